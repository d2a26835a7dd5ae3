//! Where log records go: stderr (the default, through `env_logger`) or syslog (`--syslog`).
//!
//! Both honour the level of `--log-level` and, when set, the filters of `RUST_LOG`.

use std::ffi::CString;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The syslog identity of the daemon's messages.
const IDENT: &std::ffi::CStr = c"virtiofsd";

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
    /// Opens the connection to syslog (ident "virtiofsd", with the pid) and installs the
    /// logger for `level`.
    pub fn init(level: LevelFilter) -> Result<(), log::SetLoggerError> {
        // SAFETY: IDENT is a NUL-terminated string with static lifetime, as openlog requires
        // (it keeps the pointer).
        unsafe {
            libc::openlog(
                IDENT.as_ptr(),
                libc::LOG_PID | libc::LOG_NDELAY,
                libc::LOG_USER,
            )
        };
        let logger = Syslog {
            filter: filter(level),
        };
        let max = logger.filter.filter();
        log::set_boxed_logger(Box::new(logger))?;
        log::set_max_level(max);
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
    fn messages_with_nul_bytes_are_escaped() {
        let args = format_args!("a\0b");
        let record = Record::builder().args(args).level(Level::Info).build();
        assert_eq!(message(&record).as_bytes(), b"a\\0b");
    }
}
