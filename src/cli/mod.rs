//! The command line: every flag of the reference `virtiofsd` 1.14, spelled as it spells them,
//! turned into checked [`Settings`].
//!
//! A flag is either supported (it does what it says) or refused at start with exit status 2 and
//! a message that names it and says it is not implemented yet; none is silently ignored. The
//! defaults are the reference's.
//! `doc/configuration.md` describes each flag; `tests/it/cli.rs` checks both against the binary.
//!
//! clap parses each flag into the type its value has in the daemon (`args.rs`), so a malformed
//! value is refused by clap, naming the flag, before anything else is looked at.
//! [`Args::into_command`] then applies the legacy forms (`options.rs`: `-o` options and
//! deprecated spellings) and checks what no single value shows: the host (the shared directory,
//! the socket's directory, the group) and flags taken together.

mod args;
mod options;
#[cfg(test)]
mod tests;

use std::os::fd::RawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use crate::daemon::{DaemonConfig, ProcessOptions, SocketSpec};
use crate::idmap::{TranslateError, Translation};
use crate::migration;
use crate::passthrough::xattrmap::XattrMapError;
use crate::passthrough::{Config, Negotiate};
use crate::sandbox::caps::ModCapsError;
use crate::sandbox::userns;

pub use crate::socket_path::NotASocket;
pub use args::{Args, InodeFileHandlesFlag, MAX_THREAD_POOL};

/// The reference `virtiofsd` release whose command line and behaviour this daemon matches. It
/// moves only when this daemon catches up with a later reference release.
macro_rules! reference_release {
    () => {
        "1.14.0"
    };
}

/// The reference `virtiofsd` release whose command line this daemon matches.
pub const REFERENCE_RELEASE: &str = reference_release!();

/// What `--version` prints after `virtiofsd `: the reference release this daemon matches, then
/// this package's name and version as semantic-versioning build metadata, which version
/// comparisons ignore (`1.14.0+virtiofsd-dropin.0.2.0`). Scripts that compare the version with
/// the reference's decide as they would for that reference release.
pub const VERSION: &str = concat!(
    reference_release!(),
    "+",
    env!("CARGO_PKG_NAME"),
    ".",
    env!("CARGO_PKG_VERSION")
);

/// The name of `v` as its flag spells it.
fn spelled<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_owned())
}

/// A command line refused after clap parsed it: one variant per refusal. Every message starts
/// with the flag (or `-o` option) it is about; the errors of other modules that some carry
/// (overlapping translations, id map ranges taken together, socket activation) name it
/// themselves. Most are a wrong command line (exit status 2); a few are a well-formed one that
/// names what the host does not have ([`UsageError::exit_code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("--shared-dir: missing; expected --shared-dir=DIR (or -o source=DIR)")]
    MissingSharedDir,
    #[error("--shared-dir: '{}' does not exist; expected --shared-dir=DIR", .0.display())]
    SharedDirMissing(PathBuf),
    #[error("--shared-dir: '{}' is not a directory; expected --shared-dir=DIR", .0.display())]
    NotADirectory(PathBuf),
    /// A flag, or a flag's value, this version does not implement; `hint` says what to use.
    #[error("{what}: not implemented yet in this version{hint}")]
    NotImplemented { what: String, hint: &'static str },
    #[error(
        "--socket-group: unknown group '{0}'; expected --socket-group=GROUP with a group name or \
         number"
    )]
    UnknownGroup(String),
    #[error("--fd: cannot be used together with --socket-path")]
    FdAndSocketPath,
    #[error(
        "--socket-path: missing; expected --socket-path=PATH, --fd=N, or a socket passed by \
         systemd socket activation"
    )]
    MissingSocket,
    /// A socket-activation environment (`LISTEN_PID`, `LISTEN_FDS`) that does not hold up.
    #[error("{0}")]
    Activation(String),
    #[error(
        "--socket-path: '{}' is {len} bytes; a unix socket path is at most {max} bytes \
         (use a shorter path, or a relative one from a nearer working directory)",
        .path.display(),
        max = MAX_SOCKET_PATH
    )]
    SocketPathTooLong { path: PathBuf, len: usize },
    #[error(
        "--socket-path: directory '{}' does not exist or is not a directory; expected \
         --socket-path=PATH in an existing directory",
        .0.display()
    )]
    SocketDirMissing(PathBuf),
    #[error("--socket-path: '{}' is a directory; expected the path of a socket to create", .0.display())]
    SocketPathIsDir(PathBuf),
    #[error(transparent)]
    SocketPathNotASocket(NotASocket),
    #[error("--socket-group: only applies to a socket the daemon creates with --socket-path")]
    SocketGroupWithoutPath,
    /// A `--translate-uid`/`--translate-gid` rule that overlaps another.
    #[error(transparent)]
    Translate(#[from] TranslateError),
    #[error(
        "--posix-acl={0}: cannot be used together with --translate-uid or --translate-gid \
         (translating ids would break POSIX ACLs); use --posix-acl=never"
    )]
    AclWithTranslation(String),
    /// Bad `-o xattrmap` rules (as given, and why).
    #[error("-o xattrmap: invalid value '{0}': {1}")]
    LegacyXattrmap(String, XattrMapError),
    /// A set of `--uid-map` (or `--gid-map`) ranges the kernel would refuse.
    #[error("{0}")]
    IdMap(userns::MapsError),
    /// A bad `-o modcaps` list (as given, and why).
    #[error("-o modcaps: invalid value '{0}': {1}")]
    LegacyModcaps(String, ModCapsError),
    /// A legacy `-o` option whose value is not one of its choices.
    #[error("{flag}: invalid {what} '{value}': expected one of {expected}")]
    LegacyValue {
        flag: String,
        what: &'static str,
        value: String,
        expected: String,
    },
    #[error(
        "{0}: not supported (an option of the old C virtiofsd); use --cache to choose how long \
         the guest caches"
    )]
    LegacyTimeout(String),
    #[error("{0}: not supported (an option of the old C virtiofsd)")]
    LegacyUnsupported(String),
    #[error(
        "{0}: unknown legacy option; expected source=DIR, cache=MODE, loglevel=LEVEL, \
         sandbox=KIND, modcaps=CAPS, announce_submounts, xattr, no_xattr, readdirplus, \
         no_readdirplus, writeback, no_writeback, allow_direct_io, no_allow_direct_io, \
         [no_]killpriv_v2, [no_]posix_acl, [no_]security_label, xattrmap=RULES, [no_]posix_lock or \
         [no_]flock"
    )]
    UnknownLegacy(String),
    #[error("--print-capabilities: prints the capabilities; there is nothing to serve")]
    NothingToServe,
    /// A check of paths asked for with `--migration-mode=file-handles`.
    #[error(
        "{0}: checks the paths of --migration-mode=find-paths; expected it without \
         --migration-mode=file-handles"
    )]
    MigrationPathsOnly(&'static str),
}

impl UsageError {
    /// The exit status: 2 when the command line itself is wrong (what it says can be told
    /// wrong from the arguments alone: an unknown or unimplemented flag, a malformed value,
    /// flags that cannot go together); 1 when it is well-formed but the host does not have
    /// what it names: a shared directory or a socket directory that does not exist or is not a
    /// directory, a socket path taken by something else, an unknown group. 1 is also what the
    /// reference exits with for those it refuses (it replaces what is at the socket path), and
    /// what the daemon exits with when it cannot run.
    pub fn exit_code(&self) -> u8 {
        match self {
            UsageError::SharedDirMissing(_)
            | UsageError::NotADirectory(_)
            | UsageError::SocketDirMissing(_)
            | UsageError::SocketPathIsDir(_)
            | UsageError::SocketPathNotASocket(_) => 1,
            // An empty name is no group name at all.
            UsageError::UnknownGroup(g) if !g.is_empty() => 1,
            _ => 2,
        }
    }
}

/// Longest path a unix socket address holds (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Refuses a `--socket-path` the daemon could not bind, before anything (the lock file) is
/// made next to it.
fn check_socket_path(path: &Path) -> Result<(), UsageError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(UsageError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(UsageError::SocketDirMissing(dir.to_path_buf()));
    }
    if path.is_dir() {
        return Err(UsageError::SocketPathIsDir(path.to_path_buf()));
    }
    // Checked again (without following a symlink) just before the socket is made.
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            Err(UsageError::SocketPathNotASocket(NotASocket::at(path, &m)))
        }
        _ => Ok(()),
    }
}

/// Resolves `--socket-group`: a group name from the group database, or a number.
pub fn group_id(group: &str) -> Result<libc::gid_t, UsageError> {
    let unknown = || UsageError::UnknownGroup(group.to_owned());
    if group.is_empty() {
        return Err(unknown());
    }
    if let Ok(gid) = group.parse::<libc::gid_t>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(unknown()),
    }
}

/// The log settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    pub level: log::LevelFilter,
    /// Log to syslog instead of stderr (`--syslog`).
    pub syslog: bool,
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub daemon: DaemonConfig,
    pub process: ProcessOptions,
    pub log: LogSettings,
    /// Deprecation warnings for the command line, to print before starting.
    pub warnings: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Command {
    /// `--print-capabilities`.
    PrintCapabilities,
    /// Serve a directory.
    Run(Box<Settings>),
}

/// The vhost-user backend capabilities printed by `--print-capabilities`: the JSON libvirt
/// reads from a vhost-user description. Lists only what this version supports: the
/// never/auto/always values of `--posix-acl` and `--security-label`, and "separate-options"
/// (the flags can be given one by one, not only with `-o`), and "migrate-precopy" (live
/// migration through QEMU: `SET_DEVICE_STATE_FD` and the dirty log).
pub const CAPABILITIES: &str = "{\n  \"type\": \"fs\",\n  \"features\": [\n    \
     \"migrate-precopy\",\n    \"posix-acl-negotiation-mode\",\n    \"security-label-negotiation-mode\",\n    \
     \"separate-options\"\n  ]\n}\n";

impl Args {
    /// Checks the command line. `activated` is asked for a socket passed by systemd socket
    /// activation when the command line names none (see [`crate::activation`]).
    ///
    /// Each value was parsed and checked on its own by clap; what is left are the legacy forms,
    /// the host (the shared directory, the socket's directory and group), and the checks that
    /// take several flags or occurrences together, in this order.
    pub fn into_command(
        mut self,
        activated: impl FnOnce() -> Result<Option<RawFd>, String>,
    ) -> Result<Command, UsageError> {
        let warnings = self.apply_legacy_forms()?;
        if self.print_capabilities {
            return Ok(Command::PrintCapabilities);
        }
        let shared_dir = self.shared_dir()?;
        let migration = self.migration_options()?;
        let socket_group = self.socket_group.as_deref().map(group_id).transpose()?;
        let socket = self.socket(activated)?;
        if socket_group.is_some() && !matches!(socket, SocketSpec::Path(_)) {
            return Err(UsageError::SocketGroupWithoutPath);
        }
        let translate = Translation::from_rules(&self.translate_uid, &self.translate_gid)?;
        if self.posix_acl != Negotiate::Never && !translate.is_empty() {
            // An ACL stores raw ids, which the translation cannot reach.
            return Err(UsageError::AclWithTranslation(spelled(&self.posix_acl)));
        }
        userns::check_maps("--uid-map", &self.uid_map).map_err(UsageError::IdMap)?;
        userns::check_maps("--gid-map", &self.gid_map).map_err(UsageError::IdMap)?;
        let fs = self.fs_config(shared_dir, migration);
        Ok(Command::Run(Box::new(Settings {
            daemon: DaemonConfig {
                fs,
                socket,
                tag: self.tag,
                thread_pool_size: self.thread_pool_size,
                poll_window: std::time::Duration::from_micros(self.poll_window.unwrap_or(0)),
                translate,
                uid_map: self.uid_map,
                gid_map: self.gid_map,
            },
            process: ProcessOptions {
                socket_group,
                rlimit_nofile: self.rlimit_nofile,
                sandbox: self.sandbox,
                modcaps: self.modcaps.unwrap_or_default(),
                seccomp: self.seccomp,
            },
            log: LogSettings {
                level: self.log_level,
                syslog: self.syslog,
            },
            warnings,
        })))
    }

    /// `--shared-dir` (or `-o source`): given, and a directory of the host.
    fn shared_dir(&mut self) -> Result<PathBuf, UsageError> {
        let dir = self.shared_dir.take().ok_or(UsageError::MissingSharedDir)?;
        if !dir.exists() {
            return Err(UsageError::SharedDirMissing(dir));
        }
        if !dir.is_dir() {
            return Err(UsageError::NotADirectory(dir));
        }
        Ok(dir)
    }

    /// The `--migration-*` flags; the checks of a path only go with paths.
    fn migration_options(&self) -> Result<migration::Options, UsageError> {
        if self.migration_mode == migration::Mode::FileHandles {
            if self.migration_verify_handles {
                return Err(UsageError::MigrationPathsOnly("--migration-verify-handles"));
            }
            if self.migration_confirm_paths {
                return Err(UsageError::MigrationPathsOnly("--migration-confirm-paths"));
            }
        }
        Ok(migration::Options {
            mode: self.migration_mode,
            on_error: self.migration_on_error,
            verify_handles: self.migration_verify_handles,
            confirm_paths: self.migration_confirm_paths,
        })
    }

    /// The socket: `--socket-path` (or `--socket`), `--fd`, or one passed by socket activation
    /// (asked of `activated` only when the command line names none).
    fn socket(
        &mut self,
        activated: impl FnOnce() -> Result<Option<RawFd>, String>,
    ) -> Result<SocketSpec, UsageError> {
        let socket = match (self.socket_path.take().or(self.socket.take()), self.fd) {
            (Some(p), None) => SocketSpec::Path(p),
            (None, Some(fd)) => SocketSpec::Fd(fd),
            (Some(_), Some(_)) => return Err(UsageError::FdAndSocketPath),
            (None, None) => match activated().map_err(UsageError::Activation)? {
                Some(fd) => SocketSpec::Fd(fd),
                None => return Err(UsageError::MissingSocket),
            },
        };
        if let SocketSpec::Path(p) = &socket {
            check_socket_path(p)?;
        }
        Ok(socket)
    }

    /// The file system's settings.
    fn fs_config(&mut self, shared_dir: PathBuf, migration: migration::Options) -> Config {
        let mut fs = Config::new(shared_dir, self.cache);
        // Each of these needs extended attributes, and turns them on (as the reference does).
        fs.xattr = self.xattr
            || self.xattrmap.is_some()
            || self.posix_acl != Negotiate::Never
            || self.security_label != Negotiate::Never;
        fs.xattrmap = self.xattrmap.take();
        fs.posix_acl = self.posix_acl;
        fs.security_label = self.security_label;
        fs.killpriv_v2 = self.killpriv_v2 && !self.no_killpriv_v2;
        fs.readonly = self.readonly;
        fs.readdirplus = !self.no_readdirplus;
        if let Some(n) = self.max_nodes {
            fs.max_nodes = n;
        }
        if let Some(n) = self.max_data_fds {
            fs.max_data_fds = n;
        }
        if let Some(n) = self.max_lock_fds {
            fs.max_lock_fds = n;
        }
        fs.posix_lock = self.posix_lock.is_on();
        fs.flock = self.flock.is_on();
        fs.writeback = self.writeback;
        // On unless turned off (clap keeps only the last of the pair).
        fs.announce_submounts = !self.no_announce_submounts;
        fs.allow_direct_io = self.allow_direct_io;
        fs.allow_mmap = self.allow_mmap;
        fs.preserve_noatime = self.preserve_noatime;
        fs.inode_file_handles = self.inode_file_handles.mode;
        fs.migration = migration;
        fs
    }
}

impl TryFrom<Args> for DaemonConfig {
    type Error = UsageError;

    /// The daemon configuration of a command line that names its socket (no socket activation).
    fn try_from(a: Args) -> Result<Self, UsageError> {
        match a.into_command(|| Ok(None))? {
            Command::Run(s) => Ok(s.daemon),
            Command::PrintCapabilities => Err(UsageError::NothingToServe),
        }
    }
}
