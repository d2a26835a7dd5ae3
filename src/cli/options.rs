//! The legacy forms of the command line: the `-o a,b=c` options of the old C virtiofsd,
//! applied onto the flags, and the deprecated spellings, each of which earns a warning.

use std::path::PathBuf;
use std::str::FromStr;

use clap::ValueEnum;
use log::LevelFilter;

use super::args::Switch;
use super::args::LOG_LEVELS;
use super::{Args, UsageError};
use crate::passthrough::Negotiate;

/// Parses the value of a legacy `-o` option (`flag`, e.g. `-o sandbox`) that names one of the
/// choices of `T`; an invalid value is refused naming `what` and the listed choices.
fn legacy_choice<T: ValueEnum>(
    flag: &str,
    what: &'static str,
    value: &str,
) -> Result<T, UsageError> {
    T::from_str(value, false).map_err(|_| {
        let listed = T::value_variants()
            .iter()
            .filter_map(T::to_possible_value)
            .filter(|p| !p.is_hide_set())
            .map(|p| p.get_name().to_owned());
        invalid_choice(flag, what, value, listed)
    })
}

/// Parses the value of a legacy `-o` option as its flag does; `refused` makes the refusal of
/// the value, from the value and why.
fn legacy_parse<T: FromStr>(
    value: &str,
    refused: fn(String, T::Err) -> UsageError,
) -> Result<T, UsageError> {
    value.parse().map_err(|e| refused(value.to_owned(), e))
}

/// Parses `-o loglevel=LEVEL`: a level of `--log-level`, or "err", the old C virtiofsd's
/// spelling of "error".
fn legacy_level(value: &str) -> Result<LevelFilter, UsageError> {
    let level = if value == "err" { "error" } else { value };
    match LOG_LEVELS.contains(&level).then(|| level.parse()) {
        Some(Ok(l)) => Ok(l),
        _ => Err(invalid_choice("-o loglevel", "level", value, LOG_LEVELS)),
    }
}

/// The refusal of `value`, not one of the `choices` of the legacy option `flag`.
fn invalid_choice(
    flag: &str,
    what: &'static str,
    value: &str,
    choices: impl IntoIterator<Item = impl Into<String>>,
) -> UsageError {
    let choices: Vec<String> = choices.into_iter().map(Into::into).collect();
    UsageError::LegacyValue {
        flag: flag.to_owned(),
        what,
        value: value.to_owned(),
        expected: choices.join(", "),
    }
}

/// The deprecation warning for flag spellings kept only for old command lines.
fn deprecated(what: &str, instead: &str) -> String {
    format!("warning: {what} is deprecated; {instead}")
}

impl Args {
    /// Applies the legacy forms onto the flags: the `-o` options, then `-d`. Returns a warning
    /// for each deprecated form given.
    pub(super) fn apply_legacy_forms(&mut self) -> Result<Vec<String>, UsageError> {
        let mut warnings = Vec::new();
        if !self.compat_options.is_empty() {
            warnings.push(deprecated(
                "-o",
                "give the options as flags (e.g. --cache=auto instead of -o cache=auto)",
            ));
        }
        self.apply_compat_options()?;
        if self.compat_debug {
            warnings.push(deprecated("-d", "use --log-level=debug"));
            self.log_level = LevelFilter::Debug;
        }
        if self.compat_foreground {
            warnings.push(deprecated(
                "-f",
                "it has no effect (the daemon always runs in the foreground); remove it",
            ));
        }
        if self.socket.is_some() {
            warnings.push(deprecated("--socket", "use --socket-path"));
        }
        if self.inode_file_handles.fallback {
            warnings.push(deprecated(
                "--inode-file-handles=fallback",
                "use --inode-file-handles=prefer",
            ));
        }
        Ok(warnings)
    }

    /// Applies the legacy `-o a,b=c` options onto the flags. As with the reference, they apply
    /// after the other flags, whatever their order.
    fn apply_compat_options(&mut self) -> Result<(), UsageError> {
        let options: Vec<String> = self
            .compat_options
            .iter()
            .flat_map(|o| o.split(','))
            // A stray comma ("cache=auto,") leaves an empty item: nothing to apply.
            .filter(|o| !o.is_empty())
            .map(str::to_owned)
            .collect();
        for opt in options {
            self.apply_compat_option(&opt)?;
        }
        Ok(())
    }

    fn apply_compat_option(&mut self, opt: &str) -> Result<(), UsageError> {
        let flag = format!("-o {opt}");
        let value_for = |name: &str| format!("-o {name}");
        match opt.split_once('=') {
            Some(("source", dir)) => self.shared_dir = Some(PathBuf::from(dir)),
            Some(("cache", mode)) => {
                self.cache = legacy_choice(&value_for("cache"), "cache mode", mode)?;
            }
            Some(("loglevel" | "log_level", level)) => self.log_level = legacy_level(level)?,
            Some(("sandbox", kind)) => {
                self.sandbox = legacy_choice(&value_for("sandbox"), "value", kind)?;
            }
            Some(("xattrmap", rules)) => {
                self.xattrmap = Some(legacy_parse(rules, UsageError::LegacyXattrmap)?);
            }
            Some(("modcaps", caps)) => {
                self.modcaps = Some(legacy_parse(caps, UsageError::LegacyModcaps)?);
            }
            Some(("timeout", _)) => return Err(UsageError::LegacyTimeout(flag)),
            Some(_) => return Err(UsageError::UnknownLegacy(flag)),
            None => match opt {
                "xattr" => self.xattr = true,
                "no_xattr" => self.xattr = false,
                "readdirplus" => self.no_readdirplus = false,
                "no_readdirplus" => self.no_readdirplus = true,
                "writeback" => self.writeback = true,
                "no_writeback" => self.writeback = false,
                "allow_direct_io" => self.allow_direct_io = true,
                "no_allow_direct_io" => self.allow_direct_io = false,
                "killpriv_v2" => {
                    self.killpriv_v2 = true;
                    self.no_killpriv_v2 = false;
                }
                "no_killpriv_v2" => self.killpriv_v2 = false,
                "posix_acl" => self.posix_acl = Negotiate::Always,
                "no_posix_acl" => self.posix_acl = Negotiate::Never,
                "security_label" => self.security_label = Negotiate::Always,
                "no_security_label" => self.security_label = Negotiate::Never,
                // The reference's spellings: locks kept in the guest, or held on the host.
                "posix_lock" => self.posix_lock = Switch::On,
                "no_posix_lock" => self.posix_lock = Switch::Off,
                "flock" => self.flock = Switch::On,
                "no_flock" => self.flock = Switch::Off,
                "announce_submounts" => {
                    self.announce_submounts = true;
                    self.no_announce_submounts = false;
                }
                "norace" => return Err(UsageError::LegacyUnsupported(flag)),
                _ => return Err(UsageError::UnknownLegacy(flag)),
            },
        }
        Ok(())
    }
}
