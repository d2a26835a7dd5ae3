//! Directory listings, served two ways.
//!
//! A snapshot: a whole directory read once with `getdents64` into one compact buffer of
//! (host inode number, `DT_*` type, name) records, then served by index. The entry at index `i`
//! carries the offset `i + 1`, so a READDIR at offset `o` resumes at index `o`; offsets stay
//! stable for as long as the snapshot does. A READDIR at offset 0 reads the directory again (a
//! rewind). A snapshot is charged against the listing budget (`dircache`) as it grows; one that
//! does not fit is abandoned.
//!
//! A stream, for directories whose snapshot does not fit: each READDIR reads from the directory
//! itself, after `lseek` to the offset the guest sends, and entries carry the `d_off` cookie
//! `getdents64` gave them, which is what the host file system resumes from (stable for as long
//! as the entry exists on the usual Linux file systems, which export them to NFS). Nothing is
//! held between requests.
//!
//! Either way an entry the host file system reports as `DT_UNKNOWN` is stat'ed (once, for a
//! snapshot), and skipped if it has vanished, so a served entry never has type `DT_UNKNOWN`.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use super::budget::{Charge, Overflow};
use super::sys;

/// Bytes before the name in a record: inode number (8), type (1), name length (2). The name
/// follows with a terminating NUL.
const HEADER: usize = 11;

/// Offset of `d_name` in a `struct linux_dirent64`.
const DIRENT_NAME: usize = 19;
/// Bytes charged for a snapshot besides its buffers: the structure, its `Arc` and its place in
/// the cache.
const OVERHEAD: usize = 128;
/// Size of the buffer `getdents64` fills while a snapshot is read.
const READ_CHUNK: usize = 32 * 1024;
/// Smallest and largest buffer `getdents64` fills for one streamed READDIR.
const STREAM_CHUNK: (usize, usize) = (1024, 64 * 1024);

/// One entry of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapEntry<'a> {
    pub ino: u64,
    /// A `libc::DT_*` value, never `DT_UNKNOWN`.
    pub dtype: u8,
    pub name: &'a [u8],
    /// `name` with its terminating NUL.
    pub cname: &'a CStr,
}

/// What the READDIRs of a directory handle (or of an inode listed without one) are served
/// from, once one at offset 0 started it.
#[derive(Debug, Clone)]
pub enum Listing {
    /// Offsets are indices + 1 into the snapshot.
    Snapshot(Arc<DirSnapshot>),
    /// Read from the directory at each request ([`stream`]); offsets are its `d_off` cookies.
    Stream,
}

/// The entries of a directory as read at one point in time.
#[derive(Debug, Default)]
pub struct DirSnapshot {
    /// Records back to back: inode number, type, name length (native endian), name, NUL.
    buf: Vec<u8>,
    /// Start of each record in `buf`.
    index: Vec<u32>,
    /// What the buffers hold of the listing budget ([`DirSnapshot::memory_size`]).
    charge: Charge,
}

/// A function charging more bytes to a snapshot's [`Charge`], or refusing them.
pub type Reserve<'a> = dyn FnMut(&mut Charge, usize) -> Result<(), Overflow> + 'a;

impl DirSnapshot {
    pub fn new() -> Self {
        DirSnapshot::default()
    }

    /// Reads the whole directory `dir` (a descriptor opened for reading) from its start;
    /// `rewind` when the descriptor was read before (a fresh one is at the start already).
    /// Every byte is charged with `reserve` before it is allocated; when it refuses, the entries
    /// read so far are dropped and the reason returned.
    pub fn read(
        dir: BorrowedFd<'_>,
        rewind: bool,
        reserve: &mut Reserve<'_>,
    ) -> io::Result<Result<Self, Overflow>> {
        let mut snap = DirSnapshot::new();
        let empty = snap.memory_size();
        if let Err(o) = reserve(&mut snap.charge, empty) {
            return Ok(Err(o));
        }
        if rewind {
            sys::lseek(dir, 0, libc::SEEK_SET)?;
        }
        Ok(snap.read_all(dir, reserve)?.map(|()| snap))
    }

    /// Bytes this snapshot holds: its buffers and a fixed [`OVERHEAD`].
    pub fn memory_size(&self) -> usize {
        OVERHEAD + self.buf.capacity() + self.index.capacity() * std::mem::size_of::<u32>()
    }

    /// Bytes of the listing budget charged to this snapshot (its [`Self::memory_size`]).
    #[cfg(test)]
    pub fn charged(&self) -> usize {
        self.charge.bytes()
    }

    /// This snapshot, holding `charge` (for tests of code that stores snapshots).
    #[cfg(test)]
    pub fn with_charge(mut self, charge: Charge) -> Self {
        self.charge = charge;
        self
    }

    /// A snapshot of regular files with these names (for tests of code that stores snapshots).
    #[cfg(test)]
    pub fn from_names(names: impl IntoIterator<Item = Vec<u8>>) -> Self {
        let mut snap = DirSnapshot::new();
        for (i, n) in names.into_iter().enumerate() {
            snap.push(i as u64 + 1, libc::DT_REG, &n)
                .expect("valid name");
        }
        snap
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// (Re)reads the whole directory `dir` (a descriptor opened for reading) from its start,
    /// without a budget.
    #[cfg(test)]
    pub fn fill(&mut self, dir: BorrowedFd<'_>) -> io::Result<()> {
        self.buf.clear();
        self.index.clear();
        sys::lseek(dir, 0, libc::SEEK_SET)?;
        self.read_all(dir, &mut |_, _| Ok(()))?
            .map_err(|_| sys::error(libc::ENOMEM))
    }

    /// Appends every entry from the descriptor's current position to its end, charging each
    /// allocation with `reserve` first.
    fn read_all(
        &mut self,
        dir: BorrowedFd<'_>,
        reserve: &mut Reserve<'_>,
    ) -> io::Result<Result<(), Overflow>> {
        let mut raw = [0u8; READ_CHUNK];
        loop {
            let n = sys::getdents64(dir, &mut raw)?;
            if n == 0 {
                break;
            }
            // What the records take here (at most: vanished entries are skipped).
            let (bytes, slots) = Records(&raw[..n]).flatten().fold((0, 0), |(b, s), (e, _)| {
                (b + HEADER + e.name.len() + 1, s + 1)
            });
            if let Err(o) = self.make_room(bytes, slots, reserve) {
                return Ok(Err(o));
            }
            self.push_raw(dir, &raw[..n])?;
        }
        self.shrink_to_fit();
        Ok(Ok(()))
    }

    /// Gives the room no record uses back, to the allocator and to the budget.
    fn shrink_to_fit(&mut self) {
        let before = self.memory_size();
        self.buf.shrink_to_fit();
        self.index.shrink_to_fit();
        self.charge
            .release(before.saturating_sub(self.memory_size()));
    }

    /// A snapshot of the records `records` gives (a migration state's listing), charged with
    /// `reserve` before each allocation as [`DirSnapshot::read`] does; `Ok(Err)` when the
    /// budget refuses it, `Err` when `records` does.
    pub(super) fn collect<'n, E>(
        count: usize,
        mut records: impl FnMut() -> Result<(u64, u8, &'n [u8]), E>,
        reserve: &mut Reserve<'_>,
    ) -> Result<Result<Self, Overflow>, E> {
        let mut snap = DirSnapshot::new();
        let empty = snap.memory_size();
        if let Err(o) = reserve(&mut snap.charge, empty) {
            return Ok(Err(o));
        }
        for _ in 0..count {
            let (ino, dtype, name) = records()?;
            if let Err(o) = snap.make_room(HEADER + name.len() + 1, 1, reserve) {
                return Ok(Err(o));
            }
            if snap.push(ino, dtype, name).is_err() {
                // A name longer than a record holds: not one a directory gives.
                return Ok(Err(Overflow::TooBig));
            }
        }
        snap.shrink_to_fit();
        Ok(Ok(snap))
    }

    /// Makes room for `bytes` more record bytes and `slots` more records, charging the growth:
    /// doubled while the budget allows (so that reading stays linear), exact otherwise.
    fn make_room(
        &mut self,
        bytes: usize,
        slots: usize,
        reserve: &mut Reserve<'_>,
    ) -> Result<(), Overflow> {
        let (buf_cap, index_cap) = (self.buf.capacity(), self.index.capacity());
        let need_buf = self.buf.len() + bytes;
        let need_index = self.index.len() + slots;
        if need_buf <= buf_cap && need_index <= index_cap {
            return Ok(());
        }
        let grow = |cap: usize, need: usize, double: bool| match (need > cap, double) {
            (false, _) => cap,
            (true, true) => need.max(cap.saturating_mul(2)),
            (true, false) => need,
        };
        let mut result = Err(Overflow::Full);
        for double in [true, false] {
            let new_buf = grow(buf_cap, need_buf, double);
            let new_index = grow(index_cap, need_index, double);
            let extra = (new_buf - buf_cap) + (new_index - index_cap) * std::mem::size_of::<u32>();
            result = reserve(&mut self.charge, extra);
            if result.is_ok() {
                self.buf.reserve_exact(new_buf - self.buf.len());
                self.index.reserve_exact(new_index - self.index.len());
                break;
            }
        }
        result?;
        // An allocator giving more than asked is charged too.
        let over = self.memory_size().saturating_sub(self.charge.bytes());
        if over > 0 {
            reserve(&mut self.charge, over)?;
        }
        Ok(())
    }

    /// Appends the `linux_dirent64` records in `raw`, resolving `DT_UNKNOWN` relative to `dir`.
    fn push_raw(&mut self, dir: BorrowedFd<'_>, raw: &[u8]) -> io::Result<()> {
        for rec in Records(raw) {
            let (e, _) = rec?;
            if let Some(dtype) = resolve_type(dir, &e) {
                self.push(e.ino, dtype, e.name)?;
            }
        }
        Ok(())
    }

    /// Appends one record (the room was made by the caller, or the buffers grow uncharged).
    pub(super) fn push(&mut self, ino: u64, dtype: u8, name: &[u8]) -> io::Result<()> {
        let start = u32::try_from(self.buf.len()).map_err(|_| sys::error(libc::EOVERFLOW))?;
        let len = u16::try_from(name.len()).map_err(|_| sys::error(libc::ENAMETOOLONG))?;
        self.buf.extend_from_slice(&ino.to_ne_bytes());
        self.buf.push(dtype);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(name);
        self.buf.push(0);
        self.index.push(start);
        Ok(())
    }

    /// Serves the entries from index `offset` (the offset of the entry before) to `f`, with the
    /// offset to resume after each, until `f` returns `false` or the snapshot ends.
    pub fn serve(
        &self,
        offset: u64,
        f: &mut dyn FnMut(SnapEntry<'_>, u64) -> io::Result<bool>,
    ) -> io::Result<()> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(());
        };
        for i in start..self.len() {
            let Some(e) = self.get(i) else { break };
            if !f(e, i as u64 + 1)? {
                break;
            }
        }
        Ok(())
    }

    /// The entry at index `i` (its READDIR offset is `i + 1`).
    pub fn get(&self, i: usize) -> Option<SnapEntry<'_>> {
        let start = *self.index.get(i)? as usize;
        let rec = self.buf.get(start..)?;
        let header = rec.get(..HEADER)?;
        let ino = u64::from_ne_bytes(header[0..8].try_into().ok()?);
        let dtype = header[8];
        let len = u16::from_ne_bytes(header[9..11].try_into().ok()?) as usize;
        let cname = CStr::from_bytes_with_nul(rec.get(HEADER..=HEADER + len)?).ok()?;
        Some(SnapEntry {
            ino,
            dtype,
            name: cname.to_bytes(),
            cname,
        })
    }
}

/// The `linux_dirent64` records of a `getdents64` buffer: each entry (its type as reported,
/// maybe `DT_UNKNOWN`) with its `d_off`; `EIO` for a malformed record. Empty names are skipped.
struct Records<'a>(&'a [u8]);

impl<'a> Iterator for Records<'a> {
    type Item = io::Result<(SnapEntry<'a>, u64)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let raw = self.0;
            if raw.len() < DIRENT_NAME {
                return None;
            }
            let ino = u64::from_ne_bytes(raw[0..8].try_into().unwrap_or_default());
            let off = u64::from_ne_bytes(raw[8..16].try_into().unwrap_or_default());
            let reclen = u16::from_ne_bytes(raw[16..18].try_into().unwrap_or_default()) as usize;
            if reclen < DIRENT_NAME || reclen > raw.len() {
                self.0 = &[];
                return Some(Err(sys::error(libc::EIO)));
            }
            let dtype = raw[18];
            let name_field = &raw[DIRENT_NAME..reclen];
            self.0 = &raw[reclen..];
            let Some(nul) = name_field.iter().position(|&b| b == 0) else {
                self.0 = &[];
                return Some(Err(sys::error(libc::EIO)));
            };
            if nul == 0 {
                continue;
            }
            let Ok(cname) = CStr::from_bytes_with_nul(&name_field[..=nul]) else {
                self.0 = &[];
                return Some(Err(sys::error(libc::EIO)));
            };
            let e = SnapEntry {
                ino,
                dtype,
                name: cname.to_bytes(),
                cname,
            };
            return Some(Ok((e, off)));
        }
    }
}

/// The type of `e`, an entry of `dir`: as reported, or when that is `DT_UNKNOWN` as `fstatat`
/// finds it; `None` when it has vanished since (or has no type).
fn resolve_type(dir: BorrowedFd<'_>, e: &SnapEntry<'_>) -> Option<u8> {
    if e.dtype != libc::DT_UNKNOWN {
        return Some(e.dtype);
    }
    let st = sys::fstatat(dir, e.cname, libc::AT_SYMLINK_NOFOLLOW).ok()?;
    Some(sys::mode_to_dtype(st.st_mode)).filter(|&t| t != libc::DT_UNKNOWN)
}

/// The size of the `getdents64` buffer for a streamed READDIR whose reply takes `reply` bytes:
/// about as many entries as a reply of plain dirents holds (`plus`: of entries with attributes,
/// five times larger).
pub fn stream_chunk(reply: u32, plus: bool) -> usize {
    let reply = reply as usize;
    let want = if plus { reply / 4 } else { reply };
    want.clamp(STREAM_CHUNK.0, STREAM_CHUNK.1)
}

/// Serves the entries of `dir` (a descriptor opened for reading, which the caller keeps to
/// itself meanwhile) from `cookie` (0: the start; otherwise a `d_off` an entry was served with),
/// reading `chunk` bytes of records at a time, to `f` with the cookie to resume after each, until
/// `f` returns `false` (the entry was not taken) or the directory ends. Types are resolved as in a
/// snapshot; nothing outlives the call. An offset the file system refuses to seek to ends the
/// listing.
pub fn stream(
    dir: BorrowedFd<'_>,
    cookie: u64,
    chunk: usize,
    f: &mut dyn FnMut(SnapEntry<'_>, u64) -> io::Result<bool>,
) -> io::Result<()> {
    // Linux file systems give cookies below 2^63 (a `loff_t`); larger ones are EINVAL.
    match sys::lseek(dir, cookie, libc::SEEK_SET) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(()),
        r => r?,
    };
    let mut raw = vec![0u8; chunk.max(STREAM_CHUNK.0)];
    loop {
        let n = sys::getdents64(dir, &mut raw)?;
        if n == 0 {
            return Ok(());
        }
        for rec in Records(&raw[..n]) {
            let (mut e, off) = rec?;
            let Some(dtype) = resolve_type(dir, &e) else {
                continue;
            };
            e.dtype = dtype;
            if !f(e, off)? {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, OwnedFd};

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        std::fs::File::open(path).unwrap().into()
    }

    fn names(s: &DirSnapshot) -> Vec<Vec<u8>> {
        (0..s.len())
            .map(|i| s.get(i).unwrap().name.to_vec())
            .collect()
    }

    fn raw_dirent(ino: u64, dtype: u8, name: &[u8]) -> Vec<u8> {
        let reclen = (DIRENT_NAME + name.len() + 1 + 7) & !7;
        let mut v = vec![0u8; reclen];
        v[0..8].copy_from_slice(&ino.to_ne_bytes());
        v[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        v[18] = dtype;
        v[DIRENT_NAME..DIRENT_NAME + name.len()].copy_from_slice(name);
        v
    }

    #[test]
    fn snapshot_lists_every_entry_with_its_type() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let dir = open_dir(tmp.path());
        let s = DirSnapshot::read(dir.as_fd(), false, &mut |_, _| Ok(()))
            .unwrap()
            .unwrap();
        let mut got: Vec<(Vec<u8>, u8)> = (0..s.len())
            .map(|i| {
                let e = s.get(i).unwrap();
                (e.name.to_vec(), e.dtype)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (b".".to_vec(), libc::DT_DIR),
                (b"..".to_vec(), libc::DT_DIR),
                (b"file".to_vec(), libc::DT_REG),
                (b"sub".to_vec(), libc::DT_DIR),
            ]
        );
        assert!(s.get(s.len()).is_none());
    }

    #[test]
    fn refill_sees_new_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir(tmp.path());
        let mut s = DirSnapshot::new();
        s.fill(dir.as_fd()).unwrap();
        assert_eq!(s.len(), 2);
        std::fs::write(tmp.path().join("late"), b"").unwrap();
        s.fill(dir.as_fd()).unwrap();
        assert!(names(&s).contains(&b"late".to_vec()));
    }

    #[test]
    fn unknown_types_are_resolved_and_vanished_entries_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        std::os::unix::fs::symlink("nowhere", tmp.path().join("link")).unwrap();
        let dir = open_dir(tmp.path());
        let mut raw = raw_dirent(1, libc::DT_UNKNOWN, b"file");
        raw.extend(raw_dirent(2, libc::DT_UNKNOWN, b"gone"));
        raw.extend(raw_dirent(3, libc::DT_UNKNOWN, b"link"));
        let mut s = DirSnapshot::new();
        s.push_raw(dir.as_fd(), &raw).unwrap();
        assert_eq!(s.len(), 2);
        let first = s.get(0).unwrap();
        assert_eq!(
            (first.ino, first.dtype, first.name),
            (1, libc::DT_REG, &b"file"[..])
        );
        assert_eq!(first.cname, c"file");
        assert_eq!(s.get(1).unwrap().dtype, libc::DT_LNK);
    }

    #[test]
    fn malformed_records_are_eio_not_panics() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir(tmp.path());
        let mut raw = raw_dirent(1, libc::DT_REG, b"x");
        raw[16..18].copy_from_slice(&200u16.to_ne_bytes());
        let mut s = DirSnapshot::new();
        let e = s.push_raw(dir.as_fd(), &raw).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }

    /// Every (name, type, cookie) `stream` serves from `cookie` on, at most `max` entries.
    fn streamed(dir: BorrowedFd<'_>, cookie: u64, max: usize) -> Vec<(Vec<u8>, u8, u64)> {
        let mut out = Vec::new();
        stream(dir, cookie, 1024, &mut |e, off| {
            if out.len() == max {
                return Ok(false);
            }
            out.push((e.name.to_vec(), e.dtype, off));
            Ok(true)
        })
        .unwrap();
        out
    }

    #[test]
    fn a_stream_lists_every_entry_once_and_resumes_at_any_cookie() {
        let tmp = tempfile::tempdir().unwrap();
        let mut expected = vec![
            (b".".to_vec(), libc::DT_DIR),
            (b"..".to_vec(), libc::DT_DIR),
        ];
        for i in 0..300 {
            let name = format!("{i:03}-{}", "n".repeat(i % 60));
            if i % 3 == 0 {
                std::fs::create_dir(tmp.path().join(&name)).unwrap();
                expected.push((name.into_bytes(), libc::DT_DIR));
            } else {
                std::fs::write(tmp.path().join(&name), b"").unwrap();
                expected.push((name.into_bytes(), libc::DT_REG));
            }
        }
        expected.sort();
        let dir = open_dir(tmp.path());
        // In chunks of 7, each resuming at the cookie of the last entry taken.
        let mut all = Vec::new();
        let mut cookie = 0;
        loop {
            let chunk = streamed(dir.as_fd(), cookie, 7);
            let Some(last) = chunk.last() else { break };
            cookie = last.2;
            all.extend(chunk);
        }
        let mut got: Vec<_> = all.iter().map(|(n, t, _)| (n.clone(), *t)).collect();
        got.sort();
        assert_eq!(got, expected, "every entry once, with its type");
        // Any cookie resumes right after its entry, on a fresh descriptor too.
        let fresh = open_dir(tmp.path());
        for i in [0, 1, 57, all.len() - 2] {
            let next = streamed(fresh.as_fd(), all[i].2, 1);
            assert_eq!(next[0].0, all[i + 1].0, "after {i}");
        }
        assert!(streamed(dir.as_fd(), all.last().unwrap().2, 10).is_empty());
        // A cookie the file system refuses ends the listing.
        assert!(streamed(dir.as_fd(), u64::MAX, 10).is_empty());
    }

    #[test]
    fn a_snapshot_is_charged_as_it_grows_and_abandoned_past_its_share() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..2000 {
            std::fs::write(
                tmp.path().join(format!("a-rather-long-file-name-{i:05}")),
                b"",
            )
            .unwrap();
        }
        let dir = open_dir(tmp.path());
        let cache = super::super::dircache::DirCache::<u64>::new(4 << 20);
        let snap = DirSnapshot::read(dir.as_fd(), false, &mut |c, n| cache.reserve(c, n))
            .unwrap()
            .unwrap();
        assert_eq!(snap.len(), 2002);
        assert_eq!(snap.charged(), snap.memory_size());
        assert_eq!(cache.used(), snap.memory_size());
        // Doubling charged more while reading; the rest went back.
        assert!(cache.peak() >= cache.used());
        drop(snap);
        assert_eq!(cache.used(), 0);
        // With a quarter of the budget below its size, the read gives up and keeps nothing.
        let small = super::super::dircache::DirCache::<u64>::new(64 << 10);
        let r = DirSnapshot::read(dir.as_fd(), true, &mut |c, n| small.reserve(c, n)).unwrap();
        assert_eq!(r.unwrap_err(), Overflow::TooBig);
        assert_eq!(small.used(), 0);
        assert!(small.peak() <= 16 << 10);
    }
}
