//! The inode store: node ids handed to the guest, each backed by a host file reached through
//! its parent and name, an `O_PATH | O_NOFOLLOW` descriptor, or a file handle.
//!
//! A host file is identified by an [`InodeKey`]: (`st_dev`, `st_ino`, mount id), its type and,
//! where the file system stamps one, its birth time. Looking up a file already known returns
//! its node id and adds a reference, so one host file has one node id at a time. The table is
//! read-mostly: lookups of known files and most forgets take only the read lock and change the
//! per-inode atomic count; the write lock is taken to add an inode and to remove one whose
//! count reaches zero.
//!
//! # A node id names one file for its whole life
//! An inode found by name keeps no descriptor, so the host may free its inode number once the
//! file is deleted and give it to a new file while the guest still holds the node. The key
//! alone cannot tell the two apart when the new file has the same type and was born in the same
//! clock tick; each inode therefore carries what does ([`Identity`]): a birth time old enough
//! that no new file can share it (settled), else the file's handle (whose generation differs
//! for a new file), else an `O_PATH` descriptor held from the start (the number cannot be
//! reused while it is open). A file found under a known key that fails that check is a new
//! inode, and the old one is retired: it keeps its node id until forgotten but is reached by no
//! name any more ([`InodeStore::retire`]).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, Weak};

use super::key::{Identity, InodeKey, Stamp};
use crate::passthrough::file_handle::FileHandle;
use crate::passthrough::handle::HandleData;
use crate::passthrough::sys::{OnceFd, StatExtra};
use once_cell::race::OnceBox;

use crate::fuse::abi::ROOT_ID;

use super::memory::{give_back_free_memory, GiveBack};
use super::slab::{self, Counted, Slot};

/// A counted reference to a node (in its slot: see [`slab`]).
pub type Node = slab::Ref<InodeData>;

/// Where an inode was found by name: its parent directory and its name there. An inode found
/// this way gets no descriptor until an operation needs one (see [`InodeData`]).
#[derive(Debug)]
pub struct Origin {
    pub parent: Node,
    name: StoredName,
}

impl Origin {
    pub fn new(parent: Node, name: &CStr) -> Self {
        Origin {
            parent,
            name: StoredName::new(name),
        }
    }

    /// The name, without its NUL.
    pub fn name(&self) -> &[u8] {
        self.name.bytes()
    }
}

/// Bytes of a name kept inside the node (without a NUL): most names in a tree are shorter.
const INLINE_NAME: usize = 14;

/// A name kept by a node: inside it when short (no allocation of its own), on the heap else.
/// 16 bytes either way.
#[derive(Debug)]
pub(super) enum StoredName {
    Inline { len: u8, bytes: [u8; INLINE_NAME] },
    Heap(Box<CString>),
}

impl StoredName {
    pub(super) fn new(name: &CStr) -> Self {
        let b = name.to_bytes();
        match u8::try_from(b.len()) {
            Ok(len) if b.len() <= INLINE_NAME => {
                let mut bytes = [0u8; INLINE_NAME];
                bytes[..b.len()].copy_from_slice(b);
                StoredName::Inline { len, bytes }
            }
            _ => StoredName::Heap(Box::new(name.to_owned())),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            StoredName::Inline { len, bytes } => &bytes[..usize::from(*len).min(INLINE_NAME)],
            StoredName::Heap(c) => c.to_bytes(),
        }
    }
}

/// How a new inode is reached.
pub enum Source {
    /// An `O_PATH | O_NOFOLLOW` descriptor of the file.
    Fd(OwnedFd),
    /// A name in a parent directory; the descriptor is opened on first need.
    Found(Origin),
}

/// An `O_PATH` descriptor of an inode: the one the inode keeps, or one opened for a single
/// operation (closed when dropped). Use it through [`AsFd`], and keep it alive as long as a
/// `/proc/self/fd/N` name made from it is used.
#[derive(Debug)]
pub enum PathFd<'a> {
    Kept(BorrowedFd<'a>),
    Owned(OwnedFd),
}

impl AsFd for PathFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            PathFd::Kept(fd) => fd.as_fd(),
            PathFd::Owned(fd) => fd.as_fd(),
        }
    }
}

/// One host file the guest holds references on.
///
/// Most inodes come from a lookup or a directory listing and are never used for more than a
/// `stat` (a `find`, an `ls -l`): they keep only their parent and name, and the passthrough
/// filesystem opens an `O_PATH` descriptor the first time an operation needs one, checking
/// that the name still leads to the same file (else `ESTALE`). That keeps a tree walk to one
/// `statx` per entry and the daemon's descriptors bounded by what the guest really uses.
///
/// With file handles (`--inode-file-handles=prefer|mandatory`) an inode other than a directory
/// keeps a file handle instead of that descriptor, taken the first time a descriptor is needed
/// (at lookup with `mandatory`), and each operation opens a descriptor for its own use.
///
/// It lives in a slot of [`slab`], reached through [`Node`]s; every node of a walk costs its
/// size (a unit test keeps it there) and nothing else but its two table entries.
#[derive(Debug)]
pub struct InodeData {
    pub id: u64,
    pub key: InodeKey,
    refcount: AtomicU64,
    /// References to this node's slot: the id table's, requests', children's (see [`slab`]).
    pins: AtomicU32,
    /// `O_PATH | O_NOFOLLOW` descriptor of the file once opened and kept (set once).
    fd: OnceFd,
    /// Open handles of this inode (OPEN, OPENDIR, CREATE not yet released).
    pub handles: AtomicU32,
    /// How this inode's mount tells files apart.
    pub identity: Identity,
    /// The key alone proves identity: the birth time was settled when last checked.
    settled: AtomicBool,
    /// Another file has this inode's key now (see [`InodeStore::retire`]).
    stale: AtomicBool,
    /// The file handles of the file, once one is known (set once; most nodes have none).
    file_handles: OnceBox<FileHandles>,
    /// Where it was found, and what only opened inodes need.
    state: Mutex<State>,
}

/// The file handles of a node.
#[derive(Debug, Default)]
struct FileHandles {
    /// The file handle taken when the inode was added, for an inode whose key alone does not
    /// prove it is the same file (see [`InodeData::proven_by_key`]).
    ident: Option<FileHandle>,
    /// File handle of the file, once taken (file handle modes only).
    kept: OnceLock<FileHandle>,
}

/// The parts of a node that change under its lock.
#[derive(Debug, Default)]
struct State {
    /// Parent and name, for inodes found by name (updated when found again by another name).
    origin: Option<Origin>,
    /// What only opened inodes need, made at the first open (most nodes of a walk are never
    /// opened: they do not pay for it).
    opened: Option<Box<Opened>>,
}

/// The part of a node that only opens use.
#[derive(Debug, Default)]
struct Opened {
    /// The handle this inode was last opened with, to stat it after its name is gone.
    last_open: Weak<HandleData>,
    /// The settled stamp of what the guest was last given: for a directory, of the last listing
    /// served from offset 0; for a file, of the file at the last OPEN. Lets OPENDIR and OPEN
    /// tell the guest that the listing or pages it cached are still the file's.
    served: Option<Stamp>,
}

// SAFETY: `pins` is one field of the node, changed by nothing but `slab::Ref`.
unsafe impl Counted for InodeData {
    fn pins(&self) -> &AtomicU32 {
        &self.pins
    }
}

impl InodeData {
    pub(super) fn new(id: u64, n: NewInode) -> Self {
        let (fd, origin) = match n.source {
            Source::Fd(fd) => (Some(fd), None),
            Source::Found(origin) => (None, Some(origin)),
        };
        let file_handles = match n.handle {
            Some(h) => OnceBox::with_value(Box::new(FileHandles {
                ident: Some(h),
                kept: OnceLock::new(),
            })),
            None => OnceBox::new(),
        };
        InodeData {
            id,
            key: n.key,
            refcount: AtomicU64::new(1),
            pins: AtomicU32::new(1),
            fd: OnceFd::new(fd),
            handles: AtomicU32::new(0),
            identity: n.identity,
            settled: AtomicBool::new(n.settled),
            stale: AtomicBool::new(false),
            file_handles,
            state: Mutex::new(State {
                origin,
                opened: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn file_handles(&self) -> Option<&FileHandles> {
        self.file_handles.get()
    }

    /// The handle this inode was last opened with, if it is still open.
    pub fn last_open(&self) -> Option<Arc<HandleData>> {
        self.state()
            .opened
            .as_ref()
            .and_then(|o| o.last_open.upgrade())
    }

    /// Records `h` as the handle this inode was last opened with.
    pub fn set_last_open(&self, h: &Arc<HandleData>) {
        self.state()
            .opened
            .get_or_insert_with(Default::default)
            .last_open = Arc::downgrade(h);
    }

    /// The settled stamp of what the guest was last given (see [`Opened::served`]).
    pub fn served(&self) -> Option<Stamp> {
        self.state().opened.as_ref().and_then(|o| o.served)
    }

    /// Records the stamp of what the guest was given now (`None`: nothing it may keep).
    pub fn set_served(&self, stamp: Option<Stamp>) {
        self.update_served(|s| *s = stamp);
    }

    /// Sets the served stamp to `f(current)` under one lock; returns what `f` returned.
    pub fn update_served<R>(&self, f: impl FnOnce(&mut Option<Stamp>) -> R) -> R {
        let mut st = self.state();
        let o = &mut st.opened;
        let mut cur = o.as_ref().and_then(|o| o.served);
        let r = f(&mut cur);
        match (o.as_mut(), cur) {
            (Some(o), _) => o.served = cur,
            (None, None) => {}
            (None, Some(_)) => {
                *o = Some(Box::new(Opened {
                    served: cur,
                    ..Default::default()
                }))
            }
        }
        r
    }

    /// Whether a file with this inode's key is this inode without further proof: its birth
    /// time was settled, or it keeps a descriptor (its number cannot have been reused), unless
    /// its mount is told apart by file handles and it has one (a network file system may give
    /// a number away while a client holds the file open).
    pub fn proven_by_key(&self) -> bool {
        self.settled.load(Ordering::Relaxed)
            || (self.opened_fd().is_some()
                && (self.identity != Identity::Handle || self.ident_handle().is_none()))
    }

    /// The file handle that proves identity, for an inode whose key does not.
    pub fn ident_handle(&self) -> Option<&FileHandle> {
        self.file_handles().and_then(|h| h.ident.as_ref())
    }

    /// Records that the key alone proves identity from now on.
    pub fn settle(&self) {
        self.settled.store(true, Ordering::Relaxed);
    }

    /// Whether another file has taken this inode's key (it is reached by no name any more).
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Where the inode was last found by name (the name copied, on the stack when it fits: a
    /// request that reaches a file through its name allocates nothing for it).
    pub fn origin(&self) -> Option<(Node, OriginName)> {
        let st = self.state();
        st.origin
            .as_ref()
            .map(|o| (o.parent.clone(), OriginName::new(o.name())))
    }

    /// The directory where the inode was last found by name (its name is not copied).
    pub fn parent(&self) -> Option<Node> {
        self.state().origin.as_ref().map(|o| o.parent.clone())
    }

    /// Records that the inode was found as `name` in `parent` (an inode without a descriptor
    /// then reopens through that name).
    pub fn found_at(&self, parent: &Node, name: &CStr) {
        if self.opened_fd().is_some() {
            return;
        }
        let old = {
            let mut st = self.state();
            // Once more under the lock: `keep_fd` sets the descriptor before it takes the
            // origin under this lock, so a descriptor set since the check above shows here,
            // and an origin set here is taken by it.
            if self.opened_fd().is_some() {
                return;
            }
            let same = st
                .origin
                .as_ref()
                .is_some_and(|o| Node::ptr_eq(&o.parent, parent) && o.name() == name.to_bytes());
            if same {
                return;
            }
            st.origin.replace(Origin::new(parent.clone(), name))
        };
        // The old parent's reference goes outside the lock.
        drop(old);
    }

    /// The `O_PATH` descriptor, if it was opened.
    pub fn opened_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.get()
    }

    /// Keeps `fd` as this inode's descriptor (unless another thread set one first) and returns
    /// the descriptor kept.
    pub fn keep_fd(&self, fd: OwnedFd) -> BorrowedFd<'_> {
        let kept = self.fd.set(fd);
        // The parent is no longer needed to reach this inode.
        let origin = self.state().origin.take();
        drop(origin);
        kept
    }

    /// The file handle, if one was taken.
    pub fn file_handle(&self) -> Option<&FileHandle> {
        self.file_handles().and_then(|h| h.kept.get())
    }

    /// Keeps `h` as this inode's file handle (unless one is kept already).
    pub fn keep_file_handle(&self, h: FileHandle) {
        let _ = self
            .file_handles
            .get_or_init(Box::<FileHandles>::default)
            .kept
            .set(h);
    }

    pub fn is_dir(&self) -> bool {
        self.key.kind() == libc::S_IFDIR
    }

    pub fn is_symlink(&self) -> bool {
        self.key.kind() == libc::S_IFLNK
    }

    /// References the guest holds on this node.
    pub fn refcount(&self) -> u64 {
        self.refcount.load(Ordering::Relaxed)
    }
}

/// A name copied out of an inode's [`Origin`]: inline up to `NAME_MAX` bytes (on the stack of
/// the request), on the heap past that (a file system that allows longer names).
pub struct OriginName {
    buf: [u8; 256],
    len: u16,
    heap: Option<CString>,
}

impl OriginName {
    /// `name` (without a NUL, and none inside: it came from a C string).
    pub(super) fn new(name: &[u8]) -> Self {
        let mut n = OriginName {
            buf: [0u8; 256],
            len: 0,
            heap: None,
        };
        match u16::try_from(name.len() + 1).ok().filter(|&l| l <= 256) {
            Some(len) => {
                n.buf[..name.len()].copy_from_slice(name);
                n.len = len;
            }
            None => n.heap = CString::new(name).ok(),
        }
        n
    }
}

impl std::ops::Deref for OriginName {
    type Target = CStr;

    fn deref(&self) -> &CStr {
        match &self.heap {
            Some(c) => c,
            None => {
                CStr::from_bytes_with_nul(&self.buf[..usize::from(self.len)]).unwrap_or_default()
            }
        }
    }
}

/// The two indexes of the inodes: by node id and by key. Each entry is the number of the
/// node's slot (see [`slab`]), whose node holds its id and key: a node costs the tables
/// 2 × 5 bytes a slot (with hashbrown's control byte), not a copy of its key.
///
/// Every entry is a [`Slot`]: it holds one reference on its node (given back when the entry
/// goes, or when the tables are dropped), and leads to it safely. `by_key` holds a subset of
/// the nodes of `by_id`.
pub(super) struct Maps {
    /// Node id → inode.
    pub(super) by_id: HashTable<Slot<InodeData>>,
    /// Key → the inode that key leads to now (a retired inode is in `by_id` only).
    pub(super) by_key: HashTable<Slot<InodeData>>,
    /// Keyed hashing of keys: the host's inode numbers are not chosen by the daemon.
    keys: RandomState,
    /// The secret of the id hash (see [`id_hash`]).
    seed: u64,
}

impl Default for Maps {
    fn default() -> Self {
        let keys = RandomState::new();
        Maps {
            by_id: HashTable::new(),
            by_key: HashTable::new(),
            seed: keys.hash_one(0u64),
            keys,
        }
    }
}

/// Hash of a node id with the table's secret `seed`: a 128-bit product folded onto itself, so
/// that every bit of the id reaches the low bits that choose the slot. Ids are the daemon's
/// own, but a migration state names ids of its own choosing: ids sharing their low bits
/// (`k << 40`) must not share a slot, or a forged state would make each lookup O(n).
pub(super) fn id_hash(seed: u64, id: u64) -> u64 {
    let p = u128::from(id ^ seed) * 0x9e37_79b9_7f4a_7c15_u128;
    (p as u64) ^ ((p >> 64) as u64)
}

impl Maps {
    fn key_hash(&self, key: &InodeKey) -> u64 {
        self.keys.hash_one(key)
    }

    /// The secret of the id hash (random per table).
    pub(super) fn id_seed(&self) -> u64 {
        self.seed
    }

    fn find_id(&self, id: u64) -> Option<&Slot<InodeData>> {
        self.by_id.find(id_hash(self.id_seed(), id), |s| s.id == id)
    }

    fn get_id(&self, id: u64) -> Option<&InodeData> {
        self.find_id(id).map(|s| &**s)
    }

    /// The node `id`, with one more reference.
    fn clone_id(&self, id: u64) -> Option<Node> {
        self.find_id(id).map(Slot::to_ref)
    }

    fn find_key(&self, key: &InodeKey) -> Option<&Slot<InodeData>> {
        self.by_key.find(self.key_hash(key), |s| s.key == *key)
    }

    fn get_key(&self, key: &InodeKey) -> Option<&InodeData> {
        self.find_key(key).map(|s| &**s)
    }

    /// The node of `key`, with one more reference.
    fn clone_key(&self, key: &InodeKey) -> Option<Node> {
        self.find_key(key).map(Slot::to_ref)
    }

    fn has_id(&self, id: u64) -> bool {
        self.find_id(id).is_some()
    }

    /// Adds `data` under its id and its key (the callers checked that neither is taken); the
    /// tables keep its reference.
    fn add(&mut self, data: Node) {
        let seed = self.id_seed();
        let keys = &self.keys;
        let (id, key) = (data.id, data.key);
        self.by_key
            .insert_unique(keys.hash_one(key), Slot::new(data.clone()), |s| {
                keys.hash_one(s.key)
            });
        self.by_id
            .insert_unique(id_hash(seed, id), Slot::new(data), |s| id_hash(seed, s.id));
    }

    /// Removes the inode `id` from both indexes (from the key index only if its key still
    /// leads to it), and gives back the reference the tables held.
    fn remove(&mut self, id: u64) -> Option<Node> {
        let seed = self.id_seed();
        let data = match self.by_id.find_entry(id_hash(seed, id), |s| s.id == id) {
            Ok(e) => e.remove().0.into_ref(),
            Err(_) => return None,
        };
        self.unkey(&data);
        Some(data)
    }

    /// Removes `data` from the key index, if its key leads to it.
    fn unkey(&mut self, data: &InodeData) {
        let h = self.key_hash(&data.key);
        if let Ok(e) = self.by_key.find_entry(h, |s| s.id == data.id) {
            e.remove();
        }
    }

    fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Every node, with one more reference each.
    fn nodes(&self) -> Vec<Node> {
        self.by_id.iter().map(Slot::to_ref).collect()
    }
}

/// Tables smaller than this many slots are left as they are.
pub(super) const SHRINK_FLOOR: usize = 256;

impl Maps {
    /// Gives the tables' room back once a quarter of it is used (the guest forgot most of what
    /// it held): to twice what is left, so that forgetting stays amortised O(1) and the memory
    /// of a walk the guest has forgotten goes back to the system (a big table is a mapping of
    /// its own, unmapped when it is reallocated smaller).
    fn shrink_when_sparse(&mut self) {
        let seed = self.id_seed();
        let sparse = |cap: usize, len: usize| cap > SHRINK_FLOOR && len.saturating_mul(4) < cap;
        if sparse(self.by_id.capacity(), self.by_id.len()) {
            self.by_id
                .shrink_to(self.by_id.len() * 2, |s| id_hash(seed, s.id));
        }
        if sparse(self.by_key.capacity(), self.by_key.len()) {
            let keys = &self.keys;
            self.by_key
                .shrink_to(self.by_key.len() * 2, |s| keys.hash_one(s.key));
        }
    }
}

/// What a FORGET did (see [`InodeStore::forget_deferred`]).
#[derive(Debug)]
pub struct Forgotten {
    /// The key of a directory that went (what was cached of its listings may go too).
    pub dir: Option<InodeKey>,
    /// Whether to give the free memory back now ([`give_back_free_memory`]).
    pub give_back: bool,
}

/// A new inode for [`InodeStore::insert`].
pub struct NewInode {
    pub key: InodeKey,
    pub identity: Identity,
    pub source: Source,
    /// The file handle proving identity (when the key does not).
    pub handle: Option<FileHandle>,
    /// Whether the key alone proves identity.
    pub settled: bool,
}

/// Why [`InodeStore::insert`] or [`InodeStore::restore`] added no node.
pub enum NotAdded {
    /// Its key (or, for a restore, its id) is taken: the new inode given back.
    Known(NewInode),
    /// No slot for it (see [`slab::Ref::try_new`]): refused with `ENFILE`.
    NoRoom,
}

impl std::fmt::Debug for NotAdded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotAdded::Known(_) => "Known",
            NotAdded::NoRoom => "NoRoom",
        })
    }
}

/// Node `id` made of `n` in a slot of its own; `NoRoom` when there is none left (logged once
/// per thousand refusals).
fn new_node(id: u64, n: NewInode) -> Result<Node, NotAdded> {
    Node::try_new(InodeData::new(id, n)).map_err(|refused| {
        // What it holds (a descriptor, a parent, a name) goes with it.
        drop(refused);
        static REFUSED: AtomicU64 = AtomicU64::new(0);
        if REFUSED.fetch_add(1, Ordering::Relaxed) % 1000 == 0 {
            log::warn!(
                "no room for another node (the nodes the guest holds hold {} slots of memory, \
                 or the system gives no more): refused with ENFILE",
                slab::CAPACITY
            );
        }
        NotAdded::NoRoom
    })
}

/// Node id → inode, and host identity → node id.
pub struct InodeStore {
    pub(super) maps: RwLock<Maps>,
    next_id: AtomicU64,
    /// Ids of inodes whose file is gone from the host with nothing left to serve it (see
    /// [`InodeStore::bury`]), as ranges `start → end` (exclusive): the ids the guest has not
    /// forgotten yet, which answer `ESTALE`. Ids are given in order, so the ids of files made
    /// and removed one after the other make one range. Nodes and ranges together are at most
    /// [`InodeStore::set_limit`]'s: past it the oldest ranges go (see [`InodeStore::trim`]).
    dead: Mutex<BTreeMap<u64, u64>>,
    /// Most nodes and ranges of dead ids held together (`--max-nodes`).
    limit: AtomicUsize,
    /// When FORGETs give the free memory back.
    pub(super) give_back: GiveBack,
}

impl InodeStore {
    /// A store holding only the root directory, as [`ROOT_ID`].
    pub fn new(
        root_fd: OwnedFd,
        root_st: &libc::stat64,
        x: &StatExtra,
        identity: Identity,
    ) -> std::io::Result<Self> {
        let store = InodeStore {
            maps: RwLock::new(Maps::default()),
            next_id: AtomicU64::new(ROOT_ID + 1),
            dead: Mutex::new(BTreeMap::new()),
            limit: AtomicUsize::new(usize::MAX),
            give_back: GiveBack::default(),
        };
        store.insert_root(root_fd, root_st, x, identity)?;
        Ok(store)
    }

    fn insert_root(
        &self,
        fd: OwnedFd,
        st: &libc::stat64,
        x: &StatExtra,
        identity: Identity,
    ) -> std::io::Result<()> {
        let key = InodeKey::new(st, x, identity)?;
        let data = Node::new(InodeData::new(
            ROOT_ID,
            NewInode {
                key,
                identity,
                source: Source::Fd(fd),
                handle: None,
                settled: true,
            },
        ));
        let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        maps.add(data);
        Ok(())
    }

    /// Sets how many nodes and ranges of dead ids the store holds at most (`--max-nodes`; no
    /// limit until set).
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Drops the oldest ranges of dead ids until they and `nodes` nodes fit the limit: a
    /// guest that interleaves ids it keeps with ids of removed files, or forgets every other
    /// id of a range, makes a range each (54 bytes), which count against `--max-nodes` as its
    /// nodes do, so that what the guest makes the daemon keep has one bound, and a migration
    /// destination with the same limit takes every state the source makes. A dropped range's
    /// ids answer `EBADF` instead of `ESTALE` (they are never given again).
    fn trim(&self, dead: &mut BTreeMap<u64, u64>, nodes: usize) {
        let room = self.limit.load(Ordering::Relaxed).saturating_sub(nodes);
        if dead.len() <= room {
            return;
        }
        static TRIMMED: AtomicU64 = AtomicU64::new(0);
        if TRIMMED.fetch_add(1, Ordering::Relaxed) % 1000 == 0 {
            log::warn!(
                "{} ranges of ids of files gone and {nodes} nodes past --max-nodes: the oldest \
                 ranges are dropped (their ids answer EBADF instead of ESTALE)",
                dead.len()
            );
        }
        while dead.len() > room {
            dead.pop_first();
        }
    }

    /// The inode with node id `id`.
    pub fn get(&self, id: u64) -> Option<Node> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        maps.clone_id(id)
    }

    /// Adds one reference on `id`, if it is known.
    pub fn add_ref(&self, id: u64) -> bool {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        match maps.get_id(id) {
            Some(data) => {
                data.refcount.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Adds `n` as a new inode with a count of 1 and returns it; gives `n` back when
    /// its key is known already (the caller then checks that inode: see `InodeData`).
    pub fn insert(&self, n: NewInode) -> Result<Node, NotAdded> {
        let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        if maps.get_key(&n.key).is_some() {
            return Err(NotAdded::Known(n));
        }
        // Ids restored by a migration may lie ahead of the counter: never give one twice.
        let mut id = self.next_id.fetch_add(1, Ordering::Relaxed);
        while maps.has_id(id) || id == 0 {
            id = self.next_id.fetch_add(1, Ordering::Relaxed);
        }
        let data = new_node(id, n)?;
        maps.add(data.clone());
        self.give_back.held(maps.len());
        self.trim(
            &mut self.dead.lock().unwrap_or_else(PoisonError::into_inner),
            maps.len(),
        );
        Ok(data)
    }

    /// Marks `data` stale: another file has its key now. It keeps its node id (and what it
    /// holds open) until the guest forgets it, but its key no longer leads to it.
    pub fn retire(&self, data: &InodeData) {
        let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        data.stale.store(true, Ordering::Relaxed);
        maps.unkey(data);
        log::debug!(
            "node {} retired: its inode number {} now names another file",
            data.id,
            data.key.ino
        );
    }

    /// Drops the inode `data`, whose file no longer exists on the host and which nothing the
    /// daemon holds (handle, descriptor) can serve any more: it would cost memory until the
    /// guest forgets it, which a guest need never do. Its id answers `ESTALE` from now on (see
    /// [`InodeStore::is_dead`]) until the guest forgets it.
    pub fn bury(&self, data: &InodeData) {
        let removed = {
            let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
            let removed = maps.remove(data.id);
            if removed.is_some() {
                // Under the table's lock, so that a FORGET of the id cannot come in between.
                let mut dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
                Self::add_dead(&mut dead, data.id);
                self.trim(&mut dead, maps.len());
            }
            removed
        };
        // The descriptors it held (none: see the caller) and its name go outside the lock.
        drop(removed);
    }

    /// Adds `id` to the ranges of buried ids.
    fn add_dead(dead: &mut BTreeMap<u64, u64>, id: u64) {
        // Joined to the range ending at `id` (the usual case: made and removed in turn).
        let before = dead.range(..id).next_back().map(|(s, e)| (*s, *e));
        match before {
            Some((start, end)) if end == id => {
                dead.insert(start, id + 1);
            }
            _ => {
                dead.insert(id, id + 1);
            }
        }
        if let Some(after_end) = dead.remove(&(id + 1)) {
            let start = dead.range(..=id).next_back().map(|(s, _)| *s).unwrap_or(id);
            dead.insert(start, after_end);
        }
    }

    /// Whether `id` is the id of a buried inode the guest has not forgotten.
    pub fn is_dead(&self, id: u64) -> bool {
        Self::in_ranges(
            &self.dead.lock().unwrap_or_else(PoisonError::into_inner),
            id,
        )
    }

    fn in_ranges(dead: &BTreeMap<u64, u64>, id: u64) -> bool {
        dead.range(..=id)
            .next_back()
            .is_some_and(|(_, end)| id < *end)
    }

    /// The guest forgot the buried id `id`.
    fn forget_dead(&self, id: u64) {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        let mut dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((start, end)) = dead.range(..=id).next_back().map(|(s, e)| (*s, *e)) else {
            return;
        };
        if id >= end {
            return;
        }
        dead.remove(&start);
        if start < id {
            dead.insert(start, id);
        }
        if id + 1 < end {
            dead.insert(id + 1, end);
        }
        // A range split in two: one more to hold.
        self.trim(&mut dead, maps.len());
    }

    /// The number of ranges of buried ids (what they cost).
    #[cfg(test)]
    pub fn dead_ranges(&self) -> usize {
        self.dead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The inode identified by `key`, if known (no reference is taken).
    pub fn find(&self, key: &InodeKey) -> Option<Node> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        maps.clone_key(key)
    }

    /// Adds one reference on the inode identified by `key`, if it is known, and returns it.
    pub fn ref_known(&self, key: &InodeKey) -> Option<Node> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        let data = maps.clone_key(key)?;
        // Counts only drop to zero (and entries go away) under the write lock, so an entry seen
        // under any lock is live and taking a reference on it is enough.
        data.refcount.fetch_add(1, Ordering::Relaxed);
        Some(data)
    }

    /// Drops `count` references on `id` (see [`InodeStore::forget_deferred`]), and gives the
    /// free memory back to the system when it is time to. Returns the key of a directory that
    /// went (what was cached of its listings may go too).
    pub fn forget(&self, id: u64, count: u64) -> Option<InodeKey> {
        let f = self.forget_deferred(id, count);
        if f.give_back {
            give_back_free_memory();
        }
        f.dir
    }

    /// Drops `count` references on `id`; at zero the inode is removed and its descriptor closed
    /// (once no request still uses it). Unknown ids and the root are ignored. Says whether the
    /// caller is to give the free memory back, once it dropped what goes with the node (its
    /// listing): see [`give_back_free_memory`].
    pub fn forget_deferred(&self, id: u64, count: u64) -> Forgotten {
        let none = Forgotten {
            dir: None,
            give_back: false,
        };
        if id == ROOT_ID || count == 0 {
            return none;
        }
        {
            let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
            let Some(data) = maps.get_id(id) else {
                drop(maps);
                self.forget_dead(id);
                return none;
            };
            // Fast path: the count stays above zero.
            let mut cur = data.refcount.load(Ordering::Relaxed);
            while cur > count {
                match data.refcount.compare_exchange_weak(
                    cur,
                    cur - count,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return none,
                    Err(now) => cur = now,
                }
            }
        }
        let removed = {
            let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
            let Some(data) = maps.get_id(id) else {
                // Buried between the read lock and this one: forget the dead id instead.
                drop(maps);
                self.forget_dead(id);
                return none;
            };
            // Under the write lock nobody else changes counts.
            let left = data.refcount.load(Ordering::Relaxed).saturating_sub(count);
            data.refcount.store(left, Ordering::Relaxed);
            if left > 0 {
                return none;
            }
            let removed = maps.remove(id);
            maps.shrink_when_sparse();
            let halved = self.give_back.removed(maps.len());
            (removed, halved)
        };
        // The descriptor closes outside the lock (when the last `Arc` goes).
        let (removed, halved) = removed;
        // A retired directory shares its key with the one that has it now: its listing stays.
        let dir = removed
            .as_ref()
            .filter(|d| d.is_dir() && !d.is_stale())
            .map(|d| d.key);
        // When half the nodes are gone since the last give-back, free in the allocator's
        // arenas, in pages it keeps (the tables' room too, after a shrink), the caller gives
        // those back.
        drop(removed);
        Forgotten {
            dir,
            give_back: halved,
        }
    }

    /// Every inode, by node id (for a migration's save).
    pub fn all(&self) -> Vec<Node> {
        let maps = self.maps.read().unwrap_or_else(PoisonError::into_inner);
        let mut v = maps.nodes();
        v.sort_by_key(|d| d.id);
        v
    }

    /// The node id the next new inode gets.
    pub fn next_id(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// Makes the next new inode get at least `id` (a migration destination goes on numbering
    /// where the source stopped: a node id is never given twice).
    pub fn reserve_ids(&self, id: u64) {
        self.next_id.fetch_max(id, Ordering::Relaxed);
    }

    /// Adds `n` as node `id` with `refcount` references (a migration destination taking over
    /// the source's nodes); gives `n` back when `id` or its key is taken already.
    pub fn restore(&self, id: u64, n: NewInode, refcount: u64) -> Result<Node, NotAdded> {
        let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        if id == ROOT_ID || maps.has_id(id) || maps.get_key(&n.key).is_some() || self.is_dead(id) {
            return Err(NotAdded::Known(n));
        }
        let data = new_node(id, n)?;
        data.refcount.store(refcount.max(1), Ordering::Relaxed);
        maps.add(data.clone());
        self.give_back.held(maps.len());
        self.trim(
            &mut self.dead.lock().unwrap_or_else(PoisonError::into_inner),
            maps.len(),
        );
        drop(maps);
        self.reserve_ids(id.saturating_add(1));
        Ok(data)
    }

    /// Adds node `id` as a node that reaches no file (one a migration destination could not
    /// find again): it answers `ESTALE` until the guest forgets it, as a buried node does, and
    /// costs what a buried id costs (ids lost in a row share one range). `false` when `id` is
    /// taken.
    pub fn restore_lost(&self, id: u64) -> bool {
        let maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        let mut dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        if id == ROOT_ID || id == 0 || maps.has_id(id) || Self::in_ranges(&dead, id) {
            return false;
        }
        Self::add_dead(&mut dead, id);
        self.trim(&mut dead, maps.len());
        drop(dead);
        drop(maps);
        self.reserve_ids(id.saturating_add(1));
        true
    }

    /// The ranges of ids that answer `ESTALE` (buried or lost), `start → end` exclusive, in
    /// order (for a migration's save).
    pub fn dead_ranges_list(&self) -> Vec<(u64, u64)> {
        let dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        dead.iter().map(|(s, e)| (*s, *e)).collect()
    }

    /// Makes the ids `start..end` answer `ESTALE` until the guest forgets each (a migration
    /// destination taking over the source's buried ids); `false` when the range is empty or
    /// meets ids taken already.
    pub fn restore_dead_range(&self, start: u64, end: u64) -> bool {
        let maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
        let mut dead = self.dead.lock().unwrap_or_else(PoisonError::into_inner);
        let overlaps = dead
            .range(..end)
            .next_back()
            .is_some_and(|(_, e)| *e > start);
        if start <= ROOT_ID || start >= end || overlaps || maps.has_id(start) {
            return false;
        }
        dead.insert(start, end);
        self.trim(&mut dead, maps.len());
        drop(dead);
        drop(maps);
        self.reserve_ids(end);
        true
    }

    /// Drops every inode but the root (the guest unmounted).
    pub fn clear(&self) {
        let old = {
            let mut maps = self.maps.write().unwrap_or_else(PoisonError::into_inner);
            let root = maps.remove(ROOT_ID);
            let old = std::mem::take(&mut *maps);
            if let Some(root) = root {
                root.refcount.store(1, Ordering::Relaxed);
                maps.add(root);
            }
            old
        };
        self.dead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        drop(old);
        give_back_free_memory();
    }

    /// How many inodes the table holds.
    pub fn len(&self) -> usize {
        self.maps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}
