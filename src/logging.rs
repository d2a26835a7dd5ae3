//! Where log records go: stderr (the default, through `env_logger`) or syslog (`--syslog`).
//!
//! Both honour the level of `--log-level` and, when set, the filters of `RUST_LOG`.

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The syslog identity of the daemon's messages; each line carries it as `virtiofsd[PID]`.
const IDENT: &str = "virtiofsd";

/// Whether [`Syslog::init`] installed the syslog logger (so that [`set_pid`] retags it).
static SYSLOG: AtomicBool = AtomicBool::new(false);

/// The syslog tag `virtiofsd[PID]`, leaked: `openlog(3)` keeps the pointer. Made once at start
/// and once more in a sandboxed child.
fn tag(pid: u32) -> &'static CStr {
    let tag = CString::new(format!("{IDENT}[{pid}]")).unwrap_or_default();
    Box::leak(tag.into_boxed_c_str())
}

/// `openlog(3)` with the tag of `pid` (the pid is in the tag, not added by syslog from
/// `getpid()`, which says 1 inside the sandbox's pid namespace). `LOG_NDELAY` connects to
/// `/dev/log` now, while it can still be reached; a later call keeps that connection.
fn open(pid: u32) {
    // SAFETY: the tag is a NUL-terminated string with static lifetime, as openlog requires (it
    // keeps the pointer).
    unsafe { libc::openlog(tag(pid).as_ptr(), libc::LOG_NDELAY, libc::LOG_USER) };
}

/// Tells syslog the pid to show from now on: a sandboxed child calls it with its pid as the
/// host (the launcher's pid namespace) numbers it, learned before it hides the host's `/proc`.
/// Does nothing unless logging goes to syslog.
pub fn set_pid(pid: u32) {
    if SYSLOG.load(Ordering::Relaxed) {
        open(pid);
    }
}

/// This process's pid as numbered in the pid namespace of the mounted `/proc` (the host's,
/// until a sandbox mounts its own): `/proc/self` links to it. Falls back to `getpid()`.
pub fn pid_seen_by_proc() -> u32 {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id)
}

/// Whether a syslog daemon listens on `/dev/log` (a datagram socket, or a stream one): a
/// socket file left by a stopped one would swallow every line, the last error too.
pub fn syslog_listens() -> bool {
    let path = "/dev/log";
    std::os::unix::net::UnixDatagram::unbound().is_ok_and(|s| s.connect(path).is_ok())
        || std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// The filter of `--log-level` refined by `RUST_LOG`.
fn filter(level: LevelFilter) -> env_logger::Logger {
    env_logger::Builder::new()
        .filter_level(level)
        .parse_env("RUST_LOG")
        .build()
}

/// Sends log records to stderr with millisecond timestamps.
pub fn init_stderr(level: LevelFilter) {
    env_logger::Builder::new()
        .filter_level(level)
        .parse_env("RUST_LOG")
        .format_timestamp_millis()
        .init();
}

/// The syslog priority of a log level (facility `LOG_USER`, as the reference daemon uses).
pub fn priority(level: Level) -> libc::c_int {
    let severity = match level {
        Level::Error => libc::LOG_ERR,
        Level::Warn => libc::LOG_WARNING,
        Level::Info => libc::LOG_INFO,
        Level::Debug | Level::Trace => libc::LOG_DEBUG,
    };
    libc::LOG_USER | severity
}

/// A [`Log`] that writes each record with `syslog(3)`.
pub struct Syslog {
    filter: env_logger::Logger,
}

impl Syslog {
    /// Opens the connection to syslog (tag `virtiofsd[PID]`, see [`set_pid`]) and installs
    /// the logger for `level`.
    pub fn init(level: LevelFilter) -> Result<(), log::SetLoggerError> {
        open(std::process::id());
        let logger = Syslog {
            filter: filter(level),
        };
        let max = logger.filter.filter();
        log::set_boxed_logger(Box::new(logger))?;
        log::set_max_level(max);
        SYSLOG.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The text of a record as a C string; NUL bytes, which syslog cannot carry, are escaped.
fn message(record: &Record<'_>) -> CString {
    let text = format!("{}", record.args()).replace('\0', "\\0");
    CString::new(text).unwrap_or_default()
}

impl Log for Syslog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.filter.matches(record) {
            return;
        }
        let msg = message(record);
        // SAFETY: the format is a static "%s" and `msg` a NUL-terminated string that outlives
        // the call.
        unsafe { libc::syslog(priority(record.level()), c"%s".as_ptr(), msg.as_ptr()) };
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_severities() {
        assert_eq!(priority(Level::Error), libc::LOG_USER | libc::LOG_ERR);
        assert_eq!(priority(Level::Warn), libc::LOG_USER | libc::LOG_WARNING);
        assert_eq!(priority(Level::Info), libc::LOG_USER | libc::LOG_INFO);
        assert_eq!(priority(Level::Debug), libc::LOG_USER | libc::LOG_DEBUG);
        assert_eq!(priority(Level::Trace), libc::LOG_USER | libc::LOG_DEBUG);
    }

    #[test]
    fn the_tag_carries_the_pid() {
        assert_eq!(tag(4242), c"virtiofsd[4242]");
    }

    #[test]
    fn proc_self_names_this_process() {
        // The tests run in the pid namespace of the mounted /proc.
        assert_eq!(pid_seen_by_proc(), std::process::id());
    }

    #[test]
    fn messages_with_nul_bytes_are_escaped() {
        let args = format_args!("a\0b");
        let record = Record::builder().args(args).level(Level::Info).build();
        assert_eq!(message(&record).as_bytes(), b"a\\0b");
    }
}
