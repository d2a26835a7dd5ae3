//! Starting and stopping the daemon: the listening socket, the vhost-user session, signals.
//!
//! One daemon serves one frontend connection: it listens on `--socket-path` (or takes the
//! listening socket passed with `--fd`), accepts QEMU, serves until QEMU disconnects, and exits.
//! SIGTERM and SIGINT stop it at any point; the socket file it created is removed either way.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::info;
use nix::errno::Errno;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::stat::Mode;
use nix::unistd::Gid;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::idmap::{MappedFs, Translation};
use crate::passthrough::{self, PassthroughFs};
use crate::sandbox::userns::{self, IdMapRange};
use crate::sandbox::{self, caps, seccomp, SandboxError, SandboxMode};
use crate::socket_lock::{self, LockError, SocketId};
use crate::socket_path::NotASocket;
use crate::vhost_user::backend::{LoadJob, LoadKeeper, UnsharedMemory};
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
    /// Most time a queue's thread polls for the guest's next request (`--poll-window`; zero:
    /// never).
    pub poll_window: std::time::Duration,
    /// uid/gid translation between guest and host (`--translate-uid`, `--translate-gid`);
    /// empty translates nothing.
    pub translate: Translation,
    /// User-namespace maps (`--uid-map`, `--gid-map`); the daemon enters a user namespace
    /// when either is given.
    pub uid_map: Vec<IdMapRange>,
    pub gid_map: Vec<IdMapRange>,
}

/// Settings of the daemon process that [`serve`] leaves alone (tests run it in a thread).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOptions {
    /// Group that owns the socket created at `--socket-path` (`--socket-group`); the socket is
    /// then mode 0770 instead of 0700.
    pub socket_group: Option<libc::gid_t>,
    /// `--rlimit-nofile`: `None` raises the soft limit of open files to
    /// [`default_nofile_limit`], `Some(0)` leaves it, `Some(n)` sets it to `n`.
    pub rlimit_nofile: Option<u64>,
    /// How the daemon confines itself (`--sandbox`).
    pub sandbox: SandboxMode,
    /// Changes to the capabilities the daemon keeps (`--modcaps`).
    pub modcaps: caps::ModCaps,
    /// `--seccomp`: what the filter installed before serving does to a system call off its
    /// list ([`seccomp::Action::None`] installs none).
    pub seccomp: seccomp::Action,
}

/// The open-files limit the daemon asks for by default.
pub const DEFAULT_NOFILE: u64 = 1_000_000;

/// Why the daemon stopped with an error: one variant per step that can fail; the cause, when
/// there is one, is the `source()`.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot open shared directory {}", .path.display())]
    SharedDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("vhost-user socket: cannot listen on {}", .path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    SocketLock(#[from] LockError),
    #[error("vhost-user socket: --fd {0} is not an open socket")]
    NotASocket(RawFd),
    #[error("vhost-user socket: cannot give group {gid} (--socket-group) the socket {}", .path.display())]
    SocketGroup {
        path: PathBuf,
        gid: libc::gid_t,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    NotASocketPath(NotASocket),
    /// `vhost_user_backend::Error` is no `std::error::Error`: it is shown in the message.
    #[error("vhost-user socket: accept failed: {0}")]
    Accept(vhost_user_backend::Error),
    #[error("cannot block the stop signals (SIGTERM, SIGINT, SIGHUP)")]
    BlockSignals(#[source] Errno),
    #[error("cannot start the thread that waits for the stop signals")]
    SignalThread(#[source] io::Error),
    #[error("cannot drop supplementary groups")]
    SupplementaryGroups(#[source] io::Error),
    #[error("--uid-map/--gid-map")]
    UserNamespace(#[source] userns::Error),
    /// The shared directory cannot be listed by the daemon as it runs: no sandbox mode helps.
    #[error(
        "--shared-dir {}: this daemon (uid {uid}) may not read and search it; run it as root or \
         as the directory's owner, or give that uid read and search permission",
        .path.display()
    )]
    ShareUnreadable {
        path: PathBuf,
        uid: u32,
        #[source]
        source: io::Error,
    },
    #[error("device setup")]
    Backend(#[source] io::Error),
    #[error("device setup: cannot create the vhost-user daemon: {0}")]
    VhostUserDaemon(vhost_user_backend::Error),
    #[error("vhost-user session: {0}")]
    Session(vhost_user_backend::Error),
    /// The session failed because guest memory was not shared with the daemon.
    #[error("{0}")]
    GuestMemoryNotShared(UnsharedMemory),
    #[error("--rlimit-nofile: cannot read the limit of open files")]
    GetLimit(#[source] Errno),
    #[error(
        "--rlimit-nofile: cannot set the limit of open files to {want} (now soft {soft}, hard \
         {hard})"
    )]
    SetLimit {
        want: u64,
        soft: u64,
        hard: u64,
        #[source]
        source: Errno,
    },
    #[error("--rlimit-nofile: cannot raise the limit of open files to the hard limit {hard}")]
    RaiseToHard {
        hard: u64,
        #[source]
        source: Errno,
    },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("cannot drop capabilities")]
    DropCaps(#[source] io::Error),
    #[error("--seccomp")]
    Seccomp(#[source] seccomp::Error),
}

/// The device's state loads run on the thread that keeps the capability to open file handles
/// (`--migration-mode=file-handles`): the transport asks for it through its own trait, and
/// knows nothing of the sandbox.
impl LoadKeeper for caps::Keeper {
    fn run(&self, job: LoadJob) -> Result<(), LoadJob> {
        caps::Keeper::run(self, job)
    }

    fn close(&self) {
        caps::Keeper::close(self)
    }

    fn is_open(&self) -> bool {
        caps::Keeper::is_open(self)
    }
}

/// The signals that stop the daemon.
fn stop_signals() -> SigSet {
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP]
        .into_iter()
        .collect()
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and so in every thread it starts
/// from then on), so that they stay pending until [`handle_stop_signals`] waits for them.
fn block_stop_signals() -> Result<SigSet, DaemonError> {
    let set = stop_signals();
    set.thread_block().map_err(DaemonError::BlockSignals)?;
    Ok(set)
}

/// Blocks the stop signals (see [`block_stop_signals`]), then starts a thread that waits for
/// them, removes `socket_path` and its lock file and exits with status 0.
fn handle_stop_signals(socket: Option<(PathBuf, Option<SocketId>)>) -> Result<(), DaemonError> {
    let set = block_stop_signals()?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                info!("signal {} received, exiting", sig as i32);
            }
            if let Some((p, made)) = &socket {
                socket_lock::remove_socket(p, *made);
            }
            std::process::exit(0);
        })
        .map_err(DaemonError::SignalThread)?;
    Ok(())
}

/// Whether the daemon, with the ids it serves with (those of its user namespace with
/// `--uid-map`), may use `mode` (`R_OK`, `W_OK`, `X_OK`) on `path`.
fn may_access(path: &Path, mode: libc::c_int) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path that outlives the call; faccessat only reads it.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, libc::AT_EACCESS) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Refuses a shared directory the daemon cannot list (no sandbox mode would change that: it
/// would serve a directory whose every request fails), and warns when the guest's changes will
/// fail because the daemon may not write it (not root, root of a user namespace that does not
/// own it, or a read-only mount) and `--readonly` was not given.
fn check_share_access(dir: &Path, readonly: bool, in_userns: bool) -> Result<(), DaemonError> {
    let uid = nix::unistd::geteuid();
    if let Err(source) = may_access(dir, libc::R_OK | libc::X_OK) {
        if source.raw_os_error() == Some(libc::EACCES) {
            return Err(DaemonError::ShareUnreadable {
                path: dir.to_path_buf(),
                uid: uid.as_raw(),
                source,
            });
        }
    }
    if readonly {
        return Ok(());
    }
    if let Err(e) = may_access(dir, libc::W_OK) {
        let who = match in_userns {
            true => format!("uid {uid} of its user namespace (--uid-map)"),
            false => format!("uid {uid}"),
        };
        log::warn!(
            "--shared-dir {}: this daemon runs as {who} and may not write it ({e}): the guest \
             can read the share, but every file it creates, changes or removes there fails. \
             Run the daemon as root or as the directory's owner, or pass --readonly",
            dir.display(),
        );
    }
    Ok(())
}

/// The mode of the socket the daemon creates: owner only, or owner and `--socket-group`.
fn socket_mode(group: Option<libc::gid_t>) -> libc::mode_t {
    if group.is_some() {
        0o770
    } else {
        0o700
    }
}

/// Creates (or takes, with `--fd`) the listening socket. A socket created at a path is not
/// removed when the listener is dropped: see [`SocketFile`]. Its mode comes from the umask
/// [`run`] set and its group from the file-system group id of the thread that binds it: once
/// made, the socket is never changed by path (a local user who can write its directory could
/// have put a symbolic link there by then). Only a socket already at the path is replaced.
fn bind_listener(
    spec: &SocketSpec,
    group: Option<libc::gid_t>,
) -> Result<(UnixListener, Option<SocketId>), DaemonError> {
    match spec {
        SocketSpec::Path(p) => {
            remove_old_socket(p)?;
            let l = bind_as_group(p, group)?;
            // What was made, to remove only that at exit (see `SocketFile`).
            let made = SocketId::of(p);
            let file = SocketFile(Some((p.clone(), made)));
            check_socket_group(p, group)?;
            std::mem::forget(file);
            Ok((l, made))
        }
        SocketSpec::Fd(fd) => {
            // SAFETY: fstat only writes the local `st`; an invalid fd makes it fail with EBADF.
            let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
            // SAFETY: see above.
            let rc = unsafe { libc::fstat64(*fd, &mut st) };
            if rc != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
                return Err(DaemonError::NotASocket(*fd));
            }
            // SAFETY: the user handed this listening socket to the daemon with `--fd`; nothing
            // else in the process owns it, and it was just checked to be a socket.
            Ok((unsafe { UnixListener::from_raw_fd(*fd) }, None))
        }
    }
}

/// Removes a socket left at `path` (by an earlier daemon); refuses anything else there.
fn remove_old_socket(path: &Path) -> Result<(), DaemonError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DaemonError::Listen {
            path: path.to_path_buf(),
            source,
        }),
        Ok(m) if m.file_type().is_socket() => match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DaemonError::Listen {
                path: path.to_path_buf(),
                source: e,
            }),
            _ => Ok(()),
        },
        Ok(m) => Err(DaemonError::NotASocketPath(NotASocket::at(path, &m))),
    }
}

/// Binds a socket at `path` with `group` as the file-system group id of this thread for that
/// one call, so that the socket is made with that group (a directory with the set-group-ID
/// bit gives its own instead: see [`check_socket_group`]).
fn bind_as_group(path: &Path, group: Option<libc::gid_t>) -> Result<UnixListener, DaemonError> {
    let listen_failed = |source| DaemonError::Listen {
        path: path.to_path_buf(),
        source,
    };
    let Some(gid) = group else {
        return UnixListener::bind(path).map_err(listen_failed);
    };
    let before = nix::unistd::setfsgid(Gid::from_raw(gid));
    // setfsgid answers the previous id whether it worked or not: an invalid id asks for the
    // current one without changing it.
    let now = nix::unistd::setfsgid(Gid::from_raw(u32::MAX));
    let bound = if now.as_raw() == gid {
        UnixListener::bind(path).map_err(listen_failed)
    } else {
        Err(DaemonError::SocketGroup {
            path: path.to_path_buf(),
            gid,
            source: io::Error::from_raw_os_error(libc::EPERM),
        })
    };
    nix::unistd::setfsgid(before);
    bound
}

/// Checks (without changing it) that the socket just made at `path` has `group`.
fn check_socket_group(path: &Path, group: Option<libc::gid_t>) -> Result<(), DaemonError> {
    let Some(gid) = group else { return Ok(()) };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() && m.gid() != gid => Err(DaemonError::SocketGroup {
            path: path.to_path_buf(),
            gid,
            source: io::Error::other(format!(
                "made with group {} instead (its directory has the set-group-ID bit?)",
                m.gid()
            )),
        }),
        _ => Ok(()),
    }
}

/// The socket file the daemon created, removed when dropped (see
/// [`socket_lock::remove_socket`]; `None`: nothing to remove here).
struct SocketFile(Option<(PathBuf, Option<SocketId>)>);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some((p, made)) = &self.0 {
            socket_lock::remove_socket(p, *made);
        }
    }
}

/// The limit `--rlimit-nofile` asks for by default: [`DEFAULT_NOFILE`], or less when the
/// kernel allows less (`/proc/sys/fs/nr_open`).
pub fn default_nofile_limit() -> u64 {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    nr_open.map_or(DEFAULT_NOFILE, |n| n.min(DEFAULT_NOFILE))
}

fn setrlimit_nofile(soft: u64, hard: u64) -> nix::Result<()> {
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard)
}

/// Sets the limit of open files as `--rlimit-nofile` asks (see [`ProcessOptions`]). By
/// default the soft limit is raised to [`default_nofile_limit`], raising the hard limit too
/// when needed; without the privilege to raise the hard limit, the soft limit is raised to the
/// hard one. An explicit value that cannot be set is an error.
pub fn set_rlimit_nofile(requested: Option<u64>) -> Result<(), DaemonError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(DaemonError::GetLimit)?;
    let set_failed = |want, source| DaemonError::SetLimit {
        want,
        soft,
        hard,
        source,
    };
    match requested {
        Some(0) => Ok(()),
        Some(n) => setrlimit_nofile(n, hard.max(n)).map_err(|e| set_failed(n, e)),
        None => {
            let want = default_nofile_limit();
            if soft >= want {
                return Ok(());
            }
            match setrlimit_nofile(want, hard.max(want)) {
                Ok(()) => Ok(()),
                Err(e) if hard < want => {
                    if soft < hard {
                        setrlimit_nofile(hard, hard)
                            .map_err(|source| DaemonError::RaiseToHard { hard, source })?;
                    }
                    info!(
                        "cannot raise the hard limit of open files to {want} ({e}); using the \
                         hard limit {hard}"
                    );
                    Ok(())
                }
                Err(e) => Err(set_failed(want, e)),
            }
        }
    }
}

/// Runs the daemon process: sets the open-files limit, creates the socket, confines itself as
/// `--sandbox` asks and drops the capabilities it does not use (see [`crate::sandbox`]), stops
/// cleanly on SIGTERM/SIGINT/SIGHUP, and serves one frontend connection. The socket it creates
/// is mode 0700 (0770 and owned by `--socket-group` when given). Files are created with the
/// modes the guest asks for: the umask is cleared once the socket exists. Once the shared
/// directory is open, and before the frontend is accepted, the seccomp filter of `--seccomp` is
/// installed on every thread (those started later inherit it).
///
/// Its phases, in this order (each a private function below): `set_up_process`, `make_socket`,
/// `enter_userns_and_check_share` (in the user namespace of `--uid-map`, once the socket
/// exists), `confine` (sandbox and capabilities, still single-threaded), `serve_confined` (the
/// shared directory opened, the seccomp filter, one frontend served), `shut_down`.
pub fn run(cfg: DaemonConfig, opts: &ProcessOptions) -> Result<(), DaemonError> {
    set_up_process(opts)?;
    // One daemon per socket path: a second one stops here instead of replacing the socket
    // (see `socket_lock`). The lock is held until this process, and the sandbox's child, exit:
    // it is dropped last, after the socket file is removed.
    let (_lock, mut socket) = make_socket(&cfg.socket, opts.socket_group)?;
    enter_userns_and_check_share(&cfg)?;
    let (confined, keeper) = confine(&cfg, opts, &mut socket)?;
    let (result, socket_file) = serve_confined(cfg, opts.seccomp, socket, confined, keeper);
    shut_down(socket_file);
    result
}

/// The set-up of the process before the socket exists: the stop signals blocked, the umask of
/// the socket, the open-files limit, the allocator, the supplementary groups.
fn set_up_process(opts: &ProcessOptions) -> Result<(), DaemonError> {
    // A stop signal that arrives before the daemon waits for it (once the socket exists, a
    // service manager may send one at any time) waits, pending.
    block_stop_signals()?;
    // The socket is created with the restrictive mode straight away, then chmod-ed to it.
    nix::sys::stat::umask(Mode::from_bits_truncate(
        0o777 & !socket_mode(opts.socket_group),
    ));
    set_rlimit_nofile(opts.rlimit_nofile)?;
    passthrough::allocator_gives_memory_back();
    // Requests are checked against the caller's groups, never the daemon's own, except where
    // a user namespace forbids dropping them (see `sandbox::groups`).
    match sandbox::groups::plan_for_this_process() {
        sandbox::groups::Plan::Drop => {
            passthrough::drop_supplementary_groups().map_err(DaemonError::SupplementaryGroups)?
        }
        sandbox::groups::Plan::NotRoot | sandbox::groups::Plan::NoneHeld => {}
        sandbox::groups::Plan::KeepSingleId => info!(
            "setgroups is denied in this user namespace (e.g. unshare -r): the supplementary \
             groups are kept; the namespace maps one uid and gid, so no other caller gets them"
        ),
        sandbox::groups::Plan::KeepMappedRange => log::warn!(
            "setgroups is denied in this user namespace: the supplementary groups of the user \
             who started the daemon cannot be dropped, and creations by guest callers are also \
             checked against them"
        ),
    }
    Ok(())
}

/// The listening socket [`run`] made at `--socket-path` (or took with `--fd`).
struct Socket {
    listener: UnixListener,
    /// The socket file made, if any (see [`SocketFile`]).
    made: Option<SocketId>,
    /// `--socket-path`; `None` with `--fd`.
    path: Option<PathBuf>,
    /// Removed when dropped, unless a supervising parent removes it.
    file: SocketFile,
}

/// Takes the socket's lock (at `--socket-path`) and makes the listening socket (or takes the
/// one of `--fd`). The lock comes back apart, for [`run`] to hold to its end.
fn make_socket(
    spec: &SocketSpec,
    group: Option<libc::gid_t>,
) -> Result<(Option<socket_lock::SocketLock>, Socket), DaemonError> {
    let path = match spec {
        SocketSpec::Path(p) => Some(p.clone()),
        SocketSpec::Fd(_) => None,
    };
    let lock = path
        .as_deref()
        .map(|p| socket_lock::acquire(p, std::process::id()))
        .transpose()?;
    let (listener, made) = bind_listener(spec, group).inspect_err(|_| {
        // No socket made: the lock file this daemon made goes too.
        if let Some(p) = &path {
            socket_lock::remove_lock_file(p);
        }
    })?;
    let file = SocketFile(path.clone().map(|p| (p, made)));
    Ok((
        lock,
        Socket {
            listener,
            made,
            path,
            file,
        },
    ))
}

/// Enters the user namespace of `--uid-map`/`--gid-map`, if any, refuses a shared directory
/// the daemon cannot list there, then clears the umask.
///
/// The socket and its lock file are made first, with the ids and capabilities the daemon was
/// started with: once in its user namespace, root of the host has no right left in a directory
/// such as /run (not even to open the lock file there), and `--socket-group` names a host
/// group. The listener and the lock stay open across the switch. Still single-threaded here,
/// as entering a user namespace requires.
fn enter_userns_and_check_share(cfg: &DaemonConfig) -> Result<(), DaemonError> {
    let in_userns = !cfg.uid_map.is_empty() || !cfg.gid_map.is_empty();
    if in_userns {
        userns::enter_user_namespace(&cfg.uid_map, &cfg.gid_map)
            .map_err(DaemonError::UserNamespace)?;
        info!("running in a user namespace");
    }
    check_share_access(&cfg.fs.root_dir, cfg.fs.readonly, in_userns)?;
    // Modes from the guest are applied as given; the guest kernel already applied its umask.
    nix::sys::stat::umask(Mode::empty());
    Ok(())
}

/// Enters the sandbox of `--sandbox` and drops the capabilities the daemon does not use;
/// starts the capability keeper of a migration destination that needs one. Still
/// single-threaded when called: it forks and enters namespaces. A supervised child cannot name
/// the socket file any more: its parent removes it, so `socket` forgets it.
fn confine(
    cfg: &DaemonConfig,
    opts: &ProcessOptions,
    socket: &mut Socket,
) -> Result<(sandbox::Confined, Option<Arc<caps::Keeper>>), DaemonError> {
    let confined = sandbox::enter(
        opts.sandbox,
        &cfg.fs.root_dir,
        socket.path.as_deref().map(|p| (p, socket.made)),
        socket.listener.as_raw_fd(),
    )?;
    if confined.supervised {
        std::mem::forget(std::mem::replace(&mut socket.file, SocketFile(None)));
    }
    // Capabilities belong to threads, and threads copy them: drop them before any starts.
    // DAC_READ_SEARCH is kept only to open file handles (`--inode-file-handles`, and a
    // migration destination of `--migration-mode=file-handles`).
    let by_handle = cfg.fs.inode_file_handles != passthrough::InodeFileHandles::Never
        || cfg.fs.migration.mode == crate::migration::Mode::FileHandles;
    let file_handle_caps = match by_handle {
        false => &[][..],
        true => caps::FILE_HANDLE_CAPS,
    };
    let keep = caps::kept(
        nix::unistd::geteuid().is_root(),
        file_handle_caps,
        &opts.modcaps,
    );
    let kept = caps::drop_all_but(keep, caps::last_cap()).map_err(DaemonError::DropCaps)?;
    info!("capabilities kept: {kept}");
    // Kept for a migration's load only: by one thread that serves no request, and only until
    // a session starts or a state was taken over (the keeper starts with the stop signals
    // blocked, as every thread does).
    let load_only = caps::CapSet::of(caps::FILE_HANDLE_CAPS);
    let keeper = match cfg.fs.inode_file_handles == passthrough::InodeFileHandles::Never
        && cfg.fs.migration.mode == crate::migration::Mode::FileHandles
        && kept.contains(caps::CAP_DAC_READ_SEARCH)
    {
        true => {
            block_stop_signals()?;
            let k = caps::Keeper::start(load_only).map_err(DaemonError::DropCaps)?;
            info!("capabilities {load_only} kept by one thread, to load a migration state");
            Some(k)
        }
        false => None,
    };
    Ok((confined, keeper))
}

/// Starts the thread that waits for the stop signals, opens the shared directory as the
/// confined process names it, installs the seccomp filter of `--seccomp` once set-up is done,
/// and serves one frontend until it disconnects. Gives back the socket file to remove (even
/// when the stop-signal thread did not start).
fn serve_confined(
    mut cfg: DaemonConfig,
    seccomp_action: seccomp::Action,
    socket: Socket,
    confined: sandbox::Confined,
    keeper: Option<Arc<caps::Keeper>>,
) -> (Result<(), DaemonError>, SocketFile) {
    let Socket { listener, file, .. } = socket;
    if let Err(e) = handle_stop_signals(file.0.clone()) {
        return (Err(e), file);
    }
    let shown = cfg.fs.root_dir.clone();
    cfg.fs.root_dir = confined.root_dir;
    let result = serve_with(cfg, confined.proc_self_fd, keeper, &shown, move || {
        // Set-up is done: the shared directory is open, the socket listens, the request
        // threads of --thread-pool-size and the signal thread run (the filter reaches them
        // with TSYNC); the per-queue workers started after accepting inherit it.
        seccomp::install(seccomp_action).map_err(DaemonError::Seccomp)?;
        if seccomp_action != seccomp::Action::None {
            info!("seccomp filter installed (--seccomp={seccomp_action})");
        }
        Ok(Listener::from(listener))
    });
    (result, file)
}

/// Removes the socket file the daemon made (none when a supervising parent removes it, or with
/// `--fd`); the socket's lock goes after it, as [`run`] returns.
fn shut_down(socket_file: SocketFile) {
    drop(socket_file);
}

/// Listens, accepts one frontend and serves it until it disconnects. Touches no process-wide
/// state (signals, umask), so tests run it in a thread.
pub fn serve(cfg: DaemonConfig) -> Result<(), DaemonError> {
    let spec = cfg.socket.clone();
    let root = cfg.fs.root_dir.clone();
    let mut socket_file = SocketFile(None);
    let result = serve_with(cfg, None, None, &root, || {
        let (l, made) = bind_listener(&spec, None)?;
        if let SocketSpec::Path(p) = &spec {
            socket_file = SocketFile(Some((p.clone(), made)));
        }
        Ok(Listener::from(l))
    });
    drop(socket_file);
    result
}

/// Opens the shared directory (with `proc_self_fd` as its `/proc/self/fd` when given; `shown`
/// is its name in messages), calls `listener` for the listening socket, accepts one frontend
/// and serves it until it disconnects.
fn serve_with(
    cfg: DaemonConfig,
    proc_self_fd: Option<OwnedFd>,
    keeper: Option<Arc<caps::Keeper>>,
    shown: &Path,
    listener: impl FnOnce() -> Result<Listener, DaemonError>,
) -> Result<(), DaemonError> {
    let shared_dir = |source| DaemonError::SharedDir {
        path: shown.to_path_buf(),
        source,
    };
    let fs = match proc_self_fd {
        Some(fd) => PassthroughFs::with_proc_self_fd(cfg.fs, fd),
        None => PassthroughFs::new(cfg.fs),
    }
    .map_err(shared_dir)?;
    // Always wrapped, so the device has one type; without rules the wrapper only forwards.
    let fs = MappedFs::new(fs, cfg.translate);
    let mut backend =
        FsBackend::new(fs, cfg.tag, cfg.thread_pool_size).map_err(DaemonError::Backend)?;
    if let Some(k) = keeper {
        backend = backend.with_keeper(k);
    }
    backend = backend.with_poll_window(cfg.poll_window);
    let backend = Arc::new(backend);
    let mut daemon = VhostUserDaemon::new(
        "virtiofsd".into(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(DaemonError::VhostUserDaemon)?;

    let mut listener = listener()?;
    info!(
        "serving {} on {}",
        shown.display(),
        match &cfg.socket {
            SocketSpec::Path(p) => p.display().to_string(),
            SocketSpec::Fd(fd) => format!("fd {fd}"),
        }
    );
    daemon.start(&mut listener).map_err(DaemonError::Accept)?;
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
        Err(e) => Err(match backend.unshared_memory(&e) {
            Some(u) => DaemonError::GuestMemoryNotShared(u),
            None => DaemonError::Session(e),
        }),
    }
}
