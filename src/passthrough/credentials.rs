//! Creating files as the guest caller: a guard that switches this thread's filesystem uid and
//! gid (`setfsuid(2)` / `setfsgid(2)`) for the duration of one creating syscall.
//!
//! Only a daemon running as root switches: then new files are owned by the caller, and the
//! kernel checks the caller's permissions on the parent directory. An unprivileged daemon
//! creates everything as itself. Linux keeps fsuid/fsgid per thread, so a switch never leaks
//! into requests served by other threads; the guard restores the previous ids when dropped.

use std::io;

/// Restores this thread's fsuid/fsgid on drop.
#[must_use = "the credentials are restored as soon as the guard is dropped"]
pub struct CredsGuard {
    old_uid: libc::uid_t,
    old_gid: libc::gid_t,
}

/// Whether the daemon runs with effective uid 0 (and so should create files as the caller).
pub fn running_as_root() -> bool {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Switches to `uid`/`gid` when `as_root` (see [`running_as_root`]); `None` when no switch is
/// needed (not root, or the caller is root already).
pub fn switch_to(as_root: bool, uid: u32, gid: u32) -> io::Result<Option<CredsGuard>> {
    if !as_root || (uid == 0 && gid == 0) {
        return Ok(None);
    }
    // The group first: once the fsuid is not 0 the thread may lose the right to change it.
    let old_gid = set_fsgid(gid)?;
    let old_uid = match set_fsuid(uid) {
        Ok(old) => old,
        Err(e) => {
            // SAFETY: restoring the previous fsgid of this thread; nothing to check.
            unsafe { libc::setfsgid(old_gid) };
            return Err(e);
        }
    };
    Ok(Some(CredsGuard { old_uid, old_gid }))
}

/// Sets the fsuid and checks it took effect (`setfsuid` reports no errors, only the old id).
fn set_fsuid(uid: u32) -> io::Result<u32> {
    // SAFETY: `setfsuid` only changes this thread's filesystem uid.
    let old = unsafe { libc::setfsuid(uid) } as u32;
    // SAFETY: as above; an invalid id (-1) changes nothing and returns the current fsuid.
    let now = unsafe { libc::setfsuid(u32::MAX) } as u32;
    if now != uid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(old)
}

fn set_fsgid(gid: u32) -> io::Result<u32> {
    // SAFETY: `setfsgid` only changes this thread's filesystem gid.
    let old = unsafe { libc::setfsgid(gid) } as u32;
    // SAFETY: as above; an invalid id (-1) changes nothing and returns the current fsgid.
    let now = unsafe { libc::setfsgid(u32::MAX) } as u32;
    if now != gid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(old)
}

impl Drop for CredsGuard {
    fn drop(&mut self) {
        // SAFETY: restoring the ids this thread had before the switch; uid first so that the
        // thread regains the capabilities it needs to restore the gid.
        unsafe {
            libc::setfsuid(self.old_uid);
            libc::setfsgid(self.old_gid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> (u32, u32) {
        // SAFETY: -1 changes nothing; the calls return the current ids.
        unsafe {
            (
                libc::setfsuid(u32::MAX) as u32,
                libc::setfsgid(u32::MAX) as u32,
            )
        }
    }

    #[test]
    fn no_switch_when_not_root() {
        assert!(switch_to(false, 1000, 1000).unwrap().is_none());
    }

    #[test]
    fn switch_is_undone_when_the_guard_drops() {
        if !running_as_root() {
            return;
        }
        let before = current();
        {
            let _g = switch_to(true, 1000, 1001).unwrap().expect("switched");
            assert_eq!(current(), (1000, 1001));
        }
        assert_eq!(current(), before);
    }
}
