//! The dirty-page log of guest memory: `vhost-user-backend`'s [`BitmapMmapRegion`], which QEMU
//! hands a log to when a migration starts (`SET_LOG_BASE`), behind one process-wide switch.
//!
//! The library's bitmap takes a lock on every write to guest memory to learn whether there is
//! a log yet; a daemon that is not being migrated (nearly always) pays for that on every reply.
//! Here a write looks at one flag first, which is set once the first log arrives and never
//! cleared (a cancelled migration leaves the log in place; QEMU gives a new one next time).
//! One daemon serves one device, so the flag is the process's.

use std::sync::atomic::{AtomicBool, Ordering};

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapMmapRegion, BitmapReplace};
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;

/// Set once any region has a log.
static LOGGING: AtomicBool = AtomicBool::new(false);

/// The dirty-page log of one guest memory region (or of a slice of it).
#[derive(Clone, Debug, Default)]
pub struct DirtyLog(BitmapMmapRegion);

impl Bitmap for DirtyLog {
    fn mark_dirty(&self, offset: usize, len: usize) {
        // Acquire: the log set up before the flag was set is seen whole.
        if LOGGING.load(Ordering::Acquire) {
            self.0.mark_dirty(offset, len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        LOGGING.load(Ordering::Acquire) && self.0.dirty_at(offset)
    }

    fn slice_at(&self, offset: usize) -> Self {
        DirtyLog(self.0.slice_at(offset))
    }
}

impl WithBitmapSlice<'_> for DirtyLog {
    type S = Self;
}

impl BitmapSlice for DirtyLog {}

impl NewBitmap for DirtyLog {
    fn with_len(len: usize) -> Self {
        DirtyLog(BitmapMmapRegion::with_len(len))
    }
}

impl BitmapReplace for DirtyLog {
    type InnerBitmap = AtomicBitmapMmap;

    fn replace(&self, bitmap: AtomicBitmapMmap) {
        self.0.replace(bitmap);
        LOGGING.store(true, Ordering::Release);
    }
}
