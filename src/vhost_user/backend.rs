//! The vhost-user-fs device: a `VhostUserBackend` that serves FUSE requests from its queues.
//!
//! Queue 0 is the high-priority queue (FORGET), queues 1.. are request queues. Each queue gets
//! its own worker thread from `vhost-user-backend`; a worker pops a chain, hands it to the
//! shared [`Server`] as a reader/writer pair, and returns it to the guest with the reply length.
//! With `--thread-pool-size N` each queue's chains are handed to a pool of N threads instead, so
//! slow requests on one queue do not hold up the ones behind them. At most [`POOL_BACKLOG`] times
//! N chains are taken off the rings and not yet answered: a queue that finds the pool that busy
//! stops popping and leaves the rest in its ring, and the pool thread whose answer brings the
//! pool down to half that kicks it again (through its kick eventfd, as the guest would), so it
//! resumes where it stopped.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use log::{error, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::descriptor::{split_chain, DirtyLog, GuestMem, GuestMemory};
use super::poll::{Poll, Polled};
pub use super::vring::Vring;
use crate::error::Chain;
use crate::filesystem::{FileSystem, LateReply};
use crate::fuse::io::Writer as _;
use crate::fuse::server::{status_reply, Handled, Server};
use crate::logging::warn_throttled;
use crate::migration;

/// A job a [`LoadKeeper`] runs: one state load.
pub type LoadJob = Box<dyn FnOnce() + Send>;

/// What a migration destination's state load needs and the threads that serve the guest must
/// not have (with `--migration-mode=file-handles`, the capability to open file handles): one
/// thread that runs the load with it, until it is closed. The device asks for it through this
/// trait only; the daemon, which sets the process up, hands it one ([`FsBackend::with_keeper`]).
pub trait LoadKeeper: Send + Sync {
    /// Runs `job` with what a load needs; gives it back when closed.
    fn run(&self, job: LoadJob) -> Result<(), LoadJob>;
    /// Ends it: no load runs from now on. Returns once what it kept is given up (a second
    /// call, or one made while the first waits, returns at once).
    fn close(&self);
    /// Whether it still runs jobs.
    fn is_open(&self) -> bool;
}

/// Largest virtqueue the device accepts.
pub const MAX_QUEUE_SIZE: usize = 32768;
/// Most request queues the device offers (QEMU's `num-request-queues`).
pub const MAX_REQUEST_QUEUES: usize = 16;
/// Most chains returned before the guest is interrupted: a burst of requests is answered with
/// one interrupt per batch (or per pass over the queue, if shorter), not one per request.
const SIGNAL_BATCH: usize = 16;
/// Size of the virtio-fs tag field in the device configuration space.
const TAG_LEN: usize = 36;
/// With a thread pool, chains taken off the rings and not yet answered, per pool thread.
pub const POOL_BACKLOG: usize = 4;

/// Most time `GET_VRING_BASE` waits for the chains a queue has in flight to be answered: once
/// for all the queues a frontend stops in a row (see [`FsBackend::stop_vring`]).
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Chains each queue has taken off its ring and not yet returned, so that stopping a queue
/// (`GET_VRING_BASE`, which a migration sends before it copies guest memory for the last time)
/// can wait for them: a reply written into guest memory after that copy would never reach the
/// destination.
struct InFlight {
    per_queue: Vec<AtomicUsize>,
    /// Queues whose last stop gave up waiting: a reply may have reached guest memory after
    /// the frontend's last copy of it, so no state is saved until they are stopped again.
    stopped_late: Vec<AtomicBool>,
    /// Threads in [`InFlight::wait_idle`]: a chain answered wakes them only when there are some
    /// (a condition variable's wake-up is a system call, too dear for every request).
    waiters: AtomicUsize,
    idle: Condvar,
    lock: Mutex<()>,
}

impl InFlight {
    fn new(queues: usize) -> Self {
        InFlight {
            per_queue: (0..queues).map(|_| AtomicUsize::new(0)).collect(),
            stopped_late: (0..queues).map(|_| AtomicBool::new(false)).collect(),
            waiters: AtomicUsize::new(0),
            idle: Condvar::new(),
            lock: Mutex::new(()),
        }
    }

    /// Counts one chain of `queue` in flight; called before the chain is popped, so that a stop
    /// that finds the ring not ready and the count at zero knows no chain is being taken.
    fn enter(&self, queue: usize) {
        if let Some(c) = self.per_queue.get(queue) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// One chain of `queue` fewer in flight (returned, or none was popped).
    fn leave(&self, queue: usize) {
        if let Some(c) = self.per_queue.get(queue) {
            // SeqCst with the waiter's: either it sees the count at zero, or this sees it.
            if c.fetch_sub(1, Ordering::SeqCst) == 1 && self.waiters.load(Ordering::SeqCst) > 0 {
                let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
                self.idle.notify_all();
            }
        }
    }

    /// Waits until `queue` has no chain in flight, for at most `limit`; whether it has none.
    fn wait_idle(&self, queue: usize, limit: Duration) -> bool {
        let Some(c) = self.per_queue.get(queue) else {
            return true;
        };
        let deadline = Instant::now() + limit;
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut idle = true;
        while c.load(Ordering::SeqCst) != 0 {
            let now = Instant::now();
            if now >= deadline {
                idle = false;
                break;
            }
            // A short timeout as well: the count is read outside the lock by `leave`.
            guard = self
                .idle
                .wait_timeout(guard, (deadline - now).min(Duration::from_millis(10)))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        idle
    }
}

/// One unit in flight on a queue for as long as it lives.
struct Counted<'a> {
    in_flight: &'a InFlight,
    queue: usize,
}

impl<'a> Counted<'a> {
    fn enter(in_flight: &'a InFlight, queue: usize) -> Self {
        in_flight.enter(queue);
        Counted { in_flight, queue }
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.in_flight.leave(self.queue);
    }
}

/// Chains answered later (SETLKW requests waiting for their lock), with the queue each came
/// from: a queue that stops answers its own (`ENOLCK`) rather than wait for them.
type Deferrals = Arc<Mutex<Vec<(usize, LateReply)>>>;

/// What answering a chain later needs besides the chain: where it goes back to.
struct Late<'a> {
    vring: &'a Vring,
    event_idx: bool,
    queue: usize,
    in_flight: &'a Arc<InFlight>,
    deferrals: &'a Deferrals,
}

/// A chain whose request is answered after its handler returned; it stays in flight until then.
struct DeferredChain {
    mem: GuestMem,
    chain: DescriptorChain<GuestMem>,
    vring: Vring,
    event_idx: bool,
    queue: usize,
    in_flight: Arc<InFlight>,
}

impl DeferredChain {
    /// Writes the reply of request `unique` (success, or the error `errno`) and returns the
    /// chain to the guest.
    fn finish(self, unique: u64, errno: i32) {
        let head = self.chain.head_index();
        let reply = status_reply(unique, errno);
        let len = match split_chain(&self.mem, self.chain) {
            Ok((_, mut w)) => match w.write_all(&reply) {
                Ok(()) => reply.len() as u32,
                Err(e) => {
                    warn_throttled!("late reply to chain {head} could not be written: {e}");
                    0
                }
            },
            Err(e) => {
                warn_throttled!("descriptor chain {head} refused: {e}");
                0
            }
        };
        if let Err(e) = complete(&self.vring, head, len, self.event_idx) {
            error!("failed to return chain {head}: {e}");
        }
        self.in_flight.leave(self.queue);
    }
}

/// A chain queued for a pool thread, with the memory it was resolved against.
struct Job {
    mem: GuestMem,
    head: u16,
    chain: DescriptorChain<GuestMem>,
    vring: Vring,
    event_idx: bool,
    /// The queue the chain came from.
    queue: usize,
}

/// What the queue threads and the pool threads share: the chains in flight.
#[derive(Default)]
struct Backlog {
    /// Chains taken off the rings and not yet returned.
    in_flight: usize,
    /// Stalled queues are kicked once no more than this many chains are in flight (half the
    /// limit: the pool still has work queued, and a queue is not woken for every answer).
    resume_at: usize,
    /// Most chains ever in flight at once.
    peak: usize,
    /// Queues that stopped popping because the pool was full, to kick when a chain is answered,
    /// by the worker thread serving them (one queue per thread).
    stalled: Vec<(usize, Vring)>,
}

/// The request thread pool.
struct Pool {
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    backlog: Arc<Mutex<Backlog>>,
    /// Most chains in flight at once.
    limit: usize,
}

impl Pool {
    /// Counts one more chain in flight, if the pool has room; otherwise records `vring`, served by
    /// the queue thread `queue`, as stalled (it is kicked once a chain is answered) and returns
    /// `false`.
    fn take_slot(&self, queue: usize, vring: &Vring) -> bool {
        let mut b = self.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        if b.in_flight >= self.limit {
            if !b.stalled.iter().any(|(q, _)| *q == queue) {
                b.stalled.push((queue, vring.clone()));
            }
            return false;
        }
        b.in_flight += 1;
        b.peak = b.peak.max(b.in_flight);
        true
    }
}

/// One chain fewer in flight (it was answered, or never taken); once the pool has drained to
/// half its limit, the queues that stopped for lack of room are kicked to pop again.
fn give_slot(backlog: &Mutex<Backlog>) {
    let stalled = {
        let mut b = backlog.lock().unwrap_or_else(PoisonError::into_inner);
        b.in_flight = b.in_flight.saturating_sub(1);
        if b.in_flight > b.resume_at {
            return;
        }
        std::mem::take(&mut b.stalled)
    };
    for (queue, vring) in stalled {
        if let Err(e) = kick(&vring) {
            error!("queue {queue} could not be resumed: {e}");
        }
    }
}

/// Signals the queue's kick eventfd, so that its thread serves it again as after a guest kick.
fn kick(vring: &Vring) -> io::Result<()> {
    let state = vring.get_ref();
    let Some(kick) = state.get_kick() else {
        // Not started (or stopped): the next start reads the ring anyway.
        return Ok(());
    };
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes the 8 bytes of the local `one` to the kick eventfd, which the read guard
    // `state` keeps open; the result is checked.
    let n = unsafe { libc::write(kick.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if n == one.len() as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How a pass over a queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// No chain left in the ring.
    Drained,
    /// The pool is full: chains were left in the ring, and the queue will be kicked.
    Stalled,
}

/// A session that failed because guest memory was not shared with the daemon (see
/// [`FsBackend::unshared_memory`]). Its message says what is wrong and how to start QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsharedMemory {
    /// The frontend set the device up and gave queue addresses, but no guest memory at all.
    All,
    /// A queue lies in guest memory the frontend did not give.
    Part,
}

impl std::fmt::Display for UnsharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnsharedMemory::All => write!(
                f,
                "guest memory is not shared with virtiofsd: the frontend set up the queues but \
                 gave no guest memory (QEMU gives only memory it maps shared). Start QEMU with \
                 -object memory-backend-memfd,id=mem,size=SIZE,share=on -numa node,memdev=mem \
                 (or -machine memory-backend=mem), SIZE being the -m size; with libvirt, \
                 <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>"
            ),
            UnsharedMemory::Part => write!(
                f,
                "part of guest memory is not shared with virtiofsd: a queue lies outside the \
                 guest memory the frontend gave (QEMU gives only memory it maps shared). Give \
                 every guest memory backend share=on (-object \
                 memory-backend-memfd,id=ID,size=SIZE,share=on, or memory-backend-file with \
                 share=on, for each -numa node); with libvirt, <access mode='shared'/> in \
                 <memoryBacking>"
            ),
        }
    }
}

/// The vhost-user-fs device backend.
pub struct FsBackend<F: FileSystem + 'static> {
    server: Arc<Server<F>>,
    mem: RwLock<GuestMemoryAtomic<GuestMemory>>,
    /// The frontend has acknowledged the features (`SET_FEATURES`): it is setting the device up.
    features_acked: AtomicBool,
    event_idx: AtomicBool,
    tag: Option<String>,
    num_queues: usize,
    pool: Option<Pool>,
    in_flight: Arc<InFlight>,
    /// Chains to be answered later.
    deferrals: Deferrals,
    /// The state transfer under way (`SET_DEVICE_STATE_FD`), whose result
    /// `CHECK_DEVICE_STATE` reports.
    transfer: Mutex<Option<Transfer>>,
    /// The thread that alone holds the capability a load needs (`--migration-mode=file-handles`),
    /// until a session is served or a state was taken over.
    keeper: Option<Arc<dyn LoadKeeper>>,
    /// Adaptive polling of the available rings after a pass (`--poll-window`).
    poll: Poll,
    /// Most time stopping queues waits for their requests ([`STOP_WAIT`]; shorter in tests).
    stop_wait: Duration,
    /// When a stop last gave up waiting: the queues stopped after it within `stop_wait` do not
    /// wait again, so a guest blocking a request on every queue delays a migration's switch-over
    /// by `stop_wait` once, not once per queue.
    stop_gave_up: Mutex<Option<Instant>>,
}

impl<F: FileSystem + 'static> FsBackend<F> {
    /// A device serving `fs` with up to `MAX_REQUEST_QUEUES` request queues. `tag` is exposed in
    /// the configuration space when given. `pool_size` > 0 starts that many request threads.
    pub fn new(fs: F, tag: Option<String>, pool_size: usize) -> io::Result<Self> {
        if let Some(t) = &tag {
            if t.is_empty() || t.len() > TAG_LEN {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("tag must be 1 to {TAG_LEN} bytes"),
                ));
            }
        }
        let server = Arc::new(Server::new(fs));
        let num_queues = 1 + MAX_REQUEST_QUEUES;
        let in_flight = Arc::new(InFlight::new(num_queues));
        let deferrals = Deferrals::default();
        let pool = if pool_size > 0 {
            let limit = pool_size.saturating_mul(POOL_BACKLOG);
            let backlog = Arc::new(Mutex::new(Backlog {
                resume_at: limit / 2,
                ..Backlog::default()
            }));
            Some(Pool {
                jobs: Mutex::new(start_pool(
                    server.clone(),
                    backlog.clone(),
                    in_flight.clone(),
                    deferrals.clone(),
                    pool_size,
                )?),
                backlog,
                limit,
            })
        } else {
            None
        };
        Ok(FsBackend {
            server,
            mem: RwLock::new(GuestMemoryAtomic::new(GuestMemory::new())),
            features_acked: AtomicBool::new(false),
            event_idx: AtomicBool::new(false),
            tag,
            num_queues,
            pool,
            in_flight,
            deferrals,
            transfer: Mutex::new(None),
            keeper: None,
            poll: Poll::new(Duration::ZERO, num_queues),
            stop_wait: STOP_WAIT,
            stop_gave_up: Mutex::new(None),
        })
    }

    /// The same device, whose queue workers look at their available ring for up to `max` after
    /// each pass before they sleep (see [`super::poll`]; zero: never).
    pub fn with_poll_window(mut self, max: Duration) -> Self {
        self.poll = Poll::new(max, self.num_queues);
        self
    }

    /// The same device, whose state loads run on `keeper`, with what it keeps for them.
    pub fn with_keeper(mut self, keeper: Arc<dyn LoadKeeper>) -> Self {
        // The guest's session started: no state is loaded from now on, and the keeper's
        // capability is gone before the guest has the reply to its INIT.
        let k = keeper.clone();
        if !self.server.on_session_start(Box::new(move || k.close())) {
            warn!("the capability keeper was given twice: the first one is kept");
            return self;
        }
        self.keeper = Some(keeper);
        self
    }

    /// Closes the capability keeper, if any: no state can be loaded from now on (a session is
    /// served, or a state was taken over).
    fn close_keeper(&self) {
        if let Some(k) = &self.keeper {
            k.close();
        }
    }

    /// The FUSE server shared by every queue.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    fn memory(&self) -> GuestMem {
        self.mem.read().unwrap_or_else(|p| p.into_inner()).memory()
    }

    /// Whether the session ended with `e` because guest memory was not shared with the daemon,
    /// and how much of it. The backend library refuses `SET_VRING_ADDR` with "invalid
    /// parameters" when it holds no memory region (QEMU gives only the regions it maps shared,
    /// and with `CONFIGURE_MEM_SLOTS` it then sends no region at all), and with "missing memory
    /// mapping" when a ring address is in none of them. The first counts only once the
    /// frontend has acknowledged the features, as a frontend setting the device up does before
    /// it gives memory and queues: an invalid parameter before that is something else.
    pub fn unshared_memory(&self, e: &vhost_user_backend::Error) -> Option<UnsharedMemory> {
        use vhost::vhost_user::Error as VuError;
        use vhost_user_backend::VhostUserHandlerError;
        use vm_memory::GuestMemoryBackend as _;
        match e {
            vhost_user_backend::Error::HandleRequest(VuError::InvalidParam)
                if self.features_acked.load(Ordering::Relaxed)
                    && self.memory().num_regions() == 0 =>
            {
                Some(UnsharedMemory::All)
            }
            vhost_user_backend::Error::HandleRequest(VuError::ReqHandlerError(io))
                if matches!(
                    io.get_ref()
                        .and_then(|i| i.downcast_ref::<VhostUserHandlerError>()),
                    Some(VhostUserHandlerError::MissingMemoryMapping)
                ) =>
            {
                Some(UnsharedMemory::Part)
            }
            _ => None,
        }
    }

    /// Most chains in flight at once so far, and the most allowed, with a thread pool. For the
    /// pool's tests (`backend/pool_tests.rs`); the daemon does not use it.
    #[cfg(test)]
    fn pool_peak(&self) -> Option<(usize, usize)> {
        let pool = self.pool.as_ref()?;
        let b = pool.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        Some((b.peak, pool.limit))
    }

    /// The same device, whose queue stops wait at most `wait` for their requests. For the
    /// pool's tests (`backend/pool_tests.rs`); the daemon keeps the default.
    #[cfg(test)]
    fn with_stop_wait(mut self, wait: Duration) -> Self {
        self.stop_wait = wait;
        self
    }

    /// Answers `queue`'s requests that wait to be answered later (SETLKWs waiting for their
    /// lock) with `ENOLCK`: a stopped queue (a migration, a reset) answers nothing later.
    fn answer_deferred(&self, queue: usize) {
        let mine: Vec<LateReply> = {
            let mut list = self
                .deferrals
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut *list)
                .into_iter()
                .partition(|(q, _)| *q == queue);
            *list = rest;
            mine.into_iter().map(|(_, r)| r).collect()
        };
        let answered = mine.iter().filter(|r| r.answer(libc::ENOLCK)).count();
        if answered > 0 {
            warn!("queue {queue} stopped: {answered} waiting lock request(s) answered ENOLCK");
        }
    }

    /// Starts the thread that saves the state to `file` or loads it from there; its result
    /// waits for `CHECK_DEVICE_STATE`. One transfer at a time; a save with no request in flight.
    fn start_transfer(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<()> {
        if !matches!(phase, VhostTransferStatePhase::STOPPED) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "state transfer is only done with the device stopped",
            ));
        }
        if matches!(direction, VhostTransferStateDirection::SAVE) {
            let in_flight = &self.in_flight;
            // A pass woken by a kick from before the stop may still be looking at a queue: it
            // takes nothing off a stopped one and is over in a moment.
            if !(0..in_flight.per_queue.len())
                .all(|q| in_flight.wait_idle(q, Duration::from_millis(100)))
            {
                // The state of a device still answering requests would be out of date at once.
                // (A destination has served nothing: a load is refused once a session started.)
                return Err(io::Error::other(
                    "state saved with requests in flight: stop the queues first (GET_VRING_BASE)",
                ));
            }
            if in_flight
                .stopped_late
                .iter()
                .any(|l| l.load(Ordering::Acquire))
            {
                // Its reply was written after the queue stopped, perhaps after the frontend's
                // last copy of guest memory: the destination would not have it.
                return Err(io::Error::other(
                    "a queue stopped with a request still in flight: the guest's state is not \
                     saved (the migration fails; the guest goes on here)",
                ));
            }
        }
        let mut slot = self.transfer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(job) = slot.take() {
            if !job.is_finished() {
                // One transfer at a time: a load still waiting for bytes would otherwise be
                // left behind (a thread and a pipe each time), or mix its nodes with the next.
                *slot = Some(job);
                return Err(io::Error::other(
                    "a state transfer is still under way: its pipe must be closed and it must \
                     be checked (CHECK_DEVICE_STATE) before another starts",
                ));
            }
            warn!("migration: a new state transfer replaces one that was never checked");
        }
        let server = self.server.clone();
        let job = match direction {
            VhostTransferStateDirection::SAVE => {
                // A source: no state comes to this daemon now.
                self.close_keeper();
                Transfer::Thread(
                    thread::Builder::new()
                        .name("virtiofsd-save".into())
                        .spawn(move || save_state(&server, file))?,
                )
            }
            VhostTransferStateDirection::LOAD => match self.keeper.as_ref().filter(|k| k.is_open())
            {
                Some(keeper) => {
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    let done = Arc::new(AtomicBool::new(false));
                    let finished = done.clone();
                    keeper
                        .run(Box::new(move || {
                            let result = load_state(&server, file);
                            finished.store(true, Ordering::Release);
                            let _ = tx.send(result);
                        }))
                        .map_err(|_| io::Error::other("the capability keeper has ended"))?;
                    Transfer::Kept { result: rx, done }
                }
                None => Transfer::Thread(
                    thread::Builder::new()
                        .name("virtiofsd-load".into())
                        .spawn(move || load_state(&server, file))?,
                ),
            },
        };
        *slot = Some(job);
        Ok(())
    }

    /// Serves every available chain of `vring` (served by the queue thread `queue`), or with a
    /// thread pool hands them to it until it is full.
    fn process_queue(&self, vring: &Vring, queue: usize) -> io::Result<Pass> {
        let mem = self.memory();
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        // Chains returned since the guest was last told.
        let mut unsignalled = 0;
        loop {
            if let Some(pool) = &self.pool {
                if !pool.take_slot(queue, vring) {
                    return Ok(Pass::Stalled);
                }
            }
            self.in_flight.enter(queue);
            let chain = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let Some(chain) = chain else {
                self.in_flight.leave(queue);
                if let Some(pool) = &self.pool {
                    give_slot(&pool.backlog);
                }
                break;
            };
            let head = chain.head_index();
            if let Some(pool) = &self.pool {
                let job = Job {
                    mem: mem.clone(),
                    head,
                    chain,
                    vring: vring.clone(),
                    event_idx,
                    queue,
                };
                let sent = pool
                    .jobs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .send(job);
                if sent.is_err() {
                    self.in_flight.leave(queue);
                    give_slot(&pool.backlog);
                    return Err(io::Error::other("request thread pool is gone"));
                }
                continue;
            }
            let late = Late {
                vring,
                event_idx,
                queue,
                in_flight: &self.in_flight,
                deferrals: &self.deferrals,
            };
            let Some(len) = serve_chain(&self.server, &mem, chain, &late) else {
                // Answered later; in flight until then.
                continue;
            };
            let used = vring.add_used(head, len);
            self.in_flight.leave(queue);
            match used {
                Ok(()) => unsignalled += 1,
                // A head the guest made up (outside the table) cannot be returned; the chain
                // is dropped and the queue goes on.
                Err(e) => warn_throttled!("chain {head} could not be returned to the guest: {e}"),
            }
            if unsignalled == SIGNAL_BATCH {
                notify(vring, event_idx)?;
                unsignalled = 0;
            }
        }
        if unsignalled > 0 {
            notify(vring, event_idx)?;
        }
        Ok(Pass::Drained)
    }
}

/// Runs one chain through the server; returns the reply length (0 when refused), or `None`
/// when the request is answered later (it is then returned, and leaves `late.in_flight`, by
/// its [`DeferredChain`]).
fn serve_chain<F: FileSystem>(
    server: &Server<F>,
    mem: &GuestMem,
    chain: DescriptorChain<GuestMem>,
    late: &Late<'_>,
) -> Option<u32> {
    let head = chain.head_index();
    let mut kept = Some(chain.clone());
    let mut defer = |unique: u64| {
        let d = DeferredChain {
            mem: mem.clone(),
            chain: kept.take()?,
            vring: late.vring.clone(),
            event_idx: late.event_idx,
            queue: late.queue,
            in_flight: late.in_flight.clone(),
        };
        let reply = LateReply::new(move |e| d.finish(unique, e));
        let stopped = {
            let mut list = late
                .deferrals
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            list.retain(|(_, r)| !r.is_answered());
            // A stop (`GET_VRING_BASE`) marks the ring not ready, then answers the requests
            // this list holds for it: one registered after that would escape it and be
            // answered after the stop (into memory a migration copied already). Read under the
            // list's lock, the ring is either still ready (and the stop answers this one) or
            // stopped (and it is answered here, while its chain still counts as in flight,
            // which the stop waits for).
            let ready = late.vring.get_ref().get_queue().ready();
            if ready {
                list.push((late.queue, reply.clone()));
            }
            !ready
        };
        if stopped {
            reply.answer(libc::ENOLCK);
        }
        Some(reply)
    };
    match split_chain(mem, chain) {
        Ok((r, w)) => match server.handle_request(r, w, &mut defer) {
            Ok(Handled::Reply(n)) => Some(n as u32),
            Ok(Handled::Deferred) => None,
            Err(e) => {
                warn_throttled!("request in chain {head} refused: {e}");
                Some(0)
            }
        },
        Err(e) => {
            warn_throttled!("descriptor chain {head} refused: {e}");
            Some(0)
        }
    }
}

/// A state transfer under way.
enum Transfer {
    /// On a thread of its own.
    Thread(thread::JoinHandle<Result<(), String>>),
    /// A load on the capability keeper's thread.
    Kept {
        result: std::sync::mpsc::Receiver<Result<(), String>>,
        done: Arc<AtomicBool>,
    },
}

impl Transfer {
    fn is_finished(&self) -> bool {
        match self {
            Transfer::Thread(t) => t.is_finished(),
            Transfer::Kept { done, .. } => done.load(Ordering::Acquire),
        }
    }

    /// Waits for it to end: its result.
    fn join(self) -> Result<(), String> {
        match self {
            Transfer::Thread(t) => t
                .join()
                .unwrap_or_else(|_| Err("the state transfer thread panicked".into())),
            Transfer::Kept { result, .. } => result
                .recv()
                .unwrap_or_else(|_| Err("the state load ended without a result".into())),
        }
    }
}

/// Writes the server's state to `file` (the frontend reads it to its end).
fn save_state<F: FileSystem>(server: &Server<F>, mut file: File) -> Result<(), String> {
    let state = server
        .save_state()
        .map_err(|e| format!("saving the state failed: {}", Chain(&e)))?;
    file.write_all(&state)
        .map_err(|e| format!("sending the state ({} bytes) failed: {e}", state.len()))?;
    log::info!("migration: state sent ({} bytes)", state.len());
    Ok(())
}

/// Reads a state from `file` to its end and has the server take it over.
fn load_state<F: FileSystem>(server: &Server<F>, file: File) -> Result<(), String> {
    let mut state = Vec::new();
    let limit = migration::MAX_STATE as u64 + 1;
    file.take(limit)
        .read_to_end(&mut state)
        .map_err(|e| format!("receiving the state failed: {e}"))?;
    server.load_state(&state).map_err(|e| {
        format!(
            "the state received ({} bytes) is refused: {}",
            state.len(),
            Chain(&e)
        )
    })?;
    log::info!("migration: state of {} bytes taken over", state.len());
    Ok(())
}

/// Returns a chain to the guest and notifies it when it asked to be.
fn complete(vring: &Vring, head: u16, len: u32, event_idx: bool) -> io::Result<()> {
    vring
        .add_used(head, len)
        .map_err(|e| io::Error::other(format!("add_used: {e}")))?;
    notify(vring, event_idx)
}

/// Interrupts the guest for the chains returned so far, unless (with event-index) it asked not
/// to be told yet.
fn notify(vring: &Vring, event_idx: bool) -> io::Result<()> {
    let notify = !event_idx
        || vring
            .needs_notification()
            .map_err(|e| io::Error::other(format!("needs_notification: {e}")))?;
    if notify {
        vring.signal_used_queue()?;
    }
    Ok(())
}

/// Starts `size` threads serving the chains sent to the returned channel; each counts its
/// chain out of `backlog` once returned.
fn start_pool<F: FileSystem + 'static>(
    server: Arc<Server<F>>,
    backlog: Arc<Mutex<Backlog>>,
    in_flight: Arc<InFlight>,
    deferrals: Deferrals,
    size: usize,
) -> io::Result<std::sync::mpsc::Sender<Job>> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..size {
        let rx = rx.clone();
        let server = server.clone();
        let backlog = backlog.clone();
        let in_flight = in_flight.clone();
        let deferrals = deferrals.clone();
        thread::Builder::new()
            .name(format!("virtiofsd-pool-{i}"))
            .spawn(move || loop {
                let job = match rx.lock().unwrap_or_else(PoisonError::into_inner).recv() {
                    Ok(job) => job,
                    Err(_) => return,
                };
                let late = Late {
                    vring: &job.vring,
                    event_idx: job.event_idx,
                    queue: job.queue,
                    in_flight: &in_flight,
                    deferrals: &deferrals,
                };
                // A chain answered later frees its pool slot now: a waiting lock does not
                // hold up the pool.
                if let Some(len) = serve_chain(&server, &job.mem, job.chain, &late) {
                    if let Err(e) = complete(&job.vring, job.head, len, job.event_idx) {
                        error!("failed to return chain {}: {e}", job.head);
                    }
                    in_flight.leave(job.queue);
                }
                give_slot(&backlog);
            })?;
    }
    Ok(tx)
}

impl<F: FileSystem + 'static> VhostUserBackend for FsBackend<F> {
    type Bitmap = DirtyLog;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.num_queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Every page the device writes is marked in the dirty log once the frontend
            // gives one (`LOG_SHMFD`), as a migration needs.
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE;
        if self.tag.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        f
    }

    fn acked_features(&self, _features: u64) {
        self.features_acked.store(true, Ordering::Relaxed);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // struct virtio_fs_config { u8 tag[36]; le32 num_request_queues; }
        let mut config = [0u8; TAG_LEN + 4];
        if let Some(tag) = &self.tag {
            config[..tag.len()].copy_from_slice(tag.as_bytes());
        }
        let nrq = (self.num_queues - 1) as u32;
        config[TAG_LEN..].copy_from_slice(&nrq.to_le_bytes());
        let start = (offset as usize).min(config.len());
        let end = start.saturating_add(size as usize).min(config.len());
        config[start..end].to_vec()
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemory>) -> io::Result<()> {
        *self.mem.write().unwrap_or_else(|p| p.into_inner()) = mem;
        Ok(())
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        // The frontend hears only that it failed: the log says why.
        self.start_transfer(direction, phase, file)
            .map(|()| None)
            .inspect_err(|e| error!("migration: state transfer refused: {e}"))
    }

    fn check_device_state(&self) -> io::Result<()> {
        let job = self
            .transfer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let kept = matches!(job, Some(Transfer::Kept { .. }));
        let result = match job {
            None => Err("no state transfer was started".to_string()),
            Some(job) => job.join(),
        };
        if kept && result.is_ok() {
            // A state was taken over: no second one is.
            self.close_keeper();
        }
        result.map_err(|e| {
            error!("migration: {e}");
            io::Error::other(e)
        })
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // The ring is no longer ready: no chain is popped from now on. Wait for those taken.
        let queue = queue_index as usize;
        let mut gave_up = self
            .stop_gave_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let limit = match *gave_up {
            Some(t) if t.elapsed() < self.stop_wait => Duration::ZERO,
            _ => self.stop_wait,
        };
        self.answer_deferred(queue);
        let idle = self.in_flight.wait_idle(queue, limit);
        if let Some(late) = self.in_flight.stopped_late.get(queue) {
            late.store(!idle, Ordering::Release);
        }
        if !idle {
            // A request that blocks (a lock wait, a slow fsync) is not worth hanging the
            // frontend for; a state saved now is refused (`start_transfer`), so the migration
            // fails and the guest goes on at the source.
            *gave_up = Some(Instant::now());
            warn!(
                "queue {queue} stopped with requests still in flight (waited {} ms)",
                limit.as_millis()
            );
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One worker thread per queue.
        (0..self.num_queues).map(|i| 1u64 << i).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        let vring = vrings
            .get(usize::from(device_event))
            .ok_or_else(|| io::Error::other(format!("unknown queue event {device_event}")))?;
        // The whole pass counts as in flight: with event-index it writes the used ring's
        // avail_event field too, which a stop must not see written after it returned.
        let _pass = Counted::enter(&self.in_flight, thread_id);
        if self.keeper.as_ref().is_some_and(|k| k.is_open()) && self.server.is_initialized() {
            // A session taken over by a state the frontend never checked (CHECK_DEVICE_STATE
            // closes it): no second state is loaded. (One started by INIT closed it as the
            // INIT was served.)
            self.close_keeper();
        }
        if !vring.get_ref().get_queue().ready() {
            return Ok(());
        }
        if self.event_idx.load(Ordering::Relaxed) {
            // Keep draining until the guest has added nothing new since the last pass. A queue
            // left for a full pool is kicked again once the pool has drained to half of it, and
            // drained then. With polling, the ring is looked at for a while before the guest is
            // asked to kick again (its notifications stay off meanwhile).
            let queue = usize::from(device_event);
            self.poll.woken(queue);
            loop {
                vring
                    .disable_notification()
                    .map_err(|e| io::Error::other(format!("disable_notification: {e}")))?;
                if self.process_queue(vring, thread_id)? == Pass::Stalled {
                    break;
                }
                let polled = self.poll.wait(queue, vring);
                if polled == Polled::More {
                    continue;
                }
                // Turned back on, then the ring read once more: a chain made available as the
                // polling ended is served now, not left without a kick. (A queue that stopped
                // meanwhile gets its notifications back as it would have without polling, and is
                // left: a stop takes no more chains.)
                let more = vring
                    .enable_notification()
                    .map_err(|e| io::Error::other(format!("enable_notification: {e}")))?;
                if !more || polled == Polled::Stopped {
                    break;
                }
            }
            self.poll.pass_ended(queue);
        } else {
            self.process_queue(vring, thread_id)?;
        }
        Ok(())
    }
}

// The thread pool under a flood, and queue stops, driven through the test frontend.
#[cfg(test)]
mod pool_tests;
