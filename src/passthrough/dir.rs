//! Directory snapshots: a whole directory read once with `getdents64` into one compact buffer of
//! (host inode number, `DT_*` type, name) records, then served by index.
//!
//! The entry at index `i` carries the offset `i + 1`, so a READDIR at offset `o` resumes at
//! index `o`; offsets stay stable for as long as the snapshot does. A READDIR at offset 0 reads
//! the directory again (a rewind). Types are resolved at snapshot time: an entry the host file
//! system reports as `DT_UNKNOWN` is stat'ed once, and skipped if it has vanished, so a served
//! entry never has type `DT_UNKNOWN`.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;

use super::sys;

/// Bytes before the name in a record: inode number (8), type (1), name length (2). The name
/// follows with a terminating NUL.
const HEADER: usize = 11;

/// Offset of `d_name` in a `struct linux_dirent64`.
const DIRENT_NAME: usize = 19;

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

/// The entries of a directory as read at one point in time.
#[derive(Debug, Default)]
pub struct DirSnapshot {
    /// Records back to back: inode number, type, name length (native endian), name, NUL.
    buf: Vec<u8>,
    /// Start of each record in `buf`.
    index: Vec<u32>,
}

impl DirSnapshot {
    pub fn new() -> Self {
        DirSnapshot::default()
    }

    /// Reads the whole directory `dir` (a descriptor opened for reading) from its start;
    /// `rewind` when the descriptor was read before (a fresh one is at the start already).
    pub fn read(dir: BorrowedFd<'_>, rewind: bool) -> io::Result<Self> {
        let mut snap = DirSnapshot::new();
        if rewind {
            sys::lseek(dir, 0, libc::SEEK_SET)?;
        }
        snap.read_all(dir)?;
        Ok(snap)
    }

    /// Heap bytes this snapshot holds.
    pub fn memory_size(&self) -> usize {
        self.buf.capacity() + self.index.capacity() * std::mem::size_of::<u32>()
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

    /// (Re)reads the whole directory `dir` (a descriptor opened for reading) from its start.
    #[cfg(test)]
    pub fn fill(&mut self, dir: BorrowedFd<'_>) -> io::Result<()> {
        self.buf.clear();
        self.index.clear();
        sys::lseek(dir, 0, libc::SEEK_SET)?;
        self.read_all(dir)
    }

    /// Appends every entry from the descriptor's current position to its end.
    fn read_all(&mut self, dir: BorrowedFd<'_>) -> io::Result<()> {
        let mut raw = [0u8; 32 * 1024];
        loop {
            let n = sys::getdents64(dir, &mut raw)?;
            if n == 0 {
                break;
            }
            self.push_raw(dir, &raw[..n])?;
        }
        self.buf.shrink_to_fit();
        self.index.shrink_to_fit();
        Ok(())
    }

    /// Appends the `linux_dirent64` records in `raw`, resolving `DT_UNKNOWN` relative to `dir`.
    fn push_raw(&mut self, dir: BorrowedFd<'_>, mut raw: &[u8]) -> io::Result<()> {
        while raw.len() >= DIRENT_NAME {
            let ino = u64::from_ne_bytes(raw[0..8].try_into().unwrap_or_default());
            let reclen = u16::from_ne_bytes(raw[16..18].try_into().unwrap_or_default()) as usize;
            if reclen < DIRENT_NAME || reclen > raw.len() {
                return Err(sys::error(libc::EIO));
            }
            let mut dtype = raw[18];
            let name_field = &raw[DIRENT_NAME..reclen];
            raw = &raw[reclen..];
            let Some(nul) = name_field.iter().position(|&b| b == 0) else {
                return Err(sys::error(libc::EIO));
            };
            let name = &name_field[..nul];
            if name.is_empty() {
                continue;
            }
            if dtype == libc::DT_UNKNOWN {
                let cname = CStr::from_bytes_with_nul(&name_field[..=nul])
                    .map_err(|_| sys::error(libc::EIO))?;
                match sys::fstatat(dir, cname, libc::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => dtype = sys::mode_to_dtype(st.st_mode),
                    // Gone since getdents64 listed it.
                    Err(_) => continue,
                }
                if dtype == libc::DT_UNKNOWN {
                    continue;
                }
            }
            self.push(ino, dtype, name)?;
        }
        Ok(())
    }

    fn push(&mut self, ino: u64, dtype: u8, name: &[u8]) -> io::Result<()> {
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
        let s = DirSnapshot::read(dir.as_fd(), false).unwrap();
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
}
