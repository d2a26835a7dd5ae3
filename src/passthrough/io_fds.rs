//! Per-inode I/O descriptors for the no-open mode of `--cache=always`.
//!
//! When the guest kernel may skip OPEN / OPENDIR (`FUSE_NO_OPEN_SUPPORT`,
//! `FUSE_NO_OPENDIR_SUPPORT`) and the daemon answers them with `ENOSYS`, the kernel sends
//! READ, WRITE and the other file requests with handle 0 and never sends RELEASE. Those
//! requests are served from descriptors kept here per inode: one readable and one writable
//! descriptor at most (a single `O_RDWR` descriptor serves both), opened on first need.
//!
//! The table is bounded: least recently used inodes lose their descriptors first once more than
//! `capacity` descriptors are held, and [`IoFds::shrink`] drops half of them when the process
//! runs out of descriptors. A request that holds a descriptor keeps it open (it is reference
//! counted) even if it is evicted meanwhile.
//!
//! Directories listed with handle 0 keep the listing their READDIRs are served from here too: a
//! snapshot until it was read to its end or the inode is forgotten, or the mark that it is
//! streamed (each READDIR opens the directory anew).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::dir::{DirSnapshot, Listing};

/// Descriptors kept aside from the budget for everything else (inodes' `O_PATH` descriptors,
/// handles, sockets, the vhost-user connection).
const RESERVE: u64 = 64;
/// Smallest capacity whatever the limit says.
const MIN_CAPACITY: usize = 8;

/// What a request needs a descriptor for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A descriptor taken from the table (stays open while held).
#[derive(Debug, Clone)]
pub struct IoFd(Arc<OwnedFd>);

impl IoFd {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[derive(Default)]
struct Slot {
    read: Option<Arc<OwnedFd>>,
    write: Option<Arc<OwnedFd>>,
    /// Position in the LRU order.
    tick: u64,
}

impl Slot {
    /// Distinct descriptors held (an `O_RDWR` descriptor in both places counts once).
    fn count(&self) -> usize {
        match (&self.read, &self.write) {
            (Some(r), Some(w)) if Arc::ptr_eq(r, w) => 1,
            (r, w) => usize::from(r.is_some()) + usize::from(w.is_some()),
        }
    }
}

#[derive(Default)]
struct Inner {
    slots: HashMap<u64, Slot>,
    /// tick → inode, oldest first.
    lru: BTreeMap<u64, u64>,
    next_tick: u64,
    /// Descriptors held by all slots.
    fds: usize,
}

impl Inner {
    fn touch(&mut self, inode: u64) {
        let tick = self.next_tick;
        self.next_tick += 1;
        if let Some(slot) = self.slots.get_mut(&inode) {
            self.lru.remove(&slot.tick);
            slot.tick = tick;
            self.lru.insert(tick, inode);
        }
    }

    fn remove(&mut self, inode: u64) -> Option<Slot> {
        let slot = self.slots.remove(&inode)?;
        self.lru.remove(&slot.tick);
        self.fds -= slot.count();
        Some(slot)
    }

    /// Removes least recently used slots (never `keep`) until at most `target` descriptors are
    /// held; returns them to be closed outside the lock.
    fn evict_to(&mut self, target: usize, keep: Option<u64>) -> Vec<Slot> {
        let mut out = Vec::new();
        while self.fds > target {
            let Some(inode) = self.lru.values().copied().find(|&i| Some(i) != keep) else {
                break;
            };
            if let Some(slot) = self.remove(inode) {
                out.push(slot);
            }
        }
        out
    }
}

/// Inode → its I/O descriptors, bounded, least recently used first out.
pub struct IoFds {
    inner: Mutex<Inner>,
    capacity: AtomicUsize,
    /// Directory listings served to READDIRs with handle 0, by inode.
    dirs: Mutex<HashMap<u64, Listing>>,
}

impl Default for IoFds {
    fn default() -> Self {
        IoFds::new(MIN_CAPACITY)
    }
}

impl IoFds {
    pub fn new(capacity: usize) -> Self {
        IoFds {
            inner: Mutex::new(Inner::default()),
            capacity: AtomicUsize::new(capacity.max(1)),
            dirs: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The capacity the open-files limit allows: half of the soft `RLIMIT_NOFILE` minus a
    /// reserve, at least [`MIN_CAPACITY`].
    pub fn capacity_from_rlimit() -> usize {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        let cap = (soft / 2).saturating_sub(RESERVE);
        usize::try_from(cap).unwrap_or(usize::MAX).max(MIN_CAPACITY)
    }

    pub fn set_capacity(&self, capacity: usize) {
        let capacity = capacity.max(1);
        self.capacity.store(capacity, Ordering::Relaxed);
        let evicted = self.lock().evict_to(capacity, None);
        drop(evicted);
    }

    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// A descriptor of `inode` good for `access`, if one is held (it becomes most recently used).
    pub fn get(&self, inode: u64, access: Access) -> Option<IoFd> {
        let mut inner = self.lock();
        let slot = inner.slots.get(&inode)?;
        let fd = match access {
            Access::Read => slot.read.clone(),
            Access::Write => slot.write.clone(),
        }?;
        inner.touch(inode);
        Some(IoFd(fd))
    }

    /// Any descriptor of `inode` (for fsync), if one is held.
    pub fn get_any(&self, inode: u64) -> Option<IoFd> {
        self.get(inode, Access::Write)
            .or_else(|| self.get(inode, Access::Read))
    }

    /// Keeps `fd` of `inode`, opened readable (`readable`) and/or writable (`writable`), and
    /// returns it. A descriptor it replaces is closed once no request uses it; least recently
    /// used inodes lose theirs when the table is over capacity.
    pub fn insert(&self, inode: u64, fd: OwnedFd, readable: bool, writable: bool) -> IoFd {
        let fd = Arc::new(fd);
        let cap = self.capacity();
        let (old, evicted) = {
            let mut inner = self.lock();
            let mut slot = inner.remove(inode).unwrap_or_default();
            let mut old = Vec::new();
            if readable {
                old.extend(slot.read.replace(fd.clone()));
            }
            if writable {
                old.extend(slot.write.replace(fd.clone()));
            }
            inner.fds += slot.count();
            let tick = inner.next_tick;
            inner.next_tick += 1;
            slot.tick = tick;
            inner.lru.insert(tick, inode);
            inner.slots.insert(inode, slot);
            let evicted = inner.evict_to(cap, Some(inode));
            (old, evicted)
        };
        drop(old);
        drop(evicted);
        IoFd(fd)
    }

    /// Drops the descriptors and the listing of `inode` (it was forgotten).
    pub fn remove(&self, inode: u64) {
        let slot = self.lock().remove(inode);
        drop(slot);
        let snap = self
            .dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&inode);
        drop(snap);
    }

    /// Drops the older half of the descriptors (the process ran out of them); returns whether
    /// any were dropped.
    pub fn shrink(&self) -> bool {
        let evicted = {
            let mut inner = self.lock();
            let target = inner.fds / 2;
            inner.evict_to(target, None)
        };
        let any = !evicted.is_empty();
        drop(evicted);
        any
    }

    /// Drops everything (the guest unmounted).
    pub fn clear(&self) {
        let old = std::mem::take(&mut *self.lock());
        drop(old);
        let dirs = std::mem::take(&mut *self.dirs.lock().unwrap_or_else(PoisonError::into_inner));
        drop(dirs);
    }

    /// Descriptors held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().fds
    }

    /// The listing a READDIR with handle 0 of `inode` continues from.
    pub fn listing(&self, inode: u64) -> Option<Listing> {
        self.dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&inode)
            .cloned()
    }

    pub fn set_listing(&self, inode: u64, listing: Listing) {
        let old = self
            .dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(inode, listing);
        drop(old);
    }

    /// Forgets the listing of `inode` if it is still `snap` (read to its end).
    pub fn end_listing(&self, inode: u64, snap: &Arc<DirSnapshot>) {
        let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(dirs.get(&inode), Some(Listing::Snapshot(s)) if Arc::ptr_eq(s, snap)) {
            let old = dirs.remove(&inode);
            drop(dirs);
            drop(old);
        }
    }

    /// Every listing kept for an inode.
    #[cfg(test)]
    pub fn all_listings(&self) -> Vec<Listing> {
        let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.values().cloned().collect()
    }

    #[cfg(test)]
    pub fn listings(&self) -> usize {
        self.dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether descriptors for I/O of `inode` are kept.
    pub fn holds(&self, inode: u64) -> bool {
        self.lock().slots.contains_key(&inode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn bounded_and_least_recently_used_first_out() {
        let t = IoFds::new(3);
        t.insert(1, devnull(), true, false);
        t.insert(2, devnull(), true, true);
        t.insert(3, devnull(), true, false);
        assert_eq!(t.len(), 3);
        // 1 is used again: 2 is now the oldest.
        assert!(t.get(1, Access::Read).is_some());
        assert!(t.get(1, Access::Write).is_none());
        t.insert(4, devnull(), true, false);
        assert_eq!(t.len(), 3);
        assert!(!t.holds(2));
        assert!(t.holds(1) && t.holds(3) && t.holds(4));
        // A second descriptor of the same inode counts too.
        t.insert(4, devnull(), false, true);
        assert_eq!(t.len(), 3);
        assert!(t.get(4, Access::Read).is_some() && t.get(4, Access::Write).is_some());
        assert!(!t.holds(3), "the oldest other inode went");
        // Replacing both by one read-write descriptor.
        t.insert(4, devnull(), true, true);
        assert_eq!(t.len(), 2);
        t.remove(4);
        assert_eq!(t.len(), 1);
        assert!(t.shrink());
        assert_eq!(t.len(), 0);
        assert!(!t.shrink());
    }

    #[test]
    fn a_held_descriptor_survives_eviction() {
        let t = IoFds::new(1);
        let a = t.insert(1, devnull(), true, false);
        t.insert(2, devnull(), true, false);
        assert!(!t.holds(1));
        // Still open: fstat works.
        crate::passthrough::sys::stat_fd(a.fd()).unwrap();
        t.set_capacity(5);
        assert_eq!(t.capacity(), 5);
        t.clear();
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn capacity_follows_the_open_files_limit() {
        let cap = IoFds::capacity_from_rlimit();
        assert!(cap >= MIN_CAPACITY);
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert!((cap as u64) < soft.max(2 * (MIN_CAPACITY as u64 + RESERVE)));
    }
}
