//! Directory snapshots shared between handles while the directory is unchanged.
//!
//! A snapshot is stored with the [`Stamp`] the directory had just before it was read: change
//! time, modification time, size and link count. Any change to the directory's entries moves
//! its change time, so a later handle whose `fstat` gives the same stamp may reuse the snapshot.
//!
//! Timestamps are coarse (a clock tick, not a nanosecond): a change made in the same tick as the
//! stamp was taken would leave the stamp as it was. A snapshot is therefore only stored when its
//! stamp was already [`SETTLE`] old when reading began ("settled"): any later change then
//! produces a newer time and cannot be missed. Directories changed within the last second are
//! read afresh by every handle.
//!
//! Memory is bounded: the cache holds at most `cap` bytes of snapshots and evicts the least
//! recently used first. Handles keep their own `Arc` to the snapshot they serve, so eviction
//! never disturbs a listing in progress.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::dir::DirSnapshot;
use super::inode::InodeKey;

/// How old a directory's change time must be for a snapshot of it to be shared.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Default memory budget for cached snapshots.
pub const DEFAULT_CAP: usize = 64 << 20;

/// What a directory looked like when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    ctime: (i64, i64),
    mtime: (i64, i64),
    size: i64,
    nlink: u64,
}

impl Stamp {
    pub fn of(st: &libc::stat64) -> Self {
        Stamp {
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            size: st.st_size,
            nlink: st.st_nlink,
        }
    }

    /// Whether both times lie at least [`SETTLE`] before `now` (seconds, nanoseconds since the
    /// epoch), so that any later change of the directory gives a different stamp.
    pub fn settled(&self, now: (i64, i64)) -> bool {
        let limit = now.0.saturating_sub(SETTLE.as_secs() as i64);
        let before = |t: (i64, i64)| t < (limit, now.1);
        before(self.ctime) && before(self.mtime)
    }
}

/// The current wall-clock time, as the kernel stamps files.
pub fn now() -> (i64, i64) {
    // SAFETY: clock_gettime only writes the local timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec, ts.tv_nsec)
}

struct Cached {
    stamp: Stamp,
    snap: Arc<DirSnapshot>,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<InodeKey, Cached>,
    bytes: usize,
    clock: u64,
}

/// Settled snapshots by directory, bounded in memory.
pub struct DirCache {
    inner: Mutex<Inner>,
    cap: usize,
}

impl DirCache {
    pub fn new(cap: usize) -> Self {
        DirCache {
            inner: Mutex::new(Inner::default()),
            cap,
        }
    }

    /// The snapshot of `key` if one was stored with exactly `stamp`.
    pub fn get(&self, key: &InodeKey, stamp: &Stamp) -> Option<Arc<DirSnapshot>> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.clock += 1;
        let clock = inner.clock;
        let c = inner.map.get_mut(key)?;
        if c.stamp != *stamp {
            return None;
        }
        c.used = clock;
        Some(c.snap.clone())
    }

    /// Stores `snap` of `key`, read when the directory had `stamp`; the caller has checked that
    /// the stamp is settled. Evicts least recently used snapshots to stay within the budget.
    pub fn insert(&self, key: InodeKey, stamp: Stamp, snap: Arc<DirSnapshot>) {
        let bytes = snap.memory_size();
        if bytes > self.cap / 4 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.clock += 1;
        let used = inner.clock;
        if let Some(old) = inner.map.insert(
            key,
            Cached {
                stamp,
                snap,
                bytes,
                used,
            },
        ) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        while inner.bytes > self.cap {
            let Some(victim) = inner
                .map
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(c) = inner.map.remove(&victim) {
                inner.bytes -= c.bytes;
            }
        }
    }

    /// Drops every snapshot.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.map.clear();
        inner.bytes = 0;
    }

    /// Bytes of snapshots held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ctime: i64) -> Stamp {
        Stamp {
            ctime: (ctime, 0),
            mtime: (ctime, 0),
            size: 4096,
            nlink: 2,
        }
    }

    fn key(ino: u64) -> InodeKey {
        InodeKey {
            dev: 1,
            ino,
            mnt_id: 1,
            kind: libc::S_IFDIR,
            btime: Some((1, 0)),
        }
    }

    fn snapshot(names: usize) -> Arc<DirSnapshot> {
        Arc::new(DirSnapshot::from_names(
            (0..names).map(|i| format!("name-{i:05}").into_bytes()),
        ))
    }

    #[test]
    fn stamp_within_the_settle_time_is_not_settled() {
        assert!(!stamp(100).settled((100, 500)));
        assert!(!stamp(100).settled((101, 0)));
        assert!(stamp(100).settled((101, 1)));
        assert!(stamp(100).settled((200, 0)));
    }

    #[test]
    fn get_returns_the_snapshot_only_for_the_same_stamp() {
        let cache = DirCache::new(DEFAULT_CAP);
        let snap = snapshot(3);
        cache.insert(key(1), stamp(10), snap.clone());
        assert!(Arc::ptr_eq(&cache.get(&key(1), &stamp(10)).unwrap(), &snap));
        assert!(cache.get(&key(1), &stamp(11)).is_none());
        assert!(cache.get(&key(2), &stamp(10)).is_none());
    }

    #[test]
    fn insert_evicts_least_recently_used_beyond_the_cap() {
        let one = snapshot(100).memory_size();
        let cache = DirCache::new(one * 4);
        for ino in 0..4 {
            cache.insert(key(ino), stamp(1), snapshot(100));
        }
        // Touch 0 so that 1 is the least recently used.
        assert!(cache.get(&key(0), &stamp(1)).is_some());
        cache.insert(key(9), stamp(1), snapshot(100));
        assert!(cache.bytes() <= one * 4);
        assert!(cache.get(&key(1), &stamp(1)).is_none());
        assert!(cache.get(&key(0), &stamp(1)).is_some());
        assert!(cache.get(&key(9), &stamp(1)).is_some());
    }

    #[test]
    fn snapshot_larger_than_a_quarter_of_the_cap_is_not_stored() {
        let cache = DirCache::new(1024);
        cache.insert(key(1), stamp(1), snapshot(1000));
        assert_eq!(cache.bytes(), 0);
    }
}
