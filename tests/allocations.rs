//! Heap allocations the daemon makes per request, counted by this test binary's allocator on
//! every thread but the test's own (which plays the guest): the in-process daemon's serving and
//! queue threads. One test only, so that no other test's threads are counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use virtiofsd::fuse::abi::ROOT_ID;

struct Counting;

static DAEMON_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the test's thread: its allocations (the frontend's) are not counted.
    static GUEST: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counting touches only
// an atomic and a const-initialised thread-local, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !GUEST.with(Cell::get) {
            DAEMON_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above (the system allocator) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !GUEST.with(Cell::get) {
            DAEMON_ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations by the daemon while `n` requests made by `f` are served.
fn per_request(n: u64, mut f: impl FnMut()) -> f64 {
    let before = DAEMON_ALLOCS.load(Ordering::Relaxed);
    for _ in 0..n {
        f();
    }
    (DAEMON_ALLOCS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

#[test]
fn the_hot_requests_allocate_nothing_per_request() {
    GUEST.with(|g| g.set(true));
    let mut d = Daemon::start();
    let a = d.file("a", &[7u8; 8192]);
    let fh = d.open(a, libc::O_RDWR);
    // Warm: the first requests fill caches and grow buffers.
    for _ in 0..200 {
        d.c.getattr(a, None).unwrap();
        d.c.lookup(ROOT_ID, "a").unwrap();
        d.c.read(a, fh, 0, 4096).unwrap();
        d.c.write(a, fh, 0, &[1u8; 4096]).unwrap();
    }
    let n = 2000;
    let getattr = per_request(n, || {
        d.c.getattr(a, None).unwrap();
    });
    let lookup = per_request(n, || {
        d.c.lookup(ROOT_ID, "a").unwrap();
    });
    let read = per_request(n, || {
        d.c.read(a, fh, 0, 4096).unwrap();
    });
    let write = per_request(n, || {
        d.c.write(a, fh, 0, &[1u8; 4096]).unwrap();
    });
    let missing = per_request(n, || {
        assert_eq!(d.c.lookup(ROOT_ID, "missing").unwrap_err(), libc::ENOENT);
    });
    // One page of a listing of 60 files, past its first entry, on one handle: served from the
    // snapshot read by the first READDIRPLUS (offset 0 reads the directory again: a rewind).
    // Each entry is one more reference, forgotten at the end.
    let dir = d.c.mkdir(ROOT_ID, "dir", 0o755, 0).unwrap().nodeid;
    for i in 0..60 {
        std::fs::write(d.host(format!("dir/f{i:02}")), b"x").unwrap();
    }
    let dh = d.c.opendir(dir, libc::O_RDONLY as u32).unwrap().fh;
    let mut held: std::collections::HashMap<u64, u64> = Default::default();
    for e in d.c.readdirplus(dir, dh, 0, 4096).unwrap() {
        *held.entry(e.entry.nodeid).or_default() += 1;
    }
    let readdirplus = per_request(n, || {
        for e in d.c.readdirplus(dir, dh, 1, 4096).unwrap() {
            *held.entry(e.entry.nodeid).or_default() += 1;
        }
    });
    d.c.releasedir(dir, dh, 0).unwrap();
    for (id, count) in held {
        if id != 0 {
            d.c.forget(id, count);
        }
    }
    eprintln!(
        "allocations per request: GETATTR {getattr:.2}, LOOKUP {lookup:.2}, LOOKUP of a missing \
         name {missing:.2}, READ {read:.2}, WRITE {write:.2}, READDIRPLUS {readdirplus:.2}"
    );
    for (what, per) in [
        ("GETATTR", getattr),
        ("LOOKUP", lookup),
        ("LOOKUP missing", missing),
        ("READ", read),
        ("WRITE", write),
        ("READDIRPLUS", readdirplus),
    ] {
        assert!(per < 0.05, "{what}: {per:.2} allocations per request");
    }
    d.c.forget(a, 200 + n + 1);
    d.finish();
}
