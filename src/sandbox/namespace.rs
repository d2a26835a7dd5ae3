//! The confinement steps of `--sandbox=namespace` and `--sandbox=chroot`, through `nix`.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

/// A confinement step that failed, with the path it worked on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create {what}")]
    Unshare {
        what: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot write /proc/self/{file}")]
    IdentityMap {
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot open {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot make the mounts of the new mount namespace slaves")]
    MakeSlave(#[source] Errno),
    #[error("cannot mount a procfs (subset=pid) for the new pid namespace")]
    MountProc(#[source] Errno),
    #[error(
        "cannot mount a procfs (subset=pid) for the new pid namespace (the subset=pid option \
         needs Linux 5.8 or later; the sandbox does not fall back to a procfs that shows \
         system-wide files)"
    )]
    ProcSubsetUnknown(#[source] Errno),
    #[error("cannot bind-mount {} onto itself", .path.display())]
    BindMount {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read the mount flags of {}", .path.display())]
    MountFlags {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot remount {} nodev", .path.display())]
    RemountNodev {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot read /proc/self/mountinfo")]
    MountInfo(#[source] io::Error),
    #[error("{} is not a mount point after the bind mount", .0.display())]
    NotAMountPoint(PathBuf),
    #[error("cannot change directory to {}", .path.display())]
    Chdir {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot pivot_root into {}", .path.display())]
    PivotRoot {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot detach the old root")]
    DetachOldRoot(#[source] Errno),
    #[error("cannot chroot into {}", .path.display())]
    Chroot {
        path: PathBuf,
        #[source]
        source: Errno,
    },
}

/// `unshare(2)` with `flags`; `what` names the namespaces in the error.
pub fn unshare(flags: CloneFlags, what: &'static str) -> Result<(), Error> {
    nix::sched::unshare(flags).map_err(|source| Error::Unshare { what, source })
}

/// Moves the calling (single-threaded) process into a new user namespace in which its own uid
/// and gid map to themselves, so that an unprivileged daemon may create the other namespaces;
/// files keep the owners they have outside. Supplementary groups are denied in it (the kernel
/// requires that before an unprivileged gid map).
pub fn enter_identity_user_namespace() -> Result<(), Error> {
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    unshare(CloneFlags::CLONE_NEWUSER, "a user namespace")?;
    let write = |file: &'static str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|source| Error::IdentityMap { file, source })
    };
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("setgroups", "deny\n".into())?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// Opens `path` as an `O_PATH` directory descriptor.
fn open_path_dir(path: &Path) -> Result<OwnedFd, Error> {
    crate::os::open_path_dir(path).map_err(|source| Error::Open {
        path: path.to_path_buf(),
        source,
    })
}

/// `mount(2)` without a source or file system type: a change of `target`'s mount.
fn remount(target: &Path, flags: MsFlags) -> nix::Result<()> {
    nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
}

fn chdir(path: &Path) -> Result<(), Error> {
    nix::unistd::chdir(path).map_err(|source| Error::Chdir {
        path: path.to_path_buf(),
        source,
    })
}

/// The options of the procfs the sandbox mounts: only the directories of processes (and
/// `self`, `thread-self`), so that neither `/proc/sys` nor `/proc/sysrq-trigger` nor any other
/// system-wide file exists in it (Linux 5.8 and later). Which processes it shows is already
/// limited by the new pid namespace, in which the daemon is alone (no `hidepid` needed).
pub const PROC_OPTIONS: &CStr = c"subset=pid";

/// Mounts a procfs of the calling process's pid namespace on `target` with
/// [`PROC_OPTIONS`]. Never falls back to another procfs: when this one cannot be mounted, the
/// sandbox does not start.
fn mount_fresh_proc(target: &Path) -> Result<(), Error> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME;
    nix::mount::mount(
        Some("proc"),
        target,
        Some("proc"),
        flags,
        Some(PROC_OPTIONS),
    )
    .map_err(|e| match e {
        Errno::EINVAL => Error::ProcSubsetUnknown(e),
        e => Error::MountProc(e),
    })
}

/// `ST_NOSYMFOLLOW` of `statvfs(3)`'s `f_flag` (`linux/statfs.h`), which neither `libc` nor
/// `nix` defines (and `nix`'s `Statvfs::flags` drops bits it does not know, so the raw call is
/// kept here).
const ST_NOSYMFOLLOW: libc::c_ulong = 0x2000;

/// The mount flags of the mount at `path` that a bind remount must pass again to keep them:
/// read-only, nosuid, noexec, nodev, nosymfollow (in a user namespace, the kernel refuses to
/// clear the first four when they are locked). The access-time flags are left out: a remount
/// that gives none keeps the mount's own.
fn kept_mount_flags(path: &Path) -> Result<MsFlags, Error> {
    let fail = |source| Error::MountFlags {
        path: path.to_path_buf(),
        source,
    };
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| fail(Errno::EINVAL))?;
    // SAFETY: `st` is a local out value; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(fail(Errno::last()));
    }
    let pairs = [
        (libc::ST_RDONLY, MsFlags::MS_RDONLY),
        (libc::ST_NOSUID, MsFlags::MS_NOSUID),
        (libc::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (libc::ST_NODEV, MsFlags::MS_NODEV),
        (
            ST_NOSYMFOLLOW,
            MsFlags::from_bits_retain(libc::MS_NOSYMFOLLOW),
        ),
    ];
    Ok(pairs
        .iter()
        .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
        .fold(MsFlags::empty(), |flags, (_, ms)| flags | *ms))
}

/// Remounts the mount at `path` (the top one, when several are stacked there) `nodev`, keeping
/// its other flags.
fn remount_nodev(path: &Path) -> Result<(), Error> {
    let flags =
        kept_mount_flags(path)? | MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NODEV;
    remount(path, flags).map_err(|source| Error::RemountNodev {
        path: path.to_path_buf(),
        source,
    })
}

/// The mount points of `mountinfo` (the text of `/proc/self/mountinfo`) at `dir` or below it,
/// each once, in the order listed.
fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for line in mountinfo.lines() {
        let Some(field) = line.split(' ').nth(4) else {
            continue;
        };
        let p = std::path::PathBuf::from(std::ffi::OsString::from_vec(crate::mountinfo::unescape(
            field,
        )));
        if p.starts_with(dir) && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Makes every mount at or under `dir` (the bind mount of the shared directory and the
/// submounts it carries) `nodev`, so that no device node in the share can be opened through
/// them, whatever the host mounted there. Reads the mounts from `/proc/self/mountinfo` of the
/// fresh procfs. A submount the daemon may not reach (`EACCES`) is left as it is: nothing in it
/// can be opened by the daemon either.
fn make_nodev(dir: &Path) -> Result<(), Error> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
    let points = mount_points_under(&mountinfo, dir);
    if !points.iter().any(|p| p == dir) {
        return Err(Error::NotAMountPoint(dir.to_path_buf()));
    }
    for p in points {
        match remount_nodev(&p) {
            Err(Error::RemountNodev {
                source: Errno::EACCES,
                ..
            }) if p != dir => {
                log::debug!(
                    "cannot remount {} nodev (EACCES): left as it is",
                    p.display()
                );
            }
            r => r?,
        }
    }
    Ok(())
}

/// In a process that has just entered new mount and pid namespaces (and is the first process
/// of the pid namespace): stops mount events from reaching the host, mounts a procfs of the new
/// pid namespace on `/proc` (with `subset=pid`: no system-wide file in it; fails when it cannot
/// be mounted), opens `/proc/self/fd`, and makes `shared_dir` (absolute) the root of the mount
/// namespace: bind-mounted onto itself, remounted `nodev` (and its submounts), `pivot_root`
/// into it, the old root detached. Returns the `/proc/self/fd` descriptor, which stays usable
/// afterwards.
pub fn pivot_into(shared_dir: &Path) -> Result<OwnedFd, Error> {
    let root = Path::new("/");
    remount(root, MsFlags::MS_REC | MsFlags::MS_SLAVE).map_err(Error::MakeSlave)?;
    mount_fresh_proc(Path::new("/proc"))?;
    let proc_self_fd = open_path_dir(Path::new("/proc/self/fd"))?;
    nix::mount::mount(
        Some(shared_dir),
        shared_dir,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|source| Error::BindMount {
        path: shared_dir.to_path_buf(),
        source,
    })?;
    make_nodev(shared_dir)?;
    chdir(shared_dir)?;
    nix::unistd::pivot_root(".", ".").map_err(|source| Error::PivotRoot {
        path: shared_dir.to_path_buf(),
        source,
    })?;
    // The old root is stacked under the new one at "."; detach it and everything under it.
    nix::mount::umount2(".", MntFlags::MNT_DETACH).map_err(Error::DetachOldRoot)?;
    chdir(root)?;
    Ok(proc_self_fd)
}

/// Opens `/proc/self/fd`, then makes `shared_dir` the process's root directory with
/// `chroot(2)`. Returns the `/proc/self/fd` descriptor.
pub fn chroot_into(shared_dir: &Path) -> Result<OwnedFd, Error> {
    let proc_self_fd = open_path_dir(Path::new("/proc/self/fd"))?;
    chdir(shared_dir)?;
    nix::unistd::chroot(".").map_err(|source| Error::Chroot {
        path: shared_dir.to_path_buf(),
        source,
    })?;
    chdir(Path::new("/"))?;
    Ok(proc_self_fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            crate::mountinfo::unescape(r"/a\040b\011c\012d\134e"),
            b"/a b\tc\nd\\e"
        );
        // Not an escape: kept as it is.
        assert_eq!(crate::mountinfo::unescape(r"/x\09y\"), b"/x\\09y\\");
    }

    #[test]
    fn mount_points_at_or_under_the_share_are_found_once() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:5 / /srv/share rw,nosuid shared:2 - tmpfs tmpfs rw
31 22 0:6 / /srv/shared rw shared:3 - tmpfs tmpfs rw
32 30 0:7 / /srv/share/sub\\040dir rw shared:4 - tmpfs tmpfs rw
33 30 0:8 / /srv/share rw shared:5 - tmpfs tmpfs rw
34 22 0:9 / /proc rw - proc proc rw
";
        let got = mount_points_under(info, Path::new("/srv/share"));
        assert_eq!(
            got,
            [
                std::path::PathBuf::from("/srv/share"),
                std::path::PathBuf::from("/srv/share/sub dir")
            ]
        );
    }
}
