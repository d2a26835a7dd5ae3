//! The confinement steps of `--sandbox=namespace` and `--sandbox=chroot`, as raw system calls.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Adds what failed to an error, keeping its kind and errno text.
fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(context(what, io::Error::last_os_error()))
    }
}

/// `unshare(2)` with `flags`.
pub fn unshare(flags: libc::c_int, what: &str) -> io::Result<()> {
    // SAFETY: unshare only changes the namespaces of the calling process.
    check(unsafe { libc::unshare(flags) }, what)
}

/// Moves the calling (single-threaded) process into a new user namespace in which its own uid
/// and gid map to themselves, so that an unprivileged daemon may create the other namespaces;
/// files keep the owners they have outside. Supplementary groups are denied in it (the kernel
/// requires that before an unprivileged gid map).
pub fn enter_identity_user_namespace() -> io::Result<()> {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    unshare(libc::CLONE_NEWUSER, "cannot create a user namespace")?;
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| context(&format!("cannot write /proc/self/{file}"), e))
    };
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("setgroups", "deny\n".into())?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// Opens `path` as an `O_PATH` directory descriptor.
fn open_path_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: `c` is a NUL-terminated path; open returns a new descriptor or -1.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(context(
            &format!("cannot open {}", path.display()),
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype
        .map(|t| CString::new(t).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e)))
        .transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let data = data.map_or(std::ptr::null(), |d| d.as_ptr().cast::<libc::c_void>());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call (the
    // file system data, when given, is such a string of options).
    let rc = unsafe { libc::mount(ptr(&source), target.as_ptr(), ptr(&fstype), flags, data) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn chdir(path: &Path) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::chdir(c.as_ptr()) };
    check(
        rc,
        &format!("cannot change directory to {}", path.display()),
    )
}

/// The options of the procfs the sandbox mounts: only the directories of processes (and
/// `self`, `thread-self`), so that neither `/proc/sys` nor `/proc/sysrq-trigger` nor any other
/// system-wide file exists in it (Linux 5.8 and later). Which processes it shows is already
/// limited by the new pid namespace, in which the daemon is alone (no `hidepid` needed).
pub const PROC_OPTIONS: &CStr = c"subset=pid";

/// `ST_NOSYMFOLLOW` of `statvfs(3)`'s `f_flag` (`linux/statfs.h`), which the `libc` crate
/// does not define.
const ST_NOSYMFOLLOW: libc::c_ulong = 0x2000;

/// Mounts a procfs of the calling process's pid namespace on `target` with
/// [`PROC_OPTIONS`]. Never falls back to another procfs: when this one cannot be mounted, the
/// sandbox does not start.
fn mount_fresh_proc(target: &Path) -> io::Result<()> {
    mount(
        Some(Path::new("proc")),
        target,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RELATIME,
        Some(PROC_OPTIONS),
    )
    .map_err(|e| {
        let what = "cannot mount a procfs (subset=pid) for the new pid namespace";
        if e.raw_os_error() == Some(libc::EINVAL) {
            context(
                &format!(
                    "{what} (the subset=pid option needs Linux 5.8 or later; the sandbox does \
                     not fall back to a procfs that shows system-wide files)"
                ),
                e,
            )
        } else {
            context(what, e)
        }
    })
}

/// The mount flags of the mount at `path` that a bind remount must pass again to keep them:
/// read-only, nosuid, noexec, nodev, nosymfollow (in a user namespace, the kernel refuses to
/// clear the first four when they are locked). The access-time flags are left out: a remount
/// that gives none keeps the mount's own.
fn kept_mount_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let c = cstr(path)?;
    // SAFETY: `st` is a local out value; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(context(
            &format!("cannot read the mount flags of {}", path.display()),
            io::Error::last_os_error(),
        ));
    }
    let pairs = [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NODEV, libc::MS_NODEV),
        (ST_NOSYMFOLLOW, libc::MS_NOSYMFOLLOW),
    ];
    Ok(pairs
        .iter()
        .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
        .fold(0, |flags, (_, ms)| flags | ms))
}

/// Remounts the mount at `path` (the top one, when several are stacked there) `nodev`, keeping
/// its other flags.
fn remount_nodev(path: &Path) -> io::Result<()> {
    let flags = kept_mount_flags(path)? | libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NODEV;
    mount(None, path, None, flags, None)
        .map_err(|e| context(&format!("cannot remount {} nodev", path.display()), e))
}

/// Undoes the octal escapes of a path in `/proc/self/mountinfo` (`\040` for a space, `\011`,
/// `\012`, `\134`).
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |j: usize| b.get(j).filter(|c| (b'0'..=b'7').contains(c)).copied();
        if b[i] == b'\\' {
            if let (Some(x), Some(y), Some(z)) = (octal(i + 1), octal(i + 2), octal(i + 3)) {
                let v =
                    (u32::from(x - b'0') << 6) | (u32::from(y - b'0') << 3) | u32::from(z - b'0');
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
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
        let p = std::path::PathBuf::from(std::ffi::OsString::from_vec(unescape_mountinfo(field)));
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
fn make_nodev(dir: &Path) -> io::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| context("cannot read /proc/self/mountinfo", e))?;
    let points = mount_points_under(&mountinfo, dir);
    if !points.iter().any(|p| p == dir) {
        return Err(io::Error::other(format!(
            "{} is not a mount point after the bind mount",
            dir.display()
        )));
    }
    for p in points {
        match remount_nodev(&p) {
            Err(e) if p != dir && e.raw_os_error() == Some(libc::EACCES) => {
                log::debug!("{e}: left as it is");
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
pub fn pivot_into(shared_dir: &Path) -> io::Result<OwnedFd> {
    let root = Path::new("/");
    mount(None, root, None, libc::MS_REC | libc::MS_SLAVE, None).map_err(|e| {
        context(
            "cannot make the mounts of the new mount namespace slaves",
            e,
        )
    })?;
    let proc_dir = Path::new("/proc");
    mount_fresh_proc(proc_dir)?;
    let proc_self_fd = open_path_dir(Path::new("/proc/self/fd"))?;
    mount(
        Some(shared_dir),
        shared_dir,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
    .map_err(|e| {
        context(
            &format!("cannot bind-mount {} onto itself", shared_dir.display()),
            e,
        )
    })?;
    make_nodev(shared_dir)?;
    chdir(shared_dir)?;
    let dot = c".";
    // SAFETY: both arguments are the static NUL-terminated string "."; pivot_root reads them.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    check(
        if rc == 0 { 0 } else { -1 },
        &format!("cannot pivot_root into {}", shared_dir.display()),
    )?;
    // The old root is stacked under the new one at "."; detach it and everything under it.
    // SAFETY: "." is a static NUL-terminated string; umount2 reads it.
    let rc = unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) };
    check(rc, "cannot detach the old root")?;
    chdir(root)?;
    Ok(proc_self_fd)
}

/// Opens `/proc/self/fd`, then makes `shared_dir` the process's root directory with
/// `chroot(2)`. Returns the `/proc/self/fd` descriptor.
pub fn chroot_into(shared_dir: &Path) -> io::Result<OwnedFd> {
    let proc_self_fd = open_path_dir(Path::new("/proc/self/fd"))?;
    chdir(shared_dir)?;
    // SAFETY: "." is a static NUL-terminated string; chroot reads it.
    let rc = unsafe { libc::chroot(c".".as_ptr()) };
    check(rc, &format!("cannot chroot into {}", shared_dir.display()))?;
    chdir(Path::new("/"))?;
    Ok(proc_self_fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_mountinfo(r"/a\040b\011c\012d\134e"),
            b"/a b\tc\nd\\e"
        );
        // Not an escape: kept as it is.
        assert_eq!(unescape_mountinfo(r"/x\09y\"), b"/x\\09y\\");
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
