//! Capabilities: which ones the daemon keeps (`--modcaps`), and dropping all the others.
//!
//! After the sandbox is set up, and before any thread starts (capabilities belong to a thread,
//! and new threads copy them from the thread that starts them), the daemon keeps only the
//! capabilities its requests need, in the effective and permitted sets, clears the inheritable
//! and ambient sets, and removes every other capability from the bounding set, so that nothing
//! the process becomes later can get them back. A daemon not running as root keeps none.
//!
//! The calls are raw `capget`/`capset`/`prctl`: the bounding set is cleared up to the running
//! kernel's `cap_last_cap`, which may know capabilities no crate's list names yet, and `nix`
//! has no capability calls.

use std::fmt;
use std::io;
use std::str::FromStr;

/// Capability numbers (`linux/capability.h`).
pub const CAP_CHOWN: u32 = 0;
pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_FOWNER: u32 = 3;
pub const CAP_FSETID: u32 = 4;
pub const CAP_SETGID: u32 = 6;
pub const CAP_SETUID: u32 = 7;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_MKNOD: u32 = 27;
pub const CAP_SETFCAP: u32 = 31;

/// Every capability Linux knows, by number, as `--modcaps` spells them (without `cap_`).
const NAMES: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// The capabilities a daemon running as root uses for the guest's requests: creating files as
/// the caller and changing their owners (`CHOWN`, `SETUID`, `SETGID`), acting on files whatever
/// their permissions, as the guest kernel has already checked them (`DAC_OVERRIDE`, `FOWNER`,
/// `FSETID`), device nodes (`MKNOD`), and `security.capability` attributes (`SETFCAP`).
pub const ROOT_CAPS: &[u32] = &[
    CAP_CHOWN,
    CAP_DAC_OVERRIDE,
    CAP_FOWNER,
    CAP_FSETID,
    CAP_SETGID,
    CAP_SETUID,
    CAP_MKNOD,
    CAP_SETFCAP,
];

/// Kept by a root daemon besides [`ROOT_CAPS`]: opening inodes by file handle
/// (`open_by_handle_at`) needs `DAC_READ_SEARCH`. Kept separate so that it can be kept only
/// when file handles are used.
pub const FILE_HANDLE_CAPS: &[u32] = &[CAP_DAC_READ_SEARCH];

/// A set of capabilities, one bit per capability number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapSet(pub u64);

impl CapSet {
    pub fn of(caps: &[u32]) -> CapSet {
        CapSet(caps.iter().fold(0, |s, &c| s | (1 << c)))
    }
    pub fn contains(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1 << cap) != 0
    }
    pub fn insert(&mut self, cap: u32) {
        self.0 |= 1 << cap;
    }
    pub fn remove(&mut self, cap: u32) {
        self.0 &= !(1 << cap);
    }
    /// The capabilities up to and including `last`.
    pub fn upto(self, last: u32) -> CapSet {
        match last {
            63.. => self,
            n => CapSet(self.0 & ((1u64 << (n + 1)) - 1)),
        }
    }
}

impl fmt::Display for CapSet {
    /// The names of the capabilities, comma-separated (`none` when empty).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = (0..64)
            .filter(|&c| self.contains(c))
            .map(|c| match NAMES.get(c as usize) {
                Some(n) => (*n).to_string(),
                None => format!("cap_{c}"),
            })
            .collect();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

/// The number of the capability `name` (lower- or upper-case, with or without `cap_`).
pub fn cap_number(name: &str) -> Option<u32> {
    let lower = name.to_ascii_lowercase();
    let bare = lower.strip_prefix("cap_").unwrap_or(&lower);
    NAMES.iter().position(|n| *n == bare).map(|i| i as u32)
}

/// The changes `--modcaps` asks for, in order: `(true, cap)` adds, `(false, cap)` removes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModCaps(pub Vec<(bool, u32)>);

/// What a refusal of a `--modcaps` list says is expected.
const MODCAPS_FORM: &str = "expected +CAP:-CAP... with capability names such as sys_admin or \
                            mknod (e.g. +sys_admin:-mknod)";

/// Why a `--modcaps` list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModCapsError {
    #[error("an entry is empty (a ':' too many); {form}", form = MODCAPS_FORM)]
    EmptyEntry,
    #[error("entry '{0}' does not start with + (keep) or - (drop); {form}", form = MODCAPS_FORM)]
    NoSign(String),
    #[error("unknown capability '{0}'; {form}", form = MODCAPS_FORM)]
    UnknownCapability(String),
}

impl FromStr for ModCaps {
    type Err = ModCapsError;

    /// Parses `--modcaps`: `:`-separated entries, each `+name` (keep) or `-name` (drop), the
    /// name a capability without `cap_` in any case, e.g. `+sys_admin:-mknod`.
    fn from_str(s: &str) -> Result<ModCaps, ModCapsError> {
        let mut out = Vec::new();
        for entry in s.split(':') {
            let (add, name) = match entry.as_bytes().first() {
                Some(b'+') => (true, &entry[1..]),
                Some(b'-') => (false, &entry[1..]),
                None => return Err(ModCapsError::EmptyEntry),
                Some(_) => return Err(ModCapsError::NoSign(entry.to_owned())),
            };
            let cap =
                cap_number(name).ok_or_else(|| ModCapsError::UnknownCapability(name.to_owned()))?;
            out.push((add, cap));
        }
        Ok(ModCaps(out))
    }
}

/// The capabilities the daemon keeps: [`ROOT_CAPS`] and `extra` when it runs as root, none
/// otherwise; then `--modcaps` applied in order.
pub fn kept(as_root: bool, extra: &[u32], modcaps: &ModCaps) -> CapSet {
    let mut set = if as_root {
        let mut s = CapSet::of(ROOT_CAPS);
        s.0 |= CapSet::of(extra).0;
        s
    } else {
        CapSet::default()
    };
    for &(add, cap) in &modcaps.0 {
        if add {
            set.insert(cap);
        } else {
            set.remove(cap);
        }
    }
    set
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's effective, permitted and inheritable sets.
pub fn current() -> io::Result<(CapSet, CapSet, CapSet)> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `hdr` and `data` are valid, writable and of the layout capget expects for
    // version 3 (a header and two data elements).
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let join =
        |f: fn(&CapData) -> u32| CapSet(u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32));
    Ok((
        join(|d| d.effective),
        join(|d| d.permitted),
        join(|d| d.inheritable),
    ))
}

/// Sets the calling thread's effective, permitted and inheritable sets.
pub fn set(effective: CapSet, permitted: CapSet, inheritable: CapSet) -> io::Result<()> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let split = |s: CapSet, i: usize| (s.0 >> (32 * i)) as u32;
    let data: [CapData; 2] = std::array::from_fn(|i| CapData {
        effective: split(effective, i),
        permitted: split(permitted, i),
        inheritable: split(inheritable, i),
    });
    // SAFETY: `hdr` and `data` are valid and of the layout capset expects for version 3; the
    // kernel only reads `data`.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The highest capability number the running kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(NAMES.len() as u32 - 1)
}

/// Keeps only `keep` (those of it the thread has) in the calling thread's effective and
/// permitted sets, clears its inheritable and ambient sets, and removes every other
/// capability from the bounding set (when the thread may: that needs `CAP_SETPCAP`).
/// Returns the capabilities kept. Call it before any thread starts.
pub fn drop_all_but(keep: CapSet, last: u32) -> io::Result<CapSet> {
    let (eff, permitted, _) = current()?;
    let keep = keep.upto(last);
    let kept = CapSet(keep.0 & permitted.0);
    // SAFETY: prctl with these arguments only clears this thread's ambient set.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    if eff.contains(CAP_SETPCAP) {
        for cap in (0..=last).filter(|&c| !keep.contains(c)) {
            // SAFETY: prctl with these arguments only removes `cap` from this thread's
            // bounding set.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
                let e = io::Error::last_os_error();
                // EINVAL: a capability this kernel does not know.
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
            }
        }
    }
    set(kept, kept, CapSet::default())?;
    Ok(kept)
}

/// Drops `caps` from the calling thread's effective and permitted sets.
pub fn drop_from_thread(caps: CapSet) -> io::Result<()> {
    let (eff, permitted, inheritable) = current()?;
    set(
        CapSet(eff.0 & !caps.0),
        CapSet(permitted.0 & !caps.0),
        CapSet(inheritable.0 & !caps.0),
    )
}

/// A job a [`Keeper`] runs.
pub type Job = Box<dyn FnOnce() + Send>;

/// The one thread that keeps some capabilities, to run jobs with them, until it is closed.
///
/// A capability one rare job needs (`DAC_READ_SEARCH` for a migration destination's
/// `open_by_handle_at`) should not be held by the threads that serve the guest. Capabilities
/// belong to threads: the keeper's thread takes them from the thread that starts it, which then
/// drops them, before any other thread starts. The keeper holds them in its permitted set
/// only, raises them into its effective set for the length of each job, and once closed it
/// drops them from its permitted set too and ends; [`Keeper::close`] returns once they are
/// gone.
pub struct Keeper {
    caps: CapSet,
    jobs: std::sync::Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    /// Hears from the keeper's thread when it has dropped its capabilities (or ended).
    dropped: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    open: std::sync::atomic::AtomicBool,
}

impl Keeper {
    /// Starts the keeper's thread with `caps` (which the calling thread has), then drops them
    /// from the calling thread. Call it before the threads that must not have them start.
    pub fn start(caps: CapSet) -> io::Result<std::sync::Arc<Keeper>> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("virtiofsd-caps".into())
            .spawn(move || {
                // Held, not used, between jobs.
                let lowered = current().and_then(|(eff, p, i)| set(CapSet(eff.0 & !caps.0), p, i));
                let _ = ready_tx.send(lowered);
                while let Ok(job) = rx.recv() {
                    let raised =
                        current().and_then(|(eff, p, i)| set(CapSet(eff.0 | caps.0), p, i));
                    if let Err(e) = raised {
                        log::warn!("cannot raise capabilities {caps} for a job: {e}");
                    }
                    job();
                    if let Ok((eff, p, i)) = current() {
                        let _ = set(CapSet(eff.0 & !caps.0), p, i);
                    }
                }
                // Closed: gone from this thread before `close` returns, not only once the
                // thread has ended.
                if let Err(e) = drop_from_thread(caps) {
                    log::warn!("cannot drop capabilities {caps} from their keeper: {e}");
                }
                let _ = dropped_tx.send(());
            })?;
        ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the capability keeper did not start")))?;
        drop_from_thread(caps)?;
        Ok(std::sync::Arc::new(Keeper {
            caps,
            jobs: std::sync::Mutex::new(Some(tx)),
            dropped: std::sync::Mutex::new(Some(dropped_rx)),
            open: std::sync::atomic::AtomicBool::new(true),
        }))
    }

    /// Runs `job` on the keeper's thread with its capabilities; gives it back when closed.
    pub fn run(&self, job: Job) -> Result<(), Job> {
        let jobs = self
            .jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match jobs.as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Ends the keeper: once the job under way (if any) is done, its thread drops the
    /// capabilities and ends. Returns when no thread of the process has them any more (a
    /// second call, or one made while the first waits, returns at once).
    pub fn close(&self) {
        if self.open.swap(false, std::sync::atomic::Ordering::AcqRel) {
            self.jobs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let dropped = self
                .dropped
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(dropped) = dropped {
                // An error: the thread ended (it panicked in a job), its capabilities with it.
                let _ = dropped.recv();
            }
            log::info!(
                "capabilities {} dropped: they were kept only to load a migration state",
                self.caps
            );
        }
    }

    /// Whether it still runs jobs.
    pub fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_numbered_as_the_kernel_numbers_them() {
        assert_eq!(cap_number("chown"), Some(CAP_CHOWN));
        assert_eq!(cap_number("SYS_ADMIN"), Some(CAP_SYS_ADMIN));
        assert_eq!(cap_number("Mknod"), Some(CAP_MKNOD));
        assert_eq!(cap_number("cap_setfcap"), Some(CAP_SETFCAP));
        assert_eq!(cap_number("dac_read_search"), Some(CAP_DAC_READ_SEARCH));
        assert_eq!(cap_number("checkpoint_restore"), Some(40));
        assert_eq!(cap_number("sys_chroot"), Some(18));
        assert_eq!(cap_number("nonsense"), None);
        assert_eq!(cap_number(""), None);
    }

    #[test]
    fn modcaps_parses_adds_and_removes_in_order() {
        assert_eq!(
            "+sys_admin:-MKNOD".parse::<ModCaps>().unwrap(),
            ModCaps(vec![(true, CAP_SYS_ADMIN), (false, CAP_MKNOD)])
        );
        assert_eq!(
            "-chown".parse::<ModCaps>().unwrap(),
            ModCaps(vec![(false, CAP_CHOWN)])
        );
    }

    #[test]
    fn bad_modcaps_are_refused_saying_the_form() {
        for bad in [
            "",
            "sys_admin",
            "+",
            "+sys_admin:",
            "+nonsense",
            "*chown",
            "+sys admin",
        ] {
            let e = bad.parse::<ModCaps>().unwrap_err().to_string();
            assert!(e.contains("expected +CAP:-CAP..."), "{bad}: {e}");
        }
        let e = "+nonsense".parse::<ModCaps>().unwrap_err();
        assert_eq!(e, ModCapsError::UnknownCapability("nonsense".into()));
        let e = "+chown::-mknod".parse::<ModCaps>().unwrap_err();
        assert_eq!(e, ModCapsError::EmptyEntry);
        let e = "*chown".parse::<ModCaps>().unwrap_err();
        assert_eq!(e, ModCapsError::NoSign("*chown".into()));
    }

    #[test]
    fn root_keeps_its_list_and_modcaps_adjusts_it() {
        let base = kept(true, &[], &ModCaps::default());
        assert_eq!(base, CapSet(0x8800_00db));
        assert_eq!(
            base.to_string(),
            "chown,dac_override,fowner,fsetid,setgid,setuid,mknod,setfcap"
        );
        let with_fh = kept(true, FILE_HANDLE_CAPS, &ModCaps::default());
        assert_eq!(with_fh, CapSet(0x8800_00df));
        let m = "+sys_admin:-mknod".parse::<ModCaps>().unwrap();
        let adjusted = kept(true, FILE_HANDLE_CAPS, &m);
        assert!(adjusted.contains(CAP_SYS_ADMIN) && !adjusted.contains(CAP_MKNOD));
        assert_eq!(adjusted.0, (0x8800_00df | 1 << 21) & !(1 << 27));
        // Later entries win.
        let m = "-chown:+chown:-setuid".parse::<ModCaps>().unwrap();
        let s = kept(true, &[], &m);
        assert!(s.contains(CAP_CHOWN) && !s.contains(CAP_SETUID));
    }

    #[test]
    fn a_daemon_not_root_keeps_only_what_modcaps_adds() {
        assert_eq!(
            kept(false, FILE_HANDLE_CAPS, &ModCaps::default()),
            CapSet(0)
        );
        let m = "+mknod:-chown".parse::<ModCaps>().unwrap();
        assert_eq!(kept(false, &[], &m), CapSet::of(&[CAP_MKNOD]));
    }

    #[test]
    fn sets_are_cut_at_the_last_capability() {
        let all = CapSet(u64::MAX);
        assert_eq!(all.upto(40).0, (1 << 41) - 1);
        assert_eq!(all.upto(63), all);
        assert_eq!(CapSet(0).to_string(), "none");
    }

    #[test]
    fn current_reads_this_threads_sets() {
        let (eff, permitted, _) = current().unwrap();
        assert_eq!(
            eff.0 & !permitted.0,
            0,
            "effective is a subset of permitted"
        );
    }
}
