//! No-open mode: with `--cache=always` and a guest offering `FUSE_NO_OPEN_SUPPORT` /
//! `FUSE_NO_OPENDIR_SUPPORT` at INIT, OPEN, OPENDIR and FLUSH are answered with `ENOSYS` and
//! files and directories are then used with handle 0 (the Linux client sends no RELEASE).
//! Without those INIT flags, in any other cache mode, or with the guest's locks held on the host
//! (the default), nothing changes.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::*;
use virtiofsd::fuse::abi::{fattr, fopen, init, ROOT_ID};
use virtiofsd::passthrough::CacheMode;
use virtiofsd_frontend::fuse_client::DEFAULT_INIT_FLAGS;
use virtiofsd_frontend::KernelState;

/// `--cache=always` with the guest's locks kept in the guest (`-o no_posix_lock,no_flock`): the
/// locks held on the host need OPEN, FLUSH and RELEASE.
fn always() -> Daemon {
    Daemon::with(Options {
        posix_lock: false,
        flock: false,
        ..Options::default().cache(CacheMode::Always)
    })
}

#[test]
fn cache_always_with_host_locks_serves_open_flush_and_release() {
    let mut d = Daemon::with(Options::default().cache(CacheMode::Always));
    let n = d.file("f", b"x");
    let o = d.c.open(n, libc::O_RDWR as u32).unwrap();
    assert_ne!(o.fh, 0);
    d.c.flush(n, o.fh, 1).unwrap();
    d.c.release(n, o.fh, 0).unwrap();
    assert!(d.c.opendir(ROOT_ID, 0).is_ok());
    d.finish();
}

fn agreed(d: &Daemon) -> u64 {
    let i = d.init.unwrap();
    u64::from(i.flags) | (u64::from(i.flags2) << 32)
}

#[test]
fn the_frontend_offers_no_open_like_linux() {
    assert_ne!(DEFAULT_INIT_FLAGS & init::NO_OPEN_SUPPORT, 0);
    assert_ne!(DEFAULT_INIT_FLAGS & init::NO_OPENDIR_SUPPORT, 0);
}

#[test]
fn cache_always_answers_open_opendir_flush_with_enosys_and_serves_handle_0() {
    let mut d = always();
    assert_eq!(agreed(&d) & init::ATOMIC_O_TRUNC, 0, "no atomic O_TRUNC");
    let n = d.file("f", b"hello world");
    assert_eq!(
        d.c.open(n, libc::O_RDONLY as u32).unwrap_err(),
        libc::ENOSYS
    );
    assert_eq!(d.c.opendir(ROOT_ID, 0).unwrap_err(), libc::ENOSYS);
    assert_eq!(d.c.flush(n, 0, 0).unwrap_err(), libc::ENOSYS);

    assert_eq!(d.c.read(n, 0, 6, 64).unwrap(), b"world");
    assert_eq!(d.c.write(n, 0, 0, b"HELLO").unwrap(), 5);
    // Straight to the host file.
    assert_eq!(fs::read(d.host("f")).unwrap(), b"HELLO world");
    d.c.fsync(n, 0, false).unwrap();
    assert_eq!(d.c.getattr(n, Some(0)).unwrap().attr.size, 11);

    // O_TRUNC: the kernel truncates with SETATTR (naming handle 0) after its own open.
    let mut a = setattr_in(fattr::SIZE | fattr::FH);
    a.size = 0;
    a.fh = 0;
    assert_eq!(d.c.setattr(n, &a).unwrap().attr.size, 0);
    assert_eq!(fs::read(d.host("f")).unwrap(), b"");

    // CREATE gives handle 0; the file is written through it, no RELEASE follows.
    let (e, o) =
        d.c.create(
            ROOT_ID,
            "new",
            (libc::O_CREAT | libc::O_WRONLY | libc::O_APPEND) as u32,
            0o644,
            0,
        )
        .unwrap();
    assert_eq!(o.fh, 0);
    assert_eq!(o.open_flags & fopen::KEEP_CACHE, fopen::KEEP_CACHE);
    d.c.write(e.nodeid, 0, 0, b"0123456789").unwrap();
    // Never O_APPEND on the host: the offset the guest gives is used.
    d.c.write(e.nodeid, 0, 2, b"ab").unwrap();
    assert_eq!(fs::read(d.host("new")).unwrap(), b"01ab456789");

    // Directories with handle 0.
    fs::create_dir(d.host("dir")).unwrap();
    for i in 0..300 {
        fs::write(d.host(format!("dir/entry-{i:03}")), b"").unwrap();
    }
    let dir = d.node("dir");
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let batch = d.c.readdir(dir, 0, offset, 1024).unwrap();
        if batch.is_empty() {
            break;
        }
        offset = batch.last().unwrap().off;
        names.extend(batch.into_iter().map(|e| e.name));
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 302);
    let plus = d.c.readdirplus(dir, 0, 0, 1 << 16).unwrap();
    assert!(plus.iter().any(|p| p.dirent.name == b"entry-299"));
    d.c.fsyncdir(dir, 0, false).unwrap();
    d.finish();
}

#[test]
fn the_kernel_helpers_learn_from_enosys_like_linux() {
    let mut d = always();
    let n = d.file("f", b"data");
    assert_eq!(d.c.kernel_state(), KernelState::default());
    let o = d.c.kernel_open(n, libc::O_RDONLY as u32).unwrap().unwrap();
    assert_eq!((o.fh, o.open_flags), (0, fopen::KEEP_CACHE));
    let od = d.c.kernel_opendir(ROOT_ID, 0).unwrap().unwrap();
    assert_eq!(od.fh, 0);
    d.c.kernel_flush(n, 0, 0).unwrap().unwrap();
    d.c.kernel_release(n, 0, 0).unwrap().unwrap();
    d.c.kernel_releasedir(ROOT_ID, 0, 0).unwrap().unwrap();
    assert_eq!(
        d.c.kernel_state(),
        KernelState {
            no_open: true,
            no_opendir: true,
            no_flush: true
        }
    );
    assert_eq!(d.c.read(n, o.fh, 0, 16).unwrap(), b"data");
    d.finish();
}

#[test]
fn without_no_open_support_cache_always_opens_as_before() {
    let mut d = Daemon::with(
        Options::default()
            .cache(CacheMode::Always)
            .without_no_open(),
    );
    assert_ne!(agreed(&d) & init::ATOMIC_O_TRUNC, 0);
    let n = d.file("f", b"x");
    let fh = d.open(n, libc::O_RDWR);
    assert_ne!(fh, 0);
    assert_eq!(d.c.read(n, 0, 0, 4).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.write(n, 0, 0, b"y").unwrap_err(), libc::EBADF);
    assert_eq!(d.c.read(n, fh, 0, 4).unwrap(), b"x");
    d.c.flush(n, fh, 0).unwrap();
    d.c.release(n, fh, 0).unwrap();
    let od = d.c.opendir(ROOT_ID, 0).unwrap();
    assert_ne!(od.fh, 0);
    assert_eq!(d.c.readdir(ROOT_ID, 0, 0, 4096).unwrap_err(), libc::EBADF);
    d.c.releasedir(ROOT_ID, od.fh, 0).unwrap();
    let o = d.c.kernel_open(n, 0).unwrap().unwrap();
    assert_ne!(o.fh, 0);
    assert!(!d.c.kernel_state().no_open);
    d.finish();
}

#[test]
fn other_cache_modes_always_open() {
    for mode in [CacheMode::Never, CacheMode::Metadata, CacheMode::Auto] {
        let mut d = Daemon::with(Options::default().cache(mode));
        assert_ne!(agreed(&d) & init::ATOMIC_O_TRUNC, 0, "{mode:?}");
        let n = d.file("f", b"x");
        let fh = d.open(n, libc::O_RDONLY);
        assert_ne!(fh, 0, "{mode:?}");
        assert_eq!(d.c.read(n, 0, 0, 4).unwrap_err(), libc::EBADF, "{mode:?}");
        d.c.flush(n, fh, 0).unwrap();
        d.c.release(n, fh, 0).unwrap();
        assert!(d.c.opendir(ROOT_ID, 0).is_ok());
        d.finish();
    }
}

#[test]
fn unlinked_and_replaced_files_stay_usable_and_host_deletion_is_an_error() {
    let mut d = always();
    let gone = d.file("gone", b"still readable");
    let old = d.file("old", b"old content");
    fs::write(d.host("src"), b"new").unwrap();
    let vanished = d.file("vanished", b"x");
    // The guest holds them open (the daemon never saw an OPEN), then removes the names.
    d.c.unlink(ROOT_ID, "gone").unwrap();
    let _src = d.node("src");
    d.c.rename(ROOT_ID, "src", ROOT_ID, "old").unwrap();
    assert_eq!(d.c.read(gone, 0, 0, 64).unwrap(), b"still readable");
    d.c.write(gone, 0, 0, b"STILL").unwrap();
    assert_eq!(d.c.read(gone, 0, 0, 64).unwrap(), b"STILL readable");
    assert_eq!(d.c.getattr(gone, Some(0)).unwrap().attr.nlink, 0);
    assert_eq!(d.c.read(old, 0, 0, 64).unwrap(), b"old content");
    assert_eq!(fs::read(d.host("old")).unwrap(), b"new");
    // Deleted behind the daemon's back: an error, not a panic, and the daemon keeps serving.
    fs::remove_file(d.host("vanished")).unwrap();
    let e = d.c.read(vanished, 0, 0, 4).unwrap_err();
    assert!(e == libc::ESTALE || e == libc::ENOENT, "errno {e}");
    assert_eq!(d.c.read(old, 0, 0, 64).unwrap(), b"old content");
    d.finish();
}

/// The names a listing of `dir` (handle 0) gives, `.` and `..` aside. A removed directory
/// answers `ENOENT`, as `getdents` does on the host (glibc's `readdir` takes it for the end).
fn listed(d: &mut Daemon, dir: u64) -> Vec<Vec<u8>> {
    let entries = match d.c.readdir(dir, 0, 0, 4096) {
        Err(libc::ENOENT) => Vec::new(),
        r => r.unwrap_or_else(|e| panic!("READDIR: errno {e}")),
    };
    let mut names: Vec<Vec<u8>> = entries
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    names.sort();
    names
}

#[test]
fn a_directory_the_guest_renames_another_over_stays_usable_until_forget() {
    // xfstests generic/035: MKDIR dir2, the guest holds it open (no OPENDIR in this mode),
    // RENAME dir1 over dir2, fstat of the open dir2: GETATTR of its node. It answered ESTALE:
    // the node kept no descriptor, and no name led to it any more.
    let mut d = always();
    let dir2 = d.c.mkdir(ROOT_ID, "dir2", 0o755, 0).unwrap().nodeid;
    let dir1 = d.c.mkdir(ROOT_ID, "dir1", 0o755, 0).unwrap().nodeid;
    fs::write(d.host("dir1/inside"), b"x").unwrap();
    d.c.rename(ROOT_ID, "dir1", ROOT_ID, "dir2").unwrap();
    let a =
        d.c.getattr(dir2, None)
            .expect("fstat of the replaced directory")
            .attr;
    assert_eq!(a.nlink, 0, "removed, as the host says");
    assert_eq!(a.mode & libc::S_IFMT, libc::S_IFDIR);
    assert!(
        listed(&mut d, dir2).is_empty(),
        "lists empty, as on the host"
    );
    assert_eq!(d.c.lookup(dir2, "inside").unwrap_err(), libc::ENOENT);
    // The one renamed keeps its node under the new name.
    assert_eq!(d.c.getattr(dir1, None).unwrap().attr.nlink, 2);
    assert_eq!(listed(&mut d, dir1), [b"inside".to_vec()]);
    // Removed by RMDIR while held: the same.
    let gone = d.c.mkdir(ROOT_ID, "gone", 0o755, 0).unwrap().nodeid;
    d.c.rmdir(ROOT_ID, "gone").unwrap();
    assert_eq!(d.c.getattr(gone, None).unwrap().attr.nlink, 0);
    // Until the guest forgets them.
    d.c.forget(dir2, 1);
    d.c.forget(gone, 1);
    assert_eq!(d.c.getattr(dir2, None).unwrap_err(), libc::EBADF);
    d.finish();
}

#[test]
fn a_directory_the_host_renames_another_over_stays_usable_until_forget() {
    // The same with the host doing the rename, which the daemon never hears of; a directory
    // found by LOOKUP (and by READDIRPLUS) as well as one the guest made.
    let mut d = always();
    fs::create_dir(d.host("looked")).unwrap();
    fs::create_dir(d.host("listed")).unwrap();
    let looked = d.node("looked");
    let plus = d.c.readdirplus(ROOT_ID, 0, 0, 1 << 16).unwrap();
    let listed_node = plus
        .iter()
        .find(|p| p.dirent.name == b"listed")
        .expect("listed by READDIRPLUS")
        .entry
        .nodeid;
    for name in ["looked", "listed"] {
        let other = format!("other-{name}");
        fs::create_dir(d.host(&other)).unwrap();
        fs::rename(d.host(&other), d.host(name)).unwrap();
    }
    for (name, node) in [("looked", looked), ("listed", listed_node)] {
        let a =
            d.c.getattr(node, None)
                .unwrap_or_else(|e| panic!("{name}: errno {e}"));
        assert_eq!(a.attr.nlink, 0, "{name}");
        assert!(listed(&mut d, node).is_empty(), "{name}");
    }
    d.finish();
}

#[test]
fn readonly_share_refuses_handle_less_writes() {
    let mut d = Daemon::with(Options {
        posix_lock: false,
        flock: false,
        ..Options::default().cache(CacheMode::Always).readonly()
    });
    let n = d.file("f", b"ro");
    fs::set_permissions(d.host("f"), fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(d.c.write(n, 0, 0, b"x").unwrap_err(), libc::EROFS);
    assert_eq!(d.c.fallocate(n, 0, 0, 8, 0).unwrap_err(), libc::EROFS);
    assert_eq!(d.c.read(n, 0, 0, 8).unwrap(), b"ro");
    assert_eq!(fs::read(d.host("f")).unwrap(), b"ro");
    d.finish();
}

#[test]
fn hostile_handle_0_requests_get_errors_and_the_daemon_keeps_serving() {
    let mut d = always();
    let n = d.file("f", b"ok");
    fs::create_dir(d.host("dir")).unwrap();
    std::os::unix::fs::symlink("f", d.host("link")).unwrap();
    let dir = d.node("dir");
    let link = d.node("link");
    let fifo =
        d.c.mknod(ROOT_ID, "fifo", libc::S_IFIFO | 0o644, 0, 0)
            .unwrap();
    let fifo = fifo.nodeid;
    for (node, want) in [
        (dir, libc::EISDIR),
        (link, libc::ELOOP),
        (fifo, libc::ENXIO),
        (987_654, libc::EBADF),
    ] {
        assert_eq!(d.c.read(node, 0, 0, 16).unwrap_err(), want, "read {node}");
        assert_eq!(
            d.c.write(node, 0, 0, b"x").unwrap_err(),
            want,
            "write {node}"
        );
        assert_eq!(
            d.c.fallocate(node, 0, 0, 8, 0).unwrap_err(),
            want,
            "fallocate {node}"
        );
        assert_eq!(d.c.fsync(node, 0, false).unwrap_err(), want, "fsync {node}");
    }
    assert_eq!(d.c.readdir(n, 0, 0, 4096).unwrap_err(), libc::ENOTDIR);
    assert_eq!(d.c.readdir(987_654, 0, 0, 4096).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.read(n, u64::MAX, 0, 4).unwrap_err(), libc::EBADF);
    assert_eq!(d.c.read(n, 1, 0, 4).unwrap_err(), libc::EBADF);
    // Reading at huge offsets, or from the end of a listing again.
    assert_eq!(d.c.read(n, 0, 1 << 40, 4).unwrap(), b"");
    assert_eq!(d.c.read(n, 0, u64::MAX, 4).unwrap_err(), libc::EINVAL);
    assert!(d.c.readdir(dir, 0, u64::MAX, 4096).unwrap().is_empty());
    // Forgotten nodes lose their descriptors; a later handle-0 read is EBADF.
    d.c.forget(n, 1);
    assert_eq!(d.c.read(n, 0, 0, 4).unwrap_err(), libc::EBADF);
    let again = d.node("f");
    assert_eq!(d.c.read(again, 0, 0, 4).unwrap(), b"ok");
    d.finish();
}
