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
use std::os::fd::RawFd;

/// The first descriptor the service manager passes (`SD_LISTEN_FDS_START` in `sd-daemon.h`).
pub const SD_LISTEN_FDS_START: RawFd = 3;

/// The environment variables of the protocol; all of them are unset after reading.
const LISTEN_VARS: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];

/// Interprets the values of `LISTEN_PID` and `LISTEN_FDS` for process `our_pid`, without
/// touching the process: `Ok(Some(3))` when one socket was passed to this process, `Ok(None)`
/// when none was (variables unset, meant for another process, or `LISTEN_FDS=0`), and an error
/// when the values are malformed or name more than one socket.
pub fn parse_listen_env(
    listen_pid: Option<&OsStr>,
    listen_fds: Option<&OsStr>,
    our_pid: u32,
) -> Result<Option<RawFd>, String> {
    let Some(pid) = listen_pid else {
        return Ok(None);
    };
    let pid = pid
        .to_str()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| {
            format!(
                "socket activation: LISTEN_PID={}: expected a process id",
                pid.to_string_lossy()
            )
        })?;
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
        .ok_or_else(|| {
            format!(
                "socket activation: LISTEN_FDS={}: expected a number of descriptors",
                fds.to_string_lossy()
            )
        })?;
    match n {
        0 => Ok(None),
        1 => Ok(Some(SD_LISTEN_FDS_START)),
        n => Err(format!(
            "socket activation: LISTEN_FDS={n}: virtiofsd serves exactly one socket; give the \
             socket unit a single ListenStream= (one unit per shared directory)"
        )),
    }
}

/// Checks that `fd` is a listening unix stream socket: `SO_ACCEPTCONN` set, `SO_TYPE`
/// `SOCK_STREAM`, address family `AF_UNIX`.
pub fn check_listening_unix_socket(fd: RawFd) -> Result<(), String> {
    let what = |e: io::Error| format!("socket activation: descriptor {fd}: {e}");
    let accepting = getsockopt_int(fd, libc::SO_ACCEPTCONN).map_err(what)?;
    let kind = getsockopt_int(fd, libc::SO_TYPE).map_err(what)?;
    // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid value.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr` is a writable sockaddr_storage of `len` bytes; getsockname writes at most
    // `len` bytes into it and updates `len`. An invalid fd only makes the call fail.
    let rc = unsafe {
        libc::getsockname(
            fd,
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(what(io::Error::last_os_error()));
    }
    if i32::from(addr.ss_family) != libc::AF_UNIX {
        return Err(format!(
            "socket activation: descriptor {fd} is not a unix socket (address family {}); \
             use ListenStream=/path/to/socket",
            addr.ss_family
        ));
    }
    if kind != libc::SOCK_STREAM {
        return Err(format!(
            "socket activation: descriptor {fd} is not a stream socket (type {kind}); \
             use ListenStream=, not ListenDatagram= or ListenSequentialPacket="
        ));
    }
    if accepting == 0 {
        return Err(format!(
            "socket activation: descriptor {fd} is not listening; the socket unit needs \
             Accept=no"
        ));
    }
    Ok(())
}

/// `getsockopt(fd, SOL_SOCKET, opt)` for an option whose value is an int.
fn getsockopt_int(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `val` is a writable int and `len` its size; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(val)
}

/// Sets `FD_CLOEXEC` on `fd`, keeping its other descriptor flags.
fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with F_GETFD/F_SETFD takes and returns plain ints; a bad fd only fails.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
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
pub fn listen_fds_from_env() -> Result<Option<RawFd>, String> {
    let pid = std::env::var_os("LISTEN_PID");
    let fds = std::env::var_os("LISTEN_FDS");
    for var in LISTEN_VARS {
        std::env::remove_var(var);
    }
    let Some(fd) = parse_listen_env(pid.as_deref(), fds.as_deref(), std::process::id())? else {
        return Ok(None);
    };
    check_listening_unix_socket(fd)?;
    set_cloexec(fd).map_err(|e| format!("socket activation: descriptor {fd}: {e}"))?;
    Ok(Some(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};

    fn parse(pid: Option<&str>, fds: Option<&str>, ours: u32) -> Result<Option<RawFd>, String> {
        parse_listen_env(pid.map(OsStr::new), fds.map(OsStr::new), ours)
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
        assert_eq!(check_listening_unix_socket(l.as_raw_fd()), Ok(()));
    }

    #[test]
    fn other_descriptors_fail_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        let conn = UnixStream::connect(dir.path().join("s")).unwrap();
        let e = check_listening_unix_socket(conn.as_raw_fd()).unwrap_err();
        assert!(e.contains("not listening"), "{e}");
        drop(l);

        let dgram = UnixDatagram::unbound().unwrap();
        let e = check_listening_unix_socket(dgram.as_raw_fd()).unwrap_err();
        assert!(e.contains("not a stream socket"), "{e}");

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = check_listening_unix_socket(tcp.as_raw_fd()).unwrap_err();
        assert!(e.contains("not a unix socket"), "{e}");

        let file = std::fs::File::open("/dev/null").unwrap();
        let e = check_listening_unix_socket(file.as_raw_fd()).unwrap_err();
        assert!(e.contains("descriptor"), "{e}");
    }

    #[test]
    fn cloexec_is_set() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        let fd = l.as_raw_fd();
        // SAFETY: plain fcntl calls on a descriptor this test owns.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        set_cloexec(fd).unwrap();
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}
