//! `--xattrmap`, `--posix-acl`, `--security-label` and `--killpriv-v2` end to end: requests
//! from the test frontend, checked against what lands on the host.
//!
//! `trusted.*` and `security.*` attributes and some mode changes need root on the host; those
//! tests are skipped otherwise.

use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use virtiofsd::fuse::abi::{self, fattr, init, ROOT_ID};
use virtiofsd::passthrough::Negotiate;
use virtiofsd_frontend::{secctx_extension, XattrReply};

const RDWR: u32 = libc::O_RDWR as u32;

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn skip_unless_root(what: &str) -> bool {
    if !as_root() {
        eprintln!("skipped: {what} needs root");
        return true;
    }
    false
}

fn list(d: &mut Daemon, node: u64) -> Vec<String> {
    let Ok(XattrReply::Size(n)) = d.c.listxattr(node, 0) else {
        panic!("LISTXATTR size probe failed");
    };
    let Ok(XattrReply::Data(data)) = d.c.listxattr(node, n.max(1)) else {
        panic!("LISTXATTR failed");
    };
    assert_eq!(
        data.len(),
        n as usize,
        "the size probe gives the list's size"
    );
    let mut names: Vec<String> = data
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8(n.to_vec()).unwrap())
        .collect();
    names.sort();
    names
}

fn get(d: &mut Daemon, node: u64, name: &str) -> Result<Vec<u8>, i32> {
    match d.c.getxattr(node, name, 4096)? {
        XattrReply::Data(v) => Ok(v),
        XattrReply::Size(_) => panic!("a value was asked for"),
    }
}

fn host_names(p: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = list_xattrs(p)
        .into_iter()
        .map(|(n, _)| String::from_utf8(n).unwrap())
        .collect();
    v.sort();
    v
}

fn mode(p: &std::path::Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// An ACL in the `system.posix_acl_*` format: version 2, then (tag, perm, id) entries for
/// user::, group::, other:: with these permissions.
fn acl(user: u16, group: u16, other: u16) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(0x01u16, user), (0x04, group), (0x20, other)] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    v
}

/// An extended ACL (one that mode bits cannot express, so the host stores it): user::, a named
/// user 4242 with read, group::, mask:: `mask`, other::.
fn extended_acl(user: u16, group: u16, mask: u16, other: u16) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, user, u32::MAX),
        (0x02, 4, 4242),
        (0x04, group, u32::MAX),
        (0x10, mask, u32::MAX),
        (0x20, other, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

#[test]
fn a_map_rule_prefixes_every_guest_name_and_hides_unprefixed_host_names() {
    let mut d = Daemon::with(Options::default().xattrmap(":map::user.virtiofs.:"));
    let f = d.file("f", b"x");
    host_setxattr(&d.host("f"), b"user.host-only", b"h");
    d.c.setxattr(f, "user.greeting", b"hello", 0).unwrap();
    let host = host_names(&d.host("f"));
    assert_eq!(host, ["user.host-only", "user.virtiofs.user.greeting"]);
    assert_eq!(list(&mut d, f), ["user.greeting"]);
    assert_eq!(get(&mut d, f, "user.greeting").unwrap(), b"hello");
    // The host's own attribute is out of reach under its host name.
    assert_eq!(get(&mut d, f, "user.host-only"), Err(libc::ENODATA));
    d.c.removexattr(f, "user.greeting").unwrap();
    assert_eq!(host_names(&d.host("f")), ["user.host-only"]);
    assert!(list(&mut d, f).is_empty());
}

#[test]
fn trusted_names_prefixed_others_passed_and_the_target_namespace_guarded() {
    if skip_unless_root("trusted.* attributes") {
        return;
    }
    let mut d = Daemon::with(Options::default().xattrmap("/map/trusted./user.virtiofs./"));
    let f = d.file("f", b"x");
    host_setxattr(&d.host("f"), b"trusted.host", b"t");
    d.c.setxattr(f, "trusted.overlay.opaque", b"y", 0).unwrap();
    d.c.setxattr(f, "user.plain", b"p", 0).unwrap();
    assert_eq!(
        host_names(&d.host("f")),
        [
            "trusted.host",
            "user.plain",
            "user.virtiofs.trusted.overlay.opaque"
        ]
    );
    // The guest may not use the prefix directly, and sees neither the host's trusted.*.
    assert_eq!(
        d.c.setxattr(f, "user.virtiofs.trusted.sneaky", b"z", 0),
        Err(libc::EPERM)
    );
    assert_eq!(list(&mut d, f), ["trusted.overlay.opaque", "user.plain"]);
    assert_eq!(get(&mut d, f, "trusted.overlay.opaque").unwrap(), b"y");
}

#[test]
fn bad_and_unsupported_rules_refuse_and_hide() {
    let rules = "/unsupported/all/user.nosup./user.nosup./ /bad/all/user.secret./user.secret./ \
                 /ok/all///";
    let mut d = Daemon::with(Options::default().xattrmap(rules));
    let f = d.file("f", b"x");
    host_setxattr(&d.host("f"), b"user.secret.key", b"k");
    host_setxattr(&d.host("f"), b"user.nosup.a", b"a");
    host_setxattr(&d.host("f"), b"user.shown", b"s");
    assert_eq!(list(&mut d, f), ["user.shown"]);
    assert_eq!(d.c.setxattr(f, "user.secret.x", b"1", 0), Err(libc::EPERM));
    assert_eq!(get(&mut d, f, "user.secret.key"), Err(libc::ENODATA));
    assert_eq!(d.c.removexattr(f, "user.secret.key"), Err(libc::EPERM));
    assert_eq!(
        d.c.setxattr(f, "user.nosup.x", b"1", 0),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(get(&mut d, f, "user.nosup.a"), Err(libc::EOPNOTSUPP));
}

#[test]
fn names_no_rule_matches_are_refused_and_hidden() {
    let mut d = Daemon::with(Options::default().xattrmap(":prefix:client:user.:user.vm.:"));
    let f = d.file("f", b"x");
    d.c.setxattr(f, "user.a", b"1", 0).unwrap();
    assert_eq!(host_names(&d.host("f")), ["user.vm.user.a"]);
    // No server rule: every host name is hidden; security.* has no client rule.
    assert!(list(&mut d, f).is_empty());
    assert_eq!(d.c.setxattr(f, "security.x", b"1", 0), Err(libc::EPERM));
}

#[test]
fn xattrs_of_symlinks_and_fifos_are_reached_without_opening_them() {
    if skip_unless_root("trusted.* attributes") {
        return;
    }
    let mut d =
        Daemon::with(Options::default().xattrmap(":prefix:all:trusted.:trusted.vm.: :ok:all:::"));
    std::os::unix::fs::symlink("/etc/passwd", d.host("l")).unwrap();
    let fifo = std::ffi::CString::new(d.host("p").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    for name in ["l", "p"] {
        let n = d.node(name);
        d.c.setxattr(n, "trusted.t", b"v", 0).unwrap();
        assert_eq!(
            host_getxattr(&d.host(name), b"trusted.vm.trusted.t").unwrap(),
            b"v"
        );
        assert_eq!(list(&mut d, n), ["trusted.t"], "{name}");
        assert_eq!(get(&mut d, n, "trusted.t").unwrap(), b"v");
        d.c.removexattr(n, "trusted.t").unwrap();
        assert!(host_getxattr(&d.host(name), b"trusted.vm.trusted.t").is_none());
    }
    // The symlink's target was never touched.
    assert!(host_getxattr(std::path::Path::new("/etc/passwd"), b"trusted.vm.trusted.t").is_none());
}

#[test]
fn acl_attributes_are_refused_and_hidden_without_posix_acl() {
    if skip_unless_root("setting an ACL on the host") {
        return;
    }
    let mut d = Daemon::with(Options::default().xattr());
    assert_eq!(d.init.unwrap().flags & init::POSIX_ACL as u32, 0);
    let f = d.file("f", b"x");
    host_setxattr(&d.host("f"), b"system.posix_acl_access", &acl(6, 4, 4));
    host_setxattr(&d.host("f"), b"user.a", b"1");
    assert_eq!(list(&mut d, f), ["user.a"]);
    assert_eq!(
        get(&mut d, f, "system.posix_acl_access"),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        d.c.setxattr(f, "system.posix_acl_access", &acl(7, 7, 7), 0),
        Err(libc::EOPNOTSUPP)
    );
}

/// A daemon with `--posix-acl=always` after an INIT offering what ACLs need.
fn acl_daemon() -> Daemon {
    let mut d = Daemon::with(Options::default().posix_acl(Negotiate::Always).no_init());
    let flags = virtiofsd_frontend::fuse_client::DEFAULT_INIT_FLAGS | init::DONT_MASK;
    let out = d.c.init_with(38, flags, 1 << 17, true).unwrap();
    let want = init::POSIX_ACL | init::DONT_MASK | init::SETXATTR_EXT;
    assert_eq!(u64::from(out.flags) & want, want, "ACL flags agreed");
    d.init = Some(out);
    fs::set_permissions(&d.share, fs::Permissions::from_mode(0o777)).unwrap();
    d
}

#[test]
fn posix_acl_always_refuses_a_guest_without_support_and_auto_goes_on() {
    let flags = virtiofsd_frontend::fuse_client::DEFAULT_INIT_FLAGS & !init::POSIX_ACL;
    let mut d = Daemon::with(Options::default().posix_acl(Negotiate::Always).no_init());
    assert_eq!(
        d.c.init_with(38, flags, 1 << 17, true).unwrap_err(),
        libc::EPROTO
    );
    let mut d = Daemon::with(Options::default().posix_acl(Negotiate::Auto).no_init());
    let out = d.c.init_with(38, flags, 1 << 17, true).unwrap();
    assert_eq!(out.flags & (init::POSIX_ACL | init::DONT_MASK) as u32, 0);
}

#[test]
fn the_umask_applies_only_where_no_default_acl_is_inherited() {
    if skip_unless_root("creating files as the caller") {
        return;
    }
    let mut d = acl_daemon();
    let inherit = d.c.mkdir(ROOT_ID, "inherit", 0o777, 0o022).unwrap().nodeid;
    let plain = d.c.mkdir(ROOT_ID, "plain", 0o777, 0o022).unwrap().nodeid;
    assert_eq!(
        mode(&d.host("plain")),
        0o755,
        "umask 022 applied by the host"
    );
    // A default ACL set through the guest: user rw, group rw, other r.
    d.c.setxattr(inherit, "system.posix_acl_default", &acl(6, 6, 4), 0)
        .unwrap();
    assert!(host_getxattr(&d.host("inherit"), b"system.posix_acl_default").is_some());
    for (dir, name) in [(inherit, "inherit"), (plain, "plain")] {
        d.c.create(dir, "f", RDWR, 0o666, 0o022).unwrap();
        d.c.mknod(dir, "n", libc::S_IFIFO | 0o666, 0, 0o022)
            .unwrap();
        d.c.mkdir(dir, "d", 0o777, 0o022).unwrap();
        let (_, _) = d.c.tmpfile(dir, RDWR, 0o666, 0o022).unwrap();
        let want = if name == "inherit" {
            // The ACL decides; the umask is ignored.
            [0o664, 0o664, 0o664]
        } else {
            [0o644, 0o644, 0o755]
        };
        let got = [
            mode(&d.host(format!("{name}/f"))),
            mode(&d.host(format!("{name}/n"))),
            mode(&d.host(format!("{name}/d"))),
        ];
        assert_eq!(got, want, "{name}");
    }
    // The new directory inherits the default ACL.
    assert!(host_getxattr(&d.host("inherit/d"), b"system.posix_acl_default").is_some());
    assert!(host_getxattr(&d.host("plain/d"), b"system.posix_acl_default").is_none());
    assert_eq!(list(&mut d, inherit), ["system.posix_acl_default"]);
}

#[test]
fn setting_the_access_acl_with_kill_sgid_clears_set_group_id() {
    if skip_unless_root("set-group-id files") {
        return;
    }
    let mut d = acl_daemon();
    for (name, flags, kept) in [
        ("kill", abi::SETXATTR_ACL_KILL_SGID, false),
        ("keep", 0, true),
    ] {
        let f = d.file(name, b"x");
        fs::set_permissions(d.host(name), fs::Permissions::from_mode(0o2775)).unwrap();
        d.c.setxattr_ext(
            f,
            "system.posix_acl_access",
            &extended_acl(7, 5, 5, 5),
            0,
            flags,
        )
        .unwrap();
        assert!(host_getxattr(&d.host(name), b"system.posix_acl_access").is_some());
        let m = mode(&d.host(name));
        assert_eq!(m & libc::S_ISGID != 0, kept, "{name}: {m:o}");
        assert_eq!(m & 0o777, 0o755, "{name}");
    }
}

/// A daemon with `--security-label=always` after an INIT offering `FUSE_SECURITY_CTX`.
fn label_daemon(opts: Options) -> Daemon {
    let mut d = Daemon::with(opts.security_label(Negotiate::Always).no_init());
    let flags = virtiofsd_frontend::fuse_client::DEFAULT_INIT_FLAGS | init::SECURITY_CTX;
    let out = d.c.init_with(38, flags, 1 << 17, true).unwrap();
    assert_ne!(out.flags2 & (init::SECURITY_CTX >> 32) as u32, 0);
    d.init = Some(out);
    d
}

const LABEL: &[u8] = b"system_u:object_r:container_file_t:s0\0";

#[test]
fn every_creation_stores_the_security_context_on_the_new_file() {
    if skip_unless_root("security.* attributes") {
        return;
    }
    let mut d = label_daemon(Options::default());
    let ext = secctx_extension(b"security.selinux", LABEL);
    d.c.create_ext(ROOT_ID, "f", RDWR, 0o644, 0, 0, &ext)
        .unwrap();
    d.c.mkdir_ext(ROOT_ID, "d", 0o755, 0, &ext).unwrap();
    d.c.mknod_ext(ROOT_ID, "p", libc::S_IFIFO | 0o644, 0, 0, &ext)
        .unwrap();
    d.c.symlink_ext(ROOT_ID, "l", "f", &ext).unwrap();
    for name in ["f", "d", "p", "l"] {
        assert_eq!(
            host_getxattr(&d.host(name), b"security.selinux").as_deref(),
            Some(LABEL),
            "{name}"
        );
    }
    // Without a context nothing is set.
    d.c.create(ROOT_ID, "g", RDWR, 0o644, 0).unwrap();
    assert!(host_getxattr(&d.host("g"), b"security.selinux").is_none());
}

#[test]
fn a_context_the_host_refuses_fails_the_creation_and_leaves_nothing() {
    let mut d = label_daemon(Options::default());
    // No such attribute namespace: the host refuses the name.
    let ext = secctx_extension(b"bogus.label", b"x");
    assert_eq!(
        d.c.create_ext(ROOT_ID, "f", RDWR, 0o644, 0, 0, &ext).err(),
        Some(libc::EOPNOTSUPP)
    );
    let mkdir = d.c.mkdir_ext(ROOT_ID, "d", 0o755, 0, &ext);
    assert_eq!(mkdir.err(), Some(libc::EOPNOTSUPP));
    let symlink = d.c.symlink_ext(ROOT_ID, "l", "t", &ext);
    assert_eq!(symlink.err(), Some(libc::EOPNOTSUPP));
    let left: Vec<_> = fs::read_dir(&d.share).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    // A malformed extension is refused before anything is made.
    let mut bad = secctx_extension(b"security.selinux", LABEL);
    bad[8..12].copy_from_slice(&4096u32.to_le_bytes());
    let mkdir = d.c.mkdir_ext(ROOT_ID, "m", 0o755, 0, &bad);
    assert_eq!(mkdir.err(), Some(libc::EINVAL));
    assert!(!d.host("m").exists());
}

#[test]
fn security_contexts_follow_the_xattr_map() {
    let mut d = label_daemon(Options::default().xattrmap(":map::user.virtiofs.:"));
    let ext = secctx_extension(b"security.selinux", LABEL);
    let (e, _) =
        d.c.create_ext(ROOT_ID, "f", RDWR, 0o644, 0, 0, &ext)
            .unwrap();
    assert_eq!(
        host_getxattr(&d.host("f"), b"user.virtiofs.security.selinux").as_deref(),
        Some(LABEL)
    );
    assert_eq!(get(&mut d, e.nodeid, "security.selinux").unwrap(), LABEL);
}

#[test]
fn security_contexts_are_ignored_unless_agreed() {
    // --security-label not given: the extension is parsed but not applied.
    let mut d = Daemon::with(Options::default().xattr());
    let ext = secctx_extension(b"user.label", b"x");
    d.c.create_ext(ROOT_ID, "f", RDWR, 0o644, 0, 0, &ext)
        .unwrap();
    assert!(host_getxattr(&d.host("f"), b"user.label").is_none());
}

fn killpriv_daemon(on: bool) -> Daemon {
    let opts = if on {
        Options::default().killpriv_v2()
    } else {
        Options::default()
    };
    let d = Daemon::with(opts);
    let agreed = d.init.unwrap().flags & init::HANDLE_KILLPRIV_V2 as u32 != 0;
    assert_eq!(agreed, on, "HANDLE_KILLPRIV_V2 only with --killpriv-v2");
    d
}

/// A host file `name` with `mode`, looked up.
fn suid_file(d: &mut Daemon, name: &str, mode: u32) -> u64 {
    let n = d.file(name, b"0123456789");
    fs::set_permissions(d.host(name), fs::Permissions::from_mode(mode)).unwrap();
    n
}

#[test]
fn killpriv_v2_write_with_the_kill_flag_clears_set_id_bits_on_the_host() {
    if skip_unless_root("a daemon that keeps set-id bits on write") {
        return;
    }
    let mut d = killpriv_daemon(true);
    for (name, start, flags, end) in [
        ("kill", 0o6775, abi::WRITE_KILL_SUIDGID, 0o0775),
        // set-group-id without group execute is a locking mark, not a privilege.
        ("nogx", 0o6765, abi::WRITE_KILL_SUIDGID, 0o2765),
        ("keep", 0o6775, 0, 0o6775),
    ] {
        let n = suid_file(&mut d, name, start);
        let fh = d.open(n, libc::O_RDWR);
        let arg = abi::WriteIn {
            fh,
            offset: 0,
            size: 3,
            write_flags: flags,
            ..Default::default()
        };
        assert_eq!(d.c.write_with(n, &arg, b"abc").unwrap(), 3);
        assert_eq!(mode(&d.host(name)), end, "{name}");
    }
}

#[test]
fn killpriv_v2_truncation_by_setattr_open_and_create_clears_set_id_bits() {
    if skip_unless_root("a daemon that keeps set-id bits") {
        return;
    }
    let mut d = killpriv_daemon(true);
    let n = suid_file(&mut d, "setattr", 0o4755);
    let mut s = setattr_in(fattr::SIZE | fattr::KILL_SUIDGID);
    s.size = 1;
    d.c.setattr(n, &s).unwrap();
    assert_eq!(mode(&d.host("setattr")), 0o755);
    assert_eq!(fs::metadata(d.host("setattr")).unwrap().len(), 1);
    let n = suid_file(&mut d, "open", 0o4755);
    d.c.open_with(
        n,
        (libc::O_RDWR | libc::O_TRUNC) as u32,
        abi::OPEN_KILL_SUIDGID,
    )
    .unwrap();
    assert_eq!(mode(&d.host("open")), 0o755);
    suid_file(&mut d, "create", 0o4755);
    let flags = (libc::O_RDWR | libc::O_TRUNC) as u32;
    d.c.create_ext(
        ROOT_ID,
        "create",
        flags,
        0o644,
        0,
        abi::OPEN_KILL_SUIDGID,
        &[],
    )
    .unwrap();
    assert_eq!(mode(&d.host("create")), 0o755);
    // Without the flag the bits stay.
    let n = suid_file(&mut d, "plain", 0o4755);
    d.c.open_with(n, (libc::O_RDWR | libc::O_TRUNC) as u32, 0)
        .unwrap();
    assert_eq!(mode(&d.host("plain")), 0o4755);
}

/// A `security.capability` value (revision 2, effective, `CAP_NET_RAW` permitted).
const FILE_CAP: &[u8] =
    b"\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";

/// FALLOCATE and COPY_FILE_RANGE (destination `name`, opened read-write) on a host file made
/// with `start` and `FILE_CAP`; returns its mode afterwards and whether the capability is left.
fn after_fallocate_and_copy(d: &mut Daemon, name: &str, start: u32) -> [(u32, bool); 2] {
    let src = d.file(&format!("{name}.src"), b"abcdef");
    let src_fh = d.open(src, libc::O_RDONLY);
    let mut out = [(0, false); 2];
    for (i, op) in ["fallocate", "copy"].into_iter().enumerate() {
        let f = format!("{name}.{op}");
        let n = suid_file(d, &f, start);
        host_setxattr(&d.host(&f), b"security.capability", FILE_CAP);
        let fh = d.open(n, libc::O_RDWR);
        if op == "fallocate" {
            d.c.fallocate(n, fh, 0, 8192, 0).unwrap();
            assert_eq!(fs::metadata(d.host(&f)).unwrap().len(), 8192);
        } else {
            let arg = abi::CopyFileRangeIn {
                fh_in: src_fh,
                off_in: 0,
                nodeid_out: n,
                fh_out: fh,
                off_out: 2,
                len: 3,
                flags: 0,
            };
            assert_eq!(d.c.copy_file_range(src, &arg).unwrap(), 3);
            assert_eq!(fs::read(d.host(&f)).unwrap(), b"01abc56789");
        }
        let cap = host_getxattr(&d.host(&f), b"security.capability").is_some();
        out[i] = (mode(&d.host(&f)), cap);
    }
    out
}

#[test]
fn killpriv_v2_fallocate_and_copy_file_range_clear_set_id_bits_and_capabilities() {
    if skip_unless_root("a daemon that keeps set-id bits and sets capabilities") {
        return;
    }
    let mut d = killpriv_daemon(true);
    // The requests carry no kill flag: with HANDLE_KILLPRIV_V2 the guest kernel leaves the
    // clearing it does before either call (file_modified) to the daemon.
    for (name, start, end) in [
        ("gx", 0o6775, 0o0775),
        // set-group-id without group execute is a locking mark, not a privilege.
        ("nogx", 0o6765, 0o2765),
        ("uid", 0o4755, 0o0755),
    ] {
        for (op, (mode, cap)) in ["fallocate", "copy_file_range"]
            .into_iter()
            .zip(after_fallocate_and_copy(&mut d, name, start))
        {
            assert_eq!(mode, end, "{op} on {name} ({start:o})");
            assert!(!cap, "{op} on {name}: security.capability removed");
        }
    }
    // Without --killpriv-v2 the guest kernel clears the bits itself (a SETATTR before the
    // request); the daemon, allowed to keep them, leaves them alone.
    let mut d = killpriv_daemon(false);
    for (op, (mode, _)) in ["fallocate", "copy_file_range"]
        .into_iter()
        .zip(after_fallocate_and_copy(&mut d, "off", 0o6775))
    {
        assert_eq!(mode, 0o6775, "{op} without --killpriv-v2");
    }
}

#[test]
fn killpriv_v2_is_not_offered_by_default() {
    killpriv_daemon(false);
}

#[test]
fn a_remapped_capability_is_removed_where_the_kernel_would_remove_the_real_one() {
    let mut d = Daemon::with(Options::default().xattrmap(":map::user.virtiofs.:"));
    let n = d.file("f", b"x");
    let host = b"user.virtiofs.security.capability";
    let cap = b"\x01\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";
    d.c.setxattr(n, "security.capability", cap, 0).unwrap();
    assert!(host_getxattr(&d.host("f"), host).is_some());
    let fh = d.open(n, libc::O_RDWR);
    d.c.write(n, fh, 0, b"y").unwrap();
    assert!(
        host_getxattr(&d.host("f"), host).is_none(),
        "a write removes it"
    );
    d.c.setxattr(n, "security.capability", cap, 0).unwrap();
    let mut s = setattr_in(fattr::SIZE);
    s.size = 0;
    d.c.setattr(n, &s).unwrap();
    assert!(
        host_getxattr(&d.host("f"), host).is_none(),
        "a truncation removes it"
    );
    // Other attributes stay.
    d.c.setxattr(n, "user.other", b"o", 0).unwrap();
    d.c.write(n, fh, 0, b"z").unwrap();
    assert!(host_getxattr(&d.host("f"), b"user.virtiofs.user.other").is_some());
}

#[test]
fn a_remapped_capability_is_removed_by_fallocate_and_copy_file_range() {
    for killpriv in [false, true] {
        let mut opts = Options::default().xattrmap(":map::user.virtiofs.:");
        if killpriv {
            opts = opts.killpriv_v2();
        }
        let mut d = Daemon::with(opts);
        let host = b"user.virtiofs.security.capability";
        let src = d.file("src", b"abc");
        let src_fh = d.open(src, libc::O_RDONLY);
        let n = d.file("f", b"x");
        let fh = d.open(n, libc::O_RDWR);
        d.c.setxattr(n, "security.capability", FILE_CAP, 0).unwrap();
        d.c.fallocate(n, fh, 0, 4096, 0).unwrap();
        assert!(
            host_getxattr(&d.host("f"), host).is_none(),
            "fallocate removes it (killpriv {killpriv})"
        );
        d.c.setxattr(n, "security.capability", FILE_CAP, 0).unwrap();
        let arg = abi::CopyFileRangeIn {
            fh_in: src_fh,
            off_in: 0,
            nodeid_out: n,
            fh_out: fh,
            off_out: 0,
            len: 3,
            flags: 0,
        };
        assert_eq!(d.c.copy_file_range(src, &arg).unwrap(), 3);
        assert!(
            host_getxattr(&d.host("f"), host).is_none(),
            "copy_file_range removes it (killpriv {killpriv})"
        );
    }
}
