//! systemd socket activation of the real binary: the test plays the service manager. It binds
//! and listens on a unix socket, starts `virtiofsd` without `--socket-path` or `--fd`, with the
//! socket as descriptor 3 and `LISTEN_FDS`/`LISTEN_PID` set as `sd_listen_fds(3)` describes, and
//! then connects to the socket as QEMU would.
//!
//! `LISTEN_PID` must be the daemon's own pid, which is only known after the fork; a tiny
//! `sh -c 'LISTEN_PID=$$ ... exec "$0" "$@"'` wrapper sets it (the shell's pid is the pid the
//! daemon gets from `exec`), so that the code between fork and exec only calls
//! async-signal-safe functions.

use crate::common;

use common::wait_exit;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use virtiofsd::fuse::abi::ROOT_ID;
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

struct Setup {
    _tmp: TempDir,
    share: PathBuf,
    socket: PathBuf,
    listener: UnixListener,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    fs::write(share.join("hello"), b"activated").unwrap();
    let socket = tmp.path().join("vfs.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    Setup {
        _tmp: tmp,
        share,
        socket,
        listener,
    }
}

/// Starts the binary with `args`, the listener as descriptor 3 and `LISTEN_FDS=listen_fds`;
/// `LISTEN_PID` is the daemon's own pid, or `pid_offset` more than it. The test's own copy of
/// the listener is closed once the daemon runs, so that a daemon which did not take the socket
/// makes connecting fail at once instead of hanging in the handshake.
fn spawn_activated(
    listener: UnixListener,
    listen_fds: &str,
    pid_offset: u32,
    args: &[String],
) -> Child {
    let fd = listener.as_raw_fd();
    let script =
        format!("LISTEN_PID=$(($$ + {pid_offset})) LISTEN_FDS={listen_fds} exec \"$0\" \"$@\"");
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(script)
        .arg(BIN)
        .args(args)
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_FDNAMES")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only calls dup2 and
    // fcntl, which are async-signal-safe. It puts the listening socket at descriptor 3 without
    // close-on-exec, as the service manager does.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("start virtiofsd through sh");
    drop(listener);
    child
}

fn share_arg(share: &Path) -> String {
    format!("--shared-dir={}", share.display())
}

#[test]
fn binary_serves_a_socket_passed_by_socket_activation() {
    let s = setup();
    let child = spawn_activated(
        s.listener,
        "1",
        0,
        &[share_arg(&s.share), "--log-level=error".into()],
    );
    let mut fe = FsFrontend::connect(&s.socket, 1).expect("connect to the activated socket");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let e = c.lookup(ROOT_ID, "hello").unwrap();
    let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    assert_eq!(c.read(e.nodeid, fh, 0, 100).unwrap(), b"activated");
    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    // The socket file belongs to the service manager: the daemon leaves it in place.
    assert!(
        s.socket.exists(),
        "the daemon removed a socket it did not create"
    );
}

#[test]
fn more_than_one_activated_socket_is_refused() {
    let s = setup();
    let child = spawn_activated(s.listener, "2", 0, &[share_arg(&s.share)]);
    let (status, err) = wait_exit(child);
    assert_ne!(status.code(), Some(0), "stderr: {err}");
    assert!(err.contains("LISTEN_FDS"), "stderr: {err}");
}

#[test]
fn sockets_meant_for_another_process_are_ignored() {
    // LISTEN_PID names some other process: the daemon has no socket and says so.
    let s = setup();
    let child = spawn_activated(s.listener, "1", 1, &[share_arg(&s.share)]);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("socket"), "stderr: {err}");
}

#[test]
fn the_command_line_socket_wins_over_an_activated_one() {
    let s = setup();
    let own = s.socket.with_file_name("own.sock");
    let child = spawn_activated(
        s.listener,
        "1",
        0,
        &[
            share_arg(&s.share),
            format!("--socket-path={}", own.display()),
            "--log-level=error".into(),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !own.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            own.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut fe = FsFrontend::connect(&own, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    c.lookup(ROOT_ID, "hello").unwrap();
    drop(fe);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
}
