//! Extended attributes of the passthrough filesystem: the four xattr requests, the
//! `--xattrmap` translation, POSIX ACL gating, security labels of new files, and the removal of
//! a remapped `security.capability` where the host kernel would remove the real one.
//!
//! Every call reaches the file as the name `N` relative to the `/proc/self/fd` directory
//! descriptor, made this thread's working directory for the call ([`super::threadfs`]):
//! following that magic link leads to the inode itself (a symlink is not followed further), so
//! the same path serves every kind of file, no file is opened for I/O, and no absolute path is
//! needed.

use std::borrow::Cow;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use super::sys::{self, error, ProcName};
use super::threadfs;
use super::xattrmap::{ToHost, XattrMap};
use crate::filesystem::{SecCtx, XattrReply};
use crate::fuse::abi::SETXATTR_ACL_KILL_SGID;

/// Largest extended attribute value, and largest list of names (Linux `XATTR_*_MAX`).
const XATTR_MAX: usize = 65536;

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
const CAPABILITY: &CStr = c"security.capability";

fn is_acl(name: &[u8]) -> bool {
    name == ACL_ACCESS || name == ACL_DEFAULT
}

/// The host name `map` gives `security.capability`, when it is another name (the host kernel
/// then no longer removes it by itself).
pub(super) fn remapped_capability(map: Option<&XattrMap>) -> Option<CString> {
    match map?.to_host(CAPABILITY) {
        ToHost::Name(n) if n.as_ref() != CAPABILITY => Some(n.into_owned()),
        _ => None,
    }
}

/// The permission bits of `mode` with set-user-id cleared, and set-group-id cleared when the
/// group may execute; `None` when nothing needs clearing.
pub(super) fn killed_suidgid(mode: u32) -> Option<u32> {
    let mut m = mode & 0o7777;
    if m & libc::S_ISUID != 0 {
        m &= !libc::S_ISUID;
    }
    if m & libc::S_ISGID != 0 && m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    (m != mode & 0o7777).then_some(m)
}

/// The extended-attribute rules of a session, and `/proc/self/fd`, through which every call
/// reaches its file (`PassthroughFs::xattrs` lends them).
pub(super) struct Xattrs<'a> {
    /// `--xattrmap`.
    pub(super) map: Option<&'a XattrMap>,
    /// The host name of `security.capability` when the map renames it
    /// ([`remapped_capability`]).
    pub(super) cap: Option<&'a CStr>,
    /// Whether POSIX ACLs were enabled in this session (`--posix-acl` and the guest agreed).
    pub(super) acl: bool,
    pub(super) proc_self_fd: BorrowedFd<'a>,
}

impl Xattrs<'_> {
    /// The host name of the attribute the guest calls `name`. While POSIX ACLs are not enabled,
    /// ACL attributes are refused (`EOPNOTSUPP`) whichever side names them: the guest would not
    /// enforce them.
    fn host_name<'n>(&self, name: &'n CStr) -> io::Result<Cow<'n, CStr>> {
        if !self.acl && is_acl(name.to_bytes()) {
            return Err(error(libc::EOPNOTSUPP));
        }
        let host = match self.map {
            None => Cow::Borrowed(name),
            Some(map) => match map.to_host(name) {
                ToHost::Name(n) => n,
                ToHost::Denied => return Err(error(libc::EPERM)),
                ToHost::Unsupported => return Err(error(libc::EOPNOTSUPP)),
            },
        };
        if !self.acl && is_acl(host.to_bytes()) {
            return Err(error(libc::EOPNOTSUPP));
        }
        Ok(host)
    }

    /// The NUL-separated host list `raw` as the guest sees it: names translated, hidden ones
    /// (by the map, or ACL names while ACLs are off) left out.
    fn guest_list(&self, raw: &[u8]) -> Vec<u8> {
        let acl = self.acl;
        let mut out = Vec::with_capacity(raw.len());
        for name in raw.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if !acl && is_acl(name) {
                continue;
            }
            let shown = match self.map {
                None => Some(name),
                Some(map) => map.to_guest(name),
            };
            if let Some(g) = shown.filter(|g| acl || !is_acl(g)) {
                out.extend_from_slice(g);
                out.push(0);
            }
        }
        out
    }

    /// Runs `f` with the name that reaches `fd`'s inode from the working directory.
    fn at_fd<T>(
        &self,
        fd: BorrowedFd<'_>,
        f: impl FnOnce(&CStr) -> io::Result<T>,
    ) -> io::Result<T> {
        let proc = ProcName::new(fd.as_raw_fd());
        threadfs::in_dir(self.proc_self_fd, || f(proc.name()))
    }

    /// SETXATTR on the node `node` opens an `O_PATH` descriptor of (asked for once the name
    /// is accepted).
    pub(super) fn set<P: AsFd>(
        &self,
        node: impl FnOnce() -> io::Result<P>,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        let host = self.host_name(name)?;
        let pfd = node()?;
        let fd = pfd.as_fd();
        self.at_fd(fd, |p| sys::setxattr(p, &host, value, flags as i32))?;
        if self.acl && setxattr_flags & SETXATTR_ACL_KILL_SGID != 0 && name.to_bytes() == ACL_ACCESS
        {
            // The guest found the caller neither in the file's group nor holding CAP_FSETID:
            // setting the access ACL drops set-group-id, which the host (where the daemon may
            // hold CAP_FSETID) would keep.
            let st = sys::stat_fd(fd)?;
            if st.st_mode & libc::S_ISGID != 0 {
                let proc = ProcName::new(fd.as_raw_fd());
                let mode = st.st_mode & 0o7777 & !libc::S_ISGID;
                sys::fchmodat(self.proc_self_fd, proc.name(), mode)?;
            }
        }
        Ok(())
    }

    /// GETXATTR (see [`Self::set`] for `node`).
    pub(super) fn get<P: AsFd>(
        &self,
        node: impl FnOnce() -> io::Result<P>,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        let host = match self.host_name(name) {
            // A name the rules refuse does not exist, as far as reading goes.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Err(error(libc::ENODATA)),
            r => r?,
        };
        let pfd = node()?;
        if size == 0 {
            let n = self.at_fd(pfd.as_fd(), |p| sys::getxattr(p, &host, &mut []))?;
            return Ok(XattrReply::Size(n as u32));
        }
        let mut buf = vec![0u8; (size as usize).min(XATTR_MAX)];
        let n = self.at_fd(pfd.as_fd(), |p| sys::getxattr(p, &host, &mut buf))?;
        buf.truncate(n);
        Ok(XattrReply::Data(buf))
    }

    /// LISTXATTR of the file `node` is an `O_PATH` descriptor of.
    pub(super) fn list(&self, node: BorrowedFd<'_>, size: u32) -> io::Result<XattrReply> {
        // The whole list is read and filtered, then answered as asked: the size the guest is
        // told is the size of the list it gets.
        let mut buf = vec![0u8; XATTR_MAX];
        let n = self.at_fd(node, |p| sys::listxattr(p, &mut buf))?;
        let list = self.guest_list(&buf[..n]);
        let len = u32::try_from(list.len()).map_err(|_| error(libc::E2BIG))?;
        if size == 0 {
            Ok(XattrReply::Size(len))
        } else if len > size {
            Err(error(libc::ERANGE))
        } else {
            Ok(XattrReply::Data(list))
        }
    }

    /// REMOVEXATTR (see [`Self::set`] for `node`).
    pub(super) fn remove<P: AsFd>(
        &self,
        node: impl FnOnce() -> io::Result<P>,
        name: &CStr,
    ) -> io::Result<()> {
        let host = self.host_name(name)?;
        self.at_fd(node()?.as_fd(), |p| sys::removexattr(p, &host))
    }

    /// Sets the security contexts `secctx` on a file just created, open as `file`; the host
    /// names follow `--xattrmap`.
    pub(super) fn label_fd(&self, file: BorrowedFd<'_>, secctx: &[SecCtx<'_>]) -> io::Result<()> {
        for c in secctx {
            let host = self.host_name(c.name)?;
            sys::fsetxattr(file, &host, c.value, 0)?;
        }
        Ok(())
    }

    /// As [`Self::label_fd`] for a file reached by an `O_PATH` descriptor (any kind of file).
    pub(super) fn label_path_fd(
        &self,
        path_fd: BorrowedFd<'_>,
        secctx: &[SecCtx<'_>],
    ) -> io::Result<()> {
        for c in secctx {
            let host = self.host_name(c.name)?;
            self.at_fd(path_fd, |p| sys::setxattr(p, &host, c.value, 0))?;
        }
        Ok(())
    }

    /// Removes the remapped `security.capability` from a regular file about to be written,
    /// truncated or given away, as the host kernel does with the real one (see
    /// [`remapped_capability`]).
    pub(super) fn drop_remapped_capability(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let Some(cap) = self.cap else {
            return Ok(());
        };
        if sys::stat_fd(fd)?.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        match self.at_fd(fd, |p| sys::removexattr(p, cap)) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => Ok(()),
            r => r,
        }
    }

    /// Clears set-user-id and set-group-id (when group-executable) of the regular file `fd`
    /// refers to, and its remapped capability, as the host kernel does for a caller without
    /// `CAP_FSETID` (`--killpriv-v2`). A daemon without the right to change the mode is no
    /// more privileged than that caller: the host kernel clears the bits itself then.
    pub(super) fn kill_priv(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let st = sys::stat_fd(fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        if let Some(m) = killed_suidgid(st.st_mode) {
            let proc = ProcName::new(fd.as_raw_fd());
            match sys::fchmodat(self.proc_self_fd, proc.name(), m) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                r => r?,
            }
        }
        self.drop_remapped_capability(fd)
    }

    /// Before the file `fd` is changed by FALLOCATE or COPY_FILE_RANGE: clears its set-id
    /// bits and capability when `kill_priv` (`--killpriv-v2` agreed, see [`Self::kill_priv`]),
    /// and otherwise its remapped capability only (the host kernel drops the real one, the guest
    /// kernel has cleared the bits itself).
    pub(super) fn modifying(&self, fd: BorrowedFd<'_>, kill_priv: bool) -> io::Result<()> {
        if kill_priv {
            self.kill_priv(fd)
        } else {
            self.drop_remapped_capability(fd)
        }
    }

    /// The creation `make` (a syscall on the parent), with the guest's `umask` applied by the
    /// host kernel when POSIX ACLs are enabled: it uses the umask only when the parent has no
    /// default ACL. Without ACLs `mode` was masked by the guest already.
    pub(super) fn with_guest_umask<T>(&self, umask: u32, make: impl FnOnce() -> T) -> T {
        if self.acl {
            threadfs::with_umask(umask, make)
        } else {
            make()
        }
    }

    /// The mode to create with: as sent when ACLs are enabled (the host applies the umask),
    /// masked with the umask otherwise.
    pub(super) fn create_mode(&self, mode: u32, umask: u32) -> u32 {
        if self.acl {
            mode & 0o7777
        } else {
            mode & !umask & 0o7777
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filesystem::FileSystem;
    use crate::fuse::abi::ROOT_ID;
    use crate::passthrough::PassthroughFs;
    use crate::passthrough::{CacheMode, Config};
    use std::ffi::CString;

    fn fs_on(dir: &std::path::Path) -> PassthroughFs {
        let mut cfg = Config::new(dir, CacheMode::Auto);
        cfg.xattr = true;
        cfg.xattrmap =
            Some(XattrMap::parse(":prefix:all:trusted.:trusted.vm.: :ok:all:::").unwrap());
        PassthroughFs::new(cfg).unwrap()
    }

    fn ctx() -> crate::filesystem::Context {
        crate::filesystem::Context::default()
    }

    /// The size of the host attribute `name` of `p` (not following a symlink), if any.
    fn host_size(p: &std::path::Path, name: &CStr) -> Option<isize> {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated strings; a size probe with no buffer.
        let n = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        (n >= 0).then_some(n)
    }

    /// Hides `/proc` from the calling thread: its own mount namespace with an empty tmpfs on
    /// `/proc`. `false` when that is not permitted (not root).
    fn hide_proc() -> bool {
        // SAFETY: plain system calls on literal, NUL-terminated strings; results checked.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return false;
            }
            let none = std::ptr::null();
            assert_eq!(
                libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    none.cast()
                ),
                0
            );
            assert_eq!(
                libc::mount(
                    c"none".as_ptr(),
                    c"/proc".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    none.cast()
                ),
                0
            );
        }
        true
    }

    #[test]
    fn xattrs_of_every_kind_of_file_work_without_proc_mounted() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        std::fs::create_dir(d.path().join("d")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("l")).unwrap();
        let fifo = CString::new(d.path().join("p").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; checked.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let fs = fs_on(d.path());
        let path = d.path().to_owned();
        std::thread::spawn(move || {
            if !hide_proc() {
                eprintln!("skipped: hiding /proc needs CAP_SYS_ADMIN");
                return;
            }
            assert!(
                !std::path::Path::new("/proc/self/fd").exists(),
                "/proc still there"
            );
            for name in ["f", "d", "l", "p"] {
                let cname = CString::new(name).unwrap();
                let e = fs.lookup(&ctx(), ROOT_ID, &cname).unwrap();
                fs.setxattr(&ctx(), e.inode, c"trusted.t", b"v", 0, 0)
                    .unwrap_or_else(|err| panic!("{name}: {err}"));
                let Ok(XattrReply::Data(v)) = fs.getxattr(&ctx(), e.inode, c"trusted.t", 16) else {
                    panic!("{name}: getxattr")
                };
                assert_eq!(v, b"v");
                let Ok(XattrReply::Data(l)) = fs.listxattr(&ctx(), e.inode, 256) else {
                    panic!("{name}: listxattr")
                };
                assert_eq!(l, b"trusted.t\0", "{name}");
                // The host name followed the map.
                assert_eq!(
                    host_size(&path.join(name), c"trusted.vm.trusted.t"),
                    Some(1)
                );
                fs.removexattr(&ctx(), e.inode, c"trusted.t").unwrap();
                assert_eq!(host_size(&path.join(name), c"trusted.vm.trusted.t"), None);
            }
        })
        .join()
        .unwrap();
    }
}
