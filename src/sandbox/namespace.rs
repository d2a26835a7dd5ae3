//! The confinement steps of `--sandbox=namespace` and `--sandbox=chroot`, as raw system calls.

use std::ffi::CString;
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
    what: &str,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype
        .map(|t| CString::new(t).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e)))
        .transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call; no
    // filesystem data is passed.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            std::ptr::null(),
        )
    };
    check(rc, what)
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

/// In a process that has just entered new mount and pid namespaces (and is the first process
/// of the pid namespace): stops mount events from reaching the host, mounts a procfs of the new
/// pid namespace on `/proc`, opens `/proc/self/fd`, and makes `shared_dir` (absolute) the root
/// of the mount namespace: bind-mounted onto itself, `pivot_root` into it, the old root
/// detached. Returns the `/proc/self/fd` descriptor, which stays usable afterwards.
pub fn pivot_into(shared_dir: &Path) -> io::Result<OwnedFd> {
    let root = Path::new("/");
    mount(
        None,
        root,
        None,
        libc::MS_REC | libc::MS_SLAVE,
        "cannot make the mounts of the new mount namespace slaves",
    )?;
    let proc_dir = Path::new("/proc");
    let fresh_proc = mount(
        Some(Path::new("proc")),
        proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RELATIME,
        "cannot mount a procfs for the new pid namespace",
    );
    if let Err(e) = fresh_proc {
        // The procfs of the parent pid namespace shows this process too: /proc/self still
        // names it. A container may refuse new procfs mounts.
        log::warn!("{e}; using the existing /proc");
    }
    let proc_self_fd = open_path_dir(Path::new("/proc/self/fd"))?;
    mount(
        Some(shared_dir),
        shared_dir,
        None,
        libc::MS_BIND | libc::MS_REC,
        &format!("cannot bind-mount {} onto itself", shared_dir.display()),
    )?;
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
