//! The node tables' tests: ids, keys, lookup counts, buried and lost ids, the memory given
//! back after FORGET, and the size of a node.

use super::inode::*;
use super::key::{Identity, InodeKey};
use super::memory::TRIM_LAST;
use super::slab::Counted;
use crate::fuse::abi::ROOT_ID;
use crate::passthrough::sys;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

fn open_path(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> (OwnedFd, InodeKey) {
    let fd = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
    let (st, x) = sys::stat_fd_mnt(fd.as_fd()).unwrap();
    (fd, InodeKey::new(&st, &x, Identity::Birth).unwrap())
}

fn store_on(dir: &std::path::Path) -> (InodeStore, OwnedFd) {
    let root: OwnedFd = std::fs::File::open(dir).unwrap().into();
    let fd = sys::openat(root.as_fd(), c".", libc::O_PATH, 0).unwrap();
    let (st, x) = sys::stat_fd_mnt(fd.as_fd()).unwrap();
    (InodeStore::new(fd, &st, &x, Identity::Birth).unwrap(), root)
}

fn new_inode(key: InodeKey, fd: OwnedFd) -> NewInode {
    NewInode {
        key,
        identity: Identity::Birth,
        source: Source::Fd(fd),
        handle: None,
        settled: true,
    }
}

/// A store on no host file, for the tests Miri runs too (the tables alone): its root is a
/// pipe's descriptor, its keys are made up.
fn store_without_host() -> InodeStore {
    let (root, _) = nix::unistd::pipe().unwrap();
    let mut st = sys::zeroed_stat();
    st.st_mode = libc::S_IFDIR | 0o755;
    st.st_ino = 1;
    InodeStore::new(root, &st, &no_mount(), Identity::Birth).unwrap()
}

fn no_mount() -> sys::StatExtra {
    sys::StatExtra {
        mnt_id: 1,
        btime: None,
    }
}

/// The key of a regular file `ino` no host has.
fn made_up_key(ino: u64) -> InodeKey {
    let mut st = sys::zeroed_stat();
    st.st_mode = libc::S_IFREG | 0o644;
    st.st_ino = ino;
    InodeKey::new(&st, &no_mount(), Identity::Birth).unwrap()
}

/// The tables on their own (each entry a counted slot; Miri runs this test): a node is found
/// by id and by key while the tables hold it, with a reference for each table; a retired node
/// by id only; a node forgotten, buried or cleared gets every reference back.
#[test]
fn the_tables_hold_a_reference_an_entry_and_give_each_back() {
    let store = store_without_host();
    let n: u64 = if cfg!(miri) { 40 } else { 2_000 };
    let nodes: Vec<Node> = (0..n)
        .map(|i| {
            let parent = store.get(ROOT_ID).unwrap();
            let n = NewInode {
                key: made_up_key(100 + i),
                identity: Identity::Birth,
                source: Source::Found(Origin::new(parent, c"n")),
                handle: None,
                settled: true,
            };
            store.insert(n).ok().unwrap()
        })
        .collect();
    assert_eq!(store.len() as u64, n + 1);
    let pins = |node: &Node| u64::from(node.pins().load(Ordering::Relaxed));
    for node in &nodes {
        // Ours, the id table's and the key table's.
        assert_eq!(pins(node), 3);
        assert!(Node::ptr_eq(&store.get(node.id).unwrap(), node));
        assert!(Node::ptr_eq(&store.find(&node.key).unwrap(), node));
    }
    let root = store.get(ROOT_ID).unwrap();
    assert_eq!(pins(&root), 3 + n, "the tables', ours and one a child");
    // A retired node is in the id table only.
    store.retire(&nodes[0]);
    assert_eq!(pins(&nodes[0]), 2);
    assert!(store.find(&nodes[0].key).is_none());
    assert!(store.get(nodes[0].id).is_some());
    // Forgotten, buried: in neither.
    store.forget(nodes[0].id, 1);
    store.forget(nodes[1].id, 1);
    store.bury(&nodes[2]);
    for node in &nodes[..3] {
        assert_eq!(pins(node), 1, "node {}", node.id);
        assert!(store.get(node.id).is_none() && store.find(&node.key).is_none());
    }
    let all = store.all();
    assert_eq!(all.len() as u64, n - 2);
    assert_eq!(pins(&nodes[3]), 4);
    drop(all);
    assert_eq!(pins(&nodes[3]), 3);
    store.clear();
    assert!(nodes.iter().all(|node| pins(node) == 1));
    assert_eq!(store.len(), 1);
    drop(nodes);
    assert_eq!(pins(&root), 3, "the tables' and ours");
}

#[test]
fn same_host_file_gets_same_id_and_counts_references() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    let (fd1, key) = open_path(root.as_fd(), c"f");
    let (fd2, key2) = open_path(root.as_fd(), c"f");
    assert_eq!(key, key2);
    let a = store.insert(new_inode(key, fd1)).ok().unwrap().id;
    assert_ne!(a, ROOT_ID);
    // A second insert of the same key is handed back: the caller checks the known inode.
    assert!(store.insert(new_inode(key, fd2)).is_err());
    assert_eq!(store.ref_known(&key).unwrap().id, a);
    assert_eq!(store.get(a).unwrap().refcount(), 2);
    store.forget(a, 1);
    assert_eq!(store.get(a).unwrap().refcount(), 1);
    store.forget(a, 1);
    assert!(store.get(a).is_none());
    assert_eq!(store.len(), 1);
}

/// A guest that forgets every other id of a range of buried ids splits it at each FORGET:
/// the ranges count against the limit with the nodes, the oldest dropped first.
#[test]
fn ranges_of_buried_ids_and_nodes_together_stay_within_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    store.set_limit(16);
    let (fd, base) = open_path(root.as_fd(), c"f");
    drop(fd);
    let mut ids = Vec::new();
    for i in 0..200 {
        let mut key = base;
        key.ino = base.ino + 1_000_000 + i;
        let n = store
            .insert(NewInode {
                key,
                identity: Identity::Birth,
                source: Source::Found(Origin::new(store.get(ROOT_ID).unwrap(), c"f")),
                handle: None,
                settled: true,
            })
            .ok()
            .unwrap();
        store.bury(&n);
        ids.push(n.id);
    }
    assert_eq!(store.dead_ranges(), 1, "ids buried in a row make one range");
    let kept = store.insert(new_inode(base, open_path(root.as_fd(), c"f").0));
    let kept = kept.ok().unwrap();
    for id in ids.iter().step_by(2) {
        store.forget(*id, 1);
        assert!(
            store.dead_ranges() + store.len() <= 16,
            "{} ranges and {} nodes",
            store.dead_ranges(),
            store.len()
        );
    }
    // The newest stay stale; the oldest were dropped (never given again).
    assert!(store.is_dead(ids[199]) && store.is_dead(ids[197]));
    assert!(!store.is_dead(ids[1]));
    assert_eq!(store.dead_ranges(), 14, "the root and one node take two");
    assert!(store.get(kept.id).is_some());
}

#[test]
fn buried_ids_answer_until_forgotten_and_cost_a_range() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, root) = store_on(tmp.path());
    let mut ids = Vec::new();
    for i in 0..6 {
        let name = std::ffi::CString::new(format!("f{i}")).unwrap();
        std::fs::write(tmp.path().join(format!("f{i}")), b"x").unwrap();
        let (fd, key) = open_path(root.as_fd(), &name);
        ids.push(store.insert(new_inode(key, fd)).ok().unwrap());
    }
    // Buried out of order: consecutive ids join into one range.
    for i in [1, 3, 2, 5] {
        store.bury(&ids[i]);
        assert!(store.get(ids[i].id).is_none());
    }
    assert_eq!(store.dead_ranges(), 2, "{{1,2,3}} and {{5}}");
    for (i, dead) in [
        (0, false),
        (1, true),
        (2, true),
        (3, true),
        (4, false),
        (5, true),
    ] {
        assert_eq!(store.is_dead(ids[i].id), dead, "{i}");
    }
    assert_eq!(store.len(), 3, "the root, 0 and 4");
    // Forgetting splits a range; an unknown id forgets nothing.
    store.forget(ids[2].id, 1);
    assert!(!store.is_dead(ids[2].id));
    assert!(store.is_dead(ids[1].id) && store.is_dead(ids[3].id));
    assert_eq!(store.dead_ranges(), 3);
    store.forget(ids[2].id, 1);
    store.forget(u64::MAX, 1);
    assert_eq!(store.dead_ranges(), 3);
    for i in [1, 3, 5] {
        store.forget(ids[i].id, 1);
    }
    assert_eq!(store.dead_ranges(), 0);
    // A live inode is not touched by a forget of a buried neighbour.
    assert_eq!(store.get(ids[4].id).unwrap().refcount(), 1);
}

#[test]
fn the_tables_give_their_room_back_when_the_guest_forgets() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    let (fd, base) = open_path(root.as_fd(), c"f");
    drop(fd);
    let n = 50_000u64;
    let mut ids = Vec::new();
    for i in 0..n {
        // Keys of files that need not exist: the table only compares them.
        let mut key = base;
        key.ino = base.ino + 1_000_000 + i;
        let n = NewInode {
            key,
            identity: Identity::Birth,
            source: Source::Found(Origin::new(store.get(ROOT_ID).unwrap(), c"f")),
            handle: None,
            settled: true,
        };
        ids.push(store.insert(n).ok().unwrap().id);
    }
    let full = store.maps.read().unwrap().by_id.capacity();
    assert!(full >= n as usize);
    for id in &ids[..ids.len() - 10] {
        store.forget(*id, 1);
    }
    let maps = store.maps.read().unwrap();
    assert_eq!(maps.by_id.len(), 11);
    assert!(
        maps.by_id.capacity() <= SHRINK_FLOOR * 2 && maps.by_key.capacity() <= SHRINK_FLOOR * 2,
        "{} and {} slots for 11 nodes (were {full})",
        maps.by_id.capacity(),
        maps.by_key.capacity()
    );
}

#[test]
fn lost_and_carried_over_ids_are_ranges_that_nothing_else_takes() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    let (fd, key) = open_path(root.as_fd(), c"f");
    let real = store.restore(10, new_inode(key, fd), 1).ok().unwrap();
    // Lost ids in a row make one range; taken ids and the root are refused.
    for id in [4, 5, 6] {
        assert!(store.restore_lost(id));
    }
    assert_eq!(store.dead_ranges(), 1);
    for taken in [0, ROOT_ID, 5, real.id] {
        assert!(!store.restore_lost(taken), "{taken}");
    }
    // Ranges carried over from a source: empty ones and ones meeting a range refused.
    assert!(store.restore_dead_range(20, 30));
    for (start, end) in [(7, 7), (8, 5), (6, 8), (25, 40), (15, 21), (ROOT_ID, 3)] {
        assert!(!store.restore_dead_range(start, end), "{start}..{end}");
    }
    assert_eq!(store.dead_ranges_list(), vec![(4, 7), (20, 30)]);
    assert!(store.is_dead(29) && !store.is_dead(30) && !store.is_dead(7));
    // A restored node cannot take a dead id; new ids come after them all.
    std::fs::write(tmp.path().join("g"), b"x").unwrap();
    let (fd, key2) = open_path(root.as_fd(), c"g");
    assert!(store.restore(25, new_inode(key2, fd), 1).is_err());
    let (fd, key2) = open_path(root.as_fd(), c"g");
    assert!(store.restore(31, new_inode(key2, fd), 1).is_ok());
    assert!(store.next_id() >= 30);
}

#[test]
fn a_retired_inode_keeps_its_id_but_not_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    let (fd1, key) = open_path(root.as_fd(), c"f");
    let (fd2, _) = open_path(root.as_fd(), c"f");
    let old = store.insert(new_inode(key, fd1)).ok().unwrap();
    store.retire(&old);
    assert!(old.is_stale());
    assert!(store.ref_known(&key).is_none());
    // A new file with the same key becomes a new inode beside the retired one.
    let new = store.insert(new_inode(key, fd2)).ok().unwrap();
    assert_ne!(new.id, old.id);
    assert_eq!(store.ref_known(&key).unwrap().id, new.id);
    // Forgetting the retired inode leaves the new one's key alone.
    store.forget(old.id, 1);
    assert!(store.get(old.id).is_none());
    assert_eq!(store.find(&key).unwrap().id, new.id);
}

#[test]
fn root_and_unknown_ids_ignore_forget() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _root) = store_on(tmp.path());
    store.forget(ROOT_ID, 100);
    store.forget(12345, 1);
    assert!(store.get(ROOT_ID).is_some());
}

#[test]
fn clear_keeps_only_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    let (fd, key) = open_path(root.as_fd(), c"f");
    let id = store.insert(new_inode(key, fd)).ok().unwrap().id;
    store.clear();
    assert!(store.get(id).is_none());
    assert!(store.get(ROOT_ID).is_some());
    assert_eq!(store.len(), 1);
}

/// What a node held by a walk costs: its slot (the node itself, with its name inside) and a
/// slot number in each index. A field added to every node shows here first; what only
/// opened nodes need goes in `Opened`.
#[test]
fn a_node_of_a_walk_is_its_slot_with_its_name_inside() {
    assert!(
        std::mem::size_of::<InodeData>() <= 104,
        "{} bytes",
        std::mem::size_of::<InodeData>()
    );
    assert_eq!(std::mem::size_of::<InodeKey>(), 24);
    assert_eq!(std::mem::size_of::<StoredName>(), 16);
    assert_eq!(std::mem::size_of::<Option<Origin>>(), 24);
    let short = StoredName::new(c"name-14-bytes.");
    assert!(matches!(short, StoredName::Inline { .. }));
    assert_eq!(short.bytes(), b"name-14-bytes.");
    let long = StoredName::new(c"name-of-15-bytes");
    assert!(matches!(long, StoredName::Heap(_)));
    assert_eq!(long.bytes(), b"name-of-15-bytes");
    let empty = StoredName::new(c"");
    assert_eq!(empty.bytes(), b"");
    let max = std::ffi::CString::new(vec![b'x'; 255]).unwrap();
    assert_eq!(StoredName::new(&max).bytes(), max.as_bytes());
    assert_eq!(&*OriginName::new(max.as_bytes()), max.as_c_str());
    let longer = std::ffi::CString::new(vec![b'y'; 300]).unwrap();
    assert_eq!(&*OriginName::new(longer.as_bytes()), longer.as_c_str());
}

fn loose_node(id: u64, key: InodeKey, source: Source) -> Node {
    Node::new(InodeData::new(
        id,
        NewInode {
            key,
            identity: Identity::Birth,
            source,
            handle: None,
            settled: true,
        },
    ))
}

/// Slots are reused as soon as a node goes, but node ids are not: an id the guest forgot
/// names nothing afterwards (not the node that took its slot), and every new node gets an
/// id never given before, whose key is its own file's.
#[test]
fn a_forgotten_id_never_names_the_node_that_took_its_slot() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    std::fs::write(tmp.path().join("g"), b"y").unwrap();
    let (store, root) = store_on(tmp.path());
    let (_fd, kf) = open_path(root.as_fd(), c"f");
    let (_fd, kg) = open_path(root.as_fd(), c"g");
    let found = |key| NewInode {
        key,
        identity: Identity::Birth,
        source: Source::Found(Origin::new(store.get(ROOT_ID).unwrap(), c"n")),
        handle: None,
        settled: true,
    };
    let mut seen = std::collections::HashSet::new();
    let mut last: Option<(u64, *const InodeData)> = None;
    let mut slot_reused = 0;
    for i in 0..2_000 {
        let key = if i % 2 == 0 { kf } else { kg };
        let n = store.insert(found(key)).ok().unwrap();
        let (id, addr) = (n.id, &*n as *const InodeData);
        assert!(seen.insert(id), "id {id} given twice");
        assert_eq!(n.key, key);
        drop(n);
        if let Some((old, old_addr)) = last {
            assert!(
                store.get(old).is_none(),
                "forgotten id {old} still names a node"
            );
            slot_reused += usize::from(old_addr == addr);
        }
        store.forget(id, 1);
        assert!(store.get(id).is_none());
        assert!(store.find(&key).is_none());
        last = Some((id, addr));
    }
    // The lowest free slot is taken: most turns reuse the slot just freed (other tests'
    // nodes may take it in between).
    assert!(slot_reused > 0);
    assert_eq!(store.len(), 1);
}

/// A node found again by name while another thread gives it its descriptor ends with the
/// descriptor and no parent: a parent kept beside the descriptor would hold the parent's
/// node (and the parents above it) for as long as the guest holds this one.
#[test]
fn a_node_given_its_descriptor_while_found_again_keeps_no_parent() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (_store, root) = store_on(tmp.path());
    let (fd, key) = open_path(root.as_fd(), c"f");
    let parent = loose_node(2, key, Source::Fd(fd));
    let other = loose_node(3, key, Source::Fd(open_path(root.as_fd(), c"f").0));
    let (batches, turns) = (50, 2_000);
    let mut kept = 0;
    for b in 0..batches {
        let nodes: Vec<Node> = (0..turns)
            .map(|i| {
                let origin = Origin::new(parent.clone(), c"f");
                loose_node(10 + b * turns + i, key, Source::Found(origin))
            })
            .collect();
        let fds: Vec<OwnedFd> = (0..turns)
            .map(|_| open_path(root.as_fd(), c"f").0)
            .collect();
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                for n in &nodes {
                    barrier.wait();
                    n.found_at(&other, c"g");
                }
            });
            for (n, fd) in nodes.iter().zip(fds) {
                barrier.wait();
                n.keep_fd(fd);
            }
        });
        kept += nodes.iter().filter(|n| n.origin().is_some()).count();
    }
    let turns = batches * turns;
    assert_eq!(
        kept, 0,
        "{kept} of {turns} nodes keep a parent beside their descriptor"
    );
}

/// Ids a migration state chooses (`k << 40`: the same low bits) still spread over the
/// table's slots, which the low bits of the hash choose.
#[test]
fn ids_sharing_their_low_bits_do_not_share_a_slot() {
    let maps = Maps::default();
    let slots: std::collections::HashSet<u64> = (0..1024u64)
        .map(|k| id_hash(maps.id_seed(), k << 40) & 1023)
        .collect();
    // 1,024 random picks of 1,024 slots fill about 647.
    assert!(slots.len() > 500, "{} slots of 1024", slots.len());
}

/// A guest that looks up and forgets one file in turn makes a give-back of free memory
/// once per many forgets, not at each; a walk it forgets whole gets a few, the last near
/// its end.
#[test]
fn free_memory_is_given_back_after_many_forgets_only() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"x").unwrap();
    let (store, root) = store_on(tmp.path());
    let (fd, base) = open_path(root.as_fd(), c"f");
    drop(fd);
    let node = |i: u64| {
        let mut key = base;
        key.ino = base.ino + 1_000_000 + i;
        NewInode {
            key,
            identity: Identity::Birth,
            source: Source::Found(Origin::new(store.get(ROOT_ID).unwrap(), c"f")),
            handle: None,
            settled: true,
        }
    };
    for i in 0..1000 {
        let id = store.insert(node(i)).ok().unwrap().id;
        store.forget(id, 1);
    }
    let gave = store.give_back.made();
    assert!(
        gave <= 1000 / TRIM_LAST,
        "{gave} give-backs for 1,000 forgets"
    );
    let ids: Vec<u64> = (1000..11_000)
        .map(|i| store.insert(node(i)).ok().unwrap().id)
        .collect();
    let before = store.give_back.made();
    for id in ids {
        store.forget(id, 1);
    }
    let walk = store.give_back.made() - before;
    assert!(
        (1..=10).contains(&walk),
        "{walk} give-backs for a walk of 10,000"
    );
    assert_eq!(store.len(), 1);
    // The last one came with the last FORGET: nothing forgotten is left in the
    // allocator's pages or the slots' chunks.
    assert_eq!(store.give_back.removed_since(), 0);
}
