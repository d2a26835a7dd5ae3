//! The memory of the nodes: every node lives in a slot of a chunk the daemon maps for nodes
//! alone, and a [`Ref`] is a counted reference to one slot (what an `Arc` is, without its two
//! counts and the allocator's header: a node costs its own size and no more). The count is in
//! the node ([`Counted`]); the slots are [`SLOT`] bytes, which the node fits in (checked when
//! the code is built).
//!
//! # Slots and chunks
//! A chunk is [`CHUNK_BYTES`] of anonymous memory, aligned to its size, so that the chunk of a
//! slot is its address rounded down: its first slot-sized room holds the chunk's number, the
//! others are slots. A slot has a number (`chunk × SLOTS + index`) that the node tables store
//! instead of a pointer (4 bytes a table entry, not 8). A map with a bit a slot tells the
//! free ones; a free slot holds nothing.
//!
//! New nodes go to the lowest free slot of the lowest-numbered chunk with room, so that the
//! nodes the guest keeps gather in the first chunks and at their starts; when the guest has
//! forgotten many, the pages of the chunks kept that hold only free slots go back to the system
//! too ([`give_back_free_pages`]). A chunk whose last node goes is unmapped when the other
//! chunks have room for half a chunk of nodes or more, else kept: so that a guest that looks up
//! and forgets nodes at the edge of a chunk cannot make each FORGET cost an unmap and the next
//! LOOKUP a map (between an unmap and the next map it must fill half a chunk), and at most one
//! empty chunk is kept. When the guest forgets a walk, the memory of its nodes goes back to the
//! system at once, without the allocator's help.
//!
//! # References
//! The count of references (`pins`) is in the node itself. The node tables hold one an entry,
//! each a [`Slot`] (the slot's number, 4 bytes); each request using a node holds one, a
//! [`Ref`], while it runs; a node found by name holds one on its parent. Both deref to the node
//! safely: the reference they own keeps it in its slot.
//! The last reference dropped drops the node in its slot and frees the slot. Dropping a node can
//! drop its parent's last reference, and so on up a chain: those drops are made one after the
//! other, never nested, so the stack stays flat however long the chain.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

#[cfg(not(miri))]
use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};

/// Bytes of a chunk (a power of two: a chunk is aligned to it).
const CHUNK_BYTES: usize = 128 << 10;

/// Bytes of a slot: what a node may take at most.
pub const SLOT: usize = 104;

/// Slots of a chunk (the first slot-sized room holds the chunk's number).
const SLOTS: usize = CHUNK_BYTES / SLOT - 1;

/// Chunks there can be: each is a mapping of its own, and the system allows a process some
/// 65,000 (`vm.max_map_count`), which the allocator, the threads' stacks and the libraries
/// share; the directory of chunks is a static array of this many pointers (256 KiB of address
/// space, touched only as it is used).
const MAX_CHUNKS: usize = 1 << 15;

/// Nodes there can be at most (41 million).
pub const CAPACITY: usize = MAX_CHUNKS * SLOTS;

const _: () = assert!(SLOT % 8 == 0 && SLOT >= 8);
const _: () = assert!(CHUNK_BYTES.is_power_of_two() && SLOTS >= 64);
const _: () = assert!((MAX_CHUNKS * SLOTS) < u32::MAX as usize);

/// Chunk number → its memory (null when it has none): read without a lock to turn a slot
/// number the node tables hold into the node (a slot in a table is live, so its chunk is
/// mapped and stays so).
static DIRECTORY: [AtomicPtr<u8>; MAX_CHUNKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_CHUNKS];

/// Words of a chunk's map of free slots.
const WORDS: usize = SLOTS.div_ceil(64);

struct Chunk {
    /// The mapping (null when the chunk was given back).
    base: *mut u8,
    /// One bit a slot, set when it is free. Slots are taken lowest first, so that the nodes
    /// kept gather at the start of the chunk and the pages of its free slots can go back.
    free: [u64; WORDS],
    /// Slots in use.
    live: u32,
    /// A slot was freed since the chunk's free pages were last given back (a chunk without
    /// one has nothing more to give: a page taken again since was taken by a node still there
    /// or freed again).
    freed: bool,
}

// SAFETY: `base` is the address of a mapping only the allocator below hands out slots of; the
// chunk records are only used under the allocator's mutex.
unsafe impl Send for Chunk {}

impl Chunk {
    fn new(base: *mut u8) -> Chunk {
        let mut free = [u64::MAX; WORDS];
        if SLOTS % 64 != 0 {
            free[WORDS - 1] = (1u64 << (SLOTS % 64)) - 1;
        }
        Chunk {
            base,
            free,
            live: 0,
            freed: false,
        }
    }

    fn is_free(&self, i: usize) -> bool {
        self.free[i / 64] & (1 << (i % 64)) != 0
    }

    /// Takes the lowest free slot, if any.
    fn take(&mut self) -> Option<u32> {
        let w = self.free.iter().position(|w| *w != 0)?;
        let bit = self.free[w].trailing_zeros() as usize;
        self.free[w] &= !(1 << bit);
        self.live += 1;
        Some((w * 64 + bit) as u32)
    }

    fn put(&mut self, i: u32) {
        let i = i as usize;
        self.free[i / 64] |= 1 << (i % 64);
        self.live -= 1;
        self.freed = true;
    }

    fn full(&self) -> bool {
        self.live as usize == SLOTS
    }

    /// The runs of whole pages (`page` bytes, a power of two) that hold only free slots, as
    /// (offset in the chunk, length): what [`Chunk::give_back_free_pages`] gives back. The
    /// first page holds the chunk's header and is never one of them; a page size past the
    /// chunk's half gives none.
    fn free_page_runs(&self, page: usize, mut run: impl FnMut(usize, usize)) {
        if !page.is_power_of_two() || page > CHUNK_BYTES / 2 {
            return;
        }
        let pages = ((SLOTS + 1) * SLOT).div_ceil(page);
        let free_page = |p: usize| {
            // The slots overlapping page `p` (the first page holds the chunk's header).
            let (start, end) = (p * page, (p + 1) * page);
            if start < SLOT {
                return false;
            }
            let first = start / SLOT - 1;
            let last = ((end - 1) / SLOT - 1).min(SLOTS - 1);
            (first..=last).all(|i| self.is_free(i))
        };
        let mut p = 1;
        while p < pages {
            if !free_page(p) {
                p += 1;
                continue;
            }
            let from = p;
            while p < pages && free_page(p) {
                p += 1;
            }
            run(from * page, (p - from) * page);
        }
    }

    /// Gives the pages that hold only free slots back to the system (they read as zeros when
    /// touched again; a free slot holds nothing).
    fn give_back_free_pages(&self) {
        self.free_page_runs(page_size(), |offset, len| {
            #[cfg(not(miri))]
            if let Some(at) = NonNull::new(self.base.wrapping_add(offset).cast()) {
                // SAFETY: whole pages of the system's size inside this chunk's mapping that
                // hold no live slot (the kernel rounds the length up to a page, and the runs
                // are of whole pages already): no node is there, and the allocator's lock
                // keeps any from being put there now.
                let _ = unsafe { madvise(at, len, MmapAdvise::MADV_DONTNEED) };
            }
            // Under Miri (no `madvise`), the pages are zeroed as the kernel would: a live node
            // there would be a write through a node still borrowed, which Miri reports.
            #[cfg(miri)]
            // SAFETY: as above.
            unsafe {
                self.base.wrapping_add(offset).write_bytes(0, len)
            };
        });
    }
}

/// The system's page size: what `madvise` rounds to (4 KiB on x86-64; 16 or 64 KiB on some
/// aarch64 and ppc64 kernels). 0 when it cannot be told (no page is given back then).
fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(usize::MAX);
    let p = PAGE.load(Ordering::Relaxed);
    if p != usize::MAX {
        return p;
    }
    let p = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| n.is_power_of_two())
        .unwrap_or(0);
    PAGE.store(p, Ordering::Relaxed);
    p
}

#[derive(Default)]
struct Alloc {
    chunks: Vec<Chunk>,
    /// Numbers of mapped chunks with a free slot.
    with_room: std::collections::BTreeSet<u32>,
    /// Numbers of chunks given back (reused lowest first).
    released: std::collections::BTreeSet<u32>,
    /// Free slots of the mapped chunks.
    free: usize,
}

static ALLOC: Mutex<Alloc> = Mutex::new(Alloc {
    chunks: Vec::new(),
    with_room: std::collections::BTreeSet::new(),
    released: std::collections::BTreeSet::new(),
    free: 0,
});

fn alloc() -> std::sync::MutexGuard<'static, Alloc> {
    ALLOC.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Under Miri, which models no mapping at an address of its own choosing nor part of one
/// unmapped: the layout of a chunk taken from the allocator (aligned to its size).
#[cfg(miri)]
const CHUNK_LAYOUT: std::alloc::Layout =
    match std::alloc::Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES) {
        Ok(l) => l,
        Err(_) => panic!("a chunk's size is a power of two"),
    };

/// Under Miri: a chunk from the allocator, zeroed as a new mapping is.
#[cfg(miri)]
fn map_chunk() -> Option<*mut u8> {
    // SAFETY: the layout's size is not zero.
    let p = unsafe { std::alloc::alloc_zeroed(CHUNK_LAYOUT) };
    (!p.is_null()).then_some(p)
}

/// Maps a chunk aligned to [`CHUNK_BYTES`]: twice the size, then the parts before and after
/// the aligned chunk are unmapped.
#[cfg(not(miri))]
fn map_chunk() -> Option<*mut u8> {
    let len = std::num::NonZeroUsize::new(2 * CHUNK_BYTES)?;
    // SAFETY: a new private anonymous mapping at an address the kernel chooses; it aliases
    // nothing.
    let p = unsafe {
        mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .ok()?;
    let start = p.as_ptr() as usize;
    let aligned = (start + CHUNK_BYTES - 1) & !(CHUNK_BYTES - 1);
    let head = aligned - start;
    let tail = CHUNK_BYTES - head;
    // SAFETY: both ranges are within the mapping just made and outside the chunk kept; nothing
    // refers to them.
    unsafe {
        if let Some(h) = NonNull::new(start as *mut libc::c_void).filter(|_| head > 0) {
            let _ = munmap(h, head);
        }
        if let Some(t) = NonNull::new((aligned + CHUNK_BYTES) as *mut libc::c_void) {
            if tail > 0 {
                let _ = munmap(t, tail);
            }
        }
    }
    Some(aligned as *mut u8)
}

/// The address of slot `index` of the chunk at `base`.
fn slot_at(base: *mut u8, index: u32) -> *mut u8 {
    base.wrapping_add((index as usize + 1) * SLOT)
}

/// Takes a free slot: the lowest free slot of the lowest-numbered chunk with room, a new chunk
/// when none has. `None` when no chunk can be added (the slab is full, or the system has no
/// memory).
fn take_slot() -> Option<NonNull<u8>> {
    #[cfg(test)]
    if !tests::may_take() {
        return None;
    }
    let mut a = alloc();
    let number = match a.with_room.first() {
        Some(n) => *n,
        None => {
            let number = match a.released.first() {
                Some(n) => *n,
                None if a.chunks.len() < MAX_CHUNKS => a.chunks.len() as u32,
                None => return None,
            };
            let base = map_chunk()?;
            // SAFETY: the chunk is fresh, aligned and CHUNK_BYTES long: its first bytes are its
            // own header.
            unsafe { base.cast::<u32>().write(number) };
            if (number as usize) == a.chunks.len() {
                a.chunks.push(Chunk::new(base));
            } else {
                a.released.remove(&number);
                a.chunks[number as usize] = Chunk::new(base);
            }
            DIRECTORY[number as usize].store(base, Ordering::Release);
            a.with_room.insert(number);
            a.free += SLOTS;
            number
        }
    };
    let c = &mut a.chunks[number as usize];
    let index = c.take()?;
    let (p, full) = (slot_at(c.base, index), c.full());
    a.free -= 1;
    if full {
        a.with_room.remove(&number);
    }
    NonNull::new(p)
}

/// Frees the slot at `p` (whose node was dropped already), and gives its chunk back to the
/// system when that was its last node and the other chunks have room for half a chunk (see
/// the module's doc).
fn free_slot(p: NonNull<u8>) {
    // The chunk's start, with the provenance of its mapping.
    let offset = p.as_ptr().addr() & (CHUNK_BYTES - 1);
    let base = p.as_ptr().wrapping_sub(offset);
    let index = (offset / SLOT - 1) as u32;
    let mut a = alloc();
    // SAFETY: `p` is a slot of a mapped chunk (it held a node until now), whose header holds
    // its number.
    let number = unsafe { base.cast::<u32>().read() };
    a.free += 1;
    // The other chunks' free slots, once this one is empty (all its slots are free then).
    let room_elsewhere = a.free.saturating_sub(SLOTS) >= SLOTS / 2;
    let c = &mut a.chunks[number as usize];
    c.put(index);
    let release = c.live == 0 && room_elsewhere;
    if release {
        c.base = std::ptr::null_mut();
        DIRECTORY[number as usize].store(std::ptr::null_mut(), Ordering::Release);
        a.with_room.remove(&number);
        a.released.insert(number);
        a.free -= SLOTS;
        // The records of chunks given back at the end go too, and their room once sparse.
        while a.chunks.last().is_some_and(|c| c.base.is_null()) {
            let last = a.chunks.len() as u32 - 1;
            a.chunks.pop();
            a.released.remove(&last);
        }
        let (len, cap) = (a.chunks.len(), a.chunks.capacity());
        if cap > 16 && len * 4 < cap {
            a.chunks.shrink_to(len * 2);
        }
    } else {
        a.with_room.insert(number);
    }
    drop(a);
    if release {
        #[cfg(not(miri))]
        if let Some(b) = NonNull::new(base.cast::<libc::c_void>()) {
            // SAFETY: the chunk has no node left and is in no list: nothing refers to it.
            let _ = unsafe { munmap(b, CHUNK_BYTES) };
        }
        #[cfg(miri)]
        // SAFETY: as above; under Miri the chunk came from the allocator, with this layout.
        unsafe {
            std::alloc::dealloc(base, CHUNK_LAYOUT)
        };
    }
}

/// Gives back to the system the pages of the chunks kept that hold only free slots (after the
/// guest forgot many nodes: see `inode`).
pub fn give_back_free_pages() {
    let mut a = alloc();
    let Alloc {
        chunks, with_room, ..
    } = &mut *a;
    // Only the chunks a node left since the last time: the lock is held meanwhile, and there
    // may be thousands.
    for number in with_room.iter() {
        let c = &mut chunks[*number as usize];
        if !c.base.is_null() && std::mem::take(&mut c.freed) {
            c.give_back_free_pages();
        }
    }
}

/// What lives in a slot: a value with its own count of references.
///
/// # Safety
/// `pins` returns the same counter for the whole life of the value, which nothing but [`Ref`]
/// changes.
pub unsafe trait Counted: Sync + Send + Sized {
    fn pins(&self) -> &AtomicU32;
}

/// A counted reference to a node in its slot (see the module's doc).
pub struct Ref<T: Counted>(NonNull<T>);

impl<T: Counted + std::fmt::Debug> std::fmt::Debug for Ref<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

// SAFETY: a `Ref` is a shared reference to a `T`, which is `Sync` and `Send`; the count is
// atomic, and the slot is freed by the last reference only, on whatever thread drops it.
unsafe impl<T: Counted> Send for Ref<T> {}
// SAFETY: as above.
unsafe impl<T: Counted> Sync for Ref<T> {}

impl<T: Counted> Ref<T> {
    /// Puts `value` in a free slot, with one reference: the one returned. Like `Box::new`, it
    /// stops the process when no memory can be had: for what the daemon makes before it
    /// serves (the root) and tests; a node a request makes goes through [`Ref::try_new`].
    pub fn new(value: T) -> Ref<T> {
        match Self::try_new(value) {
            Ok(r) => r,
            Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<T>()),
        }
    }

    /// Puts `value` in a free slot, with one reference: the one returned; gives `value` back
    /// when there is none (every slot of the [`CAPACITY`] is taken, or the system gives no more
    /// memory or mappings). The node limit (`--max-nodes`) counts the nodes the guest holds,
    /// not the ones they hold in turn (a parent the guest forgot stays while a node found in
    /// it is held, and a chain restored by a migration holds every ancestor it has): the
    /// slots can run out before it, and the request is then refused, not the process stopped.
    pub fn try_new(value: T) -> Result<Ref<T>, T> {
        const {
            assert!(std::mem::size_of::<T>() <= SLOT && std::mem::align_of::<T>() <= 8);
        }
        let Some(p) = take_slot() else {
            return Err(value);
        };
        value.pins().store(1, Ordering::Relaxed);
        let p = p.cast::<T>();
        // SAFETY: the slot is free, 8-aligned and SLOT bytes long (enough for a `T`, checked
        // above), and ours alone.
        unsafe { p.as_ptr().write(value) };
        Ok(Ref(p))
    }

    /// Whether `a` and `b` are the same node.
    pub fn ptr_eq(a: &Ref<T>, b: &Ref<T>) -> bool {
        a.0 == b.0
    }
}

/// A counted reference to a node held as the number of its slot: what a node table keeps an
/// entry (4 bytes where a [`Ref`] takes 8). Like a [`Ref`], it owns one reference to the node
/// (given back when it is dropped) and derefs to it.
pub struct Slot<T: Counted> {
    n: u32,
    /// Owns what a `Ref` owns (and is `Send` and `Sync` as a `Ref` is).
    _ref: PhantomData<Ref<T>>,
}

impl<T: Counted> Slot<T> {
    /// The reference `r` as a slot number.
    pub fn new(r: Ref<T>) -> Slot<T> {
        let n = slot_number(r.0.cast());
        std::mem::forget(r);
        Slot {
            n,
            _ref: PhantomData,
        }
    }

    /// The reference this slot owns, as a [`Ref`].
    pub fn into_ref(self) -> Ref<T> {
        let r = Ref(self.ptr());
        std::mem::forget(self);
        r
    }

    /// One more reference to the node, as a [`Ref`].
    pub fn to_ref(&self) -> Ref<T> {
        pin(&**self);
        Ref(self.ptr())
    }

    fn ptr(&self) -> NonNull<T> {
        // SAFETY: this slot owns a reference: the slot is live.
        unsafe { slot_ptr(self.n) }.cast()
    }
}

impl<T: Counted> std::ops::Deref for Slot<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the reference this slot owns keeps the node in it for as long as `self` is
        // borrowed.
        unsafe { self.ptr().as_ref() }
    }
}

impl<T: Counted> Drop for Slot<T> {
    fn drop(&mut self) {
        drop(Ref::<T>(self.ptr()));
    }
}

impl<T: Counted + std::fmt::Debug> std::fmt::Debug for Slot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// The address of slot `n`.
///
/// # Safety
/// Slot `n` is live (its chunk is mapped).
unsafe fn slot_ptr(n: u32) -> NonNull<u8> {
    let (chunk, index) = (n as usize / SLOTS, n % SLOTS as u32);
    let base = DIRECTORY[chunk].load(Ordering::Acquire);
    // SAFETY: a live slot's chunk is mapped: its base is not null, nor any slot in it.
    unsafe { NonNull::new_unchecked(slot_at(base, index)) }
}

fn slot_number(p: NonNull<u8>) -> u32 {
    let offset = p.as_ptr().addr() & (CHUNK_BYTES - 1);
    let base = p.as_ptr().wrapping_sub(offset);
    // SAFETY: `p` is a live slot: its chunk's header holds the chunk's number.
    let number = unsafe { base.cast::<u32>().read() };
    number * SLOTS as u32 + (offset / SLOT - 1) as u32
}

fn pin<T: Counted>(d: &T) {
    // As `Arc`: a new reference is made from one held, so no ordering is needed; a count that
    // could wrap means references are leaked without end, and the process stops.
    if d.pins().fetch_add(1, Ordering::Relaxed) > i32::MAX as u32 {
        std::process::abort();
    }
}

impl<T: Counted> Clone for Ref<T> {
    fn clone(&self) -> Ref<T> {
        pin(&**self);
        Ref(self.0)
    }
}

impl<T: Counted> std::ops::Deref for Ref<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this reference keeps the slot live.
        unsafe { self.0.as_ref() }
    }
}

impl<T: Counted> AsRef<T> for Ref<T> {
    fn as_ref(&self) -> &T {
        self
    }
}

/// A node whose last reference went: its slot, and how to drop what is in it.
type Dying = (NonNull<u8>, unsafe fn(NonNull<u8>));

/// Drops the `T` at `p`.
///
/// # Safety
/// `p` holds a `T` that nothing uses any more.
unsafe fn drop_as<T>(p: NonNull<u8>) {
    // SAFETY: as the caller promises.
    unsafe { std::ptr::drop_in_place(p.cast::<T>().as_ptr()) }
}

thread_local! {
    /// Whether this thread is dropping nodes now.
    static DROPPING: Cell<bool> = const { Cell::new(false) };
    /// Nodes whose last reference went while this thread was dropping another.
    static PENDING: RefCell<Vec<Dying>> = const { RefCell::new(Vec::new()) };
}

impl<T: Counted> Drop for Ref<T> {
    fn drop(&mut self) {
        if self.pins().fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // As `Arc`: every use of the node by other references happened before this.
        fence(Ordering::Acquire);
        let dying: Dying = (self.0.cast(), drop_as::<T>);
        let nested = DROPPING.try_with(|d| d.replace(true)).unwrap_or(false);
        if nested && PENDING.try_with(|q| q.borrow_mut().push(dying)).is_ok() {
            return;
        }
        /// Clears the flag when the outermost drop ends, even by a panic (else every last
        /// reference dropped on this thread afterwards would wait in the queue for good).
        struct Outermost(bool);
        impl Drop for Outermost {
            fn drop(&mut self) {
                if self.0 {
                    let _ = DROPPING.try_with(|d| d.set(false));
                }
            }
        }
        let _outermost = Outermost(!nested);
        let mut next = Some(dying);
        while let Some((p, drop_fn)) = next {
            // SAFETY: that was the last reference: nothing else uses the node; dropping it may
            // drop other nodes' last references, which are queued above, not nested.
            unsafe { drop_fn(p) };
            free_slot(p);
            next = PENDING.try_with(|q| q.borrow_mut().pop()).ok().flatten();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Slots this thread may still take (tests only: a slab as good as full, on this thread
        /// alone, while the other tests go on).
        static ROOM: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    /// Whether this thread may take one more slot (one fewer from now on).
    pub(super) fn may_take() -> bool {
        ROOM.with(|r| match r.get() {
            usize::MAX => true,
            0 => false,
            n => {
                r.set(n - 1);
                true
            }
        })
    }

    /// Runs `f` on this thread with `n` slots left to take.
    pub(crate) fn with_room<R>(n: usize, f: impl FnOnce() -> R) -> R {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                ROOM.with(|r| r.set(usize::MAX));
            }
        }
        let _reset = Reset;
        ROOM.with(|r| r.set(n));
        f()
    }

    /// A node for the slab's tests: its count, a number, and the node it holds (as a node holds
    /// its parent).
    #[derive(Debug)]
    struct Probe {
        pins: AtomicU32,
        id: u64,
        parent: Option<Ref<Probe>>,
    }

    // SAFETY: `pins` is a field of the probe, changed by nothing but `Ref`.
    unsafe impl Counted for Probe {
        fn pins(&self) -> &AtomicU32 {
            &self.pins
        }
    }

    fn probe(id: u64, parent: Option<Ref<Probe>>) -> Ref<Probe> {
        Ref::new(Probe {
            pins: AtomicU32::new(0),
            id,
            parent,
        })
    }

    /// Miri runs these tests too, some thousand times slower: `n` there is `small`.
    fn scaled(n: u64, small: u64) -> u64 {
        if cfg!(miri) {
            small
        } else {
            n
        }
    }

    /// A chain of nodes each held only by its child (its parent forgotten first): dropping the
    /// last child drops them all one after the other, on a stack far too small for one nested
    /// drop per node.
    #[test]
    fn a_chain_of_parents_as_long_as_a_guest_likes_is_dropped_without_recursion() {
        let length = scaled(200_000, 2_000);
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let mut last = probe(2, None);
                for i in 0..length {
                    last = probe(3 + i, Some(last));
                }
                let parent = last.parent.clone().unwrap();
                assert_eq!(parent.id, length + 1);
                drop(parent);
                drop(last);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// Nodes made, shared and dropped on many threads at once: no two live nodes share a slot,
    /// and a node's references all come back.
    #[test]
    fn nodes_made_and_dropped_on_many_threads_never_share_a_slot() {
        let turns = scaled(5_000, 150);
        let shared = probe(2, None);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..turns {
                        let n = probe(10 + t * 10_000 + i, Some(shared.clone()));
                        if i % 3 == 0 {
                            drop(n);
                        } else {
                            mine.push(n);
                        }
                    }
                    mine
                })
            })
            .collect();
        let all: Vec<Ref<Probe>> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let mut addrs: Vec<usize> = all.iter().map(|n| &**n as *const Probe as usize).collect();
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), all.len(), "two live nodes in one slot");
        for n in &all {
            assert_eq!(n.parent.as_ref().unwrap().id, 2);
        }
        assert_eq!(
            shared.pins().load(Ordering::Relaxed) as usize,
            1 + all.len()
        );
        drop(all);
        assert_eq!(shared.pins().load(Ordering::Relaxed), 1);
    }

    /// A slot holds the reference it was given, leads back to the same node, and gives its
    /// reference back when dropped; in 4 bytes.
    #[test]
    fn slots_lead_back_to_their_node_and_own_a_reference() {
        assert_eq!(std::mem::size_of::<Slot<Probe>>(), 4);
        let n = probe(7, None);
        let kept = n.clone();
        let s = Slot::new(n);
        assert_eq!(s.id, 7);
        assert_eq!(kept.pins().load(Ordering::Relaxed), 2);
        let back = s.to_ref();
        assert!(Ref::ptr_eq(&back, &kept));
        assert_eq!(kept.pins().load(Ordering::Relaxed), 3);
        drop(back);
        let again = Slot::new(s.into_ref());
        assert_eq!(kept.pins().load(Ordering::Relaxed), 2);
        drop(again);
        assert_eq!(kept.pins().load(Ordering::Relaxed), 1);
        // The last reference held by a slot drops the node and frees its slot (for the next
        // node on this thread, the lowest free slot of its chunk may be that one).
        let parent = probe(8, None);
        let child = Slot::new(probe(9, Some(parent.clone())));
        assert_eq!(parent.pins().load(Ordering::Relaxed), 2);
        drop(child);
        assert_eq!(parent.pins().load(Ordering::Relaxed), 1);
        assert_eq!(kept.id, 7);
    }

    /// The slots of a chunk that overlap bytes `from..to` of it.
    fn slots_in(from: usize, to: usize) -> impl Iterator<Item = usize> {
        (0..SLOTS).filter(move |i| (i + 1) * SLOT < to && (i + 2) * SLOT > from)
    }

    /// Whatever the system's page size, the runs given back are whole pages of it (`madvise`
    /// refuses a start that is not page-aligned and rounds the length up to a page: a run of
    /// 4 KiB on a 64 KiB-page kernel would zero the 60 KiB of live nodes after it), never the
    /// header's page, and every page holding only free slots is in one.
    #[test]
    #[cfg_attr(miri, ignore = "arithmetic only, and minutes under Miri")]
    fn free_page_runs_are_whole_pages_of_the_system_size_without_a_live_slot() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut layouts: Vec<Vec<usize>> = vec![vec![], vec![0], vec![SLOTS - 1]];
        // One live slot at each place, a few at random, a run at the start.
        layouts.extend((0..SLOTS).step_by(37).map(|i| vec![i]));
        layouts.extend((0..50).map(|_| {
            (0..1 + random() % 6)
                .map(|_| (random() % SLOTS as u64) as usize)
                .collect()
        }));
        layouts.push((0..200).collect());
        for page in [4096, 16384, 65536] {
            for live in &layouts {
                let mut c = Chunk::new(std::ptr::null_mut());
                let mut taken = vec![false; SLOTS];
                for &i in live {
                    taken[i] = true;
                }
                // Take the lowest free slots, then give back those not meant to be live.
                let top = live.iter().max().map_or(0, |m| m + 1);
                for _ in 0..top {
                    c.take();
                }
                for i in (0..top).filter(|i| !taken[*i]) {
                    c.put(i as u32);
                }
                let mut covered = vec![false; CHUNK_BYTES / page];
                c.free_page_runs(page, |offset, len| {
                    assert!(offset % page == 0 && len % page == 0 && len > 0);
                    assert!(offset >= page, "the header's page");
                    assert!(offset + len <= CHUNK_BYTES);
                    for i in slots_in(offset, offset + len) {
                        assert!(!taken[i], "live slot {i} in {offset}+{len} (page {page})");
                    }
                    covered[offset / page..(offset + len) / page].fill(true);
                });
                for (p, covered) in covered.iter().enumerate().skip(1) {
                    let free = slots_in(p * page, (p + 1) * page).all(|i| !taken[i]);
                    assert_eq!(*covered, free, "page {p} of {page} bytes, live {live:?}");
                }
            }
        }
    }
}
