//! An in-process vhost-user *frontend* for virtio-fs: the part QEMU and the guest kernel play.
//!
//! Used by the integration tests and the benchmark tool to drive the daemon exactly as a VM
//! would, without a VM:
//! - [`memory`]: guest memory (one memfd, mapped shared, announced with `SET_MEM_TABLE`) and
//!   allocators for rings and buffers;
//! - [`virtqueue`]: the driver side of split virtqueues, including raw hooks to build malformed
//!   descriptor chains;
//! - [`fuse_client`]: FUSE requests over a request queue, as the Linux virtio-fs driver sends
//!   them, with typed helpers for every opcode the daemon serves;
//! - [`checked`]: the same typed helpers in a fallible form (`try_lookup`, ...) for tools that
//!   must report a misbehaving daemon instead of panicking; each request is laid out there
//!   once, and the panicking helpers unwrap them;
//! - this module: [`FsFrontend`], the vhost-user connection and handshake.
//!
//! ```no_run
//! use virtiofsd_frontend::FsFrontend;
//! use virtiofs_fuse::abi::ROOT_ID;
//!
//! let mut fs = FsFrontend::connect("/tmp/vfsd.sock", 1).unwrap();
//! let mut client = fs.client(0).unwrap();
//! client.init().unwrap();
//! assert_eq!(client.lookup(ROOT_ID, "missing").unwrap_err(), libc::ENOENT);
//! ```

pub mod checked;
mod error;
pub mod fuse_client;
pub mod memory;
pub mod migrate;
pub mod virtqueue;

#[cfg(test)]
mod echo_tests;

pub use error::{Error, FuseResult, Result};

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

pub use fuse_client::{
    secctx_extension, Completion, Ctx, DirEntry, DirEntryPlus, FuseClient, KernelState, Reply,
    SgLayout, Ticket, TicketKind, XattrReply,
};
pub use memory::{Arena, GuestMemory};
pub use migrate::DirtyLog;
pub use virtqueue::{
    Buffer, Next, QueueOptions, QueueStats, RawDesc, RawDescriptor, UsedElem, Virtqueue,
    VringLayout,
};

/// `VIRTIO_F_VERSION_1`.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// `VIRTIO_RING_F_INDIRECT_DESC`.
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
/// `VIRTIO_RING_F_EVENT_IDX`.
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
/// `VHOST_USER_F_PROTOCOL_FEATURES`.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Index of the virtio-fs high-priority queue (FORGET, INTERRUPT).
pub const HIPRIO_QUEUE: usize = 0;

/// How much of guest memory the frontend gives the daemon (`SET_MEM_TABLE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SharedMemory {
    /// All of it.
    #[default]
    All,
    /// None: no `SET_MEM_TABLE` at all, as QEMU (with `CONFIGURE_MEM_SLOTS`) when no memory
    /// backend has `share=on`. Setting up the first vring then fails.
    Nothing,
    /// Only its first page, which is kept unused: the rings lie beyond it, as in a second NUMA
    /// node whose memory backend lacks `share=on`. Setting up the first vring then fails.
    FirstPage,
}

/// Settings of a [`FsFrontend`].
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Guest memory size (default 64 MiB).
    pub mem_size: usize,
    /// Guest physical address of guest memory (default 0x10000; page aligned).
    pub gpa_base: u64,
    /// Descriptors per queue (default 256; power of two).
    pub queue_size: u16,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX` if offered (default true).
    pub event_idx: bool,
    /// Negotiate `VIRTIO_RING_F_INDIRECT_DESC` if offered (default true).
    pub indirect: bool,
    /// Initial ring index of every queue, sent with `SET_VRING_BASE` (default 0).
    pub initial_ring_index: u16,
    /// How long to wait for a used entry before failing (default 10 s).
    pub timeout: Duration,
    /// How long to retry connecting while the socket does not exist yet or refuses (default 5 s).
    pub connect_timeout: Duration,
    /// Guest memory each request-queue [`FuseClient`] reserves for request and reply buffers
    /// (default 4 MiB: room for several 1 MiB reads in flight).
    pub client_arena_size: usize,
    /// Same for the high-priority queue client (default 64 KiB).
    pub hiprio_arena_size: usize,
    /// How much of guest memory the daemon is given (default all of it).
    pub shared_memory: SharedMemory,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            mem_size: memory::DEFAULT_MEM_SIZE,
            gpa_base: memory::DEFAULT_GPA_BASE,
            queue_size: virtqueue::DEFAULT_QUEUE_SIZE,
            event_idx: true,
            indirect: true,
            initial_ring_index: 0,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            client_arena_size: 4 << 20,
            hiprio_arena_size: 64 << 10,
            shared_memory: SharedMemory::All,
        }
    }
}

/// A vhost-user connection to a virtio-fs daemon with its guest memory and vrings set up.
///
/// Vring 0 is the high-priority queue, vrings `1..=num_request_queues` the request queues. Hand
/// them out as [`FuseClient`]s ([`FsFrontend::client`], [`FsFrontend::hiprio_client`]) or as bare
/// [`Virtqueue`]s ([`FsFrontend::take_queue`]); each can move to its own thread. Dropping the
/// `FsFrontend` (or [`FsFrontend::disconnect`]) closes the vhost-user socket, which is how a VM
/// going away looks to the daemon; queues and clients stay usable memory-wise but nothing will
/// answer them any more.
pub struct FsFrontend {
    vhost: Option<Frontend>,
    mem: Arc<GuestMemory>,
    queues: Vec<Option<Virtqueue>>,
    acked_features: u64,
    protocol_features: VhostUserProtocolFeatures,
    config: FrontendConfig,
    unique: Arc<AtomicU64>,
    /// Each vring's addresses as sent with `SET_VRING_ADDR` (sent again when logging starts).
    vring_addrs: Vec<vhost::VringConfigData>,
}

impl std::fmt::Debug for FsFrontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsFrontend")
            .field("connected", &self.vhost.is_some())
            .field("mem", &self.mem)
            .field("queues", &self.queues.len())
            .field(
                "acked_features",
                &format_args!("{:#x}", self.acked_features),
            )
            .field("protocol_features", &self.protocol_features)
            .finish()
    }
}

impl FsFrontend {
    /// Connects with the default [`FrontendConfig`]. See [`FsFrontend::connect_with`].
    pub fn connect(socket_path: impl AsRef<Path>, num_request_queues: usize) -> Result<Self> {
        Self::connect_with(socket_path, num_request_queues, &FrontendConfig::default())
    }

    /// Connects to the daemon's socket and sets the device up the way QEMU does:
    /// `SET_OWNER`, `GET_FEATURES`, `GET_PROTOCOL_FEATURES`/`SET_PROTOCOL_FEATURES` (MQ,
    /// REPLY_ACK, CONFIG, LOG_SHMFD, DEVICE_STATE when offered; every later message then asks for an ack),
    /// `GET_QUEUE_NUM` (with MQ), `SET_FEATURES` (VERSION_1, PROTOCOL_FEATURES, and EVENT_IDX /
    /// INDIRECT_DESC when configured and offered), `SET_MEM_TABLE` (see
    /// [`FrontendConfig::shared_memory`]), and for each of the
    /// `1 + num_request_queues` vrings `SET_VRING_NUM`, `SET_VRING_BASE`, `SET_VRING_ADDR`,
    /// `SET_VRING_KICK`, `SET_VRING_CALL`, then `SET_VRING_ENABLE` for all of them.
    pub fn connect_with(
        socket_path: impl AsRef<Path>,
        num_request_queues: usize,
        config: &FrontendConfig,
    ) -> Result<Self> {
        if num_request_queues == 0 {
            return Err(Error::Config(
                "virtio-fs needs at least one request queue".into(),
            ));
        }
        let num_queues = 1 + num_request_queues;
        let stream = Self::connect_socket(socket_path.as_ref(), config.connect_timeout)?;
        let mut fe = Frontend::from_stream(stream, num_queues as u64);

        fe.set_owner()?;
        let offered = fe.get_features()?;
        if offered & VIRTIO_F_VERSION_1 == 0 {
            return Err(Error::Handshake(format!(
                "daemon does not offer VIRTIO_F_VERSION_1 (features {offered:#x})"
            )));
        }

        let mut protocol_features = VhostUserProtocolFeatures::empty();
        if offered & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let p = fe.get_protocol_features()?;
            protocol_features = p
                & (VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::REPLY_ACK
                    | VhostUserProtocolFeatures::CONFIG
                    | VhostUserProtocolFeatures::LOG_SHMFD
                    | VhostUserProtocolFeatures::DEVICE_STATE);
            fe.set_protocol_features(protocol_features)?;
            if protocol_features.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
        }
        if protocol_features.contains(VhostUserProtocolFeatures::MQ) {
            let n = fe.get_queue_num()?;
            if n < num_queues as u64 {
                return Err(Error::Handshake(format!(
                    "daemon supports {n} queues, {num_queues} requested"
                )));
            }
        }

        let mut wanted = VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES;
        if config.event_idx {
            wanted |= VIRTIO_RING_F_EVENT_IDX;
        }
        if config.indirect {
            wanted |= VIRTIO_RING_F_INDIRECT_DESC;
        }
        let acked = offered & wanted;
        fe.set_features(acked)?;

        let mem = Arc::new(GuestMemory::new(config.mem_size, config.gpa_base)?);
        match config.shared_memory {
            SharedMemory::All => {
                fe.set_mem_table(&[mem.region_info()])?;
            }
            SharedMemory::Nothing => {}
            SharedMemory::FirstPage => {
                let page = mem.alloc(memory::PAGE_SIZE, memory::PAGE_SIZE)?;
                debug_assert_eq!(page, mem.gpa_base());
                let mut first = mem.region_info();
                first.memory_size = memory::PAGE_SIZE;
                fe.set_mem_table(&[first])?;
            }
        }

        let opts = QueueOptions {
            size: config.queue_size,
            event_idx: acked & VIRTIO_RING_F_EVENT_IDX != 0,
            indirect: acked & VIRTIO_RING_F_INDIRECT_DESC != 0,
            initial_index: config.initial_ring_index,
            timeout: config.timeout,
        };
        let mut queues = Vec::with_capacity(num_queues);
        let mut vring_addrs = Vec::with_capacity(num_queues);
        for i in 0..num_queues {
            let q = Virtqueue::new(i, mem.clone(), &opts)?;
            fe.set_vring_num(i, q.size())?;
            fe.set_vring_base(i, config.initial_ring_index)?;
            let addrs = q.vring_config()?;
            fe.set_vring_addr(i, &addrs)?;
            vring_addrs.push(addrs);
            fe.set_vring_kick(i, q.kick_fd())?;
            fe.set_vring_call(i, q.call_fd())?;
            queues.push(Some(q));
        }
        if acked & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            for i in 0..num_queues {
                fe.set_vring_enable(i, true)?;
            }
        }

        Ok(FsFrontend {
            vhost: Some(fe),
            mem,
            queues,
            acked_features: acked,
            protocol_features,
            config: config.clone(),
            unique: Arc::new(AtomicU64::new(0)),
            vring_addrs,
        })
    }

    fn connect_socket(path: &Path, patience: Duration) -> Result<UnixStream> {
        let deadline = Instant::now() + patience;
        loop {
            match UnixStream::connect(path) {
                Ok(s) => return Ok(s),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(Error::io("connect to the vhost-user socket", e)),
            }
        }
    }

    /// Guest memory.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.mem
    }

    /// The configuration the connection was made with.
    pub fn config(&self) -> &FrontendConfig {
        &self.config
    }

    /// Virtio features acknowledged with `SET_FEATURES`.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Whether `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub fn event_idx(&self) -> bool {
        self.acked_features & VIRTIO_RING_F_EVENT_IDX != 0
    }

    /// Whether `VIRTIO_RING_F_INDIRECT_DESC` was negotiated.
    pub fn indirect(&self) -> bool {
        self.acked_features & VIRTIO_RING_F_INDIRECT_DESC != 0
    }

    /// Protocol features acknowledged with `SET_PROTOCOL_FEATURES`.
    pub fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.protocol_features
    }

    /// Number of vrings (1 + request queues).
    pub fn num_queues(&self) -> usize {
        self.queues.len()
    }

    /// The vhost-user connection, for tests of the vhost-user layer itself (e.g.
    /// `get_vring_base`, `get_config`). `None` after [`FsFrontend::disconnect`].
    pub fn vhost(&mut self) -> Option<&mut Frontend> {
        self.vhost.as_mut()
    }

    /// Whether the vhost-user socket is still open.
    pub fn is_connected(&self) -> bool {
        self.vhost.is_some()
    }

    /// Closes the vhost-user socket (as a VM shutting down would).
    pub fn disconnect(&mut self) {
        self.vhost = None;
    }

    /// Takes vring `index` (0 = high priority) as a bare virtqueue.
    pub fn take_queue(&mut self, index: usize) -> Result<Virtqueue> {
        self.queues
            .get_mut(index)
            .and_then(Option::take)
            .ok_or(Error::NoSuchQueue(index))
    }

    /// A FUSE client on request queue `n` (vring `1 + n`).
    pub fn client(&mut self, n: usize) -> Result<FuseClient> {
        let q = self.take_queue(1 + n)?;
        FuseClient::new(q, self.config.client_arena_size as u64, self.unique.clone())
    }

    /// A FUSE client on the high-priority queue (vring 0), where the Linux driver sends FORGET
    /// and INTERRUPT.
    pub fn hiprio_client(&mut self) -> Result<FuseClient> {
        let q = self.take_queue(HIPRIO_QUEUE)?;
        FuseClient::new(q, self.config.hiprio_arena_size as u64, self.unique.clone())
    }
}
