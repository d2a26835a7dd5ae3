//! FUSE requests over one virtio-fs queue, laid out as the Linux virtio-fs driver lays them out.
//!
//! A [`FuseClient`] owns a [`Virtqueue`] and a buffer [`Arena`] in guest memory. Each request
//! is `fuse_in_header` + arguments in device-readable buffers, followed (unless the opcode gets
//! no reply, like FORGET) by device-writable room for `fuse_out_header` + the reply body. How
//! those bytes are cut into descriptors is chosen by [`SgLayout`]; chains can also go through an
//! indirect table. Replies are checked the way the kernel checks them: used length equals
//! `out.len`, `unique` matches, `error` is 0 or a negative errno (and then comes without body).
//!
//! Three levels of API:
//! - typed helpers ([`FuseClient::lookup`], [`FuseClient::read`], ...) returning
//!   `Result<T, i32>` with the positive errno, so tests write
//!   `assert_eq!(c.lookup(ROOT_ID, "x").unwrap_err(), libc::ENOENT)`. They **panic** on
//!   transport or protocol failures (timeouts, malformed replies): those are test failures, not
//!   FUSE errors;
//! - [`FuseClient::request`] and friends returning a parsed [`Reply`] or an [`Error`], plus
//!   [`FuseClient::submit`]/[`FuseClient::complete`]/[`FuseClient::wait`] for pipelining;
//! - raw submissions (arbitrary bytes, arbitrary descriptor chains) for robustness tests.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::error::{Error, FuseResult, Result};
use super::memory::{Arena, GuestMemory};
use super::virtqueue::{Buffer, RawDesc, UsedElem, Virtqueue};
use virtiofs_fuse::abi::{self, opcode, InHeader, OutHeader, Pod};

/// Step between request ids, as in Linux (the low bit marks interrupts).
pub const UNIQUE_STEP: u64 = 2;
/// `max_readahead` a 6.x kernel sends in FUSE_INIT (128 KiB).
pub const DEFAULT_MAX_READAHEAD: u32 = 128 << 10;
/// Minor version sent by [`FuseClient::init`] (Linux 6.x).
pub const INIT_MINOR: u32 = 38;
/// Minor version sent by [`FuseClient::init_compat`] (Linux 5.4).
pub const INIT_COMPAT_MINOR: u32 = 31;
/// Reply room for FUSE_READLINK and the like (a page, like the kernel).
pub const PAGE_SIZE: usize = 4096;
/// Longest name the kernel accepts in a directory entry.
pub const FUSE_NAME_MAX: usize = 1024;

// INIT flags missing from `abi::init` (the daemon does not implement them, the kernel sends them).
const SPLICE_WRITE: u64 = 1 << 7;
const SPLICE_MOVE: u64 = 1 << 8;
const SPLICE_READ: u64 = 1 << 9;
const HAS_IOCTL_DIR: u64 = 1 << 11;
const HAS_EXPIRE_ONLY: u64 = 1 << 35;
const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;

/// INIT flags of a Linux 5.4 virtio-fs mount (protocol 7.31, 32 bits only).
pub const LINUX_5_4_INIT_FLAGS: u64 = abi::init::ASYNC_READ
    | abi::init::POSIX_LOCKS
    | abi::init::ATOMIC_O_TRUNC
    | abi::init::EXPORT_SUPPORT
    | abi::init::BIG_WRITES
    | abi::init::DONT_MASK
    | SPLICE_WRITE
    | SPLICE_MOVE
    | SPLICE_READ
    | abi::init::FLOCK_LOCKS
    | HAS_IOCTL_DIR
    | abi::init::AUTO_INVAL_DATA
    | abi::init::DO_READDIRPLUS
    | abi::init::READDIRPLUS_AUTO
    | abi::init::ASYNC_DIO
    | abi::init::WRITEBACK_CACHE
    | abi::init::NO_OPEN_SUPPORT
    | abi::init::PARALLEL_DIROPS
    | abi::init::HANDLE_KILLPRIV
    | abi::init::POSIX_ACL
    | abi::init::ABORT_ERROR
    | abi::init::MAX_PAGES
    | abi::init::CACHE_SYMLINKS
    | abi::init::NO_OPENDIR_SUPPORT
    | abi::init::EXPLICIT_INVAL_DATA;

/// INIT flags of a Linux 6.x virtio-fs mount (protocol 7.38, with `INIT_EXT` and `flags2`).
/// `SECURITY_CTX` and `CREATE_SUPP_GROUP` are left out: they make the kernel append request
/// extensions this client does not build.
pub const DEFAULT_INIT_FLAGS: u64 = LINUX_5_4_INIT_FLAGS
    | abi::init::SUBMOUNTS
    | abi::init::HANDLE_KILLPRIV_V2
    | abi::init::SETXATTR_EXT
    | abi::init::INIT_EXT
    | HAS_EXPIRE_ONLY
    | DIRECT_IO_ALLOW_MMAP;

/// How a request's bytes are cut into descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SgLayout {
    /// Like the Linux driver: `fuse_in_header`, then one descriptor per argument; writable
    /// `fuse_out_header`, then one descriptor for the body.
    #[default]
    PerArg,
    /// One readable and one writable descriptor.
    Contiguous,
    /// Readable and writable bytes each cut into descriptors of at most this many bytes
    /// (headers and structs straddle descriptor boundaries).
    Chunked(usize),
}

/// Credentials sent in `fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Ctx {
    /// The credentials of this process (what a guest process with the same ids would send).
    pub fn current() -> Self {
        Ctx {
            // SAFETY: geteuid/getegid cannot fail and have no preconditions.
            uid: unsafe { libc::geteuid() },
            // SAFETY: as above.
            gid: unsafe { libc::getegid() },
            pid: std::process::id(),
        }
    }
}

/// What kind of answer a submission expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TicketKind {
    /// A FUSE request that gets a reply.
    Reply,
    /// A FUSE request that gets no reply (FORGET, BATCH_FORGET): readable buffers only, returned
    /// with used length 0.
    NoReply,
    /// Raw bytes or a raw chain: nothing is checked.
    Raw,
}

/// Handle of a submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket {
    seq: u64,
    /// `unique` of the request (0 for raw submissions).
    pub unique: u64,
    /// Opcode of the request (0 for raw submissions).
    pub opcode: u32,
    /// What kind of answer is expected.
    pub kind: TicketKind,
}

/// A used chain: what the device returned, unparsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub ticket: Ticket,
    /// Used length reported by the device.
    pub used_len: u32,
    /// The first `used_len` bytes of the writable area (empty for raw chains, whose buffers the
    /// test owns).
    pub data: Vec<u8>,
}

impl Completion {
    /// Parses and checks the reply according to the ticket's kind.
    pub fn into_reply(self) -> Result<Reply> {
        match self.ticket.kind {
            TicketKind::NoReply => {
                if self.used_len != 0 {
                    return Err(Error::Protocol(format!(
                        "{} (unique {}) has no reply but came back with used length {}",
                        opcode_name(self.ticket.opcode),
                        self.ticket.unique,
                        self.used_len
                    )));
                }
                Ok(Reply {
                    unique: self.ticket.unique,
                    error: 0,
                    body: Vec::new(),
                })
            }
            TicketKind::Reply => {
                parse_reply(&self.data, Some(self.ticket.unique), self.ticket.opcode)
            }
            TicketKind::Raw => parse_reply(&self.data, None, 0),
        }
    }
}

/// A FUSE reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// `fuse_out_header.unique`.
    pub unique: u64,
    /// `fuse_out_header.error` as sent: 0 or a *negative* errno.
    pub error: i32,
    /// Everything after `fuse_out_header`.
    pub body: Vec<u8>,
}

impl Reply {
    /// The positive errno, if the reply is an error.
    pub fn errno(&self) -> Option<i32> {
        (self.error != 0).then_some(-self.error)
    }

    /// The body, or the positive errno.
    pub fn into_result(self) -> std::result::Result<Vec<u8>, i32> {
        match self.errno() {
            Some(e) => Err(e),
            None => Ok(self.body),
        }
    }
}

/// Checks a reply as the kernel would and splits it into header fields and body.
/// `expected_unique` is checked when given; `op` only decorates messages.
pub fn parse_reply(data: &[u8], expected_unique: Option<u64>, op: u32) -> Result<Reply> {
    let what = || {
        if op == 0 {
            "raw request".to_string()
        } else {
            opcode_name(op).to_string()
        }
    };
    let oh = OutHeader::from_prefix(data).ok_or_else(|| {
        Error::Protocol(format!(
            "{}: reply of {} bytes is shorter than fuse_out_header",
            what(),
            data.len()
        ))
    })?;
    if oh.len as usize != data.len() {
        return Err(Error::Protocol(format!(
            "{}: fuse_out_header.len is {} but the device wrote {} bytes",
            what(),
            oh.len,
            data.len()
        )));
    }
    if let Some(u) = expected_unique {
        if oh.unique != u {
            return Err(Error::Protocol(format!(
                "{}: reply unique {} does not match request unique {u}",
                what(),
                oh.unique
            )));
        }
    }
    if oh.error > 0 || oh.error <= -512 {
        return Err(Error::Protocol(format!(
            "{}: fuse_out_header.error {} is not 0 or a negative errno",
            what(),
            oh.error
        )));
    }
    if oh.error != 0 && data.len() != std::mem::size_of::<OutHeader>() {
        return Err(Error::Protocol(format!(
            "{}: error reply ({}) carries a {}-byte body",
            what(),
            oh.error,
            data.len() - std::mem::size_of::<OutHeader>()
        )));
    }
    Ok(Reply {
        unique: oh.unique,
        error: oh.error,
        body: data[std::mem::size_of::<OutHeader>()..].to_vec(),
    })
}

/// The `fuse_in_header` of a request with arguments `args`: `len` covers them, no extensions.
pub fn request_header(unique: u64, opcode: u32, nodeid: u64, ctx: Ctx, args: &[&[u8]]) -> InHeader {
    let body: usize = args.iter().map(|a| a.len()).sum();
    InHeader {
        len: (std::mem::size_of::<InHeader>() + body) as u32,
        opcode,
        unique,
        nodeid,
        uid: ctx.uid,
        gid: ctx.gid,
        pid: ctx.pid,
        total_extlen: 0,
        padding: 0,
    }
}

/// Builds the readable bytes of a request: `fuse_in_header` (with `len` covering the arguments)
/// followed by the arguments.
pub fn build_request(unique: u64, opcode: u32, nodeid: u64, ctx: Ctx, args: &[&[u8]]) -> Vec<u8> {
    let hdr = request_header(unique, opcode, nodeid, ctx, args);
    let mut v = Vec::with_capacity(hdr.len as usize);
    v.extend_from_slice(hdr.as_bytes());
    for a in args {
        v.extend_from_slice(a);
    }
    v
}

/// A security context request extension as Linux builds it (`FUSE_SECURITY_CTX`): header with
/// the count 1 as type, `fuse_secctx`, the name with its NUL, the value, padded to 8 bytes.
pub fn secctx_extension(name: &[u8], value: &[u8]) -> Vec<u8> {
    let len = 8 + 8 + name.len() + 1 + value.len();
    let size = len.div_ceil(8) * 8;
    let mut ext = Vec::with_capacity(size);
    ext.extend_from_slice(&(size as u32).to_le_bytes());
    ext.extend_from_slice(&1u32.to_le_bytes());
    ext.extend_from_slice(&(value.len() as u32).to_le_bytes());
    ext.extend_from_slice(&0u32.to_le_bytes());
    ext.extend_from_slice(name);
    ext.push(0);
    ext.extend_from_slice(value);
    ext.resize(size, 0);
    ext
}

/// `name` followed by a NUL byte, as the kernel sends names.
pub fn cstr(name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(name.len() + 1);
    v.extend_from_slice(name);
    v.push(0);
    v
}

/// One `fuse_dirent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// Offset of the *next* entry.
    pub off: u64,
    /// `DT_*` type.
    pub typ: u32,
    pub name: Vec<u8>,
}

/// One `fuse_direntplus`.
#[derive(Debug, Clone)]
pub struct DirEntryPlus {
    pub entry: abi::EntryOut,
    pub dirent: DirEntry,
}

fn parse_one_dirent(buf: &[u8]) -> std::result::Result<(DirEntry, usize), String> {
    let d = abi::Dirent::from_prefix(buf)
        .ok_or_else(|| format!("{} trailing bytes are not a fuse_dirent", buf.len()))?;
    let namelen = d.namelen as usize;
    if namelen == 0 || namelen > FUSE_NAME_MAX {
        return Err(format!("dirent name length {namelen}"));
    }
    let size = abi::dirent_size(namelen);
    if buf.len() < size {
        return Err(format!(
            "dirent of {size} bytes (name length {namelen}) truncated to {}",
            buf.len()
        ));
    }
    let hdr = std::mem::size_of::<abi::Dirent>();
    let name = buf[hdr..hdr + namelen].to_vec();
    if name.contains(&b'/') || name.contains(&0) {
        return Err(format!("dirent name {name:?} contains '/' or NUL"));
    }
    Ok((
        DirEntry {
            ino: d.ino,
            off: d.off,
            typ: d.typ,
            name,
        },
        size,
    ))
}

/// Parses a READDIR reply body. Fails on any malformed or partial record.
pub fn parse_dirents(mut buf: &[u8]) -> std::result::Result<Vec<DirEntry>, String> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (e, size) = parse_one_dirent(buf)?;
        out.push(e);
        buf = &buf[size..];
    }
    Ok(out)
}

/// Parses a READDIRPLUS reply body. Fails on any malformed or partial record.
pub fn parse_direntplus(mut buf: &[u8]) -> std::result::Result<Vec<DirEntryPlus>, String> {
    let mut out = Vec::new();
    let es = std::mem::size_of::<abi::EntryOut>();
    while !buf.is_empty() {
        let entry = abi::EntryOut::from_prefix(buf)
            .ok_or_else(|| format!("{} trailing bytes are not a fuse_direntplus", buf.len()))?;
        let (dirent, size) = parse_one_dirent(&buf[es..])?;
        out.push(DirEntryPlus { entry, dirent });
        buf = &buf[es + size..];
    }
    Ok(out)
}

/// Answer of GETXATTR/LISTXATTR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrReply {
    /// Size probe (request size 0): the size of the value/list.
    Size(u32),
    /// The value/list.
    Data(Vec<u8>),
}

/// Name of an opcode, for messages.
pub fn opcode_name(op: u32) -> &'static str {
    abi::Opcode::try_from(op).map_or("unknown opcode", abi::Opcode::name)
}

/// A request the device owns.
#[derive(Debug)]
struct Pending {
    ticket: Ticket,
    /// Arena allocations (readable bytes, writable bytes) to free on completion.
    areas: Vec<(u64, u64)>,
    /// Writable area (address, capacity), read back on completion.
    out: Option<(u64, u64)>,
}

/// A FUSE client over one virtio-fs queue. See the module documentation.
pub struct FuseClient {
    vq: Virtqueue,
    mem: Arc<GuestMemory>,
    arena: Arena,
    unique: Arc<AtomicU64>,
    next_seq: u64,
    ctx: Ctx,
    layout: SgLayout,
    use_indirect: bool,
    poison: bool,
    pending: HashMap<u16, Pending>,
    /// Completions that arrived while waiting for another ticket.
    done: VecDeque<Completion>,
    init_out: Option<abi::InitOut>,
    /// What the `kernel_*` helpers learnt, as the Linux client does (`fc->no_open`, ...).
    pub(crate) kernel: KernelState,
}

/// Requests the daemon answered with `ENOSYS`, which the `kernel_*` helpers of
/// [`FuseClient`] then stop sending, as the Linux FUSE client does: after OPEN → `ENOSYS`
/// files are used with handle 0 and never released; after OPENDIR → `ENOSYS` likewise for
/// directories; after FLUSH → `ENOSYS` no more FLUSH.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelState {
    pub no_open: bool,
    pub no_opendir: bool,
    pub no_flush: bool,
}

impl std::fmt::Debug for FuseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseClient")
            .field("vq", &self.vq)
            .field("ctx", &self.ctx)
            .field("layout", &self.layout)
            .field("use_indirect", &self.use_indirect)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl FuseClient {
    /// A client on `vq` with `arena_size` bytes of request/reply buffers carved from the queue's
    /// guest memory; `unique` is the request id counter (shared by all clients of a connection,
    /// like the kernel's).
    pub fn new(vq: Virtqueue, arena_size: u64, unique: Arc<AtomicU64>) -> Result<Self> {
        let mem = vq.memory().clone();
        let base = mem.alloc(arena_size, 64)?;
        Ok(FuseClient {
            vq,
            mem,
            arena: Arena::new(base, arena_size),
            unique,
            next_seq: 0,
            ctx: Ctx::current(),
            layout: SgLayout::default(),
            use_indirect: false,
            poison: true,
            pending: HashMap::new(),
            done: VecDeque::new(),
            kernel: KernelState::default(),
            init_out: None,
        })
    }

    // ---- configuration -------------------------------------------------------------------

    /// The underlying queue, for raw hooks (see [`Virtqueue`]). Chains added directly there are
    /// unknown to this client: complete them with the queue's own methods while this client has
    /// nothing in flight, or use [`FuseClient::submit_raw_chain`].
    pub fn queue(&mut self) -> &mut Virtqueue {
        &mut self.vq
    }

    /// Guest memory.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.mem
    }

    /// Credentials sent with each request (default: this process's).
    pub fn ctx(&self) -> Ctx {
        self.ctx
    }

    /// Sets the credentials for subsequent requests.
    pub fn set_ctx(&mut self, uid: u32, gid: u32, pid: u32) {
        self.ctx = Ctx { uid, gid, pid };
    }

    /// Runs `f` with the credentials temporarily set to `uid`/`gid`/`pid`.
    pub fn with_ctx<R>(
        &mut self,
        uid: u32,
        gid: u32,
        pid: u32,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let saved = self.ctx;
        self.set_ctx(uid, gid, pid);
        let r = f(self);
        self.ctx = saved;
        r
    }

    /// How requests are cut into descriptors.
    pub fn set_sg_layout(&mut self, layout: SgLayout) {
        self.layout = layout;
    }

    /// Sends subsequent requests through indirect tables. Fails if the feature was not
    /// negotiated.
    pub fn set_indirect(&mut self, on: bool) -> Result<()> {
        if on && !self.vq.indirect_enabled() {
            return Err(Error::NotNegotiated("VIRTIO_RING_F_INDIRECT_DESC"));
        }
        self.use_indirect = on;
        Ok(())
    }

    /// Whether reply buffers are filled with 0xA5 before submission (default true), so that a
    /// daemon reporting bytes it never wrote is caught. Turn off for benchmarks.
    pub fn set_poison_replies(&mut self, on: bool) {
        self.poison = on;
    }

    /// How long to wait for each completion.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.vq.set_timeout(timeout);
    }

    /// Requests the device owns.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The INIT reply of the last successful [`FuseClient::init`] on this client.
    pub fn init_out(&self) -> Option<&abi::InitOut> {
        self.init_out.as_ref()
    }

    /// Tells this client about an INIT negotiated on another client of the same connection
    /// (it decides, e.g., the SETXATTR argument format).
    pub fn set_init_out(&mut self, init: abi::InitOut) {
        self.init_out = Some(init);
    }

    /// A new request id.
    pub fn next_unique(&self) -> u64 {
        self.unique.fetch_add(UNIQUE_STEP, Ordering::Relaxed) + UNIQUE_STEP
    }

    /// Reserves `len` bytes of guest memory for the rest of the connection (for buffers of raw
    /// chains).
    pub fn alloc_buffer(&self, len: u64) -> Result<u64> {
        self.mem.alloc(len, 64)
    }

    // ---- submission ----------------------------------------------------------------------

    /// Submits a request with this client's credentials; returns its ticket without waiting.
    pub fn submit(
        &mut self,
        opcode: u32,
        nodeid: u64,
        args: &[&[u8]],
        reply_cap: usize,
    ) -> Result<Ticket> {
        let t = self.enqueue(opcode, nodeid, args, reply_cap)?;
        self.publish()?;
        Ok(t)
    }

    /// Like [`FuseClient::submit`] but leaves the chain unpublished until
    /// [`FuseClient::publish`], to batch many requests behind one `avail.idx` update and kick.
    pub fn enqueue(
        &mut self,
        opcode: u32,
        nodeid: u64,
        args: &[&[u8]],
        reply_cap: usize,
    ) -> Result<Ticket> {
        let unique = self.next_unique();
        let hdr = request_header(unique, opcode, nodeid, self.ctx, args);
        self.enqueue_header(hdr, args, reply_cap)
    }

    /// Enqueues a request with a caller-made header (any `len`, `unique`, `opcode`...), sent
    /// verbatim. The reply's unique is checked against `hdr.unique`.
    pub fn enqueue_header(
        &mut self,
        hdr: InHeader,
        args: &[&[u8]],
        reply_cap: usize,
    ) -> Result<Ticket> {
        let kind = if matches!(hdr.opcode, opcode::FORGET | opcode::BATCH_FORGET) {
            TicketKind::NoReply
        } else {
            TicketKind::Reply
        };
        let mut segs: Vec<&[u8]> = Vec::with_capacity(args.len() + 1);
        segs.push(hdr.as_bytes());
        segs.extend_from_slice(args);
        let out = if kind == TicketKind::NoReply {
            0
        } else {
            std::mem::size_of::<OutHeader>() + reply_cap
        };
        self.enqueue_segments(&segs, out, kind, hdr.unique, hdr.opcode)
    }

    /// Makes every enqueued request visible to the device and kicks it if it wants a kick.
    pub fn publish(&mut self) -> Result<()> {
        self.vq.publish();
        self.vq.notify()?;
        Ok(())
    }

    /// Submits raw readable bytes (cut per the [`SgLayout`], each `readable` element being one
    /// "argument") with `writable_len` bytes of reply room (no writable descriptor if 0).
    /// Nothing is checked; [`Completion::into_reply`] parses without a unique check.
    pub fn submit_raw(&mut self, readable: &[&[u8]], writable_len: usize) -> Result<Ticket> {
        let t = self.enqueue_segments(readable, writable_len, TicketKind::Raw, 0, 0)?;
        self.publish()?;
        Ok(t)
    }

    /// Submits a raw descriptor chain (see [`Virtqueue::add_raw_chain`]) whose buffers the
    /// caller set up (e.g. with [`FuseClient::alloc_buffer`]). Its completion has empty `data`.
    pub fn submit_raw_chain(&mut self, descs: &[RawDesc]) -> Result<Ticket> {
        let head = self.vq.add_raw_chain(descs)?;
        self.track_raw(head)
    }

    /// Submits a raw indirect chain (see [`Virtqueue::add_raw_indirect`]).
    pub fn submit_raw_indirect(
        &mut self,
        head_flags: u16,
        table: &[RawDesc],
        table_len: Option<u32>,
    ) -> Result<Ticket> {
        let head = self.vq.add_raw_indirect(head_flags, table, table_len)?;
        self.track_raw(head)
    }

    fn track_raw(&mut self, head: u16) -> Result<Ticket> {
        let ticket = self.ticket(0, 0, TicketKind::Raw);
        self.pending.insert(
            head,
            Pending {
                ticket,
                areas: Vec::new(),
                out: None,
            },
        );
        self.publish()?;
        Ok(ticket)
    }

    fn ticket(&mut self, unique: u64, opcode: u32, kind: TicketKind) -> Ticket {
        self.next_seq += 1;
        Ticket {
            seq: self.next_seq,
            unique,
            opcode,
            kind,
        }
    }

    fn alloc_area(&mut self, len: u64) -> Result<u64> {
        self.arena.alloc(len, 8).ok_or(Error::OutOfGuestMemory {
            requested: len,
            available: self.arena.free_bytes(),
        })
    }

    /// Cuts `[addr, addr + len)` into buffers of at most `chunk` bytes.
    fn chunks(addr: u64, len: u64, chunk: usize, writable: bool, out: &mut Vec<Buffer>) {
        let chunk = chunk.max(1) as u64;
        let mut off = 0;
        while off < len {
            let n = chunk.min(len - off);
            out.push(Buffer {
                addr: addr + off,
                len: n as u32,
                writable,
            });
            off += n;
        }
    }

    fn enqueue_segments(
        &mut self,
        readable: &[&[u8]],
        out_len: usize,
        kind: TicketKind,
        unique: u64,
        opcode: u32,
    ) -> Result<Ticket> {
        let in_len: usize = readable.iter().map(|s| s.len()).sum();
        if in_len == 0 && out_len == 0 {
            return Err(Error::InvalidChain("request without any bytes".into()));
        }
        if in_len > u32::MAX as usize || out_len > u32::MAX as usize {
            return Err(Error::InvalidChain("request larger than 4 GiB".into()));
        }
        let mut areas = Vec::with_capacity(2);
        let in_addr = if in_len > 0 {
            let a = self.alloc_area(in_len as u64)?;
            areas.push((a, in_len as u64));
            Some(a)
        } else {
            None
        };
        let out_addr = if out_len > 0 {
            match self.alloc_area(out_len as u64) {
                Ok(a) => {
                    areas.push((a, out_len as u64));
                    Some(a)
                }
                Err(e) => {
                    self.free_areas(&areas);
                    return Err(e);
                }
            }
        } else {
            None
        };

        let mut bufs = Vec::new();
        if let Some(base) = in_addr {
            let mut off = 0u64;
            for s in readable {
                self.mem.write(base + off, s)?;
                if !s.is_empty() && self.layout == SgLayout::PerArg {
                    bufs.push(Buffer::readable(base + off, s.len() as u32));
                }
                off += s.len() as u64;
            }
            match self.layout {
                SgLayout::PerArg => {}
                SgLayout::Contiguous => bufs.push(Buffer::readable(base, in_len as u32)),
                SgLayout::Chunked(n) => Self::chunks(base, in_len as u64, n, false, &mut bufs),
            }
        }
        if let Some(base) = out_addr {
            if self.poison {
                self.mem.fill(base, out_len, 0xa5)?;
            }
            let hdr = std::mem::size_of::<OutHeader>();
            match self.layout {
                SgLayout::PerArg if out_len > hdr => {
                    bufs.push(Buffer::writable(base, hdr as u32));
                    bufs.push(Buffer::writable(base + hdr as u64, (out_len - hdr) as u32));
                }
                SgLayout::PerArg | SgLayout::Contiguous => {
                    bufs.push(Buffer::writable(base, out_len as u32))
                }
                SgLayout::Chunked(n) => Self::chunks(base, out_len as u64, n, true, &mut bufs),
            }
        }

        let head = match self.vq.add_chain(&bufs, self.use_indirect) {
            Ok(h) => h,
            Err(e) => {
                self.free_areas(&areas);
                return Err(e);
            }
        };
        let ticket = self.ticket(unique, opcode, kind);
        self.pending.insert(
            head,
            Pending {
                ticket,
                areas,
                out: out_addr.map(|a| (a, out_len as u64)),
            },
        );
        Ok(ticket)
    }

    fn free_areas(&mut self, areas: &[(u64, u64)]) {
        for &(a, l) in areas {
            self.arena.free(a, l);
        }
    }

    // ---- completion ----------------------------------------------------------------------

    /// Waits for the next completion of any request, in the order the device returned them
    /// (completions already collected by [`FuseClient::wait`] come first).
    pub fn complete(&mut self) -> Result<Completion> {
        if let Some(c) = self.done.pop_front() {
            return Ok(c);
        }
        let used = self.vq.wait_used()?;
        self.finish(used)
    }

    /// Collects a completion only if one is ready (never sleeps).
    pub fn try_complete(&mut self) -> Result<Option<Completion>> {
        if let Some(c) = self.done.pop_front() {
            return Ok(Some(c));
        }
        match self.vq.pop_used()? {
            Some(used) => self.finish(used).map(Some),
            None => Ok(None),
        }
    }

    fn finish(&mut self, used: UsedElem) -> Result<Completion> {
        let p = self.pending.remove(&used.id).ok_or_else(|| {
            Error::Protocol(format!(
                "device returned head {} that this client did not submit",
                used.id
            ))
        })?;
        let res = (|| {
            let data = match p.out {
                Some((addr, cap)) => {
                    if u64::from(used.len) > cap {
                        return Err(Error::Protocol(format!(
                            "{} (unique {}): used length {} exceeds the {cap}-byte writable area",
                            opcode_name(p.ticket.opcode),
                            p.ticket.unique,
                            used.len
                        )));
                    }
                    self.mem.read_vec(addr, used.len as usize)?
                }
                None if p.ticket.kind == TicketKind::Raw => Vec::new(),
                None => {
                    if used.len != 0 {
                        return Err(Error::Protocol(format!(
                            "{} (unique {}): used length {} but the chain has no writable buffer",
                            opcode_name(p.ticket.opcode),
                            p.ticket.unique,
                            used.len
                        )));
                    }
                    Vec::new()
                }
            };
            Ok(Completion {
                ticket: p.ticket,
                used_len: used.len,
                data,
            })
        })();
        self.free_areas(&p.areas);
        res
    }

    /// Waits for the completion of `ticket` (stashing others for [`FuseClient::complete`]).
    pub fn wait_completion(&mut self, ticket: Ticket) -> Result<Completion> {
        if let Some(i) = self.done.iter().position(|c| c.ticket == ticket) {
            return Ok(self.done.remove(i).expect("index from position"));
        }
        loop {
            let used = self.vq.wait_used()?;
            let c = self.finish(used)?;
            if c.ticket == ticket {
                return Ok(c);
            }
            self.done.push_back(c);
        }
    }

    /// Waits for the reply of `ticket` and checks it.
    pub fn wait(&mut self, ticket: Ticket) -> Result<Reply> {
        self.wait_completion(ticket)?.into_reply()
    }

    // ---- one-shot requests ---------------------------------------------------------------

    /// Sends a request and waits for its reply. `args` are concatenated after the header;
    /// `reply_cap` is the room for the reply body (after `fuse_out_header`).
    pub fn request(
        &mut self,
        opcode: u32,
        nodeid: u64,
        args: &[&[u8]],
        reply_cap: usize,
    ) -> Result<Reply> {
        let t = self.submit(opcode, nodeid, args, reply_cap)?;
        self.wait(t)
    }

    /// [`FuseClient::request`] with explicit credentials.
    #[allow(clippy::too_many_arguments)]
    pub fn request_with_ctx(
        &mut self,
        opcode: u32,
        nodeid: u64,
        args: &[&[u8]],
        reply_cap: usize,
        uid: u32,
        gid: u32,
        pid: u32,
    ) -> Result<Reply> {
        let unique = self.next_unique();
        let hdr = request_header(unique, opcode, nodeid, Ctx { uid, gid, pid }, args);
        self.request_with_header(hdr, args, reply_cap)
    }

    /// Sends a request with a caller-made header, verbatim, and waits for its reply.
    pub fn request_with_header(
        &mut self,
        hdr: InHeader,
        args: &[&[u8]],
        reply_cap: usize,
    ) -> Result<Reply> {
        let t = self.enqueue_header(hdr, args, reply_cap)?;
        self.publish()?;
        self.wait(t)
    }

    /// Sends raw bytes and waits for whatever comes back.
    pub fn request_raw(&mut self, readable: &[&[u8]], writable_len: usize) -> Result<Completion> {
        let t = self.submit_raw(readable, writable_len)?;
        self.wait_completion(t)
    }

    // ---- typed helpers -------------------------------------------------------------------
    //
    // Each unwraps its fallible `try_*` twin (`checked.rs`), which lays out the request and
    // checks the reply: every request is laid out once, and a broken daemon is a panic here, an
    // `Error` there.

    /// FUSE_INIT as a Linux 6.x kernel sends it: 7.38, [`DEFAULT_INIT_FLAGS`], 64-byte
    /// `fuse_init_in` with `flags2`.
    pub fn init(&mut self) -> std::result::Result<abi::InitOut, i32> {
        settle(opcode::INIT, self.try_init())
    }

    /// FUSE_INIT as Linux 5.4 sends it: 7.31, [`LINUX_5_4_INIT_FLAGS`], the 16-byte
    /// `fuse_init_in`.
    pub fn init_compat(&mut self) -> std::result::Result<abi::InitOut, i32> {
        settle(opcode::INIT, self.try_init_compat())
    }

    /// FUSE_INIT with any minor and flags; `ext` sends the 48-byte extension carrying the high
    /// 32 flag bits. Accepts the 24-byte reply of protocol < 7.23 and the 64-byte one.
    pub fn init_with(
        &mut self,
        minor: u32,
        flags: u64,
        max_readahead: u32,
        ext: bool,
    ) -> std::result::Result<abi::InitOut, i32> {
        settle(
            opcode::INIT,
            self.try_init_with(minor, flags, max_readahead, ext),
        )
    }

    /// FUSE_DESTROY.
    pub fn destroy(&mut self) -> std::result::Result<(), i32> {
        settle(opcode::DESTROY, self.try_destroy())
    }

    /// FUSE_LOOKUP of `name` in `parent`; a negative entry (node id 0) is `ENOENT`, as the
    /// Linux client reads it.
    pub fn lookup(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(opcode::LOOKUP, self.try_lookup(parent, name))
    }

    /// FUSE_LOOKUP of `name` in `parent`, a negative entry (node id 0) given as it came.
    pub fn lookup_entry(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(opcode::LOOKUP, self.try_lookup_entry(parent, name))
    }

    /// FUSE_FORGET (no reply; waits until the device returned the chain).
    pub fn forget(&mut self, nodeid: u64, nlookup: u64) {
        if let Err(e) = self.try_forget(nodeid, nlookup) {
            panic!("FORGET: {e}");
        }
    }

    /// FUSE_BATCH_FORGET of `(nodeid, nlookup)` pairs (no reply).
    pub fn batch_forget(&mut self, forgets: &[(u64, u64)]) {
        if let Err(e) = self.try_batch_forget(forgets) {
            panic!("BATCH_FORGET: {e}");
        }
    }

    /// FUSE_GETATTR (with `fh` if given).
    pub fn getattr(
        &mut self,
        nodeid: u64,
        fh: Option<u64>,
    ) -> std::result::Result<abi::AttrOut, i32> {
        settle(opcode::GETATTR, self.try_getattr(nodeid, fh))
    }

    /// FUSE_SETATTR.
    pub fn setattr(
        &mut self,
        nodeid: u64,
        attr: &abi::SetattrIn,
    ) -> std::result::Result<abi::AttrOut, i32> {
        settle(opcode::SETATTR, self.try_setattr(nodeid, attr))
    }

    /// FUSE_READLINK.
    pub fn readlink(&mut self, nodeid: u64) -> std::result::Result<Vec<u8>, i32> {
        settle(opcode::READLINK, self.try_readlink(nodeid))
    }

    /// FUSE_SYMLINK: creates `name` in `parent` pointing at `target`.
    pub fn symlink(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        target: impl AsRef<[u8]>,
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(opcode::SYMLINK, self.try_symlink(parent, name, target))
    }

    /// FUSE_MKNOD.
    pub fn mknod(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(
            opcode::MKNOD,
            self.try_mknod(parent, name, mode, rdev, umask),
        )
    }

    /// FUSE_MKDIR (`mode` without `S_IFDIR`, as the kernel sends it).
    pub fn mkdir(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        umask: u32,
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(opcode::MKDIR, self.try_mkdir(parent, name, mode, umask))
    }

    /// FUSE_UNLINK.
    pub fn unlink(&mut self, parent: u64, name: impl AsRef<[u8]>) -> std::result::Result<(), i32> {
        settle(opcode::UNLINK, self.try_unlink(parent, name))
    }

    /// FUSE_RMDIR.
    pub fn rmdir(&mut self, parent: u64, name: impl AsRef<[u8]>) -> std::result::Result<(), i32> {
        settle(opcode::RMDIR, self.try_rmdir(parent, name))
    }

    /// FUSE_RENAME.
    pub fn rename(
        &mut self,
        olddir: u64,
        oldname: impl AsRef<[u8]>,
        newdir: u64,
        newname: impl AsRef<[u8]>,
    ) -> std::result::Result<(), i32> {
        settle(
            opcode::RENAME,
            self.try_rename(olddir, oldname, newdir, newname),
        )
    }

    /// FUSE_RENAME2 with `RENAME_*` flags.
    pub fn rename2(
        &mut self,
        olddir: u64,
        oldname: impl AsRef<[u8]>,
        newdir: u64,
        newname: impl AsRef<[u8]>,
        flags: u32,
    ) -> std::result::Result<(), i32> {
        settle(
            opcode::RENAME2,
            self.try_rename2(olddir, oldname, newdir, newname, flags),
        )
    }

    /// FUSE_LINK: a new name `newname` in `newparent` for `oldnodeid`.
    pub fn link(
        &mut self,
        oldnodeid: u64,
        newparent: u64,
        newname: impl AsRef<[u8]>,
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(opcode::LINK, self.try_link(oldnodeid, newparent, newname))
    }

    /// FUSE_OPEN with `O_*` flags.
    pub fn open(&mut self, nodeid: u64, flags: u32) -> std::result::Result<abi::OpenOut, i32> {
        settle(opcode::OPEN, self.try_open(nodeid, flags))
    }

    /// FUSE_CREATE.
    pub fn create(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        flags: u32,
        mode: u32,
        umask: u32,
    ) -> std::result::Result<(abi::EntryOut, abi::OpenOut), i32> {
        settle(
            opcode::CREATE,
            self.try_create(parent, name, flags, mode, umask),
        )
    }

    /// FUSE_TMPFILE (sent, like the kernel, with the name "/").
    pub fn tmpfile(
        &mut self,
        parent: u64,
        flags: u32,
        mode: u32,
        umask: u32,
    ) -> std::result::Result<(abi::EntryOut, abi::OpenOut), i32> {
        settle(
            opcode::TMPFILE,
            self.try_tmpfile(parent, flags, mode, umask),
        )
    }

    /// FUSE_READ of up to `size` bytes at `offset`.
    pub fn read(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> std::result::Result<Vec<u8>, i32> {
        settle(opcode::READ, self.try_read(nodeid, fh, offset, size))
    }

    /// FUSE_READ with a caller-made `fuse_read_in`.
    pub fn read_with(
        &mut self,
        nodeid: u64,
        arg: &abi::ReadIn,
    ) -> std::result::Result<Vec<u8>, i32> {
        settle(opcode::READ, self.try_read_with(nodeid, arg))
    }

    /// FUSE_WRITE of `data` at `offset`; returns the byte count written.
    pub fn write(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> std::result::Result<u32, i32> {
        settle(opcode::WRITE, self.try_write(nodeid, fh, offset, data))
    }

    /// FUSE_WRITE with a caller-made `fuse_write_in` (its `size` is sent as is).
    pub fn write_with(
        &mut self,
        nodeid: u64,
        arg: &abi::WriteIn,
        data: &[u8],
    ) -> std::result::Result<u32, i32> {
        settle(opcode::WRITE, self.try_write_with(nodeid, arg, data))
    }

    /// FUSE_FLUSH.
    pub fn flush(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> std::result::Result<(), i32> {
        settle(opcode::FLUSH, self.try_flush(nodeid, fh, lock_owner))
    }

    /// FUSE_RELEASE (`flags` are the open flags).
    pub fn release(&mut self, nodeid: u64, fh: u64, flags: u32) -> std::result::Result<(), i32> {
        settle(opcode::RELEASE, self.try_release(nodeid, fh, flags))
    }

    /// FUSE_RELEASE or FUSE_RELEASEDIR with a caller-made `fuse_release_in`.
    pub fn release_with(
        &mut self,
        op: u32,
        nodeid: u64,
        arg: &abi::ReleaseIn,
    ) -> std::result::Result<(), i32> {
        settle(op, self.try_release_with(op, nodeid, arg))
    }

    /// FUSE_GETLK.
    pub fn getlk(
        &mut self,
        nodeid: u64,
        lk: &abi::LkIn,
    ) -> std::result::Result<abi::FileLock, i32> {
        settle(opcode::GETLK, self.try_getlk(nodeid, lk))
    }

    /// FUSE_SETLK.
    pub fn setlk(&mut self, nodeid: u64, lk: &abi::LkIn) -> std::result::Result<(), i32> {
        settle(opcode::SETLK, self.try_setlk(nodeid, lk, false))
    }

    /// FUSE_SETLKW, waiting for the reply.
    pub fn setlkw(&mut self, nodeid: u64, lk: &abi::LkIn) -> std::result::Result<(), i32> {
        settle(opcode::SETLKW, self.try_setlk(nodeid, lk, true))
    }

    /// FUSE_SETLKW, submitted without waiting: its reply comes through [`FuseClient::wait`].
    pub fn submit_setlkw(&mut self, nodeid: u64, lk: &abi::LkIn) -> Result<Ticket> {
        self.submit(opcode::SETLKW, nodeid, &[lk.as_bytes()], 0)
    }

    /// FUSE_FSYNC.
    pub fn fsync(&mut self, nodeid: u64, fh: u64, datasync: bool) -> std::result::Result<(), i32> {
        settle(opcode::FSYNC, self.try_fsync(nodeid, fh, datasync))
    }

    /// FUSE_FSYNCDIR.
    pub fn fsyncdir(
        &mut self,
        nodeid: u64,
        fh: u64,
        datasync: bool,
    ) -> std::result::Result<(), i32> {
        settle(opcode::FSYNCDIR, self.try_fsyncdir(nodeid, fh, datasync))
    }

    /// FUSE_OPENDIR.
    pub fn opendir(&mut self, nodeid: u64, flags: u32) -> std::result::Result<abi::OpenOut, i32> {
        settle(opcode::OPENDIR, self.try_opendir(nodeid, flags))
    }

    /// FUSE_READDIR from `offset` with `size` bytes of room; parsed entries.
    pub fn readdir(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> std::result::Result<Vec<DirEntry>, i32> {
        settle(opcode::READDIR, self.try_readdir(nodeid, fh, offset, size))
    }

    /// FUSE_READDIRPLUS from `offset` with `size` bytes of room; parsed entries.
    pub fn readdirplus(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> std::result::Result<Vec<DirEntryPlus>, i32> {
        settle(
            opcode::READDIRPLUS,
            self.try_readdirplus(nodeid, fh, offset, size),
        )
    }

    /// FUSE_RELEASEDIR.
    pub fn releasedir(&mut self, nodeid: u64, fh: u64, flags: u32) -> std::result::Result<(), i32> {
        settle(opcode::RELEASEDIR, self.try_releasedir(nodeid, fh, flags))
    }

    /// FUSE_STATFS.
    pub fn statfs(&mut self, nodeid: u64) -> std::result::Result<abi::Kstatfs, i32> {
        settle(opcode::STATFS, self.try_statfs(nodeid))
    }

    /// FUSE_ACCESS with an `R_OK`/`W_OK`/`X_OK`/`F_OK` mask.
    pub fn access(&mut self, nodeid: u64, mask: u32) -> std::result::Result<(), i32> {
        settle(opcode::ACCESS, self.try_access(nodeid, mask))
    }

    /// FUSE_SETXATTR; uses the extended `fuse_setxattr_in` when INIT negotiated `SETXATTR_EXT`.
    pub fn setxattr(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
        value: &[u8],
        flags: u32,
    ) -> std::result::Result<(), i32> {
        settle(
            opcode::SETXATTR,
            self.try_setxattr(nodeid, name, value, flags),
        )
    }

    /// FUSE_SETXATTR in the extended format (as after `SETXATTR_EXT`) with `setxattr_flags`
    /// (e.g. `SETXATTR_ACL_KILL_SGID`).
    pub fn setxattr_ext(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> std::result::Result<(), i32> {
        settle(
            opcode::SETXATTR,
            self.try_setxattr_ext(nodeid, name, value, flags, setxattr_flags),
        )
    }

    /// Sends `op` with request extensions `ext` (whole 8-byte records, see
    /// [`secctx_extension`]) after the arguments, `total_extlen` set as the kernel does; returns
    /// the reply body or the errno.
    pub fn call_with_ext(
        &mut self,
        op: u32,
        nodeid: u64,
        args: &[&[u8]],
        ext: &[u8],
        reply_cap: usize,
    ) -> std::result::Result<Vec<u8>, i32> {
        settle(op, self.try_call_with_ext(op, nodeid, args, ext, reply_cap))
    }

    /// FUSE_MKDIR with request extensions.
    pub fn mkdir_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        umask: u32,
        ext: &[u8],
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(
            opcode::MKDIR,
            self.try_mkdir_ext(parent, name, mode, umask, ext),
        )
    }

    /// FUSE_MKNOD with request extensions.
    pub fn mknod_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
        umask: u32,
        ext: &[u8],
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(
            opcode::MKNOD,
            self.try_mknod_ext(parent, name, mode, rdev, umask, ext),
        )
    }

    /// FUSE_SYMLINK with request extensions.
    pub fn symlink_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        target: impl AsRef<[u8]>,
        ext: &[u8],
    ) -> std::result::Result<abi::EntryOut, i32> {
        settle(
            opcode::SYMLINK,
            self.try_symlink_ext(parent, name, target, ext),
        )
    }

    /// FUSE_CREATE with `open_flags` (`FUSE_OPEN_KILL_SUIDGID`) and request extensions.
    #[allow(clippy::too_many_arguments)]
    pub fn create_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        flags: u32,
        mode: u32,
        umask: u32,
        open_flags: u32,
        ext: &[u8],
    ) -> std::result::Result<(abi::EntryOut, abi::OpenOut), i32> {
        settle(
            opcode::CREATE,
            self.try_create_ext(parent, name, flags, mode, umask, open_flags, ext),
        )
    }

    /// FUSE_OPEN with `open_flags` (`FUSE_OPEN_KILL_SUIDGID`).
    pub fn open_with(
        &mut self,
        nodeid: u64,
        flags: u32,
        open_flags: u32,
    ) -> std::result::Result<abi::OpenOut, i32> {
        settle(opcode::OPEN, self.try_open_with(nodeid, flags, open_flags))
    }

    /// FUSE_GETXATTR: with `size` 0 the size probe, else the value (at most `size` bytes).
    pub fn getxattr(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
        size: u32,
    ) -> std::result::Result<XattrReply, i32> {
        settle(opcode::GETXATTR, self.try_getxattr(nodeid, name, size))
    }

    /// FUSE_LISTXATTR: with `size` 0 the size probe, else the NUL-separated list.
    pub fn listxattr(&mut self, nodeid: u64, size: u32) -> std::result::Result<XattrReply, i32> {
        settle(opcode::LISTXATTR, self.try_listxattr(nodeid, size))
    }

    /// FUSE_REMOVEXATTR.
    pub fn removexattr(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
    ) -> std::result::Result<(), i32> {
        settle(opcode::REMOVEXATTR, self.try_removexattr(nodeid, name))
    }

    /// FUSE_FALLOCATE.
    pub fn fallocate(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> std::result::Result<(), i32> {
        settle(
            opcode::FALLOCATE,
            self.try_fallocate(nodeid, fh, offset, length, mode),
        )
    }

    /// FUSE_LSEEK; returns the resulting offset.
    pub fn lseek(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    ) -> std::result::Result<u64, i32> {
        settle(opcode::LSEEK, self.try_lseek(nodeid, fh, offset, whence))
    }

    /// FUSE_COPY_FILE_RANGE from `nodeid_in`; returns the byte count copied.
    pub fn copy_file_range(
        &mut self,
        nodeid_in: u64,
        arg: &abi::CopyFileRangeIn,
    ) -> std::result::Result<u32, i32> {
        settle(
            opcode::COPY_FILE_RANGE,
            self.try_copy_file_range(nodeid_in, arg),
        )
    }

    /// FUSE_SYNCFS (sent on the root node, like the kernel).
    pub fn syncfs(&mut self) -> std::result::Result<(), i32> {
        settle(opcode::SYNCFS, self.try_syncfs())
    }
}

/// Unwraps a [`FuseResult`] for a typed helper: a transport or protocol failure panics (what a
/// test wants), a FUSE answer is returned.
fn settle<T>(op: u32, r: FuseResult<T>) -> std::result::Result<T, i32> {
    match r {
        Ok(answer) => answer,
        Err(e) => panic!("{}: {e}", opcode_name(op)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes_have_a_correct_header() {
        let ctx = Ctx {
            uid: 1000,
            gid: 100,
            pid: 42,
        };
        let name = cstr(b"file.txt");
        let arg = abi::MkdirIn {
            mode: 0o755,
            umask: 0o022,
        };
        let bytes = build_request(6, opcode::MKDIR, 1, ctx, &[arg.as_bytes(), &name]);
        assert_eq!(bytes.len(), 40 + 8 + 9);
        let h = InHeader::from_prefix(&bytes).unwrap();
        assert_eq!(h.len as usize, bytes.len());
        assert_eq!((h.opcode, h.unique, h.nodeid), (opcode::MKDIR, 6, 1));
        assert_eq!((h.uid, h.gid, h.pid, h.total_extlen), (1000, 100, 42, 0));
        assert_eq!(&bytes[40..44], &0o755u32.to_le_bytes());
        assert_eq!(&bytes[48..], b"file.txt\0");
    }

    #[test]
    fn cstr_appends_exactly_one_nul() {
        assert_eq!(cstr(b"a"), b"a\0");
        assert_eq!(cstr(b""), b"\0");
    }

    #[test]
    fn init_flags_split_into_flags_and_flags2() {
        assert_eq!(
            DEFAULT_INIT_FLAGS as u32 as u64 & abi::init::INIT_EXT,
            abi::init::INIT_EXT
        );
        assert_ne!(DEFAULT_INIT_FLAGS >> 32, 0);
        assert_eq!(LINUX_5_4_INIT_FLAGS >> 32, 0);
        assert_eq!(LINUX_5_4_INIT_FLAGS & abi::init::INIT_EXT, 0);
        assert_eq!(DEFAULT_INIT_FLAGS & abi::init::SECURITY_CTX, 0);
    }

    fn out(len: u32, error: i32, unique: u64, body: &[u8]) -> Vec<u8> {
        let mut v = OutHeader { len, error, unique }.as_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn reply_parsing_checks_like_the_kernel() {
        let ok = parse_reply(&out(20, 0, 8, b"abcd"), Some(8), opcode::READ).unwrap();
        assert_eq!((ok.error, ok.body.as_slice()), (0, &b"abcd"[..]));
        let err = parse_reply(&out(16, -2, 8, b""), Some(8), opcode::LOOKUP).unwrap();
        assert_eq!(err.errno(), Some(libc::ENOENT));
        assert_eq!(err.into_result(), Err(libc::ENOENT));

        for bad in [
            out(16, 0, 8, b"")[..15].to_vec(), // short header
            out(24, 0, 8, b"abcd"),            // len mismatch
            out(16, 0, 9, b""),                // unique mismatch
            out(16, 5, 8, b""),                // positive error
            out(16, -512, 8, b""),             // kernel-internal errno
            out(20, -2, 8, b"abcd"),           // error with body
        ] {
            assert!(
                matches!(
                    parse_reply(&bad, Some(8), opcode::LOOKUP),
                    Err(Error::Protocol(_))
                ),
                "{bad:?} accepted"
            );
        }
        // Raw completions skip the unique check.
        assert!(parse_reply(&out(16, 0, 9, b""), None, 0).is_ok());
    }

    fn dirent(ino: u64, off: u64, typ: u32, name: &[u8]) -> Vec<u8> {
        let d = abi::Dirent {
            ino,
            off,
            namelen: name.len() as u32,
            typ,
        };
        let mut v = d.as_bytes().to_vec();
        v.extend_from_slice(name);
        v.resize(abi::dirent_size(name.len()), 0);
        v
    }

    #[test]
    fn dirents_parse_and_reject_garbage() {
        let mut buf = dirent(1, 1, 4, b".");
        buf.extend(dirent(7, 2, 8, b"a-longer-name"));
        let v = parse_dirents(&buf).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].name, b"a-longer-name");
        assert_eq!((v[1].ino, v[1].off, v[1].typ), (7, 2, 8));

        assert!(parse_dirents(&buf[..buf.len() - 1]).is_err());
        assert!(parse_dirents(&dirent(1, 1, 4, b"a/b")).is_err());
        assert!(parse_dirents(&dirent(1, 1, 4, b"")).is_err());

        let entry = abi::EntryOut {
            nodeid: 9,
            ..Default::default()
        };
        let mut plus = entry.as_bytes().to_vec();
        plus.extend(dirent(9, 1, 8, b"f"));
        let p = parse_direntplus(&plus).unwrap();
        assert_eq!(
            (p[0].entry.nodeid, p[0].dirent.name.as_slice()),
            (9, &b"f"[..])
        );
        assert!(parse_direntplus(&plus[..100]).is_err());
    }
}
