//! Behaviour tests of [`PassthroughFs`] on temporary directories, through the [`FileSystem`]
//! trait only (plus a peek at the inode table for lookup counts).

mod file_handles;
mod listings;

use super::xattr::killed_suidgid;
use super::*;
use crate::fuse::io::{SliceReader, VecWriter};
use std::collections::BTreeSet;
use std::ffi::CString;
use std::fmt::Debug;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn ctx() -> Context {
    Context {
        uid: 0,
        gid: 0,
        pid: 1,
        ..Context::default()
    }
}

fn fs_with(dir: &Path, f: impl FnOnce(&mut Config)) -> PassthroughFs {
    let mut cfg = Config::new(dir, CacheMode::Auto);
    f(&mut cfg);
    PassthroughFs::new(cfg).unwrap()
}

fn new_fs(dir: &Path) -> PassthroughFs {
    fs_with(dir, |_| {})
}

fn cs(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn errno<T: Debug>(r: io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().expect("an OS error")
}

/// Looks `path` up component by component from the root (one reference per component).
fn lookup(fs: &PassthroughFs, path: &str) -> Entry {
    let mut e = fs.lookup(&ctx(), ROOT_ID, c".").unwrap();
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        e = fs.lookup(&ctx(), e.inode, &cs(comp)).unwrap();
    }
    e
}

fn read_at(fs: &PassthroughFs, inode: u64, fh: u64, size: u32, off: u64) -> Vec<u8> {
    let mut w = VecWriter::new(size as usize);
    let n = fs.read(&ctx(), inode, fh, &mut w, size, off).unwrap();
    let mut b = w.bytes();
    b.truncate(n);
    b
}

fn write_at(fs: &PassthroughFs, inode: u64, fh: u64, data: &[u8], off: u64) -> usize {
    let mut r = SliceReader::new(data);
    fs.write(&ctx(), inode, fh, &mut r, data.len() as u32, off, false)
        .unwrap()
}

fn create(fs: &PassthroughFs, parent: u64, name: &str, mode: u32) -> (Entry, u64) {
    let (e, o) = fs
        .create(
            &ctx(),
            parent,
            &cs(name),
            mode,
            libc::O_RDWR as u32,
            0,
            0,
            &[],
        )
        .unwrap();
    (e, o.handle.unwrap())
}

/// Every (name, offset, type) of a directory, from `offset` on, taking at most `max` entries.
fn readdir(
    fs: &PassthroughFs,
    inode: u64,
    fh: u64,
    offset: u64,
    max: usize,
) -> Vec<(Vec<u8>, u64, u32)> {
    let mut out = Vec::new();
    fs.readdir(&ctx(), inode, fh, 4096, offset, &mut |d| {
        if out.len() == max {
            return Ok(0);
        }
        out.push((d.name.to_vec(), d.offset, d.type_));
        Ok(1)
    })
    .unwrap();
    out
}

fn refcount(fs: &PassthroughFs, id: u64) -> Option<u64> {
    fs.inodes.get(id).map(|d| d.refcount())
}

#[test]
fn lookup_dotdot_at_root_stays_in_share() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    let fs = new_fs(tmp.path());
    let root_ino = std::fs::metadata(tmp.path()).unwrap().ino();
    let up = fs.lookup(&ctx(), ROOT_ID, c"..").unwrap();
    assert_eq!(up.inode, ROOT_ID);
    assert_eq!(up.attr.st_ino, root_ino);
    let sub = fs.lookup(&ctx(), ROOT_ID, c"sub").unwrap();
    let back = fs.lookup(&ctx(), sub.inode, c"..").unwrap();
    assert_eq!(back.inode, ROOT_ID);
}

#[test]
fn lookup_dot_returns_the_directory_itself() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    let fs = new_fs(tmp.path());
    let sub = fs.lookup(&ctx(), ROOT_ID, c"sub").unwrap();
    let dot = fs.lookup(&ctx(), sub.inode, c".").unwrap();
    assert_eq!(dot.inode, sub.inode);
    assert_eq!(refcount(&fs, sub.inode), Some(2));
}

#[test]
fn lookup_refuses_name_with_slash() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    let fs = new_fs(tmp.path());
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"sub/..")), libc::EINVAL);
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"../etc")), libc::EINVAL);
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"/etc")), libc::EINVAL);
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"")), libc::EINVAL);
    let long = cs(&"a".repeat(256));
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, &long)), libc::ENAMETOOLONG);
    assert_eq!(fs.lookup(&ctx(), ROOT_ID, c"missing").unwrap().inode, 0);
}

#[test]
fn lookup_under_a_regular_file_is_enotdir() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    assert_eq!(errno(fs.lookup(&ctx(), f.inode, c"x")), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(&ctx(), f.inode, c".")), libc::ENOTDIR);
}

#[test]
fn lookup_twice_returns_same_node_id_and_counts_references() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let a = fs.lookup(&ctx(), ROOT_ID, c"f").unwrap();
    let b = fs.lookup(&ctx(), ROOT_ID, c"f").unwrap();
    assert_eq!(a.inode, b.inode);
    assert_ne!(a.inode, ROOT_ID);
    assert_eq!(refcount(&fs, a.inode), Some(2));
    assert_eq!(a.entry_timeout, fs.cfg.entry_timeout);
    assert_eq!(a.attr_timeout, fs.cfg.attr_timeout);
}

#[test]
fn forget_to_zero_frees_the_inode() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let a = fs.lookup(&ctx(), ROOT_ID, c"f").unwrap();
    fs.lookup(&ctx(), ROOT_ID, c"f").unwrap();
    fs.forget(&ctx(), a.inode, 1);
    assert!(fs.getattr(&ctx(), a.inode, None).is_ok());
    fs.batch_forget(&ctx(), &[(a.inode, 1), (987654, 3)]);
    assert_eq!(errno(fs.getattr(&ctx(), a.inode, None)), libc::EBADF);
    assert_eq!(fs.inodes.len(), 1);
    // A new lookup gets a new node id.
    let again = fs.lookup(&ctx(), ROOT_ID, c"f").unwrap();
    assert_ne!(again.inode, a.inode);
}

#[test]
fn root_is_never_forgotten() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    fs.forget(&ctx(), ROOT_ID, u64::MAX);
    assert!(fs.getattr(&ctx(), ROOT_ID, None).is_ok());
}

#[test]
fn unknown_node_ids_are_ebadf() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    assert_eq!(errno(fs.getattr(&ctx(), 42, None)), libc::EBADF);
    assert_eq!(errno(fs.lookup(&ctx(), 42, c"x")), libc::EBADF);
    assert_eq!(errno(fs.open(&ctx(), 42, 0, 0)), libc::EBADF);
    assert_eq!(
        errno(fs.mkdir(&ctx(), 42, c"d", 0o755, 0, &[])),
        libc::EBADF
    );
    fs.forget(&ctx(), 42, 1);
}

#[test]
fn symlink_pointing_outside_is_not_followed_by_open() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"secret").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), tmp.path().join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), tmp.path().join("dirlink")).unwrap();
    let fs = new_fs(tmp.path());

    let link = lookup(&fs, "link");
    assert_eq!(link.attr.st_mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        errno(fs.open(&ctx(), link.inode, libc::O_RDONLY as u32, 0)),
        libc::ELOOP
    );
    assert_eq!(
        fs.readlink(&ctx(), link.inode).unwrap(),
        outside.path().join("secret").as_os_str().as_bytes()
    );

    // A symlink to a directory is not a directory to walk or list.
    let dirlink = lookup(&fs, "dirlink");
    assert_eq!(
        errno(fs.lookup(&ctx(), dirlink.inode, c"secret")),
        libc::ENOTDIR
    );
    assert_eq!(errno(fs.opendir(&ctx(), dirlink.inode, 0)), libc::ENOTDIR);
    assert_eq!(
        errno(fs.mkdir(&ctx(), dirlink.inode, c"new", 0o755, 0, &[])),
        libc::ENOTDIR
    );
    assert!(!outside.path().join("new").exists());
}

#[test]
fn create_through_dangling_symlink_does_not_escape() {
    let outside = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path().join("planted"), tmp.path().join("esc")).unwrap();
    let fs = new_fs(tmp.path());
    assert!(fs
        .create(
            &ctx(),
            ROOT_ID,
            c"esc",
            0o644,
            libc::O_WRONLY as u32,
            0,
            0,
            &[]
        )
        .is_err());
    assert!(fs
        .create(
            &ctx(),
            ROOT_ID,
            c"esc",
            0o644,
            (libc::O_WRONLY | libc::O_EXCL) as u32,
            0,
            0,
            &[]
        )
        .is_err());
    assert!(!outside.path().join("planted").exists());
}

#[test]
fn create_then_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let (e, fh) = fs
        .create(
            &ctx(),
            ROOT_ID,
            c"f",
            0o666,
            libc::O_RDWR as u32,
            0o022,
            0,
            &[],
        )
        .map(|(e, o)| (e, o.handle.unwrap()))
        .unwrap();
    assert_eq!(e.attr.st_mode, libc::S_IFREG | 0o644);
    assert_eq!(write_at(&fs, e.inode, fh, b"hello world", 0), 11);
    assert_eq!(read_at(&fs, e.inode, fh, 5, 6), b"world");
    // Short read at the end of the file.
    assert_eq!(read_at(&fs, e.inode, fh, 100, 0), b"hello world");
    assert_eq!(read_at(&fs, e.inode, fh, 100, 50), b"");
    fs.flush(&ctx(), e.inode, fh, 0).unwrap();
    fs.fsync(&ctx(), e.inode, true, fh).unwrap();
    fs.fsync(&ctx(), e.inode, false, fh).unwrap();
    fs.release(&ctx(), e.inode, 0, fh).unwrap();
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"hello world");
    assert_eq!(lookup(&fs, "f").inode, e.inode);
}

#[test]
fn create_excl_refuses_existing_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"keep").unwrap();
    let fs = new_fs(tmp.path());
    let flags = (libc::O_RDWR | libc::O_EXCL) as u32;
    assert_eq!(
        errno(fs.create(&ctx(), ROOT_ID, c"f", 0o644, flags, 0, 0, &[])),
        libc::EEXIST
    );
    // Without O_EXCL it opens the existing file.
    let (e, fh) = create(&fs, ROOT_ID, "f", 0o644);
    assert_eq!(read_at(&fs, e.inode, fh, 10, 0), b"keep");
}

#[test]
fn create_never_opens_an_existing_special_file_or_directory() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    let fs = new_fs(tmp.path());
    fs.mknod(&ctx(), ROOT_ID, c"fifo", libc::S_IFIFO | 0o666, 0, 0, &[])
        .unwrap();
    // Opening a FIFO for writing would block; a device node would reach the host device.
    let flags = libc::O_WRONLY as u32;
    assert_eq!(
        errno(fs.create(&ctx(), ROOT_ID, c"fifo", 0o644, flags, 0, 0, &[])),
        libc::ENXIO
    );
    assert_eq!(
        errno(fs.create(&ctx(), ROOT_ID, c"d", 0o644, 0, 0, 0, &[])),
        libc::EISDIR
    );
    assert_eq!(fs.handles.len(), 0);
}

#[test]
fn create_as_uid_1000_is_owned_by_1000_on_the_host() {
    if !credentials::running_as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let fs = new_fs(tmp.path());
    let user = Context {
        uid: 1000,
        gid: 1000,
        pid: 1,
        ..Context::default()
    };
    let (e, _) = fs
        .create(&user, ROOT_ID, c"f", 0o644, libc::O_RDWR as u32, 0, 0, &[])
        .unwrap();
    assert_eq!((e.attr.st_uid, e.attr.st_gid), (1000, 1000));
    fs.mkdir(&user, ROOT_ID, c"d", 0o755, 0, &[]).unwrap();
    fs.symlink(&user, c"f", ROOT_ID, c"l", &[]).unwrap();
    for name in ["f", "d", "l"] {
        let md = std::fs::symlink_metadata(tmp.path().join(name)).unwrap();
        assert_eq!((md.uid(), md.gid()), (1000, 1000), "{name}");
    }
    // The thread is back to root afterwards: root-only directory still writable.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    fs.mkdir(&ctx(), ROOT_ID, c"rootdir", 0o755, 0, &[])
        .unwrap();
    // And uid 1000 is refused in it.
    assert_eq!(
        errno(fs.mkdir(&user, ROOT_ID, c"d2", 0o755, 0, &[])),
        libc::EACCES
    );
}

#[test]
fn mkdir_and_mknod_apply_umask() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let d = fs.mkdir(&ctx(), ROOT_ID, c"d", 0o777, 0o027, &[]).unwrap();
    assert_eq!(d.attr.st_mode, libc::S_IFDIR | 0o750);
    let p = fs
        .mknod(&ctx(), ROOT_ID, c"p", libc::S_IFIFO | 0o666, 0, 0o022, &[])
        .unwrap();
    assert_eq!(p.attr.st_mode, libc::S_IFIFO | 0o644);
    assert_eq!(
        errno(fs.mkdir(&ctx(), ROOT_ID, c"d", 0o777, 0, &[])),
        libc::EEXIST
    );
}

#[test]
fn open_refuses_special_files() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let p = fs
        .mknod(&ctx(), ROOT_ID, c"p", libc::S_IFIFO | 0o666, 0, 0, &[])
        .unwrap();
    assert_eq!(
        errno(fs.open(&ctx(), p.inode, libc::O_RDONLY as u32, 0)),
        libc::ENXIO
    );
}

#[test]
fn readonly_refuses_mkdir_with_erofs() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"data").unwrap();
    let fs = fs_with(tmp.path(), |c| c.readonly = true);
    let c = ctx();
    assert_eq!(
        errno(fs.mkdir(&c, ROOT_ID, c"d", 0o755, 0, &[])),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.mknod(&c, ROOT_ID, c"n", libc::S_IFIFO, 0, 0, &[])),
        libc::EROFS
    );
    assert_eq!(errno(fs.symlink(&c, c"x", ROOT_ID, c"s", &[])), libc::EROFS);
    assert_eq!(
        errno(fs.create(&c, ROOT_ID, c"g", 0o644, 0, 0, 0, &[])),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.tmpfile(&c, ROOT_ID, 0o644, libc::O_RDWR as u32, 0, &[])),
        libc::EROFS
    );
    assert_eq!(errno(fs.unlink(&c, ROOT_ID, c"f")), libc::EROFS);
    assert_eq!(errno(fs.rmdir(&c, ROOT_ID, c"f")), libc::EROFS);
    assert_eq!(
        errno(fs.rename(&c, ROOT_ID, c"f", ROOT_ID, c"g", 0)),
        libc::EROFS
    );
    let f = lookup(&fs, "f");
    assert_eq!(errno(fs.link(&c, f.inode, ROOT_ID, c"h")), libc::EROFS);
    let attr = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(errno(fs.setattr(&c, f.inode, attr, None)), libc::EROFS);
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(errno(fs.open(&c, f.inode, flags as u32, 0)), libc::EROFS);
    }
    let fh = fs.open(&c, f.inode, 0, 0).unwrap().handle.unwrap();
    assert_eq!(read_at(&fs, f.inode, fh, 10, 0), b"data");
    let mut r = SliceReader::new(b"x");
    assert_eq!(
        errno(fs.write(&c, f.inode, fh, &mut r, 1, 0, false)),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.fallocate(&c, f.inode, fh, 0, 0, 10, false)),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.copy_file_range(&c, f.inode, fh, 0, f.inode, fh, 10, 1, 0, false)),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.access(&c, f.inode, libc::W_OK as u32)),
        libc::EROFS
    );
    fs.access(&c, f.inode, libc::R_OK as u32).unwrap();
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"data");
}

#[test]
fn dot_and_dotdot_are_refused_as_names_to_change() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let c = ctx();
    let sub = lookup(&fs, "sub");
    for name in [c".", c".."] {
        assert_eq!(errno(fs.unlink(&c, sub.inode, name)), libc::EINVAL);
        assert_eq!(errno(fs.rmdir(&c, sub.inode, name)), libc::EINVAL);
        assert_eq!(
            errno(fs.mkdir(&c, sub.inode, name, 0o755, 0, &[])),
            libc::EINVAL
        );
        assert_eq!(
            errno(fs.rename(&c, sub.inode, name, ROOT_ID, c"x", 0)),
            libc::EINVAL
        );
        assert_eq!(
            errno(fs.rename(&c, ROOT_ID, c"f", sub.inode, name, 0)),
            libc::EINVAL
        );
        let f = lookup(&fs, "f");
        assert_eq!(errno(fs.link(&c, f.inode, ROOT_ID, name)), libc::EINVAL);
        assert_eq!(
            errno(fs.symlink(&c, c"f", ROOT_ID, name, &[])),
            libc::EINVAL
        );
    }
    assert_eq!(errno(fs.unlink(&c, ROOT_ID, c"a/b")), libc::EINVAL);
    assert!(tmp.path().join("sub").is_dir());
}

#[test]
fn rename_noreplace_refuses_existing_target() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"a").unwrap();
    std::fs::write(tmp.path().join("b"), b"b").unwrap();
    let fs = new_fs(tmp.path());
    let r = fs.rename(&ctx(), ROOT_ID, c"a", ROOT_ID, c"b", libc::RENAME_NOREPLACE);
    assert_eq!(errno(r), libc::EEXIST);
    fs.rename(&ctx(), ROOT_ID, c"a", ROOT_ID, c"c", libc::RENAME_NOREPLACE)
        .unwrap();
    assert_eq!(std::fs::read(tmp.path().join("c")).unwrap(), b"a");
    assert_eq!(
        errno(fs.rename(&ctx(), ROOT_ID, c"c", ROOT_ID, c"d", 1 << 7)),
        libc::EINVAL
    );
}

#[test]
fn rename_exchange_swaps() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"a").unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("d/b"), b"b").unwrap();
    let fs = new_fs(tmp.path());
    let d = lookup(&fs, "d");
    fs.rename(&ctx(), ROOT_ID, c"a", d.inode, c"b", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(std::fs::read(tmp.path().join("a")).unwrap(), b"b");
    assert_eq!(std::fs::read(tmp.path().join("d/b")).unwrap(), b"a");
}

#[test]
fn unlink_while_open_still_reads() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"still here").unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let fh = fs.open(&ctx(), f.inode, 0, 0).unwrap().handle.unwrap();
    fs.unlink(&ctx(), ROOT_ID, c"f").unwrap();
    assert!(!tmp.path().join("f").exists());
    assert_eq!(read_at(&fs, f.inode, fh, 64, 0), b"still here");
    let (st, _) = fs.getattr(&ctx(), f.inode, Some(fh)).unwrap();
    assert_eq!(st.st_nlink, 0);
    assert_eq!(
        fs.lookup(&ctx(), ROOT_ID, c"f").unwrap().inode,
        0,
        "negative entry"
    );
}

#[test]
fn rmdir_removes_empty_directories_only() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("full/x")).unwrap();
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let fs = new_fs(tmp.path());
    assert_eq!(errno(fs.rmdir(&ctx(), ROOT_ID, c"full")), libc::ENOTEMPTY);
    fs.rmdir(&ctx(), ROOT_ID, c"empty").unwrap();
    assert!(!tmp.path().join("empty").exists());
}

#[test]
fn setattr_truncates_and_sets_times() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"0123456789").unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let attr = SetAttr {
        size: Some(4),
        atime: SetTime::At(1_000_000, 5),
        mtime: SetTime::At(2_000_000, 7),
        mode: Some(0o600),
        ..SetAttr::default()
    };
    let (st, timeout) = fs.setattr(&ctx(), f.inode, attr, None).unwrap();
    assert_eq!(timeout, fs.cfg.attr_timeout);
    assert_eq!(st.st_size, 4);
    assert_eq!((st.st_atime, st.st_atime_nsec), (1_000_000, 5));
    assert_eq!((st.st_mtime, st.st_mtime_nsec), (2_000_000, 7));
    assert_eq!(st.st_mode, libc::S_IFREG | 0o600);
    // (Not read on the host here: that would update the access time.)
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 4);

    // Through a handle, with "now" and omitted times.
    let fh = fs
        .open(&ctx(), f.inode, libc::O_RDWR as u32, 0)
        .unwrap()
        .handle
        .unwrap();
    let attr = SetAttr {
        size: Some(1),
        mtime: SetTime::Now,
        ..SetAttr::default()
    };
    let (st, _) = fs.setattr(&ctx(), f.inode, attr, Some(fh)).unwrap();
    assert_eq!(st.st_size, 1);
    assert_eq!(st.st_atime, 1_000_000);
    assert!(st.st_mtime > 2_000_000);
}

#[test]
fn setattr_changes_owner_and_symlink_times_without_following() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    std::os::unix::fs::symlink("f", tmp.path().join("l")).unwrap();
    let fs = new_fs(tmp.path());
    let l = lookup(&fs, "l");
    let attr = SetAttr {
        mtime: SetTime::At(12345, 0),
        ..SetAttr::default()
    };
    fs.setattr(&ctx(), l.inode, attr, None).unwrap();
    assert_eq!(
        std::fs::symlink_metadata(tmp.path().join("l"))
            .unwrap()
            .mtime(),
        12345
    );
    assert_ne!(
        std::fs::metadata(tmp.path().join("f")).unwrap().mtime(),
        12345
    );
    let chmod = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    assert_eq!(
        errno(fs.setattr(&ctx(), l.inode, chmod, None)),
        libc::EOPNOTSUPP
    );
    if credentials::running_as_root() {
        let chown = SetAttr {
            uid: Some(1234),
            ..SetAttr::default()
        };
        let (st, _) = fs.setattr(&ctx(), l.inode, chown, None).unwrap();
        assert_eq!(st.st_uid, 1234);
        assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().uid(), 0);
    }
}

#[test]
fn kill_suidgid_clears_set_id_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f");
    std::fs::write(&path, b"x").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o6755)).unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let fh = fs
        .open(&ctx(), f.inode, libc::O_RDWR as u32, 0)
        .unwrap()
        .handle
        .unwrap();
    let mut r = SliceReader::new(b"y");
    fs.write(&ctx(), f.inode, fh, &mut r, 1, 0, true).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o755);

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o4644)).unwrap();
    let attr = SetAttr {
        kill_suidgid: true,
        ..SetAttr::default()
    };
    fs.setattr(&ctx(), f.inode, attr, None).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o644);
    // Set-group-id without group execute is a mandatory-locking mark; kept.
    assert_eq!(killed_suidgid(0o2644), None);
}

#[test]
fn xattr_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = fs_with(tmp.path(), |c| c.xattr = true);
    let f = lookup(&fs, "f");
    match fs.setxattr(&ctx(), f.inode, c"user.test", b"value", 0, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return,
        r => r.unwrap(),
    }
    assert_eq!(
        fs.getxattr(&ctx(), f.inode, c"user.test", 0).unwrap(),
        XattrReply::Size(5)
    );
    assert_eq!(
        fs.getxattr(&ctx(), f.inode, c"user.test", 64).unwrap(),
        XattrReply::Data(b"value".to_vec())
    );
    assert_eq!(
        errno(fs.getxattr(&ctx(), f.inode, c"user.test", 2)),
        libc::ERANGE
    );
    let XattrReply::Size(n) = fs.listxattr(&ctx(), f.inode, 0).unwrap() else {
        panic!("size expected");
    };
    let XattrReply::Data(list) = fs.listxattr(&ctx(), f.inode, n).unwrap() else {
        panic!("data expected");
    };
    assert!(list.split(|&b| b == 0).any(|n| n == b"user.test"));
    assert_eq!(
        errno(fs.setxattr(
            &ctx(),
            f.inode,
            c"user.test",
            b"v",
            libc::XATTR_CREATE as u32,
            0
        )),
        libc::EEXIST
    );
    fs.removexattr(&ctx(), f.inode, c"user.test").unwrap();
    assert_eq!(
        errno(fs.getxattr(&ctx(), f.inode, c"user.test", 64)),
        libc::ENODATA
    );

    // On a directory, and on a symlink (trusted.* as root; user.* is not allowed there).
    fs.setxattr(&ctx(), ROOT_ID, c"user.dir", b"d", 0, 0)
        .unwrap();
    assert_eq!(
        fs.getxattr(&ctx(), ROOT_ID, c"user.dir", 8).unwrap(),
        XattrReply::Data(b"d".to_vec())
    );
    if credentials::running_as_root() {
        std::os::unix::fs::symlink("f", tmp.path().join("l")).unwrap();
        let l = lookup(&fs, "l");
        if fs
            .setxattr(&ctx(), l.inode, c"trusted.t", b"s", 0, 0)
            .is_ok()
        {
            assert_eq!(
                fs.getxattr(&ctx(), l.inode, c"trusted.t", 8).unwrap(),
                XattrReply::Data(b"s".to_vec())
            );
            // The target was not touched.
            assert_eq!(
                errno(fs.getxattr(&ctx(), f.inode, c"trusted.t", 8)),
                libc::ENODATA
            );
        }
    }
}

#[test]
fn xattr_disabled_is_enosys() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let c = ctx();
    assert_eq!(errno(fs.getxattr(&c, ROOT_ID, c"user.x", 0)), libc::ENOSYS);
    assert_eq!(errno(fs.listxattr(&c, ROOT_ID, 0)), libc::ENOSYS);
    assert_eq!(
        errno(fs.setxattr(&c, ROOT_ID, c"user.x", b"", 0, 0)),
        libc::ENOSYS
    );
    assert_eq!(errno(fs.removexattr(&c, ROOT_ID, c"user.x")), libc::ENOSYS);
}

#[test]
fn link_returns_same_node_id_as_lookup() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let d = lookup(&fs, "d");
    let l = fs.link(&ctx(), f.inode, d.inode, c"g").unwrap();
    assert_eq!(l.inode, f.inode);
    assert_eq!(l.attr.st_nlink, 2);
    assert_eq!(refcount(&fs, f.inode), Some(2));
    assert_eq!(std::fs::read(tmp.path().join("d/g")).unwrap(), b"x");
    assert_eq!(errno(fs.link(&ctx(), d.inode, ROOT_ID, c"d2")), libc::EPERM);
}

#[test]
fn link_of_a_symlink_links_the_symlink_itself() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    std::os::unix::fs::symlink("f", tmp.path().join("l")).unwrap();
    let fs = new_fs(tmp.path());
    let l = lookup(&fs, "l");
    let l2 = fs.link(&ctx(), l.inode, ROOT_ID, c"l2").unwrap();
    assert_eq!(l2.inode, l.inode);
    assert!(std::fs::symlink_metadata(tmp.path().join("l2"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn tmpfile_creates_unnamed_file() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let (e, o) = fs
        .tmpfile(&ctx(), ROOT_ID, 0o666, libc::O_RDWR as u32, 0o077, &[])
        .unwrap();
    let fh = o.handle.unwrap();
    assert_eq!(e.attr.st_mode, libc::S_IFREG | 0o600);
    assert_eq!(e.attr.st_nlink, 0);
    assert_eq!(write_at(&fs, e.inode, fh, b"anon", 0), 4);
    assert_eq!(read_at(&fs, e.inode, fh, 16, 0), b"anon");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    // It can be given a name with LINK.
    let named = fs.link(&ctx(), e.inode, ROOT_ID, c"named").unwrap();
    assert_eq!(named.inode, e.inode);
    assert_eq!(std::fs::read(tmp.path().join("named")).unwrap(), b"anon");
}

#[test]
fn copy_file_range_copies() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("src"), b"0123456789").unwrap();
    let fs = new_fs(tmp.path());
    let src = lookup(&fs, "src");
    let hin = fs.open(&ctx(), src.inode, 0, 0).unwrap().handle.unwrap();
    let (dst, hout) = create(&fs, ROOT_ID, "dst", 0o644);
    let n = fs
        .copy_file_range(&ctx(), src.inode, hin, 2, dst.inode, hout, 1, 5, 0, false)
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(std::fs::read(tmp.path().join("dst")).unwrap(), b"\x0023456");
    assert_eq!(
        errno(fs.copy_file_range(
            &ctx(),
            src.inode,
            hin,
            0,
            dst.inode,
            hout,
            0,
            1,
            1 << 40,
            false
        )),
        libc::EINVAL
    );
}

#[test]
fn lseek_finds_data() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let (f, fh) = create(&fs, ROOT_ID, "sparse", 0o644);
    const MIB: u64 = 1 << 20;
    write_at(&fs, f.inode, fh, b"data", MIB);
    let data = fs
        .lseek(&ctx(), f.inode, fh, 0, libc::SEEK_DATA as u32)
        .unwrap();
    // File systems without hole tracking report the whole file as data.
    assert!(data == MIB || data == 0, "{data}");
    let hole = fs
        .lseek(&ctx(), f.inode, fh, MIB, libc::SEEK_HOLE as u32)
        .unwrap();
    assert_eq!(hole, MIB + 4);
    assert_eq!(
        errno(fs.lseek(&ctx(), f.inode, fh, MIB + 4, libc::SEEK_DATA as u32)),
        libc::ENXIO
    );
    assert_eq!(
        fs.lseek(&ctx(), f.inode, fh, 3, libc::SEEK_SET as u32)
            .unwrap(),
        3
    );
    assert_eq!(errno(fs.lseek(&ctx(), f.inode, fh, 0, 99)), libc::EINVAL);
}

#[test]
fn fallocate_extends_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let (f, fh) = create(&fs, ROOT_ID, "f", 0o644);
    fs.fallocate(&ctx(), f.inode, fh, 0, 0, 8192, false)
        .unwrap();
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 8192);
    assert_eq!(
        errno(fs.fallocate(&ctx(), f.inode, fh, 0, u64::MAX, 1, false)),
        libc::EINVAL
    );
}

#[test]
fn read_and_write_refuse_offsets_above_i64_max() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let (f, fh) = create(&fs, ROOT_ID, "f", 0o644);
    let mut w = VecWriter::new(16);
    assert_eq!(
        errno(fs.read(&ctx(), f.inode, fh, &mut w, 16, 1 << 63)),
        libc::EINVAL
    );
    let mut r = SliceReader::new(b"x");
    assert_eq!(
        errno(fs.write(&ctx(), f.inode, fh, &mut r, 1, u64::MAX, false)),
        libc::EINVAL
    );
}

#[test]
fn handles_are_checked_against_their_inode() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"a").unwrap();
    std::fs::write(tmp.path().join("b"), b"b").unwrap();
    let fs = new_fs(tmp.path());
    let a = lookup(&fs, "a");
    let b = lookup(&fs, "b");
    let fh = fs.open(&ctx(), a.inode, 0, 0).unwrap().handle.unwrap();
    let mut w = VecWriter::new(4);
    assert_eq!(
        errno(fs.read(&ctx(), b.inode, fh, &mut w, 4, 0)),
        libc::EBADF
    );
    assert_eq!(errno(fs.release(&ctx(), b.inode, 0, fh)), libc::EBADF);
    fs.release(&ctx(), a.inode, 0, fh).unwrap();
    assert_eq!(errno(fs.release(&ctx(), a.inode, 0, fh)), libc::EBADF);
    assert_eq!(errno(fs.flush(&ctx(), a.inode, fh, 0)), libc::EBADF);
    assert_eq!(errno(fs.releasedir(&ctx(), ROOT_ID, 0, 999)), libc::EBADF);
    // A file handle is no directory handle.
    let fh = fs.open(&ctx(), a.inode, 0, 0).unwrap().handle.unwrap();
    assert_eq!(
        errno(fs.readdir(&ctx(), a.inode, fh, 4096, 0, &mut |_| Ok(1))),
        libc::ENOTDIR
    );
}

#[test]
fn open_flags_follow_cache_mode() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    // No mode asks for FLUSH: the daemon holds no locks and writes reach the host at WRITE.
    for (mode, file, dir) in [
        (CacheMode::Never, fopen::DIRECT_IO | fopen::NOFLUSH, 0),
        (
            CacheMode::Metadata,
            fopen::DIRECT_IO | fopen::NOFLUSH,
            fopen::CACHE_DIR,
        ),
        (CacheMode::Auto, fopen::NOFLUSH, fopen::CACHE_DIR),
        (
            CacheMode::Always,
            fopen::KEEP_CACHE | fopen::NOFLUSH,
            fopen::CACHE_DIR | fopen::KEEP_CACHE,
        ),
    ] {
        let fs = fs_with(tmp.path(), |c| c.cache = mode);
        let f = lookup(&fs, "f");
        assert_eq!(fs.open(&ctx(), f.inode, 0, 0).unwrap().open_flags, file);
        assert_eq!(fs.opendir(&ctx(), ROOT_ID, 0).unwrap().open_flags, dir);
    }
}

#[test]
fn writeback_opens_write_only_files_for_reading_too() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"readable").unwrap();
    let fs = fs_with(tmp.path(), |c| c.writeback = true);
    let f = lookup(&fs, "f");
    let flags = (libc::O_WRONLY | libc::O_APPEND) as u32;
    let fh = fs.open(&ctx(), f.inode, flags, 0).unwrap().handle.unwrap();
    assert_eq!(read_at(&fs, f.inode, fh, 8, 0), b"readable");
    // O_APPEND was left to the guest: a write lands at the offset asked.
    write_at(&fs, f.inode, fh, b"R", 0);
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"Readable");

    // Without writeback, O_APPEND stays and a write-only handle cannot read.
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let fh = fs.open(&ctx(), f.inode, flags, 0).unwrap().handle.unwrap();
    let mut w = VecWriter::new(8);
    assert_eq!(
        errno(fs.read(&ctx(), f.inode, fh, &mut w, 8, 0)),
        libc::EBADF
    );
    write_at(&fs, f.inode, fh, b"!", 0);
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"Readable!");
}

#[test]
fn open_with_trunc_truncates() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"content").unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    fs.open(&ctx(), f.inode, (libc::O_WRONLY | libc::O_TRUNC) as u32, 0)
        .unwrap();
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 0);
}

#[test]
fn init_intersects_with_capable() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let all = fs.init(u64::MAX).unwrap();
    assert_ne!(all & init::DO_READDIRPLUS, 0);
    assert_ne!(all & init::AUTO_INVAL_DATA, 0);
    assert_eq!(all & init::WRITEBACK_CACHE, 0);
    assert_eq!(all & init::EXPORT_SUPPORT, 0);
    assert_eq!(all & init::CACHE_SYMLINKS, 0);
    assert_eq!(fs.init(init::ASYNC_READ).unwrap(), init::ASYNC_READ);
    assert_eq!(fs.init(0).unwrap(), 0);

    let fs = fs_with(tmp.path(), |c| {
        c.cache = CacheMode::Always;
        c.writeback = true;
        c.readdirplus = false;
    });
    let all = fs.init(u64::MAX).unwrap();
    assert_ne!(all & init::CACHE_SYMLINKS, 0);
    assert_ne!(all & init::WRITEBACK_CACHE, 0);
    assert_eq!(all & (init::DO_READDIRPLUS | init::READDIRPLUS_AUTO), 0);
    assert_eq!(all & init::AUTO_INVAL_DATA, 0);

    // `never`: the entries a READDIRPLUS would bring expire at once; plain listings.
    let fs = fs_with(tmp.path(), |c| c.cache = CacheMode::Never);
    let all = fs.init(u64::MAX).unwrap();
    assert_eq!(all & (init::DO_READDIRPLUS | init::READDIRPLUS_AUTO), 0);
}

#[test]
fn readdir_offsets_are_stable_and_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let mut expected: BTreeSet<Vec<u8>> = [b".".to_vec(), b"..".to_vec()].into();
    for i in 0..100 {
        let name = format!("file{i:03}");
        std::fs::write(tmp.path().join(&name), b"").unwrap();
        expected.insert(name.into_bytes());
    }
    let fs = new_fs(tmp.path());
    let fh = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let chunk = readdir(&fs, ROOT_ID, fh, offset, 7);
        if chunk.is_empty() {
            break;
        }
        for (name, off, _) in chunk {
            assert_eq!(off, seen.len() as u64 + 1, "offsets are index + 1");
            seen.push(name);
            offset = off;
        }
    }
    assert_eq!(seen.len(), expected.len(), "no duplicates");
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // Resuming at a past offset gives the same entries again.
    let again = readdir(&fs, ROOT_ID, fh, 50, 3);
    let names: Vec<_> = again.into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(names, seen[50..53].to_vec());
    // Past the end: nothing.
    assert!(readdir(&fs, ROOT_ID, fh, 10_000, 10).is_empty());
    assert!(readdir(&fs, ROOT_ID, fh, u64::MAX, 10).is_empty());
    fs.fsyncdir(&ctx(), ROOT_ID, false, fh).unwrap();
    fs.releasedir(&ctx(), ROOT_ID, 0, fh).unwrap();
}

#[test]
fn readdir_at_offset_zero_rereads() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let fh = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    assert_eq!(readdir(&fs, ROOT_ID, fh, 0, 100).len(), 2);
    std::fs::write(tmp.path().join("new"), b"").unwrap();
    // The snapshot holds until a rewind.
    assert!(readdir(&fs, ROOT_ID, fh, 2, 100).is_empty());
    let all = readdir(&fs, ROOT_ID, fh, 0, 100);
    assert!(all.iter().any(|(n, _, _)| n == b"new"));
}

#[test]
fn readdir_reports_dtype_for_every_kind() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("reg"), b"").unwrap();
    std::fs::create_dir(tmp.path().join("dir")).unwrap();
    std::os::unix::fs::symlink("reg", tmp.path().join("lnk")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(tmp.path().join("sock")).unwrap();
    let fs = new_fs(tmp.path());
    fs.mknod(&ctx(), ROOT_ID, c"fifo", libc::S_IFIFO | 0o644, 0, 0, &[])
        .unwrap();
    let fh = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let entries = readdir(&fs, ROOT_ID, fh, 0, 100);
    let type_of = |name: &[u8]| {
        entries
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, t)| *t as u8)
    };
    assert_eq!(type_of(b"reg"), Some(libc::DT_REG));
    assert_eq!(type_of(b"dir"), Some(libc::DT_DIR));
    assert_eq!(type_of(b"lnk"), Some(libc::DT_LNK));
    assert_eq!(type_of(b"fifo"), Some(libc::DT_FIFO));
    assert_eq!(type_of(b"sock"), Some(libc::DT_SOCK));
    assert_eq!(type_of(b"."), Some(libc::DT_DIR));
    assert!(entries
        .iter()
        .all(|(_, _, t)| *t != u32::from(libc::DT_UNKNOWN)));
}

#[test]
fn readdirplus_refused_entry_drops_its_lookup() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..10 {
        std::fs::write(tmp.path().join(format!("f{i}")), b"").unwrap();
    }
    let fs = new_fs(tmp.path());
    let fh = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let mut accepted = Vec::new();
    let mut refused = None;
    fs.readdirplus(&ctx(), ROOT_ID, fh, 4096, 0, &mut |d, e| {
        if accepted.len() == 6 {
            refused = Some((d.offset, e.inode));
            return Ok(0);
        }
        accepted.push((d.name.to_vec(), d.offset, e.inode, e.attr.st_mode));
        Ok(1)
    })
    .unwrap();
    let (refused_off, refused_id) = refused.expect("an entry was refused");
    for (name, _, id, mode) in &accepted {
        if name == b"." || name == b".." {
            assert_eq!(*id, 0);
            assert_eq!(mode & libc::S_IFMT, libc::S_IFDIR);
        } else {
            assert_eq!(refcount(&fs, *id), Some(1), "one reference per entry");
            assert_eq!(mode & libc::S_IFMT, libc::S_IFREG);
        }
    }
    if refused_id != 0 {
        assert_eq!(
            refcount(&fs, refused_id),
            None,
            "refused entry's reference dropped"
        );
    }
    // The next call resumes with the refused entry and hands out the rest.
    let mut rest = Vec::new();
    fs.readdirplus(&ctx(), ROOT_ID, fh, 4096, refused_off - 1, &mut |d, e| {
        rest.push((d.name.to_vec(), e.inode));
        Ok(1)
    })
    .unwrap();
    assert_eq!(accepted.len() + rest.len(), 12);
    for (name, id) in &rest {
        if name != b"." && name != b".." {
            assert_eq!(lookup(&fs, std::str::from_utf8(name).unwrap()).inode, *id);
        }
    }
}

#[test]
fn readdirplus_skips_entries_removed_since_the_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("gone"), b"").unwrap();
    std::fs::write(tmp.path().join("kept"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let fh = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    // Take the snapshot, then remove a file behind it.
    assert_eq!(readdir(&fs, ROOT_ID, fh, 0, 100).len(), 4);
    std::fs::remove_file(tmp.path().join("gone")).unwrap();
    let mut names = Vec::new();
    fs.readdirplus(&ctx(), ROOT_ID, fh, 4096, 1, &mut |d, _| {
        names.push(d.name.to_vec());
        Ok(1)
    })
    .unwrap();
    assert!(names.contains(&b"kept".to_vec()));
    assert!(!names.contains(&b"gone".to_vec()));
}

#[test]
fn access_checks_mode_bits_for_the_caller() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f");
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let (uid, gid) = (f.attr.st_uid, f.attr.st_gid);
    let owner = Context {
        uid,
        gid,
        pid: 1,
        ..Context::default()
    };
    let stranger = Context {
        uid: uid + 1000,
        gid: gid + 1000,
        pid: 1,
        ..Context::default()
    };
    let group = Context {
        uid: uid + 1000,
        gid,
        pid: 1,
        ..Context::default()
    };
    let (r, w, x) = (libc::R_OK as u32, libc::W_OK as u32, libc::X_OK as u32);
    fs.access(&stranger, f.inode, libc::F_OK as u32).unwrap();
    fs.access(&owner, f.inode, r | w).unwrap();
    fs.access(&group, f.inode, r).unwrap();
    assert_eq!(errno(fs.access(&group, f.inode, w)), libc::EACCES);
    assert_eq!(errno(fs.access(&stranger, f.inode, r)), libc::EACCES);
    let root = ctx();
    fs.access(&root, f.inode, r | w).unwrap();
    assert_eq!(errno(fs.access(&root, f.inode, x)), libc::EACCES);
    fs.access(&root, ROOT_ID, x).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o601)).unwrap();
    fs.access(&root, f.inode, x).unwrap();
}

#[test]
fn statfs_syncfs_and_readlink_work() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    std::os::unix::fs::symlink("some/target", tmp.path().join("l")).unwrap();
    let fs = new_fs(tmp.path());
    let st = fs.statfs(&ctx(), ROOT_ID).unwrap();
    assert!(st.f_bsize > 0);
    fs.syncfs(&ctx(), ROOT_ID).unwrap();
    let f = lookup(&fs, "f");
    fs.syncfs(&ctx(), f.inode).unwrap();
    let l = lookup(&fs, "l");
    fs.syncfs(&ctx(), l.inode).unwrap();
    fs.statfs(&ctx(), l.inode).unwrap();
    assert_eq!(fs.readlink(&ctx(), l.inode).unwrap(), b"some/target");
    assert_eq!(errno(fs.readlink(&ctx(), f.inode)), libc::EINVAL);
}

#[test]
fn destroy_drops_everything_but_root() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let fh = fs.open(&ctx(), f.inode, 0, 0).unwrap().handle.unwrap();
    fs.destroy();
    assert_eq!(errno(fs.getattr(&ctx(), f.inode, None)), libc::EBADF);
    assert_eq!(errno(fs.release(&ctx(), f.inode, 0, fh)), libc::EBADF);
    assert_eq!(fs.inodes.len(), 1);
    assert_eq!(fs.handles.len(), 0);
    assert!(fs.getattr(&ctx(), ROOT_ID, None).is_ok());
}

#[test]
fn new_fails_on_a_missing_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let err = PassthroughFs::new(Config::new(&missing, CacheMode::Auto))
        .err()
        .unwrap();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    std::fs::write(tmp.path().join("file"), b"").unwrap();
    let err = PassthroughFs::new(Config::new(tmp.path().join("file"), CacheMode::Auto))
        .err()
        .unwrap();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
}

#[test]
fn concurrent_lookups_and_forgets_balance() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let fs = new_fs(tmp.path());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..500 {
                    let e = fs.lookup(&ctx(), ROOT_ID, c"f").unwrap();
                    assert!(fs.getattr(&ctx(), e.inode, None).is_ok());
                    fs.forget(&ctx(), e.inode, 1);
                }
            });
        }
    });
    assert_eq!(fs.inodes.len(), 1);
}

/// Makes `dir`'s change time old enough for its snapshots to be shared.
fn let_settle() {
    std::thread::sleep(key::SETTLE + Duration::from_millis(100));
}

/// Waits until a file changed now has times settled for keeping its pages (`auto`).
fn let_file_settle() {
    std::thread::sleep(key::FILE_SETTLE + Duration::from_millis(100));
}

fn names_of(list: &[(Vec<u8>, u64, u32)]) -> BTreeSet<Vec<u8>> {
    list.iter().map(|(n, _, _)| n.clone()).collect()
}

#[test]
fn snapshots_of_a_settled_directory_are_shared_between_handles() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let_settle();
    let h1 = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let first = readdir(&fs, ROOT_ID, h1, 0, usize::MAX);
    let h2 = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let second = readdir(&fs, ROOT_ID, h2, 0, usize::MAX);
    assert_eq!(first, second);
    let handle_snap = |h: u64| {
        let hd = fs.handles.get(h, ROOT_ID).unwrap();
        let guard = hd.dir.as_ref().unwrap().lock().unwrap();
        match guard.clone().unwrap() {
            dir::Listing::Snapshot(snap) => snap,
            dir::Listing::Stream => panic!("a small directory is not streamed"),
        }
    };
    assert!(Arc::ptr_eq(&handle_snap(h1), &handle_snap(h2)));
}

#[test]
fn listing_after_a_change_sees_it_even_when_a_snapshot_was_shared() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let_settle();
    let h1 = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    readdir(&fs, ROOT_ID, h1, 0, usize::MAX);
    std::fs::write(tmp.path().join("b"), b"").unwrap();
    std::fs::remove_file(tmp.path().join("a")).unwrap();
    let h2 = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let names = names_of(&readdir(&fs, ROOT_ID, h2, 0, usize::MAX));
    assert!(names.contains(b"b".as_slice()) && !names.contains(b"a".as_slice()));
}

#[test]
fn offsets_of_an_open_listing_stay_stable_while_the_directory_changes() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(tmp.path().join(format!("f{i:02}")), b"").unwrap();
    }
    let fs = new_fs(tmp.path());
    let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let head = readdir(&fs, ROOT_ID, h, 0, 10);
    for i in 0..20 {
        std::fs::remove_file(tmp.path().join(format!("f{i:02}"))).unwrap();
    }
    let tail = readdir(&fs, ROOT_ID, h, head.last().unwrap().1, usize::MAX);
    assert_eq!(head.len() + tail.len(), 22);
    let mut all = names_of(&head);
    all.extend(names_of(&tail));
    assert_eq!(all.len(), 22, "no duplicates, nothing lost");
}

#[test]
fn metadata_opendir_keeps_the_guest_listing_only_while_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"").unwrap();
    let fs = fs_with(tmp.path(), |c| c.cache = CacheMode::Metadata);
    let_settle();
    let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap();
    assert_eq!(h.open_flags, fopen::CACHE_DIR, "nothing served yet");
    readdir(&fs, ROOT_ID, h.handle.unwrap(), 0, usize::MAX);
    let again = fs.opendir(&ctx(), ROOT_ID, 0).unwrap();
    assert_eq!(again.open_flags, fopen::CACHE_DIR | fopen::KEEP_CACHE);
    std::fs::write(tmp.path().join("b"), b"").unwrap();
    let changed = fs.opendir(&ctx(), ROOT_ID, 0).unwrap();
    assert_eq!(
        changed.open_flags,
        fopen::CACHE_DIR,
        "changed: guest must re-read"
    );
}

#[test]
fn auto_opendir_serves_the_listing_every_time() {
    // Kept, the listing would leave the guest to look up or stat each of its expired (1 s)
    // entries on its own; served, one READDIRPLUS refreshes a page of them.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"").unwrap();
    let fs = fs_with(tmp.path(), |c| c.cache = CacheMode::Auto);
    let_settle();
    let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap();
    readdir(&fs, ROOT_ID, h.handle.unwrap(), 0, usize::MAX);
    let again = fs.opendir(&ctx(), ROOT_ID, 0).unwrap();
    assert_eq!(
        again.open_flags,
        fopen::CACHE_DIR,
        "unchanged, still served"
    );
}

#[test]
fn auto_open_keeps_the_guest_pages_only_while_the_file_is_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("f");
    std::fs::write(&path, b"one").unwrap();
    let fs = fs_with(tmp.path(), |c| c.cache = CacheMode::Auto);
    let f = lookup(&fs, "f");
    let open = |flags: i32| {
        fs.open(&ctx(), f.inode, flags as u32, 0)
            .unwrap()
            .open_flags
    };
    let keep = fopen::KEEP_CACHE | fopen::NOFLUSH;

    // Changed within the last second: an equal stamp could hide a change in the same tick.
    assert_eq!(open(libc::O_RDONLY), fopen::NOFLUSH, "first open");
    assert_eq!(
        open(libc::O_RDONLY),
        fopen::NOFLUSH,
        "not settled when last opened"
    );
    let_file_settle();
    assert_eq!(
        open(libc::O_RDONLY),
        fopen::NOFLUSH,
        "the last open's stamp was unsettled"
    );
    assert_eq!(open(libc::O_RDONLY), keep, "unchanged since a settled open");
    assert_eq!(open(libc::O_RDWR), keep, "whatever the access mode");

    // Changed on the host, even to the same size: dropped, and not kept at the open after.
    std::fs::write(&path, b"two").unwrap();
    assert_eq!(open(libc::O_RDONLY), fopen::NOFLUSH, "changed");
    let_file_settle();
    assert_eq!(
        open(libc::O_RDONLY),
        fopen::NOFLUSH,
        "the last open saw it unsettled"
    );
    assert_eq!(open(libc::O_RDONLY), keep);

    // O_TRUNC changes the file: nothing is kept, by that open or the next.
    assert_eq!(open(libc::O_WRONLY | libc::O_TRUNC), fopen::NOFLUSH);
    let_file_settle();
    assert_eq!(open(libc::O_RDONLY), fopen::NOFLUSH);

    // A guest write through a handle changes the stamp like a host write.
    assert_eq!(open(libc::O_RDONLY), keep);
    let fh = fs
        .open(&ctx(), f.inode, libc::O_RDWR as u32, 0)
        .unwrap()
        .handle
        .unwrap();
    write_at(&fs, f.inode, fh, b"x", 0);
    assert_eq!(open(libc::O_RDONLY), fopen::NOFLUSH, "written since");

    // Other modes decide without the record.
    let always = fs_with(tmp.path(), |c| c.cache = CacheMode::Always);
    let g = lookup(&always, "f");
    let flags = always.open(&ctx(), g.inode, 0, 0).unwrap().open_flags;
    assert_eq!(flags, keep);
    let wb = fs_with(tmp.path(), |c| {
        c.cache = CacheMode::Auto;
        c.writeback = true;
    });
    let g = lookup(&wb, "f");
    for _ in 0..2 {
        let flags = wb.open(&ctx(), g.inode, 0, 0).unwrap().open_flags;
        assert_eq!(
            flags & fopen::KEEP_CACHE,
            0,
            "writeback: the guest's own pages decide"
        );
    }
}

/// Mounts a fresh ext4 image made without the `filetype` feature (so `getdents64` reports
/// `DT_UNKNOWN` for every entry) at a temporary directory; `None` when that cannot be done
/// here (not root, no `mkfs.ext4`, no loop devices).
struct NoFiletypeMount {
    dir: tempfile::TempDir,
}

impl NoFiletypeMount {
    fn new() -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        let img = dir.path().join("img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).ok()?;
        std::fs::File::create(&img).ok()?.set_len(16 << 20).ok()?;
        let ok = |c: &mut std::process::Command| c.status().map(|s| s.success()).unwrap_or(false);
        if !ok(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "^filetype"])
            .arg(&img))
        {
            return None;
        }
        if !ok(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt))
        {
            return None;
        }
        Some(NoFiletypeMount { dir })
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for NoFiletypeMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.path())
            .status();
    }
}

/// The `d_type` of every entry of `dir` as the host's `getdents64` reports it.
fn raw_dtypes(dir: &Path) -> Vec<u8> {
    let f = std::fs::File::open(dir).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = sys::getdents64(f.as_fd(), &mut buf).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 19 <= n {
        let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
        out.push(buf[at + 18]);
        at += reclen;
    }
    out
}

#[test]
fn dtype_is_real_on_a_filesystem_that_reports_dt_unknown() {
    let Some(m) = NoFiletypeMount::new() else {
        eprintln!("skipped: needs root, mkfs.ext4 and a loop device");
        return;
    };
    let root = m.path();
    std::fs::write(root.join("file"), b"x").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::os::unix::fs::symlink("file", root.join("link")).unwrap();
    let fifo = CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: `fifo` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    // The host filesystem really does not know the types.
    let raw = raw_dtypes(&root);
    assert!(raw.iter().all(|t| *t == libc::DT_UNKNOWN), "{raw:?}");

    let fs = new_fs(&root);
    let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let got: std::collections::BTreeMap<Vec<u8>, u32> = readdir(&fs, ROOT_ID, h, 0, usize::MAX)
        .into_iter()
        .map(|(n, _, t)| (n, t))
        .collect();
    let t = |n: &str| got[n.as_bytes()] as u8;
    assert_eq!(t("file"), libc::DT_REG);
    assert_eq!(t("dir"), libc::DT_DIR);
    assert_eq!(t("link"), libc::DT_LNK);
    assert_eq!(t("fifo"), libc::DT_FIFO);
    assert_eq!(t("sock"), libc::DT_SOCK);
    assert_eq!(t("lost+found"), libc::DT_DIR);
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Held by tests that count this process's descriptors and by tests that open many: tests run
/// in parallel threads of one process.
static FD_COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn fd_counting() -> std::sync::MutexGuard<'static, ()> {
    FD_COUNTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn lookup_of_a_file_opens_no_descriptor_until_needed() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"data").unwrap();
    let fs = new_fs(tmp.path());
    let e = lookup(&fs, "f");
    let node = fs.inodes.get(e.inode).unwrap();
    assert!(node.opened_fd().is_none());
    let (st, _) = fs.getattr(&ctx(), e.inode, None).unwrap();
    assert_eq!(st.st_size, 4);
    assert!(node.opened_fd().is_none(), "a stat needs no descriptor");
    let fh = fs.open(&ctx(), e.inode, libc::O_RDONLY as u32, 0).unwrap();
    assert_eq!(read_at(&fs, e.inode, fh.handle.unwrap(), 4, 0), b"data");
}

#[test]
fn readdirplus_over_many_files_holds_no_descriptor_per_file() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..300 {
        std::fs::write(tmp.path().join(format!("f{i:03}")), b"").unwrap();
    }
    let fs = new_fs(tmp.path());
    let h = fs.opendir(&ctx(), ROOT_ID, 0).unwrap().handle.unwrap();
    let _counting = fd_counting();
    let before = open_fds();
    let mut ids = Vec::new();
    let mut offset = 0;
    loop {
        let mut got = 0;
        fs.readdirplus(&ctx(), ROOT_ID, h, 4096, offset, &mut |d, e| {
            offset = d.offset;
            got += 1;
            if e.inode != 0 {
                ids.push(e.inode);
            }
            Ok(1)
        })
        .unwrap();
        if got == 0 {
            break;
        }
    }
    assert_eq!(ids.len(), 300);
    assert!(
        open_fds() < before + 10,
        "{} descriptors opened",
        open_fds() - before
    );
}

#[test]
fn file_renamed_by_the_guest_stays_usable_under_its_node_id() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("f"), b"abc").unwrap();
    let fs = new_fs(tmp.path());
    let f = lookup(&fs, "f");
    let d = lookup(&fs, "d");
    fs.rename(&ctx(), ROOT_ID, c"f", d.inode, c"g", 0).unwrap();
    let (st, _) = fs.getattr(&ctx(), f.inode, None).unwrap();
    assert_eq!(st.st_ino, f.attr.st_ino);
    let fh = fs.open(&ctx(), f.inode, libc::O_RDONLY as u32, 0).unwrap();
    assert_eq!(read_at(&fs, f.inode, fh.handle.unwrap(), 3, 0), b"abc");
}

#[test]
fn exchanged_files_keep_their_node_ids() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"A").unwrap();
    std::fs::write(tmp.path().join("b"), b"BB").unwrap();
    let fs = new_fs(tmp.path());
    let a = lookup(&fs, "a");
    let b = lookup(&fs, "b");
    fs.rename(&ctx(), ROOT_ID, c"a", ROOT_ID, c"b", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(fs.getattr(&ctx(), a.inode, None).unwrap().0.st_size, 1);
    assert_eq!(fs.getattr(&ctx(), b.inode, None).unwrap().0.st_size, 2);
}

#[test]
fn unlinked_while_open_still_answers_getattr_without_a_handle() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let (e, fh) = create(&fs, ROOT_ID, "f", 0o644);
    write_at(&fs, e.inode, fh, b"12345", 0);
    fs.unlink(&ctx(), ROOT_ID, c"f").unwrap();
    let (st, _) = fs.getattr(&ctx(), e.inode, None).unwrap();
    assert_eq!((st.st_size, st.st_nlink), (5, 0));
}

#[test]
fn file_replaced_on_the_host_is_stale_until_looked_up_again() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"old").unwrap();
    let fs = new_fs(tmp.path());
    let old = lookup(&fs, "f");
    std::fs::write(tmp.path().join("new"), b"newer").unwrap();
    std::fs::rename(tmp.path().join("new"), tmp.path().join("f")).unwrap();
    assert_eq!(errno(fs.getattr(&ctx(), old.inode, None)), libc::ESTALE);
    assert_eq!(
        errno(fs.open(&ctx(), old.inode, libc::O_RDONLY as u32, 0)),
        libc::ESTALE
    );
    let new = lookup(&fs, "f");
    assert_ne!(new.inode, old.inode);
    assert_eq!(fs.getattr(&ctx(), new.inode, None).unwrap().0.st_size, 5);
}

#[test]
fn file_moved_on_the_host_is_found_again_under_its_new_name() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let fs = new_fs(tmp.path());
    let before = lookup(&fs, "f");
    std::fs::rename(tmp.path().join("f"), tmp.path().join("g")).unwrap();
    let after = lookup(&fs, "g");
    assert_eq!(after.inode, before.inode);
    assert!(fs.getattr(&ctx(), before.inode, None).is_ok());
}

#[test]
fn whiteout_left_by_rename_belongs_to_the_caller() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a"), b"").unwrap();
    let fs = new_fs(tmp.path());
    let user = Context {
        uid: 1000,
        gid: 1001,
        pid: 1,
        ..Context::default()
    };
    fs.rename(&user, ROOT_ID, c"a", ROOT_ID, c"b", libc::RENAME_WHITEOUT)
        .unwrap();
    let m = std::fs::symlink_metadata(tmp.path().join("a")).unwrap();
    assert_eq!(m.mode() & libc::S_IFMT, libc::S_IFCHR);
    assert_eq!((m.uid(), m.gid()), (1000, 1001));
}

#[test]
fn mount_points_are_announced_only_when_asked() {
    let Some(m) = NoFiletypeMount::new() else {
        eprintln!("skipped: needs root, mkfs.ext4 and a loop device");
        return;
    };
    let share = m.dir.path();
    std::fs::create_dir(share.join("plain")).unwrap();
    let submount = crate::fuse::abi::ATTR_SUBMOUNT;
    let fs = fs_with(share, |c| c.announce_submounts = true);
    assert_eq!(
        fs.init(u64::MAX).unwrap() & init::SUBMOUNTS,
        init::SUBMOUNTS
    );
    assert_eq!(lookup(&fs, "mnt").attr_flags & submount, submount);
    assert_eq!(lookup(&fs, "plain").attr_flags & submount, 0);
    // Inside the submount, its own directories are not mount points.
    assert_eq!(lookup(&fs, "mnt/lost+found").attr_flags & submount, 0);
    let quiet = new_fs(share);
    assert_eq!(quiet.init(u64::MAX).unwrap() & init::SUBMOUNTS, 0);
    assert_eq!(lookup(&quiet, "mnt").attr_flags & submount, 0);
}

// ---- no-open mode (--cache=always, FUSE_NO_OPEN_SUPPORT) ---------------------------------------

/// A filesystem in `--cache=always` whose guest offered no-open support at INIT (locks off:
/// with the guest's locks held on the host, OPEN, FLUSH and RELEASE are served).
fn no_open_fs(dir: &Path, f: impl FnOnce(&mut Config)) -> PassthroughFs {
    let fs = fs_with(dir, |c| {
        c.cache = CacheMode::Always;
        c.posix_lock = false;
        c.flock = false;
        f(c);
    });
    let agreed = fs.init(u64::MAX).unwrap();
    assert_eq!(
        agreed & init::ATOMIC_O_TRUNC,
        0,
        "no atomic O_TRUNC in no-open mode"
    );
    fs
}

fn try_read(fs: &PassthroughFs, inode: u64, fh: u64, size: u32, off: u64) -> io::Result<Vec<u8>> {
    let mut w = VecWriter::new(size as usize);
    let n = fs.read(&ctx(), inode, fh, &mut w, size, off)?;
    let mut b = w.bytes();
    b.truncate(n);
    Ok(b)
}

fn try_write(fs: &PassthroughFs, inode: u64, fh: u64, data: &[u8], off: u64) -> io::Result<usize> {
    let mut r = SliceReader::new(data);
    fs.write(&ctx(), inode, fh, &mut r, data.len() as u32, off, false)
}

#[test]
fn no_open_is_agreed_only_in_cache_always_with_a_capable_guest() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    for mode in [CacheMode::Never, CacheMode::Metadata, CacheMode::Auto] {
        let fs = fs_with(tmp.path(), |c| c.cache = mode);
        assert_ne!(fs.init(u64::MAX).unwrap() & init::ATOMIC_O_TRUNC, 0);
        let f = lookup(&fs, "f");
        let fh = fs.open(&ctx(), f.inode, 0, 0).unwrap().handle.unwrap();
        assert_ne!(fh, 0, "handles are never 0");
        fs.flush(&ctx(), f.inode, fh, 0).unwrap();
        assert_eq!(errno(try_read(&fs, f.inode, 0, 1, 0)), libc::EBADF);
        assert!(fs.opendir(&ctx(), ROOT_ID, 0).is_ok());
    }
    // Locks held on the host need OPEN, FLUSH and RELEASE: no no-open mode with them.
    let fs = fs_with(tmp.path(), |c| c.cache = CacheMode::Always);
    assert_ne!(fs.init(u64::MAX).unwrap() & init::ATOMIC_O_TRUNC, 0);
    let f = lookup(&fs, "f");
    assert!(fs.open(&ctx(), f.inode, 0, 0).unwrap().handle.unwrap() != 0);
    // A guest without NO_OPEN_SUPPORT / NO_OPENDIR_SUPPORT: the old behaviour.
    let fs = fs_with(tmp.path(), |c| {
        c.cache = CacheMode::Always;
        c.posix_lock = false;
        c.flock = false;
    });
    let agreed = fs.init(!(init::NO_OPEN_SUPPORT | init::NO_OPENDIR_SUPPORT));
    assert_ne!(agreed.unwrap() & init::ATOMIC_O_TRUNC, 0);
    let f = lookup(&fs, "f");
    assert!(fs.open(&ctx(), f.inode, 0, 0).unwrap().handle.unwrap() != 0);
    assert!(fs.opendir(&ctx(), ROOT_ID, 0).is_ok());
    assert_eq!(errno(try_read(&fs, f.inode, 0, 1, 0)), libc::EBADF);

    let fs = no_open_fs(tmp.path(), |_| {});
    let f = lookup(&fs, "f");
    assert_eq!(errno(fs.open(&ctx(), f.inode, 0, 0)), libc::ENOSYS);
    assert_eq!(errno(fs.opendir(&ctx(), ROOT_ID, 0)), libc::ENOSYS);
    assert_eq!(errno(fs.flush(&ctx(), f.inode, 0, 0)), libc::ENOSYS);
    fs.release(&ctx(), f.inode, 0, 0).unwrap();
    fs.releasedir(&ctx(), ROOT_ID, 0, 0).unwrap();
    // A handle other than 0 is still checked.
    assert_eq!(errno(try_read(&fs, f.inode, 7, 1, 0)), libc::EBADF);
    assert_eq!(fs.handles.len(), 0);
}

#[test]
fn no_open_reads_writes_and_lists_without_handles() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"hello world").unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    for i in 0..50 {
        std::fs::write(tmp.path().join(format!("d/e{i:02}")), b"").unwrap();
    }
    let fs = no_open_fs(tmp.path(), |_| {});
    let f = lookup(&fs, "f");
    assert_eq!(try_read(&fs, f.inode, 0, 5, 6).unwrap(), b"world");
    assert_eq!(try_write(&fs, f.inode, 0, b"HELLO", 0).unwrap(), 5);
    // Straight to the host file, visible to other host processes at once.
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"HELLO world");
    assert_eq!(try_read(&fs, f.inode, 0, 64, 0).unwrap(), b"HELLO world");
    fs.fsync(&ctx(), f.inode, true, 0).unwrap();
    fs.fallocate(&ctx(), f.inode, 0, 0, 0, 20, false).unwrap();
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 20);
    assert_eq!(
        fs.lseek(&ctx(), f.inode, 0, 3, libc::SEEK_DATA as u32)
            .unwrap(),
        3
    );
    // GETATTR / SETATTR naming handle 0.
    let (st, _) = fs.getattr(&ctx(), f.inode, Some(0)).unwrap();
    assert_eq!(st.st_size, 20);
    let attr = SetAttr {
        size: Some(4),
        ..SetAttr::default()
    };
    fs.setattr(&ctx(), f.inode, attr, Some(0)).unwrap();
    assert_eq!(try_read(&fs, f.inode, 0, 64, 0).unwrap(), b"HELL");
    // One read-write descriptor serves both.
    assert_eq!(fs.io_fds.len(), 1);
    assert_eq!(fs.handles.len(), 0);

    // Directories: offset 0 takes a snapshot, later offsets continue it, the end drops it.
    let d = lookup(&fs, "d");
    let mut names = BTreeSet::new();
    let mut offset = 0;
    loop {
        let chunk = readdir(&fs, d.inode, 0, offset, 7);
        if chunk.is_empty() {
            break;
        }
        assert_eq!(fs.io_fds.listings(), 1);
        for (name, off, _) in chunk {
            names.insert(name);
            offset = off;
        }
    }
    assert_eq!(names.len(), 52, "50 entries, '.' and '..'");
    assert_eq!(fs.io_fds.listings(), 0, "read to its end: dropped");
    let mut plus = 0;
    fs.readdirplus(&ctx(), d.inode, 0, 4096, 0, &mut |_, _| {
        plus += 1;
        Ok(1)
    })
    .unwrap();
    assert_eq!(plus, 52);
    fs.fsyncdir(&ctx(), d.inode, false, 0).unwrap();
    assert_eq!(fs.handles.len(), 0);
}

#[test]
fn no_open_refuses_handle_less_io_on_what_is_not_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    std::os::unix::fs::symlink("f", tmp.path().join("l")).unwrap();
    let fs = no_open_fs(tmp.path(), |_| {});
    let d = lookup(&fs, "d");
    let l = lookup(&fs, "l");
    let f = lookup(&fs, "f");
    assert_eq!(errno(try_read(&fs, d.inode, 0, 1, 0)), libc::EISDIR);
    assert_eq!(errno(try_write(&fs, d.inode, 0, b"x", 0)), libc::EISDIR);
    assert_eq!(errno(try_read(&fs, l.inode, 0, 1, 0)), libc::ELOOP);
    assert_eq!(errno(try_write(&fs, l.inode, 0, b"x", 0)), libc::ELOOP);
    assert_eq!(errno(try_read(&fs, 999_999, 0, 1, 0)), libc::EBADF);
    assert_eq!(errno(try_write(&fs, 999_999, 0, b"x", 0)), libc::EBADF);
    assert_eq!(errno(fs.fsync(&ctx(), 999_999, false, 0)), libc::EBADF);
    assert_eq!(
        errno(fs.readdir(&ctx(), f.inode, 0, 4096, 0, &mut |_| Ok(1))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs.readdir(&ctx(), 999_999, 0, 4096, 0, &mut |_| Ok(1))),
        libc::EBADF
    );
    assert_eq!(fs.io_fds.len(), 0);
    // Still serving.
    assert_eq!(try_read(&fs, f.inode, 0, 1, 0).unwrap(), b"x");
}

#[test]
fn no_open_descriptor_cache_is_bounded_and_forget_drops_entries() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(tmp.path().join(format!("f{i}")), format!("content {i}")).unwrap();
    }
    let fs = no_open_fs(tmp.path(), |c| c.max_data_fds = 4);
    assert_eq!(
        fs.io_fds.capacity(),
        4,
        "--max-data-fds, below the open-files limit"
    );
    let default = no_open_fs(tmp.path(), |_| {});
    assert_eq!(
        default.io_fds.capacity(),
        crate::passthrough::config::DEFAULT_MAX_DATA_FDS.min(IoFds::capacity_from_rlimit())
    );
    let nodes: Vec<Entry> = (0..20).map(|i| lookup(&fs, &format!("f{i}"))).collect();
    for round in 0..2 {
        for (i, e) in nodes.iter().enumerate() {
            let want = format!("content {i}");
            assert_eq!(try_read(&fs, e.inode, 0, 64, 0).unwrap(), want.as_bytes());
            assert!(fs.io_fds.len() <= 4, "round {round}: {}", fs.io_fds.len());
        }
    }
    let last = nodes.last().unwrap();
    assert!(fs.io_fds.holds(last.inode));
    fs.forget(&ctx(), last.inode, 1);
    assert!(!fs.io_fds.holds(last.inode));
}

#[test]
fn no_open_create_and_tmpfile_return_handle_0() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = no_open_fs(tmp.path(), |_| {});
    let flags = (libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT) as u32;
    let (e, o) = fs
        .create(&ctx(), ROOT_ID, c"new", 0o644, flags, 0, 0, &[])
        .unwrap();
    assert_eq!(o.handle, None, "fh 0");
    assert_eq!(o.open_flags, fopen::KEEP_CACHE | fopen::NOFLUSH);
    assert_eq!(fs.handles.len(), 0);
    assert!(
        fs.io_fds.holds(e.inode),
        "the created descriptor is the inode's"
    );
    // Never O_APPEND on the host: the guest's offset is where the write lands.
    try_write(&fs, e.inode, 0, b"abcdef", 0).unwrap();
    try_write(&fs, e.inode, 0, b"XY", 1).unwrap();
    assert_eq!(std::fs::read(tmp.path().join("new")).unwrap(), b"aXYdef");
    // Write-only from CREATE; a read opens its own descriptor.
    assert_eq!(try_read(&fs, e.inode, 0, 64, 0).unwrap(), b"aXYdef");
    // The kernel may send RELEASE of a file made before its first OPEN: nothing to do.
    fs.release(&ctx(), e.inode, 0, 0).unwrap();

    let (t, o) = fs
        .tmpfile(&ctx(), ROOT_ID, 0o600, libc::O_RDWR as u32, 0, &[])
        .unwrap();
    assert_eq!(o.handle, None);
    try_write(&fs, t.inode, 0, b"tmp", 0).unwrap();
    assert_eq!(try_read(&fs, t.inode, 0, 8, 0).unwrap(), b"tmp");
    assert_eq!(fs.handles.len(), 0);
}

#[test]
fn no_open_on_a_readonly_share_refuses_writes() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"ro").unwrap();
    let fs = no_open_fs(tmp.path(), |c| c.readonly = true);
    let f = lookup(&fs, "f");
    assert_eq!(errno(try_write(&fs, f.inode, 0, b"x", 0)), libc::EROFS);
    assert_eq!(
        errno(fs.fallocate(&ctx(), f.inode, 0, 0, 0, 10, false)),
        libc::EROFS
    );
    assert_eq!(try_read(&fs, f.inode, 0, 8, 0).unwrap(), b"ro");
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"ro");
}

#[test]
fn no_open_unlinked_or_replaced_files_stay_readable() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("gone"), b"still here").unwrap();
    std::fs::write(tmp.path().join("old"), b"replaced one").unwrap();
    std::fs::write(tmp.path().join("src"), b"new").unwrap();
    let fs = no_open_fs(tmp.path(), |_| {});
    // The guest opened them (the daemon never heard of it), then removes their names.
    let g = lookup(&fs, "gone");
    let o = lookup(&fs, "old");
    fs.unlink(&ctx(), ROOT_ID, c"gone").unwrap();
    fs.rename(&ctx(), ROOT_ID, c"src", ROOT_ID, c"old", 0)
        .unwrap();
    assert!(!tmp.path().join("gone").exists());
    assert_eq!(try_read(&fs, g.inode, 0, 64, 0).unwrap(), b"still here");
    try_write(&fs, g.inode, 0, b"STILL", 0).unwrap();
    assert_eq!(try_read(&fs, g.inode, 0, 64, 0).unwrap(), b"STILL here");
    assert_eq!(fs.getattr(&ctx(), g.inode, Some(0)).unwrap().0.st_nlink, 0);
    assert_eq!(try_read(&fs, o.inode, 0, 64, 0).unwrap(), b"replaced one");
    assert_eq!(std::fs::read(tmp.path().join("old")).unwrap(), b"new");
}

#[test]
fn no_open_file_deleted_on_the_host_gives_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let fs = no_open_fs(tmp.path(), |_| {});
    let f = lookup(&fs, "f");
    std::fs::remove_file(tmp.path().join("f")).unwrap();
    let e = errno(try_read(&fs, f.inode, 0, 1, 0));
    assert!(e == libc::ESTALE || e == libc::ENOENT, "errno {e}");
    let e = errno(try_write(&fs, f.inode, 0, b"y", 0));
    assert!(e == libc::ESTALE || e == libc::ENOENT, "errno {e}");
}

/// Run in a child process of the test binary (the open-files limit is per process): with a
/// limit of 64 descriptors and a descriptor cache allowed far more, reading 200 files runs out
/// of descriptors; each time half of the cache is closed and the read succeeds.
#[test]
fn no_open_out_of_descriptors_evicts_and_retries() {
    if std::env::var_os("VIRTIOFSD_EMFILE_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "passthrough::tests::no_open_out_of_descriptors_evicts_and_retries",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("VIRTIOFSD_EMFILE_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {text}");
        assert!(
            text.contains("EMFILE-CHILD-OK"),
            "child did not run: {text}"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..200 {
        std::fs::write(tmp.path().join(format!("f{i:03}")), format!("{i}")).unwrap();
    }
    let fs = no_open_fs(tmp.path(), |_| {});
    let nodes: Vec<Entry> = (0..200).map(|i| lookup(&fs, &format!("f{i:03}"))).collect();
    let lim = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    // SAFETY: setrlimit reads the local `lim` only; this child process runs this test alone.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    fs.io_fds.set_capacity(100_000);
    for (i, e) in nodes.iter().enumerate() {
        let want = format!("{i}");
        assert_eq!(try_read(&fs, e.inode, 0, 8, 0).unwrap(), want.as_bytes());
    }
    assert!(fs.io_fds.len() < 64, "{}", fs.io_fds.len());
    println!("EMFILE-CHILD-OK");
}

#[test]
fn a_fresh_file_is_proven_by_its_handle_until_its_birth_time_settles() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    std::fs::write(tmp.path().join("old"), b"x").unwrap();
    let st = std::fs::metadata(tmp.path().join("old")).unwrap();
    if st.created().is_err() {
        eprintln!("skipped: the temporary file system stamps no birth time");
        return;
    }
    let fresh = lookup(&fs, "old");
    let node = fs.inodes.get(fresh.inode).unwrap();
    assert!(
        !node.proven_by_key(),
        "born just now: the key alone proves nothing"
    );
    assert!(
        node.ident_handle().is_some(),
        "its file handle proves it instead"
    );
    std::thread::sleep(key::SETTLE + Duration::from_millis(100));
    // Found again after its birth time settled: the key proves it from now on.
    assert_eq!(lookup(&fs, "old").inode, fresh.inode);
    assert!(node.proven_by_key());
    assert_eq!(fs.getattr(&ctx(), fresh.inode, None).unwrap().0.st_size, 1);
}

#[test]
fn a_file_born_long_ago_is_proven_by_its_key_alone() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    if std::fs::metadata(tmp.path().join("f"))
        .unwrap()
        .created()
        .is_err()
    {
        eprintln!("skipped: the temporary file system stamps no birth time");
        return;
    }
    std::thread::sleep(key::SETTLE + Duration::from_millis(100));
    let fs = new_fs(tmp.path());
    let e = lookup(&fs, "f");
    let node = fs.inodes.get(e.inode).unwrap();
    assert!(node.proven_by_key());
    assert!(node.ident_handle().is_none(), "no file handle taken");
    assert!(node.opened_fd().is_none(), "no descriptor kept");
}

#[test]
fn a_missing_name_is_a_negative_entry_kept_as_long_as_the_cache_mode_keeps_entries() {
    let tmp = tempfile::tempdir().unwrap();
    for (mode, timeout) in [
        (CacheMode::Always, Some(Duration::from_secs(86400))),
        (CacheMode::Auto, Some(Duration::from_secs(1))),
        (CacheMode::Metadata, None),
        (CacheMode::Never, None),
    ] {
        let fs = fs_with(tmp.path(), |c| *c = Config::new(tmp.path(), mode));
        let r = fs.lookup(&ctx(), ROOT_ID, c"missing");
        match timeout {
            Some(t) => {
                let e = r.unwrap();
                assert_eq!((e.inode, e.entry_timeout), (0, t), "{mode:?}");
                // No reference is taken: nothing to forget.
                assert_eq!(fs.inodes.len(), 1, "{mode:?}");
            }
            None => assert_eq!(errno(r), libc::ENOENT, "{mode:?}"),
        }
    }
}

#[test]
fn other_lookup_errors_are_never_negative_entries() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let fs = fs_with(tmp.path(), |c| {
        *c = Config::new(tmp.path(), CacheMode::Always)
    });
    let f = lookup(&fs, "f");
    assert_eq!(errno(fs.lookup(&ctx(), f.inode, c"x")), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"a/b")), libc::EINVAL);
    assert_eq!(errno(fs.lookup(&ctx(), 9999, c"x")), libc::EBADF);
}

#[test]
fn the_one_funnel_of_opens_opens_only_regular_files_and_directories() {
    // Every open of a node for I/O goes through `open_node`: a FIFO or device node is refused
    // before anything is opened, whatever the caller checked and whatever mount the node is on
    // (a mount the host adds under the share after start is not `nodev` in the sandbox).
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    fs.mknod(&ctx(), ROOT_ID, c"fifo", libc::S_IFIFO | 0o666, 0, 0, &[])
        .unwrap();
    std::os::unix::fs::symlink("fifo", tmp.path().join("link")).unwrap();
    for (name, want) in [("fifo", libc::ENXIO), ("link", libc::ELOOP)] {
        let e = lookup(&fs, name);
        let data = fs.inode(e.inode).unwrap();
        assert_eq!(
            errno(fs.open_node(&data, libc::O_RDONLY | libc::O_NONBLOCK)),
            want,
            "{name}"
        );
    }
}

/// Makes a chain of `depth` directories named `d` below the share of `fs` (each made with
/// `mkdirat` in the one above: the chain's path is far past `PATH_MAX`), and restores each as
/// a migration destination does (found by name in the one above, no descriptor of its own).
/// Returns the node id of the deepest.
fn restore_chain(fs: &PassthroughFs, depth: u64) -> u64 {
    let root = fs.inode(ROOT_ID).unwrap();
    let mut cur = sys::openat(root.opened_fd().unwrap(), c".", open_path_flags(), 0).unwrap();
    let mut parent = root.clone();
    for id in 2..2 + depth {
        sys::mkdirat(cur.as_fd(), c"d", 0o755).unwrap();
        let fd = sys::openat(cur.as_fd(), c"d", open_path_flags(), 0).unwrap();
        let (st, x) = sys::stat_fd_mnt(fd.as_fd()).unwrap();
        let identity = fs
            .nodes()
            .identity_of(&root, &st, &x, identity::At::Fd(fd.as_fd()))
            .unwrap();
        let key = InodeKey::new(&st, &x, identity).unwrap();
        let source = Source::Found(Origin::new(parent.clone(), c"d"));
        let n = fs
            .nodes()
            .new_inode(key, identity, identity::At::Fd(fd.as_fd()), source)
            .unwrap();
        parent = fs.inodes.restore(id, n, 1).ok().unwrap();
        assert!(
            parent.opened_fd().is_none(),
            "level {id} keeps a descriptor"
        );
        cur = fd;
    }
    parent.id
}

/// Removes a chain of directories `d` below `dir`, and the empty directories at its bottom,
/// without recursion (`std::fs::remove_dir_all`, and so `TempDir`'s drop, makes one nested call
/// per level).
fn remove_chain(dir: &Path) {
    let open = |at: BorrowedFd<'_>, name: &CStr| {
        sys::openat(
            at,
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
    };
    let mut cur: OwnedFd = std::fs::File::open(dir).unwrap().into();
    let mut depth = 0;
    while let Ok(next) = open(cur.as_fd(), c"d") {
        cur = next;
        depth += 1;
    }
    let list = format!("/proc/self/fd/{}", cur.as_raw_fd());
    for e in std::fs::read_dir(list).unwrap() {
        let name = CString::new(e.unwrap().file_name().as_bytes()).unwrap();
        sys::unlinkat(cur.as_fd(), &name, libc::AT_REMOVEDIR).unwrap();
    }
    for _ in 0..depth {
        cur = open(cur.as_fd(), c"..").unwrap();
        sys::unlinkat(cur.as_fd(), c"d", libc::AT_REMOVEDIR).unwrap();
    }
}

#[test]
fn a_node_at_the_bottom_of_a_restored_chain_of_any_depth_is_served_on_a_small_stack() {
    // Each node of the chain is reached through the one above: a descriptor of the deepest
    // used to be opened by a recursion one level per node, which overflowed a queue worker's
    // 2 MiB stack at a few thousand levels (the process aborted). The walk is a loop now.
    // 20,000 levels (`CHAIN_LEVELS=N` for N: 100,000 pass in 145 s here, 120 of them the
    // host's own rmdir of the chain, which costs time in proportion to its depth).
    let levels: u64 = std::env::var("CHAIN_LEVELS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let _fds = fd_counting();
    let tmp = tempfile::tempdir().unwrap();
    let fs = new_fs(tmp.path());
    let fds = open_fds();
    let bottom = restore_chain(&fs, levels);
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn_scoped(s, || {
                let attr = fs.getattr(&ctx(), bottom, None).unwrap();
                assert_eq!(attr.0.st_mode & libc::S_IFMT, libc::S_IFDIR);
                let e = fs.mkdir(&ctx(), bottom, c"leaf", 0o755, 0, &[]).unwrap();
                let opened = fs.opendir(&ctx(), e.inode, libc::O_RDONLY as u32).unwrap();
                fs.releasedir(&ctx(), e.inode, 0, opened.handle.unwrap())
                    .unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
    });
    // One directory in 64 keeps its descriptor: a later walk from below is short, and the
    // chain takes a descriptor per 64 levels, not one each (100,000 levels would take more
    // descriptors than the open-files limit of most hosts).
    let kept = open_fds().saturating_sub(fds) as u64;
    assert!(
        kept < levels / 64 + 100,
        "{kept} descriptors kept for {levels} levels"
    );
    let t = std::time::Instant::now();
    for id in (bottom - 1_000..bottom).rev() {
        fs.getattr(&ctx(), id, None).unwrap();
    }
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "1,000 nodes near the bottom: {:?}",
        t.elapsed()
    );
    drop(fs);
    remove_chain(tmp.path());
}

#[test]
fn a_node_with_no_slot_left_is_refused_with_enfile_and_the_daemon_goes_on() {
    // The node limit counts the nodes the guest holds, not the parents they hold in turn (a
    // directory the guest forgot stays while a file found in it is held; a chain restored by a
    // migration holds every ancestor), so the slots of node memory can run out before it. A
    // new node then used to stop the process (`handle_alloc_error`); it is refused instead.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    std::fs::create_dir(tmp.path().join("d")).unwrap();
    let fs = new_fs(tmp.path());
    node::slab::tests::with_room(0, || {
        assert_eq!(errno(fs.lookup(&ctx(), ROOT_ID, c"f")), libc::ENFILE);
        assert_eq!(
            errno(fs.symlink(&ctx(), c"f", ROOT_ID, c"l", &[])),
            libc::ENFILE
        );
        assert_eq!(
            errno(fs.mkdir(&ctx(), ROOT_ID, c"new", 0o755, 0, &[])),
            libc::ENFILE
        );
        // A migration destination refuses the node (and so the state), nothing kept.
        let root = fs.inode(ROOT_ID).unwrap();
        let fd = sys::openat(root.opened_fd().unwrap(), c"d", open_path_flags(), 0).unwrap();
        let (st, x) = sys::stat_fd_mnt(fd.as_fd()).unwrap();
        let identity = fs
            .nodes()
            .identity_of(&root, &st, &x, identity::At::Fd(fd.as_fd()))
            .unwrap();
        let key = InodeKey::new(&st, &x, identity).unwrap();
        let source = Source::Found(Origin::new(root.clone(), c"d"));
        let n = fs
            .nodes()
            .new_inode(key, identity, identity::At::Fd(fd.as_fd()), source)
            .unwrap();
        assert!(matches!(
            fs.inodes.restore(7, n, 1),
            Err(node::inode::NotAdded::NoRoom)
        ));
    });
    assert_eq!(fs.inodes.len(), 1, "only the root");
    assert!(!tmp.path().join("l").exists() && !tmp.path().join("new").exists());
    let f = lookup(&fs, "f");
    assert_eq!(fs.getattr(&ctx(), f.inode, None).unwrap().0.st_size, 1);
}
