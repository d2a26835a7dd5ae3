//! Inodes kept by file handle instead of descriptor (`--inode-file-handles`): descriptors stay
//! bounded, files renamed or unlinked on the host are still reached, and the modes fall back or
//! refuse as documented when handles are not available.

use super::*;
use crate::sandbox::caps::{self, CapSet};

fn as_root() -> bool {
    credentials::running_as_root()
}

fn fs_mode(dir: &Path, mode: InodeFileHandles) -> PassthroughFs {
    fs_with(dir, |c| c.inode_file_handles = mode)
}

fn chmod(fs: &PassthroughFs, inode: u64, mode: u32) -> io::Result<libc::stat64> {
    let attr = SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    fs.setattr(&ctx(), inode, attr, None).map(|(st, _)| st)
}

fn set_mtime(fs: &PassthroughFs, inode: u64, secs: i64) {
    let attr = SetAttr {
        atime: SetTime::At(secs, 0),
        mtime: SetTime::At(secs, 0),
        ..SetAttr::default()
    };
    fs.setattr(&ctx(), inode, attr, None).unwrap();
}

fn host_mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Whether the inode keeps a descriptor, and whether it has a file handle.
fn kept(fs: &PassthroughFs, id: u64) -> (bool, bool) {
    let node = fs.inodes.get(id).unwrap();
    let kept = (node.opened_fd().is_some(), node.file_handle().is_some());
    kept
}

#[test]
fn operations_on_many_files_hold_no_descriptor_per_file() {
    if !as_root() {
        eprintln!("skipped: open_by_handle_at needs CAP_DAC_READ_SEARCH");
        return;
    }
    const FILES: usize = 5000;
    const LINKS: usize = 500;
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..FILES {
        std::fs::write(tmp.path().join(format!("f{i}")), b"").unwrap();
    }
    for i in 0..LINKS {
        std::os::unix::fs::symlink(format!("target{i}"), tmp.path().join(format!("l{i}"))).unwrap();
    }
    let fs = fs_mode(tmp.path(), InodeFileHandles::Prefer);
    assert_eq!(fs.fh_mode, InodeFileHandles::Prefer);
    let _counting = fd_counting();
    let before = open_fds();
    let mut ids = Vec::new();
    for i in 0..FILES {
        let e = fs.lookup(&ctx(), ROOT_ID, &cs(&format!("f{i}"))).unwrap();
        chmod(&fs, e.inode, 0o600).unwrap();
        set_mtime(&fs, e.inode, 1_000_000 + i as i64);
        assert_eq!(
            fs.getattr(&ctx(), e.inode, None).unwrap().0.st_mode & 0o777,
            0o600
        );
        ids.push(e.inode);
    }
    for i in 0..LINKS {
        let e = fs.lookup(&ctx(), ROOT_ID, &cs(&format!("l{i}"))).unwrap();
        assert_eq!(
            fs.readlink(&ctx(), e.inode).unwrap(),
            format!("target{i}").into_bytes()
        );
        set_mtime(&fs, e.inode, 2_000_000);
        ids.push(e.inode);
    }
    let grown = open_fds().saturating_sub(before);
    // Other tests run in parallel in this process; a descriptor per file would be thousands.
    assert!(grown < 100, "{grown} descriptors more after {FILES} files");
    for id in ids {
        assert_eq!(kept(&fs, id), (false, true), "node {id}");
    }
    assert_eq!(host_mode(&tmp.path().join("f4999")), 0o600);
    let m = std::fs::metadata(tmp.path().join("f1234")).unwrap();
    assert_eq!(m.mtime(), 1_001_234);
    assert_eq!(fs.mounts.len(), 1);
}

#[test]
fn never_keeps_a_descriptor_per_file_used_as_before() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..200 {
        std::fs::write(tmp.path().join(format!("f{i}")), b"").unwrap();
    }
    let _many = fd_counting();
    let fs = fs_mode(tmp.path(), InodeFileHandles::Never);
    let mut ids = Vec::new();
    for i in 0..200 {
        let e = fs.lookup(&ctx(), ROOT_ID, &cs(&format!("f{i}"))).unwrap();
        assert_eq!(kept(&fs, e.inode), (false, false), "a lookup keeps nothing");
        chmod(&fs, e.inode, 0o640).unwrap();
        ids.push(e.inode);
    }
    for id in ids {
        assert_eq!(kept(&fs, id), (true, false), "node {id}");
    }
    assert_eq!(fs.mounts.len(), 0);
    // A file renamed on the host before the daemon ever needed a descriptor of it is stale.
    std::fs::write(tmp.path().join("x"), b"x").unwrap();
    let x = lookup(&fs, "x");
    std::fs::rename(tmp.path().join("x"), tmp.path().join("y")).unwrap();
    assert_eq!(errno(fs.getattr(&ctx(), x.inode, None)), libc::ESTALE);
}

#[test]
fn directories_keep_their_descriptors() {
    if !as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("d/e")).unwrap();
    let fs = fs_mode(tmp.path(), InodeFileHandles::Prefer);
    let e = lookup(&fs, "d/e");
    let d = lookup(&fs, "d");
    assert_eq!(kept(&fs, d.inode), (true, false), "parent of a lookup");
    chmod(&fs, e.inode, 0o700).unwrap();
    assert_eq!(kept(&fs, e.inode), (true, false));
}

#[test]
fn a_file_renamed_on_the_host_after_use_is_reached_by_its_handle() {
    if !as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("f"), b"abc").unwrap();
    std::os::unix::fs::symlink("target", tmp.path().join("l")).unwrap();
    let fs = fs_mode(tmp.path(), InodeFileHandles::Prefer);
    let f = lookup(&fs, "f");
    let l = lookup(&fs, "l");
    chmod(&fs, f.inode, 0o640).unwrap();
    assert_eq!(fs.readlink(&ctx(), l.inode).unwrap(), b"target");
    assert_eq!(kept(&fs, f.inode), (false, true));
    assert_eq!(kept(&fs, l.inode), (false, true));

    // Moved to another directory behind the daemon's back.
    std::fs::rename(tmp.path().join("f"), tmp.path().join("d/g")).unwrap();
    std::fs::rename(tmp.path().join("l"), tmp.path().join("d/m")).unwrap();
    std::fs::write(tmp.path().join("f"), b"another file").unwrap();

    let (st, _) = fs.getattr(&ctx(), f.inode, None).unwrap();
    assert_eq!((st.st_ino, st.st_size), (f.attr.st_ino, 3));
    chmod(&fs, f.inode, 0o604).unwrap();
    assert_eq!(host_mode(&tmp.path().join("d/g")), 0o604);
    assert_ne!(host_mode(&tmp.path().join("f")), 0o604);
    let fh = fs.open(&ctx(), f.inode, libc::O_RDONLY as u32, 0).unwrap();
    assert_eq!(read_at(&fs, f.inode, fh.handle.unwrap(), 10, 0), b"abc");
    assert_eq!(fs.readlink(&ctx(), l.inode).unwrap(), b"target");
    // Still no descriptor kept.
    assert_eq!(kept(&fs, f.inode), (false, true));
    // Found again under its new name: the same node.
    assert_eq!(lookup(&fs, "d/g").inode, f.inode);
}

#[test]
fn mandatory_takes_the_handle_at_lookup() {
    if !as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"abc").unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    let fs = fs_mode(tmp.path(), InodeFileHandles::Mandatory);
    let f = lookup(&fs, "f");
    let d = lookup(&fs, "d");
    assert_eq!(kept(&fs, f.inode), (false, true));
    assert_eq!(kept(&fs, d.inode), (false, true));
    // Renamed on the host before any operation needed it: still reached.
    std::fs::rename(tmp.path().join("f"), tmp.path().join("g")).unwrap();
    assert_eq!(fs.getattr(&ctx(), f.inode, None).unwrap().0.st_size, 3);
    let fh = fs.open(&ctx(), f.inode, libc::O_RDONLY as u32, 0).unwrap();
    assert_eq!(read_at(&fs, f.inode, fh.handle.unwrap(), 10, 0), b"abc");

    // A file the guest created is reached after a host rename as well.
    let (c, cfh) = create(&fs, ROOT_ID, "c", 0o644);
    fs.release(&ctx(), c.inode, 0, cfh).unwrap();
    assert_eq!(kept(&fs, c.inode), (false, true));
    std::fs::rename(tmp.path().join("c"), tmp.path().join("d/c2")).unwrap();
    assert_eq!(
        fs.getattr(&ctx(), c.inode, None).unwrap().0.st_ino,
        c.attr.st_ino
    );

    // With prefer the handle is taken on first need only: the same rename makes it stale.
    std::fs::write(tmp.path().join("p"), b"x").unwrap();
    let fs = fs_mode(tmp.path(), InodeFileHandles::Prefer);
    let p = lookup(&fs, "p");
    assert_eq!(kept(&fs, p.inode), (false, false));
    std::fs::rename(tmp.path().join("p"), tmp.path().join("q")).unwrap();
    assert_eq!(errno(fs.getattr(&ctx(), p.inode, None)), libc::ESTALE);
}

#[test]
fn a_file_unlinked_while_open_stays_usable_and_goes_stale_once_closed() {
    if !as_root() {
        return;
    }
    for mode in [InodeFileHandles::Prefer, InodeFileHandles::Mandatory] {
        let tmp = tempfile::tempdir().unwrap();
        let fs = fs_mode(tmp.path(), mode);
        let (e, fh) = create(&fs, ROOT_ID, "f", 0o644);
        write_at(&fs, e.inode, fh, b"12345", 0);
        std::fs::remove_file(tmp.path().join("f")).unwrap();
        let (st, _) = fs.getattr(&ctx(), e.inode, None).unwrap();
        assert_eq!((st.st_size, st.st_nlink), (5, 0), "{mode:?}");
        let st = chmod(&fs, e.inode, 0o600).unwrap();
        assert_eq!(st.st_mode & 0o777, 0o600);
        let fh2 = fs.open(&ctx(), e.inode, libc::O_RDONLY as u32, 0).unwrap();
        assert_eq!(read_at(&fs, e.inode, fh2.handle.unwrap(), 10, 0), b"12345");
        assert!(!kept(&fs, e.inode).0, "{mode:?}");
        fs.release(&ctx(), e.inode, 0, fh).unwrap();
        fs.release(&ctx(), e.inode, 0, fh2.handle.unwrap()).unwrap();
        // Nothing keeps the file any more: it is gone on the host.
        assert_eq!(errno(fs.getattr(&ctx(), e.inode, None)), libc::ESTALE);
        assert_eq!(errno(chmod(&fs, e.inode, 0o644)), libc::ESTALE);
    }
}

/// A `ramfs` (a file system that gives no file handles) mounted on a temporary directory;
/// needs root.
struct RamfsMount {
    dir: tempfile::TempDir,
    at: std::path::PathBuf,
}

impl RamfsMount {
    /// Mounts ramfs on `sub` under a new temporary directory.
    fn new(sub: &str) -> Option<Self> {
        if !as_root() {
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        let at = dir.path().join(sub);
        std::fs::create_dir_all(&at).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "ramfs", "none"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(RamfsMount { dir, at })
    }
}

impl Drop for RamfsMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.at).status();
    }
}

#[test]
fn a_file_system_without_handles() {
    let Some(m) = RamfsMount::new("share") else {
        eprintln!("skipped: needs root and a ramfs mount");
        return;
    };
    std::fs::write(m.at.join("f"), b"x").unwrap();
    let mut cfg = Config::new(&m.at, CacheMode::Auto);
    cfg.inode_file_handles = InodeFileHandles::Mandatory;
    let err = PassthroughFs::new(cfg)
        .err()
        .expect("mandatory refused on ramfs");
    assert!(
        err.to_string()
            .contains("--inode-file-handles=mandatory: the shared directory's file system gives no file handles"),
        "{err}"
    );
    // prefer: files keep descriptors, as with never.
    let fs = fs_mode(&m.at, InodeFileHandles::Prefer);
    let f = lookup(&fs, "f");
    chmod(&fs, f.inode, 0o600).unwrap();
    assert_eq!(kept(&fs, f.inode), (true, false));
    drop(fs);
    drop(m);
}

#[test]
fn a_mount_without_handles_under_the_share() {
    let Some(m) = RamfsMount::new("r") else {
        eprintln!("skipped: needs root and a ramfs mount");
        return;
    };
    let share = m.dir.path();
    std::fs::write(m.at.join("inside"), b"x").unwrap();
    std::fs::write(share.join("outside"), b"y").unwrap();
    let fs = fs_mode(share, InodeFileHandles::Mandatory);
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"r")), libc::EOPNOTSUPP);
    let o = lookup(&fs, "outside");
    assert_eq!(kept(&fs, o.inode), (false, true));

    let fs = fs_mode(share, InodeFileHandles::Prefer);
    let inside = lookup(&fs, "r/inside");
    let outside = lookup(&fs, "outside");
    chmod(&fs, inside.inode, 0o600).unwrap();
    chmod(&fs, outside.inode, 0o600).unwrap();
    assert_eq!(kept(&fs, inside.inode), (true, false));
    assert_eq!(kept(&fs, outside.inode), (false, true));
    drop(fs);
}

/// Drops `CAP_DAC_READ_SEARCH` from the effective set of the calling thread (capabilities are
/// per thread) until dropped.
struct NoDacReadSearch {
    saved: (CapSet, CapSet, CapSet),
}

const CAP_DAC_READ_SEARCH: u32 = 2;

impl NoDacReadSearch {
    fn new() -> Option<Self> {
        let saved = caps::current().ok()?;
        let mut effective = saved.0;
        effective.remove(CAP_DAC_READ_SEARCH);
        caps::set(effective, saved.1, saved.2).ok()?;
        Some(NoDacReadSearch { saved })
    }
}

impl Drop for NoDacReadSearch {
    fn drop(&mut self) {
        // The effective set saved in `new` (still permitted).
        let (e, p, i) = self.saved;
        let _ = caps::set(e, p, i);
    }
}

#[test]
fn without_cap_dac_read_search_prefer_runs_as_never_and_mandatory_refuses() {
    if !as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let Some(_nocap) = NoDacReadSearch::new() else {
        eprintln!("skipped: cannot change capabilities");
        return;
    };
    let fs = fs_mode(tmp.path(), InodeFileHandles::Prefer);
    assert_eq!(fs.fh_mode, InodeFileHandles::Never);
    let f = lookup(&fs, "f");
    chmod(&fs, f.inode, 0o600).unwrap();
    assert_eq!(kept(&fs, f.inode), (true, false));
    let mut cfg = Config::new(tmp.path(), CacheMode::Auto);
    cfg.inode_file_handles = InodeFileHandles::Mandatory;
    let err = PassthroughFs::new(cfg).err().expect("mandatory refused");
    assert!(err.to_string().contains("CAP_DAC_READ_SEARCH"), "{err}");
}

/// An overlayfs mount (lower, upper, work and merged directories under a temporary directory).
struct OverlayMount {
    dir: tempfile::TempDir,
}

impl OverlayMount {
    fn new() -> Option<Self> {
        if !as_root() {
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        for d in ["lower", "upper", "work", "merged"] {
            std::fs::create_dir(dir.path().join(d)).ok()?;
        }
        std::fs::write(dir.path().join("lower/f"), b"from the lower layer").ok()?;
        let p = |d: &str| dir.path().join(d).display().to_string();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            p("lower"),
            p("upper"),
            p("work")
        );
        let ok = std::process::Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(dir.path().join("merged"))
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(OverlayMount { dir })
    }

    fn merged(&self) -> std::path::PathBuf {
        self.dir.path().join("merged")
    }
}

impl Drop for OverlayMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.merged())
            .status();
    }
}

/// Overlayfs changes a file's birth time when it copies the file up, so its nodes are told
/// apart by (identifying) file handles, which a copy-up keeps: the node stays the same.
#[test]
fn an_overlayfs_file_keeps_its_node_across_a_copy_up() {
    let Some(m) = OverlayMount::new() else {
        eprintln!("skipped: needs root and overlayfs");
        return;
    };
    let fs = new_fs(&m.merged());
    let f = lookup(&fs, "f");
    let node = fs.inodes.get(f.inode).unwrap();
    assert_ne!(
        node.identity,
        key::Identity::Birth,
        "overlayfs birth times are not trusted"
    );
    if node.identity == key::Identity::Handle {
        // Linux 6.5 and later give identifying handles (AT_HANDLE_FID) without nfs_export.
        assert!(node.opened_fd().is_none(), "no descriptor held");
    }
    // Copy-up: the host appends through the merged directory.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(m.merged().join("f"))
        .unwrap()
        .write_all(b", copied up")
        .unwrap();
    assert!(m.dir.path().join("upper/f").exists(), "copied up");
    assert_eq!(
        lookup(&fs, "f").inode,
        f.inode,
        "the same node after the copy-up"
    );
    let st = fs.getattr(&ctx(), f.inode, None).unwrap().0;
    assert_eq!(
        st.st_size as usize,
        b"from the lower layer, copied up".len()
    );
    drop(fs);
}
