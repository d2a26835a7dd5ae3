//! Unit tests of the rule parser, the id maps and the [`MappedFs`] wrapper (against a fake
//! filesystem that records what it was asked).

use std::ffi::{CStr, CString};
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use super::*;
use crate::filesystem::{
    Context, DirEntry, Entry, FileSystem, Opened, SecCtx, SetAttr, XattrReply,
};
use crate::fuse::abi::init;
use crate::fuse::io::{SliceReader, VecWriter, ZeroCopyReader, ZeroCopyWriter};

fn rule(s: &str) -> Rule {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn map(specs: &[&str]) -> IdMap {
    IdMap::parse("--translate-uid", specs).unwrap_or_else(|e| panic!("{e}"))
}

/// Rules each well-formed on its own.
fn rules(specs: &[&str]) -> Vec<Rule> {
    specs.iter().map(|s| s.parse().unwrap()).collect()
}

/// The translation of well-formed, non-overlapping rules.
fn translation(uid: &[&str], gid: &[&str]) -> Translation {
    Translation::from_rules(&rules(uid), &rules(gid)).unwrap_or_else(|e| panic!("{e}"))
}

fn refusal(specs: &[&str]) -> String {
    IdMap::parse("--translate-gid", specs)
        .unwrap_err()
        .to_string()
}

// ---- parsing ---------------------------------------------------------------------------------

#[test]
fn every_rule_type_parses_with_its_fields_in_order() {
    for (s, kind, source, target, count) in [
        ("guest:1000:2000:10", RuleKind::Guest, 1000, 2000, 10),
        ("host:2000:1000:10", RuleKind::Host, 2000, 1000, 10),
        ("map:0:100000:65536", RuleKind::Map, 0, 100000, 65536),
        (
            "squash-guest:0:65534:1000",
            RuleKind::SquashGuest,
            0,
            65534,
            1000,
        ),
        (
            "squash-host:0:0:4294967295",
            RuleKind::SquashHost,
            0,
            0,
            4294967295,
        ),
        ("forbid-guest:0:1", RuleKind::ForbidGuest, 0, 0, 1),
    ] {
        let r = rule(s);
        assert_eq!(
            r,
            Rule {
                kind,
                source,
                target,
                count
            },
            "{s}"
        );
        assert_eq!(r.to_string(), s, "round trip");
    }
}

#[test]
fn malformed_rules_are_refused_with_the_reason_and_the_expected_form() {
    for (spec, reason) in [
        ("", "unknown rule type ''"),
        (
            "guest",
            "a guest rule takes 3 numbers after the type, found 0",
        ),
        (
            "map:1:2",
            "a map rule takes 3 numbers after the type, found 2",
        ),
        ("map:1:2:3:4", "found 4"),
        (
            "forbid-guest:1:2:3",
            "a forbid-guest rule takes 2 numbers after the type, found 3",
        ),
        ("forbid-guest:1", "found 1"),
        ("squash:1:2:3", "unknown rule type 'squash'"),
        ("Map:1:2:3", "unknown rule type 'Map'"),
        (":0:1:2:", "unknown rule type ''"),
        ("map:a:2:3", "'a' is not an id or count"),
        ("map:1::3", "'' is not an id or count"),
        ("map:-1:2:3", "'-1' is not an id or count"),
        ("map:+1:2:3", "'+1' is not an id or count"),
        ("map: 1:2:3", "' 1' is not an id or count"),
        ("map:0x10:2:3", "'0x10' is not an id or count"),
        ("map:1:2:4294967296", "'4294967296' is not an id or count"),
    ] {
        let e = refusal(&[spec]);
        assert!(
            e.starts_with(&format!("--translate-gid: invalid rule '{spec}': ")),
            "{e}"
        );
        assert!(e.contains(reason), "{spec}: {e}");
        assert!(e.ends_with(&format!("; expected {EXPECTED_FORM}")), "{e}");
    }
}

#[test]
fn ranges_past_the_largest_id_are_refused() {
    for (spec, reason) in [
        (
            "map:4294967295:0:1",
            "the guest range starting at 4294967295 runs past 4294967294",
        ),
        (
            "map:4294967290:0:6",
            "the guest range starting at 4294967290",
        ),
        (
            "map:0:4294967290:6",
            "the host range starting at 4294967290",
        ),
        (
            "guest:1:4294967294:2",
            "the host range starting at 4294967294",
        ),
        (
            "host:4294967294:0:2",
            "the host range starting at 4294967294",
        ),
        (
            "host:0:4294967294:2",
            "the guest range starting at 4294967294",
        ),
        ("squash-guest:4294967294:0:2", "the guest range"),
        (
            "squash-guest:0:4294967295:2",
            "the host id starting at 4294967295",
        ),
        (
            "squash-host:0:4294967295:2",
            "the guest id starting at 4294967295",
        ),
        ("squash-host:1:0:4294967295", "the host range starting at 1"),
        (
            "forbid-guest:4294967294:2",
            "the guest range starting at 4294967294",
        ),
    ] {
        let e = refusal(&[spec]);
        assert!(e.contains(reason), "{spec}: {e}");
        assert!(e.contains("expected <type>"), "{e}");
    }
    // The largest id itself is fine.
    let m = map(&["map:4294967294:7:1", "squash-guest:0:4294967294:10"]);
    assert_eq!(m.to_host(4294967294), Ok(7));
    assert_eq!(m.to_guest(7), 4294967294);
    assert_eq!(m.to_host(9), Ok(4294967294));
    // A range of every id but the last.
    let m = map(&["guest:0:0:4294967295"]);
    assert_eq!(m.to_host(4294967294), Ok(4294967294));
}

#[test]
fn overlapping_rules_in_one_direction_are_refused_naming_both() {
    for (specs, reason) in [
        (
            &["guest:0:1000:10", "guest:5:2000:10"][..],
            "guest ids 5 to 9 are already covered by 'guest:0:1000:10'",
        ),
        (
            &["guest:5:2000:10", "guest:0:1000:10"][..],
            "guest ids 5 to 9 are already covered by 'guest:5:2000:10'",
        ),
        (
            &["map:0:1000:10", "squash-guest:9:5:1"][..],
            "guest ids 9 to 9",
        ),
        (
            &["forbid-guest:0:1", "map:0:1000:10"][..],
            "guest ids 0 to 0",
        ),
        (
            &["map:0:1000:10", "host:1009:0:1"][..],
            "host ids 1009 to 1009 are already covered by 'map:0:1000:10'",
        ),
        (
            &["squash-host:0:0:100", "squash-host:50:1:10"][..],
            "host ids 50 to 59",
        ),
        (&["map:0:0:10", "map:20:5:1"][..], "host ids 5 to 5"),
    ] {
        let e = refusal(specs);
        let last = specs[specs.len() - 1];
        assert!(
            e.starts_with(&format!("--translate-gid: invalid rule '{last}': ")),
            "{e}"
        );
        assert!(e.contains(reason), "{specs:?}: {e}");
        assert!(e.contains("may not overlap"), "{e}");
    }
}

#[test]
fn the_same_ids_may_be_used_in_opposite_directions() {
    let m = map(&[
        "guest:0:1000:10",
        "host:0:1000:10",
        "squash-guest:100:5:10",
        "squash-host:100:5:10",
        "forbid-guest:200:10",
        "host:200:0:10",
    ]);
    assert_eq!(m.to_host(3), Ok(1003));
    assert_eq!(m.to_guest(3), 1003);
    assert_eq!(m.to_host(205), Err(Forbidden));
    assert_eq!(m.to_guest(205), 5);
}

#[test]
fn a_refused_rule_leaves_the_map_unchanged() {
    let mut m = map(&["guest:0:1000:10"]);
    let before = m.clone();
    // The guest side would be added, the host side overlaps.
    m.add(rule("host:0:0:1")).unwrap();
    let err = m.add(rule("map:50:0:1")).unwrap_err();
    assert!(matches!(err, RuleError::Overlap { .. }), "{err}");
    assert_eq!(m.to_host(50), Ok(50));
    assert_ne!(m, before);
    // A hand-made rule is checked like a parsed one.
    let bad = Rule {
        kind: RuleKind::Map,
        source: u32::MAX,
        target: 0,
        count: 0,
    };
    // An empty range changes nothing, wherever it starts.
    let snapshot = m.clone();
    assert_eq!(m.add(bad), Ok(()));
    assert_eq!(m, snapshot);
    let bad = Rule { count: 2, ..bad };
    assert!(matches!(m.add(bad), Err(RuleError::Overflow { .. })));
}

// ---- translation -----------------------------------------------------------------------------

#[test]
fn guest_rule_maps_guest_to_host_only() {
    let m = map(&["guest:1000:5000:10"]);
    assert_eq!(m.to_host(999), Ok(999));
    assert_eq!(m.to_host(1000), Ok(5000));
    assert_eq!(m.to_host(1009), Ok(5009));
    assert_eq!(m.to_host(1010), Ok(1010));
    // Not the other way.
    assert_eq!(m.to_guest(5000), 5000);
    assert_eq!(m.to_guest(1000), 1000);
}

#[test]
fn host_rule_maps_host_to_guest_only() {
    let m = map(&["host:5000:1000:10"]);
    assert_eq!(m.to_guest(5000), 1000);
    assert_eq!(m.to_guest(5009), 1009);
    assert_eq!(m.to_guest(5010), 5010);
    assert_eq!(m.to_guest(4999), 4999);
    assert_eq!(m.to_host(1000), Ok(1000));
    assert_eq!(m.to_host(5000), Ok(5000));
}

#[test]
fn map_rule_maps_both_ways() {
    let m = map(&["map:0:100000:65536"]);
    assert_eq!(m.to_host(0), Ok(100000));
    assert_eq!(m.to_host(65535), Ok(165535));
    assert_eq!(m.to_host(65536), Ok(65536));
    assert_eq!(m.to_guest(100000), 0);
    assert_eq!(m.to_guest(165535), 65535);
    assert_eq!(m.to_guest(165536), 165536);
    assert_eq!(m.to_guest(99999), 99999);
    for g in [0, 1, 1000, 65535] {
        assert_eq!(m.to_guest(m.to_host(g).unwrap()), g);
    }
}

#[test]
fn squash_guest_sends_a_range_to_one_host_id() {
    let m = map(&["squash-guest:1000:65534:100"]);
    for g in [1000, 1050, 1099] {
        assert_eq!(m.to_host(g), Ok(65534));
    }
    assert_eq!(m.to_host(1100), Ok(1100));
    assert_eq!(m.to_guest(65534), 65534);
}

#[test]
fn squash_host_shows_a_range_as_one_guest_id() {
    let m = map(&["squash-host:0:65534:1000"]);
    for h in [0, 1, 999] {
        assert_eq!(m.to_guest(h), 65534);
    }
    assert_eq!(m.to_guest(1000), 1000);
    assert_eq!(m.to_host(65534), Ok(65534));
    assert_eq!(m.to_host(0), Ok(0));
}

#[test]
fn forbid_guest_refuses_only_its_range() {
    let m = map(&["forbid-guest:0:1", "forbid-guest:1000:5"]);
    assert_eq!(m.to_host(0), Err(Forbidden));
    assert_eq!(m.to_host(1000), Err(Forbidden));
    assert_eq!(m.to_host(1004), Err(Forbidden));
    assert_eq!(m.to_host(1), Ok(1));
    assert_eq!(m.to_host(1005), Ok(1005));
    assert_eq!(m.to_guest(0), 0);
}

#[test]
fn many_disjoint_rules_are_each_found() {
    let specs: Vec<String> = (0..50u32)
        .rev()
        .map(|i| format!("map:{}:{}:10", i * 100, 1_000_000 + i * 100))
        .collect();
    let m = IdMap::parse("--translate-uid", &specs).unwrap();
    for i in 0..50u32 {
        assert_eq!(m.to_host(i * 100 + 9), Ok(1_000_000 + i * 100 + 9));
        assert_eq!(m.to_host(i * 100 + 10), Ok(i * 100 + 10));
        assert_eq!(m.to_guest(1_000_000 + i * 100), i * 100);
    }
}

#[test]
fn translation_flags_are_named_in_refusals() {
    let t = translation(&["map:0:1000:1"], &["squash-host:0:100:1"]);
    assert_eq!(t.uid.to_host(0), Ok(1000));
    assert_eq!(t.gid.to_guest(0), 100);
    assert!(!t.is_empty());
    assert!(translation(&[], &[]).is_empty());
    // Rules parsed one by one (as the command line does) are checked together.
    let t = Translation::from_rules(&rules(&["map:0:1000:10"]), &rules(&["host:5:0:1"])).unwrap();
    assert_eq!(t.uid.to_host(9), Ok(1009));
    let e = Translation::from_rules(&rules(&["map:0:1:1", "map:0:2:1"]), &[]).unwrap_err();
    assert!(e.to_string().starts_with("--translate-uid: "), "{e}");
    let e = Translation::from_rules(&[], &rules(&["map:0:1000:10", "guest:9:0:1"])).unwrap_err();
    assert!(e.to_string().starts_with("--translate-gid: "), "{e}");
    assert_eq!(
        (e.flag, e.rule.as_str()),
        ("--translate-gid", "guest:9:0:1")
    );
    assert!(matches!(e.error, RuleError::Overlap { .. }), "{e}");
}

// ---- the wrapper -----------------------------------------------------------------------------

/// Host owner and group of every attribute the fake answers with.
const HOST_UID: u32 = 5000;
const HOST_GID: u32 = 6000;

/// A filesystem that implements every method, records the method name with the context (and
/// SETATTR's ids), and answers with attributes owned by `HOST_UID:HOST_GID`.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<(&'static str, Context)>>,
    setattr_ids: Mutex<Option<(Option<u32>, Option<u32>)>>,
    xattr_list: Vec<u8>,
    init_flags: u64,
}

impl Fake {
    fn log(&self, name: &'static str, ctx: &Context) {
        self.calls.lock().unwrap().push((name, *ctx));
    }

    fn calls(&self) -> Vec<(&'static str, Context)> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn stat() -> libc::stat64 {
        // SAFETY: stat64 is plain old data; all-zero is a valid value.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        st.st_uid = HOST_UID;
        st.st_gid = HOST_GID;
        st.st_mode = libc::S_IFREG | 0o644;
        st
    }

    fn entry() -> Entry {
        Entry {
            inode: 2,
            generation: 0,
            attr: Fake::stat(),
            attr_flags: 0,
            attr_timeout: Duration::ZERO,
            entry_timeout: Duration::ZERO,
        }
    }
}

fn opened() -> Opened {
    Opened {
        handle: Some(1),
        open_flags: 0,
    }
}

impl FileSystem for Fake {
    fn init(&self, capable: u64) -> io::Result<u64> {
        Ok(capable & self.init_flags)
    }
    fn destroy(&self) {
        self.log("destroy", &Context::default());
    }
    fn lookup(&self, ctx: &Context, _: u64, _: &CStr) -> io::Result<Entry> {
        self.log("lookup", ctx);
        Ok(Fake::entry())
    }
    fn forget(&self, ctx: &Context, _: u64, _: u64) {
        self.log("forget", ctx);
    }
    fn batch_forget(&self, ctx: &Context, _: &[(u64, u64)]) {
        self.log("batch_forget", ctx);
    }
    fn getattr(
        &self,
        ctx: &Context,
        _: u64,
        _: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.log("getattr", ctx);
        Ok((Fake::stat(), Duration::ZERO))
    }
    fn setattr(
        &self,
        ctx: &Context,
        _: u64,
        attr: SetAttr,
        _: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.log("setattr", ctx);
        *self.setattr_ids.lock().unwrap() = Some((attr.uid, attr.gid));
        Ok((Fake::stat(), Duration::ZERO))
    }
    fn readlink(&self, ctx: &Context, _: u64) -> io::Result<Vec<u8>> {
        self.log("readlink", ctx);
        Ok(b"t".to_vec())
    }
    fn symlink(
        &self,
        ctx: &Context,
        _: &CStr,
        _: u64,
        _: &CStr,
        _: &[SecCtx],
    ) -> io::Result<Entry> {
        self.log("symlink", ctx);
        Ok(Fake::entry())
    }
    fn mknod(
        &self,
        ctx: &Context,
        _: u64,
        _: &CStr,
        _: u32,
        _: u32,
        _: u32,
        _: &[SecCtx],
    ) -> io::Result<Entry> {
        self.log("mknod", ctx);
        Ok(Fake::entry())
    }
    fn mkdir(
        &self,
        ctx: &Context,
        _: u64,
        _: &CStr,
        _: u32,
        _: u32,
        _: &[SecCtx],
    ) -> io::Result<Entry> {
        self.log("mkdir", ctx);
        Ok(Fake::entry())
    }
    fn unlink(&self, ctx: &Context, _: u64, _: &CStr) -> io::Result<()> {
        self.log("unlink", ctx);
        Ok(())
    }
    fn rmdir(&self, ctx: &Context, _: u64, _: &CStr) -> io::Result<()> {
        self.log("rmdir", ctx);
        Ok(())
    }
    fn rename(&self, ctx: &Context, _: u64, _: &CStr, _: u64, _: &CStr, _: u32) -> io::Result<()> {
        self.log("rename", ctx);
        Ok(())
    }
    fn link(&self, ctx: &Context, _: u64, _: u64, _: &CStr) -> io::Result<Entry> {
        self.log("link", ctx);
        Ok(Fake::entry())
    }
    fn open(&self, ctx: &Context, _: u64, _: u32, _: u32) -> io::Result<Opened> {
        self.log("open", ctx);
        Ok(opened())
    }
    fn create(
        &self,
        ctx: &Context,
        _: u64,
        _: &CStr,
        _: u32,
        _: u32,
        _: u32,
        _: u32,
        _: &[SecCtx],
    ) -> io::Result<(Entry, Opened)> {
        self.log("create", ctx);
        Ok((Fake::entry(), opened()))
    }
    fn tmpfile(
        &self,
        ctx: &Context,
        _: u64,
        _: u32,
        _: u32,
        _: u32,
        _: &[SecCtx],
    ) -> io::Result<(Entry, Opened)> {
        self.log("tmpfile", ctx);
        Ok((Fake::entry(), opened()))
    }
    fn read(
        &self,
        ctx: &Context,
        _: u64,
        _: u64,
        _: &mut dyn ZeroCopyWriter,
        _: u32,
        _: u64,
    ) -> io::Result<usize> {
        self.log("read", ctx);
        Ok(1)
    }
    fn write(
        &self,
        ctx: &Context,
        _: u64,
        _: u64,
        _: &mut dyn ZeroCopyReader,
        _: u32,
        _: u64,
        _: bool,
    ) -> io::Result<usize> {
        self.log("write", ctx);
        Ok(1)
    }
    fn flush(&self, ctx: &Context, _: u64, _: u64, _: u64) -> io::Result<()> {
        self.log("flush", ctx);
        Ok(())
    }
    fn release(&self, ctx: &Context, _: u64, _: u32, _: u64) -> io::Result<()> {
        self.log("release", ctx);
        Ok(())
    }
    fn fsync(&self, ctx: &Context, _: u64, _: bool, _: u64) -> io::Result<()> {
        self.log("fsync", ctx);
        Ok(())
    }
    fn opendir(&self, ctx: &Context, _: u64, _: u32) -> io::Result<Opened> {
        self.log("opendir", ctx);
        Ok(opened())
    }
    fn readdir(
        &self,
        ctx: &Context,
        _: u64,
        _: u64,
        _: u32,
        _: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.log("readdir", ctx);
        add_entry(DirEntry {
            ino: 2,
            offset: 1,
            type_: u32::from(libc::DT_REG),
            name: b"f",
        })
        .map(|_| ())
    }
    fn readdirplus(
        &self,
        ctx: &Context,
        _: u64,
        _: u64,
        _: u32,
        _: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.log("readdirplus", ctx);
        for i in 0..3 {
            let d = DirEntry {
                ino: 2 + i,
                offset: 1 + i,
                type_: u32::from(libc::DT_REG),
                name: b"f",
            };
            if add_entry(d, Fake::entry())? == 0 {
                break;
            }
        }
        Ok(())
    }
    fn releasedir(&self, ctx: &Context, _: u64, _: u32, _: u64) -> io::Result<()> {
        self.log("releasedir", ctx);
        Ok(())
    }
    fn fsyncdir(&self, ctx: &Context, _: u64, _: bool, _: u64) -> io::Result<()> {
        self.log("fsyncdir", ctx);
        Ok(())
    }
    fn statfs(&self, ctx: &Context, _: u64) -> io::Result<libc::statvfs64> {
        self.log("statfs", ctx);
        // SAFETY: statvfs64 is plain old data; all-zero is a valid value.
        Ok(unsafe { std::mem::zeroed() })
    }
    fn access(&self, ctx: &Context, _: u64, _: u32) -> io::Result<()> {
        self.log("access", ctx);
        Ok(())
    }
    fn setxattr(
        &self,
        ctx: &Context,
        _: u64,
        _: &CStr,
        _: &[u8],
        _: u32,
        _: u32,
    ) -> io::Result<()> {
        self.log("setxattr", ctx);
        Ok(())
    }
    fn getxattr(&self, ctx: &Context, _: u64, _: &CStr, _: u32) -> io::Result<XattrReply> {
        self.log("getxattr", ctx);
        Ok(XattrReply::Data(b"v".to_vec()))
    }
    fn listxattr(&self, ctx: &Context, _: u64, size: u32) -> io::Result<XattrReply> {
        self.log("listxattr", ctx);
        let n = self.xattr_list.len() as u32;
        if size == 0 {
            Ok(XattrReply::Size(n))
        } else if n > size {
            Err(io::Error::from_raw_os_error(libc::ERANGE))
        } else {
            Ok(XattrReply::Data(self.xattr_list.clone()))
        }
    }
    fn removexattr(&self, ctx: &Context, _: u64, _: &CStr) -> io::Result<()> {
        self.log("removexattr", ctx);
        Ok(())
    }
    fn fallocate(
        &self,
        ctx: &Context,
        _: u64,
        _: u64,
        _: u32,
        _: u64,
        _: u64,
        _: bool,
    ) -> io::Result<()> {
        self.log("fallocate", ctx);
        Ok(())
    }
    fn lseek(&self, ctx: &Context, _: u64, _: u64, _: u64, _: u32) -> io::Result<u64> {
        self.log("lseek", ctx);
        Ok(0)
    }
    fn copy_file_range(
        &self,
        ctx: &Context,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: bool,
    ) -> io::Result<usize> {
        self.log("copy_file_range", ctx);
        Ok(0)
    }
    fn syncfs(&self, ctx: &Context, _: u64) -> io::Result<()> {
        self.log("syncfs", ctx);
        Ok(())
    }
}

fn cs(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Calls every method of `fs` once with `ctx`; returns the names of those that failed.
fn call_everything(fs: &dyn FileSystem, ctx: &Context) -> Vec<&'static str> {
    let n = cs("n");
    let mut failed = Vec::new();
    let mut check = |name: &'static str, ok: bool| {
        if !ok {
            failed.push(name);
        }
    };
    check("init", fs.init(u64::MAX).is_ok());
    fs.destroy();
    check("lookup", fs.lookup(ctx, 1, &n).is_ok());
    fs.forget(ctx, 2, 1);
    fs.batch_forget(ctx, &[(2, 1)]);
    check("getattr", fs.getattr(ctx, 2, None).is_ok());
    check(
        "setattr",
        fs.setattr(ctx, 2, SetAttr::default(), None).is_ok(),
    );
    check("readlink", fs.readlink(ctx, 2).is_ok());
    check("symlink", fs.symlink(ctx, &n, 1, &n, &[]).is_ok());
    check(
        "mknod",
        fs.mknod(ctx, 1, &n, libc::S_IFIFO | 0o600, 0, 0, &[])
            .is_ok(),
    );
    check("mkdir", fs.mkdir(ctx, 1, &n, 0o755, 0, &[]).is_ok());
    check("unlink", fs.unlink(ctx, 1, &n).is_ok());
    check("rmdir", fs.rmdir(ctx, 1, &n).is_ok());
    check("rename", fs.rename(ctx, 1, &n, 1, &n, 0).is_ok());
    check("link", fs.link(ctx, 2, 1, &n).is_ok());
    check("open", fs.open(ctx, 2, 0, 0).is_ok());
    check("create", fs.create(ctx, 1, &n, 0o644, 0, 0, 0, &[]).is_ok());
    check("tmpfile", fs.tmpfile(ctx, 1, 0o644, 0, 0, &[]).is_ok());
    let mut w = VecWriter::new(16);
    check("read", fs.read(ctx, 2, 1, &mut w, 1, 0).is_ok());
    let mut r = SliceReader::new(b"x");
    check("write", fs.write(ctx, 2, 1, &mut r, 1, 0, false).is_ok());
    check("flush", fs.flush(ctx, 2, 1, 0).is_ok());
    check("release", fs.release(ctx, 2, 0, 1).is_ok());
    check("fsync", fs.fsync(ctx, 2, false, 1).is_ok());
    check("opendir", fs.opendir(ctx, 1, 0).is_ok());
    check(
        "readdir",
        fs.readdir(ctx, 1, 1, 4096, 0, &mut |_| Ok(1)).is_ok(),
    );
    check(
        "readdirplus",
        fs.readdirplus(ctx, 1, 1, 4096, 0, &mut |_, _| Ok(1))
            .is_ok(),
    );
    check("releasedir", fs.releasedir(ctx, 1, 0, 1).is_ok());
    check("fsyncdir", fs.fsyncdir(ctx, 1, false, 1).is_ok());
    check("statfs", fs.statfs(ctx, 1).is_ok());
    check("access", fs.access(ctx, 1, 0).is_ok());
    check(
        "setxattr",
        fs.setxattr(ctx, 2, &cs("user.a"), b"v", 0, 0).is_ok(),
    );
    check("getxattr", fs.getxattr(ctx, 2, &cs("user.a"), 16).is_ok());
    check("listxattr", fs.listxattr(ctx, 2, 0).is_ok());
    check("removexattr", fs.removexattr(ctx, 2, &cs("user.a")).is_ok());
    check("fallocate", fs.fallocate(ctx, 2, 1, 0, 0, 1, false).is_ok());
    check("lseek", fs.lseek(ctx, 2, 1, 0, 0).is_ok());
    check(
        "copy_file_range",
        fs.copy_file_range(ctx, 2, 1, 0, 2, 1, 0, 1, 0, false)
            .is_ok(),
    );
    check("syncfs", fs.syncfs(ctx, 1).is_ok());
    failed
}

/// Every method of the trait, as the fake logs it (`init` is not logged).
const ALL_LOGGED: [&str; 37] = [
    "destroy",
    "lookup",
    "forget",
    "batch_forget",
    "getattr",
    "setattr",
    "readlink",
    "symlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "link",
    "open",
    "create",
    "tmpfile",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "access",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "fallocate",
    "lseek",
    "copy_file_range",
    "syncfs",
];

fn guest_ctx() -> Context {
    Context {
        uid: 1000,
        gid: 100,
        pid: 42,
        supp_group: Some(101),
    }
}

fn mapped(uid: &[&str], gid: &[&str]) -> MappedFs<Fake> {
    MappedFs::new(Fake::default(), translation(uid, gid))
}

#[test]
fn every_method_reaches_the_inner_filesystem_without_rules() {
    let fs = mapped(&[], &[]);
    assert!(!fs.is_active());
    assert_eq!(call_everything(&fs, &guest_ctx()), Vec::<&str>::new());
    let calls = fs.inner().calls();
    let names: Vec<&str> = calls.iter().map(|c| c.0).collect();
    assert_eq!(names, ALL_LOGGED.to_vec());
    // Untouched context.
    assert!(calls[1..].iter().all(|c| c.1 == guest_ctx()), "{calls:?}");
}

#[test]
fn every_method_reaches_the_inner_filesystem_with_rules_and_a_host_context() {
    let fs = mapped(&["map:1000:2000:10"], &["map:100:200:10"]);
    assert!(fs.is_active());
    assert_eq!(call_everything(&fs, &guest_ctx()), Vec::<&str>::new());
    let calls = fs.inner().calls();
    let names: Vec<&str> = calls.iter().map(|c| c.0).collect();
    assert_eq!(names, ALL_LOGGED.to_vec());
    let host = Context {
        uid: 2000,
        gid: 200,
        pid: 42,
        supp_group: Some(201),
    };
    assert!(calls[1..].iter().all(|c| c.1 == host), "{calls:?}");
}

#[test]
fn attributes_going_back_are_translated_to_guest_ids() {
    let fs = mapped(&["host:5000:1:1"], &["squash-host:6000:2:10"]);
    let ctx = guest_ctx();
    let n = cs("n");
    let ids = |st: &libc::stat64| (st.st_uid, st.st_gid);
    assert_eq!(ids(&fs.lookup(&ctx, 1, &n).unwrap().attr), (1, 2));
    assert_eq!(ids(&fs.getattr(&ctx, 2, None).unwrap().0), (1, 2));
    assert_eq!(
        ids(&fs.setattr(&ctx, 2, SetAttr::default(), None).unwrap().0),
        (1, 2)
    );
    assert_eq!(ids(&fs.symlink(&ctx, &n, 1, &n, &[]).unwrap().attr), (1, 2));
    assert_eq!(
        ids(&fs.mknod(&ctx, 1, &n, 0, 0, 0, &[]).unwrap().attr),
        (1, 2)
    );
    assert_eq!(ids(&fs.mkdir(&ctx, 1, &n, 0, 0, &[]).unwrap().attr), (1, 2));
    assert_eq!(ids(&fs.link(&ctx, 2, 1, &n).unwrap().attr), (1, 2));
    assert_eq!(
        ids(&fs.create(&ctx, 1, &n, 0, 0, 0, 0, &[]).unwrap().0.attr),
        (1, 2)
    );
    assert_eq!(
        ids(&fs.tmpfile(&ctx, 1, 0, 0, 0, &[]).unwrap().0.attr),
        (1, 2)
    );
    let mut seen = Vec::new();
    fs.readdirplus(&ctx, 1, 1, 4096, 0, &mut |d, e| {
        seen.push((d.ino, ids(&e.attr)));
        Ok(if seen.len() == 2 { 0 } else { 1 })
    })
    .unwrap();
    assert_eq!(seen, vec![(2, (1, 2)), (3, (1, 2))]);
}

#[test]
fn setattr_owner_is_translated_and_forbidden_ids_refused() {
    let fs = mapped(
        &["map:1000:2000:10", "forbid-guest:0:1"],
        &["squash-guest:100:300:10", "forbid-guest:50:5"],
    );
    let ctx = guest_ctx();
    let chown = |uid: Option<u32>, gid: Option<u32>| {
        fs.setattr(
            &ctx,
            2,
            SetAttr {
                uid,
                gid,
                ..SetAttr::default()
            },
            None,
        )
    };
    chown(Some(1005), Some(105)).unwrap();
    assert_eq!(
        fs.inner().setattr_ids.lock().unwrap().take(),
        Some((Some(2005), Some(300)))
    );
    chown(None, Some(7)).unwrap();
    assert_eq!(
        fs.inner().setattr_ids.lock().unwrap().take(),
        Some((None, Some(7)))
    );
    fs.inner().calls();
    assert_eq!(
        chown(Some(0), None).unwrap_err().raw_os_error(),
        Some(libc::EPERM)
    );
    assert_eq!(
        chown(Some(1), Some(52)).unwrap_err().raw_os_error(),
        Some(libc::EPERM)
    );
    assert!(fs.inner().calls().is_empty(), "refused before the inner fs");
}

#[test]
fn creating_as_a_forbidden_id_is_refused_before_the_inner_filesystem() {
    let fs = mapped(&["forbid-guest:1000:1"], &["forbid-guest:7:1"]);
    let n = cs("n");
    let eperm = |r: io::Result<()>| assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPERM));
    for ctx in [
        guest_ctx(),
        Context {
            uid: 1,
            gid: 7,
            ..guest_ctx()
        },
    ] {
        eperm(fs.symlink(&ctx, &n, 1, &n, &[]).map(drop));
        eperm(fs.mknod(&ctx, 1, &n, 0, 0, 0, &[]).map(drop));
        eperm(fs.mkdir(&ctx, 1, &n, 0, 0, &[]).map(drop));
        eperm(fs.link(&ctx, 2, 1, &n).map(drop));
        eperm(fs.create(&ctx, 1, &n, 0, 0, 0, 0, &[]).map(drop));
        eperm(fs.tmpfile(&ctx, 1, 0, 0, 0, &[]).map(drop));
        eperm(fs.rename(&ctx, 1, &n, 1, &cs("m"), super::fs::RENAME_WHITEOUT));
        assert!(fs.inner().calls().is_empty());
        // Requests that create nothing go through with the id as it is.
        fs.rename(&ctx, 1, &n, 1, &cs("m"), 0).unwrap();
        fs.getattr(&ctx, 2, None).unwrap();
        fs.access(&ctx, 2, 0).unwrap();
        let calls = fs.inner().calls();
        assert_eq!(calls.len(), 3);
        assert!(calls.iter().all(|c| c.1 == ctx));
    }
    // A forbidden supplementary group is dropped, the request still goes through.
    let ctx = Context {
        uid: 1,
        gid: 1,
        supp_group: Some(7),
        ..guest_ctx()
    };
    fs.mkdir(&ctx, 1, &n, 0, 0, &[]).unwrap();
    assert_eq!(fs.inner().calls()[0].1.supp_group, None);
}

#[test]
fn acl_xattrs_are_refused_only_while_translating() {
    let acl = [
        cs("system.posix_acl_access"),
        cs("system.posix_acl_default"),
    ];
    let ctx = guest_ctx();
    let plain = mapped(&[], &[]);
    for a in &acl {
        plain.setxattr(&ctx, 2, a, b"x", 0, 0).unwrap();
        plain.getxattr(&ctx, 2, a, 0).unwrap();
        plain.removexattr(&ctx, 2, a).unwrap();
    }
    let fs = mapped(&[], &["map:0:1:1"]);
    let eopnotsupp =
        |r: io::Result<()>| assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EOPNOTSUPP));
    fs.inner().calls();
    for a in &acl {
        eopnotsupp(fs.setxattr(&ctx, 2, a, b"x", 0, 0));
        eopnotsupp(fs.getxattr(&ctx, 2, a, 0).map(drop));
        eopnotsupp(fs.removexattr(&ctx, 2, a));
    }
    assert!(fs.inner().calls().is_empty());
    fs.setxattr(&ctx, 2, &cs("system.posix_acl_other"), b"x", 0, 0)
        .unwrap();
    fs.getxattr(&ctx, 2, &cs("user.posix_acl_access"), 0)
        .unwrap();
}

#[test]
fn listxattr_leaves_out_acl_names_while_translating() {
    let list = b"user.a\0system.posix_acl_access\0security.x\0system.posix_acl_default\0".to_vec();
    let fake = || Fake {
        xattr_list: list.clone(),
        ..Fake::default()
    };
    let ctx = guest_ctx();
    let plain = MappedFs::new(fake(), Translation::default());
    assert_eq!(
        plain.listxattr(&ctx, 2, 0).unwrap(),
        XattrReply::Size(list.len() as u32)
    );
    let t = translation(&["map:0:1:1"], &[]);
    let fs = MappedFs::new(fake(), t);
    let want = b"user.a\0security.x\0".to_vec();
    assert_eq!(
        fs.listxattr(&ctx, 2, 0).unwrap(),
        XattrReply::Size(want.len() as u32)
    );
    assert_eq!(
        fs.listxattr(&ctx, 2, want.len() as u32).unwrap(),
        XattrReply::Data(want.clone())
    );
    assert_eq!(
        fs.listxattr(&ctx, 2, want.len() as u32 - 1)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ERANGE)
    );
    assert_eq!(without_acl_names_for_test(b""), b"");
    assert_eq!(without_acl_names_for_test(b"system.posix_acl_access"), b"");
    assert_eq!(without_acl_names_for_test(b"a\0b"), b"a\0b");
}

fn without_acl_names_for_test(l: &[u8]) -> Vec<u8> {
    super::fs::without_acl_names(l)
}

#[test]
fn posix_acl_is_never_enabled_while_translating() {
    let fake = || Fake {
        init_flags: init::POSIX_ACL | init::ASYNC_READ,
        ..Fake::default()
    };
    let plain = MappedFs::new(fake(), Translation::default());
    assert_eq!(
        plain.init(u64::MAX).unwrap(),
        init::POSIX_ACL | init::ASYNC_READ
    );
    let fs = MappedFs::new(fake(), translation(&["map:0:1:1"], &[]));
    assert_eq!(fs.init(u64::MAX).unwrap(), init::ASYNC_READ);
}

#[test]
fn the_invalid_id_is_never_translated() {
    // (uid_t)-1 marks a request without caller ids (FUSE_ALLOW_IDMAP); no rule can reach it.
    let m = map(&["map:4294967194:0:100", "squash-host:4294967294:5:1"]);
    assert_eq!(m.to_host(u32::MAX), Ok(u32::MAX));
    assert_eq!(m.to_guest(u32::MAX), u32::MAX);
    let fs = mapped(
        &["squash-guest:0:7:4294967295"],
        &["forbid-guest:0:4294967295"],
    );
    let ctx = Context {
        uid: u32::MAX,
        gid: u32::MAX,
        pid: 1,
        supp_group: None,
    };
    fs.mkdir(&ctx, 1, &cs("n"), 0, 0, &[]).unwrap();
    assert_eq!(fs.inner().calls()[0].1, ctx);
}

#[test]
fn a_count_of_zero_names_no_id_and_is_accepted() {
    // As the reference: Incus passes forbid-guest:0:0 among its rules.
    let map = IdMap::parse(
        "--translate-uid",
        &[
            "map:0:1000000:1000000000",
            "forbid-guest:0:0",
            "forbid-guest:1000000000:3294967295",
            "guest:5:6:0",
            "squash-host:7:8:0",
        ],
    )
    .unwrap();
    assert_eq!(map.to_host(0), Ok(1_000_000));
    assert_eq!(map.to_host(5), Ok(1_000_005));
    assert_eq!(map.to_host(1_000_000_000), Err(Forbidden));
    assert_eq!(map.to_guest(1_000_007), 7);
    let empty = IdMap::parse("--translate-gid", &["forbid-guest:0:0", "map:4:4:0"]).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.to_host(0), Ok(0));
}
