//! The memory budget of directory listings: one [`Budget`] for every snapshot the daemon holds,
//! and the [`Charge`] each snapshot holds against it (a leaf: listings and their cache both use
//! it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes all listings may hold together.
#[derive(Debug)]
pub struct Budget {
    cap: usize,
    used: AtomicUsize,
    /// Most bytes ever held at once.
    peak: AtomicUsize,
}

impl Budget {
    pub(super) fn new(cap: usize) -> Self {
        Budget {
            cap,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Takes `n` bytes if they fit.
    pub(super) fn try_take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&v| v <= self.cap) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(seen) => cur = seen,
            }
        }
    }

    pub(super) fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The budget, in bytes.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Most bytes ever held at once.
    #[cfg(test)]
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// The bytes of the budget one snapshot holds; given back when it is dropped.
#[derive(Debug, Default)]
pub struct Charge {
    budget: Option<Arc<Budget>>,
    bytes: usize,
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records `n` more bytes, taken from `budget` by the caller, as held by this charge.
    pub(super) fn add(&mut self, budget: &Arc<Budget>, n: usize) {
        self.budget.get_or_insert_with(|| budget.clone());
        self.bytes += n;
    }

    /// Gives back `n` of the bytes held (the snapshot shrank).
    pub fn release(&mut self, n: usize) {
        let n = n.min(self.bytes);
        self.bytes -= n;
        if let Some(b) = &self.budget {
            b.give(n);
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let n = self.bytes;
        self.release(n);
    }
}

/// Why a snapshot could not grow (or be taken at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// It would take more than a quarter of the budget.
    TooBig,
    /// The budget is held by listings in use.
    Full,
    /// A name is longer than a record holds (`dir::NAME_MAX`): not one Linux gives.
    LongName,
}
