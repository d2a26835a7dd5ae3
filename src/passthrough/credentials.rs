//! Creating files as the guest caller: a guard that switches this thread's filesystem uid and
//! gid (`setfsuid(2)` / `setfsgid(2)`), and the supplementary group the guest kernel sent with
//! the request (`FUSE_CREATE_SUPP_GROUP`), for the duration of one creating syscall.
//!
//! The daemon drops its own supplementary groups at start, so the host checks a creation
//! against the caller's uid, gid and that one group only. The group is set with the raw
//! `setgroups` system call, which (unlike the C library's wrapper, which `nix` calls) changes
//! this thread only.
//!
//! Only a daemon running as root switches: then new files are owned by the caller, and the
//! kernel checks the caller's permissions on the parent directory. An unprivileged daemon
//! creates everything as itself. Linux keeps fsuid/fsgid per thread, so a switch never leaks
//! into requests served by other threads; the guard restores the previous ids when dropped.

use std::io;

use nix::unistd::{Gid, Uid};

use crate::filesystem::Context;
use crate::fuse::abi::INVALID_UIDGID;

/// Restores this thread's fsuid/fsgid on drop.
#[must_use = "the credentials are restored as soon as the guard is dropped"]
pub struct CredsGuard {
    old_uid: Uid,
    old_gid: Gid,
    /// Whether a supplementary group was set (and must be cleared again).
    group_set: bool,
}

/// Whether the daemon runs with effective uid 0 (and so should create files as the caller).
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Switches to `uid`/`gid` when `as_root` (see [`running_as_root`]); `None` when no switch is
/// needed (not root, or the caller is root already).
///
/// A request without a caller identity ([`INVALID_UIDGID`], sent with idmapped mounts by every
/// request that does not create an inode) is refused with `EOVERFLOW`, the error the kernel
/// gives for a caller whose ids have no mapping: creating it as the daemon (root) instead would
/// give the guest files it may not own.
pub fn switch_to(as_root: bool, ctx: &Context) -> io::Result<Option<CredsGuard>> {
    let (uid, gid) = (ctx.uid, ctx.gid);
    if !as_root {
        return Ok(None);
    }
    if uid == INVALID_UIDGID || gid == INVALID_UIDGID {
        log::warn!("creating request without a caller uid/gid ({uid}:{gid}) refused");
        return Err(io::Error::from_raw_os_error(libc::EOVERFLOW));
    }
    if uid == 0 && gid == 0 {
        return Ok(None);
    }
    let group_set = match ctx.supp_group.filter(|&g| g != INVALID_UIDGID) {
        Some(g) => {
            set_thread_groups(&[g])?;
            true
        }
        None => false,
    };
    // The group first: once the fsuid is not 0 the thread may lose the right to change it.
    let old_gid = set_fsgid(gid)?;
    let old_uid = match set_fsuid(uid) {
        Ok(old) => old,
        Err(e) => {
            nix::unistd::setfsgid(old_gid);
            if group_set {
                let _ = set_thread_groups(&[]);
            }
            return Err(e);
        }
    };
    Ok(Some(CredsGuard {
        old_uid,
        old_gid,
        group_set,
    }))
}

/// Sets this thread's supplementary groups (only this thread's: the raw system call).
fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the pointer and count describe the live slice `groups`; the kernel only reads it.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Drops every supplementary group of the process (at start, before threads exist), so that
/// no request is checked against the daemon's own groups.
pub fn drop_supplementary_groups() -> io::Result<()> {
    if !running_as_root() {
        return Ok(());
    }
    // The C library's `setgroups`: every thread of the process, though there is one only yet.
    nix::unistd::setgroups(&[])?;
    Ok(())
}

/// An invalid id: `setfsuid`/`setfsgid` change nothing with it and return the current id.
const NO_ID: u32 = u32::MAX;

/// Sets this thread's fsuid and checks it took effect (`setfsuid` reports no errors, only the
/// old id); returns the old one.
fn set_fsuid(uid: u32) -> io::Result<Uid> {
    let old = nix::unistd::setfsuid(Uid::from_raw(uid));
    if nix::unistd::setfsuid(Uid::from_raw(NO_ID)).as_raw() != uid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(old)
}

/// As [`set_fsuid`], for the fsgid.
fn set_fsgid(gid: u32) -> io::Result<Gid> {
    let old = nix::unistd::setfsgid(Gid::from_raw(gid));
    if nix::unistd::setfsgid(Gid::from_raw(NO_ID)).as_raw() != gid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(old)
}

impl Drop for CredsGuard {
    fn drop(&mut self) {
        // Restoring the ids this thread had before the switch; uid first so that the thread
        // regains the capabilities it needs to restore the gid.
        nix::unistd::setfsuid(self.old_uid);
        nix::unistd::setfsgid(self.old_gid);
        if self.group_set {
            let _ = set_thread_groups(&[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> (u32, u32) {
        (
            nix::unistd::setfsuid(Uid::from_raw(NO_ID)).as_raw(),
            nix::unistd::setfsgid(Gid::from_raw(NO_ID)).as_raw(),
        )
    }

    #[test]
    fn no_switch_when_not_root() {
        let ctx = Context {
            uid: 1000,
            gid: 1000,
            ..Context::default()
        };
        assert!(switch_to(false, &ctx).unwrap().is_none());
    }

    #[test]
    fn invalid_ids_never_become_credentials() {
        let before = current();
        for (uid, gid) in [
            (INVALID_UIDGID, INVALID_UIDGID),
            (INVALID_UIDGID, 1000),
            (1000, INVALID_UIDGID),
            (INVALID_UIDGID, 0),
            (0, INVALID_UIDGID),
        ] {
            let ctx = Context {
                uid,
                gid,
                ..Context::default()
            };
            let e = switch_to(true, &ctx).err().expect("refused");
            assert_eq!(e.raw_os_error(), Some(libc::EOVERFLOW), "{uid}:{gid}");
            assert_eq!(current(), before, "{uid}:{gid}");
            // Not root: nothing is switched at all, so nothing to refuse.
            assert!(switch_to(false, &ctx).unwrap().is_none());
        }
    }

    #[test]
    fn invalid_supplementary_group_is_not_set() {
        if !running_as_root() {
            return;
        }
        let ctx = Context {
            uid: 1000,
            gid: 1001,
            supp_group: Some(INVALID_UIDGID),
            ..Context::default()
        };
        let g = switch_to(true, &ctx).unwrap().expect("switched");
        assert!(!g.group_set);
        drop(g);
    }

    #[test]
    fn switch_is_undone_when_the_guard_drops() {
        if !running_as_root() {
            return;
        }
        let before = current();
        {
            let ctx = Context {
                uid: 1000,
                gid: 1001,
                ..Context::default()
            };
            let _g = switch_to(true, &ctx).unwrap().expect("switched");
            assert_eq!(current(), (1000, 1001));
        }
        assert_eq!(current(), before);
    }
}
