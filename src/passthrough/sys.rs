//! Thin safe wrappers over the libc calls the passthrough filesystem makes.
//!
//! Every wrapper takes borrowed descriptors and NUL-terminated names, returns owned descriptors,
//! and turns a `-1` into the thread's `errno` as an [`io::Error`]. None of them builds a host path
//! from guest names: names are always resolved relative to a directory descriptor, or, for the
//! `*xattr` family that has no `*at` form, as the name `N` (see [`ProcName`]) relative to the
//! `/proc/self/fd` directory made this thread's working directory (see `threadfs`). No absolute
//! path is used.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The empty name, for `AT_EMPTY_PATH` calls on the descriptor itself.
pub const EMPTY: &CStr = c"";

/// An `io::Error` for a raw `errno` value.
pub use crate::filesystem::errno as error;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<u64> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as u64)
    }
}

/// Converts a guest offset or length to `off64_t`; values above `i64::MAX` are `EINVAL`.
pub fn to_off(v: u64) -> io::Result<libc::off64_t> {
    libc::off64_t::try_from(v).map_err(|_| error(libc::EINVAL))
}

/// Takes ownership of a descriptor a successful call just returned.
fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: callers pass a descriptor the kernel has just created for us; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A descriptor number as a NUL-terminated decimal name, to resolve under `/proc/self/fd`
/// without allocating.
pub struct ProcName {
    buf: [u8; 16],
    /// Where the decimal number starts in `buf`.
    start: usize,
}

impl ProcName {
    pub fn new(fd: RawFd) -> Self {
        // Ten digits at most, then the NUL.
        let mut buf = [0u8; 16];
        let mut n = fd.unsigned_abs();
        let mut i = 10;
        loop {
            i -= 1;
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        ProcName { buf, start: i }
    }

    /// `"N"`, to resolve relative to a `/proc/self/fd` directory descriptor.
    pub fn name(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.buf[self.start..11]).unwrap_or(EMPTY)
    }
}

/// The whole content of the file `name` under `dir` (a small one: a `/proc` file).
pub fn read_all(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let fd = openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        0,
    )?;
    let mut out = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut out)?;
    Ok(out)
}

pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated and outlives the call; the result is checked.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    check(fd).map(owned)
}

/// An `O_PATH` descriptor of the file `fd` refers to, reopened through its magic link in
/// `/proc/self/fd` (`proc_self_fd`).
pub fn reopen_path(proc_self_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let name = ProcName::new(fd.as_raw_fd());
    openat(proc_self_fd, name.name(), libc::O_PATH, 0)
}

/// A zeroed `stat64`, to be filled in.
pub fn zeroed_stat() -> libc::stat64 {
    // SAFETY: `stat64` is made of integers only, for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<libc::stat64> {
    let mut st = zeroed_stat();
    // SAFETY: `name` is NUL-terminated and `st` is a valid out-pointer; the result is checked.
    check(unsafe { libc::fstatat64(dir.as_raw_fd(), name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// Attributes of the file `fd` refers to (any descriptor, `O_PATH` included; never follows).
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<libc::stat64> {
    fstatat(fd, EMPTY, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

static HAVE_STATX: AtomicBool = AtomicBool::new(true);

/// What `statx` tells of a file beyond `stat64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatExtra {
    /// Id of the mount the file is on (0 when the kernel cannot tell).
    pub mnt_id: u64,
    /// Birth time (seconds, nanoseconds), when the file system records one.
    pub btime: Option<(i64, u32)>,
}

/// Attributes of `fd`, its mount id and birth time.
pub fn stat_fd_mnt(fd: BorrowedFd<'_>) -> io::Result<(libc::stat64, StatExtra)> {
    stat_at_mnt(fd, EMPTY)
}

/// Attributes of `name` in `dir` (of `dir` itself when `name` is empty), never following a
/// symlink, with the mount id and birth time `statx` gives (none without `statx`).
pub fn stat_at_mnt(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(libc::stat64, StatExtra)> {
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    if HAVE_STATX.load(Ordering::Relaxed) {
        // SAFETY: `statx` is made of integers only, for which all-zero is a valid value.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: the name is NUL-terminated and `stx` is a valid out-pointer; checked below.
        let ret = unsafe {
            libc::statx(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags,
                libc::STATX_BASIC_STATS | libc::STATX_MNT_ID | libc::STATX_BTIME,
                &mut stx,
            )
        };
        match check(ret) {
            Ok(_) => {
                let mnt_id = if stx.stx_mask & libc::STATX_MNT_ID != 0 {
                    stx.stx_mnt_id
                } else {
                    0
                };
                let btime = (stx.stx_mask & libc::STATX_BTIME != 0)
                    .then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec));
                return Ok((statx_to_stat(&stx), StatExtra { mnt_id, btime }));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
                HAVE_STATX.store(false, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    let extra = StatExtra {
        mnt_id: 0,
        btime: None,
    };
    Ok((fstatat(dir, name, flags)?, extra))
}

/// The type of the file system `fd` is on (`statfs`'s `f_type`).
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    // SAFETY: `statfs64` is made of integers only, for which all-zero is a valid value.
    let mut sfs: libc::statfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: `sfs` is a valid out-pointer; `fstatfs` accepts `O_PATH` descriptors.
    check(unsafe { libc::fstatfs64(fd.as_raw_fd(), &mut sfs) })?;
    Ok(sfs.f_type as i64)
}

fn statx_to_stat(stx: &libc::statx) -> libc::stat64 {
    let mut st = zeroed_stat();
    st.st_dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    st.st_ino = stx.stx_ino;
    st.st_nlink = stx.stx_nlink as _;
    st.st_mode = stx.stx_mode as _;
    st.st_uid = stx.stx_uid;
    st.st_gid = stx.stx_gid;
    st.st_rdev = libc::makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
    st.st_size = stx.stx_size as _;
    st.st_blksize = stx.stx_blksize as _;
    st.st_blocks = stx.stx_blocks as _;
    st.st_atime = stx.stx_atime.tv_sec as _;
    st.st_atime_nsec = stx.stx_atime.tv_nsec as _;
    st.st_mtime = stx.stx_mtime.tv_sec as _;
    st.st_mtime_nsec = stx.stx_mtime.tv_nsec as _;
    st.st_ctime = stx.stx_ctime.tv_sec as _;
    st.st_ctime_nsec = stx.stx_ctime.tv_nsec as _;
    st
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; the result is checked.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; the result is checked.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev as libc::dev_t) })
        .map(drop)
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated; the result is checked.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; the result is checked.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated; the raw syscall avoids depending on the libc
    // version for `renameat2`; the result is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    };
    check_long(ret).map(drop)
}

pub fn linkat(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: i32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated; the result is checked.
    let ret = unsafe {
        libc::linkat(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    };
    check(ret).map(drop)
}

/// The target of the symlink `fd` (an `O_PATH | O_NOFOLLOW` descriptor of it).
pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    readlink_at(fd, EMPTY)
}

/// The target of the symlink `name` in `dir` (`""`: `dir` itself).
pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for `buf.len()` bytes and the name is NUL-terminated; checked.
    let ret = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = check_size(ret)?;
    buf.truncate(n);
    Ok(buf)
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a borrowed descriptor; the result is checked.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

pub fn fchmodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; the result is checked.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) }).map(drop)
}

/// Changes the owner of the file `fd` refers to (never following a symlink). `u32::MAX`
/// (`-1`) leaves an id unchanged.
/// Changes the owner of `name` in `dir` without following a symlink.
pub fn fchownat_nofollow(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: the name is NUL-terminated; the result is checked.
    let ret = unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(ret).map(drop)
}

pub fn fchown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: the name is NUL-terminated; the result is checked.
    let ret = unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(ret).map(drop)
}

pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let size = to_off(size)?;
    // SAFETY: plain syscall on a borrowed descriptor; the result is checked.
    check(unsafe { libc::ftruncate64(fd.as_raw_fd(), size) }).map(drop)
}

pub fn utimensat(dir: BorrowedFd<'_>, name: &CStr, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `times` points to two timespecs; checked.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

pub fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: `times` points to two timespecs; the result is checked.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on a borrowed descriptor; the result is checked.
    let ret = unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    };
    check(ret).map(drop)
}

pub fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall on a borrowed descriptor; the new descriptor is checked and owned.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) }).map(owned)
}

/// The access mode (`O_RDONLY`, `O_WRONLY` or `O_RDWR`) an open file was opened with.
/// The file status flags of `fd` (`F_GETFL`): access mode, `O_APPEND`, `O_DIRECT`, ...
pub fn fd_status_flags(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: F_GETFL on a borrowed descriptor takes no pointer; the result is checked.
    let ret = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    check(ret)
}

pub fn fd_access_mode(fd: BorrowedFd<'_>) -> io::Result<i32> {
    Ok(fd_status_flags(fd)? & libc::O_ACCMODE)
}

/// A byte-range lock as `fcntl(2)` sees it: `F_RDLCK`, `F_WRLCK` or `F_UNLCK`, from `start`
/// for `len` bytes (0: to the end of the file, however far it grows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLock {
    pub typ: i32,
    pub start: i64,
    pub len: i64,
}

fn flock64(l: &RangeLock) -> libc::flock64 {
    // SAFETY: `flock64` is plain integers; all zero is a valid value (l_pid must be 0 for OFD
    // locks).
    let mut f: libc::flock64 = unsafe { std::mem::zeroed() };
    f.l_type = l.typ as libc::c_short;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = l.start;
    f.l_len = l.len;
    f
}

/// Sets (or, with `F_UNLCK`, removes) an open-file-description lock on `fd`, without waiting:
/// `EAGAIN` when another description holds a conflicting lock.
pub fn ofd_setlk(fd: BorrowedFd<'_>, l: &RangeLock) -> io::Result<()> {
    let f = flock64(l);
    // SAFETY: F_OFD_SETLK reads the `flock64` the pointer names, which lives across the call.
    check(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_OFD_SETLK,
            &f as *const libc::flock64,
        )
    })
    .map(drop)
}

/// The first lock another open file description holds on `fd`'s file that conflicts with `l`
/// (`F_OFD_GETLK`), and the pid the host reports for its holder (-1 for an OFD lock); `None`
/// when `l` could be taken.
pub fn ofd_getlk(fd: BorrowedFd<'_>, l: &RangeLock) -> io::Result<Option<(RangeLock, i32)>> {
    let mut f = flock64(l);
    // SAFETY: F_OFD_GETLK reads and rewrites the `flock64` the pointer names, which lives
    // across the call.
    check(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut f as *mut libc::flock64,
        )
    })?;
    if i32::from(f.l_type) == libc::F_UNLCK {
        return Ok(None);
    }
    Ok(Some((
        RangeLock {
            typ: i32::from(f.l_type),
            start: f.l_start,
            len: f.l_len,
        },
        f.l_pid,
    )))
}

/// `flock(2)` with `op` (`LOCK_SH`, `LOCK_EX`, `LOCK_UN`, with `LOCK_NB`).
pub fn flock(fd: BorrowedFd<'_>, op: i32) -> io::Result<()> {
    // SAFETY: plain syscall on a borrowed descriptor; the result is checked.
    check(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

/// Adds `O_DIRECT` to an open file's status flags.
pub fn set_direct(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain fcntl calls on a borrowed descriptor; the results are checked.
    unsafe {
        let fl = check(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        check(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            fl | libc::O_DIRECT,
        ))
        .map(drop)
    }
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: u32, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (to_off(offset)?, to_off(len)?);
    // SAFETY: plain syscall on a borrowed descriptor; the result is checked.
    check(unsafe { libc::fallocate64(fd.as_raw_fd(), mode as i32, offset, len) }).map(drop)
}

pub fn lseek(fd: BorrowedFd<'_>, offset: u64, whence: i32) -> io::Result<u64> {
    let offset = to_off(offset)?;
    // SAFETY: plain syscall on a borrowed descriptor; the result is checked.
    let ret = unsafe { libc::lseek64(fd.as_raw_fd(), offset, whence) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as u64)
    }
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: usize,
    flags: u32,
) -> io::Result<usize> {
    let mut off_in = to_off(off_in)?;
    let mut off_out = to_off(off_out)?;
    // SAFETY: the offsets are valid in/out pointers to `loff_t`s for the duration of the call;
    // the result is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_copy_file_range,
            fd_in.as_raw_fd(),
            &mut off_in as *mut libc::off64_t,
            fd_out.as_raw_fd(),
            &mut off_out as *mut libc::off64_t,
            len,
            flags,
        )
    };
    check_long(ret).map(|n| n as usize)
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs64> {
    // SAFETY: `statvfs64` is made of integers only, for which all-zero is a valid value.
    let mut st: libc::statvfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; the result is checked.
    check(unsafe { libc::fstatvfs64(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on a borrowed descriptor; the result is checked.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// Reads directory entries of `fd` into `buf` (`getdents64`); 0 at the end of the directory.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for `buf.len()` bytes; the result is checked.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    check_long(ret).map(|n| n as usize)
}

/// `getxattr(2)` on a path (following the last component); `buf` empty asks the size.
pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the strings are NUL-terminated and `buf` is writable for `buf.len()` bytes (a null
    // pointer is never dereferenced when the length is 0); the result is checked.
    let ret = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    check_size(ret)
}

/// `listxattr(2)` on a path; `buf` empty asks the size.
pub fn listxattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the path is NUL-terminated and `buf` is writable for `buf.len()` bytes; checked.
    let ret = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check_size(ret)
}

pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: the strings are NUL-terminated and `value` is readable for its length; checked.
    let ret = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    check(ret).map(drop)
}

/// `fsetxattr(2)` on an open (not `O_PATH`) descriptor.
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `value` is readable for its length; checked.
    let ret = unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    check(ret).map(drop)
}

pub fn removexattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated; the result is checked.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// `libc::DT_*` of a `st_mode`.
pub fn mode_to_dtype(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}

/// `S_IF*` type bits of a `libc::DT_*`.
pub fn dtype_to_mode(dtype: u8) -> u32 {
    match dtype {
        libc::DT_REG => libc::S_IFREG,
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_SOCK => libc::S_IFSOCK,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_name_formats_descriptor_numbers() {
        assert_eq!(ProcName::new(0).name(), c"0");
        assert_eq!(ProcName::new(7).name(), c"7");
        assert_eq!(ProcName::new(1234567).name(), c"1234567");
        assert_eq!(ProcName::new(i32::MAX).name(), c"2147483647");
    }

    #[test]
    fn offsets_above_i64_max_are_einval() {
        assert_eq!(to_off(i64::MAX as u64).unwrap(), i64::MAX);
        let e = to_off(i64::MAX as u64 + 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn dtype_and_mode_round_trip() {
        for m in [
            libc::S_IFREG,
            libc::S_IFDIR,
            libc::S_IFLNK,
            libc::S_IFIFO,
            libc::S_IFSOCK,
            libc::S_IFCHR,
            libc::S_IFBLK,
        ] {
            assert_eq!(dtype_to_mode(mode_to_dtype(m | 0o644)), m);
        }
    }
}

/// A descriptor set at most once and kept until dropped (then closed): what a node keeps of
/// its file, in 4 bytes (-1 while none is set). Shared between threads: the first to set one
/// keeps it.
#[derive(Debug)]
pub struct OnceFd(AtomicI32);

impl OnceFd {
    /// `fd`, or none yet.
    pub fn new(fd: Option<OwnedFd>) -> Self {
        OnceFd(AtomicI32::new(fd.map_or(-1, IntoRawFd::into_raw_fd)))
    }

    /// The descriptor, if one was set.
    pub fn get(&self) -> Option<BorrowedFd<'_>> {
        let fd = self.0.load(Ordering::Acquire);
        // SAFETY: a descriptor set here is owned by `self` and closed only when it is dropped,
        // which the borrow of `self` outlives.
        (fd >= 0).then(|| unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Keeps `fd` unless a descriptor was set already (then `fd` is closed); returns the
    /// descriptor kept.
    pub fn set(&self, fd: OwnedFd) -> BorrowedFd<'_> {
        let raw = fd.as_raw_fd();
        match self
            .0
            .compare_exchange(-1, raw, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                // Owned by `self` now (closed when it is dropped).
                let _ = fd.into_raw_fd();
                // SAFETY: as in `get`: set here, owned by `self`.
                unsafe { BorrowedFd::borrow_raw(raw) }
            }
            Err(kept) => {
                drop(fd);
                // SAFETY: as in `get`: set by another thread, owned by `self`.
                unsafe { BorrowedFd::borrow_raw(kept) }
            }
        }
    }
}

impl Drop for OnceFd {
    fn drop(&mut self) {
        let fd = *self.0.get_mut();
        if fd >= 0 {
            // SAFETY: the descriptor was set once and given to `self`, which nothing else
            // closes; no borrow of it outlives `self`.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}
