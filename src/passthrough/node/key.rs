//! What identifies host files and directory states, shared by the inode table, the identity
//! checks and the listing cache (a leaf: it depends on nothing else of the passthrough module
//! but the syscall wrappers).

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, PoisonError, RwLock};
use std::time::Duration;

use crate::passthrough::sys::StatExtra;

/// How old a directory's change time must be for a snapshot of it to be shared.
pub const SETTLE: Duration = Duration::from_secs(1);

/// How old a file's times must be for the guest to keep its pages across opens (`auto`).
pub const FILE_SETTLE: Duration = Duration::from_secs(2);

/// What identifies a host file: its device, mount, inode number, type and, on mounts told
/// apart by it, its birth time. Every node holds one, so it is packed into 24 bytes: the
/// (`st_dev`, mount id) pair, of which a daemon meets few, is a number in [`MOUNTS`] sharing a
/// word with the file type. Comparing and hashing keys reads the key alone.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub ino: u64,
    /// Birth time, seconds (see [`InodeKey::btime`]).
    btime_sec: i64,
    /// Birth time, nanoseconds; [`NO_BTIME`] when the key has none.
    btime_nsec: u32,
    /// The mount's number in [`MOUNTS`] (low [`MOUNT_BITS`] bits) and the `S_IFMT` bits of the
    /// file's mode shifted down to the top four: a number reused by a file of another type is
    /// another key.
    mount_kind: u32,
}

/// `btime_nsec` of a key without a birth time (no real time has a billion nanoseconds or more).
const NO_BTIME: u32 = u32::MAX;

/// Bits of [`InodeKey::mount_kind`] that hold the mount's number; the type takes the rest.
const MOUNT_BITS: u32 = 28;

/// Where the `S_IFMT` bits start in a mode (`S_IFMT` is `0o170000`: four bits).
const KIND_SHIFT: u32 = 12;

impl InodeKey {
    /// The key of the file `st`, `x` on a mount told apart by `identity`. `ENFILE` when the
    /// file is on a mount beyond the most [`MOUNTS`] holds.
    pub fn new(st: &libc::stat64, x: &StatExtra, identity: Identity) -> io::Result<Self> {
        let btime = match identity {
            Identity::Birth => x.btime,
            Identity::Handle | Identity::Pinned => None,
        };
        Self::of_parts(st.st_dev, x.mnt_id, st.st_ino, st.st_mode, btime)
    }

    /// The key of inode `ino` with mode `mode` on device `dev` and mount `mnt_id`.
    fn of_parts(
        dev: u64,
        mnt_id: u64,
        ino: u64,
        mode: u32,
        btime: Option<(i64, u32)>,
    ) -> io::Result<Self> {
        let mount = MOUNTS.number(dev, mnt_id)?;
        let kind = (mode & libc::S_IFMT) >> KIND_SHIFT;
        Ok(InodeKey {
            ino,
            btime_sec: 0,
            btime_nsec: NO_BTIME,
            mount_kind: (kind << MOUNT_BITS) | mount,
        }
        .with_btime(btime))
    }

    /// The `S_IFMT` bits of the file's mode.
    pub fn kind(&self) -> u32 {
        (self.mount_kind >> MOUNT_BITS) << KIND_SHIFT
    }

    /// The mount's number in [`MOUNTS`].
    fn mount(&self) -> u32 {
        self.mount_kind & ((1 << MOUNT_BITS) - 1)
    }

    /// `st_dev` of the file.
    pub fn dev(&self) -> u64 {
        MOUNTS.pair(self.mount()).0
    }

    /// Id of the mount the file is on (0 when the kernel cannot tell).
    pub fn mnt_id(&self) -> u64 {
        MOUNTS.pair(self.mount()).1
    }

    /// Birth time, on mounts whose [`Identity`] is [`Identity::Birth`].
    pub fn btime(&self) -> Option<(i64, u32)> {
        (self.btime_nsec != NO_BTIME).then_some((self.btime_sec, self.btime_nsec))
    }

    /// This key with birth time `btime` (a nanosecond count out of range is clamped, so that
    /// it can never read as "none").
    pub fn with_btime(self, btime: Option<(i64, u32)>) -> Self {
        let (btime_sec, btime_nsec) = match btime {
            Some((s, ns)) => (s, ns.min(999_999_999)),
            None => (0, NO_BTIME),
        };
        InodeKey {
            btime_sec,
            btime_nsec,
            ..self
        }
    }

    /// Whether `other` is on the same mount.
    pub fn same_mount(&self, other: &InodeKey) -> bool {
        self.mount() == other.mount()
    }

    /// Whether the file seen as `st`, `x` is on this key's mount (no lock on a thread's
    /// latest mount).
    pub fn on_mount_of(&self, st: &libc::stat64, x: &StatExtra) -> bool {
        MOUNTS.known(st.st_dev, x.mnt_id) == Some(self.mount())
    }
}

impl std::fmt::Debug for InodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeKey")
            .field("dev", &self.dev())
            .field("ino", &self.ino)
            .field("mnt_id", &self.mnt_id())
            .field("kind", &format_args!("{:#o}", self.kind()))
            .field("btime", &self.btime())
            .finish()
    }
}

/// The (`st_dev`, mount id) pairs the keys of this process were made on, each under a number
/// that stays its own for the life of the process. Pairs are never forgotten: they are as
/// many as the host mounts and subvolumes met under the shared directories.
static MOUNTS: LazyLock<Mounts> = LazyLock::new(|| Mounts::new(1 << MOUNT_BITS));

/// See [`MOUNTS`].
struct Mounts {
    table: RwLock<MountTable>,
    /// Most pairs held: a number must fit in [`MOUNT_BITS`] bits.
    limit: usize,
    /// Whether a refused pair was logged.
    warned: AtomicBool,
}

#[derive(Default)]
struct MountTable {
    numbers: HashMap<(u64, u64), u32>,
    pairs: Vec<(u64, u64)>,
}

thread_local! {
    /// The pair this thread last asked [`MOUNTS`] about, and its number: most files a thread
    /// meets in a row are on one mount.
    static LATEST: Cell<Option<(u64, u64, u32)>> = const { Cell::new(None) };
}

impl Mounts {
    fn new(limit: usize) -> Self {
        Mounts {
            table: RwLock::new(MountTable::default()),
            limit,
            warned: AtomicBool::new(false),
        }
    }

    /// The number of the pair (`dev`, `mnt_id`), given it now if it has none; `ENFILE` (logged
    /// once) when the table is full.
    fn number(&self, dev: u64, mnt_id: u64) -> io::Result<u32> {
        if let Some(n) = self.known(dev, mnt_id) {
            return Ok(n);
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let n = match table.numbers.get(&(dev, mnt_id)) {
            Some(&n) => n,
            None if table.pairs.len() >= self.limit => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "{} host mounts met: files on one more (device {dev}, mount {mnt_id}) get \
                         ENFILE",
                        self.limit
                    );
                }
                return Err(io::Error::from_raw_os_error(libc::ENFILE));
            }
            None => {
                let n = table.pairs.len() as u32;
                table.pairs.push((dev, mnt_id));
                table.numbers.insert((dev, mnt_id), n);
                n
            }
        };
        self.remember(dev, mnt_id, n);
        Ok(n)
    }

    /// The number of the pair (`dev`, `mnt_id`) if it has one.
    fn known(&self, dev: u64, mnt_id: u64) -> Option<u32> {
        if self.is_global() {
            if let Some((d, m, n)) = LATEST.get() {
                if (d, m) == (dev, mnt_id) {
                    return Some(n);
                }
            }
        }
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        let n = *table.numbers.get(&(dev, mnt_id))?;
        drop(table);
        self.remember(dev, mnt_id, n);
        Some(n)
    }

    /// Whether this is [`MOUNTS`] (whose numbers [`LATEST`] holds; the tests make others).
    fn is_global(&self) -> bool {
        std::ptr::eq(self, &*MOUNTS)
    }

    fn remember(&self, dev: u64, mnt_id: u64, n: u32) {
        if self.is_global() {
            LATEST.set(Some((dev, mnt_id, n)));
        }
    }

    /// The pair numbered `n` (a number this table gave).
    fn pair(&self, n: u32) -> (u64, u64) {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        table.pairs.get(n as usize).copied().unwrap_or_default()
    }
}

/// How the inodes of one host mount are told apart from later files given the same number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The file system stamps a birth time that never changes: it is part of the key. An inode
    /// born less than [`SETTLE`] before it was first seen
    /// also carries its file handle (or, without one, keeps a descriptor) until it is seen
    /// again after that time.
    Birth,
    /// No birth time to trust: every inode carries its file handle (or keeps a descriptor).
    Handle,
    /// No file handles either: every inode keeps an `O_PATH` descriptor from the start.
    Pinned,
}

/// What a directory looked like when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    ctime: (i64, i64),
    mtime: (i64, i64),
    size: i64,
    nlink: libc::nlink_t,
}

impl Stamp {
    pub fn of(st: &libc::stat64) -> Self {
        Stamp {
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
            size: st.st_size,
            nlink: st.st_nlink,
        }
    }

    /// Whether both times lie at least [`SETTLE`] before `now` (seconds, nanoseconds since the
    /// epoch), so that any later change of the directory gives a different stamp.
    pub fn settled(&self, now: (i64, i64)) -> bool {
        self.settled_for(now, SETTLE)
    }

    /// Whether both times lie at least `age` before `now`.
    fn settled_for(&self, now: (i64, i64), age: Duration) -> bool {
        let limit = now.0.saturating_sub(age.as_secs() as i64);
        let before = |t: (i64, i64)| t < (limit, now.1);
        before(self.ctime) && before(self.mtime)
    }

    /// This stamp of a file's data, if it is settled now: what a later look at the file can be
    /// compared with. [`FILE_SETTLE`] rather than [`SETTLE`]: a file system with a coarser
    /// clock than a second (FAT's 2 s modification times) must not hide a change either.
    pub fn if_settled(self) -> Option<Self> {
        self.settled_for(now(), FILE_SETTLE).then_some(self)
    }
}

/// The current wall-clock time, as the kernel stamps files.
pub fn now() -> (i64, i64) {
    // `SystemTime` reads `CLOCK_REALTIME`, the clock the kernel stamps files with.
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
        // A clock before 1970: whole seconds are enough to compare with.
        Err(e) => (-(e.duration().as_secs() as i64) - 1, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made-up devices, far from any real `st_dev`.
    const DEV_A: u64 = u64::MAX - 1;
    const DEV_B: u64 = u64::MAX - 2;

    fn key(dev: u64, mnt_id: u64, ino: u64, mode: u32) -> InodeKey {
        InodeKey::of_parts(dev, mnt_id, ino, mode, None).unwrap()
    }

    #[test]
    fn a_key_is_24_bytes() {
        assert_eq!(std::mem::size_of::<InodeKey>(), 24);
    }

    #[test]
    fn one_number_on_two_devices_or_mounts_is_two_keys() {
        let a = key(DEV_A, 7, 42, libc::S_IFREG);
        let other_dev = key(DEV_B, 7, 42, libc::S_IFREG);
        let other_mount = key(DEV_A, 8, 42, libc::S_IFREG);
        assert_ne!(a, other_dev);
        assert_ne!(a, other_mount);
        assert_ne!(other_dev, other_mount);
        assert!(!a.same_mount(&other_dev));
        assert!(!a.same_mount(&other_mount));
        // The same file again is the same key, on the same mount as its neighbours.
        assert_eq!(a, key(DEV_A, 7, 42, libc::S_IFREG));
        assert!(a.same_mount(&key(DEV_A, 7, 43, libc::S_IFDIR)));
        for (k, dev, mnt_id) in [
            (a, DEV_A, 7),
            (other_dev, DEV_B, 7),
            (other_mount, DEV_A, 8),
        ] {
            assert_eq!((k.dev(), k.mnt_id(), k.ino), (dev, mnt_id, 42));
        }
    }

    #[test]
    fn the_type_is_kept_and_tells_keys_apart() {
        let kinds = [
            libc::S_IFREG,
            libc::S_IFDIR,
            libc::S_IFLNK,
            libc::S_IFIFO,
            libc::S_IFSOCK,
            libc::S_IFCHR,
            libc::S_IFBLK,
        ];
        for kind in kinds {
            // Permission and set-id bits are no part of the key.
            let k = key(DEV_A, 9, 5, kind | 0o7755);
            assert_eq!(k.kind(), kind);
            assert_eq!((k.dev(), k.mnt_id()), (DEV_A, 9));
            assert_eq!(k, key(DEV_A, 9, 5, kind));
            for other in kinds.iter().filter(|&&o| o != kind) {
                assert_ne!(k, key(DEV_A, 9, 5, *other));
            }
        }
    }

    #[test]
    fn a_birth_time_or_none_comes_back() {
        let k = key(DEV_A, 10, 1, libc::S_IFREG);
        assert_eq!(k.btime(), None);
        for t in [(0, 0), (1_700_000_000, 999_999_999), (-5, 3)] {
            let b = k.with_btime(Some(t));
            assert_eq!(b.btime(), Some(t));
            assert_ne!(b, k);
            assert_eq!(b.with_btime(None), k);
        }
        // Out of range nanoseconds are clamped, never read as "none".
        assert_eq!(
            k.with_btime(Some((1, u32::MAX))).btime(),
            Some((1, 999_999_999))
        );
    }

    /// A key made from `statx` keeps the birth time only on mounts told apart by it.
    #[test]
    fn a_key_of_a_file_keeps_its_birth_time_by_its_mount_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let dir: std::os::fd::OwnedFd = std::fs::File::open(tmp.path()).unwrap().into();
        let (st, x) = crate::passthrough::sys::stat_fd_mnt(std::os::fd::AsFd::as_fd(&dir)).unwrap();
        let x = StatExtra {
            btime: Some((12, 34)),
            ..x
        };
        let birth = InodeKey::new(&st, &x, Identity::Birth).unwrap();
        assert_eq!(birth.btime(), Some((12, 34)));
        assert_eq!(
            (birth.dev(), birth.ino, birth.mnt_id(), birth.kind()),
            (st.st_dev, st.st_ino, x.mnt_id, libc::S_IFDIR)
        );
        assert!(birth.on_mount_of(&st, &x));
        for identity in [Identity::Handle, Identity::Pinned] {
            let k = InodeKey::new(&st, &x, identity).unwrap();
            assert_eq!(k.btime(), None);
            assert_eq!(k, birth.with_btime(None));
        }
        let elsewhere = StatExtra {
            mnt_id: x.mnt_id.wrapping_add(1),
            ..x
        };
        assert!(!birth.on_mount_of(&st, &elsewhere));
    }

    #[test]
    fn a_full_mount_table_refuses_new_mounts_with_enfile() {
        let mounts = Mounts::new(3);
        let numbers: Vec<u32> = (0..3).map(|m| mounts.number(DEV_A, m).unwrap()).collect();
        assert_eq!(numbers, [0, 1, 2]);
        assert!(!mounts.warned.load(Ordering::Relaxed));
        for _ in 0..2 {
            let e = mounts.number(DEV_B, 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENFILE));
        }
        assert!(mounts.warned.load(Ordering::Relaxed));
        // The pairs it holds keep their numbers.
        assert_eq!(mounts.number(DEV_A, 1).unwrap(), 1);
        assert_eq!(mounts.known(DEV_B, 0), None);
        assert_eq!(mounts.pair(2), (DEV_A, 2));
    }

    #[test]
    fn a_key_shows_its_device_and_mount() {
        let k = key(DEV_A, 11, 3, libc::S_IFDIR);
        let shown = format!("{k:?}");
        assert!(shown.contains(&format!("dev: {DEV_A}")), "{shown}");
        assert!(shown.contains("mnt_id: 11"), "{shown}");
        assert!(shown.contains("kind: 0o40000"), "{shown}");
    }
}
