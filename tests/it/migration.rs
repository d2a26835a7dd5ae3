//! Live migration, in process: the test frontend plays both QEMUs. It stops the source's queues,
//! takes the source daemon's state (`SET_DEVICE_STATE_FD` save + `CHECK_DEVICE_STATE`), starts
//! a second daemon on the same shared directory, gives it the state (load + check) without a new
//! INIT, and the "guest" goes on with the node ids and handles it held: reading, writing,
//! listing from the offset it had reached, creating. Each mode (`find-paths`, with and without
//! its checks, and `file-handles`), files renamed, deleted and replaced between save and load,
//! both `--migration-on-error` actions, both cache modes the guest test uses, and states that
//! are truncated, corrupted or foreign.

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::*;
use virtiofsd::fuse::abi::{self, ROOT_ID};
use virtiofsd::migration::{Mode, OnError, Options as Migration};
use virtiofsd::passthrough::CacheMode;
use virtiofsd_frontend::fuse_client::DirEntry;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn paths() -> Migration {
    Migration::default()
}

fn guest_error(mut m: Migration) -> Migration {
    m.on_error = OnError::GuestError;
    m
}

fn handles() -> Migration {
    Migration {
        mode: Mode::FileHandles,
        ..Default::default()
    }
}

fn checked() -> Migration {
    Migration {
        verify_handles: true,
        confirm_paths: true,
        ..Default::default()
    }
}

/// The state of `src`, its queues stopped first (as QEMU does at the switch-over).
fn saved(src: &mut Daemon) -> Vec<u8> {
    src.fe.stop_queues().expect("GET_VRING_BASE on every queue");
    src.fe.save_state().expect("source state")
}

/// Stops the source, takes its state, and starts a destination daemon with `opts` on the same
/// directory, the state loaded. `Err` is the destination's refusal (CHECK_DEVICE_STATE).
fn migrate(src: &mut Daemon, opts: Options) -> (Daemon, Result<(), String>) {
    let state = saved(src);
    migrate_state(src, &state, opts)
}

fn migrate_state(src: &Daemon, state: &[u8], opts: Options) -> (Daemon, Result<(), String>) {
    let mut dst = Daemon::with(opts.share_at(&src.share).no_init());
    let loaded = dst.fe.load_state(state).map_err(|e| e.to_string());
    if let Some(i) = src.init {
        dst.c.set_init_out(i);
        dst.init = Some(i);
    }
    (dst, loaded)
}

/// The session part of a real state of `src` (its queues stopped here), to forge states with.
fn real_session(src: &mut Daemon) -> (bool, u64, u64) {
    use virtiofsd::migration::{open, Decoder};
    let real = saved(src);
    let mut d = Decoder::new(open(&real).unwrap());
    let mut s = d.section("session").unwrap();
    (s.bool("").unwrap(), s.u64("").unwrap(), s.u64("").unwrap())
}

/// A sealed state: `session`, then the file system's section as `fs` writes it.
fn forged(
    session: (bool, u64, u64),
    fs: impl FnOnce(&mut virtiofsd::migration::Encoder),
) -> Vec<u8> {
    let mut e = virtiofsd::migration::Encoder::new();
    let s = e.begin();
    e.bool(session.0);
    e.u64(session.1);
    e.u64(session.2);
    e.end(s);
    let s = e.begin();
    fs(&mut e);
    e.end(s);
    virtiofsd::migration::seal(&e.into_bytes())
}

/// The start of a forged file-system section: ids below `next`, one regular file `id` with one
/// reference, whose location follows.
fn one_node(e: &mut virtiofsd::migration::Encoder, next: u64, id: u64) {
    e.u64(next);
    e.u64(next);
    e.u32(1);
    e.u64(id);
    e.u64(1);
    e.u32(libc::S_IFREG);
}

fn source(opts: Options) -> Daemon {
    let _ = env_logger::builder().is_test(true).try_init();
    Daemon::with(opts)
}

fn names(entries: &[DirEntry]) -> Vec<Vec<u8>> {
    entries.iter().map(|e| e.name.clone()).collect()
}

/// What the guest holds before the migration, in every scenario.
struct Held {
    /// `a`, open read-write as `a_fh`.
    a: u64,
    a_fh: u64,
    /// `dir`, open as `dir_fh`, listed up to `offset` (a snapshot of 200 names).
    dir: u64,
    dir_fh: u64,
    offset: u64,
    seen: Vec<Vec<u8>>,
    /// `dir/f`, looked up only.
    f: u64,
}

fn hold(d: &mut Daemon) -> Held {
    fs::create_dir(d.host("dir")).unwrap();
    for i in 0..200 {
        fs::write(d.host(format!("dir/n{i:03}")), b"x").unwrap();
    }
    fs::write(d.host("dir/f"), b"f contents").unwrap();
    let a = d.file("a", b"0123456789");
    // As the Linux client opens: with `--cache=always` there is no OPEN (handle 0).
    let a_fh = d.c.kernel_open(a, libc::O_RDWR as u32).unwrap().unwrap().fh;
    let dir = d.node("dir");
    let f = d.c.lookup(dir, "f").unwrap().nodeid;
    let dir_fh =
        d.c.kernel_opendir(dir, libc::O_RDONLY as u32)
            .unwrap()
            .unwrap()
            .fh;
    let first = d.c.readdir(dir, dir_fh, 0, 1024).unwrap();
    assert!(!first.is_empty() && first.len() < 150, "{}", first.len());
    let offset = first.last().unwrap().off;
    Held {
        a,
        a_fh,
        dir,
        dir_fh,
        offset,
        seen: names(&first),
        f,
    }
}

/// Everything the guest held works on the destination, and new work too.
fn check_held(d: &mut Daemon, h: &Held) {
    // The open file: read, write through the handle; the host sees the bytes.
    assert_eq!(d.c.read(h.a, h.a_fh, 0, 100).unwrap(), b"0123456789");
    d.c.write(h.a, h.a_fh, 10, b"+after").unwrap();
    assert_eq!(fs::read(d.host("a")).unwrap(), b"0123456789+after");
    // The listing goes on from the offset the guest had: every name exactly once.
    let mut all = h.seen.clone();
    let mut off = h.offset;
    loop {
        let more = d.c.readdir(h.dir, h.dir_fh, off, 1024).unwrap();
        if more.is_empty() {
            break;
        }
        off = more.last().unwrap().off;
        all.extend(names(&more));
    }
    all.sort();
    let mut want: Vec<Vec<u8>> = vec![b".".to_vec(), b"..".to_vec(), b"f".to_vec()];
    want.extend((0..200).map(|i| format!("n{i:03}").into_bytes()));
    want.sort();
    assert_eq!(all, want, "listing across the migration");
    d.c.kernel_releasedir(h.dir, h.dir_fh, 0).unwrap().unwrap();
    // A node only looked up: attributes, open, read.
    let attr = d.c.getattr(h.f, None).unwrap();
    assert_eq!(attr.attr.size, 10);
    let fh =
        d.c.kernel_open(h.f, libc::O_RDONLY as u32)
            .unwrap()
            .unwrap()
            .fh;
    assert_eq!(d.c.read(h.f, fh, 0, 100).unwrap(), b"f contents");
    d.c.kernel_release(h.f, fh, 0).unwrap().unwrap();
    // New work: create in a held directory; lookups give new node ids, never a held one.
    let (e, o) =
        d.c.create(h.dir, "new", libc::O_RDWR as u32, 0o644, 0)
            .unwrap();
    assert!(![ROOT_ID, h.a, h.dir, h.f].contains(&e.nodeid));
    d.c.write(e.nodeid, o.fh, 0, b"made on the destination")
        .unwrap();
    assert_eq!(
        fs::read(d.host("dir/new")).unwrap(),
        b"made on the destination"
    );
    if h.a_fh != 0 {
        assert_ne!(o.fh, h.a_fh);
        assert_ne!(o.fh, h.dir_fh);
    }
    // Releasing the migrated handle works once.
    d.c.kernel_release(h.a, h.a_fh, 0).unwrap().unwrap();
}

fn each_mode(cache: CacheMode) {
    let mut modes = vec![("find-paths", paths()), ("find-paths checked", checked())];
    if is_root() {
        modes.push(("file-handles", handles()));
    }
    for (name, m) in modes {
        eprintln!("mode {name}, cache {cache:?}");
        let opts = Options::default().cache(cache).migration(m);
        let mut src = source(opts.clone());
        let held = hold(&mut src);
        let (mut dst, loaded) = migrate(&mut src, opts);
        loaded.unwrap_or_else(|e| panic!("{name}: load refused: {e}"));
        check_held(&mut dst, &held);
    }
}

#[test]
fn the_guest_keeps_its_nodes_handles_and_listing_in_every_mode() {
    each_mode(CacheMode::Auto);
}

#[test]
fn the_guest_keeps_its_nodes_handles_and_listing_with_cache_always() {
    each_mode(CacheMode::Always);
}

#[test]
fn handle_less_io_of_cache_always_goes_on() {
    // `--cache=always` with a guest offering no-open (and the guest's locks kept in the guest,
    // which no-open needs): files are used with handle 0.
    let opts = Options {
        posix_lock: false,
        flock: false,
        ..Options::default().cache(CacheMode::Always)
    };
    let mut src = source(opts.clone());
    let a = src.file("a", b"abc");
    let o = src.c.kernel_open(a, libc::O_RDWR as u32).unwrap().unwrap();
    assert_eq!(o.fh, 0, "no-open mode expected");
    src.c.write(a, 0, 3, b"def").unwrap();
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    assert_eq!(dst.c.read(a, 0, 0, 100).unwrap(), b"abcdef");
    dst.c.write(a, 0, 6, b"ghi").unwrap();
    assert_eq!(fs::read(dst.host("a")).unwrap(), b"abcdefghi");
}

/// A file renamed, one deleted and one replaced on the host between save and load.
struct Changed {
    moved: u64,
    gone: u64,
    replaced: u64,
    kept: u64,
}

fn change_between(src: &mut Daemon) -> (Vec<u8>, Changed) {
    let moved = src.file("moved", b"moved");
    let gone = src.file("gone", b"gone");
    let replaced = src.file("replaced", b"old");
    let kept = src.file("kept", b"kept");
    let state = saved(src);
    fs::rename(src.host("moved"), src.host("moved-away")).unwrap();
    fs::remove_file(src.host("gone")).unwrap();
    fs::remove_file(src.host("replaced")).unwrap();
    fs::write(src.host("replaced"), b"new file, same name").unwrap();
    (
        state,
        Changed {
            moved,
            gone,
            replaced,
            kept,
        },
    )
}

fn read_node(d: &mut Daemon, node: u64) -> Result<Vec<u8>, i32> {
    let fh = d.c.open(node, libc::O_RDONLY as u32)?.fh;
    let data = d.c.read(node, fh, 0, 100);
    d.c.release(node, fh, 0)?;
    data
}

#[test]
fn with_guest_error_a_file_gone_fails_alone() {
    let opts = Options::default().migration(guest_error(paths()));
    let mut src = source(opts.clone());
    let (state, c) = change_between(&mut src);
    let (mut dst, loaded) = migrate_state(&src, &state, opts);
    loaded.expect("guest-error loads whatever it finds");
    assert_eq!(dst.c.getattr(c.gone, None).unwrap_err(), libc::ESTALE);
    assert_eq!(read_node(&mut dst, c.gone).unwrap_err(), libc::ESTALE);
    // Found by its path: renamed away is gone for find-paths; the replaced name is a new file
    // of the same type, which find-paths without checks takes (the reference does the same).
    assert_eq!(dst.c.getattr(c.moved, None).unwrap_err(), libc::ESTALE);
    assert_eq!(
        read_node(&mut dst, c.replaced).unwrap(),
        b"new file, same name"
    );
    assert_eq!(read_node(&mut dst, c.kept).unwrap(), b"kept");
    // The lost node goes away when forgotten; the name can be looked up afresh.
    dst.c.forget(c.gone, 1);
    fs::write(dst.host("gone"), b"again").unwrap();
    let again = dst.node("gone");
    assert_ne!(again, c.gone);
    assert_eq!(read_node(&mut dst, again).unwrap(), b"again");
}

#[test]
fn verify_handles_refuses_a_replaced_file() {
    let m = guest_error(Migration {
        verify_handles: true,
        ..Default::default()
    });
    let opts = Options::default().migration(m);
    let mut src = source(opts.clone());
    let (state, c) = change_between(&mut src);
    let (mut dst, loaded) = migrate_state(&src, &state, opts);
    loaded.unwrap();
    assert_eq!(read_node(&mut dst, c.replaced).unwrap_err(), libc::ESTALE);
    assert_eq!(read_node(&mut dst, c.kept).unwrap(), b"kept");
}

#[test]
fn file_handles_follow_a_rename_and_refuse_a_replacement() {
    if !is_root() {
        eprintln!("skipped: open_by_handle_at needs CAP_DAC_READ_SEARCH");
        return;
    }
    let opts = Options::default().migration(guest_error(handles()));
    let mut src = source(opts.clone());
    let (state, c) = change_between(&mut src);
    let (mut dst, loaded) = migrate_state(&src, &state, opts);
    loaded.unwrap();
    assert_eq!(read_node(&mut dst, c.moved).unwrap(), b"moved");
    // A handle names the file, not the name: the node deleted or replaced on the host is its
    // old file while that still exists (here the source daemon, alive until the switch-over,
    // keeps it), else ESTALE; never the new file at its name.
    match read_node(&mut dst, c.replaced) {
        Ok(data) => assert_eq!(data, b"old"),
        Err(e) => assert_eq!(e, libc::ESTALE),
    }
    match read_node(&mut dst, c.gone) {
        Ok(data) => assert_eq!(data, b"gone"),
        Err(e) => assert_eq!(e, libc::ESTALE),
    }
    assert_eq!(read_node(&mut dst, c.kept).unwrap(), b"kept");
}

#[test]
fn with_abort_a_file_gone_fails_the_migration_and_the_destination_serves_nothing() {
    let opts = Options::default().migration(paths());
    let mut src = source(opts.clone());
    let (state, c) = change_between(&mut src);
    let (mut dst, loaded) = migrate_state(&src, &state, opts);
    assert!(loaded.is_err(), "abort loaded a state with a file gone");
    // Nothing of the state is served: the session was never taken over.
    assert!(dst.c.getattr(c.kept, None).is_err());
    assert!(dst.c.getattr(ROOT_ID, None).is_err());
}

#[test]
fn a_file_deleted_while_open_is_lost_with_find_paths_and_kept_with_file_handles() {
    // (mode, share on a file system of its own, kept)
    let mut cases = vec![(guest_error(paths()), false, false)];
    if is_root() {
        cases.push((guest_error(handles()), true, true));
        // A handle of a file with no name cannot be proven inside a share that is a directory
        // of a larger file system.
        cases.push((guest_error(handles()), false, false));
    }
    for (m, whole, kept) in cases {
        let mut opts = Options::default().migration(m);
        if whole {
            opts = opts.ext4_share();
        }
        let mut src = source(opts.clone());
        let a = src.file("tmp", b"scratch");
        let fh = src.open(a, libc::O_RDWR);
        src.c.unlink(ROOT_ID, "tmp").unwrap();
        let other = src.file("other", b"other");
        let (mut dst, loaded) = migrate(&mut src, opts.ext4_share_off());
        loaded.unwrap();
        if kept {
            assert_eq!(dst.c.read(a, fh, 0, 10).unwrap(), b"scratch");
        } else {
            assert_eq!(dst.c.read(a, fh, 0, 10).unwrap_err(), libc::EBADF, "{m:?}");
        }
        assert_eq!(read_node(&mut dst, other).unwrap(), b"other");
    }
}

#[test]
fn a_file_handle_in_a_state_cannot_reach_outside_the_shared_directory() {
    if !is_root() {
        eprintln!("skipped: open_by_handle_at needs CAP_DAC_READ_SEARCH");
        return;
    }
    let opts = Options::default().migration(guest_error(handles()));
    let mut src = source(opts.clone());
    src.file("inside", b"inside");
    let session = real_session(&mut src);
    // The real handle of outside/secret, on the same file system as the share.
    let (ty, bytes) = handle_of(&src.outside.join("secret"));
    let blob = forged(session, |e| {
        one_node(e, 100, 42);
        e.u8(2);
        e.i32(ty);
        e.bytes(&bytes);
        e.bool(false);
        e.u32(0);
    });
    let (mut dst, loaded) = migrate_state(&src, &blob, opts);
    loaded.unwrap();
    assert_eq!(read_node(&mut dst, 42).unwrap_err(), libc::ESTALE);
}

/// `name_to_handle_at` of `path`: (handle type, bytes).
fn handle_of(path: &std::path::Path) -> (i32, Vec<u8>) {
    use std::os::unix::ffi::OsStrExt;
    #[repr(C)]
    struct Raw {
        bytes: u32,
        ty: i32,
        f: [u8; 128],
    }
    let mut raw = Raw {
        bytes: 128,
        ty: 0,
        f: [0; 128],
    };
    let mut mnt = 0;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `raw` is a `struct file_handle` with 128 bytes of room, as `bytes` says; the
    // path is NUL-terminated and `mnt` a valid out-pointer.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            p.as_ptr(),
            (&mut raw as *mut Raw).cast(),
            &mut mnt,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at: {}",
        std::io::Error::last_os_error()
    );
    (raw.ty, raw.f[..raw.bytes as usize].to_vec())
}

#[test]
fn ids_a_daemon_never_gives_are_refused() {
    let opts = Options::default().migration(guest_error(paths()));
    let mut src = source(opts.clone());
    src.file("a", b"a");
    let session = real_session(&mut src);
    let state = |next: u64, node: u64, handle: Option<u64>| {
        forged(session, |e| {
            one_node(e, next, node);
            e.u8(1);
            e.u32(1);
            e.bytes(b"a");
            e.bool(false);
            match handle {
                Some(h) => {
                    e.u32(1);
                    e.u64(h);
                    e.u64(node);
                    e.i32(libc::O_RDONLY);
                    e.u8(0);
                    e.bool(false);
                }
                None => e.u32(0),
            }
        })
    };
    for (what, blob) in [
        ("next ids at the end of u64", state(u64::MAX, 5, None)),
        ("node id 0", state(10, 0, None)),
        ("node id past next", state(10, 12, None)),
        ("handle u64::MAX", state(10, 5, Some(u64::MAX))),
        ("handle 0", state(10, 5, Some(0))),
    ] {
        let (mut dst, loaded) = migrate_state(&src, &blob, opts.clone());
        assert!(loaded.is_err(), "{what}: loaded");
        assert!(dst.c.getattr(ROOT_ID, None).is_err(), "{what}: served");
    }
    // Sane ids load; the ids given later skip those restored.
    let (mut dst, loaded) = migrate_state(&src, &state(10, 5, Some(7)), opts);
    loaded.unwrap();
    assert_eq!(dst.c.read(5, 7, 0, 10).unwrap(), b"a");
    let b = dst.file("b", b"b");
    assert!(b >= 10, "new node id {b}");
    let fh = dst.open(b, libc::O_RDONLY);
    assert!(fh >= 10, "new handle {fh}");
}

#[test]
fn with_abort_a_file_deleted_while_open_fails_the_save() {
    let opts = Options::default();
    let mut src = source(opts);
    let a = src.file("tmp", b"scratch");
    let _fh = src.open(a, libc::O_RDWR);
    src.c.unlink(ROOT_ID, "tmp").unwrap();
    src.fe.stop_queues().unwrap();
    assert!(
        src.fe.save_state().is_err(),
        "the source sent a state naming a file it cannot find"
    );
}

#[test]
fn confirm_paths_finds_a_file_renamed_on_the_host_while_open() {
    let opts = Options::default().migration(checked());
    let mut src = source(opts.clone());
    let a = src.file("before", b"contents");
    let fh = src.open(a, libc::O_RDWR);
    fs::rename(src.host("before"), src.host("after")).unwrap();
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    assert_eq!(dst.c.read(a, fh, 0, 100).unwrap(), b"contents");
    dst.c.write(a, fh, 8, b"!").unwrap();
    assert_eq!(fs::read(dst.host("after")).unwrap(), b"contents!");
}

#[test]
fn the_destination_refuses_bad_states_and_serves_nothing_wrong() {
    let opts = Options::default();
    let mut src = source(opts.clone());
    let a = src.file("a", b"a");
    let state = saved(&mut src);
    let mut bad: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", state[..state.len() / 2].to_vec()),
        ("one byte short", state[..state.len() - 1].to_vec()),
        (
            "foreign",
            b"QEVM\0\0\0\x03 a QEMU stream, not ours".to_vec(),
        ),
    ];
    for at in [0, 9, 15, state.len() / 2, state.len() - 3] {
        let mut s = state.clone();
        s[at] ^= 0x5a;
        bad.push(("corrupted", s));
    }
    let mut longer = state.clone();
    longer.extend_from_slice(b"trailing");
    bad.push(("longer", longer));
    for (what, blob) in bad {
        let (mut dst, loaded) = migrate_state(&src, &blob, opts.clone());
        assert!(loaded.is_err(), "{what} state loaded");
        assert!(dst.c.getattr(a, None).is_err(), "{what}: node served");
    }
    // The good one still loads.
    let (mut dst, loaded) = migrate_state(&src, &state, opts);
    loaded.unwrap();
    assert_eq!(read_node(&mut dst, a).unwrap(), b"a");
}

#[test]
fn a_destination_with_other_options_or_a_session_refuses_the_state() {
    let opts = Options::default().cache(CacheMode::Auto);
    let mut src = source(opts.clone());
    src.file("a", b"a");
    let state = saved(&mut src);
    // Another cache mode would agree on other INIT flags than the guest has.
    let (_d, loaded) = migrate_state(&src, &state, Options::default().cache(CacheMode::Always));
    let e = loaded.unwrap_err();
    assert!(!e.is_empty());
    // A daemon that already serves a guest is not a destination.
    let mut busy = Daemon::with(Options::default().share_at(&src.share));
    assert!(busy.fe.load_state(&state).is_err());
    busy.c.getattr(ROOT_ID, None).unwrap();
}

#[test]
fn a_second_state_is_refused_and_the_first_stays_served() {
    // States of a source whose guest had not mounted yet (so the destination serves no session
    // after the first): the second claims the first's node id for another file.
    let opts = Options::default().migration(guest_error(paths()));
    let mut src = source(opts.clone());
    fs::write(src.host("a"), b"first").unwrap();
    fs::write(src.host("b"), b"other").unwrap();
    let (_, offered, agreed) = real_session(&mut src);
    let state = |name: &[u8]| {
        forged((false, offered, agreed), |e| {
            one_node(e, 100, 42);
            e.u8(1);
            e.u32(1);
            e.bytes(name);
            e.bool(false);
            e.u32(0);
        })
    };
    let mut dst = Daemon::with(opts.share_at(&src.share).no_init());
    dst.fe.load_state(&state(b"a")).unwrap();
    assert!(dst.fe.load_state(&state(b"b")).is_err(), "a second state");
    assert!(
        dst.fe.load_state(&state(b"a")).is_err(),
        "the same state twice"
    );
    // The first state's node is still served, and is still `a`.
    dst.c.init().unwrap();
    assert_eq!(read_node(&mut dst, 42).unwrap(), b"first");
}

#[test]
fn one_state_transfer_at_a_time() {
    let opts = Options::default();
    let mut src = source(opts.clone());
    let a = src.file("a", b"a");
    let state = saved(&mut src);
    let mut dst = Daemon::with(opts.share_at(&src.share).no_init());
    // A load whose pipe stays open is still reading: a second transfer is refused (not left to
    // run beside it), and the first goes on once its bytes come.
    let mut pipe = dst.fe.begin_load().unwrap();
    assert!(
        dst.fe.begin_load().is_err(),
        "second transfer while one runs"
    );
    std::io::Write::write_all(&mut pipe, &state).unwrap();
    drop(pipe);
    dst.fe.check_state().unwrap();
    dst.c.set_init_out(src.init.unwrap());
    assert_eq!(read_node(&mut dst, a).unwrap(), b"a");
}

#[test]
fn a_state_cannot_reach_outside_the_shared_directory() {
    // Made by hand, as a forger would: a path of names the decoder must refuse, and one that
    // goes through a symlink pointing outside.
    let opts = Options::default().migration(guest_error(paths()));
    let mut src = source(opts.clone());
    std::os::unix::fs::symlink(&src.outside, src.host("out")).unwrap();
    let session = real_session(&mut src);
    let state = |path: &[&[u8]]| {
        forged(session, |e| {
            one_node(e, 100, 42);
            e.u8(1);
            e.u32(path.len() as u32);
            for n in path {
                e.bytes(n);
            }
            e.bool(false);
            e.u32(0);
        })
    };
    for path in [
        &[&b".."[..], b"outside", b"secret"][..],
        &[b"out", b"secret"],
    ] {
        let (mut dst, loaded) = migrate_state(&src, &state(path), opts.clone());
        if path[0] == b".." {
            // Not a name: the decoder refuses the whole state.
            assert!(loaded.is_err());
        } else {
            // Through a symlink: the node is lost, the session goes on.
            loaded.unwrap();
            assert_eq!(read_node(&mut dst, 42).unwrap_err(), libc::ESTALE);
            dst.c.getattr(ROOT_ID, None).unwrap();
        }
        if let Ok(o) = dst.c.open(42, libc::O_RDONLY as u32) {
            let data = dst.c.read(42, o.fh, 0, 100).unwrap_or_default();
            assert_ne!(data, SECRET, "{path:?} reached the secret");
        }
    }
    assert_eq!(fs::read(src.outside.join("secret")).unwrap(), SECRET);
}

#[test]
fn dirty_log_marks_every_page_a_read_reply_filled() {
    let mut d = Daemon::start();
    // Distinct bytes everywhere, so the reply is found in guest memory by its contents.
    let data: Vec<u8> = (0..96 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let a = d.file("big", &data);
    let fh = d.open(a, libc::O_RDONLY);
    let log = d.fe.start_dirty_log().unwrap();
    log.clear().unwrap();
    let got = d.c.read(a, fh, 0, data.len() as u32).unwrap();
    assert_eq!(got, data);
    let dirty = log.dirty_pages().unwrap();
    assert!(!dirty.is_empty(), "nothing was marked");
    // Find where the reply landed: scan guest memory for the data's first 64 bytes.
    let mem = d.fe.memory().clone();
    let (base, end) = (mem.gpa_base(), mem.gpa_end());
    let mut at = None;
    let mut buf = vec![0u8; 1 << 20];
    let mut gpa = base;
    while gpa < end && at.is_none() {
        let n = ((end - gpa) as usize).min(buf.len());
        mem.read(gpa, &mut buf[..n]).unwrap();
        at = buf[..n]
            .windows(64)
            .position(|w| w == &data[..64])
            .map(|p| gpa + p as u64);
        if gpa + n as u64 >= end {
            break;
        }
        gpa += n as u64 - 64;
    }
    let at = at.expect("the reply is in guest memory");
    let mut copy = vec![0u8; data.len()];
    mem.read(at, &mut copy).unwrap();
    assert_eq!(copy, data, "the reply is contiguous in guest memory");
    for page in at / 4096..=(at + data.len() as u64 - 1) / 4096 {
        assert!(
            dirty.contains(&page),
            "guest page {page:#x} holds READ data but is not marked dirty"
        );
    }
    // The used ring was written too: some page outside the data is dirty.
    assert!(dirty
        .iter()
        .any(|p| *p < at / 4096 || *p > (at + data.len() as u64) / 4096));
    // Nothing is marked once the queues are stopped: a stop waits for the queue's pass to
    // end, with the event index it writes after the reply.
    d.fe.stop_queues().unwrap();
    log.clear().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(log.dirty_pages().unwrap().is_empty());
    let _ = fs::metadata(d.host("big")).unwrap().ino();
}

#[test]
fn id_translation_goes_on_after_the_migration() {
    if !is_root() {
        eprintln!("skipped: the translation to host ids needs to chown");
        return;
    }
    // Both daemons are started with the same mapping, as a launcher would.
    let opts = Options::default().translate_uid(&["map:0:100000:65536"]);
    let mut src = source(opts.clone());
    // The shared directory belongs to the guest's root, as the host sees it.
    std::os::unix::fs::chown(&src.share, Some(100_000), Some(0)).unwrap();
    let before = src.file("before", b"x");
    std::os::unix::fs::chown(src.host("before"), Some(100_000), Some(0)).unwrap();
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    assert_eq!(dst.c.getattr(before, None).unwrap().attr.uid, 0);
    let (e, _) = dst
        .c
        .create(ROOT_ID, "after", libc::O_RDWR as u32, 0o644, 0)
        .unwrap();
    assert_eq!(e.attr.uid, 0, "guest view");
    assert_eq!(
        fs::metadata(dst.host("after")).unwrap().uid(),
        100_000,
        "host view"
    );
}

/// The real binary, sandboxed (`--sandbox=namespace`), as a migration destination of
/// `--migration-mode=file-handles --migration-on-error=guest-error` serving `share` on a socket
/// in `dir`; the frontend connected to it.
fn sandboxed_destination(
    share: &std::path::Path,
    dir: &std::path::Path,
) -> (std::process::Child, virtiofsd_frontend::FsFrontend) {
    destination_binary(
        share,
        dir,
        &[
            "--sandbox=namespace",
            "--migration-mode=file-handles",
            "--migration-on-error=guest-error",
        ],
    )
}

/// The real binary with `args` as a migration destination serving `share` on a socket in
/// `dir`; the frontend connected to it.
fn destination_binary(
    share: &std::path::Path,
    dir: &std::path::Path,
    args: &[&str],
) -> (std::process::Child, virtiofsd_frontend::FsFrontend) {
    let socket = dir.join("dst.sock");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .args(args)
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--socket-path={}", socket.display()))
        .args([
            // The options of the in-process source.
            "--no-announce-submounts",
            "--log-level=warn",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        // A file, not a pipe: a daemon that logs much never waits for the test to read.
        .stderr(fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("start virtiofsd");
    let fe = virtiofsd_frontend::FsFrontend::connect(&socket, 1).expect("connect to the binary");
    (child, fe)
}

/// Waits for a daemon of [`destination_binary`] with `dir` to exit: its status and its log.
fn exit_of(
    child: std::process::Child,
    dir: &std::path::Path,
) -> (std::process::ExitStatus, String) {
    let (status, _) = wait_exit(child);
    (
        status,
        fs::read_to_string(dir.join("stderr")).unwrap_or_default(),
    )
}

/// The mount id of the root of process `pid` (its `/`), from the host's view of its mounts.
fn root_mount_id(pid: u32) -> String {
    let info = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    info.lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && f[4] == "/").then(|| f[0].to_owned())
        })
        .expect("a mount at /")
}

#[test]
fn a_sandboxed_destination_reads_the_hosts_mounts_never_the_shares() {
    // Once the shared directory is the sandbox's root, `/proc/self/mountinfo` by path would be
    // a file the guest writes: a forged one made a handle of a file deleted while open pass as
    // inside the share. The destination must ask the procfs it kept, and then also take such a
    // file when the share really is its file system's root.
    if !is_root() {
        eprintln!("skipped: needs root (a sandbox, an ext4 share, open_by_handle_at)");
        return;
    }
    for whole in [true, false] {
        let mut opts = Options::default().migration(guest_error(handles()));
        if whole {
            opts = opts.ext4_share();
        }
        let mut src = source(opts);
        let a = src.file("tmp", b"scratch");
        let fh = src.open(a, libc::O_RDWR);
        src.c.unlink(ROOT_ID, "tmp").unwrap();
        let state = saved(&mut src);
        let dir = tempfile::tempdir().unwrap();
        let (child, mut fe) = sandboxed_destination(&src.share, dir.path());
        if !whole {
            // What a guest could have written into the share: every mount "whole".
            let id = root_mount_id(serving_child(&child));
            let forged = format!("{id} 1 0:1 / / rw - ext4 /dev/x rw\n");
            fs::create_dir_all(src.share.join("proc/self")).unwrap();
            fs::write(src.share.join("proc/self/mountinfo"), forged.repeat(2)).unwrap();
        }
        if let Err(e) = fe.load_state(&state) {
            drop(fe);
            let (status, err) = exit_of(child, dir.path());
            panic!("the destination refused the state ({e}); it exited {status:?}: {err}");
        }
        let mut c = fe.client(0).unwrap();
        c.set_init_out(src.init.unwrap());
        let got = c.read(a, fh, 0, 10);
        if whole {
            assert_eq!(
                got.unwrap(),
                b"scratch",
                "the share is its file system's root"
            );
        } else {
            assert_eq!(
                got.unwrap_err(),
                libc::EBADF,
                "a handle proven by a forged mountinfo"
            );
        }
        fe.disconnect();
        let (status, err) = exit_of(child, dir.path());
        assert_eq!(status.code(), Some(0), "{err}");
    }
}

/// (Peak resident memory, resident memory) of process `pid`, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmHWM"), field("VmRSS"))
}

/// A forged file-system section of `nodes` nodes and `handles` handles after the ids.
fn forged_fs(
    session: (bool, u64, u64),
    next: u64,
    nodes: u32,
    node: impl Fn(&mut virtiofsd::migration::Encoder, u32),
    handles: u32,
    handle: impl Fn(&mut virtiofsd::migration::Encoder, u32),
) -> Vec<u8> {
    forged(session, |e| {
        e.u64(next);
        e.u64(next);
        e.u32(nodes);
        for i in 0..nodes {
            node(e, i);
        }
        e.u32(handles);
        for i in 0..handles {
            handle(e, i);
        }
    })
}

#[test]
fn a_forged_state_costs_the_destination_little_more_than_its_own_bytes() {
    // Each forged state is some 50 MB. It used to decode to 3.7 times its size (lost nodes) and
    // 9.6 times (deep paths) before anything was checked, and a lost node stayed as a whole
    // node: now each node is restored as it is read, a path is never copied, a lost id costs
    // a range of ids, and listings are charged to the listing budget.
    const MB: u64 = 1 << 20;
    let opts = Options::default().migration(guest_error(paths()));
    let mut src = source(opts);
    src.file("a", b"a");
    let session = real_session(&mut src);
    let lost_node = |e: &mut virtiofsd::migration::Encoder, i: u32| {
        // Every other id: no two in a row, so each is its own range.
        e.u64(2 + 2 * u64::from(i));
        e.u64(1);
        e.u32(libc::S_IFREG);
        e.u8(0);
        e.i32(libc::ENOENT);
        e.bool(false);
    };
    let deep_node = |e: &mut virtiofsd::migration::Encoder, i: u32| {
        e.u64(2 + u64::from(i));
        e.u64(1);
        e.u32(libc::S_IFREG);
        e.u8(1);
        e.u32(4096);
        for _ in 0..4096 {
            e.bytes(b"d");
        }
        e.bool(false);
    };
    let no_handle = |_: &mut virtiofsd::migration::Encoder, _: u32| {};
    let listing = |e: &mut virtiofsd::migration::Encoder, i: u32| {
        e.u64(1 + u64::from(i));
        e.u64(ROOT_ID);
        e.i32(libc::O_RDONLY);
        e.u8(2);
        e.u32(200_000);
        for j in 0..200_000u32 {
            e.u64(u64::from(j) + 1);
            e.u8(libc::DT_REG);
            e.bytes(format!("entry-{j:08}").as_bytes());
        }
        e.bool(true);
    };
    let n_lost = 2_000_000;
    let n_deep = 2_500;
    struct Case {
        what: &'static str,
        blob: Vec<u8>,
        mode: &'static str,
        loads: bool,
        /// Most the peak may grow, and the resident memory may stay grown, per byte of state.
        peak: f64,
        kept: f64,
    }
    let cases = [
        Case {
            what: "2,000,000 lost nodes, none next to another",
            blob: forged_fs(
                session,
                2 * n_lost as u64 + 2,
                n_lost,
                lost_node,
                0,
                no_handle,
            ),
            mode: "--migration-on-error=guest-error",
            loads: true,
            // The state's own bytes, then a range of ids per lost node (36 bytes, less than a
            // tenth of a node: --max-nodes bounds them).
            peak: 3.0,
            kept: 2.0,
        },
        Case {
            what: "2,500 paths 4,096 names deep (abort)",
            blob: forged_fs(session, n_deep as u64 + 2, n_deep, deep_node, 0, no_handle),
            mode: "--migration-on-error=abort",
            loads: false,
            peak: 1.5,
            kept: 0.25,
        },
        Case {
            what: "2,500 paths 4,096 names deep (guest-error)",
            blob: forged_fs(session, n_deep as u64 + 2, n_deep, deep_node, 0, no_handle),
            mode: "--migration-on-error=guest-error",
            loads: true,
            peak: 1.5,
            kept: 0.25,
        },
        Case {
            what: "listings of 200,000 entries, past the listing budget",
            blob: forged_fs(session, 2, 0, lost_node, 16, listing),
            mode: "--migration-on-error=guest-error",
            loads: false,
            peak: 1.5,
            kept: 0.25,
        },
    ];
    for case in cases {
        let dir = tempfile::tempdir().unwrap();
        let (child, mut fe) = destination_binary(
            &src.share,
            dir.path(),
            &["--sandbox=none", case.mode, "--max-nodes=4000000"],
        );
        let pid = child.id();
        let (_, before) = memory_kib(pid);
        let loaded = fe.load_state(&case.blob);
        let (peak, after) = memory_kib(pid);
        let size = case.blob.len() as f64 / 1024.0;
        eprintln!(
            "{}: state {:.1} MB; resident {before} KiB before, {after} KiB after, peak {peak} KiB",
            case.what,
            size / 1024.0
        );
        assert_eq!(loaded.is_ok(), case.loads, "{}: {loaded:?}", case.what);
        assert!(
            (peak.saturating_sub(before)) as f64 <= case.peak * size,
            "{}: the peak grew by {} KiB for a state of {size} KiB",
            case.what,
            peak - before
        );
        assert!(
            (after.saturating_sub(before)) as f64 <= case.kept * size,
            "{}: {} KiB stay for a state of {size} KiB",
            case.what,
            after - before
        );
        assert!(
            case.blob.len() as u64 > 30 * MB,
            "{}: a big state",
            case.what
        );
        fe.disconnect();
        let (status, err) = exit_of(child, dir.path());
        assert_eq!(status.code(), Some(0), "{}: {err}", case.what);
        // Lost nodes are logged a few at a time, their paths shortened.
        assert!(
            err.len() < 64 << 10,
            "{}: {} bytes of log",
            case.what,
            err.len()
        );
    }
}

#[test]
fn a_state_of_more_nodes_than_max_nodes_is_refused() {
    let opts = Options::default().migration(guest_error(paths()));
    let mut src = source(opts.clone());
    for i in 0..10 {
        src.file(&format!("f{i}"), b"x");
    }
    let state = saved(&mut src);
    // Eleven nodes with the root: refused below, taken at the limit.
    let (mut dst, loaded) = migrate_state(&src, &state, opts.clone().max_nodes(10));
    assert!(loaded.is_err(), "eleven nodes past --max-nodes=10");
    assert!(dst.c.getattr(ROOT_ID, None).is_err(), "served");
    let (mut dst, loaded) = migrate_state(&src, &state, opts.max_nodes(11));
    loaded.unwrap();
    assert!(dst.c.getattr(ROOT_ID, None).is_ok());
}

#[test]
fn ids_of_files_gone_from_the_host_stay_stale_after_the_migration() {
    // A node whose file was removed and that nothing holds is buried: its id answers ESTALE
    // until the guest forgets it. The destination takes those ids over, and gives them to no
    // new file.
    let opts = Options::default();
    let mut src = source(opts.clone());
    let kept = src.file("kept", b"kept");
    let mut gone = Vec::new();
    for i in 0..3 {
        let name = format!("gone{i}");
        gone.push(src.file(&name, b"x"));
        src.c.unlink(ROOT_ID, &name).unwrap();
    }
    for &id in &gone {
        assert_eq!(src.c.getattr(id, None).unwrap_err(), libc::ESTALE, "source");
    }
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    for &id in &gone {
        assert_eq!(dst.c.getattr(id, None).unwrap_err(), libc::ESTALE, "{id}");
    }
    assert_eq!(read_node(&mut dst, kept).unwrap(), b"kept");
    dst.c.forget(gone[1], 1);
    assert_eq!(dst.c.getattr(gone[1], None).unwrap_err(), libc::EBADF);
    assert_eq!(dst.c.getattr(gone[2], None).unwrap_err(), libc::ESTALE);
    let new = dst.file("new", b"new");
    assert!(new > *gone.iter().max().unwrap(), "new node id {new}");
}

/// The threads of process `pid` that have capability `cap` in their permitted and in their
/// effective sets, by name.
fn threads_with_cap(pid: u32, cap: u32) -> (Vec<String>, Vec<String>) {
    let (mut permitted, mut effective) = (Vec::new(), Vec::new());
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(status) = fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap()
        };
        let name = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let name = name.trim().to_owned();
        if field("CapPrm:") & (1 << cap) != 0 {
            permitted.push(name.clone());
        }
        if field("CapEff:") & (1 << cap) != 0 {
            effective.push(name);
        }
    }
    (permitted, effective)
}

/// No thread of `pid` has `cap`, in either set.
fn assert_cap_gone(pid: u32, cap: u32, what: &str) {
    let (p, e) = threads_with_cap(pid, cap);
    assert!(
        p.is_empty() && e.is_empty(),
        "{what}: threads {p:?} still have it (effective in {e:?})"
    );
}

#[test]
fn dac_read_search_is_held_by_one_thread_and_only_until_a_state_or_a_session() {
    // `--migration-mode=file-handles` needs CAP_DAC_READ_SEARCH to load a state (it opens
    // handles, which can name any file of the file system). Before, every thread kept it in
    // its effective set for the daemon's life, on a source too. Now one thread that serves no
    // request holds it, raised only while it loads, and drops it once a state was taken over
    // or the guest's session started: gone when the answer to CHECK_DEVICE_STATE, or to INIT,
    // arrives, not at some later queue event.
    if !is_root() {
        eprintln!("skipped: needs root (a sandbox, CAP_DAC_READ_SEARCH)");
        return;
    }
    const CAP_DAC_READ_SEARCH: u32 = 2;
    let opts = Options::default().migration(guest_error(handles()));
    let mut src = source(opts);
    let a = src.file("a", b"kept by handle");
    let fh = src.open(a, libc::O_RDONLY);
    let state = saved(&mut src);

    // A destination: held for the load, then gone.
    let dir = tempfile::tempdir().unwrap();
    let (child, mut fe) = sandboxed_destination(&src.share, dir.path());
    let pid = serving_child(&child);
    let (permitted, effective) = threads_with_cap(pid, CAP_DAC_READ_SEARCH);
    assert_eq!(permitted, ["virtiofsd-caps"], "before the load");
    assert!(effective.is_empty(), "effective in {effective:?}");
    fe.load_state(&state)
        .expect("the state loads with the keeper's capability");
    assert_cap_gone(pid, CAP_DAC_READ_SEARCH, "after the load");
    let mut c = fe.client(0).unwrap();
    c.set_init_out(src.init.unwrap());
    assert_eq!(c.read(a, fh, 0, 20).unwrap(), b"kept by handle");
    fe.disconnect();
    let (status, err) = exit_of(child, dir.path());
    assert_eq!(status.code(), Some(0), "{err}");

    // A daemon that serves a guest from the start (a source): gone at INIT, whether the INIT
    // is served by the queue's thread, in its polling window, or by a pool thread.
    for extra in [&[][..], &["--poll-window=10000"], &["--thread-pool-size=2"]] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--sandbox=namespace",
            "--migration-mode=file-handles",
            "--migration-on-error=guest-error",
        ];
        args.extend_from_slice(extra);
        let (child, mut fe) = destination_binary(&src.share, dir.path(), &args);
        let pid = serving_child(&child);
        assert_eq!(threads_with_cap(pid, CAP_DAC_READ_SEARCH).0.len(), 1);
        let mut c = fe.client(0).unwrap();
        // Requests before INIT (refused) open a polling window for the INIT to come in.
        for _ in 0..20 {
            assert_eq!(c.getattr(ROOT_ID, None).unwrap_err(), libc::EIO);
        }
        c.init().unwrap();
        assert_cap_gone(pid, CAP_DAC_READ_SEARCH, &format!("after INIT, {extra:?}"));
        c.getattr(ROOT_ID, None).unwrap();
        fe.disconnect();
        let (status, err) = exit_of(child, dir.path());
        assert_eq!(status.code(), Some(0), "{extra:?}: {err}");
    }
}

#[test]
fn with_polling_on_the_queues_stop_at_once_and_the_state_is_whole() {
    // A queue's thread that polls its ring holds the queue's pass open: a stop (GET_VRING_BASE)
    // must end the polling at once, not wait out the window or be refused for a request in
    // flight.
    let window = std::time::Duration::from_millis(5);
    let opts = Options::default().poll_window(window);
    let mut src = source(opts.clone());
    let held = hold(&mut src);
    // Requests right before the stop, so that the window is open when it comes.
    for _ in 0..50 {
        src.c.getattr(ROOT_ID, None).unwrap();
    }
    let t = std::time::Instant::now();
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "the switch-over took {:?}",
        t.elapsed()
    );
    check_held(&mut dst, &held);
}

/// The node ids of a chain of `depth` directories `d` the guest makes with MKDIR, top first.
fn mkdir_chain(d: &mut Daemon, depth: usize) -> Vec<u64> {
    let mut ids = Vec::with_capacity(depth);
    let mut parent = ROOT_ID;
    for _ in 0..depth {
        parent = d.c.mkdir(parent, "d", 0o755, 0).expect("MKDIR").nodeid;
        ids.push(parent);
    }
    ids
}

/// After a migration: the deepest node of a chain is served, and the guest goes on below it.
fn serves_the_bottom(dst: &mut Daemon, bottom: u64) {
    let attr = dst.c.getattr(bottom, None).expect("GETATTR at the bottom");
    assert_eq!(attr.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    let leaf = dst.c.mkdir(bottom, "leaf", 0o755, 0).expect("MKDIR").nodeid;
    let fh = dst.c.opendir(leaf, 0).expect("OPENDIR").fh;
    dst.c.releasedir(leaf, fh, 0).unwrap();
}

#[test]
fn a_deep_tree_an_honest_source_sends_is_served_on_the_destination() {
    // Nodes restored by path keep no descriptor and are reached through their parents: the
    // deepest of a chain used to be opened by a recursion one level per node, on a queue
    // worker's 2 MiB stack, which a tree as deep as a source's paths reach (/proc gives paths
    // up to PATH_MAX) overflowed: the destination aborted with every guest of it.
    let opts = Options::default();
    let mut src = source(opts.clone());
    let depth = (4000 - src.share.as_os_str().len()) / 2;
    let chain = mkdir_chain(&mut src, depth);
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    serves_the_bottom(&mut dst, *chain.last().unwrap());
    drop(dst);
    remove_chain(&src.share);
}

#[test]
fn a_guest_that_splits_ranges_of_stale_ids_stays_migratable_to_a_like_destination() {
    // Each FORGET of an id inside a range of ids of files gone splits it: 100 ranges from 200
    // files made and removed, under --max-nodes=16. They were not bounded on the source, and a
    // destination with the same limit refused the state ("more ranges than this daemon
    // holds"): the guest made its own VM impossible to migrate. Ranges count against the limit
    // with the nodes now, the oldest dropped first (their ids answer EBADF).
    let opts = Options::default().max_nodes(16);
    let mut src = source(opts.clone());
    let kept = src.file("kept", b"kept");
    let mut gone = Vec::new();
    for i in 0..200 {
        let name = format!("gone{i}");
        let id = src
            .c
            .mknod(ROOT_ID, &name, libc::S_IFREG | 0o644, 0, 0)
            .unwrap_or_else(|e| panic!("MKNOD {i}: errno {e}"))
            .nodeid;
        src.c.unlink(ROOT_ID, &name).unwrap();
        gone.push(id);
    }
    for id in gone.iter().step_by(2) {
        src.c.forget(*id, 1);
    }
    let newest = gone[199];
    assert_eq!(src.c.getattr(newest, None).unwrap_err(), libc::ESTALE);
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.expect("a destination with the source's --max-nodes takes its state");
    assert_eq!(dst.c.getattr(newest, None).unwrap_err(), libc::ESTALE);
    assert_eq!(dst.c.getattr(gone[1], None).unwrap_err(), libc::EBADF);
    assert_eq!(read_node(&mut dst, kept).unwrap(), b"kept");
}

/// Levels of the chains of the tests below: 20,000, or `CHAIN_LEVELS` (100,000 pass; the host's
/// own mkdir and rmdir of a chain cost time in proportion to its depth, minutes at 100,000).
fn chain_levels() -> u64 {
    std::env::var("CHAIN_LEVELS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// A node of a forged state located as `name` in node `parent` (`LOC_CHILD`).
fn child_node(e: &mut virtiofsd::migration::Encoder, id: u64, parent: u64, name: &[u8]) {
    e.u64(id);
    e.u64(1);
    e.u32(libc::S_IFDIR);
    e.u8(3);
    e.u64(parent);
    e.bytes(name);
    e.bool(false);
}

#[test]
fn a_forged_chain_of_any_depth_is_served_on_the_destination() {
    // A state names each node of a chain as a name in the one before (a name a level, where
    // paths cost a path a level): the destination restores it without a descriptor each, and
    // serves its bottom on a queue worker's stack.
    let levels = chain_levels();
    let opts = Options::default();
    let mut src = source(opts.clone());
    make_chain(&src.share, levels as usize);
    let session = real_session(&mut src);
    let blob = forged(session, |e| {
        e.u64(levels + 2);
        e.u64(1);
        e.u32(levels as u32);
        for level in 1..=levels {
            child_node(e, 1 + level, level, b"d");
        }
        e.u32(0);
    });
    let (mut dst, loaded) = migrate_state(&src, &blob, opts);
    loaded.unwrap();
    serves_the_bottom(&mut dst, levels + 1);
    drop(dst);
    remove_chain(&src.share);
}

#[test]
fn a_name_in_a_parent_cannot_leave_the_share_or_come_before_its_parent() {
    let opts = Options::default();
    let mut src = source(opts.clone());
    fs::create_dir(src.host("d")).unwrap();
    let session = real_session(&mut src);
    let state = |parent: u64, name: &'static [u8]| {
        forged(session, move |e| {
            e.u64(10);
            e.u64(1);
            e.u32(1);
            child_node(e, 5, parent, name);
            e.u32(0);
        })
    };
    for (parent, name, why) in [
        (ROOT_ID, &b".."[..], "a name that is not plain"),
        (ROOT_ID, &b"d/.."[..], "a name with a slash"),
        (7, &b"d"[..], "a parent not restored before"),
        (5, &b"d"[..], "itself as its parent"),
    ] {
        let (mut dst, loaded) = migrate_state(&src, &state(parent, name), opts.clone());
        assert!(loaded.is_err(), "{why}");
        assert!(dst.c.getattr(ROOT_ID, None).is_err(), "{why}: served");
    }
    let (mut dst, loaded) = migrate_state(&src, &state(ROOT_ID, b"d"), opts);
    loaded.unwrap();
    dst.c.getattr(5, None).unwrap();
}

#[test]
fn a_tree_deeper_than_a_path_can_say_migrates_a_name_a_level() {
    // /proc gives a descriptor's path up to PATH_MAX (some 2,000 levels of one-letter names),
    // and a state held paths of 4,096 names at most: a deeper tree the guest made was lost
    // (and the migration refused with --migration-on-error=abort). Past that its nodes are
    // sent as a name in their parent. 5,000 levels, or `CHAIN_LEVELS` (the source keeps a
    // descriptor per directory the guest made a name in: as many as the open-files limit).
    let levels = std::env::var("CHAIN_LEVELS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let opts = Options::default();
    let mut src = source(opts.clone());
    let chain = mkdir_chain(&mut src, levels);
    let file = src
        .c
        .mknod(chain[levels - 1], "f", libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    serves_the_bottom(&mut dst, chain[levels - 1]);
    let attr = dst.c.getattr(file.nodeid, None).unwrap();
    assert_eq!(attr.attr.mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(attr.attr.ino, file.attr.ino);
    drop(dst);
    remove_chain(&src.share);
}

#[test]
fn a_sandboxed_destination_serves_the_bottom_of_a_deep_chain() {
    // The daemon as it runs in production (sandboxed, its queue workers' stacks its own):
    // where a deep chain used to kill it with SIGSEGV, it serves the chain's bottom and exits
    // cleanly.
    if !is_root() {
        eprintln!("skipped: needs root (a sandbox)");
        return;
    }
    const LEVELS: u64 = 5_000;
    let mut src = source(Options::default());
    make_chain(&src.share, LEVELS as usize);
    let session = real_session(&mut src);
    let blob = forged(session, |e| {
        e.u64(LEVELS + 2);
        e.u64(1);
        e.u32(LEVELS as u32);
        for level in 1..=LEVELS {
            child_node(e, 1 + level, level, b"d");
        }
        e.u32(0);
    });
    let dir = tempfile::tempdir().unwrap();
    let (child, mut fe) = destination_binary(&src.share, dir.path(), &["--sandbox=namespace"]);
    if let Err(e) = fe.load_state(&blob) {
        drop(fe);
        let (status, err) = exit_of(child, dir.path());
        panic!("the destination refused the state ({e}); it exited {status:?}: {err}");
    }
    let mut c = fe.client(0).unwrap();
    c.set_init_out(src.init.unwrap());
    let attr = c.getattr(LEVELS + 1, None).expect("GETATTR at the bottom");
    assert_eq!(attr.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    c.mkdir(LEVELS + 1, "leaf", 0o755, 0)
        .expect("MKDIR at the bottom");
    fe.disconnect();
    let (status, err) = exit_of(child, dir.path());
    assert_eq!(status.code(), Some(0), "{err}");
    remove_chain(&src.share);
}

fn lk(fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> abi::LkIn {
    abi::LkIn {
        fh,
        owner,
        lk: abi::FileLock {
            start,
            end,
            typ: typ as u32,
            pid: owner as u32,
        },
        lk_flags: 0,
        padding: 0,
    }
}

fn flk(fh: u64, owner: u64, typ: i32) -> abi::LkIn {
    abi::LkIn {
        lk_flags: abi::LK_FLOCK,
        ..lk(fh, owner, typ, 0, i64::MAX as u64)
    }
}

/// Whether a host process (a new open file description) may take a write lock on
/// `start..start+len` (`F_OFD_SETLK`, dropped again at once).
fn host_may_lock(path: &std::path::Path, start: i64, len: i64) -> bool {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let fl = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    // SAFETY: `fl` lives across the call.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
}

/// Whether a host process may take an exclusive `flock` (`LOCK_NB`, dropped again at once).
fn host_may_flock(path: &std::path::Path) -> bool {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    // SAFETY: plain flock on an open descriptor.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// The guest's locks in `carried_locks`: a POSIX owner's two ranges, an OFD lock (the guest
/// names its open file as the owner) and a flock.
struct GuestLocks {
    posix: (u64, u64),
    ofd: (u64, u64),
    flock: (u64, u64),
}

const POSIX_OWNER: u64 = 0x7000;
const OFD_OWNER: u64 = 0xf11e;
const FLOCK_OWNER: u64 = 0xf10c;

fn take_guest_locks(src: &mut Daemon) -> GuestLocks {
    let a = src.file("db", b"data");
    let b = src.file("ofd", b"data");
    let f = src.file("lockfile", b"");
    let (fa, fb, ff) = (
        src.open(a, libc::O_RDWR),
        src.open(b, libc::O_RDWR),
        src.open(f, libc::O_RDONLY),
    );
    src.c
        .setlk(a, &lk(fa, POSIX_OWNER, libc::F_WRLCK, 0, 99))
        .unwrap();
    src.c
        .setlk(a, &lk(fa, POSIX_OWNER, libc::F_RDLCK, 200, 299))
        .unwrap();
    src.c
        .setlk(b, &lk(fb, OFD_OWNER, libc::F_WRLCK, 0, i64::MAX as u64))
        .unwrap();
    src.c
        .setlk(f, &flk(ff, FLOCK_OWNER, libc::F_WRLCK))
        .unwrap();
    GuestLocks {
        posix: (a, fa),
        ofd: (b, fb),
        flock: (f, ff),
    }
}

/// Whether the host can take any of the guest's locks.
fn host_takes_any(d: &Daemon) -> [bool; 4] {
    [
        host_may_lock(&d.host("db"), 0, 100),
        host_may_lock(&d.host("db"), 200, 100),
        host_may_lock(&d.host("ofd"), 0, 0),
        host_may_flock(&d.host("lockfile")),
    ]
}

/// The source holds its guest's locks while the destination loads the state; once the source
/// is gone the destination holds them (the host cannot take them), and they are the guest's to
/// drop there.
fn locks_carried(name: &str, m: Migration) {
    eprintln!("mode {name}");
    let opts = Options::default().migration(m);
    let mut src = source(opts.clone());
    let g = take_guest_locks(&mut src);
    assert_eq!(
        host_takes_any(&src),
        [false; 4],
        "{name}: held at the source"
    );
    let (mut dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap_or_else(|e| panic!("{name}: a state with locks refused: {e}"));
    // The source still holds them (its QEMU has not disconnected yet).
    assert_eq!(host_takes_any(&src), [false; 4], "{name}");
    src.fe.disconnect();
    // A request on a node waits for its hand-over: another owner of the destination's guest
    // then finds each lock held by the carried owner (its pid), not by an outsider (0).
    let (a, fa) = g.posix;
    for (start, typ) in [(0, libc::F_RDLCK), (250, libc::F_WRLCK)] {
        let got = dst
            .c
            .getlk(a, &lk(fa, 0x99, typ, start, start))
            .unwrap_or_else(|e| panic!("{name}: GETLK: errno {e}"));
        assert_ne!(got.typ, libc::F_UNLCK as u32, "{name}: range {start} free");
        assert_eq!(
            got.pid, POSIX_OWNER as u32,
            "{name}: holder of range {start}"
        );
    }
    let (b, fb) = g.ofd;
    let got = dst.c.getlk(b, &lk(fb, 0x99, libc::F_RDLCK, 0, 0)).unwrap();
    assert_eq!(got.pid, OFD_OWNER as u32, "{name}: the OFD lock's holder");
    let (f, ff) = g.flock;
    assert_eq!(
        dst.c.setlk(f, &flk(ff, 0x99, libc::F_WRLCK)),
        Err(libc::EAGAIN),
        "{name}: another owner's flock"
    );
    // The source's daemon is gone from the locks (it let them go at the disconnect): what the
    // host cannot take now, the destination holds.
    assert_eq!(
        host_takes_any(&dst),
        [false; 4],
        "{name}: held at the destination"
    );
    // Its guest's handles are whole, and its owners drop their locks there.
    assert_eq!(dst.c.read(a, fa, 0, 4).unwrap(), b"data");
    dst.c
        .setlk(a, &lk(fa, POSIX_OWNER, libc::F_UNLCK, 0, 99))
        .unwrap();
    assert_eq!(host_takes_any(&dst), [true, false, false, false], "{name}");
    dst.c.flush(a, fa, POSIX_OWNER).unwrap();
    dst.c
        .setlk(b, &lk(fb, OFD_OWNER, libc::F_UNLCK, 0, i64::MAX as u64))
        .unwrap();
    dst.c
        .setlk(f, &flk(ff, FLOCK_OWNER, libc::F_UNLCK))
        .unwrap();
    assert_eq!(host_takes_any(&dst), [true; 4], "{name}: all dropped");
}

#[test]
fn held_locks_are_carried_to_the_destination_in_every_mode() {
    let mut modes = vec![("find-paths", paths()), ("find-paths checked", checked())];
    if is_root() {
        modes.push(("file-handles", handles()));
    }
    for (name, m) in modes {
        locks_carried(name, m);
    }
}

#[test]
fn a_carried_lock_an_outsider_took_meanwhile_gives_its_handle_ebadf() {
    let opts = Options::default().migration(guest_error(Migration::default()));
    let mut src = source(opts.clone());
    let g = take_guest_locks(&mut src);
    let state = saved(&mut src);
    src.fe.disconnect();
    // Once the source let go and before the destination takes them, a host process takes the
    // flock and one of the POSIX ranges.
    let outsider = fs::File::open(src.host("lockfile")).unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        use std::os::fd::AsRawFd;
        // SAFETY: plain flock on an open descriptor.
        let r = unsafe { libc::flock(outsider.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the source never let the flock go"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let started = std::time::Instant::now();
    let (mut dst, loaded) = migrate_state(&src, &state, opts);
    loaded.expect("a lock held elsewhere at the load is handed over later, not refused");
    let (f, ff) = g.flock;
    // The hand-over of the flock is given up after its bound (20 s; the test frontend waits
    // 10 s for a reply, so the request is sent after it): then the handle the lock came
    // through gets EBADF, and the other files go on.
    std::thread::sleep(std::time::Duration::from_secs(21).saturating_sub(started.elapsed()));
    let r = dst.c.getlk(f, &lk(0, 0x99, libc::F_RDLCK, 0, 0));
    assert!(r.is_ok(), "GETLK after the hand-over: {r:?}");
    assert_eq!(
        dst.c.read(f, ff, 0, 1).err(),
        Some(libc::EBADF),
        "the lost lock's handle"
    );
    let (a, fa) = g.posix;
    assert_eq!(dst.c.read(a, fa, 0, 4).unwrap(), b"data");
    assert!(
        !host_may_lock(&dst.host("db"), 0, 100),
        "the POSIX lock was carried"
    );
    drop(outsider);
}

#[test]
fn with_abort_a_locked_file_gone_before_the_load_fails_it() {
    let opts = Options::default();
    let mut src = source(opts.clone());
    take_guest_locks(&mut src);
    let state = saved(&mut src);
    fs::remove_file(src.host("ofd")).unwrap();
    let (_dst, loaded) = migrate_state(&src, &state, opts);
    assert!(loaded.is_err(), "loaded without the OFD lock's file");
}

/// The locks section of a real state of one flock: its bytes at the end of the payload,
/// changed by `f`, resealed.
fn patched_locks(state: &[u8], f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut payload = virtiofsd::migration::open(state).unwrap().to_vec();
    // The section: its count (u32), then one record of node, owner, handle (u64 each), pid
    // (u32), writable, kind (u8 each), the flock's type (i32).
    let len = 4 + 8 * 3 + 4 + 1 + 1 + 4;
    let at = payload.len() - len;
    f(&mut payload[at..]);
    virtiofsd::migration::seal(&payload)
}

/// A real state of one flock with its record sent twice (the counts and section lengths
/// made right for it).
fn lock_twice(state: &[u8]) -> Vec<u8> {
    let mut p = virtiofsd::migration::open(state).unwrap().to_vec();
    let record = 8 * 3 + 4 + 1 + 1 + 4;
    let count = p.len() - record - 4;
    let rec = p[p.len() - record..].to_vec();
    let add = |p: &mut Vec<u8>, at: usize, n: u64| {
        let v = u64::from_le_bytes(p[at..at + 8].try_into().unwrap()) + n;
        p[at..at + 8].copy_from_slice(&v.to_le_bytes());
    };
    p[count..count + 4].copy_from_slice(&2u32.to_le_bytes());
    add(&mut p, count - 8, record as u64);
    let session = u64::from_le_bytes(p[..8].try_into().unwrap()) as usize;
    add(&mut p, 8 + session, record as u64);
    p.extend_from_slice(&rec);
    virtiofsd::migration::seal(&p)
}

/// As [`lock_twice`], the second record another owner's: two owners holding one exclusive
/// flock.
fn lock_twice_by_two_owners(state: &[u8]) -> Vec<u8> {
    let mut p = virtiofsd::migration::open(&lock_twice(state))
        .unwrap()
        .to_vec();
    let record = 8 * 3 + 4 + 1 + 1 + 4;
    let at = p.len() - record + 8;
    p[at..at + 8].copy_from_slice(&(FLOCK_OWNER + 1).to_le_bytes());
    virtiofsd::migration::seal(&p)
}

#[test]
fn a_state_of_two_owners_holding_conflicting_locks_is_refused() {
    // guest-error: no source writes such a state, so it is refused, not one of them lost.
    let opts = Options::default().migration(guest_error(Migration::default()));
    let mut src = source(opts.clone());
    let f = src.file("lockfile", b"");
    let ff = src.open(f, libc::O_RDONLY);
    src.c
        .setlk(f, &flk(ff, FLOCK_OWNER, libc::F_WRLCK))
        .unwrap();
    let state = saved(&mut src);
    let blob = lock_twice_by_two_owners(&state);
    // The source holds the flock: the first record is pending when the second is read.
    let started = std::time::Instant::now();
    let (mut dst, loaded) = migrate_state(&src, &blob, opts.clone());
    assert!(
        loaded.is_err(),
        "a state of two owners holding one exclusive flock was taken"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "the refusal waited for the hand-over"
    );
    assert!(dst.c.getattr(f, None).is_err(), "served");
    // Without the source, the first record is taken at once: the second still conflicts.
    src.fe.disconnect();
    let (_dst, loaded) = migrate_state(&src, &blob, opts);
    assert!(loaded.is_err(), "taken once the source let go");
}

#[test]
fn a_forged_locks_section_is_refused_cleanly() {
    // guest-error: a record it refuses is the state's fault, never a lock lost alone.
    let opts = Options::default().migration(guest_error(Migration::default()));
    let mut src = source(opts.clone());
    let f = src.file("lockfile", b"");
    let ff = src.open(f, libc::O_RDONLY);
    src.c
        .setlk(f, &flk(ff, FLOCK_OWNER, libc::F_WRLCK))
        .unwrap();
    let state = saved(&mut src);
    let forged = [
        (
            "absurd count",
            patched_locks(&state, |b| b[..4].copy_from_slice(&u32::MAX.to_le_bytes())),
        ),
        (
            "unknown node",
            patched_locks(&state, |b| {
                b[4..12].copy_from_slice(&(1u64 << 40).to_le_bytes())
            }),
        ),
        (
            "unknown kind",
            patched_locks(&state, |b| b[4 + 24 + 4 + 1] = 9),
        ),
        (
            "bad type",
            patched_locks(&state, |b| {
                b[4 + 24 + 4 + 2..].copy_from_slice(&77i32.to_le_bytes())
            }),
        ),
        // A record lock of 2^31 ranges, in a state far too short for them.
        (
            "absurd ranges",
            patched_locks(&state, |b| {
                b[4 + 24 + 4 + 1] = 0;
                b[4 + 24 + 4 + 2..].copy_from_slice(&(1u32 << 31).to_le_bytes());
            }),
        ),
    ];
    let forged = forged
        .into_iter()
        .chain([("an owner twice", lock_twice(&state))]);
    for (what, blob) in forged {
        let (mut dst, loaded) = migrate_state(&src, &blob, opts.clone());
        assert!(loaded.is_err(), "{what}: taken");
        assert!(dst.c.getattr(f, None).is_err(), "{what}: served");
    }
    // The real one is taken.
    src.fe.disconnect();
    let (_dst, loaded) = migrate_state(&src, &state, opts);
    loaded.unwrap();
}

#[test]
fn a_lost_lock_handle_stays_lost_after_a_second_migration() {
    let opts = Options::default().migration(guest_error(Migration::default()));
    let mut src = source(opts.clone());
    let g = take_guest_locks(&mut src);
    let state = saved(&mut src);
    src.fe.disconnect();
    // A host process takes the flock once the source let it go: its hand-over is given up.
    let outsider = fs::File::open(src.host("lockfile")).unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        use std::os::fd::AsRawFd;
        // SAFETY: plain flock on an open descriptor.
        let r = unsafe { libc::flock(outsider.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the source never let the flock go"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let started = std::time::Instant::now();
    let (mut dst, loaded) = migrate_state(&src, &state, opts.clone());
    loaded.unwrap();
    let (f, ff) = g.flock;
    std::thread::sleep(std::time::Duration::from_secs(21).saturating_sub(started.elapsed()));
    let _ = dst.c.getlk(f, &lk(0, 0x99, libc::F_RDLCK, 0, 0));
    assert_eq!(
        dst.c.read(f, ff, 0, 1).err(),
        Some(libc::EBADF),
        "first destination"
    );
    // Migrated again: the handle stays lost (it is not sent), the others go on.
    let (mut dst2, loaded) = migrate(&mut dst, opts);
    loaded.unwrap();
    assert_eq!(
        dst2.c.read(f, ff, 0, 1).err(),
        Some(libc::EBADF),
        "second destination: the lost handle works again"
    );
    let (a, fa) = g.posix;
    assert_eq!(dst2.c.read(a, fa, 0, 4).unwrap(), b"data");
    drop(outsider);
}

#[test]
fn a_refused_lock_state_leaves_no_host_lock() {
    let opts = Options::default().migration(guest_error(Migration::default()));
    let mut src = source(opts.clone());
    let f = src.file("lockfile", b"");
    let ff = src.open(f, libc::O_RDONLY);
    src.c
        .setlk(f, &flk(ff, FLOCK_OWNER, libc::F_WRLCK))
        .unwrap();
    let state = saved(&mut src);
    // The first record is adopted (pending: the source holds it), the second refuses the state.
    let blob = lock_twice(&state);
    let (dst, loaded) = migrate_state(&src, &blob, opts);
    assert!(loaded.is_err());
    // The migration failed: the guest goes on at the source, which lets its flock go; the
    // refused destination, still up, takes nothing.
    src.fe.disconnect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        host_may_flock(&src.host("lockfile")),
        "the refused destination took the flock"
    );
    drop(dst);
}

/// The `writable` byte of the last lock record of a state.
fn last_lock_writable(state: &[u8]) -> u8 {
    let p = virtiofsd::migration::open(state).unwrap();
    // node, owner, handle (u64 each), pid (u32), writable (u8), kind (u8), flock type (i32).
    p[p.len() - (1 + 1 + 4)]
}

#[test]
fn a_carried_record_is_writable_only_as_far_as_the_guests_handles() {
    let opts = Options::default();
    let mut src = source(opts.clone());
    let f = src.file("lockfile", b"");
    let ff = src.open(f, libc::O_RDONLY);
    src.c
        .setlk(f, &flk(ff, FLOCK_OWNER, libc::F_WRLCK))
        .unwrap();
    let state = saved(&mut src);
    assert_eq!(last_lock_writable(&state), 0, "read-only handle");
    // A state that says its description may write, over a read-only handle.
    let forged = patched_locks(&state, |b| b[4 + 24 + 4] = 1);
    assert_eq!(last_lock_writable(&forged), 1);
    src.fe.disconnect();
    let (mut dst, loaded) = migrate_state(&src, &forged, opts.clone());
    loaded.unwrap();
    let again = saved(&mut dst);
    assert_eq!(
        last_lock_writable(&again),
        0,
        "the destination opened the record's description read-write"
    );
}

/// A POSIX owner whose first lock came through a read-only open file and a write lock through
/// a read-write one keeps its write lock across a migration.
#[test]
fn an_owner_moved_to_a_writable_description_keeps_its_write_lock() {
    let opts = Options::default();
    let mut src = source(opts.clone());
    let a = src.file("db", b"data");
    let ro = src.open(a, libc::O_RDONLY);
    let rw = src.open(a, libc::O_RDWR);
    src.c
        .setlk(a, &lk(ro, POSIX_OWNER, libc::F_RDLCK, 0, 9))
        .unwrap();
    src.c
        .setlk(a, &lk(rw, POSIX_OWNER, libc::F_WRLCK, 20, 29))
        .unwrap();
    let (_dst, loaded) = migrate(&mut src, opts);
    loaded.unwrap();
    src.fe.disconnect();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Taken by the destination once the source let go: the host never gets it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(std::time::Instant::now() < until);
    assert!(
        !host_may_lock(&src.host("db"), 20, 10),
        "the write lock was not carried"
    );
}

/// A POSIX lock is a process's, on every file of it the process has open: when a migration
/// loses one, every handle of the file gets EBADF (which of them are the process's, the
/// daemon cannot tell).
#[test]
fn a_posix_owners_lost_lock_gives_every_handle_of_its_file_ebadf() {
    use std::os::fd::AsRawFd;
    let opts = Options::default().migration(guest_error(Migration::default()));
    let mut src = source(opts.clone());
    let a = src.file("db", b"data");
    let (fa, fa2) = (src.open(a, libc::O_RDWR), src.open(a, libc::O_RDONLY));
    src.c
        .setlk(a, &lk(fa, POSIX_OWNER, libc::F_WRLCK, 0, 99))
        .unwrap();
    // Another owner's lock on the file, an OFD one through the other handle.
    src.c
        .setlk(a, &lk(fa2, OFD_OWNER, libc::F_RDLCK, 200, 299))
        .unwrap();
    let state = saved(&mut src);
    src.fe.disconnect();
    // A host process takes the range once the source let it go: its hand-over is given up.
    let outsider = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(src.host("db"))
        .unwrap();
    let fl = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 100,
        l_pid: 0,
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // SAFETY: `fl` lives across the call.
    while unsafe { libc::fcntl(outsider.as_raw_fd(), libc::F_OFD_SETLK, &fl) } != 0 {
        assert!(
            std::time::Instant::now() < until,
            "the source never let the lock go"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let started = std::time::Instant::now();
    let (mut dst, loaded) = migrate_state(&src, &state, opts.clone());
    loaded.unwrap();
    std::thread::sleep(std::time::Duration::from_secs(21).saturating_sub(started.elapsed()));
    let _ = dst.c.getlk(a, &lk(0, 0x99, libc::F_RDLCK, 0, 0));
    assert_eq!(
        dst.c.read(a, fa, 0, 1).err(),
        Some(libc::EBADF),
        "its handle"
    );
    assert_eq!(
        dst.c.read(a, fa2, 0, 1).err(),
        Some(libc::EBADF),
        "another handle of its file"
    );
    // Migrated again: the lost handles are not sent, nor the OFD lock of one of them (no
    // RELEASE could ever end it there).
    let (_dst2, loaded) = migrate(&mut dst, opts);
    loaded.unwrap();
    dst.fe.disconnect();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !host_may_lock(&src.host("db"), 200, 100) {
        assert!(
            std::time::Instant::now() < until,
            "the lost handle's lock was carried"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(outsider);
}
