//! Starting and stopping the daemon: the listening socket, the vhost-user session, signals.
//!
//! One daemon serves one frontend connection: it listens on `--socket-path` (or takes the
//! listening socket passed with `--fd`), accepts QEMU, serves until QEMU disconnects, and exits.
//! SIGTERM and SIGINT stop it at any point; the socket file it created is removed either way.

use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;

use log::info;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::idmap::{MappedFs, Translation};
use crate::passthrough::{self, PassthroughFs};
use crate::userns::{self, IdMapRange};
use crate::vhost_user::FsBackend;

/// Where the vhost-user socket comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketSpec {
    /// Create a listening socket at this path (`--socket-path`).
    Path(PathBuf),
    /// Use this already-listening socket (`--fd`).
    Fd(RawFd),
}

/// Everything the daemon needs to run.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub fs: passthrough::Config,
    pub socket: SocketSpec,
    pub tag: Option<String>,
    pub thread_pool_size: usize,
    /// uid/gid translation between guest and host (`--translate-uid`, `--translate-gid`);
    /// empty translates nothing.
    pub translate: Translation,
    /// User-namespace maps (`--uid-map`, `--gid-map`); the daemon enters a user namespace
    /// when either is given.
    pub uid_map: Vec<IdMapRange>,
    pub gid_map: Vec<IdMapRange>,
}

/// Why the daemon stopped with an error.
#[derive(Debug)]
pub enum DaemonError {
    /// The shared directory could not be opened.
    SharedDir(PathBuf, io::Error),
    /// The vhost-user socket could not be created or accepted on.
    Socket(String),
    /// The device could not be set up.
    Device(String),
    /// The vhost-user session ended with an error.
    Session(String),
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::SharedDir(p, e) => {
                write!(f, "cannot open shared directory {}: {e}", p.display())
            }
            DaemonError::Socket(m) => write!(f, "vhost-user socket: {m}"),
            DaemonError::Device(m) => write!(f, "device setup: {m}"),
            DaemonError::Session(m) => write!(f, "vhost-user session: {m}"),
        }
    }
}

impl std::error::Error for DaemonError {}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it starts), then
/// starts a thread that waits for them, removes `socket_path` and exits with status 0.
fn handle_stop_signals(socket_path: Option<PathBuf>) -> io::Result<()> {
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before use; the calls only
    // read and write it and the thread's signal mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is a valid, initialised signal set and `sig` a valid out pointer.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc == 0 {
                info!("signal {sig} received, exiting");
            }
            if let Some(p) = &socket_path {
                let _ = std::fs::remove_file(p);
            }
            std::process::exit(0);
        })?;
    Ok(())
}

fn listener(spec: &SocketSpec) -> Result<Listener, DaemonError> {
    match spec {
        SocketSpec::Path(p) => Listener::new(p, true)
            .map_err(|e| DaemonError::Socket(format!("cannot listen on {}: {e}", p.display()))),
        SocketSpec::Fd(fd) => {
            // SAFETY: fstat only writes the local `st`; an invalid fd makes it fail with EBADF.
            let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
            // SAFETY: see above.
            let rc = unsafe { libc::fstat64(*fd, &mut st) };
            if rc != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
                return Err(DaemonError::Socket(format!(
                    "--fd {fd} is not an open socket"
                )));
            }
            // SAFETY: the user handed this listening socket to the daemon with `--fd`; nothing
            // else in the process owns it, and it was just checked to be a socket.
            Ok(unsafe { Listener::from_raw_fd(*fd) })
        }
    }
}

/// Runs the daemon process: clears the umask, stops cleanly on SIGTERM/SIGINT, and serves one
/// frontend connection with [`serve`].
pub fn run(cfg: DaemonConfig) -> Result<(), DaemonError> {
    // Modes from the guest are applied as given; the guest kernel already applied its umask.
    // SAFETY: umask has no memory-safety preconditions.
    unsafe { libc::umask(0) };
    // Requests are checked against the caller's groups, never the daemon's own.
    passthrough::drop_supplementary_groups()
        .map_err(|e| DaemonError::Device(format!("cannot drop supplementary groups: {e}")))?;
    // Still single-threaded here, as entering a user namespace requires.
    if !cfg.uid_map.is_empty() || !cfg.gid_map.is_empty() {
        userns::enter_user_namespace(&cfg.uid_map, &cfg.gid_map)
            .map_err(|e| DaemonError::Device(format!("--uid-map/--gid-map: {e}")))?;
        info!("running in a user namespace");
    }

    let socket_path = match &cfg.socket {
        SocketSpec::Path(p) => Some(p.clone()),
        SocketSpec::Fd(_) => None,
    };
    handle_stop_signals(socket_path).map_err(|e| DaemonError::Device(e.to_string()))?;
    serve(cfg)
}

/// Listens, accepts one frontend and serves it until it disconnects. Touches no process-wide
/// state (signals, umask), so tests run it in a thread.
pub fn serve(cfg: DaemonConfig) -> Result<(), DaemonError> {
    let root = cfg.fs.root_dir.clone();
    let fs = PassthroughFs::new(cfg.fs).map_err(|e| DaemonError::SharedDir(root.clone(), e))?;
    // Always wrapped, so the device has one type; without rules the wrapper only forwards.
    let fs = MappedFs::new(fs, cfg.translate);
    let backend = Arc::new(
        FsBackend::new(fs, cfg.tag, cfg.thread_pool_size)
            .map_err(|e| DaemonError::Device(e.to_string()))?,
    );
    let mut daemon = VhostUserDaemon::new(
        "virtiofsd".into(),
        backend,
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(|e| DaemonError::Device(e.to_string()))?;

    let mut listener = listener(&cfg.socket)?;
    info!(
        "serving {} on {}",
        root.display(),
        match &cfg.socket {
            SocketSpec::Path(p) => p.display().to_string(),
            SocketSpec::Fd(fd) => format!("fd {fd}"),
        }
    );
    daemon
        .start(&mut listener)
        .map_err(|e| DaemonError::Socket(format!("accept failed: {e}")))?;
    info!("frontend connected");
    let result = daemon.wait();
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    match result {
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            VhostUserError::Disconnected | VhostUserError::PartialMessage,
        )) => {
            info!("frontend disconnected, exiting");
            Ok(())
        }
        Err(e) => Err(DaemonError::Session(e.to_string())),
    }
}
