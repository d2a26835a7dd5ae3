//! The workloads: FUSE request sequences a Linux guest sends for common jobs (`find`, `ls -l`,
//! `cat`, a sequential reader, a build creating and removing files), sent through the test
//! frontend. Each one leaves the daemon holding no references: it forgets every node id it was
//! given (FORGET on the high-priority queue, as the virtio-fs driver does) and releases every
//! handle it opened. Only the measured part runs between [`Meter::start`] and
//! [`Meter::stop`]; lookups a workload needs beforehand (and their forgets) are not measured.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use virtiofs_fuse::abi::{self, opcode, Pod, ROOT_ID};
use virtiofsd_frontend::{FsFrontend, FuseClient, FuseResult};

use crate::daemon::{CpuTime, Running};
use crate::tree::{TreeStats, BIG_FILE, SCRATCH_PREFIX};

/// Buffer the Linux kernel gives READDIR/READDIRPLUS: one page.
pub const READDIR_BUF: u32 = 4096;
/// READ size of the open-read-close workload: one page (every small file fits).
pub const SMALL_READ: u32 = 4096;
/// Size of the reads of the sequential-read workload.
pub const SEQ_READ: u32 = 1 << 20;
/// FORGETs in flight at once on the high-priority queue.
const FORGET_WINDOW: usize = 128;
/// `lock_owner` of FLUSH (the kernel sends a hash of the file table; any constant will do).
const LOCK_OWNER: u64 = 0x5eed_f11e;
/// Passes of the getattr workload.
pub const GETATTR_PASSES: u64 = 3;
const DT_DIR: u32 = 4;

/// The workloads, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    WalkReaddirplus,
    WalkReaddirLookup,
    Getattr,
    OpenReadClose,
    SeqRead1m,
    CreateUnlink,
    ReadTwice,
}

impl Workload {
    /// Every workload, in run order.
    pub const ALL: [Workload; 7] = [
        Workload::WalkReaddirplus,
        Workload::WalkReaddirLookup,
        Workload::Getattr,
        Workload::OpenReadClose,
        Workload::SeqRead1m,
        Workload::CreateUnlink,
        Workload::ReadTwice,
    ];

    /// Name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Workload::WalkReaddirplus => "walk-readdirplus",
            Workload::WalkReaddirLookup => "walk-readdir-lookup",
            Workload::Getattr => "getattr",
            Workload::OpenReadClose => "open-read-close",
            Workload::SeqRead1m => "seq-read-1m",
            Workload::CreateUnlink => "create-unlink",
            Workload::ReadTwice => "read-twice",
        }
    }

    /// What the ops are, for the report (plural).
    pub fn op_unit(self) -> &'static str {
        match self {
            Workload::WalkReaddirplus | Workload::WalkReaddirLookup => "entries",
            Workload::Getattr => "GETATTRs",
            Workload::OpenReadClose | Workload::ReadTwice => "files",
            Workload::SeqRead1m => "READs",
            Workload::CreateUnlink => "CREATEs+UNLINKs",
        }
    }

    /// Parses a comma-separated list (`all` for every workload), keeping run order.
    pub fn parse_list(s: &str) -> Result<Vec<Workload>, String> {
        let mut wanted = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                wanted.extend(Workload::ALL);
                continue;
            }
            match Workload::ALL.iter().find(|w| w.name() == part) {
                Some(&w) => wanted.push(w),
                None => {
                    let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                    return Err(format!(
                        "--workloads: unknown workload '{part}'; expected 'all' or a comma-separated \
                         list of {}",
                        names.join(", ")
                    ));
                }
            }
        }
        if wanted.is_empty() {
            return Err("--workloads: empty list".into());
        }
        Ok(Workload::ALL
            .into_iter()
            .filter(|w| wanted.contains(w))
            .collect())
    }
}

/// Settings of the workloads.
#[derive(Debug, Clone)]
pub struct Settings {
    /// READs in flight in seq-read-1m.
    pub seq_depth: usize,
    /// Files created (and unlinked) by create-unlink.
    pub create_files: usize,
    /// Passes over the big file in seq-read-1m.
    pub seq_passes: u64,
    /// References a walk may hold before forgetting (0: no limit, forget at the end).
    pub max_held: usize,
    /// What the host-side walk found (the daemons must report the same).
    pub tree: TreeStats,
}

/// One measured run of a workload on one daemon.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub ops: u64,
    /// Payload bytes read (seq-read-1m).
    pub bytes: u64,
    pub wall: Duration,
    /// CPU time of the daemon's process tree.
    pub daemon_cpu: CpuTime,
    /// CPU time of this process (the frontend) over the same interval.
    pub bench_cpu: CpuTime,
}

impl Measured {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    pub fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Measured intervals of one workload run: wall time and the CPU time of the daemon (and of this
/// process) summed over every interval between [`Meter::resume`] and [`Meter::pause`].
pub struct Meter<'a> {
    daemon: &'a Running,
    wall: Duration,
    daemon_cpu: CpuTime,
    bench_cpu: CpuTime,
    /// Start of the running interval: (instant, daemon CPU, bench CPU).
    running: Option<(Instant, CpuTime, CpuTime)>,
}

impl<'a> Meter<'a> {
    /// A meter with nothing measured yet.
    pub fn new(daemon: &'a Running) -> Self {
        Meter {
            daemon,
            wall: Duration::ZERO,
            daemon_cpu: CpuTime::default(),
            bench_cpu: CpuTime::default(),
            running: None,
        }
    }

    /// A meter measuring from now.
    pub fn start(daemon: &'a Running) -> Result<Self, String> {
        let mut m = Meter::new(daemon);
        m.resume()?;
        Ok(m)
    }

    /// Starts an interval.
    pub fn resume(&mut self) -> Result<(), String> {
        let d = self.daemon.cpu_time()?;
        let b = crate::daemon::process_cpu("/proc/self/stat")?;
        self.running = Some((Instant::now(), d, b));
        Ok(())
    }

    /// Ends the running interval, if any.
    pub fn pause(&mut self) -> Result<(), String> {
        if let Some((t, d, b)) = self.running.take() {
            self.wall += t.elapsed();
            let bench = crate::daemon::process_cpu("/proc/self/stat")?;
            self.daemon_cpu = self.daemon_cpu.add(self.daemon.cpu_time()?.since(d));
            self.bench_cpu = self.bench_cpu.add(bench.since(b));
        }
        Ok(())
    }

    /// Ends measuring; `ops` and `bytes` are what the measured intervals did.
    pub fn stop(mut self, ops: u64, bytes: u64) -> Result<Measured, String> {
        self.pause()?;
        Ok(Measured {
            ops,
            bytes,
            wall: self.wall,
            daemon_cpu: self.daemon_cpu,
            bench_cpu: self.bench_cpu,
        })
    }
}

/// A connected, initialised frontend: the request queue and the high-priority queue.
pub struct Session {
    pub fe: FsFrontend,
    pub c: FuseClient,
    pub hp: FuseClient,
    pub init: abi::InitOut,
    scratch_seq: u64,
}

impl Session {
    /// Takes both queues of `fe` and sends FUSE_INIT (as Linux 6.x does).
    pub fn new(mut fe: FsFrontend) -> Result<Self, String> {
        let mut c = fe.client(0).map_err(|e| format!("request queue: {e}"))?;
        let mut hp = fe
            .hiprio_client()
            .map_err(|e| format!("high-priority queue: {e}"))?;
        c.set_poison_replies(false);
        hp.set_poison_replies(false);
        let init = fuse(c.try_init(), || "INIT".into())?;
        hp.set_init_out(init);
        Ok(Session {
            fe,
            c,
            hp,
            init,
            scratch_seq: 0,
        })
    }

    /// Largest READ the kernel would send after this INIT.
    fn max_read(&self) -> u32 {
        let flags = u64::from(self.init.flags) | (u64::from(self.init.flags2) << 32);
        let pages = if flags & abi::init::MAX_PAGES != 0 && self.init.max_pages > 0 {
            u32::from(self.init.max_pages)
        } else {
            32
        };
        pages.saturating_mul(4096)
    }
}

/// Turns a [`FuseResult`] into a value or a message naming the request.
pub fn fuse<T>(r: FuseResult<T>, what: impl FnOnce() -> String) -> Result<T, String> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(errno)) => Err(format!(
            "{}: {} (errno {errno})",
            what(),
            std::io::Error::from_raw_os_error(errno)
        )),
        Err(e) => Err(format!("{}: {e}", what())),
    }
}

fn name_str(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

/// Lookup counts the daemon handed out, to be forgotten.
#[derive(Debug, Default)]
pub struct Refs(HashMap<u64, u64>);

impl Refs {
    /// Nodes held.
    pub fn nodes(&self) -> usize {
        self.0.len()
    }

    fn add(&mut self, nodeid: u64) {
        *self.0.entry(nodeid).or_insert(0) += 1;
    }
}

/// Sends one FORGET per node (the virtio-fs driver does not batch) on the high-priority queue,
/// [`FORGET_WINDOW`] at a time, and waits until the device returned them all.
pub fn forget_all(hp: &mut FuseClient, refs: Refs) -> Result<(), String> {
    let err = |e: virtiofsd_frontend::Error| format!("FORGET on the high-priority queue: {e}");
    let mut in_flight = 0;
    for (nodeid, nlookup) in refs.0 {
        let arg = abi::ForgetIn { nlookup };
        hp.enqueue(opcode::FORGET, nodeid, &[arg.as_bytes()], 0)
            .map_err(err)?;
        in_flight += 1;
        if in_flight == FORGET_WINDOW {
            drain(hp, &mut in_flight).map_err(err)?;
        }
    }
    drain(hp, &mut in_flight).map_err(err)
}

fn drain(hp: &mut FuseClient, in_flight: &mut usize) -> virtiofsd_frontend::Result<()> {
    hp.publish()?;
    while *in_flight > 0 {
        hp.complete()?.into_reply()?;
        *in_flight -= 1;
    }
    Ok(())
}

/// A node found by a walk.
pub struct Found {
    pub nodeid: u64,
    pub attr: abi::Attr,
}

/// Called by [`walk`] with nodes whose references are still held.
type OnGroup<'f> = dyn FnMut(&mut FuseClient, &[Found]) -> Result<(), String> + 'f;

/// Walks the whole tree from the root as `find` on a virtio-fs mount makes the kernel do:
/// OPENDIR, READDIRPLUS (or READDIR + a LOOKUP per entry) until an empty reply, RELEASEDIR,
/// then descend into the subdirectories. Returns the entries seen (without `.` and `..`).
///
/// Every node received is handed once to `on_group` while its reference is held, then
/// forgotten: all at the end, or, with `max_held` > 0, whenever a directory's listing brings
/// the held references to `max_held` (directories still to be listed stay held).
fn walk(
    c: &mut FuseClient,
    hp: &mut FuseClient,
    plus: bool,
    max_held: usize,
    on_group: &mut OnGroup<'_>,
) -> Result<u64, String> {
    let mut refs = Refs::default();
    let mut found = Vec::new();
    let mut stack = vec![ROOT_ID];
    let mut entries = 0;
    while let Some(dir) = stack.pop() {
        entries += list_dir(c, dir, plus, &mut refs, &mut found, &mut stack)?;
        if max_held > 0 && refs.0.len() >= max_held {
            on_group(c, &found)?;
            found.clear();
            let (keep, drop): (HashMap<u64, u64>, HashMap<u64, u64>) =
                refs.0.drain().partition(|(n, _)| stack.contains(n));
            refs.0 = keep;
            forget_all(hp, Refs(drop))?;
        }
    }
    on_group(c, &found)?;
    forget_all(hp, refs)?;
    Ok(entries)
}

/// Lists one directory: records the references and nodes received and pushes subdirectories on
/// `stack`. Returns the entries seen (without `.` and `..`).
pub fn list_dir(
    c: &mut FuseClient,
    dir: u64,
    plus: bool,
    refs: &mut Refs,
    found: &mut Vec<Found>,
    stack: &mut Vec<u64>,
) -> Result<u64, String> {
    let flags = (libc::O_RDONLY | libc::O_DIRECTORY) as u32;
    let fh = fuse(c.kernel_opendir(dir, flags), || {
        format!("OPENDIR node {dir}")
    })?
    .fh;
    let mut entries = 0;
    let mut offset = 0;
    loop {
        // (name, type, entry if READDIRPLUS gave one, offset of the next entry)
        let batch: Vec<(Vec<u8>, u32, Option<abi::EntryOut>, u64)> = if plus {
            fuse(c.try_readdirplus(dir, fh, offset, READDIR_BUF), || {
                format!("READDIRPLUS node {dir} offset {offset}")
            })?
            .into_iter()
            .map(|e| {
                let entry = (e.entry.nodeid != 0).then_some(e.entry);
                (e.dirent.name, e.dirent.typ, entry, e.dirent.off)
            })
            .collect()
        } else {
            fuse(c.try_readdir(dir, fh, offset, READDIR_BUF), || {
                format!("READDIR node {dir} offset {offset}")
            })?
            .into_iter()
            .map(|e| (e.name, e.typ, None, e.off))
            .collect()
        };
        if batch.is_empty() {
            break;
        }
        for (name, typ, entry, off) in batch {
            offset = off;
            // The kernel ignores `.` and `..` (and takes no reference from them).
            if name == b"." || name == b".." {
                continue;
            }
            entries += 1;
            let entry = match entry {
                Some(e) => e,
                None => fuse(c.try_lookup(dir, &name), || {
                    format!("LOOKUP '{}' in node {dir}", name_str(&name))
                })?,
            };
            refs.add(entry.nodeid);
            if typ == DT_DIR || entry.attr.mode & libc::S_IFMT == libc::S_IFDIR {
                stack.push(entry.nodeid);
            }
            found.push(Found {
                nodeid: entry.nodeid,
                attr: entry.attr,
            });
        }
    }
    fuse(c.kernel_releasedir(dir, fh, flags), || {
        format!("RELEASEDIR node {dir}")
    })?;
    Ok(entries)
}

fn check_entries(what: &str, got: u64, settings: &Settings) -> Result<(), String> {
    if got != settings.tree.entries {
        return Err(format!(
            "{what}: the daemon listed {got} entries, the host tree has {}",
            settings.tree.entries
        ));
    }
    Ok(())
}

/// Runs workload `w` on session `s`, measuring `daemon`.
pub fn run(
    w: Workload,
    s: &mut Session,
    daemon: &Running,
    settings: &Settings,
) -> Result<Measured, String> {
    let max_held = settings.max_held;
    match w {
        Workload::WalkReaddirplus | Workload::WalkReaddirLookup => {
            let plus = w == Workload::WalkReaddirplus;
            let m = Meter::start(daemon)?;
            let entries = walk(&mut s.c, &mut s.hp, plus, max_held, &mut |_, _| Ok(()))?;
            let r = m.stop(entries, 0)?;
            check_entries(w.name(), entries, settings)?;
            Ok(r)
        }
        Workload::Getattr => {
            let mut m = Meter::new(daemon);
            let mut ops = 0;
            let entries = walk(&mut s.c, &mut s.hp, true, max_held, &mut |c, group| {
                m.resume()?;
                for _ in 0..GETATTR_PASSES {
                    for f in group {
                        let n = f.nodeid;
                        fuse(c.try_getattr(n, None), || format!("GETATTR node {n}"))?;
                    }
                }
                m.pause()?;
                ops += GETATTR_PASSES * group.len() as u64;
                Ok(())
            })?;
            check_entries(w.name(), entries, settings)?;
            m.stop(ops, 0)
        }
        // ReadTwice: every file read twice while its node is held. With --cache=always (no
        // OPEN), the second pass shows what the daemon's kept descriptors save, or what
        // reopening costs once there are more files than --max-data-fds.
        Workload::OpenReadClose | Workload::ReadTwice => {
            let passes = if w == Workload::ReadTwice { 2 } else { 1 };
            let mut m = Meter::new(daemon);
            let mut ops = 0;
            walk(&mut s.c, &mut s.hp, true, max_held, &mut |c, group| {
                m.resume()?;
                let small = |f: &&Found| {
                    f.attr.mode & libc::S_IFMT == libc::S_IFREG
                        && f.attr.size <= u64::from(SMALL_READ)
                };
                for _ in 0..passes {
                    for f in group.iter().filter(small) {
                        open_read_close(c, f)?;
                        ops += 1;
                    }
                }
                m.pause()
            })?;
            m.stop(ops, 0)
        }
        Workload::SeqRead1m => seq_read(s, daemon, settings),
        Workload::CreateUnlink => create_unlink(s, daemon, settings),
    }
}

/// What `cat FILE` makes the kernel send: OPEN, READ of a page, FLUSH, RELEASE (with
/// `--cache=always` and a daemon that answers OPEN and FLUSH with `ENOSYS`, only the READ).
fn open_read_close(c: &mut FuseClient, f: &Found) -> Result<(), String> {
    let flags = libc::O_RDONLY as u32;
    let n = f.nodeid;
    let fh = fuse(c.kernel_open(n, flags), || format!("OPEN node {n}"))?.fh;
    let data = fuse(c.try_read(n, fh, 0, SMALL_READ), || {
        format!("READ node {n}")
    })?;
    if data.len() as u64 != f.attr.size {
        return Err(format!(
            "READ node {n}: {} bytes, but the file has {}",
            data.len(),
            f.attr.size
        ));
    }
    fuse(c.kernel_flush(n, fh, LOCK_OWNER), || {
        format!("FLUSH node {n}")
    })?;
    fuse(c.kernel_release(n, fh, flags), || {
        format!("RELEASE node {n}")
    })
}

fn seq_read(s: &mut Session, daemon: &Running, settings: &Settings) -> Result<Measured, String> {
    let entry = fuse(s.c.try_lookup(ROOT_ID, BIG_FILE), || {
        format!("LOOKUP '{BIG_FILE}'")
    })?;
    let node = entry.nodeid;
    let total = entry.attr.size;
    let size = SEQ_READ.min(s.max_read());
    if total == 0 || total % u64::from(size) != 0 {
        return Err(format!(
            "'{BIG_FILE}' has {total} bytes, not a multiple of the {size}-byte reads"
        ));
    }
    let flags = libc::O_RDONLY as u32;
    let fh = fuse(s.c.kernel_open(node, flags), || {
        format!("OPEN '{BIG_FILE}'")
    })?
    .fh;
    let depth = settings.seq_depth.max(1);
    let err = |e: virtiofsd_frontend::Error| format!("READ of '{BIG_FILE}': {e}");

    let m = Meter::start(daemon)?;
    // Reads cover `passes` times the file: request k reads at (k * size) mod file size.
    let passes = settings.seq_passes.max(1);
    let end = total.saturating_mul(passes);
    let (mut next, mut in_flight, mut ops, mut bytes) = (0u64, 0usize, 0u64, 0u64);
    loop {
        while in_flight < depth && next < end {
            let arg = abi::ReadIn {
                fh,
                offset: next % total.max(1),
                size,
                ..Default::default()
            };
            s.c.enqueue(opcode::READ, node, &[arg.as_bytes()], size as usize)
                .map_err(err)?;
            next += u64::from(size);
            in_flight += 1;
        }
        s.c.publish().map_err(err)?;
        if in_flight == 0 {
            break;
        }
        let reply = s.c.complete().and_then(|c| c.into_reply()).map_err(err)?;
        in_flight -= 1;
        let body = reply.into_result().map_err(|errno| {
            format!(
                "READ of '{BIG_FILE}': {} (errno {errno})",
                std::io::Error::from_raw_os_error(errno)
            )
        })?;
        if body.len() > size as usize {
            return Err(format!(
                "READ of '{BIG_FILE}': {} bytes for a {size}-byte read",
                body.len()
            ));
        }
        ops += 1;
        bytes += body.len() as u64;
    }
    let r = m.stop(ops, bytes)?;
    if bytes != end {
        return Err(format!(
            "READ of '{BIG_FILE}': got {bytes} bytes in {passes} passes over a file of {total}"
        ));
    }
    fuse(s.c.kernel_release(node, fh, flags), || {
        format!("RELEASE '{BIG_FILE}'")
    })?;
    let mut refs = Refs::default();
    refs.add(node);
    forget_all(&mut s.hp, refs)?;
    Ok(r)
}

fn create_unlink(
    s: &mut Session,
    daemon: &Running,
    settings: &Settings,
) -> Result<Measured, String> {
    s.scratch_seq += 1;
    let dir_name = format!("{SCRATCH_PREFIX}{}-{}", std::process::id(), s.scratch_seq);
    let dir = fuse(s.c.try_mkdir(ROOT_ID, &dir_name, 0o755, 0o022), || {
        format!("MKDIR '{dir_name}'")
    })?
    .nodeid;
    let names: Vec<String> = (0..settings.create_files)
        .map(|i| format!("c{i:06}"))
        .collect();
    let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) as u32;
    let mode = libc::S_IFREG | 0o644;

    let m = Meter::start(daemon)?;
    let mut refs = Refs::default();
    for name in &names {
        let (entry, open) = fuse(s.c.try_create(dir, name, flags, mode, 0o022), || {
            format!("CREATE '{dir_name}/{name}'")
        })?;
        refs.add(entry.nodeid);
        let n = entry.nodeid;
        fuse(s.c.kernel_release(n, open.fh, flags), || {
            format!("RELEASE '{dir_name}/{name}'")
        })?;
    }
    for name in &names {
        fuse(s.c.try_unlink(dir, name), || {
            format!("UNLINK '{dir_name}/{name}'")
        })?;
    }
    forget_all(&mut s.hp, refs)?;
    let r = m.stop(2 * names.len() as u64, 0)?;

    fuse(s.c.try_rmdir(ROOT_ID, &dir_name), || {
        format!("RMDIR '{dir_name}'")
    })?;
    let mut refs = Refs::default();
    refs.add(dir);
    forget_all(&mut s.hp, refs)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_lists_parse_in_run_order() {
        assert_eq!(Workload::parse_list("all").unwrap(), Workload::ALL.to_vec());
        assert_eq!(
            Workload::parse_list("create-unlink, getattr").unwrap(),
            vec![Workload::Getattr, Workload::CreateUnlink]
        );
        assert!(Workload::parse_list("getattr,bogus").is_err());
        assert!(Workload::parse_list("").is_err());
    }
}
