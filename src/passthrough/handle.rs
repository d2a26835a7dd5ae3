//! The handle table: files and directories the guest has open (OPEN, CREATE, TMPFILE,
//! OPENDIR) until the matching RELEASE / RELEASEDIR.
//!
//! A handle owns a real (not `O_PATH`) descriptor of its inode; a directory handle also keeps
//! the [`Listing`] its READDIRs are served from (a snapshot, or its own descriptor read anew).
//! Handle numbers come from a counter that starts at 1 and are never reused: handle 0 is never a
//! handle (in no-open mode it stands for the inode's own descriptor, see `io_fds`). Requests name
//! the inode as well as the handle; a handle used with another inode is refused with `EBADF`.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::dir::Listing;
use super::sys;

/// One open file or directory.
#[derive(Debug)]
pub struct HandleData {
    pub inode: u64,
    pub file: OwnedFd,
    /// The directory listing, for handles made by OPENDIR: empty until the first READDIR,
    /// replaced on each READDIR at offset 0. A streamed listing's READDIRs hold the lock while
    /// they read `file`.
    pub dir: Option<Mutex<Option<Listing>>>,
    /// A lock the guest took through it was lost in a migration (it could not be taken again
    /// on the destination): the guest gets `EBADF` on it, as for a handle the migration lost.
    pub lost: AtomicBool,
}

impl HandleData {
    pub fn file(inode: u64, file: OwnedFd) -> Self {
        HandleData {
            inode,
            file,
            dir: None,
            lost: AtomicBool::new(false),
        }
    }

    pub fn dir(inode: u64, file: OwnedFd) -> Self {
        HandleData {
            inode,
            file,
            dir: Some(Mutex::new(None)),
            lost: AtomicBool::new(false),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Handle number → open file.
pub struct HandleStore {
    map: RwLock<HashMap<u64, Arc<HandleData>>>,
    next: AtomicU64,
}

impl Default for HandleStore {
    fn default() -> Self {
        HandleStore {
            map: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl HandleStore {
    pub fn insert(&self, data: HandleData) -> (u64, Arc<HandleData>) {
        let data = Arc::new(data);
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        // Numbers restored by a migration may lie ahead of the counter: never give one twice.
        let mut h = self.next.fetch_add(1, Ordering::Relaxed);
        while map.contains_key(&h) || h == 0 {
            h = self.next.fetch_add(1, Ordering::Relaxed);
        }
        map.insert(h, data.clone());
        (h, data)
    }

    /// The handle `h` of `inode`; `EBADF` when unknown or opened for another inode.
    pub fn get(&self, h: u64, inode: u64) -> io::Result<Arc<HandleData>> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        match map.get(&h) {
            Some(data) if data.inode == inode && !data.lost.load(Ordering::Relaxed) => {
                Ok(data.clone())
            }
            _ => Err(sys::error(libc::EBADF)),
        }
    }

    /// Closes the handle `h` of `inode` (once no request still uses it).
    pub fn remove(&self, h: u64, inode: u64) -> io::Result<()> {
        let removed = {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            match map.get(&h) {
                Some(data) if data.inode == inode => map.remove(&h),
                _ => return Err(sys::error(libc::EBADF)),
            }
        };
        drop(removed);
        Ok(())
    }

    /// Every handle, by number (for a migration's save).
    pub fn all(&self) -> Vec<(u64, Arc<HandleData>)> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<_> = map.iter().map(|(h, d)| (*h, d.clone())).collect();
        v.sort_by_key(|(h, _)| *h);
        v
    }

    /// The number the next handle gets.
    pub fn next_id(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Adds `data` as handle `h` (a migration destination taking over the source's handles);
    /// `None` when `h` is 0 or taken. Later handles get higher numbers.
    pub fn restore(&self, h: u64, data: HandleData) -> Option<Arc<HandleData>> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if h == 0 || map.contains_key(&h) {
            return None;
        }
        let data = Arc::new(data);
        map.insert(h, data.clone());
        self.next.fetch_max(h.saturating_add(1), Ordering::Relaxed);
        Some(data)
    }

    /// Makes the next handle get at least `h`.
    pub fn reserve_ids(&self, h: u64) {
        self.next.fetch_max(h, Ordering::Relaxed);
    }

    pub fn clear(&self) {
        let old = std::mem::take(&mut *self.map.write().unwrap_or_else(PoisonError::into_inner));
        drop(old);
    }

    /// The listings of every open directory handle.
    #[cfg(test)]
    pub fn dir_listings(&self) -> Vec<Listing> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.values()
            .filter_map(|h| h.dir.as_ref())
            .filter_map(|d| d.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn handles_are_distinct_and_bound_to_their_inode() {
        let store = HandleStore::default();
        let (a, _) = store.insert(HandleData::file(5, devnull()));
        let (b, _) = store.insert(HandleData::dir(6, devnull()));
        assert_ne!(a, b);
        assert_eq!(store.get(a, 5).unwrap().inode, 5);
        assert!(store.get(b, 6).unwrap().dir.is_some());
        let e = store.get(a, 6).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert_eq!(
            store.remove(a, 6).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        store.remove(a, 5).unwrap();
        assert_eq!(
            store.remove(a, 5).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        store.clear();
        assert_eq!(store.len(), 0);
    }
}
