//! Several request queues served at once, pipelined requests on one queue, and every legal way
//! of laying a request out in descriptors.

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use virtiofsd::fuse::abi::{self, opcode, Pod, ROOT_ID};
use virtiofsd_frontend::{FuseClient, SgLayout};

/// Creates, writes, reads back and (every other file) unlinks `files` files named
/// `{prefix}-{i}` through `c`, interleaving a GETATTR and a LOOKUP; returns the requests sent.
fn churn(c: &mut FuseClient, prefix: &str, files: usize) -> usize {
    let mut requests = 0;
    for i in 0..files {
        let name = format!("{prefix}-{i:03}");
        let data = pattern(100 + i * 37, i as u32);
        let (e, o) = c
            .create(
                ROOT_ID,
                &name,
                (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32,
                0o644,
                0,
            )
            .unwrap_or_else(|e| panic!("create {name}: errno {e}"));
        assert_eq!(
            c.write(e.nodeid, o.fh, 0, &data).unwrap(),
            data.len() as u32
        );
        assert_eq!(c.read(e.nodeid, o.fh, 0, 64 << 10).unwrap(), data);
        assert_eq!(
            c.getattr(e.nodeid, Some(o.fh)).unwrap().attr.size,
            data.len() as u64
        );
        c.release(e.nodeid, o.fh, 0).unwrap();
        assert_eq!(c.lookup(ROOT_ID, &name).unwrap().nodeid, e.nodeid);
        requests += 6;
        if i % 2 == 1 {
            c.unlink(ROOT_ID, &name).unwrap();
            assert_eq!(c.lookup(ROOT_ID, &name).unwrap_err(), libc::ENOENT);
            requests += 2;
        }
    }
    requests
}

/// What `churn(prefix, files)` leaves on the host.
fn check_churn(d: &Daemon, prefix: &str, files: usize) {
    for i in 0..files {
        let p = d.host(format!("{prefix}-{i:03}"));
        if i % 2 == 1 {
            assert!(!p.exists(), "{} survived its unlink", p.display());
        } else {
            assert_eq!(fs::read(&p).unwrap(), pattern(100 + i * 37, i as u32));
        }
    }
}

fn two_queues_interleaved(pool: usize) {
    let mut d = Daemon::with(Options::default().queues(2).pool(pool));
    let mut c1 = d.client(1);
    let files = 60;
    // Queue 1 on its own thread, queue 0 on this one.
    let t1 = std::thread::spawn(move || churn(&mut c1, "q1", files));
    let n0 = churn(&mut d.c, "q0", files);
    let n1 = t1.join().expect("queue 1 worker");
    assert!(n0 >= 400 && n1 >= 400, "{n0} and {n1} requests");
    check_churn(&d, "q0", files);
    check_churn(&d, "q1", files);
    assert_eq!(fs::read_dir(&d.share).unwrap().count(), files);
    d.finish();
}

#[test]
fn two_request_queues_serve_interleaved_workloads() {
    two_queues_interleaved(0);
}

#[test]
fn two_request_queues_with_a_thread_pool_of_two() {
    two_queues_interleaved(2);
}

/// One thread keeps queue 0 busy with batches of pipelined 1 MiB WRITEs until the other, on
/// queue 1, has finished its LOOKUPs (or a generous cap is reached); both must complete and all
/// data must be right.
fn busy_queue_does_not_block_the_other(pool: usize) {
    let mut d = Daemon::with(Options::default().queues(2).pool(pool));
    fs::write(d.host("probe"), b"probe").unwrap();
    let probe_ino = fs::metadata(d.host("probe")).unwrap().ino();
    let (e, o) =
        d.c.create(
            ROOT_ID,
            "big",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o644,
            0,
        )
        .unwrap();
    let mut looker = d.client(1);
    let done = Arc::new(AtomicBool::new(false));

    // Queue 1: LOOKUPs, one at a time, on their own thread.
    let done_l = done.clone();
    let l = std::thread::spawn(move || {
        for _ in 0..300 {
            assert_eq!(looker.lookup(ROOT_ID, "probe").unwrap().attr.ino, probe_ino);
        }
        done_l.store(true, Ordering::Release);
    });

    // Queue 0: batches of three pipelined 1 MiB WRITEs until the LOOKUPs are done (capped).
    let chunk = pattern(1 << 20, 99);
    let arg = |i: u64| abi::WriteIn {
        fh: o.fh,
        offset: i << 20,
        size: 1 << 20,
        ..Default::default()
    };
    let mut batches = 0;
    // At least one batch, then until the LOOKUPs are done.
    while batches == 0 || (!done.load(Ordering::Acquire) && batches < 500) {
        let tickets: Vec<_> = (0..3u64)
            .map(|i| {
                d.c.enqueue(opcode::WRITE, e.nodeid, &[arg(i).as_bytes(), &chunk], 8)
                    .unwrap()
            })
            .collect();
        d.c.publish().unwrap();
        for t in tickets {
            let r = d.c.wait(t).unwrap();
            let out = abi::WriteOut::from_prefix(&r.into_result().unwrap()).unwrap();
            assert_eq!(out.size, 1 << 20);
        }
        batches += 1;
    }
    l.join().expect("LOOKUPs on queue 1 did not complete");
    assert!(done.load(Ordering::Acquire));
    assert!(batches >= 1);

    let host = fs::read(d.host("big")).unwrap();
    assert_eq!(host.len(), 3 << 20);
    for part in host.chunks(1 << 20) {
        assert!(part == chunk.as_slice(), "WRITE data corrupted on the host");
    }
    d.c.release(e.nodeid, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn one_queue_progresses_while_the_other_is_busy_with_large_writes() {
    busy_queue_does_not_block_the_other(0);
}

#[test]
fn one_queue_progresses_while_the_other_is_busy_with_a_thread_pool() {
    busy_queue_does_not_block_the_other(2);
}

#[test]
fn many_pipelined_requests_on_one_queue_all_complete() {
    let mut d = Daemon::start();
    for i in 0..8 {
        fs::write(d.host(format!("f{i}")), vec![b'x'; i]).unwrap();
    }
    // 60 chains of four descriptors, then 250 through indirect tables (one slot each).
    for (count, indirect) in [(60, false), (250, true)] {
        d.c.set_indirect(indirect).unwrap();
        let mut tickets = Vec::new();
        for i in 0..count {
            let name = format!("f{}\0", i % 8);
            let t =
                d.c.enqueue(opcode::LOOKUP, ROOT_ID, &[name.as_bytes()], 128)
                    .unwrap();
            tickets.push((i % 8, t));
        }
        d.c.publish().unwrap();
        assert_eq!(d.c.in_flight(), count);
        // Collected in reverse submission order: replies are matched by unique.
        for (i, t) in tickets.into_iter().rev() {
            let r = d.c.wait(t).unwrap();
            let e = abi::EntryOut::from_prefix(&r.into_result().unwrap()).unwrap();
            assert_eq!(e.attr.size, i as u64);
        }
        assert_eq!(d.c.in_flight(), 0);
    }
    d.finish();
}

#[test]
fn ring_indices_wrap_around_on_a_small_queue() {
    let mut d = Daemon::with(Options::default().frontend(|f| {
        f.queue_size = 8;
        f.initial_ring_index = u16::MAX - 20;
    }));
    let n = d.file("f", b"wrap");
    // Eight chains in flight (a full ring) per round, through indirect tables.
    d.c.set_indirect(true).unwrap();
    for round in 0..20 {
        let tickets: Vec<_> = (0..8)
            .map(|_| {
                d.c.enqueue(opcode::LOOKUP, ROOT_ID, &[b"f\0"], 128)
                    .unwrap()
            })
            .collect();
        d.c.publish().unwrap();
        for t in tickets {
            let r = d.c.wait(t).unwrap();
            assert_eq!(r.error, 0, "round {round}");
        }
    }
    // And two direct four-descriptor chains at a time.
    d.c.set_indirect(false).unwrap();
    for _ in 0..20 {
        let a = d.c.submit(opcode::LOOKUP, ROOT_ID, &[b"f\0"], 128).unwrap();
        let b = d.c.submit(opcode::GETATTR, n, &[&[0u8; 16]], 104).unwrap();
        assert_eq!(d.c.wait(b).unwrap().error, 0);
        assert_eq!(d.c.wait(a).unwrap().error, 0);
    }
    assert_eq!(d.c.getattr(n, None).unwrap().attr.size, 4);
    d.finish();
}

#[test]
fn without_event_index_or_indirect_descriptors() {
    let mut d = Daemon::with(Options::default().frontend(|f| {
        f.event_idx = false;
        f.indirect = false;
    }));
    assert!(!d.fe.event_idx() && !d.fe.indirect());
    let n = d.file("f", b"plain rings");
    let fh = d.open(n, libc::O_RDONLY);
    for _ in 0..50 {
        assert_eq!(d.c.read(n, fh, 0, 100).unwrap(), b"plain rings");
    }
    d.finish();
}

#[test]
fn every_descriptor_layout_carries_the_same_requests() {
    let mut d = Daemon::start();
    // (layout, payload size): a chain may not have more descriptors than the queue (256).
    let layouts = [
        (SgLayout::PerArg, 10_000),
        (SgLayout::Contiguous, 10_000),
        (SgLayout::Chunked(1), 100),
        (SgLayout::Chunked(7), 700),
        (SgLayout::Chunked(40), 4000),
        (SgLayout::Chunked(4096), 10_000),
    ];
    for (i, (layout, size)) in layouts.into_iter().enumerate() {
        for indirect in [false, true] {
            let name = format!("f-{i}-{indirect}");
            let payload = pattern(size, i as u32);
            d.c.set_sg_layout(layout);
            d.c.set_indirect(indirect).unwrap();
            let what = format!("{layout:?}, indirect {indirect}");
            let (e, o) =
                d.c.create(
                    ROOT_ID,
                    &name,
                    (libc::O_CREAT | libc::O_RDWR) as u32,
                    0o600,
                    0,
                )
                .unwrap_or_else(|e| panic!("{what}: errno {e}"));
            assert_eq!(
                d.c.write(e.nodeid, o.fh, 0, &payload).unwrap(),
                size as u32,
                "{what}"
            );
            assert_eq!(
                d.c.read(e.nodeid, o.fh, 0, size as u32).unwrap(),
                payload,
                "{what}"
            );
            let found = d.c.lookup(ROOT_ID, &name).unwrap();
            assert_eq!(
                (found.nodeid, found.attr.size),
                (e.nodeid, size as u64),
                "{what}"
            );
            assert_eq!(fs::read(d.host(&name)).unwrap(), payload, "{what}");
            d.c.release(e.nodeid, o.fh, 0).unwrap();
        }
    }
    d.finish();
}

#[test]
fn forgets_on_the_high_priority_queue_race_with_lookups() {
    let mut d = Daemon::start();
    let names: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
    for n in &names {
        fs::write(d.host(n), n.as_bytes()).unwrap();
    }
    let mut hp = d.fe.hiprio_client().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    // FORGET every reference as soon as it is handed out, on the high-priority queue, while
    // this thread keeps looking the same names up: node ids die and are born again.
    let forgetter = std::thread::spawn(move || {
        let mut n = 0;
        for id in rx {
            hp.forget(id, 1);
            n += 1;
        }
        n
    });
    let mut sent = 0;
    for round in 0..15 {
        for n in &names {
            let e =
                d.c.lookup(ROOT_ID, n)
                    .unwrap_or_else(|e| panic!("round {round}, {n}: errno {e}"));
            assert_eq!(e.attr.size, n.len() as u64);
            tx.send(e.nodeid).unwrap();
            sent += 1;
        }
    }
    drop(tx);
    assert_eq!(forgetter.join().unwrap(), sent);
    for n in &names {
        let e = d.c.lookup(ROOT_ID, n).unwrap();
        let a = d.c.getattr(e.nodeid, None).unwrap();
        assert_eq!(a.attr.ino, fs::metadata(d.host(n)).unwrap().ino());
    }
    d.finish();
}

/// Requests one at a time on `c`, each after a pause that sweeps across `window` (none, then
/// about the window itself, then past it): a request made as a polling window ends must be
/// answered like any other (the frontend waits at most its reply timeout).
fn requests_around_the_window(c: &mut FuseClient, window: std::time::Duration, rounds: u32) {
    for i in 0..rounds {
        // 0, ~window/4 ... ~2x window, in 16 steps, then again.
        let pause = window * (i % 16) / 8;
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        c.getattr(ROOT_ID, None)
            .unwrap_or_else(|e| panic!("request {i} after {pause:?}: errno {e}"));
    }
}

fn polling_never_loses_a_request(pool: usize) {
    let window = std::time::Duration::from_micros(400);
    let mut d = Daemon::with(Options::default().queues(2).pool(pool).poll_window(window));
    let mut c1 = d.client(1);
    let t1 = std::thread::spawn(move || requests_around_the_window(&mut c1, window, 400));
    requests_around_the_window(&mut d.c, window, 400);
    t1.join().expect("queue 1");
    // And a burst of pipelined work still completes with polling on.
    check_polled_churn(&mut d);
    d.finish();
}

#[test]
fn with_polling_an_idle_guest_costs_the_daemon_no_cpu() {
    // The binary, so that its CPU time is its own: busy, then idle.
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    fs::create_dir(&share).unwrap();
    let socket = dir.path().join("vfs.sock");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .args(["--sandbox=none", "--poll-window=400", "--log-level=error"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut fe = virtiofsd_frontend::FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let window = std::time::Duration::from_micros(400);
    requests_around_the_window(&mut c, window, 200);
    std::thread::sleep(window * 4);
    let before = process_cpu(child.id());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let idle = process_cpu(child.id()) - before;
    assert!(
        idle < std::time::Duration::from_millis(10),
        "the daemon used {idle:?} of CPU in 500 ms while the guest sent nothing"
    );
    fe.disconnect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn with_polling_a_trickle_of_requests_costs_the_daemon_no_more_than_without() {
    // One cheap request every 8 ms, the longest window (10 ms): each request came within the
    // window, so the worker polled from one to the next, 42% of a core against nothing
    // without polling. Polling that finds a request once in 8 ms does not pay for itself.
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    fs::create_dir(&share).unwrap();
    let socket = dir.path().join("vfs.sock");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .args(["--sandbox=none", "--poll-window=10000", "--log-level=error"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut fe = virtiofsd_frontend::FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    const REQUESTS: u32 = 100;
    let before = process_cpu(child.id());
    for i in 0..REQUESTS {
        // At least 8 ms apart, however busy the machine.
        std::thread::sleep(std::time::Duration::from_millis(8));
        c.getattr(ROOT_ID, None)
            .unwrap_or_else(|e| panic!("request {i}: errno {e}"));
    }
    let used = process_cpu(child.id()) - before;
    // A GETATTR costs the daemon tens of microseconds (hundreds in a debug build); polling
    // from one request to the next cost some 8 ms each.
    assert!(
        used < std::time::Duration::from_millis(u64::from(REQUESTS)),
        "the daemon used {used:?} of CPU for {REQUESTS} GETATTRs 8 ms apart"
    );
    fe.disconnect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// CPU time of every thread of process `pid`, as the scheduler counts it.
fn process_cpu(pid: u32) -> std::time::Duration {
    let mut ns = 0u64;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        if let Ok(s) = fs::read_to_string(t.path().join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    std::time::Duration::from_nanos(ns)
}

fn check_polled_churn(d: &mut Daemon) {
    let n = churn(&mut d.c, "polled", 20);
    assert!(n >= 100, "{n} requests");
    check_churn(d, "polled", 20);
}

#[test]
fn with_polling_a_request_made_as_the_window_ends_is_answered() {
    polling_never_loses_a_request(0);
}

#[test]
fn with_polling_and_a_thread_pool_no_request_is_lost() {
    polling_never_loses_a_request(2);
}
