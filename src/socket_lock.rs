//! One daemon per socket path: the lock file `<socket>.pid`.
//!
//! Before it creates the socket at `--socket-path`, the daemon opens (creating it if needed)
//! `<socket>.pid` next to it, takes an exclusive `flock(2)` on it without waiting, and writes its
//! pid into it. A second daemon started on the same path finds the lock taken and refuses to
//! start, naming the socket and the pid it reads from the file, instead of replacing the live
//! socket. The reference `virtiofsd` uses the same file name, so neither daemon takes over the
//! other's socket.
//!
//! The kernel releases the lock when the last descriptor of the file closes, so a daemon that
//! was killed leaves at most a stale file, which does not block the next one. A daemon that
//! stops normally removes the file while it still holds the lock; a daemon that had opened the
//! file just before it was removed notices (the path no longer leads to the file it locked) and
//! starts over with a fresh file. A socket passed with `--fd` or by systemd socket activation
//! has no path the daemon owns, and no lock: whoever made the socket owns it.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "vhost-user socket {} is in use by another virtiofsd ({}, lock file {}); stop it or \
         choose another --socket-path",
        .socket.display(),
        .pid.map_or_else(|| "pid unknown".to_owned(), |p| format!("pid {p}")),
        .lock.display()
    )]
    InUse {
        socket: PathBuf,
        lock: PathBuf,
        pid: Option<u32>,
    },
    #[error("vhost-user socket: cannot open the lock file {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "vhost-user socket: the lock file {} is {why}, not a file of this daemon's; remove it, \
         or choose a --socket-path in a directory only its owner can write to",
        .path.display()
    )]
    Untrusted { path: PathBuf, why: String },
    #[error("vhost-user socket: cannot lock {}", .path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("vhost-user socket: cannot write the pid into {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The lock file of the socket at `socket`: `<socket>.pid`.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".pid");
    PathBuf::from(s)
}

/// The lock on a socket path, held until the process (and every process it forked without
/// closing the descriptor) exits. Dropping it closes this copy of the descriptor; it does not
/// remove the file (see [`remove_lock_file`]).
#[derive(Debug)]
pub struct SocketLock {
    _file: File,
}

/// Takes the lock of the socket path `socket` for this process and writes `pid` into it.
pub fn acquire(socket: &Path, pid: u32) -> Result<SocketLock, LockError> {
    let path = lock_path(socket);
    // A removal by the previous holder between our open and our flock is retried; more than a
    // few in a row means something else keeps replacing the file.
    for _ in 0..16 {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        check_own_file(&file, &path)?;
        // SAFETY: flock(2) on the descriptor of `file`, which stays open across the call; no
        // memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let source = io::Error::last_os_error();
            if source.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(LockError::InUse {
                    socket: socket.to_path_buf(),
                    pid: holder_pid(&mut file),
                    lock: path,
                });
            }
            return Err(LockError::Lock { path, source });
        }
        if !still_at_path(&file, &path) {
            continue;
        }
        let write = |file: &mut File| -> io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(format!("{pid}\n").as_bytes())
        };
        write(&mut file).map_err(|source| LockError::Write {
            path: path.clone(),
            source,
        })?;
        return Ok(SocketLock { _file: file });
    }
    Err(LockError::Lock {
        path,
        source: io::Error::other("the lock file keeps being replaced"),
    })
}

/// Refuses a lock file this daemon would not have made: another user's (who could hold the
/// lock to keep the daemon from starting, or rewrite the pid an administrator reads), a hard
/// link to some other file (whose contents the pid would replace), or not a regular file.
fn check_own_file(file: &File, path: &Path) -> Result<(), LockError> {
    let meta = file.metadata().map_err(|source| LockError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let untrusted = |why: String| LockError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    if !meta.file_type().is_file() {
        return Err(untrusted("not a regular file".into()));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(untrusted(format!(
            "owned by uid {} (this daemon runs as uid {uid})",
            meta.uid()
        )));
    }
    // (No link at all: its holder removed it just now, and the caller starts over.)
    if meta.nlink() > 1 {
        return Err(untrusted(format!(
            "a file with {} hard links",
            meta.nlink()
        )));
    }
    Ok(())
}

/// Whether `path` still names the file open as `file` (the previous holder may have removed it
/// between our open and our lock).
fn still_at_path(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The pid the holder wrote into the lock file. The holder writes it right after locking, so
/// an empty file is read again for a short while.
fn holder_pid(file: &mut File) -> Option<u32> {
    for _ in 0..50 {
        // A pid and a newline; whatever else the file holds is not read.
        let mut text = Vec::with_capacity(PID_TEXT);
        if file.rewind().is_ok()
            && (&mut *file)
                .take(PID_TEXT as u64)
                .read_to_end(&mut text)
                .is_ok()
        {
            let pid = std::str::from_utf8(&text)
                .ok()
                .and_then(|t| t.lines().next())
                .and_then(|l| l.trim().parse().ok());
            if pid.is_some() {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Most bytes of the lock file read for the holder's pid.
const PID_TEXT: usize = 32;

/// Removes the lock file of the socket at `socket`; to be called by the holder, while it still
/// holds the lock (before it exits). A file already gone is no error.
pub fn remove_lock_file(socket: &Path) {
    let path = lock_path(socket);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != io::ErrorKind::NotFound {
            log::warn!(
                "cannot remove the lock file {}: {e}{}",
                path.display(),
                left_hint(&e)
            );
        }
    }
}

/// Why a file the daemon made in the socket's directory may outlive it, and that it does no
/// harm: with `--uid-map`, the daemon made the socket and its lock file before it entered its
/// user namespace, where it may no longer write that directory (root's /run, for one).
fn left_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            " (the daemon's user namespace, --uid-map/--gid-map, may not write the socket's \
             directory; the file is left, and the next daemon started on this path replaces it)"
        }
        _ => "",
    }
}

/// Device and inode number of the socket file the daemon made, so that it removes that file
/// and nothing another user put at the path since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketId {
    dev: u64,
    ino: u64,
}

impl SocketId {
    /// The socket at `path`, if that is one (a symbolic link is not followed).
    pub fn of(path: &Path) -> Option<Self> {
        let m = std::fs::symlink_metadata(path).ok()?;
        m.file_type().is_socket().then(|| SocketId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// Removes the socket file at `path` when it is still the one the daemon made (`made`), then
/// the lock file. The socket goes first: once the lock file is gone another daemon may take
/// the path.
pub fn remove_socket(path: &Path, made: Option<SocketId>) {
    if made.is_some() && SocketId::of(path) == made {
        if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!(
                    "cannot remove the socket {}: {e}{}",
                    path.display(),
                    left_hint(&e)
                );
            }
        }
    }
    remove_lock_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_file_is_the_socket_path_with_pid_appended() {
        assert_eq!(
            lock_path(Path::new("/run/vfs.sock")),
            Path::new("/run/vfs.sock.pid")
        );
    }

    #[test]
    fn a_second_lock_on_the_same_socket_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        let held = acquire(&socket, 4242).unwrap();
        assert_eq!(
            std::fs::read_to_string(lock_path(&socket)).unwrap(),
            "4242\n"
        );
        // A new open file description, as another process would have: refused.
        let e = acquire(&socket, 4343).unwrap_err();
        assert!(
            matches!(
                e,
                LockError::InUse {
                    pid: Some(4242),
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains(&socket.display().to_string()), "{msg}");
        assert!(msg.contains("pid 4242"), "{msg}");
        drop(held);
        // Released: a stale file does not block, and it is rewritten.
        let _again = acquire(&socket, 4343).unwrap();
        assert_eq!(
            std::fs::read_to_string(lock_path(&socket)).unwrap(),
            "4343\n"
        );
    }

    #[test]
    fn a_lock_file_hard_linked_to_another_file_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::hard_link(&victim, lock_path(&socket)).unwrap();
        let e = acquire(&socket, 4242).unwrap_err();
        assert!(matches!(e, LockError::Untrusted { .. }), "{e:?}");
        assert!(e.to_string().contains("hard links"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn a_lock_file_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root
        }
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        std::fs::write(lock_path(&socket), "1\n").unwrap();
        std::os::unix::fs::chown(lock_path(&socket), Some(65534), None).unwrap();
        let e = acquire(&socket, 4242).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        assert_eq!(std::fs::read_to_string(lock_path(&socket)).unwrap(), "1\n");
    }

    #[test]
    fn a_huge_lock_file_is_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        let held = acquire(&socket, 7).unwrap();
        // The holder's file made huge (sparse): the pid is still read from its start, quickly.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(lock_path(&socket))
            .unwrap();
        f.set_len(1 << 40).unwrap();
        let started = std::time::Instant::now();
        let e = acquire(&socket, 8).unwrap_err();
        assert!(matches!(e, LockError::InUse { pid: Some(7), .. }), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(held);
    }

    #[test]
    fn a_lock_file_removed_by_its_holder_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s.sock");
        let held = acquire(&socket, 1).unwrap();
        remove_lock_file(&socket);
        // The path is free again: the next daemon creates a new file, even while the old
        // (removed) one is still locked.
        let next = acquire(&socket, 2).unwrap();
        assert_eq!(std::fs::read_to_string(lock_path(&socket)).unwrap(), "2\n");
        drop((held, next));
    }
}
