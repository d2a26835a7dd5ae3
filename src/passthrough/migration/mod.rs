//! The passthrough file system's part of a live migration: its nodes and handles (see
//! `crate::migration` for the container and the protocol).
//!
//! # What is sent
//! For each node the guest holds: its node id, its reference count, its file type, and where
//! the destination finds it again:
//! - `find-paths`: its path in the shared directory, as names from the root. Most nodes know
//!   where they were found (parent and name), so the path is put together from memory; a node
//!   that keeps a descriptor instead is located through `/proc/self/fd`. With
//!   `--migration-confirm-paths` each path is opened and checked to lead to the node right
//!   before it is sent (else the descriptor's own path is tried). A node whose path is longer
//!   than `/proc` gives (`PATH_MAX`) or a state holds (4,096 names) is sent as a name in its
//!   parent, a node of the state sent before it: the name it was found by, or, for a
//!   directory that keeps a descriptor, the name its parent (`..`) lists it under. A chain of
//!   any depth then costs the state a name a level.
//! - `file-handles`: its file handle.
//!
//! With `--migration-verify-handles` a node's identifying handle is sent too, and the
//! destination checks that the path it opened is that very file.
//! A node found nowhere (deleted while the guest held it, moved away on the host) is sent as
//! lost: with `--migration-on-error=abort` the save fails, and the source goes on serving;
//! with `guest-error` the destination gives `ESTALE` for that node only.
//!
//! For each handle: its number, its node, its open flags and, for a directory, the listing
//! its READDIRs are served from (a snapshot is sent whole, so the offsets the guest holds stay
//! valid; a listing read from the directory is reopened, and its offsets are the host file
//! system's own cookies).
//!
//! Then the guest's locks, when it holds some (a section of its own, tagged, after the ids of
//! files gone): per owner and node, the ranges or the `flock` it holds. The destination takes
//! them again, at once when free and otherwise by a hand-over from the source
//! (`locks::Locks::adopt`; doc/locks.md, Migration).
//!
//! What is not sent: the descriptors of handle-less I/O (`--cache=always`), the directory
//! cache and negative entries, which the destination rebuilds on demand; the id mapping, which
//! is the command line's.
//!
//! # What the destination trusts
//! A path is opened one name at a time below the shared directory's root, never following a
//! symlink and never through `..`, so no state, however made, reaches a file outside it; a
//! name in a parent is opened the same way in a directory node restored before it. A
//! file handle can name any file of the file system: one opened from a state must be inside
//! the shared directory (its path below the root), or the node is lost.
//!
//! The save side is `save.rs`, the load side `load.rs`; this file holds the format both share
//! (tags, bounds, the decoded forms) and the lookups below the shared directory both use.

mod load;
mod save;

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use super::file_handle::FileHandle;
use super::sys::{self, error, ProcName};
use super::{open_path_flags, PassthroughFs};
use crate::fuse::abi::ROOT_ID;
use crate::migration::StateError;

/// Longest name a path of a state may hold (Linux's `NAME_MAX`).
const NAME_MAX: usize = 255;
/// Deepest path sent (a longer parent chain means a loop).
const MAX_DEPTH: usize = 4096;
/// Node ids, handle numbers and the counters of both are below this in a state: a counter
/// near `u64::MAX` would wrap to ids already given (0, the root).
const MAX_ID: u64 = 1 << 62;

/// Where the destination finds a node.
enum Location {
    /// Names from the shared directory's root.
    Path(Vec<CString>),
    /// A file handle on the shared directory's file system.
    Handle(FileHandle),
    /// Nowhere: the errno the save met.
    Lost(i32),
    /// A name in a directory that is a node of the state too, sent before it: for a node whose
    /// path is too long for `/proc` to give (`PATH_MAX`) or for a state to hold ([`MAX_DEPTH`]
    /// names). A chain of them costs the state a name a level, not a path a level.
    Child(u64, CString),
}

const LOC_LOST: u8 = 0;
const LOC_PATH: u8 = 1;
const LOC_HANDLE: u8 = 2;
const LOC_CHILD: u8 = 3;

/// The tag of the locks section, after the stale ids (doc/locks.md, Migration).
const SECTION_LOCKS: u8 = 1;
/// A carried record's kind: record (POSIX and OFD) locks, then its ranges; a `flock`, then its
/// type.
const LOCK_RECORD: u8 = 0;
const LOCK_FLOCK: u8 = 1;
/// Fewest bytes a carried record takes in a state (a flock).
const MIN_CARRIED: usize = 8 + 8 + 8 + 4 + 1 + 1 + 4;

const LISTING_NONE: u8 = 0;
const LISTING_STREAM: u8 = 1;
const LISTING_SNAPSHOT: u8 = 2;

/// Open flags a handle is reopened with on the destination.
const KEPT_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_NONBLOCK
    | libc::O_SYNC
    | libc::O_DSYNC;

/// A node as read from a state, borrowing its path from it.
struct SavedNode<'a> {
    id: u64,
    refcount: u64,
    kind: u32,
    location: SavedLocation<'a>,
    fid: Option<FileHandle>,
}

/// Where a state says the destination finds a node.
enum SavedLocation<'a> {
    Path(SavedPath<'a>),
    Handle(FileHandle),
    Lost(i32),
    /// A name (proven a plain name) in the directory of node `parent`, restored before it.
    Child {
        parent: u64,
        name: &'a [u8],
    },
}

/// A path in a state: the records (a `u32` length, then the name) of its names from the root,
/// each proven a plain name when it was read. It is the state's own bytes, so a path costs no
/// allocation however deep, and the path of a node's parent is a prefix of the node's.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct SavedPath<'a>(&'a [u8]);

impl<'a> SavedPath<'a> {
    fn names(self) -> impl Iterator<Item = &'a [u8]> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let len = u32::from_le_bytes(*len) as usize;
            let (name, tail) = tail.split_at_checked(len)?;
            rest = tail;
            Some(name)
        })
    }

    /// The path of the directory holding the last name, and that name (`None` at the root).
    fn split_last(self) -> Option<(SavedPath<'a>, &'a [u8])> {
        let last = self.names().last()?;
        let parent = &self.0[..self.0.len() - 4 - last.len()];
        Some((SavedPath(parent), last))
    }

    /// The path as the log shows it, the guest's names escaped, its middle left out when long.
    fn show(self) -> String {
        const SHOWN: usize = 200;
        let mut s = String::new();
        for n in self.names() {
            if s.len() > SHOWN {
                let last = self.names().last().unwrap_or_default();
                s.push_str("/…/");
                s.push_str(&crate::logging::escaped(&last[..last.len().min(NAME_MAX)]));
                break;
            }
            s.push('/');
            s.push_str(&crate::logging::escaped(&n[..n.len().min(NAME_MAX)]));
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }
}

/// Fewest bytes a node takes in a state (a lost one).
const MIN_NODE: usize = 8 + 8 + 4 + 1 + 4 + 1;

/// Lost nodes and handles logged one by one; the rest are only counted (a forged state of
/// millions of lost nodes must not flood the log).
const LOGGED_LOSSES: usize = 32;

/// Why a node of a state is not taken, as an error of kind `errno`.
fn refused(errno: i32, why: impl Into<String>) -> io::Error {
    io::Error::new(io::Error::from_raw_os_error(errno).kind(), why.into())
}

fn io_error(what: impl Into<String>, source: io::Error) -> StateError {
    StateError::Io {
        what: what.into(),
        source,
    }
}

impl PassthroughFs {
    /// The path of the file `fd` refers to, as names below the shared directory's root
    /// (`ENOENT` when it was deleted, `EXDEV` when it is not below the root).
    fn fd_path(&self, fd: BorrowedFd<'_>, root: &[u8]) -> io::Result<Vec<CString>> {
        let path = self.proc_link(fd)?;
        let rest = if root == b"/" {
            &path[..]
        } else if path == root {
            &b""[..]
        } else if path.starts_with(root) && path.get(root.len()) == Some(&b'/') {
            &path[root.len()..]
        } else {
            return Err(error(libc::EXDEV));
        };
        if rest.ends_with(b" (deleted)") && sys::stat_fd(fd)?.st_nlink == 0 {
            return Err(error(libc::ENOENT));
        }
        rest.split(|b| *b == b'/')
            .filter(|n| !n.is_empty())
            .map(|n| CString::new(n).map_err(|_| error(libc::EINVAL)))
            .collect()
    }

    /// Where `/proc/self/fd/N` of `fd` points.
    fn proc_link(&self, fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
        let name = ProcName::new(fd.as_raw_fd());
        sys::readlink_at(self.proc_self_fd.as_fd(), name.name())
    }

    /// Where the shared directory's root is, as `/proc/self/fd` shows paths.
    fn root_path(&self) -> io::Result<Vec<u8>> {
        let root = self.inode(ROOT_ID)?;
        let fd = root.opened_fd().ok_or_else(|| error(libc::EBADF))?;
        self.proc_link(fd)
    }

    /// Opens `names` below the root one name at a time: `O_PATH`, no symlink followed, every
    /// name but the last a directory. `names` come from a state: each is a plain name (the
    /// decoder refuses `/`, NUL, `.` and `..`).
    fn open_beneath<'n>(&self, names: impl Iterator<Item = &'n [u8]>) -> io::Result<OwnedFd> {
        let root = self.inode(ROOT_ID)?;
        let root_fd = root.opened_fd().ok_or_else(|| error(libc::EBADF))?;
        let mut cur = sys::openat(root_fd, c".", open_path_flags(), 0)?;
        let mut buf = [0u8; NAME_MAX + 1];
        let mut names = names.peekable();
        while let Some(name) = names.next() {
            if name.len() > NAME_MAX {
                return Err(error(libc::ENAMETOOLONG));
            }
            if name.contains(&0) {
                return Err(error(libc::EINVAL));
            }
            buf[..name.len()].copy_from_slice(name);
            buf[name.len()] = 0;
            let name = CStr::from_bytes_until_nul(&buf).map_err(|_| error(libc::EINVAL))?;
            let next = sys::openat(cur.as_fd(), name, open_path_flags(), 0)?;
            if names.peek().is_some()
                && sys::stat_fd(next.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFDIR
            {
                return Err(error(libc::ENOTDIR));
            }
            cur = next;
        }
        Ok(cur)
    }
}
