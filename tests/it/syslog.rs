//! `--syslog` through a test `/dev/log`: the daemon runs in a mount namespace of its own in
//! which `/dev` is a test directory holding a datagram socket `log` that the test reads, so
//! the test sees exactly the lines a syslog daemon would get. Every line must carry a pid the
//! host knows (the started process, or the sandbox's serving child as the host numbers it;
//! never the 1 it is inside its pid namespace), and the deprecation warnings of the command
//! line must be among them. Needs root (a mount namespace); says it is skipped otherwise.

use crate::common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::wait_exit;
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

/// One syslog datagram: its priority, the pid in its tag and its text.
#[derive(Debug)]
struct Line {
    priority: u32,
    pid: u32,
    text: String,
}

/// Parses `<PRI>Mmm dd hh:mm:ss virtiofsd[PID]: text`.
fn parse(datagram: &[u8]) -> Result<Line, String> {
    let s = String::from_utf8_lossy(datagram).into_owned();
    let bad = || format!("not a virtiofsd[PID] syslog line: {s:?}");
    let rest = s.strip_prefix('<').ok_or_else(bad)?;
    let (pri, rest) = rest.split_once('>').ok_or_else(bad)?;
    let (_, rest) = rest.split_once(" virtiofsd[").ok_or_else(bad)?;
    let (pid, text) = rest.split_once("]: ").ok_or_else(bad)?;
    Ok(Line {
        priority: pri.parse().map_err(|_| bad())?,
        pid: pid.parse().map_err(|_| bad())?,
        text: text.to_owned(),
    })
}

/// Starts the daemon with `args` in a private mount namespace whose `/dev` is `dev`.
fn spawn_with_dev(dev: &Path, args: &[String]) -> Child {
    let dev = CString::new(dev.as_os_str().as_bytes()).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG");
    // SAFETY: runs in the child between fork and exec; unshare and mount are async-signal-safe
    // system calls, and every string they get was made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let none = std::ptr::null::<libc::c_char>();
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    dev.as_ptr(),
                    c"/dev".as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("start virtiofsd")
}

/// Runs one session of a daemon started with `--syslog -f` and `extra`; returns the syslog
/// lines, the started pid and the serving child's pid (the started one without a sandbox).
fn session(extra: &[&str]) -> (Vec<Line>, u32, u32) {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    fs::create_dir(&dev).unwrap();
    let log = UnixDatagram::bind(dev.join("log")).unwrap();
    log.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    let socket = tmp.path().join("vfs.sock");
    let mut args = vec![
        format!("--shared-dir={}", share.display()),
        format!("--socket-path={}", socket.display()),
        "--syslog".to_string(),
        "-f".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let child = spawn_with_dev(&dev, &args);
    let started = child.id();
    let serving = if extra.contains(&"--sandbox=none") {
        started
    } else {
        common::serving_child(&child)
    };
    let mut fe = FsFrontend::connect(&socket, 1).expect("connect");
    fe.client(0).unwrap().init().unwrap();
    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "{extra:?}: {status}, stderr: {err}");
    // The deprecation warning is on stderr as before.
    assert!(err.contains("-f is deprecated"), "{extra:?}: {err}");

    let mut lines = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = log.recv(&mut buf) {
        lines.push(parse(&buf[..n]).unwrap());
    }
    (lines, started, serving)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What every session must show in syslog.
fn assert_lines(extra: &[&str], lines: &[Line], started: u32, serving: u32) {
    assert!(!lines.is_empty(), "{extra:?}: nothing reached syslog");
    for l in lines {
        assert!(
            l.pid == started || l.pid == serving,
            "{extra:?}: pid {} is neither the started daemon ({started}) nor its serving \
             process ({serving}): {l:?}",
            l.pid
        );
        assert_eq!(
            l.priority & !7,
            libc::LOG_USER as u32,
            "facility user: {l:?}"
        );
    }
    let warning = lines
        .iter()
        .find(|l| l.text.contains("-f is deprecated"))
        .unwrap_or_else(|| {
            panic!("{extra:?}: the deprecation warning is not in syslog: {lines:?}")
        });
    assert_eq!(
        warning.priority,
        (libc::LOG_USER | libc::LOG_WARNING) as u32
    );
    // The serving process says so, under the pid the host knows it by.
    assert!(
        lines
            .iter()
            .any(|l| l.pid == serving && l.text.contains("frontend connected")),
        "{extra:?}: {lines:?}"
    );
}

#[test]
fn a_sandboxed_daemon_logs_the_host_pids_and_its_warnings() {
    if !is_root() {
        eprintln!("skipped: a private /dev/log needs root (a mount namespace)");
        return;
    }
    for extra in [&["--sandbox=namespace"][..], &["--sandbox=chroot"]] {
        let (lines, started, serving) = session(extra);
        assert_ne!(started, serving);
        assert_lines(extra, &lines, started, serving);
        assert!(lines.iter().all(|l| l.pid != 1), "{extra:?}: {lines:?}");
        // The supervisor's own lines keep its pid.
        assert!(
            lines.iter().any(|l| l.pid == started),
            "{extra:?}: {lines:?}"
        );
    }
}

#[test]
fn an_unsandboxed_daemon_logs_its_own_pid_and_its_warnings() {
    if !is_root() {
        eprintln!("skipped: a private /dev/log needs root (a mount namespace)");
        return;
    }
    let extra = &["--sandbox=none"][..];
    let (lines, started, serving) = session(extra);
    assert_lines(extra, &lines, started, serving);
    assert!(lines.iter().all(|l| l.pid == started), "{lines:?}");
}

#[test]
fn a_dead_dev_log_and_a_fatal_error_still_reach_stderr() {
    if !is_root() {
        eprintln!("skipped: a private /dev/log needs root (a mount namespace)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    fs::create_dir(&dev).unwrap();
    // A socket file left by a syslog daemon that stopped: nothing listens on it.
    drop(UnixDatagram::bind(dev.join("log")).unwrap());
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    let socket = tmp.path().join("vfs.sock");
    // The path is taken by a first daemon: the second stops with exit 1.
    let lock = virtiofsd::socket_lock::acquire(&socket, 4242).unwrap();
    let args = [
        format!("--shared-dir={}", share.display()),
        format!("--socket-path={}", socket.display()),
        "--syslog".to_string(),
        "--sandbox=none".to_string(),
    ];
    let (status, err) = wait_exit(spawn_with_dev(&dev, &args));
    drop(lock);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("no syslog daemon listens"), "{err}");
    assert!(
        err.contains("in use by another virtiofsd (pid 4242"),
        "{err}"
    );
}
