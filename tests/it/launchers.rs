//! The command lines launchers use, run as they write them (`doc/launchers.md` is the table):
//! each starts the real binary with a launcher's arguments (the share, the socket and the
//! descriptor number substituted), serves one session through the test frontend, and expects
//! exit status 0 once the frontend hangs up. A launcher that passes a listening socket
//! (`--fd=N`) gets one at exactly that descriptor number, as it would. The tests of the launchers
//! added with podman machine and RunCVM run the same launch against the reference `virtiofsd`
//! 1.14 too when it is installed.

use crate::common;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::wait_exit;
use virtiofsd::fuse::abi::ROOT_ID;
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

/// What a launcher sets besides the arguments.
#[derive(Default)]
struct Setting<'a> {
    /// Start the daemon in the shared directory (for a `--shared-dir .`).
    cwd_in_share: bool,
    /// Environment variables set (the others, `RUST_LOG` included, are as the test's).
    env: &'a [(&'a str, &'a str)],
}

/// The reference `virtiofsd` to compare with, when it is installed (`REF_VIRTIOFSD`, else
/// `/opt/ref-virtiofsd/bin/virtiofsd` as `tests/bench/reference.sh` installs it).
fn reference() -> Option<String> {
    let r = std::env::var("REF_VIRTIOFSD")
        .unwrap_or_else(|_| "/opt/ref-virtiofsd/bin/virtiofsd".to_owned());
    std::path::Path::new(&r).exists().then_some(r)
}

/// Runs `args` (with `{dir}`, `{sock}` and `{fd}` substituted) as a launcher would: with a
/// listening socket at descriptor `fd` when given, else expecting the daemon to create
/// `{sock}`. Serves one session and checks the exit status.
fn launch(what: &str, args: &[&str], fd: Option<i32>) {
    launch_binary(BIN, what, args, fd, &Setting::default());
}

/// [`launch`] with a launcher's other settings; when the reference is installed, runs the same
/// launch against it too, so that the row's "as the reference" holds.
fn launch_alike(what: &str, args: &[&str], fd: Option<i32>, setting: &Setting) {
    launch_binary(BIN, what, args, fd, setting);
    match reference() {
        Some(r) => launch_binary(&r, &format!("{what}, the reference"), args, fd, setting),
        None => eprintln!("{what}: no reference virtiofsd installed to compare with"),
    }
}

fn launch_binary(bin: &str, what: &str, args: &[&str], fd: Option<i32>, setting: &Setting) {
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    fs::write(share.join("hello"), b"launched").unwrap();
    let socket = tmp.path().join("vfs.sock");
    let n = fd.unwrap_or(-1).to_string();
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("{dir}", &share.display().to_string())
                .replace("{sock}", &socket.display().to_string())
                .replace("{fd}", &n)
        })
        .collect();
    let mut cmd = Command::new(bin);
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .envs(setting.env.iter().copied());
    if setting.cwd_in_share {
        cmd.current_dir(&share);
    }
    let listener = fd.map(|target| {
        let l = UnixListener::bind(&socket).unwrap();
        let raw = l.as_raw_fd();
        // SAFETY: runs in the child between fork and exec; dup2 and fcntl are
        // async-signal-safe. Puts the listening socket at descriptor `target`, kept across exec.
        unsafe {
            cmd.pre_exec(move || {
                if raw == target {
                    if libc::fcntl(target, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(raw, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        l
    });
    let mut child = cmd.spawn().unwrap();
    drop(listener);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if child.try_wait().unwrap().is_some() {
            let (status, err) = wait_exit(child);
            panic!("{what} {args:?}: exited before listening ({status}): {err}");
        }
        assert!(Instant::now() < deadline, "{what}: never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut fe = FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let e = c.lookup(ROOT_ID, "hello").unwrap();
    assert_eq!(e.attr.size, 8, "{what}");
    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(
        status.code(),
        Some(0),
        "{what} {args:?}: {status}, stderr: {err}"
    );
    assert!(!err.contains("ERROR"), "{what}: {err}");
}

#[test]
fn libvirt_old_o_style() {
    // libvirt before "separate-options": the descriptor and one -o list.
    launch(
        "libvirt (-o)",
        &[
            "--fd={fd}",
            "-o",
            "source={dir},cache=always,xattr,no_posix_lock,no_flock",
            "--thread-pool-size=4",
        ],
        Some(27),
    );
}

#[test]
fn libvirt_separate_options() {
    // libvirt once the descriptor lists "separate-options".
    launch(
        "libvirt (separate options)",
        &[
            "--fd={fd}",
            "--shared-dir",
            "{dir}",
            "--xattr",
            "--cache",
            "always",
            "--thread-pool-size=4",
            "--sandbox",
            "chroot",
        ],
        Some(31),
    );
}

#[test]
fn kata_old_command_line() {
    // Kata Containers with the C daemon's spellings.
    launch(
        "Kata (old)",
        &[
            "--syslog",
            "-o",
            "cache=auto",
            "-o",
            "no_posix_lock",
            "-o",
            "source={dir}",
            "--fd=3",
            "-f",
            "--thread-pool-size=1",
            "-o",
            "announce_submounts",
        ],
        Some(3),
    );
}

#[test]
fn kata_new_command_line() {
    // Kata Containers 3 with the Rust daemon's spellings.
    launch(
        "Kata (new)",
        &[
            "--syslog",
            "--cache=auto",
            "--shared-dir={dir}",
            "--fd=3",
            "--thread-pool-size=1",
            "--announce-submounts",
            "--inode-file-handles=prefer",
        ],
        Some(3),
    );
}

#[test]
fn kubevirt_command_line() {
    launch(
        "KubeVirt",
        &[
            "--socket-path={sock}",
            "--shared-dir={dir}",
            "--cache=auto",
            "--sandbox=none",
            "--migration-mode=find-paths",
            "--migration-on-error=guest-error",
        ],
        None,
    );
}

#[test]
fn incus_command_line() {
    // Incus (plain VM share): the socket comes at descriptor 3.
    launch(
        "Incus",
        &["--fd=3", "--cache=never", "--shared-dir={dir}"],
        Some(3),
    );
}

#[test]
fn incus_idmapped_command_line() {
    // Incus (idmapped VM share): its rules include empty forbid-guest ranges (count 0), which
    // the reference accepts and which name no id.
    launch(
        "Incus (idmapped)",
        &[
            "--fd=3",
            "--cache=never",
            "--shared-dir={dir}",
            "--translate-uid=map:0:1000000:1000000000",
            "--translate-uid=forbid-guest:0:0",
            "--translate-gid=map:0:1000000:1000000000",
            "--translate-gid=forbid-guest:0:0",
            "--translate-uid=forbid-guest:1000000000:3294967295",
            "--translate-gid=forbid-guest:1000000000:3294967295",
        ],
        Some(3),
    );
}

#[test]
fn podman_machine_command_line() {
    // podman machine (QEMU, Linux): `--shared-dir .` with the working directory set to the
    // share, RUST_LOG=ERROR to quiet the daemon, run as the user who runs podman.
    launch_alike(
        "podman machine",
        &[
            "--sandbox",
            "none",
            "--socket-path",
            "{sock}",
            "--shared-dir",
            ".",
            "--seccomp=none",
        ],
        None,
        &Setting {
            cwd_in_share: true,
            env: &[("RUST_LOG", "ERROR")],
        },
    );
}

#[test]
fn runcvm_command_line() {
    // RunCVM: the C daemon's -o spellings, as root inside the container.
    launch_alike(
        "RunCVM",
        &[
            "-o",
            "cache=auto",
            "-o",
            "announce_submounts",
            "-o",
            "xattr",
            "--socket-path={sock}",
            "-o",
            "source={dir}",
            "-o",
            "sandbox=chroot",
        ],
        None,
        &Setting::default(),
    );
}

#[test]
fn runcvm_sys_admin_cache_none_command_line() {
    // RunCVM with RUNCVM_SYS_ADMIN=1 and RUNCVM_VIRTIOFSD_CACHE=none.
    launch_alike(
        "RunCVM (sys_admin, cache none)",
        &[
            "-o",
            "modcaps=+sys_admin",
            "-o",
            "cache=none",
            "-o",
            "announce_submounts",
            "-o",
            "xattr",
            "--socket-path={sock}",
            "-o",
            "source={dir}",
            "-o",
            "sandbox=chroot",
        ],
        None,
        &Setting::default(),
    );
}
