//! A rate limit for the warnings a guest can cause at will, and `warn_throttled!`, the
//! `log::warn!` that goes through one.

use std::sync::{Mutex, PoisonError};

/// Warnings of one kind a throttle lets through per [`THROTTLE_INTERVAL`] (the kernel's
/// `printk_ratelimit` default).
pub const THROTTLE_BURST: u32 = 10;
/// The length of a throttle's window.
pub const THROTTLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// A rate limit for one warning a guest can cause at will (a malformed chain, a refused
/// request): at most [`THROTTLE_BURST`] lines per [`THROTTLE_INTERVAL`]; those past it are
/// counted, and the first line let through in a later window is preceded by how many were
/// suppressed. A guest sending a hundred thousand bad chains gets a few lines, not a hundred
/// thousand, and the count still tells how many there were. Used through
/// [`warn_throttled!`](crate::warn_throttled), one throttle per call site.
#[derive(Debug)]
pub struct Throttle {
    state: Mutex<ThrottleState>,
}

#[derive(Debug)]
struct ThrottleState {
    /// When the current window began (none: nothing logged yet).
    since: Option<std::time::Instant>,
    /// Lines let through in the current window.
    passed: u32,
    /// Lines suppressed since the last one let through.
    suppressed: u64,
}

/// What a [`Throttle`] says of one more line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Log it, after saying that this many were suppressed before it (when not zero).
    Log { suppressed: u64 },
    /// Count it and log nothing.
    Suppress,
}

impl Throttle {
    pub const fn new() -> Self {
        Throttle {
            state: Mutex::new(ThrottleState {
                since: None,
                passed: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether one more line, now, is logged.
    pub fn admit(&self) -> Admit {
        self.admit_at(std::time::Instant::now())
    }

    /// [`Throttle::admit`] at `now` (tests give the times).
    pub fn admit_at(&self, now: std::time::Instant) -> Admit {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let new_window = s
            .since
            .is_none_or(|t| now.saturating_duration_since(t) >= THROTTLE_INTERVAL);
        if new_window {
            s.since = Some(now);
            s.passed = 0;
        }
        if s.passed >= THROTTLE_BURST {
            s.suppressed = s.suppressed.saturating_add(1);
            return Admit::Suppress;
        }
        s.passed += 1;
        Admit::Log {
            suppressed: std::mem::take(&mut s.suppressed),
        }
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

/// `log::warn!` through a [`Throttle`] of the call site's own: for warnings about what a guest
/// did, which it can repeat as fast as it likes. The calling crate depends on `log`.
#[macro_export]
macro_rules! warn_throttled {
    ($($arg:tt)+) => {{
        static THROTTLE: $crate::throttle::Throttle = $crate::throttle::Throttle::new();
        match THROTTLE.admit() {
            $crate::throttle::Admit::Log { suppressed } => {
                if suppressed > 0 {
                    log::warn!("{suppressed} more warnings like the next one were suppressed");
                }
                log::warn!($($arg)+);
            }
            $crate::throttle::Admit::Suppress => {}
        }
    }};
}

/// The macro by this module's path too (`#[macro_export]` puts it at the crate's root).
pub use crate::warn_throttled;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_passes_a_burst_per_window_and_counts_the_rest() {
        // Times given, not slept.
        let t = Throttle::new();
        let t0 = std::time::Instant::now();
        let burst = THROTTLE_BURST as usize;
        let first: Vec<Admit> = (0..burst + 5).map(|_| t.admit_at(t0)).collect();
        assert!(first[..burst]
            .iter()
            .all(|a| *a == Admit::Log { suppressed: 0 }));
        assert!(first[burst..].iter().all(|a| *a == Admit::Suppress));
        // Still the same window.
        let late = t0 + THROTTLE_INTERVAL - std::time::Duration::from_millis(1);
        assert_eq!(t.admit_at(late), Admit::Suppress);
        // The next window lets a line through, saying how many were not logged.
        let next = t0 + THROTTLE_INTERVAL;
        assert_eq!(t.admit_at(next), Admit::Log { suppressed: 6 });
        assert_eq!(t.admit_at(next), Admit::Log { suppressed: 0 });
    }
}
