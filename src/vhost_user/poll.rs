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
//! it halves. Each look yields the CPU first, so a runnable thread on the same CPU (a vCPU of
//! a guest on a small host) runs before the poller.
//!
//! Polling must pay for itself: a window never costs more CPU than the requests it serves save.
//! A request that polling finds saves the guest's kick and the worker's wake-up, worth
//! [`HIT_CREDIT`]; each queue keeps a credit of polling time, which such a request adds to
//! and every moment spent polling takes from, and a window is polled only when the credit
//! pays for all of it. A kick that came less than [`HIT_CREDIT`] after the last pass adds what
//! polling for that gap would have saved ([`HIT_CREDIT`] less the gap), so a guest that turns
//! busy gets polling back after a few kicks. A guest sending one request every few milliseconds
//! would have the worker poll for milliseconds to save microseconds: it earns no credit and
//! the worker sleeps between its requests. The credit is capped at the flag's maximum, so an
//! idle queue costs at most one window.
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

/// What one request found by polling saves: the guest's kick and the wake-up of the sleeping
/// worker (`epoll_wait`, the kick eventfd, a context switch), which cost tens of microseconds
/// on the machines of doc/performance.md. Polling time is paid for at this rate.
pub const HIT_CREDIT: Duration = Duration::from_micros(25);

#[derive(Debug, Default, Clone, Copy)]
struct QueuePoll {
    /// How long the next window lasts (if the credit allows).
    window: Duration,
    /// When the last pass ended.
    last_end: Option<Instant>,
    /// Polling time the queue may still spend (see the module's documentation).
    credit: Duration,
    /// Time spent polling since the start (what the tests check).
    spent: Duration,
}

impl QueuePoll {
    /// How long the next window lasts: as long as the gaps ask for, if the credit pays for all
    /// of it; else none (a shorter one would end before the request it waits for comes).
    fn length(&self) -> Duration {
        if self.credit >= self.window {
            self.window
        } else {
            Duration::ZERO
        }
    }

    /// A window ended after `spent`, `found` a request or not: its time is paid from the
    /// credit, a request found adds [`HIT_CREDIT`] (up to `max`), and a window that found
    /// nothing halves.
    fn ended(&mut self, spent: Duration, found: bool, max: Duration) {
        self.spent = self.spent.saturating_add(spent);
        self.credit = self.credit.saturating_sub(spent);
        if found {
            self.credit = (self.credit + HIT_CREDIT).min(max);
        } else {
            self.window /= 2;
            if self.window < Duration::from_micros(1) {
                self.window = Duration::ZERO;
            }
        }
    }
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
            // Polling for this gap would have cost less than the kick and the wake-up.
            if let Some(saved) = HIT_CREDIT.checked_sub(gap) {
                s.credit = (s.credit + saved).min(self.max);
            }
        }
    }

    /// Looks at the available ring of `vring` for the queue's window.
    pub fn wait(&self, queue: usize, vring: &Vring) -> Polled {
        let Some(mut s) = self.state(queue) else {
            return Polled::Nothing;
        };
        let length = s.length();
        if length.is_zero() {
            return Polled::Nothing;
        }
        let start = Instant::now();
        let deadline = start + length;
        loop {
            let polled = match vring.pending() {
                None => Polled::Stopped,
                Some(true) => Polled::More,
                Some(false) if Instant::now() >= deadline => Polled::Nothing,
                Some(false) => {
                    std::thread::yield_now();
                    continue;
                }
            };
            s.ended(start.elapsed(), polled == Polled::More, self.max);
            return polled;
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

    /// Plays `n` requests on queue 0 of `p`, each coming `gap` after the last was served
    /// (served at once): caught by the window when it is polled that long, else kicked.
    /// Returns the time spent polling and the requests polling found.
    fn play(p: &Poll, gap: Duration, n: usize) -> (Duration, usize) {
        let mut now = Instant::now();
        let mut hits = 0;
        p.pass_ended_at(0, now);
        for _ in 0..n {
            let mut s = p.state(0).unwrap();
            let length = s.length();
            if !length.is_zero() && gap <= length {
                s.ended(gap, true, p.max);
                hits += 1;
                now += gap;
                continue;
            }
            if !length.is_zero() {
                s.ended(length, false, p.max);
            }
            drop(s);
            // Asleep: the request kicks, and its pass ends when it is served.
            now += gap;
            p.woken_at(0, now);
            p.pass_ended_at(0, now);
        }
        (p.state(0).unwrap().spent, hits)
    }

    #[test]
    fn polling_never_costs_more_than_the_requests_it_finds_save() {
        // Times given, not slept. A trickle of one request every 8 ms used to keep the worker
        // polling all the time (a window of 10 ms catches each request after 8 ms).
        let us = Duration::from_micros;
        for max in [us(50), us(200), us(10_000)] {
            for gap in [1, 5, 10, 20, 24, 26, 40, 100, 1_000, 8_000, 9_000, 20_000].map(us) {
                let p = Poll::new(max, 1);
                let n = 2_000;
                let (spent, hits) = play(&p, gap, n);
                assert!(
                    spent <= HIT_CREDIT * hits as u32,
                    "max {max:?}, gap {gap:?}: {spent:?} polled for {hits} requests found"
                );
                // Polling keeps its use: requests that come closer together than a wake-up
                // costs are found by polling, once a few kicks have paid for a window.
                if gap < HIT_CREDIT && gap <= max {
                    assert!(
                        hits >= n * 9 / 10,
                        "max {max:?}, gap {gap:?}: {hits} of {n} found by polling"
                    );
                } else {
                    assert_eq!(hits, 0, "max {max:?}, gap {gap:?}");
                }
            }
        }
    }

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
