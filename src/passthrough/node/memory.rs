//! The memory a node's file gives back: how the allocator is told to return what the guest's
//! FORGETs free ([`allocator_gives_memory_back`]), and when it is made to
//! ([`GiveBack`], [`freed`], [`give_back_free_memory`]). The nodes themselves are not the
//! allocator's (see `slab`); the node tables, the listings and the names are.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes the guest's forgets freed since the allocator last gave its free pages back.
static FREED: AtomicUsize = AtomicUsize::new(0);
/// Freed bytes past which the allocator gives its free pages back: often enough that a walk the
/// guest forgot leaves at most this much behind, seldom enough (once per some 6,000 nodes) that
/// the trim costs a forget nothing noticeable.
const TRIM_EVERY: usize = 1 << 20;

/// Records that forgetting freed `bytes`; past [`TRIM_EVERY`] the allocator's free pages go
/// back to the system.
pub fn freed(bytes: usize) {
    if FREED.fetch_add(bytes, Ordering::Relaxed) + bytes >= TRIM_EVERY {
        FREED.store(0, Ordering::Relaxed);
        give_back_free_memory();
    }
}

/// Makes the allocator give memory back as the guest forgets (the nodes are not the
/// allocator's: see `slab`; the tables, listings and names are):
/// - glibc raises its thresholds each time a large block is freed (the node tables,
///   reallocated as they grow, are such blocks), up to 32 MiB for what it maps on its own and
///   64 MiB for the free room it keeps at the top of a heap. Fixed thresholds end that: blocks
///   of 256 KiB and more are mappings of their own, and more than 1 MiB free at the top of a
///   heap is returned at once (not less: a request's large buffers, freed in turn, must not
///   make each request give pages back and fault them in again).
/// - One arena: `malloc_trim` does not reach the top of the heaps glibc makes for other
///   threads, where up to that 1 MiB each stayed after the guest forgot a walk. The daemon's
///   requests allocate next to nothing (`tests/allocations.rs`), so they do not wait on one
///   another for it.
///
/// Called once at start, by the daemon.
pub fn allocator_gives_memory_back() {
    #[cfg(all(target_env = "gnu", not(miri)))]
    // SAFETY: mallopt only changes the allocator's tunables; it has no precondition, and these
    // values are within the documented ranges.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the allocator's free pages to the system (glibc keeps freed small blocks in its
/// arenas otherwise), and the pages of free node slots.
pub fn give_back_free_memory() {
    super::slab::give_back_free_pages();
    #[cfg(all(target_env = "gnu", not(miri)))]
    // SAFETY: malloc_trim only releases memory the allocator holds free; it has no
    // precondition.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Nodes removed between two give-backs at least (about 26 KiB of nodes).
const TRIM_AFTER_NODES: usize = 256;

/// Nodes removed since the last give-back for one to be made when the guest has forgotten
/// every node.
pub(super) const TRIM_LAST: usize = 16;

/// When the node tables' FORGETs give the free memory back: once half the nodes held at the
/// peak are gone, so that a walk the guest forgets leaves nothing behind (the last give-back
/// comes with the last forget) for O(log n) give-backs.
#[derive(Debug)]
pub struct GiveBack {
    /// The most nodes held since the allocator last gave its free pages back: once half of
    /// them are forgotten it gives them back again.
    high_water: AtomicUsize,
    /// Nodes removed since the allocator last gave its free pages back: a give-back needs
    /// [`TRIM_AFTER_NODES`] of them, so that a guest that looks up and forgets one file in turn
    /// cannot make every FORGET cost one.
    removed_since: AtomicUsize,
    /// Give-backs decided (for the tests).
    made: AtomicUsize,
}

impl Default for GiveBack {
    fn default() -> Self {
        GiveBack {
            high_water: AtomicUsize::new(1),
            removed_since: AtomicUsize::new(0),
            made: AtomicUsize::new(0),
        }
    }
}

impl GiveBack {
    /// The tables hold `len` nodes now (after an add).
    pub fn held(&self, len: usize) {
        self.high_water.fetch_max(len, Ordering::Relaxed);
    }

    /// A node was removed from the tables, which hold `len` now (called under their write
    /// lock): whether the free memory is to go back now ([`give_back_free_memory`]).
    pub fn removed(&self, len: usize) -> bool {
        let since = self.removed_since.fetch_add(1, Ordering::Relaxed) + 1;
        // Half the nodes held at the peak are gone (and enough since the last time), or the
        // guest forgot everything: then the last nodes since the last halving (fewer than
        // `TRIM_AFTER_NODES` may be left by then) go back too, once some were forgotten (a
        // guest that looks up and forgets one file in turn gets one give-back per
        // `TRIM_LAST` FORGETs, not one each).
        let halved = (since >= TRIM_AFTER_NODES
            && len.saturating_mul(2) <= self.high_water.load(Ordering::Relaxed))
            || (len <= 1 && since >= TRIM_LAST);
        if halved {
            self.high_water.store(len.max(1), Ordering::Relaxed);
            self.removed_since.store(0, Ordering::Relaxed);
            self.made.fetch_add(1, Ordering::Relaxed);
        }
        halved
    }

    /// Give-backs decided so far.
    #[cfg(test)]
    pub fn made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }

    /// Nodes removed since the last give-back.
    #[cfg(test)]
    pub fn removed_since(&self) -> usize {
        self.removed_since.load(Ordering::Relaxed)
    }
}
