//! The passthrough filesystem: serves a host directory to the guest.
//!
//! # Security model
//! The guest is untrusted. Every operation is performed relative to a descriptor under the shared
//! directory: node ids map to host files reached by parent and name, `O_PATH | O_NOFOLLOW`
//! descriptors, or file handles the daemon took itself from such descriptors and never takes
//! from the guest (`node`, `file_handle`), names from the guest
//! are single components (no `/`, not empty, at most 255 bytes; `.` and `..` are refused by the
//! calls that create or remove names), and no host path is ever built from guest names. Symlinks
//! are never followed on the host: lookups use `O_NOFOLLOW`, stat and chown use
//! `AT_SYMLINK_NOFOLLOW`, and an inode is reopened for I/O through its `/proc/self/fd/N` magic
//! link, which resolves to the inode itself (opening a symlink that way fails with `ELOOP`).
//! `..` of the shared directory is the shared directory.
//!
//! # Layout
//! Each line uses only the modules of the lines below it (`doc/architecture.md`, checked by
//! `tests/it/architecture.rs`):
//! - `ops`: the requests, one method each (`impl FileSystem for PassthroughFs`); `migration`:
//!   the nodes and handles a migration saves and finds again;
//! - this module: [`PassthroughFs`], the descriptors of nodes, opening by name, listings, INIT
//!   negotiation; it lends `identity` and `xattr` what they need of it (`nodes`, `xattrs`);
//! - `identity`: telling a node's file from a later file with the same inode number;
//!   `dircache`: directory snapshots shared between handles, under one memory budget;
//! - `node`: a node, in a folder of its own (its modules sit on this line and the two last):
//!   `node::inode`, the node's data and the node id ↔ host file tables with lookup counts;
//! - `handle`: open files and directories; `io_fds`: per-inode descriptors for requests
//!   without a handle (no-open mode); `locks`: the guest's locks, held on the host; `file_handle`: file handles, kept instead of descriptors
//!   with `--inode-file-handles`;
//! - `dir`: directory snapshots and streamed listings served by READDIR / READDIRPLUS;
//!   `node::key`: what identifies a host file or a directory's state; `node::memory`: the
//!   memory given back after FORGET; `config`: the settings; `xattr`:
//!   extended attributes, ACL gating, security labels, set-id clearing;
//! - `budget`: the listings' memory budget; `node::slab`: the memory of the nodes; `sys`: thin
//!   wrappers over the syscalls; `xattrmap`:
//!   the `--xattrmap` language; `threadfs`: per-thread working directory and umask;
//!   `credentials`: creating files as the guest caller when running as root.

mod budget;
pub mod config;
mod credentials;
mod dir;
mod dircache;
mod file_handle;
mod handle;
mod identity;
mod io_fds;
mod locks;
mod migration;
mod node;
mod ops;
mod sys;
#[cfg(test)]
mod tests;
mod threadfs;
mod xattr;
pub mod xattrmap;

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

pub use config::{CacheMode, Config, InodeFileHandles, Negotiate};
pub use credentials::drop_supplementary_groups;
pub use node::memory::allocator_gives_memory_back;

use crate::filesystem::{
    Context, DirEntry, Entry, FileLock, FileSystem, LateReply, LockKind, Opened, SecCtx, SetAttr,
    SetTime, XattrReply, ZeroCopyReader, ZeroCopyWriter,
};
use crate::fuse::abi::{fopen, init, ROOT_ID};
use crate::os::open_path_dir;
use dir::DirSnapshot;
use dircache::DirCache;
use file_handle::{FileHandle, MountFds};
use handle::{HandleData, HandleStore};
use identity::{At, MountIdentities, Nodes};
use io_fds::{Access, IoFd, IoFds};
use node::inode::{InodeData, InodeStore, Node, Origin, PathFd, Source};
use node::key::{self, InodeKey, Stamp};
use node::slab;
use sys::{error, ProcName};
use xattr::Xattrs;

/// Longest name of a directory entry.
const NAME_MAX: usize = 255;

/// Levels of a chain of ancestors without descriptors between two that keep theirs once
/// walked (see [`PassthroughFs::path_fd`]).
const KEEP_EVERY: usize = 64;

/// A filesystem that passes every request through to a host directory.
pub struct PassthroughFs {
    cfg: Config,
    inodes: InodeStore,
    handles: HandleStore,
    /// Settled directory snapshots shared between handles.
    dircache: DirCache,
    /// `/proc/self/fd`, to reopen inodes through their magic links.
    proc_self_fd: OwnedFd,
    /// Whether the daemon runs as root (and so creates files as the caller).
    as_root: bool,
    /// File handle mode in effect (`Never` when `prefer` found handles unusable at start).
    fh_mode: InodeFileHandles,
    /// A descriptor per mount, to open file handles through.
    mounts: MountFds,
    /// How each mount's files are told apart from later files with the same inode number.
    mount_identities: MountIdentities,
    /// POSIX ACLs enabled in this session (`--posix-acl`, agreed at INIT).
    posix_acl_on: AtomicBool,
    /// Security contexts of creations applied in this session (`--security-label`, agreed).
    security_ctx_on: AtomicBool,
    /// The host name of `security.capability` when `--xattrmap` renames it.
    cap_xattr: Option<CString>,
    /// Descriptors of inodes the guest reads and writes without a handle (no-open mode).
    io_fds: IoFds,
    /// OPEN is answered with `ENOSYS`: the guest sends file requests with handle 0 and no
    /// RELEASE (`--cache=always` and a guest offering `FUSE_NO_OPEN_SUPPORT`).
    no_open: AtomicBool,
    /// OPENDIR is answered with `ENOSYS` (`FUSE_NO_OPENDIR_SUPPORT`), likewise for directories.
    no_opendir: AtomicBool,
    /// The guest's locks, held on host files (`locks`).
    locks: Arc<locks::Locks>,
    /// `FUSE_POSIX_LOCKS` agreed in this session.
    posix_locks_on: AtomicBool,
    /// `FUSE_FLOCK_LOCKS` agreed in this session.
    flock_on: AtomicBool,
}

/// A descriptor a file request is served with: its handle's, or the inode's own.
enum FileRef {
    Handle(Arc<HandleData>),
    Inode(IoFd),
}

impl FileRef {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            FileRef::Handle(h) => h.fd(),
            FileRef::Inode(f) => f.fd(),
        }
    }
}

/// Whether an error means the process is out of descriptors.
fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Refuses names that are empty, contain `/`, or are longer than `NAME_MAX`.
fn check_name(name: &CStr) -> io::Result<()> {
    let b = name.to_bytes();
    if b.is_empty() || b.contains(&b'/') {
        return Err(error(libc::EINVAL));
    }
    if b.len() > NAME_MAX {
        return Err(error(libc::ENAMETOOLONG));
    }
    Ok(())
}

/// As [`check_name`], and also refuses `.` and `..` (names that are created, removed or moved).
fn check_new_name(name: &CStr) -> io::Result<()> {
    check_name(name)?;
    match name.to_bytes() {
        b"." | b".." => Err(error(libc::EINVAL)),
        _ => Ok(()),
    }
}

/// Whether `open(2)` flags may change the file.
fn flags_write(flags: i32) -> bool {
    let acc = flags & libc::O_ACCMODE;
    acc == libc::O_WRONLY || acc == libc::O_RDWR || flags & libc::O_TRUNC != 0
}

fn timespec(t: SetTime) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        SetTime::Omit => (0, libc::UTIME_OMIT),
        SetTime::Now => (0, libc::UTIME_NOW),
        SetTime::At(s, ns) => (s, ns as i64),
    };
    libc::timespec {
        tv_sec: tv_sec as libc::time_t,
        tv_nsec: tv_nsec as _,
    }
}

/// Whether a file of type `kind` (`S_IFMT` bits) may be opened for I/O on the host: symlinks
/// are never followed (`ELOOP`); device nodes, FIFOs and sockets are served by the guest kernel
/// itself and never opened here (`ENXIO`), so a node the guest made cannot reach a host device.
fn check_openable(kind: u32) -> io::Result<()> {
    match kind {
        libc::S_IFREG | libc::S_IFDIR => Ok(()),
        libc::S_IFLNK => Err(error(libc::ELOOP)),
        _ => Err(error(libc::ENXIO)),
    }
}

/// Whether `e` means the daemon ran out of a resource (descriptors, memory) rather than that
/// a path is wrong.
fn is_resource_shortage(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    )
}

fn open_path_flags() -> i32 {
    libc::O_PATH | libc::O_NOFOLLOW
}

impl PassthroughFs {
    /// Opens the shared directory `cfg.root_dir` and `/proc/self/fd`.
    pub fn new(cfg: Config) -> io::Result<PassthroughFs> {
        let proc_self_fd = open_path_dir(std::path::Path::new("/proc/self/fd"))?;
        Self::with_proc_self_fd(cfg, proc_self_fd)
    }

    /// Opens the shared directory `cfg.root_dir`, with `proc_self_fd` (a descriptor of
    /// `/proc/self/fd`, opened before a sandbox hid `/proc`) to reopen inodes through.
    pub fn with_proc_self_fd(mut cfg: Config, proc_self_fd: OwnedFd) -> io::Result<PassthroughFs> {
        // The node memory has room for this many (41 million): half of it, since a node the
        // guest forgot stays while a node it holds was found in it. That is no proof: a chain
        // restored by a migration holds every ancestor the guest forgot, so a node with no slot
        // left is refused with ENFILE (`slab::Ref::try_new`), never the process stopped.
        if cfg.max_nodes > slab::CAPACITY / 2 {
            log::warn!(
                "--max-nodes={}: at most {} nodes are served",
                cfg.max_nodes,
                slab::CAPACITY / 2
            );
            cfg.max_nodes = slab::CAPACITY / 2;
        }
        let root = open_path_dir(&cfg.root_dir)?;
        let (st, x) = sys::stat_fd_mnt(root.as_fd())?;
        let mounts = MountFds::default();
        let fh_mode = file_handle::probe(cfg.inode_file_handles, root.as_fd(), &mounts)?;
        let mount_identities = MountIdentities::default();
        let root_identity = identity::probe(root.as_fd(), &x);
        mount_identities.insert(st.st_dev, x.mnt_id, root_identity);
        let inodes = InodeStore::new(root, &st, &x, root_identity)?;
        inodes.set_limit(cfg.max_nodes);
        Ok(PassthroughFs {
            inodes,
            mount_identities,
            fh_mode,
            mounts,
            handles: HandleStore::default(),
            dircache: DirCache::new(cfg.listing_memory),
            proc_self_fd,
            as_root: credentials::running_as_root(),
            posix_acl_on: AtomicBool::new(false),
            security_ctx_on: AtomicBool::new(false),
            cap_xattr: xattr::remapped_capability(cfg.xattrmap.as_ref()),
            io_fds: IoFds::default(),
            no_open: AtomicBool::new(false),
            no_opendir: AtomicBool::new(false),
            locks: locks::Locks::new(),
            posix_locks_on: AtomicBool::new(false),
            flock_on: AtomicBool::new(false),
            cfg,
        })
    }

    /// The inode `id`; `ESTALE` for one whose file is gone (see [`InodeStore::bury`]), `EBADF`
    /// for an id the guest does not hold.
    fn inode(&self, id: u64) -> io::Result<Node> {
        self.inodes
            .get(id)
            .ok_or_else(|| match self.inodes.is_dead(id) {
                true => error(libc::ESTALE),
                false => error(libc::EBADF),
            })
    }

    /// Whether the guest still knows node `id` (not forgotten: it is in the table, or its file
    /// is gone and its id answers `ESTALE` until its FORGET). Ids are never given again.
    fn node_known(&self, id: u64) -> bool {
        self.inodes.get(id).is_some() || self.inodes.is_dead(id)
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.cfg.readonly {
            Err(error(libc::EROFS))
        } else {
            Ok(())
        }
    }

    fn xattr_enabled(&self) -> io::Result<()> {
        if self.cfg.xattr {
            Ok(())
        } else {
            Err(error(libc::ENOSYS))
        }
    }

    fn entry(&self, id: u64, attr: libc::stat64) -> Entry {
        Entry {
            inode: id,
            generation: 0,
            attr,
            attr_flags: 0,
            attr_timeout: self.cfg.attr_timeout,
            entry_timeout: self.cfg.entry_timeout,
        }
    }

    /// Looks `name` up in `parent` without following a symlink and takes one reference. One
    /// `statx` (and, for a file born within the last second, its file handle: see `identity`);
    /// a new inode gets no descriptor until an operation needs one, but for a directory in
    /// no-opendir mode, which keeps its `O_PATH` descriptor from here on. With
    /// `--inode-file-handles=mandatory` a new inode gets its file handle here, and the lookup
    /// fails when the host file system cannot give one.
    fn do_lookup(&self, parent: &Node, name: &CStr) -> io::Result<Entry> {
        let pfd = self.path_fd(parent)?;
        let (st, x) = sys::stat_at_mnt(pfd.as_fd(), name)?;
        let at = At::Name(pfd.as_fd(), name);
        let (node, new) = self.nodes().find_or_add(parent, &st, &x, at, || {
            Ok(Source::Found(Origin::new(parent.clone(), name)))
        })?;
        if !new {
            node.found_at(parent, name);
        } else if self.fh_mode == InodeFileHandles::Mandatory && node.file_handle().is_none() {
            match self.handle_by_name(parent, name, &node) {
                Ok(h) => node.keep_file_handle(h),
                Err(e) => {
                    self.inodes.forget(node.id, 1);
                    return Err(e);
                }
            }
        }
        if self.no_opendir() && node.is_dir() && node.opened_fd().is_none() {
            // The guest may hold it open without the daemon knowing (no OPENDIR), and fstat
            // or list it after its name is gone, renamed over or removed by the guest or the
            // host: its descriptor is kept from now on, as every directory used as a parent
            // keeps one. Without one (out of descriptors) the lookup still succeeds; the
            // directory is then reached by its name only.
            if let Err(e) = self.path_fd(&node) {
                log::debug!("directory node {} keeps no descriptor: {e}", node.id);
            }
        }
        let mut entry = self.entry(node.id, st);
        if self.is_submount(parent, &node.key) {
            entry.attr_flags |= crate::fuse::abi::ATTR_SUBMOUNT;
        }
        Ok(entry)
    }

    /// Whether a directory identified by `key` under `parent` is the root of another host
    /// mount, to be announced to the guest (`--announce-submounts`).
    fn is_submount(&self, parent: &InodeData, key: &InodeKey) -> bool {
        self.cfg.announce_submounts && key.kind() == libc::S_IFDIR && !key.same_mount(&parent.key)
    }

    /// Whether `data` keeps a file handle rather than an `O_PATH` descriptor: in the file
    /// handle modes, every inode but directories. Directories keep their descriptors: they are
    /// the parents every lookup, creation and removal goes through, and a guest holds few of
    /// them next to its files.
    fn uses_file_handle(&self, data: &InodeData) -> bool {
        self.fh_mode != InodeFileHandles::Never && !data.is_dir()
    }

    /// An `O_PATH` descriptor of `data`.
    ///
    /// The first time, it is opened through the parent and name (checking that the name still
    /// leads to the same file). Without file handles (and for directories) that descriptor is
    /// kept from then on. With file handles, a file handle is taken from it instead and each
    /// call opens a descriptor for its caller: through the name while it leads to the file,
    /// else through the handle the guest last opened it with (the file may be unlinked), else
    /// through the file handle (the file was renamed or moved on the host). In `prefer` mode a
    /// file whose file system gives no handles keeps its descriptor. When nothing reaches the
    /// file, the inode is stale (`ESTALE`).
    ///
    /// A node restored by a migration is reached through its parent, which may be reached
    /// through its own, and so on up a chain as deep as the state made it: the chain is
    /// walked with a loop, never a recursion (its depth is the guest's and the state's to
    /// choose; 100,000 levels overflowed a queue worker's stack). The ancestors without a
    /// descriptor are gathered first (at most the nodes there are), then opened from the
    /// highest down. One in [`KEEP_EVERY`] keeps its descriptor (they are directories): a later
    /// walk from anywhere below stops within that many levels, and a chain costs a descriptor
    /// per [`KEEP_EVERY`] levels, not one per level (100,000 levels would take more descriptors
    /// than most hosts allow a process).
    fn path_fd<'a>(&self, data: &'a InodeData) -> io::Result<PathFd<'a>> {
        if let Some(fd) = data.opened_fd() {
            return Ok(PathFd::Kept(fd));
        }
        // A concurrent rename can move a node of the chain under another parent between the
        // walk up and the walk down: the walk is then made again, a few times at most.
        for _ in 0..4 {
            if let Some(fd) = self.path_fd_walk(data)? {
                return Ok(fd);
            }
        }
        Err(error(libc::ESTALE))
    }

    /// One walk of [`Self::path_fd`]: `None` when a node of the chain was moved meanwhile.
    fn path_fd_walk<'a>(&self, data: &'a InodeData) -> io::Result<Option<PathFd<'a>>> {
        // The ancestors reached through their own parent (no descriptor, not stale), nearest
        // first. Most nodes' parent keeps a descriptor: nothing is gathered, nothing allocated.
        let mut chain: Vec<Node> = Vec::new();
        let mut up = data.parent().filter(|_| !data.is_stale());
        while let Some(p) = up {
            if p.opened_fd().is_some() {
                break;
            }
            // One without a usable parent (stale, or restored by file handle) is reached
            // otherwise: the walk stops there.
            up = p.parent().filter(|_| !p.is_stale());
            chain.push(p);
        }
        // Down from the highest: each node opened through the one above it.
        let mut above: Option<(&Node, PathFd<'_>)> = None;
        for (i, node) in chain.iter().rev().enumerate() {
            let keep = (i + 1) % KEEP_EVERY == 0;
            let parent = above.as_ref().map(|(n, fd)| (*n, fd));
            let fd = match self.path_fd_step(node, parent, keep)? {
                Some(fd) => fd,
                None => return Ok(None),
            };
            above = Some((node, fd));
        }
        self.path_fd_step(data, above.as_ref().map(|(n, fd)| (*n, fd)), true)
    }

    /// A descriptor of `data` when its parent's is `parent` (the node and its descriptor) or
    /// its parent keeps one; `None` when its parent is another node now (it was moved). A
    /// directory keeps the descriptor opened when `keep` (else it is the caller's alone).
    fn path_fd_step<'a>(
        &self,
        data: &'a InodeData,
        parent: Option<(&Node, &PathFd<'_>)>,
        keep: bool,
    ) -> io::Result<Option<PathFd<'a>>> {
        if let Some(fd) = data.opened_fd() {
            return Ok(Some(PathFd::Kept(fd)));
        }
        // A stale inode is reached by no name: its number names another file now.
        let origin = data.origin().filter(|_| !data.is_stale());
        let by_name = match &origin {
            Some((p, name)) => {
                let pfd = match parent {
                    Some((n, fd)) if Node::ptr_eq(n, p) => fd.as_fd(),
                    _ => match p.opened_fd() {
                        Some(fd) => fd,
                        None => return Ok(None),
                    },
                };
                match sys::openat(pfd, name, open_path_flags(), 0) {
                    Ok(fd) if self.nodes().is_inode(fd.as_fd(), data)? => Some(fd),
                    // Out of descriptors or memory says nothing about where the name leads:
                    // the guest gets that error, not ESTALE.
                    Err(e) if is_resource_shortage(&e) => return Err(e),
                    _ => None,
                }
            }
            None => None,
        };
        if !self.uses_file_handle(data) {
            let fd = match by_name {
                Some(fd) => fd,
                None => self.last_open_fd(data)?,
            };
            if !keep {
                return Ok(Some(PathFd::Owned(fd)));
            }
            return Ok(Some(PathFd::Kept(data.keep_fd(fd))));
        }
        if let Some(fd) = by_name {
            if data.file_handle().is_some() {
                return Ok(Some(PathFd::Owned(fd)));
            }
            let parent = origin.as_ref().map(|(p, _)| p.as_ref());
            return match self.handle_of(fd.as_fd(), parent) {
                Ok(h) => {
                    data.keep_file_handle(h);
                    Ok(Some(PathFd::Owned(fd)))
                }
                Err(e) if self.fh_mode == InodeFileHandles::Mandatory => Err(e),
                Err(e) => {
                    file_handle::note_fallback(data.key.mnt_id(), &e);
                    Ok(Some(PathFd::Kept(data.keep_fd(fd))))
                }
            };
        }
        if let Ok(fd) = self.last_open_fd(data) {
            return Ok(Some(PathFd::Owned(fd)));
        }
        if let Some(h) = data.file_handle() {
            if let Ok(fd) = self.mounts.open(h, open_path_flags()) {
                if self.nodes().is_inode(fd.as_fd(), data)? {
                    return Ok(Some(PathFd::Owned(fd)));
                }
            }
        }
        Err(error(libc::ESTALE))
    }

    /// An `O_PATH` descriptor of `data` through the handle it was last opened with, which
    /// still reaches it when its name is gone; `ESTALE` when it has none open.
    fn last_open_fd(&self, data: &InodeData) -> io::Result<OwnedFd> {
        let h = data.last_open().ok_or_else(|| error(libc::ESTALE))?;
        self.reopen_path(h.fd())
    }

    /// A new `O_PATH` descriptor of the file `fd` refers to, through `/proc/self/fd/N`.
    fn reopen_path(&self, fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        sys::reopen_path(self.proc_self_fd.as_fd(), fd)
    }

    /// The extended-attribute rules of this session (see `xattr`).
    fn xattrs(&self) -> Xattrs<'_> {
        Xattrs {
            map: self.cfg.xattrmap.as_ref(),
            cap: self.cap_xattr.as_deref(),
            acl: self.posix_acl_on.load(Ordering::Relaxed),
            proc_self_fd: self.proc_self_fd.as_fd(),
        }
    }

    /// Whether security contexts sent with creations are applied in this session.
    fn labels_enabled(&self) -> bool {
        self.security_ctx_on.load(Ordering::Relaxed)
    }

    /// The node table with what tells its files apart (see `identity`).
    fn nodes(&self) -> Nodes<'_> {
        Nodes {
            inodes: &self.inodes,
            mounts: &self.mount_identities,
            proc_self_fd: self.proc_self_fd.as_fd(),
            max_nodes: self.cfg.max_nodes,
        }
    }

    /// The file handle of the file `fd` (a descriptor verified to be the inode's), with a
    /// descriptor of its mount recorded to open it through. `parent` is the directory it was
    /// found in, which is opened for that when on the same mount; a file on another mount
    /// than its parent is that mount's root, and only a directory can be opened for it
    /// (`EOPNOTSUPP` for a file mounted on its own).
    fn handle_of(&self, fd: BorrowedFd<'_>, parent: Option<&InodeData>) -> io::Result<FileHandle> {
        let h = FileHandle::of_fd(fd)?;
        self.mounts.ensure(h.mnt_id, || {
            let dir = parent
                .filter(|p| p.key.mnt_id() == h.mnt_id)
                .and_then(|p| p.opened_fd());
            match dir {
                Some(dir) => file_handle::open_dir(dir),
                None if sys::stat_fd(fd)?.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    file_handle::open_dir(fd)
                }
                None => Err(error(libc::EOPNOTSUPP)),
            }
        })?;
        Ok(h)
    }

    /// The file handle of `name` in `parent`, checked to be the file of `node` (`ESTALE` when
    /// the name changed since it was looked at).
    fn handle_by_name(
        &self,
        parent: &InodeData,
        name: &CStr,
        node: &InodeData,
    ) -> io::Result<FileHandle> {
        let fd = sys::openat(self.path_fd(parent)?.as_fd(), name, open_path_flags(), 0)?;
        if !self.nodes().is_inode(fd.as_fd(), node)? {
            return Err(error(libc::ESTALE));
        }
        self.handle_of(fd.as_fd(), Some(parent)).inspect_err(|e| {
            log::debug!("no file handle for node in directory {}: {e}", parent.id);
        })
    }

    /// Attributes of `data`: one `statx` through its parent and name when it has no descriptor.
    fn stat_node(&self, data: &InodeData) -> io::Result<libc::stat64> {
        if let Some(fd) = data.opened_fd() {
            return sys::stat_fd(fd);
        }
        if let Some((parent, name)) = data.origin().filter(|_| !data.is_stale()) {
            let pfd = self.path_fd(&parent)?;
            if let Ok((st, x)) = sys::stat_at_mnt(pfd.as_fd(), &name) {
                // Not proven through the name (it may have changed meanwhile): through a
                // descriptor below.
                if InodeKey::new(&st, &x, data.identity)
                    .and_then(|key| {
                        self.nodes()
                            .same_file(data, &key, At::Name(pfd.as_fd(), &name))
                    })
                    .unwrap_or(false)
                {
                    return Ok(st);
                }
            }
        }
        sys::stat_fd(self.path_fd(data)?.as_fd())
    }

    /// Opens `data` for I/O with `flags`: through its parent and name when it has no descriptor
    /// (checking that the name still leads to it), through `/proc/self/fd/N` otherwise. Only a
    /// regular file or a directory: a device node, FIFO or socket is never opened on the host,
    /// whatever mount it is on (the guest opens those in its own kernel). Every open of a node
    /// comes here, so this holds for mounts the host adds under the share after the sandbox was
    /// made `nodev` too (doc/security.md).
    fn open_node(&self, data: &InodeData, flags: i32) -> io::Result<OwnedFd> {
        if !matches!(data.key.kind(), libc::S_IFREG | libc::S_IFDIR) {
            return Err(error(match data.key.kind() {
                libc::S_IFLNK => libc::ELOOP,
                _ => libc::ENXIO,
            }));
        }
        // Through the name: an O_PATH descriptor (which opens nothing, whatever the name now
        // leads to) checked to be this inode, then reopened for I/O. Never an open for I/O of
        // a name before the check: a FIFO or device node put there would be opened.
        if data.opened_fd().is_none() {
            if let Some((parent, name)) = data.origin().filter(|_| !data.is_stale()) {
                let pfd = self.path_fd(&parent)?;
                match sys::openat(pfd.as_fd(), &name, open_path_flags(), 0) {
                    Ok(path) if self.nodes().is_inode(path.as_fd(), data)? => {
                        return self.reopen_fd(path.as_fd(), flags);
                    }
                    Err(e) if out_of_fds(&e) => return Err(e),
                    _ => {}
                }
            }
        }
        let file = self.reopen_fd(self.path_fd(data)?.as_fd(), flags)?;
        // The path descriptor was checked (or is held); the reopened one must be that file.
        let (st, x) = sys::stat_fd_mnt(file.as_fd())?;
        if InodeKey::new(&st, &x, data.identity)? != data.key {
            log::warn!(
                "node {}: a reopened descriptor is another file; refused",
                data.id
            );
            return Err(error(libc::ESTALE));
        }
        Ok(file)
    }

    /// Looks up `..` of a directory other than the root. The parent of a directory the guest
    /// holds is one the guest looked up on its way down; a parent the table does not know means
    /// the directory was moved out of the shared directory on the host, and is refused.
    fn lookup_parent(&self, dir: &InodeData, dotdot: &CStr) -> io::Result<Entry> {
        let dfd = self.path_fd(dir)?;
        let (st, x) = sys::stat_at_mnt(dfd.as_fd(), dotdot)?;
        let at = At::Name(dfd.as_fd(), dotdot);
        let key = self.nodes().key_at(dir, &st, &x, at)?;
        let known = match self.inodes.ref_known(&key) {
            Some(known) => match self.nodes().same_file(&known, &key, at) {
                Ok(true) => Some(known),
                r => {
                    self.inodes.forget(known.id, 1);
                    r?;
                    None
                }
            },
            None => None,
        };
        match known {
            Some(known) => Ok(self.entry(known.id, st)),
            None => {
                log::warn!(
                    "lookup of '..' of node {} leaves the shared directory; refused",
                    dir.id
                );
                Err(error(libc::EACCES))
            }
        }
    }

    /// Opens the file `fd` refers to through `/proc/self/fd/N`; `O_DIRECT` is dropped when the
    /// host file system refuses it.
    fn reopen_fd(&self, fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
        let name = ProcName::new(fd.as_raw_fd());
        let flags = flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL);
        match sys::openat(self.proc_self_fd.as_fd(), name.name(), flags, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && flags & libc::O_DIRECT != 0 => {
                sys::openat(
                    self.proc_self_fd.as_fd(),
                    name.name(),
                    flags & !libc::O_DIRECT,
                    0,
                )
            }
            r => r,
        }
    }

    /// The guest's `open(2)` flags as the host file is opened with: creation, terminal,
    /// path-only and signal flags removed; `O_DIRECT` removed unless `--allow-direct-io`,
    /// `O_NOATIME` unless `--preserve-noatime`; with writeback caching, write-only becomes
    /// read-write (the guest's page cache may read) and `O_APPEND` is left to the guest.
    fn host_open_flags(&self, flags: i32) -> i32 {
        let mut f = flags
            & !(libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOCTTY
                | libc::O_NOFOLLOW
                | libc::O_PATH
                | libc::O_ASYNC
                | (libc::O_TMPFILE & !libc::O_DIRECTORY));
        if !self.cfg.allow_direct_io {
            f &= !libc::O_DIRECT;
        }
        if !self.cfg.preserve_noatime {
            f &= !libc::O_NOATIME;
        }
        if self.cfg.writeback {
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        if self.no_open() {
            // A file created in no-open mode is kept as the inode's own descriptor, shared by
            // every later handle-less request: positioned writes, no direct I/O.
            f &= !(libc::O_APPEND | libc::O_DIRECT);
        }
        f
    }

    /// OPEN and CREATE flags of a file. `keep`: the guest's cached pages of the file are still
    /// the file's (see [`Self::keep_file_pages`]); only `auto` uses it, `always` keeps them
    /// anyway. FLUSH is asked for only when the guest's record locks are held on the host (it
    /// drops the closing process's locks); otherwise `FOPEN_NOFLUSH` (ignored by the guest
    /// under its writeback cache, which needs FLUSH): writes reach the host at WRITE, and
    /// RELEASE closes the host file.
    fn file_open_flags(&self, keep: bool) -> u32 {
        // With record locks held on the host, FLUSH tells which guest process closed the file:
        // its locks go then (`locks`).
        let noflush = match self.posix_locks_on.load(Ordering::Relaxed) {
            true => 0,
            false => fopen::NOFLUSH,
        };
        noflush
            | match self.cfg.cache {
                CacheMode::Never | CacheMode::Metadata => fopen::DIRECT_IO,
                CacheMode::Auto if keep => fopen::KEEP_CACHE,
                CacheMode::Auto => 0,
                CacheMode::Always => fopen::KEEP_CACHE,
            }
    }

    /// Whether an OPEN of the file `data`, seen as `st` just before it was opened, may let the
    /// guest keep the pages it cached (`auto`): only when the file has the stamp it had at the
    /// previous OPEN, and that stamp was settled then, so that no change since can hide behind
    /// an equal stamp. Every page the guest holds was read after that OPEN, or kept by it under
    /// the same rule. Records `st` for the next OPEN; `truncating` (`O_TRUNC`) keeps nothing.
    /// Without it, as the reference does, the guest drops the file's pages at every open.
    fn keep_file_pages(&self, data: &InodeData, st: &libc::stat64, truncating: bool) -> bool {
        if self.cfg.cache != CacheMode::Auto || self.cfg.writeback {
            return false;
        }
        let stamp = Stamp::of(st);
        data.update_served(|served| {
            let keep = !truncating && *served == Some(stamp);
            *served = if truncating { None } else { stamp.if_settled() };
            keep
        })
    }

    /// OPENDIR flags. `always` lets the guest keep listings. `metadata` lets it cache them and
    /// keep the cached one only when the directory is unchanged since the daemon served that
    /// listing (same settled stamp). `auto` has the guest read the listing at every opendir, as
    /// the reference does: the entries and attributes a READDIRPLUS brings refresh a page of
    /// the guest's (1 s) at once, where a kept listing would leave it to look up or stat each
    /// expired child on its own (and the daemon cannot tell which of them the guest's reads
    /// made stale). `never` caches none.
    fn dir_open_flags(&self, data: &InodeData, dir: BorrowedFd<'_>) -> u32 {
        match self.cfg.cache {
            CacheMode::Always => fopen::CACHE_DIR | fopen::KEEP_CACHE,
            CacheMode::Metadata => {
                let served = data.served();
                let unchanged = served
                    .is_some_and(|stamp| sys::stat_fd(dir).is_ok_and(|st| Stamp::of(&st) == stamp));
                if unchanged {
                    fopen::CACHE_DIR | fopen::KEEP_CACHE
                } else {
                    fopen::CACHE_DIR
                }
            }
            CacheMode::Auto => fopen::CACHE_DIR,
            CacheMode::Never => 0,
        }
    }

    /// What the cache holds for the directory `data` with `stamp`: a shared snapshot (the stamp
    /// is settled) or the mark that it is too large for one; `None` when it must be read.
    fn cached_listing(&self, data: &InodeData, stamp: &Stamp) -> Option<(dir::Listing, bool)> {
        match self.dircache.get(&data.key, stamp) {
            dircache::Found::Snapshot(snap) => Some((dir::Listing::Snapshot(snap), true)),
            dircache::Found::TooBig => Some((dir::Listing::Stream, false)),
            dircache::Found::Miss => None,
        }
    }

    /// A new listing of the directory `data`, open for reading as `dir` (`rewind` when that was
    /// read before) and stamped `stamp` just before: a snapshot when it fits the listing budget
    /// (shared from then on if the stamp is settled), a stream otherwise. The flag tells whether
    /// a settled snapshot serves it.
    fn read_listing(
        &self,
        data: &InodeData,
        stamp: Stamp,
        dir: BorrowedFd<'_>,
        rewind: bool,
    ) -> io::Result<(dir::Listing, bool)> {
        let settled = stamp.settled(key::now());
        match DirSnapshot::read(dir, rewind, &mut |c, n| self.dircache.reserve(c, n))? {
            Ok(snap) => {
                let snap = Arc::new(snap);
                if settled {
                    self.dircache.insert(data.key, stamp, snap.clone());
                }
                Ok((dir::Listing::Snapshot(snap), settled))
            }
            Err(why) => {
                if matches!(why, budget::Overflow::TooBig | budget::Overflow::LongName) {
                    self.dircache.too_big(data.key, stamp);
                }
                log::debug!(
                    "directory {}: listing streamed ({why:?}); listings hold {} of {} bytes",
                    data.id,
                    self.dircache.used(),
                    self.dircache.cap()
                );
                Ok((dir::Listing::Stream, false))
            }
        }
    }

    /// Records whether the listing just started for `data` was a settled snapshot of `stamp`,
    /// which lets a later OPENDIR keep the guest's cached listing (`dir_open_flags`).
    fn served_listing(&self, data: &InodeData, stamp: Stamp, settled: bool) {
        data.set_served(settled.then_some(stamp));
    }

    /// Serves the entries of the directory `data` from `offset` for a READDIR on `handle` to
    /// `f`, with the offset to resume after each, until `f` returns `false` or the listing ends.
    /// Offset 0 starts a new listing (a rewind); later offsets continue the handle's, or in
    /// no-opendir mode with handle 0 the inode's. A streamed listing reads `chunk` bytes of
    /// records at a time.
    fn list(
        &self,
        data: &InodeData,
        handle: u64,
        offset: u64,
        chunk: usize,
        f: &mut dyn FnMut(dir::SnapEntry<'_>, u64) -> io::Result<bool>,
    ) -> io::Result<()> {
        if handle != 0 || !self.no_opendir() {
            let h = self.dir_handle(data.id, handle)?;
            let Some(dir) = &h.dir else {
                return Err(error(libc::ENOTDIR));
            };
            let mut cur = dir.lock().unwrap_or_else(PoisonError::into_inner);
            let listing = match &*cur {
                Some(l) if offset != 0 => l.clone(),
                _ => {
                    let stamp = Stamp::of(&sys::stat_fd(h.fd())?);
                    let (l, settled) = match self.cached_listing(data, &stamp) {
                        Some(hit) => hit,
                        None => self.read_listing(data, stamp, h.fd(), cur.is_some())?,
                    };
                    self.served_listing(data, stamp, settled);
                    *cur = Some(l.clone());
                    l
                }
            };
            return match listing {
                dir::Listing::Snapshot(snap) => {
                    drop(cur);
                    snap.serve(offset, f)
                }
                // The handle's descriptor is read from where the guest resumes: the lock is held
                // until the reply is full.
                dir::Listing::Stream => dir::stream(h.fd(), offset, chunk, f),
            };
        }
        if !data.is_dir() {
            return Err(error(libc::ENOTDIR));
        }
        let known = if offset != 0 {
            self.io_fds.listing(data.id)
        } else {
            None
        };
        let listing = match known {
            Some(l) => l,
            None => {
                let stamp = Stamp::of(&self.stat_node(data)?);
                let (l, stamp, settled) = match self.cached_listing(data, &stamp) {
                    Some((l, settled)) => (l, stamp, settled),
                    None => {
                        let dir = self.open_io(data, libc::O_RDONLY | libc::O_DIRECTORY)?;
                        let stamp = Stamp::of(&sys::stat_fd(dir.as_fd())?);
                        let (l, settled) = self.read_listing(data, stamp, dir.as_fd(), false)?;
                        (l, stamp, settled)
                    }
                };
                self.served_listing(data, stamp, settled);
                self.io_fds.set_listing(data.id, l.clone());
                l
            }
        };
        match listing {
            dir::Listing::Snapshot(snap) => {
                if usize::try_from(offset).map_or(true, |o| o >= snap.len()) {
                    self.io_fds.end_listing(data.id, &snap);
                }
                snap.serve(offset, f)
            }
            dir::Listing::Stream => {
                let dir = self.open_io(data, libc::O_RDONLY | libc::O_DIRECTORY)?;
                dir::stream(dir.as_fd(), offset, chunk, f)
            }
        }
    }

    /// Makes a node with `make(parent_fd)` as the caller (with the guest's `umask` when
    /// given, see [`Xattrs::with_guest_umask`]), labels it with `secctx`, then looks it up. A node
    /// that cannot be labelled is removed again and the creation fails.
    fn make_node(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        umask: Option<u32>,
        secctx: &[SecCtx<'_>],
        make: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>,
    ) -> io::Result<Entry> {
        self.check_writable()?;
        check_new_name(name)?;
        // Past --max-nodes nothing is made that the guest could not be given.
        self.nodes().check_node_limit()?;
        let p = self.inode(parent)?;
        {
            let _creds = credentials::switch_to(self.as_root, ctx)?;
            let pfd = self.path_fd(&p)?;
            let pfd = pfd.as_fd();
            match umask {
                Some(m) => self.xattrs().with_guest_umask(m, || make(pfd))?,
                None => make(pfd)?,
            }
        }
        if self.labels_enabled() && !secctx.is_empty() {
            let pfd = self.path_fd(&p)?;
            let pfd = pfd.as_fd();
            let labelled = sys::openat(pfd, name, open_path_flags(), 0)
                .and_then(|fd| self.xattrs().label_path_fd(fd.as_fd(), secctx).map(|()| fd));
            if let Err(e) = labelled {
                log::warn!("security context of a new node refused by the host: {e}");
                self.unmake(&p, name);
                return Err(e);
            }
        }
        // No room for its node (see `slab::Ref::try_new`): nothing stays that the guest was not
        // given.
        self.do_lookup(&p, name).inspect_err(|e| {
            if e.raw_os_error() == Some(libc::ENFILE) {
                self.unmake(&p, name);
            }
        })
    }

    /// Removes `name`, just made in `parent` by a creation that then failed.
    fn unmake(&self, parent: &InodeData, name: &CStr) {
        let Ok(pfd) = self.path_fd(parent) else {
            return;
        };
        let pfd = pfd.as_fd();
        let kind = sys::fstatat(pfd, name, libc::AT_SYMLINK_NOFOLLOW)
            .map_or(0, |st| st.st_mode & libc::S_IFMT);
        let flags = if kind == libc::S_IFDIR {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        let _ = sys::unlinkat(pfd, name, flags);
    }

    /// Registers a file just opened (by CREATE or TMPFILE) as an inode and a handle.
    /// `name` is the file's name in `parent`, `None` for an unnamed file (`O_TMPFILE`).
    fn register_open(
        &self,
        parent: &Node,
        file: OwnedFd,
        name: Option<&CStr>,
        direct: bool,
    ) -> io::Result<(Entry, Opened)> {
        if direct {
            // The host may not support direct I/O; the guest is told DIRECT_IO regardless.
            let _ = sys::set_direct(file.as_fd());
        }
        let (st, x) = sys::stat_fd_mnt(file.as_fd())?;
        // In no-open mode, read before the reference is taken (nothing may fail after it).
        let access = match self.no_open() {
            true => Some(sys::fd_access_mode(file.as_fd())?),
            false => None,
        };
        let (node, new) =
            self.nodes()
                .find_or_add(parent, &st, &x, At::Fd(file.as_fd()), || match name {
                    Some(name) => Ok(Source::Found(Origin::new(parent.clone(), name))),
                    None => self.reopen_path(file.as_fd()).map(Source::Fd),
                })?;
        if let (false, Some(name)) = (new, name) {
            node.found_at(parent, name);
        }
        let entry = self.entry(node.id, st);
        if let Some(acc) = access {
            // The guest sends no RELEASE in no-open mode: the descriptor becomes the inode's
            // own, and the guest gets handle 0.
            let readable = acc != libc::O_WRONLY;
            let writable = acc != libc::O_RDONLY;
            self.io_fds.insert(entry.inode, file, readable, writable);
            let opened = Opened {
                handle: None,
                open_flags: self.file_open_flags(false),
            };
            return Ok((entry, opened));
        }
        let node = self.inode(entry.inode)?;
        if self.fh_mode == InodeFileHandles::Mandatory
            && node.opened_fd().is_none()
            && node.file_handle().is_none()
        {
            // As a lookup would; a failure shows when an operation needs the handle.
            let parent = node.origin().map(|(p, _)| p);
            if let Ok(h) = self.handle_of(file.as_fd(), parent.as_deref()) {
                node.keep_file_handle(h);
            }
        }
        node.handles.fetch_add(1, Ordering::SeqCst);
        let handle = self.open_handle(&node, HandleData::file(entry.inode, file));
        let opened = Opened {
            handle: Some(handle),
            open_flags: self.file_open_flags(false),
        };
        Ok((entry, opened))
    }

    /// How long the guest may remember that a name does not exist: as long as it keeps entries
    /// in `auto` and `always`; not at all in `never` and `metadata`, where the guest asks again
    /// each time.
    fn negative_timeout(&self) -> Duration {
        match self.cfg.cache {
            CacheMode::Auto | CacheMode::Always => self.cfg.entry_timeout,
            CacheMode::Never | CacheMode::Metadata => Duration::ZERO,
        }
    }

    /// The reply to a LOOKUP of a missing name: node id 0 ("no such entry") with a timeout, which
    /// the guest keeps as a negative entry. A name the guest creates replaces it at once.
    fn negative_entry(&self) -> Entry {
        Entry {
            inode: 0,
            generation: 0,
            attr: sys::zeroed_stat(),
            attr_flags: 0,
            attr_timeout: Duration::ZERO,
            entry_timeout: self.negative_timeout(),
        }
    }

    /// Registers an open handle of `node`, remembered by the node for when its name is gone.
    /// Registers the open handle `data` of `node`, which the caller counted in
    /// [`InodeData::handles`] before it opened the host file (see [`Self::opening`]).
    fn open_handle(&self, node: &InodeData, data: HandleData) -> u64 {
        let (id, h) = self.handles.insert(data);
        node.set_last_open(&h);
        id
    }

    /// After an open with `O_TRUNC`: clears set-user-id / set-group-id when the guest asks
    /// (`FUSE_OPEN_KILL_SUIDGID`), and a remapped `security.capability` in any case.
    fn truncated_on_open(&self, fd: BorrowedFd<'_>, fuse_flags: u32) -> io::Result<()> {
        if fuse_flags & crate::fuse::abi::OPEN_KILL_SUIDGID != 0 {
            self.xattrs().kill_priv(fd)
        } else {
            self.xattrs().drop_remapped_capability(fd)
        }
    }

    /// The INIT flags of `--posix-acl`, `--security-label` and `--killpriv-v2` the guest kernel
    /// (offering `capable`) agrees to; records which are on. `EPROTO` when an `always` feature
    /// is not offered.
    fn negotiate_xattr_features(&self, capable: u64) -> io::Result<u64> {
        let mut want = 0;
        let xattr = self.cfg.xattr;
        let acl_flags = init::POSIX_ACL | init::DONT_MASK | init::SETXATTR_EXT;
        let acl = match self.cfg.posix_acl {
            Negotiate::Never => false,
            _ if xattr && capable & acl_flags == acl_flags => true,
            Negotiate::Always => {
                log::error!(
                    "--posix-acl=always: the guest kernel does not offer POSIX ACLs \
                     (FUSE_POSIX_ACL, FUSE_DONT_MASK and FUSE_SETXATTR_EXT); session refused"
                );
                return Err(error(libc::EPROTO));
            }
            Negotiate::Auto => {
                log::warn!("--posix-acl=auto: the guest kernel does not offer POSIX ACLs; off");
                false
            }
        };
        if acl {
            want |= acl_flags;
        }
        self.posix_acl_on.store(acl, Ordering::Relaxed);
        let labels = match self.cfg.security_label {
            Negotiate::Never => false,
            _ if xattr && capable & init::SECURITY_CTX != 0 => true,
            Negotiate::Always => {
                log::error!(
                    "--security-label=always: the guest kernel does not offer \
                     FUSE_SECURITY_CTX; session refused"
                );
                return Err(error(libc::EPROTO));
            }
            Negotiate::Auto => {
                log::warn!(
                    "--security-label=auto: the guest kernel does not offer FUSE_SECURITY_CTX; \
                     off"
                );
                false
            }
        };
        if labels {
            want |= init::SECURITY_CTX;
        }
        self.security_ctx_on.store(labels, Ordering::Relaxed);
        if self.cfg.killpriv_v2 {
            if capable & init::HANDLE_KILLPRIV_V2 != 0 {
                want |= init::HANDLE_KILLPRIV_V2;
            } else {
                log::warn!("--killpriv-v2: the guest kernel does not offer it; off");
            }
        }
        Ok(want)
    }

    fn dir_handle(&self, inode: u64, handle: u64) -> io::Result<Arc<HandleData>> {
        let h = self.handles.get(handle, inode)?;
        if h.dir.is_none() {
            return Err(error(libc::ENOTDIR));
        }
        Ok(h)
    }

    /// Whether OPEN is answered with `ENOSYS` (files come with handle 0 and no RELEASE).
    fn no_open(&self) -> bool {
        self.no_open.load(Ordering::Relaxed)
    }

    /// Whether OPENDIR is answered with `ENOSYS` (directories come with handle 0).
    fn no_opendir(&self) -> bool {
        self.no_opendir.load(Ordering::Relaxed)
    }

    /// The descriptor a file request on `inode` with `handle` is served with. In no-open mode
    /// handle 0 stands for the inode's own descriptor good for `access`; otherwise (and for
    /// any other handle) the handle must be open on `inode` (`EBADF`).
    fn file_ref(&self, inode: u64, handle: u64, access: Access) -> io::Result<FileRef> {
        if handle == 0 && self.no_open() {
            return self.inode_fd(inode, access).map(FileRef::Inode);
        }
        self.handles.get(handle, inode).map(FileRef::Handle)
    }

    /// The inode's own descriptor for `access`, opened on first need and kept in `io_fds`:
    /// read-only for reads; read-write for writes (write-only when reading is not permitted),
    /// never `O_APPEND` (a positioned write must land where the guest says). Only regular
    /// files: `EISDIR` for directories, `ELOOP` for symlinks, `ENXIO` for special files.
    fn inode_fd(&self, inode: u64, access: Access) -> io::Result<IoFd> {
        if access == Access::Write {
            self.check_writable()?;
        }
        let data = self.inode(inode)?;
        match data.key.kind() {
            libc::S_IFDIR => return Err(error(libc::EISDIR)),
            kind => check_openable(kind)?,
        }
        if let Some(fd) = self.io_fds.get(inode, access) {
            return Ok(fd);
        }
        let (file, readable, writable) = match access {
            Access::Read => (self.open_io(&data, libc::O_RDONLY)?, true, false),
            Access::Write => match self.open_io(&data, libc::O_RDWR) {
                Ok(f) => (f, true, true),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                    (self.open_io(&data, libc::O_WRONLY)?, false, true)
                }
                Err(e) => return Err(e),
            },
        };
        Ok(self.io_fds.insert(inode, file, readable, writable))
    }

    /// Opens `data` for I/O; when the process is out of descriptors, the older half of the
    /// per-inode descriptors is closed and the open tried once more.
    fn open_io(&self, data: &InodeData, flags: i32) -> io::Result<OwnedFd> {
        match self.open_node(data, flags) {
            Err(e) if out_of_fds(&e) && self.io_fds.shrink() => {
                log::debug!("out of descriptors: closed half of the per-inode descriptors");
                self.open_node(data, flags)
            }
            r => r,
        }
    }

    /// Before `name` in `dir` is unlinked or replaced, a known inode that would lose the name it
    /// is reached by gets its own `O_PATH` descriptor, kept whatever `--inode-file-handles`
    /// says (a file handle would not keep an unlinked file alive), and stays reachable: in
    /// no-open mode any file, and in no-opendir mode any directory (the guest may hold it open
    /// without the daemon knowing); otherwise a file with other links (a node remembers one
    /// name, and this one is going). Returns the
    /// known inode when `name` is its last name (a directory, or a file with one link), for
    /// [`Self::bury_if_unreachable`] once the name is gone.
    fn keep_reachable(&self, parent: &InodeData, dir: BorrowedFd<'_>, name: &CStr) -> Option<Node> {
        let (st, x) = sys::stat_at_mnt(dir, name).ok()?;
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let last_name = is_dir || st.st_nlink < 2;
        // Outside no-open mode only a file that keeps other names needs it: a node remembers
        // one name, and this one is going. A directory in no-opendir mode has one from its
        // lookup, unless the descriptors ran out then.
        let keep = if is_dir {
            self.no_opendir()
        } else {
            self.no_open() || !last_name
        };
        let key = self
            .nodes()
            .key_at(parent, &st, &x, At::Name(dir, name))
            .ok()?;
        let known = self.inodes.find(&key)?;
        if keep && known.opened_fd().is_none() {
            if let Ok(fd) = sys::openat(dir, name, open_path_flags(), 0) {
                if self.nodes().is_inode(fd.as_fd(), &known).unwrap_or(false) {
                    known.keep_fd(fd);
                }
            }
        }
        last_name.then_some(known)
    }

    /// After the last name of the file of `node` was removed: when nothing the daemon holds
    /// can serve it any more (no open handle, no descriptor of its own or for I/O), the node
    /// is dropped and its id answers `ESTALE` (see [`InodeStore::bury`]). A guest that creates
    /// and removes files without ever forgetting them then costs nothing.
    fn bury_if_unreachable(&self, node: &InodeData) {
        // In no-opendir mode the guest may list a directory it holds without the daemon
        // knowing (a removed one lists empty, as on the host).
        if node.is_dir() && self.no_opendir() {
            return;
        }
        if node.id != ROOT_ID
            && node.handles.load(Ordering::SeqCst) == 0
            && node.opened_fd().is_none()
            && !self.io_fds.holds(node.id)
        {
            self.inodes.bury(node);
            // A listing kept for it (no-opendir mode) goes too.
            self.io_fds.remove(node.id);
        }
    }

    /// Runs `open` (which opens the host file of `node` for a handle) with the handle counted
    /// in [`InodeData::handles`] from before it starts, so that an UNLINK racing it never finds
    /// the node unheld once the open has found the file; the count is given back when `open`
    /// fails.
    fn opening<T>(&self, node: &InodeData, open: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        node.handles.fetch_add(1, Ordering::SeqCst);
        let r = open();
        if r.is_err() {
            node.handles.fetch_sub(1, Ordering::SeqCst);
        }
        r
    }

    /// Whether the guest's handle `fh` of `inode` may write (the kernel's rule for a write
    /// lock); a handle of 0 names none and may. `EBADF` for a handle not open on `inode`.
    fn handle_writable(&self, inode: u64, fh: u64) -> io::Result<bool> {
        if fh == 0 {
            return Ok(true);
        }
        let h = self.handles.get(fh, inode)?;
        Ok(sys::fd_access_mode(h.fd())? != libc::O_RDONLY)
    }

    /// A descriptor of `inode` for one lock owner's locks (`locks`): read-write when the
    /// handle `fh` the owner came through may write and the daemon may write the file,
    /// read-only otherwise (a write lock on it then gets `EBADF`). A new open file description
    /// each time, opened without waiting for a lease to break (`O_NONBLOCK`); only regular files
    /// and directories.
    fn lock_fd(&self, inode: u64, fh: u64) -> io::Result<(OwnedFd, bool)> {
        self.lock_fd_as(inode, self.handle_writable(inode, fh)?)
    }

    /// A lock description of `inode`, read-write when `writable` and the daemon may write the
    /// file (`lock_fd`; a migration destination opens a carried record's so).
    fn lock_fd_as(&self, inode: u64, writable: bool) -> io::Result<(OwnedFd, bool)> {
        let data = self.inode(inode)?;
        let kind = data.key.kind();
        check_openable(kind)?;
        let flags = libc::O_NONBLOCK | libc::O_NOCTTY;
        if kind == libc::S_IFDIR {
            return Ok((
                self.open_node(&data, flags | libc::O_RDONLY | libc::O_DIRECTORY)?,
                false,
            ));
        }
        if !self.cfg.readonly && writable {
            match self.open_node(&data, flags | libc::O_RDWR) {
                Ok(fd) => return Ok((fd, true)),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((self.open_node(&data, flags | libc::O_RDONLY)?, false))
    }

    /// A read-only description of `inode` to test for a lock through (GETLK of an owner that
    /// holds nothing), closed after the test.
    fn lock_test_fd(&self, inode: u64) -> io::Result<OwnedFd> {
        let data = self.inode(inode)?;
        let kind = data.key.kind();
        check_openable(kind)?;
        let dir = match kind {
            libc::S_IFDIR => libc::O_DIRECTORY,
            _ => 0,
        };
        self.open_node(
            &data,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | dir,
        )
    }

    /// Whether locks of `kind` were agreed with the guest (`ENOSYS` otherwise: the guest keeps
    /// them itself and never sends them).
    fn locks_on(&self, kind: LockKind) -> io::Result<()> {
        let on = match kind {
            LockKind::Posix => &self.posix_locks_on,
            LockKind::Flock => &self.flock_on,
        };
        match on.load(Ordering::Relaxed) {
            true => Ok(()),
            false => Err(error(libc::ENOSYS)),
        }
    }

    /// A checked lock request of `owner` on `inode` through `fh`; a write record lock through
    /// a handle that may not write is `EBADF`, as the kernel answers it.
    fn lock_req(
        &self,
        inode: u64,
        fh: u64,
        owner: u64,
        lock: &FileLock,
        kind: LockKind,
    ) -> io::Result<locks::Req> {
        self.locks_on(kind)?;
        let req = locks::Req::new(inode, owner, fh, lock, kind)?;
        if kind == LockKind::Posix
            && req.typ == libc::F_WRLCK
            && !self.handle_writable(inode, fh)?
        {
            return Err(error(libc::EBADF));
        }
        Ok(req)
    }

    /// Counts the release of an open handle of `inode` (see [`InodeData::handles`]).
    fn released(&self, inode: u64) {
        if let Some(node) = self.inodes.get(inode) {
            // One less, never below 0 (a RELEASE the count never saw). An explicit loop rather
            // than `fetch_update`, which Rust 1.99 deprecates in favour of `try_update`, a
            // method Rust 1.85 lacks.
            let mut n = node.handles.load(Ordering::SeqCst);
            while let Some(less) = n.checked_sub(1) {
                match node.handles.compare_exchange_weak(
                    n,
                    less,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break,
                    Err(now) => n = now,
                }
            }
        }
    }
}
