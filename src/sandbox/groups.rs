//! Whether the daemon can and must drop its own supplementary groups at start.
//!
//! A daemon running as root creates files as the guest's caller (`setfsuid`/`setfsgid`), and
//! the host checks those creations against the caller's ids and the daemon's supplementary
//! groups; so it drops its groups first. One setting forbids that: a user namespace whose
//! `/proc/self/setgroups` says `deny`, which is what `unshare -r` (`--map-root-user`) makes and
//! what a rootless container may inherit. There `setgroups(2)` fails with `EPERM` whatever the
//! process's capabilities, and the groups the launcher gave the daemon are the launching user's
//! own. The daemon then keeps them, rather than refusing to start:
//!
//! - when the namespace maps one uid and one gid only, the daemon cannot act as anyone but the
//!   launching user, so there is no other caller to lend the groups to;
//! - when it maps more (subordinate ids, e.g. `unshare -r --map-auto` on a system whose
//!   `unshare` also denies `setgroups`), a guest caller mapped to a subordinate id is also
//!   checked against the launching user's groups; that reaches nothing the launching user
//!   cannot reach, and it is said in a warning at start.

use std::fs;

/// What to do with the supplementary groups at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Not root: the daemon never switches to a caller's ids, its groups stay.
    NotRoot,
    /// Drop them (`setgroups(0, NULL)`).
    Drop,
    /// `setgroups` is denied in this user namespace, and the process holds no supplementary
    /// group: nothing to drop.
    NoneHeld,
    /// `setgroups` is denied, the namespace maps a single uid and gid: kept, harmless.
    KeepSingleId,
    /// `setgroups` is denied, the namespace maps more ids: kept, with a warning.
    KeepMappedRange,
}

/// The number of ids an `uid_map`/`gid_map` file maps (the sum of its counts); `None` when the
/// text does not parse.
fn mapped_ids(map: &str) -> Option<u64> {
    map.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
        .sum()
}

/// The plan for a process with effective uid 0 (`root`), the text of `/proc/self/setgroups`
/// (`None` where the kernel has no user namespaces), of `uid_map` and `gid_map`, and `groups`
/// supplementary groups.
pub fn plan(
    root: bool,
    setgroups: Option<&str>,
    uid_map: &str,
    gid_map: &str,
    groups: usize,
) -> Plan {
    if !root {
        return Plan::NotRoot;
    }
    if setgroups.map(str::trim) != Some("deny") {
        return Plan::Drop;
    }
    if groups == 0 {
        return Plan::NoneHeld;
    }
    if mapped_ids(uid_map) == Some(1) && mapped_ids(gid_map) == Some(1) {
        Plan::KeepSingleId
    } else {
        Plan::KeepMappedRange
    }
}

/// The plan for this process, from `/proc/self`.
pub fn plan_for_this_process() -> Plan {
    let read = |f: &str| fs::read_to_string(format!("/proc/self/{f}")).ok();
    let groups = nix::unistd::getgroups().map_or(1, |g| g.len());
    plan(
        nix::unistd::geteuid().is_root(),
        read("setgroups").as_deref(),
        &read("uid_map").unwrap_or_default(),
        &read("gid_map").unwrap_or_default(),
        groups,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "         0       1001          1\n";
    const AUTO: &str = "         0       1001          1\n         1     100000      65535\n";

    #[test]
    fn root_outside_a_denying_namespace_drops_its_groups() {
        let init = "         0          0 4294967295\n";
        assert_eq!(plan(true, Some("allow\n"), init, init, 3), Plan::Drop);
        assert_eq!(plan(true, None, "", "", 3), Plan::Drop);
        assert_eq!(plan(true, Some("allow\n"), AUTO, AUTO, 1), Plan::Drop);
    }

    #[test]
    fn an_unprivileged_daemon_leaves_its_groups() {
        assert_eq!(plan(false, Some("allow\n"), ONE, ONE, 3), Plan::NotRoot);
    }

    #[test]
    fn where_setgroups_is_denied_the_groups_are_kept() {
        assert_eq!(plan(true, Some("deny\n"), ONE, ONE, 1), Plan::KeepSingleId);
        assert_eq!(
            plan(true, Some("deny\n"), AUTO, AUTO, 1),
            Plan::KeepMappedRange
        );
        assert_eq!(
            plan(true, Some("deny\n"), ONE, AUTO, 1),
            Plan::KeepMappedRange
        );
        assert_eq!(plan(true, Some("deny\n"), AUTO, AUTO, 0), Plan::NoneHeld);
    }

    #[test]
    fn maps_are_counted_over_their_lines() {
        assert_eq!(mapped_ids(AUTO), Some(65536));
        assert_eq!(mapped_ids(ONE), Some(1));
        assert_eq!(mapped_ids("0 1"), None);
    }
}
