//! The [`FileSystem`] trait for [`PassthroughFs`]: one method per FUSE request, each checking
//! the guest's arguments and calling the helpers of `mod.rs` (node identity, descriptors,
//! listings) and the syscall wrappers of `sys`.

use super::*;

impl FileSystem for PassthroughFs {
    fn init(&self, capable: u64) -> io::Result<u64> {
        let mut want = init::ASYNC_READ
            | init::PARALLEL_DIROPS
            | init::BIG_WRITES
            | init::ATOMIC_O_TRUNC
            | init::MAX_PAGES;
        // In `never` the entries and attributes a READDIRPLUS brings expire at once: plain
        // listings carry four times as many names per request (as the reference's do).
        if self.cfg.readdirplus && self.cfg.cache != CacheMode::Never {
            want |= init::DO_READDIRPLUS;
            // With `always` the guest keeps what a listing brings: every chunk of a listing
            // carries the entries' attributes, not only the first (READDIRPLUS_AUTO would
            // list the rest of a large directory without them, and `ls -l` or `tar` would then
            // look each of those entries up one by one).
            if self.cfg.cache != CacheMode::Always {
                want |= init::READDIRPLUS_AUTO;
            }
        }
        match self.cfg.cache {
            CacheMode::Always => want |= init::CACHE_SYMLINKS,
            CacheMode::Auto => want |= init::AUTO_INVAL_DATA,
            CacheMode::Never | CacheMode::Metadata => {}
        }
        if self.cfg.writeback {
            want |= init::WRITEBACK_CACHE;
        }
        if self.cfg.posix_lock {
            want |= init::POSIX_LOCKS;
        }
        if self.cfg.flock {
            want |= init::FLOCK_LOCKS;
        }
        let locks = want & capable & (init::POSIX_LOCKS | init::FLOCK_LOCKS);
        self.posix_locks_on
            .store(locks & init::POSIX_LOCKS != 0, Ordering::Relaxed);
        self.flock_on
            .store(locks & init::FLOCK_LOCKS != 0, Ordering::Relaxed);
        self.locks
            .set_max_fds(self.cfg.max_lock_fds.min(IoFds::capacity_from_rlimit() / 2));
        // No-open mode: with `--cache=always` the kernel's defaults for a file it did not open
        // (FOPEN_KEEP_CACHE; CACHE_DIR for directories) are what OPEN would answer anyway, so
        // OPEN / OPENDIR / FLUSH / RELEASE round trips are skipped. Not with locks held on the
        // host: they are dropped at FLUSH and RELEASE, which the guest would no longer send.
        let always = self.cfg.cache == CacheMode::Always && locks == 0;
        let no_open = always && capable & init::NO_OPEN_SUPPORT != 0;
        let no_opendir = always && capable & init::NO_OPENDIR_SUPPORT != 0;
        self.no_open.store(no_open, Ordering::Relaxed);
        self.no_opendir.store(no_opendir, Ordering::Relaxed);
        if no_open {
            // The kernel would take O_TRUNC as done by an OPEN it no longer sends; without
            // this flag it truncates with SETATTR instead.
            want &= !init::ATOMIC_O_TRUNC;
        }
        if no_open || no_opendir {
            self.io_fds
                .set_capacity(IoFds::capacity_from_rlimit().min(self.cfg.max_data_fds));
        }
        if self.cfg.announce_submounts {
            want |= init::SUBMOUNTS;
        }
        if self.cfg.allow_mmap && matches!(self.cfg.cache, CacheMode::Never | CacheMode::Metadata) {
            // Files are served with direct I/O; let the guest mmap them all the same.
            want |= init::DIRECT_IO_ALLOW_MMAP;
        }
        if self.as_root {
            // Creations are checked against the caller's groups: ask for the one that matters.
            want |= init::CREATE_SUPP_GROUP;
            // Idmapped mounts: new files belong to the creator's ids as mapped through the
            // mount, which only a daemon that creates as the caller can honour. In that mode
            // the kernel sends no caller ids with other requests, and this file system uses
            // them for nothing but creating (ACCESS is answered by the server without them).
            want |= init::ALLOW_IDMAP;
        }
        want |= self.negotiate_xattr_features(capable)?;
        Ok(want & capable)
    }

    fn save_state(
        &self,
        out: &mut crate::migration::Encoder,
    ) -> Result<(), crate::migration::StateError> {
        self.save_migration_state(out)
    }

    fn load_state(
        &self,
        input: &mut crate::migration::Decoder<'_>,
    ) -> Result<(), crate::migration::StateError> {
        self.load_migration_state(input)
    }

    fn destroy(&self) {
        self.locks.clear();
        self.posix_locks_on.store(false, Ordering::Relaxed);
        self.flock_on.store(false, Ordering::Relaxed);
        self.posix_acl_on.store(false, Ordering::Relaxed);
        self.security_ctx_on.store(false, Ordering::Relaxed);
        self.io_fds.clear();
        self.dircache.clear();
        self.handles.clear();
        self.inodes.clear();
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        check_name(name)?;
        let p = self.inode(parent)?;
        let this = match name.to_bytes() {
            b"." => true,
            b".." => p.id == ROOT_ID,
            _ => false,
        };
        if this {
            if !p.is_dir() {
                return Err(error(libc::ENOTDIR));
            }
            let st = self.stat_node(&p)?;
            if !self.inodes.add_ref(p.id) {
                return Err(error(libc::EBADF));
            }
            return Ok(self.entry(p.id, st));
        }
        if name.to_bytes() == b".." {
            return self.lookup_parent(&p, name);
        }
        match self.do_lookup(&p, name) {
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT) && !self.negative_timeout().is_zero() =>
            {
                Ok(self.negative_entry())
            }
            r => r,
        }
    }

    fn forget(&self, _ctx: &Context, inode: u64, count: u64) {
        let f = self.inodes.forget_deferred(inode, count);
        // Node ids are never reused: once gone, the inode's descriptors can go too (first, so
        // that the cached listing below is the last holder of a no-opendir listing).
        if self.inodes.get(inode).is_none() {
            if self.no_open() || self.no_opendir() {
                self.io_fds.remove(inode);
            }
            self.locks.forget(inode);
        }
        if let Some(dir) = f.dir {
            self.dircache.forget(&dir);
        }
        // After the listing went, so that its pages go back too.
        if f.give_back {
            node::memory::give_back_free_memory();
        }
    }

    fn getattr(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        let data = self.inode(inode)?;
        let st = match handle.and_then(|h| self.handles.get(h, inode).ok()) {
            Some(h) => sys::stat_fd(h.fd())?,
            None => self.stat_node(&data)?,
        };
        Ok((st, self.cfg.attr_timeout))
    }

    fn setattr(
        &self,
        _ctx: &Context,
        inode: u64,
        attr: SetAttr,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.check_writable()?;
        let data = self.inode(inode)?;
        let h = handle.and_then(|h| self.handles.get(h, inode).ok());
        // Kept open until the end: `proc` names it.
        let pfd = self.path_fd(&data)?;
        let proc = ProcName::new(pfd.as_fd().as_raw_fd());

        if let Some(mode) = attr.mode {
            match &h {
                Some(h) => sys::fchmod(h.fd(), mode & 0o7777)?,
                None if data.is_symlink() => return Err(error(libc::EOPNOTSUPP)),
                None => sys::fchmodat(self.proc_self_fd.as_fd(), proc.name(), mode & 0o7777)?,
            }
        }
        if attr.uid.is_some() || attr.gid.is_some() {
            let uid = attr.uid.unwrap_or(u32::MAX);
            let gid = attr.gid.unwrap_or(u32::MAX);
            sys::fchown_fd(pfd.as_fd(), uid, gid)?;
        }
        if let Some(size) = attr.size {
            match &h {
                Some(h) => sys::ftruncate(h.fd(), size)?,
                None => {
                    match data.key.kind() {
                        libc::S_IFREG => {}
                        libc::S_IFDIR => return Err(error(libc::EISDIR)),
                        _ => return Err(error(libc::EINVAL)),
                    }
                    let f = self.open_node(&data, libc::O_WRONLY | libc::O_NONBLOCK)?;
                    sys::ftruncate(f.as_fd(), size)?;
                }
            }
        }
        if attr.atime != SetTime::Omit || attr.mtime != SetTime::Omit {
            let times = [timespec(attr.atime), timespec(attr.mtime)];
            match &h {
                Some(h) => sys::futimens(h.fd(), &times)?,
                None => sys::utimensat(self.proc_self_fd.as_fd(), proc.name(), &times)?,
            }
        }
        if attr.kill_suidgid && attr.mode.is_none() {
            // FATTR_KILL_SUIDGID (--killpriv-v2): the truncation or ownership change was made
            // by a guest caller without CAP_FSETID.
            self.xattrs().kill_priv(self.path_fd(&data)?.as_fd())?;
        } else if attr.size.is_some() || attr.uid.is_some() || attr.gid.is_some() {
            self.xattrs()
                .drop_remapped_capability(self.path_fd(&data)?.as_fd())?;
        }
        Ok((sys::stat_fd(pfd.as_fd())?, self.cfg.attr_timeout))
    }

    fn readlink(&self, _ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        let data = self.inode(inode)?;
        if !data.is_symlink() {
            return Err(error(libc::EINVAL));
        }
        sys::readlink_fd(self.path_fd(&data)?.as_fd())
    }

    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: u64,
        name: &CStr,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<Entry> {
        self.make_node(ctx, parent, name, None, secctx, |dir| {
            sys::symlinkat(target, dir, name)
        })
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
        let mode = (mode & libc::S_IFMT) | self.xattrs().create_mode(mode, umask);
        self.make_node(ctx, parent, name, Some(umask), secctx, |dir| {
            sys::mknodat(dir, name, mode, u64::from(rdev))
        })
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
        let mode = self.xattrs().create_mode(mode, umask);
        self.make_node(ctx, parent, name, Some(umask), secctx, |dir| {
            sys::mkdirat(dir, name, mode)
        })
    }

    fn unlink(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.check_writable()?;
        check_new_name(name)?;
        let p = self.inode(parent)?;
        let dir = self.path_fd(&p)?;
        let dir = dir.as_fd();
        let gone = self.keep_reachable(&p, dir, name);
        sys::unlinkat(dir, name, 0)?;
        if let Some(node) = gone {
            self.bury_if_unreachable(&node);
        }
        Ok(())
    }

    fn rmdir(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.check_writable()?;
        check_new_name(name)?;
        let p = self.inode(parent)?;
        let dir = self.path_fd(&p)?;
        let dir = dir.as_fd();
        let gone = self.keep_reachable(&p, dir, name);
        sys::unlinkat(dir, name, libc::AT_REMOVEDIR)?;
        if let Some(node) = gone {
            self.bury_if_unreachable(&node);
        }
        Ok(())
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
        self.check_writable()?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT) != 0 {
            return Err(error(libc::EINVAL));
        }
        check_new_name(oldname)?;
        check_new_name(newname)?;
        let old = self.inode(olddir)?;
        let new = self.inode(newdir)?;
        let (old_pfd, new_pfd) = (self.path_fd(&old)?, self.path_fd(&new)?);
        let (old_fd, new_fd) = (old_pfd.as_fd(), new_pfd.as_fd());
        // Inodes the guest holds that are reached by name follow the rename.
        let known = |dnode: &InodeData, dir: BorrowedFd<'_>, name: &CStr| {
            let (st, x) = sys::stat_at_mnt(dir, name).ok()?;
            let at = At::Name(dir, name);
            let key = self.nodes().key_at(dnode, &st, &x, at).ok()?;
            let node = self.inodes.find(&key)?;
            self.nodes()
                .same_file(&node, &key, at)
                .ok()?
                .then_some(node)
        };
        let moved = known(&old, old_fd, oldname);
        let (swapped, replaced) = if flags & libc::RENAME_EXCHANGE != 0 {
            (known(&new, new_fd, newname), None)
        } else {
            (None, self.keep_reachable(&new, new_fd, newname))
        };
        sys::renameat2(old_fd, oldname, new_fd, newname, flags)?;
        if let Some(node) = replaced.filter(|r| moved.as_ref().is_none_or(|m| m.id != r.id)) {
            self.bury_if_unreachable(&node);
        }
        if flags & libc::RENAME_WHITEOUT != 0 && self.as_root {
            // The whiteout is a new node and belongs to the caller, like any other creation.
            // It is made as root (switching fsuid would drop CAP_MKNOD) and handed over.
            let invalid = crate::fuse::abi::INVALID_UIDGID;
            if ctx.uid != invalid && ctx.gid != invalid && (ctx.uid, ctx.gid) != (0, 0) {
                sys::fchownat_nofollow(old_fd, oldname, ctx.uid, ctx.gid)?;
            }
        }
        if let Some(m) = moved {
            m.found_at(&new, newname);
        }
        if let Some(s) = swapped {
            s.found_at(&old, oldname);
        }
        Ok(())
    }

    fn link(
        &self,
        _ctx: &Context,
        inode: u64,
        newparent: u64,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.check_writable()?;
        check_new_name(newname)?;
        let src = self.inode(inode)?;
        let np = self.inode(newparent)?;
        if src.is_dir() {
            return Err(error(libc::EPERM));
        }
        // Following the magic link reaches the inode itself (a symlink is linked, not its
        // target) and needs no privilege, unlike `AT_EMPTY_PATH`.
        let src_fd = self.path_fd(&src)?;
        let proc = ProcName::new(src_fd.as_fd().as_raw_fd());
        sys::linkat(
            self.proc_self_fd.as_fd(),
            proc.name(),
            self.path_fd(&np)?.as_fd(),
            newname,
            libc::AT_SYMLINK_FOLLOW,
        )?;
        self.do_lookup(&np, newname)
    }

    fn open(&self, _ctx: &Context, inode: u64, flags: u32, fuse_flags: u32) -> io::Result<Opened> {
        if self.no_open() {
            // The kernel then opens every file itself and sends handle 0 from now on.
            return Err(error(libc::ENOSYS));
        }
        let flags = flags as i32;
        if self.cfg.readonly && flags_write(flags) {
            return Err(error(libc::EROFS));
        }
        let data = self.inode(inode)?;
        check_openable(data.key.kind())?;
        let truncating = flags & libc::O_TRUNC != 0;
        let (file, st) = self.opening(&data, || {
            let file = self.open_node(&data, self.host_open_flags(flags))?;
            // What the file is once opened (a network file system checks at open), for
            // `keep_file_pages`; only `auto` asks.
            let st = match self.cfg.cache == CacheMode::Auto && !truncating {
                true => Some(sys::stat_fd(file.as_fd())?),
                false => None,
            };
            if truncating {
                self.truncated_on_open(file.as_fd(), fuse_flags)?;
            }
            Ok((file, st))
        })?;
        let handle = self.open_handle(&data, HandleData::file(inode, file));
        // Last: nothing may fail once the record of this open is made.
        let keep = match st {
            Some(st) => self.keep_file_pages(&data, &st, truncating),
            None => {
                // Truncated, or not `auto`: nothing to keep at the next open.
                data.set_served(None);
                false
            }
        };
        Ok(Opened {
            handle: Some(handle),
            open_flags: self.file_open_flags(keep),
        })
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
        self.check_writable()?;
        check_new_name(name)?;
        // Past --max-nodes nothing is made that the guest could not be given.
        self.nodes().check_node_limit()?;
        let p = self.inode(parent)?;
        let flags = flags as i32;
        let direct = self.host_open_flags(flags) & libc::O_DIRECT != 0;
        // Always exclusive: an existing name is handled below. O_DIRECT is set after creation
        // (the host may refuse it, and the file must not be created twice).
        let oflags =
            (self.host_open_flags(flags) & !libc::O_DIRECT) | libc::O_CREAT | libc::O_NOFOLLOW;
        let mode = self.xattrs().create_mode(mode, umask);
        let mut tries = 0;
        loop {
            let created = {
                let _creds = credentials::switch_to(self.as_root, ctx)?;
                let pfd = self.path_fd(&p)?;
                let pfd = pfd.as_fd();
                self.xattrs().with_guest_umask(umask, || {
                    sys::openat(pfd, name, oflags | libc::O_EXCL, mode)
                })
            };
            match created {
                Ok(file) => {
                    if self.labels_enabled() && !secctx.is_empty() {
                        if let Err(e) = self.xattrs().label_fd(file.as_fd(), secctx) {
                            log::warn!("security context of a new file refused by the host: {e}");
                            let _ = sys::unlinkat(self.path_fd(&p)?.as_fd(), name, 0);
                            return Err(e);
                        }
                    }
                    return self.register_open(&p, file, Some(name), direct);
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => {}
                Err(e) => return Err(e),
            }
            // The name exists: open it as OPEN would, so that an existing device node, FIFO or
            // socket is never opened on the host.
            match sys::openat(self.path_fd(&p)?.as_fd(), name, open_path_flags(), 0) {
                Ok(path_fd) => {
                    let st = sys::stat_fd(path_fd.as_fd())?;
                    match st.st_mode & libc::S_IFMT {
                        libc::S_IFDIR => return Err(error(libc::EISDIR)),
                        kind => check_openable(kind)?,
                    }
                    let file = self.reopen_fd(path_fd.as_fd(), self.host_open_flags(flags))?;
                    let opened = sys::stat_fd(file.as_fd())?;
                    if (opened.st_dev, opened.st_ino, opened.st_mode & libc::S_IFMT)
                        != (st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT)
                    {
                        return Err(error(libc::ESTALE));
                    }
                    if flags & libc::O_TRUNC != 0 {
                        self.truncated_on_open(file.as_fd(), fuse_flags)?;
                    }
                    return self.register_open(&p, file, Some(name), false);
                }
                // Removed in between: try creating again.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        }
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
        self.check_writable()?;
        let p = self.inode(parent)?;
        let flags = flags as i32;
        let direct = self.host_open_flags(flags) & libc::O_DIRECT != 0;
        let oflags = (self.host_open_flags(flags) & !libc::O_DIRECT) | libc::O_TMPFILE;
        let mode = self.xattrs().create_mode(mode, umask);
        let file = {
            let _creds = credentials::switch_to(self.as_root, ctx)?;
            let pfd = self.path_fd(&p)?;
            let pfd = pfd.as_fd();
            self.xattrs()
                .with_guest_umask(umask, || sys::openat(pfd, c".", oflags, mode))?
        };
        if self.labels_enabled() && !secctx.is_empty() {
            // Unnamed: closing it is all the removal it needs.
            self.xattrs().label_fd(file.as_fd(), secctx)?;
        }
        self.register_open(&p, file, None, direct)
    }

    fn read(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        sys::to_off(offset)?;
        let h = self.file_ref(inode, handle, Access::Read)?;
        // The writer keeps reading until `size` bytes, end of file, or a full reply buffer.
        w.read_from_file_at(h.fd(), size as usize, offset)
    }

    fn write(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        self.check_writable()?;
        sys::to_off(offset)?;
        let h = self.file_ref(inode, handle, Access::Write)?;
        if kill_priv {
            self.xattrs().kill_priv(h.fd())?;
        } else {
            self.xattrs().drop_remapped_capability(h.fd())?;
        }
        // The reader keeps writing until `size` bytes are written or the file refuses more.
        r.write_to_file_at(h.fd(), size as usize, offset)
    }

    fn flush(&self, _ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        if self.no_open() {
            // The kernel stops sending FLUSH (writes went to the host file already).
            return Err(error(libc::ENOSYS));
        }
        // The guest process closed the file: its record locks on it go, as on a local file.
        self.locks.flush(inode, lock_owner);
        let h = self.handles.get(handle, inode)?;
        // Closing a duplicate gives the host file system the close(2) of the guest process
        // (for example NFS flushes on close) while the handle stays open.
        drop(sys::dup(h.fd())?);
        Ok(())
    }

    fn release(&self, _ctx: &Context, inode: u64, _flags: u32, handle: u64) -> io::Result<()> {
        if handle == 0 && self.no_open() {
            // A file made by CREATE before the first OPEN: its descriptor is the inode's.
            return Ok(());
        }
        self.handles.remove(handle, inode)?;
        self.released(inode);
        // The guest's open file is gone: its OFD and flock locks go.
        self.locks.release(inode, handle);
        Ok(())
    }

    fn fsync(&self, _ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        if handle == 0 && self.no_open() {
            let fd = match self.io_fds.get_any(inode) {
                Some(fd) => fd,
                None => self.inode_fd(inode, Access::Read)?,
            };
            return sys::fsync(fd.fd(), datasync);
        }
        let h = self.handles.get(handle, inode)?;
        sys::fsync(h.fd(), datasync)
    }

    fn opendir(&self, _ctx: &Context, inode: u64, _flags: u32) -> io::Result<Opened> {
        if self.no_opendir() {
            // The kernel keeps and caches listings itself (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR)
            // and sends READDIR with handle 0 from now on.
            return Err(error(libc::ENOSYS));
        }
        let data = self.inode(inode)?;
        if !data.is_dir() {
            return Err(error(libc::ENOTDIR));
        }
        let file = self.opening(&data, || {
            self.open_node(&data, libc::O_RDONLY | libc::O_DIRECTORY)
        })?;
        let open_flags = self.dir_open_flags(&data, file.as_fd());
        let handle = self.open_handle(&data, HandleData::dir(inode, file));
        Ok(Opened {
            handle: Some(handle),
            open_flags,
        })
    }

    fn readdir(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>) -> io::Result<usize>,
    ) -> io::Result<()> {
        let data = self.inode(inode)?;
        let chunk = dir::stream_chunk(size, false);
        self.list(&data, handle, offset, chunk, &mut |e, next| {
            let n = add_entry(DirEntry {
                ino: e.ino,
                offset: next,
                type_: u32::from(e.dtype),
                name: e.name,
            })?;
            Ok(n != 0)
        })
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry<'_>, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let parent = self.inode(inode)?;
        let chunk = dir::stream_chunk(size, true);
        let mut emitted = false;
        // Bytes of the reply used so far: an entry that cannot fit is not looked up (a node
        // made for it would be dropped again at once, at every page's end).
        let mut used = 0usize;
        self.list(&parent, handle, offset, chunk, &mut |e, next| {
            if emitted && used + crate::fuse::abi::direntplus_size(e.name.len()) > size as usize {
                return Ok(false);
            }
            let dirent = |type_: u32| DirEntry {
                ino: e.ino,
                offset: next,
                type_,
                name: e.name,
            };
            // An entry with no node id (and no reference): the guest lists its name and type and
            // links nothing.
            let bare = || {
                let mut attr = sys::zeroed_stat();
                attr.st_ino = e.ino;
                attr.st_mode = sys::dtype_to_mode(e.dtype);
                let entry = Entry {
                    inode: 0,
                    generation: 0,
                    attr,
                    attr_flags: 0,
                    attr_timeout: Duration::ZERO,
                    entry_timeout: Duration::ZERO,
                };
                (dirent(u32::from(e.dtype)), entry)
            };
            let (dent, entry) = if e.name == b"." || e.name == b".." {
                // The guest never looks these up.
                bare()
            } else {
                match self.do_lookup(&parent, e.cname) {
                    Ok(entry) => {
                        let t = sys::mode_to_dtype(entry.attr.st_mode);
                        (dirent(u32::from(t)), entry)
                    }
                    // Removed since the listing was read.
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(true),
                    // Past --max-nodes the listing goes on with names alone.
                    Err(err) if err.raw_os_error() == Some(libc::ENFILE) => bare(),
                    Err(_) if emitted => return Ok(false),
                    Err(err) => return Err(err),
                }
            };
            let id = entry.inode;
            match add_entry(dent, entry) {
                Ok(n) if n > 0 => {
                    emitted = true;
                    used += n;
                    Ok(true)
                }
                res => {
                    // Refused (or failed): the guest never saw this reference.
                    if id != 0 {
                        self.inodes.forget(id, 1);
                    }
                    res.map(|_| false)
                }
            }
        })
    }

    fn releasedir(&self, _ctx: &Context, inode: u64, _flags: u32, handle: u64) -> io::Result<()> {
        if handle == 0 && self.no_opendir() {
            return Ok(());
        }
        self.handles.remove(handle, inode)?;
        self.released(inode);
        // The guest's open file is gone: its OFD and flock locks go.
        self.locks.release(inode, handle);
        Ok(())
    }

    fn fsyncdir(&self, _ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        if handle == 0 && self.no_opendir() {
            let data = self.inode(inode)?;
            if !data.is_dir() {
                return Err(error(libc::ENOTDIR));
            }
            let dir = self.open_io(&data, libc::O_RDONLY | libc::O_DIRECTORY)?;
            return sys::fsync(dir.as_fd(), datasync);
        }
        let h = self.handles.get(handle, inode)?;
        sys::fsync(h.fd(), datasync)
    }

    fn statfs(&self, _ctx: &Context, inode: u64) -> io::Result<libc::statvfs64> {
        let data = self.inode(inode)?;
        sys::fstatvfs(self.path_fd(&data)?.as_fd())
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        let data = self.inode(inode)?;
        let st = self.stat_node(&data)?;
        let mask = mask as i32 & (libc::R_OK | libc::W_OK | libc::X_OK);
        if mask == libc::F_OK {
            return Ok(());
        }
        let mode = st.st_mode;
        let root = ctx.uid == 0;
        // Whether owner, group or others (as applicable to the caller) have `bits` (rwx
        // position in the owner triplet).
        let allowed = |owner_bit: u32| {
            (st.st_uid == ctx.uid && mode & owner_bit != 0)
                || (st.st_gid == ctx.gid && mode & (owner_bit >> 3) != 0)
                || mode & (owner_bit >> 6) != 0
        };
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        if mask & libc::R_OK != 0 && !root && !allowed(libc::S_IRUSR) {
            return Err(denied);
        }
        if mask & libc::W_OK != 0 {
            if self.cfg.readonly {
                return Err(error(libc::EROFS));
            }
            if !root && !allowed(libc::S_IWUSR) {
                return Err(denied);
            }
        }
        if mask & libc::X_OK != 0 {
            let root_may = root && (mode & 0o111 != 0 || mode & libc::S_IFMT == libc::S_IFDIR);
            if !root_may && !allowed(libc::S_IXUSR) {
                return Err(denied);
            }
        }
        Ok(())
    }

    fn setxattr(
        &self,
        _ctx: &Context,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        self.xattr_enabled()?;
        self.check_writable()?;
        let data = self.inode(inode)?;
        self.xattrs()
            .set(|| self.path_fd(&data), name, value, flags, setxattr_flags)
    }

    fn getxattr(
        &self,
        _ctx: &Context,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.xattr_enabled()?;
        let data = self.inode(inode)?;
        self.xattrs().get(|| self.path_fd(&data), name, size)
    }

    fn listxattr(&self, _ctx: &Context, inode: u64, size: u32) -> io::Result<XattrReply> {
        self.xattr_enabled()?;
        let data = self.inode(inode)?;
        self.xattrs().list(self.path_fd(&data)?.as_fd(), size)
    }

    fn removexattr(&self, _ctx: &Context, inode: u64, name: &CStr) -> io::Result<()> {
        self.xattr_enabled()?;
        self.check_writable()?;
        let data = self.inode(inode)?;
        self.xattrs().remove(|| self.path_fd(&data), name)
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
        kill_priv: bool,
    ) -> io::Result<()> {
        self.check_writable()?;
        let h = self.file_ref(inode, handle, Access::Write)?;
        self.xattrs().modifying(h.fd(), kill_priv)?;
        sys::fallocate(h.fd(), mode, offset, length)
    }

    fn lseek(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let whence = match whence as i32 {
            w @ (libc::SEEK_SET
            | libc::SEEK_CUR
            | libc::SEEK_END
            | libc::SEEK_DATA
            | libc::SEEK_HOLE) => w,
            _ => return Err(error(libc::EINVAL)),
        };
        let h = self.file_ref(inode, handle, Access::Read)?;
        sys::lseek(h.fd(), offset, whence)
    }

    fn copy_file_range(
        &self,
        _ctx: &Context,
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
        self.check_writable()?;
        let flags = u32::try_from(flags).map_err(|_| error(libc::EINVAL))?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let hin = self.file_ref(inode_in, handle_in, Access::Read)?;
        let hout = self.file_ref(inode_out, handle_out, Access::Write)?;
        self.xattrs().modifying(hout.fd(), kill_priv)?;
        sys::copy_file_range(hin.fd(), offset_in, hout.fd(), offset_out, len, flags)
    }

    fn getlk(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        // A test needs no write access (F_GETLK for a write lock on a read-only descriptor
        // is fine): only the handle is checked.
        self.locks_on(LockKind::Posix)?;
        self.handle_writable(inode, handle)?;
        let req = locks::Req::new(inode, owner, handle, &lock, LockKind::Posix)?;
        let conflict = self.locks.get(&req, || self.lock_test_fd(inode))?;
        Ok(conflict.unwrap_or(FileLock {
            typ: libc::F_UNLCK as u32,
            ..lock
        }))
    }

    fn setlk(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        kind: LockKind,
    ) -> io::Result<()> {
        let req = self.lock_req(inode, handle, owner, &lock, kind)?;
        self.locks.set_known(
            &req,
            || self.lock_fd(inode, handle),
            || self.node_known(inode),
        )
    }

    fn setlk_wait(
        &self,
        _ctx: &Context,
        inode: u64,
        handle: u64,
        owner: u64,
        lock: FileLock,
        kind: LockKind,
        reply: LateReply,
    ) -> io::Result<()> {
        let req = self.lock_req(inode, handle, owner, &lock, kind)?;
        self.locks.wait_known(
            req,
            || self.lock_fd(inode, handle),
            reply,
            || self.node_known(inode),
        )
    }

    fn syncfs(&self, _ctx: &Context, inode: u64) -> io::Result<()> {
        // A node whose file is gone syncs the shared directory's file system (Linux sends the
        // root's node anyway).
        let data = match self.inode(inode) {
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => None,
            r => Some(r?),
        };
        // syncfs(2) needs a real descriptor; regular files and directories are safe to open.
        let opened = match data.as_ref().map(|d| d.key.kind()) {
            Some(libc::S_IFDIR) => data
                .as_ref()
                .and_then(|d| self.open_node(d, libc::O_RDONLY | libc::O_DIRECTORY).ok()),
            Some(libc::S_IFREG) => data
                .as_ref()
                .and_then(|d| self.open_node(d, libc::O_RDONLY | libc::O_NONBLOCK).ok()),
            _ => None,
        };
        let file = match opened {
            Some(f) => f,
            None => {
                let root = self.inode(ROOT_ID)?;
                self.open_node(&root, libc::O_RDONLY | libc::O_DIRECTORY)?
            }
        };
        sys::syncfs(file.as_fd())
    }
}
