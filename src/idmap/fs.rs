//! [`MappedFs`]: a [`FileSystem`] that translates uids and gids around another one.
//!
//! Going in (guest → host), the caller's uid, gid and supplementary group in every request's
//! [`Context`] and the owner and group a SETATTR sets are translated. Requests that create a
//! file (MKNOD, MKDIR, SYMLINK, CREATE, TMPFILE, LINK, RENAME with `RENAME_WHITEOUT`) and a
//! SETATTR that sets a `forbid-guest` id are refused with `EPERM` before the inner filesystem is
//! called. Coming back (host → guest), the owner and group of every attribute set the guest
//! receives are translated: GETATTR, SETATTR, LOOKUP, the creating requests, and each
//! READDIRPLUS entry.
//!
//! While any rule is active, the POSIX ACL extended attributes (`system.posix_acl_access`,
//! `system.posix_acl_default`) are refused with `EOPNOTSUPP` and left out of LISTXATTR: an ACL
//! stores raw ids, which would otherwise bypass the translation. `FUSE_POSIX_ACL` is never
//! enabled then.
//!
//! Without rules the wrapper only forwards: each method checks one `Option` and calls the inner
//! filesystem with its arguments untouched. Every method of the trait is forwarded explicitly,
//! so none falls back to the trait's `ENOSYS` defaults.

use std::ffi::CStr;
use std::io;
use std::time::Duration;

use super::Translation;
use crate::filesystem::{
    errno, Context, DirEntry, Entry, FileLock, FileSystem, LateReply, LockKind, Opened, SecCtx,
    SetAttr, XattrReply, ZeroCopyReader, ZeroCopyWriter,
};
use crate::fuse::abi::init;
use crate::migration::{Decoder, Encoder, StateError};

/// The extended attributes that hold POSIX ACLs.
const ACL_XATTRS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];
/// Largest list of extended attribute names (Linux `XATTR_LIST_MAX`).
const XATTR_LIST_MAX: u32 = 65536;
/// `renameat2(2)`'s `RENAME_WHITEOUT`.
pub(super) const RENAME_WHITEOUT: u32 = 1 << 2;

fn is_acl(name: &CStr) -> bool {
    ACL_XATTRS.contains(&name.to_bytes())
}

/// A filesystem that applies a [`Translation`] to the requests it forwards to `F` and to the
/// attributes `F` answers with.
pub struct MappedFs<F: FileSystem> {
    inner: F,
    /// `None` when no rule is given: the fast path.
    map: Option<Box<Translation>>,
}

impl<F: FileSystem> MappedFs<F> {
    /// Wraps `inner`; with an empty `map` the wrapper only forwards.
    pub fn new(inner: F, map: Translation) -> MappedFs<F> {
        let map = if map.is_empty() {
            None
        } else {
            Some(Box::new(map))
        };
        MappedFs { inner, map }
    }

    /// The wrapped filesystem.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Whether any translation rule is active.
    pub fn is_active(&self) -> bool {
        self.map.is_some()
    }

    /// The request's credentials as host ids. A `forbid-guest` id is kept as it is: it only
    /// matters when the caller creates a file (see [`MappedFs::creator`]).
    fn ctx(&self, ctx: &Context) -> Context {
        let Some(m) = &self.map else { return *ctx };
        Context {
            uid: m.uid.to_host(ctx.uid).unwrap_or(ctx.uid),
            gid: m.gid.to_host(ctx.gid).unwrap_or(ctx.gid),
            // A forbidden group is dropped: it would only add permissions.
            supp_group: ctx.supp_group.and_then(|g| m.gid.to_host(g).ok()),
            ..*ctx
        }
    }

    /// The credentials a new file is created with, as host ids; `EPERM` when the caller's uid
    /// or gid is forbidden.
    fn creator(&self, ctx: &Context) -> io::Result<Context> {
        let Some(m) = &self.map else { return Ok(*ctx) };
        let uid = m.uid.to_host(ctx.uid).map_err(|_| errno(libc::EPERM))?;
        let gid = m.gid.to_host(ctx.gid).map_err(|_| errno(libc::EPERM))?;
        Ok(Context {
            uid,
            gid,
            supp_group: ctx.supp_group.and_then(|g| m.gid.to_host(g).ok()),
            ..*ctx
        })
    }

    /// Owner and group of `st` as guest ids.
    fn attr_to_guest(&self, st: &mut libc::stat64) {
        if let Some(m) = &self.map {
            st.st_uid = m.uid.to_guest(st.st_uid);
            st.st_gid = m.gid.to_guest(st.st_gid);
        }
    }

    fn entry_to_guest(&self, mut e: Entry) -> Entry {
        self.attr_to_guest(&mut e.attr);
        e
    }

    fn refuse_acl(&self, name: &CStr) -> io::Result<()> {
        if self.map.is_some() && is_acl(name) {
            Err(errno(libc::EOPNOTSUPP))
        } else {
            Ok(())
        }
    }
}

/// Removes the ACL names from a NUL-separated list of names.
pub(super) fn without_acl_names(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split_inclusive(|&b| b == 0) {
        let bare = name.strip_suffix(&[0]).unwrap_or(name);
        if !ACL_XATTRS.contains(&bare) {
            out.extend_from_slice(name);
        }
    }
    out
}

impl<F: FileSystem> FileSystem for MappedFs<F> {
    fn init(&self, capable: u64) -> io::Result<u64> {
        let want = self.inner.init(capable)?;
        if self.map.is_some() {
            Ok(want & !init::POSIX_ACL)
        } else {
            Ok(want)
        }
    }

    fn destroy(&self) {
        self.inner.destroy()
    }

    // Translation keeps no state of its own: both daemons of a migration are started with the
    // same mapping, and the nodes and handles are the wrapped file system's.
    fn save_state(&self, out: &mut Encoder) -> Result<(), StateError> {
        self.inner.save_state(out)
    }

    fn load_state(&self, input: &mut Decoder<'_>) -> Result<(), StateError> {
        self.inner.load_state(input)
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        let e = self.inner.lookup(&self.ctx(ctx), parent, name)?;
        Ok(self.entry_to_guest(e))
    }

    fn forget(&self, ctx: &Context, inode: u64, count: u64) {
        self.inner.forget(&self.ctx(ctx), inode, count)
    }

    fn batch_forget(&self, ctx: &Context, requests: &[(u64, u64)]) {
        self.inner.batch_forget(&self.ctx(ctx), requests)
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        let (mut st, t) = self.inner.getattr(&self.ctx(ctx), inode, handle)?;
        self.attr_to_guest(&mut st);
        Ok((st, t))
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        attr: SetAttr,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        let Some(m) = &self.map else {
            return self.inner.setattr(ctx, inode, attr, handle);
        };
        let forbidden = |_| errno(libc::EPERM);
        let attr = SetAttr {
            uid: attr
                .uid
                .map(|u| m.uid.to_host(u))
                .transpose()
                .map_err(forbidden)?,
            gid: attr
                .gid
                .map(|g| m.gid.to_host(g))
                .transpose()
                .map_err(forbidden)?,
            ..attr
        };
        let (mut st, t) = self.inner.setattr(&self.ctx(ctx), inode, attr, handle)?;
        self.attr_to_guest(&mut st);
        Ok((st, t))
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        self.inner.readlink(&self.ctx(ctx), inode)
    }

    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: u64,
        name: &CStr,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        let e = self
            .inner
            .symlink(&self.creator(ctx)?, target, parent, name, secctx)?;
        Ok(self.entry_to_guest(e))
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        let e = self
            .inner
            .mknod(&self.creator(ctx)?, parent, name, mode, rdev, umask, secctx)?;
        Ok(self.entry_to_guest(e))
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        let e = self
            .inner
            .mkdir(&self.creator(ctx)?, parent, name, mode, umask, secctx)?;
        Ok(self.entry_to_guest(e))
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.inner.unlink(&self.ctx(ctx), parent, name)
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.inner.rmdir(&self.ctx(ctx), parent, name)
    }

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        // A whiteout is a new device node, created as the caller.
        let ctx = if flags & RENAME_WHITEOUT != 0 {
            self.creator(ctx)?
        } else {
            self.ctx(ctx)
        };
        self.inner
            .rename(&ctx, olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        let e = self
            .inner
            .link(&self.creator(ctx)?, inode, newparent, newname)?;
        Ok(self.entry_to_guest(e))
    }

    fn open(&self, ctx: &Context, inode: u64, flags: u32, fuse_flags: u32) -> io::Result<Opened> {
        self.inner.open(&self.ctx(ctx), inode, flags, fuse_flags)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        flags: u32,
        umask: u32,
        fuse_flags: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<(Entry, Opened)> {
        let (e, o) = self.inner.create(
            &self.creator(ctx)?,
            parent,
            name,
            mode,
            flags,
            umask,
            fuse_flags,
            secctx,
        )?;
        Ok((self.entry_to_guest(e), o))
    }

    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<(Entry, Opened)> {
        let (e, o) = self
            .inner
            .tmpfile(&self.creator(ctx)?, parent, mode, flags, umask, secctx)?;
        Ok((self.entry_to_guest(e), o))
    }

    fn read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        self.inner
            .read(&self.ctx(ctx), inode, handle, w, size, offset)
    }

    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        self.inner
            .write(&self.ctx(ctx), inode, handle, r, size, offset, kill_priv)
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        self.inner.flush(&self.ctx(ctx), inode, handle, lock_owner)
    }

    fn release(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        self.inner.release(&self.ctx(ctx), inode, flags, handle)
    }

    fn getlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        self.inner.getlk(&self.ctx(ctx), inode, handle, owner, lock)
    }

    fn setlk(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        kind: LockKind,
    ) -> io::Result<()> {
        self.inner
            .setlk(&self.ctx(ctx), inode, handle, owner, lock, kind)
    }

    fn setlk_wait(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        kind: LockKind,
        reply: LateReply,
    ) -> io::Result<()> {
        self.inner
            .setlk_wait(&self.ctx(ctx), inode, handle, owner, lock, kind, reply)
    }

    fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.inner.fsync(&self.ctx(ctx), inode, datasync, handle)
    }

    fn opendir(&self, ctx: &Context, inode: u64, flags: u32) -> io::Result<Opened> {
        self.inner.opendir(&self.ctx(ctx), inode, flags)
    }

    fn readdir(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>) -> io::Result<usize>,
    ) -> io::Result<()> {
        self.inner
            .readdir(&self.ctx(ctx), inode, handle, size, offset, add_entry)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        if self.map.is_none() {
            return self
                .inner
                .readdirplus(ctx, inode, handle, size, offset, add_entry);
        }
        let mut translated = |d: DirEntry<'_>, e: Entry| add_entry(d, self.entry_to_guest(e));
        self.inner
            .readdirplus(&self.ctx(ctx), inode, handle, size, offset, &mut translated)
    }

    fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        self.inner.releasedir(&self.ctx(ctx), inode, flags, handle)
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.inner.fsyncdir(&self.ctx(ctx), inode, datasync, handle)
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<libc::statvfs64> {
        self.inner.statfs(&self.ctx(ctx), inode)
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        self.inner.access(&self.ctx(ctx), inode, mask)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        self.refuse_acl(name)?;
        self.inner
            .setxattr(&self.ctx(ctx), inode, name, value, flags, setxattr_flags)
    }

    fn getxattr(
        &self,
        ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.refuse_acl(name)?;
        self.inner.getxattr(&self.ctx(ctx), inode, name, size)
    }

    fn listxattr(&self, ctx: &Context, inode: u64, size: u32) -> io::Result<XattrReply> {
        if self.map.is_none() {
            return self.inner.listxattr(ctx, inode, size);
        }
        // Fetch the whole list, drop the ACL names, then answer as asked.
        let list = match self
            .inner
            .listxattr(&self.ctx(ctx), inode, XATTR_LIST_MAX)?
        {
            XattrReply::Data(list) => without_acl_names(&list),
            // Not a list to filter (the inner filesystem answered with a size anyway).
            XattrReply::Size(n) => return Ok(XattrReply::Size(n)),
        };
        let len = u32::try_from(list.len()).map_err(|_| errno(libc::E2BIG))?;
        if size == 0 {
            Ok(XattrReply::Size(len))
        } else if len > size {
            Err(errno(libc::ERANGE))
        } else {
            Ok(XattrReply::Data(list))
        }
    }

    fn removexattr(&self, ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        self.refuse_acl(name)?;
        self.inner.removexattr(&self.ctx(ctx), inode, name)
    }

    fn fallocate(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
        kill_priv: bool,
    ) -> io::Result<()> {
        self.inner.fallocate(
            &self.ctx(ctx),
            inode,
            handle,
            mode,
            offset,
            length,
            kill_priv,
        )
    }

    fn lseek(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.inner
            .lseek(&self.ctx(ctx), inode, handle, offset, whence)
    }

    fn copy_file_range(
        &self,
        ctx: &Context,
        inode_in: u64,
        handle_in: u64,
        offset_in: u64,
        inode_out: u64,
        handle_out: u64,
        offset_out: u64,
        len: u64,
        flags: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        self.inner.copy_file_range(
            &self.ctx(ctx),
            inode_in,
            handle_in,
            offset_in,
            inode_out,
            handle_out,
            offset_out,
            len,
            flags,
            kill_priv,
        )
    }

    fn syncfs(&self, ctx: &Context, inode: u64) -> io::Result<()> {
        self.inner.syncfs(&self.ctx(ctx), inode)
    }
}
