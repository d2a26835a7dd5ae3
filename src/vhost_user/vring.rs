//! The virtqueue type of the device: `vhost-user-backend`'s `VringRwLock`, except that the
//! next used index is not reset while the queue runs.
//!
//! When a migration starts (and when it is cancelled), QEMU turns dirty logging on for the
//! running device: `SET_VRING_ADDR` again on every queue. The backend library answers it by
//! reading the used index from guest memory and setting the ring's next used index to it, in
//! two steps. A request answered between them would have its used entry overwritten by the next
//! one, and the guest would wait for that reply forever. The used index in guest memory is the
//! ring's own while it runs, so the reset is only taken while the queue is stopped (at set-up,
//! and after `GET_VRING_BASE`), and then from the used index read under the ring's lock.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use vhost_user_backend::{VringRwLock, VringState, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

use super::descriptor::GuestMemory;

type Mem = GuestMemoryAtomic<GuestMemory>;

/// A virtqueue over guest memory with a dirty-page log, and that memory (the library's ring
/// keeps it private), to read the used index under the ring's lock.
#[derive(Clone)]
pub struct Vring(VringRwLock<Mem>, Mem);

impl Vring {
    /// Whether the driver has made chains available that were not taken yet; `None` when the
    /// queue is not running (a stop came: whoever polls it stops too).
    pub fn pending(&self) -> Option<bool> {
        let state = self.0.get_ref();
        let queue = state.get_queue();
        if !queue.ready() {
            return None;
        }
        let avail = queue.avail_idx(&*self.1.memory(), Ordering::Acquire).ok()?;
        Some(avail.0 != queue.next_avail())
    }
}

impl<'a> VringStateGuard<'a, Mem> for Vring {
    type G = RwLockReadGuard<'a, VringState<Mem>>;
}

impl<'a> VringStateMutGuard<'a, Mem> for Vring {
    type G = RwLockWriteGuard<'a, VringState<Mem>>;
}

impl VringT<Mem> for Vring {
    fn new(mem: Mem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        Ok(Vring(VringRwLock::new(mem.clone(), max_queue_size)?, mem))
    }

    fn get_ref(&self) -> RwLockReadGuard<'_, VringState<Mem>> {
        self.0.get_ref()
    }

    fn get_mut(&self) -> RwLockWriteGuard<'_, VringState<Mem>> {
        self.0.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.0.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.0.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.0.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.0.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.0.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.0.set_enabled(enabled)
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        self.0.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.0.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.0.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        // Checked and set under one lock: no chain can be returned in between.
        let mut state = self.0.get_mut();
        if state.get_queue().ready() {
            return;
        }
        // The library read `idx` from guest memory before taking the lock; a request answered
        // late (after a stop that gave up waiting) may have moved it since. Read it again.
        let idx = state
            .get_queue()
            .used_idx(&*self.1.memory(), Ordering::Acquire)
            .map_or(idx, |i| i.0);
        state.get_queue_mut().set_next_used(idx);
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.0.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.0.set_queue_size(num)
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.0.set_queue_event_idx(enabled)
    }

    fn set_queue_ready(&self, ready: bool) {
        self.0.set_queue_ready(ready)
    }

    fn set_kick(&self, file: Option<File>) {
        self.0.set_kick(file)
    }

    fn read_kick(&self) -> io::Result<bool> {
        self.0.read_kick()
    }

    fn set_call(&self, file: Option<File>) {
        self.0.set_call(file)
    }

    fn set_err(&self, file: Option<File>) {
        self.0.set_err(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    #[test]
    fn a_stopped_queue_takes_the_used_index_as_it_is_under_the_lock() {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let v = Vring::new(GuestMemoryAtomic::new(mem), 256).unwrap();
        v.set_queue_size(16);
        v.set_queue_info(0, 0x1000, 0x2000).unwrap();
        // The library reads the used index, then a late request is answered, then the library
        // sets the index it read: the answered entry must not be written over by the next.
        let read = v.queue_used_idx().unwrap();
        v.add_used(0, 10).unwrap();
        v.set_queue_next_used(read);
        assert_eq!(v.get_ref().get_queue().next_used(), read.wrapping_add(1));
    }

    #[test]
    fn the_next_used_index_is_not_reset_while_the_queue_runs() {
        let v = Vring::new(GuestMemoryAtomic::new(GuestMemory::new()), 256).unwrap();
        v.set_queue_next_used(3);
        assert_eq!(v.get_ref().get_queue().next_used(), 3);
        v.set_queue_ready(true);
        v.set_queue_next_used(9);
        assert_eq!(
            v.get_ref().get_queue().next_used(),
            3,
            "reset while running"
        );
        v.set_queue_ready(false);
        v.set_queue_next_used(9);
        assert_eq!(v.get_ref().get_queue().next_used(), 9);
    }
}
