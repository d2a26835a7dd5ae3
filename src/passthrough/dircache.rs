//! One memory budget for every directory listing the daemon holds, and the snapshots shared
//! between handles while their directory is unchanged.
//!
//! # The budget
//! Every [`DirSnapshot`] is charged against one [`Budget`] while it is read, growing with it,
//! and gives its bytes back when the last holder drops it: the shared cache below, directory
//! handles, and the listings of no-opendir inodes all hold the same charged snapshots, so an
//! `Arc` shared by a hundred handles counts once. A snapshot may take at most a quarter of the
//! budget. When the budget is full, snapshots only the cache still holds are dropped, least
//! recently used first; when that is not enough (handles hold the rest), or the directory is too
//! large for one snapshot, the reader gives up and the listing is served from the directory
//! itself, a chunk per request (see `dir::stream`), holding nothing between requests.
//!
//! # Sharing
//! A snapshot is stored with the [`Stamp`] the directory had just before it was read: change
//! time, modification time, size and link count. Any change to the directory's entries moves
//! its change time, so a later handle whose `fstat` gives the same stamp may reuse the snapshot.
//!
//! Timestamps are coarse (a clock tick, not a nanosecond): a change made in the same tick as the
//! stamp was taken would leave the stamp as it was. A snapshot is therefore only stored when its
//! stamp was already [`SETTLE`](super::node::key::SETTLE) old when reading began ("settled"): any later change then
//! produces a newer time and cannot be missed. Directories changed within the last second are
//! read afresh by every handle, each copy charged like any other.
//!
//! A directory found too large for one snapshot is remembered with its stamp (a few of them), so
//! that the next handles stream it at once instead of reading it to the limit again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use super::budget::{Budget, Charge, Overflow};
use super::dir::DirSnapshot;
use super::node::key::{InodeKey, Stamp};

/// Directories remembered as too large for a snapshot.
const TOO_BIG_KEPT: usize = 64;

/// What the cache knows of a directory with a given stamp.
#[derive(Debug)]
pub enum Found {
    /// A snapshot taken with that stamp.
    Snapshot(Arc<DirSnapshot>),
    /// Too large for a snapshot with that stamp.
    TooBig,
    /// Nothing.
    Miss,
}

struct Cached {
    stamp: Stamp,
    snap: Arc<DirSnapshot>,
    used: u64,
}

struct Inner<K> {
    map: HashMap<K, Cached>,
    /// Use tick → key, least recently used first.
    lru: BTreeMap<u64, K>,
    clock: u64,
    /// Directories found too large, with the stamp they had; oldest first.
    too_big: VecDeque<(K, Stamp)>,
}

impl<K: Hash + Eq + Copy> Inner<K> {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn remove(&mut self, key: &K) -> Option<Cached> {
        let c = self.map.remove(key)?;
        self.lru.remove(&c.used);
        Some(c)
    }
}

/// The listing budget and the settled snapshots by directory.
pub struct DirCache<K = InodeKey> {
    inner: Mutex<Inner<K>>,
    budget: Arc<Budget>,
    /// Most bytes one snapshot may take.
    per_listing: usize,
}

impl<K: Hash + Eq + Copy> DirCache<K> {
    /// A cache whose listings hold at most `budget` bytes together.
    pub fn new(budget: usize) -> Self {
        DirCache {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                lru: BTreeMap::new(),
                clock: 0,
                too_big: VecDeque::new(),
            }),
            budget: Arc::new(Budget::new(budget)),
            per_listing: budget / 4,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What is known of `key` read with exactly `stamp`.
    pub fn get(&self, key: &K, stamp: &Stamp) -> Found {
        let mut inner = self.lock();
        if inner.too_big.iter().any(|(k, s)| k == key && s == stamp) {
            return Found::TooBig;
        }
        let tick = inner.tick();
        let Some(c) = inner.map.get_mut(key) else {
            return Found::Miss;
        };
        if c.stamp != *stamp {
            return Found::Miss;
        }
        let old = std::mem::replace(&mut c.used, tick);
        let snap = c.snap.clone();
        inner.lru.remove(&old);
        inner.lru.insert(tick, *key);
        Found::Snapshot(snap)
    }

    /// Stores `snap` of `key`, read when the directory had `stamp`; the caller has checked that
    /// the stamp is settled. A snapshot it replaces is dropped once no handle serves it.
    pub fn insert(&self, key: K, stamp: Stamp, snap: Arc<DirSnapshot>) {
        let old = {
            let mut inner = self.lock();
            let old = inner.remove(&key);
            let used = inner.tick();
            inner.lru.insert(used, key);
            inner.map.insert(key, Cached { stamp, snap, used });
            old
        };
        drop(old);
    }

    /// Remembers that `key` with `stamp` is too large for a snapshot.
    pub fn too_big(&self, key: K, stamp: Stamp) {
        let mut inner = self.lock();
        inner.too_big.retain(|(k, _)| *k != key);
        if inner.too_big.len() == TOO_BIG_KEPT {
            inner.too_big.pop_front();
        }
        inner.too_big.push_back((key, stamp));
        let dropped = inner.remove(&key);
        drop(inner);
        drop(dropped);
    }

    /// Charges `n` more bytes to the snapshot holding `charge`: fails when the snapshot would
    /// exceed its share, or when the budget stays full after dropping every snapshot that only
    /// the cache holds.
    pub fn reserve(&self, charge: &mut Charge, n: usize) -> Result<(), Overflow> {
        if charge.bytes().saturating_add(n) > self.per_listing {
            return Err(Overflow::TooBig);
        }
        while !self.budget.try_take(n) {
            if !self.evict_one() {
                return Err(Overflow::Full);
            }
        }
        charge.add(&self.budget, n);
        Ok(())
    }

    /// Drops the least recently used snapshot no handle holds; whether there was one.
    fn evict_one(&self) -> bool {
        let victim = {
            let mut inner = self.lock();
            let key = inner.lru.values().copied().find(|k| {
                inner
                    .map
                    .get(k)
                    .is_some_and(|c| Arc::strong_count(&c.snap) == 1)
            });
            match key {
                // Only the cache holds it, and taking it needs the lock: dropping it frees it.
                Some(k) => inner.remove(&k),
                None => None,
            }
        };
        victim.is_some()
    }

    /// Drops the snapshot of `key`, if one is cached (the guest forgot the directory: it drops
    /// what it cached of it too, and a walk it forgot keeps no memory here).
    pub fn forget(&self, key: &K) {
        let old = {
            let mut inner = self.lock();
            let old = inner.remove(key);
            // The map gives its room back once a quarter full (a walk the guest forgot leaves
            // no table of a thousand directories behind).
            let (cap, len) = (inner.map.capacity(), inner.map.len());
            if cap > 64 && len.saturating_mul(4) < cap {
                inner.map.shrink_to(len * 2);
            }
            old
        };
        if let Some(c) = old {
            let size = c.snap.memory_size();
            let last = Arc::strong_count(&c.snap) == 1;
            drop(c);
            if last {
                super::node::memory::freed(size);
            }
        }
    }

    /// Drops every snapshot the cache holds.
    pub fn clear(&self) {
        let old = {
            let mut inner = self.lock();
            inner.lru.clear();
            inner.too_big.clear();
            std::mem::take(&mut inner.map)
        };
        drop(old);
    }

    /// Bytes all listings hold now.
    pub fn used(&self) -> usize {
        self.budget.used()
    }

    /// The budget, in bytes.
    pub fn cap(&self) -> usize {
        self.budget.cap()
    }

    /// Most bytes all listings ever held at once.
    #[cfg(test)]
    pub fn peak(&self) -> usize {
        self.budget.peak()
    }

    /// The snapshots in the cache.
    #[cfg(test)]
    pub fn snapshots(&self) -> Vec<Arc<DirSnapshot>> {
        self.lock().map.values().map(|c| c.snap.clone()).collect()
    }

    /// Snapshots in the cache.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ctime: i64) -> Stamp {
        let mut st = crate::passthrough::sys::zeroed_stat();
        (st.st_ctime, st.st_mtime, st.st_size, st.st_nlink) = (ctime, ctime, 4096, 2);
        Stamp::of(&st)
    }

    /// A snapshot of `names` regular files charged against `cache`.
    fn snapshot(cache: &DirCache<u64>, names: usize) -> Arc<DirSnapshot> {
        let snap = DirSnapshot::from_names((0..names).map(|i| format!("name-{i:05}").into_bytes()));
        let mut charge = Charge::default();
        cache.reserve(&mut charge, snap.memory_size()).unwrap();
        Arc::new(snap.with_charge(charge))
    }

    fn hit(f: Found) -> Option<Arc<DirSnapshot>> {
        match f {
            Found::Snapshot(s) => Some(s),
            _ => None,
        }
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
        let cache = DirCache::new(1 << 20);
        let snap = snapshot(&cache, 3);
        cache.insert(1, stamp(10), snap.clone());
        assert!(Arc::ptr_eq(&hit(cache.get(&1, &stamp(10))).unwrap(), &snap));
        assert!(matches!(cache.get(&1, &stamp(11)), Found::Miss));
        assert!(matches!(cache.get(&2, &stamp(10)), Found::Miss));
    }

    #[test]
    fn a_full_budget_drops_least_recently_used_snapshots_nobody_holds() {
        let probe = DirCache::<u64>::new(1 << 20);
        let one = snapshot(&probe, 100).memory_size();
        let cache = DirCache::new(one * 4);
        for ino in 0..4 {
            cache.insert(ino, stamp(1), snapshot(&cache, 100));
        }
        assert_eq!(cache.used(), one * 4);
        // Touch 0 so that 1 is the least recently used; a handle holds 2.
        assert!(hit(cache.get(&0, &stamp(1))).is_some());
        let held = hit(cache.get(&2, &stamp(1))).unwrap();
        cache.insert(9, stamp(1), snapshot(&cache, 100));
        assert!(cache.used() <= one * 4);
        assert!(hit(cache.get(&1, &stamp(1))).is_none());
        assert!(hit(cache.get(&0, &stamp(1))).is_some());
        assert!(hit(cache.get(&9, &stamp(1))).is_some());
        // The held one is never the one dropped: the next goes first, then the budget is full.
        cache.insert(10, stamp(1), snapshot(&cache, 100));
        assert!(hit(cache.get(&2, &stamp(1))).is_some());
        let mut c = Charge::default();
        let _a = snapshot(&cache, 100);
        let _b = snapshot(&cache, 100);
        let _d = snapshot(&cache, 100);
        assert_eq!(cache.reserve(&mut c, one), Err(Overflow::Full));
        assert_eq!(cache.peak(), one * 4);
        drop(held);
        assert_eq!(cache.len(), 1, "only the held snapshot was kept");
    }

    #[test]
    fn one_snapshot_takes_at_most_a_quarter_of_the_budget() {
        let cache = DirCache::<u64>::new(4000);
        let mut c = Charge::default();
        cache.reserve(&mut c, 600).unwrap();
        assert_eq!(cache.reserve(&mut c, 401), Err(Overflow::TooBig));
        cache.reserve(&mut c, 400).unwrap();
        assert_eq!(cache.used(), 1000);
        c.release(300);
        assert_eq!((c.bytes(), cache.used()), (700, 700));
        drop(c);
        assert_eq!(cache.used(), 0);
    }

    #[test]
    fn too_big_is_remembered_per_stamp() {
        let cache = DirCache::<u64>::new(1 << 20);
        cache.too_big(7, stamp(1));
        assert!(matches!(cache.get(&7, &stamp(1)), Found::TooBig));
        assert!(matches!(cache.get(&7, &stamp(2)), Found::Miss));
        for k in 100..100 + TOO_BIG_KEPT as u64 {
            cache.too_big(k, stamp(1));
        }
        assert!(
            matches!(cache.get(&7, &stamp(1)), Found::Miss),
            "oldest forgotten"
        );
        cache.clear();
        assert!(matches!(cache.get(&100, &stamp(1)), Found::Miss));
    }
}
