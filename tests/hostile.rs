//! A hostile guest: escape attempts through `..`, symlinks and odd names, extreme sizes,
//! descriptor loops, requests after DESTROY, forgets of nodes it never had, and 100,000
//! LOOKUP/FORGET cycles. After each, the daemon still serves (a LOOKUP and GETATTR round trip)
//! and nothing outside the share was changed or even read: the canary next to the share keeps
//! its content, mode, times (atime included: it is set older than mtime, so on a `relatime` or
//! `strictatime` host any read would move it) and listing. Descriptors and memory stay bounded
//! by what the guest holds, not by how many requests it sent.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use virtiofsd::fuse::abi::{self, opcode, Pod, ROOT_ID};
use virtiofsd_frontend::fuse_client::{build_request, cstr};
use virtiofsd_frontend::virtqueue::VIRTQ_DESC_F_INDIRECT;
use virtiofsd_frontend::{Buffer, Next, RawDesc};

/// The tests of this file run one at a time: the 100,000-cycle test counts the descriptors and
/// memory of the whole process, which a daemon of another test would disturb.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A `/proc/self/status` field in KiB (`VmRSS`, `RssAnon`): memory of this process, the
/// in-process daemon included.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Resident memory of this process (the in-process daemon included), in KiB.
fn rss_kib() -> u64 {
    status_kib("VmRSS")
}

#[test]
fn hundred_thousand_lookup_forget_cycles_keep_descriptors_and_memory_bounded() {
    let _serial = serial();
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

/// Resident anonymous memory of this process (the in-process daemon included), in KiB: what
/// the daemon's tables cost, without the page cache of files mapped.
fn rss_anon_kib() -> u64 {
    status_kib("RssAnon")
}

/// A guest that creates a name and removes it, again and again, and never sends FORGET: a node
/// whose file is gone and that nothing holds costs (next to) nothing. Its id answers ESTALE
/// until the guest forgets it. Before, each cycle kept some 700 bytes (200,000 cycles: +137 MiB).
#[test]
fn create_and_unlink_without_forget_keeps_memory_flat() {
    let _serial = serial();
    let mut d = Daemon::start();
    let cycle = |d: &mut Daemon| -> u64 {
        let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
        let (e, o) = d.c.create(ROOT_ID, "f", flags, 0o644, 0).unwrap();
        d.c.release(e.nodeid, o.fh, 0).unwrap();
        d.c.unlink(ROOT_ID, "f").unwrap();
        e.nodeid
    };
    for _ in 0..5_000 {
        cycle(&mut d);
    }
    let fds_before = open_fds();
    let rss_before = rss_anon_kib();
    let mut last = 0;
    for _ in 0..200_000 {
        last = cycle(&mut d);
    }
    let rss_after = rss_anon_kib();
    assert!(
        rss_after <= rss_before + 4 * 1024,
        "anonymous memory grew from {rss_before} KiB to {rss_after} KiB"
    );
    assert!(open_fds() <= fds_before + 8);
    assert_eq!(d.c.getattr(last, None).unwrap_err(), libc::ESTALE);
    d.c.forget(last, 1);
    assert_eq!(
        d.c.getattr(last, None).unwrap_err(),
        libc::EBADF,
        "forgotten"
    );

    // The other ways of making a name: each node is gone with its name.
    let e = d.c.mkdir(ROOT_ID, "dir", 0o755, 0).unwrap();
    d.c.rmdir(ROOT_ID, "dir").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, None).unwrap_err(), libc::ESTALE);
    let e = d.c.symlink(ROOT_ID, "link", "target").unwrap();
    d.c.unlink(ROOT_ID, "link").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, None).unwrap_err(), libc::ESTALE);
    let e =
        d.c.mknod(ROOT_ID, "fifo", libc::S_IFIFO | 0o644, 0, 0)
            .unwrap();
    d.c.unlink(ROOT_ID, "fifo").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, None).unwrap_err(), libc::ESTALE);
    // Replaced by a rename.
    let a = d.file("a", b"a");
    d.file("b", b"b");
    d.c.rename(ROOT_ID, "b", ROOT_ID, "a").unwrap();
    assert_eq!(d.c.getattr(a, None).unwrap_err(), libc::ESTALE);

    // Not while something can still serve it: an open handle, or another name.
    let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
    let (e, o) = d.c.create(ROOT_ID, "open", flags, 0o644, 0).unwrap();
    d.c.write(e.nodeid, o.fh, 0, b"still here").unwrap();
    d.c.unlink(ROOT_ID, "open").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, Some(o.fh)).unwrap().attr.size, 10);
    assert_eq!(d.c.read(e.nodeid, o.fh, 0, 10).unwrap(), b"still here");
    d.c.release(e.nodeid, o.fh, 0).unwrap();
    let l = d.file("l1", b"linked");
    std::fs::hard_link(d.host("l1"), d.host("l2")).unwrap();
    d.c.unlink(ROOT_ID, "l1").unwrap();
    assert_eq!(
        d.c.getattr(l, None).unwrap().attr.size,
        6,
        "reached by its other name"
    );
    d.finish();
}

/// `--max-nodes`: past it a new node is refused with ENFILE, never an unbounded table; what the
/// guest forgets or removes makes room again.
#[test]
fn max_nodes_bounds_the_nodes_a_guest_holds() {
    let mut d = Daemon::with(Options::default().max_nodes(16));
    let mut held = Vec::new();
    let refused = loop {
        let name = format!("f{}", held.len());
        std::fs::write(d.host(&name), b"x").unwrap();
        match d.c.lookup(ROOT_ID, &name) {
            Ok(e) => held.push((name, e.nodeid)),
            Err(e) => break e,
        }
        assert!(held.len() <= 16, "no limit");
    };
    assert_eq!(refused, libc::ENFILE);
    assert_eq!(held.len(), 15, "the root is one of the 16");
    let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
    assert_eq!(
        d.c.create(ROOT_ID, "new", flags, 0o644, 0).unwrap_err(),
        libc::ENFILE
    );
    assert!(!d.host("new").exists(), "nothing is made past the limit");
    assert_eq!(
        d.c.mkdir(ROOT_ID, "newdir", 0o755, 0).unwrap_err(),
        libc::ENFILE
    );
    assert!(!d.host("newdir").exists());
    // A listing goes on with names alone (node id 0) for what the table has no room for.
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    let plus = d.c.readdirplus(ROOT_ID, o.fh, 0, 64 * 1024).unwrap();
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    let names: Vec<_> = plus.iter().map(|p| p.dirent.name.clone()).collect();
    assert!(names.contains(&b"f15".to_vec()), "{names:?}");
    assert!(plus
        .iter()
        .any(|p| p.entry.nodeid == 0 && p.dirent.name.starts_with(b"f")));
    // Known nodes are still served; a forgotten one makes room.
    assert_eq!(d.c.getattr(held[0].1, None).unwrap().attr.size, 1);
    // (looked up, then listed: two references)
    d.c.forget(held[0].1, 2);
    let e = d.c.lookup(ROOT_ID, "f15").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, None).unwrap().attr.size, 1);
    // And so does a removed one.
    assert_eq!(d.c.lookup(ROOT_ID, "f16").unwrap_err(), libc::ENOENT);
    d.c.unlink(ROOT_ID, &held[1].0).unwrap();
    std::fs::write(d.host("f16"), b"x").unwrap();
    assert!(d.c.lookup(ROOT_ID, "f16").is_ok());
    d.finish();
}

/// A guest opening many handles on a large directory it has just changed (so that no two may
/// share one snapshot) and reading them all interleaved, with READDIR and READDIRPLUS: the
/// daemon's memory grows by at most its listing budget (plus slack), not by a copy per handle,
/// and every handle still lists every name exactly once with its type.
#[test]
fn many_opendirs_on_a_large_directory_read_interleaved_keep_memory_bounded() {
    let _serial = serial();
    const BUDGET: usize = 16 << 20;
    const HANDLES: usize = 64;
    let mut d = Daemon::with(Options::default().listing_memory(BUDGET));
    // 20,000 names of 60 bytes: a snapshot takes about 1.5 MB, 64 of them about 100 MB.
    const NAMES: usize = 20_000;
    let name = |i: usize| format!("{i:05}-{}", "n".repeat(54));
    let dtype = |i: usize| {
        u32::from(if i % 50 == 0 {
            libc::DT_DIR
        } else {
            libc::DT_REG
        })
    };
    for i in 0..NAMES {
        if i % 50 == 0 {
            std::fs::create_dir(d.host(name(i))).unwrap();
        } else {
            std::fs::write(d.host(name(i)), b"").unwrap();
        }
    }
    // Which name an entry is: its index, NAMES for `.` and NAMES + 1 for `..` (names are
    // checked as they come: the test itself must not hold 64 listings).
    let index_of = |n: &[u8], t: u32| -> usize {
        let i = match n {
            b"." => NAMES,
            b".." => NAMES + 1,
            _ => {
                let i: usize = std::str::from_utf8(&n[..5]).unwrap().parse().unwrap();
                assert_eq!(n, name(i).as_bytes());
                assert_eq!(t, dtype(i), "type of {i}");
                return i;
            }
        };
        assert_eq!(t, u32::from(libc::DT_DIR));
        i
    };

    // Warm up: one READDIRPLUS listing gives every name its node (kept: the table is not what
    // this test measures), and the allocator its working size.
    let fh = d.c.opendir(ROOT_ID, 0).unwrap().fh;
    let mut offset = 0;
    loop {
        let chunk = d.c.readdirplus(ROOT_ID, fh, offset, 4096).unwrap();
        let Some(last) = chunk.last() else { break };
        offset = last.dirent.off;
    }
    d.c.releasedir(ROOT_ID, fh, 0).unwrap();
    let rss_before = rss_kib();

    struct Listing {
        fh: u64,
        offset: u64,
        seen: Vec<bool>,
        done: bool,
    }
    // Touch the directory so that its listings cannot be shared.
    std::fs::write(d.host("touch"), b"").unwrap();
    std::fs::remove_file(d.host("touch")).unwrap();
    let mut lists: Vec<Listing> = (0..HANDLES)
        .map(|_| Listing {
            fh: d.c.opendir(ROOT_ID, 0).unwrap().fh,
            offset: 0,
            seen: vec![false; NAMES + 2],
            done: false,
        })
        .collect();
    let mut rss_max = rss_before;
    let mut round = 0;
    while lists.iter().any(|l| !l.done) {
        for (i, l) in lists.iter_mut().enumerate().filter(|(_, l)| !l.done) {
            let got: Vec<(Vec<u8>, u32, u64)> = if i % 8 == 0 {
                let chunk = d.c.readdirplus(ROOT_ID, l.fh, l.offset, 4096).unwrap();
                for e in &chunk {
                    if e.entry.nodeid != 0 {
                        d.c.forget(e.entry.nodeid, 1);
                    }
                }
                chunk
                    .into_iter()
                    .map(|e| (e.dirent.name, e.dirent.typ, e.dirent.off))
                    .collect()
            } else {
                d.c.readdir(ROOT_ID, l.fh, l.offset, 4096)
                    .unwrap()
                    .into_iter()
                    .map(|e| (e.name, e.typ, e.off))
                    .collect()
            };
            match got.last() {
                Some(last) => l.offset = last.2,
                None => l.done = true,
            }
            for (n, t, _) in got {
                let at = index_of(&n, t);
                assert!(!l.seen[at], "handle {i}: {} listed twice", n.escape_ascii());
                l.seen[at] = true;
            }
        }
        if round % 16 == 0 {
            rss_max = rss_max.max(rss_kib());
        }
        round += 1;
    }
    rss_max = rss_max.max(rss_kib());
    for (i, l) in lists.iter().enumerate() {
        let missing = l.seen.iter().filter(|s| !**s).count();
        assert_eq!(missing, 0, "handle {i}: names not listed");
    }
    let grown = rss_max.saturating_sub(rss_before);
    assert!(
        grown <= (BUDGET as u64 >> 10) + 24 * 1024,
        "resident memory grew by {grown} KiB with {HANDLES} listings open (budget {} KiB)",
        BUDGET >> 10
    );
    for l in &lists {
        d.c.releasedir(ROOT_ID, l.fh, 0).unwrap();
    }
    d.finish();
}

// ---- the canary next to the share -------------------------------------------------------------

/// Everything about one path under `outside/` and next to the share, atime included, read
/// without touching atime (`O_NOATIME`).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    mode: u32,
    nlink: u64,
    uid: u32,
    size: u64,
    atime: (i64, i64),
    mtime: (i64, i64),
    ctime: (i64, i64),
    data: Vec<u8>,
}

/// The canary: `outside/secret`, `outside/dir/inner` and the base directory's listing.
struct Canary {
    base: PathBuf,
    before: BTreeMap<PathBuf, Seen>,
}

fn no_atime_read(p: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .read_to_end(&mut v)
        .unwrap();
    v
}

fn no_atime_list(p: &Path) -> Vec<u8> {
    // getdents on a descriptor opened with O_NOATIME does not touch the directory's atime (a
    // reopen through /proc/self/fd would).
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOATIME | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "open {}", p.display());
    // SAFETY: `fd` is an open directory descriptor we own; fdopendir takes it over.
    let dir = unsafe { libc::fdopendir(fd) };
    assert!(!dir.is_null());
    let mut names = Vec::new();
    loop {
        // SAFETY: `dir` is a valid directory stream until closedir below.
        let e = unsafe { libc::readdir64(dir) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir64 returned a valid entry whose d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        names.push(name.to_bytes().to_vec());
    }
    // SAFETY: `dir` came from fdopendir and is closed once.
    unsafe { libc::closedir(dir) };
    names.sort();
    names.join(&b'/')
}

/// Sets the atime of `p` (not following symlinks) an hour before its mtime.
fn age_atime(p: &Path) {
    let m = fs::symlink_metadata(p).unwrap();
    let t = [
        libc::timespec {
            tv_sec: m.mtime() - 3600,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated and `t` holds two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

impl Canary {
    /// Adds `outside/dir/inner`, ages every atime under `outside/` and records the state.
    fn plant(d: &Daemon) -> Canary {
        fs::create_dir(d.outside.join("dir")).unwrap();
        fs::write(d.outside.join("dir/inner"), SECRET).unwrap();
        host_setxattr(&d.outside.join("secret"), b"user.canary", b"outside");
        for p in ["secret", "dir/inner", "dir", ""] {
            age_atime(&d.outside.join(p));
        }
        let base = d.share.parent().unwrap().to_path_buf();
        let c = Canary {
            before: Self::look(&base),
            base,
        };
        // This host's atime policy: reading through a plain open moves an aged atime unless the
        // filesystem is mounted `noatime`, in which case the atime comparison proves nothing
        // but stays harmless.
        c
    }

    fn look(base: &Path) -> BTreeMap<PathBuf, Seen> {
        let mut m = BTreeMap::new();
        for rel in [
            "outside",
            "outside/secret",
            "outside/dir",
            "outside/dir/inner",
        ] {
            let p = base.join(rel);
            let md = fs::symlink_metadata(&p).unwrap();
            let data = if md.is_dir() {
                no_atime_list(&p)
            } else {
                no_atime_read(&p)
            };
            m.insert(
                PathBuf::from(rel),
                Seen {
                    mode: md.mode(),
                    nlink: md.nlink(),
                    uid: md.uid(),
                    size: md.size(),
                    atime: (md.atime(), md.atime_nsec()),
                    mtime: (md.mtime(), md.mtime_nsec()),
                    ctime: (md.ctime(), md.ctime_nsec()),
                    data,
                },
            );
        }
        // Nothing new next to the share.
        m.insert(
            PathBuf::from("."),
            Seen {
                mode: 0,
                nlink: 0,
                uid: 0,
                size: 0,
                atime: (0, 0),
                mtime: (0, 0),
                ctime: (0, 0),
                data: no_atime_list(base),
            },
        );
        m
    }

    /// Panics if anything outside the share changed or was read.
    fn assert_untouched(&self, what: &str) {
        let now = Self::look(&self.base);
        for (p, b) in &self.before {
            assert_eq!(
                Some(b),
                now.get(p),
                "{} changed or was read by {what}",
                p.display()
            );
        }
        assert_eq!(
            host_getxattr(&self.base.join("outside/secret"), b"user.canary").as_deref(),
            Some(&b"outside"[..]),
            "{what}"
        );
    }
}

/// The daemon still answers LOOKUP and GETATTR on queue 0, and the canary is untouched.
fn assert_serves(d: &mut Daemon, canary: &Canary, what: &str) {
    fs::write(d.host("alive"), b"alive").unwrap();
    let e =
        d.c.lookup(ROOT_ID, "alive")
            .unwrap_or_else(|e| panic!("LOOKUP after {what}: errno {e}"));
    assert_eq!(e.attr.ino, fs::metadata(d.host("alive")).unwrap().ino());
    let a =
        d.c.getattr(e.nodeid, None)
            .unwrap_or_else(|e| panic!("GETATTR after {what}: errno {e}"));
    assert_eq!(a.attr.size, 5);
    d.c.forget(e.nodeid, 1);
    assert_eq!(d.c.in_flight(), 0);
    canary.assert_untouched(what);
}

fn hostile_daemon(opts: Options) -> (Daemon, Canary) {
    let d = Daemon::with(opts.timeout(Duration::from_secs(5)));
    let c = Canary::plant(&d);
    (d, c)
}

/// Reading the canary the plain way does move its atime here (or the host is `noatime`).
#[test]
fn the_canary_notices_a_read() {
    let _serial = serial();
    let (d, c) = hostile_daemon(Options::default());
    c.assert_untouched("nothing");
    let _ = fs::read(d.outside.join("secret")).unwrap();
    let after = Canary::look(&c.base);
    let noatime = fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.contains(" noatime"));
    if !noatime {
        assert_ne!(
            c.before[Path::new("outside/secret")].atime,
            after[Path::new("outside/secret")].atime,
            "a plain read did not move the aged atime: the canary cannot see reads"
        );
    }
    d.finish();
}

// ---- `..` and symlinks -------------------------------------------------------------------------

#[test]
fn dotdot_chains_stop_at_the_root() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default());
    fs::create_dir_all(d.host("a/b/c")).unwrap();
    let share_ino = fs::metadata(&d.share).unwrap().ino();
    let a = d.c.lookup(ROOT_ID, "a").unwrap().nodeid;
    let b = d.c.lookup(a, "b").unwrap().nodeid;
    let mut n = d.c.lookup(b, "c").unwrap().nodeid;
    // Ten `..` from three levels down: a, then the root, then the root again and again.
    let mut inos = Vec::new();
    for _ in 0..10 {
        let e = d.c.lookup(n, "..").unwrap();
        inos.push(e.attr.ino);
        n = e.nodeid;
    }
    assert_eq!(inos[2], share_ino);
    assert!(inos[2..].iter().all(|&i| i == share_ino), "{inos:?}");
    assert_eq!(n, ROOT_ID);
    // From there, nothing of the parent directory is visible.
    for name in ["outside", "share", "secret"] {
        assert_eq!(d.c.lookup(n, name).unwrap_err(), libc::ENOENT, "{name}");
    }
    let fh = d.c.opendir(n, 0).unwrap().fh;
    let names: Vec<Vec<u8>> =
        d.c.readdir(n, fh, 0, 4096)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
    assert!(!names.iter().any(|x| x == b"outside"), "{names:?}");
    d.c.releasedir(n, fh, 0).unwrap();
    // Creating `..`-relative names from the reached node stays refused.
    assert!(d.c.mkdir(n, "..", 0o755, 0).is_err());
    assert_serves(&mut d, &canary, "`..` chains");
    d.finish();
}

/// Symlinks pointing out of the share (made on the host and by the guest) are only ever read
/// as links: lookups through them, opens, attribute and xattr changes never reach the target.
#[test]
fn symlinks_out_of_the_share_are_never_followed() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default().xattr());
    let links = [
        ("toroot", "/".to_string()),
        ("up", "../..".to_string()),
        ("out", "../outside".to_string()),
        ("secretlink", "../outside/secret".to_string()),
        (
            "abs",
            d.outside.join("secret").to_string_lossy().into_owned(),
        ),
    ];
    for (name, target) in &links {
        std::os::unix::fs::symlink(target, d.host(name)).unwrap();
    }
    // The same made by the guest.
    for (name, target) in &links {
        let g = format!("g{name}");
        d.c.symlink(ROOT_ID, &g, target).unwrap();
        assert_eq!(
            fs::read_link(d.host(&g)).unwrap().to_string_lossy(),
            target.as_str()
        );
    }
    let names: Vec<String> = links
        .iter()
        .flat_map(|(n, _)| [n.to_string(), format!("g{n}")])
        .collect();
    let rw = libc::O_RDWR as u32;
    for name in &names {
        let e = d.c.lookup(ROOT_ID, name).unwrap();
        assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFLNK, "{name}");
        let n = e.nodeid;
        for inner in ["etc", "secret", "outside", "share", "dir", ".."] {
            assert!(
                d.c.lookup(n, inner).is_err(),
                "lookup {inner} through {name} succeeded"
            );
        }
        for flags in [
            libc::O_RDONLY as u32,
            rw,
            (libc::O_WRONLY | libc::O_TRUNC) as u32,
            (libc::O_RDONLY | libc::O_NOFOLLOW) as u32,
        ] {
            assert!(d.c.open(n, flags).is_err(), "open {name} {flags:#o}");
        }
        assert!(d.c.opendir(n, 0).is_err(), "opendir {name}");
        assert!(
            d.c.create(n, "new", (libc::O_CREAT | libc::O_RDWR) as u32, 0o644, 0)
                .is_err(),
            "create under {name}"
        );
        assert!(d.c.mkdir(n, "new", 0o755, 0).is_err(), "mkdir under {name}");
        assert!(d.c.unlink(n, "secret").is_err(), "unlink under {name}");
        assert!(d.c.symlink(n, "new", "/").is_err(), "symlink under {name}");
        // Attribute changes on the link: a mode, a size, times, an owner. Whatever the answer,
        // the target keeps its own (checked by the canary).
        let mut s = setattr_in(abi::fattr::MODE);
        s.mode = 0o777;
        let _ = d.c.setattr(n, &s);
        let mut s = setattr_in(abi::fattr::SIZE);
        s.size = 0;
        let _ = d.c.setattr(n, &s);
        let mut s = setattr_in(abi::fattr::ATIME | abi::fattr::MTIME);
        s.atime = 1;
        s.mtime = 1;
        let _ = d.c.setattr(n, &s);
        let mut s = setattr_in(abi::fattr::UID | abi::fattr::GID);
        s.uid = 4242;
        s.gid = 4242;
        let _ = d.c.setattr(n, &s);
        let _ = d.c.setxattr(n, "user.evil", b"x", 0);
        let _ = d.c.removexattr(n, "user.canary");
        match d.c.getxattr(n, "user.canary", 4096) {
            Err(_) => {}
            Ok(v) => panic!("getxattr through {name} read the target's attribute: {v:?}"),
        }
        // A hard link to the link is a link to the link, never to the target.
        let h = format!("hard-{name}");
        if d.c.link(n, ROOT_ID, &h).is_ok() {
            assert!(fs::symlink_metadata(d.host(&h)).unwrap().is_symlink());
        }
        assert!(
            d.c.readlink(n).is_ok(),
            "readlink {name} (the guest resolves it)"
        );
        canary.assert_untouched(name);
    }
    assert_serves(&mut d, &canary, "symlinks pointing out of the share");
    d.finish();
}

// ---- names ------------------------------------------------------------------------------------

/// Names with a NUL inside: the name ends at the first NUL (as the kernel sends it), so the
/// rest, whatever it says, is never a path.
#[test]
fn names_with_a_nul_inside_never_reach_outside() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default());
    fs::write(d.host("probe"), b"probe").unwrap();
    let mk = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let cr = abi::CreateIn {
        flags: (libc::O_CREAT | libc::O_RDWR) as u32,
        mode: 0o644,
        umask: 0,
        open_flags: 0,
    };
    let bodies: Vec<(u32, Vec<Vec<u8>>)> = vec![
        (
            opcode::LOOKUP,
            vec![b"probe\0/../../outside/secret\0".to_vec()],
        ),
        (opcode::LOOKUP, vec![b"\0../outside\0".to_vec()]),
        (
            opcode::MKDIR,
            vec![mk.as_bytes().to_vec(), b"x\0../outside/made\0".to_vec()],
        ),
        (
            opcode::CREATE,
            vec![cr.as_bytes().to_vec(), b"y\0/../../outside/new\0".to_vec()],
        ),
        (opcode::SYMLINK, vec![b"l\0/\0../outside\0".to_vec()]),
        (opcode::UNLINK, vec![b"\0../outside/secret\0".to_vec()]),
        (opcode::RMDIR, vec![b"\0../outside/dir\0".to_vec()]),
        (
            opcode::RENAME,
            vec![
                abi::RenameIn { newdir: ROOT_ID }.as_bytes().to_vec(),
                b"probe\0../outside/x\0".to_vec(),
            ],
        ),
    ];
    for (op, body) in &bodies {
        let args: Vec<&[u8]> = body.iter().map(|v| &v[..]).collect();
        let r = d.c.request(*op, ROOT_ID, &args, 4096).unwrap();
        if r.error == 0 && *op == opcode::LOOKUP {
            let e = abi::EntryOut::from_prefix(&r.body).unwrap();
            assert_eq!(e.attr.ino, fs::metadata(d.host("probe")).unwrap().ino());
        }
        canary.assert_untouched(abi_name(*op));
    }
    // Whatever was made is in the share, under the name before the NUL.
    for e in fs::read_dir(&d.share).unwrap() {
        let n = e.unwrap().file_name();
        assert!(!n.as_bytes().contains(&b'/'), "{n:?}");
    }
    assert_serves(&mut d, &canary, "names with a NUL inside");
    d.finish();
}

fn abi_name(op: u32) -> &'static str {
    virtiofsd_frontend::fuse_client::opcode_name(op)
}

// ---- sizes -------------------------------------------------------------------------------------

#[test]
fn xattr_and_listing_sizes_near_u32_max() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default().xattr());
    fs::write(d.host("probe"), b"probe").unwrap();
    host_setxattr(&d.host("probe"), b"user.a", b"value");
    let n = d.node("probe");
    for size in [u32::MAX, u32::MAX - 15, 1 << 31] {
        // The reply buffer is small: the answer fits it or is ERANGE, never an overrun.
        let g = abi::GetxattrIn { size, padding: 0 };
        let r =
            d.c.request(opcode::GETXATTR, n, &[g.as_bytes(), &cstr(b"user.a")], 64)
                .unwrap();
        match r.into_result() {
            Ok(v) => assert_eq!(v, b"value"),
            Err(e) => assert_eq!(e, libc::ERANGE),
        }
        let r =
            d.c.request(opcode::LISTXATTR, n, &[g.as_bytes()], 64)
                .unwrap();
        if let Ok(v) = r.into_result() {
            assert!(v.len() <= 48);
        }
        let fh = d.c.opendir(ROOT_ID, 0).unwrap().fh;
        let ri = abi::ReadIn {
            fh,
            size,
            ..Default::default()
        };
        let r =
            d.c.request(opcode::READDIRPLUS, ROOT_ID, &[ri.as_bytes()], 512)
                .unwrap();
        assert!(r.into_result().unwrap().len() <= 512 - 16);
        d.c.releasedir(ROOT_ID, fh, 0).unwrap();
    }
    // SETXATTR whose value is as long as it claims, but huge: refused, not stored.
    let value = vec![b'v'; 70 * 1024];
    assert!(d.c.setxattr(n, "user.big", &value, 0).is_err());
    assert_eq!(host_getxattr(&d.host("probe"), b"user.big"), None);
    assert_serves(&mut d, &canary, "xattr and listing sizes near u32::MAX");
    d.finish();
}

// ---- descriptors -------------------------------------------------------------------------------

fn put(d: &Daemon, bytes: &[u8]) -> u64 {
    let a = d.c.alloc_buffer(bytes.len().max(1) as u64).unwrap();
    d.c.memory().write(a, bytes).unwrap();
    a
}

fn room(d: &Daemon, len: usize) -> u64 {
    let a = d.c.alloc_buffer(len as u64).unwrap();
    d.c.memory().fill(a, len, 0xa5).unwrap();
    a
}

fn mkdir_req(d: &Daemon, name: &str) -> Vec<u8> {
    let arg = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    build_request(
        d.c.next_unique(),
        opcode::MKDIR,
        ROOT_ID,
        d.c.ctx(),
        &[arg.as_bytes(), &cstr(name.as_bytes())],
    )
}

fn unique_of(req: &[u8]) -> u64 {
    abi::InHeader::from_prefix(req).unwrap().unique
}

fn untouched(d: &Daemon, addr: u64, len: usize) -> bool {
    d.c.memory()
        .read_vec(addr, len)
        .unwrap()
        .iter()
        .all(|&b| b == 0xa5)
}

/// Loops inside an indirect table (a descriptor pointing at itself, two pointing at each other,
/// the last pointing back at the first) end the chain after at most the table's length of
/// descriptors: a request without a reply buffer never runs, and a loop after a complete
/// request and reply buffer gets at most a correct reply.
#[test]
fn descriptor_loops_inside_an_indirect_table() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default());
    let req = mkdir_req(&d, "made");
    let ra = put(&d, &req);
    let len = req.len() as u32;
    let wa = room(&d, 256);
    let mut self_loop = RawDesc::chain(&[Buffer::readable(ra, len)]);
    self_loop[0].flags |= virtiofsd_frontend::virtqueue::VIRTQ_DESC_F_NEXT;
    self_loop[0].next = Next::Slot(0);
    let mut two = RawDesc::chain(&[
        Buffer::readable(ra, 40),
        Buffer::readable(ra + 40, len - 40),
    ]);
    two[1].flags |= virtiofsd_frontend::virtqueue::VIRTQ_DESC_F_NEXT;
    two[1].next = Next::Slot(0);
    let mut back = RawDesc::chain(&[Buffer::readable(ra, len), Buffer::writable(wa, 256)]);
    back[1].flags |= virtiofsd_frontend::virtqueue::VIRTQ_DESC_F_NEXT;
    back[1].next = Next::Slot(0);
    for (what, t) in [("self", self_loop), ("pair", two)] {
        let tk =
            d.c.submit_raw_indirect(VIRTQ_DESC_F_INDIRECT, &t, None)
                .unwrap();
        let used = d.c.wait_completion(tk).unwrap().used_len;
        assert_eq!(used, 0, "{what}");
        assert!(untouched(&d, wa, 256), "{what}: reply written");
        assert!(!d.host("made").exists(), "{what}: the request ran");
    }
    let tk =
        d.c.submit_raw_indirect(VIRTQ_DESC_F_INDIRECT, &back, None)
            .unwrap();
    let used = d.c.wait_completion(tk).unwrap().used_len;
    if used != 0 {
        let data = d.c.memory().read_vec(wa, used as usize).unwrap();
        let r = virtiofsd_frontend::fuse_client::parse_reply(&data, Some(unique_of(&req)), 0)
            .expect("a well-formed reply");
        assert_eq!(r.error, 0);
        assert!(d.host("made").is_dir());
    }
    assert_serves(&mut d, &canary, "indirect descriptor loops");
    d.finish();
}

/// Request bytes offered only in device-writable descriptors are no request; a reply offered
/// only read-only space is never written there.
#[test]
fn request_data_in_writable_descriptors_and_replies_in_readable_ones() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default());
    let req = mkdir_req(&d, "made");
    let ra = put(&d, &req);
    let wa = room(&d, 256);
    // Only writable descriptors: the first holds a complete MKDIR.
    let descs = RawDesc::chain(&[
        Buffer::writable(ra, req.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    let tk = d.c.submit_raw_chain(&descs).unwrap();
    assert_eq!(d.c.wait_completion(tk).unwrap().used_len, 0);
    assert!(
        !d.host("made").exists(),
        "a request in a writable descriptor ran"
    );
    // Readable request, then only readable space for the reply: nothing is written there.
    for req in [
        build_request(
            d.c.next_unique(),
            opcode::LOOKUP,
            ROOT_ID,
            d.c.ctx(),
            &[&cstr(b"alive")],
        ),
        build_request(d.c.next_unique(), opcode::STATFS, ROOT_ID, d.c.ctx(), &[]),
    ] {
        let ra = put(&d, &req);
        let descs = RawDesc::chain(&[
            Buffer::readable(ra, req.len() as u32),
            Buffer::readable(wa, 256),
        ]);
        let tk = d.c.submit_raw_chain(&descs).unwrap();
        assert_eq!(d.c.wait_completion(tk).unwrap().used_len, 0);
        assert!(
            untouched(&d, wa, 256),
            "reply written into a readable descriptor"
        );
    }
    assert_serves(&mut d, &canary, "descriptors of the wrong direction");
    d.finish();
}

// ---- session ----------------------------------------------------------------------------------

/// After DESTROY every request but INIT gets EIO (and FORGET nothing); a new INIT starts a new
/// session that serves again, with none of the old node ids or handles.
#[test]
fn requests_after_destroy_get_eio_until_a_new_init() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default());
    fs::write(d.host("probe"), b"probe").unwrap();
    let n = d.node("probe");
    let fh = d.open(n, libc::O_RDWR);
    d.c.destroy().unwrap();
    assert_eq!(d.c.lookup(ROOT_ID, "probe").unwrap_err(), libc::EIO);
    assert_eq!(d.c.getattr(ROOT_ID, None).unwrap_err(), libc::EIO);
    assert_eq!(d.c.read(n, fh, 0, 10).unwrap_err(), libc::EIO);
    assert_eq!(d.c.write(n, fh, 0, b"after").unwrap_err(), libc::EIO);
    assert_eq!(d.c.mkdir(ROOT_ID, "made", 0o755, 0).unwrap_err(), libc::EIO);
    d.c.forget(n, 1);
    d.c.batch_forget(&[(n, 1), (ROOT_ID, 1)]);
    // A second DESTROY is refused like any other request of a dead session.
    assert!(d.c.destroy().is_err());
    assert!(!d.host("made").exists());
    assert_eq!(fs::read(d.host("probe")).unwrap(), b"probe");
    d.c.init().unwrap();
    // The old handle is gone with the old session.
    assert!(d.c.read(n, fh, 0, 10).is_err() || d.c.getattr(n, None).is_err());
    assert_serves(&mut d, &canary, "requests after DESTROY");
    d.finish();
}

/// FORGET and BATCH_FORGET of node ids never handed out, of the root, and with counts far
/// beyond what the guest holds: ignored or clamped, never a panic; the root stays.
#[test]
fn forgets_of_unknown_nodes_and_huge_counts() {
    let _serial = serial();
    let (mut d, canary) = hostile_daemon(Options::default());
    fs::write(d.host("probe"), b"probe").unwrap();
    for id in [0, 2, 3, 12345, 1 << 40, u64::MAX - 1, u64::MAX] {
        d.c.forget(id, 1);
        d.c.forget(id, u64::MAX);
    }
    d.c.forget(ROOT_ID, u64::MAX);
    let n = d.node("probe");
    // One reference held; forgetting u64::MAX of it drops it once, not below zero.
    d.c.forget(n, u64::MAX);
    d.c.forget(n, u64::MAX);
    let many: Vec<(u64, u64)> = (0..1000u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15), u64::MAX - i))
        .chain(std::iter::repeat_n((ROOT_ID, u64::MAX), 100))
        .collect();
    for chunk in many.chunks(200) {
        d.c.batch_forget(chunk);
    }
    // The same node forgotten a hundred times in one batch after one lookup.
    let n = d.node("probe");
    d.c.batch_forget(&vec![(n, 1); 100]);
    assert_eq!(
        d.c.getattr(ROOT_ID, None).unwrap().attr.ino,
        fs::metadata(&d.share).unwrap().ino()
    );
    assert_serves(&mut d, &canary, "forgets of unknown nodes and huge counts");
    d.finish();
}

// ---- descriptor exhaustion --------------------------------------------------------------------

/// The real binary with `--rlimit-nofile=128`: the guest opens files until the daemon runs out of
/// descriptors and gets EMFILE (or ENFILE) for it; once it closes some, opens work again, the
/// daemon kept serving throughout, and it exits 0 without a panic when the frontend goes.
#[test]
fn descriptor_exhaustion_gets_emfile_and_the_daemon_recovers() {
    let _serial = serial();
    use std::process::{Command, Stdio};
    use virtiofsd_frontend::FsFrontend;

    clear_umask();
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    for i in 0..200 {
        fs::write(share.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    let socket = tmp.path().join("vfs.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", share.display()))
        .args(["--rlimit-nofile=128", "--log-level=error"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(std::time::Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut fe = FsFrontend::connect(&socket, 1).expect("connect");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();

    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..200 {
        let e = match c.lookup(ROOT_ID, format!("f{i}")) {
            Ok(e) => e,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        match c.open(e.nodeid, libc::O_RDONLY as u32) {
            Ok(o) => held.push((i, e.nodeid, o.fh)),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let errno = refused.expect("200 opens under a limit of 128 descriptors all succeeded");
    assert!(
        matches!(errno, libc::EMFILE | libc::ENFILE),
        "out of descriptors: errno {errno}"
    );
    assert!(held.len() < 128 && !held.is_empty(), "{} opens", held.len());
    // While exhausted, requests that need no new descriptor still work.
    let (i, n, fh) = held[0];
    assert_eq!(
        c.read(n, fh, 0, 64).unwrap(),
        format!("file {i}").as_bytes()
    );
    assert!(c.getattr(ROOT_ID, None).is_ok());

    // Give half back: new opens (and a directory listing) work again.
    let give_back = held.len() / 2;
    for (_, n, fh) in held.drain(..give_back) {
        c.release(n, fh, 0).unwrap();
    }
    for i in 190..195 {
        let e = c.lookup(ROOT_ID, format!("f{i}")).unwrap();
        let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
        assert_eq!(
            c.read(e.nodeid, fh, 0, 64).unwrap(),
            format!("file {i}").as_bytes()
        );
        c.release(e.nodeid, fh, 0).unwrap();
    }
    let dh = c.opendir(ROOT_ID, 0).unwrap().fh;
    assert!(!c.readdir(ROOT_ID, dh, 0, 4096).unwrap().is_empty());
    c.releasedir(ROOT_ID, dh, 0).unwrap();
    for (_, n, fh) in held {
        c.release(n, fh, 0).unwrap();
    }

    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `--cache=always`: every directory the guest looks up keeps a descriptor (the guest may hold
/// it open without OPENDIR), until FORGET. A guest that looks up more directories than the
/// open-files limit allows still gets them, without a descriptor past the limit, the daemon
/// goes on serving, and forgetting them gives the descriptors back.
#[test]
fn directories_held_in_no_opendir_mode_past_the_descriptor_limit_are_still_served() {
    let _serial = serial();
    use std::process::{Command, Stdio};
    use virtiofsd_frontend::FsFrontend;

    clear_umask();
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    for i in 0..200 {
        fs::create_dir(share.join(format!("d{i}"))).unwrap();
    }
    fs::write(share.join("f"), b"file").unwrap();
    let socket = tmp.path().join("vfs.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_virtiofsd"));
    cmd.arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", share.display()))
        // No-opendir mode: `--cache=always` with the guest's locks kept in the guest (with
        // locks on, OPENDIR and RELEASEDIR are served, for the guest's `flock` of a directory).
        .args(["--cache=always", "--posix-lock=off", "--flock=off"])
        .args(["--rlimit-nofile=128", "--log-level=error"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(tmp.path().join("stderr")).unwrap());
    // The daemons other tests run in this process meanwhile have descriptors without
    // close-on-exec (the frontend's eventfds): the child must not inherit them, or they take
    // its 128 before it starts.
    // SAFETY: runs in the child between fork and exec; close_range is one async-signal-safe
    // system call, marking every descriptor from 3 on close-on-exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("start virtiofsd");
    let stderr = || fs::read_to_string(tmp.path().join("stderr")).unwrap_or_default();
    let mut fe = FsFrontend::connect(&socket, 1)
        .unwrap_or_else(|e| panic!("connect: {e}; daemon stderr: {}", stderr()));
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let pid = serving_child(&child);
    let fds = || fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    // Queues, their eventfds and threads take most of the 128 already.
    let idle = fds();

    let held: Vec<u64> = (0..200)
        .map(|i| {
            c.lookup(ROOT_ID, format!("d{i}"))
                .unwrap_or_else(|e| panic!("lookup of d{i}: errno {e}"))
                .nodeid
        })
        .collect();
    for &n in &held {
        assert_eq!(c.getattr(n, None).unwrap().attr.nlink, 2);
    }
    let at_limit = fds();
    assert!(
        at_limit >= 120 && at_limit > idle + 10,
        "{at_limit} descriptors for 200 directories held, {idle} before"
    );
    let f = c.lookup(ROOT_ID, "f").unwrap().nodeid;
    for n in held {
        c.forget(n, 1);
    }
    // FORGET is answered by nothing: a request after it is served after it.
    c.getattr(ROOT_ID, None).unwrap();
    let after = fds();
    assert!(
        after <= idle + 1,
        "{after} descriptors once forgotten, {idle} before"
    );
    // The descriptors are back: a file is read, and a directory looked up now keeps one
    // (it is still served once the host renamed another over it).
    assert_eq!(c.read(f, 0, 0, 64).unwrap(), b"file");
    let d0 = c.lookup(ROOT_ID, "d0").unwrap().nodeid;
    fs::rename(share.join("d1"), share.join("d0")).unwrap();
    assert_eq!(c.getattr(d0, None).unwrap().attr.nlink, 0);

    fe.disconnect();
    let (status, _) = wait_exit(child);
    let err = stderr();
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `RssAnon` of process `pid`, in KiB.
fn rss_anon_of(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The daemon as a process of its own (its memory measured alone) serving `share` on `socket`,
/// without a sandbox and quiet.
fn quiet_daemon(share: &std::path::Path, socket: &std::path::Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .args(["--sandbox=none", "--log-level=error"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// A guest that walks 60,000 files and then forgets them all gets the daemon's memory for them
/// back: the node tables give their room back and the allocator's free pages go back to the
/// system. 120,000 nodes: 61 MiB held and 61 MiB kept at first; 61 and 7.8 once the tables
/// shrank; 25 and 1.0 (idle: 0.6) since a node is one block with its name inside; 60,000
/// nodes: 8.6 MiB and 0.56 (idle 0.53) since nodes live in slots of their own.
/// `NODES=N` walks N files instead.
#[test]
fn memory_held_for_forgotten_nodes_goes_back_to_the_system() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    fs::create_dir(&share).unwrap();
    let files: usize = std::env::var("NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000);
    for d in 0..60 {
        let sub = share.join(format!("d{d:02}"));
        fs::create_dir(&sub).unwrap();
        for f in 0..files / 60 {
            fs::File::create(sub.join(format!("f{f:04}"))).unwrap();
        }
    }
    let socket = dir.path().join("vfs.sock");
    let mut child = quiet_daemon(&share, &socket);
    let mut fe = virtiofsd_frontend::FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let pid = child.id();
    let idle = rss_anon_of(pid);
    let mut held = Vec::with_capacity(files + 60);
    // What the first half costs, with the daemon's fixed costs of serving (its threads' stacks,
    // the tables' first steps), and what the second half adds: nodes alone.
    let mut half = (0, 0);
    for d in 0..60 {
        if d == 30 {
            half = (held.len(), rss_anon_of(pid));
        }
        let sub = c.lookup(ROOT_ID, format!("d{d:02}")).unwrap().nodeid;
        held.push(sub);
        for f in 0..files / 60 {
            held.push(c.lookup(sub, format!("f{f:04}")).unwrap().nodeid);
        }
    }
    let peak = rss_anon_of(pid);
    let forgets: Vec<(u64, u64)> = held.iter().map(|&id| (id, 1)).collect();
    for chunk in forgets.chunks(500) {
        c.batch_forget(chunk);
    }
    c.getattr(ROOT_ID, None).unwrap();
    let after = rss_anon_of(pid);
    eprintln!(
        "RssAnon: idle {idle} KiB, holding {files} nodes {peak} KiB, after FORGET {after} KiB"
    );
    assert!(
        peak > idle + 5 * 1024,
        "the walk held little: {idle} -> {peak} KiB"
    );
    // Bytes per node held: the node's slot and its two index entries (4 bytes each and a
    // control byte, at hashbrown's load): about 126 for the second half, 135 in all when the
    // daemon runs alone; the threads' stacks add some when other tests keep the machine busy.
    // 467 before the node was packed; 230 while it was a block of the allocator's; the
    // issue's target is 150.
    let added = (peak - half.1) * 1024 / (held.len() - half.0) as u64;
    let per_node = (peak - idle) * 1024 / held.len() as u64;
    eprintln!("bytes per node: {per_node} in all, {added} for the second half");
    assert!(
        added <= 150 && per_node <= 180,
        "{added} bytes per node added by the second half, {per_node} in all ({idle} -> {} -> \
         {peak} KiB for {} nodes)",
        half.1,
        held.len()
    );
    // After FORGET the daemon is back within a tenth of what it held idle: the chunks of the
    // nodes are unmapped, the pages of the chunk the root keeps go back, the tables shrink,
    // and the allocator (one arena) gives its free pages back.
    assert!(
        after.saturating_sub(idle) <= idle / 10,
        "{after} KiB kept after FORGET of every node (idle {idle} KiB, peak {peak} KiB)"
    );
    fe.disconnect();
    assert!(child.wait().unwrap().success());
}

/// What the default `--max-nodes` assumes a node costs at most (a tenth of
/// `MEMORY_PER_NODE`), against the worst node a guest can make: a file it just created (a
/// node born within the last second keeps its file handle to tell it from a later file with
/// the same inode number) with a name of 255 bytes (kept on the heap). 533 bytes each were
/// measured, past the 205 the old default (2 KiB a node) allowed: a daemon at its default limit
/// could hold a quarter of the host's memory. `NODES=N` makes N files instead.
#[test]
fn the_default_max_nodes_holds_the_worst_nodes_in_a_tenth_of_the_memory() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    fs::create_dir(&share).unwrap();
    let files: usize = std::env::var("NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let socket = dir.path().join("vfs.sock");
    let mut child = quiet_daemon(&share, &socket);
    let mut fe = virtiofsd_frontend::FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let pid = child.id();
    let name = |i: usize| {
        let mut n = format!("{i:08}-").into_bytes();
        n.resize(255, b'x');
        n
    };
    // The daemon's fixed costs of serving (its threads' stacks, the tables' first steps) come
    // with the first nodes: measured from the first tenth on.
    let mut start = 0;
    for i in 0..files {
        if i == files / 10 {
            start = rss_anon_of(pid);
        }
        c.mknod(ROOT_ID, name(i), libc::S_IFREG | 0o644, 0, 0)
            .unwrap_or_else(|e| panic!("MKNOD {i}: errno {e}"));
    }
    let end = rss_anon_of(pid);
    let per_node = (end - start) * 1024 / (files - files / 10) as u64;
    let allowed = virtiofsd::passthrough::config::MEMORY_PER_NODE / 10;
    eprintln!("bytes per node with 255-byte names, made by the guest: {per_node}");
    assert!(
        per_node <= allowed,
        "{per_node} bytes per node: the default --max-nodes allows a node per {} bytes of the \
         host's memory",
        virtiofsd::passthrough::config::MEMORY_PER_NODE
    );
    fe.disconnect();
    assert!(child.wait().unwrap().success());
}

/// Minor page faults of process `pid` so far (`/proc/PID/stat`, field 10).
fn minor_faults_of(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) start with the state (field 3).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(7).unwrap().parse().unwrap()
}

/// A guest that holds exactly enough nodes to fill the daemon's first chunk of node memory and
/// then, in turn, looks up a file (the first node of a new chunk), forgets a node of the first
/// chunk, forgets the new one (the second chunk is empty, the first has room) and looks the
/// first one up again, must not make each turn map a chunk and unmap it. A chunk mapped anew
/// shows as a page fault on its first page; one kept shows none. The holding count that hits
/// the boundary is found by trying a few around it (the daemon's first chunk holds some 1,259
/// nodes with the root).
#[test]
fn lookups_and_forgets_at_a_chunk_boundary_do_not_map_and_unmap_node_memory() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    fs::create_dir(&share).unwrap();
    const FILES: usize = 1275;
    for f in 0..FILES {
        fs::File::create(share.join(format!("f{f:04}"))).unwrap();
    }
    fs::File::create(share.join("b")).unwrap();
    let socket = dir.path().join("vfs.sock");
    let mut child = quiet_daemon(&share, &socket);
    let mut fe = virtiofsd_frontend::FsFrontend::connect(&socket, 1).unwrap();
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let pid = child.id();
    const START: usize = 1250;
    const TURNS: u64 = 400;
    let mut held: Vec<u64> = (0..START)
        .map(|f| c.lookup(ROOT_ID, format!("f{f:04}")).unwrap().nodeid)
        .collect();
    let mut worst = (0, 0);
    for f in START..FILES {
        let name = format!("f{f:04}");
        held.push(c.lookup(ROOT_ID, &name).unwrap().nodeid);
        let before = minor_faults_of(pid);
        for _ in 0..TURNS {
            let b = c.lookup(ROOT_ID, "b").unwrap().nodeid;
            c.forget(held[f], 1);
            c.forget(b, 1);
            held[f] = c.lookup(ROOT_ID, &name).unwrap().nodeid;
        }
        c.getattr(ROOT_ID, None).unwrap();
        let faults = minor_faults_of(pid) - before;
        if faults > worst.0 {
            worst = (faults, f + 1);
        }
    }
    eprintln!(
        "most minor faults in {TURNS} turns: {} (holding {} nodes)",
        worst.0, worst.1
    );
    assert!(
        worst.0 < TURNS / 4,
        "{} page faults in {TURNS} turns holding {} nodes: a chunk is mapped and unmapped \
         at each turn",
        worst.0,
        worst.1
    );
    fe.disconnect();
    assert!(child.wait().unwrap().success());
}
