//! A guest that hammers the daemon with lookups and forgets: descriptors and memory must stay
//! bounded by what the guest holds, not by how many requests it sent.

mod common;

use common::*;
use virtiofsd::fuse::abi::ROOT_ID;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident memory of this process (the in-process daemon included), in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn hundred_thousand_lookup_forget_cycles_keep_descriptors_and_memory_bounded() {
    let mut d = Daemon::start();
    for i in 0..50 {
        std::fs::write(d.host(format!("f{i}")), b"x").unwrap();
        std::fs::create_dir(d.host(format!("d{i}"))).unwrap();
        std::fs::write(d.host(format!("d{i}/inner")), b"y").unwrap();
    }
    // Warm up: every name once, so allocator arenas and tables reach their working size.
    let names: Vec<String> = (0..50)
        .flat_map(|i| [format!("f{i}"), format!("d{i}")])
        .collect();
    for n in &names {
        let e = d.c.lookup(ROOT_ID, n).unwrap();
        d.c.forget(e.nodeid, 1);
    }
    let fds_before = open_fds();
    let rss_before = rss_kib();

    for i in 0..100_000usize {
        let name = &names[i % names.len()];
        let e = d.c.lookup(ROOT_ID, name).unwrap();
        if name.starts_with('d') && i % 7 == 0 {
            // A lookup below it gives the directory a descriptor; forgetting must free it.
            let inner = d.c.lookup(e.nodeid, "inner").unwrap();
            d.c.forget(inner.nodeid, 1);
        }
        if i % 1000 == 0 {
            // `..` at the root, again and again, stays the root.
            assert_eq!(d.c.lookup(ROOT_ID, "..").unwrap().nodeid, ROOT_ID);
            d.c.forget(ROOT_ID, 1);
        }
        d.c.forget(e.nodeid, 1);
    }

    let fds_after = open_fds();
    let rss_after = rss_kib();
    assert!(
        fds_after <= fds_before + 8,
        "descriptors grew from {fds_before} to {fds_after}"
    );
    assert!(
        rss_after <= rss_before + 16 * 1024,
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
    // The daemon still serves, and every reference was given back: a lookup starts afresh.
    let e = d.c.lookup(ROOT_ID, "f0").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, None).unwrap().attr.size, 1);
    d.finish();
}
