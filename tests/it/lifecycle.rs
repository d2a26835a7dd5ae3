//! The daemon's life: the real binary started, served, disconnected, signalled, and refusing a
//! bad command line; `daemon::serve` refusing a bad configuration; the device configuration
//! space.

use crate::common;

use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use virtiofsd::daemon::{self, DaemonConfig, DaemonError, SocketSpec};
use virtiofsd::fuse::abi::ROOT_ID;
use virtiofsd::passthrough::{CacheMode, Config};
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

fn spawn(args: &[String]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd")
}

fn serve_args(d: &RunDirs, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("--socket-path={}", d.socket.display()),
        format!("--shared-dir={}", d.share.display()),
        "--log-level=error".to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Polls until `path` exists (the daemon is listening).
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

// ---- the binary -------------------------------------------------------------------------------

#[test]
fn binary_serves_one_frontend_and_exits_0_when_it_disconnects() {
    let d = run_dirs();
    fs::write(d.share.join("hello"), b"hello from the host").unwrap();
    let child = spawn(&serve_args(&d, &[]));

    let mut fe = FsFrontend::connect(&d.socket, 1).expect("connect to the binary");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let e = c.lookup(ROOT_ID, "hello").unwrap();
    let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    assert_eq!(
        c.read(e.nodeid, fh, 0, 100).unwrap(),
        b"hello from the host"
    );
    // The real daemon clears its umask: the mode given is the mode the host gets.
    let (n, o) = c
        .create(
            ROOT_ID,
            "made",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o666,
            0,
        )
        .unwrap();
    c.write(n.nodeid, o.fh, 0, b"guest data").unwrap();
    assert_eq!(fs::read(d.share.join("made")).unwrap(), b"guest data");
    assert_eq!(
        std::os::unix::fs::MetadataExt::mode(&fs::metadata(d.share.join("made")).unwrap()) & 0o777,
        0o666
    );

    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!d.socket.exists(), "socket left behind");
    assert!(!err.contains("panicked"), "{err}");
    // One connection only: nobody listens any more.
    assert!(std::os::unix::net::UnixStream::connect(&d.socket).is_err());
}

#[test]
fn binary_with_a_thread_pool_and_two_queues() {
    let d = run_dirs();
    let child = spawn(&serve_args(&d, &["--thread-pool-size=2", "--cache=never"]));
    let mut fe = FsFrontend::connect(&d.socket, 2).unwrap();
    let mut c0 = fe.client(0).unwrap();
    let init = c0.init().unwrap();
    let mut c1 = fe.client(1).unwrap();
    c1.set_init_out(init);
    let e = c1.mkdir(ROOT_ID, "dir", 0o750, 0).unwrap();
    assert_eq!(c0.lookup(ROOT_ID, "dir").unwrap().nodeid, e.nodeid);
    assert!(d.share.join("dir").is_dir());
    drop(fe);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    assert!(!d.socket.exists());
}

#[test]
fn sigterm_while_waiting_for_a_connection_exits_0_and_removes_the_socket() {
    let d = run_dirs();
    let child = spawn(&serve_args(&d, &[]));
    wait_for(&d.socket);
    signal(&child, libc::SIGTERM);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!d.socket.exists(), "socket left behind");
}

#[test]
fn sigint_while_waiting_for_a_connection_exits_0_and_removes_the_socket() {
    let d = run_dirs();
    let child = spawn(&serve_args(&d, &[]));
    wait_for(&d.socket);
    signal(&child, libc::SIGINT);
    let (status, _) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}");
    assert!(status.signal().is_none());
    assert!(!d.socket.exists());
}

#[test]
fn sigterm_during_a_session_exits_0_and_removes_the_socket() {
    let d = run_dirs();
    let child = spawn(&serve_args(&d, &[]));
    let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    c.mkdir(ROOT_ID, "before-signal", 0o755, 0).unwrap();
    signal(&child, libc::SIGTERM);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!d.socket.exists());
    assert!(d.share.join("before-signal").is_dir());
}

#[test]
fn binary_serves_a_listening_socket_passed_with_fd() {
    use std::os::fd::AsRawFd;
    let d = run_dirs();
    let listener = std::os::unix::net::UnixListener::bind(&d.socket).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(BIN);
    cmd.arg(format!("--fd={fd}"))
        .arg(format!("--shared-dir={}", d.share.display()))
        .arg("--log-level=error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only calls fcntl, which
    // is async-signal-safe; it makes the listening socket survive exec in the child only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    c.symlink(ROOT_ID, "via-fd", "target").unwrap();
    assert!(fs::symlink_metadata(d.share.join("via-fd")).is_ok());
    drop(fe);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    drop(listener);
}

#[test]
fn callers_do_not_inherit_the_daemons_supplementary_groups() {
    let d = run_dirs();
    let grp = d.share.join("grp");
    fs::create_dir(&grp).unwrap();
    std::os::unix::fs::chown(&grp, Some(0), Some(4242)).unwrap();
    fs::set_permissions(&grp, std::os::unix::fs::PermissionsExt::from_mode(0o775)).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(serve_args(&d, &[]))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // As if started by a user in group 4242 (e.g. with sudo).
    // SAFETY: runs in the child between fork and exec; setgroups is async-signal-safe and
    // `groups` outlives the call.
    unsafe {
        cmd.pre_exec(|| {
            let groups: [libc::gid_t; 1] = [4242];
            if libc::setgroups(1, groups.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let g = c.lookup(ROOT_ID, "grp").unwrap().nodeid;
    // 1000:1000 is not in group 4242: only the daemon is.
    let r = c.with_ctx(1000, 1000, 1, |c| c.mkdir(g, "sub", 0o755, 0));
    drop(fe);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    assert_eq!(
        r.map(|e| (e.attr.uid, e.attr.gid)),
        Err(libc::EACCES),
        "a caller outside group 4242 created in a group-4242 directory"
    );
    assert!(!grp.join("sub").exists());
}

// ---- one daemon per socket path ----------------------------------------------------------------

/// `<socket>.pid`, the lock file of a socket path.
fn lock_file(socket: &Path) -> std::path::PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".pid");
    s.into()
}

/// Serves one LOOKUP of `name` through `socket`, then hangs up.
fn assert_reachable(socket: &Path, share: &Path, name: &str) {
    fs::write(share.join(name), b"x").unwrap();
    let mut fe = FsFrontend::connect(socket, 1).expect("the first daemon is still reachable");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    c.lookup(ROOT_ID, name).unwrap();
    fe.disconnect();
}

#[test]
fn a_second_daemon_on_a_live_socket_exits_1_naming_the_socket_and_the_first_pid() {
    for sandbox in ["--sandbox=none", "--sandbox=namespace"] {
        let d = run_dirs();
        let first = spawn(&serve_args(&d, &[sandbox]));
        wait_for(&d.socket);
        let socket_inode = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&d.socket).unwrap());
        assert_eq!(
            fs::read_to_string(lock_file(&d.socket)).unwrap(),
            format!("{}\n", first.id()),
            "{sandbox}: the lock file holds the pid of the daemon that was started"
        );

        let second = spawn(&serve_args(&d, &[sandbox]));
        let (status, err) = wait_exit(second);
        assert_eq!(
            status.code(),
            Some(1),
            "{sandbox}: {status:?}, stderr: {err}"
        );
        assert!(
            err.contains(&d.socket.display().to_string()) && err.contains("in use"),
            "{sandbox}: {err}"
        );
        assert!(
            err.contains(&format!("pid {}", first.id())),
            "{sandbox}: {err}"
        );
        // The first daemon's socket is untouched and it still serves.
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&fs::metadata(&d.socket).unwrap()),
            socket_inode,
            "{sandbox}: the second daemon replaced the socket"
        );
        assert_reachable(&d.socket, &d.share, "still-there");
        let (status, err) = wait_exit(first);
        assert_eq!(status.code(), Some(0), "{sandbox}: {err}");
        assert!(!d.socket.exists(), "{sandbox}: socket left behind");
        assert!(
            !lock_file(&d.socket).exists(),
            "{sandbox}: lock file left behind"
        );
    }
}

#[test]
fn a_stale_lock_from_a_killed_daemon_does_not_block_the_next_one() {
    for sandbox in ["--sandbox=none", "--sandbox=namespace"] {
        let d = run_dirs();
        let killed = spawn(&serve_args(&d, &[sandbox]));
        wait_for(&d.socket);
        signal(&killed, libc::SIGKILL);
        let (status, _) = wait_exit(killed);
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // With a sandbox, the serving child learns of its parent's death and exits too; the
        // lock is released once both are gone.
        assert!(
            lock_file(&d.socket).exists(),
            "{sandbox}: no stale lock file to test with"
        );
        assert!(d.socket.exists(), "{sandbox}: no stale socket to test with");

        let deadline = Instant::now() + Duration::from_secs(10);
        let next = loop {
            let next = spawn(&serve_args(&d, &[sandbox]));
            let mut next = next;
            std::thread::sleep(Duration::from_millis(100));
            match next.try_wait().unwrap() {
                None => break next,
                Some(_) => {
                    let (_, err) = wait_exit(next);
                    assert!(
                        err.contains("in use") && Instant::now() < deadline,
                        "{sandbox}: {err}"
                    );
                }
            }
        };
        assert_reachable(&d.socket, &d.share, "after-stale");
        let (status, err) = wait_exit(next);
        assert_eq!(status.code(), Some(0), "{sandbox}: {err}");
    }
}

#[test]
fn a_lock_file_of_a_process_that_is_gone_does_not_block() {
    let d = run_dirs();
    // A lock file and a socket file left by something long gone, with a pid nobody holds.
    fs::write(lock_file(&d.socket), "999999999\n").unwrap();
    drop(std::os::unix::net::UnixListener::bind(&d.socket).unwrap());
    let child = spawn(&serve_args(&d, &["--sandbox=none"]));
    std::thread::sleep(Duration::from_millis(200));
    assert_reachable(&d.socket, &d.share, "fresh");
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "{err}");
}

#[test]
fn a_socket_passed_with_fd_takes_no_lock() {
    use std::os::fd::AsRawFd;
    let d = run_dirs();
    // Another daemon holds the lock of this path: a socket handed over with --fd is the
    // launcher's business, not the lock's.
    fs::write(lock_file(&d.socket), "1\n").unwrap();
    let holder = fs::File::open(lock_file(&d.socket)).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns and keeps open; no memory is passed.
    let locked = unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    let listener = std::os::unix::net::UnixListener::bind(&d.socket).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(BIN);
    cmd.arg(format!("--fd={fd}"))
        .arg(format!("--shared-dir={}", d.share.display()))
        .arg("--log-level=error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only calls fcntl, which
    // is async-signal-safe; it makes the listening socket survive exec in the child only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    assert_reachable(&d.socket, &d.share, "via-fd");
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    assert_eq!(fs::read_to_string(lock_file(&d.socket)).unwrap(), "1\n");
    drop((listener, holder));
}

/// Runs the binary with `args`, expects exit status 2 and a message naming `flag`.
fn assert_refused(args: &[String], flag: &str) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run virtiofsd");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: status {:?}, stderr: {err}",
        out.status
    );
    assert!(
        err.contains(flag),
        "{args:?}: stderr does not name {flag}: {err}"
    );
}

#[test]
fn bad_command_lines_exit_2_naming_the_flag() {
    let d = run_dirs();
    let share = format!("--shared-dir={}", d.share.display());
    let sock = format!("--socket-path={}", d.socket.display());
    let with = |extra: &str| vec![share.clone(), sock.clone(), extra.to_string()];

    assert_refused(&with("--no-such-flag"), "--no-such-flag");
    assert_refused(&with("--cache=sometimes"), "--cache");
    assert_refused(&with("--sandbox=jail"), "--sandbox");
    assert_refused(&with("--modcaps=+no_such_cap"), "--modcaps");
    assert_refused(&with("--seccomp=maybe"), "--seccomp");
    assert_refused(&with("--log-level=loud"), "--log-level");
    assert_refused(&with("--thread-pool-size=many"), "--thread-pool-size");
    assert_refused(&with("--tag="), "--tag");
    assert_refused(&with(&format!("--tag={}", "t".repeat(37))), "--tag");
    assert_refused(&with("--fd=3"), "--fd");
    assert_refused(std::slice::from_ref(&sock), "--shared-dir");
    assert_refused(std::slice::from_ref(&share), "--socket-path");
    assert_refused(&[share.clone(), "--fd=-1".to_string()], "--fd");
    // Nothing was created.
    assert!(!d.socket.exists());
}

#[test]
fn help_and_version_exit_0() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--shared-dir",
        "--socket-path",
        "--cache",
        "--thread-pool-size",
    ] {
        assert!(text.contains(flag), "--help does not mention {flag}");
    }
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

// ---- daemon::serve ----------------------------------------------------------------------------

fn config(share: &Path, socket: &Path) -> DaemonConfig {
    DaemonConfig {
        fs: Config::new(share, CacheMode::Auto),
        socket: SocketSpec::Path(socket.to_path_buf()),
        tag: None,
        thread_pool_size: 0,
        poll_window: std::time::Duration::ZERO,
        translate: Default::default(),
        uid_map: Vec::new(),
        gid_map: Vec::new(),
    }
}

#[test]
fn serve_refuses_a_missing_shared_directory_without_creating_the_socket() {
    let d = run_dirs();
    let missing = d.share.join("missing");
    match daemon::serve(config(&missing, &d.socket)) {
        Err(DaemonError::SharedDir { path, source }) => {
            assert_eq!(path, missing);
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
        }
        other => panic!("expected a shared-directory error, got {other:?}"),
    }
    assert!(!d.socket.exists());
}

#[test]
fn serve_refuses_a_socket_path_it_cannot_bind() {
    let d = run_dirs();
    let bad = d.share.join("no/such/dir/vfs.sock");
    assert!(matches!(
        daemon::serve(config(&d.share, &bad)),
        Err(DaemonError::Listen { .. })
    ));
}

#[test]
fn serve_refuses_a_tag_longer_than_the_config_space() {
    let d = run_dirs();
    let mut cfg = config(&d.share, &d.socket);
    cfg.tag = Some("t".repeat(37));
    assert!(matches!(daemon::serve(cfg), Err(DaemonError::Backend(_))));
    assert!(!d.socket.exists());
}

#[test]
fn serve_returns_ok_after_the_frontend_disconnects_even_without_init() {
    let d = Daemon::with(Options::default().no_init());
    // A frontend that set the device up but never spoke FUSE.
    assert!(d.fe.is_connected());
    d.finish();
}

#[test]
fn tag_and_queue_count_are_in_the_device_configuration_space() {
    use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
    use vhost::vhost_user::VhostUserFrontend;
    let mut d = Daemon::with(Options::default().tag("myfs"));
    assert!(d
        .fe
        .protocol_features()
        .contains(VhostUserProtocolFeatures::CONFIG));
    let vu = d.fe.vhost().unwrap();
    let (_, payload) = vu
        .get_config(0, 40, VhostUserConfigFlags::WRITABLE, &[0u8; 40])
        .unwrap();
    assert_eq!(&payload[..4], b"myfs");
    assert!(payload[4..36].iter().all(|&b| b == 0));
    let nrq = u32::from_le_bytes(payload[36..40].try_into().unwrap());
    assert_eq!(
        nrq as usize,
        virtiofsd::vhost_user::backend::MAX_REQUEST_QUEUES
    );
    assert!(d.c.lookup(ROOT_ID, "x").is_err());
    d.finish();
}

/// Serves one frontend that gives `shared` of its memory; returns how `serve` ended and the
/// frontend's own result.
fn serve_a_frontend_sharing(
    shared: virtiofsd_frontend::SharedMemory,
) -> (Result<(), DaemonError>, bool) {
    let d = run_dirs();
    let cfg = config(&d.share, &d.socket);
    let daemon = std::thread::spawn(move || daemon::serve(cfg));
    let fe_cfg = virtiofsd_frontend::FrontendConfig {
        shared_memory: shared,
        ..Default::default()
    };
    let connected = match FsFrontend::connect_with(&d.socket, 1, &fe_cfg) {
        Ok(mut fe) => {
            let mut c = fe.client(0).unwrap();
            c.init().unwrap();
            true
        }
        Err(_) => false,
    };
    (daemon.join().unwrap(), connected)
}

#[test]
fn a_frontend_that_shares_no_guest_memory_is_told_to_start_qemu_with_share_on() {
    use virtiofsd::vhost_user::backend::UnsharedMemory;
    use virtiofsd_frontend::SharedMemory;
    let (served, connected) = serve_a_frontend_sharing(SharedMemory::Nothing);
    assert!(!connected, "set up without guest memory");
    match served {
        Err(e @ DaemonError::GuestMemoryNotShared(UnsharedMemory::All)) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("guest memory is not shared with virtiofsd"),
                "{msg}"
            );
            for part in ["memory-backend-memfd", "share=on", "-numa node,memdev=mem"] {
                assert!(msg.contains(part), "{msg}");
            }
            assert!(!msg.contains('\n'), "one line: {msg}");
        }
        other => panic!("expected GuestMemoryNotShared(All), got {other:?}"),
    }
}

#[test]
fn a_frontend_whose_rings_lie_in_memory_it_did_not_share_is_told_so() {
    use virtiofsd::vhost_user::backend::UnsharedMemory;
    use virtiofsd_frontend::SharedMemory;
    let (served, connected) = serve_a_frontend_sharing(SharedMemory::FirstPage);
    assert!(!connected, "set up with the rings outside shared memory");
    match served {
        Err(e @ DaemonError::GuestMemoryNotShared(UnsharedMemory::Part)) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("part of guest memory is not shared"),
                "{msg}"
            );
            assert!(msg.contains("share=on"), "{msg}");
        }
        other => panic!("expected GuestMemoryNotShared(Part), got {other:?}"),
    }
}

#[test]
fn a_frontend_that_shares_all_of_its_memory_is_served_without_that_error() {
    let (served, connected) = serve_a_frontend_sharing(virtiofsd_frontend::SharedMemory::All);
    assert!(connected);
    assert!(served.is_ok(), "{served:?}");
}
