//! Descriptors as several layers use them.
//!
//! A leaf: it uses `std`, `libc` and `nix`, and nothing else of this crate, so every layer may
//! use it without depending on another layer (the sandbox opens `/proc/self/fd` the way the
//! passthrough file system does, without reaching into it).

use std::os::fd::OwnedFd;
use std::path::Path;

/// Opens the directory `path` with `O_PATH`, close-on-exec: the shared directory,
/// `/proc/self/fd` (by the sandbox too, before it hides `/proc`), a thread's working directory.
pub fn open_path_dir(path: &Path) -> nix::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn open_path_dir_opens_directories_only() {
        let d = tempfile::tempdir().unwrap();
        let fd = open_path_dir(d.path()).unwrap();
        let flags = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        std::fs::write(d.path().join("f"), b"").unwrap();
        assert_eq!(
            open_path_dir(&d.path().join("f")).unwrap_err(),
            nix::errno::Errno::ENOTDIR
        );
    }
}
