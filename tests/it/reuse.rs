//! Inode number reuse: a node id names one file for its whole life.
//!
//! An inode found by name keeps no descriptor, so once its file is deleted the host file system
//! may give the same inode number to the next file made. The share here is a fresh, small ext4
//! file system (one block group), where that is exactly what happens: the tests check it (the
//! "precondition" assertions) and then that the new file is a new node, and that the old node
//! reaches nothing of the new file: no open of a device or FIFO, no truncation, no data, no
//! `..` confusion, no syncfs through it. Each sends the raw requests a hostile guest would; the
//! symlink case is the one `stress-ng --symlink` meets in a benign guest.

use crate::common;

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use virtiofsd::fuse::abi::{self, fattr, opcode, Pod, ROOT_ID};
use virtiofsd::passthrough::{CacheMode, InodeFileHandles};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A daemon serving a fresh ext4 file system, or `None` (with a note) when not root.
fn ext4(cache: CacheMode) -> Option<Daemon> {
    ext4_with(cache, InodeFileHandles::Never)
}

fn ext4_with(cache: CacheMode, handles: InodeFileHandles) -> Option<Daemon> {
    if !is_root() {
        eprintln!("skipped: needs root to loop-mount an ext4 file system");
        return None;
    }
    let mut opts = Options::default()
        .ext4_share()
        .cache(cache)
        .inode_file_handles(handles);
    opts.frontend.timeout = Duration::from_secs(5);
    Some(Daemon::with(opts))
}

fn host_ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// Makes `name` on the host, looks it up (node N, no descriptor kept), and unlinks it through
/// the guest without a FORGET. Returns N and the inode number that is now free.
fn lookup_then_unlink(d: &mut Daemon, name: &str) -> (u64, u64) {
    fs::write(d.host(name), b"old contents").unwrap();
    let ino = host_ino(&d.host(name));
    let n = d.node(name);
    d.c.unlink(ROOT_ID, name).unwrap();
    (n, ino)
}

fn assert_reused(d: &Daemon, name: &str, ino: u64) {
    assert_eq!(
        host_ino(&d.host(name)),
        ino,
        "precondition: ext4 gives the freed inode number to the next file"
    );
}

/// `IN_OPEN` events of the files in one directory: shows whether the daemon opened a file.
struct OpenWatch(OwnedFd);

impl OpenWatch {
    fn new(dir: &Path) -> OpenWatch {
        // SAFETY: plain syscall; the result is checked and owned.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` was just created and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let p = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: `p` is NUL-terminated; the result is checked.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), p.as_ptr(), libc::IN_OPEN) };
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        OpenWatch(fd)
    }

    /// Names opened since the watch began.
    fn opened(&self) -> Vec<String> {
        let mut names = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is valid for its length; the result is checked.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return names;
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes(rest[12..16].try_into().unwrap()) as usize;
                let name = &rest[16..16 + len];
                let end = name.iter().position(|&b| b == 0).unwrap_or(len);
                names.push(String::from_utf8_lossy(&name[..end]).into_owned());
                rest = &rest[16 + len..];
            }
        }
    }
}

#[test]
fn a_device_node_given_a_freed_number_is_a_new_node_and_never_opened() {
    for handles in [
        InodeFileHandles::Never,
        InodeFileHandles::Prefer,
        InodeFileHandles::Mandatory,
    ] {
        device_in_place_of_a_file(handles);
    }
}

fn device_in_place_of_a_file(handles: InodeFileHandles) {
    let Some(mut d) = ext4_with(CacheMode::Auto, handles) else {
        return;
    };
    let (n, ino) = lookup_then_unlink(&mut d, "a");
    let watch = OpenWatch::new(&d.share);
    let m =
        d.c.mknod(ROOT_ID, "b", libc::S_IFCHR | 0o666, fuse_dev(1, 3), 0)
            .unwrap();
    assert_reused(&d, "b", ino);
    assert_ne!(
        m.nodeid, n,
        "the device is a new node, not the deleted file's"
    );
    assert_eq!(m.attr.mode & libc::S_IFMT, libc::S_IFCHR);
    // The old node reaches nothing: its file is gone.
    assert_eq!(d.c.open(n, libc::O_RDWR as u32).unwrap_err(), libc::ESTALE);
    assert_eq!(d.c.getattr(n, None).unwrap_err(), libc::ESTALE);
    // The device itself is never opened on the host.
    assert_eq!(
        d.c.open(m.nodeid, libc::O_RDWR as u32).unwrap_err(),
        libc::ENXIO
    );
    assert_eq!(d.c.lookup(ROOT_ID, "b").unwrap().nodeid, m.nodeid);
    assert!(
        !watch.opened().iter().any(|f| f == "b"),
        "the daemon opened the device node"
    );
    d.finish();
}

#[test]
fn a_fifo_given_a_freed_number_does_not_hang_an_open_with_o_trunc() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    let (n, ino) = lookup_then_unlink(&mut d, "a");
    let m =
        d.c.mknod(ROOT_ID, "p", libc::S_IFIFO | 0o666, 0, 0)
            .unwrap();
    assert_reused(&d, "p", ino);
    assert_ne!(m.nodeid, n);
    // The old code reopened the FIFO without O_NONBLOCK here and the worker hung (the client
    // then times out after 5 s and the test fails).
    let e =
        d.c.open(n, (libc::O_WRONLY | libc::O_TRUNC) as u32)
            .unwrap_err();
    assert_eq!(e, libc::ESTALE);
    // Still serving.
    assert_eq!(
        d.c.getattr(ROOT_ID, None).unwrap().attr.ino,
        host_ino(&d.share)
    );
    d.finish();
}

#[test]
fn a_symlink_given_a_freed_number_reads_as_a_symlink() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    let (n, ino) = lookup_then_unlink(&mut d, "a");
    let m = d.c.symlink(ROOT_ID, "s", "target").unwrap();
    assert_reused(&d, "s", ino);
    assert_ne!(m.nodeid, n, "a new symlink is a new node");
    assert_eq!(m.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(d.c.readlink(m.nodeid).unwrap(), b"target");
    let again = d.c.lookup(ROOT_ID, "s").unwrap();
    assert_eq!(again.nodeid, m.nodeid);
    assert_eq!(again.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert!(d.c.readlink(n).is_err());
    d.finish();
}

#[test]
fn a_regular_file_given_a_freed_number_is_a_new_node_the_old_one_stale() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    let (n, ino) = lookup_then_unlink(&mut d, "a");
    // Same type, made within the same clock tick as likely as not: only the file handle's
    // generation tells the files apart then.
    let (m, open) =
        d.c.create(ROOT_ID, "b", libc::O_RDWR as u32, 0o644, 0)
            .unwrap();
    d.c.write(m.nodeid, open.fh, 0, b"new").unwrap();
    assert_reused(&d, "b", ino);
    assert_ne!(m.nodeid, n);
    assert_eq!(d.c.getattr(n, None).unwrap_err(), libc::ESTALE);
    assert_eq!(
        d.c.open(n, libc::O_RDONLY as u32).unwrap_err(),
        libc::ESTALE
    );
    assert_eq!(d.c.lookup(ROOT_ID, "b").unwrap().nodeid, m.nodeid);
    d.finish();
}

#[test]
fn setattr_size_on_a_node_whose_number_was_reused_truncates_nothing() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    let (n, ino) = lookup_then_unlink(&mut d, "a");
    fs::write(d.host("b"), b"keep me").unwrap();
    assert_reused(&d, "b", ino);
    let m = d.node("b");
    assert_ne!(m, n);
    let mut attr = setattr_in(fattr::SIZE);
    attr.size = 0;
    assert_eq!(d.c.setattr(n, &attr).unwrap_err(), libc::ESTALE);
    assert_eq!(fs::read(d.host("b")).unwrap(), b"keep me");
    d.finish();
}

#[test]
fn a_directory_given_a_freed_number_is_a_new_node_and_dotdot_leads_to_it() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    fs::create_dir(d.host("p")).unwrap();
    fs::create_dir(d.host("p/x")).unwrap();
    let ino = host_ino(&d.host("p/x"));
    let p = d.node("p");
    let x = d.c.lookup(p, "x").unwrap().nodeid;
    d.c.rmdir(p, "x").unwrap();
    let y = d.c.mkdir(p, "y", 0o755, 0).unwrap().nodeid;
    assert_reused(&d, "p/y", ino);
    assert_ne!(y, x, "the new directory is a new node");
    fs::create_dir(d.host("p/y/c")).unwrap();
    let c = d.c.lookup(y, "c").unwrap().nodeid;
    assert_eq!(
        d.c.lookup(c, "..").unwrap().nodeid,
        y,
        "`..` is the new directory"
    );
    assert_eq!(d.c.getattr(x, None).unwrap_err(), libc::ESTALE);
    assert_eq!(d.c.lookup(x, "c").unwrap_err(), libc::ESTALE);
    d.finish();
}

#[test]
fn syncfs_through_a_node_whose_number_was_reused_opens_nothing_of_the_new_file() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    let (n, ino) = lookup_then_unlink(&mut d, "a");
    d.c.mknod(ROOT_ID, "p", libc::S_IFIFO | 0o666, 0, 0)
        .unwrap();
    assert_reused(&d, "p", ino);
    d.node("p");
    let watch = OpenWatch::new(&d.share);
    let arg = abi::SyncfsIn { padding: 0 };
    let reply =
        d.c.request(opcode::SYNCFS, n, &[arg.as_bytes()], 0)
            .unwrap();
    assert_eq!(
        reply.errno(),
        None,
        "syncfs goes through the shared directory"
    );
    assert!(
        !watch.opened().iter().any(|f| f == "p"),
        "the daemon opened the FIFO"
    );
    d.finish();
}

#[test]
fn cache_always_handle_less_io_never_serves_another_files_data() {
    // No-open mode: the guest's locks kept in the guest (locks held on the host turn it off).
    if !is_root() {
        eprintln!("skipped: needs root to loop-mount an ext4 file system");
        return;
    }
    let mut opts = Options::default().ext4_share().cache(CacheMode::Always);
    opts.posix_lock = false;
    opts.flock = false;
    opts.frontend.timeout = Duration::from_secs(5);
    let mut d = Daemon::with(opts);
    fs::write(d.host("a"), b"contents of a").unwrap();
    let ino = host_ino(&d.host("a"));
    let n = d.node("a");
    // The host replaces the file behind the guest's back.
    fs::remove_file(d.host("a")).unwrap();
    fs::write(d.host("b"), b"contents of b").unwrap();
    assert_reused(&d, "b", ino);
    let m = d.node("b");
    assert_ne!(m, n);
    // Handle 0: the inode's own descriptor (no-open mode).
    assert_eq!(d.c.read(n, 0, 0, 100).unwrap_err(), libc::ESTALE);
    assert_eq!(d.c.write(n, 0, 0, b"xx").unwrap_err(), libc::ESTALE);
    assert_eq!(d.c.read(m, 0, 0, 100).unwrap(), b"contents of b");
    d.finish();
}

#[test]
fn hard_links_and_renames_keep_their_node_while_numbers_are_checked() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    // Fresh files (born within the last second) are proven by their file handle.
    fs::write(d.host("a"), b"x").unwrap();
    let n = d.node("a");
    fs::hard_link(d.host("a"), d.host("b")).unwrap();
    assert_eq!(d.node("b"), n, "a hard link is the same node");
    fs::rename(d.host("a"), d.host("c")).unwrap();
    assert_eq!(d.node("c"), n, "a renamed file is the same node");
    assert_eq!(d.c.getattr(n, None).unwrap().attr.nlink, 2);
    d.finish();
}

// ---- no number reuse needed: a name that now leads elsewhere ----

/// A node found by name is opened through an `O_PATH` descriptor of the name, checked, then
/// reopened: a FIFO (or, without `nodev`, a device node) the guest renamed over the name is
/// never opened on the host, not even to be refused afterwards.
#[test]
fn open_of_a_node_whose_name_now_leads_to_a_fifo_opens_nothing() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    fs::write(d.host("a"), b"old").unwrap();
    let n = d.node("a");
    d.c.mknod(ROOT_ID, "p", libc::S_IFIFO | 0o666, 0, 0)
        .unwrap();
    d.c.rename(ROOT_ID, "p", ROOT_ID, "a").unwrap();
    let watch = OpenWatch::new(&d.share);
    let e = d.c.open(n, libc::O_RDONLY as u32).unwrap_err();
    assert_eq!(e, libc::ESTALE);
    let opened = watch.opened();
    assert!(
        !opened.iter().any(|f| f == "a"),
        "the daemon opened the FIFO now named a: {opened:?}"
    );
    d.finish();
}

#[test]
fn open_and_syncfs_of_a_node_whose_name_now_leads_to_a_device_open_nothing() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    fs::write(d.host("a"), b"old").unwrap();
    let n = d.node("a");
    // /dev/null: harmless to open; a watchdog or tty would not be.
    d.c.mknod(ROOT_ID, "dev", libc::S_IFCHR | 0o666, fuse_dev(1, 3), 0)
        .unwrap();
    d.c.rename(ROOT_ID, "dev", ROOT_ID, "a").unwrap();
    let watch = OpenWatch::new(&d.share);
    // OPEN (write-only), then SYNCFS: both open the name for I/O before checking it.
    let e = d.c.open(n, libc::O_WRONLY as u32).unwrap_err();
    assert_eq!(e, libc::ESTALE);
    let arg = abi::SyncfsIn { padding: 0 };
    let reply =
        d.c.request(opcode::SYNCFS, n, &[arg.as_bytes()], 0)
            .unwrap();
    assert_eq!(reply.errno(), None);
    let opened = watch.opened();
    assert!(
        !opened.iter().any(|f| f == "a"),
        "the daemon opened the device node now named a (O_WRONLY): {opened:?}"
    );
    d.finish();
}

/// A benign guest: two hard links, both looked up (the node remembers the last name), the
/// last one removed: the node's file is alive under its other name and stays reachable.
#[test]
fn unlinking_the_name_a_node_was_last_found_by_keeps_it_reachable_through_its_other_links() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    fs::write(d.host("a"), b"data").unwrap();
    fs::hard_link(d.host("a"), d.host("b")).unwrap();
    let n = d.node("a");
    assert_eq!(d.node("b"), n);
    d.c.unlink(ROOT_ID, "b").unwrap();
    assert!(d.host("a").exists());
    let r = d.c.getattr(n, None);
    assert!(
        r.is_ok(),
        "getattr of a live file's node: errno {:?}",
        r.err()
    );
    let r = d.c.open(n, libc::O_RDONLY as u32);
    assert!(r.is_ok(), "open of a live file's node: errno {:?}", r.err());
    d.finish();
}

/// Same with a rename over the name the node last had.
#[test]
fn renaming_over_the_name_a_node_was_last_found_by_keeps_it_reachable_through_its_other_links() {
    let Some(mut d) = ext4(CacheMode::Auto) else {
        return;
    };
    fs::write(d.host("a"), b"data").unwrap();
    fs::hard_link(d.host("a"), d.host("b")).unwrap();
    fs::write(d.host("c"), b"other").unwrap();
    let n = d.node("a");
    assert_eq!(d.node("b"), n);
    d.c.rename(ROOT_ID, "c", ROOT_ID, "b").unwrap();
    let r = d.c.getattr(n, None);
    assert!(
        r.is_ok(),
        "getattr of a live file's node: errno {:?}",
        r.err()
    );
    d.finish();
}
