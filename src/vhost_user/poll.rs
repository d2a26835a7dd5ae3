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
        self.woken_at(queue, Instant::now());
    }

    fn woken_at(&self, queue: usize, now: Instant) {
        let Some(mut s) = self.state(queue) else {
            return;
        };
        if let Some(last) = s.last_end {
            let gap = now.saturating_duration_since(last);
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
        self.pass_ended_at(queue, Instant::now());
    }

    fn pass_ended_at(&self, queue: usize, now: Instant) {
        if let Some(mut s) = self.state(queue) {
            s.last_end = Some(now);
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
        // Times given, not slept: the rule, whatever the machine's load.
        let ms = Duration::from_millis;
        let p = Poll::new(ms(5), 2);
        let t0 = Instant::now();
        assert_eq!(p.window(0), Duration::ZERO, "nothing learnt yet");
        p.pass_ended_at(0, t0);
        p.woken_at(0, t0 + ms(1));
        assert_eq!(
            p.window(0),
            Duration::from_micros(1500),
            "1.5 times the gap"
        );
        assert_eq!(p.window(1), Duration::ZERO, "per queue");
        // A longer gap within the maximum grows it, up to the maximum.
        p.pass_ended_at(0, t0 + ms(2));
        p.woken_at(0, t0 + ms(6));
        assert_eq!(p.window(0), ms(5));
        // A gap past the maximum halves it.
        p.pass_ended_at(0, t0 + ms(10));
        p.woken_at(0, t0 + ms(20));
        assert_eq!(p.window(0), Duration::from_micros(2500));
        // A shorter gap does not shrink it.
        p.pass_ended_at(0, t0 + ms(21));
        p.woken_at(0, t0 + ms(21) + Duration::from_micros(10));
        assert_eq!(p.window(0), Duration::from_micros(2500));
        // Off: no state, no window.
        let off = Poll::new(Duration::ZERO, 1);
        off.pass_ended_at(0, t0);
        off.woken_at(0, t0 + ms(1));
        assert_eq!(off.window(0), Duration::ZERO);
    }
}
