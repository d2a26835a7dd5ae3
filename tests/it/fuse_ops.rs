//! Every FUSE opcode the daemon serves, success and error paths, driven through the test
//! frontend over a real vhost-user connection; each change is checked on the host afterwards.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use virtiofsd::fuse::abi::{self, fattr, init, opcode, Pod, ROOT_ID};
use virtiofsd::passthrough::CacheMode;
use virtiofsd_frontend::fuse_client::{
    build_request, DEFAULT_INIT_FLAGS, INIT_COMPAT_MINOR, INIT_MINOR, LINUX_5_4_INIT_FLAGS,
};
use virtiofsd_frontend::{DirEntry, XattrReply};

const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;
const RENAME_WHITEOUT: u32 = 4;

fn ino(p: &std::path::Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

// ---- INIT -------------------------------------------------------------------------------------

#[test]
fn init_7_38_with_flags2_negotiates_a_subset_and_the_limits() {
    let mut d = Daemon::with(Options::default().no_init());
    let out = d.c.init().unwrap();

    assert_eq!((out.major, out.minor), (7, INIT_MINOR));
    let agreed = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    assert_eq!(
        agreed & !DEFAULT_INIT_FLAGS,
        0,
        "daemon enabled flags the kernel did not offer: {:#x}",
        agreed & !DEFAULT_INIT_FLAGS
    );
    for want in [
        init::ASYNC_READ,
        init::BIG_WRITES,
        init::ATOMIC_O_TRUNC,
        init::PARALLEL_DIROPS,
        init::MAX_PAGES,
        init::DO_READDIRPLUS,
        init::READDIRPLUS_AUTO,
        init::AUTO_INVAL_DATA,
        init::INIT_EXT,
        init::POSIX_LOCKS,
        init::FLOCK_LOCKS,
    ] {
        assert_ne!(agreed & want, 0, "flag {want:#x} not enabled: {agreed:#x}");
    }
    for off in [init::WRITEBACK_CACHE, init::SECURITY_CTX] {
        assert_eq!(agreed & off, 0, "flag {off:#x} enabled: {agreed:#x}");
    }
    assert_eq!(out.max_write, 1 << 20);
    assert_eq!(out.max_pages, 256);
    assert!(out.max_readahead <= 128 << 10);
    assert!(out.max_background > 0 && out.congestion_threshold <= out.max_background);

    assert!(d.c.lookup(ROOT_ID, "nothing").unwrap_err() == libc::ENOENT);
    d.finish();
}

#[test]
fn init_like_linux_5_4_with_7_31_and_short_init_in_is_accepted() {
    let mut d = Daemon::with(Options::default().no_init());
    let out = d.c.init_compat().unwrap();

    assert_eq!((out.major, out.minor), (7, INIT_COMPAT_MINOR));
    assert_eq!(out.flags2, 0);
    assert_eq!(u64::from(out.flags) & !LINUX_5_4_INIT_FLAGS, 0);
    assert_eq!(u64::from(out.flags) & init::INIT_EXT, 0);
    assert_ne!(u64::from(out.flags) & init::MAX_PAGES, 0);
    assert_eq!(out.max_write, 1 << 20);

    fs::write(d.host("f"), b"5.4").unwrap();
    let e = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!(e.attr.size, 3);
    d.finish();
}

#[test]
fn init_with_a_protocol_older_than_7_27_gets_eproto_and_no_session() {
    let mut d = Daemon::with(Options::default().no_init());
    assert_eq!(
        d.c.init_with(26, LINUX_5_4_INIT_FLAGS, 4096, false)
            .unwrap_err(),
        libc::EPROTO
    );
    assert_eq!(d.c.lookup(ROOT_ID, "x").unwrap_err(), libc::EIO);
    d.c.init().unwrap();
    assert_eq!(d.c.lookup(ROOT_ID, "x").unwrap_err(), libc::ENOENT);
    d.finish();
}

#[test]
fn init_with_a_newer_major_is_answered_with_the_daemon_major_only() {
    let mut d = Daemon::with(Options::default().no_init());
    let inc = abi::InitInCompat {
        major: 8,
        minor: 0,
        max_readahead: 0,
        flags: 0,
    };
    let r = d.c.request(opcode::INIT, 0, &[inc.as_bytes()], 64).unwrap();
    assert_eq!(r.error, 0);
    let out = abi::InitOut::from_prefix(&r.body).unwrap();
    assert_eq!(out.major, 7);
    // The kernel retries with 7.x; the session starts then.
    d.c.init().unwrap();
    d.finish();
}

// ---- LOOKUP -----------------------------------------------------------------------------------

#[test]
fn lookup_finds_a_file_with_its_host_attributes() {
    let mut d = Daemon::start();
    fs::write(d.host("file"), b"hello").unwrap();
    fs::set_permissions(d.host("file"), fs::Permissions::from_mode(0o640)).unwrap();
    let md = fs::metadata(d.host("file")).unwrap();

    let e = d.c.lookup(ROOT_ID, "file").unwrap();

    assert!(e.nodeid > ROOT_ID);
    assert_eq!(e.attr.ino, md.ino());
    assert_eq!(e.attr.size, 5);
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o640);
    assert_eq!(e.attr.nlink, 1);
    assert_eq!((e.attr.uid, e.attr.gid), (md.uid(), md.gid()));
    assert_eq!(
        (e.attr.mtime, e.attr.mtimensec),
        (md.mtime() as u64, md.mtime_nsec() as u32)
    );
    // A second lookup hands out the same node id.
    assert_eq!(d.c.lookup(ROOT_ID, "file").unwrap().nodeid, e.nodeid);
    d.finish();
}

#[test]
fn lookup_of_a_missing_name_gets_enoent() {
    let mut d = Daemon::start();
    assert_eq!(d.c.lookup(ROOT_ID, "missing").unwrap_err(), libc::ENOENT);
    fs::create_dir(d.host("dir")).unwrap();
    let dir = d.node("dir");
    assert_eq!(d.c.lookup(dir, "missing").unwrap_err(), libc::ENOENT);
    d.finish();
}

/// A missing name is answered with node id 0 and an entry timeout (a negative entry the guest
/// keeps) in `auto` and `always`, as long as positive entries; with `ENOENT` in `never` and
/// `metadata`, so the guest asks again each time.
#[test]
fn lookup_of_a_missing_name_is_a_negative_entry_that_follows_the_cache_mode() {
    for (mode, valid) in [
        (CacheMode::Always, Some(86400)),
        (CacheMode::Auto, Some(1)),
        (CacheMode::Metadata, None),
        (CacheMode::Never, None),
    ] {
        let mut d = Daemon::with(Options::default().cache(mode));
        match (valid, d.c.lookup_entry(ROOT_ID, "missing.h")) {
            (Some(v), Ok(e)) => {
                assert_eq!((e.nodeid, e.entry_valid), (0, v), "{mode:?}");
                assert_eq!(e.attr_valid, 0, "{mode:?}");
            }
            (None, Err(errno)) => assert_eq!(errno, libc::ENOENT, "{mode:?}"),
            (v, r) => panic!("{mode:?}: expected {v:?}, got {r:?}"),
        }
        // The guest creating the name replaces its negative entry with the new file's.
        let (e, o) =
            d.c.create(ROOT_ID, "missing.h", libc::O_WRONLY as u32, 0o644, 0)
                .unwrap();
        assert_ne!(e.nodeid, 0);
        if o.fh != 0 {
            d.c.release(e.nodeid, o.fh, 0).unwrap();
        }
        assert_eq!(
            d.c.lookup_entry(ROOT_ID, "missing.h").unwrap().nodeid,
            e.nodeid
        );
        d.finish();
    }
}

#[test]
fn lookup_of_a_name_with_a_slash_is_refused_even_when_the_path_exists() {
    let mut d = Daemon::start();
    fs::create_dir(d.host("a")).unwrap();
    fs::write(d.host("a/b"), b"x").unwrap();
    assert_eq!(d.c.lookup(ROOT_ID, "a/b").unwrap_err(), libc::EINVAL);
    assert_eq!(d.c.lookup(ROOT_ID, "../outside").unwrap_err(), libc::EINVAL);
    assert_eq!(d.c.lookup(ROOT_ID, "/etc").unwrap_err(), libc::EINVAL);
    d.finish();
}

#[test]
fn lookup_of_dotdot_at_the_root_stays_at_the_root() {
    let mut d = Daemon::start();
    let root_ino = ino(&d.share);

    let up = d.c.lookup(ROOT_ID, "..").unwrap();
    assert_eq!(up.nodeid, ROOT_ID);
    assert_eq!(up.attr.ino, root_ino);
    let up2 = d.c.lookup(up.nodeid, "..").unwrap();
    assert_eq!((up2.nodeid, up2.attr.ino), (ROOT_ID, root_ino));
    let dot = d.c.lookup(ROOT_ID, ".").unwrap();
    assert_eq!((dot.nodeid, dot.attr.ino), (ROOT_ID, root_ino));

    // ".." of a first-level directory is the root too, and nothing above it is reachable.
    fs::create_dir(d.host("sub")).unwrap();
    let sub = d.node("sub");
    let parent = d.c.lookup(sub, "..").unwrap();
    assert_eq!(parent.attr.ino, root_ino);
    assert_eq!(
        d.c.lookup(parent.nodeid, "outside").unwrap_err(),
        libc::ENOENT
    );
    d.finish();
}

#[test]
fn lookup_of_an_overlong_name_gets_enametoolong() {
    let mut d = Daemon::start();
    let long = "n".repeat(256);
    assert_eq!(d.c.lookup(ROOT_ID, &long).unwrap_err(), libc::ENAMETOOLONG);
    // 255 bytes is a legal name.
    let max = "m".repeat(255);
    assert_eq!(d.c.lookup(ROOT_ID, &max).unwrap_err(), libc::ENOENT);
    fs::write(d.host(&max), b"").unwrap();
    assert!(d.c.lookup(ROOT_ID, &max).is_ok());
    d.finish();
}

#[test]
fn lookup_through_a_symlink_to_a_host_directory_does_not_escape() {
    let mut d = Daemon::start();
    std::os::unix::fs::symlink(&d.outside, d.host("escape")).unwrap();
    std::os::unix::fs::symlink("/", d.host("root")).unwrap();
    let esc = d.c.lookup(ROOT_ID, "escape").unwrap();
    assert_eq!(esc.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(d.c.lookup(esc.nodeid, "secret").unwrap_err(), libc::ENOTDIR);
    let root = d.node("root");
    assert_eq!(d.c.lookup(root, "etc").unwrap_err(), libc::ENOTDIR);
    assert_eq!(d.c.opendir(esc.nodeid, 0).unwrap_err(), libc::ENOTDIR);
    d.finish();
}

#[test]
fn dotdot_of_a_directory_the_host_moved_out_of_the_share_does_not_escape() {
    let mut d = Daemon::start();
    fs::create_dir(d.host("sub")).unwrap();
    let sub = d.node("sub");
    // A host process moves the directory out while the guest holds its node id.
    fs::rename(d.host("sub"), d.outside.join("sub")).unwrap();
    let outside_ino = ino(&d.outside);
    if let Ok(up) = d.c.lookup(sub, "..") {
        assert_ne!(
            up.attr.ino, outside_ino,
            "\"..\" reached the host directory {:?}",
            d.outside
        );
        if let Ok(s) = d.c.lookup(up.nodeid, "secret") {
            let fh = d.c.open(s.nodeid, libc::O_RDONLY as u32).unwrap().fh;
            assert_ne!(d.c.read(s.nodeid, fh, 0, 100).unwrap(), SECRET);
        }
    }
    d.finish();
}

#[test]
fn lookup_on_an_unknown_node_id_gets_ebadf() {
    let mut d = Daemon::start();
    assert_eq!(d.c.lookup(0xdead_beef, "x").unwrap_err(), libc::EBADF);
    assert_eq!(d.c.lookup(0, "x").unwrap_err(), libc::EBADF);
    d.finish();
}

// ---- FORGET / BATCH_FORGET --------------------------------------------------------------------

#[test]
fn forget_drops_references_and_lookup_still_works_afterwards() {
    let mut d = Daemon::start();
    fs::write(d.host("f"), b"data").unwrap();
    let host_ino = ino(&d.host("f"));
    let n = d.node("f");
    assert_eq!(d.node("f"), n);
    assert_eq!(d.node("f"), n);

    // Like Linux, on the high-priority queue. Partial forget keeps the node id alive.
    let mut hp = d.fe.hiprio_client().unwrap();
    hp.forget(n, 2);
    assert_eq!(d.c.getattr(n, None).unwrap().attr.ino, host_ino);
    hp.forget(n, 1);

    // A fresh lookup works and designates the same file.
    let again = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!(again.attr.ino, host_ino);
    assert_eq!(d.c.getattr(again.nodeid, None).unwrap().attr.size, 4);
    d.finish();
}

#[test]
fn forget_on_the_request_queue_works_too() {
    let mut d = Daemon::start();
    fs::write(d.host("f"), b"data").unwrap();
    let n = d.node("f");
    d.c.forget(n, 1);
    assert_eq!(d.c.lookup(ROOT_ID, "f").unwrap().attr.size, 4);
    d.finish();
}

#[test]
fn forget_of_unknown_ids_of_the_root_and_of_too_many_references_is_harmless() {
    let mut d = Daemon::start();
    fs::write(d.host("f"), b"data").unwrap();
    let n = d.node("f");
    let mut hp = d.fe.hiprio_client().unwrap();
    hp.forget(0xdead_beef_0000, 1);
    hp.forget(0, 5);
    hp.forget(ROOT_ID, u64::MAX);
    hp.forget(n, 0);
    hp.forget(n, 1000);
    hp.forget(n, 1);

    assert_eq!(d.c.getattr(ROOT_ID, None).unwrap().attr.ino, ino(&d.share));
    let e = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!(d.c.getattr(e.nodeid, None).unwrap().attr.size, 4);
    d.finish();
}

#[test]
fn batch_forget_releases_every_listed_node_and_ignores_unknown_ones() {
    let mut d = Daemon::start();
    for n in ["a", "b", "c"] {
        fs::write(d.host(n), n.as_bytes()).unwrap();
    }
    let a = d.node("a");
    let b = d.node("b");
    let c = d.node("c");
    let c2 = d.node("c");
    assert_eq!(c, c2);

    let mut hp = d.fe.hiprio_client().unwrap();
    hp.batch_forget(&[(a, 1), (b, 1), (0xdead_beef, 3), (ROOT_ID, 9), (c, 1)]);
    hp.batch_forget(&[]);

    // `c` still has one reference.
    assert_eq!(d.c.getattr(c, None).unwrap().attr.size, 1);
    for n in ["a", "b", "c"] {
        let e = d.c.lookup(ROOT_ID, n).unwrap();
        assert_eq!(e.attr.ino, ino(&d.host(n)));
    }
    assert!(d.c.getattr(ROOT_ID, None).is_ok());
    d.finish();
}

// ---- GETATTR ----------------------------------------------------------------------------------

#[test]
fn getattr_without_and_with_a_handle_reports_host_attributes() {
    let mut d = Daemon::start();
    let root = d.c.getattr(ROOT_ID, None).unwrap();
    assert_eq!(root.attr.ino, ino(&d.share));
    assert_eq!(root.attr.mode, libc::S_IFDIR | 0o755);
    assert_eq!((root.attr_valid, root.attr_valid_nsec), (1, 0));

    let n = d.file("f", b"0123456789");
    let a = d.c.getattr(n, None).unwrap();
    assert_eq!(a.attr.size, 10);
    assert_eq!(a.attr.ino, ino(&d.host("f")));

    let fh = d.open(n, libc::O_RDWR);
    d.c.write(n, fh, 10, b"more").unwrap();
    let b = d.c.getattr(n, Some(fh)).unwrap();
    assert_eq!(b.attr.size, 14);
    assert_eq!(fs::metadata(d.host("f")).unwrap().len(), 14);
    d.c.release(n, fh, libc::O_RDWR as u32).unwrap();
    d.finish();
}

#[test]
fn getattr_of_an_unknown_node_gets_ebadf() {
    let mut d = Daemon::start();
    assert_eq!(d.c.getattr(12345, None).unwrap_err(), libc::EBADF);
    d.finish();
}

// ---- SETATTR ----------------------------------------------------------------------------------

#[test]
fn setattr_changes_the_mode_on_the_host() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    let mut s = setattr_in(fattr::MODE);
    s.mode = libc::S_IFREG | 0o4751;
    let out = d.c.setattr(n, &s).unwrap();
    assert_eq!(out.attr.mode, libc::S_IFREG | 0o4751);
    assert_eq!(
        fs::metadata(d.host("f")).unwrap().mode(),
        libc::S_IFREG | 0o4751
    );
    d.finish();
}

#[test]
fn setattr_changes_owner_and_group_as_root() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    let mut s = setattr_in(fattr::UID | fattr::GID);
    s.uid = 1234;
    s.gid = 5678;
    let out = d.c.setattr(n, &s).unwrap();
    assert_eq!((out.attr.uid, out.attr.gid), (1234, 5678));
    let md = fs::metadata(d.host("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));

    // Group only.
    let mut s = setattr_in(fattr::GID);
    s.gid = 42;
    d.c.setattr(n, &s).unwrap();
    let md = fs::metadata(d.host("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 42));
    d.finish();
}

#[test]
fn setattr_size_truncates_and_extends_the_host_file() {
    let mut d = Daemon::start();
    let n = d.file("f", b"0123456789");
    let mut s = setattr_in(fattr::SIZE);
    s.size = 3;
    assert_eq!(d.c.setattr(n, &s).unwrap().attr.size, 3);
    assert_eq!(fs::read(d.host("f")).unwrap(), b"012");
    s.size = 8192;
    d.c.setattr(n, &s).unwrap();
    let data = fs::read(d.host("f")).unwrap();
    assert_eq!(data.len(), 8192);
    assert!(data[3..].iter().all(|&b| b == 0));

    fs::create_dir(d.host("dir")).unwrap();
    let dir = d.node("dir");
    assert_eq!(d.c.setattr(dir, &s).unwrap_err(), libc::EISDIR);
    d.finish();
}

#[test]
fn setattr_sets_explicit_times_and_now() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    let mut s = setattr_in(fattr::ATIME | fattr::MTIME);
    s.atime = 1_000_000_000;
    s.atimensec = 123_456_789;
    s.mtime = 1_100_000_000;
    s.mtimensec = 987_654_321;
    let out = d.c.setattr(n, &s).unwrap();
    assert_eq!(
        (out.attr.mtime, out.attr.mtimensec),
        (1_100_000_000, 987_654_321)
    );
    let md = fs::metadata(d.host("f")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_100_000_000, 987_654_321));

    // MTIME_NOW only: atime is left alone.
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    d.c.setattr(n, &setattr_in(fattr::MTIME | fattr::MTIME_NOW))
        .unwrap();
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let md = fs::metadata(d.host("f")).unwrap();
    assert!(
        md.mtime() >= before.as_secs() as i64 - 1 && md.mtime() <= after.as_secs() as i64 + 1,
        "mtime {} not between {before:?} and {after:?}",
        md.mtime()
    );
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));

    // ATIME_NOW too.
    d.c.setattr(n, &setattr_in(fattr::ATIME | fattr::ATIME_NOW))
        .unwrap();
    let md = fs::metadata(d.host("f")).unwrap();
    assert!(md.atime() >= before.as_secs() as i64 - 1);
    d.finish();
}

#[test]
fn setattr_through_a_file_handle() {
    let mut d = Daemon::start();
    let n = d.file("f", b"0123456789");
    let fh = d.open(n, libc::O_RDWR);
    let mut s = setattr_in(fattr::SIZE | fattr::FH | fattr::MODE);
    s.fh = fh;
    s.size = 4;
    s.mode = 0o600;
    let out = d.c.setattr(n, &s).unwrap();
    assert_eq!(out.attr.size, 4);
    let md = fs::metadata(d.host("f")).unwrap();
    assert_eq!((md.len(), md.mode() & 0o7777), (4, 0o600));
    assert_eq!(fs::read(d.host("f")).unwrap(), b"0123");
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn setattr_on_a_symlink_never_touches_its_target() {
    let mut d = Daemon::start();
    let secret = d.outside.join("secret");
    std::os::unix::fs::symlink(&secret, d.host("sl")).unwrap();
    let before = d.snapshot();
    let sl = d.node("sl");

    let mut s = setattr_in(fattr::MODE);
    s.mode = 0o777;
    assert_eq!(d.c.setattr(sl, &s).unwrap_err(), libc::EOPNOTSUPP);
    let mut s = setattr_in(fattr::SIZE);
    s.size = 0;
    assert_eq!(d.c.setattr(sl, &s).unwrap_err(), libc::EINVAL);
    // Times and owner apply to the link itself.
    let mut s = setattr_in(fattr::MTIME);
    s.mtime = 1;
    d.c.setattr(sl, &s).unwrap();
    let mut s = setattr_in(fattr::UID);
    s.uid = 77;
    d.c.setattr(sl, &s).unwrap();
    let link = fs::symlink_metadata(d.host("sl")).unwrap();
    assert_eq!((link.mtime(), link.uid()), (1, 77));

    let after = d.snapshot();
    let key = std::path::PathBuf::from("outside/secret");
    assert_eq!(before.0[&key], after.0[&key], "symlink target changed");
    assert_eq!(fs::read(&secret).unwrap(), SECRET);
    d.finish();
}

// ---- READLINK / SYMLINK -----------------------------------------------------------------------

#[test]
fn readlink_returns_the_target_and_refuses_non_links() {
    let mut d = Daemon::start();
    std::os::unix::fs::symlink("some/relative/target", d.host("l")).unwrap();
    let l = d.node("l");
    assert_eq!(d.c.readlink(l).unwrap(), b"some/relative/target");
    let f = d.file("f", b"");
    assert_eq!(d.c.readlink(f).unwrap_err(), libc::EINVAL);
    d.finish();
}

#[test]
fn symlink_creates_a_host_link_with_that_target() {
    let mut d = Daemon::start();
    let e = d.c.symlink(ROOT_ID, "link", "target/of/link").unwrap();
    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(e.attr.size, "target/of/link".len() as u64);
    let target = fs::read_link(d.host("link")).unwrap();
    assert_eq!(target.as_os_str(), "target/of/link");
    assert_eq!(d.c.readlink(e.nodeid).unwrap(), b"target/of/link");
    assert_eq!(
        d.c.symlink(ROOT_ID, "link", "other").unwrap_err(),
        libc::EEXIST
    );
    d.finish();
}

#[test]
fn symlink_to_a_host_file_is_never_followed_on_open() {
    let mut d = Daemon::start();
    let e = d.c.symlink(ROOT_ID, "pw", "/etc/passwd").unwrap();
    assert_eq!(
        fs::read_link(d.host("pw")).unwrap().as_os_str(),
        "/etc/passwd"
    );
    let pw = d.c.lookup(ROOT_ID, "pw").unwrap();
    assert_eq!(pw.nodeid, e.nodeid);
    assert_eq!(pw.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        d.c.open(pw.nodeid, libc::O_RDONLY as u32).unwrap_err(),
        libc::ELOOP
    );

    // The same for a target the test owns, with writing flags.
    let secret = d.outside.join("secret");
    let s =
        d.c.symlink(ROOT_ID, "sec", secret.as_os_str().as_encoded_bytes())
            .unwrap();
    let before = d.snapshot();
    for flags in [
        libc::O_RDWR | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_APPEND,
    ] {
        assert_eq!(d.c.open(s.nodeid, flags as u32).unwrap_err(), libc::ELOOP);
    }
    // CREATE on the link's name must not follow it either.
    let r = d.c.create(
        ROOT_ID,
        "sec",
        (libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC) as u32,
        0o644,
        0,
    );
    assert_eq!(r.unwrap_err(), libc::ELOOP);
    before.assert_same(&d.snapshot(), "opening a symlink");
    assert_eq!(fs::read(&secret).unwrap(), SECRET);
    d.finish();
}

// ---- MKNOD / MKDIR ----------------------------------------------------------------------------

#[test]
fn mknod_makes_a_fifo_with_the_exact_mode() {
    let mut d = Daemon::start();
    let e =
        d.c.mknod(ROOT_ID, "fifo", libc::S_IFIFO | 0o666, 0, 0o022)
            .unwrap();
    assert_eq!(e.attr.mode, libc::S_IFIFO | 0o644);
    let md = fs::symlink_metadata(d.host("fifo")).unwrap();
    assert!(md.file_type().is_fifo());
    assert_eq!(md.mode() & 0o7777, 0o644);
    // FIFOs are served by the guest kernel; the daemon never opens them.
    assert_eq!(
        d.c.open(e.nodeid, libc::O_RDONLY as u32).unwrap_err(),
        libc::ENXIO
    );
    assert_eq!(
        d.c.mknod(ROOT_ID, "fifo", libc::S_IFIFO | 0o600, 0, 0)
            .unwrap_err(),
        libc::EEXIST
    );
    d.finish();
}

#[test]
fn mknod_makes_a_char_device_as_root_that_cannot_be_opened() {
    let mut d = Daemon::start();
    let rdev = fuse_dev(1, 3); // /dev/null
    let e =
        d.c.mknod(ROOT_ID, "null", libc::S_IFCHR | 0o600, rdev, 0)
            .unwrap();
    assert_eq!(e.attr.mode, libc::S_IFCHR | 0o600);
    assert_eq!(e.attr.rdev, rdev);
    let md = fs::symlink_metadata(d.host("null")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!((libc::major(md.rdev()), libc::minor(md.rdev())), (1, 3));

    for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
        assert_eq!(d.c.open(e.nodeid, flags as u32).unwrap_err(), libc::ENXIO);
    }
    // CREATE on the existing device name must not open it either.
    let r = d.c.create(
        ROOT_ID,
        "null",
        (libc::O_CREAT | libc::O_RDWR) as u32,
        0o600,
        0,
    );
    assert_eq!(r.unwrap_err(), libc::ENXIO);
    d.finish();
}

#[test]
fn mknod_of_a_device_as_an_unprivileged_caller_is_refused() {
    let mut d = Daemon::start();
    fs::create_dir(d.host("pub")).unwrap();
    fs::set_permissions(d.host("pub"), fs::Permissions::from_mode(0o777)).unwrap();
    let p = d.node("pub");
    let r = d.c.with_ctx(1000, 1000, 1, |c| {
        c.mknod(p, "dev", libc::S_IFCHR | 0o666, fuse_dev(1, 3), 0)
    });
    assert_eq!(r.unwrap_err(), libc::EPERM);
    assert!(!d.host("pub/dev").exists());
    // A FIFO is fine, and owned by the caller.
    let f =
        d.c.with_ctx(1000, 1000, 1, |c| {
            c.mknod(p, "fifo", libc::S_IFIFO | 0o600, 0, 0)
        })
        .unwrap();
    assert_eq!((f.attr.uid, f.attr.gid), (1000, 1000));
    assert_eq!(
        fs::symlink_metadata(d.host("pub/fifo")).unwrap().uid(),
        1000
    );
    d.finish();
}

#[test]
fn creating_as_another_caller_checks_their_group_not_the_daemons() {
    let mut d = Daemon::start();
    // root:root 0775: group members may write, the caller is not one.
    fs::create_dir(d.host("grp")).unwrap();
    fs::set_permissions(d.host("grp"), fs::Permissions::from_mode(0o775)).unwrap();
    let g = d.node("grp");
    let rw = (libc::O_CREAT | libc::O_RDWR) as u32;
    let r =
        d.c.with_ctx(1000, 1000, 1, |c| c.create(g, "x", rw, 0o644, 0));
    assert_eq!(r.unwrap_err(), libc::EACCES);
    // Group 1000 owning the directory lets the caller in.
    std::os::unix::fs::chown(d.host("grp"), Some(0), Some(1000)).unwrap();
    let (e, o) =
        d.c.with_ctx(1000, 1000, 1, |c| c.create(g, "x", rw, 0o644, 0))
            .unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1000, 1000));
    d.c.release(e.nodeid, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn mknod_of_a_regular_file_and_a_socket() {
    let mut d = Daemon::start();
    let e =
        d.c.mknod(ROOT_ID, "reg", libc::S_IFREG | 0o640, 0, 0)
            .unwrap();
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o640);
    assert!(fs::symlink_metadata(d.host("reg")).unwrap().is_file());
    let s =
        d.c.mknod(ROOT_ID, "sock", libc::S_IFSOCK | 0o600, 0, 0)
            .unwrap();
    assert_eq!(s.attr.mode & libc::S_IFMT, libc::S_IFSOCK);
    assert!(fs::symlink_metadata(d.host("sock"))
        .unwrap()
        .file_type()
        .is_socket());
    d.finish();
}

#[test]
fn mkdir_creates_a_directory_with_mode_minus_umask() {
    let mut d = Daemon::start();
    let e = d.c.mkdir(ROOT_ID, "dir", 0o777, 0o022).unwrap();
    assert_eq!(e.attr.mode, libc::S_IFDIR | 0o755);
    assert_eq!(e.attr.ino, ino(&d.host("dir")));
    let md = fs::metadata(d.host("dir")).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.mode() & 0o7777, 0o755);

    let sub = d.c.mkdir(e.nodeid, "sub", 0o700, 0).unwrap();
    assert!(sub.nodeid != e.nodeid);
    assert_eq!(
        fs::metadata(d.host("dir/sub")).unwrap().mode() & 0o7777,
        0o700
    );
    assert_eq!(
        d.c.mkdir(ROOT_ID, "dir", 0o777, 0).unwrap_err(),
        libc::EEXIST
    );
    let f = d.file("file", b"");
    assert_eq!(d.c.mkdir(f, "x", 0o777, 0).unwrap_err(), libc::ENOTDIR);
    d.finish();
}

// ---- UNLINK / RMDIR ---------------------------------------------------------------------------

#[test]
fn unlink_removes_the_host_name() {
    let mut d = Daemon::start();
    d.file("f", b"x");
    d.c.unlink(ROOT_ID, "f").unwrap();
    assert!(!d.host("f").exists());
    assert_eq!(d.c.unlink(ROOT_ID, "f").unwrap_err(), libc::ENOENT);
    assert_eq!(d.c.lookup(ROOT_ID, "f").unwrap_err(), libc::ENOENT);

    fs::create_dir(d.host("dir")).unwrap();
    assert_eq!(d.c.unlink(ROOT_ID, "dir").unwrap_err(), libc::EISDIR);
    assert!(d.host("dir").is_dir());
    d.finish();
}

#[test]
fn unlink_of_an_open_file_keeps_the_handle_usable() {
    let mut d = Daemon::start();
    let n = d.file("f", b"still here");
    let fh = d.open(n, libc::O_RDONLY);
    d.c.unlink(ROOT_ID, "f").unwrap();
    assert!(!d.host("f").exists());
    assert_eq!(d.c.read(n, fh, 0, 100).unwrap(), b"still here");
    assert_eq!(d.c.getattr(n, None).unwrap().attr.nlink, 0);
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn rmdir_removes_empty_directories_only() {
    let mut d = Daemon::start();
    fs::create_dir(d.host("empty")).unwrap();
    fs::create_dir(d.host("full")).unwrap();
    fs::write(d.host("full/f"), b"x").unwrap();
    fs::write(d.host("file"), b"x").unwrap();

    d.c.rmdir(ROOT_ID, "empty").unwrap();
    assert!(!d.host("empty").exists());
    assert_eq!(d.c.rmdir(ROOT_ID, "full").unwrap_err(), libc::ENOTEMPTY);
    assert!(d.host("full/f").exists());
    assert_eq!(d.c.rmdir(ROOT_ID, "file").unwrap_err(), libc::ENOTDIR);
    assert_eq!(d.c.rmdir(ROOT_ID, "missing").unwrap_err(), libc::ENOENT);
    d.finish();
}

// ---- RENAME / RENAME2 -------------------------------------------------------------------------

#[test]
fn rename_moves_between_directories_and_replaces() {
    let mut d = Daemon::start();
    fs::write(d.host("a"), b"A").unwrap();
    fs::write(d.host("b"), b"B").unwrap();
    fs::create_dir(d.host("dir")).unwrap();
    let dir = d.node("dir");

    d.c.rename(ROOT_ID, "a", dir, "moved").unwrap();
    assert!(!d.host("a").exists());
    assert_eq!(fs::read(d.host("dir/moved")).unwrap(), b"A");

    // Onto an existing name: replaced.
    d.c.rename(dir, "moved", ROOT_ID, "b").unwrap();
    assert_eq!(fs::read(d.host("b")).unwrap(), b"A");
    assert!(!d.host("dir/moved").exists());

    assert_eq!(
        d.c.rename(ROOT_ID, "missing", ROOT_ID, "x").unwrap_err(),
        libc::ENOENT
    );
    // A directory into itself.
    assert_eq!(
        d.c.rename(ROOT_ID, "dir", dir, "inner").unwrap_err(),
        libc::EINVAL
    );
    d.finish();
}

#[test]
fn rename2_noreplace_refuses_an_existing_target() {
    let mut d = Daemon::start();
    fs::write(d.host("a"), b"A").unwrap();
    fs::write(d.host("b"), b"B").unwrap();
    assert_eq!(
        d.c.rename2(ROOT_ID, "a", ROOT_ID, "b", RENAME_NOREPLACE)
            .unwrap_err(),
        libc::EEXIST
    );
    assert_eq!(fs::read(d.host("a")).unwrap(), b"A");
    assert_eq!(fs::read(d.host("b")).unwrap(), b"B");

    d.c.rename2(ROOT_ID, "a", ROOT_ID, "c", RENAME_NOREPLACE)
        .unwrap();
    assert!(!d.host("a").exists());
    assert_eq!(fs::read(d.host("c")).unwrap(), b"A");
    d.finish();
}

#[test]
fn rename2_exchange_swaps_the_two_names_on_the_host() {
    let mut d = Daemon::start();
    fs::write(d.host("a"), b"A").unwrap();
    fs::create_dir(d.host("dir")).unwrap();
    fs::write(d.host("dir/b"), b"B").unwrap();
    let dir = d.node("dir");
    d.c.rename2(ROOT_ID, "a", dir, "b", RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(fs::read(d.host("a")).unwrap(), b"B");
    assert_eq!(fs::read(d.host("dir/b")).unwrap(), b"A");
    assert_eq!(
        d.c.rename2(ROOT_ID, "a", ROOT_ID, "missing", RENAME_EXCHANGE)
            .unwrap_err(),
        libc::ENOENT
    );
    d.finish();
}

#[test]
fn rename2_whiteout_leaves_a_whiteout_device_as_root() {
    let mut d = Daemon::start();
    fs::write(d.host("a"), b"A").unwrap();
    d.c.rename2(ROOT_ID, "a", ROOT_ID, "b", RENAME_WHITEOUT)
        .unwrap();
    assert_eq!(fs::read(d.host("b")).unwrap(), b"A");
    let md = fs::symlink_metadata(d.host("a")).unwrap();
    assert!(md.file_type().is_char_device(), "{:o}", md.mode());
    assert_eq!(md.rdev(), 0);
    d.finish();
}

#[test]
fn rename2_with_unknown_flags_gets_einval() {
    let mut d = Daemon::start();
    fs::write(d.host("a"), b"A").unwrap();
    assert_eq!(
        d.c.rename2(ROOT_ID, "a", ROOT_ID, "b", 1 << 7).unwrap_err(),
        libc::EINVAL
    );
    assert_eq!(
        d.c.rename2(
            ROOT_ID,
            "a",
            ROOT_ID,
            "b",
            RENAME_NOREPLACE | RENAME_EXCHANGE
        )
        .unwrap_err(),
        libc::EINVAL
    );
    assert!(d.host("a").exists() && !d.host("b").exists());
    d.finish();
}

// ---- LINK -------------------------------------------------------------------------------------

#[test]
fn link_adds_a_second_name_for_the_same_inode() {
    let mut d = Daemon::start();
    let n = d.file("f", b"linked");
    fs::create_dir(d.host("dir")).unwrap();
    let dir = d.node("dir");
    let e = d.c.link(n, dir, "hard").unwrap();
    assert_eq!(e.nodeid, n);
    assert_eq!(e.attr.nlink, 2);
    let a = fs::metadata(d.host("f")).unwrap();
    let b = fs::metadata(d.host("dir/hard")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(fs::read(d.host("dir/hard")).unwrap(), b"linked");

    assert_eq!(d.c.link(n, ROOT_ID, "f").unwrap_err(), libc::EEXIST);
    assert_eq!(d.c.link(dir, ROOT_ID, "dirlink").unwrap_err(), libc::EPERM);
    d.finish();
}

#[test]
fn link_of_a_symlink_links_the_symlink_itself() {
    let mut d = Daemon::start();
    let secret = d.outside.join("secret");
    std::os::unix::fs::symlink(&secret, d.host("sl")).unwrap();
    let sl = d.node("sl");
    d.c.link(sl, ROOT_ID, "sl2").unwrap();
    let md = fs::symlink_metadata(d.host("sl2")).unwrap();
    assert!(md.file_type().is_symlink());
    assert_eq!(fs::metadata(&secret).unwrap().nlink(), 1);
    d.finish();
}

// ---- OPEN / CREATE ----------------------------------------------------------------------------

#[test]
fn open_read_only_reads_and_refuses_writes() {
    let mut d = Daemon::start();
    let n = d.file("f", b"contents");
    let o = d.c.open(n, libc::O_RDONLY as u32).unwrap();
    assert_eq!(d.c.read(n, o.fh, 0, 100).unwrap(), b"contents");
    assert_eq!(d.c.write(n, o.fh, 0, b"x").unwrap_err(), libc::EBADF);
    assert_eq!(fs::read(d.host("f")).unwrap(), b"contents");
    d.c.release(n, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn open_write_only_with_trunc_truncates_the_host_file() {
    let mut d = Daemon::start();
    let n = d.file("f", b"old contents");
    let fh = d.open(n, libc::O_WRONLY | libc::O_TRUNC);
    assert_eq!(fs::metadata(d.host("f")).unwrap().len(), 0);
    d.c.write(n, fh, 0, b"new").unwrap();
    assert_eq!(d.c.read(n, fh, 0, 10).unwrap_err(), libc::EBADF);
    assert_eq!(fs::read(d.host("f")).unwrap(), b"new");
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn open_with_append_appends_on_the_host() {
    let mut d = Daemon::start();
    let n = d.file("f", b"abc");
    let fh = d.open(n, libc::O_WRONLY | libc::O_APPEND);
    d.c.write(n, fh, 0, b"def").unwrap();
    assert_eq!(fs::read(d.host("f")).unwrap(), b"abcdef");
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn open_of_an_unknown_node_gets_ebadf() {
    let mut d = Daemon::start();
    assert_eq!(d.c.open(999_999, 0).unwrap_err(), libc::EBADF);
    d.finish();
}

#[test]
fn create_makes_a_file_owned_by_the_request_caller() {
    let mut d = Daemon::start();
    fs::create_dir(d.host("pub")).unwrap();
    fs::set_permissions(d.host("pub"), fs::Permissions::from_mode(0o777)).unwrap();
    let pubdir = d.node("pub");
    let pid = std::process::id();

    let (e, o) =
        d.c.with_ctx(1000, 1000, pid, |c| {
            c.create(
                pubdir,
                "owned",
                (libc::O_CREAT | libc::O_RDWR) as u32,
                0o666,
                0o022,
            )
        })
        .unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1000, 1000));
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o644);
    let md = fs::metadata(d.host("pub/owned")).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (1000, 1000, 0o644)
    );

    assert_eq!(d.c.write(e.nodeid, o.fh, 0, b"mine").unwrap(), 4);
    assert_eq!(fs::read(d.host("pub/owned")).unwrap(), b"mine");
    d.c.release(e.nodeid, o.fh, 0).unwrap();

    // Directories made by the caller are theirs too.
    let dir =
        d.c.with_ctx(1000, 1000, pid, |c| c.mkdir(pubdir, "sub", 0o755, 0))
            .unwrap();
    assert_eq!(dir.attr.uid, 1000);
    assert_eq!(fs::metadata(d.host("pub/sub")).unwrap().uid(), 1000);
    d.finish();
}

#[test]
fn create_as_an_unprivileged_caller_respects_directory_permissions() {
    let mut d = Daemon::start();
    // The shared directory is root's, mode 0755.
    let r = d.c.with_ctx(1000, 1000, 1, |c| {
        c.create(
            ROOT_ID,
            "nope",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o644,
            0,
        )
    });
    assert_eq!(r.unwrap_err(), libc::EACCES);
    let r =
        d.c.with_ctx(1000, 1000, 1, |c| c.mkdir(ROOT_ID, "nope", 0o755, 0));
    assert_eq!(r.unwrap_err(), libc::EACCES);
    assert!(!d.host("nope").exists());
    // The daemon's own credentials are restored afterwards.
    let (e, _) =
        d.c.create(
            ROOT_ID,
            "yes",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o644,
            0,
        )
        .unwrap();
    assert_eq!(e.attr.uid, 0);
    assert_eq!(fs::metadata(d.host("yes")).unwrap().uid(), 0);
    d.finish();
}

#[test]
fn create_with_excl_refuses_an_existing_name_and_without_it_opens_it() {
    let mut d = Daemon::start();
    fs::write(d.host("f"), b"kept").unwrap();
    let mode = fs::metadata(d.host("f")).unwrap().mode();
    let excl = (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32;
    assert_eq!(
        d.c.create(ROOT_ID, "f", excl, 0o600, 0).unwrap_err(),
        libc::EEXIST
    );
    let (e, o) =
        d.c.create(
            ROOT_ID,
            "f",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o600,
            0,
        )
        .unwrap();
    assert_eq!(e.attr.ino, ino(&d.host("f")));
    assert_eq!(d.c.read(e.nodeid, o.fh, 0, 10).unwrap(), b"kept");
    // The existing file keeps its mode (the CREATE mode applies to new files only).
    assert_eq!(fs::metadata(d.host("f")).unwrap().mode(), mode);
    d.c.release(e.nodeid, o.fh, 0).unwrap();

    // With O_TRUNC the existing file is emptied.
    let (e, o) =
        d.c.create(
            ROOT_ID,
            "f",
            (libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC) as u32,
            0o600,
            0,
        )
        .unwrap();
    assert_eq!(fs::metadata(d.host("f")).unwrap().len(), 0);
    d.c.release(e.nodeid, o.fh, 0).unwrap();
    d.finish();
}

// ---- READ / WRITE / FLUSH / RELEASE / FSYNC ---------------------------------------------------

#[test]
fn read_is_short_at_end_of_file() {
    let mut d = Daemon::start();
    let n = d.file("f", b"0123456789");
    let fh = d.open(n, libc::O_RDONLY);
    assert_eq!(d.c.read(n, fh, 0, 4).unwrap(), b"0123");
    assert_eq!(d.c.read(n, fh, 4, 100).unwrap(), b"456789");
    assert_eq!(d.c.read(n, fh, 10, 100).unwrap(), b"");
    assert_eq!(d.c.read(n, fh, 1 << 40, 100).unwrap(), b"");
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn write_of_one_mebibyte_lands_on_the_host() {
    let mut d = Daemon::start();
    let (e, o) =
        d.c.create(
            ROOT_ID,
            "big",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o644,
            0,
        )
        .unwrap();
    let data = pattern(1 << 20, 7);
    assert_eq!(d.c.write(e.nodeid, o.fh, 0, &data).unwrap(), 1 << 20);
    assert_eq!(fs::read(d.host("big")).unwrap(), data);

    // Read back in one request, and overwrite in the middle.
    assert_eq!(d.c.read(e.nodeid, o.fh, 0, 1 << 20).unwrap(), data);
    assert_eq!(d.c.write(e.nodeid, o.fh, 1000, b"MIDDLE").unwrap(), 6);
    let host = fs::read(d.host("big")).unwrap();
    assert_eq!(&host[1000..1006], b"MIDDLE");
    assert_eq!(&host[..1000], &data[..1000]);
    assert_eq!(&host[1006..], &data[1006..]);
    d.c.release(e.nodeid, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn write_beyond_the_end_leaves_a_hole() {
    let mut d = Daemon::start();
    let n = d.file("f", b"ab");
    let fh = d.open(n, libc::O_RDWR);
    d.c.write(n, fh, 10, b"z").unwrap();
    assert_eq!(fs::read(d.host("f")).unwrap(), b"ab\0\0\0\0\0\0\0\0z");
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn read_and_write_with_an_unknown_or_foreign_handle_get_ebadf() {
    let mut d = Daemon::start();
    let a = d.file("a", b"A");
    let b = d.file("b", b"B");
    let fa = d.open(a, libc::O_RDWR);
    assert_eq!(d.c.read(a, 777, 0, 1).unwrap_err(), libc::EBADF);
    // A handle of another node is refused, not used.
    assert_eq!(d.c.read(b, fa, 0, 1).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.write(b, fa, 0, b"x").unwrap_err(), libc::EBADF);
    assert_eq!(fs::read(d.host("a")).unwrap(), b"A");
    assert_eq!(fs::read(d.host("b")).unwrap(), b"B");
    d.finish();
}

#[test]
fn flush_succeeds_on_an_open_handle_only() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    let fh = d.open(n, libc::O_RDWR);
    d.c.write(n, fh, 0, b"y").unwrap();
    d.c.flush(n, fh, 0x1234).unwrap();
    assert_eq!(fs::read(d.host("f")).unwrap(), b"y");
    // The handle stays usable after FLUSH.
    assert_eq!(d.c.read(n, fh, 0, 1).unwrap(), b"y");
    assert_eq!(d.c.flush(n, fh + 100, 0).unwrap_err(), libc::EBADF);
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn release_closes_the_handle_and_unknown_handles_get_ebadf() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    let fh = d.open(n, libc::O_RDONLY);
    d.c.release(n, fh, 0).unwrap();
    assert_eq!(d.c.read(n, fh, 0, 1).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.release(n, fh, 0).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.release(n, 424_242, 0).unwrap_err(), libc::EBADF);
    d.finish();
}

#[test]
fn fsync_and_fdatasync_succeed_on_open_handles() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    let fh = d.open(n, libc::O_RDWR);
    d.c.write(n, fh, 0, b"synced").unwrap();
    d.c.fsync(n, fh, false).unwrap();
    d.c.fsync(n, fh, true).unwrap();
    assert_eq!(fs::read(d.host("f")).unwrap(), b"synced");
    assert_eq!(d.c.fsync(n, 999_999, false).unwrap_err(), libc::EBADF);
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

// ---- OPENDIR / READDIR / READDIRPLUS / RELEASEDIR / FSYNCDIR ----------------------------------

/// Fills the share with one entry of each type plus `extra` regular files.
fn populate_types(d: &Daemon, extra: usize) {
    fs::write(d.host("reg"), b"r").unwrap();
    fs::create_dir(d.host("dir")).unwrap();
    std::os::unix::fs::symlink("reg", d.host("lnk")).unwrap();
    let fifo = std::ffi::CString::new(d.host("fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `fifo` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    drop(std::os::unix::net::UnixListener::bind(d.host("sock")).unwrap());
    for i in 0..extra {
        fs::write(d.host(format!("file-{i:03}")), b"").unwrap();
    }
}

fn expected_types(extra: usize) -> BTreeMap<Vec<u8>, u32> {
    let mut m: BTreeMap<Vec<u8>, u32> = [
        (&b"."[..], libc::DT_DIR),
        (b"..", libc::DT_DIR),
        (b"reg", libc::DT_REG),
        (b"dir", libc::DT_DIR),
        (b"lnk", libc::DT_LNK),
        (b"fifo", libc::DT_FIFO),
        (b"sock", libc::DT_SOCK),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_vec(), u32::from(t)))
    .collect();
    for i in 0..extra {
        m.insert(format!("file-{i:03}").into_bytes(), u32::from(libc::DT_REG));
    }
    m
}

/// Reads a whole directory with `size`-byte READDIR requests, following the offsets.
fn readdir_all(d: &mut Daemon, node: u64, fh: u64, size: u32) -> Vec<DirEntry> {
    let mut all = Vec::new();
    let mut off = 0;
    for _ in 0..10_000 {
        let batch = d.c.readdir(node, fh, off, size).unwrap();
        if batch.is_empty() {
            return all;
        }
        for e in &batch {
            assert!(e.off > off, "offset {} does not advance past {off}", e.off);
            off = e.off;
        }
        all.extend(batch);
    }
    panic!("READDIR never reached the end");
}

#[test]
fn readdir_lists_every_entry_with_its_type() {
    let mut d = Daemon::start();
    populate_types(&d, 0);
    let o = d.c.opendir(ROOT_ID, libc::O_RDONLY as u32).unwrap();
    let entries = d.c.readdir(ROOT_ID, o.fh, 0, 64 << 10).unwrap();

    let got: BTreeMap<Vec<u8>, u32> = entries.iter().map(|e| (e.name.clone(), e.typ)).collect();
    assert_eq!(got.len(), entries.len(), "duplicate names: {entries:?}");
    assert_eq!(got, expected_types(0));
    for e in &entries {
        if e.name != b"." && e.name != b".." {
            let name = String::from_utf8(e.name.clone()).unwrap();
            assert_eq!(e.ino, ino(&d.host(&name)), "ino of {name}");
        }
    }
    // The end of the listing is an empty reply.
    let last = entries.last().unwrap().off;
    assert!(d.c.readdir(ROOT_ID, o.fh, last, 4096).unwrap().is_empty());
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn readdir_with_a_small_buffer_has_stable_offsets_and_no_duplicates() {
    let mut d = Daemon::start();
    populate_types(&d, 40);
    let expected = expected_types(40);
    let o = d.c.opendir(ROOT_ID, 0).unwrap();

    let big = d.c.readdir(ROOT_ID, o.fh, 0, 64 << 10).unwrap();
    // 100 bytes: three short records per reply.
    let first = readdir_all(&mut d, ROOT_ID, o.fh, 100);
    let second = readdir_all(&mut d, ROOT_ID, o.fh, 100);
    assert!(first.len() > 3);
    assert_eq!(first, second, "offsets changed between two passes");
    assert_eq!(
        first, big,
        "small-buffer listing differs from a one-shot listing"
    );

    let names: BTreeSet<&[u8]> = first.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(names.len(), first.len(), "duplicate entries");
    let got: BTreeMap<Vec<u8>, u32> = first.iter().map(|e| (e.name.clone(), e.typ)).collect();
    assert_eq!(got, expected);

    // Resuming from an offset in the middle continues right after that entry.
    let resumed = d.c.readdir(ROOT_ID, o.fh, first[9].off, 64 << 10).unwrap();
    assert_eq!(resumed.as_slice(), &first[10..]);
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();

    // A second handle sees the same listing.
    let o2 = d.c.opendir(ROOT_ID, 0).unwrap();
    let other = readdir_all(&mut d, ROOT_ID, o2.fh, 256);
    let other_names: BTreeSet<&[u8]> = other.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(other_names, names);
    d.c.releasedir(ROOT_ID, o2.fh, 0).unwrap();
    d.finish();
}

#[test]
fn readdir_of_a_subdirectory_and_of_a_file() {
    let mut d = Daemon::start();
    fs::create_dir(d.host("dir")).unwrap();
    fs::write(d.host("dir/inner"), b"").unwrap();
    let dir = d.node("dir");
    let o = d.c.opendir(dir, 0).unwrap();
    let names: BTreeSet<Vec<u8>> =
        d.c.readdir(dir, o.fh, 0, 4096)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
    let want: BTreeSet<Vec<u8>> = [&b"."[..], b"..", b"inner"]
        .iter()
        .map(|n| n.to_vec())
        .collect();
    assert_eq!(names, want);
    // The directory handle is bound to its node.
    assert_eq!(
        d.c.readdir(ROOT_ID, o.fh, 0, 4096).unwrap_err(),
        libc::EBADF
    );
    d.c.releasedir(dir, o.fh, 0).unwrap();

    let f = d.file("f", b"");
    assert_eq!(d.c.opendir(f, 0).unwrap_err(), libc::ENOTDIR);
    // A file handle is not a directory handle.
    let fh = d.open(f, libc::O_RDONLY);
    assert_eq!(d.c.readdir(f, fh, 0, 4096).unwrap_err(), libc::ENOTDIR);
    d.finish();
}

#[test]
fn readdirplus_hands_out_usable_node_ids_except_for_dot_and_dotdot() {
    let mut d = Daemon::start();
    populate_types(&d, 3);
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    let entries = d.c.readdirplus(ROOT_ID, o.fh, 0, 64 << 10).unwrap();

    let got: BTreeMap<Vec<u8>, u32> = entries
        .iter()
        .map(|e| (e.dirent.name.clone(), e.dirent.typ))
        .collect();
    assert_eq!(got.len(), entries.len());
    assert_eq!(got, expected_types(3));
    let mut forgets = Vec::new();
    for e in &entries {
        let name = &e.dirent.name;
        if name == b"." || name == b".." {
            assert_eq!(
                e.entry.nodeid,
                0,
                "{:?} has a node id",
                String::from_utf8_lossy(name)
            );
            continue;
        }
        assert_ne!(e.entry.nodeid, 0);
        assert_eq!(e.entry.attr.ino, e.dirent.ino);
        let a = d.c.getattr(e.entry.nodeid, None).unwrap();
        assert_eq!(a.attr.ino, e.dirent.ino);
        let want_type = match e.dirent.typ as u8 {
            libc::DT_REG => libc::S_IFREG,
            libc::DT_DIR => libc::S_IFDIR,
            libc::DT_LNK => libc::S_IFLNK,
            libc::DT_FIFO => libc::S_IFIFO,
            libc::DT_SOCK => libc::S_IFSOCK,
            t => panic!("unexpected type {t}"),
        };
        assert_eq!(a.attr.mode & libc::S_IFMT, want_type);
        assert_eq!(e.entry.attr.mode, a.attr.mode);
        forgets.push((e.entry.nodeid, 1));
    }
    // The node ids agree with LOOKUP's.
    let reg = entries.iter().find(|e| e.dirent.name == b"reg").unwrap();
    assert_eq!(d.node("reg"), reg.entry.nodeid);
    d.c.batch_forget(&forgets);
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn readdirplus_hands_out_exactly_one_reference_per_entry_served() {
    let mut d = Daemon::start();
    for i in 0..9 {
        fs::write(d.host(format!("f{i}")), b"").unwrap();
    }
    fs::create_dir(d.host("dir")).unwrap();
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    // Small replies: the daemon looks entries up and must give back the reference of each
    // entry that did not fit.
    let mut refs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut off = 0;
    for _ in 0..2 {
        loop {
            let b = d.c.readdirplus(ROOT_ID, o.fh, off, 400).unwrap();
            let Some(last) = b.last() else { break };
            off = last.dirent.off;
            for e in b.iter().filter(|e| e.entry.nodeid != 0) {
                *refs.entry(e.entry.nodeid).or_default() += 1;
            }
        }
        off = 0;
    }
    assert_eq!(refs.len(), 10);
    assert!(refs.values().all(|&n| n == 2));
    // Giving back exactly what was handed out drops every node id.
    let all: Vec<(u64, u64)> = refs.into_iter().collect();
    d.c.batch_forget(&all);
    for (n, _) in &all {
        assert_eq!(
            d.c.getattr(*n, None).unwrap_err(),
            libc::EBADF,
            "node {n} still referenced"
        );
    }
    // And the names can be looked up again.
    assert_eq!(
        d.c.lookup(ROOT_ID, "f0").unwrap().attr.ino,
        ino(&d.host("f0"))
    );
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn readdirplus_with_a_small_buffer_has_no_duplicates() {
    let mut d = Daemon::start();
    populate_types(&d, 10);
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    let mut all = Vec::new();
    let mut off = 0;
    loop {
        // Room for two records.
        let batch = d.c.readdirplus(ROOT_ID, o.fh, off, 400).unwrap();
        if batch.is_empty() {
            break;
        }
        assert!(batch.len() <= 2);
        off = batch.last().unwrap().dirent.off;
        all.extend(batch);
    }
    let names: BTreeSet<Vec<u8>> = all.iter().map(|e| e.dirent.name.clone()).collect();
    assert_eq!(names.len(), all.len());
    assert_eq!(names, expected_types(10).into_keys().collect());
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn releasedir_and_fsyncdir() {
    let mut d = Daemon::start();
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    d.c.fsyncdir(ROOT_ID, o.fh, false).unwrap();
    d.c.fsyncdir(ROOT_ID, o.fh, true).unwrap();
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    assert_eq!(
        d.c.readdir(ROOT_ID, o.fh, 0, 4096).unwrap_err(),
        libc::EBADF
    );
    assert_eq!(d.c.releasedir(ROOT_ID, o.fh, 0).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.fsyncdir(ROOT_ID, o.fh, false).unwrap_err(), libc::EBADF);
    d.finish();
}

// ---- STATFS / ACCESS --------------------------------------------------------------------------

#[test]
fn statfs_reports_the_host_file_system() {
    let mut d = Daemon::start();
    let s = d.c.statfs(ROOT_ID).unwrap();
    let p = std::ffi::CString::new(d.share.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs64 is plain data; `p` is NUL-terminated.
    let mut host: libc::statvfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs64(p.as_ptr(), &mut host) }, 0);
    assert_eq!(s.blocks, host.f_blocks);
    assert_eq!(u64::from(s.bsize), host.f_bsize);
    assert_eq!(u64::from(s.frsize), host.f_frsize);
    assert_eq!(s.namelen, 255);
    assert_eq!(s.files, host.f_files);
    let f = d.file("f", b"");
    assert_eq!(d.c.statfs(f).unwrap().blocks, host.f_blocks);
    d.finish();
}

#[test]
fn access_checks_the_callers_permissions() {
    let mut d = Daemon::start();
    let secret = d.file("private", b"x");
    fs::set_permissions(d.host("private"), fs::Permissions::from_mode(0o600)).unwrap();
    let public = d.file("public", b"x");
    fs::set_permissions(d.host("public"), fs::Permissions::from_mode(0o644)).unwrap();
    let (r, w, x) = (libc::R_OK as u32, libc::W_OK as u32, libc::X_OK as u32);

    // Root reads and writes everything, but executes only what has an x bit.
    d.c.access(secret, r | w).unwrap();
    d.c.access(secret, libc::F_OK as u32).unwrap();
    assert_eq!(d.c.access(public, x).unwrap_err(), libc::EACCES);
    d.c.access(ROOT_ID, r | w | x).unwrap();

    // Another user.
    d.c.with_ctx(1000, 1000, 1, |c| {
        assert_eq!(c.access(secret, r).unwrap_err(), libc::EACCES);
        c.access(secret, libc::F_OK as u32).unwrap();
        c.access(public, r).unwrap();
        assert_eq!(c.access(public, w).unwrap_err(), libc::EACCES);
        c.access(ROOT_ID, r | x).unwrap();
        assert_eq!(c.access(ROOT_ID, w).unwrap_err(), libc::EACCES);
    });
    assert_eq!(d.c.access(777_777, r).unwrap_err(), libc::EBADF);
    d.finish();
}

// ---- XATTR ------------------------------------------------------------------------------------

#[test]
fn xattrs_round_trip_to_the_host() {
    let mut d = Daemon::with(Options::default().xattr());
    let n = d.file("f", b"x");
    let path = d.host("f");

    d.c.setxattr(n, "user.color", b"blue", 0).unwrap();
    assert_eq!(host_getxattr(&path, b"user.color").unwrap(), b"blue");

    assert_eq!(
        d.c.getxattr(n, "user.color", 0).unwrap(),
        XattrReply::Size(4)
    );
    assert_eq!(
        d.c.getxattr(n, "user.color", 64).unwrap(),
        XattrReply::Data(b"blue".to_vec())
    );
    assert_eq!(d.c.getxattr(n, "user.color", 2).unwrap_err(), libc::ERANGE);

    host_setxattr(&path, b"user.host", b"made on the host");
    let XattrReply::Size(len) = d.c.listxattr(n, 0).unwrap() else {
        panic!("size probe answered with data");
    };
    let XattrReply::Data(list) = d.c.listxattr(n, len).unwrap() else {
        panic!("list answered with a size");
    };
    assert_eq!(list.len(), len as usize);
    let names: BTreeSet<&[u8]> = list.split(|&b| b == 0).filter(|s| !s.is_empty()).collect();
    assert!(names.contains(&b"user.color"[..]) && names.contains(&b"user.host"[..]));
    if len > 1 {
        assert_eq!(d.c.listxattr(n, 1).unwrap_err(), libc::ERANGE);
    }

    // XATTR_CREATE on an existing name, XATTR_REPLACE on a missing one.
    assert_eq!(
        d.c.setxattr(n, "user.color", b"red", libc::XATTR_CREATE as u32)
            .unwrap_err(),
        libc::EEXIST
    );
    assert_eq!(
        d.c.setxattr(n, "user.none", b"v", libc::XATTR_REPLACE as u32)
            .unwrap_err(),
        libc::ENODATA
    );
    d.c.setxattr(n, "user.color", b"red", libc::XATTR_REPLACE as u32)
        .unwrap();
    assert_eq!(host_getxattr(&path, b"user.color").unwrap(), b"red");

    d.c.removexattr(n, "user.color").unwrap();
    assert_eq!(host_getxattr(&path, b"user.color"), None);
    assert_eq!(
        d.c.getxattr(n, "user.color", 64).unwrap_err(),
        libc::ENODATA
    );
    assert_eq!(d.c.removexattr(n, "user.color").unwrap_err(), libc::ENODATA);

    // On a directory too.
    d.c.setxattr(ROOT_ID, "user.dir", b"d", 0).unwrap();
    assert_eq!(host_getxattr(&d.share, b"user.dir").unwrap(), b"d");
    d.finish();
}

#[test]
fn setxattr_in_the_pre_7_33_format_works_after_a_5_4_init() {
    let mut d = Daemon::with(Options::default().xattr().no_init());
    d.c.init_compat().unwrap();
    let n = d.file("f", b"x");
    d.c.setxattr(n, "user.old", b"format", 0).unwrap();
    assert_eq!(host_getxattr(&d.host("f"), b"user.old").unwrap(), b"format");
    d.finish();
}

#[test]
fn xattr_requests_on_a_symlink_never_reach_its_target() {
    let mut d = Daemon::with(Options::default().xattr());
    let secret = d.outside.join("secret");
    host_setxattr(&secret, b"user.hidden", b"outside value");
    std::os::unix::fs::symlink(&secret, d.host("sl")).unwrap();
    let before = d.snapshot();
    let sl = d.node("sl");

    // Linux refuses user.* attributes on symlinks.
    assert_eq!(
        d.c.setxattr(sl, "user.evil", b"x", 0).unwrap_err(),
        libc::EPERM
    );
    match d.c.getxattr(sl, "user.hidden", 256) {
        Ok(v) => panic!("read the symlink target's xattr through the link: {v:?}"),
        Err(e) => assert!(
            e == libc::ENODATA || e == libc::EPERM || e == libc::ELOOP,
            "{e}"
        ),
    }
    if let Ok(XattrReply::Data(list)) = d.c.listxattr(sl, 4096) {
        assert!(
            !list.windows(11).any(|w| w == b"user.hidden"),
            "listed the symlink target's xattrs"
        );
    }
    assert_eq!(d.c.removexattr(sl, "user.hidden").unwrap_err(), libc::EPERM);
    before.assert_same(&d.snapshot(), "xattr requests on a symlink");
    d.finish();
}

#[test]
fn xattr_requests_get_enosys_when_xattrs_are_disabled() {
    let mut d = Daemon::start();
    let n = d.file("f", b"x");
    assert_eq!(
        d.c.setxattr(n, "user.a", b"v", 0).unwrap_err(),
        libc::ENOSYS
    );
    assert_eq!(d.c.getxattr(n, "user.a", 64).unwrap_err(), libc::ENOSYS);
    assert_eq!(d.c.getxattr(n, "user.a", 0).unwrap_err(), libc::ENOSYS);
    assert_eq!(d.c.listxattr(n, 0).unwrap_err(), libc::ENOSYS);
    assert_eq!(d.c.removexattr(n, "user.a").unwrap_err(), libc::ENOSYS);
    assert_eq!(host_getxattr(&d.host("f"), b"user.a"), None);
    d.finish();
}

// ---- FALLOCATE / LSEEK / COPY_FILE_RANGE ------------------------------------------------------

#[test]
fn fallocate_reserves_space_and_punches_holes() {
    let mut d = Daemon::start();
    let n = d.file("f", b"");
    let fh = d.open(n, libc::O_RDWR);
    d.c.fallocate(n, fh, 0, 16384, 0).unwrap();
    let md = fs::metadata(d.host("f")).unwrap();
    assert_eq!(md.len(), 16384);
    assert!(md.blocks() >= 32, "{} blocks", md.blocks());

    // KEEP_SIZE beyond the end: size unchanged.
    d.c.fallocate(n, fh, 16384, 16384, libc::FALLOC_FL_KEEP_SIZE as u32)
        .unwrap();
    assert_eq!(fs::metadata(d.host("f")).unwrap().len(), 16384);

    d.c.write(n, fh, 0, &[0xff; 8192]).unwrap();
    d.c.fallocate(
        n,
        fh,
        0,
        4096,
        (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32,
    )
    .unwrap();
    let data = fs::read(d.host("f")).unwrap();
    assert!(data[..4096].iter().all(|&b| b == 0));
    assert!(data[4096..8192].iter().all(|&b| b == 0xff));

    assert_eq!(d.c.fallocate(n, 31337, 0, 10, 0).unwrap_err(), libc::EBADF);
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn lseek_finds_data_and_holes() {
    let mut d = Daemon::start();
    {
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(d.host("sparse")).unwrap();
        f.write_all_at(&[b'A'; 4096], 0).unwrap();
        f.write_all_at(&[b'B'; 4096], 1 << 20).unwrap();
    }
    let size = (1 << 20) + 4096;
    let n = d.node("sparse");
    let fh = d.open(n, libc::O_RDONLY);
    let (data, hole) = (libc::SEEK_DATA as u32, libc::SEEK_HOLE as u32);

    assert_eq!(d.c.lseek(n, fh, 0, data).unwrap(), 0);
    assert_eq!(d.c.lseek(n, fh, 0, hole).unwrap(), 4096);
    assert_eq!(d.c.lseek(n, fh, 4096, data).unwrap(), 1 << 20);
    assert_eq!(d.c.lseek(n, fh, 1 << 20, hole).unwrap(), size);
    assert_eq!(d.c.lseek(n, fh, size + 10, data).unwrap_err(), libc::ENXIO);
    assert_eq!(d.c.lseek(n, fh, 5, libc::SEEK_SET as u32).unwrap(), 5);
    assert_eq!(d.c.lseek(n, fh, 0, libc::SEEK_END as u32).unwrap(), size);
    assert_eq!(d.c.lseek(n, fh, 0, 99).unwrap_err(), libc::EINVAL);
    assert_eq!(d.c.lseek(n, 55_555, 0, data).unwrap_err(), libc::EBADF);
    d.c.release(n, fh, 0).unwrap();
    d.finish();
}

#[test]
fn copy_file_range_copies_between_host_files() {
    let mut d = Daemon::start();
    let src_data = pattern(200, 3);
    let src = d.file("src", &src_data);
    let dst = d.file("dst", b"");
    let fin = d.open(src, libc::O_RDONLY);
    let fout = d.open(dst, libc::O_WRONLY);
    let arg = abi::CopyFileRangeIn {
        fh_in: fin,
        off_in: 10,
        nodeid_out: dst,
        fh_out: fout,
        off_out: 5,
        len: 100,
        flags: 0,
    };
    assert_eq!(d.c.copy_file_range(src, &arg).unwrap(), 100);
    let out = fs::read(d.host("dst")).unwrap();
    assert_eq!(&out[..5], &[0; 5]);
    assert_eq!(&out[5..], &src_data[10..110]);

    let bad_flags = abi::CopyFileRangeIn { flags: 1, ..arg };
    assert_eq!(
        d.c.copy_file_range(src, &bad_flags).unwrap_err(),
        libc::EINVAL
    );
    let bad_fh = abi::CopyFileRangeIn {
        fh_out: 99_999,
        ..arg
    };
    assert_eq!(d.c.copy_file_range(src, &bad_fh).unwrap_err(), libc::EBADF);
    // Copying past the end of the source copies nothing.
    let past = abi::CopyFileRangeIn {
        off_in: 1000,
        ..arg
    };
    assert_eq!(d.c.copy_file_range(src, &past).unwrap(), 0);
    d.finish();
}

// ---- TMPFILE / SYNCFS / DESTROY / unknown -----------------------------------------------------

#[test]
fn tmpfile_makes_an_unnamed_file_that_link_can_name() {
    let mut d = Daemon::start();
    let (e, o) =
        d.c.tmpfile(ROOT_ID, libc::O_RDWR as u32, 0o640, 0o022)
            .unwrap();
    assert_ne!(e.nodeid, 0);
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o640);
    assert_eq!(e.attr.nlink, 0);
    assert_eq!(
        fs::read_dir(&d.share).unwrap().count(),
        0,
        "tmpfile has a name"
    );

    d.c.write(e.nodeid, o.fh, 0, b"anonymous").unwrap();
    assert_eq!(d.c.read(e.nodeid, o.fh, 0, 100).unwrap(), b"anonymous");
    d.c.link(e.nodeid, ROOT_ID, "named").unwrap();
    assert_eq!(fs::read(d.host("named")).unwrap(), b"anonymous");
    assert_eq!(
        fs::metadata(d.host("named")).unwrap().mode() & 0o7777,
        0o640
    );
    d.c.release(e.nodeid, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn syncfs_succeeds() {
    let mut d = Daemon::start();
    d.file("f", b"x");
    d.c.syncfs().unwrap();
    d.finish();
}

#[test]
fn destroy_ends_the_session_until_a_new_init() {
    let mut d = Daemon::start();
    fs::write(d.host("f"), b"x").unwrap();
    let n = d.node("f");
    let fh = d.open(n, libc::O_RDONLY);
    d.c.destroy().unwrap();

    assert_eq!(d.c.lookup(ROOT_ID, "f").unwrap_err(), libc::EIO);
    assert_eq!(d.c.getattr(ROOT_ID, None).unwrap_err(), libc::EIO);
    assert_eq!(d.c.read(n, fh, 0, 1).unwrap_err(), libc::EIO);
    assert_eq!(d.c.mkdir(ROOT_ID, "dir", 0o755, 0).unwrap_err(), libc::EIO);
    assert!(!d.host("dir").exists());

    d.c.init().unwrap();
    let e = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!(e.attr.size, 1);
    // Handles of the old session are gone.
    assert_eq!(d.c.read(e.nodeid, fh, 0, 1).unwrap_err(), libc::EBADF);
    d.finish();
}

#[test]
fn unknown_and_unimplemented_opcodes_get_enosys() {
    let mut d = Daemon::start();
    for op in [
        0,
        7,
        19,
        opcode::BMAP,
        opcode::IOCTL,
        opcode::POLL,
        opcode::SETUPMAPPING,
        opcode::REMOVEMAPPING,
        opcode::STATX,
        53,
        4096,
        9999,
        u32::MAX,
    ] {
        let r = d.c.request(op, ROOT_ID, &[&[0u8; 64]], 256).unwrap();
        assert_eq!(r.errno(), Some(libc::ENOSYS), "opcode {op}");
    }
    assert!(d.c.getattr(ROOT_ID, None).is_ok());
    d.finish();
}

#[test]
fn interrupt_gets_no_reply() {
    let mut d = Daemon::start();
    let mut hp = d.fe.hiprio_client().unwrap();
    let arg = abi::InterruptIn { unique: 12345 };
    let req = build_request(
        hp.next_unique() | 1,
        opcode::INTERRUPT,
        0,
        hp.ctx(),
        &[arg.as_bytes()],
    );
    let c = hp.request_raw(&[&req], 64).unwrap();
    assert_eq!(c.used_len, 0);
    assert!(d.c.getattr(ROOT_ID, None).is_ok());
    d.finish();
}

// ---- directory listings across changes (doc/caching.md) ---------------------------------------

fn names(entries: &[DirEntry]) -> BTreeSet<Vec<u8>> {
    entries.iter().map(|e| e.name.clone()).collect()
}

#[test]
fn readdir_offsets_survive_changes_and_a_rewind_sees_them() {
    let mut d = Daemon::start();
    for i in 0..30 {
        fs::write(d.host(format!("file-{i:02}")), b"").unwrap();
    }
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    let full = readdir_all(&mut d, ROOT_ID, o.fh, 64 << 10);

    // Read the first part with a small buffer, change the directory, read the rest.
    let mut first = Vec::new();
    let mut off = 0;
    while first.len() < 10 {
        let b = d.c.readdir(ROOT_ID, o.fh, off, 100).unwrap();
        off = b.last().unwrap().off;
        first.extend(b);
    }
    fs::remove_file(d.host("file-20")).unwrap();
    fs::write(d.host("added"), b"").unwrap();
    d.c.mkdir(ROOT_ID, "added-dir", 0o755, 0).unwrap();
    let mut rest = Vec::new();
    loop {
        let b = d.c.readdir(ROOT_ID, o.fh, off, 100).unwrap();
        let Some(last) = b.last() else { break };
        off = last.off;
        rest.extend(b);
    }
    first.extend(rest);
    assert_eq!(
        first, full,
        "a listing in progress changed under its offsets"
    );

    // A READDIR at offset 0 starts over and sees the changes.
    let again = d.c.readdir(ROOT_ID, o.fh, 0, 64 << 10).unwrap();
    let n = names(&again);
    assert!(n.contains(&b"added"[..]) && n.contains(&b"added-dir"[..]));
    assert!(!n.contains(&b"file-20"[..]));
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    d.finish();
}

#[test]
fn readdirplus_skips_entries_removed_after_the_snapshot() {
    let mut d = Daemon::start();
    for i in 0..6 {
        fs::write(d.host(format!("f{i}")), b"").unwrap();
    }
    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    // Room for one record: the snapshot is taken, one entry served.
    let first = d.c.readdirplus(ROOT_ID, o.fh, 0, 200).unwrap();
    assert_eq!(first.len(), 1);
    let listed = d.c.readdir(ROOT_ID, o.fh, 0, 64 << 10).unwrap();
    for e in &listed {
        if e.name.starts_with(b"f") {
            fs::remove_file(d.host(String::from_utf8(e.name.clone()).unwrap())).unwrap();
        }
    }
    // The snapshot (taken at offset 0 above) still names the files; they are gone.
    let rest =
        d.c.readdirplus(ROOT_ID, o.fh, listed[0].off, 64 << 10)
            .unwrap();
    for e in &rest {
        assert!(
            !e.dirent.name.starts_with(b"f"),
            "a removed file was served with node id {}",
            e.entry.nodeid
        );
    }
    d.c.releasedir(ROOT_ID, o.fh, 0).unwrap();
    d.finish();
}

/// Polls until `dir`'s change and modification times are more than a second old, so that the
/// daemon may share a snapshot of it between handles (bounded).
fn wait_until_settled(dir: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let md = fs::metadata(dir).unwrap();
    let newest = std::cmp::max(
        Duration::new(md.ctime() as u64, md.ctime_nsec() as u32),
        Duration::new(md.mtime() as u64, md.mtime_nsec() as u32),
    );
    while SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
        < newest + Duration::from_millis(1050)
    {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn shared_directory_snapshots_never_hide_a_change() {
    // `metadata` lets the guest keep a listing while it is unchanged (`auto` serves it again).
    let mut d = Daemon::with(Options::default().cache(CacheMode::Metadata));
    fs::create_dir(d.host("dir")).unwrap();
    for i in 0..5 {
        fs::write(d.host(format!("dir/f{i}")), b"").unwrap();
    }
    let dir = d.node("dir");
    wait_until_settled(&d.host("dir"));
    let list = |d: &mut Daemon| -> (u32, BTreeSet<Vec<u8>>) {
        let o = d.c.opendir(dir, 0).unwrap();
        let all = readdir_all(d, dir, o.fh, 4096);
        d.c.releasedir(dir, o.fh, 0).unwrap();
        (o.open_flags, names(&all))
    };

    let (flags1, l1) = list(&mut d);
    assert_ne!(flags1 & abi::fopen::CACHE_DIR, 0);
    // Unchanged since it was served: the guest may keep its cached listing, and the daemon
    // serves the shared snapshot.
    let (flags2, l2) = list(&mut d);
    assert_eq!(l2, l1);
    assert_ne!(flags2 & abi::fopen::KEEP_CACHE, 0, "flags {flags2:#x}");

    // Host changes right after a shared snapshot was served (same clock tick).
    fs::rename(d.host("dir/f1"), d.host("dir/g1")).unwrap();
    let (flags3, l3) = list(&mut d);
    assert_eq!(
        flags3 & abi::fopen::KEEP_CACHE,
        0,
        "stale listing kept: {flags3:#x}"
    );
    assert!(
        l3.contains(&b"g1"[..]) && !l3.contains(&b"f1"[..]),
        "{l3:?}"
    );
    fs::remove_file(d.host("dir/f2")).unwrap();
    fs::write(d.host("dir/h"), b"").unwrap();
    let (_, l4) = list(&mut d);
    assert!(l4.contains(&b"h"[..]) && !l4.contains(&b"f2"[..]), "{l4:?}");

    // A change through the daemon.
    d.c.mkdir(dir, "made", 0o755, 0).unwrap();
    let (flags5, l5) = list(&mut d);
    assert_eq!(
        flags5 & abi::fopen::KEEP_CACHE,
        0,
        "stale listing kept: {flags5:#x}"
    );
    assert!(l5.contains(&b"made"[..]));
    d.finish();
}
