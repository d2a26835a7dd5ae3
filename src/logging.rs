//! Where log records go: stderr (the default, through `env_logger`) or syslog (`--syslog`).
//!
//! Both honour the level of `--log-level` and, when set, the filters of `RUST_LOG`.

use std::io::{self, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The syslog identity of the daemon's messages; each line carries it as `virtiofsd[PID]`.
const IDENT: &str = "virtiofsd";

/// The pid shown in the syslog tag `virtiofsd[PID]` (see [`set_pid`]).
static PID: AtomicU32 = AtomicU32::new(0);

/// Tells syslog the pid to show from now on: a sandboxed child calls it with its pid as the
/// host (the launcher's pid namespace) numbers it, learned before it hides the host's `/proc`
/// (inside its pid namespace `getpid()` says 1).
pub fn set_pid(pid: u32) {
    PID.store(pid, Ordering::Relaxed);
}

/// This process's pid as numbered in the pid namespace of the mounted `/proc` (the host's,
/// until a sandbox mounts its own): `/proc/self` links to it. Falls back to `getpid()`.
pub fn pid_seen_by_proc() -> u32 {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id)
}

/// Bytes a guest chose (a name, an attribute name), escaped for a log line: printable ASCII as
/// it is, anything else (and the backslash) as `\xNN`, so that a name can neither forge a line
/// (a newline, a terminal escape) nor hide what it is.
pub fn escaped(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

/// Where syslog listens.
const DEV_LOG: &str = "/dev/log";

/// A connection to the syslog daemon: `/dev/log` is a datagram socket, or on a few systems a
/// stream one (whose records end with a NUL byte, as `syslog(3)` sends them).
enum Conn {
    Datagram(UnixDatagram),
    Stream(UnixStream),
}

impl Conn {
    /// Connects to [`DEV_LOG`]; only at start: once the sandbox has made the shared directory
    /// the root, that name would be looked up among the guest's files.
    fn open() -> io::Result<Conn> {
        let dgram = UnixDatagram::unbound().and_then(|s| s.connect(DEV_LOG).map(|()| s));
        match dgram {
            Ok(s) => Ok(Conn::Datagram(s)),
            Err(_) => UnixStream::connect(DEV_LOG).map(Conn::Stream),
        }
    }

    fn send(&mut self, line: &[u8]) -> io::Result<()> {
        match self {
            Conn::Datagram(s) => s.send(line).map(drop),
            Conn::Stream(s) => {
                s.write_all(line)?;
                s.write_all(b"\0")
            }
        }
    }
}

/// Whether a syslog daemon listens on `/dev/log` (a datagram socket, or a stream one): a
/// socket file left by a stopped one would swallow every line, the last error too.
pub fn syslog_listens() -> bool {
    Conn::open().is_ok()
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

/// A [`Log`] that sends each record to the syslog daemon over the connection made at start,
/// as `<PRI>Mmm dd hh:mm:ss virtiofsd[PID]: text`. The connection is never made again by path
/// (see `Conn::open`): a record that cannot be sent goes to stderr.
pub struct Syslog {
    filter: env_logger::Logger,
    conn: Mutex<Option<Conn>>,
}

impl Syslog {
    /// Connects to syslog and installs the logger for `level`. The tag carries this process's
    /// pid until [`set_pid`] says another.
    pub fn init(level: LevelFilter) -> Result<(), SyslogError> {
        // The local time zone is read now, while /etc/localtime can still be reached.
        // SAFETY: tzset only reads the environment and the zone file; no other thread runs yet.
        unsafe { tzset() };
        set_pid(std::process::id());
        let conn = Conn::open().map_err(SyslogError::Connect)?;
        let logger = Syslog {
            filter: filter(level),
            conn: Mutex::new(Some(conn)),
        };
        let max = logger.filter.filter();
        log::set_boxed_logger(Box::new(logger)).map_err(SyslogError::Logger)?;
        log::set_max_level(max);
        Ok(())
    }
}

/// Why `--syslog` could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SyslogError {
    #[error("cannot connect to {DEV_LOG}")]
    Connect(#[source] io::Error),
    #[error("a logger is installed already")]
    Logger(#[source] log::SetLoggerError),
}

extern "C" {
    fn tzset();
}

/// The syslog line of a record at `now` (seconds since the epoch): priority, local time, tag
/// with the pid of [`set_pid`], text. NUL bytes, which a stream record cannot carry, are
/// escaped.
fn line(record: &Record<'_>, now: libc::time_t) -> Vec<u8> {
    // SAFETY: tm is plain data, for which all-zero bytes are a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let mut stamp = [0u8; 32];
    // SAFETY: localtime_r writes the local `tm`; strftime writes at most `stamp.len()` bytes
    // into `stamp` and returns how many, with a NUL-terminated static format.
    let n = unsafe {
        libc::localtime_r(&now, &mut tm);
        libc::strftime(
            stamp.as_mut_ptr().cast(),
            stamp.len(),
            c"%b %e %H:%M:%S".as_ptr(),
            &tm,
        )
    };
    let text = format!("{}", record.args()).replace('\0', "\\0");
    let mut out = format!("<{}>", priority(record.level())).into_bytes();
    out.extend_from_slice(&stamp[..n]);
    out.extend_from_slice(format!(" {IDENT}[{}]: {text}", PID.load(Ordering::Relaxed)).as_bytes());
    out
}

impl Log for Syslog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.filter.matches(record) {
            return;
        }
        // SAFETY: time(NULL) only reads the clock.
        let now = unsafe { libc::time(std::ptr::null_mut()) };
        let line = line(record, now);
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = conn.as_mut().is_some_and(|c| c.send(&line).is_ok());
        if !sent {
            // The syslog daemon went away: it is not looked for again (see `Conn::open`).
            *conn = None;
            drop(conn);
            eprintln!("virtiofsd: {}", String::from_utf8_lossy(&line));
        }
    }

    fn flush(&self) {}
}

/// `log::warn!` through a rate limit of the call site's own, for the warnings a guest can cause
/// at will: the protocol crate's, which its FUSE server uses too.
pub(crate) use virtiofs_fuse::throttle::warn_throttled;

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
    fn a_line_carries_priority_time_tag_and_pid() {
        set_pid(4242);
        let args = format_args!("hello");
        let record = Record::builder().args(args).level(Level::Warn).build();
        let l = String::from_utf8(line(&record, 0)).unwrap();
        let pri = format!("<{}>", libc::LOG_USER | libc::LOG_WARNING);
        assert!(l.starts_with(&pri), "{l}");
        // "Mmm dd hh:mm:ss" of some time zone on the first day of 1970 or the last of 1969.
        assert_eq!(
            l.len(),
            pri.len() + 15 + " virtiofsd[4242]: hello".len(),
            "{l}"
        );
        assert!(l.ends_with(" virtiofsd[4242]: hello"), "{l}");
    }

    #[test]
    fn proc_self_names_this_process() {
        // The tests run in the pid namespace of the mounted /proc.
        assert_eq!(pid_seen_by_proc(), std::process::id());
    }

    #[test]
    fn guest_bytes_are_escaped_for_a_log_line() {
        assert_eq!(escaped(b"plain name.txt"), "plain name.txt");
        assert_eq!(
            escaped(b"a\nfake [ERROR] line\x1b[2J\\\xff"),
            "a\\x0afake [ERROR] line\\x1b[2J\\x5c\\xff"
        );
    }

    #[test]
    fn messages_with_nul_bytes_are_escaped() {
        let args = format_args!("a\0b");
        let record = Record::builder().args(args).level(Level::Info).build();
        assert!(line(&record, 0).ends_with(b": a\\0b"));
    }
}
