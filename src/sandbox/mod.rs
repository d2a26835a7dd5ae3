//! Confining the daemon (`--sandbox`) and dropping its capabilities (`--modcaps`).
//!
//! - `namespace` (the default): the daemon enters new pid, mount and network namespaces (and
//!   first a user namespace mapping its own uid and gid when it does not run as root), and the
//!   shared directory becomes the root of its mount namespace (`pivot_root`), bind-mounted
//!   `nodev` (with its submounts), the host's other mounts detached. Nothing outside the shared
//!   directory can be named any more, no device node in it can be opened, and the daemon sees
//!   no other process and no network. The only procfs it keeps (for `/proc/self/fd`) is one of
//!   its own pid namespace mounted with `subset=pid`: no `/proc/sys`, no `/proc/sysrq-trigger`.
//!   When that procfs cannot be mounted, the daemon does not start.
//! - `chroot`: the shared directory becomes the daemon's root directory (`chroot`); for hosts
//!   where namespaces cannot be created. Needs root.
//! - `none`: no confinement.
//!
//! With `namespace` and `chroot` the process forks once the listening socket exists: the child
//! confines itself and serves; the parent stays outside, forwards SIGTERM, SIGINT and SIGHUP to
//! the child, removes the socket file the daemon created once the child has exited (the child
//! can no longer name it), and exits with the child's status. A new pid namespace only applies
//! to the children of the process that creates it, which is another reason for the fork.
//!
//! Whatever the sandbox, the serving process then keeps only the capabilities it uses (see
//! [`caps`]), before any thread starts; once set up, and before the frontend is accepted, it
//! installs the seccomp filter of `--seccomp` ([`seccomp`]) on every thread.

pub mod caps;
mod namespace;
pub mod seccomp;

use std::fmt;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// What `--sandbox` asks for (the names are the flag's values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxMode {
    #[default]
    Namespace,
    Chroot,
    None,
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxMode::Namespace => "namespace",
            SandboxMode::Chroot => "chroot",
            SandboxMode::None => "none",
        })
    }
}

/// Where the serving process stands once [`enter`] returns.
#[derive(Debug)]
pub struct Confined {
    /// The shared directory as the serving process names it now (`/` when confined).
    pub root_dir: PathBuf,
    /// `/proc/self/fd` of the serving process, opened before the confinement hid `/proc`.
    pub proc_self_fd: Option<OwnedFd>,
    /// Whether a parent process outside the sandbox supervises this one (and removes the
    /// socket file).
    pub supervised: bool,
}

/// Why the sandbox could not be set up.
#[derive(Debug)]
pub struct SandboxError(pub String);

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SandboxError {}

/// The signals the supervising parent forwards to the child.
const FORWARDED: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

fn sigmask(how: libc::c_int, set: &libc::sigset_t) -> io::Result<libc::sigset_t> {
    // SAFETY: `old` is a local out value; pthread_sigmask reads `set` and writes `old`.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        match libc::pthread_sigmask(how, set, &mut old) {
            0 => Ok(old),
            rc => Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

/// Number of threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Sets up the sandbox `mode` around `shared_dir`.
///
/// With `none` nothing happens. Otherwise the process forks: only the child returns, confined;
/// the parent supervises it and ends the process with its status, after closing its copy of
/// the listening socket `listen_fd` and removing `socket_file` (the socket the daemon created,
/// if any). The process must be single-threaded.
pub fn enter(
    mode: SandboxMode,
    shared_dir: &Path,
    socket_file: Option<&Path>,
    listen_fd: RawFd,
) -> Result<Confined, SandboxError> {
    if mode == SandboxMode::None {
        return Ok(Confined {
            root_dir: shared_dir.to_path_buf(),
            proc_self_fd: None,
            supervised: false,
        });
    }
    let fail =
        |what: &str, e: &dyn fmt::Display| SandboxError(format!("--sandbox={mode}: {what}: {e}"));
    let threads = thread_count();
    if threads != 1 {
        return Err(fail(
            "cannot set up the sandbox",
            &format!("the process runs {threads} threads; this must be done before any starts"),
        ));
    }
    let shared_dir = std::fs::canonicalize(shared_dir)
        .map_err(|e| fail(&format!("cannot resolve {}", shared_dir.display()), &e))?;
    if mode == SandboxMode::Namespace {
        create_namespaces().map_err(|e| {
            SandboxError(format!(
                "--sandbox=namespace: {e}; namespaces may be unavailable here (e.g. inside a \
                 container): use --sandbox=chroot or --sandbox=none"
            ))
        })?;
    }

    let forwarded = sigset(&[FORWARDED[0], FORWARDED[1], FORWARDED[2], libc::SIGCHLD]);
    let old_mask = sigmask(libc::SIG_BLOCK, &forwarded)
        .map_err(|e| fail("cannot block the forwarded signals", &e))?;
    // SAFETY: the process is single-threaded (checked above), so the child is a complete copy
    // with no lock held by a vanished thread.
    let child = unsafe { libc::fork() };
    if child < 0 {
        let e = io::Error::last_os_error();
        let _ = sigmask(libc::SIG_SETMASK, &old_mask);
        return Err(fail("cannot fork", &e));
    }
    if child > 0 {
        // SAFETY: the parent never serves: its copy of the listening socket is closed so that
        // only the child accepts; the process exits in `supervise` without dropping the
        // listener again.
        unsafe { libc::close(listen_fd) };
        supervise(child, &forwarded, socket_file);
    }

    // The child keeps the stop signals blocked until its signal thread waits for them, so that
    // a signal forwarded right away is not lost (as the first process of a pid namespace, it
    // would ignore it otherwise); SIGCHLD is as before.
    let mut mask = old_mask;
    for s in FORWARDED {
        // SAFETY: `mask` is an initialised signal set.
        unsafe { libc::sigaddset(&mut mask, s) };
    }
    sigmask(libc::SIG_SETMASK, &mask).map_err(|e| fail("cannot set the signal mask", &e))?;
    // SAFETY: prctl with these arguments only sets this process's parent-death signal: should
    // the supervising parent die, the child is told to stop.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGTERM as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let proc_self_fd = match mode {
        SandboxMode::Namespace => namespace::unshare(
            libc::CLONE_NEWNS | libc::CLONE_NEWNET,
            "cannot create mount and network namespaces",
        )
        .and_then(|()| namespace::pivot_into(&shared_dir)),
        _ => namespace::chroot_into(&shared_dir),
    }
    .map_err(|e| {
        let hint = match mode {
            SandboxMode::Namespace => {
                "; use --sandbox=chroot or --sandbox=none where namespaces cannot be used"
            }
            _ => "; --sandbox=chroot needs root (CAP_SYS_CHROOT); use --sandbox=none otherwise",
        };
        SandboxError(format!("--sandbox={mode}: {e}{hint}"))
    })?;
    log::info!("sandbox: {mode}, {} is the root now", shared_dir.display());
    Ok(Confined {
        root_dir: PathBuf::from("/"),
        proc_self_fd: Some(proc_self_fd),
        supervised: true,
    })
}

/// In the parent, before the fork: a user namespace when not root (root, including root of a
/// `--uid-map` user namespace, needs none), then a new pid namespace for the child. The mount
/// and network namespaces are the child's own, so that the parent can still remove the socket.
fn create_namespaces() -> io::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        namespace::enter_identity_user_namespace()?;
    }
    namespace::unshare(libc::CLONE_NEWPID, "cannot create a pid namespace")
}

/// The supervising parent: forwards the stop signals to `child`, waits for it, removes the
/// socket file and exits with the child's status (128 + the signal when it was killed).
fn supervise(child: libc::pid_t, set: &libc::sigset_t, socket_file: Option<&Path>) -> ! {
    // The parent needs no privilege but to remove the socket where it created it.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let keep = if unsafe { libc::geteuid() } == 0 {
        caps::CapSet::of(&[caps::CAP_DAC_OVERRIDE])
    } else {
        caps::CapSet::default()
    };
    if let Err(e) = caps::drop_all_but(keep, caps::last_cap()) {
        log::warn!("supervisor: cannot drop capabilities: {e}");
    }
    let status = loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is an initialised signal set blocked in this (only) thread; `sig` is a
        // valid out pointer.
        if unsafe { libc::sigwait(set, &mut sig) } != 0 {
            continue;
        }
        if sig != libc::SIGCHLD {
            // SAFETY: kill has no memory-safety preconditions; `child` is ours, not reaped.
            unsafe { libc::kill(child, sig) };
            continue;
        }
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer; `child` is our own child.
        match unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } {
            0 => continue,
            pid if pid == child => break status,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("supervisor: cannot wait for the daemon: {e}");
                break 1 << 8;
            }
        }
    };
    if let Some(p) = socket_file {
        if let Err(e) = std::fs::remove_file(p) {
            if e.kind() != io::ErrorKind::NotFound {
                log::warn!("cannot remove the socket {}: {e}", p.display());
            }
        }
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        log::error!("the daemon was killed by signal {}", libc::WTERMSIG(status));
        128 + libc::WTERMSIG(status)
    } else {
        1
    };
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_as_spelled() {
        use clap::ValueEnum;
        for s in ["namespace", "chroot", "none"] {
            assert_eq!(SandboxMode::from_str(s, false).unwrap().to_string(), s);
        }
        assert!(SandboxMode::from_str("jail", false).is_err());
        assert_eq!(SandboxMode::default(), SandboxMode::Namespace);
    }
}
