//! The dirty-page log of guest memory, which QEMU hands the daemon when a migration starts
//! (`SET_LOG_BASE`): one bit per 4 KiB page of guest physical memory, set by the daemon after
//! each write so that QEMU copies that page again.
//!
//! `vm-memory` gives every slice of guest memory its own copy of its region's bitmap, and
//! `virtio-queue` makes slices for every ring access. `vhost-user-backend`'s `BitmapMmapRegion`
//! holds a reference-counted lock, so every slice costs two atomic updates and every write a lock,
//! migrating or not (about 0.5 µs of daemon CPU per small request, measured: doc/performance.md).
//! Here a bitmap is two plain numbers (its region's number, its offset in the region), and the
//! logs live in one table that a write looks at only once a migration has started:
//! - a region gets its number when `vm-memory` creates its bitmap;
//! - `SET_LOG_BASE` puts each region's log in the table ([`BitmapReplace`]), after
//!   `vhost-user-backend`'s own checks that the log covers the region;
//! - nothing is ever removed (a cancelled migration leaves the log in place, as the library
//!   does; QEMU gives a new one next time), and a region's entry is a few words.
//!
//! One daemon serves one device, so the table is the process's.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapReplace, MemRegionBitmap, MmapLogReg};
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::GuestMemoryRegion;

/// Bytes of guest memory per bit of the log.
const LOG_PAGE: usize = 4096;

/// Set once any region has a log: until then a write looks at nothing else.
static LOGGING: AtomicBool = AtomicBool::new(false);
/// The next region number.
static NEXT_REGION: AtomicU32 = AtomicU32::new(0);
/// Each region's log, by region number.
static LOGS: RwLock<Vec<Option<RegionLog>>> = RwLock::new(Vec::new());

/// The log of one guest memory region.
#[derive(Debug)]
pub struct RegionLog {
    log: Arc<MmapLogReg>,
    /// Log page of the region's first byte.
    first_page: usize,
    /// Pages of the region.
    pages: usize,
}

impl RegionLog {
    fn mark(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / LOG_PAGE;
        let last = offset.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last.min(self.pages.saturating_sub(1)) {
            let bit = self.first_page + page;
            // In bounds: `new` had the library check that the log covers every page of the
            // region (its index panics otherwise, never reads out of bounds).
            // Release: the data written to the page is visible before its bit (the frontend
            // may copy the page the moment it sees the bit, then clear it).
            self.log[bit / 8].fetch_or(1 << (bit % 8), Ordering::Release);
        }
    }

    fn is_marked(&self, offset: usize) -> bool {
        let page = offset / LOG_PAGE;
        if page >= self.pages {
            return false;
        }
        let bit = self.first_page + page;
        self.log[bit / 8].load(Ordering::Relaxed) & (1 << (bit % 8)) != 0
    }
}

impl MemRegionBitmap for RegionLog {
    fn new<R: GuestMemoryRegion>(region: &R, log: Arc<MmapLogReg>) -> io::Result<Self> {
        // The library's bitmap checks that the log covers the whole region; its checks are
        // kept, its bitmap is not.
        AtomicBitmapMmap::new(region, log.clone())?;
        let start = usize::try_from(region.start_addr().0)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let len = usize::try_from(region.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        Ok(RegionLog {
            log,
            first_page: start / LOG_PAGE,
            pages: len / LOG_PAGE,
        })
    }
}

/// The dirty-page log of one guest memory region, or of a slice of it (from `offset` on).
#[derive(Clone, Copy, Debug)]
pub struct DirtyLog {
    region: u32,
    offset: usize,
}

impl DirtyLog {
    fn with_log<T>(&self, f: impl FnOnce(&RegionLog) -> T) -> Option<T> {
        // Acquire: a log put in the table before the flag was set is seen.
        if !LOGGING.load(Ordering::Acquire) {
            return None;
        }
        let logs = LOGS.read().unwrap_or_else(PoisonError::into_inner);
        logs.get(self.region as usize)?.as_ref().map(f)
    }
}

impl Default for DirtyLog {
    /// A new region's bitmap (every bitmap `vm-memory` makes for a region gets its number).
    fn default() -> Self {
        DirtyLog {
            region: NEXT_REGION.fetch_add(1, Ordering::Relaxed),
            offset: 0,
        }
    }
}

impl Bitmap for DirtyLog {
    fn mark_dirty(&self, offset: usize, len: usize) {
        let at = self.offset.saturating_add(offset);
        self.with_log(|log| log.mark(at, len));
    }

    fn dirty_at(&self, offset: usize) -> bool {
        let at = self.offset.saturating_add(offset);
        self.with_log(|log| log.is_marked(at)).unwrap_or(false)
    }

    fn slice_at(&self, offset: usize) -> Self {
        DirtyLog {
            region: self.region,
            offset: self.offset.saturating_add(offset),
        }
    }
}

impl WithBitmapSlice<'_> for DirtyLog {
    type S = Self;
}

impl BitmapSlice for DirtyLog {}

impl NewBitmap for DirtyLog {
    fn with_len(_len: usize) -> Self {
        DirtyLog::default()
    }
}

impl BitmapReplace for DirtyLog {
    type InnerBitmap = RegionLog;

    fn replace(&self, log: RegionLog) {
        let mut logs = LOGS.write().unwrap_or_else(PoisonError::into_inner);
        let at = self.region as usize;
        if logs.len() <= at {
            logs.resize_with(at + 1, || None);
        }
        logs[at] = Some(log);
        drop(logs);
        LOGGING.store(true, Ordering::Release);
    }
}
