//! Node identity: telling a file the guest holds from a later file that got the same inode
//! number (see `inode` for the rule each inode keeps).
//!
//! Every place that finds a file by name or opens a descriptor for a node goes through here:
//! [`Nodes::find_or_add`] when a name is looked up (or a file created), and
//! [`Nodes::same_file`] when a descriptor or a name is to serve a node already known.
//! The common case costs nothing beyond the `statx` a lookup makes anyway: on file systems
//! that stamp a birth time, a file born more than [`SETTLE`] ago is proven by its key.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::PoisonError;

use super::file_handle::FileHandle;
use super::node::inode::{InodeData, InodeStore, NewInode, Node, NotAdded, Source};
use super::node::key::{self, SETTLE};
use super::node::key::{Identity, InodeKey};
use super::sys::{self, error, StatExtra};

/// File systems whose birth time is stamped once, at creation, and never changes (the
/// `statfs` magic numbers). Others, overlayfs among them (a copy-up gives a file the upper
/// layer's birth time), are told apart by file handles.
const BIRTH_TIME_FS: &[i64] = &[
    0xEF53,      // ext2/3/4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0xF2F5_2010, // f2fs
    0xCA45_1A4E, // bcachefs
    0x2FC1_2FC1, // zfs
];

/// Where a file was seen: a name in a directory, or a descriptor.
#[derive(Clone, Copy)]
pub(super) enum At<'a> {
    Name(BorrowedFd<'a>, &'a CStr),
    Fd(BorrowedFd<'a>),
}

impl At<'_> {
    /// The file handle of what is there now.
    fn handle(self) -> io::Result<FileHandle> {
        match self {
            At::Name(dir, name) => FileHandle::fid_at(dir, name),
            At::Fd(fd) => FileHandle::fid_of_fd(fd),
        }
    }

    /// Whether the identifying handle of what is there now is `h` (nothing allocated).
    fn is_handle(self, h: &FileHandle) -> io::Result<bool> {
        match self {
            At::Name(dir, name) => h.is_fid_at(dir, name, 0),
            At::Fd(fd) => h.is_fid_at(fd, c"", libc::AT_EMPTY_PATH),
        }
    }

    /// An `O_PATH` descriptor of what is there now (a descriptor stands for itself, reopened
    /// through `/proc/self/fd`).
    fn open_path(self, proc_self_fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        match self {
            At::Name(dir, name) => sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0),
            At::Fd(fd) => sys::reopen_path(proc_self_fd, fd),
        }
    }
}

/// Whether a birth time lies [`SETTLE`] before now: no file born later can have it.
fn settled(btime: (i64, u32)) -> bool {
    let now = key::now();
    let limit = now.0.saturating_sub(SETTLE.as_secs() as i64);
    (btime.0, i64::from(btime.1)) < (limit, now.1)
}

/// Whether a failure to take a file handle means the file system gives none (rather than that
/// the name changed under us).
fn no_handles(e: &io::Error) -> bool {
    !matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENOMEM)
    )
}

/// Identity rules by mount, learnt the first time a mount is met.
#[derive(Default)]
pub(super) struct MountIdentities {
    map: std::sync::RwLock<HashMap<(u64, u64), Identity>>,
}

impl MountIdentities {
    fn get(&self, dev: u64, mnt_id: u64) -> Option<Identity> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&(dev, mnt_id)).copied()
    }

    pub(super) fn insert(&self, dev: u64, mnt_id: u64, identity: Identity) -> Identity {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        *map.entry((dev, mnt_id)).or_insert(identity)
    }
}

/// The identity rule of the mount of a file seen as `st`, `x` through `fd`.
pub(super) fn probe(fd: BorrowedFd<'_>, x: &StatExtra) -> Identity {
    let birth = x.btime.is_some() && sys::fs_type(fd).is_ok_and(|t| BIRTH_TIME_FS.contains(&t));
    let identity = if birth {
        Identity::Birth
    } else if FileHandle::fid_of_fd(fd).is_ok() {
        Identity::Handle
    } else {
        Identity::Pinned
    };
    log::info!(
        "mount {}: nodes are told apart by {}",
        x.mnt_id,
        match identity {
            Identity::Birth => "inode number, type and birth time",
            Identity::Handle => "file handle",
            Identity::Pinned => "a descriptor held per node (no birth time, no file handles)",
        }
    );
    identity
}

/// The node table with what telling its files apart needs: the rule of each mount, the node
/// limit, and `/proc/self/fd` to reopen a descriptor through (`PassthroughFs::nodes` lends
/// them).
pub(super) struct Nodes<'a> {
    pub(super) inodes: &'a InodeStore,
    pub(super) mounts: &'a MountIdentities,
    pub(super) proc_self_fd: BorrowedFd<'a>,
    /// Most nodes the table holds (`--max-nodes`).
    pub(super) max_nodes: usize,
}

impl Nodes<'_> {
    /// The identity rule of the mount of the file seen as `st`, `x` at `at`; `near` is a known
    /// inode (its parent), whose rule holds when it is on the same mount.
    pub(super) fn identity_of(
        &self,
        near: &InodeData,
        st: &libc::stat64,
        x: &StatExtra,
        at: At<'_>,
    ) -> io::Result<Identity> {
        if near.key.on_mount_of(st, x) {
            return Ok(near.identity);
        }
        if let Some(i) = self.mounts.get(st.st_dev, x.mnt_id) {
            return Ok(i);
        }
        let identity = match at {
            At::Fd(fd) => probe(fd, x),
            At::Name(..) => probe(at.open_path(self.proc_self_fd)?.as_fd(), x),
        };
        Ok(self.mounts.insert(st.st_dev, x.mnt_id, identity))
    }

    /// The key of the file seen as `st`, `x` at `at`, next to the known inode `near`.
    pub(super) fn key_at(
        &self,
        near: &InodeData,
        st: &libc::stat64,
        x: &StatExtra,
        at: At<'_>,
    ) -> io::Result<InodeKey> {
        InodeKey::new(st, x, self.identity_of(near, st, x, at)?)
    }

    /// Whether the file with key `key`, seen at `at`, is the inode `data`: same key, and the
    /// key proves it (the inode keeps a descriptor, or its birth time is settled) or the file
    /// handle there is the one the inode was added with. An inode found the same after its
    /// birth time settled needs no handle from then on.
    pub(super) fn same_file(
        &self,
        data: &InodeData,
        key: &InodeKey,
        at: At<'_>,
    ) -> io::Result<bool> {
        if *key != data.key || data.is_stale() {
            return Ok(false);
        }
        if data.proven_by_key() {
            return Ok(true);
        }
        let Some(h) = data.ident_handle() else {
            return Ok(false);
        };
        if !at.is_handle(h)? {
            return Ok(false);
        }
        if data.key.btime().is_some_and(settled) {
            data.settle();
        }
        Ok(true)
    }

    /// Whether `fd` refers to the inode `data`.
    pub(super) fn is_inode(&self, fd: BorrowedFd<'_>, data: &InodeData) -> io::Result<bool> {
        let (st, x) = sys::stat_fd_mnt(fd)?;
        self.same_file(data, &InodeKey::new(&st, &x, data.identity)?, At::Fd(fd))
    }

    /// The inode of the file seen as `st`, `x` at `at` (next to the known inode `near`), with
    /// one more reference, and whether it is new. A known inode with the same key that is not
    /// this file is retired and a new inode made from `source`.
    pub(super) fn find_or_add(
        &self,
        near: &InodeData,
        st: &libc::stat64,
        x: &StatExtra,
        at: At<'_>,
        source: impl FnOnce() -> io::Result<Source>,
    ) -> io::Result<(Node, bool)> {
        let identity = self.identity_of(near, st, x, at)?;
        let key = InodeKey::new(st, x, identity)?;
        let mut source = Some(source);
        let mut pending: Option<NewInode> = None;
        for _ in 0..4 {
            if let Some(known) = self.inodes.ref_known(&key) {
                match self
                    .same_file(&known, &key, at)
                    .and_then(|same| match (same, at) {
                        // The name may have changed between the `statx` and the handle: check once
                        // more through one descriptor before retiring a node the guest holds.
                        (false, At::Name(..)) if !known.is_stale() => {
                            let fd = at.open_path(self.proc_self_fd)?;
                            let (st, x) = sys::stat_fd_mnt(fd.as_fd())?;
                            if InodeKey::new(&st, &x, identity)? != key {
                                return Err(error(libc::ESTALE));
                            }
                            self.is_inode(fd.as_fd(), &known)
                        }
                        _ => Ok(same),
                    }) {
                    Ok(true) => return Ok((known, false)),
                    Ok(false) => {
                        log::debug!(
                            "inode number {} of node {} names another file now",
                            key.ino,
                            known.id
                        );
                        self.inodes.retire(&known);
                        self.inodes.forget(known.id, 1);
                    }
                    Err(e) => {
                        self.inodes.forget(known.id, 1);
                        return Err(e);
                    }
                }
                continue;
            }
            let n = match pending.take() {
                Some(n) => n,
                None => {
                    self.check_node_limit()?;
                    let make = source.take().ok_or_else(|| error(libc::ESTALE))?;
                    self.new_inode(key, identity, at, make()?)?
                }
            };
            match self.inodes.insert(n) {
                Ok(data) => return Ok((data, true)),
                Err(NotAdded::Known(n)) => pending = Some(n),
                Err(NotAdded::NoRoom) => return Err(error(libc::ENFILE)),
            }
        }
        // The name kept changing under us.
        Err(error(libc::ESTALE))
    }

    /// Refuses a new inode once the table holds `--max-nodes` (`ENFILE`, logged once per
    /// thousand refusals): memory stays bounded whatever the guest looks up and never forgets.
    pub(super) fn check_node_limit(&self) -> io::Result<()> {
        if self.inodes.len() < self.max_nodes {
            return Ok(());
        }
        static REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1000 == 0 {
            log::warn!(
                "the guest holds {} nodes (--max-nodes): a new one is refused with ENFILE until \
                 it forgets some",
                self.max_nodes
            );
        }
        Err(error(libc::ENFILE))
    }

    /// What a new inode with `key` proves its identity with: nothing more than its key when
    /// its birth time is settled; else its file handle; else a descriptor held from now on.
    pub(super) fn new_inode(
        &self,
        key: InodeKey,
        identity: Identity,
        at: At<'_>,
        source: Source,
    ) -> io::Result<NewInode> {
        let new = |source, handle, settled| NewInode {
            key,
            identity,
            source,
            handle,
            settled,
        };
        let held = matches!(source, Source::Fd(_));
        // A held descriptor keeps the number from being reused, on local file systems; on a
        // mount told apart by handles (a network file system may reuse it all the same) the
        // handle is taken too.
        if (held && identity != Identity::Handle) || key.btime().is_some_and(settled) {
            return Ok(new(source, None, true));
        }
        if identity != Identity::Pinned {
            match at.handle() {
                Ok(h) => return Ok(new(source, Some(h), false)),
                Err(e) if !no_handles(&e) => return Err(e),
                Err(_) => {}
            }
        }
        if held {
            return Ok(new(source, None, false));
        }
        // Hold the file open: its number cannot go to another file while the guest holds it.
        let fd = at.open_path(self.proc_self_fd)?;
        let (st, x) = sys::stat_fd_mnt(fd.as_fd())?;
        if InodeKey::new(&st, &x, identity)? != key {
            return Err(error(libc::ESTALE));
        }
        Ok(new(Source::Fd(fd), None, true))
    }
}
