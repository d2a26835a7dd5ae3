//! Malformed input the daemon must survive: broken FUSE requests and broken descriptor chains.
//! After each, a normal LOOKUP on the same queue still succeeds and nothing on the host changed
//! (neither in the shared directory nor next to it).

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::*;
use virtiofsd::fuse::abi::{self, opcode, InHeader, Pod, ROOT_ID};
use virtiofsd_frontend::fuse_client::{build_request, cstr, parse_reply};
use virtiofsd_frontend::virtqueue::{
    RawDescriptor, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};
use virtiofsd_frontend::{Buffer, Next, RawDesc};

/// A daemon (with `opts`, short reply timeout) serving a share that holds the file `probe`;
/// returns it with a snapshot of the host taken before any malformed input.
fn setup_with(opts: Options) -> (Daemon, Snapshot) {
    let d = Daemon::with(opts);
    fs::write(d.host("probe"), b"probe").unwrap();
    let before = d.snapshot();
    (d, before)
}

fn setup() -> (Daemon, Snapshot) {
    setup_with(opts())
}

/// Default options with a 5 s reply timeout (a dead queue fails fast).
fn opts() -> Options {
    Options::default().timeout(Duration::from_secs(5))
}

/// The daemon still answers a normal LOOKUP on request queue 0 and the host is unchanged.
fn assert_survived(d: &mut Daemon, before: &Snapshot, what: &str) {
    let e =
        d.c.lookup(ROOT_ID, "probe")
            .unwrap_or_else(|e| panic!("LOOKUP after {what} failed with errno {e}"));
    assert_eq!(e.attr.ino, fs::metadata(d.host("probe")).unwrap().ino());
    assert_eq!(d.c.in_flight(), 0);
    before.assert_same(&d.snapshot(), what);
}

/// The bytes of a request with a correct header.
fn request_bytes(d: &Daemon, op: u32, nodeid: u64, args: &[&[u8]]) -> Vec<u8> {
    build_request(d.c.next_unique(), op, nodeid, d.c.ctx(), args)
}

fn lookup_bytes(d: &Daemon, name: &str) -> Vec<u8> {
    request_bytes(d, opcode::LOOKUP, ROOT_ID, &[&cstr(name.as_bytes())])
}

fn mkdir_bytes(d: &Daemon, name: &str) -> Vec<u8> {
    let arg = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    request_bytes(
        d,
        opcode::MKDIR,
        ROOT_ID,
        &[arg.as_bytes(), &cstr(name.as_bytes())],
    )
}

/// Copies `bytes` into fresh guest memory; returns the guest address.
fn put(d: &Daemon, bytes: &[u8]) -> u64 {
    let a = d.c.alloc_buffer(bytes.len().max(1) as u64).unwrap();
    d.c.memory().write(a, bytes).unwrap();
    a
}

/// Fresh guest memory filled with 0xa5.
fn room(d: &Daemon, len: usize) -> u64 {
    let a = d.c.alloc_buffer(len as u64).unwrap();
    d.c.memory().fill(a, len, 0xa5).unwrap();
    a
}

/// Submits a raw chain on request queue 0 and returns the used length.
fn run_chain(d: &mut Daemon, descs: &[RawDesc]) -> u32 {
    let t = d.c.submit_raw_chain(descs).unwrap();
    d.c.wait_completion(t)
        .unwrap_or_else(|e| panic!("raw chain {descs:?} never came back: {e}"))
        .used_len
}

fn run_indirect(d: &mut Daemon, head_flags: u16, table: &[RawDesc], len: Option<u32>) -> u32 {
    let t = d.c.submit_raw_indirect(head_flags, table, len).unwrap();
    d.c.wait_completion(t)
        .unwrap_or_else(|e| panic!("raw indirect chain {table:?} never came back: {e}"))
        .used_len
}

/// The reply the device wrote at `addr`, `used` bytes long, checked as the kernel would.
fn reply_at(d: &Daemon, addr: u64, used: u32, unique: u64) -> virtiofsd_frontend::Reply {
    let data = d.c.memory().read_vec(addr, used as usize).unwrap();
    parse_reply(&data, Some(unique), 0).expect("well-formed reply")
}

fn unique_of(req: &[u8]) -> u64 {
    InHeader::from_prefix(req).unwrap().unique
}

fn header(d: &Daemon, op: u32, nodeid: u64, len: u32) -> InHeader {
    let ctx = d.c.ctx();
    InHeader {
        len,
        opcode: op,
        unique: d.c.next_unique(),
        nodeid,
        uid: ctx.uid,
        gid: ctx.gid,
        pid: ctx.pid,
        total_extlen: 0,
        padding: 0,
    }
}

// ---- FUSE header ------------------------------------------------------------------------------

#[test]
fn header_length_larger_than_the_chain_gets_einval() {
    let (mut d, before) = setup();
    let name = cstr(b"probe");
    for len in [40 + name.len() as u32 + 1, 40 + 4096, u32::MAX] {
        let h = header(&d, opcode::LOOKUP, ROOT_ID, len);
        let r = d.c.request_with_header(h, &[&name], 256).unwrap();
        assert_eq!(r.errno(), Some(libc::EINVAL), "len {len}");
    }
    // Not executed either.
    let arg = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let dir = cstr(b"made");
    let h = header(&d, opcode::MKDIR, ROOT_ID, 40 + 8 + dir.len() as u32 + 100);
    let r =
        d.c.request_with_header(h, &[arg.as_bytes(), &dir], 256)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    assert_survived(&mut d, &before, "header len beyond the chain");
}

#[test]
fn header_length_below_the_header_size_gets_einval() {
    let (mut d, before) = setup();
    let name = cstr(b"probe");
    for len in [0, 1, 16, 39] {
        let h = header(&d, opcode::LOOKUP, ROOT_ID, len);
        let r = d.c.request_with_header(h, &[&name], 256).unwrap();
        assert_eq!(r.errno(), Some(libc::EINVAL), "len {len}");
    }
    // len 40 says "no arguments": the name is missing.
    let h = header(&d, opcode::LOOKUP, ROOT_ID, 40);
    let r = d.c.request_with_header(h, &[&name], 256).unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    assert_survived(&mut d, &before, "header len below 40");
}

#[test]
fn request_shorter_than_a_header_is_returned_without_reply() {
    let (mut d, before) = setup();
    for n in [1usize, 20, 39] {
        let c = d.c.request_raw(&[&vec![0u8; n]], 256).unwrap();
        assert_eq!(c.used_len, 0, "{n}-byte request");
    }
    assert_survived(&mut d, &before, "requests shorter than a header");
}

#[test]
fn extension_length_beyond_the_body_gets_einval() {
    let (mut d, before) = setup();
    let name = cstr(b"probe");
    let mut h = header(&d, opcode::LOOKUP, ROOT_ID, 40 + name.len() as u32);
    h.total_extlen = 100;
    let r = d.c.request_with_header(h, &[&name], 256).unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    assert_survived(&mut d, &before, "total_extlen beyond the body");
}

#[test]
fn oversized_request_body_is_refused() {
    let (mut d, before) = setup();
    let mut name = vec![b'x'; 300 << 10];
    name.push(0);
    let r = d.c.request(opcode::LOOKUP, ROOT_ID, &[&name], 256).unwrap();
    assert_eq!(r.errno(), Some(libc::E2BIG));
    let r =
        d.c.request(opcode::MKDIR, ROOT_ID, &[&[0u8; 8], &name], 256)
            .unwrap();
    assert!(r.errno().is_some());
    assert_survived(&mut d, &before, "a 300 KiB LOOKUP");
}

#[test]
fn request_before_init_gets_eio() {
    let (mut d, before) = setup_with(opts().no_init());
    assert_eq!(d.c.lookup(ROOT_ID, "probe").unwrap_err(), libc::EIO);
    assert_eq!(d.c.getattr(ROOT_ID, None).unwrap_err(), libc::EIO);
    assert_eq!(d.c.mkdir(ROOT_ID, "dir", 0o755, 0).unwrap_err(), libc::EIO);
    assert_eq!(
        d.c.create(
            ROOT_ID,
            "f",
            (libc::O_CREAT | libc::O_RDWR) as u32,
            0o644,
            0
        )
        .unwrap_err(),
        libc::EIO
    );
    assert_eq!(d.c.unlink(ROOT_ID, "probe").unwrap_err(), libc::EIO);
    assert_eq!(
        d.c.request(9999, ROOT_ID, &[], 64).unwrap().errno(),
        Some(libc::EIO)
    );
    d.c.forget(ROOT_ID, 1);
    before.assert_same(&d.snapshot(), "requests before INIT");
    d.c.init().unwrap();
    assert_survived(&mut d, &before, "requests before INIT");
}

/// Size of the argument struct an opcode starts with.
fn min_args(op: u32) -> usize {
    use std::mem::size_of;
    match op {
        opcode::GETATTR => size_of::<abi::GetattrIn>(),
        opcode::SETATTR => size_of::<abi::SetattrIn>(),
        opcode::OPEN | opcode::OPENDIR => size_of::<abi::OpenIn>(),
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS => size_of::<abi::ReadIn>(),
        opcode::WRITE => size_of::<abi::WriteIn>(),
        opcode::RELEASE | opcode::RELEASEDIR => size_of::<abi::ReleaseIn>(),
        opcode::FSYNC | opcode::FSYNCDIR => size_of::<abi::FsyncIn>(),
        opcode::FLUSH => size_of::<abi::FlushIn>(),
        opcode::INIT => size_of::<abi::InitInCompat>(),
        opcode::ACCESS => size_of::<abi::AccessIn>(),
        opcode::FALLOCATE => size_of::<abi::FallocateIn>(),
        opcode::LSEEK => size_of::<abi::LseekIn>(),
        opcode::COPY_FILE_RANGE => size_of::<abi::CopyFileRangeIn>(),
        opcode::SYNCFS => size_of::<abi::SyncfsIn>(),
        opcode::TMPFILE => size_of::<abi::CreateIn>(),
        opcode::GETXATTR | opcode::LISTXATTR => size_of::<abi::GetxattrIn>(),
        _ => 0,
    }
}

/// Whether an opcode's arguments include a name (an all-zero or all-0xff body never holds a
/// valid one).
fn takes_name(op: u32) -> bool {
    matches!(
        op,
        opcode::LOOKUP
            | opcode::SYMLINK
            | opcode::MKNOD
            | opcode::MKDIR
            | opcode::UNLINK
            | opcode::RMDIR
            | opcode::RENAME
            | opcode::RENAME2
            | opcode::LINK
            | opcode::CREATE
            | opcode::SETXATTR
            | opcode::GETXATTR
            | opcode::REMOVEXATTR
    )
}

#[test]
fn truncated_and_garbage_arguments_for_every_opcode_get_error_replies() {
    let (mut d, before) = setup();
    let probe = d.node("probe");
    let mut answered = 0;
    for op in 0..=60u32 {
        if op == opcode::DESTROY {
            continue;
        }
        for nodeid in [ROOT_ID, probe] {
            for (len, fill) in [
                (0usize, 0u8),
                (1, 0),
                (7, 0xff),
                (15, 0),
                (33, 0xff),
                (33, 0),
            ] {
                let body = vec![fill; len];
                let req = request_bytes(&d, op, nodeid, &[&body]);
                let c = d.c.request_raw(&[&req], 4096).unwrap();
                if c.used_len == 0 {
                    // Only requests that take no reply may come back empty.
                    assert!(
                        matches!(
                            op,
                            opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT
                        ),
                        "opcode {op} with {len} bytes of {fill:#x} got no reply"
                    );
                    continue;
                }
                let r = parse_reply(&c.data, Some(unique_of(&req)), op)
                    .unwrap_or_else(|e| panic!("opcode {op}, {len} bytes: {e}"));
                answered += 1;
                if len < min_args(op) || takes_name(op) {
                    assert!(
                        r.errno().is_some(),
                        "opcode {op} on node {nodeid} with {len} bytes of {fill:#x} succeeded"
                    );
                }
            }
        }
    }
    assert!(answered > 300);
    assert_survived(&mut d, &before, "truncated and garbage arguments");
}

// ---- reply buffers ----------------------------------------------------------------------------

#[test]
fn chain_without_writable_descriptors_for_a_request_that_needs_a_reply() {
    let (mut d, before) = setup();
    let req = lookup_bytes(&d, "probe");
    let c = d.c.request_raw(&[&req], 0).unwrap();
    assert_eq!(c.used_len, 0);
    let req = request_bytes(&d, opcode::GETATTR, ROOT_ID, &[&[0u8; 16]]);
    assert_eq!(d.c.request_raw(&[&req], 0).unwrap().used_len, 0);
    let req = request_bytes(&d, opcode::STATFS, ROOT_ID, &[]);
    assert_eq!(d.c.request_raw(&[&req], 0).unwrap().used_len, 0);
    assert_survived(&mut d, &before, "a chain with only readable descriptors");
}

#[test]
fn reply_buffer_too_small_for_any_reply_gets_nothing_written() {
    let (mut d, before) = setup();
    for cap in [1usize, 8, 15] {
        let req = lookup_bytes(&d, "probe");
        let ra = put(&d, &req);
        let wa = room(&d, cap);
        let used = run_chain(
            &mut d,
            &RawDesc::chain(&[
                Buffer::readable(ra, req.len() as u32),
                Buffer::writable(wa, cap as u32),
            ]),
        );
        assert_eq!(used, 0, "{cap}-byte reply buffer");
        assert!(
            d.c.memory()
                .read_vec(wa, cap)
                .unwrap()
                .iter()
                .all(|&b| b == 0xa5),
            "daemon wrote into a {cap}-byte reply buffer"
        );
    }
    // The same for an error reply (unknown name) and for READ and READDIR.
    let n = d.node("probe");
    let fh = d.open(n, libc::O_RDONLY);
    let dir = d.c.opendir(ROOT_ID, 0).unwrap().fh;
    let ri = |fh| abi::ReadIn {
        fh,
        size: 4096,
        ..Default::default()
    };
    for req in [
        lookup_bytes(&d, "missing"),
        request_bytes(&d, opcode::READ, n, &[ri(fh).as_bytes()]),
        request_bytes(&d, opcode::READDIR, ROOT_ID, &[ri(dir).as_bytes()]),
    ] {
        let c = d.c.request_raw(&[&req], 8).unwrap();
        assert_eq!(c.used_len, 0);
    }
    assert_survived(&mut d, &before, "tiny reply buffers");
}

#[test]
fn reply_buffer_with_room_for_the_header_only_gets_an_error_reply() {
    let (mut d, before) = setup();
    // LOOKUP needs 144 bytes; 16 and 100 are too small for the entry.
    for cap in [16usize, 100] {
        let req = lookup_bytes(&d, "probe");
        let c = d.c.request_raw(&[&req], cap).unwrap();
        let r = parse_reply(&c.data, Some(unique_of(&req)), opcode::LOOKUP).unwrap();
        assert!(r.errno().is_some(), "{cap}-byte buffer: {r:?}");
    }
    // READ and READDIR replies are cut to the buffer.
    let n = d.node("probe");
    let fh = d.open(n, libc::O_RDONLY);
    let ri = abi::ReadIn {
        fh,
        size: 4096,
        ..Default::default()
    };
    let req = request_bytes(&d, opcode::READ, n, &[ri.as_bytes()]);
    let c = d.c.request_raw(&[&req], 16 + 3).unwrap();
    let r = parse_reply(&c.data, Some(unique_of(&req)), opcode::READ).unwrap();
    assert_eq!(r.body, b"pro");
    let dir = d.c.opendir(ROOT_ID, 0).unwrap().fh;
    let ri = abi::ReadIn {
        fh: dir,
        size: 4096,
        ..Default::default()
    };
    let req = request_bytes(&d, opcode::READDIR, ROOT_ID, &[ri.as_bytes()]);
    let c = d.c.request_raw(&[&req], 16 + 40).unwrap();
    let r = parse_reply(&c.data, Some(unique_of(&req)), opcode::READDIR).unwrap();
    assert!(r.body.len() <= 40);
    assert_survived(
        &mut d,
        &before,
        "reply buffers with room for the header only",
    );
}

#[test]
fn lookup_whose_reply_does_not_fit_takes_no_reference() {
    let (mut d, before) = setup();
    let n = d.node("probe");
    for cap in [16usize, 100] {
        let req = lookup_bytes(&d, "probe");
        let c = d.c.request_raw(&[&req], cap).unwrap();
        let r = parse_reply(&c.data, Some(unique_of(&req)), opcode::LOOKUP).unwrap();
        assert!(r.errno().is_some());
    }
    // Without a reply the guest holds one reference (from `node` above).
    d.c.forget(n, 1);
    assert_eq!(
        d.c.getattr(n, None).map(|a| a.attr.ino),
        Err(libc::EBADF),
        "the undelivered LOOKUPs left references behind"
    );
    assert_survived(&mut d, &before, "LOOKUPs with small reply buffers");
}

// ---- descriptor chains ------------------------------------------------------------------------

#[test]
fn descriptor_loops_are_cut_short() {
    let (mut d, before) = setup();
    let req = lookup_bytes(&d, "probe");
    let ra = put(&d, &req);
    let wa = room(&d, 256);

    // readable -> writable -> back to the readable head.
    let mut descs = RawDesc::chain(&[
        Buffer::readable(ra, req.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    descs[1].flags |= VIRTQ_DESC_F_NEXT;
    descs[1].next = Next::Slot(0);
    assert_eq!(run_chain(&mut d, &descs), 0);

    // A readable descriptor pointing at itself.
    let self_loop = [RawDesc {
        addr: ra,
        len: req.len() as u32,
        flags: VIRTQ_DESC_F_NEXT,
        next: Next::Slot(0),
    }];
    assert_eq!(run_chain(&mut d, &self_loop), 0);

    // Two readable descriptors pointing at each other.
    let mut two = RawDesc::chain(&[
        Buffer::readable(ra, req.len() as u32),
        Buffer::readable(ra, req.len() as u32),
    ]);
    two[1].flags |= VIRTQ_DESC_F_NEXT;
    two[1].next = Next::Slot(0);
    assert_eq!(run_chain(&mut d, &two), 0);

    // A writable descriptor pointing at itself: at most a correct reply comes back.
    let req2 = lookup_bytes(&d, "probe");
    let ra2 = put(&d, &req2);
    let mut wloop = RawDesc::chain(&[
        Buffer::readable(ra2, req2.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    wloop[1].flags |= VIRTQ_DESC_F_NEXT;
    wloop[1].next = Next::Slot(1);
    let used = run_chain(&mut d, &wloop);
    if used != 0 {
        let r = reply_at(&d, wa, used, unique_of(&req2));
        assert_eq!(r.error, 0);
    }
    assert_survived(&mut d, &before, "descriptor loops");
}

#[test]
fn next_index_outside_the_table_ends_the_chain() {
    let (mut d, before) = setup();
    let req = lookup_bytes(&d, "probe");
    let ra = put(&d, &req);
    let wa = room(&d, 256);
    let mut descs = RawDesc::chain(&[
        Buffer::readable(ra, req.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    descs[0].next = Next::Index(9999);
    // The chain ends after the request: there is nowhere to put a reply.
    assert_eq!(run_chain(&mut d, &descs), 0);
    let mut descs = RawDesc::chain(&[
        Buffer::readable(ra, 40),
        Buffer::readable(ra + 40, req.len() as u32 - 40),
        Buffer::writable(wa, 256),
    ]);
    descs[0].next = Next::Index(d.c.queue().size());
    assert_eq!(run_chain(&mut d, &descs), 0);
    assert_survived(&mut d, &before, "a next index outside the table");
}

#[test]
fn descriptors_outside_guest_memory_are_refused_before_the_request_runs() {
    let (mut d, before) = setup();
    let mem = d.c.memory().clone();
    let end = mem.gpa_end();
    let req = mkdir_bytes(&d, "made");
    let ra = put(&d, &req);
    let wa = room(&d, 256);
    let len = req.len() as u32;

    let cases: Vec<Vec<RawDesc>> = vec![
        // Request beyond the end of guest memory.
        RawDesc::chain(&[
            Buffer::readable(end + 0x1000, len),
            Buffer::writable(wa, 256),
        ]),
        // Request below guest memory.
        RawDesc::chain(&[Buffer::readable(0, len), Buffer::writable(wa, 256)]),
        // Request straddling the end.
        RawDesc::chain(&[Buffer::readable(end - 8, len), Buffer::writable(wa, 256)]),
        // Address arithmetic that wraps around.
        RawDesc::chain(&[
            Buffer::readable(u64::MAX - 15, len),
            Buffer::writable(wa, 256),
        ]),
        // Valid request, reply buffer outside guest memory (or straddling its end).
        RawDesc::chain(&[
            Buffer::readable(ra, len),
            Buffer::writable(end + 0x1000, 256),
        ]),
        RawDesc::chain(&[Buffer::readable(ra, len), Buffer::writable(end - 8, 256)]),
        // A huge length.
        RawDesc::chain(&[Buffer::readable(ra, u32::MAX), Buffer::writable(wa, 256)]),
    ];
    for descs in cases {
        assert_eq!(run_chain(&mut d, &descs), 0, "{descs:?}");
        assert!(!d.host("made").exists(), "request ran despite {descs:?}");
    }
    assert_survived(&mut d, &before, "out-of-range descriptors");
}

#[test]
fn writable_descriptor_before_a_readable_one_is_refused() {
    let (mut d, before) = setup();
    let req = mkdir_bytes(&d, "made");
    let ra = put(&d, &req);
    let wa = room(&d, 256);
    let descs = RawDesc::chain(&[
        Buffer::writable(wa, 256),
        Buffer::readable(ra, req.len() as u32),
    ]);
    assert_eq!(run_chain(&mut d, &descs), 0);
    assert!(!d.host("made").exists());

    // Readable, writable, readable.
    let descs = RawDesc::chain(&[
        Buffer::readable(ra, 40),
        Buffer::writable(wa, 256),
        Buffer::readable(ra + 40, req.len() as u32 - 40),
    ]);
    assert_eq!(run_chain(&mut d, &descs), 0);
    assert!(!d.host("made").exists());
    assert_survived(&mut d, &before, "writable before readable");
}

#[test]
fn zero_length_descriptors_are_skipped() {
    let (mut d, before) = setup();
    let req = lookup_bytes(&d, "probe");
    let ra = put(&d, &req);
    let wa = room(&d, 256);
    let descs = RawDesc::chain(&[
        Buffer::readable(ra, 0),
        Buffer::readable(0xdead_0000_0000, 0),
        Buffer::readable(ra, req.len() as u32),
        Buffer::writable(0xdead_0000_0000, 0),
        Buffer::writable(wa, 0),
        Buffer::writable(wa, 256),
    ]);
    let used = run_chain(&mut d, &descs);
    let r = reply_at(&d, wa, used, unique_of(&req));
    assert_eq!(r.error, 0);
    let e = abi::EntryOut::from_prefix(&r.body).unwrap();
    assert_eq!(e.attr.ino, fs::metadata(d.host("probe")).unwrap().ino());

    // A chain of nothing but empty descriptors.
    let empty = RawDesc::chain(&[Buffer::readable(ra, 0), Buffer::writable(wa, 0)]);
    assert_eq!(run_chain(&mut d, &empty), 0);
    assert_survived(&mut d, &before, "zero-length descriptors");
}

#[test]
fn indirect_tables_that_point_out_of_range_are_refused() {
    let (mut d, before) = setup();
    let end = d.c.memory().gpa_end();
    let req = mkdir_bytes(&d, "made");
    let ra = put(&d, &req);
    let wa = room(&d, 256);
    let len = req.len() as u32;
    let ind = VIRTQ_DESC_F_INDIRECT;

    // Entries outside guest memory.
    let t = RawDesc::chain(&[
        Buffer::readable(end + 0x1000, len),
        Buffer::writable(wa, 256),
    ]);
    assert_eq!(run_indirect(&mut d, ind, &t, None), 0);
    let t = RawDesc::chain(&[
        Buffer::readable(ra, len),
        Buffer::writable(end + 0x1000, 256),
    ]);
    assert_eq!(run_indirect(&mut d, ind, &t, None), 0);
    // A table length that is not a whole number of descriptors, or zero.
    let t = RawDesc::chain(&[Buffer::readable(ra, len), Buffer::writable(wa, 256)]);
    assert_eq!(run_indirect(&mut d, ind, &t, Some(17)), 0);
    assert_eq!(run_indirect(&mut d, ind, &t, Some(0)), 0);
    // A table length running past the end of guest memory.
    assert_eq!(run_indirect(&mut d, ind, &t, Some(0xffff_fff0)), 0);
    // An indirect descriptor inside the table.
    let nested = [
        RawDesc {
            addr: ra,
            len: 32,
            flags: VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT,
            next: Next::Slot(1),
        },
        RawDesc::writable(wa, 256),
    ];
    assert_eq!(run_indirect(&mut d, ind, &nested, None), 0);
    assert!(!d.host("made").exists());

    // `next` outside the table: the chain ends before the reply buffer.
    let look = lookup_bytes(&d, "probe");
    let la = put(&d, &look);
    let mut t = RawDesc::chain(&[
        Buffer::readable(la, look.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    t[0].next = Next::Index(200);
    assert_eq!(run_indirect(&mut d, ind, &t, None), 0);
    // WRITE or NEXT on the head that refers to the table: the device ignores WRITE there
    // (virtio 1.2, 2.7.5.3.2); either way at most a correct reply comes back.
    let t = RawDesc::chain(&[
        Buffer::readable(la, look.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    for extra in [VIRTQ_DESC_F_WRITE, VIRTQ_DESC_F_NEXT] {
        let look = lookup_bytes(&d, "probe");
        d.c.memory().write(la, &look).unwrap();
        let used = run_indirect(&mut d, ind | extra, &t, None);
        if used != 0 {
            assert_eq!(reply_at(&d, wa, used, unique_of(&look)).error, 0);
        }
    }

    // The table itself outside guest memory, built by hand.
    {
        let q = d.c.queue();
        let slots = q.take_slots(1).unwrap();
        q.write_descriptor(
            slots[0],
            RawDescriptor {
                addr: end + 0x10_0000,
                len: 32,
                flags: VIRTQ_DESC_F_INDIRECT,
                next: 0,
            },
        )
        .unwrap();
        q.push_avail_head(slots[0], slots.clone()).unwrap();
        q.publish();
        q.notify().unwrap();
        let used = q.wait_used().unwrap();
        assert_eq!((used.id, used.len), (slots[0], 0));
    }
    assert!(!d.host("made").exists());

    // A well-formed indirect chain still works.
    let req = lookup_bytes(&d, "probe");
    let ra = put(&d, &req);
    let t = RawDesc::chain(&[
        Buffer::readable(ra, req.len() as u32),
        Buffer::writable(wa, 256),
    ]);
    let used = run_indirect(&mut d, ind, &t, None);
    assert_eq!(reply_at(&d, wa, used, unique_of(&req)).error, 0);
    assert_survived(&mut d, &before, "bad indirect tables");
}

#[test]
fn head_index_outside_the_descriptor_table_does_not_stop_the_queue() {
    let (mut d, before) = setup_with(opts().timeout(Duration::from_secs(2)));
    {
        let q = d.c.queue();
        q.push_avail_head(q.size() + 44, Vec::new()).unwrap();
        q.publish();
        q.notify().unwrap();
    }
    // The device may drop the bogus head; the next request must still be served.
    let req = lookup_bytes(&d, "probe");
    let t = d.c.submit_raw(&[&req], 256).unwrap();
    let c =
        d.c.wait_completion(t)
            .expect("queue stopped after a bad head index");
    let r = parse_reply(&c.data, Some(unique_of(&req)), opcode::LOOKUP).unwrap();
    assert_eq!(r.error, 0);
    before.assert_same(&d.snapshot(), "a head index outside the table");
}

#[test]
fn head_index_outside_the_descriptor_table_with_a_thread_pool() {
    let (mut d, before) = setup_with(opts().pool(2));
    {
        let q = d.c.queue();
        q.push_avail_head(q.size() + 44, Vec::new()).unwrap();
        q.publish();
        q.notify().unwrap();
    }
    let req = lookup_bytes(&d, "probe");
    let t = d.c.submit_raw(&[&req], 256).unwrap();
    let c = d.c.wait_completion(t).unwrap();
    let r = parse_reply(&c.data, Some(unique_of(&req)), opcode::LOOKUP).unwrap();
    assert_eq!(r.error, 0);
    before.assert_same(&d.snapshot(), "a head index outside the table");
}

// ---- arguments --------------------------------------------------------------------------------

#[test]
fn write_whose_size_exceeds_its_data_is_refused() {
    let (mut d, before) = setup();
    let n = d.node("probe");
    let fh = d.open(n, libc::O_RDWR);
    for size in [6, 4096, 1 << 20, u32::MAX] {
        let arg = abi::WriteIn {
            fh,
            size,
            ..Default::default()
        };
        assert_eq!(
            d.c.write_with(n, &arg, b"short").unwrap_err(),
            libc::EINVAL,
            "size {size}"
        );
    }
    // Header claiming more than the chain carries, too.
    let arg = abi::WriteIn {
        fh,
        size: 5,
        ..Default::default()
    };
    let h = header(&d, opcode::WRITE, n, 40 + 40 + 100);
    let r =
        d.c.request_with_header(h, &[arg.as_bytes(), b"short"], 64)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    // A WRITE too short for its own argument struct.
    let r = d.c.request(opcode::WRITE, n, &[&[0u8; 20]], 64).unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    d.c.release(n, fh, 0).unwrap();
    assert_survived(&mut d, &before, "WRITE sizes beyond the data");
}

#[test]
fn setxattr_value_size_beyond_the_request_is_refused() {
    let (mut d, before) = setup_with(opts().xattr());
    let n = d.node("probe");
    let name = cstr(b"user.attr");
    for size in [3u32, 100, 65536] {
        let arg = abi::SetxattrInCompat { size, flags: 0 };
        let r =
            d.c.request(opcode::SETXATTR, n, &[arg.as_bytes(), &name, b"xy"], 0)
                .unwrap();
        assert_eq!(r.errno(), Some(libc::EINVAL), "size {size}");
    }
    for size in [65537u32, u32::MAX] {
        let arg = abi::SetxattrInCompat { size, flags: 0 };
        let r =
            d.c.request(opcode::SETXATTR, n, &[arg.as_bytes(), &name, b"xy"], 0)
                .unwrap();
        assert!(r.errno().is_some(), "size {size}");
    }
    // Name without its NUL.
    let arg = abi::SetxattrInCompat { size: 2, flags: 0 };
    let r =
        d.c.request(opcode::SETXATTR, n, &[arg.as_bytes(), b"user.attr"], 0)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    assert_eq!(host_getxattr(&d.host("probe"), b"user.attr"), None);
    // GETXATTR asking for 4 GiB gets at most what fits.
    let g = abi::GetxattrIn {
        size: u32::MAX,
        padding: 0,
    };
    let r =
        d.c.request(opcode::GETXATTR, n, &[g.as_bytes(), &name], 4096)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::ENODATA));
    assert_survived(&mut d, &before, "SETXATTR sizes beyond the value");
}

#[test]
fn batch_forget_with_a_count_beyond_its_entries_is_ignored() {
    let (mut d, before) = setup();
    let n = d.node("probe");
    for count in [u32::MAX, 2, 0x1000_0000] {
        let head = abi::BatchForgetIn { count, dummy: 0 };
        let one = abi::ForgetOne {
            nodeid: n,
            nlookup: 1,
        };
        let r =
            d.c.request(
                opcode::BATCH_FORGET,
                0,
                &[head.as_bytes(), one.as_bytes()],
                0,
            )
            .unwrap();
        assert_eq!(r.error, 0);
    }
    // A trailing partial entry.
    let head = abi::BatchForgetIn { count: 1, dummy: 0 };
    d.c.request(
        opcode::BATCH_FORGET,
        0,
        &[head.as_bytes(), &n.to_le_bytes()],
        0,
    )
    .unwrap();
    // The reference from the LOOKUP above is still there.
    assert_eq!(d.c.getattr(n, None).unwrap().attr.size, 5);
    assert_survived(&mut d, &before, "BATCH_FORGET with a huge count");
}

#[test]
fn names_without_a_nul_are_refused() {
    let (mut d, before) = setup();
    let r =
        d.c.request(opcode::LOOKUP, ROOT_ID, &[b"probe"], 256)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    let mk = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let r =
        d.c.request(opcode::MKDIR, ROOT_ID, &[mk.as_bytes(), b"made"], 256)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    // SYMLINK with a terminated name but an unterminated target.
    let r =
        d.c.request(opcode::SYMLINK, ROOT_ID, &[b"made\0", b"/etc/passwd"], 256)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    // RENAME whose new name lacks its NUL.
    let rn = abi::RenameIn { newdir: ROOT_ID };
    let r =
        d.c.request(
            opcode::RENAME,
            ROOT_ID,
            &[rn.as_bytes(), b"probe\0", b"moved"],
            0,
        )
        .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    let cr = abi::CreateIn {
        flags: (libc::O_CREAT | libc::O_RDWR) as u32,
        mode: 0o644,
        umask: 0,
        open_flags: 0,
    };
    let r =
        d.c.request(opcode::CREATE, ROOT_ID, &[cr.as_bytes(), b"made"], 256)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    let r =
        d.c.request(opcode::UNLINK, ROOT_ID, &[b"probe"], 0)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    assert_survived(&mut d, &before, "names without NUL");
}

#[test]
fn names_with_a_slash_or_dots_are_refused_by_every_call_that_takes_a_name() {
    let (mut d, _) = setup();
    fs::create_dir(d.host("sub")).unwrap();
    let before = d.snapshot();
    let probe = d.node("probe");
    let rw = (libc::O_CREAT | libc::O_RDWR) as u32;
    for bad in ["../escape", "sub/x", "/abs", "../outside/secret", "a/"] {
        assert_eq!(d.c.lookup(ROOT_ID, bad).unwrap_err(), libc::EINVAL, "{bad}");
        assert_eq!(
            d.c.mkdir(ROOT_ID, bad, 0o755, 0).unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(
            d.c.create(ROOT_ID, bad, rw, 0o644, 0).unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(
            d.c.mknod(ROOT_ID, bad, libc::S_IFIFO | 0o644, 0, 0)
                .unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(
            d.c.symlink(ROOT_ID, bad, "/etc/passwd").unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(
            d.c.link(probe, ROOT_ID, bad).unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(d.c.unlink(ROOT_ID, bad).unwrap_err(), libc::EINVAL, "{bad}");
        assert_eq!(d.c.rmdir(ROOT_ID, bad).unwrap_err(), libc::EINVAL, "{bad}");
        assert_eq!(
            d.c.rename(ROOT_ID, "probe", ROOT_ID, bad).unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(
            d.c.rename(ROOT_ID, bad, ROOT_ID, "moved").unwrap_err(),
            libc::EINVAL,
            "{bad}"
        );
    }
    // "." and ".." cannot be created, removed or moved; nor can the empty name.
    for bad in [".", "..", ""] {
        assert!(d.c.mkdir(ROOT_ID, bad, 0o755, 0).is_err(), "mkdir {bad:?}");
        assert!(
            d.c.create(ROOT_ID, bad, rw, 0o644, 0).is_err(),
            "create {bad:?}"
        );
        assert!(d.c.unlink(ROOT_ID, bad).is_err(), "unlink {bad:?}");
        assert!(d.c.rmdir(ROOT_ID, bad).is_err(), "rmdir {bad:?}");
        assert!(d.c.link(probe, ROOT_ID, bad).is_err(), "link {bad:?}");
        assert!(
            d.c.rename(ROOT_ID, "probe", ROOT_ID, bad).is_err(),
            "rename to {bad:?}"
        );
        assert!(d.c.symlink(ROOT_ID, bad, "x").is_err(), "symlink {bad:?}");
    }
    let sub = d.node("sub");
    assert!(d.c.rename(sub, "..", ROOT_ID, "moved").is_err());
    assert!(d.c.rmdir(sub, "..").is_err());
    assert_survived(&mut d, &before, "names with '/' or dots");
}

#[test]
fn read_and_write_with_extreme_sizes_and_offsets_get_error_replies() {
    let (mut d, before) = setup();
    let n = d.node("probe");
    let fh = d.open(n, libc::O_RDWR);

    // READ of u32::MAX bytes with a 4 KiB reply buffer: what the file has, cut to the buffer.
    let ri = |offset: u64, size: u32| abi::ReadIn {
        fh,
        offset,
        size,
        ..Default::default()
    };
    let r =
        d.c.request(opcode::READ, n, &[ri(0, u32::MAX).as_bytes()], 4096)
            .unwrap();
    assert_eq!(r.into_result().unwrap(), b"probe");
    let r =
        d.c.request(opcode::READ, n, &[ri(u64::MAX, 4096).as_bytes()], 4096)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    let r =
        d.c.request(opcode::READ, n, &[ri(1 << 63, 4096).as_bytes()], 4096)
            .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));
    let r =
        d.c.request(
            opcode::READ,
            n,
            &[ri(i64::MAX as u64, 4096).as_bytes()],
            4096,
        )
        .unwrap();
    // pread(2) there either reports end of file or refuses the range.
    match r.into_result() {
        Ok(b) => assert!(b.is_empty(), "{} bytes read at i64::MAX", b.len()),
        Err(e) => assert_eq!(e, libc::EINVAL),
    }
    let r =
        d.c.request(
            opcode::READ,
            n,
            &[ri(u64::MAX - 2, u32::MAX).as_bytes()],
            4096,
        )
        .unwrap();
    assert_eq!(r.errno(), Some(libc::EINVAL));

    // WRITE at offsets near the top of the range.
    for offset in [
        u64::MAX,
        u64::MAX - 3,
        1 << 63,
        i64::MAX as u64,
        i64::MAX as u64 - 2,
    ] {
        let arg = abi::WriteIn {
            fh,
            offset,
            size: 4,
            ..Default::default()
        };
        let e = d.c.write_with(n, &arg, b"evil").unwrap_err();
        assert!(
            matches!(e, libc::EINVAL | libc::EFBIG),
            "offset {offset:#x}: errno {e}"
        );
    }
    // A WRITE of zero bytes is fine.
    assert_eq!(d.c.write(n, fh, 0, b"").unwrap(), 0);

    // Other offsets and lengths near the limits.
    assert_eq!(
        d.c.lseek(n, fh, u64::MAX, libc::SEEK_SET as u32)
            .unwrap_err(),
        libc::EINVAL
    );
    assert_eq!(
        d.c.lseek(n, fh, i64::MAX as u64, libc::SEEK_DATA as u32)
            .unwrap_err(),
        libc::ENXIO
    );
    for (off, len) in [
        (u64::MAX, 1),
        (0, u64::MAX),
        (i64::MAX as u64, i64::MAX as u64),
    ] {
        let e = d.c.fallocate(n, fh, off, len, 0).unwrap_err();
        assert!(
            matches!(e, libc::EINVAL | libc::EFBIG),
            "fallocate {off:#x}+{len:#x}: {e}"
        );
    }
    let mut s = setattr_in(abi::fattr::SIZE);
    s.size = u64::MAX;
    let e = d.c.setattr(n, &s).unwrap_err();
    assert!(
        matches!(e, libc::EINVAL | libc::EFBIG),
        "truncate to u64::MAX: {e}"
    );
    let cfr = abi::CopyFileRangeIn {
        fh_in: fh,
        off_in: u64::MAX,
        nodeid_out: n,
        fh_out: fh,
        off_out: 0,
        len: 10,
        flags: 0,
    };
    assert_eq!(d.c.copy_file_range(n, &cfr).unwrap_err(), libc::EINVAL);
    let cfr = abi::CopyFileRangeIn {
        off_in: 0,
        off_out: u64::MAX - 1,
        ..cfr
    };
    assert_eq!(d.c.copy_file_range(n, &cfr).unwrap_err(), libc::EINVAL);

    // READDIR far past the end, and asking for 4 GiB with a small buffer.
    let dir = d.c.opendir(ROOT_ID, 0).unwrap().fh;
    assert!(d
        .c
        .readdir(ROOT_ID, dir, u64::MAX, 4096)
        .unwrap()
        .is_empty());
    let rd = abi::ReadIn {
        fh: dir,
        size: u32::MAX,
        ..Default::default()
    };
    let r =
        d.c.request(opcode::READDIR, ROOT_ID, &[rd.as_bytes()], 4096)
            .unwrap();
    assert!(r.into_result().unwrap().len() <= 4096);
    d.c.releasedir(ROOT_ID, dir, 0).unwrap();
    d.c.release(n, fh, 0).unwrap();
    assert_survived(&mut d, &before, "extreme sizes and offsets");
}

// ---- The log ----------------------------------------------------------------------------------

#[test]
fn a_flood_of_bad_chains_logs_a_few_lines_at_the_default_level() {
    // Each refused chain used to log a warning: a guest could write tens of thousands of
    // lines a second into the host's log. The daemon binary at its default level, its stderr
    // read back.
    const CHAINS: usize = 1000;
    let dirs = run_dirs();
    let tmp = tempfile::tempdir().unwrap();
    let err_path = tmp.path().join("stderr");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_virtiofsd"))
        .arg(format!("--shared-dir={}", dirs.share.display()))
        .arg(format!("--socket-path={}", dirs.socket.display()))
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        // A file, not a pipe: the old daemon's flood never waits for the test to read it.
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("start virtiofsd");
    let mut fe = virtiofsd_frontend::FsFrontend::connect(&dirs.socket, 1).expect("connect");
    let mut c = fe.client(0).unwrap();
    c.init().unwrap();
    let wa = c.alloc_buffer(256).unwrap();
    let beyond = c.memory().gpa_end() + 0x1000;
    let bad = RawDesc::chain(&[Buffer::readable(beyond, 64), Buffer::writable(wa, 256)]);
    let start = std::time::Instant::now();
    for _ in 0..CHAINS {
        let t = c.submit_raw_chain(&bad).unwrap();
        assert_eq!(c.wait_completion(t).unwrap().used_len, 0);
    }
    let elapsed = start.elapsed();
    c.getattr(ROOT_ID, None).expect("still serving");
    fe.disconnect();
    let (status, _) = wait_exit(child);
    assert!(status.success(), "{status:?}");

    let log = fs::read_to_string(&err_path).unwrap();
    let refused = log
        .lines()
        .filter(|l| l.contains("descriptor chain") && l.contains("refused"))
        .count();
    // Ten a window of five seconds, whatever this machine's speed; one window more for the
    // one the flood began in.
    let windows = elapsed.as_secs() / 5 + 2;
    assert!(refused >= 1, "the refusals are not logged at all:\n{log}");
    assert!(
        refused as u64 <= 10 * windows,
        "{refused} lines for {CHAINS} bad chains in {elapsed:?}"
    );
}
