//! Daemon-side uid/gid translation (`--translate-uid`, `--translate-gid`) end to end: requests
//! from the test frontend with guest credentials, checked against host ownership afterwards.
//!
//! Ownership on the host follows the guest only when the daemon runs as root (it then creates
//! files as the caller); the tests that depend on it are skipped otherwise.

use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use common::*;
use virtiofsd::fuse::abi::{fattr, ROOT_ID};
use virtiofsd_frontend::XattrReply;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");
const RDWR: u32 = libc::O_RDWR as u32;

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Skips the calling test (returns true) when not running as root.
fn skip_unless_root(what: &str) -> bool {
    if !as_root() {
        eprintln!("skipped: {what} needs root");
        return true;
    }
    false
}

/// A daemon with these rules whose shared directory anyone may create in.
fn start(uid: &[&str], gid: &[&str]) -> Daemon {
    let d = Daemon::with(Options::default().translate_uid(uid).translate_gid(gid));
    fs::set_permissions(&d.share, fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn host_owner(d: &Daemon, rel: &str) -> (u32, u32) {
    let md = fs::symlink_metadata(d.host(rel)).unwrap();
    (md.uid(), md.gid())
}

fn chown(p: &std::path::Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

#[test]
fn create_as_a_mapped_guest_uid_lands_as_the_host_uid_and_reads_back_as_the_guest_uid() {
    if skip_unless_root("creating as the caller") {
        return;
    }
    let mut d = start(&["map:1000:101000:100"], &["map:1000:201000:100"]);
    let (e, _) =
        d.c.with_ctx(1005, 1007, 1, |c| c.create(ROOT_ID, "f", RDWR, 0o644, 0))
            .unwrap();
    assert_eq!(host_owner(&d, "f"), (101005, 201007));
    assert_eq!((e.attr.uid, e.attr.gid), (1005, 1007), "CREATE reply");
    let a = d.c.getattr(e.nodeid, None).unwrap();
    assert_eq!((a.attr.uid, a.attr.gid), (1005, 1007), "GETATTR");
    let l = d.c.lookup(ROOT_ID, "f").unwrap();
    assert_eq!((l.attr.uid, l.attr.gid), (1005, 1007), "LOOKUP");

    // The other creating requests too.
    let m =
        d.c.with_ctx(1001, 1002, 1, |c| c.mkdir(ROOT_ID, "dir", 0o755, 0))
            .unwrap();
    assert_eq!(host_owner(&d, "dir"), (101001, 201002));
    assert_eq!((m.attr.uid, m.attr.gid), (1001, 1002));
    let s =
        d.c.with_ctx(1003, 1004, 1, |c| c.symlink(ROOT_ID, "sym", "f"))
            .unwrap();
    assert_eq!(host_owner(&d, "sym"), (101003, 201004));
    assert_eq!((s.attr.uid, s.attr.gid), (1003, 1004));
    let n =
        d.c.with_ctx(1010, 1011, 1, |c| {
            c.mknod(ROOT_ID, "fifo", libc::S_IFIFO | 0o600, 0, 0)
        })
        .unwrap();
    assert_eq!(host_owner(&d, "fifo"), (101010, 201011));
    assert_eq!((n.attr.uid, n.attr.gid), (1010, 1011));
    d.finish();
}

#[test]
fn tmpfile_and_link_are_created_as_the_mapped_uid_and_refused_when_forbidden() {
    if skip_unless_root("creating as the caller") {
        return;
    }
    let mut d = start(
        &["map:1000:101000:100", "forbid-guest:7:1"],
        &["map:1000:201000:100"],
    );
    let (e, o) =
        d.c.with_ctx(1001, 1001, 1, |c| c.tmpfile(ROOT_ID, RDWR, 0o640, 0))
            .unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1001, 1001), "TMPFILE reply");
    let l =
        d.c.with_ctx(1001, 1001, 1, |c| c.link(e.nodeid, ROOT_ID, "named"))
            .unwrap();
    assert_eq!((l.attr.uid, l.attr.gid), (1001, 1001), "LINK reply");
    assert_eq!(host_owner(&d, "named"), (101001, 201001));
    d.c.release(e.nodeid, o.fh, 0).unwrap();

    let before = d.snapshot();
    let r =
        d.c.with_ctx(7, 1001, 1, |c| c.tmpfile(ROOT_ID, RDWR, 0o640, 0));
    assert_eq!(r.unwrap_err(), libc::EPERM, "TMPFILE as a forbidden uid");
    let r =
        d.c.with_ctx(7, 1001, 1, |c| c.link(l.nodeid, ROOT_ID, "again"));
    assert_eq!(r.unwrap_err(), libc::EPERM, "LINK as a forbidden uid");
    before.assert_same(&d.snapshot(), "refused TMPFILE and LINK");
    d.finish();
}

#[test]
fn unmapped_guest_ids_pass_through_unchanged() {
    if skip_unless_root("creating as the caller") {
        return;
    }
    let mut d = start(&["map:1000:101000:100"], &[]);
    let (e, _) =
        d.c.with_ctx(3000, 3001, 1, |c| c.create(ROOT_ID, "f", RDWR, 0o644, 0))
            .unwrap();
    assert_eq!(host_owner(&d, "f"), (3000, 3001));
    assert_eq!((e.attr.uid, e.attr.gid), (3000, 3001));
    d.finish();
}

#[test]
fn host_owners_are_shown_as_guest_ids_in_getattr_lookup_and_readdirplus() {
    if skip_unless_root("chown on the host") {
        return;
    }
    let mut d = start(&["host:101000:1000:100"], &["squash-host:200000:50:1000"]);
    fs::write(d.host("mapped"), b"x").unwrap();
    fs::write(d.host("plain"), b"x").unwrap();
    chown(&d.host("mapped"), 101042, 200999);
    chown(&d.host("plain"), 4242, 4343);

    let mapped = d.c.lookup(ROOT_ID, "mapped").unwrap();
    assert_eq!((mapped.attr.uid, mapped.attr.gid), (1042, 50));
    let a = d.c.getattr(mapped.nodeid, None).unwrap();
    assert_eq!((a.attr.uid, a.attr.gid), (1042, 50));
    let plain = d.c.lookup(ROOT_ID, "plain").unwrap();
    assert_eq!((plain.attr.uid, plain.attr.gid), (4242, 4343));

    let o = d.c.opendir(ROOT_ID, 0).unwrap();
    let entries = d.c.readdirplus(ROOT_ID, o.fh, 0, 64 << 10).unwrap();
    let ids = |name: &str| {
        let e = entries
            .iter()
            .find(|e| e.dirent.name == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} not listed"));
        (e.entry.attr.uid, e.entry.attr.gid)
    };
    assert_eq!(ids("mapped"), (1042, 50));
    assert_eq!(ids("plain"), (4242, 4343));

    // host: rules work one way only: guest 1042 is not host 101042.
    let mut s = setattr_in(fattr::UID);
    s.uid = 1042;
    let out = d.c.setattr(plain.nodeid, &s).unwrap();
    assert_eq!(host_owner(&d, "plain").0, 1042);
    assert_eq!(out.attr.uid, 1042);
    d.finish();
}

#[test]
fn setattr_chown_translates_guest_ids_to_host_ids() {
    if skip_unless_root("chown") {
        return;
    }
    let mut d = start(&["map:1000:101000:100"], &["guest:1000:201000:100"]);
    let n = d.file("f", b"x");
    let mut s = setattr_in(fattr::UID | fattr::GID);
    s.uid = 1099;
    s.gid = 1000;
    let out = d.c.setattr(n, &s).unwrap();
    assert_eq!(host_owner(&d, "f"), (101099, 201000));
    // The gid rule is guest → host only, so the host gid shows as it is.
    assert_eq!((out.attr.uid, out.attr.gid), (1099, 201000));
    d.finish();
}

#[test]
fn forbidden_guest_ids_cannot_create_or_be_given_files() {
    let mut d = start(&["forbid-guest:1000:10"], &["forbid-guest:500:1"]);
    let before = d.snapshot();
    let r =
        d.c.with_ctx(1005, 100, 1, |c| c.create(ROOT_ID, "f", RDWR, 0o644, 0));
    assert_eq!(r.unwrap_err(), libc::EPERM, "CREATE as a forbidden uid");
    let r =
        d.c.with_ctx(100, 500, 1, |c| c.create(ROOT_ID, "f", RDWR, 0o644, 0));
    assert_eq!(r.unwrap_err(), libc::EPERM, "CREATE as a forbidden gid");
    let r =
        d.c.with_ctx(1000, 100, 1, |c| c.mkdir(ROOT_ID, "d", 0o755, 0));
    assert_eq!(r.unwrap_err(), libc::EPERM, "MKDIR");
    let r = d.c.with_ctx(1009, 100, 1, |c| c.symlink(ROOT_ID, "s", "t"));
    assert_eq!(r.unwrap_err(), libc::EPERM, "SYMLINK");
    let r = d.c.with_ctx(1009, 100, 1, |c| {
        c.mknod(ROOT_ID, "p", libc::S_IFIFO | 0o600, 0, 0)
    });
    assert_eq!(r.unwrap_err(), libc::EPERM, "MKNOD");
    before.assert_same(&d.snapshot(), "refused creations");

    let n = d.file("g", b"x");
    let before = d.snapshot();
    let mut s = setattr_in(fattr::UID);
    s.uid = 1003;
    assert_eq!(d.c.setattr(n, &s).unwrap_err(), libc::EPERM, "chown");
    let mut s = setattr_in(fattr::GID);
    s.gid = 500;
    assert_eq!(d.c.setattr(n, &s).unwrap_err(), libc::EPERM, "chgrp");
    before.assert_same(&d.snapshot(), "refused chown");

    // Ids next to the forbidden ranges are fine.
    if as_root() {
        d.c.with_ctx(1010, 501, 1, |c| c.create(ROOT_ID, "ok", RDWR, 0o644, 0))
            .unwrap();
        assert_eq!(host_owner(&d, "ok"), (1010, 501));
        let mut s = setattr_in(fattr::UID | fattr::GID);
        s.uid = 999;
        s.gid = 499;
        d.c.setattr(n, &s).unwrap();
        assert_eq!(host_owner(&d, "g"), (999, 499));
    }
    d.finish();
}

#[test]
fn squash_guest_creates_a_range_of_guest_ids_as_one_host_id() {
    if skip_unless_root("creating as the caller") {
        return;
    }
    let mut d = start(
        &["squash-guest:2000:65534:100"],
        &["squash-guest:2000:65533:100"],
    );
    for (i, uid) in [2000u32, 2050, 2099].into_iter().enumerate() {
        let name = format!("f{i}");
        let (e, _) =
            d.c.with_ctx(uid, uid, 1, |c| c.create(ROOT_ID, &name, RDWR, 0o644, 0))
                .unwrap();
        assert_eq!(host_owner(&d, &name), (65534, 65533));
        // Squashing is one way: the host id comes back unchanged.
        assert_eq!((e.attr.uid, e.attr.gid), (65534, 65533));
    }
    let (_, _) =
        d.c.with_ctx(2100, 2100, 1, |c| c.create(ROOT_ID, "out", RDWR, 0o644, 0))
            .unwrap();
    assert_eq!(host_owner(&d, "out"), (2100, 2100));
    d.finish();
}

#[test]
fn squash_host_shows_a_range_of_host_ids_as_one_guest_id() {
    if skip_unless_root("chown on the host") {
        return;
    }
    let mut d = start(&["squash-host:3000:99:1000"], &["squash-host:0:98:10"]);
    for (name, uid) in [("a", 3000u32), ("b", 3999), ("c", 4000)] {
        fs::write(d.host(name), b"x").unwrap();
        chown(&d.host(name), uid, 5);
    }
    let ids = |d: &mut Daemon, name: &str| {
        let e = d.c.lookup(ROOT_ID, name).unwrap();
        (e.attr.uid, e.attr.gid)
    };
    assert_eq!(ids(&mut d, "a"), (99, 98));
    assert_eq!(ids(&mut d, "b"), (99, 98));
    assert_eq!(ids(&mut d, "c"), (4000, 98));
    d.finish();
}

#[test]
fn posix_acl_attributes_are_refused_while_translating() {
    let mut d = Daemon::with(
        Options::default()
            .xattr()
            .translate_uid(&["map:0:100000:65536"]),
    );
    let n = d.file("f", b"x");
    // A minimal valid ACL (version 2, user::rw-, group::r--, other::r--).
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(1u16, 6u16), (4, 4), (0x20, 4)] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    for name in ["system.posix_acl_access", "system.posix_acl_default"] {
        assert_eq!(
            d.c.setxattr(n, name, &acl, 0).unwrap_err(),
            libc::EOPNOTSUPP,
            "set {name}"
        );
        assert_eq!(
            d.c.getxattr(n, name, 0).unwrap_err(),
            libc::EOPNOTSUPP,
            "get {name}"
        );
        assert_eq!(
            d.c.removexattr(n, name).unwrap_err(),
            libc::EOPNOTSUPP,
            "remove {name}"
        );
    }
    // Other attributes work as usual.
    d.c.setxattr(n, "user.k", b"v", 0).unwrap();
    assert_eq!(
        d.c.getxattr(n, "user.k", 64).unwrap(),
        XattrReply::Data(b"v".to_vec())
    );
    d.finish();
}

#[test]
fn without_rules_requests_are_served_as_before() {
    let mut d = Daemon::start();
    fs::set_permissions(&d.share, fs::Permissions::from_mode(0o777)).unwrap();
    let (e, _) =
        d.c.with_ctx(1005, 1006, 1, |c| c.create(ROOT_ID, "f", RDWR, 0o644, 0))
            .unwrap();
    if as_root() {
        assert_eq!(host_owner(&d, "f"), (1005, 1006));
        assert_eq!((e.attr.uid, e.attr.gid), (1005, 1006));
    }
    d.finish();
}

#[test]
fn bad_rules_stop_the_daemon_with_status_2_and_the_expected_form() {
    let share = tempfile::tempdir().unwrap();
    let sock = share.path().join("never.sock");
    for (flag, rule, reason) in [
        ("--translate-uid", "map:0:1000", "takes 3 numbers"),
        (
            "--translate-gid",
            "squash:0:1:2",
            "unknown rule type 'squash'",
        ),
        (
            "--translate-gid",
            "map:4294967295:0:1",
            "runs past 4294967294",
        ),
        ("--translate-uid", "forbid-guest:x:1", "'x' is not an id"),
    ] {
        let out = Command::new(BIN)
            .arg(format!("--shared-dir={}", share.path().display()))
            .arg(format!("--socket-path={}", sock.display()))
            .arg(format!("{flag}={rule}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{rule}: {err}");
        assert!(
            err.contains(&format!("invalid value '{rule}' for '{flag} <RULE>'")),
            "{err}"
        );
        assert!(err.contains(reason), "{err}");
        assert!(
            err.contains("<type>:<source base>:<target base>:<count>"),
            "{err}"
        );
        assert!(!sock.exists());
    }
    // Overlap needs two occurrences of the flag.
    let out = Command::new(BIN)
        .arg(format!("--shared-dir={}", share.path().display()))
        .arg(format!("--socket-path={}", sock.display()))
        .args([
            "--translate-uid",
            "map:0:1000:10",
            "--translate-uid",
            "squash-host:1005:0:1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("host ids 1005 to 1005 are already covered by 'map:0:1000:10'"),
        "{err}"
    );
}

#[test]
fn help_lists_the_translate_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for s in [
        "--translate-uid <RULE>",
        "--translate-gid <RULE>",
        "squash-guest",
        "forbid-guest",
    ] {
        assert!(text.contains(s), "--help lacks {s}:\n{text}");
    }
}
