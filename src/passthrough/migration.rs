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

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use super::dir::{DirSnapshot, Listing};
use super::file_handle::{self, FileHandle};
use super::handle::HandleData;
use super::identity::At;
use super::node::inode::{InodeData, Node, NotAdded, Origin, Source};
use super::node::key::InodeKey;
use super::sys::{self, error, ProcName};
use super::{open_path_flags, PassthroughFs};
use crate::fuse::abi::ROOT_ID;
use crate::migration::{Decoder, Encoder, Mode, OnError, StateError};

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
    /// The guest's locks held on host files are not carried to a destination yet (doc/locks.md):
    /// with any held, `abort` refuses the state (the guest goes on here, its locks held), and
    /// `guest-error` goes on after saying which are lost.
    fn check_held_locks(&self, on_error: OnError) -> Result<(), StateError> {
        let held = self.locks.held();
        let Some(first) = held.first() else {
            return Ok(());
        };
        let what = format!(
            "the guest holds {} lock owner(s)' locks on host files (the first: node {}, owner              {:#x}, {:?}, {} range(s)), which a migration does not carry to the destination",
            held.len(),
            first.node,
            first.owner,
            first.kind,
            first.segs.len()
        );
        if on_error == OnError::Abort {
            return Err(StateError::Refused(format!(
                "{what}: the migration is refused (--migration-on-error=abort); the guest goes                  on here with its locks"
            )));
        }
        log::warn!(
            "migration: {what}: they end when this daemon exits (--migration-on-error=guest-error)"
        );
        Ok(())
    }

    /// Writes the nodes and handles (see the module documentation).
    pub(super) fn save_migration_state(&self, out: &mut Encoder) -> Result<(), StateError> {
        let opts = self.cfg.migration;
        self.check_held_locks(opts.on_error)?;
        let nodes = self.inodes.all();
        // Where the root is, as `/proc/self/fd` shows paths: read once for every node.
        let root = self
            .root_path()
            .map_err(|e| io_error("the shared directory's path", e))?;
        let handles = self.handles.all();
        out.u64(self.inodes.next_id());
        out.u64(self.handles.next_id());
        out.u32(nodes.len() as u32);
        let mut located: Vec<(&Node, Location)> = nodes
            .iter()
            .map(|node| (node, self.locate(node, &root)))
            .collect();
        if opts.mode == Mode::FindPaths {
            self.locate_deep(&mut located);
        }
        // Parents before their children: the destination restores each node as it reads it.
        let located = parents_first(located);
        let mut lost = 0usize;
        for (node, location) in located {
            if let Location::Lost(e) = location {
                let err = io::Error::from_raw_os_error(e);
                // Out of descriptors or memory says nothing about the file: never a lost node.
                if opts.on_error == OnError::Abort || super::is_resource_shortage(&err) {
                    return Err(io_error(
                        format!(
                            "node {} cannot be found again on the destination (the migration \
                             is refused: --migration-on-error=abort)",
                            node.id
                        ),
                        err,
                    ));
                }
                if lost < LOGGED_LOSSES {
                    log::warn!(
                        "migration: node {} is sent as lost ({err}); the guest will get ESTALE \
                         on it",
                        node.id
                    );
                }
                lost += 1;
            }
            out.u64(node.id);
            out.u64(node.refcount());
            out.u32(node.key.kind());
            match &location {
                Location::Lost(e) => {
                    out.u8(LOC_LOST);
                    out.i32(*e);
                }
                Location::Path(names) => {
                    out.u8(LOC_PATH);
                    out.u32(names.len() as u32);
                    for n in names {
                        out.bytes(n.as_bytes());
                    }
                }
                Location::Handle(h) => {
                    out.u8(LOC_HANDLE);
                    let (t, b) = h.parts();
                    out.i32(t);
                    out.bytes(b);
                }
                Location::Child(parent, name) => {
                    out.u8(LOC_CHILD);
                    out.u64(*parent);
                    out.bytes(name.as_bytes());
                }
            }
            let fid = match (&location, opts.verify_handles) {
                (Location::Path(_) | Location::Child(..), true) => self
                    .path_fd(node)
                    .and_then(|fd| FileHandle::fid_of_fd(fd.as_fd()))
                    .ok(),
                _ => None,
            };
            match fid {
                Some(h) => {
                    out.bool(true);
                    let (t, b) = h.parts();
                    out.i32(t);
                    out.bytes(b);
                }
                None => out.bool(false),
            }
        }
        out.u32(handles.len() as u32);
        for (h, data) in &handles {
            out.u64(*h);
            out.u64(data.inode);
            out.i32(sys::fd_status_flags(data.fd()).unwrap_or(libc::O_RDONLY) & KEPT_FLAGS);
            let listing = data
                .dir
                .as_ref()
                .map(|d| d.lock().unwrap_or_else(PoisonError::into_inner).clone());
            match listing {
                None => out.u8(LISTING_NONE),
                Some(None) => out.u8(LISTING_NONE),
                Some(Some(Listing::Stream)) => out.u8(LISTING_STREAM),
                Some(Some(Listing::Snapshot(snap))) => {
                    out.u8(LISTING_SNAPSHOT);
                    out.u32(snap.len() as u32);
                    for e in snap.records() {
                        out.u64(e.ino);
                        out.u8(e.dtype);
                        out.bytes(e.name);
                    }
                }
            }
            out.bool(data.dir.is_some());
        }
        // Ids of files gone from the host that the guest has not forgotten: they go on
        // answering ESTALE. Only when there are some, so that a destination of a release that
        // knew no such ids takes the others' states.
        let dead = self.inodes.dead_ranges_list();
        if !dead.is_empty() {
            out.u32(dead.len() as u32);
            for (start, end) in dead {
                out.u64(start);
                out.u64(end);
            }
        }
        if lost > LOGGED_LOSSES {
            log::warn!("migration: {lost} nodes sent as lost in all");
        }
        log::info!(
            "migration: saved {} nodes ({lost} lost) and {} handles ({})",
            nodes.len(),
            handles.len(),
            match opts.mode {
                Mode::FindPaths => "paths",
                Mode::FileHandles => "file handles",
            }
        );
        Ok(())
    }

    /// Where the destination will find `node`.
    fn locate(&self, node: &Node, root: &[u8]) -> Location {
        let opts = self.cfg.migration;
        if node.id == ROOT_ID {
            return Location::Path(Vec::new());
        }
        if node.is_stale() {
            return Location::Lost(libc::ESTALE);
        }
        match opts.mode {
            Mode::FileHandles => {
                match self
                    .path_fd(node)
                    .and_then(|fd| FileHandle::of_fd(fd.as_fd()))
                {
                    Ok(h) => Location::Handle(h),
                    Err(e) => Location::Lost(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            }
            Mode::FindPaths => {
                if self.unlinked_while_open(node) {
                    return Location::Lost(libc::ENOENT);
                }
                let found = self.path_of(node, root).and_then(|names| {
                    if opts.confirm_paths && !self.leads_to(&names, node)? {
                        // The names the guest found it by changed: where its descriptor is.
                        let names = self.fd_path(self.path_fd(node)?.as_fd(), root)?;
                        if !self.leads_to(&names, node)? {
                            return Err(error(libc::ENOENT));
                        }
                        return Ok(names);
                    }
                    Ok(names)
                });
                match found {
                    Ok(names) => Location::Path(names),
                    Err(e) => Location::Lost(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            }
        }
    }

    /// Finds a place for the nodes whose path is too long to send ([`Location::Child`]): a node
    /// found by name in a directory the guest holds is that name in it; a directory that keeps
    /// a descriptor is the name its parent (`..`, a node the guest holds) lists it under, each
    /// parent listed once for all its children of this kind.
    fn locate_deep(&self, located: &mut [(&Node, Location)]) {
        let too_long = |l: &Location| matches!(l, Location::Lost(e) if *e == libc::ENAMETOOLONG || *e == libc::ELOOP);
        // Directories with a descriptor, by the node id of their parent: (index, inode number).
        let mut by_parent: HashMap<u64, (Node, Vec<(usize, u64)>)> = HashMap::new();
        for (i, (node, location)) in located.iter_mut().enumerate() {
            if !too_long(location) || node.is_stale() {
                continue;
            }
            if let Some((parent, name)) = node.origin() {
                let held = self
                    .inodes
                    .get(parent.id)
                    .is_some_and(|p| Node::ptr_eq(&p, &parent));
                if held && self.child_leads_to(&parent, &name, node) {
                    *location = Location::Child(parent.id, name.to_owned());
                }
                continue;
            }
            let Some(fd) = node.opened_fd().filter(|_| node.is_dir()) else {
                continue;
            };
            let parent = sys::openat(fd, c"..", open_path_flags(), 0).and_then(|up| {
                let (st, x) = sys::stat_fd_mnt(up.as_fd())?;
                self.nodes().key_at(node, &st, &x, At::Fd(up.as_fd()))
            });
            let Some(parent) = parent.ok().and_then(|key| self.inodes.find(&key)) else {
                continue;
            };
            if !self
                .inodes
                .get(parent.id)
                .is_some_and(|p| Node::ptr_eq(&p, &parent))
            {
                continue;
            }
            by_parent
                .entry(parent.id)
                .or_insert_with(|| (parent, Vec::new()))
                .1
                .push((i, node.key.ino));
        }
        for (_, (parent, children)) in by_parent {
            let listing = self
                .open_node(
                    &parent,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
                .and_then(|dir| DirSnapshot::read(dir.as_fd(), false, &mut |_, _| Ok(())));
            let Ok(Ok(listing)) = listing else {
                continue;
            };
            let mut wanted: HashMap<u64, Vec<usize>> = HashMap::new();
            for (i, ino) in children {
                wanted.entry(ino).or_default().push(i);
            }
            for r in listing.records() {
                let Some(ids) = wanted.get(&r.ino) else {
                    continue;
                };
                let Ok(name) = CString::new(r.name) else {
                    continue;
                };
                for &i in ids {
                    let (node, location) = &mut located[i];
                    if too_long(location) && self.child_leads_to(&parent, &name, node) {
                        *location = Location::Child(parent.id, name.clone());
                    }
                }
            }
        }
    }

    /// Whether `name` in `parent` is `node` now.
    fn child_leads_to(&self, parent: &InodeData, name: &CStr, node: &InodeData) -> bool {
        self.path_fd(parent)
            .and_then(|pfd| sys::openat(pfd.as_fd(), name, open_path_flags(), 0))
            .and_then(|fd| self.nodes().is_inode(fd.as_fd(), node))
            .unwrap_or(false)
    }

    /// Whether the file the guest last opened `node` with has no name left (deleted while
    /// open: no path reaches it).
    fn unlinked_while_open(&self, node: &InodeData) -> bool {
        node.last_open()
            .is_some_and(|h| sys::stat_fd(h.fd()).is_ok_and(|st| st.st_nlink == 0))
    }

    /// Whether `names` leads to `node` now.
    fn leads_to(&self, names: &[CString], node: &InodeData) -> io::Result<bool> {
        match self.open_beneath(names.iter().map(|n| n.to_bytes())) {
            Ok(fd) => self.nodes().is_inode(fd.as_fd(), node),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The path of `node` from the root: the names it was found by, up its parents; from the
    /// first one that keeps a descriptor instead, where that descriptor is.
    fn path_of(&self, node: &Node, root: &[u8]) -> io::Result<Vec<CString>> {
        let mut names = Vec::new();
        let mut cur = node.clone();
        for _ in 0..MAX_DEPTH {
            if cur.id == ROOT_ID {
                names.reverse();
                return Ok(names);
            }
            if cur.is_stale() {
                return Err(error(libc::ESTALE));
            }
            if let Some((parent, name)) = cur.origin() {
                names.push(name.to_owned());
                cur = parent;
                continue;
            }
            let mut path = self.fd_path(self.path_fd(&cur)?.as_fd(), root)?;
            names.reverse();
            path.extend(names);
            return Ok(path);
        }
        Err(error(libc::ELOOP))
    }

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

    /// Takes over the nodes and handles of a state (see the module documentation). A state
    /// refused halfway leaves nothing of it behind.
    pub(super) fn load_migration_state(&self, input: &mut Decoder<'_>) -> Result<(), StateError> {
        if self.inodes.all().len() != 1 || !self.handles.all().is_empty() {
            return Err(StateError::Refused(
                "this daemon holds nodes or handles already: a migration destination must be \
                 fresh"
                    .into(),
            ));
        }
        let loaded = self.load_nodes_and_handles(input);
        if loaded.is_err() {
            self.handles.clear();
            self.inodes.clear();
        }
        loaded
    }

    fn load_nodes_and_handles<'a>(&self, input: &mut Decoder<'a>) -> Result<(), StateError> {
        let opts = self.cfg.migration;
        let next_node = input.u64("next node id")?;
        let next_handle = input.u64("next handle")?;
        if next_node >= MAX_ID || next_handle >= MAX_ID {
            return Err(StateError::invalid(
                "next ids",
                "beyond any id a daemon gives",
            ));
        }
        let n = input.count("nodes", MIN_NODE)?;
        // The root is one of the nodes the limit counts and one of the state's.
        if n > self.cfg.max_nodes {
            return Err(StateError::Refused(format!(
                "the state holds {n} nodes, more than this daemon holds (--max-nodes={})",
                self.cfg.max_nodes
            )));
        }
        // Each node is restored as it is read (the source sends parents first), so what the
        // state costs beyond its own bytes is the nodes themselves: no node, path or name is
        // copied out of it first. The directories restored, by path, to find a child's parent.
        let mut dirs: HashMap<SavedPath<'a>, Node> = HashMap::new();
        // The last directory restored and its descriptor: the parent of the next node, in a
        // chain sent a name a level (its nodes keep no descriptor, as those found by path).
        let mut last_dir: Option<(u64, OwnedFd)> = None;
        let root_path = self
            .root_path()
            .map_err(|e| io_error("the shared directory's path", e))?;
        let mut lost = 0usize;
        // `open_by_handle_at` takes a real (not `O_PATH`) descriptor of the mount.
        let mount_fd = match opts.mode {
            Mode::FileHandles => {
                let root = self.inode(ROOT_ID).map_err(|e| io_error("root", e))?;
                let fd = root
                    .opened_fd()
                    .ok_or_else(|| io_error("root", error(libc::EBADF)))?;
                Some(file_handle::open_dir(fd).map_err(|e| io_error("open the root", e))?)
            }
            Mode::FindPaths => None,
        };
        for _ in 0..n {
            let node = read_node(input)?;
            if node.id == ROOT_ID {
                continue;
            }
            if node.id == 0 || node.id >= next_node {
                return Err(StateError::invalid(
                    "node id",
                    format!("{} (ids are 1 to {})", node.id, next_node.saturating_sub(1)),
                ));
            }
            match self.restore_node(&node, &dirs, &mut last_dir, mount_fd.as_ref(), &root_path) {
                Ok(data) => {
                    if let (SavedLocation::Path(p), true) = (&node.location, data.is_dir()) {
                        dirs.insert(*p, data);
                    }
                }
                Err(e) => {
                    let what = match &node.location {
                        SavedLocation::Path(p) => p.show(),
                        SavedLocation::Handle(_) => "(file handle)".into(),
                        SavedLocation::Lost(_) => "(lost on the source)".into(),
                        SavedLocation::Child { parent, name } => {
                            format!("{} in node {parent}", crate::logging::escaped(name))
                        }
                    };
                    if opts.on_error == OnError::Abort || super::is_resource_shortage(&e) {
                        return Err(io_error(
                            format!(
                                "node {} at {what} cannot be found again (the migration is \
                                 refused: --migration-on-error=abort)",
                                node.id
                            ),
                            e,
                        ));
                    }
                    if lost < LOGGED_LOSSES {
                        log::warn!(
                            "migration: node {} at {what} is lost ({e}); the guest gets ESTALE \
                             on it",
                            node.id
                        );
                    }
                    if !self.inodes.restore_lost(node.id) {
                        return Err(StateError::invalid("node id", format!("{} twice", node.id)));
                    }
                    lost += 1;
                }
            }
        }
        drop(dirs);
        self.inodes.reserve_ids(next_node);
        let n = input.count("handles", 8 + 8 + 4 + 1 + 1)?;
        let mut dropped = 0usize;
        for _ in 0..n {
            let h = input.u64("handle")?;
            if h == 0 || h >= next_handle {
                return Err(StateError::invalid("handle", format!("{h}")));
            }
            let inode = input.u64("handle's node")?;
            let flags = input.i32("handle's flags")?;
            let listing = match input.u8("handle's listing")? {
                LISTING_NONE => None,
                LISTING_STREAM => Some(Listing::Stream),
                LISTING_SNAPSHOT => Some(Listing::Snapshot(Arc::new(self.read_snapshot(input)?))),
                v => return Err(StateError::invalid("handle's listing", v)),
            };
            let is_dir = input.bool("handle is a directory")?;
            match self.restore_handle(h, inode, flags, is_dir, listing) {
                Ok(()) => {}
                Err(e) if opts.on_error == OnError::Abort || super::is_resource_shortage(&e) => {
                    return Err(io_error(
                        format!("handle {h} of node {inode} cannot be opened again"),
                        e,
                    ));
                }
                Err(e) => {
                    if dropped < LOGGED_LOSSES {
                        log::warn!(
                            "migration: handle {h} of node {inode} is lost ({e}); the guest gets \
                             EBADF on it"
                        );
                    }
                    dropped += 1;
                }
            }
        }
        self.handles.reserve_ids(next_handle);
        // Ranges of ids that answer ESTALE, when the source had any.
        if !input.rest().is_empty() {
            // They count against --max-nodes with the nodes, as on the source: a source with the
            // same limit sends no more than fit; past it (a source with a higher limit) the
            // oldest are dropped as they are read, and their ids answer EBADF.
            let n = input.count("stale id ranges", 16)?;
            for _ in 0..n {
                let start = input.u64("stale ids")?;
                let end = input.u64("stale ids")?;
                if end > next_node || !self.inodes.restore_dead_range(start, end) {
                    return Err(StateError::invalid(
                        "stale ids",
                        format!("{start}..{end} (ids taken, or beyond the next id {next_node})"),
                    ));
                }
            }
        }
        if lost > LOGGED_LOSSES || dropped > LOGGED_LOSSES {
            log::warn!("migration: {lost} nodes and {dropped} handles lost in all");
        }
        log::info!(
            "migration: loaded {} nodes ({lost} lost) and {} handles ({dropped} lost)",
            self.inodes.len(),
            n - dropped
        );
        Ok(())
    }

    /// A listing of a state, charged to the listing budget as the directory's own would be.
    fn read_snapshot(&self, input: &mut Decoder<'_>) -> Result<DirSnapshot, StateError> {
        let n = input.count("listing", 8 + 1 + 4 + 1)?;
        let records = || {
            let ino = input.u64("listing: inode")?;
            let dtype = input.u8("listing: type")?;
            let name = input.bytes("listing: name")?;
            if name.is_empty() || name.len() > NAME_MAX || name.contains(&b'/') || name.contains(&0)
            {
                return Err(StateError::invalid("listing: name", "not a file name"));
            }
            Ok((ino, dtype, name))
        };
        DirSnapshot::collect(n, records, &mut |c, n| self.dircache.reserve(c, n))?.map_err(|why| {
            StateError::Refused(format!(
                "a listing of {n} entries does not fit the listing budget here ({why:?}; {} of \
                 {} bytes held)",
                self.dircache.used(),
                self.dircache.cap()
            ))
        })
    }

    /// Finds a saved node again and adds it under its node id.
    fn restore_node(
        &self,
        node: &SavedNode<'_>,
        dirs: &HashMap<SavedPath<'_>, Node>,
        last_dir: &mut Option<(u64, OwnedFd)>,
        mount_fd: Option<&OwnedFd>,
        root_path: &[u8],
    ) -> io::Result<Node> {
        let root = self.inode(ROOT_ID)?;
        let (fd, parent) = match &node.location {
            SavedLocation::Child { parent, name } => {
                // A node of this state restored before it (or the root), and a directory: the
                // name is opened in it (`O_PATH | O_NOFOLLOW`, a plain name: never `..`).
                let dir = self.inodes.get(*parent).ok_or_else(|| {
                    refused(
                        libc::ENOENT,
                        format!("its parent, node {parent}, is not here"),
                    )
                })?;
                if !dir.is_dir() {
                    return Err(error(libc::ENOTDIR));
                }
                let name = CString::new(*name).map_err(|_| error(libc::EINVAL))?;
                let fd = match last_dir {
                    Some((id, fd)) if id == parent => {
                        sys::openat(fd.as_fd(), &name, open_path_flags(), 0)?
                    }
                    _ => sys::openat(self.path_fd(&dir)?.as_fd(), &name, open_path_flags(), 0)?,
                };
                (fd, Some((dir, name)))
            }
            SavedLocation::Lost(e) => return Err(io::Error::from_raw_os_error(*e)),
            SavedLocation::Path(path) => {
                let fd = self.open_beneath(path.names())?;
                let parent = match path.split_last() {
                    Some((dir, name)) => {
                        let name = CString::new(name).map_err(|_| error(libc::EINVAL))?;
                        match dir.0.is_empty() {
                            true => Some((root.clone(), name)),
                            false => dirs.get(&dir).map(|p| (p.clone(), name)),
                        }
                    }
                    None => None,
                };
                (fd, parent)
            }
            SavedLocation::Handle(h) => {
                let mount_fd = mount_fd.ok_or_else(|| error(libc::EBADF))?;
                let fd = h.open(mount_fd.as_fd(), open_path_flags())?;
                // A handle names any file of the file system, inside the shared directory or not.
                // One with a name is taken when that name, opened from the root one component
                // at a time, is the same file; one without (deleted while open) only when the
                // shared directory is its whole file system.
                match self.fd_path(fd.as_fd(), root_path) {
                    Ok(names) => {
                        let st = sys::stat_fd(fd.as_fd())?;
                        let there = self
                            .open_beneath(names.iter().map(|n| n.to_bytes()))
                            .and_then(|f| sys::stat_fd(f.as_fd()));
                        if !there.is_ok_and(|t| t.st_dev == st.st_dev && t.st_ino == st.st_ino) {
                            return Err(refused(
                                libc::EXDEV,
                                "its file handle names a file outside the shared directory",
                            ));
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        if !self.share_is_whole_mount(&root, root_path)? {
                            return Err(refused(
                                libc::ENOENT,
                                "it was deleted while open: kept only when the shared directory \
                                 is the root of its file system",
                            ));
                        }
                    }
                    Err(e) => return Err(e),
                }
                (fd, None)
            }
        };
        let (st, x) = sys::stat_fd_mnt(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != node.kind {
            return Err(refused(
                libc::ESTALE,
                format!(
                    "it was of type {:o} and is of type {:o} here",
                    node.kind,
                    st.st_mode & libc::S_IFMT
                ),
            ));
        }
        if let Some(want) = &node.fid {
            let here = FileHandle::fid_of_fd(fd.as_fd())?;
            if here.parts() != want.parts() {
                return Err(refused(
                    libc::ESTALE,
                    "it opens another file here than on the source (--migration-verify-handles)",
                ));
            }
        }
        let identity = self
            .nodes()
            .identity_of(&root, &st, &x, At::Fd(fd.as_fd()))?;
        let key = InodeKey::new(&st, &x, identity)?;
        let source = match parent {
            Some((parent, name)) => Source::Found(Origin::new(parent, &name)),
            None => Source::Fd(sys::dup(fd.as_fd())?),
        };
        let n = self
            .nodes()
            .new_inode(key, identity, At::Fd(fd.as_fd()), source)?;
        let data = self
            .inodes
            .restore(node.id, n, node.refcount)
            .map_err(|e| match e {
                NotAdded::Known(_) => refused(
                    libc::ESTALE,
                    "it is a file another node of the state is already",
                ),
                NotAdded::NoRoom => refused(libc::ENFILE, "no room for another node"),
            })?;
        if data.is_dir() {
            *last_dir = Some((node.id, fd));
        }
        Ok(data)
    }

    /// Whether the shared directory is the root of its file system and its mount's root (then
    /// every file a handle on that mount reaches is inside it).
    fn share_is_whole_mount(&self, root: &InodeData, here: &[u8]) -> io::Result<bool> {
        // Through the `/proc/self/fd` kept from before the sandbox: by its absolute path the
        // name would be looked up inside the shared directory once that is the root, in files
        // the guest writes.
        let info = sys::read_all(self.proc_self_fd.as_fd(), c"../mountinfo")?;
        for line in info.split(|b| *b == b'\n') {
            let f: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
            if f.len() < 5 || f[0] != root.key.mnt_id().to_string().as_bytes() {
                continue;
            }
            return Ok(f[3] == b"/" && crate::mountinfo::unescape(f[4]) == here);
        }
        Ok(false)
    }

    /// Opens a saved handle again and adds it under its number.
    fn restore_handle(
        &self,
        h: u64,
        inode: u64,
        flags: i32,
        is_dir: bool,
        listing: Option<Listing>,
    ) -> io::Result<()> {
        let node = self.inode(inode).map_err(|_| error(libc::EBADF))?;
        if node.is_stale() {
            return Err(error(libc::ESTALE));
        }
        let data = if is_dir {
            if !node.is_dir() {
                return Err(error(libc::ENOTDIR));
            }
            let file =
                self.open_node(&node, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
            let data = HandleData::dir(inode, file);
            if let (Some(l), Some(slot)) = (listing, data.dir.as_ref()) {
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(l);
            }
            data
        } else {
            if node.key.kind() != libc::S_IFREG {
                return Err(error(libc::EBADF));
            }
            match flags & libc::O_ACCMODE {
                libc::O_RDONLY => {}
                libc::O_WRONLY | libc::O_RDWR if !self.cfg.readonly => {}
                libc::O_WRONLY | libc::O_RDWR => return Err(error(libc::EROFS)),
                _ => return Err(error(libc::EINVAL)),
            }
            let file = self.open_node(&node, (flags & KEPT_FLAGS) | libc::O_CLOEXEC)?;
            HandleData::file(inode, file)
        };
        let data = self.handles.restore(h, data).ok_or_else(|| {
            log::warn!("migration: handle {h} twice in the state");
            error(libc::EBADF)
        })?;
        node.handles.fetch_add(1, Ordering::Relaxed);
        node.set_last_open(&data);
        Ok(())
    }
}

/// `located` in an order the destination can restore it in: the nodes located by path (or
/// otherwise) first, the shorter paths first; then each node located in a parent after that
/// parent. A loop of parents (names the host moved around) is sent as lost.
fn parents_first(located: Vec<(&Node, Location)>) -> Vec<(&Node, Location)> {
    let (mut direct, children): (Vec<_>, Vec<_>) = located
        .into_iter()
        .partition(|(_, l)| !matches!(l, Location::Child(..)));
    direct.sort_by_key(|(_, l)| match l {
        Location::Path(p) => p.len(),
        _ => 0,
    });
    let index: HashMap<u64, usize> = children
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.id, i))
        .collect();
    // 0: not placed; 1: on the way up from the node being placed; 2: placed.
    let mut state = vec![0u8; children.len()];
    let mut order = Vec::with_capacity(children.len());
    let mut looped = Vec::new();
    for start in 0..children.len() {
        let mut up = Vec::new();
        let mut i = start;
        let looped_here = loop {
            match state[i] {
                2 => break false,
                1 => break true,
                _ => {}
            }
            state[i] = 1;
            up.push(i);
            match &children[i].1 {
                Location::Child(p, _) => match index.get(p) {
                    Some(&j) => i = j,
                    None => break false,
                },
                _ => break false,
            }
        };
        for &k in &up {
            state[k] = 2;
        }
        if looped_here {
            looped.extend(up);
        } else {
            order.extend(up.into_iter().rev());
        }
    }
    let mut children: Vec<Option<(&Node, Location)>> = children.into_iter().map(Some).collect();
    for k in looped {
        if let Some((n, _)) = children[k].take() {
            direct.push((n, Location::Lost(libc::ELOOP)));
        }
    }
    direct.extend(order.into_iter().filter_map(|k| children[k].take()));
    direct
}

fn read_handle(input: &mut Decoder<'_>, what: &'static str) -> Result<FileHandle, StateError> {
    let t = input.i32(what)?;
    let b = input.bytes(what)?;
    FileHandle::from_parts(0, t, b)
        .ok_or_else(|| StateError::invalid(what, "longer than any handle"))
}

fn read_node<'a>(input: &mut Decoder<'a>) -> Result<SavedNode<'a>, StateError> {
    let id = input.u64("node id")?;
    // A guest holds fewer references than it can make requests.
    let refcount = input.u64("node's references")?.min(MAX_ID);
    let kind = input.u32("node's type")?;
    if kind & !libc::S_IFMT != 0 || kind == 0 {
        return Err(StateError::invalid("node's type", format!("{kind:o}")));
    }
    let location = match input.u8("node's location")? {
        LOC_LOST => SavedLocation::Lost(input.i32("node's error")?),
        LOC_PATH => {
            let n = input.count("path", 5)?;
            if n > MAX_DEPTH {
                return Err(StateError::invalid("path", "too deep"));
            }
            let start = input.rest();
            for _ in 0..n {
                input.plain_name("path name")?;
            }
            if n == 0 && id != ROOT_ID {
                return Err(StateError::invalid(
                    "path",
                    format!("node {id} at the root"),
                ));
            }
            SavedLocation::Path(SavedPath(input.consumed_since(start)))
        }
        LOC_HANDLE => SavedLocation::Handle(read_handle(input, "node's file handle")?),
        LOC_CHILD => SavedLocation::Child {
            parent: input.u64("node's parent")?,
            name: input.plain_name("node's name")?,
        },
        v => return Err(StateError::invalid("node's location", v)),
    };
    let fid = match input.bool("node has an identifying handle")? {
        true => Some(read_handle(input, "node's identifying handle")?),
        false => None,
    };
    Ok(SavedNode {
        id,
        refcount,
        kind,
        location,
        fid,
    })
}
