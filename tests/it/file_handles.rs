//! `--inode-file-handles` on the real binary, driven through the test frontend: descriptors of
//! the daemon stay bounded with `prefer` and `mandatory` while they grow with `never`, files
//! renamed on the host are still reached, and `mandatory` refuses to start where handles
//! cannot be had.

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use virtiofsd::fuse::abi::{fattr, ROOT_ID};
use virtiofsd_frontend::{FsFrontend, FuseClient};

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Starts the binary (without a sandbox) on `share` with `extra` flags, through `wrapper` (e.g. `setpriv ...`)
/// when given.
fn spawn(share: &Path, socket: &Path, extra: &[&str], wrapper: &[&str]) -> Child {
    let mut args: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
    args.push(BIN.to_string());
    args.push(format!("--socket-path={}", socket.display()));
    args.push(format!("--shared-dir={}", share.display()));
    args.push("--log-level=warn".to_string());
    // Unconfined, so that the process started is the one serving: its descriptors are counted
    // and its refusal to start is seen before any socket exists.
    args.push("--sandbox=none".to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd")
}

/// Waits for the socket (the daemon serves) or the daemon's exit.
fn wait_listening(child: &mut Child, socket: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon neither served nor exited"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn daemon_fds(child: &Child) -> usize {
    fs::read_dir(format!("/proc/{}/fd", child.id()))
        .unwrap()
        .count()
}

fn chmod(c: &mut FuseClient, node: u64, mode: u32) {
    let mut s = setattr_in(fattr::MODE);
    s.mode = mode;
    c.setattr(node, &s).unwrap();
}

/// Looks up and chmods `n` files on a daemon started with `mode`; returns how many descriptors
/// the daemon opened meanwhile.
fn descriptors_after_using_files(mode: &str, n: usize) -> usize {
    let d = run_dirs();
    for i in 0..n {
        fs::write(d.share.join(format!("f{i}")), b"").unwrap();
    }
    let mut child = spawn(&d.share, &d.socket, &[mode], &[]);
    assert!(wait_listening(&mut child, &d.socket));
    let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    c.getattr(ROOT_ID, None).unwrap();
    let before = daemon_fds(&child);
    for i in 0..n {
        let e = c.lookup(ROOT_ID, format!("f{i}")).unwrap();
        chmod(&mut c, e.nodeid, 0o600);
    }
    let after = daemon_fds(&child);
    assert_eq!(
        fs::metadata(d.share.join(format!("f{}", n - 1)))
            .unwrap()
            .mode()
            & 0o777,
        0o600
    );
    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "{mode}: {err}");
    after.saturating_sub(before)
}

#[test]
fn prefer_and_mandatory_keep_descriptors_bounded_never_does_not() {
    if !as_root() {
        eprintln!("skipped: open_by_handle_at needs CAP_DAC_READ_SEARCH");
        return;
    }
    const N: usize = 2000;
    for mode in [
        "--inode-file-handles=prefer",
        "--inode-file-handles=mandatory",
    ] {
        let grown = descriptors_after_using_files(mode, N);
        assert!(grown < 20, "{mode}: {grown} descriptors for {N} files");
    }
    let grown = descriptors_after_using_files("--inode-file-handles=never", N);
    assert!(grown >= N, "never: {grown} descriptors for {N} files");
}

#[test]
fn files_renamed_on_the_host_are_still_reached() {
    if !as_root() {
        return;
    }
    for mode in [
        "--inode-file-handles=prefer",
        "--inode-file-handles=mandatory",
    ] {
        let d = run_dirs();
        fs::create_dir(d.share.join("sub")).unwrap();
        fs::write(d.share.join("f"), b"hello").unwrap();
        let mut child = spawn(&d.share, &d.socket, &[mode], &[]);
        assert!(wait_listening(&mut child, &d.socket));
        let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let f = c.lookup(ROOT_ID, "f").unwrap();
        chmod(&mut c, f.nodeid, 0o640);
        fs::rename(d.share.join("f"), d.share.join("sub/g")).unwrap();
        let a = c.getattr(f.nodeid, None).unwrap();
        assert_eq!((a.attr.ino, a.attr.size), (f.attr.ino, 5), "{mode}");
        chmod(&mut c, f.nodeid, 0o604);
        assert_eq!(
            fs::metadata(d.share.join("sub/g")).unwrap().mode() & 0o777,
            0o604,
            "{mode}"
        );
        let fh = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap().fh;
        assert_eq!(c.read(f.nodeid, fh, 0, 100).unwrap(), b"hello", "{mode}");
        fe.disconnect();
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{mode}: {err}");
    }
}

#[test]
fn mandatory_refuses_to_start_on_a_file_system_without_handles() {
    if !as_root() {
        return;
    }
    let d = run_dirs();
    let mounted = Command::new("mount")
        .args(["-t", "ramfs", "none"])
        .arg(&d.share)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount ramfs");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let child = spawn(
            &d.share,
            &d.socket,
            &["--inode-file-handles=mandatory"],
            &[],
        );
        // The socket may exist for a moment (it is made before the shared directory is
        // opened); the daemon must exit with an error, not serve.
        let (status, err) = wait_exit(child);
        assert_ne!(status.code(), Some(0));
        assert!(
            err.contains("--inode-file-handles=mandatory") && err.contains("gives no file handles"),
            "{err}"
        );
        // prefer serves it, with descriptors.
        let mut child = spawn(&d.share, &d.socket, &["--inode-file-handles=prefer"], &[]);
        assert!(wait_listening(&mut child, &d.socket));
        let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let (e, o) = c
            .create(
                ROOT_ID,
                "f",
                (libc::O_CREAT | libc::O_RDWR) as u32,
                0o644,
                0,
            )
            .unwrap();
        c.release(e.nodeid, o.fh, 0).unwrap();
        chmod(&mut c, e.nodeid, 0o600);
        fe.disconnect();
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
        assert!(err.contains("gives no file handles"), "{err}");
    });
    let _ = Command::new("umount").arg(&d.share).status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn without_cap_dac_read_search_prefer_warns_and_mandatory_refuses() {
    if !as_root() || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let nocap = ["setpriv", "--bounding-set=-dac_read_search", "--"];
    let d = run_dirs();
    fs::write(d.share.join("f"), b"x").unwrap();
    let child = spawn(
        &d.share,
        &d.socket,
        &["--inode-file-handles=mandatory"],
        &nocap,
    );
    let (status, err) = wait_exit(child);
    assert_ne!(status.code(), Some(0));
    assert!(err.contains("CAP_DAC_READ_SEARCH"), "{err}");

    // prefer warns and runs as never; the default (never) needs no such capability and says
    // nothing about it.
    for (flags, warns) in [
        (&["--inode-file-handles=prefer"][..], true),
        (&[][..], false),
    ] {
        let mut child = spawn(&d.share, &d.socket, flags, &nocap);
        assert!(wait_listening(&mut child, &d.socket));
        let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let f = c.lookup(ROOT_ID, "f").unwrap();
        chmod(&mut c, f.nodeid, 0o600);
        fe.disconnect();
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
        assert_eq!(
            err.contains("CAP_DAC_READ_SEARCH") && err.contains("runs as never"),
            warns,
            "{flags:?}: {err}"
        );
    }
}
