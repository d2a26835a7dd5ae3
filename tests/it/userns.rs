//! `sandbox::userns::enter_user_namespace` for real: files the process creates inside the namespace
//! belong on the host to the ids the maps name.
//!
//! Entering a user namespace needs a single-threaded process, and the test harness runs every
//! test on a thread of its own. So each test starts this test binary again as a child process
//! with `VIRTIOFSD_USERNS_TEST` set; a constructor (`CHILD_HOOK`, run before `main` while the
//! process still has one thread) sees the variable, plays the scenario and exits, so the
//! harness never starts in the child.

use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

use virtiofsd::error::Chain;
use virtiofsd::sandbox::userns::{enter_user_namespace, IdMapRange};

/// Names the scenario the child plays: `probe`, or `<scenario>:<directory>`.
const MODE: &str = "VIRTIOFSD_USERNS_TEST";

/// Host uid and gid that namespace id 0 maps to in the root scenario.
const HOST_BASE: u32 = 100_000;

/// An unprivileged uid/gid the root test runs the own-id scenario as.
const PLAIN_ID: u32 = 4242;

#[used]
#[link_section = ".init_array"]
static CHILD_HOOK: extern "C" fn() = child_hook;

/// Runs before `main`: plays the scenario named by `MODE`, if any, and exits.
extern "C" fn child_hook() {
    let Some(mode) = std::env::var_os(MODE) else {
        return;
    };
    let mode = mode.to_string_lossy().into_owned();
    let code = match child(&mode) {
        Ok(()) => 0,
        Err(msg) => {
            eprintln!("userns child ({mode}): {msg}");
            1
        }
    };
    // SAFETY: ends the child before the harness starts; nothing is left to clean up.
    unsafe { libc::_exit(code) };
}

fn child(mode: &str) -> Result<(), String> {
    if mode == "probe" {
        // SAFETY: unshare only changes this (single-threaded, about to exit) process.
        return match unsafe { libc::unshare(libc::CLONE_NEWUSER) } {
            0 => Ok(()),
            _ => Err(format!("unshare: {}", std::io::Error::last_os_error())),
        };
    }
    let (scenario, dir) = mode.split_once(':').ok_or("bad mode")?;
    let range = |host_id, count| IdMapRange {
        ns_id: 0,
        host_id,
        count,
    };
    match scenario {
        "root" => {
            let map = [range(HOST_BASE, 65536)];
            enter_user_namespace(&map, &map).map_err(|e| Chain(&e).to_string())?;
        }
        "own" => enter_user_namespace(&[], &[]).map_err(|e| Chain(&e).to_string())?,
        "foreign" => {
            let map = [range(HOST_BASE, 65536)];
            enter_user_namespace(&map, &[]).map_err(|e| Chain(&e).to_string())?;
        }
        _ => return Err(format!("unknown scenario {scenario}")),
    }
    // SAFETY: these getters have no preconditions.
    let ids = unsafe {
        [
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        ]
    };
    if ids != [0; 4] {
        return Err(format!(
            "inside the namespace uid/euid/gid/egid are {ids:?}"
        ));
    }
    let uid_map = fs::read_to_string("/proc/self/uid_map").map_err(|e| Chain(&e).to_string())?;
    let setgroups =
        fs::read_to_string("/proc/self/setgroups").map_err(|e| Chain(&e).to_string())?;
    let path = Path::new(dir).join("inside");
    let report = format!("{}\n{}\n{}", ids[0], uid_map.trim(), setgroups.trim());
    fs::write(&path, report).map_err(|e| format!("create {}: {e}", path.display()))?;
    // The daemon reopens files through /proc/self/fd; that must still work once the process
    // has changed credentials.
    let f = fs::File::open(&path).map_err(|e| Chain(&e).to_string())?;
    let mut back = String::new();
    fs::File::open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .and_then(|mut g| g.read_to_string(&mut back))
        .map_err(|e| format!("reopen through /proc/self/fd: {e}"))?;
    if !back.starts_with("0\n") {
        return Err(format!("reopened file reads {back:?}"));
    }
    Ok(())
}

fn run_child(mode: String, as_id: Option<u32>) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.env(MODE, mode);
    if let Some(id) = as_id {
        cmd.uid(id).gid(id);
    }
    cmd.output().expect("start the test binary")
}

/// Whether this kernel lets a process create a user namespace; prints why not otherwise.
fn user_namespaces_work() -> bool {
    let max = fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if max == Some(0) {
        eprintln!("skipped: /proc/sys/user/max_user_namespaces is 0");
        return false;
    }
    let probe = run_child("probe".into(), None);
    if !probe.status.success() {
        eprintln!(
            "skipped: this kernel or container forbids user namespaces: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        return false;
    }
    true
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A directory any uid can create files in.
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod 777");
    dir
}

fn expect_success(out: &Output) {
    assert!(
        out.status.success(),
        "child failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn root_maps_a_subordinate_range_and_acts_as_its_root() {
    if !user_namespaces_work() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: mapping host ids 100000.. without newuidmap needs root");
        return;
    }
    let dir = open_dir();
    let out = run_child(format!("root:{}", dir.path().display()), None);
    expect_success(&out);
    let file = dir.path().join("inside");
    let meta = fs::metadata(&file).expect("file created inside the namespace");
    assert_eq!((meta.uid(), meta.gid()), (HOST_BASE, HOST_BASE));
    let text = fs::read_to_string(&file).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"), "getuid() inside");
    let map: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(map, ["0", "100000", "65536"]);
    // Mapped with privilege, so the daemon may still set supplementary groups.
    assert_eq!(lines.next(), Some("allow"), "/proc/self/setgroups inside");
}

#[test]
fn unprivileged_process_maps_its_own_ids() {
    if !user_namespaces_work() {
        return;
    }
    let dir = open_dir();
    // As root, play an unprivileged user; otherwise, be the user running the tests.
    let as_id = is_root().then_some(PLAIN_ID);
    // SAFETY: geteuid and getegid have no preconditions.
    let expected = as_id.map_or_else(
        || unsafe { (libc::geteuid(), libc::getegid()) },
        |id| (id, id),
    );
    let out = run_child(format!("own:{}", dir.path().display()), as_id);
    expect_success(&out);
    let file = dir.path().join("inside");
    let meta = fs::metadata(&file).expect("file created inside");
    assert_eq!((meta.uid(), meta.gid()), expected);
    // An unprivileged gid map of one's own gid needs setgroups denied.
    let text = fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().nth(2), Some("deny"), "{text}");
}

#[test]
fn unprivileged_process_cannot_map_foreign_ids_without_the_helpers() {
    if !user_namespaces_work() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: needs root to run the child as a plain user");
        return;
    }
    let dir = open_dir();
    let out = run_child(format!("foreign:{}", dir.path().display()), Some(PLAIN_ID));
    assert!(!out.status.success(), "a plain user mapped host uid 100000");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("uid_map") && err.contains("newuidmap"),
        "unclear error: {err}"
    );
    assert!(!dir.path().join("inside").exists());
}

/// The daemon binary started with `--uid-map`/`--gid-map`: what a guest creates as its root
/// (or as uid 1000) lands on the host as the mapped ids.
#[test]
fn daemon_with_id_maps_creates_files_as_the_mapped_host_ids() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    use virtiofsd::fuse::abi::ROOT_ID;
    use virtiofsd_frontend::FsFrontend;

    if !user_namespaces_work() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: needs root to map a subordinate range");
        return;
    }
    let base = open_dir();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let share = base.path().join("share");
    let sockdir = base.path().join("sock");
    fs::create_dir(&share).unwrap();
    fs::create_dir(&sockdir).unwrap();
    for d in [&share, &sockdir] {
        std::os::unix::fs::chown(d, Some(HOST_BASE), Some(HOST_BASE)).unwrap();
    }
    // Guest uid 1000 creates too.
    fs::set_permissions(&share, fs::Permissions::from_mode(0o777)).unwrap();
    let socket = sockdir.join("vfs.sock");
    let map = format!(":0:{HOST_BASE}:65536:");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--uid-map={map}"))
        .arg(format!("--gid-map={map}"))
        .arg("--log-level=error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd");

    let mut front = FsFrontend::connect(&socket, 1).expect("connect");
    let mut c = front.client(0).unwrap();
    c.init().unwrap();
    c.with_ctx(0, 0, 1, |c| {
        c.create(ROOT_ID, "by-root", libc::O_RDWR as u32, 0o644, 0)
    })
    .unwrap();
    c.with_ctx(1000, 1000, 1, |c| c.mkdir(ROOT_ID, "by-user", 0o755, 0))
        .unwrap();
    drop(c);
    front.disconnect();

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "virtiofsd did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    daemon
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "virtiofsd failed: {status}: {err}");
    let owner = |name: &str| {
        let m = fs::symlink_metadata(share.join(name)).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!(owner("by-root"), (HOST_BASE, HOST_BASE));
    assert_eq!(owner("by-user"), (HOST_BASE + 1000, HOST_BASE + 1000));
}

/// Starts the daemon with `args`, has a frontend create `name` in the share as the guest's
/// root (with `name` empty, only INIT), hangs up, and answers how the daemon ended and its
/// standard error.
fn serve_one_creation(
    socket: &Path,
    args: &[String],
    name: &str,
) -> (std::process::ExitStatus, String) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    use virtiofsd::fuse::abi::ROOT_ID;
    use virtiofsd_frontend::FsFrontend;

    let mut daemon = Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd");
    let served = FsFrontend::connect(socket, 1).map(|mut front| {
        let mut c = front.client(0).unwrap();
        c.init().unwrap();
        if !name.is_empty() {
            c.with_ctx(0, 0, 1, |c| {
                c.create(ROOT_ID, name, libc::O_RDWR as u32, 0o644, 0)
            })
            .unwrap();
        }
        drop(c);
        front.disconnect();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = daemon.kill();
            break daemon.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    daemon
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    if let Err(e) = served {
        err.push_str(&format!("\n(test) the frontend could not connect: {e}"));
    }
    (status, err)
}

/// Root with `--uid-map` and the socket in a directory only root may write (as /run): the
/// socket and its lock file are made before the daemon enters its namespace, so it starts and
/// serves (it once stopped with "cannot open the lock file ...: Permission denied"). What it
/// cannot remove there at exit is replaced by the next daemon on the same path.
#[test]
fn root_with_id_maps_serves_a_socket_in_a_root_only_directory() {
    if !user_namespaces_work() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: needs root to map a subordinate range");
        return;
    }
    let base = open_dir();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let share = base.path().join("share");
    let run = base.path().join("run");
    fs::create_dir(&share).unwrap();
    fs::create_dir(&run).unwrap();
    // Writable by its owner alone, whatever the umask of this process (other modules of the
    // test crate clear it).
    fs::set_permissions(&share, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&share, Some(HOST_BASE), Some(HOST_BASE)).unwrap();
    // Like /run: root's, writable by root alone.
    fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).unwrap();
    let socket = run.join("vfs.sock");
    let map = format!(":0:{HOST_BASE}:65536:");
    let args = vec![
        format!("--socket-path={}", socket.display()),
        format!("--shared-dir={}", share.display()),
        format!("--uid-map={map}"),
        format!("--gid-map={map}"),
        "--log-level=warn".to_string(),
    ];
    for (round, name) in ["first", "second"].into_iter().enumerate() {
        let (status, err) = serve_one_creation(&socket, &args, name);
        assert!(
            status.success() && !err.contains("cannot open the lock file"),
            "daemon {round}: {status}: {err}"
        );
        let m = fs::symlink_metadata(share.join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (HOST_BASE, HOST_BASE), "daemon {round}");
        // The socket was made by root of the host, so that QEMU as root finds it as without
        // the maps.
        if let Ok(m) = fs::symlink_metadata(&socket) {
            assert_eq!(m.uid(), 0, "the socket's owner");
        }
    }
    // A share of root's, which the namespace's root may not write: the daemon says so.
    std::os::unix::fs::chown(&share, Some(0), Some(0)).unwrap();
    let (status, err) = serve_one_creation(&socket, &args, "");
    assert!(status.success(), "{status}: {err}");
    assert!(
        err.contains("of its user namespace (--uid-map) and may not write it"),
        "no warning about the share: {err}"
    );
}
