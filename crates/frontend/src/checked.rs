//! Fallible typed FUSE helpers: the `try_*` methods of [`FuseClient`].
//!
//! The typed helpers of [`FuseClient`] (`lookup`, `read`, ...) panic when the transport or the
//! daemon's reply is broken, which is what a test wants. A tool that drives a daemon it does not
//! trust (the benchmark) must instead report such failures, so each helper here returns a
//! [`FuseResult`]: the outer [`Result`] carries transport and protocol failures (timeouts,
//! malformed replies) as an [`Error`], the inner one the FUSE answer, a value or a positive
//! errno. Every request is laid out here and only here: the panicking helpers unwrap these.
//!
//! ```no_run
//! use virtiofsd_frontend::FsFrontend;
//! use virtiofs_fuse::abi::ROOT_ID;
//!
//! let mut fs = FsFrontend::connect("/tmp/vfsd.sock", 1).unwrap();
//! let mut c = fs.client(0).unwrap();
//! c.try_init().expect("transport").expect("INIT accepted");
//! match c.try_lookup(ROOT_ID, "missing") {
//!     Ok(Ok(entry)) => println!("node {}", entry.nodeid),
//!     Ok(Err(errno)) => println!("errno {errno}"),
//!     Err(e) => eprintln!("daemon misbehaved: {e}"),
//! }
//! ```

use super::error::{Error, FuseResult, Result};
use super::fuse_client::{
    cstr, opcode_name, parse_direntplus, parse_dirents, request_header, DirEntry, DirEntryPlus,
    FuseClient, KernelState, XattrReply, DEFAULT_INIT_FLAGS, DEFAULT_MAX_READAHEAD,
    INIT_COMPAT_MINOR, INIT_MINOR, LINUX_5_4_INIT_FLAGS, PAGE_SIZE,
};
use virtiofs_fuse::abi::{self, opcode, Pod};

fn exact<T: Pod>(op: u32, body: &[u8]) -> Result<T> {
    let size = std::mem::size_of::<T>();
    if body.len() != size {
        return Err(Error::Protocol(format!(
            "{}: reply body is {} bytes, expected {size}",
            opcode_name(op),
            body.len()
        )));
    }
    T::from_prefix(body).ok_or_else(|| Error::Protocol(format!("{}: short body", opcode_name(op))))
}

/// A reply body, refused when longer than the `reply_cap` bytes asked for.
fn checked_body(
    op: u32,
    r: std::result::Result<Vec<u8>, i32>,
    reply_cap: usize,
) -> FuseResult<Vec<u8>> {
    match r {
        Ok(body) if body.len() > reply_cap => Err(Error::Protocol(format!(
            "{}: {}-byte reply body exceeds the {reply_cap} bytes asked for",
            opcode_name(op),
            body.len()
        ))),
        r => Ok(r),
    }
}

impl FuseClient {
    /// Sends a request and waits for its reply; returns the body (at most `reply_cap` bytes) or
    /// the errno.
    pub fn try_call(
        &mut self,
        op: u32,
        nodeid: u64,
        args: &[&[u8]],
        reply_cap: usize,
    ) -> FuseResult<Vec<u8>> {
        let reply = self.request(op, nodeid, args, reply_cap)?;
        checked_body(op, reply.into_result(), reply_cap)
    }

    /// Like [`FuseClient::try_call`], for replies that must be exactly one `T`.
    pub fn try_call_obj<T: Pod>(&mut self, op: u32, nodeid: u64, args: &[&[u8]]) -> FuseResult<T> {
        match self.try_call(op, nodeid, args, std::mem::size_of::<T>())? {
            Ok(body) => exact::<T>(op, &body).map(Ok),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Like [`FuseClient::try_call`], for replies without a body.
    pub fn try_call_empty(&mut self, op: u32, nodeid: u64, args: &[&[u8]]) -> FuseResult<()> {
        match self.try_call(op, nodeid, args, 0)? {
            Ok(body) if !body.is_empty() => Err(Error::Protocol(format!(
                "{}: unexpected {}-byte reply body",
                opcode_name(op),
                body.len()
            ))),
            Ok(_) => Ok(Ok(())),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Like [`FuseClient::try_call`], with request extensions `ext` (whole 8-byte records, see
    /// [`super::fuse_client::secctx_extension`]) after the arguments and `total_extlen` set as
    /// the kernel does.
    pub fn try_call_with_ext(
        &mut self,
        op: u32,
        nodeid: u64,
        args: &[&[u8]],
        ext: &[u8],
        reply_cap: usize,
    ) -> FuseResult<Vec<u8>> {
        assert_eq!(ext.len() % 8, 0, "extensions come in 8-byte units");
        if ext.is_empty() {
            return self.try_call(op, nodeid, args, reply_cap);
        }
        let mut all = args.to_vec();
        all.push(ext);
        let unique = self.next_unique();
        let mut hdr = request_header(unique, op, nodeid, self.ctx(), &all);
        hdr.total_extlen = (ext.len() / 8) as u16;
        let reply = self.request_with_header(hdr, &all, reply_cap)?;
        checked_body(op, reply.into_result(), reply_cap)
    }

    /// Like [`FuseClient::try_call_with_ext`], for replies that must be exactly one `T`.
    pub fn try_call_ext_obj<T: Pod>(
        &mut self,
        op: u32,
        nodeid: u64,
        args: &[&[u8]],
        ext: &[u8],
    ) -> FuseResult<T> {
        match self.try_call_with_ext(op, nodeid, args, ext, std::mem::size_of::<T>())? {
            Ok(body) => exact::<T>(op, &body).map(Ok),
            Err(e) => Ok(Err(e)),
        }
    }

    /// Sends a request that gets no reply (FORGET, BATCH_FORGET) and waits until the device
    /// returned the chain.
    pub fn try_call_no_reply(&mut self, op: u32, nodeid: u64, args: &[&[u8]]) -> Result<()> {
        let t = self.submit(op, nodeid, args, 0)?;
        self.wait(t).map(|_| ())
    }

    // ---- the requests, each laid out here only ---------------------------------------------

    /// FUSE_INIT as a Linux 6.x kernel sends it (see [`FuseClient::init`]).
    pub fn try_init(&mut self) -> FuseResult<abi::InitOut> {
        self.try_init_with(INIT_MINOR, DEFAULT_INIT_FLAGS, DEFAULT_MAX_READAHEAD, true)
    }

    /// FUSE_INIT as Linux 5.4 sends it (see [`FuseClient::init_compat`]).
    pub fn try_init_compat(&mut self) -> FuseResult<abi::InitOut> {
        self.try_init_with(
            INIT_COMPAT_MINOR,
            LINUX_5_4_INIT_FLAGS,
            DEFAULT_MAX_READAHEAD,
            false,
        )
    }

    /// FUSE_INIT with any minor and flags (see [`FuseClient::init_with`]).
    pub fn try_init_with(
        &mut self,
        minor: u32,
        flags: u64,
        max_readahead: u32,
        ext: bool,
    ) -> FuseResult<abi::InitOut> {
        let inc = abi::InitInCompat {
            major: abi::KERNEL_VERSION,
            minor,
            max_readahead,
            flags: flags as u32,
        };
        let inext = abi::InitInExt {
            flags2: (flags >> 32) as u32,
            unused: [0; 11],
        };
        let mut args: Vec<&[u8]> = vec![inc.as_bytes()];
        if ext {
            args.push(inext.as_bytes());
        }
        let size = std::mem::size_of::<abi::InitOut>();
        let body = match self.try_call(opcode::INIT, 0, &args, size)? {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        if body.len() != size && body.len() != 24 {
            return Err(Error::Protocol(format!(
                "INIT: reply body is {} bytes, expected 24 or {size}",
                body.len()
            )));
        }
        let mut full = vec![0u8; size];
        full[..body.len()].copy_from_slice(&body);
        let out = exact::<abi::InitOut>(opcode::INIT, &full)?;
        self.set_init_out(out);
        Ok(Ok(out))
    }

    /// FUSE_DESTROY.
    pub fn try_destroy(&mut self) -> FuseResult<()> {
        self.try_call_empty(opcode::DESTROY, 0, &[])
    }

    /// FUSE_LOOKUP of `name` in `parent`, read as the Linux client reads it: a reply with node
    /// id 0 (a negative entry) is `ENOENT`.
    pub fn try_lookup(&mut self, parent: u64, name: impl AsRef<[u8]>) -> FuseResult<abi::EntryOut> {
        Ok(match self.try_lookup_entry(parent, name)? {
            Ok(e) if e.nodeid == 0 => Err(libc::ENOENT),
            r => r,
        })
    }

    /// FUSE_LOOKUP of `name` in `parent`, with a negative entry (node id 0) as it came.
    pub fn try_lookup_entry(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
    ) -> FuseResult<abi::EntryOut> {
        let n = cstr(name.as_ref());
        self.try_call_obj(opcode::LOOKUP, parent, &[&n])
    }

    /// FUSE_FORGET of `nlookup` references (no reply; waits until the chain came back).
    pub fn try_forget(&mut self, nodeid: u64, nlookup: u64) -> Result<()> {
        let arg = abi::ForgetIn { nlookup };
        self.try_call_no_reply(opcode::FORGET, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_BATCH_FORGET of `(nodeid, nlookup)` pairs (no reply).
    pub fn try_batch_forget(&mut self, forgets: &[(u64, u64)]) -> Result<()> {
        let head = abi::BatchForgetIn {
            count: forgets.len() as u32,
            dummy: 0,
        };
        let mut bytes = Vec::with_capacity(16 * forgets.len());
        for &(nodeid, nlookup) in forgets {
            bytes.extend_from_slice(abi::ForgetOne { nodeid, nlookup }.as_bytes());
        }
        self.try_call_no_reply(opcode::BATCH_FORGET, 0, &[head.as_bytes(), &bytes])
    }

    /// FUSE_GETATTR (with `fh` if given).
    pub fn try_getattr(&mut self, nodeid: u64, fh: Option<u64>) -> FuseResult<abi::AttrOut> {
        let arg = abi::GetattrIn {
            getattr_flags: if fh.is_some() { abi::GETATTR_FH } else { 0 },
            dummy: 0,
            fh: fh.unwrap_or(0),
        };
        self.try_call_obj(opcode::GETATTR, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_SETATTR.
    pub fn try_setattr(&mut self, nodeid: u64, attr: &abi::SetattrIn) -> FuseResult<abi::AttrOut> {
        self.try_call_obj(opcode::SETATTR, nodeid, &[attr.as_bytes()])
    }

    /// FUSE_ACCESS with an `R_OK`/`W_OK`/`X_OK`/`F_OK` mask.
    pub fn try_access(&mut self, nodeid: u64, mask: u32) -> FuseResult<()> {
        let arg = abi::AccessIn { mask, padding: 0 };
        self.try_call_empty(opcode::ACCESS, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_STATFS.
    pub fn try_statfs(&mut self, nodeid: u64) -> FuseResult<abi::Kstatfs> {
        self.try_call_obj(opcode::STATFS, nodeid, &[])
    }

    /// FUSE_READLINK.
    pub fn try_readlink(&mut self, nodeid: u64) -> FuseResult<Vec<u8>> {
        self.try_call(opcode::READLINK, nodeid, &[], PAGE_SIZE)
    }

    /// FUSE_MKDIR (`mode` without `S_IFDIR`, as the kernel sends it).
    pub fn try_mkdir(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        umask: u32,
    ) -> FuseResult<abi::EntryOut> {
        self.try_mkdir_ext(parent, name, mode, umask, &[])
    }

    /// FUSE_MKDIR with request extensions `ext` (may be empty).
    pub fn try_mkdir_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        umask: u32,
        ext: &[u8],
    ) -> FuseResult<abi::EntryOut> {
        let arg = abi::MkdirIn { mode, umask };
        let n = cstr(name.as_ref());
        self.try_call_ext_obj(opcode::MKDIR, parent, &[arg.as_bytes(), &n], ext)
    }

    /// FUSE_MKNOD.
    pub fn try_mknod(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> FuseResult<abi::EntryOut> {
        self.try_mknod_ext(parent, name, mode, rdev, umask, &[])
    }

    /// FUSE_MKNOD with request extensions `ext` (may be empty).
    pub fn try_mknod_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
        umask: u32,
        ext: &[u8],
    ) -> FuseResult<abi::EntryOut> {
        let arg = abi::MknodIn {
            mode,
            rdev,
            umask,
            padding: 0,
        };
        let n = cstr(name.as_ref());
        self.try_call_ext_obj(opcode::MKNOD, parent, &[arg.as_bytes(), &n], ext)
    }

    /// FUSE_SYMLINK: creates `name` in `parent` pointing at `target`.
    pub fn try_symlink(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        target: impl AsRef<[u8]>,
    ) -> FuseResult<abi::EntryOut> {
        self.try_symlink_ext(parent, name, target, &[])
    }

    /// FUSE_SYMLINK with request extensions `ext` (may be empty).
    pub fn try_symlink_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        target: impl AsRef<[u8]>,
        ext: &[u8],
    ) -> FuseResult<abi::EntryOut> {
        let n = cstr(name.as_ref());
        let t = cstr(target.as_ref());
        self.try_call_ext_obj(opcode::SYMLINK, parent, &[&n, &t], ext)
    }

    /// FUSE_LINK: a new name `newname` in `newparent` for `oldnodeid`.
    pub fn try_link(
        &mut self,
        oldnodeid: u64,
        newparent: u64,
        newname: impl AsRef<[u8]>,
    ) -> FuseResult<abi::EntryOut> {
        let arg = abi::LinkIn { oldnodeid };
        let n = cstr(newname.as_ref());
        self.try_call_obj(opcode::LINK, newparent, &[arg.as_bytes(), &n])
    }

    /// FUSE_UNLINK.
    pub fn try_unlink(&mut self, parent: u64, name: impl AsRef<[u8]>) -> FuseResult<()> {
        let n = cstr(name.as_ref());
        self.try_call_empty(opcode::UNLINK, parent, &[&n])
    }

    /// FUSE_RMDIR.
    pub fn try_rmdir(&mut self, parent: u64, name: impl AsRef<[u8]>) -> FuseResult<()> {
        let n = cstr(name.as_ref());
        self.try_call_empty(opcode::RMDIR, parent, &[&n])
    }

    /// FUSE_RENAME.
    pub fn try_rename(
        &mut self,
        olddir: u64,
        oldname: impl AsRef<[u8]>,
        newdir: u64,
        newname: impl AsRef<[u8]>,
    ) -> FuseResult<()> {
        let arg = abi::RenameIn { newdir };
        let o = cstr(oldname.as_ref());
        let n = cstr(newname.as_ref());
        self.try_call_empty(opcode::RENAME, olddir, &[arg.as_bytes(), &o, &n])
    }

    /// FUSE_RENAME2 with `RENAME_*` flags.
    pub fn try_rename2(
        &mut self,
        olddir: u64,
        oldname: impl AsRef<[u8]>,
        newdir: u64,
        newname: impl AsRef<[u8]>,
        flags: u32,
    ) -> FuseResult<()> {
        let arg = abi::Rename2In {
            newdir,
            flags,
            padding: 0,
        };
        let o = cstr(oldname.as_ref());
        let n = cstr(newname.as_ref());
        self.try_call_empty(opcode::RENAME2, olddir, &[arg.as_bytes(), &o, &n])
    }

    /// FUSE_OPEN with `O_*` flags.
    pub fn try_open(&mut self, nodeid: u64, flags: u32) -> FuseResult<abi::OpenOut> {
        self.try_open_with(nodeid, flags, 0)
    }

    /// FUSE_OPEN with `open_flags` (`FUSE_OPEN_KILL_SUIDGID`).
    pub fn try_open_with(
        &mut self,
        nodeid: u64,
        flags: u32,
        open_flags: u32,
    ) -> FuseResult<abi::OpenOut> {
        let arg = abi::OpenIn { flags, open_flags };
        self.try_call_obj(opcode::OPEN, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_CREATE; returns the new entry and the open file.
    pub fn try_create(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        flags: u32,
        mode: u32,
        umask: u32,
    ) -> FuseResult<(abi::EntryOut, abi::OpenOut)> {
        self.try_create_ext(parent, name, flags, mode, umask, 0, &[])
    }

    /// FUSE_CREATE with `open_flags` (`FUSE_OPEN_KILL_SUIDGID`) and request extensions `ext`
    /// (may be empty).
    #[allow(clippy::too_many_arguments)]
    pub fn try_create_ext(
        &mut self,
        parent: u64,
        name: impl AsRef<[u8]>,
        flags: u32,
        mode: u32,
        umask: u32,
        open_flags: u32,
        ext: &[u8],
    ) -> FuseResult<(abi::EntryOut, abi::OpenOut)> {
        let arg = abi::CreateIn {
            flags,
            mode,
            umask,
            open_flags,
        };
        let n = cstr(name.as_ref());
        self.try_create_like(opcode::CREATE, parent, &arg, &n, ext)
    }

    /// FUSE_TMPFILE (sent, like the kernel, with the name "/").
    pub fn try_tmpfile(
        &mut self,
        parent: u64,
        flags: u32,
        mode: u32,
        umask: u32,
    ) -> FuseResult<(abi::EntryOut, abi::OpenOut)> {
        let arg = abi::CreateIn {
            flags,
            mode,
            umask,
            open_flags: 0,
        };
        self.try_create_like(opcode::TMPFILE, parent, &arg, &cstr(b"/"), &[])
    }

    /// FUSE_CREATE or FUSE_TMPFILE with a caller-made `fuse_create_in`, the name (NUL
    /// terminated) and request extensions `ext` (may be empty); returns the new entry and the
    /// open file.
    pub fn try_create_like(
        &mut self,
        op: u32,
        parent: u64,
        arg: &abi::CreateIn,
        name: &[u8],
        ext: &[u8],
    ) -> FuseResult<(abi::EntryOut, abi::OpenOut)> {
        let es = std::mem::size_of::<abi::EntryOut>();
        let os = std::mem::size_of::<abi::OpenOut>();
        let body =
            match self.try_call_with_ext(op, parent, &[arg.as_bytes(), name], ext, es + os)? {
                Ok(b) => b,
                Err(e) => return Ok(Err(e)),
            };
        if body.len() != es + os {
            return Err(Error::Protocol(format!(
                "{}: reply body is {} bytes, expected {}",
                opcode_name(op),
                body.len(),
                es + os
            )));
        }
        Ok(Ok((
            exact::<abi::EntryOut>(op, &body[..es])?,
            exact::<abi::OpenOut>(op, &body[es..])?,
        )))
    }

    /// FUSE_READ of up to `size` bytes at `offset`.
    pub fn try_read(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> FuseResult<Vec<u8>> {
        self.try_read_with(nodeid, &read_in(fh, offset, size))
    }

    /// FUSE_READ with a caller-made `fuse_read_in`.
    pub fn try_read_with(&mut self, nodeid: u64, arg: &abi::ReadIn) -> FuseResult<Vec<u8>> {
        self.try_call(opcode::READ, nodeid, &[arg.as_bytes()], arg.size as usize)
    }

    /// FUSE_WRITE of `data` at `offset`; returns the byte count written.
    pub fn try_write(&mut self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> FuseResult<u32> {
        let arg = abi::WriteIn {
            fh,
            offset,
            size: data.len() as u32,
            ..Default::default()
        };
        self.try_write_with(nodeid, &arg, data)
    }

    /// FUSE_WRITE with a caller-made `fuse_write_in` (its `size` is sent as is).
    pub fn try_write_with(
        &mut self,
        nodeid: u64,
        arg: &abi::WriteIn,
        data: &[u8],
    ) -> FuseResult<u32> {
        let out =
            self.try_call_obj::<abi::WriteOut>(opcode::WRITE, nodeid, &[arg.as_bytes(), data])?;
        Ok(out.map(|o| o.size))
    }

    /// FUSE_FLUSH.
    pub fn try_flush(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> FuseResult<()> {
        let arg = abi::FlushIn {
            fh,
            unused: 0,
            padding: 0,
            lock_owner,
        };
        self.try_call_empty(opcode::FLUSH, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_RELEASE (`flags` are the open flags).
    pub fn try_release(&mut self, nodeid: u64, fh: u64, flags: u32) -> FuseResult<()> {
        self.try_release_with(opcode::RELEASE, nodeid, &release_in(fh, flags))
    }

    /// FUSE_RELEASE or FUSE_RELEASEDIR with a caller-made `fuse_release_in`.
    pub fn try_release_with(
        &mut self,
        op: u32,
        nodeid: u64,
        arg: &abi::ReleaseIn,
    ) -> FuseResult<()> {
        self.try_call_empty(op, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_GETLK: the conflicting lock, or `lk` with type `F_UNLCK`.
    pub fn try_getlk(&mut self, nodeid: u64, lk: &abi::LkIn) -> FuseResult<abi::FileLock> {
        match self.try_call_obj::<abi::LkOut>(opcode::GETLK, nodeid, &[lk.as_bytes()])? {
            Ok(out) => Ok(Ok(out.lk)),
            Err(e) => Ok(Err(e)),
        }
    }

    /// FUSE_SETLK, or FUSE_SETLKW (`wait`), waiting for the reply.
    pub fn try_setlk(&mut self, nodeid: u64, lk: &abi::LkIn, wait: bool) -> FuseResult<()> {
        let op = if wait { opcode::SETLKW } else { opcode::SETLK };
        self.try_call_empty(op, nodeid, &[lk.as_bytes()])
    }

    /// FUSE_FSYNC.
    pub fn try_fsync(&mut self, nodeid: u64, fh: u64, datasync: bool) -> FuseResult<()> {
        self.try_fsync_like(opcode::FSYNC, nodeid, fh, datasync)
    }

    /// FUSE_FSYNCDIR.
    pub fn try_fsyncdir(&mut self, nodeid: u64, fh: u64, datasync: bool) -> FuseResult<()> {
        self.try_fsync_like(opcode::FSYNCDIR, nodeid, fh, datasync)
    }

    /// FUSE_FSYNC or FUSE_FSYNCDIR: one layout.
    fn try_fsync_like(&mut self, op: u32, nodeid: u64, fh: u64, datasync: bool) -> FuseResult<()> {
        let arg = abi::FsyncIn {
            fh,
            fsync_flags: if datasync { abi::FSYNC_FDATASYNC } else { 0 },
            padding: 0,
        };
        self.try_call_empty(op, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_FALLOCATE.
    pub fn try_fallocate(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> FuseResult<()> {
        let arg = abi::FallocateIn {
            fh,
            offset,
            length,
            mode,
            padding: 0,
        };
        self.try_call_empty(opcode::FALLOCATE, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_LSEEK; returns the resulting offset.
    pub fn try_lseek(&mut self, nodeid: u64, fh: u64, offset: u64, whence: u32) -> FuseResult<u64> {
        let arg = abi::LseekIn {
            fh,
            offset,
            whence,
            padding: 0,
        };
        let out = self.try_call_obj::<abi::LseekOut>(opcode::LSEEK, nodeid, &[arg.as_bytes()])?;
        Ok(out.map(|o| o.offset))
    }

    /// FUSE_COPY_FILE_RANGE from `nodeid_in`; returns the byte count copied.
    pub fn try_copy_file_range(
        &mut self,
        nodeid_in: u64,
        arg: &abi::CopyFileRangeIn,
    ) -> FuseResult<u32> {
        let out = self.try_call_obj::<abi::WriteOut>(
            opcode::COPY_FILE_RANGE,
            nodeid_in,
            &[arg.as_bytes()],
        )?;
        Ok(out.map(|o| o.size))
    }

    /// FUSE_OPENDIR.
    pub fn try_opendir(&mut self, nodeid: u64, flags: u32) -> FuseResult<abi::OpenOut> {
        let arg = abi::OpenIn {
            flags,
            open_flags: 0,
        };
        self.try_call_obj(opcode::OPENDIR, nodeid, &[arg.as_bytes()])
    }

    /// FUSE_READDIR or FUSE_READDIRPLUS: one layout, the raw reply body.
    fn try_readdir_raw(
        &mut self,
        op: u32,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> FuseResult<Vec<u8>> {
        let arg = read_in(fh, offset, size);
        self.try_call(op, nodeid, &[arg.as_bytes()], size as usize)
    }

    /// FUSE_READDIR from `offset` with `size` bytes of room; parsed entries.
    pub fn try_readdir(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> FuseResult<Vec<DirEntry>> {
        match self.try_readdir_raw(opcode::READDIR, nodeid, fh, offset, size)? {
            Ok(body) => parse_dirents(&body)
                .map(Ok)
                .map_err(|e| Error::Protocol(format!("READDIR: malformed reply: {e}"))),
            Err(e) => Ok(Err(e)),
        }
    }

    /// FUSE_READDIRPLUS from `offset` with `size` bytes of room; parsed entries.
    pub fn try_readdirplus(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> FuseResult<Vec<DirEntryPlus>> {
        match self.try_readdir_raw(opcode::READDIRPLUS, nodeid, fh, offset, size)? {
            Ok(body) => parse_direntplus(&body)
                .map(Ok)
                .map_err(|e| Error::Protocol(format!("READDIRPLUS: malformed reply: {e}"))),
            Err(e) => Ok(Err(e)),
        }
    }

    /// FUSE_RELEASEDIR.
    pub fn try_releasedir(&mut self, nodeid: u64, fh: u64, flags: u32) -> FuseResult<()> {
        self.try_release_with(opcode::RELEASEDIR, nodeid, &release_in(fh, flags))
    }

    /// FUSE_SETXATTR; uses the extended `fuse_setxattr_in` when INIT negotiated `SETXATTR_EXT`.
    pub fn try_setxattr(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
        value: &[u8],
        flags: u32,
    ) -> FuseResult<()> {
        let ext = self
            .init_out()
            .is_some_and(|i| u64::from(i.flags) & abi::init::SETXATTR_EXT != 0);
        if ext {
            return self.try_setxattr_ext(nodeid, name, value, flags, 0);
        }
        let arg = abi::SetxattrInCompat {
            size: value.len() as u32,
            flags,
        };
        let n = cstr(name.as_ref());
        self.try_call_empty(opcode::SETXATTR, nodeid, &[arg.as_bytes(), &n, value])
    }

    /// FUSE_SETXATTR in the extended format (as after `SETXATTR_EXT`) with `setxattr_flags`
    /// (e.g. `SETXATTR_ACL_KILL_SGID`).
    pub fn try_setxattr_ext(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> FuseResult<()> {
        let arg = abi::SetxattrIn {
            size: value.len() as u32,
            flags,
            setxattr_flags,
            padding: 0,
        };
        let n = cstr(name.as_ref());
        self.try_call_empty(opcode::SETXATTR, nodeid, &[arg.as_bytes(), &n, value])
    }

    /// FUSE_GETXATTR: with `size` 0 the size probe, else the value (at most `size` bytes).
    pub fn try_getxattr(
        &mut self,
        nodeid: u64,
        name: impl AsRef<[u8]>,
        size: u32,
    ) -> FuseResult<XattrReply> {
        let arg = abi::GetxattrIn { size, padding: 0 };
        let n = cstr(name.as_ref());
        self.try_xattr_call(opcode::GETXATTR, nodeid, &[arg.as_bytes(), &n], size)
    }

    /// FUSE_LISTXATTR: with `size` 0 the size probe, else the NUL-separated list.
    pub fn try_listxattr(&mut self, nodeid: u64, size: u32) -> FuseResult<XattrReply> {
        let arg = abi::GetxattrIn { size, padding: 0 };
        self.try_xattr_call(opcode::LISTXATTR, nodeid, &[arg.as_bytes()], size)
    }

    /// GETXATTR or LISTXATTR: a `fuse_getxattr_out` for a size probe, else the bytes.
    fn try_xattr_call(
        &mut self,
        op: u32,
        nodeid: u64,
        args: &[&[u8]],
        size: u32,
    ) -> FuseResult<XattrReply> {
        if size == 0 {
            let out = self.try_call_obj::<abi::GetxattrOut>(op, nodeid, args)?;
            Ok(out.map(|o| XattrReply::Size(o.size)))
        } else {
            let body = self.try_call(op, nodeid, args, size as usize)?;
            Ok(body.map(XattrReply::Data))
        }
    }

    /// FUSE_REMOVEXATTR.
    pub fn try_removexattr(&mut self, nodeid: u64, name: impl AsRef<[u8]>) -> FuseResult<()> {
        let n = cstr(name.as_ref());
        self.try_call_empty(opcode::REMOVEXATTR, nodeid, &[&n])
    }

    /// FUSE_SYNCFS (sent on the root node, like the kernel).
    pub fn try_syncfs(&mut self) -> FuseResult<()> {
        let arg = abi::SyncfsIn { padding: 0 };
        self.try_call_empty(opcode::SYNCFS, abi::ROOT_ID, &[arg.as_bytes()])
    }

    // ---- as the Linux client sends them -----------------------------------------------------

    /// What the `kernel_*` helpers learnt from `ENOSYS` answers so far.
    pub fn kernel_state(&self) -> KernelState {
        self.kernel
    }

    /// Opens a file as the Linux client does: OPEN, unless the daemon answered it with
    /// `ENOSYS` before; on `ENOSYS` (now or before) the file is used with handle 0 and
    /// `FOPEN_KEEP_CACHE`, and [`FuseClient::kernel_release`] sends nothing for it.
    pub fn kernel_open(&mut self, nodeid: u64, flags: u32) -> FuseResult<abi::OpenOut> {
        let no_open = abi::OpenOut {
            fh: 0,
            open_flags: abi::fopen::KEEP_CACHE,
            ..Default::default()
        };
        if self.kernel.no_open {
            return Ok(Ok(no_open));
        }
        match self.try_open(nodeid, flags)? {
            Err(libc::ENOSYS) => {
                self.kernel.no_open = true;
                Ok(Ok(no_open))
            }
            r => Ok(r),
        }
    }

    /// Opens a directory as the Linux client does (see [`FuseClient::kernel_open`]); without
    /// OPENDIR the directory is read with handle 0, `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`.
    pub fn kernel_opendir(&mut self, nodeid: u64, flags: u32) -> FuseResult<abi::OpenOut> {
        let no_open = abi::OpenOut {
            fh: 0,
            open_flags: abi::fopen::KEEP_CACHE | abi::fopen::CACHE_DIR,
            ..Default::default()
        };
        if self.kernel.no_opendir {
            return Ok(Ok(no_open));
        }
        match self.try_opendir(nodeid, flags)? {
            Err(libc::ENOSYS) => {
                self.kernel.no_opendir = true;
                Ok(Ok(no_open))
            }
            r => Ok(r),
        }
    }

    /// FLUSH as the Linux client sends it: not at all once the daemon answered `ENOSYS`.
    pub fn kernel_flush(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> FuseResult<()> {
        if self.kernel.no_flush {
            return Ok(Ok(()));
        }
        match self.try_flush(nodeid, fh, lock_owner)? {
            Err(libc::ENOSYS) => {
                self.kernel.no_flush = true;
                Ok(Ok(()))
            }
            r => Ok(r),
        }
    }

    /// RELEASE as the Linux client sends it: not at all once OPEN was answered `ENOSYS`
    /// (whatever handle CREATE gave).
    pub fn kernel_release(&mut self, nodeid: u64, fh: u64, flags: u32) -> FuseResult<()> {
        if self.kernel.no_open {
            return Ok(Ok(()));
        }
        self.try_release(nodeid, fh, flags)
    }

    /// RELEASEDIR as the Linux client sends it: not at all once OPENDIR was answered `ENOSYS`.
    pub fn kernel_releasedir(&mut self, nodeid: u64, fh: u64, flags: u32) -> FuseResult<()> {
        if self.kernel.no_opendir {
            return Ok(Ok(()));
        }
        self.try_releasedir(nodeid, fh, flags)
    }
}

/// The `fuse_read_in` of READ, READDIR and READDIRPLUS.
fn read_in(fh: u64, offset: u64, size: u32) -> abi::ReadIn {
    abi::ReadIn {
        fh,
        offset,
        size,
        ..Default::default()
    }
}

/// The `fuse_release_in` of RELEASE and RELEASEDIR as the kernel sends it on close.
fn release_in(fh: u64, flags: u32) -> abi::ReleaseIn {
    abi::ReleaseIn {
        fh,
        flags,
        release_flags: 0,
        lock_owner: 0,
    }
}
