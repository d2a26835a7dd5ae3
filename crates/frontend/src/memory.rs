//! Guest memory of the test frontend: one memfd mapped `MAP_SHARED` as a `vm-memory`
//! `GuestMemoryMmap` of one region, handed to the daemon with `VHOST_USER_SET_MEM_TABLE`.
//!
//! [`GuestMemory`] owns the mapping and hands out ranges with a bump allocator (rings, indirect
//! tables, per-client buffer areas: everything that lives as long as the connection). Short-lived
//! buffers (one FUSE request's in/out bytes) come from an [`Arena`], a first-fit free list carved
//! once out of guest memory, so that a long-running client reuses the same bytes instead of
//! growing without bound.
//!
//! Addresses are guest physical addresses (GPAs) throughout; the region starts at a configurable
//! non-zero base so that a daemon that confuses offsets and addresses fails loudly.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{
    AtomicAccess, Bytes, FileOffset, GuestAddress, GuestMemoryBackend as _, GuestMemoryMmap,
    GuestRegionMmap, MmapRegion,
};

use super::error::{Error, Result};
use virtiofs_fuse::abi::Pod;

/// Default size of guest memory: 64 MiB.
pub const DEFAULT_MEM_SIZE: usize = 64 << 20;
/// Default guest physical address of the first byte of guest memory.
pub const DEFAULT_GPA_BASE: u64 = 0x1_0000;

pub(crate) const PAGE_SIZE: u64 = 4096;

/// Rounds `v` up to a multiple of `align` (a power of two).
pub(crate) fn align_up(v: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (v + align - 1) & !(align - 1)
}

/// Guest memory: one memfd mapped shared, as a `vm-memory` [`GuestMemoryMmap`] of one region
/// at a fixed guest physical base address. Every access is bounds-checked here (with this
/// module's errors) and done by `vm-memory`; ring fields are read and written with atomic
/// loads and stores ([`Bytes::load`], [`Bytes::store`]).
pub struct GuestMemory {
    mem: GuestMemoryMmap,
    /// The memfd behind `mem` (the region holds it too).
    file: std::sync::Arc<File>,
    size: usize,
    gpa_base: u64,
    /// Offset of the first byte not yet handed out by [`GuestMemory::alloc`].
    bump: Mutex<u64>,
}

impl std::fmt::Debug for GuestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestMemory")
            .field("fd", &self.file.as_raw_fd())
            .field("size", &self.size)
            .field("gpa_base", &format_args!("{:#x}", self.gpa_base))
            .field("allocated", &self.allocated())
            .finish()
    }
}

impl GuestMemory {
    /// Creates `size` bytes of zeroed guest memory (rounded up to a page) at guest physical
    /// address `gpa_base` (which must be page aligned).
    pub fn new(size: usize, gpa_base: u64) -> Result<Self> {
        if size == 0 {
            return Err(Error::Config("guest memory size must not be zero".into()));
        }
        if gpa_base % PAGE_SIZE != 0 {
            return Err(Error::Config(format!(
                "guest memory base {gpa_base:#x} is not page aligned"
            )));
        }
        let size = align_up(size as u64, PAGE_SIZE) as usize;
        if gpa_base.checked_add(size as u64).is_none() {
            return Err(Error::Config("guest memory range overflows".into()));
        }

        let fd = nix::sys::memfd::memfd_create(
            c"virtiofsd-test-guest",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| Error::io("memfd_create", e.into()))?;
        let file = std::sync::Arc::new(File::from(fd));
        file.set_len(size as u64)
            .map_err(|e| Error::io("ftruncate", e))?;
        let mapping = MmapRegion::from_file(FileOffset::from_arc(file.clone(), 0), size)
            .map_err(|e| Error::io("mmap", std::io::Error::other(e)))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(gpa_base))
            .ok_or_else(|| Error::Config("guest memory range overflows".into()))?;
        let mem = GuestMemoryMmap::from_regions(vec![region])
            .map_err(|e| Error::Config(format!("guest memory: {e}")))?;
        Ok(GuestMemory {
            mem,
            file,
            size,
            gpa_base,
            bump: Mutex::new(0),
        })
    }

    /// Guest physical address of the first byte.
    pub fn gpa_base(&self) -> u64 {
        self.gpa_base
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Guest physical address one past the last byte.
    pub fn gpa_end(&self) -> u64 {
        self.gpa_base + self.size as u64
    }

    /// The memfd backing guest memory.
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The region as `VHOST_USER_SET_MEM_TABLE` describes it: guest address, size, frontend
    /// userspace address, mmap offset 0 and the memfd.
    // `..Default::default()` fills the extra fields the `xen` feature of `vhost` adds.
    #[allow(clippy::needless_update)]
    pub fn region_info(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: self.gpa_base,
            memory_size: self.size as u64,
            userspace_addr: self
                .host_address(self.gpa_base)
                .expect("the first byte is inside"),
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
            ..Default::default()
        }
    }

    /// Whether `[gpa, gpa + len)` lies inside guest memory.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        self.check(gpa, len).is_ok()
    }

    /// `gpa` as a guest address, when `[gpa, gpa + len)` lies inside guest memory.
    fn check(&self, gpa: u64, len: u64) -> Result<GuestAddress> {
        let out = || Error::AddressOutOfRange { addr: gpa, len };
        let off = gpa.checked_sub(self.gpa_base).ok_or_else(out)?;
        let end = off.checked_add(len).ok_or_else(out)?;
        if end > self.size as u64 {
            return Err(out());
        }
        Ok(GuestAddress(gpa))
    }

    /// A failed access to a range [`GuestMemory::check`] accepted.
    fn failed(gpa: u64, len: usize, e: vm_memory::GuestMemoryError) -> Error {
        Error::Config(format!(
            "guest memory access at {gpa:#x} ({len} bytes): {e}"
        ))
    }

    /// The frontend's (userspace) address of `gpa`: what `VHOST_USER_SET_VRING_ADDR` carries.
    pub fn host_address(&self, gpa: u64) -> Result<u64> {
        let addr = self.check(gpa, 0)?;
        // The end of memory is a valid address here (an empty range), but no byte of a region.
        if gpa == self.gpa_end() {
            let last = self.host_address(gpa - 1)?;
            return Ok(last + 1);
        }
        let host = self
            .mem
            .get_host_address(addr)
            .map_err(|e| Self::failed(gpa, 0, e))?;
        Ok(host as u64)
    }

    /// Reserves `len` bytes aligned to `align` (a power of two) for the lifetime of this memory.
    /// Returns the guest physical address. Never returns overlapping ranges.
    pub fn alloc(&self, len: u64, align: u64) -> Result<u64> {
        if !align.is_power_of_two() {
            return Err(Error::Config(format!(
                "alignment {align} is not a power of two"
            )));
        }
        let mut bump = self.bump.lock().unwrap_or_else(|e| e.into_inner());
        // Align the guest address, not just the offset (the base is page aligned anyway).
        let start_gpa = align_up(self.gpa_base + *bump, align);
        let start = start_gpa - self.gpa_base;
        let end = start.checked_add(len.max(1));
        match end {
            Some(end) if end <= self.size as u64 => {
                *bump = end;
                Ok(start_gpa)
            }
            _ => Err(Error::OutOfGuestMemory {
                requested: len,
                available: (self.size as u64).saturating_sub(start),
            }),
        }
    }

    /// Bytes handed out by [`GuestMemory::alloc`] so far.
    pub fn allocated(&self) -> u64 {
        *self.bump.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies `data` to guest memory at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<()> {
        let addr = self.check(gpa, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.mem
            .write_slice(data, addr)
            .map_err(|e| Self::failed(gpa, data.len(), e))
    }

    /// Copies guest memory at `gpa` into `buf`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<()> {
        let addr = self.check(gpa, buf.len() as u64)?;
        let len = buf.len();
        if len == 0 {
            return Ok(());
        }
        self.mem
            .read_slice(buf, addr)
            .map_err(|e| Self::failed(gpa, len, e))
    }

    /// Reads `len` bytes at `gpa` into a new vector.
    pub fn read_vec(&self, gpa: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(gpa, &mut v)?;
        Ok(v)
    }

    /// Sets `len` bytes at `gpa` to `byte`.
    pub fn fill(&self, gpa: u64, len: usize, byte: u8) -> Result<()> {
        self.write(gpa, &vec![byte; len])
    }

    /// Writes a FUSE wire struct at `gpa`.
    pub fn write_obj<T: Pod>(&self, gpa: u64, val: &T) -> Result<()> {
        self.write(gpa, val.as_bytes())
    }

    /// Reads a FUSE wire struct at `gpa`.
    pub fn read_obj<T: Pod>(&self, gpa: u64) -> Result<T> {
        let bytes = self.read_vec(gpa, std::mem::size_of::<T>())?;
        Ok(T::from_prefix(&bytes).expect("read exactly size_of::<T>() bytes"))
    }

    /// Checks that the naturally aligned `T` at `gpa` is inside guest memory.
    fn check_aligned<T>(&self, gpa: u64) -> Result<GuestAddress> {
        let size = std::mem::size_of::<T>() as u64;
        let addr = self.check(gpa, size)?;
        if gpa % size != 0 {
            return Err(Error::Config(format!("unaligned ring field at {gpa:#x}")));
        }
        Ok(addr)
    }

    /// An atomic load of the naturally aligned `T` (`u16`, `u32`) at `gpa`, for ring fields
    /// shared with the device. The value is as stored (little-endian in a ring).
    pub(crate) fn load<T: AtomicAccess>(&self, gpa: u64, order: Ordering) -> Result<T> {
        let addr = self.check_aligned::<T>(gpa)?;
        self.mem
            .load(addr, order)
            .map_err(|e| Self::failed(gpa, std::mem::size_of::<T>(), e))
    }

    /// An atomic store of the naturally aligned `T` (`u16`, `u32`) at `gpa`.
    pub(crate) fn store<T: AtomicAccess>(&self, gpa: u64, val: T, order: Ordering) -> Result<()> {
        let addr = self.check_aligned::<T>(gpa)?;
        self.mem
            .store(val, addr, order)
            .map_err(|e| Self::failed(gpa, std::mem::size_of::<T>(), e))
    }
}

/// A first-fit allocator over one guest memory range, for buffers that are freed again (per
/// request in/out areas, indirect tables). Allocations are 8-byte granular and aligned.
#[derive(Debug, Clone)]
pub struct Arena {
    base: u64,
    len: u64,
    /// Free ranges: start -> length, never adjacent (coalesced on free).
    free: BTreeMap<u64, u64>,
}

/// Granularity and minimum alignment of [`Arena`] allocations.
const ARENA_GRANULE: u64 = 8;

impl Arena {
    /// An arena over `[base, base + len)`; `base` must be 8-aligned.
    pub fn new(base: u64, len: u64) -> Self {
        debug_assert_eq!(base % ARENA_GRANULE, 0);
        let len = len & !(ARENA_GRANULE - 1);
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(base, len);
        }
        Arena { base, len, free }
    }

    /// Start of the arena.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Total size of the arena.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the arena has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes currently free (possibly fragmented).
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Size an allocation of `len` bytes really occupies.
    pub fn rounded(len: u64) -> u64 {
        align_up(len.max(1), ARENA_GRANULE)
    }

    /// Allocates `len` bytes aligned to `align` (at least 8). Returns `None` when no free range
    /// is large enough. Free the allocation with the same `len`.
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        let align = align.max(ARENA_GRANULE);
        debug_assert!(align.is_power_of_two());
        let len = Self::rounded(len);
        let (start, flen, at) = self.free.iter().find_map(|(&start, &flen)| {
            let at = align_up(start, align);
            (at + len <= start + flen).then_some((start, flen, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + len;
        if end < start + flen {
            self.free.insert(end, start + flen - end);
        }
        Some(at)
    }

    /// Returns `[addr, addr + len)` (as passed to and returned by `alloc`) to the arena.
    pub fn free(&mut self, addr: u64, len: u64) {
        let mut start = addr;
        let mut len = Self::rounded(len);
        debug_assert!(start >= self.base && start + len <= self.base + self.len);
        // Merge with the preceding free range if it ends where this one starts.
        if let Some((&pstart, &plen)) = self.free.range(..start).next_back() {
            debug_assert!(pstart + plen <= start, "double free in arena at {addr:#x}");
            if pstart + plen == start {
                self.free.remove(&pstart);
                start = pstart;
                len += plen;
            }
        }
        // Merge with the following free range if it starts where this one ends.
        if let Some((&nstart, &nlen)) = self.free.range(start + 1..).next() {
            debug_assert!(start + len <= nstart, "double free in arena at {addr:#x}");
            if start + len == nstart {
                self.free.remove(&nstart);
                len += nlen;
            }
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_memory_is_zeroed_and_bounds_checked() {
        let mem = GuestMemory::new(1 << 20, DEFAULT_GPA_BASE).unwrap();
        assert_eq!(mem.size(), 1 << 20);
        assert_eq!(mem.read_vec(DEFAULT_GPA_BASE, 16).unwrap(), vec![0u8; 16]);
        mem.write(DEFAULT_GPA_BASE + 100, b"hello").unwrap();
        assert_eq!(mem.read_vec(DEFAULT_GPA_BASE + 100, 5).unwrap(), b"hello");
        assert!(mem.write(DEFAULT_GPA_BASE - 1, b"x").is_err());
        assert!(mem.read_vec(mem.gpa_end() - 4, 5).is_err());
        assert!(mem.read_vec(mem.gpa_end() - 4, 4).is_ok());
        assert!(mem.read_vec(u64::MAX, 2).is_err());
        assert!(!mem.contains(0, 1));
        let info = mem.region_info();
        assert_eq!(info.guest_phys_addr, DEFAULT_GPA_BASE);
        assert_eq!(info.memory_size, 1 << 20);
        assert_eq!(info.mmap_offset, 0);
        assert_eq!(
            mem.host_address(DEFAULT_GPA_BASE + 8).unwrap(),
            info.userspace_addr + 8
        );
    }

    #[test]
    fn memory_is_shared_through_the_memfd() {
        let mem = GuestMemory::new(8192, DEFAULT_GPA_BASE).unwrap();
        mem.write(DEFAULT_GPA_BASE + 4096, b"shared").unwrap();
        let mut buf = [0u8; 6];
        // SAFETY: pread into a local buffer of the given length from a valid fd.
        let n = unsafe {
            libc::pread(
                mem.raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                4096 as libc::off_t,
            )
        };
        assert_eq!(n, 6);
        assert_eq!(&buf, b"shared");
    }

    #[test]
    fn bump_allocation_respects_alignment_and_size() {
        let mem = GuestMemory::new(8192, DEFAULT_GPA_BASE).unwrap();
        let a = mem.alloc(3, 1).unwrap();
        let b = mem.alloc(16, 16).unwrap();
        assert_eq!(a, DEFAULT_GPA_BASE);
        assert_eq!(b, DEFAULT_GPA_BASE + 16);
        assert!(mem.alloc(8192, 8).is_err());
        let c = mem.alloc(8192 - 32, 4).unwrap();
        assert_eq!(c, DEFAULT_GPA_BASE + 32);
        assert!(matches!(
            mem.alloc(1, 1),
            Err(Error::OutOfGuestMemory { .. })
        ));
    }

    #[test]
    fn arena_allocates_first_fit_and_coalesces() {
        let mut a = Arena::new(0x1000, 256);
        let x = a.alloc(10, 8).unwrap();
        let y = a.alloc(64, 64).unwrap();
        let z = a.alloc(8, 8).unwrap();
        assert_eq!(x, 0x1000);
        assert_eq!(y, 0x1040);
        assert_eq!(z, 0x1010); // fills the alignment gap left before `y`
        assert!(a.alloc(256, 8).is_none());
        a.free(y, 64);
        a.free(x, 10);
        a.free(z, 8);
        assert_eq!(a.free_bytes(), 256);
        assert_eq!(a.free.len(), 1, "free list fully coalesced: {:?}", a.free);
        assert_eq!(a.alloc(256, 8), Some(0x1000));
    }

    #[test]
    fn arena_survives_many_interleaved_cycles() {
        let mut a = Arena::new(0, 4096);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for i in 0..10_000u64 {
            let len = (i * 37) % 300 + 1;
            if let Some(addr) = a.alloc(len, 8) {
                for &(b, l) in &live {
                    let l = Arena::rounded(l);
                    assert!(addr + Arena::rounded(len) <= b || b + l <= addr, "overlap");
                }
                live.push((addr, len));
            }
            if live.len() > 8 || (i % 3 == 0 && !live.is_empty()) {
                let (addr, len) = live.remove((i as usize * 7) % live.len());
                a.free(addr, len);
            }
        }
        for (addr, len) in live.drain(..) {
            a.free(addr, len);
        }
        assert_eq!(a.free_bytes(), 4096);
        assert_eq!(a.free.len(), 1);
    }
}
