//! The inode store: node ids handed to the guest, each backed by a host file reached through
//! its parent and name, an `O_PATH | O_NOFOLLOW` descriptor, or a file handle.
//!
//! A host file is identified by (`st_dev`, `st_ino`, mount id); looking up a file already known
//! returns its node id and adds a reference, so one host file has one node id at a time. The
//! table is read-mostly: lookups of known files and most forgets take only the read lock and
//! change the per-inode atomic count; the write lock is taken to add an inode and to remove one
//! whose count reaches zero.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};

use super::dircache::Stamp;
use super::file_handle::FileHandle;
use super::handle::HandleData;

use crate::fuse::abi::ROOT_ID;

/// What identifies a host file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u64,
}

impl InodeKey {
    pub fn new(st: &libc::stat64, mnt_id: u64) -> Self {
        InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id,
        }
    }
}

/// Where an inode was found by name: its parent directory and its name there. An inode found
/// this way gets no descriptor until an operation needs one (see [`InodeData`]).
#[derive(Debug)]
pub struct Origin {
    pub parent: Arc<InodeData>,
    pub name: CString,
}

/// How a new inode is reached.
pub enum Source {
    /// An `O_PATH | O_NOFOLLOW` descriptor of the file.
    Fd(OwnedFd),
    /// A name in a parent directory; the descriptor is opened on first need.
    Found(Origin),
}

/// An `O_PATH` descriptor of an inode: the one the inode keeps, or one opened for a single
/// operation (closed when dropped). Use it through [`AsFd`], and keep it alive as long as a
/// `/proc/self/fd/N` name made from it is used.
#[derive(Debug)]
pub enum PathFd<'a> {
    Kept(BorrowedFd<'a>),
    Owned(OwnedFd),
}

impl AsFd for PathFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            PathFd::Kept(fd) => fd.as_fd(),
            PathFd::Owned(fd) => fd.as_fd(),
        }
    }
}

/// One host file the guest holds references on.
///
/// Most inodes come from a lookup or a directory listing and are never used for more than a
/// `stat` (a `find`, an `ls -l`): they keep only their parent and name, and the passthrough
/// filesystem opens an `O_PATH` descriptor the first time an operation needs one, checking
/// that the name still leads to the same file (else `ESTALE`). That keeps a tree walk to one
/// `statx` per entry and the daemon's descriptors bounded by what the guest really uses.
///
/// With file handles (`--inode-file-handles=prefer|mandatory`) an inode other than a directory
/// keeps a file handle instead of that descriptor, taken the first time a descriptor is needed
/// (at lookup with `mandatory`), and each operation opens a descriptor for its own use.
#[derive(Debug)]
pub struct InodeData {
    pub id: u64,
    pub key: InodeKey,
    /// `O_PATH | O_NOFOLLOW` descriptor of the file, once opened and kept.
    fd: OnceLock<OwnedFd>,
    /// File handle of the file, once taken (file handle modes only).
    handle: OnceLock<FileHandle>,
    /// Parent and name, for inodes found by name (updated when found again by another name).
    origin: Mutex<Option<Origin>>,
    /// The handle this inode was last opened with, to stat it after its name is gone.
    pub last_open: Mutex<Weak<HandleData>>,
    /// `S_IFMT` bits of the file's mode.
    pub kind: u32,
    /// For directories: the stamp of the last listing served from offset 0, if that stamp was
    /// settled (see `dircache`); lets OPENDIR tell the guest its cached listing is still good.
    pub listing: Mutex<Option<Stamp>>,
    refcount: AtomicU64,
}

impl InodeData {
    fn new(id: u64, key: InodeKey, kind: u32, source: Source) -> Self {
        let (fd, origin) = match source {
            Source::Fd(fd) => (OnceLock::from(fd), None),
            Source::Found(origin) => (OnceLock::new(), Some(origin)),
        };
        InodeData {
            id,
            key,
            fd,
            handle: OnceLock::new(),
            origin: Mutex::new(origin),
            last_open: Mutex::new(Weak::new()),
            kind,
            listing: Mutex::new(None),
            refcount: AtomicU64::new(1),
        }
    }

    /// Where the inode was last found by name.
    pub fn origin(&self) -> Option<(Arc<InodeData>, CString)> {
        let o = self.origin.lock().unwrap_or_else(PoisonError::into_inner);
        o.as_ref().map(|o| (o.parent.clone(), o.name.clone()))
    }

    /// Records that the inode was found as `name` in `parent` (an inode without a descriptor
    /// then reopens through that name).
    pub fn found_at(&self, parent: &Arc<InodeData>, name: &CStr) {
        if self.fd.get().is_some() {
            return;
        }
        let mut o = self.origin.lock().unwrap_or_else(PoisonError::into_inner);
        let same = o
            .as_ref()
            .is_some_and(|o| Arc::ptr_eq(&o.parent, parent) && o.name.as_c_str() == name);
        if !same {
            *o = Some(Origin {
                parent: parent.clone(),
                name: name.to_owned(),
            });
        }
    }

    /// The `O_PATH` descriptor, if it was opened.
    pub fn opened_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.get().map(|fd| fd.as_fd())
    }

    /// Keeps `fd` as this inode's descriptor (unless another thread set one first) and returns
    /// the descriptor kept.
    pub fn keep_fd(&self, fd: OwnedFd) -> BorrowedFd<'_> {
        let _ = self.fd.set(fd);
        // The parent is no longer needed to reach this inode.
        self.origin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match self.fd.get() {
            Some(fd) => fd.as_fd(),
            None => unreachable!("OnceLock::set above leaves a value"),
        }
    }

    /// The file handle, if one was taken.
    pub fn file_handle(&self) -> Option<&FileHandle> {
        self.handle.get()
    }

    /// Keeps `h` as this inode's file handle (unless one is kept already).
    pub fn keep_file_handle(&self, h: FileHandle) {
        let _ = self.handle.set(h);
    }

    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }

    #[cfg(test)]
    pub fn refcount(&self) -> u64 {
        self.refcount.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Maps {
    by_id: HashMap<u64, Arc<InodeData>>,
    by_key: HashMap<InodeKey, u64>,
}

/// Node id → inode, and host identity → node id.
pub struct InodeStore {
    maps: RwLock<Maps>,
    next_id: AtomicU64,
}

impl InodeStore {
    /// A store holding only the root directory, as [`ROOT_ID`].
    pub fn new(root_fd: OwnedFd, root_st: &libc::stat64, mnt_id: u64) -> Self {
        let store = InodeStore {
            maps: RwLock::new(Maps::default()),
            next_id: AtomicU64::new(ROOT_ID + 1),
        };
        store.insert_root(root_fd, root_st, mnt_id);
        store
    }

    fn insert_root(&self, fd: OwnedFd, st: &libc::stat64, mnt_id: u64) {
        let key = InodeKey::new(st, mnt_id);
        let data = Arc::new(InodeData::new(
            ROOT_ID,
            key,
            st.st_mode & libc::S_IFMT,
            Source::Fd(fd),
        ));
        let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        maps.by_key.insert(key, ROOT_ID);
        maps.by_id.insert(ROOT_ID, data);
    }

    /// The inode with node id `id`.
    pub fn get(&self, id: u64) -> Option<Arc<InodeData>> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        maps.by_id.get(&id).cloned()
    }

    /// Adds one reference on `id`, if it is known.
    pub fn add_ref(&self, id: u64) -> bool {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        match maps.by_id.get(&id) {
            Some(data) => {
                data.refcount.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Returns the node id of the file identified by `key` with one more reference, adding it
    /// with a count of 1 when new. `source` is kept only for a new inode.
    pub fn get_or_insert(&self, key: InodeKey, kind: u32, source: Source) -> u64 {
        {
            let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(id) = Self::ref_existing(&maps, &key) {
                return id;
            }
        }
        let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = Self::ref_existing(&maps, &key) {
            return id;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let data = Arc::new(InodeData::new(id, key, kind, source));
        maps.by_key.insert(key, id);
        maps.by_id.insert(id, data);
        id
    }

    /// The inode identified by `key`, if known (no reference is taken).
    pub fn find(&self, key: &InodeKey) -> Option<Arc<InodeData>> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        let id = maps.by_key.get(key)?;
        maps.by_id.get(id).cloned()
    }

    /// Adds one reference on the inode identified by `key`, if it is known, and returns it.
    pub fn ref_known(&self, key: &InodeKey) -> Option<Arc<InodeData>> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        let id = Self::ref_existing(&maps, key)?;
        maps.by_id.get(&id).cloned()
    }

    fn ref_existing(maps: &Maps, key: &InodeKey) -> Option<u64> {
        let id = *maps.by_key.get(key)?;
        let data = maps.by_id.get(&id)?;
        // Counts only drop to zero (and entries go away) under the write lock, so an entry seen
        // under any lock is live and taking a reference on it is enough.
        data.refcount.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Drops `count` references on `id`; at zero the inode is removed and its descriptor closed
    /// (once no request still uses it). Unknown ids and the root are ignored.
    pub fn forget(&self, id: u64, count: u64) {
        if id == ROOT_ID || count == 0 {
            return;
        }
        {
            let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
            let Some(data) = maps.by_id.get(&id) else {
                return;
            };
            // Fast path: the count stays above zero.
            let mut cur = data.refcount.load(Ordering::Relaxed);
            while cur > count {
                match data.refcount.compare_exchange_weak(
                    cur,
                    cur - count,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return,
                    Err(now) => cur = now,
                }
            }
        }
        let removed = {
            let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
            let Some(data) = maps.by_id.get(&id) else {
                return;
            };
            // Under the write lock nobody else changes counts.
            let left = data.refcount.load(Ordering::Relaxed).saturating_sub(count);
            data.refcount.store(left, Ordering::Relaxed);
            if left > 0 {
                return;
            }
            let key = data.key;
            if maps.by_key.get(&key) == Some(&id) {
                maps.by_key.remove(&key);
            }
            maps.by_id.remove(&id)
        };
        // The descriptor closes outside the lock (when the last `Arc` goes).
        drop(removed);
    }

    /// Drops every inode but the root (the guest unmounted).
    pub fn clear(&self) {
        let old = {
            let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
            let root = maps.by_id.remove(&ROOT_ID);
            let old = std::mem::take(&mut *maps);
            if let Some(root) = root {
                root.refcount.store(1, Ordering::Relaxed);
                maps.by_key.insert(root.key, ROOT_ID);
                maps.by_id.insert(ROOT_ID, root);
            }
            old
        };
        drop(old);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.maps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .by_id
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passthrough::sys;
    use std::os::fd::AsRawFd;

    fn open_path(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> (OwnedFd, InodeKey, u32) {
        let fd = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let (st, mnt) = sys::stat_fd_mnt(fd.as_fd()).unwrap();
        (fd, InodeKey::new(&st, mnt), st.st_mode & libc::S_IFMT)
    }

    fn store_on(dir: &std::path::Path) -> (InodeStore, OwnedFd) {
        let root: OwnedFd = std::fs::File::open(dir).unwrap().into();
        let (fd, key, _) = open_path(root.as_fd(), c".");
        let (st, _) = sys::stat_fd_mnt(fd.as_fd()).unwrap();
        (InodeStore::new(fd, &st, key.mnt_id), root)
    }

    #[test]
    fn same_host_file_gets_same_id_and_counts_references() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        let (store, root) = store_on(tmp.path());
        let (fd1, key, kind) = open_path(root.as_fd(), c"f");
        let (fd2, key2, _) = open_path(root.as_fd(), c"f");
        assert_eq!(key, key2);
        let a = store.get_or_insert(key, kind, Source::Fd(fd1));
        let raw2 = fd2.as_raw_fd();
        let b = store.get_or_insert(key, kind, Source::Fd(fd2));
        assert_eq!(a, b);
        assert_ne!(a, ROOT_ID);
        assert_eq!(store.get(a).unwrap().refcount(), 2);
        // The second descriptor was not kept.
        assert_ne!(store.get(a).unwrap().opened_fd().unwrap().as_raw_fd(), raw2);
        store.forget(a, 1);
        assert_eq!(store.get(a).unwrap().refcount(), 1);
        store.forget(a, 1);
        assert!(store.get(a).is_none());
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn root_and_unknown_ids_ignore_forget() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _root) = store_on(tmp.path());
        store.forget(ROOT_ID, 100);
        store.forget(12345, 1);
        assert!(store.get(ROOT_ID).is_some());
    }

    #[test]
    fn clear_keeps_only_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        let (store, root) = store_on(tmp.path());
        let (fd, key, kind) = open_path(root.as_fd(), c"f");
        let id = store.get_or_insert(key, kind, Source::Fd(fd));
        store.clear();
        assert!(store.get(id).is_none());
        assert!(store.get(ROOT_ID).is_some());
        assert_eq!(store.len(), 1);
    }
}
