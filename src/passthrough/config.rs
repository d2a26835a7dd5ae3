//! Settings of the passthrough filesystem: the shared directory, the cache policy and the
//! optional features a host enables on the command line.

use std::path::PathBuf;
use std::time::Duration;

use super::xattrmap::XattrMap;

/// How much the guest may cache (`--cache`; the names are the flag's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CacheMode {
    /// No caching: zero timeouts and direct I/O.
    // "none" is the old C virtiofsd's spelling (`-o cache=none`).
    #[value(alias = "none")]
    Never,
    /// Metadata cached for a long time, file data never (direct I/O).
    Metadata,
    /// Short metadata timeouts; page cache kept only while the file is unchanged.
    #[default]
    Auto,
    /// The guest keeps pages, attributes, entries and directory listings.
    Always,
}

impl CacheMode {
    /// How long the guest may trust a name → node mapping and a node's attributes.
    pub fn timeout(self) -> Duration {
        match self {
            CacheMode::Never => Duration::ZERO,
            CacheMode::Auto => Duration::from_secs(1),
            CacheMode::Metadata | CacheMode::Always => Duration::from_secs(86400),
        }
    }
}

/// When inodes are referenced by file handle rather than by descriptor
/// (`--inode-file-handles`; the names are the flag's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum InodeFileHandles {
    /// Every inode the daemon needed a descriptor of keeps an `O_PATH` descriptor: the
    /// default, as the reference's (the daemon needs no `CAP_DAC_READ_SEARCH`).
    #[default]
    Never,
    /// Inodes other than directories keep a file handle instead of a descriptor where the
    /// host file system gives handles and the daemon may open them; a descriptor otherwise.
    // "fallback" is the reference's deprecated name (the command line warns of it).
    #[value(alias = "fallback")]
    Prefer,
    /// As `Prefer`, but a file without a handle is refused (lookups fail) and the daemon does
    /// not start when it cannot open handles.
    Mandatory,
}

/// Whether to enable a feature the guest kernel must agree to (`--posix-acl`,
/// `--security-label`; the names are the flags' values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Negotiate {
    /// Not offered.
    #[default]
    Never,
    /// Enabled when the guest kernel supports it; without it the session goes on without.
    Auto,
    /// Enabled; a guest kernel without support fails FUSE_INIT (`EPROTO`).
    Always,
}

/// Default of [`Config::listing_memory`].
pub const DEFAULT_LISTING_MEMORY: usize = 64 << 20;

/// The default of `--max-data-fds`: descriptors kept for the guest's reads and writes without
/// an open handle (no-open mode). Each pins a few KiB of the host kernel's memory; reopening a
/// file that lost its descriptor costs one `open`.
pub const DEFAULT_MAX_DATA_FDS: usize = 1024;

/// The default of [`Config::max_lock_fds`]: descriptors held for the guest's locks, one per
/// lock owner and file.
pub const DEFAULT_MAX_LOCK_FDS: usize = 1024;

/// Bytes of the host's memory per node [`default_max_nodes`] allows: ten times the worst a
/// guest can make a node cost, so that the nodes together take less than a tenth of the memory.
/// A node of a walk costs some 135 bytes; the worst is a file the guest has just created with
/// a name of 255 bytes (on the heap), which keeps its file handle while its birth time is
/// young: 536 bytes (`tests/hostile.rs::
/// the_default_max_nodes_holds_the_worst_nodes_in_a_tenth_of_the_memory`). A range of ids of
/// files gone (54 bytes) costs less, and counts against the same limit.
pub const MEMORY_PER_NODE: u64 = 8192;

/// The default of `--max-nodes`: one node per [`MEMORY_PER_NODE`] bytes of the host's memory,
/// at least 65,536 and at most 16,777,216 (8 GiB: a million).
pub fn default_max_nodes() -> usize {
    let total = nix::sys::sysinfo::sysinfo().map_or(0, |si| si.ram_total());
    (total / MEMORY_PER_NODE).clamp(1 << 16, 1 << 24) as usize
}

/// Configuration of a [`super::PassthroughFs`].
#[derive(Debug, Clone)]
pub struct Config {
    /// The host directory served to the guest.
    pub root_dir: PathBuf,
    pub cache: CacheMode,
    /// Pass extended attributes through (`--xattr`).
    pub xattr: bool,
    /// Refuse every change with `EROFS` (`--readonly`).
    pub readonly: bool,
    /// Offer `READDIRPLUS` to the guest (off with `--no-readdirplus`).
    pub readdirplus: bool,
    /// Enable the guest's writeback cache (`--writeback`).
    pub writeback: bool,
    /// Tell the guest which directories are mount points (`--announce-submounts`), so that it
    /// gives each host filesystem under the share its own device number.
    pub announce_submounts: bool,
    /// Honour `O_DIRECT` from the guest (`--allow-direct-io`); otherwise it is dropped from
    /// the flags host files are opened with.
    pub allow_direct_io: bool,
    /// Let the guest mmap files served with direct I/O (`--allow-mmap`, with `cache` never or
    /// metadata): `FUSE_DIRECT_IO_ALLOW_MMAP` is offered at INIT.
    pub allow_mmap: bool,
    /// Keep `O_NOATIME` from the guest (`--preserve-noatime`); otherwise it is dropped from
    /// the flags host files are opened with.
    pub preserve_noatime: bool,
    /// File handles instead of descriptors for inodes (`--inode-file-handles`).
    pub inode_file_handles: InodeFileHandles,
    /// Rules translating extended attribute names (`--xattrmap`).
    pub xattrmap: Option<XattrMap>,
    /// POSIX ACLs (`--posix-acl`): `FUSE_POSIX_ACL`, with the guest's umask applied by the host
    /// only where no default ACL is inherited. Needs `xattr`.
    pub posix_acl: Negotiate,
    /// Security labels of new files (`--security-label`): `FUSE_SECURITY_CTX`. Needs `xattr`.
    pub security_label: Negotiate,
    /// The daemon clears set-user-id / set-group-id bits itself on writes, truncations and
    /// ownership changes the guest marks (`--killpriv-v2`: `FUSE_HANDLE_KILLPRIV_V2`).
    pub killpriv_v2: bool,
    /// Most bytes all directory listings may hold together (snapshots, shared or not, of every
    /// handle and inode); a listing that does not fit is read from the directory at each
    /// READDIR instead. One listing takes at most a quarter.
    pub listing_memory: usize,
    /// Nodes the guest may hold at once (`--max-nodes`); a new one past it is refused with
    /// `ENFILE`.
    pub max_nodes: usize,
    /// Descriptors kept for READ and WRITE without an open handle (`--max-data-fds`, no-open
    /// mode of `--cache=always`), least recently used closed first; never more than half the
    /// open-files limit.
    pub max_data_fds: usize,
    /// Serve the guest's `fcntl` record and OFD locks with real host locks (`FUSE_POSIX_LOCKS`;
    /// off with `-o no_posix_lock` / `--posix-lock=off`: the guest keeps them to itself).
    pub posix_lock: bool,
    /// Serve the guest's `flock` locks with real host locks (`FUSE_FLOCK_LOCKS`; off with
    /// `-o no_flock` / `--flock=off`).
    pub flock: bool,
    /// Most descriptors held for the guest's locks (one per lock owner and file); a lock past
    /// it gets `ENOLCK`. Never more than a quarter of the open-files limit.
    pub max_lock_fds: usize,
    /// Entry timeout; defaults from `cache`.
    pub entry_timeout: Duration,
    /// Attribute timeout; defaults from `cache`.
    pub attr_timeout: Duration,
    /// How nodes and handles travel in a live migration (`--migration-*`).
    pub migration: crate::migration::Options,
}

impl Config {
    /// A configuration for `root_dir` with the defaults of `cache`.
    pub fn new(root_dir: impl Into<PathBuf>, cache: CacheMode) -> Self {
        Config {
            root_dir: root_dir.into(),
            cache,
            xattr: false,
            readonly: false,
            readdirplus: true,
            writeback: false,
            announce_submounts: false,
            allow_direct_io: false,
            allow_mmap: false,
            preserve_noatime: false,
            inode_file_handles: InodeFileHandles::default(),
            xattrmap: None,
            posix_acl: Negotiate::Never,
            security_label: Negotiate::Never,
            killpriv_v2: false,
            listing_memory: DEFAULT_LISTING_MEMORY,
            max_nodes: default_max_nodes(),
            max_data_fds: DEFAULT_MAX_DATA_FDS,
            posix_lock: true,
            flock: true,
            max_lock_fds: DEFAULT_MAX_LOCK_FDS,
            entry_timeout: cache.timeout(),
            attr_timeout: cache.timeout(),
            migration: crate::migration::Options::default(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::new("/", CacheMode::Auto)
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    fn parse<T: ValueEnum>(s: &str) -> Result<T, String> {
        T::from_str(s, false)
    }

    /// The names a refusal lists (aliases are not listed).
    fn names<T: ValueEnum>() -> Vec<String> {
        T::value_variants()
            .iter()
            .filter_map(T::to_possible_value)
            .map(|p| p.get_name().to_owned())
            .collect()
    }

    #[test]
    fn cache_mode_parses_every_reference_spelling() {
        assert_eq!(parse("never"), Ok(CacheMode::Never));
        assert_eq!(parse("none"), Ok(CacheMode::Never));
        assert_eq!(parse("metadata"), Ok(CacheMode::Metadata));
        assert_eq!(parse("auto"), Ok(CacheMode::Auto));
        assert_eq!(parse("always"), Ok(CacheMode::Always));
        assert!(parse::<CacheMode>("sometimes").is_err());
        assert_eq!(
            names::<CacheMode>(),
            ["never", "metadata", "auto", "always"]
        );
    }

    #[test]
    fn inode_file_handles_parse_with_the_deprecated_alias() {
        assert_eq!(parse("never"), Ok(InodeFileHandles::Never));
        assert_eq!(parse("prefer"), Ok(InodeFileHandles::Prefer));
        assert_eq!(parse("fallback"), Ok(InodeFileHandles::Prefer));
        assert_eq!(parse("mandatory"), Ok(InodeFileHandles::Mandatory));
        assert!(parse::<InodeFileHandles>("always").is_err());
        assert_eq!(
            names::<InodeFileHandles>(),
            ["never", "prefer", "mandatory"]
        );
        assert_eq!(InodeFileHandles::default(), InodeFileHandles::Never);
    }

    #[test]
    fn negotiate_parses_its_three_values() {
        assert_eq!(parse("never"), Ok(Negotiate::Never));
        assert_eq!(parse("auto"), Ok(Negotiate::Auto));
        assert_eq!(parse("always"), Ok(Negotiate::Always));
        assert!(parse::<Negotiate>("Always").is_err());
    }
}
