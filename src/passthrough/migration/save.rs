//! The save side of a migration (see the parent module): where the destination will find each
//! node, and the nodes and handles written in an order it can restore them in.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use super::{
    io_error, Location, KEPT_FLAGS, LISTING_NONE, LISTING_SNAPSHOT, LISTING_STREAM, LOCK_FLOCK,
    LOCK_RECORD, LOC_CHILD, LOC_HANDLE, LOC_LOST, LOC_PATH, LOGGED_LOSSES, MAX_DEPTH,
    SECTION_LOCKS,
};
use crate::filesystem::LockKind;
use crate::fuse::abi::ROOT_ID;
use crate::migration::{Encoder, Mode, OnError, StateError};
use crate::passthrough::dir::{DirSnapshot, Listing};
use crate::passthrough::file_handle::FileHandle;
use crate::passthrough::identity::At;
use crate::passthrough::locks::Carried;
use crate::passthrough::node::inode::{InodeData, Node};
use crate::passthrough::sys::{self, error};
use crate::passthrough::{open_path_flags, PassthroughFs};

impl PassthroughFs {
    /// Writes the nodes and handles (see the module documentation).
    pub(in crate::passthrough) fn save_migration_state(
        &self,
        out: &mut Encoder,
    ) -> Result<(), StateError> {
        let opts = self.cfg.migration;
        let nodes = self.inodes.all();
        // Where the root is, as `/proc/self/fd` shows paths: read once for every node.
        let root = self
            .root_path()
            .map_err(|e| io_error("the shared directory's path", e))?;
        // A handle a migration lost a lock of (`HandleData::lost`) is not sent: the next
        // destination answers EBADF on it, as this daemon does, rather than serve it healthy
        // without its lock.
        let (handles, lost_handles): (Vec<_>, Vec<_>) = self
            .handles
            .all()
            .into_iter()
            .partition(|(_, d)| !d.lost.load(Ordering::Relaxed));
        out.u64(self.inodes.next_id());
        out.u64(self.handles.next_id());
        out.u32(nodes.len() as u32);
        let mut located: Vec<(&Node, Location)> = nodes
            .iter()
            .map(|node| (node, self.locate(node, &root)))
            .collect();
        if opts.mode == Mode::FindPaths {
            self.locate_deep(&mut located);
        }
        // Parents before their children: the destination restores each node as it reads it.
        let located = parents_first(located);
        let mut lost = 0usize;
        for (node, location) in located {
            if let Location::Lost(e) = location {
                let err = io::Error::from_raw_os_error(e);
                // Out of descriptors or memory says nothing about the file: never a lost node.
                if opts.on_error == OnError::Abort || crate::passthrough::is_resource_shortage(&err)
                {
                    return Err(io_error(
                        format!(
                            "node {} cannot be found again on the destination (the migration \
                             is refused: --migration-on-error=abort)",
                            node.id
                        ),
                        err,
                    ));
                }
                if lost < LOGGED_LOSSES {
                    log::warn!(
                        "migration: node {} is sent as lost ({err}); the guest will get ESTALE \
                         on it",
                        node.id
                    );
                }
                lost += 1;
            }
            out.u64(node.id);
            out.u64(node.refcount());
            out.u32(node.key.kind());
            match &location {
                Location::Lost(e) => {
                    out.u8(LOC_LOST);
                    out.i32(*e);
                }
                Location::Path(names) => {
                    out.u8(LOC_PATH);
                    out.u32(names.len() as u32);
                    for n in names {
                        out.bytes(n.as_bytes());
                    }
                }
                Location::Handle(h) => {
                    out.u8(LOC_HANDLE);
                    let (t, b) = h.parts();
                    out.i32(t);
                    out.bytes(b);
                }
                Location::Child(parent, name) => {
                    out.u8(LOC_CHILD);
                    out.u64(*parent);
                    out.bytes(name.as_bytes());
                }
            }
            let fid = match (&location, opts.verify_handles) {
                (Location::Path(_) | Location::Child(..), true) => self
                    .path_fd(node)
                    .and_then(|fd| FileHandle::fid_of_fd(fd.as_fd()))
                    .ok(),
                _ => None,
            };
            match fid {
                Some(h) => {
                    out.bool(true);
                    let (t, b) = h.parts();
                    out.i32(t);
                    out.bytes(b);
                }
                None => out.bool(false),
            }
        }
        out.u32(handles.len() as u32);
        for (h, data) in &handles {
            out.u64(*h);
            out.u64(data.inode);
            out.i32(sys::fd_status_flags(data.fd()).unwrap_or(libc::O_RDONLY) & KEPT_FLAGS);
            let listing = data
                .dir
                .as_ref()
                .map(|d| d.lock().unwrap_or_else(PoisonError::into_inner).clone());
            match listing {
                None => out.u8(LISTING_NONE),
                Some(None) => out.u8(LISTING_NONE),
                Some(Some(Listing::Stream)) => out.u8(LISTING_STREAM),
                Some(Some(Listing::Snapshot(snap))) => {
                    out.u8(LISTING_SNAPSHOT);
                    out.u32(snap.len() as u32);
                    for e in snap.records() {
                        out.u64(e.ino);
                        out.u8(e.dtype);
                        out.bytes(e.name);
                    }
                }
            }
            out.bool(data.dir.is_some());
        }
        // Ids of files gone from the host that the guest has not forgotten: they go on
        // answering ESTALE. Only when there are some, so that a destination of a release that
        // knew no such ids takes the others' states.
        let dead = self.inodes.dead_ranges_list();
        // The locks the guest holds (doc/locks.md, Migration), in a section of their own after
        // the stale ids (then sent even when there are none), only when there are some: a
        // state without locks is the one a destination of an older release takes, and one with
        // locks is refused there (bytes after its last field) rather than loaded without them.
        // Nor the locks of records made through such a handle (a POSIX lock lost makes every
        // handle of its file lost, other owners' too): their open file answers EBADF already.
        let mut carried = self.locks.carried();
        if !lost_handles.is_empty() {
            let lost: HashSet<u64> = lost_handles.iter().map(|(h, _)| *h).collect();
            carried.retain(|c| !lost.contains(&c.fh));
        }
        if !dead.is_empty() || !carried.is_empty() {
            out.u32(dead.len() as u32);
            for (start, end) in dead {
                out.u64(start);
                out.u64(end);
            }
        }
        if !carried.is_empty() {
            out.u8(SECTION_LOCKS);
            let at = out.begin();
            write_locks(out, &carried);
            out.end(at);
            log::info!(
                "migration: saved the locks of {} owner(s) on {} node(s)",
                carried.len(),
                {
                    let mut nodes: Vec<u64> = carried.iter().map(|c| c.node).collect();
                    nodes.dedup();
                    nodes.len()
                }
            );
        }
        if lost > LOGGED_LOSSES {
            log::warn!("migration: {lost} nodes sent as lost in all");
        }
        log::info!(
            "migration: saved {} nodes ({lost} lost) and {} handles ({})",
            nodes.len(),
            handles.len(),
            match opts.mode {
                Mode::FindPaths => "paths",
                Mode::FileHandles => "file handles",
            }
        );
        Ok(())
    }

    /// Where the destination will find `node`.
    fn locate(&self, node: &Node, root: &[u8]) -> Location {
        let opts = self.cfg.migration;
        if node.id == ROOT_ID {
            return Location::Path(Vec::new());
        }
        if node.is_stale() {
            return Location::Lost(libc::ESTALE);
        }
        match opts.mode {
            Mode::FileHandles => {
                match self
                    .path_fd(node)
                    .and_then(|fd| FileHandle::of_fd(fd.as_fd()))
                {
                    Ok(h) => Location::Handle(h),
                    Err(e) => Location::Lost(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            }
            Mode::FindPaths => {
                if self.unlinked_while_open(node) {
                    return Location::Lost(libc::ENOENT);
                }
                let found = self.path_of(node, root).and_then(|names| {
                    if opts.confirm_paths && !self.leads_to(&names, node)? {
                        // The names the guest found it by changed: where its descriptor is.
                        let names = self.fd_path(self.path_fd(node)?.as_fd(), root)?;
                        if !self.leads_to(&names, node)? {
                            return Err(error(libc::ENOENT));
                        }
                        return Ok(names);
                    }
                    Ok(names)
                });
                match found {
                    Ok(names) => Location::Path(names),
                    Err(e) => Location::Lost(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            }
        }
    }

    /// Finds a place for the nodes whose path is too long to send ([`Location::Child`]): a node
    /// found by name in a directory the guest holds is that name in it; a directory that keeps
    /// a descriptor is the name its parent (`..`, a node the guest holds) lists it under, each
    /// parent listed once for all its children of this kind.
    fn locate_deep(&self, located: &mut [(&Node, Location)]) {
        let too_long = |l: &Location| matches!(l, Location::Lost(e) if *e == libc::ENAMETOOLONG || *e == libc::ELOOP);
        // Directories with a descriptor, by the node id of their parent: (index, inode number).
        let mut by_parent: HashMap<u64, (Node, Vec<(usize, u64)>)> = HashMap::new();
        for (i, (node, location)) in located.iter_mut().enumerate() {
            if !too_long(location) || node.is_stale() {
                continue;
            }
            if let Some((parent, name)) = node.origin() {
                let held = self
                    .inodes
                    .get(parent.id)
                    .is_some_and(|p| Node::ptr_eq(&p, &parent));
                if held && self.child_leads_to(&parent, &name, node) {
                    *location = Location::Child(parent.id, name.to_owned());
                }
                continue;
            }
            let Some(fd) = node.opened_fd().filter(|_| node.is_dir()) else {
                continue;
            };
            let parent = sys::openat(fd, c"..", open_path_flags(), 0).and_then(|up| {
                let (st, x) = sys::stat_fd_mnt(up.as_fd())?;
                self.nodes().key_at(node, &st, &x, At::Fd(up.as_fd()))
            });
            let Some(parent) = parent.ok().and_then(|key| self.inodes.find(&key)) else {
                continue;
            };
            if !self
                .inodes
                .get(parent.id)
                .is_some_and(|p| Node::ptr_eq(&p, &parent))
            {
                continue;
            }
            by_parent
                .entry(parent.id)
                .or_insert_with(|| (parent, Vec::new()))
                .1
                .push((i, node.key.ino));
        }
        for (_, (parent, children)) in by_parent {
            let listing = self
                .open_node(
                    &parent,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
                .and_then(|dir| DirSnapshot::read(dir.as_fd(), false, &mut |_, _| Ok(())));
            let Ok(Ok(listing)) = listing else {
                continue;
            };
            let mut wanted: HashMap<u64, Vec<usize>> = HashMap::new();
            for (i, ino) in children {
                wanted.entry(ino).or_default().push(i);
            }
            for r in listing.records() {
                let Some(ids) = wanted.get(&r.ino) else {
                    continue;
                };
                let Ok(name) = CString::new(r.name) else {
                    continue;
                };
                for &i in ids {
                    let (node, location) = &mut located[i];
                    if too_long(location) && self.child_leads_to(&parent, &name, node) {
                        *location = Location::Child(parent.id, name.clone());
                    }
                }
            }
        }
    }

    /// Whether `name` in `parent` is `node` now.
    fn child_leads_to(&self, parent: &InodeData, name: &CStr, node: &InodeData) -> bool {
        self.path_fd(parent)
            .and_then(|pfd| sys::openat(pfd.as_fd(), name, open_path_flags(), 0))
            .and_then(|fd| self.nodes().is_inode(fd.as_fd(), node))
            .unwrap_or(false)
    }

    /// Whether the file the guest last opened `node` with has no name left (deleted while
    /// open: no path reaches it).
    fn unlinked_while_open(&self, node: &InodeData) -> bool {
        node.last_open()
            .is_some_and(|h| sys::stat_fd(h.fd()).is_ok_and(|st| st.st_nlink == 0))
    }

    /// Whether `names` leads to `node` now.
    fn leads_to(&self, names: &[CString], node: &InodeData) -> io::Result<bool> {
        match self.open_beneath(names.iter().map(|n| n.to_bytes())) {
            Ok(fd) => self.nodes().is_inode(fd.as_fd(), node),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The path of `node` from the root: the names it was found by, up its parents; from the
    /// first one that keeps a descriptor instead, where that descriptor is.
    fn path_of(&self, node: &Node, root: &[u8]) -> io::Result<Vec<CString>> {
        let mut names = Vec::new();
        let mut cur = node.clone();
        for _ in 0..MAX_DEPTH {
            if cur.id == ROOT_ID {
                names.reverse();
                return Ok(names);
            }
            if cur.is_stale() {
                return Err(error(libc::ESTALE));
            }
            if let Some((parent, name)) = cur.origin() {
                names.push(name.to_owned());
                cur = parent;
                continue;
            }
            let mut path = self.fd_path(self.path_fd(&cur)?.as_fd(), root)?;
            names.reverse();
            path.extend(names);
            return Ok(path);
        }
        Err(error(libc::ELOOP))
    }
}

/// `located` in an order the destination can restore it in: the nodes located by path (or
/// otherwise) first, the shorter paths first; then each node located in a parent after that
/// parent. A loop of parents (names the host moved around) is sent as lost.
fn parents_first(located: Vec<(&Node, Location)>) -> Vec<(&Node, Location)> {
    let (mut direct, children): (Vec<_>, Vec<_>) = located
        .into_iter()
        .partition(|(_, l)| !matches!(l, Location::Child(..)));
    direct.sort_by_key(|(_, l)| match l {
        Location::Path(p) => p.len(),
        _ => 0,
    });
    let index: HashMap<u64, usize> = children
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.id, i))
        .collect();
    // 0: not placed; 1: on the way up from the node being placed; 2: placed.
    let mut state = vec![0u8; children.len()];
    let mut order = Vec::with_capacity(children.len());
    let mut looped = Vec::new();
    for start in 0..children.len() {
        let mut up = Vec::new();
        let mut i = start;
        let looped_here = loop {
            match state[i] {
                2 => break false,
                1 => break true,
                _ => {}
            }
            state[i] = 1;
            up.push(i);
            match &children[i].1 {
                Location::Child(p, _) => match index.get(p) {
                    Some(&j) => i = j,
                    None => break false,
                },
                _ => break false,
            }
        };
        for &k in &up {
            state[k] = 2;
        }
        if looped_here {
            looped.extend(up);
        } else {
            order.extend(up.into_iter().rev());
        }
    }
    let mut children: Vec<Option<(&Node, Location)>> = children.into_iter().map(Some).collect();
    for k in looped {
        if let Some((n, _)) = children[k].take() {
            direct.push((n, Location::Lost(libc::ELOOP)));
        }
    }
    direct.extend(order.into_iter().filter_map(|k| children[k].take()));
    direct
}

/// The locks section: each owner's record on each node, with what it holds.
fn write_locks(out: &mut Encoder, carried: &[Carried]) {
    out.u32(carried.len() as u32);
    for c in carried {
        out.u64(c.node);
        out.u64(c.owner);
        out.u64(c.fh);
        out.u32(c.pid);
        out.bool(c.writable);
        match (c.kind, c.flock) {
            (LockKind::Flock, Some(typ)) => {
                out.u8(LOCK_FLOCK);
                out.i32(typ);
            }
            _ => {
                out.u8(LOCK_RECORD);
                out.u32(c.segs.len() as u32);
                for seg in &c.segs {
                    out.u64(seg.start);
                    out.u64(seg.end);
                    out.i32(seg.typ);
                }
            }
        }
    }
}
