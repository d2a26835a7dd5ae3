//! The command line: every flag of the reference `virtiofsd` 1.14, spelled as it spells them,
//! turned into checked [`Settings`].
//!
//! A flag is either supported (it does what it says) or refused at start with exit status 2 and
//! a message that names it and says it is not implemented yet; none is silently ignored. The
//! defaults are the reference's.
//! `doc/configuration.md` describes each flag; `tests/cli.rs` checks both against the binary.

use std::os::fd::RawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use clap::{Parser, ValueEnum};

use crate::daemon::{DaemonConfig, ProcessOptions, SocketSpec};
use crate::idmap::Translation;
use crate::migration;
use crate::passthrough::xattrmap::XattrMap;
use crate::passthrough::{CacheMode, Config, InodeFileHandles, Negotiate};
use crate::sandbox::seccomp;
use crate::sandbox::userns::{self, IdMapRange};
use crate::sandbox::{caps, SandboxMode};

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

/// vhost-user virtio-fs daemon: serves a host directory to a guest.
#[derive(Debug, Parser)]
#[command(
    name = "virtiofsd",
    version = VERSION,
    about = "A vhost-user virtio-fs daemon: serves a host directory to a Linux guest",
    args_override_self = true,
    override_usage = "virtiofsd --shared-dir=DIR --socket-path=PATH [OPTIONS]"
)]
pub struct Args {
    /// Shared directory path
    #[arg(long = "shared-dir", value_name = "DIR")]
    pub shared_dir: Option<PathBuf>,

    /// Tag exposed in the device's configuration space, 1 to 36 bytes (QEMU normally sets the
    /// tag itself and ignores this one)
    #[arg(long = "tag", value_name = "TAG")]
    pub tag: Option<String>,

    /// Old name of --socket-path [deprecated]
    #[arg(long = "socket", value_name = "PATH", conflicts_with = "fd")]
    pub socket: Option<PathBuf>,

    /// vhost-user socket path to create and listen on
    ///
    /// Without --socket-path and --fd, a socket handed over by systemd socket activation
    /// (LISTEN_PID/LISTEN_FDS) is used.
    #[arg(long = "socket-path", value_name = "PATH", conflicts_with = "fd")]
    pub socket_path: Option<PathBuf>,

    /// Group (name or number) that owns the socket; the socket is then mode 0770 instead of
    /// 0700
    #[arg(long = "socket-group", value_name = "GROUP", conflicts_with = "fd")]
    pub socket_group: Option<String>,

    /// File descriptor of an already-listening (not yet connected) vhost-user socket
    #[arg(long = "fd", value_name = "FD", value_parser = number::<i32>)]
    pub fd: Option<i32>,

    /// Threads per daemon that serve requests (at most 1024); 0 serves each queue on its own
    /// thread only
    #[arg(
        long = "thread-pool-size",
        value_name = "N",
        default_value_t = 0,
        value_parser = pool_size
    )]
    pub thread_pool_size: usize,

    /// Enable extended attributes
    #[arg(long = "xattr")]
    pub xattr: bool,

    /// POSIX ACL support (never, auto, always; alone: always); implies --xattr
    ///
    /// With ACLs the guest enforces them and the guest's umask applies only where the parent
    /// directory has no default ACL. "auto" goes on without ACLs when the guest kernel lacks
    /// support, "always" then refuses the session. Cannot be combined with --translate-uid or
    /// --translate-gid. Off by default.
    #[arg(
        long = "posix-acl",
        value_name = "never|auto|always",
        require_equals = true,
        num_args = 0..=1,
        default_value = "never",
        default_missing_value = "always",
        hide_possible_values = true
    )]
    pub posix_acl: NegotiateArg,

    /// Rules translating extended attribute names between guest and host, e.g.
    /// :map::user.virtiofs.: (see doc/configuration.md); implies --xattr
    #[arg(long = "xattrmap", value_name = "RULES")]
    pub xattrmap: Option<String>,

    /// Sandbox mechanism confining the daemon to the shared directory: namespace, chroot or
    /// none
    ///
    /// "namespace" serves from new mount, pid and network namespaces whose root is the shared
    /// directory (with a user namespace when not run as root); "chroot" only changes the root
    /// directory (needs root; for hosts without namespaces); "none" does not confine.
    #[arg(
        long = "sandbox",
        value_name = "KIND",
        default_value = "namespace",
        hide_possible_values = true
    )]
    pub sandbox: SandboxMode,

    /// Share the directory read-only
    #[arg(long = "readonly")]
    pub readonly: bool,

    /// Action on a system call outside the daemon's seccomp list: kill (the process), log
    /// (allow and have the kernel log it), trap (SIGSYS: log the call, then die), or none (no
    /// filter)
    #[arg(
        long = "seccomp",
        value_name = "ACTION",
        default_value = "kill",
        hide_possible_values = true
    )]
    pub seccomp: seccomp::Action,

    /// Tell the guest which directories are mount points, so that each host filesystem under
    /// the share gets its own device number in the guest [default]
    #[arg(long = "announce-submounts")]
    pub announce_submounts: bool,

    /// Do not tell the guest which directories are mount points
    #[arg(long = "no-announce-submounts", overrides_with = "announce_submounts")]
    pub no_announce_submounts: bool,

    /// When to reference inodes by file handle instead of a kept O_PATH file descriptor
    /// (never, prefer, mandatory)
    ///
    /// Inodes the guest only looks up or stats hold no file descriptor in any mode. "never"
    /// (the default): an inode keeps the O_PATH descriptor opened for it the first time an
    /// operation needs one. "prefer": inodes other than directories keep a
    /// file handle instead and open a descriptor only for the operation; files on file systems
    /// without handles keep descriptors, and so does every inode when the daemon may not open
    /// handles (CAP_DAC_READ_SEARCH). "mandatory": as "prefer", but a lookup fails when no
    /// handle can be had, and the daemon refuses to start when it cannot open handles. "prefer"
    /// and "mandatory" keep CAP_DAC_READ_SEARCH, with which open_by_handle_at(2) can open any
    /// file of the shared directory's file system, also outside the share: a daemon the guest
    /// took over could read it; that is why the default is "never", where the reference 1.14's
    /// is "prefer" (run as root, it references every inode by file handle). ("fallback" is a
    /// deprecated alias for "prefer".)
    #[arg(
        long = "inode-file-handles",
        value_name = "MODE",
        require_equals = true,
        default_value = "never",
        hide_possible_values = true
    )]
    pub inode_file_handles: InodeFileHandlesArg,

    /// Caching policy the guest may use: never, metadata, auto or always
    #[arg(
        long = "cache",
        value_name = "MODE",
        default_value = "auto",
        hide_possible_values = true
    )]
    pub cache: CachePolicy,

    /// With --cache=never or --cache=metadata, let the guest mmap shared files; only safe when
    /// nothing else changes the shared directory
    #[arg(long = "allow-mmap")]
    pub allow_mmap: bool,

    /// Disable READDIRPLUS (the guest then looks up entries one by one)
    #[arg(long = "no-readdirplus")]
    pub no_readdirplus: bool,

    /// Enable the guest's writeback cache
    #[arg(long = "writeback")]
    pub writeback: bool,

    /// Honour O_DIRECT from the guest (by default it is dropped from host opens)
    #[arg(long = "allow-direct-io")]
    pub allow_direct_io: bool,

    /// Print the vhost-user backend capabilities (JSON) and exit
    #[arg(long = "print-capabilities")]
    pub print_capabilities: bool,

    /// Change the capabilities the daemon keeps, e.g. +sys_admin:-mknod
    ///
    /// CAPS is a ':'-separated list of +NAME (keep) or -NAME (drop), NAME a capability
    /// without "cap_" in any case. Run as root, the daemon keeps chown, dac_override, fowner,
    /// fsetid, setgid, setuid, mknod and setfcap (and dac_read_search with
    /// --inode-file-handles=prefer or mandatory); otherwise none.
    #[arg(long = "modcaps", value_name = "CAPS")]
    pub modcaps: Option<String>,

    /// Log level: error, warn, info, debug, trace or off (RUST_LOG, when set, refines it)
    #[arg(
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info",
        hide_possible_values = true
    )]
    pub log_level: LogLevel,

    /// Log to syslog instead of stderr
    #[arg(long = "syslog")]
    pub syslog: bool,

    /// Limit of open file descriptors; 0 leaves the limit unchanged [default: min(1000000,
    /// /proc/sys/fs/nr_open), or the hard limit when it cannot be raised]
    #[arg(long = "rlimit-nofile", value_name = "N", value_parser = number::<u64>)]
    pub rlimit_nofile: Option<u64>,

    /// Host files the guest may hold at once (nodes it looked up and has not forgotten); past
    /// it a new one is refused with ENFILE [default: one per 2 KiB of the host's memory, from
    /// 65536 to 16777216]
    #[arg(long = "max-nodes", value_name = "N", value_parser = max_nodes)]
    pub max_nodes: Option<usize>,

    /// With --cache=always, where the guest reads and writes files it never opened, descriptors
    /// kept for them; past it the least recently used is closed (and reopened at its next use).
    /// Never more than half the open-files limit [default: 1024]
    #[arg(long = "max-data-fds", value_name = "N", value_parser = max_data_fds)]
    pub max_data_fds: Option<usize>,

    /// After serving a queue, keep looking for the guest's next request for up to USEC
    /// microseconds before sleeping, the guest told not to notify meanwhile; the window tunes
    /// itself to the gaps between requests, and an idle guest costs nothing. 0 never polls
    /// [default: 0]
    #[arg(long = "poll-window", value_name = "USEC", value_parser = poll_window)]
    pub poll_window: Option<u64>,

    /// Comma-separated options in the legacy format, e.g. -o source=DIR,cache=none
    /// [deprecated]
    #[arg(short = 'o', value_name = "OPTIONS", action = clap::ArgAction::Append)]
    pub compat_options: Vec<String>,

    /// Same as --log-level=debug [deprecated]
    #[arg(short = 'd')]
    pub compat_debug: bool,

    /// Do not enable KILLPRIV_V2 [default]
    #[arg(long = "no-killpriv-v2")]
    pub no_killpriv_v2: bool,

    /// Enable KILLPRIV_V2: the daemon clears set-user-id/set-group-id bits on writes,
    /// truncations and ownership changes by guest callers without CAP_FSETID
    #[arg(long = "killpriv-v2", overrides_with = "no_killpriv_v2")]
    pub killpriv_v2: bool,

    /// No effect: the daemon always runs in the foreground [deprecated]
    #[arg(short = 'f')]
    pub compat_foreground: bool,

    /// Security labels (never, auto, always; alone: always); implies --xattr
    ///
    /// The security context (e.g. the SELinux label) the guest kernel sends with each creation
    /// is stored on the new file; a label the host refuses fails the creation.
    #[arg(
        long = "security-label",
        value_name = "never|auto|always",
        require_equals = true,
        num_args = 0..=1,
        default_value = "never",
        default_missing_value = "always",
        hide_possible_values = true
    )]
    pub security_label: NegotiateArg,

    /// Run the daemon in a user namespace mapping this range of uids from the host, given as
    /// :namespace_uid:host_uid:count: (repeat for several ranges)
    #[arg(long = "uid-map", value_name = "MAP", action = clap::ArgAction::Append)]
    pub uid_map: Vec<String>,

    /// Run the daemon in a user namespace mapping this range of gids from the host, given as
    /// :namespace_gid:host_gid:count: (repeat for several ranges)
    #[arg(long = "gid-map", value_name = "MAP", action = clap::ArgAction::Append)]
    pub gid_map: Vec<String>,

    /// Translate uids between guest and host inside the daemon (no user namespace needed);
    /// repeat for several ranges
    ///
    /// RULE is TYPE:SOURCE:TARGET:COUNT, COUNT ids from SOURCE:
    ///
    /// - guest:G:H:N          guest uids G.. become host uids H.. (guest to host only)
    ///
    /// - host:H:G:N           host uids H.. are shown as guest uids G.. (host to guest only)
    ///
    /// - map:G:H:N            both directions: guest G.. is host H..
    ///
    /// - squash-guest:G:H:N   every guest uid G.. becomes host uid H
    ///
    /// - squash-host:H:G:N    every host uid H.. is shown as guest uid G
    ///
    /// - forbid-guest:G:N     creating files as, or chowning files to, guest uids G.. fails
    ///   with EPERM
    ///
    /// Uids no rule covers are passed unchanged. Rules may not overlap in the same direction.
    /// While any translation is active, POSIX ACL attributes are refused (EOPNOTSUPP); cannot
    /// be combined with --posix-acl=auto|always.
    #[arg(
        long = "translate-uid",
        value_name = "RULE",
        action = clap::ArgAction::Append
    )]
    pub translate_uid: Vec<String>,

    /// Translate gids between guest and host inside the daemon; same rules as --translate-uid
    #[arg(long = "translate-gid", value_name = "RULE", action = clap::ArgAction::Append)]
    pub translate_gid: Vec<String>,

    /// Keep O_NOATIME from the guest (by default it is dropped from host opens, as an
    /// unprivileged daemon may not use it on files it does not own)
    #[arg(long = "preserve-noatime")]
    pub preserve_noatime: bool,

    /// How a live migration tells the destination where each file the guest knows is:
    /// find-paths (its path in the shared directory) or file-handles (its file handle; the same
    /// file system on both hosts, and CAP_DAC_READ_SEARCH on the destination)
    #[arg(
        long = "migration-mode",
        value_name = "MODE",
        default_value = "find-paths",
        hide_possible_values = true
    )]
    pub migration_mode: MigrationMode,

    /// What a file the destination cannot find again becomes: abort (the migration fails and the
    /// source goes on) or guest-error (the guest gets an error on that file only)
    #[arg(
        long = "migration-on-error",
        value_name = "ACTION",
        default_value = "abort",
        hide_possible_values = true
    )]
    pub migration_on_error: MigrationOnError,

    /// With find-paths: the destination checks that each path opens the very file the source
    /// had (by file handle; source and destination share one file system)
    #[arg(long = "migration-verify-handles")]
    pub migration_verify_handles: bool,

    /// With find-paths: the source checks each path right before it sends it, and sends where
    /// the file is now when it was renamed on the host
    #[arg(long = "migration-confirm-paths")]
    pub migration_confirm_paths: bool,
}

/// `--cache`: how much the guest may cache (the reference's `CachePolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CachePolicy {
    // "none" is the old C virtiofsd's spelling (`-o cache=none`).
    #[value(alias = "none")]
    Never,
    Metadata,
    Auto,
    Always,
}

impl From<CachePolicy> for CacheMode {
    fn from(c: CachePolicy) -> CacheMode {
        match c {
            CachePolicy::Never => CacheMode::Never,
            CachePolicy::Metadata => CacheMode::Metadata,
            CachePolicy::Auto => CacheMode::Auto,
            CachePolicy::Always => CacheMode::Always,
        }
    }
}

/// `--posix-acl`, `--security-label`: whether to offer a feature the guest kernel must agree to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NegotiateArg {
    Never,
    Auto,
    Always,
}

impl From<NegotiateArg> for Negotiate {
    fn from(n: NegotiateArg) -> Negotiate {
        match n {
            NegotiateArg::Never => Negotiate::Never,
            NegotiateArg::Auto => Negotiate::Auto,
            NegotiateArg::Always => Negotiate::Always,
        }
    }
}

/// `--inode-file-handles`: when inodes are referenced by file handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InodeFileHandlesArg {
    Never,
    Prefer,
    Mandatory,
    // The reference's deprecated name of "prefer": accepted with a warning, not listed.
    #[value(hide = true)]
    Fallback,
}

impl From<InodeFileHandlesArg> for InodeFileHandles {
    fn from(m: InodeFileHandlesArg) -> InodeFileHandles {
        match m {
            InodeFileHandlesArg::Never => InodeFileHandles::Never,
            InodeFileHandlesArg::Prefer | InodeFileHandlesArg::Fallback => InodeFileHandles::Prefer,
            InodeFileHandlesArg::Mandatory => InodeFileHandles::Mandatory,
        }
    }
}

/// `--log-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
    Off,
}

impl From<LogLevel> for log::LevelFilter {
    fn from(l: LogLevel) -> log::LevelFilter {
        match l {
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
            LogLevel::Off => log::LevelFilter::Off,
        }
    }
}

/// `--migration-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MigrationMode {
    FindPaths,
    FileHandles,
}

/// `--migration-on-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MigrationOnError {
    Abort,
    GuestError,
}

/// The name of `v` as its flag spells it.
fn spelled<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_owned())
}

/// Parses the value of a legacy `-o` option (`flag`, e.g. `-o sandbox`) that names one of the
/// choices of `T`; an invalid value is refused naming `what` and the listed choices.
fn legacy_choice<T: ValueEnum>(
    flag: &str,
    what: &'static str,
    value: &str,
) -> Result<T, UsageError> {
    T::from_str(value, false).map_err(|_| {
        let all: Vec<String> = T::value_variants()
            .iter()
            .filter_map(T::to_possible_value)
            .filter(|p| !p.is_hide_set())
            .map(|p| p.get_name().to_owned())
            .collect();
        UsageError::LegacyValue {
            flag: flag.to_owned(),
            what,
            value: value.to_owned(),
            expected: all.join(", "),
        }
    })
}

/// Parses and checks every occurrence of `--uid-map` or `--gid-map` (`flag`).
fn id_maps(flag: &str, specs: &[String]) -> Result<Vec<IdMapRange>, UsageError> {
    let maps = specs
        .iter()
        .map(|s| userns::parse_map(flag, s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(UsageError::IdMap)?;
    userns::check_maps(flag, &maps).map_err(UsageError::IdMap)?;
    Ok(maps)
}

/// A command line refused before the daemon starts: one variant per refusal. Every message
/// starts with the flag (or `-o` option) it is about. The checks of other modules (id maps,
/// translations, capabilities, xattr rules, socket activation) give their message as text that
/// already names the flag. Most are a wrong command line (exit status 2); a few are a well-formed
/// one that names what the host does not have ([`UsageError::exit_code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("--shared-dir: missing; expected --shared-dir=DIR (or -o source=DIR)")]
    MissingSharedDir,
    #[error("--shared-dir: '{}' does not exist; expected --shared-dir=DIR", .0.display())]
    SharedDirMissing(PathBuf),
    #[error("--shared-dir: '{}' is not a directory; expected --shared-dir=DIR", .0.display())]
    NotADirectory(PathBuf),
    #[error("--tag: expected a tag of 1 to 36 bytes")]
    TagLength,
    /// A flag, or a flag's value, this version does not implement; `hint` says what to use.
    #[error("{what}: not implemented yet in this version{hint}")]
    NotImplemented { what: String, hint: &'static str },
    #[error(
        "--socket-group: unknown group '{0}'; expected --socket-group=GROUP with a group name or \
         number"
    )]
    UnknownGroup(String),
    #[error("--fd: invalid file descriptor {0}; expected --fd=N with N >= 0")]
    NegativeFd(RawFd),
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
    #[error(
        "--socket-path: '{}' exists and is {kind}, not a socket; expected the path of a socket \
         to create (only a socket left there is replaced)",
        .path.display()
    )]
    SocketPathNotASocket { path: PathBuf, kind: &'static str },
    #[error("--socket-group: only applies to a socket the daemon creates with --socket-path")]
    SocketGroupWithoutPath,
    /// A bad `--translate-uid`/`--translate-gid` rule.
    #[error("{0}")]
    Translate(String),
    #[error(
        "--posix-acl={0}: cannot be used together with --translate-uid or --translate-gid \
         (translating ids would break POSIX ACLs); use --posix-acl=never"
    )]
    AclWithTranslation(String),
    /// Bad `--xattrmap` rules (`flag` is `--xattrmap` or `-o xattrmap`).
    #[error("{flag}: {message}")]
    Xattrmap { flag: &'static str, message: String },
    /// A bad `--uid-map`/`--gid-map` value or set of values.
    #[error("{0}")]
    IdMap(String),
    /// A bad `--modcaps` (or `-o modcaps`) list.
    #[error("{0}")]
    Modcaps(String),
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
         [no_]killpriv_v2, [no_]posix_acl, [no_]security_label, xattrmap=RULES, no_posix_lock or \
         no_flock"
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
            | UsageError::SocketPathNotASocket { .. } => 1,
            // An empty name is no group name at all.
            UsageError::UnknownGroup(g) if !g.is_empty() => 1,
            _ => 2,
        }
    }
}

/// A whole number (clap's own refusal says only "invalid digit found in string").
fn number<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| "expected a whole number N >= 0".to_owned())
}

/// Most `--thread-pool-size` threads: far more than requests a guest keeps in flight on a
/// fast host, and far fewer than the threads a process may start.
pub const MAX_THREAD_POOL: usize = 1024;

fn pool_size(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n <= MAX_THREAD_POOL => Ok(n),
        _ => Err(format!(
            "expected a whole number from 0 to {MAX_THREAD_POOL}"
        )),
    }
}

/// Longest `--poll-window`: a window is CPU time a queue's thread spends awake.
const MAX_POLL_WINDOW_US: u64 = 10_000;

fn poll_window(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n <= MAX_POLL_WINDOW_US => Ok(n),
        _ => Err(format!(
            "expected microseconds, a whole number from 0 to {MAX_POLL_WINDOW_US}"
        )),
    }
}

fn max_data_fds(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

fn max_nodes(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= 16 => Ok(n),
        _ => Err("expected a whole number of at least 16".into()),
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
        Ok(m) if !m.file_type().is_socket() => Err(UsageError::SocketPathNotASocket {
            path: path.to_path_buf(),
            kind: file_kind(&m.file_type()),
        }),
        _ => Ok(()),
    }
}

/// What a file that is not a socket is, for a message.
pub fn file_kind(t: &std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device node"
    } else {
        "another kind of file"
    }
}

/// The refusal of a flag (or flag value) this version does not implement.
fn not_yet(what: &str, hint: &'static str) -> UsageError {
    UsageError::NotImplemented {
        what: what.to_owned(),
        hint,
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

/// The deprecation warning for flag spellings kept only for old command lines.
fn deprecated(what: &str, instead: &str) -> String {
    format!("warning: {what} is deprecated; {instead}")
}

impl Args {
    /// Applies the legacy `-o a,b=c` options onto the flags. As with the reference, they apply
    /// after the other flags, whatever their order.
    fn apply_compat_options(&mut self) -> Result<(), UsageError> {
        let options: Vec<String> = self
            .compat_options
            .iter()
            .flat_map(|o| o.split(','))
            // A stray comma ("cache=auto,") leaves an empty item: nothing to apply.
            .filter(|o| !o.is_empty())
            .map(str::to_owned)
            .collect();
        for opt in options {
            self.apply_compat_option(&opt)?;
        }
        Ok(())
    }

    fn apply_compat_option(&mut self, opt: &str) -> Result<(), UsageError> {
        let flag = format!("-o {opt}");
        let value_for = |name: &str| format!("-o {name}");
        match opt.split_once('=') {
            Some(("source", dir)) => self.shared_dir = Some(PathBuf::from(dir)),
            Some(("cache", mode)) => {
                self.cache = legacy_choice(&value_for("cache"), "cache mode", mode)?;
            }
            Some(("loglevel" | "log_level", level)) => {
                // "err" is the old C virtiofsd's spelling.
                let level = if level == "err" { "error" } else { level };
                self.log_level = legacy_choice(&value_for("loglevel"), "level", level)?;
            }
            Some(("sandbox", kind)) => {
                self.sandbox = legacy_choice(&value_for("sandbox"), "value", kind)?;
            }
            Some(("xattrmap", rules)) => {
                XattrMap::parse(rules).map_err(|message| UsageError::Xattrmap {
                    flag: "-o xattrmap",
                    message,
                })?;
                self.xattrmap = Some(rules.to_owned());
            }
            Some(("modcaps", caps)) => {
                caps::parse_modcaps(caps).map_err(|e| {
                    UsageError::Modcaps(e.replacen("--modcaps", &value_for("modcaps"), 1))
                })?;
                self.modcaps = Some(caps.to_owned());
            }
            Some(("timeout", _)) => return Err(UsageError::LegacyTimeout(flag)),
            Some(_) => return Err(UsageError::UnknownLegacy(flag)),
            None => match opt {
                "xattr" => self.xattr = true,
                "no_xattr" => self.xattr = false,
                "readdirplus" => self.no_readdirplus = false,
                "no_readdirplus" => self.no_readdirplus = true,
                "writeback" => self.writeback = true,
                "no_writeback" => self.writeback = false,
                "allow_direct_io" => self.allow_direct_io = true,
                "no_allow_direct_io" => self.allow_direct_io = false,
                "killpriv_v2" => {
                    self.killpriv_v2 = true;
                    self.no_killpriv_v2 = false;
                }
                "no_killpriv_v2" => self.killpriv_v2 = false,
                "posix_acl" => self.posix_acl = NegotiateArg::Always,
                "no_posix_acl" => self.posix_acl = NegotiateArg::Never,
                "security_label" => self.security_label = NegotiateArg::Always,
                "no_security_label" => self.security_label = NegotiateArg::Never,
                // No locks are offered to the guest: these ask for what already happens.
                "no_posix_lock" | "no_flock" => {}
                "announce_submounts" => {
                    self.announce_submounts = true;
                    self.no_announce_submounts = false;
                }
                "posix_lock" | "flock" => return Err(not_yet(&flag, "")),
                "norace" => return Err(UsageError::LegacyUnsupported(flag)),
                _ => return Err(UsageError::UnknownLegacy(flag)),
            },
        }
        Ok(())
    }

    /// Checks the command line. `activated` is asked for a socket passed by systemd socket
    /// activation when the command line names none (see [`crate::activation`]).
    pub fn into_command(
        mut self,
        activated: impl FnOnce() -> Result<Option<RawFd>, String>,
    ) -> Result<Command, UsageError> {
        let mut warnings = Vec::new();
        if !self.compat_options.is_empty() {
            warnings.push(deprecated(
                "-o",
                "give the options as flags (e.g. --cache=auto instead of -o cache=auto)",
            ));
        }
        self.apply_compat_options()?;
        if self.print_capabilities {
            return Ok(Command::PrintCapabilities);
        }
        if self.compat_debug {
            warnings.push(deprecated("-d", "use --log-level=debug"));
            self.log_level = LogLevel::Debug;
        }
        if self.compat_foreground {
            warnings.push(deprecated(
                "-f",
                "it has no effect (the daemon always runs in the foreground); remove it",
            ));
        }
        if self.socket.is_some() {
            warnings.push(deprecated("--socket", "use --socket-path"));
        }
        let level = log::LevelFilter::from(self.log_level);

        let shared_dir = self.shared_dir.take().ok_or(UsageError::MissingSharedDir)?;
        if !shared_dir.exists() {
            return Err(UsageError::SharedDirMissing(shared_dir));
        }
        if !shared_dir.is_dir() {
            return Err(UsageError::NotADirectory(shared_dir));
        }
        let cache = CacheMode::from(self.cache);
        if let Some(tag) = &self.tag {
            if tag.is_empty() || tag.len() > 36 {
                return Err(UsageError::TagLength);
            }
        }
        let migration = self.migration_options()?;
        let sandbox = self.sandbox;
        let modcaps = self
            .modcaps
            .as_deref()
            .map(caps::parse_modcaps)
            .transpose()
            .map_err(UsageError::Modcaps)?
            .unwrap_or_default();
        let seccomp = self.seccomp;

        let socket_group = self.socket_group.as_deref().map(group_id).transpose()?;
        let socket = match (self.socket_path.take().or(self.socket.take()), self.fd) {
            (Some(p), None) => SocketSpec::Path(p),
            (None, Some(fd)) if fd >= 0 => SocketSpec::Fd(fd),
            (None, Some(fd)) => return Err(UsageError::NegativeFd(fd)),
            (Some(_), Some(_)) => return Err(UsageError::FdAndSocketPath),
            (None, None) => match activated().map_err(UsageError::Activation)? {
                Some(fd) => SocketSpec::Fd(fd),
                None => return Err(UsageError::MissingSocket),
            },
        };
        if let SocketSpec::Path(p) = &socket {
            check_socket_path(p)?;
        }
        if socket_group.is_some() && !matches!(socket, SocketSpec::Path(_)) {
            return Err(UsageError::SocketGroupWithoutPath);
        }

        let translate = Translation::parse(&self.translate_uid, &self.translate_gid)
            .map_err(UsageError::Translate)?;
        let posix_acl = Negotiate::from(self.posix_acl);
        let security_label = Negotiate::from(self.security_label);
        if posix_acl != Negotiate::Never && !translate.is_empty() {
            // An ACL stores raw ids, which the translation cannot reach.
            return Err(UsageError::AclWithTranslation(spelled(&self.posix_acl)));
        }
        let xattrmap = self
            .xattrmap
            .as_deref()
            .map(XattrMap::parse)
            .transpose()
            .map_err(|message| UsageError::Xattrmap {
                flag: "--xattrmap",
                message,
            })?;
        let uid_map = id_maps("--uid-map", &self.uid_map)?;
        let gid_map = id_maps("--gid-map", &self.gid_map)?;
        let mut fs = Config::new(shared_dir, cache);
        // Each of these needs extended attributes, and turns them on (as the reference does).
        fs.xattr = self.xattr
            || xattrmap.is_some()
            || posix_acl != Negotiate::Never
            || security_label != Negotiate::Never;
        fs.xattrmap = xattrmap;
        fs.posix_acl = posix_acl;
        fs.security_label = security_label;
        fs.killpriv_v2 = self.killpriv_v2 && !self.no_killpriv_v2;
        fs.readonly = self.readonly;
        fs.readdirplus = !self.no_readdirplus;
        if let Some(n) = self.max_nodes {
            fs.max_nodes = n;
        }
        if let Some(n) = self.max_data_fds {
            fs.max_data_fds = n;
        }
        fs.writeback = self.writeback;
        // On unless turned off (clap keeps only the last of the pair).
        fs.announce_submounts = !self.no_announce_submounts;
        fs.allow_direct_io = self.allow_direct_io;
        fs.allow_mmap = self.allow_mmap;
        fs.preserve_noatime = self.preserve_noatime;
        fs.inode_file_handles = self.inode_file_handles.into();
        fs.migration = migration;
        if self.inode_file_handles == InodeFileHandlesArg::Fallback {
            warnings.push(deprecated(
                "--inode-file-handles=fallback",
                "use --inode-file-handles=prefer",
            ));
        }
        Ok(Command::Run(Box::new(Settings {
            daemon: DaemonConfig {
                fs,
                socket,
                tag: self.tag,
                thread_pool_size: self.thread_pool_size,
                poll_window: std::time::Duration::from_micros(self.poll_window.unwrap_or(0)),
                translate,
                uid_map,
                gid_map,
            },
            process: ProcessOptions {
                socket_group,
                rlimit_nofile: self.rlimit_nofile,
                sandbox,
                modcaps,
                seccomp,
            },
            log: LogSettings {
                level,
                syslog: self.syslog,
            },
            warnings,
        })))
    }
}

impl Args {
    /// The `--migration-*` flags; the checks of a path only go with paths.
    fn migration_options(&self) -> Result<migration::Options, UsageError> {
        let mode = match self.migration_mode {
            MigrationMode::FindPaths => migration::Mode::FindPaths,
            MigrationMode::FileHandles => migration::Mode::FileHandles,
        };
        if mode == migration::Mode::FileHandles {
            if self.migration_verify_handles {
                return Err(UsageError::MigrationPathsOnly("--migration-verify-handles"));
            }
            if self.migration_confirm_paths {
                return Err(UsageError::MigrationPathsOnly("--migration-confirm-paths"));
            }
        }
        Ok(migration::Options {
            mode,
            on_error: match self.migration_on_error {
                MigrationOnError::Abort => migration::OnError::Abort,
                MigrationOnError::GuestError => migration::OnError::GuestError,
            },
            verify_handles: self.migration_verify_handles,
            confirm_paths: self.migration_confirm_paths,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_with(args: &[&str], activated: Option<RawFd>) -> Result<Box<Settings>, UsageError> {
        let mut v = vec!["virtiofsd"];
        v.extend_from_slice(args);
        match Args::try_parse_from(v)
            .expect("clap accepts")
            .into_command(|| Ok(activated))?
        {
            Command::Run(s) => Ok(s),
            Command::PrintCapabilities => panic!("not a run"),
        }
    }

    fn settings(args: &[&str]) -> Result<Box<Settings>, UsageError> {
        settings_with(args, None)
    }

    fn parse(args: &[&str]) -> Result<DaemonConfig, UsageError> {
        settings(args).map(|s| s.daemon)
    }

    /// What clap says when it refuses `args` (after a shared directory and a socket path);
    /// checks that it exits with status 2.
    fn refused_by_clap(args: &[&str]) -> String {
        let mut v = vec!["virtiofsd", "--shared-dir=/tmp", "--socket-path=/s"];
        v.extend_from_slice(args);
        let e = Args::try_parse_from(v).expect_err("clap refuses");
        assert_eq!(e.exit_code(), 2, "{e}");
        e.to_string()
    }

    #[test]
    fn minimal_command_line_gives_auto_cache_and_socket_path() {
        let s = settings(&["--shared-dir=/tmp", "--socket-path=/tmp/s"]).unwrap();
        let c = &s.daemon;
        assert_eq!(c.socket, SocketSpec::Path("/tmp/s".into()));
        assert_eq!(c.fs.cache, CacheMode::Auto);
        assert!(!c.fs.readonly && !c.fs.xattr && c.fs.readdirplus);
        assert!(!c.fs.allow_direct_io && !c.fs.allow_mmap && !c.fs.preserve_noatime);
        assert_eq!(s.process.rlimit_nofile, None);
        assert_eq!(s.process.socket_group, None);
        assert_eq!(s.log.level, log::LevelFilter::Info);
        assert!(!s.log.syslog);
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn missing_socket_is_refused_naming_the_flag() {
        let e = parse(&["--shared-dir=/tmp"]).unwrap_err();
        assert!(e.to_string().contains("--socket-path"), "{e}");
    }

    #[test]
    fn an_activated_socket_is_used_only_without_a_socket_flag() {
        let s = settings_with(&["--shared-dir=/tmp"], Some(3)).unwrap();
        assert_eq!(s.daemon.socket, SocketSpec::Fd(3));
        let s = settings_with(&["--shared-dir=/tmp", "--socket-path=/s"], Some(3)).unwrap();
        assert_eq!(s.daemon.socket, SocketSpec::Path("/s".into()));
        let e = settings_with(&["--shared-dir=/tmp", "--socket-group=0"], Some(3)).unwrap_err();
        assert!(e.to_string().starts_with("--socket-group:"), "{e}");
    }

    #[test]
    fn deprecated_socket_alias_works_and_warns() {
        let s = settings(&["--shared-dir=/tmp", "--socket=/tmp/s"]).unwrap();
        assert_eq!(s.daemon.socket, SocketSpec::Path("/tmp/s".into()));
        assert!(s.warnings[0].contains("--socket"), "{:?}", s.warnings);
        // --socket-path wins when both are given.
        let s = settings(&["--shared-dir=/tmp", "--socket=/a", "--socket-path=/b"]).unwrap();
        assert_eq!(s.daemon.socket, SocketSpec::Path("/b".into()));
    }

    #[test]
    fn bad_cache_mode_is_refused_naming_the_choices() {
        let e = refused_by_clap(&["--cache=sometimes"]);
        assert!(e.contains("'sometimes'") && e.contains("--cache"), "{e}");
        assert!(e.contains("never, metadata, auto, always"), "{e}");
        // The old C daemon's spelling is still accepted.
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--cache=none"]).unwrap();
        assert_eq!(c.fs.cache, CacheMode::Never);
    }

    #[test]
    fn shared_dir_must_exist() {
        let e = parse(&["--shared-dir=/nonexistent/dir", "--socket-path=/s"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--shared-dir: '/nonexistent/dir' does not exist; expected --shared-dir=DIR"
        );
    }

    #[test]
    fn shared_dir_must_be_a_directory() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let arg = format!("--shared-dir={}", f.path().display());
        let e = parse(&[arg.as_str(), "--socket-path=/s"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "--shared-dir: '{}' is not a directory; expected --shared-dir=DIR",
                f.path().display()
            )
        );
    }

    #[test]
    fn migration_flags_reach_the_filesystem_config() {
        let m = |v: &[&str]| {
            let mut a = vec!["--shared-dir=/tmp", "--socket-path=/s"];
            a.extend_from_slice(v);
            settings(&a).map(|s| s.daemon.fs.migration)
        };
        assert_eq!(m(&[]).unwrap(), migration::Options::default());
        let kubevirt = m(&[
            "--migration-mode=find-paths",
            "--migration-on-error=guest-error",
        ]);
        assert_eq!(
            kubevirt.unwrap(),
            migration::Options {
                on_error: migration::OnError::GuestError,
                ..Default::default()
            }
        );
        let checked = m(&["--migration-verify-handles", "--migration-confirm-paths"]).unwrap();
        assert!(checked.verify_handles && checked.confirm_paths);
        assert_eq!(
            m(&["--migration-mode=file-handles"]).unwrap().mode,
            migration::Mode::FileHandles
        );
        for flag in ["--migration-verify-handles", "--migration-confirm-paths"] {
            let e = parse(&[
                "--shared-dir=/tmp",
                "--socket-path=/s",
                "--migration-mode=file-handles",
                flag,
            ])
            .unwrap_err();
            assert!(e.to_string().starts_with(flag), "{e}");
            assert!(e.to_string().contains("find-paths"), "{e}");
        }
    }

    #[test]
    fn sandbox_defaults_to_namespace_and_modcaps_reach_the_process_options() {
        let s = settings(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        assert_eq!(s.process.sandbox, SandboxMode::Namespace);
        assert_eq!(s.process.modcaps, caps::ModCaps::default());
        for (kind, mode) in [
            ("namespace", SandboxMode::Namespace),
            ("chroot", SandboxMode::Chroot),
            ("none", SandboxMode::None),
        ] {
            let s = settings(&[
                "--shared-dir=/tmp",
                "--socket-path=/s",
                &format!("--sandbox={kind}"),
            ])
            .unwrap();
            assert_eq!(s.process.sandbox, mode);
            let s = settings(&[
                "--shared-dir=/tmp",
                "--socket-path=/s",
                "-o",
                &format!("sandbox={kind}"),
            ])
            .unwrap();
            assert_eq!(s.process.sandbox, mode);
        }
        let s = settings(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--modcaps=+SYS_ADMIN:-mknod",
        ])
        .unwrap();
        assert_eq!(
            s.process.modcaps,
            caps::ModCaps(vec![(true, caps::CAP_SYS_ADMIN), (false, caps::CAP_MKNOD)])
        );
        let s = settings(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "-o",
            "modcaps=-chown",
        ])
        .unwrap();
        assert_eq!(
            s.process.modcaps,
            caps::ModCaps(vec![(false, caps::CAP_CHOWN)])
        );
    }

    #[test]
    fn bad_modcaps_are_refused_naming_the_flag() {
        for bad in ["+nonsense", "sys_admin", "", "+chown:"] {
            let e = parse(&[
                "--shared-dir=/tmp",
                "--socket-path=/s",
                &format!("--modcaps={bad}"),
            ])
            .unwrap_err();
            assert!(e.to_string().starts_with("--modcaps: "), "{bad}: {e}");
        }
    }

    #[test]
    fn announce_submounts_reaches_the_filesystem_config_and_the_last_of_a_pair_wins() {
        let on = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--announce-submounts",
        ]);
        assert!(on.unwrap().fs.announce_submounts);
        let legacy = parse(&["--socket-path=/s", "-o", "source=/tmp,announce_submounts"]);
        assert!(legacy.unwrap().fs.announce_submounts);
        let off = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--announce-submounts",
            "--no-announce-submounts",
        ]);
        assert!(!off.unwrap().fs.announce_submounts);
        let default = parse(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        assert!(
            default.fs.announce_submounts,
            "on by default, as in the reference"
        );
        let on_again = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--no-announce-submounts",
            "--announce-submounts",
        ]);
        assert!(on_again.unwrap().fs.announce_submounts);
    }

    #[test]
    fn inode_file_handles_reach_the_filesystem_config() {
        use crate::passthrough::InodeFileHandles;
        let mode = |extra: &[&str]| {
            let mut v = vec!["--shared-dir=/tmp", "--socket-path=/s"];
            v.extend_from_slice(extra);
            settings(&v).map(|s| (s.daemon.fs.inode_file_handles, s.warnings))
        };
        // The reference's default: no file handles, so no CAP_DAC_READ_SEARCH.
        assert_eq!(mode(&[]).unwrap(), (InodeFileHandles::Never, vec![]));
        for (arg, want) in [
            ("--inode-file-handles=never", InodeFileHandles::Never),
            ("--inode-file-handles=prefer", InodeFileHandles::Prefer),
            (
                "--inode-file-handles=mandatory",
                InodeFileHandles::Mandatory,
            ),
        ] {
            assert_eq!(mode(&[arg]).unwrap(), (want, vec![]), "{arg}");
        }
        let (m, warnings) = mode(&["--inode-file-handles=fallback"]).unwrap();
        assert_eq!(m, InodeFileHandles::Prefer);
        assert!(
            warnings[0].contains("--inode-file-handles=prefer"),
            "{warnings:?}"
        );
        let e = refused_by_clap(&["--inode-file-handles=always"]);
        assert!(
            e.contains("'always'") && e.contains("--inode-file-handles"),
            "{e}"
        );
        assert!(
            e.contains("never, prefer, mandatory") && !e.contains("fallback"),
            "{e}"
        );
    }

    #[test]
    fn seccomp_defaults_to_kill_and_takes_each_action() {
        let s = settings(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        assert_eq!(s.process.seccomp, seccomp::Action::Kill);
        for (flag, action) in [
            ("--seccomp=kill", seccomp::Action::Kill),
            ("--seccomp=log", seccomp::Action::Log),
            ("--seccomp=trap", seccomp::Action::Trap),
            ("--seccomp=none", seccomp::Action::None),
        ] {
            let s = settings(&["--shared-dir=/tmp", "--socket-path=/s", flag]).unwrap();
            assert_eq!(s.process.seccomp, action, "{flag}");
        }
        let e = refused_by_clap(&["--seccomp=maybe"]);
        assert!(e.contains("'maybe'") && e.contains("--seccomp"), "{e}");
        assert!(e.contains("kill, log, trap, none"), "{e}");
    }

    #[test]
    fn defaults_of_refused_flags_are_accepted() {
        parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--sandbox=none",
            "--seccomp=none",
            "--inode-file-handles=never",
            "--posix-acl=never",
            "--security-label=never",
            "--no-announce-submounts",
            "--no-killpriv-v2",
            "--migration-mode=find-paths",
            "--migration-on-error=abort",
        ])
        .unwrap();
        // The last of a pair wins.
        parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--announce-submounts",
            "--no-announce-submounts",
            "--killpriv-v2",
            "--no-killpriv-v2",
        ])
        .unwrap();
    }

    #[test]
    fn invalid_values_of_refused_flags_are_invalid_not_unimplemented() {
        let e = refused_by_clap(&["--sandbox=jail"]);
        assert!(e.contains("'jail'") && e.contains("--sandbox"), "{e}");
        assert!(e.contains("namespace, chroot, none"), "{e}");
        for (flag, value) in [
            ("--migration-mode", "teleport"),
            ("--migration-on-error", "shrug"),
        ] {
            let e = refused_by_clap(&[&format!("{flag}={value}")]);
            assert!(e.contains(flag) && !e.contains("not implemented"), "{e}");
        }
    }

    #[test]
    fn flags_map_to_the_filesystem_config() {
        let s = settings(&[
            "--shared-dir=/tmp",
            "--fd=3",
            "--cache=always",
            "--xattr",
            "--readonly",
            "--no-readdirplus",
            "--thread-pool-size=4",
            "--allow-direct-io",
            "--allow-mmap",
            "--preserve-noatime",
            "--rlimit-nofile=5000",
            "--syslog",
            "--log-level=warn",
        ])
        .unwrap();
        let c = &s.daemon;
        assert_eq!(c.socket, SocketSpec::Fd(3));
        assert_eq!(c.fs.cache, CacheMode::Always);
        assert!(c.fs.xattr && c.fs.readonly && !c.fs.readdirplus);
        assert!(c.fs.allow_direct_io && c.fs.allow_mmap && c.fs.preserve_noatime);
        assert_eq!(c.thread_pool_size, 4);
        assert_eq!(s.process.rlimit_nofile, Some(5000));
        assert!(s.log.syslog);
        assert_eq!(s.log.level, log::LevelFilter::Warn);
    }

    #[test]
    fn repeated_flags_take_the_last_value() {
        let c = parse(&[
            "--shared-dir=/nonexistent",
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--cache=never",
            "--cache=metadata",
        ])
        .unwrap();
        assert_eq!(c.fs.cache, CacheMode::Metadata);
        assert_eq!(c.fs.root_dir, PathBuf::from("/tmp"));
    }

    #[test]
    fn socket_group_takes_a_name_or_a_number() {
        let s = settings(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--socket-group=root",
        ])
        .unwrap();
        assert_eq!(s.process.socket_group, Some(0));
        let s = settings(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--socket-group=4242",
        ])
        .unwrap();
        assert_eq!(s.process.socket_group, Some(4242));
        let e = settings(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--socket-group=no-such-group-here",
        ])
        .unwrap_err();
        assert!(
            e.to_string().starts_with("--socket-group: unknown group"),
            "{e}"
        );
    }

    #[test]
    fn legacy_options_map_to_the_flags() {
        let s = settings(&[
            "--socket-path=/s",
            "-o",
            "source=/tmp,cache=none,xattr,writeback,no_readdirplus",
            "-o",
            "loglevel=debug,allow_direct_io,no_flock,no_posix_lock,no_killpriv_v2,sandbox=none",
        ])
        .unwrap();
        let c = &s.daemon;
        assert_eq!(c.fs.root_dir, PathBuf::from("/tmp"));
        assert_eq!(c.fs.cache, CacheMode::Never);
        assert!(c.fs.xattr && c.fs.writeback && !c.fs.readdirplus && c.fs.allow_direct_io);
        assert_eq!(s.log.level, log::LevelFilter::Debug);
        assert!(
            s.warnings.iter().any(|w| w.contains("-o")),
            "{:?}",
            s.warnings
        );
        // -o applies after the flags, and the no_ forms undo them.
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "-o",
            "no_xattr,readdirplus,no_writeback,log_level=err,cache=metadata",
            "--xattr",
            "--no-readdirplus",
            "--writeback",
        ])
        .unwrap();
        assert!(!c.fs.xattr && c.fs.readdirplus && !c.fs.writeback);
        assert_eq!(c.fs.cache, CacheMode::Metadata);
    }

    #[test]
    fn unsupported_legacy_options_are_refused_naming_them() {
        for (opt, says) in [
            ("flock", "not implemented yet"),
            ("posix_lock", "not implemented yet"),
            ("xattrmap=:map::a.", "incomplete"),
            ("sandbox=jail", "invalid value 'jail'"),
            ("modcaps=+nonsense", "unknown capability 'nonsense'"),
            ("timeout=5", "not supported"),
            ("norace", "not supported"),
            ("bogus", "unknown legacy option"),
            ("cache=sometimes", "invalid cache mode"),
            ("loglevel=loud", "invalid level"),
        ] {
            let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "-o", opt]).unwrap_err();
            let key = opt.split('=').next().unwrap();
            assert!(
                e.to_string().starts_with(&format!("-o {key}")),
                "{opt}: {e}"
            );
            assert!(e.to_string().contains(says), "{opt}: {e}");
        }
    }

    #[test]
    fn xattr_features_reach_the_config_and_imply_xattr() {
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        assert!(c.fs.xattrmap.is_none() && !c.fs.killpriv_v2);
        assert_eq!(c.fs.posix_acl, Negotiate::Never);
        assert_eq!(c.fs.security_label, Negotiate::Never);
        for (flag, check) in [
            (
                "--posix-acl",
                (|c: &Config| c.posix_acl == Negotiate::Always) as fn(&Config) -> bool,
            ),
            ("--posix-acl=auto", |c| c.posix_acl == Negotiate::Auto),
            ("--security-label", |c| {
                c.security_label == Negotiate::Always
            }),
            ("--security-label=auto", |c| {
                c.security_label == Negotiate::Auto
            }),
            ("--xattrmap=:map::user.virtiofs.:", |c| c.xattrmap.is_some()),
        ] {
            let c = parse(&["--shared-dir=/tmp", "--socket-path=/s", flag]).unwrap();
            assert!(check(&c.fs), "{flag}");
            assert!(c.fs.xattr, "{flag} implies --xattr");
        }
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--killpriv-v2"]).unwrap();
        assert!(c.fs.killpriv_v2 && !c.fs.xattr);
        let legacy = "source=/tmp,killpriv_v2,posix_acl,security_label,xattrmap=/ok/all///";
        let c = parse(&["--socket-path=/s", "-o", legacy]).unwrap();
        assert!(c.fs.killpriv_v2 && c.fs.xattr && c.fs.xattrmap.is_some());
        assert_eq!(c.fs.posix_acl, Negotiate::Always);
        assert_eq!(c.fs.security_label, Negotiate::Always);
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "-o",
            "no_killpriv_v2",
        ]);
        assert!(!c.unwrap().fs.killpriv_v2);
    }

    #[test]
    fn bad_xattrmap_and_acl_with_translation_are_refused_naming_the_flag() {
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--xattrmap=:frob:all:::",
        ]);
        let e = e.unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--xattrmap: rule 1: unknown type 'frob'"),
            "{e}"
        );
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--xattrmap="]).unwrap_err();
        assert!(e.to_string().starts_with("--xattrmap: no rules"), "{e}");
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--posix-acl=auto",
            "--translate-uid=map:0:1000:10",
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--posix-acl=auto: cannot be used together"),
            "{e}"
        );
        // Never is fine with a translation.
        parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--posix-acl=never",
            "--translate-gid=map:0:1000:10",
        ])
        .unwrap();
    }

    #[test]
    fn compat_debug_and_foreground_warn() {
        let s = settings(&["--shared-dir=/tmp", "--socket-path=/s", "-d", "-f"]).unwrap();
        assert_eq!(s.log.level, log::LevelFilter::Debug);
        assert!(s.warnings.iter().any(|w| w.contains("-d")));
        assert!(s.warnings.iter().any(|w| w.contains("-f")));
    }

    #[test]
    fn print_capabilities_needs_nothing_else() {
        let args = Args::try_parse_from(["virtiofsd", "--print-capabilities"]).unwrap();
        assert!(matches!(
            args.into_command(|| panic!("not consulted")),
            Ok(Command::PrintCapabilities)
        ));
        assert!(CAPABILITIES.contains("\"separate-options\""));
        assert!(CAPABILITIES.contains("\"migrate-precopy\""));
    }

    #[test]
    fn translate_flags_repeat_and_reach_the_config() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--translate-uid=map:0:100000:65536",
            "--translate-uid",
            "forbid-guest:70000:10",
            "--translate-gid=squash-host:0:100:1000",
        ])
        .unwrap();
        assert_eq!(c.translate.uid.to_host(5), Ok(100005));
        assert!(c.translate.uid.to_host(70009).is_err());
        assert_eq!(c.translate.gid.to_guest(999), 100);
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        assert!(c.translate.is_empty());
    }

    #[test]
    fn bad_translate_rules_are_refused_naming_the_flag_and_the_form() {
        for (args, flag) in [
            (&["--translate-uid=map:0:1000"][..], "--translate-uid"),
            (&["--translate-gid=guest:0:1000:x"][..], "--translate-gid"),
            (
                &["--translate-gid=guest:4294967290:0:10"][..],
                "--translate-gid",
            ),
            (
                &[
                    "--translate-uid=guest:0:1000:10",
                    "--translate-uid=map:9:0:1",
                ][..],
                "--translate-uid",
            ),
        ] {
            let mut v = vec!["--shared-dir=/tmp", "--socket-path=/s"];
            v.extend_from_slice(args);
            let e = parse(&v).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("{flag}: invalid rule '")),
                "{e}"
            );
            assert!(
                e.to_string()
                    .contains("<type>:<source base>:<target base>:<count>"),
                "{e}"
            );
        }
    }

    #[test]
    fn id_maps_repeat_and_reach_the_config() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--uid-map=:0:100000:65536:",
            "--gid-map=:0:100000:1000:",
            "--gid-map=:1000:200000:10:",
        ])
        .unwrap();
        assert_eq!(c.uid_map.len(), 1);
        assert_eq!(c.gid_map.len(), 2);
        assert_eq!(c.uid_map[0].host_id, 100000);
    }

    #[test]
    fn malformed_id_map_is_refused_naming_the_flag() {
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--uid-map=0:1:2"]).unwrap_err();
        assert!(e.to_string().starts_with("--uid-map:"), "{e}");
    }

    #[test]
    fn log_level_refusal_names_the_flag_and_the_levels() {
        let e = refused_by_clap(&["--log-level=loud"]);
        assert!(e.contains("'loud'") && e.contains("--log-level"), "{e}");
        assert!(e.contains("error, warn, info, debug, trace, off"), "{e}");
        let s = settings(&["--shared-dir=/tmp", "--socket-path=/s", "--log-level=trace"]);
        assert_eq!(s.unwrap().log.level, log::LevelFilter::Trace);
    }
}
