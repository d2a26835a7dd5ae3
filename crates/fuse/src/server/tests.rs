//! The server's unit tests: requests built byte by byte against a small fake filesystem, and
//! the replies and filesystem calls they lead to.

use super::*;
use crate::abi::opcode;
use crate::io::{SliceReader, VecWriter};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// A filesystem with one file "a" (node 2) and a directory listing of `entries` names.
#[derive(Default)]
struct FakeFs {
    forgotten: AtomicU64,
    entries: Vec<String>,
    file: Mutex<Option<std::fs::File>>,
    last_ctx: Mutex<Option<Context>>,
    /// Flags the filesystem asks for in `init` besides ASYNC_READ and DO_READDIRPLUS.
    want: u64,
    /// (operation, context, mask or flags) of every lookup, mkdir, rename and access.
    seen: Mutex<Vec<(&'static str, Context, u32)>>,
    /// The security contexts (name, value) the last MKDIR carried.
    last_secctx: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl FakeFs {
    fn saw(&self, op: &'static str, ctx: &Context, arg: u32) {
        self.seen.lock().unwrap().push((op, *ctx, arg));
    }

    fn last_seen(&self) -> (&'static str, Context, u32) {
        *self
            .seen
            .lock()
            .unwrap()
            .last()
            .expect("an operation reached the filesystem")
    }
}

fn stat_with_ino(ino: u64) -> libc::stat64 {
    // SAFETY: stat64 is plain data; all-zero is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    st.st_ino = ino;
    st.st_mode = libc::S_IFREG | 0o644;
    st
}

impl FileSystem for FakeFs {
    fn init(&self, _capable: u64) -> io::Result<u64> {
        Ok(abi::init::ASYNC_READ | abi::init::DO_READDIRPLUS | self.want)
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.saw("lookup", ctx, 0);
        if parent != abi::ROOT_ID || name.to_bytes() != b"a" {
            return Err(errno(libc::ENOENT));
        }
        Ok(Entry {
            inode: 2,
            generation: 0,
            attr: stat_with_ino(22),
            attr_flags: 0,
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_millis(1500),
        })
    }

    fn mkdir(
        &self,
        ctx: &Context,
        _parent: u64,
        _name: &CStr,
        _mode: u32,
        _umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        *self.last_secctx.lock().unwrap() = secctx
            .iter()
            .map(|c| (c.name.to_bytes().to_vec(), c.value.to_vec()))
            .collect();
        *self.last_ctx.lock().unwrap() = Some(*ctx);
        self.saw("mkdir", ctx, 0);
        Err(errno(libc::EEXIST))
    }

    fn rename(
        &self,
        ctx: &Context,
        _olddir: u64,
        _oldname: &CStr,
        _newdir: u64,
        _newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.saw("rename", ctx, flags);
        Ok(())
    }

    fn access(&self, ctx: &Context, _inode: u64, mask: u32) -> io::Result<()> {
        self.saw("access", ctx, mask);
        Ok(())
    }

    fn forget(&self, _ctx: &Context, _inode: u64, count: u64) {
        self.forgotten.fetch_add(count, Ordering::Relaxed);
    }

    fn read(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        w: &mut dyn crate::io::ZeroCopyWriter,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        use std::os::fd::AsFd;
        let f = self.file.lock().unwrap();
        let f = f.as_ref().ok_or_else(|| errno(libc::EBADF))?;
        w.read_from_file_at(f.as_fd(), size as usize, offset)
    }

    fn readdir(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>) -> io::Result<usize>,
    ) -> io::Result<()> {
        for (i, name) in self.entries.iter().enumerate().skip(offset as usize) {
            let d = DirEntry {
                ino: 100 + i as u64,
                offset: i as u64 + 1,
                type_: u32::from(libc::DT_REG),
                name: name.as_bytes(),
            };
            if add_entry(d)? == 0 {
                break;
            }
        }
        Ok(())
    }
}

fn request(op: u32, nodeid: u64, unique: u64, args: &[&[u8]]) -> Vec<u8> {
    let body: usize = args.iter().map(|a| a.len()).sum();
    let h = abi::InHeader {
        len: (size_of::<abi::InHeader>() + body) as u32,
        opcode: op,
        unique,
        nodeid,
        ..Default::default()
    };
    let mut v = h.as_bytes().to_vec();
    for a in args {
        v.extend_from_slice(a);
    }
    v
}

fn send(srv: &Server<FakeFs>, req: &[u8], cap: usize) -> (Result<usize>, Vec<u8>) {
    let w = VecWriter::new(cap);
    let out = w.output();
    let result = srv.handle_message(SliceReader::new(req), w);
    let bytes = out.borrow().clone();
    (result, bytes)
}

fn out_header(bytes: &[u8]) -> abi::OutHeader {
    abi::OutHeader::from_prefix(bytes).expect("reply header")
}

fn init_request(minor: u32, flags: u32) -> Vec<u8> {
    let i = abi::InitInCompat {
        major: 7,
        minor,
        max_readahead: 1 << 17,
        flags,
    };
    let ext = abi::InitInExt::default();
    request(opcode::INIT, 0, 1, &[i.as_bytes(), ext.as_bytes()])
}

fn server() -> Server<FakeFs> {
    Server::new(FakeFs {
        entries: (0..10).map(|i| format!("entry-{i:02}")).collect(),
        ..Default::default()
    })
}

fn initialized() -> Server<FakeFs> {
    let srv = server();
    let (r, reply) = send(&srv, &init_request(38, u32::MAX), 4096);
    assert_eq!(r.unwrap(), 16 + 64);
    assert_eq!(out_header(&reply).error, 0);
    srv
}

#[test]
fn request_before_init_gets_eio() {
    let srv = server();
    let (r, reply) = send(&srv, &request(opcode::LOOKUP, 1, 5, &[b"a\0"]), 4096);
    assert_eq!(r.unwrap(), 16);
    let h = out_header(&reply);
    assert_eq!((h.error, h.unique), (-libc::EIO, 5));
}

#[test]
fn init_agrees_on_minor_and_only_the_flags_both_sides_want() {
    let srv = server();
    let flags = (abi::init::ASYNC_READ | abi::init::MAX_PAGES) as u32;
    let (_, reply) = send(&srv, &init_request(31, flags), 4096);
    let out = abi::InitOut::from_prefix(&reply[16..]).unwrap();
    assert_eq!((out.major, out.minor), (7, 31));
    assert_eq!(
        u64::from(out.flags),
        abi::init::ASYNC_READ | abi::init::MAX_PAGES
    );
    assert_eq!(out.max_write, MAX_WRITE_SIZE);
    assert_eq!(out.max_pages, MAX_PAGES);
}

#[test]
fn init_from_linux_5_4_with_short_init_in_is_accepted() {
    let srv = server();
    let i = abi::InitInCompat {
        major: 7,
        minor: 31,
        max_readahead: 0,
        flags: abi::init::ASYNC_READ as u32,
    };
    let (r, reply) = send(&srv, &request(opcode::INIT, 0, 1, &[i.as_bytes()]), 4096);
    assert_eq!(r.unwrap(), 80);
    assert_eq!(out_header(&reply).error, 0);
}

#[test]
fn init_with_too_old_protocol_gets_eproto() {
    let srv = server();
    let (_, reply) = send(&srv, &init_request(12, 0), 4096);
    assert_eq!(out_header(&reply).error, -libc::EPROTO);
}

#[test]
fn the_session_hook_runs_as_init_is_served_and_only_then() {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    let srv = server();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    assert!(srv.on_session_start(Box::new(move || {
        r.fetch_add(1, Ordering::SeqCst);
    })));
    assert!(
        !srv.on_session_start(Box::new(|| {})),
        "one hook per server"
    );
    // Neither a request before INIT nor a refused INIT starts a session.
    let (_, reply) = send(&srv, &request(opcode::LOOKUP, 1, 5, &[b"a\0"]), 4096);
    assert_eq!(out_header(&reply).error, -libc::EIO);
    let (_, reply) = send(&srv, &init_request(12, 0), 4096);
    assert_eq!(out_header(&reply).error, -libc::EPROTO);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Run by the call that serves the INIT, before its reply leaves.
    let (r, reply) = send(&srv, &init_request(38, 0), 4096);
    assert_eq!(r.unwrap(), 16 + 64);
    assert_eq!(out_header(&reply).error, 0);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn unknown_opcode_gets_enosys() {
    let srv = initialized();
    let (_, reply) = send(&srv, &request(9999, 1, 9, &[]), 4096);
    assert_eq!(out_header(&reply).error, -libc::ENOSYS);
    assert_eq!(out_header(&reply).unique, 9);
}

#[test]
fn header_length_beyond_the_request_gets_einval() {
    let srv = initialized();
    let mut req = request(opcode::LOOKUP, 1, 3, &[b"a\0"]);
    req[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    let (_, reply) = send(&srv, &req, 4096);
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
}

#[test]
fn header_length_below_header_size_gets_einval() {
    let srv = initialized();
    let mut req = request(opcode::GETATTR, 1, 3, &[&[0u8; 16]]);
    req[0..4].copy_from_slice(&3u32.to_le_bytes());
    let (_, reply) = send(&srv, &req, 4096);
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
}

#[test]
fn request_shorter_than_a_header_is_refused_without_reply() {
    let srv = initialized();
    let (r, reply) = send(&srv, &[0u8; 10], 4096);
    assert!(matches!(r, Err(ServerError::ShortHeader)));
    assert!(reply.is_empty());
}

#[test]
fn reply_buffer_too_small_for_a_header_is_refused() {
    let srv = initialized();
    let (r, _) = send(&srv, &request(opcode::LOOKUP, 1, 3, &[b"a\0"]), 8);
    assert!(matches!(r, Err(ServerError::NoRoomForReply)));
}

#[test]
fn server_errors_say_what_failed_and_keep_the_write_error() {
    use std::error::Error;
    assert_eq!(
        ServerError::ShortHeader.to_string(),
        "request shorter than a FUSE header"
    );
    assert!(ServerError::NoRoomForReply.source().is_none());
    let e = ServerError::ReplyWrite(io::Error::from_raw_os_error(libc::EFAULT));
    assert_eq!(e.to_string(), "failed to write the reply");
    let source = e.source().and_then(|s| s.downcast_ref::<io::Error>());
    assert_eq!(source.and_then(io::Error::raw_os_error), Some(libc::EFAULT));
}

#[test]
fn lookup_name_without_nul_gets_einval() {
    let srv = initialized();
    let (_, reply) = send(&srv, &request(opcode::LOOKUP, 1, 3, &[b"abc"]), 4096);
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
}

#[test]
fn lookup_overlong_name_gets_enametoolong() {
    let srv = initialized();
    let mut name = vec![b'x'; 300];
    name.push(0);
    let (_, reply) = send(&srv, &request(opcode::LOOKUP, 1, 3, &[&name]), 4096);
    assert_eq!(out_header(&reply).error, -libc::ENAMETOOLONG);
}

#[test]
fn lookup_reply_carries_entry_and_timeouts() {
    let srv = initialized();
    let (r, reply) = send(&srv, &request(opcode::LOOKUP, 1, 3, &[b"a\0"]), 4096);
    assert_eq!(r.unwrap(), 16 + 128);
    let e = abi::EntryOut::from_prefix(&reply[16..]).unwrap();
    assert_eq!((e.nodeid, e.attr.ino), (2, 22));
    assert_eq!((e.entry_valid, e.entry_valid_nsec), (1, 500_000_000));
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o644);
}

#[test]
fn lookup_reply_that_does_not_fit_gets_an_error_reply() {
    let srv = initialized();
    let (_, reply) = send(&srv, &request(opcode::LOOKUP, 1, 3, &[b"a\0"]), 64);
    assert_eq!(out_header(&reply).error, -libc::ERANGE);
}

#[test]
fn forget_takes_no_reply() {
    let srv = initialized();
    let f = abi::ForgetIn { nlookup: 3 };
    let (r, reply) = send(&srv, &request(opcode::FORGET, 2, 4, &[f.as_bytes()]), 4096);
    assert_eq!(r.unwrap(), 0);
    assert!(reply.is_empty());
    assert_eq!(srv.filesystem().forgotten.load(Ordering::Relaxed), 3);
}

#[test]
fn batch_forget_with_count_beyond_the_request_is_refused() {
    let srv = initialized();
    let b = abi::BatchForgetIn {
        count: u32::MAX,
        dummy: 0,
    };
    let one = abi::ForgetOne {
        nodeid: 2,
        nlookup: 1,
    };
    let req = request(opcode::BATCH_FORGET, 0, 4, &[b.as_bytes(), one.as_bytes()]);
    let (r, _) = send(&srv, &req, 4096);
    assert_eq!(r.unwrap(), 0);
    assert_eq!(srv.filesystem().forgotten.load(Ordering::Relaxed), 0);
}

#[test]
fn batch_forget_releases_every_item() {
    let srv = initialized();
    let b = abi::BatchForgetIn { count: 2, dummy: 0 };
    let one = abi::ForgetOne {
        nodeid: 2,
        nlookup: 5,
    };
    let req = request(
        opcode::BATCH_FORGET,
        0,
        4,
        &[b.as_bytes(), one.as_bytes(), one.as_bytes()],
    );
    send(&srv, &req, 4096).0.unwrap();
    assert_eq!(srv.filesystem().forgotten.load(Ordering::Relaxed), 10);
}

#[test]
fn readdir_never_splits_an_entry_and_honours_the_size() {
    let srv = initialized();
    // Each "entry-NN" record takes 32 bytes; ask for 100 bytes: three whole records fit.
    let ri = abi::ReadIn {
        size: 100,
        ..Default::default()
    };
    let (r, reply) = send(
        &srv,
        &request(opcode::READDIR, 1, 6, &[ri.as_bytes()]),
        4096,
    );
    assert_eq!(r.unwrap(), 16 + 96);
    assert_eq!(out_header(&reply).len, 16 + 96);
    let d = abi::Dirent::from_prefix(&reply[16 + 64..]).unwrap();
    assert_eq!((d.off, d.namelen), (3, 8));
    assert_eq!(&reply[16 + 64 + 24..16 + 64 + 32], b"entry-02");
}

#[test]
fn readdir_resumes_at_the_offset_given() {
    let srv = initialized();
    let ri = abi::ReadIn {
        size: 4096,
        offset: 8,
        ..Default::default()
    };
    let (_, reply) = send(
        &srv,
        &request(opcode::READDIR, 1, 6, &[ri.as_bytes()]),
        4096,
    );
    assert_eq!(out_header(&reply).len, 16 + 64);
    assert_eq!(&reply[16 + 24..16 + 32], b"entry-08");
}

#[test]
fn read_reply_carries_file_data_after_the_header() {
    use std::io::Write;
    let srv = initialized();
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(b"hello, world").unwrap();
    *srv.filesystem().file.lock().unwrap() = Some(f);
    let ri = abi::ReadIn {
        size: 5,
        offset: 7,
        ..Default::default()
    };
    let (r, reply) = send(&srv, &request(opcode::READ, 2, 7, &[ri.as_bytes()]), 4096);
    assert_eq!(r.unwrap(), 21);
    assert_eq!(out_header(&reply).len, 21);
    assert_eq!(&reply[16..], b"world");
}

#[test]
fn write_with_size_beyond_its_data_gets_einval() {
    let srv = initialized();
    let wi = abi::WriteIn {
        size: 1000,
        ..Default::default()
    };
    let (_, reply) = send(
        &srv,
        &request(opcode::WRITE, 2, 8, &[wi.as_bytes(), b"short"]),
        4096,
    );
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
}

#[test]
fn setxattr_value_size_beyond_the_request_gets_einval() {
    let srv = initialized();
    let s = abi::SetxattrInCompat {
        size: 100,
        flags: 0,
    };
    let (_, reply) = send(
        &srv,
        &request(opcode::SETXATTR, 1, 8, &[s.as_bytes(), b"user.a\0", b"xy"]),
        4096,
    );
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
}

fn mkdir_with_extension(ext: &[u8]) -> Vec<u8> {
    let m = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let mut req = request(
        opcode::MKDIR,
        1,
        12,
        &[m.as_bytes(), b"d\0\0\0\0\0\0\0", ext],
    );
    req[36..38].copy_from_slice(&((ext.len() / 8) as u16).to_le_bytes());
    req
}

#[test]
fn supplementary_group_extension_reaches_the_filesystem() {
    let srv = initialized();
    let hdr = abi::ExtHeader {
        size: 16,
        typ: abi::EXT_GROUPS,
    };
    let mut ext = hdr.as_bytes().to_vec();
    ext.extend_from_slice(&1u32.to_le_bytes());
    ext.extend_from_slice(&4242u32.to_le_bytes());
    let (_, reply) = send(&srv, &mkdir_with_extension(&ext), 4096);
    assert_eq!(out_header(&reply).error, -libc::EEXIST);
    let ctx = srv.filesystem().last_ctx.lock().unwrap().unwrap();
    assert_eq!(ctx.supp_group, Some(4242));
}

/// A security context extension with one context, as Linux sends it.
fn secctx_extension(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut body = (value.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&[0; 4]);
    body.extend_from_slice(name);
    body.push(0);
    body.extend_from_slice(value);
    let size = (8 + body.len()).div_ceil(8) * 8;
    let mut ext = abi::ExtHeader {
        size: size as u32,
        typ: 1,
    }
    .as_bytes()
    .to_vec();
    ext.extend_from_slice(&body);
    ext.resize(size, 0);
    ext
}

#[test]
fn security_context_reaches_the_filesystem_only_when_agreed() {
    let mut ext = secctx_extension(b"security.selinux", b"label_t\0");
    ext.extend_from_slice(
        abi::ExtHeader {
            size: 16,
            typ: abi::EXT_GROUPS,
        }
        .as_bytes(),
    );
    ext.extend_from_slice(&1u32.to_le_bytes());
    ext.extend_from_slice(&77u32.to_le_bytes());
    let offered = abi::init::ASYNC_READ | abi::init::INIT_EXT | abi::init::SECURITY_CTX;
    for (want, passed) in [(abi::init::SECURITY_CTX, true), (0, false)] {
        let srv = Server::new(FakeFs {
            want,
            ..Default::default()
        });
        let (_, reply) = send(&srv, &init_request_ext(40, offered), 4096);
        assert_eq!(out_header(&reply).error, 0);
        let (_, reply) = send(&srv, &mkdir_with_extension(&ext), 4096);
        assert_eq!(out_header(&reply).error, -libc::EEXIST);
        let got = srv.filesystem().last_secctx.lock().unwrap().clone();
        if passed {
            assert_eq!(got, [(b"security.selinux".to_vec(), b"label_t\0".to_vec())]);
        } else {
            assert!(got.is_empty());
        }
        let ctx = srv.filesystem().last_ctx.lock().unwrap().unwrap();
        assert_eq!(ctx.supp_group, Some(77));
    }
}

#[test]
fn truncated_security_context_gets_einval() {
    let ext = secctx_extension(b"security.selinux", b"a-long-label-value");
    let srv = initialized();
    // Claim one context but cut its value short (header size kept consistent).
    let mut cut = ext[..24].to_vec();
    cut[0..4].copy_from_slice(&24u32.to_le_bytes());
    let (_, reply) = send(&srv, &mkdir_with_extension(&cut), 4096);
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
    assert!(srv.filesystem().last_ctx.lock().unwrap().is_none());
}

#[test]
fn malformed_extension_gets_einval() {
    let srv = initialized();
    let hdr = abi::ExtHeader {
        size: 24,
        typ: abi::EXT_GROUPS,
    };
    let mut ext = hdr.as_bytes().to_vec();
    ext.extend_from_slice(&[0u8; 8]);
    let (_, reply) = send(&srv, &mkdir_with_extension(&ext), 4096);
    assert_eq!(out_header(&reply).error, -libc::EINVAL);
    assert!(srv.filesystem().last_ctx.lock().unwrap().is_none());
}

#[test]
fn lookup_reply_that_cannot_fit_never_reaches_the_filesystem() {
    let srv = initialized();
    let m = abi::MkdirIn::default();
    let (_, reply) = send(
        &srv,
        &request(opcode::MKDIR, 1, 3, &[m.as_bytes(), b"d\0"]),
        100,
    );
    assert_eq!(out_header(&reply).error, -libc::ERANGE);
    assert!(srv.filesystem().last_ctx.lock().unwrap().is_none());
}

#[test]
fn destroy_ends_the_session() {
    let srv = initialized();
    let (_, reply) = send(&srv, &request(opcode::DESTROY, 0, 2, &[]), 4096);
    assert_eq!(out_header(&reply).error, 0);
    let (_, reply) = send(&srv, &request(opcode::LOOKUP, 1, 3, &[b"a\0"]), 4096);
    assert_eq!(out_header(&reply).error, -libc::EIO);
}
/// Sends `req` and returns the reply header (the request must get a reply).
fn call(srv: &Server<FakeFs>, req: &[u8]) -> abi::OutHeader {
    let (r, reply) = send(srv, req, 4096);
    r.expect("a reply");
    out_header(&reply)
}

/// FUSE_INIT at `minor` offering `flags` (low and high halves, with the 7.36 extension).
fn init_request_ext(minor: u32, flags: u64) -> Vec<u8> {
    let i = abi::InitInCompat {
        major: 7,
        minor,
        max_readahead: 1 << 17,
        flags: flags as u32,
    };
    let ext = abi::InitInExt {
        flags2: (flags >> 32) as u32,
        ..Default::default()
    };
    request(opcode::INIT, 0, 1, &[i.as_bytes(), ext.as_bytes()])
}

/// What INIT agreed on: (reply minor, reply flags with flags2, server options).
fn negotiate(want: u64, minor: u32, offered: u64) -> (u32, u64, u64) {
    let srv = Server::new(FakeFs {
        want,
        ..Default::default()
    });
    let (_, reply) = send(&srv, &init_request_ext(minor, offered), 4096);
    assert_eq!(out_header(&reply).error, 0);
    let out = abi::InitOut::from_prefix(&reply[16..]).unwrap();
    let flags = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    (out.minor, flags, srv.options())
}

const IDMAP_OFFER: u64 = abi::init::ASYNC_READ | abi::init::INIT_EXT | abi::init::ALLOW_IDMAP;

#[test]
fn allow_idmap_is_enabled_when_offered_and_wanted() {
    let (minor, flags, options) = negotiate(abi::init::ALLOW_IDMAP, 41, IDMAP_OFFER);
    assert_eq!(minor, 41);
    // In flags2 (bit 8), with INIT_EXT so that the kernel reads flags2 at all.
    assert_ne!(flags & abi::init::ALLOW_IDMAP, 0);
    assert_ne!(flags & abi::init::INIT_EXT, 0);
    assert_ne!(options & abi::init::ALLOW_IDMAP, 0);
    // A newer kernel gets our minor.
    let (minor, flags, _) = negotiate(abi::init::ALLOW_IDMAP, 45, IDMAP_OFFER);
    assert_eq!(minor, abi::KERNEL_MINOR_VERSION);
    assert_ne!(flags & abi::init::ALLOW_IDMAP, 0);
}

#[test]
fn allow_idmap_is_not_enabled_unless_the_filesystem_wants_it() {
    let (minor, flags, options) = negotiate(0, 41, IDMAP_OFFER);
    assert_eq!(minor, 41);
    assert_eq!(flags & abi::init::ALLOW_IDMAP, 0);
    assert_eq!(options & abi::init::ALLOW_IDMAP, 0);
}

#[test]
fn allow_idmap_is_not_enabled_unless_the_kernel_offers_it() {
    // 6.1 speaks 7.38 and does not know the flag; 5.4 speaks 7.31 without INIT_EXT.
    for (minor, offered) in [
        (38, abi::init::ASYNC_READ | abi::init::INIT_EXT),
        (41, abi::init::ASYNC_READ | abi::init::INIT_EXT),
        (31, abi::init::ASYNC_READ),
    ] {
        let (got_minor, flags, options) = negotiate(abi::init::ALLOW_IDMAP, minor, offered);
        assert_eq!(got_minor, minor);
        assert_eq!(flags & abi::init::ALLOW_IDMAP, 0, "minor {minor}");
        assert_eq!(options & abi::init::ALLOW_IDMAP, 0, "minor {minor}");
    }
    // Nor by a client below 7.41 that sets the bit anyway.
    let (minor, flags, _) = negotiate(abi::init::ALLOW_IDMAP, 40, IDMAP_OFFER);
    assert_eq!(minor, 40);
    assert_eq!(flags & abi::init::ALLOW_IDMAP, 0);
}

fn request_as(op: u32, uid: u32, gid: u32, args: &[&[u8]]) -> Vec<u8> {
    let mut req = request(op, 1, 7, args);
    req[24..28].copy_from_slice(&uid.to_le_bytes());
    req[28..32].copy_from_slice(&gid.to_le_bytes());
    req
}

fn idmap_server() -> Server<FakeFs> {
    let srv = Server::new(FakeFs {
        want: abi::init::ALLOW_IDMAP,
        ..Default::default()
    });
    call(&srv, &init_request_ext(41, IDMAP_OFFER));
    assert_ne!(srv.options() & abi::init::ALLOW_IDMAP, 0);
    srv
}

fn rename2(flags: u32) -> Vec<u8> {
    let r = abi::Rename2In {
        newdir: 1,
        flags,
        padding: 0,
    };
    request_as(
        opcode::RENAME2,
        100000,
        100000,
        &[r.as_bytes(), b"a\0", b"b\0"],
    )
}

#[test]
fn with_idmap_only_creating_requests_carry_ids() {
    let srv = idmap_server();
    let fs = srv.filesystem();
    let m = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    call(
        &srv,
        &request_as(opcode::MKDIR, 100000, 100001, &[m.as_bytes(), b"d\0"]),
    );
    let (op, ctx, _) = fs.last_seen();
    assert_eq!((op, ctx.uid, ctx.gid), ("mkdir", 100000, 100001));

    // Whatever a non-creating request carries is not an identity.
    call(&srv, &request_as(opcode::LOOKUP, 1000, 1000, &[b"a\0"]));
    let (op, ctx, _) = fs.last_seen();
    assert_eq!(
        (op, ctx.uid, ctx.gid),
        ("lookup", abi::INVALID_UIDGID, abi::INVALID_UIDGID)
    );

    call(&srv, &rename2(libc::RENAME_NOREPLACE));
    let (op, ctx, _) = fs.last_seen();
    assert_eq!(
        (op, ctx.uid, ctx.gid),
        ("rename", abi::INVALID_UIDGID, abi::INVALID_UIDGID)
    );
    call(&srv, &rename2(libc::RENAME_WHITEOUT));
    let (op, ctx, flags) = fs.last_seen();
    assert_eq!(
        (op, ctx.uid, ctx.gid, flags),
        ("rename", 100000, 100000, libc::RENAME_WHITEOUT)
    );
}

#[test]
fn without_idmap_every_request_keeps_its_ids() {
    let srv = initialized();
    let fs = srv.filesystem();
    call(&srv, &request_as(opcode::LOOKUP, 1000, 1001, &[b"a\0"]));
    let (op, ctx, _) = fs.last_seen();
    assert_eq!((op, ctx.uid, ctx.gid), ("lookup", 1000, 1001));
    call(&srv, &rename2(0));
    let (_, ctx, _) = fs.last_seen();
    assert_eq!((ctx.uid, ctx.gid), (100000, 100000));
}

#[test]
fn access_without_a_caller_only_checks_existence() {
    let a = abi::AccessIn {
        mask: (libc::R_OK | libc::W_OK) as u32,
        padding: 0,
    };
    let srv = idmap_server();
    let (_, reply) = send(
        &srv,
        &request_as(
            opcode::ACCESS,
            abi::INVALID_UIDGID,
            abi::INVALID_UIDGID,
            &[a.as_bytes()],
        ),
        4096,
    );
    assert_eq!(out_header(&reply).error, 0);
    let (op, _, mask) = srv.filesystem().last_seen();
    assert_eq!((op, mask), ("access", libc::F_OK as u32));

    // With a caller, the mask goes through unchanged.
    let srv = initialized();
    call(
        &srv,
        &request_as(opcode::ACCESS, 1000, 1000, &[a.as_bytes()]),
    );
    let (op, ctx, mask) = srv.filesystem().last_seen();
    assert_eq!((op, ctx.uid, mask), ("access", 1000, a.mask));
    // INVALID ids are never a caller, with or without idmap.
    call(
        &srv,
        &request_as(opcode::ACCESS, abi::INVALID_UIDGID, 0, &[a.as_bytes()]),
    );
    let (_, _, mask) = srv.filesystem().last_seen();
    assert_eq!(mask, libc::F_OK as u32);
}

#[test]
fn supplementary_group_needs_a_caller() {
    let srv = idmap_server();
    let hdr = abi::ExtHeader {
        size: 16,
        typ: abi::EXT_GROUPS,
    };
    let mut ext = hdr.as_bytes().to_vec();
    ext.extend_from_slice(&1u32.to_le_bytes());
    ext.extend_from_slice(&4242u32.to_le_bytes());
    let mut req = mkdir_with_extension(&ext);
    req[24..32].fill(0xff);
    call(&srv, &req);
    let (op, ctx, _) = srv.filesystem().last_seen();
    assert_eq!(
        (op, ctx.uid, ctx.supp_group),
        ("mkdir", abi::INVALID_UIDGID, None)
    );
}
