//! FUSE request dispatch: reads one request from a [`Reader`], calls the [`FileSystem`], and
//! writes the reply to a [`Writer`].
//!
//! Everything the client sends is checked before use: the header length against the bytes the
//! request really carries, each argument struct against the body length, names for their NUL
//! terminator. A malformed request gets an error reply when it carried a readable header, and is
//! refused with a [`ServerError`] otherwise; the server never panics on input.
//!
//! [`Server::handle_message`] checks the header and reads the body into a per-thread buffer
//! (WRITE's data stays in the request); `dispatch` then hands the request to its handler, one
//! method per opcode named after it (`lookup`, `getattr`, ...). Opcodes are [`Opcode`]s; a
//! number the protocol does not define, and a request this server does not serve, get `ENOSYS`.

use std::cell::RefCell;
use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use log::debug;

use super::abi::{self, Opcode, OpcodeName, Pod, UnknownOpcode};
use super::io::{Reader, Writer};
use crate::filesystem::{
    errno, Context, DirEntry, Entry, FileLock, FileSystem, LateReply, LockKind, SecCtx, SetAttr,
    SetTime, XattrReply,
};
use crate::migration::{self, Decoder, Encoder, StateError};
use crate::throttle::warn_throttled;

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

/// Size of a reply header (and of a reply that carries no data).
pub const OUT_HEADER_SIZE: usize = size_of::<abi::OutHeader>();

/// Why a request could not even be answered.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The request is shorter than a FUSE header.
    #[error("request shorter than a FUSE header")]
    ShortHeader,
    /// The reply buffer cannot hold a reply header.
    #[error("reply buffer cannot hold a reply header")]
    NoRoomForReply,
    /// Writing the reply into the reply buffer failed.
    #[error("failed to write the reply")]
    ReplyWrite(#[source] io::Error),
}

type Result<T> = std::result::Result<T, ServerError>;

fn einval() -> io::Error {
    errno(libc::EINVAL)
}

thread_local! {
    /// Per-thread buffer for request bodies, reused across requests.
    static BODY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A cursor over a request's arguments (its body without the extensions): each call takes the
/// next argument, checked against what is left.
struct Body<'a> {
    /// What is not taken yet.
    rest: &'a [u8],
}

impl<'a> Body<'a> {
    /// The next argument struct.
    fn take<T: Pod>(&mut self) -> io::Result<T> {
        let v = T::from_prefix(self.rest).ok_or_else(einval)?;
        self.rest = &self.rest[size_of::<T>()..];
        Ok(v)
    }

    /// A NUL-terminated string of at most `max` bytes (without the NUL).
    fn cstr(&mut self, max: usize) -> io::Result<&'a CStr> {
        let nul = self.rest.iter().position(|&b| b == 0).ok_or_else(einval)?;
        if nul > max {
            return Err(errno(libc::ENAMETOOLONG));
        }
        let (s, rest) = self.rest.split_at(nul + 1);
        self.rest = rest;
        CStr::from_bytes_with_nul(s).map_err(|_| einval())
    }

    /// A name component: a string of at most `NAME_MAX` bytes.
    fn name(&mut self) -> io::Result<&'a CStr> {
        self.cstr(NAME_MAX)
    }

    /// The next `len` bytes.
    fn bytes(&mut self, len: usize) -> io::Result<&'a [u8]> {
        if len > self.rest.len() {
            return Err(einval());
        }
        let (b, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(b)
    }
}

/// What a transport gives the server to answer a request later: called with the request's
/// `unique`, it takes the request's reply buffer over and returns the [`LateReply`] that
/// answers it, or `None` when this transport cannot answer later.
pub type Defer<'a> = &'a mut dyn FnMut(u64) -> Option<LateReply>;

/// How [`Server::handle_request`] left a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Answered with this many reply bytes (0: the request takes no reply).
    Reply(usize),
    /// To be answered later, through the [`LateReply`] the transport gave.
    Deferred,
}

/// The reply of a request that carries no data: success (`errno` 0) or the error `errno`.
pub fn status_reply(unique: u64, errno: i32) -> [u8; OUT_HEADER_SIZE] {
    let out = abi::OutHeader {
        len: OUT_HEADER_SIZE as u32,
        error: -errno,
        unique,
    };
    let mut b = [0u8; OUT_HEADER_SIZE];
    b.copy_from_slice(out.as_bytes());
    b
}

/// A request on its way to its handler, its body read.
struct Request<'a> {
    /// The caller: with idmapped mounts, no ids unless the request creates an inode.
    ctx: &'a Context,
    /// The header: `nodeid` names the node the request is about, `unique` goes in the reply.
    h: &'a abi::InHeader,
    /// The arguments not taken yet.
    body: Body<'a>,
    /// The security contexts to give a new inode (none unless agreed in INIT).
    secctx: &'a [SecCtx<'a>],
    /// How to answer later (SETLKW), when the transport can.
    defer: Option<Defer<'a>>,
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
        // st_nlink is a u64 on x86_64, a u32 already on aarch64.
        #[allow(clippy::useless_conversion)]
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
        warn_throttled!(
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

/// A request this server does not serve (or an opcode the protocol does not have).
fn unsupported(op: impl std::fmt::Display) -> io::Result<Outcome> {
    debug!("unsupported opcode {op}");
    Err(errno(libc::ENOSYS))
}

/// The attributes a SETATTR sets: only those its `valid` bits name.
fn set_attr(s: &abi::SetattrIn) -> SetAttr {
    use abi::fattr;
    let v = s.valid;
    SetAttr {
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
    }
}

/// The arguments of FSYNC and FSYNCDIR: whether only the data is to be synced, and the handle.
fn fsync_args(a: &mut Body<'_>) -> io::Result<(bool, u64)> {
    let f: abi::FsyncIn = a.take()?;
    Ok((f.fsync_flags & abi::FSYNC_FDATASYNC != 0, f.fh))
}

/// What a handler produced: a reply to send, nothing (FORGET, BATCH_FORGET), or a reply that
/// comes later (a SETLKW that waits).
enum Outcome {
    Reply(usize),
    NoReply,
    Deferred,
}

/// The wire form of a lock the filesystem gives.
fn wire_lock(l: &FileLock) -> abi::FileLock {
    abi::FileLock {
        start: l.start,
        end: l.end,
        typ: l.typ,
        pid: l.pid,
    }
}

/// A lock as the guest sent it (checked by the filesystem).
fn file_lock(l: &abi::FileLock) -> FileLock {
    FileLock {
        typ: l.typ,
        start: l.start,
        end: l.end,
        pid: l.pid,
    }
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
    /// Called once the reply to the guest's INIT is made (see [`Server::on_session_start`]).
    on_session_start: std::sync::OnceLock<SessionHook>,
}

/// What [`Server::on_session_start`] runs.
pub type SessionHook = Box<dyn Fn() + Send + Sync>;

impl<F: FileSystem> Server<F> {
    pub fn new(fs: F) -> Self {
        Server {
            fs,
            options: AtomicU64::new(0),
            capable: AtomicU64::new(0),
            initialized: AtomicBool::new(false),
            state_taken: AtomicBool::new(false),
            on_session_start: std::sync::OnceLock::new(),
        }
    }

    /// Has `hook` run on the thread that serves the guest's INIT, each time one starts a
    /// session, right after its reply is made and before it is returned to the guest: what
    /// only a daemon that serves no session may hold (a migration destination's capability)
    /// is given up before the guest hears that its session started, whatever thread, pass
    /// or poll serves it. One hook per server; a second is refused (`false`).
    pub fn on_session_start(&self, hook: SessionHook) -> bool {
        self.on_session_start.set(hook).is_ok()
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
    /// request takes no reply). A SETLKW that waits holds this thread until it is answered:
    /// transports that can answer later use [`Server::handle_request`].
    pub fn handle_message<R: Reader, W: Writer>(&self, r: R, w: W) -> Result<usize> {
        match self.handle_request(r, w, &mut |_| None)? {
            Handled::Reply(n) => Ok(n),
            Handled::Deferred => Ok(0),
        }
    }

    /// Handles one request, as [`Server::handle_message`]; a request that cannot be answered
    /// now (a SETLKW whose lock is taken) is left to the [`LateReply`] `defer` gives, and
    /// [`Handled::Deferred`] returned: nothing was written to `w`.
    pub fn handle_request<R: Reader, W: Writer>(
        &self,
        mut r: R,
        mut w: W,
        defer: Defer<'_>,
    ) -> Result<Handled> {
        let mut hb = [0u8; size_of::<abi::InHeader>()];
        r.read_exact(&mut hb)
            .map_err(|_| ServerError::ShortHeader)?;
        let h = abi::InHeader::from_prefix(&hb).ok_or(ServerError::ShortHeader)?;
        let op = Opcode::try_from(h.opcode);
        let mut ctx = Context {
            uid: h.uid,
            gid: h.gid,
            pid: h.pid,
            supp_group: None,
        };
        debug!(
            "request unique={} opcode={} nodeid={} len={} uid={} gid={}",
            h.unique,
            OpcodeName(h.opcode),
            h.nodeid,
            h.len,
            h.uid,
            h.gid
        );
        if self.options() & abi::init::ALLOW_IDMAP != 0
            && !op.is_ok_and(Opcode::carries_creator_ids)
        {
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
                warn_throttled!(
                    "request unique={} opcode={}: header length {} does not match the {} bytes \
                     supplied",
                    h.unique,
                    OpcodeName(h.opcode),
                    h.len,
                    r.remaining() + size_of::<abi::InHeader>()
                );
                return self
                    .reply_error(&mut w, h.unique, einval())
                    .map(Handled::Reply);
            }
        };

        if op != Ok(Opcode::Init) && !self.initialized.load(Ordering::Acquire) {
            warn_throttled!(
                "request opcode {} before FUSE_INIT refused",
                OpcodeName(h.opcode)
            );
            return self
                .reply_error(&mut w, h.unique, errno(libc::EIO))
                .map(Handled::Reply);
        }

        let result = match op {
            // WRITE data goes from the request straight to the file, not through the body
            // buffer: the one request served before its body is read.
            Ok(Opcode::Write) => self.write(&ctx, &h, body_len, &mut r, &mut w),
            _ if body_len > MAX_BODY_SIZE => {
                warn_throttled!(
                    "request unique={} opcode={}: body of {} bytes exceeds the {} byte limit",
                    h.unique,
                    OpcodeName(h.opcode),
                    body_len,
                    MAX_BODY_SIZE
                );
                Err(errno(libc::E2BIG))
            }
            _ => self.with_body(ctx, &h, body_len, &mut r, defer, |rq| match op {
                Ok(op) => self.dispatch(op, rq, &mut w),
                Err(UnknownOpcode(n)) => unsupported(n),
            }),
        };

        match result {
            Ok(Outcome::Reply(n)) => Ok(Handled::Reply(n)),
            Ok(Outcome::NoReply) => Ok(Handled::Reply(0)),
            Ok(Outcome::Deferred) => Ok(Handled::Deferred),
            Err(e) => self.reply_error(&mut w, h.unique, e).map(Handled::Reply),
        }
    }

    /// Reads the body of a request into this thread's buffer and calls `f` with the request:
    /// the caller (its supplementary group taken from the extensions), the arguments, and the
    /// security contexts it carried (none unless agreed in INIT).
    fn with_body<R: Reader, T>(
        &self,
        mut ctx: Context,
        h: &abi::InHeader,
        body_len: usize,
        r: &mut R,
        defer: Defer<'_>,
        f: impl FnOnce(Request<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
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
            f(Request {
                ctx: &ctx,
                h,
                body: Body {
                    rest: &buf[..args_len],
                },
                secctx,
                defer: Some(defer),
            })
        })
    }

    /// The dispatch table: one handler per opcode, in the order of their numbers.
    fn dispatch<W: Writer>(&self, op: Opcode, rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        match op {
            Opcode::Lookup => self.lookup(rq, w),
            Opcode::Forget => self.forget(rq),
            Opcode::Getattr => self.getattr(rq, w),
            Opcode::Setattr => self.setattr(rq, w),
            Opcode::Readlink => self.readlink(rq, w),
            Opcode::Symlink => self.symlink(rq, w),
            Opcode::Mknod => self.mknod(rq, w),
            Opcode::Mkdir => self.mkdir(rq, w),
            Opcode::Unlink => self.unlink(rq, w),
            Opcode::Rmdir => self.rmdir(rq, w),
            Opcode::Rename => self.rename(rq, w),
            Opcode::Link => self.link(rq, w),
            Opcode::Open => self.open(rq, w),
            Opcode::Read => self.read(rq, w),
            // Served by `handle_message` before any body is read; never dispatched.
            Opcode::Write => Err(einval()),
            Opcode::Statfs => self.statfs(rq, w),
            Opcode::Release => self.release(rq, w),
            Opcode::Fsync => self.fsync(rq, w),
            Opcode::Setxattr => self.setxattr(rq, w),
            Opcode::Getxattr => self.getxattr(rq, w),
            Opcode::Listxattr => self.listxattr(rq, w),
            Opcode::Removexattr => self.removexattr(rq, w),
            Opcode::Flush => self.flush(rq, w),
            Opcode::Init => self.init(rq, w),
            Opcode::Opendir => self.opendir(rq, w),
            Opcode::Readdir => self.readdir(rq, w),
            Opcode::Releasedir => self.releasedir(rq, w),
            Opcode::Fsyncdir => self.fsyncdir(rq, w),
            Opcode::Access => self.access(rq, w),
            Opcode::Create => self.create(rq, w),
            // The Linux virtio-fs client never sends one (it drops interrupts); a SETLKW that
            // waits ends when its lock is taken or refused (doc/locks.md).
            Opcode::Interrupt => Ok(Outcome::NoReply),
            Opcode::Destroy => self.destroy(rq, w),
            Opcode::BatchForget => self.batch_forget(rq),
            Opcode::Fallocate => self.fallocate(rq, w),
            Opcode::Readdirplus => self.readdirplus(rq, w),
            Opcode::Rename2 => self.rename2(rq, w),
            Opcode::Lseek => self.lseek(rq, w),
            Opcode::CopyFileRange => self.copy_file_range(rq, w),
            Opcode::Syncfs => self.syncfs(rq, w),
            Opcode::Tmpfile => self.tmpfile(rq, w),
            Opcode::Getlk => self.getlk(rq, w),
            Opcode::Setlk => self.setlk(rq, w, false),
            Opcode::Setlkw => self.setlk(rq, w, true),
            Opcode::Bmap
            | Opcode::Ioctl
            | Opcode::Poll
            | Opcode::NotifyReply
            | Opcode::SetupMapping
            | Opcode::RemoveMapping
            | Opcode::Statx => unsupported(op),
        }
    }
}

/// The handlers, one per request: each takes its arguments from the body, calls the filesystem
/// and writes the reply.
impl<F: FileSystem> Server<F> {
    fn lookup<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, ENTRY_REPLY_SIZE)?;
        let name = rq.body.name()?;
        let e = self.fs.lookup(rq.ctx, rq.h.nodeid, name)?;
        self.ok(w, rq.h, &[entry_out(&e).as_bytes()])
    }

    fn forget(&self, mut rq: Request<'_>) -> io::Result<Outcome> {
        let f: abi::ForgetIn = rq.body.take()?;
        self.fs.forget(rq.ctx, rq.h.nodeid, f.nlookup);
        Ok(Outcome::NoReply)
    }

    fn getattr<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let g: abi::GetattrIn = rq.body.take()?;
        let fh = (g.getattr_flags & abi::GETATTR_FH != 0).then_some(g.fh);
        let (st, t) = self.fs.getattr(rq.ctx, rq.h.nodeid, fh)?;
        self.ok(w, rq.h, &[attr_out(&st, t).as_bytes()])
    }

    fn setattr<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let s: abi::SetattrIn = rq.body.take()?;
        let fh = (s.valid & abi::fattr::FH != 0).then_some(s.fh);
        let (st, t) = self.fs.setattr(rq.ctx, rq.h.nodeid, set_attr(&s), fh)?;
        self.ok(w, rq.h, &[attr_out(&st, t).as_bytes()])
    }

    fn readlink<W: Writer>(&self, rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let target = self.fs.readlink(rq.ctx, rq.h.nodeid)?;
        self.ok(w, rq.h, &[&target])
    }

    fn symlink<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, ENTRY_REPLY_SIZE)?;
        let name = rq.body.name()?;
        let target = rq.body.cstr(PATH_MAX)?;
        let e = self
            .fs
            .symlink(rq.ctx, target, rq.h.nodeid, name, rq.secctx)?;
        self.ok(w, rq.h, &[entry_out(&e).as_bytes()])
    }

    fn mknod<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, ENTRY_REPLY_SIZE)?;
        let m: abi::MknodIn = rq.body.take()?;
        let name = rq.body.name()?;
        let e = self.fs.mknod(
            rq.ctx,
            rq.h.nodeid,
            name,
            m.mode,
            m.rdev,
            m.umask,
            rq.secctx,
        )?;
        self.ok(w, rq.h, &[entry_out(&e).as_bytes()])
    }

    fn mkdir<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, ENTRY_REPLY_SIZE)?;
        let m: abi::MkdirIn = rq.body.take()?;
        let name = rq.body.name()?;
        let e = self
            .fs
            .mkdir(rq.ctx, rq.h.nodeid, name, m.mode, m.umask, rq.secctx)?;
        self.ok(w, rq.h, &[entry_out(&e).as_bytes()])
    }

    fn unlink<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        self.fs.unlink(rq.ctx, rq.h.nodeid, rq.body.name()?)?;
        self.ok(w, rq.h, &[])
    }

    fn rmdir<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        self.fs.rmdir(rq.ctx, rq.h.nodeid, rq.body.name()?)?;
        self.ok(w, rq.h, &[])
    }

    fn rename<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let r: abi::RenameIn = rq.body.take()?;
        let old = rq.body.name()?;
        let new = rq.body.name()?;
        self.fs.rename(rq.ctx, rq.h.nodeid, old, r.newdir, new, 0)?;
        self.ok(w, rq.h, &[])
    }

    fn link<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, ENTRY_REPLY_SIZE)?;
        let l: abi::LinkIn = rq.body.take()?;
        let name = rq.body.name()?;
        let e = self.fs.link(rq.ctx, l.oldnodeid, rq.h.nodeid, name)?;
        self.ok(w, rq.h, &[entry_out(&e).as_bytes()])
    }

    fn open<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, OPEN_REPLY_SIZE)?;
        let o: abi::OpenIn = rq.body.take()?;
        let opened = self.fs.open(rq.ctx, rq.h.nodeid, o.flags, o.open_flags)?;
        self.ok(w, rq.h, &[open_out(&opened).as_bytes()])
    }

    /// The file's data goes straight into the reply, after the slot left for its header.
    fn read<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let ri: abi::ReadIn = rq.body.take()?;
        if w.remaining() < OUT_HEADER_SIZE {
            return Err(einval());
        }
        let size = ri.size.min(MAX_WRITE_SIZE);
        let mut data = w.split_at(OUT_HEADER_SIZE)?;
        let n = self
            .fs
            .read(rq.ctx, rq.h.nodeid, ri.fh, &mut data, size, ri.offset)?;
        let total = OUT_HEADER_SIZE + n;
        let out = abi::OutHeader {
            len: total as u32,
            error: 0,
            unique: rq.h.unique,
        };
        w.write_all(out.as_bytes())?;
        Ok(Outcome::Reply(total))
    }

    /// Reads the arguments from `r` and leaves the data there, for the filesystem to take
    /// straight from the request.
    fn write<R: Reader, W: Writer>(
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
            warn_throttled!(
                "WRITE of {} bytes carries only {} bytes of data; refused",
                wi.size,
                data_len
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

    fn statfs<W: Writer>(&self, rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let s = self.fs.statfs(rq.ctx, rq.h.nodeid)?;
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
        self.ok(w, rq.h, &[out.as_bytes()])
    }

    fn release<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let r: abi::ReleaseIn = rq.body.take()?;
        self.fs.release(rq.ctx, rq.h.nodeid, r.flags, r.fh)?;
        self.ok(w, rq.h, &[])
    }

    fn getlk<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let l: abi::LkIn = rq.body.take()?;
        let got = self
            .fs
            .getlk(rq.ctx, rq.h.nodeid, l.fh, l.owner, file_lock(&l.lk))?;
        let out = abi::LkOut {
            lk: wire_lock(&got),
        };
        self.ok(w, rq.h, &[out.as_bytes()])
    }

    /// SETLK, and SETLKW (`sleep`): tried at once; a SETLKW whose lock is taken is handed to
    /// the filesystem to wait, and answered later when the transport can (the queue goes on),
    /// or by this thread once the wait ends.
    fn setlk<W: Writer>(&self, mut rq: Request<'_>, w: &mut W, sleep: bool) -> io::Result<Outcome> {
        let l: abi::LkIn = rq.body.take()?;
        let kind = match l.lk_flags & abi::LK_FLOCK {
            0 => LockKind::Posix,
            _ => LockKind::Flock,
        };
        let lock = file_lock(&l.lk);
        let (node, ctx) = (rq.h.nodeid, rq.ctx);
        match self.fs.setlk(ctx, node, l.fh, l.owner, lock, kind) {
            Err(e) if sleep && e.raw_os_error() == Some(libc::EAGAIN) => {}
            r => {
                r?;
                return self.ok(w, rq.h, &[]);
            }
        }
        let unique = rq.h.unique;
        if let Some(reply) = rq.defer.as_mut().and_then(|d| d(unique)) {
            if reply.is_answered() {
                // Its queue stopped meanwhile: answered `ENOLCK` already, nothing to wait for.
                return Ok(Outcome::Deferred);
            }
            if let Err(e) = self
                .fs
                .setlk_wait(ctx, node, l.fh, l.owner, lock, kind, reply.clone())
            {
                reply.answer(e.raw_os_error().unwrap_or(libc::EIO));
            }
            return Ok(Outcome::Deferred);
        }
        // A transport that cannot answer later: this thread waits for the answer.
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = LateReply::new(move |e| {
            let _ = tx.send(e);
        });
        self.fs
            .setlk_wait(ctx, node, l.fh, l.owner, lock, kind, reply)?;
        match rx.recv().unwrap_or(libc::ENOLCK) {
            0 => self.ok(w, rq.h, &[]),
            e => Err(errno(e)),
        }
    }

    fn fsync<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let (datasync, fh) = fsync_args(&mut rq.body)?;
        self.fs.fsync(rq.ctx, rq.h.nodeid, datasync, fh)?;
        self.ok(w, rq.h, &[])
    }

    /// The argument struct has two forms: the longer one once `SETXATTR_EXT` is agreed.
    fn setxattr<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let (size, flags, setxattr_flags) = if self.options() & abi::init::SETXATTR_EXT != 0 {
            let s: abi::SetxattrIn = rq.body.take()?;
            (s.size, s.flags, s.setxattr_flags)
        } else {
            let s: abi::SetxattrInCompat = rq.body.take()?;
            (s.size, s.flags, 0)
        };
        if size > XATTR_SIZE_MAX {
            return Err(errno(libc::E2BIG));
        }
        let name = rq.body.name()?;
        let value = rq.body.bytes(size as usize)?;
        self.fs
            .setxattr(rq.ctx, rq.h.nodeid, name, value, flags, setxattr_flags)?;
        self.ok(w, rq.h, &[])
    }

    fn getxattr<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let g: abi::GetxattrIn = rq.body.take()?;
        let name = rq.body.name()?;
        let reply = self.fs.getxattr(rq.ctx, rq.h.nodeid, name, g.size)?;
        self.xattr_reply(w, rq.h, reply, g.size)
    }

    fn listxattr<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let g: abi::GetxattrIn = rq.body.take()?;
        let reply = self.fs.listxattr(rq.ctx, rq.h.nodeid, g.size)?;
        self.xattr_reply(w, rq.h, reply, g.size)
    }

    fn removexattr<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        self.fs.removexattr(rq.ctx, rq.h.nodeid, rq.body.name()?)?;
        self.ok(w, rq.h, &[])
    }

    fn flush<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let f: abi::FlushIn = rq.body.take()?;
        self.fs.flush(rq.ctx, rq.h.nodeid, f.fh, f.lock_owner)?;
        self.ok(w, rq.h, &[])
    }

    /// Agrees on the protocol version and the flags, and starts the session.
    fn init<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let i: abi::InitInCompat = rq.body.take()?;
        if i.major < abi::KERNEL_VERSION
            || (i.major == abi::KERNEL_VERSION && i.minor < abi::MIN_KERNEL_MINOR_VERSION)
        {
            warn_throttled!(
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
            return self.ok(w, rq.h, &[out.as_bytes()]);
        }
        let mut capable = u64::from(i.flags);
        if capable & abi::init::INIT_EXT != 0 {
            if let Ok(ext) = rq.body.take::<abi::InitInExt>() {
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
        let reply = self.ok(w, rq.h, &[out.as_bytes()]);
        if let Some(hook) = self.on_session_start.get() {
            hook();
        }
        reply
    }

    fn opendir<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, OPEN_REPLY_SIZE)?;
        let o: abi::OpenIn = rq.body.take()?;
        let opened = self.fs.opendir(rq.ctx, rq.h.nodeid, o.flags)?;
        self.ok(w, rq.h, &[open_out(&opened).as_bytes()])
    }

    fn readdir<W: Writer>(&self, rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        self.list_dir(rq, w, false)
    }

    fn releasedir<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let r: abi::ReleaseIn = rq.body.take()?;
        self.fs.releasedir(rq.ctx, rq.h.nodeid, r.flags, r.fh)?;
        self.ok(w, rq.h, &[])
    }

    fn fsyncdir<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let (datasync, fh) = fsync_args(&mut rq.body)?;
        self.fs.fsyncdir(rq.ctx, rq.h.nodeid, datasync, fh)?;
        self.ok(w, rq.h, &[])
    }

    fn access<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let acc: abi::AccessIn = rq.body.take()?;
        // Without a caller identity (idmapped mounts) there is nobody to check the mode bits
        // for: the kernel has checked them itself (ALLOW_IDMAP needs default_permissions,
        // under which it does not even send ACCESS). Only whether the node still exists is
        // answered; nothing is granted or denied by uid/gid.
        let mask = if has_identity(rq.ctx) {
            acc.mask
        } else {
            libc::F_OK as u32
        };
        self.fs.access(rq.ctx, rq.h.nodeid, mask)?;
        self.ok(w, rq.h, &[])
    }

    fn create<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, CREATE_REPLY_SIZE)?;
        let c: abi::CreateIn = rq.body.take()?;
        let name = rq.body.name()?;
        let (e, opened) = self.fs.create(
            rq.ctx,
            rq.h.nodeid,
            name,
            c.mode,
            c.flags,
            c.umask,
            c.open_flags,
            rq.secctx,
        )?;
        self.ok(
            w,
            rq.h,
            &[entry_out(&e).as_bytes(), open_out(&opened).as_bytes()],
        )
    }

    /// Ends the session: the guest unmounted.
    fn destroy<W: Writer>(&self, rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        self.fs.destroy();
        self.initialized.store(false, Ordering::Release);
        self.ok(w, rq.h, &[])
    }

    /// A count beyond what the request carries is refused whole: nothing is forgotten.
    fn batch_forget(&self, mut rq: Request<'_>) -> io::Result<Outcome> {
        let b: abi::BatchForgetIn = rq.body.take()?;
        let count = b.count as usize;
        if count
            .checked_mul(size_of::<abi::ForgetOne>())
            .is_none_or(|n| n > rq.body.rest.len())
        {
            warn_throttled!("BATCH_FORGET count {count} exceeds the request; refused");
            return Ok(Outcome::NoReply);
        }
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            let f: abi::ForgetOne = rq.body.take()?;
            items.push((f.nodeid, f.nlookup));
        }
        self.fs.batch_forget(rq.ctx, &items);
        Ok(Outcome::NoReply)
    }

    fn fallocate<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let f: abi::FallocateIn = rq.body.take()?;
        let kill_priv = self.killpriv_v2();
        self.fs.fallocate(
            rq.ctx,
            rq.h.nodeid,
            f.fh,
            f.mode,
            f.offset,
            f.length,
            kill_priv,
        )?;
        self.ok(w, rq.h, &[])
    }

    fn readdirplus<W: Writer>(&self, rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        self.list_dir(rq, w, true)
    }

    /// With idmapped mounts, the caller's ids count only for a rename that leaves a whiteout:
    /// the only one that creates an inode.
    fn rename2<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let r: abi::Rename2In = rq.body.take()?;
        let old = rq.body.name()?;
        let new = rq.body.name()?;
        let mut ctx = *rq.ctx;
        if self.options() & abi::init::ALLOW_IDMAP != 0 && r.flags & libc::RENAME_WHITEOUT == 0 {
            without_ids(&mut ctx);
        }
        self.fs
            .rename(&ctx, rq.h.nodeid, old, r.newdir, new, r.flags)?;
        self.ok(w, rq.h, &[])
    }

    fn lseek<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let l: abi::LseekIn = rq.body.take()?;
        let offset = self
            .fs
            .lseek(rq.ctx, rq.h.nodeid, l.fh, l.offset, l.whence)?;
        self.ok(w, rq.h, &[abi::LseekOut { offset }.as_bytes()])
    }

    fn copy_file_range<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let c: abi::CopyFileRangeIn = rq.body.take()?;
        let n = self.fs.copy_file_range(
            rq.ctx,
            rq.h.nodeid,
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
        self.ok(w, rq.h, &[abi::WriteOut { size, padding: 0 }.as_bytes()])
    }

    fn syncfs<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        let _: abi::SyncfsIn = rq.body.take()?;
        self.fs.syncfs(rq.ctx, rq.h.nodeid)?;
        self.ok(w, rq.h, &[])
    }

    fn tmpfile<W: Writer>(&self, mut rq: Request<'_>, w: &mut W) -> io::Result<Outcome> {
        need_room(w, CREATE_REPLY_SIZE)?;
        let c: abi::CreateIn = rq.body.take()?;
        let (e, opened) =
            self.fs
                .tmpfile(rq.ctx, rq.h.nodeid, c.mode, c.flags, c.umask, rq.secctx)?;
        self.ok(
            w,
            rq.h,
            &[entry_out(&e).as_bytes(), open_out(&opened).as_bytes()],
        )
    }

    /// READDIR, or READDIRPLUS when `plus`: as many whole entries as fit the size asked for
    /// and the reply buffer.
    fn list_dir<W: Writer>(
        &self,
        mut rq: Request<'_>,
        w: &mut W,
        plus: bool,
    ) -> io::Result<Outcome> {
        let ri: abi::ReadIn = rq.body.take()?;
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
            self.fs.readdirplus(
                rq.ctx,
                rq.h.nodeid,
                ri.fh,
                ri.size,
                ri.offset,
                &mut |d, e| push(&d, Some(&e)),
            )?;
        } else {
            self.fs
                .readdir(rq.ctx, rq.h.nodeid, ri.fh, ri.size, ri.offset, &mut |d| {
                    push(&d, None)
                })?;
        }
        let total = OUT_HEADER_SIZE + used;
        let out = abi::OutHeader {
            len: total as u32,
            error: 0,
            unique: rq.h.unique,
        };
        w.write_all(out.as_bytes())?;
        Ok(Outcome::Reply(total))
    }
}

/// Writing replies.
impl<F: FileSystem> Server<F> {
    /// The reply to GETXATTR or LISTXATTR: the size the filesystem gave, or the value, refused
    /// with `ERANGE` when longer than the `size` the client asked for.
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
            warn_throttled!(
                "reply of {} bytes to opcode {} does not fit the {} byte reply buffer",
                total,
                OpcodeName(h.opcode),
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

    /// Writes an error reply (`-errno`, `EIO` for an error without one). Refused when part of
    /// another reply was written already or the buffer cannot hold a header.
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
mod tests;
