//! systemd socket activation: taking the listening vhost-user socket from the service manager.
//!
//! The protocol is the one `sd_listen_fds(3)` describes. The service manager (systemd with a
//! `.socket` unit, or `systemd-socket-activate`) creates and binds the socket, starts the
//! daemon with the socket open as file descriptor 3 (`SD_LISTEN_FDS_START`), and sets two
//! environment variables:
//!
//! - `LISTEN_PID`: the pid of the process the descriptors are meant for. A daemon that finds
//!   another pid there inherited the variables from an ancestor and must ignore them;
//! - `LISTEN_FDS`: how many descriptors were passed, numbered from 3 upwards.
//!
//! The daemon serves exactly one vhost-user socket, so exactly one descriptor is accepted; a
//! socket unit with several `ListenStream=` lines is refused with a message. The descriptor must
//! be a listening unix stream socket (QEMU connects to a path). [`listen_fds_from_env`] checks
//! this, unsets `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` so that no process the daemon
//! starts inherits them, and marks descriptor 3 close-on-exec.
//!
//! The command line takes precedence: `--socket-path` and `--fd` are used as given, and the
//! environment is only consulted when neither is on the command line.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{getsockname, getsockopt, sockopt, AddressFamily, SockType};
use nix::sys::socket::{SockaddrLike, SockaddrStorage};

/// The first descriptor the service manager passes (`SD_LISTEN_FDS_START` in `sd-daemon.h`).
pub const SD_LISTEN_FDS_START: RawFd = 3;

/// The environment variables of the protocol; all of them are unset after reading.
const LISTEN_VARS: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];

/// Why the socket the service manager passed cannot be served. Every message starts with
/// `socket activation:` and names the variable or the descriptor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("socket activation: LISTEN_PID={0}: expected a process id")]
    Pid(String),
    #[error("socket activation: LISTEN_FDS={0}: expected a number of descriptors")]
    FdCount(String),
    #[error(
        "socket activation: LISTEN_FDS={0}: virtiofsd serves exactly one socket; give the \
         socket unit a single ListenStream= (one unit per shared directory)"
    )]
    Several(u32),
    /// The descriptor cannot be inspected or marked close-on-exec (not a socket, not open).
    #[error("socket activation: descriptor {fd}")]
    Descriptor {
        fd: RawFd,
        #[source]
        source: io::Error,
    },
    #[error(
        "socket activation: descriptor {fd} is not a unix socket (address family {family}); \
         use ListenStream=/path/to/socket"
    )]
    NotUnix { fd: RawFd, family: String },
    #[error(
        "socket activation: descriptor {fd} is not a stream socket (type {kind}); \
         use ListenStream=, not ListenDatagram= or ListenSequentialPacket="
    )]
    NotStream { fd: RawFd, kind: i32 },
    #[error(
        "socket activation: descriptor {fd} is not listening; the socket unit needs Accept=no"
    )]
    NotListening { fd: RawFd },
}

/// Interprets the values of `LISTEN_PID` and `LISTEN_FDS` for process `our_pid`, without
/// touching the process: `Ok(Some(3))` when one socket was passed to this process, `Ok(None)`
/// when none was (variables unset, meant for another process, or `LISTEN_FDS=0`), and an error
/// when the values are malformed or name more than one socket.
pub fn parse_listen_env(
    listen_pid: Option<&OsStr>,
    listen_fds: Option<&OsStr>,
    our_pid: u32,
) -> Result<Option<RawFd>, Error> {
    let Some(pid) = listen_pid else {
        return Ok(None);
    };
    let pid = pid
        .to_str()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| Error::Pid(pid.to_string_lossy().into_owned()))?;
    if pid != our_pid {
        // Inherited from an ancestor that was activated: not for us.
        return Ok(None);
    }
    let Some(fds) = listen_fds else {
        return Ok(None);
    };
    let n = fds
        .to_str()
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or_else(|| Error::FdCount(fds.to_string_lossy().into_owned()))?;
    match n {
        0 => Ok(None),
        1 => Ok(Some(SD_LISTEN_FDS_START)),
        n => Err(Error::Several(n)),
    }
}

/// Checks that `fd` is a listening unix stream socket: address family `AF_UNIX`, `SO_TYPE`
/// `SOCK_STREAM`, `SO_ACCEPTCONN` set. `fd` is a descriptor the caller owns, or a number that
/// may not be open at all (then the check fails).
pub fn check_listening_unix_socket(fd: RawFd) -> Result<(), Error> {
    let failed = |e: nix::Error| Error::Descriptor {
        fd,
        source: e.into(),
    };
    let addr: SockaddrStorage = getsockname(fd).map_err(failed)?;
    if addr.family() != Some(AddressFamily::Unix) {
        // The number, as `<sys/socket.h>` has it (nix names a few families only).
        let family = addr
            .family()
            .map_or_else(|| "unknown".into(), |f| (f as i32).to_string());
        return Err(Error::NotUnix { fd, family });
    }
    // SAFETY: `getsockname` has just found `fd` open, and the borrow ends with this function;
    // the process is single-threaded then (see `listen_fds_from_env`), or the caller owns `fd`.
    let sock = unsafe { BorrowedFd::borrow_raw(fd) };
    // A unix socket is a stream, a datagram or a sequenced-packet one: a type nix knows.
    let kind = getsockopt(&sock, sockopt::SockType).map_err(failed)?;
    if kind != SockType::Stream {
        return Err(Error::NotStream {
            fd,
            kind: kind as i32,
        });
    }
    if !getsockopt(&sock, sockopt::AcceptConn).map_err(failed)? {
        return Err(Error::NotListening { fd });
    }
    Ok(())
}

/// Sets `FD_CLOEXEC` on `fd`, keeping its other descriptor flags.
fn set_cloexec(fd: BorrowedFd<'_>) -> nix::Result<()> {
    let flags = FdFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFD)?);
    fcntl(fd, FcntlArg::F_SETFD(flags | FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// The listening socket systemd passed to this process, if any (see the module documentation).
///
/// Reads `LISTEN_PID` and `LISTEN_FDS` and unsets them (and `LISTEN_FDNAMES`) whatever they
/// say. Returns `Ok(Some(3))` after checking that descriptor 3 is a listening unix stream
/// socket and marking it close-on-exec; `Ok(None)` when nothing was passed to this process.
/// The caller owns the descriptor from then on.
///
/// Changes the environment, so call it early, while the process is still single-threaded.
pub fn listen_fds_from_env() -> Result<Option<RawFd>, Error> {
    let pid = std::env::var_os("LISTEN_PID");
    let fds = std::env::var_os("LISTEN_FDS");
    for var in LISTEN_VARS {
        std::env::remove_var(var);
    }
    let Some(fd) = parse_listen_env(pid.as_deref(), fds.as_deref(), std::process::id())? else {
        return Ok(None);
    };
    check_listening_unix_socket(fd)?;
    // SAFETY: `fd` was just found to be an open socket, passed to this process (LISTEN_PID
    // names it); the process is single-threaded yet, and the borrow ends with this function.
    let sock = unsafe { BorrowedFd::borrow_raw(fd) };
    set_cloexec(sock).map_err(|e| Error::Descriptor {
        fd,
        source: e.into(),
    })?;
    Ok(Some(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};

    /// The result, with the error as its message.
    fn parse(pid: Option<&str>, fds: Option<&str>, ours: u32) -> Result<Option<RawFd>, String> {
        parse_listen_env(pid.map(OsStr::new), fds.map(OsStr::new), ours).map_err(|e| e.to_string())
    }

    /// The check's error message, with its cause.
    fn refusal(fd: RawFd) -> String {
        let e = check_listening_unix_socket(fd).unwrap_err();
        crate::error::Chain(&e).to_string()
    }

    #[test]
    fn one_socket_for_us_is_fd_3() {
        assert_eq!(parse(Some("42"), Some("1"), 42), Ok(Some(3)));
    }

    #[test]
    fn nothing_when_the_variables_are_unset() {
        assert_eq!(parse(None, None, 42), Ok(None));
        assert_eq!(parse(None, Some("1"), 42), Ok(None));
        assert_eq!(parse(Some("42"), None, 42), Ok(None));
    }

    #[test]
    fn nothing_when_meant_for_another_process() {
        assert_eq!(parse(Some("41"), Some("1"), 42), Ok(None));
        // Even a malformed count is not ours to judge then.
        assert_eq!(parse(Some("41"), Some("x"), 42), Ok(None));
    }

    #[test]
    fn nothing_when_zero_sockets() {
        assert_eq!(parse(Some("42"), Some("0"), 42), Ok(None));
    }

    #[test]
    fn more_than_one_socket_is_refused() {
        let e = parse(Some("42"), Some("2"), 42).unwrap_err();
        assert!(e.contains("LISTEN_FDS=2"), "{e}");
        assert!(e.contains("exactly one"), "{e}");
    }

    #[test]
    fn malformed_values_are_refused() {
        for pid in ["", "abc", "-1", "0", "42 "] {
            let e = parse(Some(pid), Some("1"), 42).unwrap_err();
            assert!(e.contains("LISTEN_PID"), "{pid:?}: {e}");
        }
        for fds in ["", "one", "-1", "1x"] {
            let e = parse(Some("42"), Some(fds), 42).unwrap_err();
            assert!(e.contains("LISTEN_FDS"), "{fds:?}: {e}");
        }
    }

    #[test]
    fn a_listening_unix_stream_socket_passes_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        check_listening_unix_socket(l.as_raw_fd()).unwrap();
    }

    #[test]
    fn other_descriptors_fail_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        let conn = UnixStream::connect(dir.path().join("s")).unwrap();
        let e = refusal(conn.as_raw_fd());
        assert!(e.contains("not listening"), "{e}");
        drop(l);

        let dgram = UnixDatagram::unbound().unwrap();
        let e = refusal(dgram.as_raw_fd());
        assert!(e.contains("not a stream socket"), "{e}");
        assert!(e.contains(&format!("(type {})", libc::SOCK_DGRAM)), "{e}");

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = refusal(tcp.as_raw_fd());
        assert!(e.contains("not a unix socket"), "{e}");
        assert!(
            e.contains(&format!("(address family {})", libc::AF_INET)),
            "{e}"
        );

        let file = std::fs::File::open("/dev/null").unwrap();
        let e = refusal(file.as_raw_fd());
        assert!(e.contains("descriptor"), "{e}");
        assert!(e.contains("os error"), "{e}");
    }

    #[test]
    fn cloexec_is_set() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        let fd = l.as_fd();
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).unwrap();
        set_cloexec(fd).unwrap();
        let flags = fcntl(fd, FcntlArg::F_GETFD).unwrap();
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}
