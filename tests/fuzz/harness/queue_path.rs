//! The virtqueue path: raw guest memory and descriptors → `pop_descriptor_chain` →
//! `split_chain` → `Server::handle_message` → `add_used`, as `FsBackend::process_queue` does.
//!
//! Input: `[avail idx: u16][mode: u8][memory image...]`. Guest memory is 64 KiB in two adjacent
//! 32 KiB regions (so buffers crossing 0x8000 span two slices); the image is copied to guest
//! address 0, where the 16-entry queue's descriptor table lives (then the available and used
//! rings). `mode` bit 0: mask descriptor addresses to 16 bits (most land inside guest memory);
//! bit 1: event index enabled. At most 64 chains are popped, so no input can loop forever.

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use virtiofs_fuse::io::{SliceReader, VecWriter};
use virtiofs_fuse::server::Server;
use virtiofsd::vhost_user::descriptor::split_chain;
use virtiofsd::vhost_user::descriptor::GuestMemory;
use virtiofsd_frontend::VringLayout;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::common;

const MEM_SIZE: usize = 0x10000;
const QUEUE_SIZE: u16 = 16;
const MAX_POPS: usize = 64;

/// Runs one input; panics on a broken invariant.
pub fn run(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let avail_idx = u16::from_le_bytes([data[0], data[1]]);
    let mode = data[2];
    let image = &data[3..data.len().min(3 + MEM_SIZE)];

    let mem: GuestMemory =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x8000), (GuestAddress(0x8000), 0x8000)])
            .unwrap();
    mem.write_slice(image, GuestAddress(0)).unwrap();

    let layout = VringLayout::new(0, QUEUE_SIZE).unwrap();
    if mode & 1 != 0 {
        for i in 0..QUEUE_SIZE {
            let a = GuestAddress(layout.desc_addr(i));
            let addr: u64 = mem.read_obj(a).unwrap();
            mem.write_obj(addr & 0xffff, a).unwrap();
        }
    }
    mem.write_obj(avail_idx, GuestAddress(layout.avail_idx()))
        .unwrap();

    let mut q = Queue::new(QUEUE_SIZE).unwrap();
    q.set_size(QUEUE_SIZE);
    q.set_desc_table_address(Some(layout.desc as u32), Some(0));
    q.set_avail_ring_address(Some(layout.avail as u32), Some(0));
    q.set_used_ring_address(Some(layout.used as u32), Some(0));
    q.set_event_idx(mode & 2 != 0);
    q.set_ready(true);
    assert!(q.is_valid(&mem));

    let srv = Server::new(common::FixedFs::new());
    let init = common::init_request(41, u64::MAX);
    srv.handle_message(SliceReader::new(&init), VecWriter::new(4096))
        .unwrap();

    for _ in 0..MAX_POPS {
        let Some(chain) = q.pop_descriptor_chain(&mem) else {
            break;
        };
        let head = chain.head_index();
        let len = match split_chain(&mem, chain) {
            Ok((r, w)) => srv.handle_message(r, w).map(|n| n as u32).unwrap_or(0),
            Err(_) => 0,
        };
        // A head outside the table is refused; the backend only logs it.
        let _ = q.add_used(&mem, head, len);
    }
    let _ = q.needs_notification(&mem);
    // Iterating the queue as well (the other pop path) must stay bounded too.
    if let Ok(mut it) = q.iter(&mem) {
        for chain in it.by_ref().take(MAX_POPS) {
            for _d in chain.take(1024) {}
        }
    }
}
