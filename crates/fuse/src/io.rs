//! The byte streams a FUSE request is read from and its reply written to.
//!
//! The server is generic over [`Reader`] and [`Writer`]; the vhost-user transport implements them
//! over descriptor chains in guest memory, and [`SliceReader`] / [`VecWriter`] implement them over
//! plain buffers for tests and fuzzing. File data moves between a host fd and the stream without
//! an intermediate copy where the implementation allows it (`preadv`/`pwritev` into guest memory).

use std::cell::RefCell;
use std::io;
use std::os::fd::BorrowedFd;
use std::rc::Rc;

use nix::errno::Errno;

pub use crate::filesystem::{ZeroCopyReader, ZeroCopyWriter};

/// The device-readable part of a request.
pub trait Reader: ZeroCopyReader {
    /// Fills `buf` completely, or fails with `UnexpectedEof` and consumes nothing.
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

/// The device-writable part of a request: where the reply goes.
pub trait Writer: ZeroCopyWriter + Sized {
    /// Writes all of `buf`, or fails with `WriteZero` when there is not enough room.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Bytes written so far through this writer (not counting split-off parts).
    fn bytes_written(&self) -> usize;
    /// Splits off everything after the next `offset` bytes into a new writer; `self` keeps only
    /// those `offset` bytes of room.
    fn split_at(&mut self, offset: usize) -> io::Result<Self>;
}

/// The file offset `done` bytes after `offset`; `EINVAL` past what a file offset holds.
fn file_offset(offset: u64, done: usize) -> io::Result<libc::off_t> {
    offset
        .checked_add(done as u64)
        .and_then(|o| libc::off_t::try_from(o).ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A [`Reader`] over a byte slice.
pub struct SliceReader<'a> {
    buf: &'a [u8],
}

impl<'a> SliceReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        SliceReader { buf }
    }
}

impl ZeroCopyReader for SliceReader<'_> {
    fn write_to_file_at(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        offset: u64,
    ) -> io::Result<usize> {
        let mut done = 0;
        let n = count.min(self.buf.len());
        while done < n {
            let off = file_offset(offset, done)?;
            let ret = match nix::sys::uio::pwrite(fd, &self.buf[done..n], off) {
                Err(Errno::EINTR) => continue,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e.into()),
                Ok(0) => break,
                Ok(ret) => ret,
            };
            done += ret;
        }
        self.buf = &self.buf[done..];
        Ok(done)
    }

    fn remaining(&self) -> usize {
        self.buf.len()
    }
}

impl Reader for SliceReader<'_> {
    fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        if out.len() > self.buf.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let (head, tail) = self.buf.split_at(out.len());
        out.copy_from_slice(head);
        self.buf = tail;
        Ok(())
    }
}

/// A [`Writer`] into a shared in-memory buffer with a fixed capacity. Parts split off with
/// [`Writer::split_at`] write into the same buffer, at their own offsets.
#[derive(Debug)]
pub struct VecWriter {
    buf: Rc<RefCell<Vec<u8>>>,
    /// Absolute start and end of this writer's window in `buf`.
    start: usize,
    end: usize,
    /// Bytes written so far from `start`.
    pos: usize,
}

impl VecWriter {
    pub fn new(cap: usize) -> Self {
        VecWriter {
            buf: Rc::new(RefCell::new(Vec::new())),
            start: 0,
            end: cap,
            pos: 0,
        }
    }

    /// Everything written through this writer and the parts split off it.
    pub fn bytes(&self) -> Vec<u8> {
        self.buf.borrow().clone()
    }

    /// The shared buffer, to read the reply after the writer was handed away.
    pub fn output(&self) -> Rc<RefCell<Vec<u8>>> {
        self.buf.clone()
    }

    fn reserve(&self, n: usize) -> usize {
        let at = self.start + self.pos;
        let mut buf = self.buf.borrow_mut();
        if buf.len() < at + n {
            buf.resize(at + n, 0);
        }
        at
    }
}

impl ZeroCopyWriter for VecWriter {
    fn read_from_file_at(
        &mut self,
        fd: BorrowedFd<'_>,
        count: usize,
        offset: u64,
    ) -> io::Result<usize> {
        let n = count.min(self.remaining());
        let mut tmp = vec![0u8; n];
        let mut got = 0;
        while got < n {
            let off = file_offset(offset, got)?;
            let ret = match nix::sys::uio::pread(fd, &mut tmp[got..], off) {
                Err(Errno::EINTR) => continue,
                Err(_) if got > 0 => break,
                Err(e) => return Err(e.into()),
                Ok(0) => break,
                Ok(ret) => ret,
            };
            got += ret;
        }
        self.write_all(&tmp[..got])?;
        Ok(got)
    }

    fn remaining(&self) -> usize {
        self.end - self.start - self.pos
    }
}

impl Writer for VecWriter {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        if data.len() > self.remaining() {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let at = self.reserve(data.len());
        self.buf.borrow_mut()[at..at + data.len()].copy_from_slice(data);
        self.pos += data.len();
        Ok(())
    }

    fn bytes_written(&self) -> usize {
        self.pos
    }

    fn split_at(&mut self, offset: usize) -> io::Result<Self> {
        let at = (self.start + self.pos)
            .checked_add(offset)
            .filter(|at| *at <= self.end)
            .ok_or(io::ErrorKind::InvalidInput)?;
        let tail = VecWriter {
            buf: self.buf.clone(),
            start: at,
            end: self.end,
            pos: 0,
        };
        self.end = at;
        Ok(tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_reader_read_exact_refuses_short_input_and_consumes_nothing() {
        let mut r = SliceReader::new(&[1, 2, 3]);
        let mut out = [0u8; 4];
        assert!(r.read_exact(&mut out).is_err());
        assert_eq!(ZeroCopyReader::remaining(&r), 3);
    }

    #[test]
    fn vec_writer_refuses_writes_past_capacity() {
        let mut w = VecWriter::new(4);
        w.write_all(&[1, 2, 3]).unwrap();
        assert!(w.write_all(&[4, 5]).is_err());
        assert_eq!(w.bytes(), &[1, 2, 3]);
    }
}
