//! One budget bounds every directory listing, whatever the number of handles and the size of
//! the directory: snapshots (shared or private, of handles and of no-opendir inodes) are
//! charged against it, and listings that do not fit are streamed from the directory. Each
//! handle still lists every entry exactly once with its real type, at offsets that stay valid.

use super::*;
use std::collections::{BTreeMap, HashSet};

/// Bytes the listings of `fs` really hold, counted without the accounting: every distinct
/// snapshot a handle, an inode or the shared cache keeps.
fn held(fs: &PassthroughFs) -> usize {
    let kept = fs
        .handles
        .dir_listings()
        .into_iter()
        .chain(fs.io_fds.all_listings())
        .filter_map(|l| match l {
            dir::Listing::Snapshot(s) => Some(s),
            dir::Listing::Stream => None,
        })
        .chain(fs.dircache.snapshots());
    let mut seen = HashSet::new();
    kept.filter(|s| seen.insert(Arc::as_ptr(s)))
        .map(|s| s.memory_size())
        .sum()
}

/// Both what is held and what is accounted stay within `cap`, and agree.
fn assert_within(fs: &PassthroughFs, cap: usize, when: &str) {
    let held = held(fs);
    assert!(
        held <= cap,
        "{when}: listings hold {held} bytes, budget {cap}"
    );
    assert_eq!(fs.dircache.used(), held, "{when}: accounted = held");
    assert!(
        fs.dircache.peak() <= cap,
        "{when}: peak {}",
        fs.dircache.peak()
    );
}

/// Fills `dir` with `n` entries (every tenth a directory, every seventh a symlink, the rest
/// regular files); returns every name the directory lists, `.` and `..` included, with its type.
fn big_dir(dir: &Path, n: usize) -> BTreeMap<Vec<u8>, u32> {
    let mut expected = BTreeMap::new();
    expected.insert(b".".to_vec(), u32::from(libc::DT_DIR));
    expected.insert(b"..".to_vec(), u32::from(libc::DT_DIR));
    for i in 0..n {
        let name = format!("entry-{i:05}-abcdefgh");
        let p = dir.join(&name);
        let t = if i % 10 == 0 {
            std::fs::create_dir(&p).unwrap();
            libc::DT_DIR
        } else if i % 7 == 0 {
            std::os::unix::fs::symlink("elsewhere", &p).unwrap();
            libc::DT_LNK
        } else {
            std::fs::write(&p, b"").unwrap();
            libc::DT_REG
        };
        expected.insert(name.into_bytes(), u32::from(t));
    }
    expected
}

/// One listing in progress.
struct Reader {
    inode: u64,
    fh: u64,
    offset: u64,
    seen: Vec<(Vec<u8>, u32)>,
    done: bool,
}

impl Reader {
    fn new(inode: u64, fh: u64) -> Self {
        Reader {
            inode,
            fh,
            offset: 0,
            seen: Vec::new(),
            done: false,
        }
    }

    /// Reads up to `max` more entries; whether the listing ended.
    fn step(&mut self, fs: &PassthroughFs, max: usize) -> bool {
        if !self.done {
            let chunk = readdir(fs, self.inode, self.fh, self.offset, max);
            match chunk.last() {
                Some((_, off, _)) => self.offset = *off,
                None => self.done = true,
            }
            self.seen
                .extend(chunk.into_iter().map(|(name, _, t)| (name, t)));
        }
        self.done
    }

    /// Every entry exactly once, with the expected type.
    fn check(&self, expected: &BTreeMap<Vec<u8>, u32>, who: &str) {
        let got: BTreeMap<Vec<u8>, u32> = self.seen.iter().cloned().collect();
        assert_eq!(
            self.seen.len(),
            got.len(),
            "{who}: an entry was listed twice"
        );
        assert_eq!(got.len(), expected.len(), "{who}: entries missing");
        assert!(&got == expected, "{who}: names or types differ");
    }
}

/// Reads every reader to its end, a chunk each in turn, checking the budget after every round.
fn read_interleaved(fs: &PassthroughFs, readers: &mut [Reader], cap: usize) {
    let mut round = 0;
    loop {
        let mut all_done = true;
        for r in readers.iter_mut() {
            all_done &= r.step(fs, 97);
        }
        assert_within(fs, cap, &format!("round {round}"));
        round += 1;
        if all_done {
            break;
        }
    }
}

fn kinds(fs: &PassthroughFs) -> (usize, usize) {
    let ls = fs.handles.dir_listings();
    let streams = ls
        .iter()
        .filter(|l| matches!(l, dir::Listing::Stream))
        .count();
    (ls.len() - streams, streams)
}

#[test]
fn many_handles_on_a_big_directory_stay_within_one_budget() {
    const CAP: usize = 4 << 20;
    const HANDLES: usize = 32;
    let tmp = tempfile::tempdir().unwrap();
    let expected = big_dir(tmp.path(), 20_000);
    let fs = fs_with(tmp.path(), |c| c.listing_memory = CAP);

    // Just changed: each handle would read its own copy. A few fit, the others stream.
    let mut readers: Vec<_> = (0..HANDLES)
        .map(|_| {
            Reader::new(
                ROOT_ID,
                fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap(),
            )
        })
        .collect();
    read_interleaved(&fs, &mut readers, CAP);
    for (i, r) in readers.iter().enumerate() {
        r.check(&expected, &format!("handle {i}"));
    }
    let (snapshots, streams) = kinds(&fs);
    assert!(snapshots >= 1, "copies that fit are kept");
    assert!(streams >= 1, "the others stream ({snapshots} snapshots)");
    // A rewind of a streamed handle lists everything again.
    let r = &mut readers[HANDLES - 1];
    *r = Reader::new(ROOT_ID, r.fh);
    while !r.step(&fs, 500) {}
    r.check(&expected, "rewound");
    for r in &readers {
        fs.releasedir(&ctx(), ROOT_ID, 0, r.fh).unwrap();
    }
    // Released handles gave their copies back (the cache keeps at most a settled one).
    assert_within(&fs, CAP, "released");
    assert!(fs.dircache.used() <= CAP / 4);

    // Settled: every handle shares one snapshot.
    let_settle();
    let mut readers: Vec<_> = (0..HANDLES)
        .map(|_| {
            Reader::new(
                ROOT_ID,
                fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap(),
            )
        })
        .collect();
    read_interleaved(&fs, &mut readers, CAP);
    for (i, r) in readers.iter().enumerate() {
        r.check(&expected, &format!("settled handle {i}"));
    }
    assert_eq!(kinds(&fs), (HANDLES, 0));
    let shared = fs.dircache.snapshots();
    assert_eq!(shared.len(), 1);
    assert_eq!(fs.dircache.used(), shared[0].memory_size(), "one copy");
}

#[test]
fn a_directory_too_big_for_the_budget_is_streamed_by_every_handle() {
    // A quarter of 256 KiB is far less than 5,000 entries take.
    const CAP: usize = 256 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let expected = big_dir(tmp.path(), 5_000);
    let fs = fs_with(tmp.path(), |c| c.listing_memory = CAP);
    let_settle();
    let mut readers: Vec<_> = (0..8)
        .map(|_| {
            Reader::new(
                ROOT_ID,
                fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap(),
            )
        })
        .collect();
    read_interleaved(&fs, &mut readers, CAP);
    for (i, r) in readers.iter().enumerate() {
        r.check(&expected, &format!("handle {i}"));
    }
    assert_eq!(kinds(&fs), (0, 8));
    assert_eq!(fs.dircache.used(), 0);
    // Offsets stay valid while the directory changes: entries that stay are listed once, and a
    // past offset resumes where it did.
    let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let head = readdir(&fs, ROOT_ID, h, 0, 300);
    for i in (0..5_000).step_by(3) {
        let p = tmp.path().join(format!("entry-{i:05}-abcdefgh"));
        if i % 10 == 0 {
            std::fs::remove_dir(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    let again = readdir(&fs, ROOT_ID, h, head[99].1, 1);
    let tail = readdir(&fs, ROOT_ID, h, head.last().unwrap().1, usize::MAX);
    let mut names: Vec<_> = head
        .iter()
        .chain(&tail)
        .map(|(n, _, _)| n.clone())
        .collect();
    let listed = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), listed, "no entry twice");
    let kept = (0..5_000usize)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("entry-{i:05}-abcdefgh").into_bytes());
    for k in kept {
        assert!(names.binary_search(&k).is_ok(), "{k:?} kept but not listed");
    }
    if let Some((name, _, _)) = again.first() {
        assert_ne!(name, &head[99].0);
    }
}

#[test]
fn streamed_readdirplus_gives_every_entry_once_with_one_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = big_dir(tmp.path(), 700);
    let fs = fs_with(tmp.path(), |c| c.listing_memory = 0);
    let fh = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let mut got = BTreeMap::new();
    let mut offset = 0;
    let mut calls = 0;
    loop {
        calls += 1;
        let mut taken = 0;
        let mut last = None;
        fs.readdirplus(&ctx(), ROOT_ID, fh, 4096, offset, &mut |d, e| {
            // Refuse the 13th entry of every reply: it comes again first in the next.
            if taken == 12 {
                if e.inode != 0 {
                    // Its reference is dropped by readdirplus itself.
                    assert!(refcount(&fs, e.inode).is_some());
                }
                return Ok(0);
            }
            taken += 1;
            let fresh = got.insert(d.name.to_vec(), (d.type_, e.inode, e.attr.st_mode));
            assert!(fresh.is_none(), "{:?} twice", d.name);
            last = Some(d.offset);
            Ok(1)
        })
        .unwrap();
        match last {
            Some(o) => offset = o,
            None => break,
        }
    }
    assert!(calls > expected.len() / 12);
    assert_eq!(got.len(), expected.len());
    for (name, (t, id, mode)) in &got {
        assert_eq!(*t, expected[name], "{name:?}");
        assert_eq!(u32::from(sys::mode_to_dtype(*mode)), *t);
        if name == b"." || name == b".." {
            assert_eq!(*id, 0);
        } else {
            assert_eq!(refcount(&fs, *id), Some(1), "one reference for {name:?}");
        }
    }
    assert_eq!(kinds(&fs), (0, 1));
}

#[test]
fn inode_listings_without_opendir_share_the_budget() {
    // About four of the eight listings fit.
    const CAP: usize = 512 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    for d in 0..8 {
        let p = tmp.path().join(format!("d{d}"));
        std::fs::create_dir(&p).unwrap();
        dirs.push((format!("d{d}"), big_dir(&p, 3_000)));
    }
    let fs = no_open_fs(tmp.path(), |c| c.listing_memory = CAP);
    assert_eq!(errno(fs.opendir(&ctx(), ROOT_ID, 0)), libc::ENOSYS);
    let mut readers: Vec<_> = dirs
        .iter()
        .map(|(name, _)| Reader::new(lookup(&fs, name).inode, 0))
        .collect();
    // Every inode keeps its listing while it is read: all eight at once.
    let mut round = 0;
    loop {
        let mut all_done = true;
        for r in readers.iter_mut() {
            all_done &= r.step(&fs, 97);
        }
        assert_within(&fs, CAP, &format!("round {round}"));
        if round == 5 {
            let ls = fs.io_fds.all_listings();
            assert_eq!(ls.len(), 8);
            let streams = ls
                .iter()
                .filter(|l| matches!(l, dir::Listing::Stream))
                .count();
            assert!(streams > 0 && streams < 8, "{streams} of 8 streamed");
        }
        round += 1;
        if all_done {
            break;
        }
    }
    for (r, (name, expected)) in readers.iter().zip(&dirs) {
        r.check(expected, name);
    }
    // Snapshots read to their end are dropped (the cache may keep settled ones).
    assert!(fs
        .io_fds
        .all_listings()
        .iter()
        .all(|l| matches!(l, dir::Listing::Stream)));
    assert_within(&fs, CAP, "the end");
}

#[test]
fn streamed_entries_get_their_real_type_where_the_host_reports_dt_unknown() {
    let Some(m) = NoFiletypeMount::new() else {
        eprintln!("skipped: needs root, mkfs.ext4 and a loop device");
        return;
    };
    let root = m.path();
    let mut expected = big_dir(&root, 300);
    expected.insert(b"lost+found".to_vec(), u32::from(libc::DT_DIR));
    assert!(raw_dtypes(&root).iter().all(|t| *t == libc::DT_UNKNOWN));
    for budget in [0, 1 << 20] {
        let fs = fs_with(&root, |c| c.listing_memory = budget);
        let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
        let mut r = Reader::new(ROOT_ID, h);
        while !r.step(&fs, 41) {}
        r.check(&expected, &format!("budget {budget}"));
        let (snapshots, streams) = kinds(&fs);
        assert_eq!(
            (snapshots, streams),
            if budget == 0 { (0, 1) } else { (1, 0) }
        );
    }
}

/// A directory the guest forgot keeps no listing: a walk the guest is done with costs the
/// daemon nothing (a million forgotten nodes kept 52 MiB of cached listings before).
#[test]
fn forgetting_a_directory_drops_its_cached_listing() {
    let tmp = tempfile::tempdir().unwrap();
    let sub = tmp.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    big_dir(&sub, 50);
    let fs = fs_with(tmp.path(), |_| {});
    let dir = lookup(&fs, "sub").inode;
    let_settle();
    let list = |fs: &PassthroughFs| {
        let h = fs.opendir(&ctx(), dir, 0).unwrap().handle.unwrap();
        assert_eq!(readdir(fs, dir, h, 0, usize::MAX).len(), 52);
        fs.releasedir(&ctx(), dir, 0, h).unwrap();
    };
    list(&fs);
    assert_eq!(
        fs.dircache.snapshots().len(),
        1,
        "kept for the next listing"
    );
    assert!(fs.dircache.used() > 0);
    // Another reference on the directory: the listing stays while one is held.
    let again = lookup(&fs, "sub").inode;
    assert_eq!(again, dir);
    fs.forget(&ctx(), dir, 1);
    assert_eq!(fs.dircache.snapshots().len(), 1);
    fs.forget(&ctx(), dir, 1);
    assert!(fs.dircache.snapshots().is_empty());
    assert_eq!(fs.dircache.used(), 0);
}
