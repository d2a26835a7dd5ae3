//! Memory per node (`--hold N`): the guest walks a tree of `N` files with OPENDIR and
//! READDIRPLUS and keeps every node it was given (a guest without memory pressure does: the
//! kernel's dentries and inodes hold their lookup counts), then forgets them all. Measured from
//! `/proc`: the daemon's anonymous memory (`RssAnon`) idle, holding and after FORGET, its
//! descriptors, the kernel memory its descriptors pin (slab, from `/proc/meminfo`), and the
//! walk's time.
//!
//! The tree (`--hold-tree DIR`, generated once): `N / 1000` directories `dNNNN` of 1,000 empty
//! files each, named `file-NNNNNN.c` (13 bytes: a source tree's names, not the shortest).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use virtiofs_fuse::abi::ROOT_ID;

use crate::daemon::Running;
use crate::workloads::{forget_all, fuse, list_dir, Refs, Session};

/// Files per directory of the hold tree.
pub const PER_DIR: usize = 1000;
const MARKER: &str = ".virtiofsd-bench-hold";

/// What one daemon held for the walk.
#[derive(Debug, Clone, Default)]
pub struct Held {
    /// Nodes the walk was given (directories and files).
    pub nodes: u64,
    pub idle_kib: u64,
    pub holding_kib: u64,
    pub after_forget_kib: u64,
    pub fds_idle: usize,
    pub fds_holding: usize,
    /// Growth of the kernel's slab memory while the daemon held the nodes (KiB; the whole
    /// host's, so only meaningful on a quiet machine).
    pub slab_kib: i64,
    pub walk: Duration,
}

impl Held {
    /// Bytes of anonymous memory per held node.
    pub fn bytes_per_node(&self) -> f64 {
        (self.holding_kib.saturating_sub(self.idle_kib) * 1024) as f64 / self.nodes.max(1) as f64
    }
}

/// Makes sure `dir` holds a hold tree of `files` files; returns whether it generated one.
pub fn ensure(dir: &Path, files: usize) -> Result<bool, String> {
    let marker = dir.join(MARKER);
    let want = format!("{files} files, {PER_DIR} per directory\n");
    if fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Ok(false);
    }
    if dir.exists()
        && fs::read_dir(dir)
            .map_err(|e| e.to_string())?
            .next()
            .is_some()
    {
        return Err(format!(
            "--hold-tree {}: not empty and not a hold tree of {files} files; give another \
             directory",
            dir.display()
        ));
    }
    fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    for d in 0..files.div_ceil(PER_DIR) {
        let sub = dir.join(format!("d{d:04}"));
        fs::create_dir(&sub).map_err(|e| format!("create {}: {e}", sub.display()))?;
        for f in 0..PER_DIR.min(files - d * PER_DIR) {
            let p = sub.join(format!("file-{:06}.c", d * PER_DIR + f));
            fs::File::create(&p).map_err(|e| format!("create {}: {e}", p.display()))?;
        }
    }
    fs::write(&marker, want).map_err(|e| format!("write {}: {e}", marker.display()))?;
    Ok(true)
}

fn status_kib(pid: u32, field: &str) -> Result<u64, String> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/status: no {field}"))
}

/// Anonymous memory of the daemon's process tree, KiB.
fn rss_anon(d: &Running) -> Result<u64, String> {
    let mut total = 0;
    for pid in d.pids() {
        match status_kib(pid, "RssAnon:") {
            Ok(k) => total += k,
            Err(e) if pid == d.pid() => return Err(e),
            Err(_) => {}
        }
    }
    Ok(total)
}

fn slab_kib() -> i64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Slab:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Walks the tree holding every node, measures, forgets them all, measures again.
pub fn measure(s: &mut Session, d: &Running, expected: u64) -> Result<Held, String> {
    // Settle: the daemon's threads have started and INIT is done.
    std::thread::sleep(Duration::from_millis(300));
    let mut h = Held {
        idle_kib: rss_anon(d)?,
        fds_idle: d.fd_count().unwrap_or(0),
        ..Held::default()
    };
    let slab_before = slab_kib();
    let mut refs = Refs::default();
    let mut found = Vec::new();
    let mut stack = vec![ROOT_ID];
    let t = Instant::now();
    let mut entries = 0;
    while let Some(dir) = stack.pop() {
        entries += list_dir(&mut s.c, dir, true, &mut refs, &mut found, &mut stack)?;
        found.clear();
    }
    h.walk = t.elapsed();
    if entries != expected {
        return Err(format!(
            "the daemon listed {entries} entries, the hold tree has {expected}"
        ));
    }
    h.nodes = refs.nodes() as u64;
    std::thread::sleep(Duration::from_millis(300));
    h.holding_kib = rss_anon(d)?;
    h.fds_holding = d.fd_count().unwrap_or(0);
    h.slab_kib = slab_kib() - slab_before;
    forget_all(&mut s.hp, refs)?;
    // A request after the forgets: they have all been served.
    fuse(s.c.try_getattr(ROOT_ID, None), || {
        "GETATTR of the root".into()
    })?;
    std::thread::sleep(Duration::from_millis(300));
    h.after_forget_kib = rss_anon(d)?;
    Ok(h)
}
