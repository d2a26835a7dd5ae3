//! Round-trip latency (`--latency N`): one request in flight at a time, as one guest thread
//! makes them, the frontend sleeping on the call eventfd as a guest waits for its interrupt.
//! Per request kind, `N` requests are timed one by one (p50, p99) and the daemon's CPU time is
//! read around them (CPU per request). The floor is the same system calls made directly by
//! one thread of this process on the same tree: what a daemon cannot avoid.
//!
//! The kinds: GETATTR of a file, LOOKUP of an existing and of a missing name, CREATE (and,
//! not timed, RELEASE) of a new file, UNLINK of it, READ and WRITE of 4 KiB at offset 0 of an
//! open file (page-cache hot), and READDIRPLUS of one page from offset 0 of a directory of 30
//! files (the kernel's page-sized buffer).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use virtiofs_fuse::abi::{self, opcode, Pod, ROOT_ID};
use virtiofsd_frontend::FuseClient;

use crate::daemon::Running;
use crate::tree::{BIG_FILE, SCRATCH_PREFIX};
use crate::workloads::{fuse, Session, READDIR_BUF};

/// The request kinds, in run order.
pub const KINDS: [&str; 8] = [
    "GETATTR",
    "LOOKUP",
    "LOOKUP missing",
    "CREATE",
    "UNLINK",
    "READ 4 KiB",
    "WRITE 4 KiB",
    "READDIRPLUS page",
];

/// A leaf directory of the tree and a file in it.
const DIR: [&str; 2] = ["d000", "d00"];
const FILE: &str = "f00";
const IO: usize = 4096;

/// What one kind measured on one daemon (or the floor) in one round.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Each request's time.
    pub times: Vec<Duration>,
    /// The daemon's CPU time over all of them (the floor: this thread's).
    pub cpu: Duration,
}

impl Sample {
    fn push_timed<T>(&mut self, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        let t = Instant::now();
        let r = f()?;
        self.times.push(t.elapsed());
        Ok(r)
    }
}

/// The `q`-quantile (0 to 1) of `times` (sorted here).
pub fn quantile(times: &mut [Duration], q: f64) -> Duration {
    if times.is_empty() {
        return Duration::ZERO;
    }
    times.sort_unstable();
    let i = ((times.len() - 1) as f64 * q).round() as usize;
    times[i.min(times.len() - 1)]
}

/// Measures every kind `n` times on the daemon of `s`.
pub fn measure(s: &mut Session, daemon: &Running, n: usize) -> Result<Vec<Sample>, String> {
    let c = &mut s.c;
    let mut refs: Vec<(u64, u64)> = Vec::new();
    let mut dir = ROOT_ID;
    for name in DIR {
        dir = fuse(c.try_lookup(dir, name), || format!("LOOKUP {name}"))?.nodeid;
        refs.push((dir, 1));
    }
    let file = fuse(c.try_lookup(dir, FILE), || format!("LOOKUP {FILE}"))?.nodeid;
    refs.push((file, 1));
    let big = fuse(c.try_lookup(ROOT_ID, BIG_FILE), || {
        format!("LOOKUP {BIG_FILE}")
    })?
    .nodeid;
    refs.push((big, 1));
    let scratch_name = format!("{SCRATCH_PREFIX}latency-{}", std::process::id());
    let scratch = fuse(c.try_mkdir(ROOT_ID, &scratch_name, 0o755, 0o022), || {
        format!("MKDIR {scratch_name}")
    })?
    .nodeid;
    let mut out = Vec::new();
    let pid = daemon.pid();
    let cpu = || task_cpu(pid);
    let timed = |out: &mut Vec<Sample>,
                 c: &mut FuseClient,
                 f: &mut dyn FnMut(&mut FuseClient, usize, &mut Sample) -> Result<(), String>|
     -> Result<(), String> {
        let mut sample = Sample::default();
        let before = cpu()?;
        for i in 0..n {
            f(c, i, &mut sample)?;
        }
        sample.cpu = cpu()?.saturating_sub(before);
        out.push(sample);
        Ok(())
    };
    // GETATTR
    timed(&mut out, c, &mut |c, _, s| {
        s.push_timed(|| fuse(c.try_getattr(file, None), || "GETATTR".into()))
            .map(drop)
    })?;
    // LOOKUP of a name the guest holds already (one more reference each, forgotten after).
    let mut looked = 0u64;
    timed(&mut out, c, &mut |c, _, s| {
        s.push_timed(|| fuse(c.try_lookup(dir, FILE), || "LOOKUP".into()))?;
        looked += 1;
        Ok(())
    })?;
    refs.push((file, looked));
    // LOOKUP of a missing name.
    timed(&mut out, c, &mut |c, _, s| {
        s.push_timed(|| match c.try_lookup(dir, "missing") {
            Ok(Err(libc::ENOENT)) => Ok(()),
            Ok(r) => Err(format!("LOOKUP missing: {r:?}")),
            Err(e) => Err(format!("LOOKUP missing: {e}")),
        })
    })?;
    // CREATE, then UNLINK of the same names.
    let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL) as u32;
    let mut created = Vec::with_capacity(n);
    timed(&mut out, c, &mut |c, i, s| {
        let name = format!("l{i:06}");
        let (e, o) = s.push_timed(|| {
            fuse(
                c.try_create(scratch, &name, flags, libc::S_IFREG | 0o644, 0o022),
                || format!("CREATE {name}"),
            )
        })?;
        fuse(c.kernel_release(e.nodeid, o.fh, flags), || "RELEASE".into())?;
        created.push(e.nodeid);
        Ok(())
    })?;
    timed(&mut out, c, &mut |c, i, s| {
        let name = format!("l{i:06}");
        s.push_timed(|| fuse(c.try_unlink(scratch, &name), || format!("UNLINK {name}")))
    })?;
    refs.extend(created.into_iter().map(|id| (id, 1)));
    // READ of 4 KiB.
    let rflags = libc::O_RDONLY as u32;
    let fh = fuse(c.kernel_open(big, rflags), || "OPEN".into())?.fh;
    timed(&mut out, c, &mut |c, _, s| {
        s.push_timed(|| {
            let got = fuse(c.try_read(big, fh, 0, IO as u32), || "READ".into())?;
            match got.len() {
                IO => Ok(()),
                l => Err(format!("READ gave {l} bytes")),
            }
        })
    })?;
    fuse(c.kernel_release(big, fh, rflags), || "RELEASE".into())?;
    // WRITE of 4 KiB.
    let wflags = (libc::O_RDWR | libc::O_CREAT) as u32;
    let (e, o) = fuse(
        c.try_create(scratch, "w", wflags, libc::S_IFREG | 0o644, 0o022),
        || "CREATE w".into(),
    )?;
    let data = vec![0x5au8; IO];
    let arg = abi::WriteIn {
        fh: o.fh,
        offset: 0,
        size: IO as u32,
        ..Default::default()
    };
    timed(&mut out, c, &mut |c, _, s| {
        s.push_timed(|| {
            let r = c
                .try_call_obj::<abi::WriteOut>(opcode::WRITE, e.nodeid, &[arg.as_bytes(), &data])
                .map_err(|e| format!("WRITE: {e}"))?
                .map_err(|e| format!("WRITE: errno {e}"))?;
            match r.size as usize {
                IO => Ok(()),
                l => Err(format!("WRITE wrote {l} bytes")),
            }
        })
    })?;
    fuse(c.kernel_release(e.nodeid, o.fh, wflags), || {
        "RELEASE".into()
    })?;
    fuse(c.try_unlink(scratch, "w"), || "UNLINK w".into())?;
    refs.push((e.nodeid, 1));
    // READDIRPLUS of one page from the start (each entry is one more reference).
    let dflags = libc::O_RDONLY as u32;
    let dh = fuse(c.kernel_opendir(dir, dflags), || "OPENDIR".into())?.fh;
    let mut entries: Vec<u64> = Vec::new();
    timed(&mut out, c, &mut |c, _, s| {
        let got = s.push_timed(|| {
            fuse(c.try_readdirplus(dir, dh, 0, READDIR_BUF), || {
                "READDIRPLUS".into()
            })
        })?;
        entries.extend(got.iter().map(|e| e.entry.nodeid).filter(|&id| id != 0));
        Ok(())
    })?;
    fuse(c.kernel_releasedir(dir, dh, dflags), || "RELEASEDIR".into())?;
    refs.extend(entries.into_iter().map(|id| (id, 1)));

    fuse(c.try_rmdir(ROOT_ID, &scratch_name), || {
        format!("RMDIR {scratch_name}")
    })?;
    refs.push((scratch, 1));
    for chunk in refs.chunks(256) {
        s.hp.try_batch_forget(chunk)
            .map_err(|e| format!("BATCH_FORGET: {e}"))?;
    }
    Ok(out)
}

/// The CPU time all threads of process `pid` have used, in nanoseconds as the scheduler
/// counts it (`/proc/PID/task/*/schedstat`; `/proc/PID/stat` counts clock ticks, too coarse
/// for microsecond requests). A thread that ended in between takes its time along.
fn task_cpu(pid: u32) -> Result<Duration, String> {
    let dir = format!("/proc/{pid}/task");
    let mut ns = 0u64;
    for t in std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(Duration::from_nanos(ns))
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `statx(2)` of `name` at `dir` with `flags`, the basic attributes and the birth time.
fn statx(dir: libc::c_int, name: &std::ffi::CStr, flags: i32, out: &mut libc::statx) -> i32 {
    // SAFETY: `name` is NUL-terminated and `out` valid and writable for the call.
    unsafe {
        libc::statx(
            dir,
            name.as_ptr(),
            flags,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            out,
        )
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("a path without NUL")
}

fn sys(r: libc::c_int, what: &str) -> Result<libc::c_int, String> {
    if r < 0 {
        Err(format!("{what}: {}", std::io::Error::last_os_error()))
    } else {
        Ok(r)
    }
}

fn open(dir: libc::c_int, name: &CString, flags: i32, mode: u32) -> Result<OwnedFd, String> {
    use std::os::fd::FromRawFd;
    // SAFETY: `name` is NUL-terminated; the descriptor returned is owned by the result.
    let fd = sys(
        unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) },
        "openat",
    )?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The same system calls made directly by this thread on `tree`: the floor of each kind.
pub fn floor(tree: &Path, n: usize) -> Result<Vec<Sample>, String> {
    let dir_path = tree.join(DIR[0]).join(DIR[1]);
    let dir = open(
        libc::AT_FDCWD,
        &cpath(&dir_path),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    let file_name = CString::new(FILE).unwrap();
    let missing = CString::new("missing").unwrap();
    let file = open(dir.as_raw_fd(), &file_name, libc::O_PATH, 0)?;
    let scratch_path = tree.join(format!("{SCRATCH_PREFIX}floor-{}", std::process::id()));
    std::fs::create_dir(&scratch_path)
        .map_err(|e| format!("create {}: {e}", scratch_path.display()))?;
    let scratch = open(
        libc::AT_FDCWD,
        &cpath(&scratch_path),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    let mut out = Vec::new();
    let mut timed = |f: &mut dyn FnMut(usize) -> Result<(), String>| -> Result<(), String> {
        let mut sample = Sample::default();
        let before = thread_cpu();
        for i in 0..n {
            let t = Instant::now();
            f(i)?;
            sample.times.push(t.elapsed());
        }
        sample.cpu = thread_cpu().saturating_sub(before);
        out.push(sample);
        Ok(())
    };
    let empty = c"";
    // SAFETY: `statx` is plain data, for which all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    timed(&mut |_| {
        sys(
            statx(file.as_raw_fd(), empty, libc::AT_EMPTY_PATH, &mut stx),
            "statx",
        )
        .map(drop)
    })?;
    // A lookup: the name opened O_PATH and its attributes read.
    timed(&mut |_| {
        let f = open(
            dir.as_raw_fd(),
            &file_name,
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )?;
        sys(
            statx(f.as_raw_fd(), empty, libc::AT_EMPTY_PATH, &mut stx),
            "statx",
        )
        .map(drop)
    })?;
    timed(&mut |_| match statx(
        dir.as_raw_fd(),
        &missing,
        libc::AT_SYMLINK_NOFOLLOW,
        &mut stx,
    ) {
        0 => Err("a missing name exists".into()),
        _ => Ok(()),
    })?;
    let names: Vec<CString> = (0..n)
        .map(|i| CString::new(format!("l{i:06}")).unwrap())
        .collect();
    timed(&mut |i| {
        open(
            scratch.as_raw_fd(),
            &names[i],
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )
        .map(drop)
    })?;
    timed(&mut |i| {
        // SAFETY: the name is NUL-terminated.
        sys(
            unsafe { libc::unlinkat(scratch.as_raw_fd(), names[i].as_ptr(), 0) },
            "unlinkat",
        )
        .map(drop)
    })?;
    let big = open(
        libc::AT_FDCWD,
        &cpath(&tree.join(BIG_FILE)),
        libc::O_RDONLY,
        0,
    )?;
    let mut buf = vec![0u8; IO];
    timed(&mut |_| {
        // SAFETY: `buf` is valid and writable for IO bytes.
        let r = unsafe { libc::pread(big.as_raw_fd(), buf.as_mut_ptr().cast(), IO, 0) };
        match r {
            r if r == IO as isize => Ok(()),
            _ => Err("pread".into()),
        }
    })?;
    let w_name = CString::new("w").unwrap();
    let w = open(
        scratch.as_raw_fd(),
        &w_name,
        libc::O_RDWR | libc::O_CREAT,
        0o644,
    )?;
    timed(&mut |_| {
        // SAFETY: `buf` is valid for IO bytes.
        let r = unsafe { libc::pwrite(w.as_raw_fd(), buf.as_ptr().cast(), IO, 0) };
        match r {
            r if r == IO as isize => Ok(()),
            _ => Err("pwrite".into()),
        }
    })?;
    drop(w);
    // One page of entries from the start, and the attributes of each.
    let d = open(
        libc::AT_FDCWD,
        &cpath(&dir_path),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?;
    let mut raw = vec![0u8; READDIR_BUF as usize];
    timed(&mut |_| {
        // SAFETY: lseek on our own descriptor.
        unsafe { libc::lseek(d.as_raw_fd(), 0, libc::SEEK_SET) };
        // SAFETY: getdents64 on our own descriptor into `raw`, valid and writable for its length.
        let got = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                d.as_raw_fd(),
                raw.as_mut_ptr(),
                raw.len(),
            )
        };
        if got <= 0 {
            return Err("getdents64".into());
        }
        let mut off = 0usize;
        while off + 19 < got as usize {
            let reclen = u16::from_ne_bytes([raw[off + 16], raw[off + 17]]) as usize;
            let name = &raw[off + 19..off + reclen];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            if &name[..len] != b"." && &name[..len] != b".." {
                if let Ok(n) = std::ffi::CStr::from_bytes_until_nul(name) {
                    statx(d.as_raw_fd(), n, libc::AT_SYMLINK_NOFOLLOW, &mut stx);
                }
            }
            off += reclen.max(1);
        }
        Ok(())
    })?;
    let _ = std::fs::remove_file(scratch_path.join("w"));
    let _ = std::fs::remove_dir(&scratch_path);
    Ok(out)
}
