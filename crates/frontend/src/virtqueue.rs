//! The driver side of a split virtqueue (virtio 1.x, section 2.7) living in [`GuestMemory`].
//!
//! A [`Virtqueue`] owns its descriptor table, available ring and used ring (laid out by
//! [`VringLayout`] with the minimal alignments 16/2/4), a kick eventfd (driver -> device) and a
//! call eventfd (device -> driver). It
//! - adds well-formed chains of [`Buffer`]s, directly in the table or through an indirect table;
//! - publishes them with a release store of `avail.idx` and notifies the device only when the
//!   device asked for it (`VRING_USED_F_NO_NOTIFY`, or `avail_event` with `VIRTIO_RING_F_EVENT_IDX`);
//! - waits for used entries with a timeout (`poll(2)` on the call eventfd), setting `used_event`
//!   when event indices are negotiated, and checks what the device returns (known head, sane
//!   `used.idx`);
//! - allows many chains in flight at once (pipelining).
//!
//! For robustness tests it also exposes raw hooks that bypass every check: [`RawDesc`] chains
//! with arbitrary `addr`/`len`/`flags`/`next` (loops, out-of-range addresses and indices,
//! writable-before-readable, zero lengths, nested indirect tables), raw heads in the available
//! ring, and raw writes of ring fields.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::VringConfigData;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error::{Error, Result};
use super::memory::{Arena, GuestMemory};

/// Descriptor flag: the chain continues at `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the buffer is device-writable.
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is an indirect descriptor table.
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
/// `used.flags`: the device does not need kicks.
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;
/// `avail.flags`: the driver does not need interrupts.
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Default number of descriptors per queue.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Largest split virtqueue size allowed by the virtio specification.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Size of one descriptor (`struct virtq_desc`).
pub const DESC_SIZE: u64 = 16;
/// Size of one used ring element (`struct virtq_used_elem`).
pub const USED_ELEM_SIZE: u64 = 8;

/// Where the three parts of a split virtqueue of `size` entries live in guest memory.
///
/// Parts are packed with the minimal alignments of virtio 1.x: descriptor table 16, available
/// ring 2, used ring 4 (the available ring ends on a 2-byte boundary, so the used ring usually
/// starts 2 bytes after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VringLayout {
    /// Number of entries.
    pub size: u16,
    /// Guest address of the descriptor table.
    pub desc: u64,
    /// Guest address of the available ring.
    pub avail: u64,
    /// Guest address of the used ring.
    pub used: u64,
}

impl VringLayout {
    /// Bytes of a descriptor table of `size` entries.
    pub fn desc_table_bytes(size: u16) -> u64 {
        DESC_SIZE * u64::from(size)
    }

    /// Bytes of an available ring: `flags`, `idx`, `ring[size]`, `used_event`.
    pub fn avail_ring_bytes(size: u16) -> u64 {
        6 + 2 * u64::from(size)
    }

    /// Bytes of a used ring: `flags`, `idx`, `ring[size]`, `avail_event`.
    pub fn used_ring_bytes(size: u16) -> u64 {
        6 + USED_ELEM_SIZE * u64::from(size)
    }

    /// Checks that `size` is a valid split virtqueue size (a power of two, 1..=32768).
    pub fn check_size(size: u16) -> Result<()> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(Error::Config(format!(
                "queue size {size} is not a power of two in 1..={MAX_QUEUE_SIZE}"
            )));
        }
        Ok(())
    }

    /// The layout of a queue of `size` entries starting at `base` (which must be 16-aligned).
    pub fn new(base: u64, size: u16) -> Result<Self> {
        Self::check_size(size)?;
        if base % 16 != 0 {
            return Err(Error::Config(format!(
                "descriptor table at {base:#x} is not 16-byte aligned"
            )));
        }
        let avail = base + Self::desc_table_bytes(size);
        let used = super::memory::align_up(avail + Self::avail_ring_bytes(size), 4);
        Ok(VringLayout {
            size,
            desc: base,
            avail,
            used,
        })
    }

    /// Bytes needed from `desc` to the end of the used ring.
    pub fn total_bytes(size: u16) -> u64 {
        let l = Self::new(0, size).expect("valid size");
        l.end()
    }

    /// One past the last byte of the used ring.
    pub fn end(&self) -> u64 {
        self.used + Self::used_ring_bytes(self.size)
    }

    /// Address of descriptor `i`.
    pub fn desc_addr(&self, i: u16) -> u64 {
        self.desc + DESC_SIZE * u64::from(i)
    }

    /// Address of `avail.flags`.
    pub fn avail_flags(&self) -> u64 {
        self.avail
    }

    /// Address of `avail.idx`.
    pub fn avail_idx(&self) -> u64 {
        self.avail + 2
    }

    /// Address of the available ring slot used by available index `idx` (taken modulo `size`).
    pub fn avail_slot(&self, idx: u16) -> u64 {
        self.avail + 4 + 2 * u64::from(idx % self.size)
    }

    /// Address of `used_event` (at the end of the available ring).
    pub fn used_event(&self) -> u64 {
        self.avail + 4 + 2 * u64::from(self.size)
    }

    /// Address of `used.flags`.
    pub fn used_flags(&self) -> u64 {
        self.used
    }

    /// Address of `used.idx`.
    pub fn used_idx(&self) -> u64 {
        self.used + 2
    }

    /// Address of the used ring element for used index `idx` (taken modulo `size`).
    pub fn used_slot(&self, idx: u16) -> u64 {
        self.used + 4 + USED_ELEM_SIZE * u64::from(idx % self.size)
    }

    /// Address of `avail_event` (at the end of the used ring).
    pub fn avail_event(&self) -> u64 {
        self.used + 4 + USED_ELEM_SIZE * u64::from(self.size)
    }
}

/// `vring_need_event()` of the virtio specification: whether moving an index from `old` to
/// `new` crosses `event` (all arithmetic modulo 2^16).
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// One buffer of a well-formed chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Guest physical address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable (`VIRTQ_DESC_F_WRITE`).
    pub writable: bool,
}

impl Buffer {
    /// A device-readable buffer.
    pub fn readable(addr: u64, len: u32) -> Self {
        Buffer {
            addr,
            len,
            writable: false,
        }
    }

    /// A device-writable buffer.
    pub fn writable(addr: u64, len: u32) -> Self {
        Buffer {
            addr,
            len,
            writable: true,
        }
    }
}

/// A descriptor exactly as stored in a descriptor table (`struct virtq_desc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawDescriptor {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl RawDescriptor {
    /// The 16 little-endian bytes of the descriptor.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }

    /// Parses 16 little-endian bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        RawDescriptor {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            len: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            flags: u16::from_le_bytes(b[12..14].try_into().unwrap()),
            next: u16::from_le_bytes(b[14..16].try_into().unwrap()),
        }
    }
}

/// Where a [`RawDesc`]'s `next` field points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The descriptor at this position of the same raw chain (or indirect table). Position 0 is
    /// the head, so `Slot(0)` from the last descriptor builds a loop.
    Slot(usize),
    /// This table index, verbatim (may be out of range).
    Index(u16),
}

/// A descriptor of a raw (unchecked) chain: the flags are used verbatim, `next` is resolved
/// against the descriptors actually allocated for the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDesc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: Next,
}

impl RawDesc {
    /// A lone device-readable descriptor (no `NEXT`).
    pub fn readable(addr: u64, len: u32) -> Self {
        RawDesc {
            addr,
            len,
            flags: 0,
            next: Next::Index(0),
        }
    }

    /// A lone device-writable descriptor (no `NEXT`).
    pub fn writable(addr: u64, len: u32) -> Self {
        RawDesc {
            addr,
            len,
            flags: VIRTQ_DESC_F_WRITE,
            next: Next::Index(0),
        }
    }

    /// Descriptors for `bufs` linked in order with `NEXT`, in any order of readable/writable and
    /// without any checks: a starting point for malformed chains (edit the result before
    /// submitting it).
    pub fn chain(bufs: &[Buffer]) -> Vec<RawDesc> {
        let n = bufs.len();
        bufs.iter()
            .enumerate()
            .map(|(i, b)| {
                let mut flags = if b.writable { VIRTQ_DESC_F_WRITE } else { 0 };
                if i + 1 < n {
                    flags |= VIRTQ_DESC_F_NEXT;
                }
                RawDesc {
                    addr: b.addr,
                    len: b.len,
                    flags,
                    next: if i + 1 < n {
                        Next::Slot(i + 1)
                    } else {
                        Next::Index(0)
                    },
                }
            })
            .collect()
    }
}

/// A used ring entry returned by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index of the chain.
    pub id: u16,
    /// Bytes the device says it wrote.
    pub len: u32,
    /// Total length of the chain's device-writable buffers, when the chain was added through a
    /// checked method (unknown for raw chains).
    pub writable_capacity: Option<u64>,
}

/// Counters, for benchmarks and notification-suppression tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Chains made available.
    pub added: u64,
    /// Used entries collected.
    pub completed: u64,
    /// Kick eventfd writes.
    pub kicks: u64,
    /// Notification checks that decided no kick was needed.
    pub kicks_suppressed: u64,
    /// Times the driver slept on the call eventfd and was woken by it.
    pub interrupts: u64,
}

/// Options for a [`Virtqueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOptions {
    /// Number of descriptors (power of two).
    pub size: u16,
    /// `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub event_idx: bool,
    /// `VIRTIO_RING_F_INDIRECT_DESC` was negotiated.
    pub indirect: bool,
    /// Starting value of `avail.idx` and `used.idx` (send it with `SET_VRING_BASE`); a value just
    /// below 65536 exercises index wraparound early.
    pub initial_index: u16,
    /// How long [`Virtqueue::wait_used`] waits before failing.
    pub timeout: Duration,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            size: DEFAULT_QUEUE_SIZE,
            event_idx: false,
            indirect: false,
            initial_index: 0,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Bookkeeping for one chain the device owns.
#[derive(Debug)]
struct InFlight {
    /// Descriptor table slots owned by the chain (freed when it comes back).
    slots: Vec<u16>,
    /// Indirect table allocated for it in the queue's indirect arena.
    indirect: Option<(u64, u64)>,
    writable_capacity: Option<u64>,
}

/// The driver side of one split virtqueue. See the module documentation.
pub struct Virtqueue {
    index: usize,
    mem: Arc<GuestMemory>,
    layout: VringLayout,
    kick: EventFd,
    call: EventFd,
    event_idx: bool,
    indirect: bool,
    timeout: Duration,
    /// Free descriptor table slots (a stack; popped from the end).
    free: Vec<u16>,
    in_flight: HashMap<u16, InFlight>,
    /// Next available index to fill (entries up to here are written to the ring).
    avail_shadow: u16,
    /// Value last stored to `avail.idx`.
    avail_published: u16,
    /// `avail.idx` at the last notification decision.
    notify_base: u16,
    /// Next used index to consume.
    last_used: u16,
    /// Indirect tables, carved lazily out of guest memory.
    indirect_arena: Option<Arena>,
    stats: QueueStats,
}

impl std::fmt::Debug for Virtqueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Virtqueue")
            .field("index", &self.index)
            .field("layout", &self.layout)
            .field("event_idx", &self.event_idx)
            .field("indirect", &self.indirect)
            .field("free", &self.free.len())
            .field("in_flight", &self.in_flight.len())
            .field("avail_shadow", &self.avail_shadow)
            .field("last_used", &self.last_used)
            .finish()
    }
}

impl Virtqueue {
    /// Allocates and initialises the rings of vring `index` in `mem` and creates its eventfds.
    /// The device still has to be told about it (see [`Virtqueue::vring_config`]).
    pub fn new(index: usize, mem: Arc<GuestMemory>, opts: &QueueOptions) -> Result<Self> {
        VringLayout::check_size(opts.size)?;
        let base = mem.alloc(VringLayout::total_bytes(opts.size), 64)?;
        let layout = VringLayout::new(base, opts.size)?;
        mem.fill(layout.desc, (layout.end() - layout.desc) as usize, 0)?;

        let start = opts.initial_index;
        mem.store::<u16>(layout.avail_idx(), start.to_le(), Ordering::Relaxed)?;
        mem.store::<u16>(layout.used_idx(), start.to_le(), Ordering::Relaxed)?;
        if opts.event_idx {
            mem.store::<u16>(layout.used_event(), start.to_le(), Ordering::Relaxed)?;
        }
        fence(Ordering::SeqCst);

        let kick = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::io("eventfd (kick)", e))?;
        let call = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::io("eventfd (call)", e))?;

        Ok(Virtqueue {
            index,
            mem,
            layout,
            kick,
            call,
            event_idx: opts.event_idx,
            indirect: opts.indirect,
            timeout: opts.timeout,
            // Pop order 0, 1, 2, ... for readable traces.
            free: (0..opts.size).rev().collect(),
            in_flight: HashMap::new(),
            avail_shadow: start,
            avail_published: start,
            notify_base: start,
            last_used: start,
            indirect_arena: None,
            stats: QueueStats::default(),
        })
    }

    /// The vring index (0 = virtio-fs high-priority queue, 1.. = request queues).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of descriptors.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// Where the rings are.
    pub fn layout(&self) -> VringLayout {
        self.layout
    }

    /// The guest memory the queue lives in.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.mem
    }

    /// The kick eventfd (give it to the device with `SET_VRING_KICK`).
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The call eventfd (give it to the device with `SET_VRING_CALL`).
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// Whether `VIRTIO_RING_F_EVENT_IDX` is in use.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// Whether indirect descriptors may be used by the checked methods.
    pub fn indirect_enabled(&self) -> bool {
        self.indirect
    }

    /// The `wait_used` timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the `wait_used` timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Free descriptor table slots.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Chains owned by the device (made available, not yet seen in the used ring).
    pub fn num_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Next available index the driver will fill.
    pub fn avail_index(&self) -> u16 {
        self.avail_shadow
    }

    /// Next used index the driver will consume.
    pub fn last_used_index(&self) -> u16 {
        self.last_used
    }

    /// `SET_VRING_ADDR` data: frontend userspace addresses of the three parts.
    pub fn vring_config(&self) -> Result<VringConfigData> {
        Ok(VringConfigData {
            queue_max_size: self.layout.size,
            queue_size: self.layout.size,
            flags: 0,
            desc_table_addr: self.mem.host_address(self.layout.desc)?,
            used_ring_addr: self.mem.host_address(self.layout.used)?,
            avail_ring_addr: self.mem.host_address(self.layout.avail)?,
            log_addr: None,
        })
    }

    // ---- checked chains ------------------------------------------------------------------

    /// Adds a well-formed chain (device-readable buffers first, then device-writable ones; every
    /// buffer non-empty and inside guest memory) to the available ring, directly or through an
    /// indirect table. Returns the head index. The chain is not visible to the device until
    /// [`Virtqueue::publish`].
    pub fn add_chain(&mut self, bufs: &[Buffer], indirect: bool) -> Result<u16> {
        if bufs.is_empty() {
            return Err(Error::InvalidChain("empty chain".into()));
        }
        if let Some(i) = bufs
            .windows(2)
            .position(|w| w[0].writable && !w[1].writable)
        {
            return Err(Error::InvalidChain(format!(
                "readable buffer {} follows a writable one",
                i + 1
            )));
        }
        for b in bufs {
            if b.len == 0 {
                return Err(Error::InvalidChain("zero-length buffer".into()));
            }
            if !self.mem.contains(b.addr, u64::from(b.len)) {
                return Err(Error::AddressOutOfRange {
                    addr: b.addr,
                    len: u64::from(b.len),
                });
            }
        }
        self.add_chain_unchecked(bufs, indirect)
    }

    /// Like [`Virtqueue::add_chain`] but without the ordering, length and address checks: the
    /// chain is correctly linked, whatever it contains (writable before readable, zero-length,
    /// out-of-range addresses...). Indirect use still requires the feature.
    pub fn add_chain_unchecked(&mut self, bufs: &[Buffer], indirect: bool) -> Result<u16> {
        if bufs.is_empty() {
            return Err(Error::InvalidChain("empty chain".into()));
        }
        if bufs.len() > usize::from(self.layout.size) {
            return Err(Error::InvalidChain(format!(
                "chain of {} descriptors is longer than the queue ({})",
                bufs.len(),
                self.layout.size
            )));
        }
        if indirect && !self.indirect {
            return Err(Error::NotNegotiated("VIRTIO_RING_F_INDIRECT_DESC"));
        }
        let cap = bufs
            .iter()
            .filter(|b| b.writable)
            .map(|b| u64::from(b.len))
            .sum();
        let raw = RawDesc::chain(bufs);
        let head = if indirect {
            self.place_indirect(VIRTQ_DESC_F_INDIRECT, &raw, None)?
        } else {
            self.place_direct(&raw)?
        };
        if let Some(f) = self.in_flight.get_mut(&head) {
            f.writable_capacity = Some(cap);
        }
        Ok(head)
    }

    /// [`add_chain`](Self::add_chain), [`publish`](Self::publish) and
    /// [`notify`](Self::notify) in one go.
    pub fn submit(&mut self, bufs: &[Buffer], indirect: bool) -> Result<u16> {
        let head = self.add_chain(bufs, indirect)?;
        self.publish();
        self.notify()?;
        Ok(head)
    }

    // ---- raw chains (robustness tests) ---------------------------------------------------

    /// Adds a raw chain: `descs[0]` becomes the head; each descriptor is written with its flags
    /// verbatim and `next` resolved ([`Next::Slot`] to the table slot allocated for that
    /// position). Nothing is validated. Returns the head index; publish with
    /// [`Virtqueue::publish`].
    pub fn add_raw_chain(&mut self, descs: &[RawDesc]) -> Result<u16> {
        if descs.is_empty() {
            return Err(Error::InvalidChain("empty raw chain".into()));
        }
        self.place_direct(descs)
    }

    /// Adds a chain whose head is an indirect descriptor with `head_flags` (normally just
    /// `VIRTQ_DESC_F_INDIRECT`; add `NEXT` or `WRITE` to make it illegal) pointing at a table
    /// holding `table` ([`Next::Slot`] resolves to a position in the table). `table_len`
    /// overrides the head's length (default `16 * table.len()`). Works even when indirect
    /// descriptors were not negotiated. Returns the head index.
    pub fn add_raw_indirect(
        &mut self,
        head_flags: u16,
        table: &[RawDesc],
        table_len: Option<u32>,
    ) -> Result<u16> {
        self.place_indirect(head_flags, table, table_len)
    }

    /// Takes `n` descriptor table slots off the free list, for chains built entirely by hand
    /// with [`write_descriptor`](Self::write_descriptor) and
    /// [`push_avail_head`](Self::push_avail_head).
    pub fn take_slots(&mut self, n: usize) -> Result<Vec<u16>> {
        if n > self.free.len() {
            return Err(Error::QueueFull {
                needed: n,
                free: self.free.len(),
            });
        }
        let at = self.free.len() - n;
        let mut v = self.free.split_off(at);
        v.reverse();
        Ok(v)
    }

    /// Returns slots taken with [`take_slots`](Self::take_slots) that were never made available.
    pub fn return_slots(&mut self, slots: &[u16]) {
        for &s in slots.iter().rev() {
            debug_assert!(!self.free.contains(&s), "slot {s} returned twice");
            self.free.push(s);
        }
    }

    /// Writes descriptor table entry `index` verbatim.
    pub fn write_descriptor(&self, index: u16, desc: RawDescriptor) -> Result<()> {
        if index >= self.layout.size {
            return Err(Error::InvalidChain(format!(
                "descriptor index {index} outside the table ({})",
                self.layout.size
            )));
        }
        self.mem
            .write(self.layout.desc_addr(index), &desc.to_bytes())
    }

    /// Reads descriptor table entry `index`.
    pub fn read_descriptor(&self, index: u16) -> Result<RawDescriptor> {
        if index >= self.layout.size {
            return Err(Error::InvalidChain(format!(
                "descriptor index {index} outside the table ({})",
                self.layout.size
            )));
        }
        Self::read_descriptor_at(&self.mem, self.layout.desc_addr(index))
    }

    /// Reads a descriptor anywhere in guest memory (e.g. in an indirect table).
    pub fn read_descriptor_at(mem: &GuestMemory, gpa: u64) -> Result<RawDescriptor> {
        let mut b = [0u8; 16];
        mem.read(gpa, &mut b)?;
        Ok(RawDescriptor::from_bytes(&b))
    }

    /// Writes descriptors anywhere in guest memory (e.g. a hand-made indirect table).
    pub fn write_descriptors_at(
        mem: &GuestMemory,
        gpa: u64,
        descs: &[RawDescriptor],
    ) -> Result<()> {
        for (i, d) in descs.iter().enumerate() {
            mem.write(gpa + DESC_SIZE * i as u64, &d.to_bytes())?;
        }
        Ok(())
    }

    /// Puts `head` (any value, even outside the table) into the next available ring slot and
    /// records it as owned by the device together with `owned_slots`, which are freed when the
    /// device returns `head`. Publish with [`Virtqueue::publish`].
    pub fn push_avail_head(&mut self, head: u16, owned_slots: Vec<u16>) -> Result<()> {
        if self.in_flight.contains_key(&head) {
            return Err(Error::InvalidChain(format!(
                "head {head} is already owned by the device"
            )));
        }
        self.push_head(head)?;
        self.in_flight.insert(
            head,
            InFlight {
                slots: owned_slots,
                indirect: None,
                writable_capacity: None,
            },
        );
        Ok(())
    }

    /// Stores `idx` into `avail.idx` without any bookkeeping (e.g. to make the device see more
    /// than `size` new entries). The queue's own state is not updated: use only for tests that
    /// expect the device to give up on this queue.
    pub fn write_avail_idx_raw(&mut self, idx: u16) -> Result<()> {
        fence(Ordering::SeqCst);
        self.mem
            .store::<u16>(self.layout.avail_idx(), idx.to_le(), Ordering::Release)?;
        Ok(())
    }

    /// Stores `flags` into `avail.flags` (e.g. `VRING_AVAIL_F_NO_INTERRUPT`).
    pub fn write_avail_flags(&self, flags: u16) -> Result<()> {
        self.mem
            .store::<u16>(self.layout.avail_flags(), flags.to_le(), Ordering::Release)?;
        Ok(())
    }

    /// Stores `idx` into `used_event` (only meaningful with event indices).
    pub fn write_used_event(&self, idx: u16) -> Result<()> {
        self.mem
            .store::<u16>(self.layout.used_event(), idx.to_le(), Ordering::Release)?;
        Ok(())
    }

    /// Current `used.idx` as written by the device.
    pub fn read_used_idx(&self) -> Result<u16> {
        Ok(u16::from_le(
            self.mem
                .load::<u16>(self.layout.used_idx(), Ordering::Acquire)?,
        ))
    }

    /// Current `used.flags` as written by the device.
    pub fn read_used_flags(&self) -> Result<u16> {
        Ok(u16::from_le(self.mem.load::<u16>(
            self.layout.used_flags(),
            Ordering::Acquire,
        )?))
    }

    /// Current `avail_event` as written by the device.
    pub fn read_avail_event(&self) -> Result<u16> {
        Ok(u16::from_le(self.mem.load::<u16>(
            self.layout.avail_event(),
            Ordering::Acquire,
        )?))
    }

    // ---- publishing and notification -----------------------------------------------------

    /// Makes every added chain visible to the device: a release store of `avail.idx` (all ring
    /// and descriptor writes before it become visible first).
    pub fn publish(&mut self) {
        if self.avail_published == self.avail_shadow {
            return;
        }
        fence(Ordering::Release);
        self.mem
            .store::<u16>(
                self.layout.avail_idx(),
                self.avail_shadow.to_le(),
                Ordering::Release,
            )
            .expect("avail.idx inside guest memory");
        self.avail_published = self.avail_shadow;
    }

    /// Kicks the device if it wants to hear about the chains published since the last call
    /// (`avail_event` with event indices, else `VRING_USED_F_NO_NOTIFY`). Returns whether it
    /// kicked.
    pub fn notify(&mut self) -> Result<bool> {
        let new = self.avail_published;
        let old = self.notify_base;
        if new == old {
            return Ok(false);
        }
        self.notify_base = new;
        // The avail.idx store must be visible before we read the device's suppression state.
        fence(Ordering::SeqCst);
        let needed = if self.event_idx {
            vring_need_event(self.read_avail_event()?, new, old)
        } else {
            self.read_used_flags()? & VRING_USED_F_NO_NOTIFY == 0
        };
        if needed {
            self.kick()?;
        } else {
            self.stats.kicks_suppressed += 1;
        }
        Ok(needed)
    }

    /// Kicks the device unconditionally.
    pub fn kick(&mut self) -> Result<()> {
        self.kick.write(1).map_err(|e| Error::io("kick", e))?;
        self.stats.kicks += 1;
        Ok(())
    }

    // ---- completions ---------------------------------------------------------------------

    /// Collects one used entry if the device returned any. Fails if the device returned a head
    /// it does not own or moved `used.idx` by more than the queue size.
    pub fn pop_used(&mut self) -> Result<Option<UsedElem>> {
        let used_idx = self.read_used_idx()?;
        let pending = used_idx.wrapping_sub(self.last_used);
        if pending == 0 {
            return Ok(None);
        }
        if pending > self.layout.size {
            return Err(Error::UsedRingCorrupt {
                queue: self.index,
                used_idx,
                last_used: self.last_used,
            });
        }
        // used.idx was loaded with acquire ordering, so the element is fully written.
        let slot = self.layout.used_slot(self.last_used);
        let id = u32::from_le(self.mem.load::<u32>(slot, Ordering::Relaxed)?);
        let len = u32::from_le(self.mem.load::<u32>(slot + 4, Ordering::Relaxed)?);
        self.last_used = self.last_used.wrapping_add(1);

        let entry = u16::try_from(id)
            .ok()
            .and_then(|id16| self.in_flight.remove(&id16).map(|f| (id16, f)));
        let Some((id16, flight)) = entry else {
            return Err(Error::UnknownUsedId {
                queue: self.index,
                id,
            });
        };
        for s in flight.slots.iter().rev() {
            self.free.push(*s);
        }
        if let (Some((addr, len)), Some(arena)) = (flight.indirect, self.indirect_arena.as_mut()) {
            arena.free(addr, len);
        }
        self.stats.completed += 1;
        Ok(Some(UsedElem {
            id: id16,
            len,
            writable_capacity: flight.writable_capacity,
        }))
    }

    /// Waits up to the queue's timeout for one used entry.
    pub fn wait_used(&mut self) -> Result<UsedElem> {
        self.wait_used_for(self.timeout)
    }

    /// Waits up to `timeout` for one used entry: checks the used ring, then (after asking for an
    /// interrupt through `used_event` with event indices) sleeps in `poll(2)` on the call
    /// eventfd. Fails with [`Error::Timeout`] when nothing arrives, and immediately with
    /// [`Error::Idle`] when the device owns no chain.
    pub fn wait_used_for(&mut self, timeout: Duration) -> Result<UsedElem> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.pop_used()? {
                return Ok(e);
            }
            if self.in_flight.is_empty() {
                return Err(Error::Idle { queue: self.index });
            }
            if self.event_idx {
                // Interrupt me when the entry at `last_used` is written.
                self.write_used_event(self.last_used)?;
            }
            fence(Ordering::SeqCst);
            if self.read_used_idx()? != self.last_used {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    queue: self.index,
                    waited: timeout,
                    in_flight: self.in_flight.len(),
                });
            }
            if self.sleep_on_call(deadline - now)? {
                self.stats.interrupts += 1;
            }
        }
    }

    /// Sleeps until the call eventfd fires or `timeout` passes; drains the eventfd. Returns
    /// whether it fired.
    fn sleep_on_call(&self, timeout: Duration) -> Result<bool> {
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd: self.call.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::io("poll(call eventfd)", e));
        }
        if r == 0 {
            return Ok(false);
        }
        match self.call.read() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(Error::io("read(call eventfd)", e)),
        }
    }

    // ---- internals -----------------------------------------------------------------------

    fn resolve_next(next: Next, slots: &[u16]) -> Result<u16> {
        match next {
            Next::Index(i) => Ok(i),
            Next::Slot(p) => slots.get(p).copied().ok_or_else(|| {
                Error::InvalidChain(format!(
                    "Next::Slot({p}) outside a chain of {} descriptors",
                    slots.len()
                ))
            }),
        }
    }

    fn place_direct(&mut self, descs: &[RawDesc]) -> Result<u16> {
        let slots = self.take_slots(descs.len())?;
        let written = (|| {
            for (i, d) in descs.iter().enumerate() {
                let next = Self::resolve_next(d.next, &slots)?;
                self.write_descriptor(
                    slots[i],
                    RawDescriptor {
                        addr: d.addr,
                        len: d.len,
                        flags: d.flags,
                        next,
                    },
                )?;
            }
            self.push_head(slots[0])
        })();
        if let Err(e) = written {
            self.return_slots(&slots);
            return Err(e);
        }
        let head = slots[0];
        self.in_flight.insert(
            head,
            InFlight {
                slots,
                indirect: None,
                writable_capacity: None,
            },
        );
        Ok(head)
    }

    fn indirect_arena(&mut self) -> Result<&mut Arena> {
        if self.indirect_arena.is_none() {
            // Room for every slot to carry a 16-entry table, capped at 1 MiB.
            let size = u64::from(self.layout.size) * DESC_SIZE * 16;
            let size = size.clamp(4096, 1 << 20);
            let base = self.mem.alloc(size, 16)?;
            self.indirect_arena = Some(Arena::new(base, size));
        }
        Ok(self.indirect_arena.as_mut().expect("just created"))
    }

    fn place_indirect(
        &mut self,
        head_flags: u16,
        table: &[RawDesc],
        table_len: Option<u32>,
    ) -> Result<u16> {
        let bytes = (DESC_SIZE * table.len() as u64).max(DESC_SIZE);
        let table_addr =
            self.indirect_arena()?
                .alloc(bytes, 16)
                .ok_or(Error::OutOfGuestMemory {
                    requested: bytes,
                    available: 0,
                })?;
        let release = |q: &mut Self| {
            if let Some(a) = q.indirect_arena.as_mut() {
                a.free(table_addr, bytes)
            }
        };
        // Positions inside an indirect table are table indices.
        let positions: Vec<u16> = (0..table.len()).map(|i| i as u16).collect();
        let mut entries = Vec::with_capacity(table.len());
        for d in table {
            match Self::resolve_next(d.next, &positions) {
                Ok(next) => entries.push(RawDescriptor {
                    addr: d.addr,
                    len: d.len,
                    flags: d.flags,
                    next,
                }),
                Err(e) => {
                    release(self);
                    return Err(e);
                }
            }
        }
        if let Err(e) = Self::write_descriptors_at(&self.mem, table_addr, &entries) {
            release(self);
            return Err(e);
        }
        let slots = match self.take_slots(1) {
            Ok(s) => s,
            Err(e) => {
                release(self);
                return Err(e);
            }
        };
        let head = slots[0];
        let res = self
            .write_descriptor(
                head,
                RawDescriptor {
                    addr: table_addr,
                    len: table_len.unwrap_or((DESC_SIZE * table.len() as u64) as u32),
                    flags: head_flags,
                    next: 0,
                },
            )
            .and_then(|()| self.push_head(head));
        if let Err(e) = res {
            self.return_slots(&slots);
            release(self);
            return Err(e);
        }
        self.in_flight.insert(
            head,
            InFlight {
                slots,
                indirect: Some((table_addr, bytes)),
                writable_capacity: None,
            },
        );
        Ok(head)
    }

    fn push_head(&mut self, head: u16) -> Result<()> {
        self.mem.store::<u16>(
            self.layout.avail_slot(self.avail_shadow),
            head.to_le(),
            Ordering::Relaxed,
        )?;
        self.avail_shadow = self.avail_shadow.wrapping_add(1);
        self.stats.added += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::DEFAULT_GPA_BASE;

    #[test]
    fn layout_math_matches_the_spec() {
        let l = VringLayout::new(0x10000, 256).unwrap();
        assert_eq!(l.desc, 0x10000);
        assert_eq!(l.avail, 0x10000 + 4096);
        // avail ring: 4 + 2 * 256 + 2 = 518 bytes, used ring 4-aligned after it.
        assert_eq!(l.used, super::super::memory::align_up(l.avail + 518, 4));
        assert_eq!(l.used - l.avail, 520);
        assert_eq!(l.used_event(), l.avail + 4 + 512);
        assert_eq!(l.avail_event(), l.used + 4 + 8 * 256);
        assert_eq!(l.end(), l.used + 6 + 8 * 256);
        assert_eq!(l.avail_slot(0), l.avail + 4);
        assert_eq!(l.avail_slot(257), l.avail + 4 + 2);
        assert_eq!(l.used_slot(65535), l.used + 4 + 8 * 255);
        assert_eq!(l.desc_addr(3), 0x10000 + 48);

        for size in [1u16, 2, 4, 8, 16, 128, 1024, 32768] {
            let l = VringLayout::new(0x2000, size).unwrap();
            assert_eq!(l.desc % 16, 0);
            assert_eq!(l.avail % 2, 0);
            assert_eq!(l.used % 4, 0);
            assert!(l.avail >= l.desc + 16 * u64::from(size));
            assert!(l.used >= l.avail + 6 + 2 * u64::from(size));
            assert_eq!(VringLayout::total_bytes(size), l.end() - l.desc);
        }
        assert!(VringLayout::new(0x2000, 0).is_err());
        assert!(VringLayout::new(0x2000, 3).is_err());
        assert!(VringLayout::new(0x2000, 65535).is_err());
        assert!(VringLayout::new(0x2008, 16).is_err());
    }

    #[test]
    fn need_event_handles_wraparound() {
        // Device asked to be kicked once entry 5 is made available.
        assert!(vring_need_event(5, 6, 5));
        assert!(vring_need_event(5, 10, 4));
        assert!(!vring_need_event(5, 5, 4));
        assert!(!vring_need_event(10, 8, 4));
        // Across the 16-bit wrap.
        assert!(vring_need_event(65535, 2, 65534));
        assert!(vring_need_event(0, 1, 65535));
        assert!(!vring_need_event(1, 1, 65535));
        assert!(!vring_need_event(5, 5, 5));
    }

    #[test]
    fn descriptor_bytes_round_trip() {
        let d = RawDescriptor {
            addr: 0x1122_3344_5566_7788,
            len: 0x99aa_bbcc,
            flags: 0x0102,
            next: 0x0304,
        };
        let b = d.to_bytes();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(RawDescriptor::from_bytes(&b), d);
    }

    fn queue(size: u16, event_idx: bool, initial_index: u16) -> Virtqueue {
        let mem = Arc::new(GuestMemory::new(4 << 20, DEFAULT_GPA_BASE).unwrap());
        let opts = QueueOptions {
            size,
            event_idx,
            indirect: true,
            initial_index,
            timeout: Duration::from_millis(200),
        };
        Virtqueue::new(1, mem, &opts).unwrap()
    }

    /// A minimal in-process device: consumes every available chain and returns it with `len`
    /// equal to its writable capacity, checking what it finds.
    struct FakeDevice {
        next_avail: u16,
        next_used: u16,
    }

    impl FakeDevice {
        fn walk(q: &Virtqueue, head: u16) -> (Vec<RawDescriptor>, u32) {
            let mut d = q.read_descriptor(head).unwrap();
            let mut out = Vec::new();
            let mut written = 0;
            if d.flags & VIRTQ_DESC_F_INDIRECT != 0 {
                for i in 0..d.len as u64 / 16 {
                    let e = Virtqueue::read_descriptor_at(q.memory(), d.addr + 16 * i).unwrap();
                    if e.flags & VIRTQ_DESC_F_WRITE != 0 {
                        written += e.len;
                    }
                    out.push(e);
                }
                return (out, written);
            }
            loop {
                if d.flags & VIRTQ_DESC_F_WRITE != 0 {
                    written += d.len;
                }
                out.push(d);
                if d.flags & VIRTQ_DESC_F_NEXT == 0 {
                    return (out, written);
                }
                d = q.read_descriptor(d.next).unwrap();
            }
        }

        fn run(&mut self, q: &Virtqueue) -> usize {
            let mem = q.memory();
            let l = q.layout();
            let avail = u16::from_le(mem.load::<u16>(l.avail_idx(), Ordering::Acquire).unwrap());
            let mut n = 0;
            while self.next_avail != avail {
                let head = u16::from_le(
                    mem.load::<u16>(l.avail_slot(self.next_avail), Ordering::Relaxed)
                        .unwrap(),
                );
                let (_descs, written) = Self::walk(q, head);
                let slot = l.used_slot(self.next_used);
                mem.store::<u32>(slot, u32::from(head).to_le(), Ordering::Relaxed)
                    .unwrap();
                mem.store::<u32>(slot + 4, written.to_le(), Ordering::Relaxed)
                    .unwrap();
                self.next_avail = self.next_avail.wrapping_add(1);
                self.next_used = self.next_used.wrapping_add(1);
                n += 1;
            }
            fence(Ordering::Release);
            mem.store::<u16>(l.used_idx(), self.next_used.to_le(), Ordering::Release)
                .unwrap();
            // Ask for a kick at the next entry.
            mem.store::<u16>(l.avail_event(), self.next_avail.to_le(), Ordering::Release)
                .unwrap();
            n
        }
    }

    #[test]
    fn ring_indices_wrap_around() {
        let start = 65530;
        let mut q = queue(8, true, start);
        let mut dev = FakeDevice {
            next_avail: start,
            next_used: start,
        };
        // Like a real device, ask for a kick at the first entry.
        q.memory()
            .store::<u16>(q.layout().avail_event(), start.to_le(), Ordering::Release)
            .unwrap();
        let buf = q.memory().alloc(64, 8).unwrap();
        let mut total = 0u64;
        // 3 chains of up to 3 descriptors per round keep the 8-entry queue busy across many
        // wraps of both the ring slots and the 16-bit indices.
        for round in 0..30_000u32 {
            let mut heads = Vec::new();
            for k in 0..3u32 {
                let bufs = [
                    Buffer::readable(buf, 8),
                    Buffer::writable(buf + 8, 16 + k),
                    Buffer::writable(buf + 32, 8),
                ];
                let indirect = (round + k) % 4 == 0;
                heads.push(
                    q.add_chain(&bufs[..1 + (k as usize % 3)], indirect)
                        .unwrap(),
                );
            }
            q.publish();
            q.notify().unwrap();
            assert_eq!(dev.run(&q), 3);
            for _ in 0..3 {
                let e = q.wait_used().unwrap();
                assert!(heads.contains(&e.id));
                assert_eq!(Some(u64::from(e.len)), e.writable_capacity);
                total += 1;
            }
            assert_eq!(q.num_free(), 8);
            assert_eq!(q.num_in_flight(), 0);
        }
        assert_eq!(total, 90_000);
        assert_eq!(q.avail_index(), start.wrapping_add(90_000u32 as u16));
        assert_eq!(q.last_used_index(), q.avail_index());
        assert!(matches!(q.wait_used(), Err(Error::Idle { .. })));
        let s = q.stats();
        assert_eq!((s.added, s.completed), (90_000, 90_000));
        // The fake device always asks for the next entry, so every batch kicked once.
        assert_eq!(s.kicks, 30_000);
    }

    #[test]
    fn notification_suppression_without_event_idx() {
        let mut q = queue(4, false, 0);
        let buf = q.memory().alloc(64, 8).unwrap();
        q.add_chain(&[Buffer::readable(buf, 8)], false).unwrap();
        q.publish();
        assert!(q.notify().unwrap());
        // The device says "don't kick me".
        q.memory()
            .store::<u16>(
                q.layout().used_flags(),
                VRING_USED_F_NO_NOTIFY.to_le(),
                Ordering::Release,
            )
            .unwrap();
        q.add_chain(&[Buffer::readable(buf, 8)], false).unwrap();
        q.publish();
        assert!(!q.notify().unwrap());
        // Nothing new published: no kick either way.
        assert!(!q.notify().unwrap());
        assert_eq!(q.stats().kicks, 1);
        assert_eq!(q.stats().kicks_suppressed, 1);
        assert_eq!(q.kick_fd().read().unwrap(), 1);
    }

    #[test]
    fn checked_chains_reject_malformed_input() {
        let mut q = queue(4, false, 0);
        let mem = q.memory().clone();
        let buf = mem.alloc(64, 8).unwrap();
        let r = Buffer::readable(buf, 8);
        let w = Buffer::writable(buf + 8, 8);
        assert!(matches!(
            q.add_chain(&[], false),
            Err(Error::InvalidChain(_))
        ));
        assert!(matches!(
            q.add_chain(&[w, r], false),
            Err(Error::InvalidChain(_))
        ));
        assert!(matches!(
            q.add_chain(&[Buffer::readable(buf, 0)], false),
            Err(Error::InvalidChain(_))
        ));
        assert!(matches!(
            q.add_chain(&[Buffer::readable(mem.gpa_end(), 8)], false),
            Err(Error::AddressOutOfRange { .. })
        ));
        assert!(matches!(
            q.add_chain(&[r, r, r, r, r], false),
            Err(Error::QueueFull { .. }) | Err(Error::InvalidChain(_))
        ));
        assert_eq!(q.num_free(), 4);
        // The unchecked variant builds them, correctly linked.
        let head = q.add_chain_unchecked(&[w, r], false).unwrap();
        let d0 = q.read_descriptor(head).unwrap();
        assert_eq!(d0.flags, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT);
        let d1 = q.read_descriptor(d0.next).unwrap();
        assert_eq!((d1.addr, d1.flags), (buf, 0));
        assert_eq!(q.num_free(), 2);
        // Not yet published.
        assert_eq!(
            u16::from_le(
                mem.load::<u16>(q.layout().avail_idx(), Ordering::Relaxed)
                    .unwrap()
            ),
            0
        );
        q.publish();
        assert_eq!(
            u16::from_le(
                mem.load::<u16>(q.layout().avail_idx(), Ordering::Relaxed)
                    .unwrap()
            ),
            1
        );
    }

    #[test]
    fn raw_chains_are_written_verbatim() {
        let mut q = queue(8, false, 0);
        let mem = q.memory().clone();
        let buf = mem.alloc(64, 8).unwrap();
        // A loop: 0 -> 1 -> 2 -> 0.
        let mut descs = RawDesc::chain(&[
            Buffer::readable(buf, 40),
            Buffer::readable(buf + 40, 8),
            Buffer::writable(buf, 16),
        ]);
        descs[2].flags |= VIRTQ_DESC_F_NEXT;
        descs[2].next = Next::Slot(0);
        let head = q.add_raw_chain(&descs).unwrap();
        let d0 = q.read_descriptor(head).unwrap();
        let d1 = q.read_descriptor(d0.next).unwrap();
        let d2 = q.read_descriptor(d1.next).unwrap();
        assert_eq!(d2.next, head);
        assert_eq!(d2.flags, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT);

        // Out-of-range next index and address, zero length.
        let h2 = q
            .add_raw_chain(&[RawDesc {
                addr: u64::MAX - 7,
                len: 0,
                flags: VIRTQ_DESC_F_NEXT,
                next: Next::Index(1000),
            }])
            .unwrap();
        let d = q.read_descriptor(h2).unwrap();
        assert_eq!((d.addr, d.len, d.next), (u64::MAX - 7, 0, 1000));

        // Indirect head with NEXT set, and a table holding a nested indirect descriptor.
        let h3 = q
            .add_raw_indirect(
                VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT,
                &[RawDesc {
                    addr: buf,
                    len: 16,
                    flags: VIRTQ_DESC_F_INDIRECT,
                    next: Next::Index(0),
                }],
                Some(17),
            )
            .unwrap();
        let h = q.read_descriptor(h3).unwrap();
        assert_eq!(h.len, 17);
        assert_eq!(h.flags, VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT);
        let t = Virtqueue::read_descriptor_at(&mem, h.addr).unwrap();
        assert_eq!(t.flags, VIRTQ_DESC_F_INDIRECT);

        // A raw head outside the table.
        q.push_avail_head(9999, Vec::new()).unwrap();
        assert!(q.push_avail_head(9999, Vec::new()).is_err());
        q.publish();
        let ring: Vec<u16> = (0..4)
            .map(|i| {
                u16::from_le(
                    mem.load::<u16>(q.layout().avail_slot(i), Ordering::Relaxed)
                        .unwrap(),
                )
            })
            .collect();
        assert_eq!(ring, vec![head, h2, h3, 9999]);
        assert_eq!(q.num_in_flight(), 4);
        assert_eq!(q.num_free(), 8 - 3 - 1 - 1);

        // The device returns the out-of-range head and a head it never got.
        let l = q.layout();
        mem.store::<u32>(l.used_slot(0), 9999u32.to_le(), Ordering::Relaxed)
            .unwrap();
        mem.store::<u32>(l.used_slot(1), 7u32.to_le(), Ordering::Relaxed)
            .unwrap();
        mem.store::<u16>(l.used_idx(), 2u16.to_le(), Ordering::Release)
            .unwrap();
        let e = q.pop_used().unwrap().unwrap();
        assert_eq!((e.id, e.writable_capacity), (9999, None));
        assert!(matches!(
            q.pop_used(),
            Err(Error::UnknownUsedId { id: 7, .. })
        ));
        // A used index that jumps by more than the queue size.
        mem.store::<u16>(l.used_idx(), 100u16.to_le(), Ordering::Release)
            .unwrap();
        assert!(matches!(q.pop_used(), Err(Error::UsedRingCorrupt { .. })));
    }

    #[test]
    fn waiting_times_out_and_wakes_on_call() {
        let mut q = queue(4, true, 0);
        let buf = q.memory().alloc(64, 8).unwrap();
        let head = q.submit(&[Buffer::writable(buf, 16)], false).unwrap();
        let t = Instant::now();
        assert!(matches!(
            q.wait_used_for(Duration::from_millis(50)),
            Err(Error::Timeout { in_flight: 1, .. })
        ));
        assert!(t.elapsed() >= Duration::from_millis(50));
        // used_event was set to ask for an interrupt at the next entry.
        assert_eq!(
            u16::from_le(
                q.memory()
                    .load::<u16>(q.layout().used_event(), Ordering::Relaxed)
                    .unwrap()
            ),
            0
        );

        // Complete it from another thread and signal the call eventfd.
        let mem = q.memory().clone();
        let l = q.layout();
        let call = q.call_fd().try_clone().unwrap();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            mem.store::<u32>(l.used_slot(0), u32::from(head).to_le(), Ordering::Relaxed)
                .unwrap();
            mem.store::<u32>(l.used_slot(0) + 4, 16u32.to_le(), Ordering::Relaxed)
                .unwrap();
            mem.store::<u16>(l.used_idx(), 1u16.to_le(), Ordering::Release)
                .unwrap();
            call.write(1).unwrap();
        });
        let e = q.wait_used_for(Duration::from_secs(5)).unwrap();
        th.join().unwrap();
        assert_eq!((e.id, e.len), (head, 16));
        assert_eq!(q.stats().interrupts, 1);
    }
}
