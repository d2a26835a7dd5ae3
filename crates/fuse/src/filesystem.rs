//! The filesystem trait the FUSE server dispatches to, and the plain types it exchanges.
//!
//! A [`FileSystem`] speaks in FUSE terms (node ids, lookup counts, handles) but knows nothing of
//! the wire layout or of virtio. Every method has a default that fails with `ENOSYS`, so a
//! filesystem implements only what it supports.
//!
//! # Lookup counts
//! Every method that returns an [`Entry`] with a non-zero `inode` (LOOKUP, MKNOD, MKDIR,
//! SYMLINK, LINK, CREATE, TMPFILE, and each entry READDIRPLUS hands out) gives the client one
//! reference on that node id. The client gives references back with [`FileSystem::forget`]; a
//! node id stays valid until its count reaches zero. The root node id is never forgotten.
//!
//! # Handles
//! OPEN, CREATE, TMPFILE and OPENDIR may return a handle; it stays valid until the matching
//! RELEASE or RELEASEDIR. A handle number is chosen by the filesystem and is opaque to the server.

use std::ffi::CStr;
use std::io;
use std::time::Duration;

use std::os::fd::BorrowedFd;

use crate::migration::{Decoder, Encoder, StateError};

/// Where a filesystem writes the data of a READ (the transport implements it over the reply
/// buffers: `fuse::io::Writer`).
pub trait ZeroCopyWriter {
    /// Reads up to `count` bytes from `fd` at `offset` into the stream, retrying short reads
    /// until `count` bytes, end of file, or no room left; returns how many. An error after some
    /// bytes were read is reported as a short read.
    fn read_from_file_at(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        offset: u64,
    ) -> io::Result<usize>;
    /// Bytes that may still be written.
    fn remaining(&self) -> usize;
}

/// Where a filesystem takes the data of a WRITE from (the transport implements it over the
/// request buffers: `fuse::io::Reader`).
pub trait ZeroCopyReader {
    /// Writes up to `count` bytes of the stream to `fd` at `offset` (or at the file's end when
    /// it was opened with `O_APPEND`), retrying short writes until done or the file refuses
    /// more; returns how many. An error after some bytes were written is a short write.
    fn write_to_file_at(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        offset: u64,
    ) -> io::Result<usize>;
    /// Bytes that may still be read.
    fn remaining(&self) -> usize;
}

/// The error for the raw `errno` value `e`: what a file system method returns (the FUSE server
/// replies with that errno; every error without one becomes `EIO`).
pub fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Who is asking: the credentials of the guest process behind a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// A supplementary group of the caller that the guest kernel sent with a creating request
    /// (`FUSE_CREATE_SUPP_GROUP`): the parent directory's group, when the caller is a member.
    pub supp_group: Option<u32>,
}

/// The answer to a successful lookup (or creation): a node id and its attributes.
#[derive(Clone, Copy)]
pub struct Entry {
    /// Node id the client uses from now on; 0 means "no node id handed out" (READDIRPLUS only).
    pub inode: u64,
    pub generation: u64,
    pub attr: libc::stat64,
    /// `fuse_attr::flags` (for example `FUSE_ATTR_SUBMOUNT`).
    pub attr_flags: u32,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("inode", &self.inode)
            .field("ino", &self.attr.st_ino)
            .field("mode", &format_args!("{:o}", self.attr.st_mode))
            .finish()
    }
}

/// One directory entry as READDIR returns it.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'a> {
    /// Host inode number (informational; the client does not use it as a node id).
    pub ino: u64,
    /// Offset the client passes back to continue *after* this entry.
    pub offset: u64,
    /// File type, one of the `libc::DT_*` values (never `DT_UNKNOWN` from the passthrough fs).
    pub type_: u32,
    pub name: &'a [u8],
}

/// A time to set with SETATTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// Leave the time as it is.
    Omit,
    /// The current time.
    Now,
    /// This many seconds and nanoseconds since the epoch.
    At(i64, u32),
}

/// What SETATTR changes; `None` / [`SetTime::Omit`] leave a field alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
    /// Clear set-user-id and set-group-id bits (`FATTR_KILL_SUIDGID`).
    pub kill_suidgid: bool,
}

impl Default for SetAttr {
    fn default() -> Self {
        SetAttr {
            mode: None,
            uid: None,
            gid: None,
            size: None,
            atime: SetTime::Omit,
            mtime: SetTime::Omit,
            kill_suidgid: false,
        }
    }
}

/// A security context the guest kernel sends with a creating request (`FUSE_SECURITY_CTX`):
/// an extended attribute (for example `security.selinux`) the new file must carry before the
/// guest sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecCtx<'a> {
    pub name: &'a CStr,
    pub value: &'a [u8],
}

/// The answer to OPEN / OPENDIR: an optional handle and `FOPEN_*` flags for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Opened {
    pub handle: Option<u64>,
    pub open_flags: u32,
}

/// The answer to GETXATTR / LISTXATTR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrReply {
    /// The client asked for the size only (it passed a size of 0).
    Size(u32),
    /// The value (or the NUL-separated name list).
    Data(Vec<u8>),
}

/// A byte-range lock as FUSE carries it (`fuse_file_lock`): `typ` is `F_RDLCK`, `F_WRLCK` or
/// `F_UNLCK`, `start..=end` the bytes (an `end` of `i64::MAX` or more: to the end of the file,
/// however far it grows), `pid` the holder's process in the guest (0: none the guest knows).
/// The values are the guest's, unchecked: the filesystem refuses what it cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileLock {
    pub typ: u32,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// What a lock request is about: a `fcntl` record lock (or an OFD lock: the guest kernel sends
/// those with its open file as the owner), or a `flock` lock (`FUSE_LK_FLOCK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    Posix,
    Flock,
}

/// How a late answer is given: with 0 (success) or a positive `errno`.
type Answer = Box<dyn FnOnce(i32) + Send>;

struct AnswerSlot(std::sync::Mutex<Option<Answer>>);

impl AnswerSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Answer>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for AnswerSlot {
    /// A request nobody answered is answered `ENOLCK` when the last holder lets it go: the
    /// guest never waits for a reply that cannot come.
    fn drop(&mut self) {
        let answer = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(a) = answer {
            a(libc::ENOLCK);
        }
    }
}

/// The reply owed for a request that is answered after its handler returned (a SETLKW that
/// waits for its lock). It is answered once, by whoever comes first: the filesystem once the
/// lock is taken or refused, the transport when its queue stops; clones share it.
#[derive(Clone)]
pub struct LateReply(std::sync::Arc<AnswerSlot>);

/// How [`LateReply::attempt`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The attempt gave an answer, which was sent.
    Answered,
    /// The attempt gave none: try again later.
    Waiting,
    /// Answered already by someone else: the attempt did not run.
    Gone,
}

impl LateReply {
    /// A reply sent by `answer` (with 0 or a positive `errno`).
    pub fn new(answer: impl FnOnce(i32) + Send + 'static) -> Self {
        LateReply(std::sync::Arc::new(AnswerSlot(std::sync::Mutex::new(
            Some(Box::new(answer)),
        ))))
    }

    /// Answers with `errno` (0: success) unless answered already; whether this call did.
    pub fn answer(&self, errno: i32) -> bool {
        let answer = self.0.lock().take();
        match answer {
            Some(a) => {
                a(errno);
                true
            }
            None => false,
        }
    }

    /// Runs `attempt` unless answered already, with no one else able to answer meanwhile, and
    /// answers with what it returns (`Some`). What the attempt did (a lock taken) is therefore
    /// always what the guest hears.
    pub fn attempt(&self, attempt: impl FnOnce() -> Option<i32>) -> Attempt {
        let mut slot = self.0.lock();
        if slot.is_none() {
            return Attempt::Gone;
        }
        match attempt() {
            None => Attempt::Waiting,
            Some(errno) => {
                let a = slot.take();
                drop(slot);
                if let Some(a) = a {
                    a(errno);
                }
                Attempt::Answered
            }
        }
    }

    /// Whether `other` is a clone of this reply.
    pub fn is(&self, other: &LateReply) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether it was answered.
    pub fn is_answered(&self) -> bool {
        self.0.lock().is_none()
    }
}

impl std::fmt::Debug for LateReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateReply")
            .field("answered", &self.is_answered())
            .finish()
    }
}

fn enosys<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// A filesystem served over FUSE. See the module documentation for the contracts on lookup
/// counts and handles. `ctx` carries the guest caller's credentials.
#[allow(unused_variables, clippy::too_many_arguments)]
pub trait FileSystem: Send + Sync {
    /// Called once with the `FUSE_INIT` flags the client offers (`fuse::abi::init`); returns the
    /// subset the filesystem wants to enable.
    fn init(&self, capable: u64) -> io::Result<u64> {
        Ok(0)
    }

    /// The client unmounted: drop every node id and handle.
    fn destroy(&self) {}

    /// Writes what a migration destination needs to serve the node ids and handles the client
    /// holds (see `migration`). Called with no request in flight.
    fn save_state(&self, out: &mut Encoder) -> Result<(), StateError> {
        Err(StateError::Refused(
            "this file system cannot be migrated".into(),
        ))
    }

    /// Takes over the node ids and handles of a state written by a source's
    /// [`FileSystem::save_state`]; called on a file system that has served nothing yet.
    fn load_state(&self, input: &mut Decoder<'_>) -> Result<(), StateError> {
        Err(StateError::Refused(
            "this file system cannot be migrated".into(),
        ))
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        enosys()
    }

    /// Drops `count` references on `inode`. Unknown node ids are ignored.
    fn forget(&self, ctx: &Context, inode: u64, count: u64) {}

    fn batch_forget(&self, ctx: &Context, requests: &[(u64, u64)]) {
        for &(inode, count) in requests {
            self.forget(ctx, inode, count);
        }
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        enosys()
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: SetAttr,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        enosys()
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        enosys()
    }

    /// `secctx`: the security contexts to set on the new node (empty unless
    /// `FUSE_SECURITY_CTX` was negotiated); the same for the other creating methods.
    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: u64,
        name: &CStr,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        enosys()
    }

    /// `umask` is the caller's umask; unless `FUSE_DONT_MASK` was negotiated the kernel has
    /// applied it to `mode` already.
    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        enosys()
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        enosys()
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        enosys()
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        enosys()
    }

    /// `flags` are `renameat2(2)` flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`,
    /// `RENAME_WHITEOUT`); 0 for a plain RENAME.
    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        enosys()
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        enosys()
    }

    /// `flags` are the guest's `open(2)` flags; `fuse_flags` the `FUSE_OPEN_*` flags.
    fn open(&self, ctx: &Context, inode: u64, flags: u32, fuse_flags: u32) -> io::Result<Opened> {
        enosys()
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        flags: u32,
        umask: u32,
        fuse_flags: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<(Entry, Opened)> {
        enosys()
    }

    /// Creates an unnamed file in `parent` (`O_TMPFILE`).
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<(Entry, Opened)> {
        enosys()
    }

    /// Reads up to `size` bytes at `offset` into `w`; returns how many were read.
    fn read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        enosys()
    }

    /// Writes `size` bytes from `r` at `offset`; returns how many were written.
    /// `kill_priv` asks to clear set-user-id / set-group-id bits as a write by an unprivileged
    /// process would.
    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        enosys()
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        enosys()
    }

    fn release(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        enosys()
    }

    fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        enosys()
    }

    fn opendir(&self, ctx: &Context, inode: u64, flags: u32) -> io::Result<Opened> {
        enosys()
    }

    /// Lists entries starting at `offset` (0, or an `offset` a previous entry carried).
    /// `add_entry` returns how many bytes the entry took, or 0 when the reply is full: the
    /// filesystem then stops without error. `size` is the client's buffer size (a hint; the
    /// callback enforces it).
    fn readdir(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>) -> io::Result<usize>,
    ) -> io::Result<()> {
        enosys()
    }

    /// Like [`FileSystem::readdir`], with a looked-up [`Entry`] per directory entry. Each entry
    /// whose `inode` is non-zero carries one lookup reference; when `add_entry` returns 0 the
    /// filesystem must drop the reference of the entry it was refused and stop.
    fn readdirplus(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        enosys()
    }

    fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        enosys()
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        enosys()
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<libc::statvfs64> {
        enosys()
    }

    /// Checks `mask` (`R_OK`, `W_OK`, `X_OK`, `F_OK`) for the caller.
    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        enosys()
    }

    /// `flags` are `setxattr(2)` flags; `setxattr_flags` the `FUSE_SETXATTR_*` flags
    /// (`SETXATTR_ACL_KILL_SGID`), 0 unless `FUSE_SETXATTR_EXT` was negotiated.
    fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        enosys()
    }

    /// `size` 0 asks for the value's size only; otherwise a value longer than `size` is `ERANGE`.
    fn getxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        enosys()
    }

    /// As [`FileSystem::getxattr`], for the NUL-separated list of names.
    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<XattrReply> {
        enosys()
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        enosys()
    }

    /// Allocates, punches or zeroes `length` bytes at `offset` (`fallocate(2)` `mode`).
    /// `kill_priv` asks to clear set-user-id / set-group-id bits and `security.capability` as
    /// a change of the file by an unprivileged process would (the client handles them itself
    /// unless `FUSE_HANDLE_KILLPRIV_V2` was agreed; the request carries no flag of its own).
    fn fallocate(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
        kill_priv: bool,
    ) -> io::Result<()> {
        enosys()
    }

    fn lseek(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        enosys()
    }

    /// Copies `len` bytes between two open files; returns how many were copied. `kill_priv`
    /// is as for [`FileSystem::fallocate`], for the destination.
    fn copy_file_range(
        &self,
        ctx: &Context,
        inode_in: u64,
        handle_in: u64,
        offset_in: u64,
        inode_out: u64,
        handle_out: u64,
        offset_out: u64,
        len: u64,
        flags: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        enosys()
    }

    fn syncfs(&self, ctx: &Context, inode: u64) -> io::Result<()> {
        enosys()
    }

    /// The first lock held by another owner that conflicts with `lock` (GETLK), or `lock`
    /// with type `F_UNLCK` when there is none. `owner` is the guest's lock owner.
    fn getlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        enosys()
    }

    /// Takes, changes or (with `F_UNLCK`) drops `owner`'s lock without waiting (SETLK, and
    /// the first try of SETLKW): `EAGAIN` when another owner holds a conflicting lock.
    fn setlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        kind: LockKind,
    ) -> io::Result<()> {
        enosys()
    }

    /// Waits for the lock a [`FileSystem::setlk`] found taken (SETLKW) and answers `reply` once
    /// it is taken or refused; returns at once. An error means the wait was not taken on: the
    /// caller answers with it.
    fn setlk_wait(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        kind: LockKind,
        reply: LateReply,
    ) -> io::Result<()> {
        enosys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_keeps_the_value() {
        assert_eq!(errno(libc::ENOENT).raw_os_error(), Some(libc::ENOENT));
    }
}
