//! The real binary confined with `--sandbox=namespace` and `--sandbox=chroot`: it serves the
//! share, the process that serves (the child of the one started) sees nothing else, runs in
//! namespaces of its own (or with the share as its root), keeps only the capabilities it needs
//! (`--modcaps` changes them), exits 0 when the frontend disconnects or on SIGTERM, and the
//! socket file is removed.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{clear_umask, fuse_dev, serving_child, setattr_in, wait_exit};
use tempfile::TempDir;
use virtiofsd::fuse::abi::{fattr, ROOT_ID};
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

/// CapEff of a daemon run as root: chown, dac_override, fowner, fsetid, setgid, setuid, mknod,
/// setfcap (no dac_read_search: the default `--inode-file-handles=never` opens no handles).
const ROOT_CAPS: u64 = 0x8800_00db;
const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
const CAP_SYS_ADMIN: u64 = 1 << 21;
const CAP_MKNOD: u64 = 1 << 27;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Dirs {
    tmp: TempDir,
    share: PathBuf,
    socket: PathBuf,
}

/// A world-readable base with `share/` (holding `hello`, and symlinks to `/` and `/etc`) and
/// the socket path.
fn dirs() -> Dirs {
    clear_umask();
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    fs::set_permissions(&share, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(share.join("hello"), b"hello from the host").unwrap();
    std::os::unix::fs::symlink("/", share.join("to-root")).unwrap();
    std::os::unix::fs::symlink("/etc", share.join("to-etc")).unwrap();
    std::os::unix::fs::symlink("../../../../../..", share.join("up")).unwrap();
    let socket = tmp.path().join("vfs.sock");
    Dirs { tmp, share, socket }
}

fn command(sandbox: &str, share: &Path, socket: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg(format!("--sandbox={sandbox}"))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .arg("--log-level=error")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

fn cap_eff(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff line");
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

fn cap_bnd(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .expect("CapBnd line");
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

fn ns(pid: &str, kind: &str) -> PathBuf {
    fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap()
}

/// The mounts of process `pid`: (mount point, per-mount options), from its mountinfo.
fn mounts(pid: u32) -> Vec<(String, Vec<String>)> {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[4].to_string(),
                f[5].split(',').map(str::to_string).collect(),
            )
        })
        .collect()
}

/// Checks that the serving process `child` holds a descriptor into a procfs of its own pid
/// namespace mounted with `subset=pid` (its `/proc/self/fd`, opened before the old root was
/// detached): walking up from it shows only the process itself, and no `sys`, `sysrq-trigger`
/// or any other system-wide file.
fn assert_only_a_pid_procfs_is_reachable(child: u32) {
    let mut found = false;
    for e in fs::read_dir(format!("/proc/{child}/fd")).unwrap() {
        let fd = e.unwrap().path();
        // SAFETY: statfs is plain data, for which all-zero bytes are a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(fd.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path, `st` a local out value.
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0
            || st.f_type != libc::PROC_SUPER_MAGIC
            || !fd.is_dir()
        {
            continue;
        }
        found = true;
        // The descriptor is /proc/self/fd = /proc/1/fd of the new pid namespace.
        let top = fd.join("../..");
        let mut names: Vec<String> = fs::read_dir(&top)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["1", "self", "thread-self"], "{}", top.display());
        assert!(top.join("1/status").exists());
        for p in ["sys", "sysrq-trigger", "kcore", "mounts", "net"] {
            assert!(
                fs::symlink_metadata(top.join(p)).is_err(),
                "{p} reachable through the procfs of the serving process"
            );
        }
    }
    assert!(found, "no procfs descriptor in the serving process");
}

/// Serves a few requests: lookups, a read, a create and write, an open with `O_TRUNC`, a hard
/// link and a chmod (the last three go through `/proc/self/fd`); the symlinks are served as
/// symlinks, and nothing can be looked up through them.
fn exercise(socket: &Path, share: &Path) {
    let mut fe = FsFrontend::connect(socket, 1).expect("connect to the binary");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let e = c.lookup(ROOT_ID, "hello").unwrap();
    let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    assert_eq!(
        c.read(e.nodeid, fh, 0, 100).unwrap(),
        b"hello from the host"
    );
    let (n, o) = c
        .create(
            ROOT_ID,
            "made",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o640,
            0,
        )
        .unwrap();
    c.write(n.nodeid, o.fh, 0, b"guest data").unwrap();
    assert_eq!(fs::read(share.join("made")).unwrap(), b"guest data");
    let t = c
        .open(n.nodeid, (libc::O_WRONLY | libc::O_TRUNC) as u32)
        .unwrap();
    c.write(n.nodeid, t.fh, 0, b"again").unwrap();
    assert_eq!(fs::read(share.join("made")).unwrap(), b"again");
    c.link(n.nodeid, ROOT_ID, "made-link").unwrap();
    assert_eq!(fs::read(share.join("made-link")).unwrap(), b"again");
    let mut sa = setattr_in(fattr::MODE);
    sa.mode = 0o600;
    c.setattr(e.nodeid, &sa).unwrap();
    let mode = fs::metadata(share.join("hello"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    for (link, target) in [("to-root", "/"), ("to-etc", "/etc")] {
        let l = c.lookup(ROOT_ID, link).unwrap();
        assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
        assert_eq!(c.readlink(l.nodeid).unwrap(), target.as_bytes());
        assert!(c.lookup(l.nodeid, "passwd").is_err());
    }
    assert_eq!(c.lookup(ROOT_ID, "..").unwrap().nodeid, ROOT_ID);
    fe.disconnect();
}

/// What the serving process sees through its own root: the share, and nothing of the host.
/// (Symlinks are not tried here: an absolute target met under `/proc/PID/root` resolves against
/// the test's own root, not the process's.)
fn assert_root_is_the_share(child: u32) {
    let root = PathBuf::from(format!("/proc/{child}/root"));
    assert_eq!(
        fs::read(root.join("hello")).unwrap(),
        b"hello from the host",
        "the root of the serving process is not the share"
    );
    for p in ["etc/passwd", "proc/1", "tmp"] {
        assert!(
            fs::symlink_metadata(root.join(p)).is_err(),
            "{p} reachable from the serving process"
        );
    }
}

fn finish(child: Child, socket: &Path) {
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!socket.exists(), "socket left behind");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn namespace_sandbox_serves_the_share_from_namespaces_of_its_own() {
    let d = dirs();
    let parent = command("namespace", &d.share, &d.socket, &[])
        .spawn()
        .unwrap();
    let child = serving_child(&parent);
    // Wait until it serves (confined and capabilities dropped) before looking at it.
    let mut probe = FsFrontend::connect(&d.socket, 1).expect("connect");
    probe.client(0).unwrap().init().unwrap();
    for kind in ["mnt", "pid", "net"] {
        assert_ne!(
            ns(&child.to_string(), kind),
            ns("self", kind),
            "the serving process shares the {kind} namespace"
        );
    }
    // The parent stays in the host's mount namespace, to remove the socket, and keeps no
    // capability but dac_override for that.
    assert_eq!(ns(&parent.id().to_string(), "mnt"), ns("self", "mnt"));
    let parent_caps = if is_root() { 1 << 1 } else { 0 };
    assert_eq!(cap_eff(parent.id()), parent_caps);
    assert_eq!(cap_bnd(parent.id()), parent_caps);
    let status = fs::read_to_string(format!("/proc/{child}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.ends_with("\t1"),
        "not pid 1 of its namespace: {nspid}"
    );
    assert_root_is_the_share(child);
    assert_only_a_pid_procfs_is_reachable(child);
    let expected = if is_root() { ROOT_CAPS } else { 0 };
    assert_eq!(cap_eff(child), expected, "CapEff of the serving process");
    assert_eq!(
        cap_bnd(child) & !expected,
        0,
        "bounding set wider than kept set"
    );
    drop(probe);
    finish(parent, &d.socket);

    // A new daemon on the same paths: the frontend's work is done there.
    let parent = command("namespace", &d.share, &d.socket, &[])
        .spawn()
        .unwrap();
    exercise(&d.socket, &d.share);
    finish(parent, &d.socket);
}

#[test]
fn chroot_sandbox_serves_the_share_as_its_root() {
    if !is_root() {
        eprintln!("skipped: --sandbox=chroot needs root");
        return;
    }
    let d = dirs();
    let parent = command("chroot", &d.share, &d.socket, &[]).spawn().unwrap();
    let child = serving_child(&parent);
    let mut probe = FsFrontend::connect(&d.socket, 1).expect("connect");
    probe.client(0).unwrap().init().unwrap();
    assert_eq!(
        fs::read_link(format!("/proc/{child}/root")).unwrap(),
        fs::canonicalize(&d.share).unwrap()
    );
    assert_eq!(ns(&child.to_string(), "mnt"), ns("self", "mnt"));
    assert_root_is_the_share(child);
    assert_eq!(cap_eff(child), ROOT_CAPS);
    drop(probe);
    finish(parent, &d.socket);

    let parent = command("chroot", &d.share, &d.socket, &[]).spawn().unwrap();
    exercise(&d.socket, &d.share);
    finish(parent, &d.socket);
}

#[test]
fn modcaps_changes_the_capabilities_kept() {
    if !is_root() {
        eprintln!("skipped: the capabilities kept are those of a daemon run as root");
        return;
    }
    for sandbox in ["namespace", "chroot", "none"] {
        let d = dirs();
        let parent = command(
            sandbox,
            &d.share,
            &d.socket,
            &["--modcaps=+SYS_ADMIN:-mknod"],
        )
        .spawn()
        .unwrap();
        let pid = if sandbox == "none" {
            parent.id()
        } else {
            serving_child(&parent)
        };
        let mut fe = FsFrontend::connect(&d.socket, 1).expect("connect");
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let expected = (ROOT_CAPS | CAP_SYS_ADMIN) & !CAP_MKNOD;
        assert_eq!(cap_eff(pid), expected, "--sandbox={sandbox}");
        assert_eq!(cap_bnd(pid), expected, "--sandbox={sandbox}");
        // Without CAP_MKNOD the daemon cannot make a device node.
        assert_eq!(
            c.mknod(ROOT_ID, "dev", libc::S_IFCHR | 0o600, fuse_dev(1, 3), 0)
                .map(|_| ()),
            Err(libc::EPERM),
            "--sandbox={sandbox}"
        );
        fe.disconnect();
        finish(parent, &d.socket);
    }
}

#[test]
fn only_file_handles_keep_cap_dac_read_search() {
    if !is_root() {
        eprintln!("skipped: the capabilities kept are those of a daemon run as root");
        return;
    }
    for (flag, expected) in [
        (None, ROOT_CAPS),
        (Some("--inode-file-handles=never"), ROOT_CAPS),
        (
            Some("--inode-file-handles=prefer"),
            ROOT_CAPS | CAP_DAC_READ_SEARCH,
        ),
        (
            Some("--inode-file-handles=mandatory"),
            ROOT_CAPS | CAP_DAC_READ_SEARCH,
        ),
    ] {
        let d = dirs();
        let parent = command("namespace", &d.share, &d.socket, flag.as_slice())
            .spawn()
            .unwrap();
        let child = serving_child(&parent);
        let mut fe = FsFrontend::connect(&d.socket, 1).expect("connect");
        fe.client(0).unwrap().init().unwrap();
        assert_eq!(cap_eff(child), expected, "{flag:?}");
        assert_eq!(cap_bnd(child), expected, "{flag:?}");
        fe.disconnect();
        finish(parent, &d.socket);
    }
}

#[test]
fn a_relative_shared_dir_and_a_mount_point_as_shared_dir_are_served() {
    let d = dirs();
    // Relative to the daemon's working directory.
    let mut cmd = command("namespace", Path::new("share"), Path::new("vfs.sock"), &[]);
    cmd.current_dir(d.tmp.path());
    let parent = cmd.spawn().unwrap();
    exercise(&d.socket, &d.share);
    finish(parent, &d.socket);

    if !is_root() {
        return;
    }
    // The share a mount point of its own (a tmpfs), in this test's mount namespace.
    let mnt = d.tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let target = c(&mnt);
    // SAFETY: the strings are NUL-terminated and outlive the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: the path is NUL-terminated; detaching our own test mount.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _unmount = Unmount(target);
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(mnt.join("hello"), b"hello from the host").unwrap();
    std::os::unix::fs::symlink("/etc", mnt.join("to-etc")).unwrap();
    std::os::unix::fs::symlink("/", mnt.join("to-root")).unwrap();
    for sandbox in ["namespace", "chroot"] {
        let parent = command(sandbox, &mnt, &d.socket, &[]).spawn().unwrap();
        exercise(&d.socket, &mnt);
        finish(parent, &d.socket);
        for f in ["made", "made-link"] {
            fs::remove_file(mnt.join(f)).unwrap();
        }
        fs::set_permissions(mnt.join("hello"), fs::Permissions::from_mode(0o644)).unwrap();
    }
}

#[test]
fn sigterm_reaches_the_serving_process_and_the_socket_is_removed() {
    for sandbox in ["namespace", "chroot"] {
        if sandbox == "chroot" && !is_root() {
            continue;
        }
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            let d = dirs();
            let parent = command(sandbox, &d.share, &d.socket, &[]).spawn().unwrap();
            let child = serving_child(&parent);
            // Serving, signals handled.
            let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
            fe.client(0).unwrap().init().unwrap();
            // SAFETY: kill has no memory-safety preconditions; the pid is our own child.
            assert_eq!(unsafe { libc::kill(parent.id() as libc::pid_t, sig) }, 0);
            finish(parent, &d.socket);
            assert!(
                !Path::new(&format!("/proc/{child}")).exists()
                    || fs::read_to_string(format!("/proc/{child}/status"))
                        .is_ok_and(|s| s.contains("State:\tZ")),
                "the serving process outlived its parent"
            );
        }
    }
}

#[test]
fn an_unprivileged_daemon_creates_a_user_namespace_and_keeps_no_capability() {
    if !is_root() {
        // Already unprivileged: the namespace test above covers it.
        return;
    }
    const NOBODY: u32 = 65534;
    let d = dirs();
    std::os::unix::fs::chown(&d.share, Some(NOBODY), Some(NOBODY)).unwrap();
    std::os::unix::fs::lchown(d.share.join("hello"), Some(NOBODY), Some(NOBODY)).unwrap();
    let sock_dir = d.tmp.path().join("sock");
    fs::create_dir(&sock_dir).unwrap();
    std::os::unix::fs::chown(&sock_dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let socket = sock_dir.join("vfs.sock");
    let mut cmd = command("namespace", &d.share, &socket, &["--rlimit-nofile=0"]);
    // SAFETY: runs in the child between fork and exec; setgroups, setgid and setuid are
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let parent = cmd.spawn().unwrap();
    let child = serving_child(&parent);
    let mut probe = FsFrontend::connect(&socket, 1).expect("connect");
    probe.client(0).unwrap().init().unwrap();
    assert_ne!(ns(&child.to_string(), "user"), ns("self", "user"));
    assert_ne!(ns(&child.to_string(), "mnt"), ns("self", "mnt"));
    assert_eq!(cap_eff(child), 0);
    assert_eq!(cap_bnd(child), 0);
    let status = fs::read_to_string(format!("/proc/{child}/status")).unwrap();
    assert!(
        status.contains(&format!("Uid:\t{NOBODY}\t{NOBODY}")),
        "{status}"
    );
    assert_root_is_the_share(child);
    // The bind mount is nodev in a user namespace too, where the kernel refuses to change
    // the mount's locked flags.
    let m = mounts(child);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].1.contains(&"nodev".to_string()), "{m:?}");
    drop(probe);
    finish(parent, &socket);

    let parent = {
        let mut cmd = command("namespace", &d.share, &socket, &["--rlimit-nofile=0"]);
        // SAFETY: as above.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    };
    exercise(&socket, &d.share);
    finish(parent, &socket);
    // Files are created as the daemon's own host uid.
    let md = fs::metadata(d.share.join("made")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&md), NOBODY);
}

/// In the child between fork and exec: installs a seccomp filter that makes system call `nr`
/// fail with `errno` (when `arg3_low` is given, only when the low 32 bits of its fourth
/// argument are that value); everything else runs.
fn deny(nr: libc::c_long, arg3_low: Option<u32>, errno: i32) -> std::io::Result<()> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt: 0,
        jf,
        k,
    };
    let allow = stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW);
    let refuse = stmt(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ERRNO | errno as u32,
    );
    // seccomp_data: nr at offset 0, args[3] at 16 + 3 * 8 (low half first on little-endian).
    let load = |offset: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset);
    let filter: Vec<libc::sock_filter> = match arg3_low {
        None => vec![load(0), jeq(nr as u32, 1), refuse, allow],
        Some(v) => vec![
            load(0),
            jeq(nr as u32, 3),
            load(40),
            jeq(v, 1),
            refuse,
            allow,
        ],
    };
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut _,
    };
    // SAFETY: prctl with these arguments only sets this process's no_new_privs bit and installs
    // the filter `prog` describes, which outlives the call (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the child between fork and exec: makes `unshare(2)` fail with `EPERM`, as the seccomp
/// policy of many container runtimes does.
fn deny_unshare() -> std::io::Result<()> {
    deny(libc::SYS_unshare, None, libc::EPERM)
}

/// The flags of the sandbox's procfs mount (and of no other mount it makes).
const PROC_MOUNT_FLAGS: u32 =
    (libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RELATIME) as u32;

#[test]
fn where_namespaces_cannot_be_created_the_daemon_says_so_and_exits_1() {
    let d = dirs();
    let mut cmd = command("namespace", &d.share, &d.socket, &["--rlimit-nofile=0"]);
    // SAFETY: runs in the child between fork and exec; deny_unshare only calls prctl.
    unsafe { cmd.pre_exec(deny_unshare) };
    let (status, err) = wait_exit(cmd.spawn().unwrap());
    assert_eq!(status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("--sandbox=namespace"), "{err}");
    assert!(err.contains("--sandbox=chroot or --sandbox=none"), "{err}");
    assert!(!d.socket.exists(), "socket left behind");

    // chroot and none need no namespace.
    for sandbox in ["chroot", "none"] {
        if sandbox == "chroot" && !is_root() {
            continue;
        }
        let mut cmd = command(sandbox, &d.share, &d.socket, &["--rlimit-nofile=0"]);
        // SAFETY: as above.
        unsafe { cmd.pre_exec(deny_unshare) };
        let parent = cmd.spawn().unwrap();
        exercise(&d.socket, &d.share);
        finish(parent, &d.socket);
        for f in ["made", "made-link"] {
            fs::remove_file(d.share.join(f)).unwrap();
        }
        fs::set_permissions(d.share.join("hello"), fs::Permissions::from_mode(0o644)).unwrap();
    }
}

#[test]
fn where_a_fresh_procfs_cannot_be_mounted_the_daemon_says_so_and_exits_1() {
    // EPERM: a container that refuses new procfs mounts; EINVAL: a kernel older than 5.8,
    // which does not know subset=pid. Neither falls back to the host's /proc (nor to a procfs
    // with system-wide files).
    for (errno, says) in [
        (libc::EPERM, "Operation not permitted"),
        (libc::EINVAL, "Linux 5.8"),
    ] {
        let d = dirs();
        let mut cmd = command("namespace", &d.share, &d.socket, &["--rlimit-nofile=0"]);
        // SAFETY: runs in the child between fork and exec; deny only calls prctl.
        unsafe { cmd.pre_exec(move || deny(libc::SYS_mount, Some(PROC_MOUNT_FLAGS), errno)) };
        let (status, err) = wait_exit(cmd.spawn().unwrap());
        assert_eq!(status.code(), Some(1), "stderr: {err}");
        assert!(err.contains("cannot mount a procfs (subset=pid)"), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(err.contains("--sandbox=chroot or --sandbox=none"), "{err}");
        assert!(!err.contains("using the existing /proc"), "{err}");
        assert!(!d.socket.exists(), "socket left behind");
    }
}

/// Mounts a tmpfs on `at` (made a directory first); unmounted (detached) when dropped.
struct Tmpfs(std::ffi::CString);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        fs::create_dir(at).unwrap();
        let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the strings are NUL-terminated and outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                c"mode=0755".as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        Tmpfs(c)
    }

    /// Remounts it with `flags` (MS_REMOUNT added).
    fn remount(&self, flags: libc::c_ulong) {
        // SAFETY: the path is NUL-terminated and outlives the call.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                self.0.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | flags,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "remount: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // SAFETY: the path is NUL-terminated; detaching our own test mount.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}

fn mknod_null(at: &Path) {
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path; mknod creates a device node with /dev/null's numbers.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
}

#[test]
fn device_nodes_in_the_share_cannot_be_opened_in_the_sandbox() {
    if !is_root() {
        eprintln!("skipped: making device nodes needs root");
        return;
    }
    let d = dirs();
    mknod_null(&d.share.join("null"));
    // A submount of the share, read-only, nosuid and noexec: it is made nodev too, and keeps
    // its other flags.
    let sub = Tmpfs::mount(&d.share.join("sub"));
    mknod_null(&d.share.join("sub/null"));
    sub.remount(libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC);

    // On the host both open (unless the test's own file system is nodev).
    let host_opens = fs::File::open(d.share.join("null")).is_ok();
    assert!(fs::File::open(d.share.join("sub/null")).is_ok());

    let parent = command("namespace", &d.share, &d.socket, &[])
        .spawn()
        .unwrap();
    let child = serving_child(&parent);
    let mut fe = FsFrontend::connect(&d.socket, 1).expect("connect");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    // The guest still sees the device node (it opens it in the guest, not on the host).
    let e = c.lookup(ROOT_ID, "null").unwrap();
    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFCHR);

    let m = mounts(child);
    let opts = |point: &str| {
        m.iter()
            .find(|(p, _)| p == point)
            .unwrap_or_else(|| panic!("no mount at {point}: {m:?}"))
            .1
            .clone()
    };
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(opts("/").contains(&"nodev".into()), "{m:?}");
    let sub_opts = opts("/sub");
    for o in ["nodev", "ro", "nosuid", "noexec"] {
        assert!(sub_opts.contains(&o.into()), "{o} missing: {m:?}");
    }
    // Opening the nodes through the serving process's own mounts fails.
    for p in ["null", "sub/null"] {
        let err = fs::File::open(format!("/proc/{child}/root/{p}")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{p}");
    }
    if !host_opens {
        eprintln!("note: the test's file system is nodev itself");
    }
    fe.disconnect();
    finish(parent, &d.socket);
}

/// A bind mount of a directory onto itself, made a shared mount (mounts made under it later
/// propagate to its copies, as on a systemd host), detached when dropped.
struct SharedBind(std::ffi::CString);

impl SharedBind {
    fn make(at: &Path) -> SharedBind {
        let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the path is NUL-terminated and outlives both calls.
        let rc = unsafe {
            libc::mount(
                c.as_ptr(),
                c.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let bind = SharedBind(c);
        // SAFETY: as above.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                bind.0.as_ptr(),
                std::ptr::null(),
                libc::MS_SHARED,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "make shared: {}", std::io::Error::last_os_error());
        bind
    }
}

impl Drop for SharedBind {
    fn drop(&mut self) {
        // SAFETY: the path is NUL-terminated; detaching our own test mount.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn a_mount_the_host_adds_under_the_share_later_serves_no_device_either() {
    // The sandbox's mounts are slaves of the host's, so that a volume the host mounts under the
    // share after start (Kata hot-plugs them so) reaches the guest; such a mount arrives
    // without `nodev`. The daemon never opens a device node, FIFO or socket on the host,
    // whatever mount it is on: it is served to the guest (which opens it in its own kernel)
    // and refused to any open or truncate.
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let d = dirs();
    let _share = SharedBind::make(&d.share);
    let parent = command("namespace", &d.share, &d.socket, &[])
        .spawn()
        .unwrap();
    let child = serving_child(&parent);
    let mut fe = FsFrontend::connect(&d.socket, 1).expect("connect");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();

    let late = Tmpfs::mount(&d.share.join("late"));
    mknod_null(&d.share.join("late/null"));
    fs::write(d.share.join("late/file"), b"late data").unwrap();
    let m = mounts(child);
    let opts = m
        .iter()
        .find(|(p, _)| p == "/late")
        .unwrap_or_else(|| panic!("the late mount did not reach the sandbox: {m:?}"))
        .1
        .clone();
    assert!(
        !opts.contains(&"nodev".into()),
        "the kernel made it nodev: the test shows nothing ({m:?})"
    );

    let dir = c.lookup(ROOT_ID, "late").unwrap();
    let f = c.lookup(dir.nodeid, "file").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    assert_eq!(c.read(f.nodeid, fh, 0, 100).unwrap(), b"late data");
    let null = c.lookup(dir.nodeid, "null").unwrap();
    assert_eq!(null.attr.mode & libc::S_IFMT, libc::S_IFCHR);
    for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
        assert_eq!(
            c.open(null.nodeid, flags as u32).unwrap_err(),
            libc::ENXIO,
            "open {flags}"
        );
    }
    let mut sa = setattr_in(fattr::SIZE);
    sa.size = 0;
    assert_eq!(c.setattr(null.nodeid, &sa).unwrap_err(), libc::EINVAL);
    fe.disconnect();
    finish(parent, &d.socket);
    drop(late);
}

/// A directory tree for a daemon run as an unprivileged uid: a base every uid may search, a
/// socket directory every uid may write, and the share, root's, with `share_mode`.
fn unprivileged_dirs(share_mode: u32) -> (TempDir, PathBuf, PathBuf) {
    let base = tempfile::tempdir().unwrap();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let share = base.path().join("share");
    let sock = base.path().join("sock");
    fs::create_dir(&share).unwrap();
    fs::create_dir(&sock).unwrap();
    fs::set_permissions(&share, fs::Permissions::from_mode(share_mode)).unwrap();
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o777)).unwrap();
    (base, share, sock.join("vfs.sock"))
}

/// The daemon started as the unprivileged uid `PLAIN`.
fn start_as_plain(share: &Path, socket: &Path, extra: &[&str]) -> Child {
    Command::new(BIN)
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .args(extra)
        .uid(PLAIN)
        .gid(PLAIN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd")
}

/// An unprivileged uid the two tests below run the daemon as.
const PLAIN: u32 = 4243;

/// A share the daemon may not list is refused at start, whatever `--sandbox` says: no sandbox
/// mode can make it readable (the hint once sent users to `--sandbox=none`, which then served
/// a directory whose every request failed).
#[test]
fn a_share_the_daemon_cannot_read_is_refused_with_every_sandbox_mode() {
    if !is_root() {
        eprintln!("skipped: needs root to run the daemon as another uid");
        return;
    }
    let (_base, share, socket) = unprivileged_dirs(0o700);
    for mode in ["none", "namespace"] {
        let child = start_as_plain(&share, &socket, &[&format!("--sandbox={mode}")]);
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(1), "--sandbox={mode}: {err}");
        assert!(
            err.contains(&format!("(uid {PLAIN}) may not read and search it"))
                && !err.contains("--sandbox=none"),
            "--sandbox={mode}: {err}"
        );
        assert!(!socket.exists(), "--sandbox={mode}: the socket was left");
    }
}

/// A daemon that is not root, started on a share it may read but not write (root's, as a
/// fresh /srv/share is), warns that the guest's changes will fail, then serves; not with
/// `--readonly`.
#[test]
fn a_daemon_without_root_warns_that_it_cannot_write_the_share() {
    if !is_root() {
        eprintln!("skipped: needs root to run the daemon as another uid");
        return;
    }
    let (_base, share, socket) = unprivileged_dirs(0o755);
    for (extra, warns) in [(None, true), (Some("--readonly"), false)] {
        let mut args = vec!["--sandbox=none"];
        args.extend(extra);
        let child = start_as_plain(&share, &socket, &args);
        let mut front = FsFrontend::connect(&socket, 1).expect("connect");
        front.client(0).unwrap().init().unwrap();
        front.disconnect();
        let (status, err) = wait_exit(child);
        assert!(status.success(), "{args:?}: {status}: {err}");
        assert_eq!(
            err.contains("may not write it"),
            warns,
            "{args:?}: the warning: {err}"
        );
    }
}

/// The capabilities `CapabilityBoundingSet=` of packaging/virtiofsd@.service leaves, in
/// setpriv's spelling (`-all,+chown,+dac_override,...`), without `leave_out`.
fn unit_bounding_set(leave_out: Option<&str>) -> String {
    let unit = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/virtiofsd@.service"
    ))
    .unwrap();
    let mut set = String::from("-all");
    for line in unit.lines() {
        let Some(caps) = line.strip_prefix("CapabilityBoundingSet=") else {
            continue;
        };
        for cap in caps.split_whitespace() {
            let name = cap.strip_prefix("CAP_").unwrap().to_ascii_lowercase();
            if Some(name.as_str()) != leave_out {
                set.push_str(&format!(",+{name}"));
            }
        }
    }
    assert!(
        set.contains("+mknod"),
        "no CapabilityBoundingSet= read: {set}"
    );
    set
}

/// The daemon as packaging/virtiofsd@.service starts it, with the unit's capability bounding
/// set and no new privileges (setpriv applies both, as systemd does; no systemd runs here):
/// with its defaults (namespace sandbox, seccomp) and file handles, it serves a guest whose
/// root makes a device node and whose uid 1000 makes a file of its own. Without
/// CAP_SYS_ADMIN in the set it cannot make its sandbox: the set is what limits it.
#[test]
fn the_units_capability_bounding_set_lets_the_daemon_serve() {
    if !is_root() || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: needs root and setpriv (util-linux)");
        return;
    }
    let start = |d: &Dirs, caps: &str| {
        Command::new("setpriv")
            .args(["--nnp", "--bounding-set", caps, "--", BIN])
            .arg(format!("--shared-dir={}", d.share.display()))
            .arg(format!("--socket-path={}", d.socket.display()))
            .args(["--log-level=error", "--inode-file-handles=prefer"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start setpriv")
    };
    let d = dirs();
    // Guest uid 1000 may create there.
    fs::set_permissions(&d.share, fs::Permissions::from_mode(0o777)).unwrap();
    let child = start(&d, &unit_bounding_set(None));
    let mut front = FsFrontend::connect(&d.socket, 1).expect("connect");
    let mut c = front.client(0).unwrap();
    c.init().unwrap();
    c.mknod(ROOT_ID, "null", libc::S_IFCHR | 0o666, 0x103, 0)
        .expect("mknod of a device node");
    c.with_ctx(1000, 1000, 1, |c| {
        c.create(ROOT_ID, "mine", libc::O_RDWR as u32, 0o644, 0)
    })
    .expect("create as uid 1000");
    drop(c);
    front.disconnect();
    let (status, err) = wait_exit(child);
    assert!(status.success(), "{status}: {err}");
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(fs::symlink_metadata(d.share.join("null"))
        .unwrap()
        .file_type()
        .is_char_device());
    assert_eq!(
        fs::symlink_metadata(d.share.join("mine")).unwrap().uid(),
        1000
    );

    let d = dirs();
    let (status, err) = wait_exit(start(&d, &unit_bounding_set(Some("sys_admin"))));
    assert_eq!(status.code(), Some(1), "without CAP_SYS_ADMIN: {err}");
}
