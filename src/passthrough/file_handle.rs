//! File handles (`name_to_handle_at(2)` / `open_by_handle_at(2)`): a few bytes the host file
//! system gives to name one of its inodes for as long as the inode exists, whatever its names.
//!
//! With `--inode-file-handles=prefer|mandatory`, an inode that is not a directory keeps such a
//! handle instead of an `O_PATH` descriptor (see `PassthroughFs::path_fd`), so a guest holding a
//! million inodes does not make the daemon hold a million descriptors. A handle is reopened with
//! `open_by_handle_at`, which needs a descriptor of any file on the same mount: [`MountFds`]
//! keeps one per mount seen. Handles are made here from descriptors the daemon has verified and
//! never come from, nor go to, the guest (a forged handle could name any inode of the host file
//! system, inside the shared directory or not).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

use super::config::InodeFileHandles;
use super::sys;

/// `MAX_HANDLE_SZ`: the largest handle a Linux file system gives.
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle, aligned as the kernel expects.
#[repr(C)]
struct RawHandle {
    handle_bytes: libc::c_uint,
    handle_type: libc::c_int,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl RawHandle {
    /// The handle's bytes, as the kernel filled them.
    fn bytes(&self) -> &[u8] {
        &self.f_handle[..(self.handle_bytes as usize).min(MAX_HANDLE_SZ)]
    }
}

/// A file handle of an inode and the id of the mount it was taken on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHandle {
    /// Mount id as `name_to_handle_at` reports it (the same number as `statx`'s
    /// `STATX_MNT_ID`).
    pub mnt_id: u64,
    handle_type: i32,
    bytes: Box<[u8]>,
}

impl FileHandle {
    /// The handle of the file `fd` refers to (any descriptor, `O_PATH` included; a symlink is
    /// not followed). `EOPNOTSUPP` when the file system gives no handles.
    pub fn of_fd(fd: BorrowedFd<'_>) -> io::Result<FileHandle> {
        Self::of(fd, c"", libc::AT_EMPTY_PATH)
    }

    /// The identifying handle of `name` in `dir` (not following a symlink): a handle that
    /// tells the file apart from every other, never opened (see [`FileHandle::fid`]).
    pub fn fid_at(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> io::Result<FileHandle> {
        Self::fid(dir, name, 0)
    }

    /// The identifying handle of the file `fd` refers to.
    pub fn fid_of_fd(fd: BorrowedFd<'_>) -> io::Result<FileHandle> {
        Self::fid(fd, c"", libc::AT_EMPTY_PATH)
    }

    /// A handle asked for with `AT_HANDLE_FID` (Linux 6.5): file systems that cannot open
    /// their files by handle may still give one that identifies them (overlayfs without
    /// `nfs_export`). On older kernels, which refuse the flag, a plain handle.
    fn fid(dir: BorrowedFd<'_>, name: &std::ffi::CStr, flags: i32) -> io::Result<FileHandle> {
        let (raw, mnt_id) = Self::raw_fid(dir, name, flags)?;
        Ok(Self::from_raw(&raw, mnt_id))
    }

    /// Whether the identifying handle of `name` in `dir` (`AT_EMPTY_PATH` in `flags`: of `dir`
    /// itself) is this handle. Taken on the stack: checking a file's identity allocates nothing.
    pub fn is_fid_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        flags: i32,
    ) -> io::Result<bool> {
        let (raw, mnt_id) = Self::raw_fid(dir, name, flags)?;
        Ok(self.mnt_id == mnt_id
            && self.handle_type == raw.handle_type
            && *self.bytes == *raw.bytes())
    }

    fn raw_fid(
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        flags: i32,
    ) -> io::Result<(RawHandle, u64)> {
        /// `AT_HANDLE_FID` (not in every libc).
        const AT_HANDLE_FID: i32 = 0x200;
        static FID_REFUSED: AtomicBool = AtomicBool::new(false);
        if !FID_REFUSED.load(Ordering::Relaxed) {
            match Self::raw_of(dir, name, flags | AT_HANDLE_FID) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    FID_REFUSED.store(true, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        Self::raw_of(dir, name, flags)
    }

    fn from_raw(raw: &RawHandle, mnt_id: u64) -> FileHandle {
        FileHandle {
            mnt_id,
            handle_type: raw.handle_type,
            bytes: raw.bytes().into(),
        }
    }

    fn of(dir: BorrowedFd<'_>, name: &std::ffi::CStr, flags: i32) -> io::Result<FileHandle> {
        let (raw, mnt_id) = Self::raw_of(dir, name, flags)?;
        Ok(Self::from_raw(&raw, mnt_id))
    }

    fn raw_of(
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
        flags: i32,
    ) -> io::Result<(RawHandle, u64)> {
        let mut raw = RawHandle {
            handle_bytes: MAX_HANDLE_SZ as libc::c_uint,
            handle_type: 0,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        let mut mnt_id: libc::c_int = 0;
        // SAFETY: the path is NUL-terminated, `raw` is a `struct file_handle` whose
        // `handle_bytes` is the size of the room that follows it, and `mnt_id` is a valid
        // out-pointer; the result is checked.
        let ret = unsafe {
            libc::name_to_handle_at(
                dir.as_raw_fd(),
                name.as_ptr(),
                (&mut raw as *mut RawHandle).cast::<libc::file_handle>(),
                &mut mnt_id,
                flags,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((raw, mnt_id as u32 as u64))
    }

    /// The handle's type and bytes, as a migration sends them.
    pub fn parts(&self) -> (i32, &[u8]) {
        (self.handle_type, &self.bytes)
    }

    /// A handle from its type and bytes (as [`FileHandle::parts`] gave them), to be opened on
    /// the mount `mnt_id`; `None` when longer than any file system's handle.
    pub fn from_parts(mnt_id: u64, handle_type: i32, bytes: &[u8]) -> Option<FileHandle> {
        (bytes.len() <= MAX_HANDLE_SZ).then(|| FileHandle {
            mnt_id,
            handle_type,
            bytes: bytes.into(),
        })
    }

    /// Opens the inode with `flags` (`O_CLOEXEC` added), given any descriptor on its mount.
    /// `ESTALE` when the inode no longer exists; `EPERM` without `CAP_DAC_READ_SEARCH`.
    pub fn open(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
        let mut raw = RawHandle {
            handle_bytes: self.bytes.len() as libc::c_uint,
            handle_type: self.handle_type,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        raw.f_handle[..self.bytes.len()].copy_from_slice(&self.bytes);
        // SAFETY: `raw` is a `struct file_handle` whose `handle_bytes` bytes were given by
        // `name_to_handle_at`; the kernel only reads it. The result is checked and owned.
        let fd = unsafe {
            libc::open_by_handle_at(
                mount_fd.as_raw_fd(),
                (&mut raw as *mut RawHandle).cast::<libc::file_handle>(),
                flags | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel has just created `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Mount id → a descriptor on that mount, for `open_by_handle_at`. Any file of the mount does,
/// but not an `O_PATH` descriptor (`EBADF`): the table keeps a directory opened for reading
/// (see [`open_dir`]), the first it is given for the mount, and grows only with the number of
/// mounts under the shared directory.
#[derive(Default)]
pub struct MountFds {
    map: RwLock<HashMap<u64, OwnedFd>>,
}

impl MountFds {
    /// Whether a descriptor of mount `mnt_id` is known.
    pub fn has(&self, mnt_id: u64) -> bool {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&mnt_id)
    }

    /// Records a descriptor of mount `mnt_id` (made with `make`) unless one is known.
    pub fn ensure(
        &self,
        mnt_id: u64,
        make: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<()> {
        if self.has(mnt_id) {
            return Ok(());
        }
        let fd = make()?;
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.entry(mnt_id).or_insert(fd);
        Ok(())
    }

    /// Opens `handle` with `flags` through the descriptor of its mount (`ESTALE` when no
    /// descriptor of that mount is known).
    pub fn open(&self, handle: &FileHandle, flags: i32) -> io::Result<OwnedFd> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        match map.get(&handle.mnt_id) {
            Some(fd) => handle.open(fd.as_fd(), flags),
            None => Err(sys::error(libc::ESTALE)),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The directory `dir` (an `O_PATH` descriptor will do) opened for reading, to be a mount's
/// descriptor in [`MountFds`].
pub fn open_dir(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    sys::openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// Checks at start that file handles can be used on the shared directory `root`, recording
/// its mount in `mounts`, and returns the mode to run in. With `mandatory` a file system that
/// gives no handles, or a daemon not allowed to open them (`open_by_handle_at` needs
/// `CAP_DAC_READ_SEARCH`), is an error; `prefer` logs why and runs as `never` when handles
/// cannot be opened, and as `prefer` when only the shared directory's file system gives none
/// (file systems mounted under it may).
pub fn probe(
    mode: InodeFileHandles,
    root: BorrowedFd<'_>,
    mounts: &MountFds,
) -> io::Result<InodeFileHandles> {
    if mode == InodeFileHandles::Never {
        return Ok(mode);
    }
    let mandatory = |what: &str, e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("--inode-file-handles=mandatory: {what} ({e})"),
        )
    };
    let h = match FileHandle::of_fd(root) {
        Ok(h) => h,
        Err(e) if mode == InodeFileHandles::Mandatory => {
            return Err(mandatory(
                "the shared directory's file system gives no file handles",
                e,
            ))
        }
        Err(e) => {
            log::warn!(
                "the shared directory's file system gives no file handles ({e}); its inodes \
                 keep file descriptors (--inode-file-handles=prefer)"
            );
            return Ok(mode);
        }
    };
    let opened = mounts
        .ensure(h.mnt_id, || open_dir(root))
        .and_then(|()| mounts.open(&h, libc::O_PATH));
    match opened {
        Ok(_) => Ok(mode),
        Err(e) if mode == InodeFileHandles::Mandatory => Err(mandatory(
            "cannot open file handles (open_by_handle_at needs CAP_DAC_READ_SEARCH)",
            e,
        )),
        Err(e) => {
            log::warn!(
                "cannot open file handles ({e}; open_by_handle_at needs CAP_DAC_READ_SEARCH): \
                 inodes keep file descriptors (--inode-file-handles=prefer runs as never)"
            );
            Ok(InodeFileHandles::Never)
        }
    }
}

/// Logs, once per process, that a file of mount `mnt_id` gave no file handle and keeps a
/// descriptor (`prefer` mode).
pub fn note_fallback(mnt_id: u64, e: &io::Error) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        log::info!(
            "no file handle for a file on mount {mnt_id} ({e}); such files keep file \
             descriptors (logged once)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn open_path(p: &std::path::Path) -> OwnedFd {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(p)
            .unwrap()
            .into()
    }

    use crate::passthrough::credentials::running_as_root;

    #[test]
    fn a_handle_reopens_its_file_after_a_rename() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), b"content").unwrap();
        let h = FileHandle::of_fd(open_path(&tmp.path().join("a")).as_fd()).unwrap();
        let (_, x) = sys::stat_fd_mnt(open_path(tmp.path()).as_fd()).unwrap();
        assert_eq!(
            h.mnt_id, x.mnt_id,
            "name_to_handle_at and statx agree on mount ids"
        );
        std::fs::rename(tmp.path().join("a"), tmp.path().join("b")).unwrap();
        if !running_as_root() {
            eprintln!("skipped the reopen: open_by_handle_at needs CAP_DAC_READ_SEARCH");
            return;
        }
        let mounts = MountFds::default();
        mounts
            .ensure(h.mnt_id, || open_dir(open_path(tmp.path()).as_fd()))
            .unwrap();
        let f = mounts.open(&h, libc::O_RDONLY).unwrap();
        let mut s = String::new();
        use std::io::Read;
        std::fs::File::from(f).read_to_string(&mut s).unwrap();
        assert_eq!(s, "content");
    }

    #[test]
    fn a_handle_of_a_removed_file_is_stale() {
        if !running_as_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), b"x").unwrap();
        let h = FileHandle::of_fd(open_path(&tmp.path().join("a")).as_fd()).unwrap();
        std::fs::remove_file(tmp.path().join("a")).unwrap();
        let root = open_dir(open_path(tmp.path()).as_fd()).unwrap();
        let e = h.open(root.as_fd(), libc::O_PATH).unwrap_err();
        assert!(gone(&e), "{e}");
    }

    /// How the kernel refuses the handle of a file that is gone: `ESTALE`, or `ENOMEM` when
    /// the inode is still being evicted (Linux 6.18 ext4, seen with other tests running: its
    /// `open_by_handle_at` says `ENOMEM` when the file system finds no dentry).
    fn gone(e: &std::io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::ESTALE) | Some(libc::ENOMEM))
    }

    /// A file unlinked while still open: ext4 and tmpfs (Linux 6.x) still open it by handle,
    /// and any file system must give either that inode or `ESTALE`; the passthrough code tries
    /// the handle the guest has open first anyway.
    #[test]
    fn handle_of_an_unlinked_open_file_is_that_file_or_stale() {
        if !running_as_root() {
            return;
        }
        for base in [std::env::temp_dir(), "/dev/shm".into()] {
            let Ok(tmp) = tempfile::tempdir_in(&base) else {
                continue;
            };
            std::fs::write(tmp.path().join("a"), b"x").unwrap();
            let keep = std::fs::File::open(tmp.path().join("a")).unwrap();
            let ino = keep.metadata().unwrap().ino();
            let h = FileHandle::of_fd(keep.as_fd()).unwrap();
            std::fs::remove_file(tmp.path().join("a")).unwrap();
            let root = open_dir(open_path(tmp.path()).as_fd()).unwrap();
            match h.open(root.as_fd(), libc::O_PATH) {
                Ok(fd) => {
                    let st = sys::stat_fd(fd.as_fd()).unwrap();
                    assert_eq!((st.st_ino, st.st_nlink), (ino, 0), "{}", base.display());
                }
                Err(e) => assert!(gone(&e), "{e}"),
            }
            drop(keep);
            // Closed and unlinked: gone.
            let e = h.open(root.as_fd(), libc::O_PATH).unwrap_err();
            assert!(gone(&e), "{}: {e}", base.display());
        }
    }

    #[test]
    fn a_path_only_descriptor_is_no_mount_descriptor() {
        if !running_as_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_path(tmp.path());
        let h = FileHandle::of_fd(dir.as_fd()).unwrap();
        let e = h.open(dir.as_fd(), libc::O_PATH).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        assert!(h
            .open(open_dir(dir.as_fd()).unwrap().as_fd(), libc::O_PATH)
            .is_ok());
    }

    #[test]
    fn unknown_mount_is_stale() {
        let tmp = tempfile::tempdir().unwrap();
        let h = FileHandle::of_fd(open_path(tmp.path()).as_fd()).unwrap();
        let mounts = MountFds::default();
        let e = mounts.open(&h, libc::O_PATH).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        assert_eq!(mounts.len(), 0);
    }
}
