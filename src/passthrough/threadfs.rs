//! Per-thread working directory and umask.
//!
//! Two operations need process attributes that threads normally share:
//! - the `*xattr` calls have no `*at` form, and a file that cannot be opened for I/O (a
//!   symlink, a device node, a FIFO, a socket) is reached as the name `N` relative to the
//!   `/proc/self/fd` directory descriptor made the working directory; no absolute path is
//!   used, so this works whatever the process's root is;
//! - with POSIX ACLs the guest's umask must apply only when the parent directory has no default
//!   ACL, which the host kernel decides when it creates the file with the caller's umask set.
//!
//! The first time a thread needs either, it gets its own copy of these attributes with
//! `unshare(CLONE_FS)`; from then on `fchdir` and `umask` affect that thread only. Should the
//! unshare fail (a seccomp policy that forbids it), a process-wide lock serialises every user of
//! the shared attributes instead, and each restores them before letting go. (A thread started
//! by a thread that has its own copy shares that copy until it makes its own; the threads that
//! serve requests are all started by threads that serve none.) A seccomp policy must allow
//! `unshare(CLONE_FS)`, `fchdir` and `umask`.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

/// Held while the shared working directory or umask is changed (only when unshare failed).
static SHARED: Mutex<()> = Mutex::new(());

enum State {
    /// Not tried yet on this thread.
    Unknown,
    /// The thread has its own attributes; the working directory it started with (to return
    /// to), when it could be opened.
    Private(Option<OwnedFd>),
    /// unshare failed: use the lock.
    Shared,
}

thread_local! {
    static STATE: RefCell<State> = const { RefCell::new(State::Unknown) };
}

/// Opens the current working directory (`O_PATH`), to return to it later.
fn open_cwd() -> Option<OwnedFd> {
    crate::os::open_path_dir(Path::new(".")).ok()
}

/// Makes this thread's attributes private if not tried yet; returns the lock to hold when they
/// are shared, and whether they are private with a directory to return to.
fn enter() -> (Option<MutexGuard<'static, ()>>, bool) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if matches!(*s, State::Unknown) {
            // unshare(CLONE_FS) only gives this thread its own copy of root, working directory
            // and umask.
            *s = match nix::sched::unshare(CloneFlags::CLONE_FS) {
                Ok(()) => State::Private(open_cwd()),
                Err(e) => {
                    log::warn!(
                        "unshare(CLONE_FS) failed ({}); changes of the working directory and \
                         umask are serialised process-wide",
                        io::Error::from(e)
                    );
                    State::Shared
                }
            };
        }
        match &*s {
            State::Private(cwd) => (None, cwd.is_some()),
            State::Shared | State::Unknown => (
                Some(SHARED.lock().unwrap_or_else(PoisonError::into_inner)),
                false,
            ),
        }
    })
}

/// Runs `f` with `dir` as the working directory, then returns to the previous one.
pub fn in_dir<T>(dir: BorrowedFd<'_>, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let (_lock, to_start) = enter();
    let back = if to_start {
        BackTo::Start
    } else {
        match open_cwd() {
            Some(fd) => BackTo::Owned(fd),
            None => BackTo::Root,
        }
    };
    nix::unistd::fchdir(dir)?;
    let r = f();
    back.go();
    r
}

/// Where [`in_dir`] returns to.
enum BackTo {
    /// The directory this thread's private attributes started with.
    Start,
    Owned(OwnedFd),
    /// The previous directory could not be opened: the root, which always exists.
    Root,
}

impl BackTo {
    fn go(self) {
        let root = || nix::unistd::chdir("/");
        let r = match &self {
            BackTo::Start => STATE.with(|s| match &*s.borrow() {
                State::Private(Some(fd)) => nix::unistd::fchdir(fd.as_fd()),
                _ => root(),
            }),
            BackTo::Owned(fd) => nix::unistd::fchdir(fd.as_fd()),
            BackTo::Root => root(),
        };
        if let Err(e) = r {
            log::warn!(
                "cannot return to the previous working directory: {}",
                io::Error::from(e)
            );
        }
    }
}

/// Runs `f` with `mask` as the umask, then restores the previous one.
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    let (_lock, _) = enter();
    let old = nix::sys::stat::umask(Mode::from_bits_truncate(mask & 0o777));
    let r = f();
    nix::sys::stat::umask(old);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Reads this thread's umask (setting it back at once).
    fn current_umask() -> libc::mode_t {
        let m = nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
        nix::sys::stat::umask(m);
        m.bits()
    }

    #[test]
    fn the_umask_is_per_thread_and_restored() {
        use std::sync::{Arc, Barrier};
        let inside = Arc::new(Barrier::new(2));
        let checked = Arc::new(Barrier::new(2));
        let (i2, c2) = (inside.clone(), checked.clone());
        let setter = std::thread::spawn(move || {
            let before = current_umask();
            let seen = with_umask(0o027, || {
                i2.wait();
                c2.wait();
                current_umask()
            });
            (seen, before, current_umask())
        });
        // A sibling thread, while the setter is inside with_umask, keeps the process umask.
        inside.wait();
        let sibling = std::thread::spawn(current_umask).join().unwrap();
        checked.wait();
        let (seen, before, after) = setter.join().unwrap();
        assert_eq!(seen, 0o027);
        assert_ne!(sibling, 0o027);
        assert_eq!(after, before);
    }

    #[test]
    fn in_dir_resolves_relative_names_there_and_returns() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("here"), b"x").unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        std::thread::spawn(move || {
            let before = std::env::current_dir().unwrap();
            let found = in_dir(dir.as_fd(), || Ok(std::path::Path::new("here").exists())).unwrap();
            assert!(found);
            assert_eq!(std::env::current_dir().unwrap(), before);
        })
        .join()
        .unwrap();
    }
}
