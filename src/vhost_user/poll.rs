//! Adaptive polling of a queue's available ring (`--poll-window`).
//!
//! After a pass has served every chain the guest made available, the queue's worker can keep
//! looking at the available ring for a short window before it goes back to sleep on the kick
//! eventfd. While it looks, the guest's notifications stay off (with `VIRTIO_RING_F_EVENT_IDX`
//! the device does not move `avail_event`, so the driver does not kick): a request the guest
//! makes in the window costs neither a kick (a VM exit on KVM) nor a wake-up of the daemon.
//!
//! The window tunes itself per queue, up to the flag's maximum: when the worker is woken by a
//! kick that came within the maximum after its last pass, the window grows to one and a half
//! times that gap (a window that long would have caught it); when a window ends with nothing,
//! it halves. A guest that stops sending costs one window at the end of its burst and less
//! each time after, and an idle queue costs nothing. Each look yields the CPU first, so a
//! runnable thread on the same CPU (a vCPU of a guest on a small host) runs before the poller.
//!
//! No request is lost when polling stops: the worker turns notifications back on and reads
//! the ring once more (`enable_notification`), as it does without polling.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::vring::Vring;

/// The polling state of every queue.
#[derive(Debug)]
pub struct Poll {
    max: Duration,
    queues: Vec<Mutex<QueuePoll>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct QueuePoll {
    /// How long the next window lasts.
    window: Duration,
    /// When the last pass ended.
    last_end: Option<Instant>,
}

/// What [`Poll::wait`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// The guest made chains available.
    More,
    /// The window ended with nothing, or polling is off for now.
    Nothing,
    /// The queue stopped.
    Stopped,
}

impl Poll {
    /// Polling of `queues` queues with windows of at most `max` (zero: never).
    pub fn new(max: Duration, queues: usize) -> Self {
        Poll {
            max,
            queues: (0..queues).map(|_| Mutex::default()).collect(),
        }
    }

    fn state(&self, queue: usize) -> Option<std::sync::MutexGuard<'_, QueuePoll>> {
        if self.max.is_zero() {
            return None;
        }
        Some(
            self.queues
                .get(queue)?
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The worker of `queue` was woken by the guest's kick: the window follows the gap since
    /// the last pass.
    pub fn woken(&self, queue: usize) {
        let Some(mut s) = self.state(queue) else {
            return;
        };
        if let Some(last) = s.last_end {
            let gap = last.elapsed();
            s.window = if gap <= self.max {
                s.window.max(gap + gap / 2).min(self.max)
            } else {
                s.window / 2
            };
        }
    }

    /// Looks at the available ring of `vring` for the queue's window.
    pub fn wait(&self, queue: usize, vring: &Vring) -> Polled {
        let Some(mut s) = self.state(queue) else {
            return Polled::Nothing;
        };
        if s.window.is_zero() {
            return Polled::Nothing;
        }
        let deadline = Instant::now() + s.window;
        loop {
            match vring.pending() {
                None => return Polled::Stopped,
                Some(true) => return Polled::More,
                Some(false) => {}
            }
            if Instant::now() >= deadline {
                s.window /= 2;
                if s.window < Duration::from_micros(1) {
                    s.window = Duration::ZERO;
                }
                return Polled::Nothing;
            }
            std::thread::yield_now();
        }
    }

    /// A pass of `queue` ended (its worker goes to sleep).
    pub fn pass_ended(&self, queue: usize) {
        if let Some(mut s) = self.state(queue) {
            s.last_end = Some(Instant::now());
        }
    }

    /// The window `queue` polls for next (for tests).
    #[cfg(test)]
    pub fn window(&self, queue: usize) -> Duration {
        self.state(queue).map(|s| s.window).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_grows_with_the_gaps_it_would_catch_and_shrinks_when_idle() {
        let p = Poll::new(Duration::from_millis(5), 2);
        assert_eq!(p.window(0), Duration::ZERO, "nothing learnt yet");
        p.pass_ended(0);
        std::thread::sleep(Duration::from_millis(1));
        p.woken(0);
        let w = p.window(0);
        assert!(
            w >= Duration::from_micros(1500) && w <= Duration::from_millis(5),
            "{w:?}"
        );
        assert_eq!(p.window(1), Duration::ZERO, "per queue");
        // A gap past the maximum halves it.
        p.pass_ended(0);
        std::thread::sleep(Duration::from_millis(6));
        p.woken(0);
        assert_eq!(p.window(0), w / 2);
        // Off: no state, no window.
        let off = Poll::new(Duration::ZERO, 1);
        off.pass_ended(0);
        off.woken(0);
        assert_eq!(off.window(0), Duration::ZERO);
    }
}
