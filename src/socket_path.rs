//! What is at a socket path when it is not a socket: the refusal the command line gives when
//! it is checked (`cli`) and the daemon gives again just before it makes the socket (`daemon`).
//!
//! A leaf: it uses `std` and `thiserror`, and nothing else of this crate, so that the command
//! line and the daemon both name it without using each other.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Something other than a socket at `--socket-path`: refused when the command line is checked,
/// and again just before the socket is made (only a socket left there is replaced).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--socket-path: '{}' exists and is {kind}, not a socket; expected the path of a socket to \
     create (only a socket left there is replaced)",
    .path.display()
)]
pub struct NotASocket {
    pub path: PathBuf,
    /// What it is ("a regular file", "a symbolic link", ...).
    pub kind: &'static str,
}

impl NotASocket {
    /// What is at `path`, whose metadata (not following a symbolic link) is `m`.
    pub fn at(path: &Path, m: &std::fs::Metadata) -> NotASocket {
        NotASocket {
            path: path.to_path_buf(),
            kind: file_kind(&m.file_type()),
        }
    }
}

/// What a file that is not a socket is, for a message.
fn file_kind(t: &std::fs::FileType) -> &'static str {
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
