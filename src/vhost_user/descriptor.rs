//! Adapts a virtio descriptor chain into the FUSE server's [`Reader`] and [`Writer`].
//!
//! A chain is split into its device-readable part (the request) and its device-writable part
//! (the reply buffer), each a list of slices of guest memory. File data moves between guest
//! memory and host files with `preadv`/`pwritev` straight on those slices: no bounce buffer.
//!
//! Every address and length comes from the guest: slices are resolved through `vm-memory`, which
//! refuses ranges outside guest RAM, total lengths are summed with overflow checks, and a chain
//! that puts a readable descriptor after a writable one is refused.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};

use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryLoadGuard, GuestMemoryMmap};

use crate::fuse::io::{Reader, Writer, ZeroCopyReader, ZeroCopyWriter};

/// The dirty-page log of a guest memory region: empty until the frontend starts a migration
/// (`SET_LOG_BASE`), then every page the device writes is marked in it, so that the frontend
/// sends that page to the destination again.
pub use super::dirty_log::DirtyLog;
/// Guest memory, with a dirty-page log per region.
pub type GuestMemory = GuestMemoryMmap<DirtyLog>;
/// Guest memory as the queues see it.
pub type GuestMem = GuestMemoryLoadGuard<GuestMemory>;
/// A slice of guest memory, with the part of the dirty-page log that covers it.
pub type VolatileSlice<'a> = vm_memory::VolatileSlice<'a, DirtyLog>;

/// Most iovecs handed to one `preadv`/`pwritev` call.
const MAX_IOVECS: usize = 64;

/// Said of a buffer outside guest memory: a guest at fault, or guest memory not all shared.
const UNSHARED_HINT: &str = " (unless the guest is at fault, part of guest memory is not shared \
                             with virtiofsd: every memory backend needs share=on)";

/// Why a descriptor chain was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A device-readable descriptor follows a device-writable one.
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// A descriptor points outside guest memory.
    #[error("descriptor {addr:#x}+{len:#x} is outside the guest memory the frontend gave{UNSHARED_HINT}")]
    BadAddress { addr: u64, len: u32 },
    /// The chain's buffers add up to more than 4 GiB.
    #[error("descriptor chain longer than 4 GiB")]
    TooLong,
    /// Not one descriptor of the chain could be read: its indirect table is malformed or
    /// outside guest memory.
    #[error(
        "no descriptor of it could be read: its indirect table is malformed or outside the \
         guest memory the frontend gave{UNSHARED_HINT}"
    )]
    Unreadable,
}

/// Splits `chain` into the request reader and the reply writer.
pub fn split_chain<'a, M>(
    mem: &'a GuestMemory,
    chain: DescriptorChain<M>,
) -> Result<(ChainReader<'a>, ChainWriter<'a>), ChainError>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let mut readable = SliceVec::new();
    let mut writable = SliceVec::new();
    let mut total: u64 = 0;
    let mut seen = false;
    for desc in chain {
        seen = true;
        total = total
            .checked_add(u64::from(desc.len()))
            .filter(|t| *t <= u64::from(u32::MAX))
            .ok_or(ChainError::TooLong)?;
        if desc.len() == 0 {
            continue;
        }
        let bad = || ChainError::BadAddress {
            addr: desc.addr().0,
            len: desc.len(),
        };
        let target = if desc.is_write_only() {
            &mut writable
        } else {
            if !writable.is_empty() {
                return Err(ChainError::ReadableAfterWritable);
            }
            &mut readable
        };
        for slice in mem.get_slices(GuestAddress(desc.addr().0), desc.len() as usize) {
            target.push(slice.map_err(|_| bad())?);
        }
    }
    if !seen {
        // A chain has at least its head: the library stops before it when the indirect table
        // the head points to is malformed or cannot be read.
        return Err(ChainError::Unreadable);
    }
    Ok((ChainReader::new(readable), ChainWriter::new(writable)))
}

/// Slices kept inline before a list spills to the heap: a FUSE request or reply rarely spans
/// more descriptors (or memory regions) than this, so most requests allocate nothing here.
const INLINE_SLICES: usize = 8;

/// A list of guest memory slices that lives on the stack up to `INLINE_SLICES` entries.
pub struct SliceVec<'a> {
    inline: [MaybeUninit<VolatileSlice<'a>>; INLINE_SLICES],
    /// Entries in `inline` (when not spilled).
    len: usize,
    /// All entries, once there are more than fit inline.
    heap: Vec<VolatileSlice<'a>>,
    spilled: bool,
}

impl Default for SliceVec<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> SliceVec<'a> {
    pub fn new() -> Self {
        SliceVec {
            inline: [MaybeUninit::uninit(); INLINE_SLICES],
            len: 0,
            heap: Vec::new(),
            spilled: false,
        }
    }

    pub fn push(&mut self, s: VolatileSlice<'a>) {
        if self.spilled {
            self.heap.push(s);
        } else if self.len < INLINE_SLICES {
            self.inline[self.len] = MaybeUninit::new(s);
            self.len += 1;
        } else {
            let mut heap = Vec::with_capacity(INLINE_SLICES * 2);
            heap.extend_from_slice(&self[..]);
            heap.push(s);
            self.heap = heap;
            self.spilled = true;
        }
    }

    pub fn truncate(&mut self, n: usize) {
        if self.spilled {
            self.heap.truncate(n);
        } else {
            self.len = self.len.min(n);
        }
    }
}

impl<'a> std::ops::Deref for SliceVec<'a> {
    type Target = [VolatileSlice<'a>];

    fn deref(&self) -> &Self::Target {
        if self.spilled {
            &self.heap
        } else {
            // SAFETY: the first `len` inline entries were written by `push` (and never
            // de-initialised: `VolatileSlice` is `Copy`); `MaybeUninit<T>` has `T`'s layout.
            unsafe { std::slice::from_raw_parts(self.inline.as_ptr().cast(), self.len) }
        }
    }
}

impl std::ops::DerefMut for SliceVec<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        if self.spilled {
            &mut self.heap
        } else {
            // SAFETY: as in `deref`; `&mut self` makes the borrow unique.
            unsafe { std::slice::from_raw_parts_mut(self.inline.as_mut_ptr().cast(), self.len) }
        }
    }
}

/// A list of guest memory slices consumed from the front.
struct Segments<'a> {
    slices: SliceVec<'a>,
    /// Index of the first slice not yet fully consumed.
    next: usize,
    remaining: usize,
    consumed: usize,
}

impl<'a> Segments<'a> {
    fn new(slices: SliceVec<'a>) -> Self {
        let remaining = slices.iter().map(|s| s.len()).sum();
        Segments {
            slices,
            next: 0,
            remaining,
            consumed: 0,
        }
    }

    /// Marks `n` bytes (at most `remaining`) as consumed.
    fn advance(&mut self, mut n: usize) {
        n = n.min(self.remaining);
        self.remaining -= n;
        self.consumed += n;
        while n > 0 {
            let s = &mut self.slices[self.next];
            if n < s.len() {
                // `n` is within the slice, so the offset is in bounds.
                if let Ok(rest) = s.offset(n) {
                    *s = rest;
                }
                return;
            }
            n -= s.len();
            self.next += 1;
        }
    }

    /// Fills `iov` with up to `count` bytes of the unconsumed slices; returns the iovec count.
    fn iovecs(&self, count: usize, iov: &mut [libc::iovec; MAX_IOVECS]) -> usize {
        let mut left = count;
        let mut n = 0;
        for s in &self.slices[self.next..] {
            if left == 0 || n == MAX_IOVECS {
                break;
            }
            let len = s.len().min(left);
            iov[n] = libc::iovec {
                iov_base: s.ptr_guard_mut().as_ptr().cast(),
                iov_len: len,
            };
            left -= len;
            n += 1;
        }
        n
    }

    /// Marks the first `n` unconsumed bytes as written in the dirty-page log (after they were
    /// written behind vm-memory's back, by a system call).
    fn mark_written(&self, n: usize) {
        let mut left = n;
        for s in &self.slices[self.next..] {
            if left == 0 {
                break;
            }
            let len = s.len().min(left);
            s.bitmap().mark_dirty(0, len);
            left -= len;
        }
    }

    /// Runs `io` (a vectored syscall) over up to `count` bytes until done, short, or failed.
    /// With `writes_memory`, the bytes the call filled are marked in the dirty-page log.
    fn vectored<F>(
        &mut self,
        count: usize,
        mut offset: u64,
        writes_memory: bool,
        mut io: F,
    ) -> io::Result<usize>
    where
        F: FnMut(&[libc::iovec], libc::off64_t) -> isize,
    {
        let mut left = count.min(self.remaining);
        let mut done = 0usize;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOVECS];
        while left > 0 {
            let n = self.iovecs(left, &mut iov);
            let asked: usize = iov[..n].iter().map(|v| v.iov_len).sum();
            let off = libc::off64_t::try_from(offset)
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            let ret = io(&iov[..n], off);
            if ret < 0 {
                let e = io::Error::last_os_error();
                if writes_memory {
                    // A failed call may still have filled part of the buffers (an O_DIRECT
                    // read that hit an error): marking them all is never wrong.
                    self.mark_written(asked);
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if done > 0 {
                    break;
                }
                return Err(e);
            }
            let got = ret as usize;
            if writes_memory {
                self.mark_written(got);
            }
            self.advance(got);
            done += got;
            left -= got;
            offset += got as u64;
            if got < asked || got == 0 {
                break;
            }
        }
        Ok(done)
    }
}

/// The device-readable part of a chain: the FUSE request.
pub struct ChainReader<'a> {
    segs: Segments<'a>,
}

impl<'a> ChainReader<'a> {
    fn new(slices: SliceVec<'a>) -> Self {
        ChainReader {
            segs: Segments::new(slices),
        }
    }
}

impl ZeroCopyReader for ChainReader<'_> {
    fn write_to_file_at(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        offset: u64,
    ) -> io::Result<usize> {
        let raw = fd.as_raw_fd();
        self.segs.vectored(count, offset, false, |iov, off| {
            // SAFETY: every iovec points into a live guest memory mapping of at least
            // `iov_len` bytes (resolved by vm-memory); the kernel only reads from them.
            unsafe { libc::pwritev64(raw, iov.as_ptr(), iov.len() as i32, off) }
        })
    }

    fn remaining(&self) -> usize {
        self.segs.remaining
    }
}

impl Reader for ChainReader<'_> {
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() > self.segs.remaining {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let mut copied = 0;
        for s in &self.segs.slices[self.segs.next..] {
            if copied == buf.len() {
                break;
            }
            copied += s.copy_to(&mut buf[copied..]);
        }
        self.segs.advance(copied);
        Ok(())
    }
}

/// The device-writable part of a chain: where the FUSE reply goes.
pub struct ChainWriter<'a> {
    segs: Segments<'a>,
}

impl<'a> ChainWriter<'a> {
    fn new(slices: SliceVec<'a>) -> Self {
        ChainWriter {
            segs: Segments::new(slices),
        }
    }
}

impl ZeroCopyWriter for ChainWriter<'_> {
    fn read_from_file_at(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        offset: u64,
    ) -> io::Result<usize> {
        let raw = fd.as_raw_fd();
        self.segs.vectored(count, offset, true, |iov, off| {
            // SAFETY: every iovec points into a live, writable guest memory mapping of at least
            // `iov_len` bytes (resolved by vm-memory); the kernel writes only within them.
            unsafe { libc::preadv64(raw, iov.as_ptr(), iov.len() as i32, off) }
        })
    }

    fn remaining(&self) -> usize {
        self.segs.remaining
    }
}

impl Writer for ChainWriter<'_> {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if buf.len() > self.segs.remaining {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut copied = 0;
        for s in &self.segs.slices[self.segs.next..] {
            if copied == buf.len() {
                break;
            }
            let n = s.len().min(buf.len() - copied);
            s.copy_from(&buf[copied..copied + n]);
            copied += n;
        }
        self.segs.advance(copied);
        Ok(())
    }

    fn bytes_written(&self) -> usize {
        self.segs.consumed
    }

    fn split_at(&mut self, offset: usize) -> io::Result<Self> {
        if offset > self.segs.remaining {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let mut rem = offset;
        let mut at = self.segs.next;
        while at < self.segs.slices.len() && rem >= self.segs.slices[at].len() {
            rem -= self.segs.slices[at].len();
            at += 1;
        }
        let mut tail = SliceVec::new();
        if at < self.segs.slices.len() {
            let s = self.segs.slices[at];
            let bad = |_| io::Error::from(io::ErrorKind::InvalidInput);
            tail.push(s.offset(rem).map_err(bad)?);
            for &rest in &self.segs.slices[at + 1..] {
                tail.push(rest);
            }
            if rem == 0 {
                self.segs.slices.truncate(at);
            } else {
                self.segs.slices.truncate(at + 1);
                self.segs.slices[at] = s.subslice(0, rem).map_err(bad)?;
            }
        }
        self.segs.remaining = offset;
        Ok(ChainWriter::new(tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::split::Descriptor;
    use vm_memory::{Bytes, GuestMemoryBackend};

    fn memory() -> GuestMemory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    /// `n` slices of `len` bytes, one every 0x100 bytes.
    fn slices(mem: &GuestMemory, n: u64, len: usize) -> SliceVec<'_> {
        let mut v = SliceVec::new();
        for i in 0..n {
            v.push(mem.get_slice(GuestAddress(i * 0x100), len).unwrap());
        }
        v
    }

    /// The chain a one-descriptor queue in `mem` hands out, its descriptor being `desc`.
    fn one_chain(mem: &GuestMemory, desc: Descriptor) -> DescriptorChain<&GuestMemory> {
        use virtio_queue::{Queue, QueueT};
        let (table, avail, used) = (0x1000u32, 0x2000u32, 0x3000u32);
        mem.write_obj(desc, GuestAddress(table.into())).unwrap();
        // avail ring: flags, idx = 1, ring[0] = descriptor 0
        mem.write_obj([0u16, 1, 0], GuestAddress(avail.into()))
            .unwrap();
        let mut q = Queue::new(4).unwrap();
        q.set_size(4);
        q.set_desc_table_address(Some(table), Some(0));
        q.set_avail_ring_address(Some(avail), Some(0));
        q.set_used_ring_address(Some(used), Some(0));
        q.set_ready(true);
        q.pop_descriptor_chain(mem).expect("a chain is available")
    }

    #[test]
    fn a_chain_outside_guest_memory_is_refused_saying_memory_may_not_be_shared() {
        use virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT;
        let mem = memory();
        // The indirect table lies past the end of the memory the frontend gave.
        let chain = one_chain(
            &mem,
            Descriptor::new(0x20000, 32, VRING_DESC_F_INDIRECT as u16, 0),
        );
        let e = split_chain(&mem, chain).err().expect("refused");
        assert!(matches!(e, ChainError::Unreadable), "{e}");
        assert!(e.to_string().contains("share=on"), "{e}");
        // So does a plain buffer.
        let chain = one_chain(&mem, Descriptor::new(0x20000, 64, 0, 0));
        let e = split_chain(&mem, chain).err().expect("refused");
        assert!(
            matches!(
                e,
                ChainError::BadAddress {
                    addr: 0x20000,
                    len: 64
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("share=on"), "{e}");
        // A buffer inside is taken.
        let chain = one_chain(&mem, Descriptor::new(0x8000, 64, 0, 0));
        assert!(split_chain(&mem, chain).is_ok());
    }

    #[test]
    fn slice_list_spills_to_the_heap_keeping_every_entry() {
        let mem = memory();
        for n in [1, INLINE_SLICES as u64, INLINE_SLICES as u64 + 1, 40] {
            let v = slices(&mem, n, 16);
            assert_eq!(v.len() as u64, n);
            for (i, s) in v.iter().enumerate() {
                assert_eq!(
                    s.ptr_guard().as_ptr(),
                    mem.get_host_address(GuestAddress(i as u64 * 0x100))
                        .unwrap() as *const u8
                );
            }
        }
    }

    #[test]
    fn writer_split_across_many_segments_writes_each_part_in_place() {
        let mem = memory();
        let mut head = ChainWriter::new(slices(&mem, 20, 10));
        let mut tail = head.split_at(16).unwrap();
        assert_eq!(ZeroCopyWriter::remaining(&head), 16);
        assert_eq!(ZeroCopyWriter::remaining(&tail), 200 - 16);
        tail.write_all(&[7u8; 184]).unwrap();
        head.write_all(&[1u8; 16]).unwrap();
        assert!(head.write_all(&[0]).is_err());
        let mut first = [0u8; 10];
        mem.read_slice(&mut first, GuestAddress(0)).unwrap();
        assert_eq!(first, [1u8; 10]);
        let mut second = [0u8; 10];
        mem.read_slice(&mut second, GuestAddress(0x100)).unwrap();
        assert_eq!(second, [1, 1, 1, 1, 1, 1, 7, 7, 7, 7]);
        let mut last = [0u8; 10];
        mem.read_slice(&mut last, GuestAddress(19 * 0x100)).unwrap();
        assert_eq!(last, [7u8; 10]);
    }

    #[test]
    fn reader_reads_exactly_across_segments_or_not_at_all() {
        let mem = memory();
        for i in 0..12u64 {
            mem.write_slice(&[i as u8; 4], GuestAddress(i * 0x100))
                .unwrap();
        }
        let mut r = ChainReader::new(slices(&mem, 12, 4));
        let mut buf = [0u8; 6];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [0, 0, 0, 0, 1, 1]);
        let mut too_much = [0u8; 43];
        assert!(r.read_exact(&mut too_much).is_err());
        assert_eq!(ZeroCopyReader::remaining(&r), 42);
    }
}
