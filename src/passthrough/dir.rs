//! Directory listings, served two ways.
//!
//! A snapshot: a whole directory read once with `getdents64` into one compact buffer of
//! records, then served by position. The entry at index `i` carries the offset `i + 1`, so a
//! READDIR at offset `o` resumes at index `o`; offsets stay stable for as long as the snapshot
//! does. A READDIR at offset 0 reads the directory again (a rewind). A snapshot is charged
//! against the listing budget (`dircache`) as it grows; one that does not fit is abandoned.
//!
//! # A snapshot's memory
//! A record is the host inode number (8 bytes, native endian), the `DT_*` type (1), the name's
//! length (1) and the name, without a NUL: 10 bytes and the name. Linux names are at most
//! [`NAME_MAX`] (255) bytes; a file system that reports a longer one gets its directory
//! streamed ([`Overflow::LongName`]), never a truncated name. The NUL a lookup by name needs
//! (READDIRPLUS) is added on the stack as each entry is served.
//!
//! The index is sparse: the start of every [`STRIDE`]th record (a `u32`). Serving from index
//! `o` finds record `o - o % STRIDE` there and steps over at most `STRIDE - 1` records, then
//! walks on: a READDIR costs the entries it serves and at most `STRIDE - 1` more.
//!
//! While a snapshot is read its buffers double as they grow (charged before they are
//! allocated); once it is read to its end they shrink to what the records use and the rest of
//! the charge goes back. A directory of 1,000 entries with 13-byte names then holds about 23.4
//! bytes per entry: 23 of record, 0.25 of index and its share of a fixed [`OVERHEAD`].
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

/// Bytes before the name in a record: inode number (8), type (1), name length (1).
const HEADER: usize = 10;
/// The longest name a record holds (Linux's `NAME_MAX`; the length is one byte).
const NAME_MAX: usize = u8::MAX as usize;
/// Records per index entry: the index holds the start of records 0, `STRIDE`, 2 `STRIDE`...
const STRIDE: usize = 16;

/// Offset of `d_name` in a `struct linux_dirent64`.
const DIRENT_NAME: usize = 19;
/// Bytes charged for a snapshot besides its buffers: the structure, its `Arc` and its place in
/// the cache.
const OVERHEAD: usize = 128;
/// Size of the buffer `getdents64` fills while a snapshot is read.
const READ_CHUNK: usize = 32 * 1024;
/// Smallest and largest buffer `getdents64` fills for one streamed READDIR.
const STREAM_CHUNK: (usize, usize) = (1024, 64 * 1024);

/// One entry as served to a READDIR, from a snapshot or a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapEntry<'a> {
    pub ino: u64,
    /// A `libc::DT_*` value, never `DT_UNKNOWN`.
    pub dtype: u8,
    pub name: &'a [u8],
    /// `name` with its terminating NUL.
    pub cname: &'a CStr,
}

/// One record of a snapshot, as stored (no NUL after the name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub ino: u64,
    /// A `libc::DT_*` value, never `DT_UNKNOWN`.
    pub dtype: u8,
    pub name: &'a [u8],
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
    /// Records back to back: inode number (native endian), type, name length, name.
    buf: Vec<u8>,
    /// Start in `buf` of records 0, [`STRIDE`], 2 [`STRIDE`]...
    index: Vec<u32>,
    /// Records in `buf`.
    len: usize,
    /// What the buffers hold of the listing budget ([`DirSnapshot::memory_size`]).
    charge: Charge,
}

/// A function charging more bytes to a snapshot's [`Charge`], or refusing them.
pub type Reserve<'a> = dyn FnMut(&mut Charge, usize) -> Result<(), Overflow> + 'a;

/// Bytes a record of a `name_len`-byte name takes.
fn record_size(name_len: usize) -> usize {
    HEADER + name_len
}

impl DirSnapshot {
    pub fn new() -> Self {
        DirSnapshot::default()
    }

    /// Reads the whole directory `dir` (a descriptor opened for reading) from its start;
    /// `rewind` when the descriptor was read before (a fresh one is at the start already).
    /// Every byte is charged with `reserve` before it is allocated; when it refuses, or a name is
    /// longer than a record holds, the entries read so far are dropped and the reason returned.
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
        self.len
    }

    /// (Re)reads the whole directory `dir` (a descriptor opened for reading) from its start,
    /// without a budget.
    #[cfg(test)]
    pub fn fill(&mut self, dir: BorrowedFd<'_>) -> io::Result<()> {
        self.buf.clear();
        self.index.clear();
        self.len = 0;
        sys::lseek(dir, 0, libc::SEEK_SET)?;
        self.read_all(dir, &mut |_, _| Ok(()))?
            .map_err(|_| sys::error(libc::ENOMEM))
    }

    /// Appends every entry from the descriptor's current position to its end, charging each
    /// allocation with `reserve` first, then gives the room no record uses back.
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
            if let Err(o) = self.append(dir, &raw[..n], reserve)? {
                return Ok(Err(o));
            }
        }
        self.shrink_to_fit();
        Ok(Ok(()))
    }

    /// Appends the `linux_dirent64` records of one `getdents64` buffer, resolving `DT_UNKNOWN`
    /// relative to `dir`, after charging the room they take; appends nothing when a name is
    /// longer than a record holds.
    fn append(
        &mut self,
        dir: BorrowedFd<'_>,
        raw: &[u8],
        reserve: &mut Reserve<'_>,
    ) -> io::Result<Result<(), Overflow>> {
        // What the records take here (at most: vanished entries are skipped).
        let (mut bytes, mut count) = (0, 0);
        for rec in Dirents(raw) {
            let (e, _) = rec?;
            if e.name.len() > NAME_MAX {
                return Ok(Err(Overflow::LongName));
            }
            bytes += record_size(e.name.len());
            count += 1;
        }
        if let Err(o) = self.make_room(bytes, count, reserve) {
            return Ok(Err(o));
        }
        for rec in Dirents(raw) {
            let (e, _) = rec?;
            if let Some(dtype) = resolve_type(dir, &e) {
                self.push(e.ino, dtype, e.name)?;
            }
        }
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
    /// budget refuses it or a name is longer than a record holds, `Err` when `records` fails.
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
            if name.len() > NAME_MAX {
                return Ok(Err(Overflow::LongName));
            }
            if let Err(o) = snap.make_room(record_size(name.len()), 1, reserve) {
                return Ok(Err(o));
            }
            if snap.push(ino, dtype, name).is_err() {
                // Past what a `u32` index addresses: far more than any budget allows.
                return Ok(Err(Overflow::TooBig));
            }
        }
        snap.shrink_to_fit();
        Ok(Ok(snap))
    }

    /// Makes room for `bytes` more record bytes and `records` more records, charging the
    /// growth: doubled while the budget allows (so that reading stays linear), exact otherwise.
    fn make_room(
        &mut self,
        bytes: usize,
        records: usize,
        reserve: &mut Reserve<'_>,
    ) -> Result<(), Overflow> {
        let (buf_cap, index_cap) = (self.buf.capacity(), self.index.capacity());
        let need_buf = self.buf.len().saturating_add(bytes);
        let need_index = self.len.saturating_add(records).div_ceil(STRIDE);
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
            let extra = (new_buf - buf_cap)
                .saturating_add((new_index - index_cap).saturating_mul(std::mem::size_of::<u32>()));
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

    /// Appends one record (the room was made by the caller, or the buffers grow uncharged).
    /// `ENAMETOOLONG` for a name longer than [`NAME_MAX`], `EINVAL` for one holding a NUL,
    /// `EOVERFLOW` past what the index addresses; nothing is appended then.
    pub(super) fn push(&mut self, ino: u64, dtype: u8, name: &[u8]) -> io::Result<()> {
        let len = u8::try_from(name.len()).map_err(|_| sys::error(libc::ENAMETOOLONG))?;
        if name.contains(&0) {
            return Err(sys::error(libc::EINVAL));
        }
        if self.len % STRIDE == 0 {
            let start = u32::try_from(self.buf.len()).map_err(|_| sys::error(libc::EOVERFLOW))?;
            self.index.push(start);
        }
        self.buf.extend_from_slice(&ino.to_ne_bytes());
        self.buf.push(dtype);
        self.buf.push(len);
        self.buf.extend_from_slice(name);
        self.len += 1;
        Ok(())
    }

    /// The record starting at byte `at` of the buffer, and where the next one starts.
    fn record_at(&self, at: usize) -> Option<(Record<'_>, usize)> {
        let rec = self.buf.get(at..)?;
        let header: &[u8; HEADER] = rec.get(..HEADER)?.try_into().ok()?;
        let ino = u64::from_ne_bytes(header[0..8].try_into().ok()?);
        let len = usize::from(header[9]);
        let name = rec.get(HEADER..HEADER + len)?;
        let r = Record {
            ino,
            dtype: header[8],
            name,
        };
        Some((r, at + HEADER + len))
    }

    /// Where record `i` starts in the buffer: found from the index entry before it, stepping
    /// over at most `STRIDE - 1` records; `None` past the end.
    fn position(&self, i: usize) -> Option<usize> {
        if i >= self.len {
            return None;
        }
        let mut at = *self.index.get(i / STRIDE)? as usize;
        for _ in 0..i % STRIDE {
            at = self.record_at(at)?.1;
        }
        Some(at)
    }

    /// Every record, in order.
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> + '_ {
        let mut at = 0;
        (0..self.len).map_while(move |_| {
            let (r, next) = self.record_at(at)?;
            at = next;
            Some(r)
        })
    }

    /// Serves the entries from index `offset` (the offset of the entry before) to `f`, with the
    /// offset to resume after each, until `f` returns `false` or the snapshot ends. An offset at
    /// or past the end serves nothing.
    pub fn serve(
        &self,
        offset: u64,
        f: &mut dyn FnMut(SnapEntry<'_>, u64) -> io::Result<bool>,
    ) -> io::Result<()> {
        let Some(mut at) = usize::try_from(offset).ok().and_then(|i| self.position(i)) else {
            return Ok(());
        };
        // The name with its NUL, for a lookup by name.
        let mut with_nul = [0u8; NAME_MAX + 1];
        for next in offset + 1..=self.len as u64 {
            let Some((r, after)) = self.record_at(at) else {
                break;
            };
            at = after;
            let n = r.name.len();
            with_nul[..n].copy_from_slice(r.name);
            with_nul[n] = 0;
            let Ok(cname) = CStr::from_bytes_with_nul(&with_nul[..=n]) else {
                break;
            };
            let e = SnapEntry {
                ino: r.ino,
                dtype: r.dtype,
                name: r.name,
                cname,
            };
            if !f(e, next)? {
                break;
            }
        }
        Ok(())
    }
}

/// The `linux_dirent64` records of a `getdents64` buffer: each entry (its type as reported,
/// maybe `DT_UNKNOWN`) with its `d_off`; `EIO` for a malformed record. Empty names are skipped.
struct Dirents<'a>(&'a [u8]);

impl<'a> Iterator for Dirents<'a> {
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
        for rec in Dirents(&raw[..n]) {
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
        s.records().map(|r| r.name.to_vec()).collect()
    }

    /// Every (inode, type, name, offset) `serve` gives from `offset`, at most `max`; checks that
    /// each entry's `cname` is its name with a NUL.
    fn served(s: &DirSnapshot, offset: u64, max: usize) -> Vec<(u64, u8, Vec<u8>, u64)> {
        let mut out = Vec::new();
        s.serve(offset, &mut |e, next| {
            if out.len() == max {
                return Ok(false);
            }
            assert_eq!(e.cname.to_bytes(), e.name);
            out.push((e.ino, e.dtype, e.name.to_vec(), next));
            Ok(true)
        })
        .unwrap();
        out
    }

    /// Appends the raw `linux_dirent64` records `raw` to `s`, without a budget.
    fn append(
        s: &mut DirSnapshot,
        dir: BorrowedFd<'_>,
        raw: &[u8],
    ) -> io::Result<Result<(), Overflow>> {
        s.append(dir, raw, &mut |_, _| Ok(()))
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
        let mut got: Vec<(Vec<u8>, u8)> = s.records().map(|r| (r.name.to_vec(), r.dtype)).collect();
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
        assert_eq!(s.records().count(), s.len());
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
        append(&mut s, dir.as_fd(), &raw).unwrap().unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            served(&s, 0, 10),
            vec![
                (1, libc::DT_REG, b"file".to_vec(), 1),
                (3, libc::DT_LNK, b"link".to_vec(), 2)
            ]
        );
    }

    #[test]
    fn malformed_records_are_eio_not_panics() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir(tmp.path());
        let mut raw = raw_dirent(1, libc::DT_REG, b"x");
        raw[16..18].copy_from_slice(&200u16.to_ne_bytes());
        let mut s = DirSnapshot::new();
        let e = append(&mut s, dir.as_fd(), &raw).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(s.len(), 0);
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
        // The directory is still listed whole, streamed.
        assert_eq!(streamed(dir.as_fd(), 0, usize::MAX).len(), 2002);
    }

    /// A directory holding an empty regular file of each name, and a snapshot of it read
    /// against a budget of its own (also returned).
    fn snapshot_of(names: &[String]) -> (tempfile::TempDir, DirSnapshot, DirCache<u64>) {
        let tmp = tempfile::tempdir().unwrap();
        for n in names {
            std::fs::write(tmp.path().join(n), b"").unwrap();
        }
        let dir = open_dir(tmp.path());
        let cache = DirCache::<u64>::new(64 << 20);
        let snap = DirSnapshot::read(dir.as_fd(), false, &mut |c, n| cache.reserve(c, n))
            .unwrap()
            .unwrap();
        assert_eq!(snap.len(), names.len() + 2);
        (tmp, snap, cache)
    }

    /// Bytes the allocator really holds for the buffers of `s`.
    #[cfg(target_env = "gnu")]
    fn heap_bytes(s: &DirSnapshot) -> usize {
        let usable = |p: *const u8, cap: usize| {
            if cap == 0 {
                return 0;
            }
            // SAFETY: `p` starts a live allocation the system allocator (`malloc`) made for a
            // vector of nonzero capacity, which `s` keeps alive; the call only reads its header.
            unsafe { libc::malloc_usable_size(p.cast_mut().cast()) }
        };
        usable(s.buf.as_ptr(), s.buf.capacity())
            + usable(s.index.as_ptr().cast(), s.index.capacity())
    }

    use super::super::dircache::DirCache;

    #[test]
    fn a_read_snapshot_holds_its_records_and_a_sparse_index_and_nothing_more() {
        let fixed: Vec<String> = (0..1000).map(|i| format!("file-{i:06}.c")).collect();
        // Names of 4 to 63 bytes.
        let mixed: Vec<String> = (0..1000)
            .map(|i| format!("{i:04}{}", "m".repeat(i * 7 % 60)))
            .collect();
        for names in [&fixed, &mixed] {
            let (_tmp, snap, cache) = snapshot_of(names);
            let entries = names.len() + 2;
            let name_bytes: usize = names.iter().map(|n| n.len()).sum::<usize>() + 1 + 2;
            let exact = OVERHEAD + HEADER * entries + name_bytes + entries.div_ceil(STRIDE) * 4;
            assert_eq!(snap.memory_size(), exact, "no slack kept");
            assert_eq!(snap.charged(), exact);
            assert_eq!(cache.used(), exact);
            eprintln!(
                "{} names of {:.1} bytes on average: {:.2} bytes per entry",
                names.len(),
                name_bytes as f64 / entries as f64,
                exact as f64 / names.len() as f64
            );
            // What the allocator holds: the buffers as charged, give or take its rounding
            // (glibc: to 16 bytes, with 8 of header).
            #[cfg(target_env = "gnu")]
            {
                let real = heap_bytes(&snap);
                let buffers = exact - OVERHEAD;
                assert!(
                    real >= buffers && real <= buffers + 2 * 24,
                    "heap {real}, buffers {buffers}"
                );
            }
        }
    }

    #[test]
    fn a_thousand_13_byte_names_take_at_most_24_bytes_each() {
        let names: Vec<String> = (0..1000).map(|i| format!("file-{i:06}.c")).collect();
        assert!(names.iter().all(|n| n.len() == 13));
        let (_tmp, snap, _cache) = snapshot_of(&names);
        let per_entry = snap.memory_size() as f64 / 1000.0;
        assert!(per_entry <= 24.0, "{per_entry:.2} bytes per entry");
    }

    /// Snapshots of `n` entries at every boundary of the index serve, from any offset, the
    /// entries after it with the offsets they always had: index + 1.
    #[test]
    fn every_offset_resumes_after_its_entry_across_the_sparse_index() {
        for n in [0, 1, 15, 16, 17, 32, 50] {
            let names: Vec<Vec<u8>> = (0..n).map(|i| "n".repeat(1 + i % 7).into_bytes()).collect();
            let s = DirSnapshot::from_names(names.clone());
            let expected: Vec<(u64, u8, Vec<u8>, u64)> = names
                .iter()
                .enumerate()
                .map(|(i, name)| (i as u64 + 1, libc::DT_REG, name.clone(), i as u64 + 1))
                .collect();
            let n = n as u64;
            let mut offsets = vec![
                0,
                1,
                15,
                16,
                17,
                31,
                32,
                33,
                n.saturating_sub(1),
                n,
                n + 1,
                u64::from(u32::MAX),
                1 << 32,
                u64::MAX - 1,
                u64::MAX,
            ];
            offsets.extend(0..=n + 1);
            for o in offsets {
                let tail = expected.get(o as usize..).unwrap_or_default();
                assert_eq!(served(&s, o, usize::MAX), tail, "{n} entries, from {o}");
                assert_eq!(
                    served(&s, o, 1),
                    tail.get(..1).unwrap_or_default(),
                    "{n} entries, one from {o}"
                );
            }
            let all: Vec<_> = s.records().map(|r| (r.ino, r.name.to_vec())).collect();
            assert_eq!(all.len() as u64, n);
        }
    }

    #[test]
    fn names_of_1_and_255_bytes_are_kept_whole() {
        let names = vec!["a".to_string(), "b".repeat(254), "c".repeat(255)];
        let (tmp, snap, _cache) = snapshot_of(&names);
        let mut got: Vec<Vec<u8>> = served(&snap, 0, usize::MAX)
            .into_iter()
            .map(|(_, _, n, _)| n)
            .collect();
        got.sort();
        let mut want: Vec<Vec<u8>> = [".", ".."]
            .iter()
            .map(|n| n.to_string())
            .chain(names.iter().cloned())
            .map(String::into_bytes)
            .collect();
        want.sort();
        assert_eq!(got, want);
        // Each served `cname` names the file (READDIRPLUS looks entries up by it).
        let dir = open_dir(tmp.path());
        snap.serve(0, &mut |e, _| {
            sys::fstatat(dir.as_fd(), e.cname, libc::AT_SYMLINK_NOFOLLOW).unwrap();
            Ok(true)
        })
        .unwrap();
        // A migration state's listing of the same names.
        let records: Vec<_> = snap.records().collect();
        let mut it = records.iter();
        let copy = DirSnapshot::collect(
            records.len(),
            || {
                let r = it.next().unwrap();
                Ok::<_, ()>((r.ino, r.dtype, r.name))
            },
            &mut |_, _| Ok(()),
        )
        .unwrap()
        .unwrap();
        assert!(copy.records().eq(snap.records()));
    }

    #[test]
    fn a_name_longer_than_a_record_holds_is_refused_never_cut() {
        let long = vec![b'x'; NAME_MAX + 1];
        let mut s = DirSnapshot::from_names([b"kept".to_vec()]);
        let before = (s.buf.clone(), s.index.clone(), s.len());
        let e = s.push(9, libc::DT_REG, &long).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
        let e = s.push(9, libc::DT_REG, b"a\0b").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert_eq!((s.buf.clone(), s.index.clone(), s.len()), before);
        // From a file system: the whole chunk is refused, and the directory is streamed.
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_dir(tmp.path());
        let mut raw = raw_dirent(1, libc::DT_REG, &[b'y'; NAME_MAX]);
        raw.extend(raw_dirent(2, libc::DT_REG, &long));
        let mut s = DirSnapshot::new();
        assert_eq!(
            append(&mut s, dir.as_fd(), &raw).unwrap(),
            Err(Overflow::LongName)
        );
        assert_eq!(s.len(), 0);
        // From a migration state: refused, and its charge given back.
        let cache = DirCache::<u64>::new(1 << 20);
        let mut names = [&b"fine"[..], &long[..]].into_iter();
        let r = DirSnapshot::collect(
            2,
            || Ok::<_, ()>((1, libc::DT_REG, names.next().unwrap())),
            &mut |c, n| cache.reserve(c, n),
        )
        .unwrap();
        assert_eq!(r.unwrap_err(), Overflow::LongName);
        assert_eq!(cache.used(), 0);
    }
}
