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
pub mod groups;
mod namespace;
pub mod process;
pub mod seccomp;
pub mod userns;

use std::fmt;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

pub use namespace::Error as StepError;
pub use process::ForkError;

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

/// Why the sandbox could not be set up. Each message starts with the `--sandbox` value; the
/// failed step, when there is one, is the source.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("--sandbox={mode}: cannot set up the sandbox")]
    NotAlone {
        mode: SandboxMode,
        #[source]
        source: ForkError,
    },
    #[error("--sandbox={mode}: cannot resolve {}", .path.display())]
    Resolve {
        mode: SandboxMode,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "--sandbox=namespace (namespaces may be unavailable here, e.g. inside a container: use \
         --sandbox=chroot or --sandbox=none)"
    )]
    Namespaces(#[source] StepError),
    #[error("--sandbox={mode}: cannot block the forwarded signals")]
    BlockSignals {
        mode: SandboxMode,
        #[source]
        source: Errno,
    },
    #[error("--sandbox={mode}: cannot fork")]
    Fork {
        mode: SandboxMode,
        #[source]
        source: ForkError,
    },
    #[error("--sandbox={mode}: cannot set the signal mask")]
    SignalMask {
        mode: SandboxMode,
        #[source]
        source: Errno,
    },
    #[error(
        "--sandbox=namespace (use --sandbox=chroot or --sandbox=none where namespaces cannot be \
         used)"
    )]
    Pivot(#[source] StepError),
    #[error("--sandbox=chroot (it needs root, CAP_SYS_CHROOT; use --sandbox=none otherwise)")]
    Chroot(#[source] StepError),
}

/// The signals the supervising parent forwards to the child.
const FORWARDED: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// Sets up the sandbox `mode` around `shared_dir`.
///
/// With `none` nothing happens. Otherwise the process forks: only the child returns, confined;
/// the parent supervises it and ends the process with its status, after closing its copy of
/// the listening socket `listen_fd` and removing `socket_file` (the socket the daemon created,
/// if any). The process must be single-threaded.
pub fn enter(
    mode: SandboxMode,
    shared_dir: &Path,
    socket_file: Option<(&Path, Option<crate::socket_lock::SocketId>)>,
    listen_fd: RawFd,
) -> Result<Confined, SandboxError> {
    if mode == SandboxMode::None {
        return Ok(Confined {
            root_dir: shared_dir.to_path_buf(),
            proc_self_fd: None,
            supervised: false,
        });
    }
    process::check_single_threaded().map_err(|source| SandboxError::NotAlone { mode, source })?;
    let shared_dir = std::fs::canonicalize(shared_dir).map_err(|source| SandboxError::Resolve {
        mode,
        path: shared_dir.to_path_buf(),
        source,
    })?;
    if mode == SandboxMode::Namespace {
        create_namespaces().map_err(SandboxError::Namespaces)?;
    }

    let mut forwarded: SigSet = FORWARDED.into_iter().collect();
    forwarded.add(Signal::SIGCHLD);
    let old_mask = forwarded
        .thread_swap_mask(SigmaskHow::SIG_BLOCK)
        .map_err(|source| SandboxError::BlockSignals { mode, source })?;
    // The supervisor's pid, which the child (in a new pid namespace) cannot ask for.
    let supervisor = std::process::id();
    let child = match process::fork_single_threaded() {
        Ok(child) => child,
        Err(source) => {
            let _ = old_mask.thread_set_mask();
            return Err(SandboxError::Fork { mode, source });
        }
    };
    if let ForkResult::Parent { child } = child {
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
        mask.add(s);
    }
    mask.thread_set_mask()
        .map_err(|source| SandboxError::SignalMask { mode, source })?;
    // Should the supervising parent die, the child is told to stop.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    // In a new pid namespace getpid() says 1: syslog lines carry the pid the host knows this
    // process by, read while the host's /proc is still mounted.
    let host_pid = crate::logging::pid_seen_by_proc();
    crate::logging::set_pid(host_pid);
    let proc_self_fd = match mode {
        SandboxMode::Namespace => namespace::unshare(
            CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWNET,
            "mount and network namespaces",
        )
        .and_then(|()| namespace::pivot_into(&shared_dir))
        .map_err(SandboxError::Pivot),
        _ => namespace::chroot_into(&shared_dir).map_err(SandboxError::Chroot),
    }?;
    log::info!(
        "sandbox: {mode}, {} is the root now; serving as pid {host_pid} (host), supervised by \
         pid {}",
        shared_dir.display(),
        supervisor
    );
    Ok(Confined {
        root_dir: PathBuf::from("/"),
        proc_self_fd: Some(proc_self_fd),
        supervised: true,
    })
}

/// In the parent, before the fork: a user namespace when not root (root, including root of a
/// `--uid-map` user namespace, needs none), then a new pid namespace for the child. The mount
/// and network namespaces are the child's own, so that the parent can still remove the socket.
fn create_namespaces() -> Result<(), StepError> {
    if !nix::unistd::geteuid().is_root() {
        namespace::enter_identity_user_namespace()?;
    }
    namespace::unshare(CloneFlags::CLONE_NEWPID, "a pid namespace")
}

/// The supervising parent: forwards the stop signals to `child`, waits for it, removes the
/// socket file and exits with the child's status (128 + the signal when it was killed).
fn supervise(
    child: Pid,
    set: &SigSet,
    socket_file: Option<(&Path, Option<crate::socket_lock::SocketId>)>,
) -> ! {
    // The parent needs no privilege but to remove the socket where it created it.
    let keep = if nix::unistd::geteuid().is_root() {
        caps::CapSet::of(&[caps::CAP_DAC_OVERRIDE])
    } else {
        caps::CapSet::default()
    };
    if let Err(e) = caps::drop_all_but(keep, caps::last_cap()) {
        log::warn!("supervisor: cannot drop capabilities: {e}");
    }
    let status = loop {
        // `set` is blocked in this (only) thread.
        let Ok(sig) = set.wait() else {
            continue;
        };
        if sig != Signal::SIGCHLD {
            // `child` is ours and not reaped yet.
            let _ = nix::sys::signal::kill(child, sig);
            continue;
        }
        match process::wait_for(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => continue,
            Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => break status,
            Ok(_) => continue,
            Err(e) => {
                log::error!("supervisor: cannot wait for the daemon: {e}");
                break WaitStatus::Exited(child, 1);
            }
        }
    };
    if let Some((p, made)) = socket_file {
        // The socket made, if still there, then its lock file.
        crate::socket_lock::remove_socket(p, made);
    }
    if let WaitStatus::Signaled(_, sig, _) = status {
        log::error!("the daemon was killed by signal {}", sig as i32);
    }
    std::process::exit(process::exit_code(status))
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
