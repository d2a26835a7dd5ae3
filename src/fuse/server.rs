//! FUSE request dispatch: reads one request from a [`Reader`], calls the [`FileSystem`], and
//! writes the reply to a [`Writer`].
//!
//! Everything the client sends is checked before use: the header length against the bytes the
//! request really carries, each argument struct against the body length, names for their NUL
//! terminator. A malformed request gets an error reply when it carried a readable header, and is
//! refused with a [`ServerError`] otherwise; the server never panics on input.

use std::cell::RefCell;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use log::{debug, warn};

use super::abi::{self, opcode, Pod};
use super::io::{Reader, Writer};
use crate::filesystem::{
    errno, Context, DirEntry, Entry, FileSystem, SecCtx, SetAttr, SetTime, XattrReply,
};
use crate::migration::{self, Decoder, Encoder, StateError};

/// Largest WRITE (and READ) payload offered to the client.
pub const MAX_WRITE_SIZE: u32 = 1 << 20;
/// Pages per request offered with `FUSE_MAX_PAGES` (`MAX_WRITE_SIZE` / 4 KiB).
const MAX_PAGES: u16 = 256;
/// Largest request body (everything after the header) read into memory; WRITE data is not
/// counted, it goes from the request straight to the file.
const MAX_BODY_SIZE: usize = 256 * 1024;
/// Largest name component accepted from the client (`NAME_MAX`).
const NAME_MAX: usize = 255;
/// Largest symlink target accepted from the client (`PATH_MAX`).
const PATH_MAX: usize = 4096;
/// Largest extended attribute value (`XATTR_SIZE_MAX`).
const XATTR_SIZE_MAX: u32 = 65536;

const OUT_HEADER_SIZE: usize = size_of::<abi::OutHeader>();

/// Why a request could not even be answered.
#[derive(Debug)]
pub enum ServerError {
    /// The request is shorter than a FUSE header.
    ShortHeader,
    /// The reply buffer cannot hold a reply header.
    NoRoomForReply,
    /// Writing the reply into the reply buffer failed.
    ReplyWrite(io::Error),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::ShortHeader => write!(f, "request shorter than a FUSE header"),
            ServerError::NoRoomForReply => write!(f, "reply buffer cannot hold a reply header"),
            ServerError::ReplyWrite(_) => write!(f, "failed to write the reply"),
        }
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServerError::ReplyWrite(e) => Some(e),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, ServerError>;

fn einval() -> io::Error {
    errno(libc::EINVAL)
}

thread_local! {
    /// Per-thread buffer for request bodies, reused across requests.
    static BODY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A cursor over a request body.
struct Args<'a> {
    bytes: &'a [u8],
}

impl<'a> Args<'a> {
    fn take<T: Pod>(&mut self) -> io::Result<T> {
        let v = T::from_prefix(self.bytes).ok_or_else(einval)?;
        self.bytes = &self.bytes[size_of::<T>()..];
        Ok(v)
    }

    /// A NUL-terminated string of at most `max` bytes (without the NUL).
    fn cstr(&mut self, max: usize) -> io::Result<&'a CStr> {
        let nul = self.bytes.iter().position(|&b| b == 0).ok_or_else(einval)?;
        if nul > max {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let (s, rest) = self.bytes.split_at(nul + 1);
        self.bytes = rest;
        CStr::from_bytes_with_nul(s).map_err(|_| einval())
    }

    fn name(&mut self) -> io::Result<&'a CStr> {
        self.cstr(NAME_MAX)
    }

    fn bytes(&mut self, len: usize) -> io::Result<&'a [u8]> {
        if len > self.bytes.len() {
            return Err(einval());
        }
        let (b, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(b)
    }
}

fn timeout_parts(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// Converts host attributes to the wire form.
pub fn attr_from_stat(st: &libc::stat64, flags: u32) -> abi::Attr {
    abi::Attr {
        ino: st.st_ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: st.st_atime as u64,
        mtime: st.st_mtime as u64,
        ctime: st.st_ctime as u64,
        atimensec: st.st_atime_nsec as u32,
        mtimensec: st.st_mtime_nsec as u32,
        ctimensec: st.st_ctime_nsec as u32,
        mode: st.st_mode,
        nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
        uid: st.st_uid,
        gid: st.st_gid,
        // The kernel decodes rdev with new_decode_dev(); glibc's dev_t encoding agrees with it
        // in the low 32 bits.
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags,
    }
}

fn entry_out(e: &Entry) -> abi::EntryOut {
    let (entry_valid, entry_valid_nsec) = timeout_parts(e.entry_timeout);
    let (attr_valid, attr_valid_nsec) = timeout_parts(e.attr_timeout);
    abi::EntryOut {
        nodeid: e.inode,
        generation: e.generation,
        entry_valid,
        attr_valid,
        entry_valid_nsec,
        attr_valid_nsec,
        attr: attr_from_stat(&e.attr, e.attr_flags),
    }
}

fn attr_out(st: &libc::stat64, timeout: Duration) -> abi::AttrOut {
    let (attr_valid, attr_valid_nsec) = timeout_parts(timeout);
    abi::AttrOut {
        attr_valid,
        attr_valid_nsec,
        dummy: 0,
        attr: attr_from_stat(st, 0),
    }
}

fn open_out(o: &crate::filesystem::Opened) -> abi::OpenOut {
    abi::OpenOut {
        fh: o.handle.unwrap_or(0),
        open_flags: o.open_flags,
        backing_id: 0,
    }
}

fn set_time(set: bool, now: bool, secs: u64, nsecs: u32) -> SetTime {
    if now {
        SetTime::Now
    } else if set {
        SetTime::At(secs as i64, nsecs)
    } else {
        SetTime::Omit
    }
}

const ENTRY_REPLY_SIZE: usize = OUT_HEADER_SIZE + size_of::<abi::EntryOut>();
const CREATE_REPLY_SIZE: usize = ENTRY_REPLY_SIZE + size_of::<abi::OpenOut>();
const OPEN_REPLY_SIZE: usize = OUT_HEADER_SIZE + size_of::<abi::OpenOut>();

/// Refuses a request whose reply cannot fit before the filesystem acts on it, so that nothing
/// is created and no reference is taken for a reply the client never receives.
fn need_room<W: Writer>(w: &W, size: usize) -> io::Result<()> {
    if w.remaining() < size {
        warn!(
            "reply buffer of {} bytes is too small for a {size} byte reply",
            w.remaining()
        );
        return Err(errno(libc::ERANGE));
    }
    Ok(())
}

/// Whether `ctx` names a caller: neither id is [`abi::INVALID_UIDGID`].
fn has_identity(ctx: &Context) -> bool {
    ctx.uid != abi::INVALID_UIDGID && ctx.gid != abi::INVALID_UIDGID
}

/// Marks `ctx` as carrying no caller identity.
fn without_ids(ctx: &mut Context) {
    ctx.uid = abi::INVALID_UIDGID;
    ctx.gid = abi::INVALID_UIDGID;
    ctx.supp_group = None;
}

/// What a handler produced: a reply to send, or nothing (FORGET, BATCH_FORGET).
enum Outcome {
    Reply(usize),
    NoReply,
}

/// Serves FUSE requests on a filesystem. Shared by every queue worker: it takes `&self`, keeps
/// only atomics, and never holds a lock while the filesystem works.
pub struct Server<F: FileSystem> {
    fs: F,
    /// Flags agreed in `FUSE_INIT` (`abi::init`).
    options: AtomicU64,
    /// Flags the client offered in `FUSE_INIT` (with `flags2`), kept for a migration: the
    /// destination agrees on them again with its own file system.
    capable: AtomicU64,
    initialized: AtomicBool,
    /// A migration state is being taken over or was (see [`Server::load_state`]): a second one
    /// is refused, so two loads never mix their nodes or undo each other's.
    state_taken: AtomicBool,
}

impl<F: FileSystem> Server<F> {
    pub fn new(fs: F) -> Self {
        Server {
            fs,
            options: AtomicU64::new(0),
            capable: AtomicU64::new(0),
            initialized: AtomicBool::new(false),
            state_taken: AtomicBool::new(false),
        }
    }

    /// The flags agreed with a client that offered `capable`; the file system sets itself up
    /// for them.
    fn agree(&self, capable: u64) -> io::Result<u64> {
        let wanted = self.fs.init(capable)? & capable;
        let mut enabled = wanted | (capable & abi::init::INIT_EXT);
        if capable & abi::init::MAX_PAGES != 0 {
            enabled |= abi::init::MAX_PAGES;
        }
        Ok(enabled)
    }

    /// The session and file system state a migration destination needs (see `migration`):
    /// whether the guest mounted, what INIT agreed, and the file system's nodes and handles.
    /// Called with the queues stopped.
    pub fn save_state(&self) -> std::result::Result<Vec<u8>, StateError> {
        let mut e = Encoder::new();
        let s = e.begin();
        e.bool(self.initialized.load(Ordering::Acquire));
        e.u64(self.capable.load(Ordering::Relaxed));
        e.u64(self.options.load(Ordering::Relaxed));
        e.end(s);
        let s = e.begin();
        self.fs.save_state(&mut e)?;
        e.end(s);
        Ok(migration::seal(&e.into_bytes()))
    }

    /// Takes over the session saved by a source daemon's [`Server::save_state`]: the guest
    /// goes on without a new INIT. Refused on a server that has served a session or taken over
    /// a state already, and when this daemon's options would agree on other flags than the
    /// source's did. A refused state leaves nothing behind: not its nodes, not what INIT set up.
    pub fn load_state(&self, blob: &[u8]) -> std::result::Result<(), StateError> {
        if self.initialized.load(Ordering::Acquire) {
            return Err(StateError::Refused(
                "a session is being served already: a migration destination must not have \
                 served a guest before"
                    .into(),
            ));
        }
        if self.state_taken.swap(true, Ordering::AcqRel) {
            return Err(StateError::Refused(
                "a migration state was taken over already: a destination takes one".into(),
            ));
        }
        let taken = self.take_state(blob);
        if taken.is_err() {
            self.fs.destroy();
            self.state_taken.store(false, Ordering::Release);
        }
        taken
    }

    fn take_state(&self, blob: &[u8]) -> std::result::Result<(), StateError> {
        let mut d = Decoder::new(migration::open(blob)?);
        let mut s = d.section("session")?;
        let initialized = s.bool("session: mounted")?;
        let capable = s.u64("session: offered flags")?;
        let options = s.u64("session: agreed flags")?;
        s.finish()?;
        let mut f = d.section("file system")?;
        d.finish()?;
        if initialized {
            let here = self.agree(capable).map_err(|e| StateError::Io {
                what: "the file system refused the session's INIT flags".into(),
                source: e,
            })?;
            if here != options {
                return Err(StateError::Refused(format!(
                    "the guest agreed on FUSE flags {options:#x} with the source; with this \
                     daemon's options it would get {here:#x} (start the destination with the \
                     source's options)"
                )));
            }
        }
        self.fs.load_state(&mut f)?;
        f.finish()?;
        self.capable.store(capable, Ordering::Relaxed);
        self.options.store(options, Ordering::Relaxed);
        self.initialized.store(initialized, Ordering::Release);
        Ok(())
    }

    /// Whether a session is served: the guest's INIT was answered, or a state took one over.
    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Acquire)
    }

    /// The filesystem behind this server.
    pub fn filesystem(&self) -> &F {
        &self.fs
    }

    /// Flags agreed with the client in `FUSE_INIT`.
    pub fn options(&self) -> u64 {
        self.options.load(Ordering::Relaxed)
    }

    /// Whether set-id bits and capabilities are the filesystem's to clear
    /// (`FUSE_HANDLE_KILLPRIV_V2` agreed). For WRITE, SETATTR and OPEN the client marks the
    /// requests that need it; FALLOCATE and COPY_FILE_RANGE carry no such flag, and the Linux
    /// client, which clears the bits itself before either (`file_modified`), leaves that to the
    /// filesystem once the flag is agreed: they clear them whenever it is.
    fn killpriv_v2(&self) -> bool {
        self.options() & abi::init::HANDLE_KILLPRIV_V2 != 0
    }

    /// Handles one request. Returns the number of reply bytes written to `w` (0 when the
    /// request takes no reply).
    pub fn handle_message<R: Reader, W: Writer>(&self, mut r: R, mut w: W) -> Result<usize> {
        let mut hb = [0u8; size_of::<abi::InHeader>()];
        r.read_exact(&mut hb)
            .map_err(|_| ServerError::ShortHeader)?;
        let h = abi::InHeader::from_prefix(&hb).ok_or(ServerError::ShortHeader)?;
        let mut ctx = Context {
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
            supp_group: None,
        };
        debug!(
            "request unique={} opcode={} nodeid={} len={} uid={} gid={}",
            h.unique, h.opcode, h.nodeid, h.len, h.uid, h.gid
        );
        if self.options() & abi::init::ALLOW_IDMAP != 0 && !abi::carries_creator_ids(h.opcode) {
            // With idmapped mounts the kernel sends the caller's ids only with creating
            // requests; whatever another request carries is not an identity.
            without_ids(&mut ctx);
        }

        // Body length as the header claims it, checked against what the chain carries.
        let body_len = match (h.len as usize)
            .checked_sub(size_of::<abi::InHeader>())
            .filter(|&n| n <= r.remaining())
        {
            Some(n) => n,
            None => {
                warn!(
                    "request unique={} opcode={}: header length {} does not match the {} bytes \
                     supplied",
                    h.unique,
                    h.opcode,
                    h.len,
                    r.remaining() + size_of::<abi::InHeader>()
                );
                return self.reply_error(&mut w, h.unique, einval());
            }
        };

        if h.opcode != opcode::INIT && !self.initialized.load(Ordering::Acquire) {
            warn!("request opcode {} before FUSE_INIT refused", h.opcode);
            return self.reply_error(&mut w, h.unique, errno(libc::EIO));
        }

        let result = if h.opcode == opcode::WRITE {
            self.do_write(&ctx, &h, body_len, &mut r, &mut w)
        } else if body_len > MAX_BODY_SIZE {
            warn!(
                "request unique={} opcode={}: body of {} bytes exceeds the {} byte limit",
                h.unique, h.opcode, body_len, MAX_BODY_SIZE
            );
            Err(errno(libc::E2BIG))
        } else {
            BODY.with(|cell| {
                let mut buf = cell.borrow_mut();
                buf.resize(body_len, 0);
                r.read_exact(&mut buf[..])?;
                // Request extensions follow the arguments.
                let ext = usize::from(h.total_extlen) * 8;
                let args_len = body_len.checked_sub(ext).ok_or_else(einval)?;
                let ext = super::ext::parse(&buf[args_len..])?;
                // A group only goes with a caller identity.
                ctx.supp_group = ext.supp_group.filter(|_| has_identity(&ctx));
                // Security contexts only when agreed (the kernel sends none otherwise).
                let secctx = if self.options() & abi::init::SECURITY_CTX != 0 {
                    &ext.secctx[..]
                } else {
                    &[]
                };
                let args = Args {
                    bytes: &buf[..args_len],
                };
                self.dispatch(&ctx, &h, args, secctx, &mut w)
            })
        };

        match result {
            Ok(Outcome::Reply(n)) => Ok(n),
            Ok(Outcome::NoReply) => Ok(0),
            Err(e) => self.reply_error(&mut w, h.unique, e),
        }
    }

    fn dispatch<W: Writer>(
        &self,
        ctx: &Context,
        h: &abi::InHeader,
        mut a: Args<'_>,
        secctx: &[SecCtx<'_>],
        w: &mut W,
    ) -> io::Result<Outcome> {
        let fs = &self.fs;
        let node = h.nodeid;
        match h.opcode {
            opcode::INIT => self.do_init(h, a, w),
            opcode::DESTROY => {
                self.fs.destroy();
                self.initialized.store(false, Ordering::Release);
                self.ok(w, h, &[])
            }
            opcode::LOOKUP => {
                need_room(w, ENTRY_REPLY_SIZE)?;
                let name = a.name()?;
                let e = fs.lookup(ctx, node, name)?;
                self.ok(w, h, &[entry_out(&e).as_bytes()])
            }
            opcode::FORGET => {
                let f: abi::ForgetIn = a.take()?;
                fs.forget(ctx, node, f.nlookup);
                Ok(Outcome::NoReply)
            }
            opcode::BATCH_FORGET => {
                let b: abi::BatchForgetIn = a.take()?;
                let count = b.count as usize;
                if count
                    .checked_mul(size_of::<abi::ForgetOne>())
                    .is_none_or(|n| n > a.bytes.len())
                {
                    warn!("BATCH_FORGET count {count} exceeds the request; refused");
                    return Ok(Outcome::NoReply);
                }
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    let f: abi::ForgetOne = a.take()?;
                    items.push((f.nodeid, f.nlookup));
                }
                fs.batch_forget(ctx, &items);
                Ok(Outcome::NoReply)
            }
            opcode::GETATTR => {
                let g: abi::GetattrIn = a.take()?;
                let fh = (g.getattr_flags & abi::GETATTR_FH != 0).then_some(g.fh);
                let (st, t) = fs.getattr(ctx, node, fh)?;
                self.ok(w, h, &[attr_out(&st, t).as_bytes()])
            }
            opcode::SETATTR => {
                let s: abi::SetattrIn = a.take()?;
                let v = s.valid;
                use abi::fattr;
                let attr = SetAttr {
                    mode: (v & fattr::MODE != 0).then_some(s.mode),
                    uid: (v & fattr::UID != 0).then_some(s.uid),
                    gid: (v & fattr::GID != 0).then_some(s.gid),
                    size: (v & fattr::SIZE != 0).then_some(s.size),
                    atime: set_time(
                        v & fattr::ATIME != 0,
                        v & fattr::ATIME_NOW != 0,
                        s.atime,
                        s.atimensec,
                    ),
                    mtime: set_time(
                        v & fattr::MTIME != 0,
                        v & fattr::MTIME_NOW != 0,
                        s.mtime,
                        s.mtimensec,
                    ),
                    kill_suidgid: v & fattr::KILL_SUIDGID != 0,
                };
                let fh = (v & fattr::FH != 0).then_some(s.fh);
                let (st, t) = fs.setattr(ctx, node, attr, fh)?;
                self.ok(w, h, &[attr_out(&st, t).as_bytes()])
            }
            opcode::READLINK => {
                let target = fs.readlink(ctx, node)?;
                self.ok(w, h, &[&target])
            }
            opcode::SYMLINK => {
                need_room(w, ENTRY_REPLY_SIZE)?;
                let name = a.name()?;
                let target = a.cstr(PATH_MAX)?;
                let e = fs.symlink(ctx, target, node, name, secctx)?;
                self.ok(w, h, &[entry_out(&e).as_bytes()])
            }
            opcode::MKNOD => {
                need_room(w, ENTRY_REPLY_SIZE)?;
                let m: abi::MknodIn = a.take()?;
                let name = a.name()?;
                let e = fs.mknod(ctx, node, name, m.mode, m.rdev, m.umask, secctx)?;
                self.ok(w, h, &[entry_out(&e).as_bytes()])
            }
            opcode::MKDIR => {
                need_room(w, ENTRY_REPLY_SIZE)?;
                let m: abi::MkdirIn = a.take()?;
                let name = a.name()?;
                let e = fs.mkdir(ctx, node, name, m.mode, m.umask, secctx)?;
                self.ok(w, h, &[entry_out(&e).as_bytes()])
            }
            opcode::UNLINK => {
                fs.unlink(ctx, node, a.name()?)?;
                self.ok(w, h, &[])
            }
            opcode::RMDIR => {
                fs.rmdir(ctx, node, a.name()?)?;
                self.ok(w, h, &[])
            }
            opcode::RENAME => {
                let r: abi::RenameIn = a.take()?;
                let old = a.name()?;
                let new = a.name()?;
                fs.rename(ctx, node, old, r.newdir, new, 0)?;
                self.ok(w, h, &[])
            }
            opcode::RENAME2 => {
                let r: abi::Rename2In = a.take()?;
                let old = a.name()?;
                let new = a.name()?;
                let mut ctx = *ctx;
                if self.options() & abi::init::ALLOW_IDMAP != 0
                    && r.flags & libc::RENAME_WHITEOUT == 0
                {
                    // Only a rename that leaves a whiteout creates an inode.
                    without_ids(&mut ctx);
                }
                fs.rename(&ctx, node, old, r.newdir, new, r.flags)?;
                self.ok(w, h, &[])
            }
            opcode::LINK => {
                need_room(w, ENTRY_REPLY_SIZE)?;
                let l: abi::LinkIn = a.take()?;
                let name = a.name()?;
                let e = fs.link(ctx, l.oldnodeid, node, name)?;
                self.ok(w, h, &[entry_out(&e).as_bytes()])
            }
            opcode::OPEN => {
                need_room(w, OPEN_REPLY_SIZE)?;
                let o: abi::OpenIn = a.take()?;
                let opened = fs.open(ctx, node, o.flags, o.open_flags)?;
                self.ok(w, h, &[open_out(&opened).as_bytes()])
            }
            opcode::CREATE => {
                need_room(w, CREATE_REPLY_SIZE)?;
                let c: abi::CreateIn = a.take()?;
                let name = a.name()?;
                let (e, opened) = fs.create(
                    ctx,
                    node,
                    name,
                    c.mode,
                    c.flags,
                    c.umask,
                    c.open_flags,
                    secctx,
                )?;
                self.ok(
                    w,
                    h,
                    &[entry_out(&e).as_bytes(), open_out(&opened).as_bytes()],
                )
            }
            opcode::TMPFILE => {
                need_room(w, CREATE_REPLY_SIZE)?;
                let c: abi::CreateIn = a.take()?;
                let (e, opened) = fs.tmpfile(ctx, node, c.mode, c.flags, c.umask, secctx)?;
                self.ok(
                    w,
                    h,
                    &[entry_out(&e).as_bytes(), open_out(&opened).as_bytes()],
                )
            }
            opcode::READ => self.do_read(ctx, h, a, w),
            opcode::STATFS => {
                let s = fs.statfs(ctx, node)?;
                let out = abi::Kstatfs {
                    blocks: s.f_blocks,
                    bfree: s.f_bfree,
                    bavail: s.f_bavail,
                    files: s.f_files,
                    ffree: s.f_ffree,
                    bsize: s.f_bsize as u32,
                    namelen: s.f_namemax as u32,
                    frsize: s.f_frsize as u32,
                    padding: 0,
                    spare: [0; 6],
                };
                self.ok(w, h, &[out.as_bytes()])
            }
            opcode::RELEASE => {
                let r: abi::ReleaseIn = a.take()?;
                fs.release(ctx, node, r.flags, r.fh)?;
                self.ok(w, h, &[])
            }
            opcode::RELEASEDIR => {
                let r: abi::ReleaseIn = a.take()?;
                fs.releasedir(ctx, node, r.flags, r.fh)?;
                self.ok(w, h, &[])
            }
            opcode::FSYNC | opcode::FSYNCDIR => {
                let f: abi::FsyncIn = a.take()?;
                let datasync = f.fsync_flags & abi::FSYNC_FDATASYNC != 0;
                if h.opcode == opcode::FSYNC {
                    fs.fsync(ctx, node, datasync, f.fh)?;
                } else {
                    fs.fsyncdir(ctx, node, datasync, f.fh)?;
                }
                self.ok(w, h, &[])
            }
            opcode::FLUSH => {
                let f: abi::FlushIn = a.take()?;
                fs.flush(ctx, node, f.fh, f.lock_owner)?;
                self.ok(w, h, &[])
            }
            opcode::SETXATTR => {
                let (size, flags, setxattr_flags) = if self.options() & abi::init::SETXATTR_EXT != 0
                {
                    let s: abi::SetxattrIn = a.take()?;
                    (s.size, s.flags, s.setxattr_flags)
                } else {
                    let s: abi::SetxattrInCompat = a.take()?;
                    (s.size, s.flags, 0)
                };
                if size > XATTR_SIZE_MAX {
                    return Err(errno(libc::E2BIG));
                }
                let name = a.name()?;
                let value = a.bytes(size as usize)?;
                fs.setxattr(ctx, node, name, value, flags, setxattr_flags)?;
                self.ok(w, h, &[])
            }
            opcode::GETXATTR => {
                let g: abi::GetxattrIn = a.take()?;
                let name = a.name()?;
                let reply = fs.getxattr(ctx, node, name, g.size)?;
                self.xattr_reply(w, h, reply, g.size)
            }
            opcode::LISTXATTR => {
                let g: abi::GetxattrIn = a.take()?;
                let reply = fs.listxattr(ctx, node, g.size)?;
                self.xattr_reply(w, h, reply, g.size)
            }
            opcode::REMOVEXATTR => {
                fs.removexattr(ctx, node, a.name()?)?;
                self.ok(w, h, &[])
            }
            opcode::OPENDIR => {
                need_room(w, OPEN_REPLY_SIZE)?;
                let o: abi::OpenIn = a.take()?;
                let opened = fs.opendir(ctx, node, o.flags)?;
                self.ok(w, h, &[open_out(&opened).as_bytes()])
            }
            opcode::READDIR => self.do_readdir(ctx, h, a, w, false),
            opcode::READDIRPLUS => self.do_readdir(ctx, h, a, w, true),
            opcode::ACCESS => {
                let acc: abi::AccessIn = a.take()?;
                // Without a caller identity (idmapped mounts) there is nobody to check the mode
                // bits for: the kernel has checked them itself (ALLOW_IDMAP needs
                // default_permissions, under which it does not even send ACCESS). Only whether
                // the node still exists is answered; nothing is granted or denied by uid/gid.
                let mask = if has_identity(ctx) {
                    acc.mask
                } else {
                    libc::F_OK as u32
                };
                fs.access(ctx, node, mask)?;
                self.ok(w, h, &[])
            }
            opcode::FALLOCATE => {
                let f: abi::FallocateIn = a.take()?;
                let kill_priv = self.killpriv_v2();
                fs.fallocate(ctx, node, f.fh, f.mode, f.offset, f.length, kill_priv)?;
                self.ok(w, h, &[])
            }
            opcode::LSEEK => {
                let l: abi::LseekIn = a.take()?;
                let offset = fs.lseek(ctx, node, l.fh, l.offset, l.whence)?;
                self.ok(w, h, &[abi::LseekOut { offset }.as_bytes()])
            }
            opcode::COPY_FILE_RANGE => {
                let c: abi::CopyFileRangeIn = a.take()?;
                let n = fs.copy_file_range(
                    ctx,
                    node,
                    c.fh_in,
                    c.off_in,
                    c.nodeid_out,
                    c.fh_out,
                    c.off_out,
                    c.len,
                    c.flags,
                    self.killpriv_v2(),
                )?;
                // The reply carries a 32-bit count; a larger copy is reported as a short one.
                let size = u32::try_from(n).unwrap_or(u32::MAX);
                self.ok(w, h, &[abi::WriteOut { size, padding: 0 }.as_bytes()])
            }
            opcode::SYNCFS => {
                let _: abi::SyncfsIn = a.take()?;
                fs.syncfs(ctx, node)?;
                self.ok(w, h, &[])
            }
            opcode::INTERRUPT => {
                // Requests are answered synchronously; there is nothing to interrupt.
                Ok(Outcome::NoReply)
            }
            other => {
                debug!("unsupported opcode {other}");
                Err(errno(libc::ENOSYS))
            }
        }
    }

    fn do_init<W: Writer>(
        &self,
        h: &abi::InHeader,
        mut a: Args<'_>,
        w: &mut W,
    ) -> io::Result<Outcome> {
        let i: abi::InitInCompat = a.take()?;
        if i.major < abi::KERNEL_VERSION
            || (i.major == abi::KERNEL_VERSION && i.minor < abi::MIN_KERNEL_MINOR_VERSION)
        {
            warn!(
                "FUSE protocol {}.{} is too old (need {}.{}+)",
                i.major,
                i.minor,
                abi::KERNEL_VERSION,
                abi::MIN_KERNEL_MINOR_VERSION
            );
            return Err(errno(libc::EPROTO));
        }
        if i.major > abi::KERNEL_VERSION {
            // Answer with our major version only; the client retries with it.
            let out = abi::InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                ..Default::default()
            };
            return self.ok(w, h, &[out.as_bytes()]);
        }
        let mut capable = u64::from(i.flags);
        if capable & abi::init::INIT_EXT != 0 {
            if let Ok(ext) = a.take::<abi::InitInExt>() {
                capable |= u64::from(ext.flags2) << 32;
            }
        }
        let minor = i.minor.min(abi::KERNEL_MINOR_VERSION);
        if minor < abi::ALLOW_IDMAP_MINOR_VERSION {
            // Not part of the protocol version the two sides agree on.
            capable &= !abi::init::ALLOW_IDMAP;
        }
        let enabled = self.agree(capable)?;
        self.capable.store(capable, Ordering::Relaxed);
        self.options.store(enabled, Ordering::Relaxed);
        self.initialized.store(true, Ordering::Release);

        let out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor,
            max_readahead: i.max_readahead,
            flags: enabled as u32,
            max_background: 64,
            congestion_threshold: 48,
            max_write: MAX_WRITE_SIZE,
            time_gran: 1,
            max_pages: MAX_PAGES,
            map_alignment: 0,
            flags2: (enabled >> 32) as u32,
            max_stack_depth: 0,
            unused: [0; 6],
        };
        log::info!(
            "FUSE session started: protocol {}.{}, flags {:#x}",
            out.major,
            out.minor,
            enabled
        );
        self.ok(w, h, &[out.as_bytes()])
    }

    fn do_read<W: Writer>(
        &self,
        ctx: &Context,
        h: &abi::InHeader,
        mut a: Args<'_>,
        w: &mut W,
    ) -> io::Result<Outcome> {
        let ri: abi::ReadIn = a.take()?;
        if w.remaining() < OUT_HEADER_SIZE {
            return Err(einval());
        }
        let size = ri.size.min(MAX_WRITE_SIZE);
        let mut data = w.split_at(OUT_HEADER_SIZE)?;
        let n = self
            .fs
            .read(ctx, h.nodeid, ri.fh, &mut data, size, ri.offset)?;
        let total = OUT_HEADER_SIZE + n;
        let out = abi::OutHeader {
            len: total as u32,
            error: 0,
            unique: h.unique,
        };
        w.write_all(out.as_bytes())?;
        Ok(Outcome::Reply(total))
    }

    fn do_write<R: Reader, W: Writer>(
        &self,
        ctx: &Context,
        h: &abi::InHeader,
        body_len: usize,
        r: &mut R,
        w: &mut W,
    ) -> io::Result<Outcome> {
        let mut wb = [0u8; size_of::<abi::WriteIn>()];
        if body_len < wb.len() {
            return Err(einval());
        }
        r.read_exact(&mut wb)?;
        let wi = abi::WriteIn::from_prefix(&wb).ok_or_else(einval)?;
        // The header's ids of a write-back (WRITE_CACHE) are no caller's: the debug log shows
        // the flags so that the two kinds can be told apart.
        debug!(
            "write unique={} nodeid={} offset={} size={} write_flags={:#x}{}",
            h.unique,
            h.nodeid,
            wi.offset,
            wi.size,
            wi.write_flags,
            if wi.write_flags & abi::WRITE_CACHE != 0 {
                " (page cache write-back)"
            } else {
                ""
            }
        );
        let data_len = body_len - wb.len();
        if wi.size as usize > data_len {
            warn!(
                "WRITE of {} bytes carries only {} bytes of data; refused",
                wi.size, data_len
            );
            return Err(einval());
        }
        if wi.size > MAX_WRITE_SIZE {
            return Err(errno(libc::E2BIG));
        }
        let kill_priv = wi.write_flags & abi::WRITE_KILL_SUIDGID != 0;
        let n = self
            .fs
            .write(ctx, h.nodeid, wi.fh, r, wi.size, wi.offset, kill_priv)?;
        let out = abi::WriteOut {
            size: n as u32,
            padding: 0,
        };
        self.ok(w, h, &[out.as_bytes()])
    }

    fn do_readdir<W: Writer>(
        &self,
        ctx: &Context,
        h: &abi::InHeader,
        mut a: Args<'_>,
        w: &mut W,
        plus: bool,
    ) -> io::Result<Outcome> {
        let ri: abi::ReadIn = a.take()?;
        if w.remaining() < OUT_HEADER_SIZE {
            return Err(einval());
        }
        let mut data = w.split_at(OUT_HEADER_SIZE)?;
        let limit = (ri.size as usize).min(data.remaining());
        let mut used = 0usize;
        // One record at a time, assembled on the stack and written with one copy.
        let mut rec = [0u8; size_of::<abi::EntryOut>() + size_of::<abi::Dirent>() + NAME_MAX + 8];
        let mut push = |d: &DirEntry<'_>, e: Option<&Entry>| -> io::Result<usize> {
            if d.name.is_empty() || d.name.len() > NAME_MAX {
                // Cannot be encoded; the host should never produce it.
                return Err(errno(libc::EIO));
            }
            let size = if e.is_some() {
                abi::direntplus_size(d.name.len())
            } else {
                abi::dirent_size(d.name.len())
            };
            if used + size > limit {
                return Ok(0);
            }
            let mut at = 0;
            if let Some(e) = e {
                let eo = entry_out(e);
                rec[..size_of::<abi::EntryOut>()].copy_from_slice(eo.as_bytes());
                at = size_of::<abi::EntryOut>();
            }
            let de = abi::Dirent {
                ino: d.ino,
                off: d.offset,
                namelen: d.name.len() as u32,
                typ: d.type_,
            };
            rec[at..at + size_of::<abi::Dirent>()].copy_from_slice(de.as_bytes());
            at += size_of::<abi::Dirent>();
            rec[at..at + d.name.len()].copy_from_slice(d.name);
            at += d.name.len();
            rec[at..size].fill(0);
            data.write_all(&rec[..size])?;
            used += size;
            Ok(size)
        };
        if plus {
            self.fs
                .readdirplus(ctx, h.nodeid, ri.fh, ri.size, ri.offset, &mut |d, e| {
                    push(&d, Some(&e))
                })?;
        } else {
            self.fs
                .readdir(ctx, h.nodeid, ri.fh, ri.size, ri.offset, &mut |d| {
                    push(&d, None)
                })?;
        }
        let total = OUT_HEADER_SIZE + used;
        let out = abi::OutHeader {
            len: total as u32,
            error: 0,
            unique: h.unique,
        };
        w.write_all(out.as_bytes())?;
        Ok(Outcome::Reply(total))
    }

    fn xattr_reply<W: Writer>(
        &self,
        w: &mut W,
        h: &abi::InHeader,
        reply: XattrReply,
        size: u32,
    ) -> io::Result<Outcome> {
        match reply {
            XattrReply::Size(n) => self.ok(
                w,
                h,
                &[abi::GetxattrOut {
                    size: n,
                    padding: 0,
                }
                .as_bytes()],
            ),
            XattrReply::Data(v) => {
                if v.len() > size as usize {
                    return Err(errno(libc::ERANGE));
                }
                self.ok(w, h, &[&v])
            }
        }
    }

    /// Writes a successful reply made of `parts`.
    fn ok<W: Writer>(&self, w: &mut W, h: &abi::InHeader, parts: &[&[u8]]) -> io::Result<Outcome> {
        let total = OUT_HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
        if total > w.remaining() {
            warn!(
                "reply of {} bytes to opcode {} does not fit the {} byte reply buffer",
                total,
                h.opcode,
                w.remaining()
            );
            return Err(errno(libc::ERANGE));
        }
        let out = abi::OutHeader {
            len: total as u32,
            error: 0,
            unique: h.unique,
        };
        w.write_all(out.as_bytes())?;
        for p in parts {
            w.write_all(p)?;
        }
        Ok(Outcome::Reply(total))
    }

    fn reply_error<W: Writer>(&self, w: &mut W, unique: u64, e: io::Error) -> Result<usize> {
        let code = e.raw_os_error().unwrap_or(libc::EIO);
        debug!("reply unique={unique} error={code}");
        let out = abi::OutHeader {
            len: OUT_HEADER_SIZE as u32,
            error: -code,
            unique,
        };
        if w.bytes_written() != 0 || w.remaining() < OUT_HEADER_SIZE {
            return Err(ServerError::NoRoomForReply);
        }
        w.write_all(out.as_bytes())
            .map_err(ServerError::ReplyWrite)?;
        Ok(OUT_HEADER_SIZE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::io::{SliceReader, VecWriter};
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
            w: &mut dyn crate::fuse::io::ZeroCopyWriter,
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
}
