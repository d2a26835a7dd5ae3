//! The seccomp filter (`--seccomp`) in the real binary: with the filter installed (`kill` by
//! default), every kind of request a guest makes is served, every thread of the daemon is
//! filtered, and the daemon still exits 0 when the frontend disconnects. The per-queue worker
//! threads start after the filter is installed: that they serve shows that thread creation
//! works under it (clone3 answered ENOSYS, then clone with the thread flags).

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use virtiofsd::fuse::abi::{self, fattr, ROOT_ID};
use virtiofsd_frontend::{FsFrontend, FuseClient};

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

fn spawn(d: &RunDirs, extra: &[&str]) -> Child {
    let child = Command::new(BIN)
        .arg(format!("--socket-path={}", d.socket.display()))
        .arg(format!("--shared-dir={}", d.share.display()))
        .arg("--log-level=info")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofsd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.socket.exists() {
        assert!(Instant::now() < deadline, "the daemon never listened");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// A field of `/proc/<pid>/task/<tid>/status` (or `/proc/self/status` for `None`).
fn status_field(status: &Path, field: &str) -> Option<String> {
    let text = fs::read_to_string(status).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// The process that serves: under the default `--sandbox=namespace` the started process only
/// supervises, and its one child serves (and carries the filter).
fn serving_pid(pid: u32) -> u32 {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next()?.parse().ok())
        .unwrap_or(pid)
}

/// The seccomp mode and filter count of every thread of the process serving for `pid`, with
/// the thread names.
fn threads_seccomp(pid: u32) -> Vec<(String, String, u32)> {
    let pid = serving_pid(pid);
    let mut out = Vec::new();
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let name = fs::read_to_string(t.join("comm")).unwrap_or_default();
        let status = t.join("status");
        let (Some(mode), Some(filters)) = (
            status_field(&status, "Seccomp"),
            status_field(&status, "Seccomp_filters"),
        ) else {
            continue; // the thread exited meanwhile
        };
        out.push((name.trim().to_string(), mode, filters.parse().unwrap()));
    }
    out
}

/// The number of seccomp filters this test process runs under (the daemon inherits them).
fn own_filters() -> u32 {
    status_field(Path::new("/proc/self/status"), "Seccomp_filters")
        .expect("a kernel with seccomp filters")
        .parse()
        .unwrap()
}

/// Every kind of request the guest makes, on queue client `c`; checks the results on the host.
fn exercise(c: &mut FuseClient, share: &Path) {
    fs::write(share.join("old"), b"host file").unwrap();
    fs::create_dir(share.join("dir")).unwrap();

    // Lookup, getattr, access, statfs.
    let old = c.lookup(ROOT_ID, "old").unwrap();
    assert_eq!(old.attr.size, 9);
    c.getattr(old.nodeid, None).unwrap();
    c.access(old.nodeid, libc::R_OK as u32).unwrap();
    let st = c.statfs(ROOT_ID).unwrap();
    assert!(st.blocks > 0);
    assert_eq!(
        c.lookup(ROOT_ID, "missing").unwrap_err(),
        libc::ENOENT,
        "a failing request is answered too"
    );

    // Create, write, read, flush, fsync, fdatasync, lseek, fallocate.
    let (f, o) = c
        .create(
            ROOT_ID,
            "file",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o640,
            0,
        )
        .unwrap();
    let data = pattern(200_000, 7);
    assert_eq!(
        c.write(f.nodeid, o.fh, 0, &data).unwrap() as usize,
        data.len()
    );
    assert_eq!(
        c.read(f.nodeid, o.fh, 1000, 5000).unwrap(),
        &data[1000..6000]
    );
    c.flush(f.nodeid, o.fh, 0).unwrap();
    c.fsync(f.nodeid, o.fh, false).unwrap();
    c.fsync(f.nodeid, o.fh, true).unwrap();
    assert_eq!(
        c.lseek(f.nodeid, o.fh, 0, libc::SEEK_DATA as u32).unwrap(),
        0
    );
    assert_eq!(
        c.lseek(f.nodeid, o.fh, 0, libc::SEEK_END as u32).unwrap(),
        data.len() as u64
    );
    c.fallocate(f.nodeid, o.fh, 0, 1 << 20, 0).unwrap();
    assert_eq!(fs::metadata(share.join("file")).unwrap().len(), 1 << 20);

    // copy_file_range into a second file.
    let (g, go) = c
        .create(
            ROOT_ID,
            "copy",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o600,
            0,
        )
        .unwrap();
    let copied = c
        .copy_file_range(
            f.nodeid,
            &abi::CopyFileRangeIn {
                fh_in: o.fh,
                off_in: 0,
                nodeid_out: g.nodeid,
                fh_out: go.fh,
                off_out: 0,
                len: 4096,
                flags: 0,
            },
        )
        .unwrap();
    assert_eq!(copied, 4096);
    assert_eq!(fs::read(share.join("copy")).unwrap(), &data[..4096]);

    // Setattr: mode, size, times, owner (to the same ids), through the handle too.
    let mut s = setattr_in(fattr::MODE);
    s.mode = 0o600;
    c.setattr(f.nodeid, &s).unwrap();
    let mut s = setattr_in(fattr::SIZE | fattr::FH);
    s.size = 1000;
    s.fh = o.fh;
    c.setattr(f.nodeid, &s).unwrap();
    let mut s = setattr_in(fattr::ATIME | fattr::MTIME);
    s.atime = 1_000_000;
    s.mtime = 2_000_000;
    c.setattr(f.nodeid, &s).unwrap();
    let meta = fs::metadata(share.join("file")).unwrap();
    let mut s = setattr_in(fattr::UID | fattr::GID);
    s.uid = meta.uid();
    s.gid = meta.gid();
    c.setattr(f.nodeid, &s).unwrap();
    let meta = fs::metadata(share.join("file")).unwrap();
    assert_eq!(
        (meta.mode() & 0o777, meta.len(), meta.mtime()),
        (0o600, 1000, 2_000_000)
    );
    c.release(f.nodeid, o.fh, 0).unwrap();
    c.release(g.nodeid, go.fh, 0).unwrap();

    // Extended attributes.
    c.setxattr(f.nodeid, "user.seccomp", b"value", 0).unwrap();
    assert_eq!(
        host_getxattr(&share.join("file"), b"user.seccomp").as_deref(),
        Some(&b"value"[..])
    );
    match c.getxattr(f.nodeid, "user.seccomp", 100).unwrap() {
        virtiofsd_frontend::XattrReply::Data(v) => assert_eq!(v, b"value"),
        other => panic!("{other:?}"),
    }
    match c.listxattr(f.nodeid, 0).unwrap() {
        virtiofsd_frontend::XattrReply::Size(n) => assert!(n >= 13),
        other => panic!("{other:?}"),
    }
    c.listxattr(f.nodeid, 1024).unwrap();
    c.removexattr(f.nodeid, "user.seccomp").unwrap();
    assert_eq!(host_getxattr(&share.join("file"), b"user.seccomp"), None);

    // Directories: mkdir, symlink, readlink, link, mknod, tmpfile, readdir(plus), rename,
    // unlink, rmdir.
    let dir = c.lookup(ROOT_ID, "dir").unwrap();
    let sub = c.mkdir(dir.nodeid, "sub", 0o755, 0).unwrap();
    let l = c.symlink(dir.nodeid, "link", "../old").unwrap();
    assert_eq!(c.readlink(l.nodeid).unwrap(), b"../old");
    c.link(old.nodeid, dir.nodeid, "hard").unwrap();
    c.mknod(dir.nodeid, "fifo", libc::S_IFIFO | 0o600, 0, 0)
        .unwrap();
    let (t, to) = c
        .tmpfile(dir.nodeid, libc::O_RDWR as u32, 0o600, 0)
        .unwrap();
    c.release(t.nodeid, to.fh, 0).unwrap();
    let dh = c.opendir(dir.nodeid, 0).unwrap().fh;
    let names: Vec<Vec<u8>> = c
        .readdirplus(dir.nodeid, dh, 0, 64 * 1024)
        .unwrap()
        .into_iter()
        .map(|e| e.dirent.name)
        .collect();
    for n in ["sub", "link", "hard", "fifo"] {
        assert!(names.iter().any(|x| x == n.as_bytes()), "{n} in {names:?}");
    }
    c.readdir(dir.nodeid, dh, 0, 64 * 1024).unwrap();
    c.fsyncdir(dir.nodeid, dh, false).unwrap();
    c.releasedir(dir.nodeid, dh, 0).unwrap();
    c.rename(ROOT_ID, "copy", dir.nodeid, "moved").unwrap();
    c.rename2(dir.nodeid, "moved", ROOT_ID, "old", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(fs::read(share.join("old")).unwrap(), &data[..4096]);
    c.unlink(dir.nodeid, "moved").unwrap();
    c.unlink(dir.nodeid, "hard").unwrap();
    c.rmdir(dir.nodeid, "sub").unwrap();
    assert!(!share.join("dir/sub").exists() && !share.join("dir/moved").exists());
    c.forget(sub.nodeid, 1);

    // Open the file again read-only, and sync the whole filesystem.
    let fh = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    assert_eq!(c.read(f.nodeid, fh, 0, 10).unwrap(), &data[..10]);
    // Locks held on the host: a record lock, GETLK, a flock lock, a SETLKW that waits for
    // another owner (the waiter thread starts under the filter), FLUSH and RELEASE.
    let lk = |owner: u64, typ: i32, flags: u32| abi::LkIn {
        fh,
        owner,
        lk: abi::FileLock {
            start: 0,
            end: i64::MAX as u64,
            typ: typ as u32,
            pid: 1,
        },
        lk_flags: flags,
        padding: 0,
    };
    c.setlk(f.nodeid, &lk(1, libc::F_RDLCK, 0)).unwrap();
    let held = c.getlk(f.nodeid, &lk(2, libc::F_WRLCK, 0)).unwrap();
    assert_eq!(held.typ, libc::F_RDLCK as u32);
    c.setlk(f.nodeid, &lk(3, libc::F_WRLCK, abi::LK_FLOCK))
        .unwrap();
    // (A write lock through no handle: the read-only one would be EBADF.)
    let t = c
        .submit_setlkw(
            f.nodeid,
            &abi::LkIn {
                fh: 0,
                ..lk(2, libc::F_WRLCK, 0)
            },
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    c.flush(f.nodeid, fh, 1).unwrap();
    assert_eq!(c.wait(t).unwrap().errno(), None);
    c.flush(f.nodeid, fh, 2).unwrap();
    c.release(f.nodeid, fh, 0).unwrap();
    c.syncfs().unwrap();
}

/// Serves a session with `flags` (and `--xattr`), checks every thread is under the daemon's
/// filter, disconnects, and expects exit status 0; returns the daemon's stderr.
fn session(flags: &[&str], queues: usize) -> String {
    let d = run_dirs();
    let mut args = vec!["--xattr"];
    args.extend_from_slice(flags);
    let child = spawn(&d, &args);
    let pid = child.id();

    let mut fe = FsFrontend::connect(&d.socket, queues).expect("connect to the binary");
    let mut c = fe.client(0).unwrap();
    let init = c.init().unwrap();
    exercise(&mut c, &d.share);
    if queues > 1 {
        let mut c1 = fe.client(1).unwrap();
        c1.set_init_out(init);
        let e = c1.mkdir(ROOT_ID, "from-queue-1", 0o700, 0).unwrap();
        assert_eq!(c.lookup(ROOT_ID, "from-queue-1").unwrap().nodeid, e.nodeid);
    }

    // Every thread, including the per-queue workers started after the filter was installed
    // and the pool threads started before, runs under one more filter than this test does.
    let threads = threads_seccomp(pid);
    let want = own_filters() + 1;
    assert!(threads.len() >= 2 + queues, "{threads:?}");
    for (name, mode, filters) in &threads {
        assert_eq!(
            (mode.as_str(), *filters),
            ("2", want),
            "thread {name}: {threads:?}"
        );
    }

    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!d.socket.exists(), "socket left behind");
    assert!(!err.contains("panicked") && !err.contains("ERROR"), "{err}");
    err
}

#[test]
fn the_default_kill_filter_lets_every_request_through() {
    let err = session(&[], 1);
    assert!(
        err.contains("seccomp filter installed (--seccomp=kill)"),
        "{err}"
    );
}

#[test]
fn the_kill_filter_covers_pool_threads_and_every_queue_worker() {
    let err = session(&["--seccomp=kill", "--thread-pool-size=3"], 2);
    assert!(err.contains("(--seccomp=kill)"), "{err}");
}

#[test]
fn trap_and_log_filters_let_every_request_through() {
    let err = session(&["--seccomp=trap"], 1);
    assert!(err.contains("(--seccomp=trap)"), "{err}");
    assert!(!err.contains("refused system call"), "{err}");
    let err = session(&["--seccomp=log", "--thread-pool-size=2"], 1);
    assert!(err.contains("(--seccomp=log)"), "{err}");
}

#[test]
fn the_kill_filter_survives_sigterm_and_removes_the_socket() {
    let d = run_dirs();
    let child = spawn(&d, &[]);
    // The filter is installed just after the socket appears: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let want = own_filters() + 1;
    while !threads_seccomp(child.id())
        .iter()
        .all(|(_, _, n)| *n == want)
    {
        assert!(Instant::now() < deadline, "no filter installed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "status {status:?}, stderr: {err}");
    assert!(!d.socket.exists(), "socket left behind");
}

#[test]
fn none_installs_no_filter() {
    let d = run_dirs();
    let child = spawn(&d, &["--seccomp=none"]);
    let pid = child.id();
    let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
    fe.client(0).unwrap().init().unwrap();
    let own = own_filters();
    for (name, _, filters) in threads_seccomp(pid) {
        assert_eq!(filters, own, "thread {name}");
    }
    fe.disconnect();
    let (status, err) = wait_exit(child);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
    assert!(!err.contains("seccomp filter installed"), "{err}");
}
