//! Running the daemon inside a user namespace (`--uid-map`, `--gid-map`).
//!
//! With these flags the daemon moves itself into a new user namespace whose ids map onto a range
//! of host ids, and becomes root (uid and gid 0) of that namespace. A file the daemon creates as
//! namespace uid `n` is then owned on the host by the host uid that `n` maps to; ids outside the
//! maps appear as the overflow id (normally 65534). This translation is done by the kernel, not
//! by the daemon (compare the daemon's own uid/gid translation).
//!
//! # Map syntax
//!
//! Each flag value is one range, written `:namespace_id:host_id:count:`, for example
//! `--uid-map=:0:100000:65536:` maps host uids 100000..=165535 to namespace uids 0..=65535. The
//! flags may be repeated to map several ranges. As with the reference daemon, the first
//! character is the delimiter and may be any ASCII punctuation or blank (`:` is the usual one);
//! the value must end with the same delimiter. Each field is a decimal `u32` (an optional
//! leading `+` is accepted). Unlike the reference daemon, which leaves these checks to the
//! kernel, parsing an [`IdMapRange`] refuses a zero count and ranges that run past `u32::MAX`, and
//! [`check_maps`] refuses overlapping ranges and maps without namespace id 0.
//!
//! # How the maps are written
//!
//! A process that has just left for a new user namespace has every capability *in* it but none
//! in its parent namespace, so it cannot map arbitrary host ids itself. [`enter_user_namespace`]
//! therefore forks a helper process first; the helper stays in the original namespace. The
//! caller then unshares, tells the helper, and the helper writes `/proc/PID/uid_map`, then
//! `gid_map`:
//!
//! - directly, when it has `CAP_SETUID`/`CAP_SETGID` (the daemon runs as root), or when the map
//!   only maps the caller's own id (for the gid map, this needs `setgroups` set to `deny`
//!   first, which is done only in that case);
//! - otherwise through the setuid helpers `newuidmap` / `newgidmap` (package `uidmap`), which
//!   check the ranges against `/etc/subuid` and `/etc/subgid`.
//!
//! The caller waits for the helper, then switches to uid and gid 0 inside the namespace.

use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::str::FromStr;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::socket::MsgFlags;
use nix::sys::wait::WaitStatus;
use nix::unistd::{ForkResult, Gid, Pid, Uid};

use super::process::{self, ForkError};

/// Why the daemon could not enter its user namespace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot enter a user namespace")]
    NotAlone(#[source] ForkError),
    /// A map the kernel would refuse (the message names the flag).
    #[error(transparent)]
    InvalidMap(MapsError),
    #[error("cannot create a socket pair")]
    SocketPair(#[source] io::Error),
    #[error("cannot fork the map writer")]
    Fork(#[source] ForkError),
    #[error("cannot create a user namespace{hint}")]
    Unshare {
        /// What an errno means here, e.g. "(user namespaces are not permitted here ...)".
        hint: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot signal the map writer")]
    Go(#[source] Errno),
    /// The map writer's report of what it could not write (the message names the file): the
    /// text of its `WriteError`, as the forked process sent it.
    #[error("{0}")]
    WriteMaps(String),
    #[error("writing the user namespace's id maps failed: {0}")]
    MapWriterVanished(Vanished),
    #[error("cannot become {id} 0 inside the user namespace")]
    BecomeRoot {
        id: &'static str,
        #[source]
        source: Errno,
    },
}

/// How the map writer ended without a report (the message follows the one saying the maps
/// were not written).
#[derive(Debug, thiserror::Error)]
pub enum Vanished {
    /// Its end of the socket could not be read.
    #[error("cannot read its report: {0}")]
    Read(io::Error),
    /// It exited, or was killed, without writing.
    #[error("it ended without a report ({})", process::describe(*.0))]
    Ended(WaitStatus),
    /// Nothing came, and waiting for it failed too.
    #[error("it ended without a report (wait failed: {0})")]
    Wait(Errno),
}

/// One range of a uid or gid map: `count` ids starting at `ns_id` inside the namespace are the
/// ids starting at `host_id` outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdMapRange {
    /// First id inside the namespace.
    pub ns_id: u32,
    /// First id in the daemon's original namespace (normally the host).
    pub host_id: u32,
    /// Number of ids in the range (at least 1).
    pub count: u32,
}

impl IdMapRange {
    /// Whether `id` (a namespace id) falls inside this range.
    fn maps_ns_id(&self, id: u32) -> bool {
        u64::from(id) >= u64::from(self.ns_id)
            && u64::from(id) < u64::from(self.ns_id) + u64::from(self.count)
    }
}

impl fmt::Display for IdMapRange {
    /// Writes the range in the flag's own syntax, `:ns_id:host_id:count:`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ":{}:{}:{}:", self.ns_id, self.host_id, self.count)
    }
}

/// Most ranges the kernel takes in one map (Linux 4.15 and later).
const MAX_RANGES: usize = 340;

fn expected(flag: &str) -> String {
    format!("expected {flag}=:namespace_id:host_id:count: (for example {flag}=:0:100000:65536:)")
}

/// The `/proc/PID` file a flag's map is written to.
fn map_file(flag: &str) -> &'static str {
    if flag.contains("gid") {
        "gid_map"
    } else {
        "uid_map"
    }
}

/// Why a whole `--uid-map` or `--gid-map` (all the values of the flag) was refused, as the
/// kernel would refuse it. Each message starts with the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapsError {
    /// A range of no ids, or one that reaches `u32::MAX` inside the namespace or on the host.
    #[error(
        "{flag}: invalid range {range}: the count must be at least 1 and neither range may \
         reach {max}; {expected}",
        max = u32::MAX,
        expected = expected(.flag)
    )]
    InvalidRange {
        flag: &'static str,
        range: IdMapRange,
    },
    /// More ranges than the kernel takes in one map.
    #[error("{flag}: {ranges} ranges given; the kernel accepts at most {max}", max = MAX_RANGES)]
    TooMany { flag: &'static str, ranges: usize },
    /// The map's text is longer than the one page the kernel reads.
    #[error(
        "{flag}: the {ranges} ranges do not fit in one page of /proc/PID/{file}; use fewer ranges",
        file = map_file(.flag)
    )]
    TooLong { flag: &'static str, ranges: usize },
    /// Two ranges share ids `side` ("inside the namespace" or "on the host").
    #[error("{flag}: ranges {first} and {second} overlap {side}")]
    Overlap {
        flag: &'static str,
        side: &'static str,
        first: IdMapRange,
        second: IdMapRange,
    },
    /// No range covers namespace id 0, the id the daemon runs as inside.
    #[error(
        "{flag}: no range maps namespace id 0; the daemon runs as id 0 inside the namespace, so \
         one range must cover it (for example {flag}=:0:100000:65536:)"
    )]
    NoRoot { flag: &'static str },
}

/// Why a `--uid-map` or `--gid-map` value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapError {
    Empty,
    NoDelimiter,
    /// The value does not end with the delimiter it starts with.
    Unterminated(char),
    /// Not 3 fields between the delimiters.
    FieldCount(usize),
    FieldEmpty(&'static str),
    NotDecimal {
        field: &'static str,
        text: String,
    },
    TooLarge {
        field: &'static str,
        text: String,
    },
    ZeroCount,
    /// The range starting at `first` inside the namespace (`host` false) or on the host runs
    /// past the last id.
    Overflow {
        host: bool,
        first: u32,
        count: u32,
    },
}

impl fmt::Display for MapError {
    /// What is wrong, then the expected form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Empty => write!(f, "the value is empty"),
            MapError::NoDelimiter => write!(f, "it must start with a delimiter such as ':'"),
            MapError::Unterminated(d) => {
                write!(f, "it must end with the delimiter it starts with ('{d}')")
            }
            MapError::FieldCount(n) => {
                write!(f, "expected 3 fields between the delimiters, found {n}")
            }
            MapError::FieldEmpty(field) => write!(f, "{field} is empty"),
            MapError::NotDecimal { field, text } => {
                write!(f, "{field} '{text}' is not a decimal number")
            }
            MapError::TooLarge { field, text } => {
                write!(f, "{field} {text} is larger than {}", u32::MAX)
            }
            MapError::ZeroCount => write!(f, "count must be at least 1"),
            MapError::Overflow { host, first, count } => write!(
                f,
                "the {} range {first}+{count} goes past {}",
                if *host { "host" } else { "namespace" },
                u32::MAX - 1
            ),
        }?;
        write!(
            f,
            "; expected :namespace_id:host_id:count: (for example :0:100000:65536:)"
        )
    }
}

impl std::error::Error for MapError {}

impl FromStr for IdMapRange {
    type Err = MapError;

    /// Parses one `--uid-map` or `--gid-map` value, `:ns_id:host_id:count:`.
    fn from_str(s: &str) -> Result<IdMapRange, MapError> {
        let delim = s.chars().next().ok_or(MapError::Empty)?;
        if !(delim.is_ascii_punctuation() || delim.is_ascii_whitespace()) {
            return Err(MapError::NoDelimiter);
        }
        if s.len() < 2 || !s.ends_with(delim) {
            return Err(MapError::Unterminated(delim));
        }
        let inner = &s[1..s.len() - 1];
        let fields: Vec<&str> = inner.split(delim).collect();
        if fields.len() != 3 {
            return Err(MapError::FieldCount(fields.len()));
        }
        let names = ["namespace_id", "host_id", "count"];
        let mut values = [0u32; 3];
        for ((value, text), field) in values.iter_mut().zip(&fields).zip(names) {
            *value = parse_u32(field, text)?;
        }
        let [ns_id, host_id, count] = values;
        if count == 0 {
            return Err(MapError::ZeroCount);
        }
        for (host, first) in [(false, ns_id), (true, host_id)] {
            if first.checked_add(count).is_none() {
                return Err(MapError::Overflow { host, first, count });
            }
        }
        Ok(IdMapRange {
            ns_id,
            host_id,
            count,
        })
    }
}

/// The `field` of a map: a decimal `u32`, ASCII digits with an optional leading `+`.
fn parse_u32(field: &'static str, text: &str) -> Result<u32, MapError> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() {
        return Err(MapError::FieldEmpty(field));
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MapError::NotDecimal {
            field,
            text: text.to_owned(),
        });
    }
    digits.parse().map_err(|_| MapError::TooLarge {
        field,
        text: text.to_owned(),
    })
}

/// Checks a whole map (all values of one flag) the way the kernel will: each range valid, at
/// most 340 ranges, no two ranges overlapping inside the namespace or on the host, and one range
/// covering namespace id 0 (the daemon runs as id 0 inside). An empty map is accepted (see
/// [`enter_user_namespace`]). The error's message starts with `flag`.
pub fn check_maps(flag: &'static str, maps: &[IdMapRange]) -> Result<(), MapsError> {
    if maps.is_empty() {
        return Ok(());
    }
    for &range in maps {
        let fits = range.ns_id.checked_add(range.count).is_some()
            && range.host_id.checked_add(range.count).is_some();
        if range.count == 0 || !fits {
            return Err(MapsError::InvalidRange { flag, range });
        }
    }
    if maps.len() > MAX_RANGES {
        return Err(MapsError::TooMany {
            flag,
            ranges: maps.len(),
        });
    }
    if map_text(maps).len() >= page_size() {
        return Err(MapsError::TooLong {
            flag,
            ranges: maps.len(),
        });
    }
    for (side, key) in [
        (
            "inside the namespace",
            (|r: &IdMapRange| r.ns_id) as fn(&IdMapRange) -> u32,
        ),
        ("on the host", |r: &IdMapRange| r.host_id),
    ] {
        let mut sorted: Vec<&IdMapRange> = maps.iter().collect();
        sorted.sort_by_key(|r| key(r));
        for pair in sorted.windows(2) {
            if u64::from(key(pair[0])) + u64::from(pair[0].count) > u64::from(key(pair[1])) {
                return Err(MapsError::Overlap {
                    flag,
                    side,
                    first: *pair[0],
                    second: *pair[1],
                });
            }
        }
    }
    if !maps.iter().any(|r| r.maps_ns_id(0)) {
        return Err(MapsError::NoRoot { flag });
    }
    Ok(())
}

fn page_size() -> usize {
    let n = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE);
    n.ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
        .unwrap_or(4096)
}

/// The text written to `/proc/PID/uid_map` or `gid_map`: one `ns host count` line per range.
fn map_text(maps: &[IdMapRange]) -> String {
    maps.iter()
        .map(|r| format!("{} {} {}\n", r.ns_id, r.host_id, r.count))
        .collect()
}

/// Which of the two maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Uid,
    Gid,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Uid => "uid",
            Kind::Gid => "gid",
        }
    }
    fn flag(self) -> &'static str {
        match self {
            Kind::Uid => "--uid-map",
            Kind::Gid => "--gid-map",
        }
    }
    fn helper(self) -> &'static str {
        match self {
            Kind::Uid => "newuidmap",
            Kind::Gid => "newgidmap",
        }
    }
}

/// One map, prepared before the fork so the helper process only writes.
struct Plan {
    kind: Kind,
    maps: Vec<IdMapRange>,
    /// The caller's effective id in the original namespace.
    own_id: u32,
}

impl Plan {
    fn new(kind: Kind, given: &[IdMapRange], own_id: u32) -> Result<Plan, Error> {
        let maps = if given.is_empty() {
            vec![IdMapRange {
                ns_id: 0,
                host_id: own_id,
                count: 1,
            }]
        } else {
            given.to_vec()
        };
        check_maps(kind.flag(), &maps).map_err(Error::InvalidMap)?;
        Ok(Plan { kind, maps, own_id })
    }

    /// Whether the map only maps the caller's own id, which the kernel lets an unprivileged
    /// process do itself.
    fn maps_only_own_id(&self) -> bool {
        matches!(self.maps.as_slice(), [r] if r.count == 1 && r.host_id == self.own_id)
    }
}

/// Moves the calling process into a new user namespace with the given uid and gid maps, and
/// makes it uid 0 and gid 0 there.
///
/// An empty `uid_maps` (or `gid_maps`) maps only the caller's own effective uid (gid) as id 0,
/// which needs no privilege. Any other map needs either root (`CAP_SETUID`/`CAP_SETGID`) or the
/// `newuidmap`/`newgidmap` helpers with matching `/etc/subuid`/`/etc/subgid` entries.
///
/// The process must be single-threaded: the kernel lets only a single-threaded process change
/// its user namespace, and the helper process is forked. Call this early, before any thread
/// starts (a thread count other than 1 in `/proc/self/status` is refused).
///
/// Supplementary groups are left as they are: drop them *before* calling this (afterwards
/// `setgroups` may be denied, when an unprivileged caller maps only its own gid). When the
/// switch to id 0 changes the process's host uid or gid (root mapping a subordinate range), the
/// kernel makes the process non-dumpable; this is left so, which keeps other processes of the
/// mapped host uid from tracing it. Reopening through `/proc/self/fd` keeps working.
pub fn enter_user_namespace(uid_maps: &[IdMapRange], gid_maps: &[IdMapRange]) -> Result<(), Error> {
    process::check_single_threaded().map_err(Error::NotAlone)?;
    let (euid, egid, pid) = (
        nix::unistd::geteuid(),
        nix::unistd::getegid(),
        nix::unistd::getpid(),
    );
    let plans = [
        Plan::new(Kind::Uid, uid_maps, euid.as_raw())?,
        Plan::new(Kind::Gid, gid_maps, egid.as_raw())?,
    ];

    let (mut parent_end, child_end) = UnixStream::pair().map_err(Error::SocketPair)?;
    let child = match process::fork_single_threaded().map_err(Error::Fork)? {
        ForkResult::Parent { child } => child,
        ForkResult::Child => {
            drop(parent_end);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                map_writer(child_end, pid, &plans)
            }))
            .map_or(2, |ok| if ok { 0 } else { 1 });
            // SAFETY: _exit ends the child at once, without running the parent's exit handlers
            // or flushing its copied stdio buffers.
            unsafe { libc::_exit(code) };
        }
    };
    drop(child_end);

    if let Err(e) = nix::sched::unshare(CloneFlags::CLONE_NEWUSER) {
        drop(parent_end); // the writer reads end-of-file and leaves without writing
        let _ = process::wait_for(child, None);
        return Err(unshare_error(e));
    }
    let go = send_go(&parent_end);
    let mut report = Vec::new();
    let read = parent_end.read_to_end(&mut report);
    let status = process::wait_for(child, None);
    go.map_err(Error::Go)?;
    match report.split_first() {
        Some((b'0', _)) => {}
        Some((_, msg)) => return Err(Error::WriteMaps(String::from_utf8_lossy(msg).into_owned())),
        None => {
            let why = match (read, status) {
                (Err(e), _) => Vanished::Read(e),
                (_, Ok(s)) => Vanished::Ended(s),
                (_, Err(e)) => Vanished::Wait(e),
            };
            return Err(Error::MapWriterVanished(why));
        }
    }
    become_root()
}

/// Sends the one-byte go-ahead without risking SIGPIPE if the writer has already died.
fn send_go(sock: &UnixStream) -> nix::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        match nix::sys::socket::send(sock.as_raw_fd(), b"g", MsgFlags::MSG_NOSIGNAL) {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(Errno::EIO),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn unshare_error(source: Errno) -> Error {
    let hint = match source {
        Errno::EPERM => {
            " (user namespaces are not permitted here: a container or seccomp policy, \
             kernel.unprivileged_userns_clone, or a chroot forbids them)"
        }
        Errno::ENOSPC | Errno::EUSERS => {
            " (the limit of user namespaces, /proc/sys/user/max_user_namespaces, or of their \
             nesting is reached)"
        }
        Errno::EINVAL => " (the process must be single-threaded)",
        _ => "",
    };
    Error::Unshare { hint, source }
}

/// Inside the namespace, with the maps written: become its root.
fn become_root() -> Result<(), Error> {
    let root_gid = Gid::from_raw(0);
    nix::unistd::setresgid(root_gid, root_gid, root_gid)
        .map_err(|source| Error::BecomeRoot { id: "gid", source })?;
    let root_uid = Uid::from_raw(0);
    nix::unistd::setresuid(root_uid, root_uid, root_uid)
        .map_err(|source| Error::BecomeRoot { id: "uid", source })
}

/// The forked helper: waits for the go-ahead, writes the maps of process `pid`, reports on
/// `sock` (`0`, or `1` and a message) and returns whether it succeeded.
fn map_writer(mut sock: UnixStream, pid: Pid, plans: &[Plan]) -> bool {
    let mut go = [0u8; 1];
    loop {
        match sock.read(&mut go) {
            Ok(1) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // The caller could not unshare (or died): nothing to do.
            _ => return false,
        }
    }
    let result = plans.iter().try_for_each(|p| write_map(pid, p));
    let report = match &result {
        Ok(()) => b"0".to_vec(),
        Err(msg) => format!("1{msg}").into_bytes(),
    };
    let _ = sock.write_all(&report);
    result.is_ok()
}

/// Why the map writer could not write a map. The writer is a forked process that sends this
/// to the daemon as text ([`Error::WriteMaps`]), so each message carries its cause.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// Writing the map file failed, and not for want of privilege.
    #[error("cannot write {path}: {error}")]
    Direct { path: String, error: io::Error },
    /// Denying `setgroups`, or the gid map after it, failed.
    #[error("cannot write {path} (with {setgroups} set to deny): {error}")]
    Setgroups {
        path: String,
        setgroups: String,
        error: io::Error,
    },
    /// Writing the map file was refused (`EPERM`) and the setuid helper did not write it.
    #[error(
        "cannot write {path}: {direct}; mapping {name}s other than one's own needs root \
         (CAP_SET{upper}) or {helper} (package uidmap) with a matching range in /etc/sub{name}\
         {failure}",
        name = .kind.name(),
        upper = .kind.name().to_uppercase(),
        helper = .kind.helper()
    )]
    Helper {
        path: String,
        kind: Kind,
        /// Why the direct write failed.
        direct: io::Error,
        failure: HelperFailure,
    },
}

/// Why `newuidmap` or `newgidmap` did not write a map (the message follows the one that says
/// it was needed).
#[derive(Debug, thiserror::Error)]
enum HelperFailure {
    #[error(", and {0} is not in PATH")]
    NotInPath(&'static str),
    #[error("; {} failed ({status}): {stderr}", .program.display())]
    Failed {
        program: PathBuf,
        status: ExitStatus,
        stderr: String,
    },
    #[error("; cannot run {}: {error}", .program.display())]
    CannotRun { program: PathBuf, error: io::Error },
}

/// Writes one map of process `pid`, directly if the kernel lets this process do it, through
/// `newuidmap`/`newgidmap` otherwise.
fn write_map(pid: Pid, plan: &Plan) -> Result<(), WriteError> {
    let kind = plan.kind.name();
    let path = format!("/proc/{pid}/{kind}_map");
    let text = map_text(&plan.maps);
    let direct = match write_once(&path, &text) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if direct.raw_os_error() != Some(libc::EPERM) {
        return Err(WriteError::Direct {
            path,
            error: direct,
        });
    }
    if plan.kind == Kind::Gid && plan.maps_only_own_id() {
        // Without CAP_SETGID in the original namespace, the kernel accepts a gid map only once
        // setgroups is denied in the new one (or a process could drop groups used to deny it
        // access).
        let setgroups = format!("/proc/{pid}/setgroups");
        return write_once(&setgroups, "deny")
            .and_then(|()| write_once(&path, &text))
            .map_err(|error| WriteError::Setgroups {
                path,
                setgroups,
                error,
            });
    }
    let helper = plan.kind.helper();
    let failed = move |failure| WriteError::Helper {
        path,
        kind: plan.kind,
        direct,
        failure,
    };
    let Some(program) = find_in_path(helper) else {
        return Err(failed(HelperFailure::NotInPath(helper)));
    };
    let mut cmd = Command::new(&program);
    cmd.arg(pid.to_string());
    for r in &plan.maps {
        cmd.args([
            r.ns_id.to_string(),
            r.host_id.to_string(),
            r.count.to_string(),
        ]);
    }
    match cmd.stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(failed(HelperFailure::Failed {
            program,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })),
        Err(error) => Err(failed(HelperFailure::CannotRun { program, error })),
    }
}

/// The first executable file called `name` in `PATH` (or in the usual system directories
/// when `PATH` is unset).
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into());
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Writes `text` to a `/proc` map file in one `write`, as the kernel requires.
fn write_once(path: &str, text: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    let n = f.write(text.as_bytes())?;
    if n != text.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write ({n} of {} bytes)", text.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ns_id: u32, host_id: u32, count: u32) -> IdMapRange {
        IdMapRange {
            ns_id,
            host_id,
            count,
        }
    }

    #[test]
    fn parses_the_documented_form() {
        assert_eq!(
            ":0:100000:65536:".parse::<IdMapRange>().unwrap(),
            r(0, 100000, 65536)
        );
        assert_eq!(
            ":1000:1000:1:".parse::<IdMapRange>().unwrap(),
            r(1000, 1000, 1)
        );
    }

    #[test]
    fn accepts_what_the_reference_accepts() {
        // Any ASCII punctuation or blank may delimit, used consistently; `+` signs and leading
        // zeros are plain decimal.
        for s in [
            "/0/1/2/",
            ";0;1;2;",
            "-0-1-2-",
            " 0 1 2 ",
            "\t0\t1\t2\t",
            ":+0:01:2:",
        ] {
            assert_eq!(s.parse::<IdMapRange>().unwrap(), r(0, 1, 2), "{s:?}");
        }
        // The largest ranges that do not reach u32::MAX, which the kernel reserves.
        assert_eq!(
            ":0:0:4294967295:".parse::<IdMapRange>().unwrap(),
            r(0, 0, u32::MAX)
        );
        assert_eq!(
            ":4294967294:1:1:".parse::<IdMapRange>().unwrap(),
            r(u32::MAX - 1, 1, 1)
        );
    }

    #[test]
    fn refuses_malformed_values_saying_the_form() {
        for s in [
            "",
            ":",
            "::",
            ":::",
            "::::",
            "0:1000:1",
            ":0:1000:1",
            "0:1000:1:",
            ":0:1000:1:x",
            ":0:1000:1:2:",
            ":0/1000/1:",
            "x0x1x1x",
            "é0é1é1é",
            ":a:1:1:",
            ":-1:1:1:",
            ": 1:1:1:",
            ":1 :1:1:",
            ":0x10:1:1:",
            "::1:1:",
            ":0:1000::",
            ":++1:1:1:",
            ":+:1:1:",
        ] {
            let e = s.parse::<IdMapRange>().unwrap_err().to_string();
            assert!(
                e.ends_with(
                    "; expected :namespace_id:host_id:count: (for example :0:100000:65536:)"
                ),
                "{s:?}: {e}"
            );
        }
    }

    #[test]
    fn messages_say_what_is_wrong() {
        let e = ":0:1000:1".parse::<IdMapRange>().unwrap_err().to_string();
        assert!(e.contains("must end with the delimiter"), "{e}");
        let e = "0:1000:1:".parse::<IdMapRange>().unwrap_err().to_string();
        assert!(e.contains("must start with a delimiter"), "{e}");
        let e = ":0:1000:1:2:"
            .parse::<IdMapRange>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected 3 fields") && e.contains("found 4"),
            "{e}"
        );
        let e = ":0:abc:1:".parse::<IdMapRange>().unwrap_err().to_string();
        assert!(e.contains("host_id 'abc' is not a decimal number"), "{e}");
        let e = ":0::1:".parse::<IdMapRange>().unwrap_err().to_string();
        assert!(e.contains("host_id is empty"), "{e}");
    }

    #[test]
    fn refuses_zero_count() {
        let e = ":0:1000:0:".parse::<IdMapRange>().unwrap_err().to_string();
        assert!(e.contains("count must be at least 1"), "{e}");
    }

    #[test]
    fn refuses_numbers_and_ranges_beyond_u32() {
        let e = ":0:1000:4294967296:"
            .parse::<IdMapRange>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("count 4294967296 is larger than 4294967295"),
            "{e}"
        );
        let e = ":4294967295:1:1:"
            .parse::<IdMapRange>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("namespace range"), "{e}");
        let e = ":1:0:4294967295:"
            .parse::<IdMapRange>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("namespace range"), "{e}");
        let e = ":0:4294967295:1:"
            .parse::<IdMapRange>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("host range"), "{e}");
        let e = ":0:1:4294967295:"
            .parse::<IdMapRange>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("host range"), "{e}");
    }

    #[test]
    fn displays_in_flag_syntax() {
        assert_eq!(r(0, 100000, 65536).to_string(), ":0:100000:65536:");
        let s = r(5, 6, 7).to_string();
        assert_eq!(s.parse::<IdMapRange>().unwrap(), r(5, 6, 7));
    }

    #[test]
    fn whole_maps_are_checked_like_the_kernel() {
        assert!(check_maps("--uid-map", &[]).is_ok());
        assert!(check_maps("--uid-map", &[r(0, 100000, 65536)]).is_ok());
        assert!(check_maps("--uid-map", &[r(1, 2000, 10), r(0, 1000, 1)]).is_ok());
        let e = check_maps("--uid-map", &[r(0, 1000, 10), r(5, 2000, 10)])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--uid-map:") && e.contains("overlap inside"),
            "{e}"
        );
        let e = check_maps("--gid-map", &[r(0, 1000, 10), r(10, 1005, 10)])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--gid-map:") && e.contains("overlap on the host"),
            "{e}"
        );
        let e = check_maps("--uid-map", &[r(1000, 1000, 1)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("namespace id 0"), "{e}");
        let e = check_maps("--uid-map", &[r(0, 1000, 0)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid range"), "{e}");
        let many: Vec<_> = (0..341).map(|i| r(i, 1000 + i, 1)).collect();
        assert!(check_maps("--uid-map", &many)
            .unwrap_err()
            .to_string()
            .contains("at most 340"));
    }

    #[test]
    fn map_text_is_one_line_per_range() {
        assert_eq!(
            map_text(&[r(0, 100000, 65536), r(65536, 1000, 1)]),
            "0 100000 65536\n65536 1000 1\n"
        );
    }

    #[test]
    fn whole_map_refusals_name_the_flag_the_ranges_and_the_limit() {
        let msg = |flag, maps: &[IdMapRange]| check_maps(flag, maps).unwrap_err().to_string();
        assert_eq!(
            msg("--uid-map", &[r(0, 1000, 0)]),
            "--uid-map: invalid range :0:1000:0:: the count must be at least 1 and neither range \
             may reach 4294967295; expected --uid-map=:namespace_id:host_id:count: (for example \
             --uid-map=:0:100000:65536:)"
        );
        let many: Vec<_> = (0..341).map(|i| r(i, 1000 + i, 1)).collect();
        assert_eq!(
            msg("--uid-map", &many),
            "--uid-map: 341 ranges given; the kernel accepts at most 340"
        );
        let long: Vec<_> = (0..300).map(|i| r(i, 4_000_000_000 + i, 1)).collect();
        assert_eq!(
            msg("--gid-map", &long),
            "--gid-map: the 300 ranges do not fit in one page of /proc/PID/gid_map; use fewer \
             ranges"
        );
        assert_eq!(
            msg("--uid-map", &[r(0, 1000, 10), r(5, 2000, 10)]),
            "--uid-map: ranges :0:1000:10: and :5:2000:10: overlap inside the namespace"
        );
        assert_eq!(
            msg("--gid-map", &[r(1000, 1000, 1)]),
            "--gid-map: no range maps namespace id 0; the daemon runs as id 0 inside the \
             namespace, so one range must cover it (for example --gid-map=:0:100000:65536:)"
        );
    }

    #[test]
    fn map_writer_reports_say_what_failed_and_why() {
        let eperm = || io::Error::from_raw_os_error(libc::EPERM);
        let helper = |failure| WriteError::Helper {
            path: "/proc/7/uid_map".into(),
            kind: Kind::Uid,
            direct: eperm(),
            failure,
        };
        let why = "cannot write /proc/7/uid_map: Operation not permitted (os error 1); mapping \
                   uids other than one's own needs root (CAP_SETUID) or newuidmap (package \
                   uidmap) with a matching range in /etc/subuid";
        assert_eq!(
            helper(HelperFailure::NotInPath("newuidmap")).to_string(),
            format!("{why}, and newuidmap is not in PATH")
        );
        assert_eq!(
            helper(HelperFailure::CannotRun {
                program: "/usr/bin/newuidmap".into(),
                error: eperm(),
            })
            .to_string(),
            format!("{why}; cannot run /usr/bin/newuidmap: Operation not permitted (os error 1)")
        );
        assert_eq!(
            WriteError::Setgroups {
                path: "/proc/7/gid_map".into(),
                setgroups: "/proc/7/setgroups".into(),
                error: eperm(),
            }
            .to_string(),
            "cannot write /proc/7/gid_map (with /proc/7/setgroups set to deny): Operation not \
             permitted (os error 1)"
        );
    }

    #[test]
    fn own_id_maps_are_recognised() {
        let p = Plan::new(Kind::Gid, &[], 1234).unwrap();
        assert_eq!(p.maps, vec![r(0, 1234, 1)]);
        assert!(p.maps_only_own_id());
        assert!(!Plan::new(Kind::Gid, &[r(0, 1000, 2)], 1000)
            .unwrap()
            .maps_only_own_id());
        assert!(Plan::new(Kind::Uid, &[r(3, 1000, 2)], 1000).is_err());
    }

    #[test]
    fn refuses_to_run_in_a_threaded_process() {
        // The test harness runs tests on their own threads, so this process has several.
        let e = enter_user_namespace(&[r(0, 100000, 65536)], &[]).unwrap_err();
        let shown = crate::error::Chain(&e).to_string();
        assert!(shown.contains("before any thread starts"), "{shown}");
    }
}
