//! The request thread pool under a flood: a guest queues far more requests than the pool has
//! threads while every request blocks. The device must take at most its backlog off the rings,
//! leave the rest there, and resume popping as the pool answers, until every request is
//! answered: no notification may be lost, whether or not event-index is negotiated.
//!
//! Unit tests of the backend (they read how many chains were in flight, and shorten the wait
//! of a queue stop), driving a device through the test frontend as QEMU and a guest would.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use virtiofsd_frontend::{FrontendConfig, FsFrontend};

use super::{FsBackend, POOL_BACKLOG};
use crate::filesystem::{Context, FileLock, FileSystem, LateReply, LockKind};
use crate::fuse::abi::{self, opcode, Pod};
use crate::migration::StateError;

/// A filesystem whose GETATTR, and SETLK (every lock is taken), wait until the gate opens.
#[derive(Default)]
struct Gated {
    open: Mutex<bool>,
    opened: Condvar,
    /// GETATTRs entered so far.
    entered: AtomicUsize,
    /// SETLKs entered so far.
    locks_entered: AtomicUsize,
    /// The late replies of the SETLKWs that wait (never answered by the filesystem).
    waiting: Mutex<Vec<LateReply>>,
}

impl Gated {
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn wait_open(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }
}

/// The filesystem the device serves: the shared gate.
struct GatedFs(Arc<Gated>);

impl FileSystem for GatedFs {
    /// Nothing to migrate but the session: a state is refused only by the device.
    fn save_state(&self, _out: &mut crate::migration::Encoder) -> Result<(), StateError> {
        Ok(())
    }

    fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        _handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        let g = &self.0;
        g.entered.fetch_add(1, Ordering::SeqCst);
        g.wait_open();
        // SAFETY: stat64 is plain data; all-zero is a valid value.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        st.st_ino = inode;
        st.st_mode = libc::S_IFREG | 0o644;
        Ok((st, Duration::ZERO))
    }

    fn setlk(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _owner: u64,
        _lock: FileLock,
        _kind: LockKind,
    ) -> io::Result<()> {
        self.0.locks_entered.fetch_add(1, Ordering::SeqCst);
        self.0.wait_open();
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }

    fn setlk_wait(
        &self,
        _ctx: &Context,
        _inode: u64,
        _handle: u64,
        _owner: u64,
        _lock: FileLock,
        _kind: LockKind,
        reply: LateReply,
    ) -> io::Result<()> {
        self.0.waiting.lock().unwrap().push(reply);
        Ok(())
    }
}

struct Device {
    backend: Arc<FsBackend<GatedFs>>,
    gate: Arc<Gated>,
    thread: Option<JoinHandle<()>>,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn start(pool: usize) -> Device {
    start_with(pool, |b| b)
}

fn start_with(pool: usize, f: impl FnOnce(FsBackend<GatedFs>) -> FsBackend<GatedFs>) -> Device {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.sock");
    let gate = Arc::new(Gated::default());
    let backend = Arc::new(f(FsBackend::new(GatedFs(gate.clone()), None, pool).unwrap()));
    let mut listener = Listener::new(&path, true).unwrap();
    let b = backend.clone();
    let thread = std::thread::spawn(move || {
        let mut daemon = VhostUserDaemon::new(
            "pool-test".into(),
            b,
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .unwrap();
        daemon.start(&mut listener).unwrap();
        let _ = daemon.wait();
        for h in daemon.get_epoll_handlers() {
            h.send_exit_event();
        }
    });
    Device {
        backend,
        gate,
        thread: Some(thread),
        path,
        _dir: dir,
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `queues` request queues each flooded with `per_queue` GETATTRs while a pool of `pool`
/// threads is stuck on the first ones; then the gate opens and every request must come back.
fn flood(pool: usize, queues: usize, per_queue: usize, event_idx: bool) {
    let mut d = start(pool);
    let cfg = FrontendConfig {
        mem_size: 32 << 20,
        client_arena_size: 2 << 20,
        event_idx,
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let mut fe = FsFrontend::connect_with(&d.path, queues, &cfg).unwrap();
    assert_eq!(fe.event_idx(), event_idx);
    let mut clients: Vec<_> = (0..queues).map(|q| fe.client(q).unwrap()).collect();
    clients[0].init().unwrap();
    let mut tickets = Vec::new();
    for (q, c) in clients.iter_mut().enumerate() {
        // One ring slot per request.
        c.set_indirect(true).unwrap();
        for i in 0..per_queue {
            let node = (q * per_queue + i + 1) as u64;
            let t = c
                .enqueue(opcode::GETATTR, node, &[&[0u8; 16]], 120)
                .unwrap();
            tickets.push((q, node, t));
        }
        c.publish().unwrap();
    }
    // Every pool thread is stuck in a GETATTR; give the queue threads time to pop all they will.
    wait_for("the pool to be busy", || {
        d.gate.entered.load(Ordering::SeqCst) == pool
    });
    std::thread::sleep(Duration::from_millis(200));
    let (peak, limit) = d.backend.pool_peak().unwrap();
    assert_eq!(limit, pool * POOL_BACKLOG);
    assert_eq!(peak, limit, "popped up to the backlog and no further");
    assert_eq!(d.gate.entered.load(Ordering::SeqCst), pool);

    d.gate.release();
    for (q, node, t) in tickets {
        let r = clients[q].wait(t).unwrap();
        assert_eq!(r.error, 0, "GETATTR {node} on queue {q}");
        let out = <abi::AttrOut as Pod>::from_prefix(&r.body).unwrap();
        assert_eq!(out.attr.ino, node);
    }
    assert_eq!(
        d.gate.entered.load(Ordering::SeqCst),
        queues * per_queue,
        "every request reached the filesystem once"
    );
    let (peak, limit) = d.backend.pool_peak().unwrap();
    assert!(peak <= limit, "{peak} chains in flight, limit {limit}");
    drop(clients);
    fe.disconnect();
    let t = d.thread.take().unwrap();
    wait_for("the device to stop", || t.is_finished());
    t.join().unwrap();
}

#[test]
fn a_flooded_pool_takes_at_most_its_backlog_and_answers_everything() {
    flood(2, 1, 100, true);
}

#[test]
fn a_flooded_pool_resumes_every_queue_without_event_index() {
    flood(1, 3, 40, false);
}

#[test]
fn a_flooded_pool_resumes_several_queues_with_event_index() {
    flood(3, 2, 60, true);
}

/// A migration stops the queues (`GET_VRING_BASE`) and then copies guest memory one last time:
/// a reply written after that would never reach the destination. Stopping a queue waits for
/// the request in flight on it, with a thread pool and without.
#[test]
fn stopping_a_queue_waits_for_the_requests_in_flight() {
    for pool in [0, 2] {
        let mut d = start(pool);
        let cfg = FrontendConfig {
            mem_size: 32 << 20,
            client_arena_size: 2 << 20,
            timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let mut fe = FsFrontend::connect_with(&d.path, 1, &cfg).unwrap();
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let t = c.enqueue(opcode::GETATTR, 7, &[&[0u8; 16]], 120).unwrap();
        c.publish().unwrap();
        wait_for("the request to block", || {
            d.gate.entered.load(Ordering::SeqCst) == 1
        });
        let stopper = std::thread::spawn(move || {
            let bases = fe.stop_queues().unwrap();
            (fe, bases)
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !stopper.is_finished(),
            "pool {pool}: GET_VRING_BASE answered with a request in flight"
        );
        d.gate.release();
        let (mut fe, bases) = stopper.join().unwrap();
        assert_eq!(bases[1], 2, "pool {pool}: INIT and the GETATTR were taken");
        // The reply is in the used ring already.
        let r = c.wait(t).unwrap();
        assert_eq!(r.error, 0);
        drop(c);
        fe.disconnect();
        let th = d.thread.take().unwrap();
        wait_for("the device to stop", || th.is_finished());
        th.join().unwrap();
    }
}

/// A guest that keeps a request blocked on every queue delays the stop of all of them by one
/// wait, not one per queue; the state is then refused (the migration fails, the guest goes on
/// at the source), also once the requests are answered, until the queues stop cleanly.
#[test]
fn a_request_blocked_on_every_queue_delays_the_stop_once() {
    let wait = Duration::from_millis(1500);
    let mut d = start_with(0, |b| b.with_stop_wait(wait));
    let cfg = FrontendConfig {
        mem_size: 32 << 20,
        client_arena_size: 2 << 20,
        // After the stop the device has no call eventfd: a reply is seen at the deadline.
        timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let queues = 3;
    let mut fe = FsFrontend::connect_with(&d.path, queues, &cfg).unwrap();
    let mut clients: Vec<_> = (0..queues).map(|q| fe.client(q).unwrap()).collect();
    clients[0].init().unwrap();
    let mut tickets = Vec::new();
    for c in &mut clients {
        tickets.push(c.enqueue(opcode::GETATTR, 7, &[&[0u8; 16]], 120).unwrap());
        c.publish().unwrap();
    }
    wait_for("a request to block on every queue", || {
        d.gate.entered.load(Ordering::SeqCst) == queues
    });
    let started = Instant::now();
    fe.stop_queues().unwrap();
    let took = started.elapsed();
    assert!(
        took >= wait,
        "stopped after {took:?} with requests in flight"
    );
    assert!(
        took < wait * 2,
        "{queues} blocked queues took {took:?} to stop (one wait is {wait:?})"
    );
    assert!(
        fe.save_state().is_err(),
        "state saved with requests in flight"
    );
    d.gate.release();
    for (c, t) in clients.iter_mut().zip(tickets) {
        assert_eq!(c.wait(t).unwrap().error, 0);
    }
    // The replies reached guest memory after the stop: still no state until a stop that finds
    // every queue idle.
    assert!(fe.save_state().is_err(), "state saved after a late stop");
    fe.stop_queues().unwrap();
    fe.save_state().expect("state after a clean stop");
    drop(clients);
    fe.disconnect();
    let th = d.thread.take().unwrap();
    wait_for("the device to stop", || th.is_finished());
    th.join().unwrap();
}

/// A SETLKW whose first try was still running when its queue stopped (`GET_VRING_BASE` marks
/// the ring not ready, then answers the queue's waiting lock requests `ENOLCK`): it used to be
/// registered to wait after that, escaped the stop's answers, held the stop for its whole wait
/// and would have been answered after it (into memory a migration copied already). It is
/// answered `ENOLCK` before the stop returns now, with a thread pool and without.
#[test]
fn a_setlkw_whose_queue_stops_during_its_first_try_is_answered_enolck_before_the_stop() {
    for pool in [0, 2] {
        let wait = Duration::from_secs(3);
        let mut d = start_with(pool, |b| b.with_stop_wait(wait));
        let cfg = FrontendConfig {
            mem_size: 32 << 20,
            client_arena_size: 2 << 20,
            timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let mut fe = FsFrontend::connect_with(&d.path, 1, &cfg).unwrap();
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let lk = abi::LkIn {
            fh: 1,
            owner: 1,
            lk: abi::FileLock {
                start: 0,
                end: 0,
                typ: libc::F_WRLCK as u32,
                pid: 1,
            },
            lk_flags: 0,
            padding: 0,
        };
        let t = c.enqueue(opcode::SETLKW, 7, &[lk.as_bytes()], 16).unwrap();
        c.publish().unwrap();
        wait_for("the first try to block", || {
            d.gate.locks_entered.load(Ordering::SeqCst) == 1
        });
        let started = Instant::now();
        let stopper = std::thread::spawn(move || {
            fe.stop_queues().unwrap();
            fe
        });
        // The stop has marked the ring not ready and answered what waited (nothing yet).
        std::thread::sleep(Duration::from_millis(300));
        d.gate.release();
        let mut fe = stopper.join().unwrap();
        let took = started.elapsed();
        assert!(
            took < wait,
            "pool {pool}: the stop waited {took:?} for a SETLKW that escaped it"
        );
        assert_eq!(c.wait(t).unwrap().error, -libc::ENOLCK, "pool {pool}");
        assert!(
            d.gate.waiting.lock().unwrap().is_empty(),
            "pool {pool}: the SETLKW was handed to the filesystem to wait"
        );
        fe.save_state().expect("state after a clean stop");
        drop(c);
        fe.disconnect();
        let th = d.thread.take().unwrap();
        wait_for("the device to stop", || th.is_finished());
        th.join().unwrap();
    }
}
