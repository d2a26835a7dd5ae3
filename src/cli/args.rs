//! The flags, as clap parses them, and the parsers of their values. A value is parsed into the
//! type the daemon uses (an enum deriving `clap::ValueEnum`, or a type implementing `FromStr`
//! with a typed error), so that clap refuses a malformed one naming the flag.

use std::ffi::OsStr;
use std::path::PathBuf;

use clap::builder::{EnumValueParser, PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use log::LevelFilter;

use super::VERSION;
use crate::idmap::{Rule, RuleError, EXPECTED_FORM};
use crate::migration;
use crate::passthrough::xattrmap::XattrMap;
use crate::passthrough::{CacheMode, InodeFileHandles, Negotiate};
use crate::sandbox::caps::ModCaps;
use crate::sandbox::seccomp;
use crate::sandbox::userns::IdMapRange;
use crate::sandbox::SandboxMode;

/// A feature turned on or off (`--posix-lock`, `--flock`; the names are the flags' values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    pub fn is_on(self) -> bool {
        self == Switch::On
    }
}

/// vhost-user virtio-fs daemon: serves a host directory to a guest.
// The doc comments below are the `--help` text, verbatim: its `[default]` and `[deprecated]`
// are the reference's words, not links.
#[allow(rustdoc::broken_intra_doc_links)]
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
    #[arg(long = "tag", value_name = "TAG", value_parser = tag)]
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
    #[arg(long = "fd", value_name = "FD", value_parser = fd)]
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
    pub posix_acl: Negotiate,

    /// Rules translating extended attribute names between guest and host, e.g.
    /// :map::user.virtiofs.: (the rule language: man virtiofsd); implies --xattr
    #[arg(long = "xattrmap", value_name = "RULES")]
    pub xattrmap: Option<XattrMap>,

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
        value_parser = InodeFileHandlesParser,
        hide_possible_values = true
    )]
    pub inode_file_handles: InodeFileHandlesFlag,

    /// Caching policy the guest may use: never, metadata, auto or always
    #[arg(
        long = "cache",
        value_name = "MODE",
        default_value = "auto",
        hide_possible_values = true
    )]
    pub cache: CacheMode,

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
    pub modcaps: Option<ModCaps>,

    /// Log level: error, warn, info, debug, trace or off (RUST_LOG, when set, refines it)
    #[arg(
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info",
        value_parser = log_level(),
        hide_possible_values = true
    )]
    pub log_level: LevelFilter,

    /// Log to syslog instead of stderr
    #[arg(long = "syslog")]
    pub syslog: bool,

    /// Limit of open file descriptors; 0 leaves the limit unchanged [default: min(1000000,
    /// /proc/sys/fs/nr_open), or the hard limit when it cannot be raised]
    #[arg(long = "rlimit-nofile", value_name = "N", value_parser = number::<u64>)]
    pub rlimit_nofile: Option<u64>,

    /// Host files the guest may hold at once (nodes it looked up and has not forgotten); past
    /// it a new one is refused with ENFILE [default: one per 8 KiB of the host's memory, from
    /// 65536 to 16777216]
    #[arg(long = "max-nodes", value_name = "N", value_parser = max_nodes)]
    pub max_nodes: Option<usize>,

    /// With --cache=always, where the guest reads and writes files it never opened, descriptors
    /// kept for them; past it the least recently used is closed (and reopened at its next use).
    /// Never more than half the open-files limit [default: 1024]
    #[arg(long = "max-data-fds", value_name = "N", value_parser = max_data_fds)]
    pub max_data_fds: Option<usize>,

    /// Descriptors held for the guest's locks, one per lock owner (a guest process, or an
    /// open file for OFD and flock locks) and file; past it a lock is refused with ENOLCK.
    /// Never more than a quarter of the open-files limit [default: 1024]
    #[arg(long = "max-lock-fds", value_name = "N", value_parser = max_data_fds)]
    pub max_lock_fds: Option<usize>,

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

    /// Hold the guest's fcntl record and OFD locks as real locks on the host files (on, off;
    /// alone: on), so that they exclude host processes and other guests [default: on]
    ///
    /// Off (-o no_posix_lock), the guest kernel keeps them to itself, as the reference
    /// virtiofsd does: they exclude only processes of that guest. See doc/locks.md.
    #[arg(
        long = "posix-lock",
        value_name = "on|off",
        require_equals = true,
        num_args = 0..=1,
        default_value = "on",
        default_missing_value = "on",
        hide_possible_values = true
    )]
    pub posix_lock: Switch,

    /// Hold the guest's flock locks as real flock locks on the host files (on, off; alone:
    /// on) [default: on]
    ///
    /// Off (-o no_flock), the guest kernel keeps them to itself, as the reference virtiofsd
    /// does. See doc/locks.md.
    #[arg(
        long = "flock",
        value_name = "on|off",
        require_equals = true,
        num_args = 0..=1,
        default_value = "on",
        default_missing_value = "on",
        hide_possible_values = true
    )]
    pub flock: Switch,

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
    pub security_label: Negotiate,

    /// Run the daemon in a user namespace mapping this range of uids from the host, given as
    /// :namespace_uid:host_uid:count: (repeat for several ranges)
    #[arg(long = "uid-map", value_name = "MAP")]
    pub uid_map: Vec<IdMapRange>,

    /// Run the daemon in a user namespace mapping this range of gids from the host, given as
    /// :namespace_gid:host_gid:count: (repeat for several ranges)
    #[arg(long = "gid-map", value_name = "MAP")]
    pub gid_map: Vec<IdMapRange>,

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
    #[arg(long = "translate-uid", value_name = "RULE", value_parser = translate_rule)]
    pub translate_uid: Vec<Rule>,

    /// Translate gids between guest and host inside the daemon; same rules as --translate-uid
    #[arg(long = "translate-gid", value_name = "RULE", value_parser = translate_rule)]
    pub translate_gid: Vec<Rule>,

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
    pub migration_mode: migration::Mode,

    /// What a file the destination cannot find again becomes: abort (the migration fails and the
    /// source goes on) or guest-error (the guest gets an error on that file only)
    #[arg(
        long = "migration-on-error",
        value_name = "ACTION",
        default_value = "abort",
        hide_possible_values = true
    )]
    pub migration_on_error: migration::OnError,

    /// With find-paths: the destination checks that each path opens the very file the source
    /// had (by file handle; source and destination share one file system)
    #[arg(long = "migration-verify-handles")]
    pub migration_verify_handles: bool,

    /// With find-paths: the source checks each path right before it sends it, and sends where
    /// the file is now when it was renamed on the host
    #[arg(long = "migration-confirm-paths")]
    pub migration_confirm_paths: bool,
}

/// `--inode-file-handles` as given: the mode, and whether it was named "fallback", the
/// reference's deprecated name of "prefer" (accepted with a warning, not listed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeFileHandlesFlag {
    pub mode: InodeFileHandles,
    pub fallback: bool,
}

/// Parses `--inode-file-handles` as [`InodeFileHandles`]' own names do, noting the deprecated
/// one.
#[derive(Clone)]
struct InodeFileHandlesParser;

impl TypedValueParser for InodeFileHandlesParser {
    type Value = InodeFileHandlesFlag;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<InodeFileHandlesFlag, clap::Error> {
        let mode = EnumValueParser::<InodeFileHandles>::new().parse_ref(cmd, arg, value)?;
        Ok(InodeFileHandlesFlag {
            mode,
            fallback: value == "fallback",
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            InodeFileHandles::value_variants()
                .iter()
                .filter_map(ValueEnum::to_possible_value),
        ))
    }
}

/// The values of `--log-level` (and `-o loglevel`), in the order a refusal lists them.
pub(super) const LOG_LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// Parses `--log-level`: one of [`LOG_LEVELS`], spelled as listed.
fn log_level() -> impl TypedValueParser<Value = LevelFilter> {
    PossibleValuesParser::new(LOG_LEVELS).try_map(|v| v.parse::<LevelFilter>())
}

/// Parses a `--translate-uid` or `--translate-gid` rule on its own (whether it overlaps another
/// is checked with all of them); a refusal ends with the expected form.
fn translate_rule(v: &str) -> Result<Rule, String> {
    v.parse()
        .map_err(|e: RuleError| format!("{e}; expected {EXPECTED_FORM}"))
}

/// A whole number (clap's own refusal says only "invalid digit found in string").
fn number<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| "expected a whole number N >= 0".to_owned())
}

/// The tag of the device's configuration space: 1 to 36 bytes (the size of its field).
fn tag(v: &str) -> Result<String, String> {
    match v.len() {
        1..=36 => Ok(v.to_owned()),
        _ => Err("expected a tag of 1 to 36 bytes".into()),
    }
}

/// A file descriptor number.
fn fd(v: &str) -> Result<i32, String> {
    match v.parse::<i32>() {
        Ok(n) if n >= 0 => Ok(n),
        _ => Err("expected a whole number N >= 0".into()),
    }
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
