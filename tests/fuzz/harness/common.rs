//! Shared by the `fuse_server` and `queue_path` targets: a filesystem with fixed answers, an
//! INIT request, and checks on a reply.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use virtiofs_fuse::abi;
use virtiofs_fuse::filesystem::{
    Context, DirEntry, Entry, FileSystem, Opened, SecCtx, SetAttr, XattrReply,
};
use virtiofs_fuse::io::{ZeroCopyReader, ZeroCopyWriter};

/// Answers every request with fixed data: node 2 for any name, three directory entries, a
/// 4 KiB file of `0xAB` bytes for READ, `/dev/null` for WRITE. Anything not listed is ENOSYS.
pub struct FixedFs {
    data: &'static OwnedFd,
    sink: &'static OwnedFd,
}

static FDS: std::sync::OnceLock<(OwnedFd, OwnedFd)> = std::sync::OnceLock::new();

fn st(ino: u64, mode: u32) -> libc::stat64 {
    // SAFETY: stat64 is plain data; all-zero is a valid value.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    st.st_ino = ino;
    st.st_mode = mode;
    st.st_nlink = 1;
    st.st_size = 4096;
    st
}

fn entry(ino: u64) -> Entry {
    Entry {
        inode: ino,
        generation: 1,
        attr: st(ino, libc::S_IFREG | 0o644),
        attr_flags: 0,
        attr_timeout: Duration::from_secs(1),
        entry_timeout: Duration::from_secs(1),
    }
}

const NAMES: [&[u8]; 3] = [b".", b"..", b"file-with-a-longer-name"];

impl FixedFs {
    pub fn new() -> Self {
        let (data, sink) = FDS.get_or_init(Self::fds);
        FixedFs { data, sink }
    }

    fn fds() -> (OwnedFd, OwnedFd) {
        // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"fuzz-data".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: `fd` is a fresh descriptor we own.
        let data: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
        let f = std::fs::File::from(data.try_clone().unwrap());
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xAB; 4096], 0).unwrap();
        let sink = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap()
            .into();
        (data, sink)
    }
}

impl FileSystem for FixedFs {
    fn init(&self, capable: u64) -> io::Result<u64> {
        // Take everything offered, so every negotiated branch is reachable.
        Ok(capable)
    }
    fn lookup(&self, _: &Context, _: u64, name: &CStr) -> io::Result<Entry> {
        if name.to_bytes() == b"missing" {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(entry(2))
    }
    fn getattr(&self, _: &Context, i: u64, _: Option<u64>) -> io::Result<(libc::stat64, Duration)> {
        Ok((st(i, libc::S_IFDIR | 0o755), Duration::from_secs(1)))
    }
    fn setattr(
        &self,
        _: &Context,
        i: u64,
        _: SetAttr,
        _: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        Ok((st(i, libc::S_IFREG | 0o644), Duration::ZERO))
    }
    fn readlink(&self, _: &Context, _: u64) -> io::Result<Vec<u8>> {
        Ok(vec![b'x'; 300])
    }
    fn mkdir(
        &self,
        _: &Context,
        _: u64,
        _: &CStr,
        _: u32,
        _: u32,
        _: &[SecCtx],
    ) -> io::Result<Entry> {
        Ok(entry(3))
    }
    fn create(
        &self,
        _: &Context,
        _: u64,
        _: &CStr,
        _: u32,
        _: u32,
        _: u32,
        _: u32,
        _: &[SecCtx],
    ) -> io::Result<(Entry, Opened)> {
        Ok((
            entry(4),
            Opened {
                handle: Some(7),
                open_flags: 0,
            },
        ))
    }
    fn open(&self, _: &Context, _: u64, _: u32, _: u32) -> io::Result<Opened> {
        Ok(Opened {
            handle: Some(8),
            open_flags: abi::fopen::KEEP_CACHE,
        })
    }
    fn opendir(&self, _: &Context, _: u64, _: u32) -> io::Result<Opened> {
        Ok(Opened::default())
    }
    fn read(
        &self,
        _: &Context,
        _: u64,
        _: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        w.read_from_file_at(self.data.as_fd(), size as usize, offset)
    }
    fn write(
        &self,
        _: &Context,
        _: u64,
        _: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        _: bool,
    ) -> io::Result<usize> {
        r.write_to_file_at(self.sink.as_fd(), size as usize, offset)
    }
    fn readdir(
        &self,
        _: &Context,
        _: u64,
        _: u64,
        _: u32,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> io::Result<usize>,
    ) -> io::Result<()> {
        for (i, n) in NAMES.iter().enumerate().skip(offset.min(8) as usize) {
            let d = DirEntry {
                ino: 10 + i as u64,
                offset: i as u64 + 1,
                type_: u32::from(libc::DT_REG),
                name: n,
            };
            if add(d)? == 0 {
                break;
            }
        }
        Ok(())
    }
    fn readdirplus(
        &self,
        _: &Context,
        _: u64,
        _: u64,
        _: u32,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        for (i, n) in NAMES.iter().enumerate().skip(offset.min(8) as usize) {
            let d = DirEntry {
                ino: 10 + i as u64,
                offset: i as u64 + 1,
                type_: u32::from(libc::DT_DIR),
                name: n,
            };
            if add(d, entry(10 + i as u64))? == 0 {
                break;
            }
        }
        Ok(())
    }
    fn getxattr(&self, _: &Context, _: u64, _: &CStr, size: u32) -> io::Result<XattrReply> {
        if size == 0 {
            Ok(XattrReply::Size(20))
        } else {
            Ok(XattrReply::Data(vec![b'v'; 20]))
        }
    }
    fn listxattr(&self, _: &Context, _: u64, size: u32) -> io::Result<XattrReply> {
        if size == 0 {
            Ok(XattrReply::Size(8))
        } else {
            Ok(XattrReply::Data(b"user.a\0\0".to_vec()))
        }
    }
    fn statfs(&self, _: &Context, _: u64) -> io::Result<libc::statvfs64> {
        // SAFETY: statvfs64 is plain data; all-zero is a valid value.
        Ok(unsafe { std::mem::zeroed() })
    }
    fn lseek(&self, _: &Context, _: u64, _: u64, off: u64, _: u32) -> io::Result<u64> {
        Ok(off)
    }
    fn copy_file_range(
        &self,
        _: &Context,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        _: u64,
        len: u64,
        _: u64,
        _: bool,
    ) -> io::Result<usize> {
        Ok(len as usize)
    }
}

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;

/// An INIT request (protocol 7.`minor`) offering `flags` (with `INIT_EXT`, `flags2` too).
pub fn init_request(minor: u32, flags: u64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&7u32.to_le_bytes()); // major
    body.extend_from_slice(&minor.to_le_bytes());
    body.extend_from_slice(&(1u32 << 20).to_le_bytes()); // max_readahead
    body.extend_from_slice(&((flags as u32) | abi::init::INIT_EXT as u32).to_le_bytes());
    body.extend_from_slice(&((flags >> 32) as u32).to_le_bytes()); // flags2
    body.extend_from_slice(&[0u8; 44]); // unused
    let mut v = Vec::new();
    v.extend_from_slice(&((IN_HEADER + body.len()) as u32).to_le_bytes());
    v.extend_from_slice(&abi::opcode::INIT.to_le_bytes());
    v.extend_from_slice(&1u64.to_le_bytes()); // unique
    v.extend_from_slice(&0u64.to_le_bytes()); // nodeid
    v.extend_from_slice(&[0u8; 16]); // uid gid pid extlen padding
    v.extend_from_slice(&body);
    v
}

/// Checks a reply the server said it wrote (`n` bytes, `n > 0`) into a buffer of `cap` bytes,
/// whose first bytes are `out`.
pub fn check_reply(req: &[u8], out: &[u8], n: usize, cap: usize) {
    assert!(n <= cap, "reply of {n} bytes in a {cap} byte buffer");
    assert!(
        n >= OUT_HEADER,
        "reply of {n} bytes is shorter than a header"
    );
    assert!(
        out.len() >= OUT_HEADER,
        "reply claims {n} bytes but wrote {}",
        out.len()
    );
    let len = u32::from_le_bytes(out[0..4].try_into().unwrap()) as usize;
    let error = i32::from_le_bytes(out[4..8].try_into().unwrap());
    let unique = u64::from_le_bytes(out[8..16].try_into().unwrap());
    assert_eq!(
        len, n,
        "reply header length differs from the returned length"
    );
    assert!(
        (-4095..=0).contains(&error),
        "reply error {error} is not a -errno"
    );
    if error != 0 {
        assert_eq!(n, OUT_HEADER, "an error reply carries a body");
    }
    if req.len() >= IN_HEADER {
        let want = u64::from_le_bytes(req[8..16].try_into().unwrap());
        assert_eq!(unique, want, "reply unique differs from the request's");
    }
}
