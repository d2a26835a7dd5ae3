//! Rootless launches, as the reference README's unprivileged recipe and `podman unshare` do
//! them: an unprivileged user starts the daemon inside `unshare -r` (a user namespace mapping
//! root to that user only, with `setgroups` denied) or `unshare -r --map-auto` (the same plus
//! the user's subordinate ids from `/etc/subuid` and `/etc/subgid`), with each `--sandbox`
//! value. The daemon must start (it keeps the supplementary groups it may not drop there),
//! serve, create files as the mapped host ids, and exit 0 when the frontend hangs up.
//!
//! Run as root, the test arranges what it needs on a fresh Debian machine: the `uidmap`
//! package (`newuidmap`/`newgidmap`, which `--map-auto` runs), a system user
//! `virtiofsd-rootless` and a subordinate id range for it. The user starts `unshare` with its
//! own group as a supplementary group, as a login would give it. Not run as root, the test
//! says it is skipped.

use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::wait_exit;
use virtiofsd::fuse::abi::ROOT_ID;
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");
const USER: &str = "virtiofsd-rootless";

/// The test user and the first of its subordinate uids and gids.
#[derive(Debug)]
struct Rootless {
    uid: u32,
    gid: u32,
    sub_uid: u32,
    sub_gid: u32,
}

fn sh(cmd: &str) -> Result<String, String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd}: {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The start of `user`'s range in a subordinate id file, if it has one.
fn sub_range(file: &str, user: &str) -> Option<u32> {
    fs::read_to_string(file).ok()?.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == user).then_some(())?;
        f.next()?.parse().ok()
    })
}

/// The first id after every range of both subordinate id files (at least 100000).
fn free_sub_start() -> u32 {
    ["/etc/subuid", "/etc/subgid"]
        .iter()
        .flat_map(|f| {
            fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(f.get(1)?.parse::<u32>().ok()? + f.get(2)?.parse::<u32>().ok()?)
        })
        .fold(100_000, u32::max)
}

/// Installs `uidmap`, creates the test user and its subordinate ranges when missing.
fn arrange() -> Result<Rootless, String> {
    if sh("command -v newuidmap && command -v newgidmap").is_err() {
        let install = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                       --no-install-recommends uidmap";
        sh(install)
            .or_else(|_| sh(&format!("apt-get update -q && {install}")))
            .map_err(|e| format!("installing uidmap: {e}"))?;
    }
    if sh(&format!("getent passwd {USER}")).is_err() {
        sh(&format!(
            "useradd --system --user-group --no-create-home --home-dir /nonexistent \
             --shell /usr/sbin/nologin {USER}"
        ))?;
    }
    for (file, flag) in [
        ("/etc/subuid", "--add-subuids"),
        ("/etc/subgid", "--add-subgids"),
    ] {
        if sub_range(file, USER).is_none() {
            let start = free_sub_start();
            sh(&format!("usermod {flag} {start}-{} {USER}", start + 65535))?;
        }
    }
    let id = |opt: &str| -> Result<u32, String> {
        sh(&format!("id {opt} {USER}"))?
            .trim()
            .parse()
            .map_err(|e| format!("id {opt}: {e}"))
    };
    Ok(Rootless {
        uid: id("-u")?,
        gid: id("-g")?,
        sub_uid: sub_range("/etc/subuid", USER).ok_or("no /etc/subuid entry")?,
        sub_gid: sub_range("/etc/subgid", USER).ok_or("no /etc/subgid entry")?,
    })
}

/// The arranged user, or `None` (with the reason printed) when the test cannot run here.
fn rootless() -> Option<&'static Rootless> {
    static R: OnceLock<Option<Rootless>> = OnceLock::new();
    R.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: arranging a test user with subordinate ids needs root");
            return None;
        }
        Some(arrange().unwrap_or_else(|e| panic!("cannot arrange the rootless user: {e}")))
    })
    .as_ref()
}

/// Starts `unshare <map_args> -- virtiofsd --sandbox=<sandbox>` as the test user on a fresh
/// share, serves one session through it, and checks who owns what the guest created.
fn serve_rootless(r: &Rootless, map_args: &[&str], sandbox: &str) {
    let what = format!(
        "unshare {} -- virtiofsd --sandbox={sandbox}",
        map_args.join(" ")
    );
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    std::os::unix::fs::chown(base, Some(r.uid), Some(r.gid)).unwrap();
    fs::set_permissions(base, fs::Permissions::from_mode(0o755)).unwrap();
    let share = base.join("share");
    fs::create_dir(&share).unwrap();
    std::os::unix::fs::chown(&share, Some(r.uid), Some(r.gid)).unwrap();
    // Guest callers other than root may create in it too.
    fs::set_permissions(&share, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(share.join("hello"), b"rootless").unwrap();
    std::os::unix::fs::chown(share.join("hello"), Some(r.uid), Some(r.gid)).unwrap();
    // The build tree may not be reachable by the test user (e.g. under /root).
    // Copied by another process: a copy written here would leave its descriptor open for
    // writing in the children other tests of this process fork meanwhile (until they exec),
    // and executing the copy then fails with ETXTBSY.
    let bin = base.join("virtiofsd");
    let cp = Command::new("install")
        .args(["-m", "0755", BIN])
        .arg(&bin)
        .status()
        .unwrap();
    assert!(cp.success(), "install {BIN}: {cp}");
    let socket = base.join("vfs.sock");

    let mut cmd = Command::new("unshare");
    cmd.args(map_args)
        .arg("--")
        .arg(&bin)
        .arg(format!("--sandbox={sandbox}"))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG");
    let (uid, gid) = (r.uid, r.gid);
    // SAFETY: runs in the child between fork and exec; setgroups, setgid and setuid are
    // async-signal-safe, and `groups` is a local array.
    unsafe {
        cmd.pre_exec(move || {
            let groups = [gid];
            if libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if child.try_wait().unwrap().is_some() {
            let (status, err) = wait_exit(child);
            panic!("{what}: exited before listening ({status}): {err}");
        }
        assert!(Instant::now() < deadline, "{what}: never listened");
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut fe = FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let e = c.lookup(ROOT_ID, "hello").unwrap();
    let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    assert_eq!(c.read(e.nodeid, fh, 0, 100).unwrap(), b"rootless", "{what}");
    // The guest's root is the namespace's root: the user who started the daemon.
    c.set_ctx(0, 0, 1);
    c.mkdir(ROOT_ID, "by-root", 0o755, 0).unwrap();
    let md = fs::metadata(share.join("by-root")).unwrap();
    assert_eq!((md.uid(), md.gid()), (r.uid, r.gid), "{what}");
    // Guest uid 1000 is subordinate id 999 past the range's start with --map-auto; without it
    // the namespace has no such id, and the creation is refused rather than made as another.
    c.set_ctx(1000, 1000, 1);
    let made = c.mkdir(ROOT_ID, "by-1000", 0o755, 0);
    if map_args.contains(&"--map-auto") {
        made.unwrap_or_else(|e| panic!("{what}: mkdir as guest uid 1000: {e:?}"));
        let md = fs::metadata(share.join("by-1000")).unwrap();
        assert_eq!(
            (md.uid(), md.gid()),
            (r.sub_uid + 999, r.sub_gid + 999),
            "{what}"
        );
    } else {
        assert!(made.is_err(), "{what}: created as an unmapped guest uid");
        assert!(!share.join("by-1000").exists(), "{what}");
    }
    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "{what}: {status}, stderr: {err}");
    assert!(!err.contains("ERROR"), "{what}: {err}");
    if sandbox != "none" {
        assert!(
            err.contains(&format!("sandbox: {sandbox}")),
            "{what}: {err}"
        );
    }
    assert!(!socket.exists(), "{what}: socket left behind");
}

#[test]
fn unshare_r_with_each_sandbox_mode() {
    let Some(r) = rootless() else { return };
    for sandbox in ["namespace", "chroot", "none"] {
        serve_rootless(r, &["-r"], sandbox);
    }
}

#[test]
fn unshare_r_map_auto_with_each_sandbox_mode() {
    let Some(r) = rootless() else { return };
    for sandbox in ["namespace", "chroot", "none"] {
        serve_rootless(r, &["-r", "--map-auto"], sandbox);
    }
}
