//! Live migration, the daemon's part: the options of `--migration-*`.
//!
//! The state's container and its codec (`seal`, `open`, `Encoder`, `Decoder`, `StateError`) are
//! the protocol crate's (`virtiofs_fuse::migration`, re-exported here), as the FUSE server saves
//! its session with them; what the file system saves is `passthrough::migration`'s.

pub use virtiofs_fuse::migration::*;

/// How the destination finds each node the guest knows (`--migration-mode`; the names are the
/// flag's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// The source sends each node's path in the shared directory; the destination opens it.
    #[default]
    FindPaths,
    /// The source sends each node's file handle; the destination opens it by handle (the same
    /// file system on both sides, and `CAP_DAC_READ_SEARCH` on the destination).
    FileHandles,
}

/// What a node that cannot be found again becomes (`--migration-on-error`; the names are the
/// flag's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnError {
    /// The migration fails (the source keeps running the guest).
    #[default]
    Abort,
    /// The node gives the guest an error (`ESTALE`), on that file only.
    GuestError,
}

/// The migration options of the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub mode: Mode,
    pub on_error: OnError,
    /// The source sends each node's file handle too, and the destination checks that the path
    /// opens that very file (`--migration-verify-handles`; source and destination share one
    /// file system).
    pub verify_handles: bool,
    /// The source checks each path it sends right before it sends it, and looks for a node
    /// whose path no longer leads to it (`--migration-confirm-paths`).
    pub confirm_paths: bool,
}
