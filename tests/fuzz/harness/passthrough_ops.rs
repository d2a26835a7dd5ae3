//! The passthrough filesystem on a temporary directory, fed random operation sequences.
//!
//! Names come from a small alphabet that includes `.`, `..`, `a/b`, the empty name and the name
//! of the sentinel next to the shared directory; symlinks may point out of it. The filesystem
//! must never panic, and nothing outside the shared directory may change: after every input the
//! sentinel file next to it (content, mode, size, times, owner) and the listing of the parent
//! directory are checked.
//!
//! Input: a sequence of operations, each an opcode byte (modulo the number of operations)
//! followed by its fields in declaration order, little-endian (`u8`, `u16`, `bool` = low bit of a
//! byte, `Option<T>` = a byte whose low bit says whether `T` follows). Decoding stops where the
//! input ends; at most 64 operations run.
use std::ffi::CStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use virtiofs_fuse::abi::ROOT_ID;
use virtiofs_fuse::filesystem::{Context, FileSystem, SetAttr, SetTime};
use virtiofs_fuse::io::{SliceReader, VecWriter};
use virtiofsd::passthrough::config::{CacheMode, Config};
use virtiofsd::passthrough::PassthroughFs;

const NAMES: [&CStr; 10] = [
    c"a",
    c"b",
    c"c",
    c".",
    c"..",
    c"a/b",
    c"",
    c"sentinel",
    c"root",
    c"outside",
];
const TARGETS: [&CStr; 6] = [
    c"a",
    c"../sentinel",
    c"..",
    c"/",
    c"../outside",
    c"/proc/self/root/etc/hostname",
];
const SENTINEL: &[u8] = b"sentinel: must never change\n";

#[derive(Debug)]
pub enum Op {
    Lookup {
        parent: u8,
        name: u8,
    },
    Forget {
        node: u8,
        count: u8,
    },
    BatchForget {
        node: u8,
        count: u8,
    },
    Getattr {
        node: u8,
        handle: Option<u8>,
    },
    Create {
        parent: u8,
        name: u8,
        mode: u16,
        flags: u8,
    },
    Mkdir {
        parent: u8,
        name: u8,
        mode: u16,
    },
    Mknod {
        parent: u8,
        name: u8,
        fifo: bool,
    },
    Symlink {
        parent: u8,
        name: u8,
        target: u8,
    },
    Link {
        node: u8,
        parent: u8,
        name: u8,
    },
    Unlink {
        parent: u8,
        name: u8,
    },
    Rmdir {
        parent: u8,
        name: u8,
    },
    Rename {
        olddir: u8,
        old: u8,
        newdir: u8,
        new: u8,
        flags: u8,
    },
    Open {
        node: u8,
        flags: u8,
    },
    Opendir {
        node: u8,
    },
    Readdir {
        handle: u8,
        offset: u8,
        size: u16,
        plus: bool,
    },
    Read {
        handle: u8,
        offset: u16,
        size: u16,
    },
    Write {
        handle: u8,
        offset: u16,
        len: u16,
    },
    Setattr {
        node: u8,
        handle: Option<u8>,
        mode: Option<u16>,
        size: Option<u16>,
        times: bool,
    },
    Readlink {
        node: u8,
    },
    Release {
        handle: u8,
    },
    Fsync {
        handle: u8,
    },
    Lseek {
        handle: u8,
        offset: u16,
        whence: u8,
    },
    Fallocate {
        handle: u8,
        offset: u16,
        len: u16,
    },
    CopyFileRange {
        from: u8,
        to: u8,
        len: u16,
    },
    Access {
        node: u8,
        mask: u8,
    },
    Statfs {
        node: u8,
    },
    Destroy,
}

/// Reads fields from the input; past its end every field reads as zero.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }
    fn opt_u8(&mut self) -> Option<u8> {
        self.bool().then(|| self.u8())
    }
    fn opt_u16(&mut self) -> Option<u16> {
        self.bool().then(|| self.u16())
    }
}

const OPS: u8 = 27;

/// Decodes the operation sequence an input stands for.
pub fn decode(data: &[u8]) -> Vec<Op> {
    let mut i = Input(data);
    let mut ops = Vec::new();
    while !i.0.is_empty() && ops.len() < 64 {
        let op = match i.u8() % OPS {
            0 => Op::Lookup {
                parent: i.u8(),
                name: i.u8(),
            },
            1 => Op::Forget {
                node: i.u8(),
                count: i.u8(),
            },
            2 => Op::BatchForget {
                node: i.u8(),
                count: i.u8(),
            },
            3 => Op::Getattr {
                node: i.u8(),
                handle: i.opt_u8(),
            },
            4 => Op::Create {
                parent: i.u8(),
                name: i.u8(),
                mode: i.u16(),
                flags: i.u8(),
            },
            5 => Op::Mkdir {
                parent: i.u8(),
                name: i.u8(),
                mode: i.u16(),
            },
            6 => Op::Mknod {
                parent: i.u8(),
                name: i.u8(),
                fifo: i.bool(),
            },
            7 => Op::Symlink {
                parent: i.u8(),
                name: i.u8(),
                target: i.u8(),
            },
            8 => Op::Link {
                node: i.u8(),
                parent: i.u8(),
                name: i.u8(),
            },
            9 => Op::Unlink {
                parent: i.u8(),
                name: i.u8(),
            },
            10 => Op::Rmdir {
                parent: i.u8(),
                name: i.u8(),
            },
            11 => Op::Rename {
                olddir: i.u8(),
                old: i.u8(),
                newdir: i.u8(),
                new: i.u8(),
                flags: i.u8(),
            },
            12 => Op::Open {
                node: i.u8(),
                flags: i.u8(),
            },
            13 => Op::Opendir { node: i.u8() },
            14 => Op::Readdir {
                handle: i.u8(),
                offset: i.u8(),
                size: i.u16(),
                plus: i.bool(),
            },
            15 => Op::Read {
                handle: i.u8(),
                offset: i.u16(),
                size: i.u16(),
            },
            16 => Op::Write {
                handle: i.u8(),
                offset: i.u16(),
                len: i.u16(),
            },
            17 => Op::Setattr {
                node: i.u8(),
                handle: i.opt_u8(),
                mode: i.opt_u16(),
                size: i.opt_u16(),
                times: i.bool(),
            },
            18 => Op::Readlink { node: i.u8() },
            19 => Op::Release { handle: i.u8() },
            20 => Op::Fsync { handle: i.u8() },
            21 => Op::Lseek {
                handle: i.u8(),
                offset: i.u16(),
                whence: i.u8(),
            },
            22 => Op::Fallocate {
                handle: i.u8(),
                offset: i.u16(),
                len: i.u16(),
            },
            23 => Op::CopyFileRange {
                from: i.u8(),
                to: i.u8(),
                len: i.u16(),
            },
            24 => Op::Access {
                node: i.u8(),
                mask: i.u8(),
            },
            25 => Op::Statfs { node: i.u8() },
            _ => Op::Destroy,
        };
        ops.push(op);
    }
    ops
}

struct Dirs {
    base: PathBuf,
    root: PathBuf,
    sentinel: PathBuf,
    sentinel_meta: (u64, u32, u64, i64, i64, u32, u32),
}

fn meta(p: &Path) -> (u64, u32, u64, i64, i64, u32, u32) {
    let m = std::fs::symlink_metadata(p).expect("sentinel is still there");
    (
        m.ino(),
        m.mode(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.uid(),
        m.gid(),
    )
}

fn listing(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn dirs() -> &'static Dirs {
    static DIRS: OnceLock<Dirs> = OnceLock::new();
    DIRS.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("virtiofsd-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/file"), SENTINEL).unwrap();
        let sentinel = base.join("sentinel");
        std::fs::write(&sentinel, SENTINEL).unwrap();
        let root = base.join("root");
        std::fs::create_dir(&root).unwrap();
        let sentinel_meta = meta(&sentinel);
        extern "C" fn cleanup() {
            if let Some(d) = DIRS.get() {
                let _ = std::fs::remove_dir_all(&d.base);
            }
        }
        // SAFETY: registers a plain `extern "C"` function to run at exit.
        unsafe { libc::atexit(cleanup) };
        Dirs {
            base,
            root,
            sentinel,
            sentinel_meta,
        }
    })
}

fn check_outside(d: &Dirs, ops: &[Op]) {
    let ok = std::fs::read(&d.sentinel).ok().as_deref() == Some(SENTINEL)
        && meta(&d.sentinel) == d.sentinel_meta
        && listing(&d.base) == ["outside", "root", "sentinel"]
        && listing(&d.base.join("outside")) == ["file"]
        && std::fs::read(d.base.join("outside/file")).ok().as_deref() == Some(SENTINEL);
    assert!(
        ok,
        "something outside the shared directory changed after {ops:#?}"
    );
}

fn reset_root(d: &Dirs) {
    // The fuzzer runs as root (the daemon's normal case), so modes set by the ops do not stop
    // the removal.
    std::fs::remove_dir_all(&d.root).unwrap();
    std::fs::create_dir(&d.root).unwrap();
}

struct State {
    nodes: Vec<u64>,
    handles: Vec<(u64, u64)>,
}

impl State {
    fn node(&self, i: u8) -> u64 {
        match i {
            // A few node ids the guest was never given.
            250 => 0,
            251 => u64::MAX,
            252 => 12345,
            _ => self.nodes[i as usize % self.nodes.len()],
        }
    }
    fn handle(&self, i: u8) -> (u64, u64) {
        if self.handles.is_empty() || i >= 250 {
            return (self.node(i), u64::from(i));
        }
        self.handles[i as usize % self.handles.len()]
    }
}

fn name(i: u8) -> &'static CStr {
    NAMES[i as usize % NAMES.len()]
}

fn apply(fs: &PassthroughFs, st: &mut State, op: &Op) {
    let ctx = Context {
        uid: 0,
        gid: 0,
        pid: 1,
        supp_group: None,
    };
    let ctx = &ctx;
    match *op {
        Op::Lookup { parent, name: n } => {
            // Node id 0 is a negative entry: no node, no reference.
            if let Ok(e) = fs.lookup(ctx, st.node(parent), name(n)) {
                if e.inode != 0 {
                    st.nodes.push(e.inode);
                }
            }
        }
        Op::Forget { node, count } => {
            if let Some(pos) = st.nodes.iter().skip(1).position(|&n| n == st.node(node)) {
                let id = st.nodes.remove(pos + 1);
                fs.forget(ctx, id, 1);
            } else {
                fs.forget(ctx, st.node(node), u64::from(count));
            }
        }
        Op::BatchForget { node, count } => {
            fs.batch_forget(
                ctx,
                &[(st.node(node), u64::from(count)), (st.node(node), 1)],
            );
        }
        Op::Getattr { node, handle } => {
            let _ = fs.getattr(ctx, st.node(node), handle.map(|h| st.handle(h).1));
        }
        Op::Create {
            parent,
            name: n,
            mode,
            flags,
        } => {
            let fl = [
                libc::O_RDWR,
                libc::O_WRONLY | libc::O_TRUNC,
                libc::O_RDONLY | libc::O_EXCL,
                libc::O_RDWR | libc::O_APPEND,
                libc::O_RDWR | libc::O_DIRECTORY,
            ][flags as usize % 5];
            if let Ok((e, o)) = fs.create(
                ctx,
                st.node(parent),
                name(n),
                u32::from(mode) | libc::S_IFREG,
                fl as u32,
                0o022,
                0,
                &[],
            ) {
                st.nodes.push(e.inode);
                if let Some(h) = o.handle {
                    st.handles.push((e.inode, h));
                }
            }
        }
        Op::Mkdir {
            parent,
            name: n,
            mode,
        } => {
            if let Ok(e) = fs.mkdir(
                ctx,
                st.node(parent),
                name(n),
                u32::from(mode & 0o7777),
                0o022,
                &[],
            ) {
                st.nodes.push(e.inode);
            }
        }
        Op::Mknod {
            parent,
            name: n,
            fifo,
        } => {
            // Never device nodes: a bug must not hand the fuzzer a real device.
            let kind = if fifo { libc::S_IFIFO } else { libc::S_IFREG };
            if let Ok(e) = fs.mknod(ctx, st.node(parent), name(n), kind | 0o644, 0, 0, &[]) {
                st.nodes.push(e.inode);
            }
        }
        Op::Symlink {
            parent,
            name: n,
            target,
        } => {
            let t = TARGETS[target as usize % TARGETS.len()];
            if let Ok(e) = fs.symlink(ctx, t, st.node(parent), name(n), &[]) {
                st.nodes.push(e.inode);
            }
        }
        Op::Link {
            node,
            parent,
            name: n,
        } => {
            if let Ok(e) = fs.link(ctx, st.node(node), st.node(parent), name(n)) {
                st.nodes.push(e.inode);
            }
        }
        Op::Unlink { parent, name: n } => {
            let _ = fs.unlink(ctx, st.node(parent), name(n));
        }
        Op::Rmdir { parent, name: n } => {
            let _ = fs.rmdir(ctx, st.node(parent), name(n));
        }
        Op::Rename {
            olddir,
            old,
            newdir,
            new,
            flags,
        } => {
            let f = [
                0,
                libc::RENAME_NOREPLACE,
                libc::RENAME_EXCHANGE,
                libc::RENAME_WHITEOUT,
                0xff,
            ][flags as usize % 5];
            let _ = fs.rename(
                ctx,
                st.node(olddir),
                name(old),
                st.node(newdir),
                name(new),
                f,
            );
        }
        Op::Open { node, flags } => {
            let fl = [
                libc::O_RDONLY,
                libc::O_RDWR,
                libc::O_WRONLY | libc::O_TRUNC,
                libc::O_RDWR | libc::O_APPEND,
                libc::O_RDONLY | libc::O_NOFOLLOW,
                libc::O_RDWR | libc::O_CREAT | libc::O_DIRECT,
            ][flags as usize % 6];
            let n = st.node(node);
            if let Ok(o) = fs.open(ctx, n, fl as u32, 0) {
                if let Some(h) = o.handle {
                    st.handles.push((n, h));
                }
            }
        }
        Op::Opendir { node } => {
            let n = st.node(node);
            if let Ok(o) = fs.opendir(ctx, n, libc::O_RDONLY as u32) {
                if let Some(h) = o.handle {
                    st.handles.push((n, h));
                }
            }
        }
        Op::Readdir {
            handle,
            offset,
            size,
            plus,
        } => {
            let (n, h) = st.handle(handle);
            let mut budget = usize::from(size);
            if plus {
                let mut got = Vec::new();
                let _ = fs.readdirplus(
                    ctx,
                    n,
                    h,
                    u32::from(size),
                    u64::from(offset),
                    &mut |d, e| {
                        let sz = 24 + d.name.len() + 128;
                        if sz > budget {
                            return Ok(0);
                        }
                        budget -= sz;
                        if e.inode != 0 {
                            got.push(e.inode);
                        }
                        Ok(sz)
                    },
                );
                st.nodes.extend(got);
            } else {
                let _ = fs.readdir(ctx, n, h, u32::from(size), u64::from(offset), &mut |d| {
                    let sz = 24 + d.name.len();
                    if sz > budget {
                        return Ok(0);
                    }
                    budget -= sz;
                    Ok(sz)
                });
            }
        }
        Op::Read {
            handle,
            offset,
            size,
        } => {
            let (n, h) = st.handle(handle);
            let mut w = VecWriter::new(usize::from(size));
            if let Ok(got) = fs.read(ctx, n, h, &mut w, u32::from(size), u64::from(offset)) {
                assert!(got <= usize::from(size), "read returned {got} > {size}");
            }
        }
        Op::Write {
            handle,
            offset,
            len,
        } => {
            let (n, h) = st.handle(handle);
            let data = vec![b'w'; usize::from(len)];
            let mut r = SliceReader::new(&data);
            if let Ok(put) = fs.write(ctx, n, h, &mut r, u32::from(len), u64::from(offset), false) {
                assert!(put <= usize::from(len), "write returned {put} > {len}");
            }
        }
        Op::Setattr {
            node,
            handle,
            mode,
            size,
            times,
        } => {
            let attr = SetAttr {
                mode: mode.map(|m| u32::from(m & 0o7777)),
                size: size.map(u64::from),
                atime: if times { SetTime::Now } else { SetTime::Omit },
                mtime: if times {
                    SetTime::At(1, 2)
                } else {
                    SetTime::Omit
                },
                ..SetAttr::default()
            };
            let (n, fh) = match handle {
                Some(h) => {
                    let (_, fh) = st.handle(h);
                    (st.node(node), Some(fh))
                }
                None => (st.node(node), None),
            };
            let _ = fs.setattr(ctx, n, attr, fh);
        }
        Op::Readlink { node } => {
            let _ = fs.readlink(ctx, st.node(node));
        }
        Op::Release { handle } => {
            let (n, h) = st.handle(handle);
            if fs.release(ctx, n, 0, h).is_ok() || fs.releasedir(ctx, n, 0, h).is_ok() {
                st.handles.retain(|&x| x != (n, h));
            }
        }
        Op::Fsync { handle } => {
            let (n, h) = st.handle(handle);
            let _ = fs.fsync(ctx, n, true, h);
            let _ = fs.fsyncdir(ctx, n, false, h);
            let _ = fs.flush(ctx, n, h, 0);
        }
        Op::Lseek {
            handle,
            offset,
            whence,
        } => {
            let (n, h) = st.handle(handle);
            let _ = fs.lseek(ctx, n, h, u64::from(offset), u32::from(whence % 6));
        }
        Op::Fallocate {
            handle,
            offset,
            len,
        } => {
            let (n, h) = st.handle(handle);
            let _ = fs.fallocate(ctx, n, h, 0, u64::from(offset), u64::from(len), false);
        }
        Op::CopyFileRange { from, to, len } => {
            let (n1, h1) = st.handle(from);
            let (n2, h2) = st.handle(to);
            let _ = fs.copy_file_range(ctx, n1, h1, 0, n2, h2, 0, u64::from(len), 0, false);
        }
        Op::Access { node, mask } => {
            let _ = fs.access(ctx, st.node(node), u32::from(mask & 7));
        }
        Op::Statfs { node } => {
            let _ = fs.statfs(ctx, st.node(node));
        }
        Op::Destroy => {
            fs.destroy();
            st.nodes.truncate(1);
            st.handles.clear();
        }
    }
}

/// Runs one input; panics on a broken invariant.
pub fn run(data: &[u8]) {
    let ops = decode(data);
    let ops = &ops[..];
    let d = dirs();
    reset_root(d);
    {
        let mut cfg = Config::new(&d.root, CacheMode::Auto);
        cfg.xattr = true;
        let fs = PassthroughFs::new(cfg).expect("open the shared directory");
        let _ = fs.init(u64::MAX);
        let mut st = State {
            nodes: vec![ROOT_ID],
            handles: Vec::new(),
        };
        for op in ops {
            apply(&fs, &mut st, op);
        }
    }
    check_outside(d, ops);
}
