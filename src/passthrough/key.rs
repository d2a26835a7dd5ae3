//! What identifies host files and directory states, shared by the inode table, the identity
//! checks and the listing cache (a leaf: it depends on nothing else of the passthrough module
//! but the syscall wrappers).

use std::time::Duration;

use super::sys::StatExtra;

/// How old a directory's change time must be for a snapshot of it to be shared.
pub const SETTLE: Duration = Duration::from_secs(1);

/// How old a file's times must be for the guest to keep its pages across opens (`auto`).
pub const FILE_SETTLE: Duration = Duration::from_secs(2);

/// What identifies a host file. Every node holds one, so it is packed: 40 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    pub dev: u64,
    pub ino: u64,
    pub mnt_id: u64,
    /// Birth time, seconds (see [`InodeKey::btime`]).
    btime_sec: i64,
    /// Birth time, nanoseconds; [`NO_BTIME`] when the key has none.
    btime_nsec: u32,
    /// `S_IFMT` bits of the file's mode: a number reused by a file of another type is another key.
    pub kind: u32,
}

/// `btime_nsec` of a key without a birth time (no real time has a billion nanoseconds or more).
const NO_BTIME: u32 = u32::MAX;

impl InodeKey {
    /// The key of the file `st`, `x` on a mount told apart by `identity`.
    pub fn new(st: &libc::stat64, x: &StatExtra, identity: Identity) -> Self {
        let btime = match identity {
            Identity::Birth => x.btime,
            Identity::Handle | Identity::Pinned => None,
        };
        InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            mnt_id: x.mnt_id,
            kind: st.st_mode & libc::S_IFMT,
            btime_sec: 0,
            btime_nsec: NO_BTIME,
        }
        .with_btime(btime)
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
        self.dev == other.dev && self.mnt_id == other.mnt_id
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
    nlink: u64,
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
