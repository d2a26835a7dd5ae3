//! The load side of a migration (see the parent module): each node found again as it is read,
//! then the handles, every field of the state checked and bounded.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};

use super::{
    io_error, refused, SavedLocation, SavedNode, SavedPath, KEPT_FLAGS, LISTING_NONE,
    LISTING_SNAPSHOT, LISTING_STREAM, LOCK_FLOCK, LOCK_RECORD, LOC_CHILD, LOC_HANDLE, LOC_LOST,
    LOC_PATH, LOGGED_LOSSES, MAX_DEPTH, MAX_ID, MIN_CARRIED, MIN_NODE, NAME_MAX, SECTION_LOCKS,
};
use crate::filesystem::LockKind;
use crate::fuse::abi::ROOT_ID;
use crate::migration::{Decoder, Mode, OnError, StateError};
use crate::passthrough::dir::{DirSnapshot, Listing};
use crate::passthrough::file_handle::{self, FileHandle};
use crate::passthrough::handle::HandleData;
use crate::passthrough::identity::At;
use crate::passthrough::locks::{Carried, OnLost, Seg, HANDOVER_TIMEOUT, MAX_RANGES, TO_EOF};
use crate::passthrough::node::inode::{InodeData, Node, NotAdded, Origin, Source};
use crate::passthrough::node::key::InodeKey;
use crate::passthrough::sys::{self, error};
use crate::passthrough::{open_path_flags, PassthroughFs};

impl PassthroughFs {
    /// Takes over the nodes and handles of a state (see the module documentation). A state
    /// refused halfway leaves nothing of it behind.
    pub(in crate::passthrough) fn load_migration_state(
        &self,
        input: &mut Decoder<'_>,
    ) -> Result<(), StateError> {
        if self.inodes.all().len() != 1 || !self.handles.all().is_empty() {
            return Err(StateError::Refused(
                "this daemon holds nodes or handles already: a migration destination must be \
                 fresh"
                    .into(),
            ));
        }
        let loaded = self.load_nodes_and_handles(input);
        if loaded.is_err() {
            // The locks taken and the hand-overs pending first: none is taken after the load
            // failed (the guest goes on at the source), whoever else cleans up after.
            self.locks.clear();
            self.handles.clear();
            self.inodes.clear();
        }
        loaded
    }

    fn load_nodes_and_handles<'a>(&self, input: &mut Decoder<'a>) -> Result<(), StateError> {
        let opts = self.cfg.migration;
        let next_node = input.u64("next node id")?;
        let next_handle = input.u64("next handle")?;
        if next_node >= MAX_ID || next_handle >= MAX_ID {
            return Err(StateError::invalid(
                "next ids",
                "beyond any id a daemon gives",
            ));
        }
        let n = input.count("nodes", MIN_NODE)?;
        // The root is one of the nodes the limit counts and one of the state's.
        if n > self.cfg.max_nodes {
            return Err(StateError::Refused(format!(
                "the state holds {n} nodes, more than this daemon holds (--max-nodes={})",
                self.cfg.max_nodes
            )));
        }
        // Each node is restored as it is read (the source sends parents first), so what the
        // state costs beyond its own bytes is the nodes themselves: no node, path or name is
        // copied out of it first. The directories restored, by path, to find a child's parent.
        let mut dirs: HashMap<SavedPath<'a>, Node> = HashMap::new();
        // The last directory restored and its descriptor: the parent of the next node, in a
        // chain sent a name a level (its nodes keep no descriptor, as those found by path).
        let mut last_dir: Option<(u64, OwnedFd)> = None;
        let root_path = self
            .root_path()
            .map_err(|e| io_error("the shared directory's path", e))?;
        let mut lost = 0usize;
        // `open_by_handle_at` takes a real (not `O_PATH`) descriptor of the mount.
        let mount_fd = match opts.mode {
            Mode::FileHandles => {
                let root = self.inode(ROOT_ID).map_err(|e| io_error("root", e))?;
                let fd = root
                    .opened_fd()
                    .ok_or_else(|| io_error("root", error(libc::EBADF)))?;
                Some(file_handle::open_dir(fd).map_err(|e| io_error("open the root", e))?)
            }
            Mode::FindPaths => None,
        };
        for _ in 0..n {
            let node = read_node(input)?;
            if node.id == ROOT_ID {
                continue;
            }
            if node.id == 0 || node.id >= next_node {
                return Err(StateError::invalid(
                    "node id",
                    format!("{} (ids are 1 to {})", node.id, next_node.saturating_sub(1)),
                ));
            }
            match self.restore_node(&node, &dirs, &mut last_dir, mount_fd.as_ref(), &root_path) {
                Ok(data) => {
                    if let (SavedLocation::Path(p), true) = (&node.location, data.is_dir()) {
                        dirs.insert(*p, data);
                    }
                }
                Err(e) => {
                    let what = match &node.location {
                        SavedLocation::Path(p) => p.show(),
                        SavedLocation::Handle(_) => "(file handle)".into(),
                        SavedLocation::Lost(_) => "(lost on the source)".into(),
                        SavedLocation::Child { parent, name } => {
                            format!("{} in node {parent}", crate::logging::escaped(name))
                        }
                    };
                    if opts.on_error == OnError::Abort
                        || crate::passthrough::is_resource_shortage(&e)
                    {
                        return Err(io_error(
                            format!(
                                "node {} at {what} cannot be found again (the migration is \
                                 refused: --migration-on-error=abort)",
                                node.id
                            ),
                            e,
                        ));
                    }
                    if lost < LOGGED_LOSSES {
                        log::warn!(
                            "migration: node {} at {what} is lost ({e}); the guest gets ESTALE \
                             on it",
                            node.id
                        );
                    }
                    if !self.inodes.restore_lost(node.id) {
                        return Err(StateError::invalid("node id", format!("{} twice", node.id)));
                    }
                    lost += 1;
                }
            }
        }
        drop(dirs);
        self.inodes.reserve_ids(next_node);
        let n = input.count("handles", 8 + 8 + 4 + 1 + 1)?;
        let mut dropped = 0usize;
        for _ in 0..n {
            let h = input.u64("handle")?;
            if h == 0 || h >= next_handle {
                return Err(StateError::invalid("handle", format!("{h}")));
            }
            let inode = input.u64("handle's node")?;
            let flags = input.i32("handle's flags")?;
            let listing = match input.u8("handle's listing")? {
                LISTING_NONE => None,
                LISTING_STREAM => Some(Listing::Stream),
                LISTING_SNAPSHOT => Some(Listing::Snapshot(Arc::new(self.read_snapshot(input)?))),
                v => return Err(StateError::invalid("handle's listing", v)),
            };
            let is_dir = input.bool("handle is a directory")?;
            match self.restore_handle(h, inode, flags, is_dir, listing) {
                Ok(()) => {}
                Err(e)
                    if opts.on_error == OnError::Abort
                        || crate::passthrough::is_resource_shortage(&e) =>
                {
                    return Err(io_error(
                        format!("handle {h} of node {inode} cannot be opened again"),
                        e,
                    ));
                }
                Err(e) => {
                    if dropped < LOGGED_LOSSES {
                        log::warn!(
                            "migration: handle {h} of node {inode} is lost ({e}); the guest gets \
                             EBADF on it"
                        );
                    }
                    dropped += 1;
                }
            }
        }
        self.handles.reserve_ids(next_handle);
        // Ranges of ids that answer ESTALE, when the source had any.
        if !input.rest().is_empty() {
            // They count against --max-nodes with the nodes, as on the source: a source with the
            // same limit sends no more than fit; past it (a source with a higher limit) the
            // oldest are dropped as they are read, and their ids answer EBADF.
            let n = input.count("stale id ranges", 16)?;
            for _ in 0..n {
                let start = input.u64("stale ids")?;
                let end = input.u64("stale ids")?;
                if end > next_node || !self.inodes.restore_dead_range(start, end) {
                    return Err(StateError::invalid(
                        "stale ids",
                        format!("{start}..{end} (ids taken, or beyond the next id {next_node})"),
                    ));
                }
            }
        }
        // The guest's locks, when it held some (doc/locks.md, Migration).
        if !input.rest().is_empty() {
            match input.u8("section")? {
                SECTION_LOCKS => {
                    let mut locks = input.section("locks")?;
                    self.load_locks(&mut locks)?;
                    locks.finish()?;
                }
                v => return Err(StateError::invalid("section", v)),
            }
        }
        if lost > LOGGED_LOSSES || dropped > LOGGED_LOSSES {
            log::warn!("migration: {lost} nodes and {dropped} handles lost in all");
        }
        log::info!(
            "migration: loaded {} nodes ({lost} lost) and {} handles ({dropped} lost)",
            self.inodes.len(),
            n - dropped
        );
        Ok(())
    }

    /// Takes again the locks the guest held at the source (doc/locks.md, Migration): each
    /// record's description opened as the lock code opens it, counted in the lock bounds, its
    /// locks taken at once when free and otherwise handed over by the waiter thread. A record
    /// that cannot be opened or locked here follows `--migration-on-error`.
    fn load_locks(&self, input: &mut Decoder<'_>) -> Result<(), StateError> {
        let opts = self.cfg.migration;
        let n = input.count("locks", MIN_CARRIED)?;
        let (mut pending, mut lost) = (0usize, 0usize);
        // The nodes the restored handles may write, listed at the first record that needs it.
        let mut writers: Option<HashSet<u64>> = None;
        // Each node's restored handles, listed at the first POSIX record.
        let mut by_node: Option<HashMap<u64, Arc<[Weak<HandleData>]>>> = None;
        for _ in 0..n {
            let c = read_carried(input)?;
            let kind_on = match c.kind {
                LockKind::Posix => self.posix_locks_on.load(Ordering::Relaxed),
                LockKind::Flock => self.flock_on.load(Ordering::Relaxed),
            };
            if !kind_on {
                return Err(StateError::invalid(
                    "lock's kind",
                    format!("{:?} locks the session did not agree on", c.kind),
                ));
            }
            let node = match self.inode(c.node) {
                Ok(node) => node,
                // A node the state sent as lost (guest-error): ESTALE answers the guest on it.
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {
                    lost += 1;
                    continue;
                }
                Err(_) => return Err(StateError::invalid("lock's node", c.node)),
            };
            let what = match node.origin() {
                Some((_, name)) => format!(
                    "node {} ({})",
                    c.node,
                    crate::logging::escaped(name.to_bytes())
                ),
                None => format!("node {}", c.node),
            };
            drop(node);
            // The handle the record was made through, if the state kept it: it gets EBADF when
            // the lock is lost.
            let handle = match c.fh {
                0 => Weak::new(),
                fh => self
                    .handles
                    .get(fh, c.node)
                    .map(|h| Arc::downgrade(&h))
                    .unwrap_or_default(),
            };
            // The handles that get EBADF when the lock is lost: an OFD or flock record's own
            // open file; for a POSIX owner (a process, whose open files of the node this daemon
            // cannot tell from other processes'), every handle of the node, so that the
            // process is told whichever of its files it uses.
            let told: Arc<[Weak<HandleData>]> = match c.kind {
                LockKind::Flock => Arc::from(vec![handle]),
                LockKind::Posix => by_node
                    .get_or_insert_with(|| {
                        let mut m: HashMap<u64, Vec<Weak<HandleData>>> = HashMap::new();
                        for (_, h) in self.handles.all() {
                            m.entry(h.inode).or_default().push(Arc::downgrade(&h));
                        }
                        m.into_iter().map(|(n, v)| (n, Arc::from(v))).collect()
                    })
                    .get(&c.node)
                    .cloned()
                    .unwrap_or_else(|| Arc::from(Vec::new())),
            };
            let lost_handles = told.clone();
            let on_lost: OnLost = Box::new(move || mark_lost(&lost_handles));
            // The state's word that the description may write is taken only as far as the
            // guest's handles say so: the record's own (an OFD or flock record's open file;
            // none, 0, may), or another of the node's (a POSIX owner moved to a read-write
            // description by a later write lock through another open file, which it has not
            // closed: its close would have dropped the record).
            let writable = c.writable
                && (self.handle_writable(c.node, c.fh).unwrap_or(false)
                    || writers
                        .get_or_insert_with(|| {
                            self.handles
                                .all()
                                .into_iter()
                                .filter(|(_, h)| {
                                    h.dir.is_none()
                                        && sys::fd_access_mode(h.fd())
                                            .is_ok_and(|m| m != libc::O_RDONLY)
                                })
                                .map(|(_, h)| h.inode)
                                .collect()
                        })
                        .contains(&c.node));
            let taken = self.locks.adopt(
                &c,
                || self.lock_fd_as(c.node, writable),
                what.clone(),
                on_lost,
            );
            match taken {
                Ok(p) => pending += usize::from(p),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Err(StateError::invalid(
                        "lock",
                        format!("owner {:#x} on node {} twice", c.owner, c.node),
                    ));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return Err(StateError::invalid(
                        "lock",
                        format!(
                            "owner {:#x} on node {}: conflicts with another owner's",
                            c.owner, c.node
                        ),
                    ));
                }
                Err(e)
                    if opts.on_error == OnError::Abort
                        || crate::passthrough::is_resource_shortage(&e)
                        || e.raw_os_error() == Some(libc::ENOLCK) =>
                {
                    return Err(io_error(
                        format!(
                            "the lock the guest holds on {what} (owner {:#x}) cannot be taken \
                             again here (the migration is refused{})",
                            c.owner,
                            match opts.on_error {
                                OnError::Abort => ": --migration-on-error=abort",
                                OnError::GuestError => "",
                            }
                        ),
                        e,
                    ));
                }
                Err(e) => {
                    if lost < LOGGED_LOSSES {
                        log::warn!(
                            "migration: the lock the guest holds on {what} (owner {:#x}) is lost \
                             ({e}); the handles it may have been taken through get EBADF",
                            c.owner
                        );
                    }
                    mark_lost(&told);
                    lost += 1;
                }
            }
        }
        log::info!(
            "migration: took again the locks of {} owner(s) ({pending} still held elsewhere, \
             handed over within {} s; {lost} lost)",
            n - lost,
            HANDOVER_TIMEOUT.as_secs()
        );
        Ok(())
    }

    /// A listing of a state, charged to the listing budget as the directory's own would be.
    fn read_snapshot(&self, input: &mut Decoder<'_>) -> Result<DirSnapshot, StateError> {
        let n = input.count("listing", 8 + 1 + 4 + 1)?;
        let records = || {
            let ino = input.u64("listing: inode")?;
            let dtype = input.u8("listing: type")?;
            let name = input.bytes("listing: name")?;
            if name.is_empty() || name.len() > NAME_MAX || name.contains(&b'/') || name.contains(&0)
            {
                return Err(StateError::invalid("listing: name", "not a file name"));
            }
            Ok((ino, dtype, name))
        };
        DirSnapshot::collect(n, records, &mut |c, n| self.dircache.reserve(c, n))?.map_err(|why| {
            StateError::Refused(format!(
                "a listing of {n} entries does not fit the listing budget here ({why:?}; {} of \
                 {} bytes held)",
                self.dircache.used(),
                self.dircache.cap()
            ))
        })
    }

    /// Finds a saved node again and adds it under its node id.
    fn restore_node(
        &self,
        node: &SavedNode<'_>,
        dirs: &HashMap<SavedPath<'_>, Node>,
        last_dir: &mut Option<(u64, OwnedFd)>,
        mount_fd: Option<&OwnedFd>,
        root_path: &[u8],
    ) -> io::Result<Node> {
        let root = self.inode(ROOT_ID)?;
        let (fd, parent) = match &node.location {
            SavedLocation::Child { parent, name } => {
                // A node of this state restored before it (or the root), and a directory: the
                // name is opened in it (`O_PATH | O_NOFOLLOW`, a plain name: never `..`).
                let dir = self.inodes.get(*parent).ok_or_else(|| {
                    refused(
                        libc::ENOENT,
                        format!("its parent, node {parent}, is not here"),
                    )
                })?;
                if !dir.is_dir() {
                    return Err(error(libc::ENOTDIR));
                }
                let name = CString::new(*name).map_err(|_| error(libc::EINVAL))?;
                let fd = match last_dir {
                    Some((id, fd)) if id == parent => {
                        sys::openat(fd.as_fd(), &name, open_path_flags(), 0)?
                    }
                    _ => sys::openat(self.path_fd(&dir)?.as_fd(), &name, open_path_flags(), 0)?,
                };
                (fd, Some((dir, name)))
            }
            SavedLocation::Lost(e) => return Err(io::Error::from_raw_os_error(*e)),
            SavedLocation::Path(path) => {
                let fd = self.open_beneath(path.names())?;
                let parent = match path.split_last() {
                    Some((dir, name)) => {
                        let name = CString::new(name).map_err(|_| error(libc::EINVAL))?;
                        match dir.0.is_empty() {
                            true => Some((root.clone(), name)),
                            false => dirs.get(&dir).map(|p| (p.clone(), name)),
                        }
                    }
                    None => None,
                };
                (fd, parent)
            }
            SavedLocation::Handle(h) => {
                let mount_fd = mount_fd.ok_or_else(|| error(libc::EBADF))?;
                let fd = h.open(mount_fd.as_fd(), open_path_flags())?;
                // A handle names any file of the file system, inside the shared directory or not.
                // One with a name is taken when that name, opened from the root one component
                // at a time, is the same file; one without (deleted while open) only when the
                // shared directory is its whole file system.
                match self.fd_path(fd.as_fd(), root_path) {
                    Ok(names) => {
                        let st = sys::stat_fd(fd.as_fd())?;
                        let there = self
                            .open_beneath(names.iter().map(|n| n.to_bytes()))
                            .and_then(|f| sys::stat_fd(f.as_fd()));
                        if !there.is_ok_and(|t| t.st_dev == st.st_dev && t.st_ino == st.st_ino) {
                            return Err(refused(
                                libc::EXDEV,
                                "its file handle names a file outside the shared directory",
                            ));
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        if !self.share_is_whole_mount(&root, root_path)? {
                            return Err(refused(
                                libc::ENOENT,
                                "it was deleted while open: kept only when the shared directory \
                                 is the root of its file system",
                            ));
                        }
                    }
                    Err(e) => return Err(e),
                }
                (fd, None)
            }
        };
        let (st, x) = sys::stat_fd_mnt(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != node.kind {
            return Err(refused(
                libc::ESTALE,
                format!(
                    "it was of type {:o} and is of type {:o} here",
                    node.kind,
                    st.st_mode & libc::S_IFMT
                ),
            ));
        }
        if let Some(want) = &node.fid {
            let here = FileHandle::fid_of_fd(fd.as_fd())?;
            if here.parts() != want.parts() {
                return Err(refused(
                    libc::ESTALE,
                    "it opens another file here than on the source (--migration-verify-handles)",
                ));
            }
        }
        let identity = self
            .nodes()
            .identity_of(&root, &st, &x, At::Fd(fd.as_fd()))?;
        let key = InodeKey::new(&st, &x, identity)?;
        let source = match parent {
            Some((parent, name)) => Source::Found(Origin::new(parent, &name)),
            None => Source::Fd(sys::dup(fd.as_fd())?),
        };
        let n = self
            .nodes()
            .new_inode(key, identity, At::Fd(fd.as_fd()), source)?;
        let data = self
            .inodes
            .restore(node.id, n, node.refcount)
            .map_err(|e| match e {
                NotAdded::Known(_) => refused(
                    libc::ESTALE,
                    "it is a file another node of the state is already",
                ),
                NotAdded::NoRoom => refused(libc::ENFILE, "no room for another node"),
            })?;
        if data.is_dir() {
            *last_dir = Some((node.id, fd));
        }
        Ok(data)
    }

    /// Whether the shared directory is the root of its file system and its mount's root (then
    /// every file a handle on that mount reaches is inside it).
    fn share_is_whole_mount(&self, root: &InodeData, here: &[u8]) -> io::Result<bool> {
        // Through the `/proc/self/fd` kept from before the sandbox: by its absolute path the
        // name would be looked up inside the shared directory once that is the root, in files
        // the guest writes.
        let info = sys::read_all(self.proc_self_fd.as_fd(), c"../mountinfo")?;
        for line in info.split(|b| *b == b'\n') {
            let f: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
            if f.len() < 5 || f[0] != root.key.mnt_id().to_string().as_bytes() {
                continue;
            }
            return Ok(f[3] == b"/" && crate::mountinfo::unescape(f[4]) == here);
        }
        Ok(false)
    }

    /// Opens a saved handle again and adds it under its number.
    fn restore_handle(
        &self,
        h: u64,
        inode: u64,
        flags: i32,
        is_dir: bool,
        listing: Option<Listing>,
    ) -> io::Result<()> {
        let node = self.inode(inode).map_err(|_| error(libc::EBADF))?;
        if node.is_stale() {
            return Err(error(libc::ESTALE));
        }
        let data = if is_dir {
            if !node.is_dir() {
                return Err(error(libc::ENOTDIR));
            }
            let file =
                self.open_node(&node, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
            let data = HandleData::dir(inode, file);
            if let (Some(l), Some(slot)) = (listing, data.dir.as_ref()) {
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(l);
            }
            data
        } else {
            if node.key.kind() != libc::S_IFREG {
                return Err(error(libc::EBADF));
            }
            match flags & libc::O_ACCMODE {
                libc::O_RDONLY => {}
                libc::O_WRONLY | libc::O_RDWR if !self.cfg.readonly => {}
                libc::O_WRONLY | libc::O_RDWR => return Err(error(libc::EROFS)),
                _ => return Err(error(libc::EINVAL)),
            }
            let file = self.open_node(&node, (flags & KEPT_FLAGS) | libc::O_CLOEXEC)?;
            HandleData::file(inode, file)
        };
        let data = self.handles.restore(h, data).ok_or_else(|| {
            log::warn!("migration: handle {h} twice in the state");
            error(libc::EBADF)
        })?;
        node.handles.fetch_add(1, Ordering::Relaxed);
        node.set_last_open(&data);
        Ok(())
    }
}

/// Makes `handles` answer EBADF (a lock taken through them was lost).
fn mark_lost(handles: &[Weak<HandleData>]) {
    for h in handles.iter().filter_map(Weak::upgrade) {
        h.lost.store(true, Ordering::Relaxed);
    }
}

fn read_handle(input: &mut Decoder<'_>, what: &'static str) -> Result<FileHandle, StateError> {
    let t = input.i32(what)?;
    let b = input.bytes(what)?;
    FileHandle::from_parts(0, t, b)
        .ok_or_else(|| StateError::invalid(what, "longer than any handle"))
}

fn read_node<'a>(input: &mut Decoder<'a>) -> Result<SavedNode<'a>, StateError> {
    let id = input.u64("node id")?;
    // A guest holds fewer references than it can make requests.
    let refcount = input.u64("node's references")?.min(MAX_ID);
    let kind = input.u32("node's type")?;
    if kind & !libc::S_IFMT != 0 || kind == 0 {
        return Err(StateError::invalid("node's type", format!("{kind:o}")));
    }
    let location = match input.u8("node's location")? {
        LOC_LOST => SavedLocation::Lost(input.i32("node's error")?),
        LOC_PATH => {
            let n = input.count("path", 5)?;
            if n > MAX_DEPTH {
                return Err(StateError::invalid("path", "too deep"));
            }
            let start = input.rest();
            for _ in 0..n {
                input.plain_name("path name")?;
            }
            if n == 0 && id != ROOT_ID {
                return Err(StateError::invalid(
                    "path",
                    format!("node {id} at the root"),
                ));
            }
            SavedLocation::Path(SavedPath(input.consumed_since(start)))
        }
        LOC_HANDLE => SavedLocation::Handle(read_handle(input, "node's file handle")?),
        LOC_CHILD => SavedLocation::Child {
            parent: input.u64("node's parent")?,
            name: input.plain_name("node's name")?,
        },
        v => return Err(StateError::invalid("node's location", v)),
    };
    let fid = match input.bool("node has an identifying handle")? {
        true => Some(read_handle(input, "node's identifying handle")?),
        false => None,
    };
    Ok(SavedNode {
        id,
        refcount,
        kind,
        location,
        fid,
    })
}

/// A carried record of the locks section, checked: a known kind, ranges sorted and apart with
/// known types, within the ranges' bound.
fn read_carried(input: &mut Decoder<'_>) -> Result<Carried, StateError> {
    let node = input.u64("lock's node")?;
    let owner = input.u64("lock's owner")?;
    let fh = input.u64("lock's handle")?;
    let pid = input.u32("lock's pid")?;
    let writable = input.bool("lock's description writable")?;
    let typ_of = |t: i32, what: &'static str| match t {
        libc::F_RDLCK | libc::F_WRLCK => Ok(t),
        _ => Err(StateError::invalid(what, t)),
    };
    let (kind, segs, flock) = match input.u8("lock's kind")? {
        LOCK_RECORD => {
            let n = input.count("lock's ranges", 8 + 8 + 4)?;
            if n == 0 || n > MAX_RANGES {
                return Err(StateError::invalid(
                    "lock's ranges",
                    format!("{n} (1 to {MAX_RANGES})"),
                ));
            }
            let mut segs: Vec<Seg> = Vec::with_capacity(n);
            for _ in 0..n {
                let start = input.u64("lock's range")?;
                let end = input.u64("lock's range")?;
                let typ = typ_of(input.i32("lock's type")?, "lock's type")?;
                // After the last, and not touching it with the same type (an owner's ranges
                // are merged so: a record stays as the lock code keeps one).
                let after_last = segs.last().is_none_or(|l| {
                    start > l.end && !(l.typ == typ && l.end.checked_add(1) == Some(start))
                });
                if start > end || end > TO_EOF || !after_last {
                    return Err(StateError::invalid(
                        "lock's range",
                        format!("{start}..={end} (not sorted, apart, merged, within the file)"),
                    ));
                }
                segs.push(Seg { start, end, typ });
            }
            (LockKind::Posix, segs, None)
        }
        LOCK_FLOCK => {
            let typ = typ_of(input.i32("flock's type")?, "flock's type")?;
            (LockKind::Flock, Vec::new(), Some(typ))
        }
        v => return Err(StateError::invalid("lock's kind", v)),
    };
    Ok(Carried {
        node,
        owner,
        kind,
        fh,
        pid,
        writable,
        segs,
        flock,
    })
}
