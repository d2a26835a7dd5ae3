//! Daemon-wide settings: `--readonly` and the `--cache` modes (open flags, entry and attribute
//! timeouts, INIT flags), plus `--writeback` and `--no-readdirplus`.

use crate::common;

use std::fs;
use std::time::Duration;

use common::*;
use virtiofsd::fuse::abi::{self, fattr, fopen, init, ROOT_ID};
use virtiofsd::passthrough::CacheMode;

// ---- --readonly -------------------------------------------------------------------------------

/// A read-only daemon over a share holding `f` (with an xattr), `dir/inner`, and `link`.
fn readonly() -> (Daemon, Snapshot) {
    let d = Daemon::with(Options::default().readonly().xattr());
    fs::write(d.host("f"), b"read only").unwrap();
    host_setxattr(&d.host("f"), b"user.k", b"v");
    fs::create_dir(d.host("dir")).unwrap();
    fs::write(d.host("dir/inner"), b"inner").unwrap();
    std::os::unix::fs::symlink("f", d.host("link")).unwrap();
    let before = d.snapshot();
    (d, before)
}

#[test]
fn readonly_refuses_every_change_with_erofs() {
    let (mut d, before) = readonly();
    let f = d.node("f");
    let dir = d.node("dir");
    let rw = (libc::O_CREAT | libc::O_RDWR) as u32;

    assert_eq!(
        d.c.mkdir(ROOT_ID, "new", 0o755, 0).unwrap_err(),
        libc::EROFS
    );
    assert_eq!(
        d.c.create(ROOT_ID, "new", rw, 0o644, 0).unwrap_err(),
        libc::EROFS
    );
    // Even when the name exists (CREATE without O_EXCL would open it for writing).
    assert_eq!(
        d.c.create(ROOT_ID, "f", rw, 0o644, 0).unwrap_err(),
        libc::EROFS
    );
    assert_eq!(
        d.c.mknod(ROOT_ID, "new", libc::S_IFIFO | 0o644, 0, 0)
            .unwrap_err(),
        libc::EROFS
    );
    assert_eq!(d.c.symlink(ROOT_ID, "new", "f").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.link(f, ROOT_ID, "new").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.unlink(ROOT_ID, "f").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.rmdir(ROOT_ID, "dir").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.rename(ROOT_ID, "f", dir, "g").unwrap_err(), libc::EROFS);
    assert_eq!(
        d.c.rename2(ROOT_ID, "f", ROOT_ID, "link", 2).unwrap_err(),
        libc::EROFS
    );
    assert_eq!(
        d.c.tmpfile(ROOT_ID, libc::O_RDWR as u32, 0o600, 0)
            .unwrap_err(),
        libc::EROFS
    );
    for flags in [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_APPEND,
    ] {
        assert_eq!(
            d.c.open(f, flags as u32).unwrap_err(),
            libc::EROFS,
            "flags {flags:#o}"
        );
    }
    for valid in [
        fattr::MODE,
        fattr::SIZE,
        fattr::UID,
        fattr::MTIME_NOW | fattr::MTIME,
    ] {
        let mut s = setattr_in(valid);
        s.mode = 0o777;
        s.uid = 1000;
        assert_eq!(
            d.c.setattr(f, &s).unwrap_err(),
            libc::EROFS,
            "valid {valid:#x}"
        );
    }
    assert_eq!(
        d.c.setxattr(f, "user.k", b"new", 0).unwrap_err(),
        libc::EROFS
    );
    assert_eq!(d.c.removexattr(f, "user.k").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.access(f, libc::W_OK as u32).unwrap_err(), libc::EROFS);

    // Through a read-only handle: WRITE, FALLOCATE, COPY_FILE_RANGE.
    let fh = d.open(f, libc::O_RDONLY);
    assert_eq!(d.c.write(f, fh, 0, b"x").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.fallocate(f, fh, 0, 4096, 0).unwrap_err(), libc::EROFS);
    let cfr = abi::CopyFileRangeIn {
        fh_in: fh,
        off_in: 0,
        nodeid_out: f,
        fh_out: fh,
        off_out: 100,
        len: 4,
        flags: 0,
    };
    assert_eq!(d.c.copy_file_range(f, &cfr).unwrap_err(), libc::EROFS);
    d.c.release(f, fh, 0).unwrap();

    before.assert_same(&d.snapshot(), "a read-only daemon");
    d.finish();
}

#[test]
fn readonly_still_serves_every_read() {
    let (mut d, before) = readonly();
    let f = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!(f.attr.size, 9);
    assert_eq!(d.c.getattr(f.nodeid, None).unwrap().attr.size, 9);
    let fh = d.open(f.nodeid, libc::O_RDONLY);
    assert_eq!(d.c.read(f.nodeid, fh, 0, 100).unwrap(), b"read only");
    assert_eq!(
        d.c.lseek(f.nodeid, fh, 0, libc::SEEK_END as u32).unwrap(),
        9
    );
    d.c.flush(f.nodeid, fh, 0).unwrap();
    d.c.fsync(f.nodeid, fh, false).unwrap();
    d.c.release(f.nodeid, fh, 0).unwrap();

    let link = d.node("link");
    assert_eq!(d.c.readlink(link).unwrap(), b"f");
    let dir = d.node("dir");
    let o = d.c.opendir(dir, 0).unwrap();
    let names: Vec<Vec<u8>> =
        d.c.readdirplus(dir, o.fh, 0, 4096)
            .unwrap()
            .into_iter()
            .map(|e| e.dirent.name)
            .collect();
    assert!(names.contains(&b"inner".to_vec()));
    d.c.releasedir(dir, o.fh, 0).unwrap();
    assert!(d.c.statfs(ROOT_ID).is_ok());
    d.c.access(f.nodeid, libc::R_OK as u32).unwrap();
    assert_eq!(
        d.c.getxattr(f.nodeid, "user.k", 64).unwrap(),
        virtiofsd_frontend::XattrReply::Data(b"v".to_vec())
    );
    assert!(d.c.listxattr(f.nodeid, 0).is_ok());
    d.c.syncfs().unwrap();

    before.assert_same(&d.snapshot(), "reads on a read-only daemon");
    d.finish();
}

// ---- --cache ----------------------------------------------------------------------------------

struct Expect {
    open_flags: u32,
    dir_flags: u32,
    timeout: Duration,
    init_on: u64,
    init_off: u64,
}

fn check_cache_mode(mode: CacheMode, want: Expect) {
    // A guest that always opens: in `always` mode the daemon would otherwise refuse OPEN
    // (tests/it/no_open.rs covers that).
    let mut d = Daemon::with(Options::default().cache(mode).without_no_open());
    let flags = u64::from(d.init.unwrap().flags);
    assert_eq!(
        flags & want.init_on,
        want.init_on,
        "{mode:?}: INIT flags {flags:#x}"
    );
    assert_eq!(flags & want.init_off, 0, "{mode:?}: INIT flags {flags:#x}");

    let timeout = |secs: u64, nsec: u32| Duration::new(secs, nsec);
    let n = d.file("f", b"cache");
    let e = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!(
        timeout(e.entry_valid, e.entry_valid_nsec),
        want.timeout,
        "{mode:?} entry"
    );
    assert_eq!(
        timeout(e.attr_valid, e.attr_valid_nsec),
        want.timeout,
        "{mode:?} attr"
    );
    let a = d.c.getattr(n, None).unwrap();
    assert_eq!(
        timeout(a.attr_valid, a.attr_valid_nsec),
        want.timeout,
        "{mode:?} getattr"
    );

    let o = d.c.open(n, libc::O_RDONLY as u32).unwrap();
    assert_eq!(
        o.open_flags & (fopen::DIRECT_IO | fopen::KEEP_CACHE | fopen::NOFLUSH),
        want.open_flags,
        "{mode:?}: open flags {:#x}",
        o.open_flags
    );
    d.c.release(n, o.fh, 0).unwrap();
    let (ce, co) =
        d.c.create(
            ROOT_ID,
            "g",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o644,
            0,
        )
        .unwrap();
    assert_eq!(
        co.open_flags & (fopen::DIRECT_IO | fopen::KEEP_CACHE | fopen::NOFLUSH),
        want.open_flags
    );
    assert_eq!(timeout(ce.entry_valid, ce.entry_valid_nsec), want.timeout);
    d.c.release(ce.nodeid, co.fh, 0).unwrap();
    let m = d.c.mkdir(ROOT_ID, "sub", 0o755, 0).unwrap();
    assert_eq!(timeout(m.entry_valid, m.entry_valid_nsec), want.timeout);

    let od = d.c.opendir(ROOT_ID, 0).unwrap();
    assert_eq!(
        od.open_flags & fopen::CACHE_DIR,
        want.dir_flags,
        "{mode:?}: opendir flags {:#x}",
        od.open_flags
    );
    // READDIRPLUS entries carry the same timeouts.
    let plus = d.c.readdirplus(ROOT_ID, od.fh, 0, 4096).unwrap();
    let g = plus.iter().find(|p| p.dirent.name == b"g").unwrap();
    assert_eq!(
        timeout(g.entry.entry_valid, g.entry.entry_valid_nsec),
        want.timeout
    );
    d.c.releasedir(ROOT_ID, od.fh, 0).unwrap();
    d.finish();
}

#[test]
fn cache_never_uses_direct_io_and_zero_timeouts() {
    check_cache_mode(
        CacheMode::Never,
        Expect {
            open_flags: fopen::DIRECT_IO,
            dir_flags: 0,
            timeout: Duration::ZERO,
            init_on: 0,
            // Entries expire at once: plain listings carry four times the names per request.
            init_off: init::AUTO_INVAL_DATA | init::CACHE_SYMLINKS | init::DO_READDIRPLUS,
        },
    );
}

#[test]
fn cache_metadata_uses_direct_io_and_long_timeouts() {
    check_cache_mode(
        CacheMode::Metadata,
        Expect {
            open_flags: fopen::DIRECT_IO,
            // Listings are cached, and kept while unchanged (as in `auto`).
            dir_flags: fopen::CACHE_DIR,
            timeout: Duration::from_secs(86400),
            init_on: 0,
            init_off: init::CACHE_SYMLINKS,
        },
    );
}

#[test]
fn cache_auto_uses_one_second_timeouts_and_auto_invalidation() {
    // Listings may be cached (CACHE_DIR); whether the cached one is kept (KEEP_CACHE) depends
    // on the directory being unchanged since it was last served.
    check_cache_mode(
        CacheMode::Auto,
        Expect {
            // Pages are kept only when the file is unchanged since a settled earlier open.
            open_flags: 0,
            dir_flags: fopen::CACHE_DIR,
            timeout: Duration::from_secs(1),
            init_on: init::AUTO_INVAL_DATA,
            init_off: init::CACHE_SYMLINKS,
        },
    );
}

#[test]
fn cache_always_keeps_pages_and_directory_listings_for_a_day() {
    check_cache_mode(
        CacheMode::Always,
        Expect {
            open_flags: fopen::KEEP_CACHE,
            dir_flags: fopen::CACHE_DIR,
            timeout: Duration::from_secs(86400),
            init_on: init::CACHE_SYMLINKS,
            init_off: init::AUTO_INVAL_DATA,
        },
    );
}

// ---- --writeback / --no-readdirplus -----------------------------------------------------------

#[test]
fn writeback_is_negotiated_and_write_only_opens_can_be_read_by_the_page_cache() {
    let mut d = Daemon::with(Options::default().writeback());
    assert_ne!(u64::from(d.init.unwrap().flags) & init::WRITEBACK_CACHE, 0);
    let n = d.file("f", b"abc");
    // With writeback caching the guest reads pages of files it opened write-only.
    let fh = d.open(n, libc::O_WRONLY);
    assert_eq!(d.c.read(n, fh, 0, 3).unwrap(), b"abc");
    // O_APPEND is left to the guest: the WRITE offset is used as given.
    let fa = d.open(n, libc::O_WRONLY | libc::O_APPEND);
    d.c.write(n, fa, 0, b"X").unwrap();
    assert_eq!(fs::read(d.host("f")).unwrap(), b"Xbc");
    d.finish();
}

#[test]
fn without_writeback_it_is_not_negotiated() {
    let d = Daemon::start();
    assert_eq!(u64::from(d.init.unwrap().flags) & init::WRITEBACK_CACHE, 0);
    d.finish();
}

#[test]
fn no_readdirplus_is_not_offered_at_init() {
    let mut d = Daemon::with(Options::default().no_readdirplus());
    let flags = u64::from(d.init.unwrap().flags);
    assert_eq!(flags & (init::DO_READDIRPLUS | init::READDIRPLUS_AUTO), 0);
    fs::write(d.host("f"), b"").unwrap();
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    let names: Vec<Vec<u8>> =
        d.c.readdir(ROOT_ID, o.fh, 0, 4096)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
    assert!(names.contains(&b"f".to_vec()));
    d.finish();
}
