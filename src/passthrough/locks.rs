//! Locks the guest takes (GETLK, SETLK, SETLKW), held as real locks on the host file, so that
//! they exclude host processes and other guests as they exclude processes of one guest.
//!
//! Each lock owner the guest names on a node gets a record with a descriptor of its own: an
//! open file description of the host file, opened by the daemon for that owner. A `fcntl`
//! record lock (and an OFD lock, which the guest kernel sends with its open file as the owner)
//! is an OFD lock (`F_OFD_SETLK`) on that description; a `flock` lock is `flock(2)` on the
//! description of its own record. The host kernel then does the rest exactly as for a local
//! file: conflicts with every other description (host processes' POSIX, OFD and flock locks,
//! other owners of this guest, other daemons), and for one owner upgrade, downgrade, split and
//! merge. The record keeps a copy of the ranges its owner holds, to know when it holds nothing
//! and what a migration would have to take again.
//!
//! A record goes, and its locks with it (they are dropped, and its description closed), at
//! FLUSH for its owner (the guest process closed the file), at RELEASE of the handle it came
//! through (the guest's open file is gone: OFD and flock locks), when the node is forgotten,
//! and at DESTROY or disconnect. A record whose owner unlocked everything stays, idle, until
//! then (its owner's next lock needs no open), or until a new owner needs its descriptor.
//!
//! A SETLKW whose lock is taken waits here, not on a queue: the [`LateReply`] it got is tried
//! again by one waiter thread with a back-off (1 ms doubling to [`MAX_BACKOFF`]), and at once
//! when an owner of this daemon releases something on the node; one that would close a cycle of
//! owners of this daemon waiting for each other gets `EDEADLK` instead. Everything a guest can
//! make the daemon hold is bounded: descriptors ([`Locks::set_max_fds`]), ranges
//! ([`MAX_RANGES`]) and waiters ([`MAX_WAITERS`]); past a bound the request gets `ENOLCK`. See
//! doc/locks.md.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::logging::warn_throttled;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::sys::{self, error, RangeLock};
use crate::filesystem::{Attempt, FileLock, LateReply, LockKind};

/// The end of a range that runs to the end of the file (`OFFSET_MAX`).
pub const TO_EOF: u64 = i64::MAX as u64;
/// Ranges all owners may hold together (each costs the host kernel a lock structure).
pub const MAX_RANGES: usize = 65536;
/// SETLKW requests waiting at once.
pub const MAX_WAITERS: usize = 256;
/// Longest pause between two tries of a waiting SETLKW.
pub const MAX_BACKOFF: Duration = Duration::from_millis(32);
/// First pause of a waiting SETLKW.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);
/// Lock descriptors when nothing else is said.
pub const DEFAULT_MAX_FDS: usize = super::config::DEFAULT_MAX_LOCK_FDS;
/// How long a migration destination goes on trying to take the locks it carried that were
/// still held when it loaded the state (by the source daemon, which lets them go when its QEMU
/// disconnects after the switch-over): past it, the owner's handle gets errors.
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between two tries of a hand-over.
const HANDOVER_PERIOD: Duration = Duration::from_millis(5);

/// A lock request checked: the range is `start..=end` with `end` at most [`TO_EOF`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    pub node: u64,
    pub owner: u64,
    pub kind: LockKind,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: i32,
    pub start: u64,
    pub end: u64,
    /// The guest's pid of the caller, reported to another owner's GETLK.
    pub pid: u32,
    /// The handle the request came through (0: none).
    pub fh: u64,
}

impl Req {
    /// Checks what the guest sent: a known type, `start <= end`, a start a file offset can
    /// hold; an end past `OFFSET_MAX` means to the end of the file. `EINVAL` otherwise.
    pub fn new(node: u64, owner: u64, fh: u64, lock: &FileLock, kind: LockKind) -> io::Result<Req> {
        let typ = match i32::try_from(lock.typ) {
            Ok(t @ (libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK)) => t,
            _ => return Err(error(libc::EINVAL)),
        };
        if lock.start > TO_EOF || lock.start > lock.end {
            return Err(error(libc::EINVAL));
        }
        Ok(Req {
            node,
            owner,
            kind,
            typ,
            start: lock.start,
            end: lock.end.min(TO_EOF),
            pid: lock.pid,
            fh,
        })
    }

    fn key(&self) -> Key {
        (self.node, self.owner, self.kind)
    }

    fn range(&self) -> RangeLock {
        range_lock(self.typ, self.start, self.end)
    }
}

fn range_lock(typ: i32, start: u64, end: u64) -> RangeLock {
    // Both at most TO_EOF (checked by `Req::new`).
    let len = match end {
        TO_EOF => 0,
        _ => (end - start + 1) as i64,
    };
    RangeLock {
        typ,
        start: start as i64,
        len,
    }
}

/// One range an owner holds, `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    pub start: u64,
    pub end: u64,
    /// `F_RDLCK` or `F_WRLCK`.
    pub typ: i32,
}

#[cfg(test)]
thread_local! {
    /// Owners' ranges worked out on this thread (by [`apply`]), for tests.
    static APPLIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The ranges of one owner after it sets `typ` on `start..=end`, as POSIX has them: what it
/// held there is replaced (split where the new range cuts it), and neighbouring or overlapping
/// ranges of one type are merged.
pub fn apply(segs: &[Seg], start: u64, end: u64, typ: i32) -> Vec<Seg> {
    #[cfg(test)]
    APPLIED.with(|n| n.set(n.get() + 1));
    let mut out: Vec<Seg> = Vec::with_capacity(segs.len() + 2);
    let push = |s: Seg, out: &mut Vec<Seg>| {
        if let Some(last) = out.last_mut() {
            if last.typ == s.typ && last.end.checked_add(1).is_some_and(|n| n >= s.start) {
                last.end = last.end.max(s.end);
                return;
            }
        }
        out.push(s);
    };
    let new = (typ != libc::F_UNLCK).then_some(Seg { start, end, typ });
    let mut placed = false;
    for s in segs {
        if s.end < start {
            push(*s, &mut out);
            continue;
        }
        if s.start < start {
            push(
                Seg {
                    start: s.start,
                    end: start - 1,
                    typ: s.typ,
                },
                &mut out,
            );
        }
        if !placed && s.start > end {
            if let Some(n) = new {
                push(n, &mut out);
            }
            placed = true;
        }
        if !placed && s.end >= start {
            // Overlaps: the new range goes here once.
            if let Some(n) = new {
                push(n, &mut out);
            }
            placed = true;
        }
        if s.end > end {
            push(
                Seg {
                    start: s.start.max(end + 1),
                    end: s.end,
                    typ: s.typ,
                },
                &mut out,
            );
        }
    }
    if !placed {
        if let Some(n) = new {
            push(n, &mut out);
        }
    }
    out
}

/// Adds `s` after the last of `segs` (sorted and apart, all before `s`), merged with it when
/// they touch and are of one type, as [`apply`] would have it.
fn push_merged(segs: &mut Vec<Seg>, s: Seg) {
    if let Some(last) = segs.last_mut() {
        if last.typ == s.typ && last.end.checked_add(1) == Some(s.start) {
            last.end = s.end;
            return;
        }
    }
    segs.push(s);
}

/// `a` and `b` (each sorted and apart) as one list, neighbours of one type merged: what
/// [`apply`] of each range of `b` onto `a` gives when no range of `b` overlaps one of `a`, in
/// one pass. Ranges that overlap: [`apply`] of each (an owner's ranges changed meanwhile).
fn merged(a: &[Seg], b: &[Seg]) -> Vec<Seg> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.start <= y.start => {
                i += 1;
                *x
            }
            (Some(x), None) => {
                i += 1;
                *x
            }
            (_, Some(y)) => {
                j += 1;
                *y
            }
            (None, None) => break,
        };
        if out.last().is_some_and(|l: &Seg| l.end >= next.start) {
            return b
                .iter()
                .fold(a.to_vec(), |acc, s| apply(&acc, s.start, s.end, s.typ));
        }
        push_merged(&mut out, next);
    }
    out
}

/// A descriptor held for locks, counted while it is open.
#[derive(Debug)]
pub struct LockFd {
    fd: OwnedFd,
    writable: bool,
    count: Arc<AtomicUsize>,
}

impl LockFd {
    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for LockFd {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The locks of one owner on one node (of one kind).
#[derive(Debug)]
struct Record {
    fd: Arc<LockFd>,
    /// The handle the record was made through: its RELEASE ends the record.
    fh: u64,
    pid: u32,
    /// POSIX: the ranges held.
    segs: Vec<Seg>,
    /// flock: the lock held (`F_RDLCK` shared, `F_WRLCK` exclusive).
    flock: Option<i32>,
}

impl Record {
    fn is_empty(&self) -> bool {
        self.segs.is_empty() && self.flock.is_none()
    }
}

type Key = (u64, u64, LockKind);

/// The locks one owner holds on one node, as a migration carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    pub node: u64,
    pub owner: u64,
    pub kind: LockKind,
    /// The handle the record was made through (its RELEASE ends it; its errors tell the guest
    /// a lock that could not be taken again).
    pub fh: u64,
    pub pid: u32,
    /// Whether its description may write (write record locks need it).
    pub writable: bool,
    /// POSIX: the ranges held, sorted and apart.
    pub segs: Vec<Seg>,
    /// flock: `F_RDLCK` or `F_WRLCK`.
    pub flock: Option<i32>,
}

/// Called when a carried lock could not be taken again in [`HANDOVER_TIMEOUT`].
pub type OnLost = Box<dyn FnOnce() + Send>;

/// Locks a migration destination carried that were still taken when it loaded the state: taken
/// by the waiter thread as soon as they are free (every [`HANDOVER_PERIOD`]), until `deadline`.
struct Handover {
    key: Key,
    /// The record's description.
    fd: Arc<LockFd>,
    /// POSIX ranges still to take.
    segs: Vec<Seg>,
    /// flock still to take.
    flock: Option<i32>,
    deadline: Instant,
    /// The node as the log names it (its names escaped).
    what: String,
    lost: Option<OnLost>,
}

/// What a try of a hand-over came to.
enum Handed {
    /// Everything taken, or the record went meanwhile (FLUSH, RELEASE, FORGET).
    Done,
    Pending,
    /// Past the deadline: the record went, and the owner's handle gets errors.
    Expired,
}

#[derive(Default)]
struct Table {
    /// node → its records.
    nodes: HashMap<u64, Vec<(u64, LockKind, Record)>>,
    /// Ranges held by all records.
    ranges: usize,
    /// Ranges of hand-overs not taken yet: they count in the bound with those held, as the
    /// host will hold them.
    pending: usize,
}

impl Table {
    /// Ranges held and pending, which [`MAX_RANGES`] bounds.
    fn counted(&self) -> usize {
        self.ranges.saturating_add(self.pending)
    }

    fn get_mut(&mut self, key: Key) -> Option<&mut Record> {
        self.nodes
            .get_mut(&key.0)?
            .iter_mut()
            .find(|(o, k, _)| *o == key.1 && *k == key.2)
            .map(|(_, _, r)| r)
    }

    fn get(&self, key: Key) -> Option<&Record> {
        self.nodes
            .get(&key.0)?
            .iter()
            .find(|(o, k, _)| *o == key.1 && *k == key.2)
            .map(|(_, _, r)| r)
    }

    fn insert(&mut self, key: Key, r: Record) {
        self.ranges += r.segs.len();
        self.nodes.entry(key.0).or_default().push((key.1, key.2, r));
    }

    /// Removes the records of `node` that `drop` picks; what they were (to close outside).
    fn remove_where(
        &mut self,
        node: u64,
        mut drop: impl FnMut(u64, LockKind, &Record) -> bool,
    ) -> Vec<Record> {
        let Some(list) = self.nodes.get_mut(&node) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        let mut i = 0;
        while i < list.len() {
            let (o, k, r) = &list[i];
            if drop(*o, *k, r) {
                gone.push(list.swap_remove(i).2);
            } else {
                i += 1;
            }
        }
        if list.is_empty() {
            self.nodes.remove(&node);
        }
        for r in &gone {
            self.ranges -= r.segs.len();
        }
        gone
    }
}

/// A SETLKW waiting for its lock.
struct Waiter {
    req: Req,
    /// The descriptor the lock is taken on when the owner has no record yet.
    fd: Arc<LockFd>,
    reply: LateReply,
    next: Instant,
    backoff: Duration,
}

#[derive(Default)]
struct WaitList {
    list: Vec<Waiter>,
    /// Locks carried by a migration not taken yet.
    handovers: Vec<Handover>,
    /// The next try of the hand-overs.
    next_handover: Option<Instant>,
    /// The waiter thread runs.
    running: bool,
}

/// The locks the guest holds on host files, and its waiting SETLKWs.
pub struct Locks {
    table: Mutex<Table>,
    /// Lock descriptors open (records' and waiters').
    fds: Arc<AtomicUsize>,
    max_fds: AtomicUsize,
    max_ranges: AtomicUsize,
    waiting: Mutex<WaitList>,
    /// Waiters (read without the lock, so that an unlock with none waiting costs no lock).
    waiter_count: AtomicUsize,
    /// Hand-overs pending (read without the lock, so that a request costs nothing when none).
    handover_count: AtomicUsize,
    wake: Condvar,
    /// Notified when hand-overs settle.
    settled: Condvar,
    /// [`HANDOVER_TIMEOUT`] (tests shorten it).
    handover_timeout: Mutex<Duration>,
    /// Itself, for the waiter thread.
    me: Weak<Locks>,
}

fn would_block(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES))
}

impl Locks {
    pub fn new() -> Arc<Locks> {
        Arc::new_cyclic(|me| Locks {
            table: Mutex::new(Table::default()),
            fds: Arc::new(AtomicUsize::new(0)),
            max_fds: AtomicUsize::new(DEFAULT_MAX_FDS),
            max_ranges: AtomicUsize::new(MAX_RANGES),
            waiting: Mutex::new(WaitList::default()),
            waiter_count: AtomicUsize::new(0),
            handover_count: AtomicUsize::new(0),
            wake: Condvar::new(),
            settled: Condvar::new(),
            handover_timeout: Mutex::new(HANDOVER_TIMEOUT),
            me: me.clone(),
        })
    }

    /// Most lock descriptors held at once.
    pub fn set_max_fds(&self, n: usize) {
        self.max_fds.store(n.max(1), Ordering::Relaxed);
    }

    /// How long a hand-over is tried (tests shorten it).
    #[cfg(test)]
    pub fn set_handover_timeout(&self, d: Duration) {
        *self
            .handover_timeout
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = d;
    }

    /// Most ranges held at once (tests lower it).
    #[cfg(test)]
    pub fn set_max_ranges(&self, n: usize) {
        self.max_ranges.store(n, Ordering::Relaxed);
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn waiting(&self) -> MutexGuard<'_, WaitList> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lock descriptors open now.
    #[cfg(test)]
    pub fn fds(&self) -> usize {
        self.fds.load(Ordering::Acquire)
    }

    /// Ranges held now.
    #[cfg(test)]
    pub fn ranges(&self) -> usize {
        self.table().ranges
    }

    /// SETLKWs waiting now.
    #[cfg(test)]
    pub fn waiters(&self) -> usize {
        self.waiter_count.load(Ordering::Acquire)
    }

    /// Counts `fd` (opened by `open`, writable or not) as a lock descriptor, if one more fits:
    /// `ENOLCK` past the bound.
    fn new_fd(
        &self,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
    ) -> io::Result<Arc<LockFd>> {
        let max = self.max_fds.load(Ordering::Relaxed);
        // A compare-exchange loop (`fetch_update` is deprecated from Rust 1.99 on).
        let take = || {
            let mut n = self.fds.load(Ordering::Relaxed);
            while n < max {
                match self
                    .fds
                    .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
                {
                    Ok(_) => return true,
                    Err(now) => n = now,
                }
            }
            false
        };
        // Past the bound, an idle description makes room.
        let room = take() || (self.evict_idle() && take());
        if !room {
            warn_throttled!("lock refused: {max} lock descriptors are held already (ENOLCK)");
            return Err(error(libc::ENOLCK));
        }
        match open() {
            Ok((fd, writable)) => Ok(Arc::new(LockFd {
                fd,
                writable,
                count: self.fds.clone(),
            })),
            Err(e) => {
                self.fds.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Closes the description of one record that holds nothing (and that no waiter uses), to
    /// make room for a new one; whether there was one.
    fn evict_idle(&self) -> bool {
        let mut t = self.table();
        let found = t.nodes.iter().find_map(|(node, list)| {
            list.iter()
                .position(|(_, _, r)| r.is_empty() && Arc::strong_count(&r.fd) == 1)
                .map(|i| (*node, i))
        });
        let Some((node, i)) = found else {
            return false;
        };
        let gone = t.nodes.get_mut(&node).map(|list| list.swap_remove(i));
        if t.nodes.get(&node).is_some_and(|l| l.is_empty()) {
            t.nodes.remove(&node);
        }
        drop(t);
        gone.is_some()
    }

    /// The descriptor `req`'s owner takes its locks on: its record's, or a new one from `open`
    /// (none for an unlock of an owner that holds nothing).
    fn owner_fd(
        &self,
        req: &Req,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
    ) -> io::Result<Option<Arc<LockFd>>> {
        if let Some(r) = self.table().get(req.key()) {
            if !needs_write(req) || r.fd.writable {
                return Ok(Some(r.fd.clone()));
            }
            // A write lock of an owner whose description was opened read-only (its first lock
            // came through a read-only handle): a new description, read-write if this request's
            // handle may write, which `set_on` moves the owner to.
        }
        if req.typ == libc::F_UNLCK {
            return Ok(None);
        }
        self.new_fd(open).map(Some)
    }

    /// Takes, changes or drops `req`'s lock without waiting (`EAGAIN` when taken); `open`
    /// opens a descriptor of the node for an owner that has none (and says whether it is
    /// writable).
    pub fn set(
        &self,
        req: &Req,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
    ) -> io::Result<()> {
        if !self.clear_of_handovers(req)? {
            self.settle(req.node);
        }
        let Some(fd) = self.owner_fd(req, open)? else {
            return Ok(());
        };
        self.set_on(req, &fd)
    }

    /// As [`Locks::set`], for a node a FORGET served meanwhile on another queue may have
    /// dropped: `known` says whether the guest still knows the node, asked once the lock is
    /// recorded. A record inserted after the FORGET dropped the node's records would stay, held
    /// and counted, until DESTROY (node ids are never given again): it goes, with `ENOLCK`.
    pub fn set_known(
        &self,
        req: &Req,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
        known: impl FnOnce() -> bool,
    ) -> io::Result<()> {
        self.set(req, open)?;
        if !known() {
            self.forget(req.node);
            return Err(error(libc::ENOLCK));
        }
        Ok(())
    }

    /// As [`Locks::wait`], checked as [`Locks::set_known`]: a waiter queued after a FORGET of
    /// its node is answered `ENOLCK`.
    pub fn wait_known(
        &self,
        req: Req,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
        reply: LateReply,
        known: impl FnOnce() -> bool,
    ) -> io::Result<()> {
        let node = req.node;
        self.wait(req, open, reply)?;
        if !known() {
            // Answers the waiter, and drops a record its owner_fd may have left.
            self.forget(node);
        }
        Ok(())
    }

    /// As [`Locks::set`], with `fd` for an owner that has no record.
    fn set_on(&self, req: &Req, fd: &Arc<LockFd>) -> io::Result<()> {
        let mut t = self.table();
        let key = req.key();
        let (flock, fd) = match t.get(key) {
            Some(r) if needs_write(req) && !r.fd.writable && fd.writable => {
                // Moved to the read-write description `fd` first, with its read locks (a
                // read-only description holds only those).
                let segs = r.segs.clone();
                move_to(&segs, &r.fd, fd)?;
                if let Some(r) = t.get_mut(key) {
                    r.fd = fd.clone();
                }
                (None, fd.clone())
            }
            Some(r) => (r.flock, r.fd.clone()),
            None => (None, fd.clone()),
        };
        // The host is asked first and the owner's ranges worked out only once it took the
        // lock: a waiter's try that finds it taken (most of them) costs the table's lock one
        // system call, not a copy of all its owner's ranges.
        let new_flock = match req.kind {
            LockKind::Posix => {
                let max_ranges = self.max_ranges.load(Ordering::Relaxed);
                // A change adds at most two ranges (the one set, and a range it cuts in two):
                // the bound is looked at before the host is asked only when that may pass it.
                if t.counted().saturating_add(2) > max_ranges {
                    let segs = t.get(key).map_or(&[][..], |r| &r.segs[..]);
                    let new = apply(segs, req.start, req.end, req.typ).len();
                    if new > segs.len() && t.counted() + (new - segs.len()) > max_ranges {
                        warn_throttled!(
                            "lock refused: {max_ranges} ranges are held already (ENOLCK)"
                        );
                        return Err(error(libc::ENOLCK));
                    }
                }
                if req.typ == libc::F_WRLCK && !fd.writable {
                    // As the kernel answers a write lock on a file not open for writing.
                    return Err(error(libc::EBADF));
                }
                sys::ofd_setlk(fd.fd(), &req.range())?;
                None
            }
            LockKind::Flock => {
                let op = match req.typ {
                    libc::F_RDLCK => libc::LOCK_SH,
                    libc::F_WRLCK => libc::LOCK_EX,
                    _ => libc::LOCK_UN,
                };
                if let Err(e) = sys::flock(fd.fd(), op | libc::LOCK_NB) {
                    if would_block(&e) && flock.is_some_and(|f| f != req.typ) {
                        // flock(2) converts a lock by dropping the old one first: refused,
                        // the owner holds nothing now (its record stays, idle).
                        if let Some(r) = t.get_mut(key) {
                            r.flock = None;
                        }
                        drop(t);
                        self.poke(req.node);
                    }
                    return Err(e);
                }
                (req.typ != libc::F_UNLCK).then_some(req.typ)
            }
        };
        // Taken on the host: the table's copy follows (the host did the same split and merge).
        let segs = t.get(key).map_or(&[][..], |r| &r.segs[..]);
        let new_segs = match req.kind {
            LockKind::Posix => apply(segs, req.start, req.end, req.typ),
            LockKind::Flock => Vec::new(),
        };
        let released = req.typ == libc::F_UNLCK
            || flock.is_some_and(|f| f != req.typ)
            || (req.typ == libc::F_RDLCK && segs.iter().any(|s| s.typ == libc::F_WRLCK));
        // A record that holds nothing now stays, idle, with its description: its owner's next
        // lock needs no new open. It goes at FLUSH, RELEASE or FORGET, or when a new owner
        // needs its descriptor (`evict_idle`).
        match t.get_mut(key) {
            Some(r) => {
                let (before, after) = (r.segs.len(), new_segs.len());
                r.segs = new_segs;
                r.flock = new_flock;
                t.ranges = t.ranges + after - before;
            }
            None => {
                let r = Record {
                    fd,
                    fh: req.fh,
                    pid: req.pid,
                    segs: new_segs,
                    flock: new_flock,
                };
                if !r.is_empty() {
                    t.insert(key, r);
                }
            }
        }
        drop(t);
        if released {
            self.poke(req.node);
        }
        Ok(())
    }

    /// The first lock of another owner that conflicts with `req` (type, range, and the guest
    /// pid of its holder when it is an owner of this daemon, 0 otherwise); `None` when there is
    /// none. `open` opens a read-only descriptor of the node for an owner that has none.
    pub fn get(
        &self,
        req: &Req,
        open: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<Option<FileLock>> {
        if req.typ == libc::F_UNLCK {
            return Err(error(libc::EINVAL));
        }
        self.settle(req.node);
        let own = self.table().get(req.key()).map(|r| r.fd.clone());
        let conflict = match &own {
            Some(fd) => sys::ofd_getlk(fd.fd(), &req.range())?,
            None => sys::ofd_getlk(open()?.as_fd(), &req.range())?,
        };
        let Some((l, _host_pid)) = conflict else {
            return Ok(None);
        };
        let start = l.start.max(0) as u64;
        let end = match l.len {
            0 => TO_EOF,
            n => start.saturating_add(n.max(1) as u64 - 1).min(TO_EOF),
        };
        // The host's pid names no guest process: report the holder's guest pid when the lock
        // is one of this daemon's owners', 0 (no process the guest knows) otherwise.
        let t = self.table();
        let pid = t
            .nodes
            .get(&req.node)
            .into_iter()
            .flatten()
            .filter(|(o, k, _)| *k == LockKind::Posix && *o != req.owner)
            .find(|(_, _, r)| {
                r.segs
                    .iter()
                    .any(|s| s.typ == l.typ && s.start <= start && s.end >= end)
            })
            .map_or(0, |(_, _, r)| r.pid);
        Ok(Some(FileLock {
            typ: l.typ as u32,
            start,
            end,
            pid,
        }))
    }

    /// FLUSH: the guest process `owner` closed a file of `node`: its record locks there go.
    pub fn flush(&self, node: u64, owner: u64) {
        let gone = self.remove(node, |o, k, _| o == owner && k == LockKind::Posix);
        self.dropped(node, gone);
    }

    /// RELEASE: the guest's open file `fh` of `node` is gone: the OFD and flock locks taken
    /// through it go (record locks went at FLUSH already).
    pub fn release(&self, node: u64, fh: u64) {
        // A waiter holds its open file, so none waits through `fh` (but a guest that says
        // otherwise gets ENOLCK rather than a lock that outlives its file).
        self.cancel(|r| r.node == node && r.fh == fh);
        let gone = self.remove(node, |_, _, r| r.fh == fh);
        self.dropped(node, gone);
    }

    /// The guest forgot `node`: whatever is left of it goes.
    pub fn forget(&self, node: u64) {
        // Waiters first: one woken by the locks going would take a lock nobody drops.
        self.cancel(|r| r.node == node);
        let gone = self.remove(node, |_, _, _| true);
        self.dropped(node, gone);
    }

    /// DESTROY or disconnect: every lock goes, and every waiter is answered `ENOLCK`.
    pub fn clear(&self) {
        self.cancel(|_| true);
        // The hand-overs, with the table (the waiters' list first, as everywhere): none is
        // taken after the records went, nor counted.
        let mut w = self.waiting();
        let handovers = std::mem::take(&mut w.handovers);
        w.next_handover = None;
        self.handover_count.store(0, Ordering::Release);
        self.settled.notify_all();
        let all = {
            let mut t = self.table();
            let all = std::mem::take(&mut *t);
            unlock_all(all.nodes.values().flatten().map(|(_, _, r)| r));
            all
        };
        drop(w);
        // Descriptors closed outside the lists' locks.
        drop(all);
        drop(handovers);
    }

    /// Removes the records of `node` that `pick` chooses and drops their locks on the host,
    /// both under the table's lock: a SETLK or a waiter of the same owner may reuse a removed
    /// record's description (it took it before the removal), and its lock, taken and recorded
    /// under the table's lock too, then comes strictly before the unlock (and goes with the
    /// record) or strictly after it (and stays, with the new record that says so). The
    /// records are returned to be closed outside the lock.
    fn remove(&self, node: u64, pick: impl FnMut(u64, LockKind, &Record) -> bool) -> Vec<Record> {
        // No lock descriptor open: no record anywhere (each holds one, counted before it is
        // opened), so the FLUSH at every close of a guest that locks nothing takes no lock.
        if self.fds.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut t = self.table();
        let gone = t.remove_where(node, pick);
        unlock_all(&gone);
        gone
    }

    /// After [`Locks::remove`]: the records' descriptors are closed and the node's waiters
    /// try again.
    fn dropped(&self, node: u64, gone: Vec<Record>) {
        if gone.is_empty() {
            return;
        }
        drop(gone);
        self.poke(node);
    }

    /// Every lock held, for a migration: each owner's record on each node that holds
    /// something (idle records are not carried; their owners' next lock opens anew).
    /// Locks a hand-over still waits for count as held (this daemon, a destination a moment
    /// ago, is migrated again before it took them).
    pub fn carried(&self) -> Vec<Carried> {
        // The waiters' list before the table, as everywhere both are taken.
        let w = self.waiting();
        let t = self.table();
        let pending = |key: Key| {
            w.handovers
                .iter()
                .find(|h| h.key == key && t.get(key).is_some_and(|r| Arc::ptr_eq(&r.fd, &h.fd)))
        };
        let mut v: Vec<Carried> = t
            .nodes
            .iter()
            .flat_map(|(node, list)| {
                list.iter().filter_map(move |(owner, kind, r)| {
                    let (mut segs, mut flock) = (r.segs.clone(), r.flock);
                    if let Some(h) = pending((*node, *owner, *kind)) {
                        segs = merged(&segs, &h.segs);
                        flock = flock.or(h.flock);
                    }
                    (!segs.is_empty() || flock.is_some()).then(|| Carried {
                        node: *node,
                        owner: *owner,
                        kind: *kind,
                        fh: r.fh,
                        pid: r.pid,
                        writable: r.fd.writable,
                        segs,
                        flock,
                    })
                })
            })
            .collect();
        drop(t);
        drop(w);
        v.sort_by_key(|h| (h.node, h.owner, h.kind == LockKind::Flock));
        v
    }

    /// Takes again, on a migration destination, the locks `c` its source held: a description
    /// from `open` (counted in the descriptors' bound), and each range (or the flock) taken
    /// at once when free. What another holds still (the source daemon, until its QEMU
    /// disconnects; or anyone) is pending: the waiter thread takes it as soon as it is free,
    /// and requests on the node wait for that ([`Locks::settle`]); past [`HANDOVER_TIMEOUT`]
    /// the record goes and `lost` is called. `c.segs` are sorted and apart (`read_carried`).
    /// Whether something is pending; an error (`EEXIST` for an owner that has a record
    /// already, `EINVAL` for one conflicting with another owner's, held or pending, `ENOLCK`
    /// past a bound, pending ranges counted, `EBADF` for a write lock on a file this daemon
    /// cannot open for writing, the open's own) leaves nothing behind.
    pub fn adopt(
        &self,
        c: &Carried,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
        what: String,
        lost: OnLost,
    ) -> io::Result<bool> {
        let key = (c.node, c.owner, c.kind);
        {
            // The waiters' list before the table, as everywhere both are taken.
            let w = self.waiting();
            let t = self.table();
            if t.get(key).is_some() {
                return Err(error(libc::EEXIST));
            }
            if conflicts_with_others(&t, &w.handovers, c) {
                // Two owners of one guest never hold conflicting locks at once: a state that
                // says so was not written by a source (and would have one of them wait out the
                // hand-over and be lost, with every request on the node waiting for it).
                warn_throttled!(
                    "carried lock refused: owner {:#x} on node {} conflicts with another \
                     owner's (EINVAL)",
                    c.owner,
                    c.node
                );
                return Err(error(libc::EINVAL));
            }
            if t.counted().saturating_add(c.segs.len()) > self.max_ranges.load(Ordering::Relaxed) {
                warn_throttled!("carried lock refused: too many ranges held already (ENOLCK)");
                return Err(error(libc::ENOLCK));
            }
            drop(t);
            drop(w);
        }
        let fd = self.new_fd(open)?;
        if c.segs.iter().any(|s| s.typ == libc::F_WRLCK) && !fd.writable {
            return Err(error(libc::EBADF));
        }
        let mut t = self.table();
        let mut taken: Vec<Seg> = Vec::new();
        let mut pending: Vec<Seg> = Vec::new();
        // The ranges are sorted and apart (`read_carried`): each taken one goes at the end of
        // the list. From the first one taken elsewhere on, the rest are pending untried: the
        // source holds them all (a try costs the host a walk of every lock of the file), and
        // lets them go at once.
        for (i, s) in c.segs.iter().enumerate() {
            match sys::ofd_setlk(fd.fd(), &range_lock(s.typ, s.start, s.end)) {
                Ok(()) => push_merged(&mut taken, *s),
                Err(e) if would_block(&e) => {
                    pending.extend_from_slice(&c.segs[i..]);
                    break;
                }
                Err(e) => {
                    let _ = sys::ofd_setlk(fd.fd(), &range_lock(libc::F_UNLCK, 0, TO_EOF));
                    return Err(e);
                }
            }
        }
        let (mut flock, mut flock_pending) = (None, None);
        if let Some(typ) = c.flock {
            let op = match typ {
                libc::F_WRLCK => libc::LOCK_EX,
                _ => libc::LOCK_SH,
            };
            match sys::flock(fd.fd(), op | libc::LOCK_NB) {
                Ok(()) => flock = Some(typ),
                Err(e) if would_block(&e) => flock_pending = Some(typ),
                Err(e) => return Err(e),
            }
        }
        t.pending += pending.len();
        t.insert(
            key,
            Record {
                fd: fd.clone(),
                fh: c.fh,
                pid: c.pid,
                segs: taken,
                flock,
            },
        );
        drop(t);
        if pending.is_empty() && flock_pending.is_none() {
            return Ok(false);
        }
        let mut w = self.waiting();
        let now = Instant::now();
        w.handovers.push(Handover {
            key,
            fd,
            segs: pending,
            flock: flock_pending,
            deadline: now
                + *self
                    .handover_timeout
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            what,
            lost: Some(lost),
        });
        w.next_handover = Some(now + HANDOVER_PERIOD);
        self.handover_count
            .store(w.handovers.len(), Ordering::Release);
        self.run_thread(&mut w)?;
        Ok(true)
    }

    /// Whether a SETLK `req` can be answered now, during a hand-over on its node, without
    /// holding its queue's worker until the hand-over settles: `EAGAIN` when it conflicts with
    /// a lock another owner has still to take (held by that owner, as far as the guest can
    /// tell); `true` when it conflicts with none (taking it leaves every pending lock free to
    /// take), `false` when its own owner has some pending (its ranges are half restored: it
    /// waits). `true` at once when no hand-over is pending.
    fn clear_of_handovers(&self, req: &Req) -> io::Result<bool> {
        if self.handover_count.load(Ordering::Acquire) == 0 {
            return Ok(true);
        }
        let w = self.waiting();
        let t = self.table();
        let mine = [Seg {
            start: req.start,
            end: req.end,
            typ: req.typ,
        }];
        // Those whose record is still there (one FLUSH, RELEASE or FORGET ended is no longer
        // taken, though the waiter thread has not seen it yet).
        for h in w.handovers.iter().filter(|h| {
            h.key.0 == req.node
                && h.key.2 == req.kind
                && t.get(h.key).is_some_and(|r| Arc::ptr_eq(&r.fd, &h.fd))
        }) {
            if h.key == req.key() {
                return Ok(false);
            }
            if req.typ == libc::F_UNLCK {
                continue;
            }
            let flock = h
                .flock
                .is_some_and(|f| f == libc::F_WRLCK || req.typ == libc::F_WRLCK);
            if flock || ranges_conflict(&h.segs, &mine) {
                return Err(error(libc::EAGAIN));
            }
        }
        Ok(true)
    }

    /// Whether some lock of `node` carried by a migration is still pending.
    fn handing_over(&self, node: u64) -> bool {
        self.handover_count.load(Ordering::Acquire) != 0
            && self.waiting().handovers.iter().any(|h| h.key.0 == node)
    }

    /// Waits until the locks of `node` a migration carried are taken again (or given up, at
    /// most [`HANDOVER_TIMEOUT`] after the load): a request on the node is never answered from
    /// a half-restored state. Costs one atomic load when nothing is pending.
    fn settle(&self, node: u64) {
        if self.handover_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut w = self.waiting();
        loop {
            let Some(deadline) = w
                .handovers
                .iter()
                .filter(|h| h.key.0 == node)
                .map(|h| h.deadline)
                .max()
            else {
                return;
            };
            // The waiter thread gives up on it at the deadline; a little after that, this
            // request goes on whatever happened (it never waits unbounded), and gives up the
            // node's hand-overs itself if the thread has not yet (it is late): none is taken
            // after this request is answered, over what its owner does meanwhile.
            let end = deadline + MAX_BACKOFF;
            let now = Instant::now();
            if now >= end {
                let (late, kept): (Vec<Handover>, Vec<Handover>) = std::mem::take(&mut w.handovers)
                    .into_iter()
                    .partition(|h| h.key.0 == node);
                w.handovers = kept;
                let expired: Vec<Handover> = {
                    let mut t = self.table();
                    late.into_iter()
                        .filter_map(|mut h| give_up(&mut t, &mut h).then_some(h))
                        .collect()
                };
                self.handover_count
                    .store(w.handovers.len(), Ordering::Release);
                if w.handovers.is_empty() {
                    w.next_handover = None;
                }
                self.settled.notify_all();
                self.expire(&mut w, expired, now);
                self.wake.notify_one();
                return;
            }
            w = self
                .settled
                .wait_timeout(w, end - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Starts the waiter thread unless it runs (`w` is the waiters' list, locked).
    fn run_thread(&self, w: &mut WaitList) -> io::Result<()> {
        if w.running {
            self.wake.notify_one();
            return Ok(());
        }
        let me = self.me.clone();
        std::thread::Builder::new()
            .name("virtiofsd-locks".into())
            .spawn(move || wait_loop(me))?;
        w.running = true;
        Ok(())
    }

    /// Tries the hand-overs (`w` locked, then the table: the order `wait` takes them in),
    /// keeps those still pending, and says when they settle.
    fn try_handovers(&self, w: &mut WaitList) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut t = self.table();
            let mut kept = Vec::new();
            for mut h in std::mem::take(&mut w.handovers) {
                match try_handover(&mut t, &mut h, now) {
                    Handed::Done => {}
                    Handed::Pending => kept.push(h),
                    Handed::Expired => expired.push(h),
                }
            }
            w.handovers = kept;
        }
        self.handover_count
            .store(w.handovers.len(), Ordering::Release);
        if w.handovers.is_empty() && w.next_handover.is_some() {
            log::info!("migration: the hand-over of the guest's locks is over");
        }
        w.next_handover = (!w.handovers.is_empty()).then(|| now + HANDOVER_PERIOD);
        self.settled.notify_all();
        self.expire(w, expired, now);
    }

    /// Tells the guest of the hand-overs given up (`w`, the waiters' list, locked): their
    /// records went already ([`give_up`]).
    fn expire(&self, w: &mut WaitList, expired: Vec<Handover>, now: Instant) {
        for mut h in expired {
            warn_throttled!(
                "migration: a lock the guest held on {} (owner {:#x}, {:?}) could not be taken \
                 again within {} s (another holds it now): the handle it was taken through gets \
                 EBADF",
                h.what,
                h.key.1,
                h.key.2,
                HANDOVER_TIMEOUT.as_secs()
            );
            if let Some(lost) = h.lost.take() {
                lost();
            }
            // What the record took is let go: the node's waiters try again now (as `poke`
            // does, with the waiters' list already locked here).
            let node = h.key.0;
            drop(h);
            for x in w.list.iter_mut().filter(|x| x.req.node == node) {
                x.next = now;
                x.backoff = FIRST_BACKOFF;
            }
        }
    }

    /// Queues `reply` to be answered once `req` can be taken (on `fd` when its owner has no
    /// record yet). `ENOLCK` past [`MAX_WAITERS`].
    pub fn wait(
        &self,
        req: Req,
        open: impl FnOnce() -> io::Result<(OwnedFd, bool)>,
        reply: LateReply,
    ) -> io::Result<()> {
        if self.waiter_count.load(Ordering::Acquire) >= MAX_WAITERS {
            warn_throttled!("SETLKW refused: {MAX_WAITERS} requests are waiting already (ENOLCK)");
            return Err(error(libc::ENOLCK));
        }
        self.settle(req.node);
        let Some(fd) = self.owner_fd(&req, open)? else {
            // An unlock never waits.
            return Err(error(libc::EINVAL));
        };
        let mut w = self.waiting();
        if w.list.len() >= MAX_WAITERS {
            return Err(error(libc::ENOLCK));
        }
        // Checked and queued under the waiters' lock: of two requests that close a cycle
        // together, the second one sees the first.
        if would_deadlock(&self.table(), &w.list, &req) {
            return Err(error(libc::EDEADLK));
        }
        w.list.push(Waiter {
            req,
            fd,
            reply,
            next: Instant::now() + FIRST_BACKOFF,
            backoff: FIRST_BACKOFF,
        });
        self.waiter_count.store(w.list.len(), Ordering::Release);
        if let Err(e) = self.run_thread(&mut w) {
            let gone = w.list.pop();
            self.waiter_count.store(w.list.len(), Ordering::Release);
            drop(w);
            drop(gone);
            return Err(e);
        }
        Ok(())
    }

    /// Something was released on `node`: its waiters try again now.
    fn poke(&self, node: u64) {
        if self.waiter_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut w = self.waiting();
        let now = Instant::now();
        let mut any = false;
        for waiter in w.list.iter_mut().filter(|x| x.req.node == node) {
            waiter.next = now;
            waiter.backoff = FIRST_BACKOFF;
            any = true;
        }
        if any {
            self.wake.notify_one();
        }
    }

    /// Answers the waiters `pick` chooses with `ENOLCK` and drops them.
    fn cancel(&self, mut pick: impl FnMut(&Req) -> bool) {
        if self.waiter_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let gone: Vec<Waiter> = {
            let mut w = self.waiting();
            let (gone, kept) = std::mem::take(&mut w.list)
                .into_iter()
                .partition(|x| pick(&x.req));
            w.list = kept;
            self.waiter_count.store(w.list.len(), Ordering::Release);
            self.wake.notify_one();
            gone
        };
        for w in gone {
            w.reply.answer(libc::ENOLCK);
        }
    }

    /// Whether a record lock `w` waits for is still taken, asked of the host (`F_OFD_GETLK`)
    /// without the table's lock: a try that finds it taken, most of them, then holds up no
    /// other request (the host walks every lock of the file for it). Only when `w`'s
    /// description is the one its lock would be taken on (its owner's own locks are no
    /// conflict there); otherwise, and for `flock`, `false`: `set_on` decides.
    fn still_taken(&self, w: &Waiter) -> bool {
        if w.req.kind != LockKind::Posix {
            return false;
        }
        let same = self
            .table()
            .get(w.req.key())
            .is_none_or(|r| Arc::ptr_eq(&r.fd, &w.fd));
        same && matches!(sys::ofd_getlk(w.fd.fd(), &w.req.range()), Ok(Some(_)))
    }

    /// One try of a waiter: `Some(errno)` once it is answered.
    fn try_waiter(&self, w: &Waiter) -> Attempt {
        // A lock carried by a migration is taken before any waiter of its node.
        if self.handing_over(w.req.node) || self.still_taken(w) {
            return Attempt::Waiting;
        }
        w.reply.attempt(|| match self.set_on(&w.req, &w.fd) {
            Ok(()) => Some(0),
            Err(e) if would_block(&e) => None,
            Err(e) => Some(e.raw_os_error().unwrap_or(libc::EIO)),
        })
    }
}

/// One try of a hand-over, under the table's lock.
fn try_handover(t: &mut Table, h: &mut Handover, now: Instant) -> Handed {
    if !t.get(h.key).is_some_and(|r| Arc::ptr_eq(&r.fd, &h.fd)) {
        // The record went (FLUSH, RELEASE, FORGET): nothing more is taken for it.
        t.pending = t.pending.saturating_sub(h.segs.len());
        h.segs.clear();
        return Handed::Done;
    }
    let Some(r) = t.get_mut(h.key) else {
        return Handed::Done;
    };
    let before = r.segs.len();
    // In order, up to the first still taken (see `Locks::adopt`); what was taken is merged
    // into the record's ranges once.
    let done = h
        .segs
        .iter()
        .take_while(|s| sys::ofd_setlk(h.fd.fd(), &range_lock(s.typ, s.start, s.end)).is_ok())
        .count();
    if done > 0 {
        r.segs = merged(&r.segs, &h.segs[..done]);
        h.segs.drain(..done);
    }
    if let Some(typ) = h.flock {
        let op = match typ {
            libc::F_WRLCK => libc::LOCK_EX,
            _ => libc::LOCK_SH,
        };
        if sys::flock(h.fd.fd(), op | libc::LOCK_NB).is_ok() {
            r.flock = Some(typ);
            h.flock = None;
        }
    }
    let after = r.segs.len();
    t.ranges = t.ranges + after - before;
    t.pending = t.pending.saturating_sub(done);
    if h.segs.is_empty() && h.flock.is_none() {
        return Handed::Done;
    }
    if now < h.deadline {
        return Handed::Pending;
    }
    give_up(t, h);
    Handed::Expired
}

/// Gives `h` up, under the table's lock: its record goes with what it took (the guest is told
/// through its handle, by [`Locks::expire`]); whether it was still the record's (otherwise it
/// went meanwhile, and nothing is lost).
fn give_up(t: &mut Table, h: &mut Handover) -> bool {
    t.pending = t.pending.saturating_sub(h.segs.len());
    h.segs.clear();
    if !t.get(h.key).is_some_and(|r| Arc::ptr_eq(&r.fd, &h.fd)) {
        return false;
    }
    let gone = t.remove_where(h.key.0, |o, k, _| o == h.key.1 && k == h.key.2);
    unlock_all(&gone);
    true
}

/// Whether the carried record `c` conflicts with a record of another owner of its node, held
/// (`t`) or still handed over (`pending`): an overlapping range where either is a write lock,
/// or two `flock`s one of which is exclusive (record and `flock` locks never conflict).
fn conflicts_with_others(t: &Table, pending: &[Handover], c: &Carried) -> bool {
    let mine = (c.node, c.owner, c.kind);
    let others = t
        .nodes
        .get(&c.node)
        .into_iter()
        .flatten()
        .filter(|(o, k, _)| *k == c.kind && (c.node, *o, *k) != mine)
        .map(|(_, _, r)| (&r.segs[..], r.flock))
        .chain(
            pending
                .iter()
                .filter(|h| h.key.0 == c.node && h.key.2 == c.kind && h.key != mine)
                .map(|h| (&h.segs[..], h.flock)),
        );
    for (segs, flock) in others {
        let flocks = matches!((flock, c.flock), (Some(a), Some(b)) if a == libc::F_WRLCK || b == libc::F_WRLCK);
        if flocks || ranges_conflict(segs, &c.segs) {
            return true;
        }
    }
    false
}

/// Whether two owners' ranges (each sorted and apart) overlap where one is a write lock. Each
/// range of the shorter list is looked up in the longer one: the ranges of the longer list
/// looked at for two ranges of the shorter are apart, so it costs the lengths, not their
/// product.
fn ranges_conflict(a: &[Seg], b: &[Seg]) -> bool {
    let (small, big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small.iter().any(|s| {
        let from = big.partition_point(|x| x.end < s.start);
        big[from..]
            .iter()
            .take_while(|x| x.start <= s.end)
            .any(|x| x.typ == libc::F_WRLCK || s.typ == libc::F_WRLCK)
    })
}

/// Whether `req` is a record write lock (which a read-only description cannot take).
fn needs_write(req: &Req) -> bool {
    req.kind == LockKind::Posix && req.typ == libc::F_WRLCK
}

/// Takes the read locks `segs` (those of a read-only description, `old`) on `new`, then drops
/// them on `old`. They never conflict with `old`'s (read locks) nor with anyone else's (whoever
/// could conflict with them is refused by `old`'s already); on a failure `new` is let go.
fn move_to(segs: &[Seg], old: &LockFd, new: &LockFd) -> io::Result<()> {
    for s in segs {
        if let Err(e) = sys::ofd_setlk(new.fd(), &range_lock(s.typ, s.start, s.end)) {
            let _ = sys::ofd_setlk(new.fd(), &range_lock(libc::F_UNLCK, 0, TO_EOF));
            return Err(e);
        }
    }
    if !segs.is_empty() {
        if let Err(e) = sys::ofd_setlk(old.fd(), &range_lock(libc::F_UNLCK, 0, TO_EOF)) {
            log::warn!("dropping a lock failed: {e}");
        }
    }
    Ok(())
}

/// Most owners' records a deadlock check looks at (past it, no deadlock is reported).
const MAX_DEADLOCK_STEPS: usize = 4096;

/// Whether `req`, waiting, would close a cycle of owners of this daemon each waiting for
/// another's record lock, as the Linux kernel's `posix_locks_deadlock` finds for classic
/// POSIX locks: the owners holding ranges that conflict with `req`, what those owners wait for
/// themselves, and so on, back to `req`'s owner. Iterative and bounded
/// ([`MAX_DEADLOCK_STEPS`]). Record (POSIX and OFD: the guest sends both alike) requests only;
/// `flock` ones never deadlock-check, as in the kernel. A cycle through a host process or
/// another daemon cannot be seen.
fn would_deadlock(t: &Table, waiters: &[Waiter], req: &Req) -> bool {
    if req.kind != LockKind::Posix {
        return false;
    }
    // (node, type, start, end, asking owner) of requests waiting, to follow.
    let mut todo = vec![(req.node, req.typ, req.start, req.end, req.owner)];
    let mut seen: Vec<u64> = Vec::new();
    let mut steps = 0usize;
    while let Some((node, typ, start, end, asker)) = todo.pop() {
        for (owner, kind, r) in t.nodes.get(&node).into_iter().flatten() {
            if *kind != LockKind::Posix || *owner == asker {
                continue;
            }
            steps += 1;
            if steps > MAX_DEADLOCK_STEPS {
                return false;
            }
            // The ranges are sorted and apart: the first that ends at or after `start` on.
            let from = r.segs.partition_point(|s| s.end < start);
            let conflicts = r.segs[from..]
                .iter()
                .take_while(|s| s.start <= end)
                .any(|s| typ == libc::F_WRLCK || s.typ == libc::F_WRLCK);
            if !conflicts {
                continue;
            }
            if *owner == req.owner {
                return true;
            }
            if seen.contains(owner) {
                continue;
            }
            seen.push(*owner);
            for w in waiters
                .iter()
                .filter(|w| w.req.kind == LockKind::Posix && w.req.owner == *owner)
            {
                todo.push((w.req.node, w.req.typ, w.req.start, w.req.end, *owner));
            }
        }
    }
    false
}

/// Drops the locks of `records` on the host (under the table's lock: see [`Locks::remove`]).
/// Closing a descriptor would do it, unless a waiter or a SETLK of the same owner still holds
/// the descriptor: unlocked explicitly, closed by the caller.
fn unlock_all<'a>(records: impl IntoIterator<Item = &'a Record>) {
    for r in records {
        let done = match r.flock {
            Some(_) => sys::flock(r.fd.fd(), libc::LOCK_UN),
            None if r.segs.is_empty() => Ok(()),
            None => sys::ofd_setlk(r.fd.fd(), &range_lock(libc::F_UNLCK, 0, TO_EOF)),
        };
        if let Err(e) = done {
            log::warn!("dropping a lock failed: {e}");
        }
    }
}

/// The waiter thread: tries each waiting SETLKW when due, until none is left (or the locks
/// are gone).
fn wait_loop(me: Weak<Locks>) {
    loop {
        let Some(locks) = me.upgrade() else {
            return;
        };
        let mut w = locks.waiting();
        w.list.retain(|x| !x.reply.is_answered());
        locks.waiter_count.store(w.list.len(), Ordering::Release);
        if w.list.is_empty() && w.handovers.is_empty() {
            w.running = false;
            return;
        }
        let now = Instant::now();
        if w.next_handover.is_some_and(|t| t <= now) {
            locks.try_handovers(&mut w);
        }
        let due: Vec<usize> = (0..w.list.len())
            .filter(|&i| w.list[i].next <= now)
            .collect();
        if due.is_empty() {
            let next = w
                .list
                .iter()
                .map(|x| x.next)
                .chain(w.next_handover)
                .min()
                .unwrap_or(now);
            let pause = next.saturating_duration_since(now).min(MAX_BACKOFF);
            let w = locks
                .wake
                .wait_timeout(w, pause)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            drop(w);
            continue;
        }
        // Tried outside the list's lock (a try takes the table's); the list only grows at its
        // end or is cut by `cancel`, whose waiters are answered and skipped.
        let tries: Vec<(Req, Arc<LockFd>, LateReply)> = due
            .iter()
            .map(|&i| (w.list[i].req, w.list[i].fd.clone(), w.list[i].reply.clone()))
            .collect();
        drop(w);
        let mut waiting = Vec::new();
        for (req, fd, reply) in tries {
            let waiter = Waiter {
                req,
                fd,
                reply,
                next: now,
                backoff: FIRST_BACKOFF,
            };
            if locks.try_waiter(&waiter) == Attempt::Waiting {
                waiting.push(waiter.reply);
            }
        }
        let mut w = locks.waiting();
        let now = Instant::now();
        for x in w.list.iter_mut() {
            if x.next <= now && waiting.iter().any(|r| same_reply(r, &x.reply)) {
                x.backoff = (x.backoff * 2).min(MAX_BACKOFF);
                x.next = now + x.backoff;
            }
        }
    }
}

fn same_reply(a: &LateReply, b: &LateReply) -> bool {
    a.is(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: i32 = libc::F_RDLCK;
    const W: i32 = libc::F_WRLCK;
    const U: i32 = libc::F_UNLCK;

    fn seg(start: u64, end: u64, typ: i32) -> Seg {
        Seg { start, end, typ }
    }

    #[test]
    fn apply_splits_a_range_that_an_unlock_cuts() {
        let s = apply(&[seg(0, 99, W)], 10, 19, U);
        assert_eq!(s, [seg(0, 9, W), seg(20, 99, W)]);
    }

    #[test]
    fn apply_merges_neighbours_of_one_type() {
        let s = apply(&[seg(0, 9, R)], 10, 19, R);
        assert_eq!(s, [seg(0, 19, R)]);
        let s = apply(&s, 30, 39, R);
        let s = apply(&s, 20, 29, R);
        assert_eq!(s, [seg(0, 39, R)]);
    }

    #[test]
    fn apply_downgrades_the_middle_of_a_write_lock() {
        let s = apply(&[seg(0, TO_EOF, W)], 100, 199, R);
        assert_eq!(s, [seg(0, 99, W), seg(100, 199, R), seg(200, TO_EOF, W)]);
        let s = apply(&s, 0, TO_EOF, U);
        assert!(s.is_empty());
    }

    #[test]
    fn apply_upgrades_across_several_ranges() {
        let s = [seg(0, 9, R), seg(20, 29, R), seg(40, 49, R)];
        let s = apply(&s, 5, 44, W);
        assert_eq!(s, [seg(0, 4, R), seg(5, 44, W), seg(45, 49, R)]);
    }

    #[test]
    fn apply_keeps_disjoint_ranges_in_order() {
        let s = apply(&[seg(50, 59, R)], 0, 9, W);
        assert_eq!(s, [seg(0, 9, W), seg(50, 59, R)]);
        let s = apply(&s, 100, 109, W);
        assert_eq!(s, [seg(0, 9, W), seg(50, 59, R), seg(100, 109, W)]);
    }

    #[test]
    fn apply_at_the_end_of_offsets_does_not_overflow() {
        let s = apply(&[], TO_EOF, TO_EOF, W);
        assert_eq!(s, [seg(TO_EOF, TO_EOF, W)]);
        let s = apply(&s, 0, TO_EOF, W);
        assert_eq!(s, [seg(0, TO_EOF, W)]);
    }

    #[test]
    fn requests_with_bad_ranges_or_types_are_refused() {
        let l = |typ, start, end| FileLock {
            typ,
            start,
            end,
            pid: 1,
        };
        let k = LockKind::Posix;
        assert!(Req::new(1, 1, 0, &l(3, 0, 1), k).is_err());
        assert!(Req::new(1, 1, 0, &l(u32::MAX, 0, 1), k).is_err());
        assert!(Req::new(1, 1, 0, &l(0, 5, 4), k).is_err());
        assert!(Req::new(1, 1, 0, &l(0, u64::MAX, u64::MAX), k).is_err());
        let r = Req::new(1, 1, 0, &l(1, 0, u64::MAX), k).unwrap();
        assert_eq!(r.end, TO_EOF);
        assert_eq!(r.range().len, 0);
        let r = Req::new(1, 1, 0, &l(0, 10, 19), k).unwrap();
        assert_eq!((r.range().start, r.range().len), (10, 10));
    }

    fn tmpfile() -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"data").unwrap();
        (d, p)
    }

    /// A host process's description of `p` holding a write lock on `start..=end` (until
    /// dropped).
    fn outsider_holding(p: &std::path::Path, start: u64, end: u64) -> std::fs::File {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        sys::ofd_setlk(f.as_fd(), &range_lock(W, start, end)).unwrap();
        f
    }

    fn opener(p: &std::path::Path) -> impl Fn() -> io::Result<(OwnedFd, bool)> + '_ {
        move || {
            let f = std::fs::OpenOptions::new().read(true).write(true).open(p)?;
            Ok((f.into(), true))
        }
    }

    fn req(owner: u64, typ: i32, start: u64, end: u64) -> Req {
        Req {
            node: 7,
            owner,
            kind: LockKind::Posix,
            typ,
            start,
            end,
            pid: owner as u32,
            fh: 1,
        }
    }

    #[test]
    fn two_owners_conflict_and_an_unlock_frees_the_descriptor() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set(&req(1, W, 0, 9), opener(&p)).unwrap();
        assert_eq!(locks.fds(), 1);
        let e = locks.set(&req(2, W, 5, 5), opener(&p)).unwrap_err();
        assert!(would_block(&e));
        // The failed owner keeps nothing.
        assert_eq!(locks.fds(), 1);
        locks.set(&req(2, W, 10, 19), opener(&p)).unwrap();
        assert_eq!(locks.fds(), 2);
        let c = locks
            .get(&req(2, R, 0, TO_EOF), || Ok(opener(&p)()?.0))
            .unwrap();
        assert_eq!(
            c,
            Some(FileLock {
                typ: W as u32,
                start: 0,
                end: 9,
                pid: 1
            })
        );
        locks.set(&req(1, U, 0, TO_EOF), opener(&p)).unwrap();
        // Owner 1 holds nothing: its description stays, idle, until its FLUSH.
        assert_eq!((locks.fds(), locks.ranges()), (2, 1));
        assert!(locks.carried().iter().all(|h| h.owner == 2));
        locks.flush(7, 2);
        locks.flush(7, 1);
        assert_eq!((locks.fds(), locks.ranges()), (0, 0));
    }

    #[test]
    fn descriptors_and_ranges_are_bounded() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set_max_fds(2);
        locks.set_max_ranges(3);
        locks.set(&req(1, R, 0, 0), opener(&p)).unwrap();
        locks.set(&req(2, R, 0, 0), opener(&p)).unwrap();
        let e = locks.set(&req(3, R, 0, 0), opener(&p)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK));
        locks.set(&req(1, R, 2, 2), opener(&p)).unwrap();
        let e = locks.set(&req(1, R, 4, 4), opener(&p)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK));
        // A change that needs no more ranges still goes through.
        locks.set(&req(1, R, 1, 1), opener(&p)).unwrap();
        assert_eq!(locks.ranges(), 2);
        locks.clear();
        assert_eq!((locks.fds(), locks.ranges()), (0, 0));
    }

    #[test]
    fn an_idle_description_makes_room_for_a_new_owner() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set_max_fds(2);
        locks.set(&req(1, W, 0, 0), opener(&p)).unwrap();
        locks.set(&req(2, W, 1, 1), opener(&p)).unwrap();
        assert_eq!(
            locks
                .set(&req(3, W, 2, 2), opener(&p))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOLCK)
        );
        locks.set(&req(1, U, 0, TO_EOF), opener(&p)).unwrap();
        // Owner 1's idle description goes; owner 2 keeps its lock.
        locks.set(&req(3, W, 2, 2), opener(&p)).unwrap();
        assert_eq!(locks.fds(), 2);
        let owners: Vec<u64> = locks.carried().iter().map(|h| h.owner).collect();
        assert_eq!(owners, [2, 3]);
        // No idle one left: a fourth owner is refused.
        assert_eq!(
            locks
                .set(&req(4, R, 5, 5), opener(&p))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOLCK)
        );
    }

    #[test]
    fn a_waiter_is_answered_when_the_holder_unlocks() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set(&req(1, W, 0, TO_EOF), opener(&p)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = LateReply::new(move |e| tx.send(e).unwrap());
        locks.wait(req(2, W, 0, 0), opener(&p), reply).unwrap();
        assert_eq!(locks.waiters(), 1);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        locks.set(&req(1, U, 0, TO_EOF), opener(&p)).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        assert_eq!(locks.carried().len(), 1);
        assert_eq!(locks.carried()[0].owner, 2);
    }

    #[test]
    fn a_waiter_is_answered_enolck_when_its_open_file_is_released() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set(&req(1, W, 0, TO_EOF), opener(&p)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = LateReply::new(move |e| tx.send(e).unwrap());
        let mut r = req(2, W, 0, 0);
        r.fh = 9;
        locks.wait(r, opener(&p), reply).unwrap();
        locks.release(7, 9);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            libc::ENOLCK
        );
        // Owner 1 (handle 1) keeps its lock.
        assert_eq!(locks.carried().len(), 1);
    }

    #[test]
    fn a_waiter_is_answered_enolck_when_its_node_is_forgotten() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set(&req(1, W, 0, TO_EOF), opener(&p)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = LateReply::new(move |e| tx.send(e).unwrap());
        locks.wait(req(2, W, 0, 0), opener(&p), reply).unwrap();
        locks.forget(7);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            libc::ENOLCK
        );
        assert_eq!(locks.waiters(), 0);
        // The waiter thread lets its copy of the descriptor go after its pass.
        let deadline = Instant::now() + Duration::from_secs(5);
        while locks.fds() != 0 {
            assert!(
                Instant::now() < deadline,
                "{} descriptors left",
                locks.fds()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether a fresh description could take `typ` on `start..start+len` now (the host's
    /// view, not the table's).
    fn carried(owner: u64, segs: Vec<Seg>, flock: Option<i32>) -> Carried {
        Carried {
            node: 7,
            owner,
            kind: match flock {
                Some(_) => LockKind::Flock,
                None => LockKind::Posix,
            },
            fh: 1,
            pid: owner as u32,
            writable: true,
            segs,
            flock,
        }
    }

    fn flag() -> (Arc<std::sync::atomic::AtomicBool>, OnLost) {
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let set = lost.clone();
        (lost, Box::new(move || set.store(true, Ordering::Relaxed)))
    }

    /// Ranges a hand-over has still to take count in the bound as held ones do, until they
    /// are taken or their record goes.
    #[test]
    fn pending_ranges_count_in_the_bound() {
        let (_d, p) = tmpfile();
        let outsider = outsider_holding(&p, 0, 99);
        let locks = Locks::new();
        locks.set_max_ranges(3);
        let three = vec![seg(0, 9, R), seg(20, 29, R), seg(40, 49, R)];
        let adopt = |owner: u64| {
            let (_, on_lost) = flag();
            let c = carried(owner, three.clone(), None);
            locks.adopt(&c, opener(&p), "f".into(), on_lost)
        };
        assert!(adopt(1).unwrap());
        assert_eq!(
            adopt(2).unwrap_err().raw_os_error(),
            Some(libc::ENOLCK),
            "3 pending and 3 more past the bound 3"
        );
        // Its record goes before it is taken: the room is back.
        locks.flush(7, 1);
        std::thread::sleep(Duration::from_millis(100));
        assert!(adopt(3).unwrap());
        // Taken: held, counted once.
        drop(outsider);
        locks.settle(7);
        assert_eq!(locks.ranges(), 3);
        assert_eq!(adopt(4).unwrap_err().raw_os_error(), Some(libc::ENOLCK));
        locks.clear();
        assert!(!adopt(5).unwrap(), "clear gave the room back");
        locks.clear();
    }

    /// A request that waited out a node's hand-over gives it up itself when the waiter thread
    /// is late: the owner's record goes, its handle is told, and nothing of it is taken later,
    /// over what the guest did meanwhile.
    #[test]
    fn a_hand_over_the_waiter_thread_is_late_for_is_given_up_by_the_request() {
        let (_d, p) = tmpfile();
        let outsider = outsider_holding(&p, 0, 99);
        let locks = Locks::new();
        locks.set_handover_timeout(Duration::from_millis(50));
        let (lost, on_lost) = flag();
        let c = carried(1, vec![seg(0, 9, W)], None);
        assert!(locks.adopt(&c, opener(&p), "f".into(), on_lost).unwrap());
        // The waiter thread is late: its next try is far off.
        locks.waiting().next_handover = Some(Instant::now() + Duration::from_secs(3600));
        let t = Instant::now();
        // A request of the owner on the node waits out the hand-over, then goes on.
        assert!(locks.set(&req(1, R, 200, 209), opener(&p)).is_ok());
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            lost.load(Ordering::Relaxed),
            "the owner's handle was not told"
        );
        assert_eq!(locks.carried().len(), 1, "only the new owner's record");
        // The holder lets go and the thread comes back: nothing of the hand-over is taken.
        drop(outsider);
        locks.waiting().next_handover = Some(Instant::now());
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            host_free(&p, W, 0, 10),
            "a hand-over given up was taken after all"
        );
        locks.clear();
    }

    /// A SETLK of another owner during a hand-over is answered at once: `EAGAIN` when it
    /// conflicts with a pending lock, taken when it does not.
    #[test]
    fn a_setlk_during_a_hand_over_is_answered_at_once() {
        let (_d, p) = tmpfile();
        let outsider = outsider_holding(&p, 0, 99);
        let locks = Locks::new();
        let (lost, on_lost) = flag();
        let c = carried(1, vec![seg(0, 9, W), seg(150, 159, R)], None);
        assert!(locks.adopt(&c, opener(&p), "f".into(), on_lost).unwrap());
        let t = Instant::now();
        let e = locks.set(&req(2, R, 5, 5), opener(&p)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        let e = locks.set(&req(2, W, 155, 300), opener(&p)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        locks.set(&req(2, R, 155, 155), opener(&p)).unwrap();
        locks.set(&req(2, W, 200, 209), opener(&p)).unwrap();
        locks.set(&req(3, U, 0, TO_EOF), opener(&p)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // The hand-over goes on, and takes its locks once free.
        drop(outsider);
        locks.settle(7);
        assert!(!lost.load(Ordering::Relaxed));
        assert!(!host_free(&p, R, 0, 10));
        locks.clear();
    }

    /// A record that goes (FLUSH, FORGET, DESTROY) during its hand-over has nothing taken for
    /// it afterwards, and keeps no descriptor.
    #[test]
    fn a_record_gone_during_its_hand_over_takes_nothing() {
        for how in 0..3 {
            let (_d, p) = tmpfile();
            let outsider = outsider_holding(&p, 0, 99);
            let locks = Locks::new();
            let (lost, on_lost) = flag();
            let c = carried(1, vec![seg(0, 9, W)], None);
            assert!(locks.adopt(&c, opener(&p), "f".into(), on_lost).unwrap());
            match how {
                0 => locks.flush(7, 1),
                1 => locks.forget(7),
                _ => locks.clear(),
            }
            std::thread::sleep(Duration::from_millis(50));
            drop(outsider);
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                host_free(&p, W, 0, 100),
                "case {how}: taken after the record went"
            );
            assert_eq!(locks.fds(), 0, "case {how}: descriptor kept");
            assert_eq!(locks.ranges(), 0, "case {how}");
            assert_eq!(locks.table().pending, 0, "case {how}: still counted");
            assert!(!lost.load(Ordering::Relaxed));
        }
    }

    /// `merged` is what `apply` of each range gives, disjoint or not.
    #[test]
    fn merged_is_apply_of_each_range() {
        let a = vec![seg(0, 9, R), seg(20, 29, W), seg(40, 49, R)];
        for b in [
            vec![seg(10, 19, R), seg(30, 39, W), seg(50, TO_EOF, R)],
            vec![seg(10, 19, W), seg(35, 35, R)],
            vec![seg(5, 25, W)],
            vec![seg(0, 0, W), seg(45, 60, W)],
            vec![],
        ] {
            let want = b
                .iter()
                .fold(a.clone(), |acc, s| apply(&acc, s.start, s.end, s.typ));
            assert_eq!(merged(&a, &b), want, "{b:?}");
        }
    }

    /// A record of many ranges, taken at once or handed over, costs this daemon a number of
    /// steps in its ranges, not their square: no range is applied to a copy of the owner's
    /// list (16,384 ranges were applied 32,768 times, adopted and listed; 5.1 s to adopt them
    /// in a debug build, 2.1 s now). The host kernel's own cost is not linear: each lock taken
    /// walks every lock of the file (2 s of the 2.1 s; 65,536 ranges cost it some 40 s, as
    /// they cost the source when its guest took them), so the test carries a quarter of the
    /// bound, and bounds the time only loosely.
    #[test]
    fn a_record_of_many_ranges_is_adopted_and_handed_over_quickly() {
        let n = (MAX_RANGES / 4) as u64;
        let segs: Vec<Seg> = (0..n)
            .map(|i| seg(i * 2, i * 2, if i % 3 == 0 { W } else { R }))
            .collect();
        // What this thread works out with `apply` (each call copies an owner's list): none,
        // the ranges go in as they come.
        let applied = || APPLIED.with(|n| n.get());
        let before = applied();
        // Free: taken at once.
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        let (_, on_lost) = flag();
        let t = Instant::now();
        let c = carried(1, segs.clone(), None);
        assert!(!locks.adopt(&c, opener(&p), "f".into(), on_lost).unwrap());
        let took = t.elapsed();
        let t = Instant::now();
        assert_eq!(locks.carried(), vec![c.clone()]);
        let listed = t.elapsed();
        locks.clear();
        // Held elsewhere (one lock over all of them): pending, taken once let go.
        let outsider = outsider_holding(&p, 0, TO_EOF);
        let (lost, on_lost) = flag();
        let t = Instant::now();
        assert!(locks.adopt(&c, opener(&p), "f".into(), on_lost).unwrap());
        let pending = t.elapsed();
        assert_eq!(
            locks.carried(),
            vec![c.clone()],
            "pending ranges count as held"
        );
        assert_eq!(applied() - before, 0, "ranges applied one at a time");
        let t = Instant::now();
        drop(outsider);
        locks.settle(7);
        let handed = t.elapsed();
        assert_eq!(locks.ranges(), MAX_RANGES / 4);
        assert!(!lost.load(Ordering::Relaxed));
        assert!(!host_free(&p, W, 0, 1), "taken");
        assert_eq!(locks.carried(), vec![c]);
        eprintln!(
            "{n} ranges: adopted free in {took:?}, listed in {listed:?}, adopted held in \
             {pending:?}, handed over in {handed:?}"
        );
        for d in [took, listed, pending, handed] {
            assert!(d < Duration::from_secs(10), "{d:?}");
        }
        locks.clear();
    }

    /// A state in which two owners hold conflicting locks on one node (no source writes one)
    /// is refused at the second record, whether the first one's lock is taken or pending, and
    /// compatible ones are taken.
    #[test]
    fn carried_records_conflicting_with_each_other_are_refused() {
        let (_d, p) = tmpfile();
        let outsider = outsider_holding(&p, 200, 299);
        let locks = Locks::new();
        let adopt = |owner: u64, segs: Vec<Seg>, flock: Option<i32>| {
            let (_, on_lost) = flag();
            locks.adopt(
                &carried(owner, segs, flock),
                opener(&p),
                "f".into(),
                on_lost,
            )
        };
        let einval = |r: io::Result<bool>| r.unwrap_err().raw_os_error() == Some(libc::EINVAL);
        // Taken at once (1), pending (2: the outsider holds it).
        assert!(!adopt(1, vec![seg(0, 9, W), seg(20, 29, R)], None).unwrap());
        assert!(adopt(2, vec![seg(200, 209, R)], None).unwrap());
        assert!(
            einval(adopt(3, vec![seg(5, 5, R)], None)),
            "against a held write"
        );
        assert!(
            einval(adopt(3, vec![seg(25, 40, W)], None)),
            "a write against a read"
        );
        assert!(
            einval(adopt(3, vec![seg(205, 300, W)], None)),
            "against a pending read"
        );
        assert_eq!(locks.fds(), 2, "a refused record keeps nothing");
        // Compatible: reads over reads, ranges apart.
        assert!(!adopt(4, vec![seg(10, 19, W), seg(21, 21, R)], None).unwrap());
        assert!(adopt(5, vec![seg(205, 205, R)], None).unwrap());
        // flock: two shared ones go together, an exclusive one with none; record locks and
        // flock never conflict.
        assert!(!adopt(6, vec![], Some(R)).unwrap());
        assert!(!adopt(7, vec![], Some(R)).unwrap());
        assert!(einval(adopt(8, vec![], Some(W))));
        drop(outsider);
        locks.clear();
    }

    /// A migration destination adopting locks another description (the source daemon's)
    /// still holds: what is free is taken at once, the rest once the holder lets go; a request
    /// of another owner on the node waits for that, and then finds the carried owner holding.
    #[test]
    fn carried_locks_held_elsewhere_are_handed_over_and_requests_wait_for_them() {
        let (_d, p) = tmpfile();
        let source = Locks::new();
        source.set(&req(1, W, 0, 99), opener(&p)).unwrap();
        let locks = Locks::new();
        let (lost, on_lost) = flag();
        let c = carried(1, vec![seg(0, 99, W), seg(200, 299, R)], None);
        assert!(locks.adopt(&c, opener(&p), "f".into(), on_lost).unwrap());
        // The free range is held already, the other pending: both are the owner's, for a
        // migration of this daemon again.
        assert_eq!(
            locks.carried()[0].segs,
            vec![seg(0, 99, W), seg(200, 299, R)]
        );
        let gone = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            source.clear();
        });
        let started = Instant::now();
        // A SETLK conflicting with a pending lock is answered at once, as if held.
        let r = locks.set(&req(2, W, 250, 260), opener(&p));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EAGAIN));
        assert!(started.elapsed() < Duration::from_millis(250));
        // A GETLK waits for the hand-over, then finds the carried owner holding.
        let got = locks.get(&req(2, W, 250, 260), || Ok(std::fs::File::open(&p)?.into()));
        let waited = started.elapsed();
        gone.join().unwrap();
        assert_eq!(got.unwrap().map(|l| (l.typ, l.pid)), Some((R as u32, 1)));
        assert!(
            waited >= Duration::from_millis(250),
            "answered after {waited:?}"
        );
        assert!(waited < HANDOVER_TIMEOUT, "answered after {waited:?}");
        assert_eq!(
            locks.carried()[0].segs,
            vec![seg(0, 99, W), seg(200, 299, R)]
        );
        assert!(!lost.load(Ordering::Relaxed));
        assert!(
            !host_free(&p, W, 0, 100),
            "the hand-over holds the range on the host"
        );
        locks.clear();
        assert!(host_free(&p, W, 0, 0));
    }

    /// A carried lock someone else keeps past the hand-over's time: the record goes, the
    /// owner's handle is told, and a waiter of the node is tried again (and answered) as for
    /// any release; nothing is held after.
    #[test]
    fn a_carried_lock_never_freed_is_given_up_and_waiters_go_on() {
        let (_d, p) = tmpfile();
        let outsider = std::fs::File::open(&p).unwrap();
        sys::flock(outsider.as_fd(), libc::LOCK_EX | libc::LOCK_NB).unwrap();
        let range = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        sys::ofd_setlk(range.as_fd(), &range_lock(W, 0, 9)).unwrap();
        let locks = Locks::new();
        locks.set_handover_timeout(Duration::from_millis(300));
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = LateReply::new(move |e| tx.send(e).unwrap());
        locks.wait(req(3, W, 0, 9), opener(&p), reply).unwrap();
        let (lost, on_lost) = flag();
        assert!(locks
            .adopt(
                &carried(1, Vec::new(), Some(W)),
                opener(&p),
                "f".into(),
                on_lost
            )
            .unwrap());
        let started = Instant::now();
        while !lost.load(Ordering::Relaxed) {
            assert!(started.elapsed() < Duration::from_secs(5), "never given up");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(locks.carried().is_empty(), "the given-up record stays");
        drop(range);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        drop(outsider);
        locks.clear();
        // The answered waiter's descriptor goes with the waiter thread's next round.
        let started = Instant::now();
        while locks.fds() != 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{} held",
                locks.fds()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A carried record past the ranges' bound, or of a write lock on a description that may
    /// not write, is refused and leaves nothing behind.
    #[test]
    fn carried_locks_count_in_the_bounds() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set_max_ranges(1);
        let (_, on_lost) = flag();
        let c = carried(1, vec![seg(0, 9, W), seg(20, 29, W)], None);
        let e = locks
            .adopt(&c, opener(&p), "f".into(), on_lost)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK));
        locks.set_max_ranges(MAX_RANGES);
        let read_only = |p: &std::path::Path| {
            let p = p.to_path_buf();
            move || Ok((std::fs::File::open(&p)?.into(), false))
        };
        let (_, on_lost) = flag();
        let e = locks
            .adopt(
                &carried(1, vec![seg(0, 9, W)], None),
                read_only(&p),
                "f".into(),
                on_lost,
            )
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert_eq!(locks.fds(), 0);
        assert!(locks.carried().is_empty());
        let (_, on_lost) = flag();
        locks.set_max_fds(1);
        assert!(!locks
            .adopt(
                &carried(1, Vec::new(), Some(W)),
                opener(&p),
                "f".into(),
                on_lost
            )
            .unwrap());
        let (_, on_lost) = flag();
        let e = locks
            .adopt(
                &carried(2, vec![seg(0, 9, R)], None),
                opener(&p),
                "f".into(),
                on_lost,
            )
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK), "past --max-lock-fds");
    }

    fn host_free(p: &std::path::Path, typ: i32, start: i64, len: i64) -> bool {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        sys::ofd_getlk(f.as_fd(), &RangeLock { typ, start, len })
            .unwrap()
            .is_none()
    }

    /// FLUSH racing a SETLK of the same owner, replayed step by step in the interleavings two
    /// queues allow: the SETLK found the owner's record (and its description) before the FLUSH
    /// removed it, and takes its lock on that description. The FLUSH's unlock of the
    /// description used to run after the table's lock was let go, so it could come after the
    /// SETLK's lock and drop it while the table said "held"; it now runs under the table's
    /// lock, with the removal (`remove`), and the table and the host agree in every order.
    #[test]
    fn a_flush_racing_a_setlk_of_its_owner_never_drops_a_lock_the_table_holds() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        let r = req(1, W, 5, 5);
        for setlk_first in [false, true] {
            locks.set(&req(1, W, 0, 0), opener(&p)).unwrap();
            // Queue A, SETLK: `set` → `owner_fd` finds owner 1's record.
            let fd = locks.owner_fd(&r, opener(&p)).unwrap().unwrap();
            if setlk_first {
                locks.set_on(&r, &fd).unwrap();
            }
            // Queue B, FLUSH(owner 1): `flush` → `remove` (what runs under the table's lock).
            let gone = locks.remove(7, |o, k, _| o == 1 && k == LockKind::Posix);
            if !setlk_first {
                // Queue A: `set_on` takes 5..=5 on the same description, a new record.
                locks.set_on(&r, &fd).unwrap();
            }
            // Queue B: `dropped` (what runs after the table's lock is let go).
            locks.dropped(7, gone);
            drop(fd);
            let table_says = locks.carried().iter().any(|h| h.owner == 1);
            assert_eq!(
                table_says,
                !host_free(&p, W, 5, 1),
                "SETLK first: {setlk_first}; the table and the host disagree: {:?}",
                locks.carried()
            );
            assert!(host_free(&p, W, 0, 1), "the flushed lock on 0 stays");
            locks.flush(7, 1);
            assert_eq!((locks.fds(), locks.ranges()), (0, 0));
        }
    }

    /// flock(2) drops the old lock before it tries the new one: a refused upgrade (`EAGAIN`)
    /// leaves the owner with nothing on the host, and its record says so (it used to say
    /// "shared", and a host process could take `LOCK_EX` meanwhile).
    #[test]
    fn a_refused_flock_upgrade_leaves_the_owner_holding_nothing() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        let f = |owner, typ| Req {
            kind: LockKind::Flock,
            ..req(owner, typ, 0, TO_EOF)
        };
        locks.set(&f(1, R), opener(&p)).unwrap();
        locks.set(&f(2, R), opener(&p)).unwrap();
        assert!(would_block(&locks.set(&f(1, W), opener(&p)).unwrap_err()));
        assert!(
            locks.carried().iter().all(|h| h.owner != 1),
            "owner 1 still recorded: {:?}",
            locks.carried()
        );
        locks.set(&f(2, U), opener(&p)).unwrap();
        let host = std::fs::File::open(&p).unwrap();
        sys::flock(host.as_fd(), libc::LOCK_EX | libc::LOCK_NB).unwrap();
        assert!(locks.carried().is_empty(), "{:?}", locks.carried());
        // Owner 1 takes its lock again once the host process lets go.
        drop(host);
        locks.set(&f(1, W), opener(&p)).unwrap();
        assert_eq!(locks.carried().len(), 1);
    }

    /// A try that finds the lock taken (a waiter's, every few milliseconds) asks the host and
    /// nothing more: its owner's ranges, however many, are worked out only once the host took
    /// the lock (they used to be copied and worked out under the table's lock at every try).
    #[test]
    fn a_refused_try_works_out_no_ranges_and_a_granted_one_keeps_the_table_right() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        for i in 0..64 {
            let typ = if i % 2 == 0 { R } else { W };
            locks.set(&req(1, typ, i, i), opener(&p)).unwrap();
        }
        locks.set(&req(2, W, 1000, 1000), opener(&p)).unwrap();
        let applied = || APPLIED.with(|n| n.get());
        let before = applied();
        let e = locks.set(&req(1, W, 1000, 1000), opener(&p)).unwrap_err();
        assert!(would_block(&e));
        assert_eq!(
            applied(),
            before,
            "a refused try worked out its owner's ranges"
        );
        assert_eq!(locks.ranges(), 65);
        // Granted once owner 2 let go: the table's copy follows the host's merge (64..=1000
        // joins the write lock on 63).
        locks.set(&req(2, U, 0, TO_EOF), opener(&p)).unwrap();
        locks.set(&req(1, W, 64, 1000), opener(&p)).unwrap();
        let held = locks.carried();
        let own: Vec<&Carried> = held.iter().filter(|h| h.owner == 1).collect();
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].segs.len(), 64);
        assert_eq!(own[0].segs[63], seg(63, 1000, W));
        assert!(host_free(&p, W, 1001, 1) && !host_free(&p, W, 1000, 1));
        // Near the bound the change is looked at first, and refused without asking the host.
        locks.set_max_ranges(locks.ranges());
        let e = locks.set(&req(1, R, 2000, 2000), opener(&p));
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOLCK));
        let e = locks.set(&req(1, R, 500, 500), opener(&p));
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOLCK));
        assert!(host_free(&p, R, 2000, 1) && !host_free(&p, R, 500, 1));
        // A change that adds no range still goes through.
        locks.set(&req(1, W, 1001, 1001), opener(&p)).unwrap();
        assert_eq!(locks.ranges(), 64);
        locks.clear();
    }

    /// Two owners each waiting for the other's range: the second to wait gets `EDEADLK`, as
    /// POSIX says (both used to wait for ever, in the guest unkillable: virtio-fs has no
    /// INTERRUPT). A longer cycle, across nodes, too; a chain that is no cycle waits.
    #[test]
    fn a_deadlock_between_two_owners_gets_edeadlk() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        locks.set(&req(1, W, 0, 0), opener(&p)).unwrap();
        locks.set(&req(2, W, 1, 1), opener(&p)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let quiet = || LateReply::new(|_| {});
        locks
            .wait(
                req(1, W, 1, 1),
                opener(&p),
                LateReply::new(move |e| tx.send(e).unwrap()),
            )
            .unwrap();
        // (The server answers the refused request's reply with the error.)
        let second = locks.wait(req(2, W, 0, 0), opener(&p), quiet());
        assert_eq!(second.unwrap_err().raw_os_error(), Some(libc::EDEADLK));
        assert_eq!(locks.waiters(), 1);
        // Owner 2 gives up its lock: owner 1's wait ends with it.
        locks.set(&req(2, U, 0, TO_EOF), opener(&p)).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
        locks.clear();

        // 1 → 2 → 3 → 1, one link on another node.
        let (_d2, p2) = tmpfile();
        let on8 = |mut r: Req| {
            r.node = 8;
            r
        };
        locks.set(&req(1, W, 0, 0), opener(&p)).unwrap();
        locks.set(&req(2, W, 1, 1), opener(&p)).unwrap();
        locks.set(&on8(req(3, W, 0, 0)), opener(&p2)).unwrap();
        locks.set(&req(3, R, 5, 5), opener(&p)).unwrap();
        locks.wait(req(1, W, 1, 1), opener(&p), quiet()).unwrap();
        locks
            .wait(on8(req(2, W, 0, 0)), opener(&p2), quiet())
            .unwrap();
        // Owner 4 waits behind the chain (1 → 2 → 3, which waits for nothing yet): no cycle.
        locks.wait(req(4, W, 0, 0), opener(&p), quiet()).unwrap();
        let e = locks
            .wait(req(3, W, 0, 0), opener(&p), quiet())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EDEADLK));
        assert_eq!(locks.waiters(), 3);
        locks.clear();
    }

    /// FORGET served on another queue while a SETLK opens its owner's description (a hostile
    /// guest, two queues): the record inserted after FORGET dropped the node's records would
    /// stay, held and counted, until DESTROY; asked after, the node is unknown and it goes.
    #[test]
    fn a_forget_during_a_setlks_open_leaves_no_orphan_lock() {
        let (_d, p) = tmpfile();
        let locks = Locks::new();
        let forgotten = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l2, f2, p2) = (locks.clone(), forgotten.clone(), p.clone());
        let e = locks.set_known(
            &req(1, W, 0, TO_EOF),
            move || {
                // The FORGET of node 7 is served on another queue meanwhile.
                f2.store(true, Ordering::SeqCst);
                l2.forget(7);
                opener(&p2)()
            },
            || !forgotten.load(Ordering::SeqCst),
        );
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ENOLCK));
        assert!(
            locks.carried().is_empty(),
            "orphan record: {:?}",
            locks.carried()
        );
        assert!(host_free(&p, W, 0, 0));
        assert_eq!(locks.fds(), 0);
        // The same for a SETLKW that waits.
        locks.set(&req(2, W, 0, 0), opener(&p)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = LateReply::new(move |e| tx.send(e).unwrap());
        locks
            .wait_known(req(1, W, 0, 0), opener(&p), reply, || false)
            .unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            libc::ENOLCK
        );
        assert!(locks.carried().is_empty());
    }
}
