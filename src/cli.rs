//! The command line: flags spelled as the reference `virtiofsd` spells them, turned into a
//! checked [`DaemonConfig`].

use std::path::PathBuf;

use clap::Parser;

use crate::daemon::{DaemonConfig, SocketSpec};
use crate::idmap::Translation;
use crate::passthrough::{CacheMode, Config};
use crate::userns::{self, IdMapRange};

/// vhost-user virtio-fs daemon: serves a host directory to a guest.
#[derive(Debug, Parser)]
#[command(name = "virtiofsd", version, about)]
pub struct Args {
    /// Shared directory path
    #[arg(long = "shared-dir", value_name = "DIR")]
    pub shared_dir: Option<PathBuf>,

    /// vhost-user socket path
    #[arg(long = "socket-path", value_name = "PATH")]
    pub socket_path: Option<PathBuf>,

    /// File descriptor of an already-listening vhost-user socket
    #[arg(long = "fd", value_name = "FD", conflicts_with = "socket_path")]
    pub fd: Option<i32>,

    /// Tag exposed in the device's configuration space (QEMU normally sets the tag itself)
    #[arg(long = "tag", value_name = "TAG")]
    pub tag: Option<String>,

    /// Threads per daemon that serve requests; 0 serves each queue on its own thread only
    #[arg(long = "thread-pool-size", value_name = "N", default_value_t = 0)]
    pub thread_pool_size: usize,

    /// Caching policy the guest may use: never, metadata, auto or always
    #[arg(long = "cache", value_name = "MODE", default_value = "auto")]
    pub cache: String,

    /// Enable extended attributes
    #[arg(long = "xattr")]
    pub xattr: bool,

    /// Share the directory read-only
    #[arg(long = "readonly")]
    pub readonly: bool,

    /// Disable READDIRPLUS (the guest then looks up entries one by one)
    #[arg(long = "no-readdirplus")]
    pub no_readdirplus: bool,

    /// Enable the guest's writeback cache
    #[arg(long = "writeback")]
    pub writeback: bool,

    /// Sandbox mechanism; only "none" is available in this version
    #[arg(long = "sandbox", value_name = "KIND", default_value = "none")]
    pub sandbox: String,

    /// Seccomp policy; only "none" is available in this version
    #[arg(long = "seccomp", value_name = "ACTION", default_value = "none")]
    pub seccomp: String,

    /// Log level: error, warn, info, debug, trace or off
    #[arg(long = "log-level", value_name = "LEVEL", default_value = "info")]
    pub log_level: String,

    /// Translate uids between guest and host inside the daemon (no user namespace needed);
    /// repeat for several ranges
    ///
    /// RULE is TYPE:SOURCE:TARGET:COUNT, COUNT ids from SOURCE:
    ///
    /// - guest:G:H:N          guest uids G.. become host uids H.. (guest to host only)
    ///
    /// - host:H:G:N           host uids H.. are shown as guest uids G.. (host to guest only)
    ///
    /// - map:G:H:N            both directions: guest G.. is host H..
    ///
    /// - squash-guest:G:H:N   every guest uid G.. becomes host uid H
    ///
    /// - squash-host:H:G:N    every host uid H.. is shown as guest uid G
    ///
    /// - forbid-guest:G:N     creating files as, or chowning files to, guest uids G.. fails
    ///   with EPERM
    ///
    /// Uids no rule covers are passed unchanged. Rules may not overlap in the same direction.
    /// While any translation is active, POSIX ACL attributes are refused (EOPNOTSUPP).
    #[arg(
        long = "translate-uid",
        value_name = "RULE",
        action = clap::ArgAction::Append
    )]
    pub translate_uid: Vec<String>,

    /// Translate gids between guest and host inside the daemon; same rules as --translate-uid
    #[arg(long = "translate-gid", value_name = "RULE", action = clap::ArgAction::Append)]
    pub translate_gid: Vec<String>,

    /// Run the daemon in a user namespace mapping this range of uids from the host, given as
    /// :namespace_uid:host_uid:count: (repeat for several ranges)
    #[arg(long = "uid-map", value_name = "MAP", action = clap::ArgAction::Append)]
    pub uid_map: Vec<String>,

    /// Run the daemon in a user namespace mapping this range of gids from the host, given as
    /// :namespace_gid:host_gid:count: (repeat for several ranges)
    #[arg(long = "gid-map", value_name = "MAP", action = clap::ArgAction::Append)]
    pub gid_map: Vec<String>,
}

/// Parses and checks every occurrence of `--uid-map` or `--gid-map` (`flag`).
fn id_maps(flag: &str, specs: &[String]) -> Result<Vec<IdMapRange>, UsageError> {
    let maps = specs
        .iter()
        .map(|s| userns::parse_map(flag, s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    userns::check_maps(flag, &maps).map_err(usage)?;
    Ok(maps)
}

/// A command line that parsed but does not make sense.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// Parses `--log-level`.
pub fn log_level(s: &str) -> Result<log::LevelFilter, UsageError> {
    match s {
        "error" => Ok(log::LevelFilter::Error),
        "warn" => Ok(log::LevelFilter::Warn),
        "info" => Ok(log::LevelFilter::Info),
        "debug" => Ok(log::LevelFilter::Debug),
        "trace" => Ok(log::LevelFilter::Trace),
        "off" => Ok(log::LevelFilter::Off),
        _ => Err(usage(format!(
            "--log-level: invalid level '{s}': expected one of error, warn, info, debug, trace, off"
        ))),
    }
}

impl TryFrom<Args> for DaemonConfig {
    type Error = UsageError;

    fn try_from(a: Args) -> Result<Self, UsageError> {
        let shared_dir = a
            .shared_dir
            .ok_or_else(|| usage("--shared-dir: missing; expected --shared-dir=DIR"))?;
        if !shared_dir.is_dir() {
            return Err(usage(format!(
                "--shared-dir: '{}' is not a directory; expected --shared-dir=DIR",
                shared_dir.display()
            )));
        }
        let socket = match (a.socket_path, a.fd) {
            (Some(p), None) => SocketSpec::Path(p),
            (None, Some(fd)) if fd >= 0 => SocketSpec::Fd(fd),
            (None, Some(fd)) => {
                return Err(usage(format!(
                    "--fd: invalid file descriptor {fd}; expected --fd=N with N >= 0"
                )))
            }
            _ => {
                return Err(usage(
                    "--socket-path: missing; expected --socket-path=PATH or --fd=N",
                ))
            }
        };
        let cache: CacheMode = a
            .cache
            .parse()
            .map_err(|e| usage(format!("--cache: {e}")))?;
        if let Some(tag) = &a.tag {
            if tag.is_empty() || tag.len() > 36 {
                return Err(usage("--tag: expected a tag of 1 to 36 bytes"));
            }
        }
        if a.sandbox != "none" {
            return Err(usage(format!(
                "--sandbox={}: not implemented yet in this version; use --sandbox=none",
                a.sandbox
            )));
        }
        if a.seccomp != "none" {
            return Err(usage(format!(
                "--seccomp={}: not implemented yet in this version; use --seccomp=none",
                a.seccomp
            )));
        }
        log_level(&a.log_level)?;
        // No --posix-acl flag exists in this version, so there is no combination to refuse;
        // the translating filesystem refuses the ACL attributes instead.
        let translate = Translation::parse(&a.translate_uid, &a.translate_gid).map_err(usage)?;
        let uid_map = id_maps("--uid-map", &a.uid_map)?;
        let gid_map = id_maps("--gid-map", &a.gid_map)?;
        let mut fs = Config::new(shared_dir, cache);
        fs.xattr = a.xattr;
        fs.readonly = a.readonly;
        fs.readdirplus = !a.no_readdirplus;
        fs.writeback = a.writeback;
        Ok(DaemonConfig {
            fs,
            socket,
            tag: a.tag,
            thread_pool_size: a.thread_pool_size,
            translate,
            uid_map,
            gid_map,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<DaemonConfig, UsageError> {
        let mut v = vec!["virtiofsd"];
        v.extend_from_slice(args);
        DaemonConfig::try_from(Args::try_parse_from(v).expect("clap accepts"))
    }

    #[test]
    fn minimal_command_line_gives_auto_cache_and_socket_path() {
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/tmp/s"]).unwrap();
        assert_eq!(c.socket, SocketSpec::Path("/tmp/s".into()));
        assert_eq!(c.fs.cache, CacheMode::Auto);
        assert!(!c.fs.readonly && !c.fs.xattr && c.fs.readdirplus);
    }

    #[test]
    fn missing_socket_is_refused_naming_the_flag() {
        let e = parse(&["--shared-dir=/tmp"]).unwrap_err();
        assert!(e.0.contains("--socket-path"), "{e}");
    }

    #[test]
    fn bad_cache_mode_is_refused_naming_the_choices() {
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--cache=sometimes"]).unwrap_err();
        assert!(e.0.starts_with("--cache:") && e.0.contains("always"), "{e}");
    }

    #[test]
    fn shared_dir_must_exist() {
        let e = parse(&["--shared-dir=/nonexistent/dir", "--socket-path=/s"]).unwrap_err();
        assert!(e.0.starts_with("--shared-dir:"), "{e}");
    }

    #[test]
    fn unimplemented_sandbox_is_refused_not_ignored() {
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--sandbox=namespace",
        ])
        .unwrap_err();
        assert!(e.0.contains("not implemented"), "{e}");
    }

    #[test]
    fn flags_map_to_the_filesystem_config() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--fd=3",
            "--cache=always",
            "--xattr",
            "--readonly",
            "--no-readdirplus",
            "--thread-pool-size=4",
        ])
        .unwrap();
        assert_eq!(c.socket, SocketSpec::Fd(3));
        assert_eq!(c.fs.cache, CacheMode::Always);
        assert!(c.fs.xattr && c.fs.readonly && !c.fs.readdirplus);
        assert_eq!(c.thread_pool_size, 4);
    }

    #[test]
    fn translate_flags_repeat_and_reach_the_config() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--translate-uid=map:0:100000:65536",
            "--translate-uid",
            "forbid-guest:70000:10",
            "--translate-gid=squash-host:0:100:1000",
        ])
        .unwrap();
        assert_eq!(c.translate.uid.to_host(5), Ok(100005));
        assert!(c.translate.uid.to_host(70009).is_err());
        assert_eq!(c.translate.gid.to_guest(999), 100);
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        assert!(c.translate.is_empty());
    }

    #[test]
    fn bad_translate_rules_are_refused_naming_the_flag_and_the_form() {
        for (args, flag) in [
            (&["--translate-uid=map:0:1000"][..], "--translate-uid"),
            (&["--translate-gid=guest:0:1000:0"][..], "--translate-gid"),
            (
                &["--translate-gid=guest:4294967290:0:10"][..],
                "--translate-gid",
            ),
            (
                &[
                    "--translate-uid=guest:0:1000:10",
                    "--translate-uid=map:9:0:1",
                ][..],
                "--translate-uid",
            ),
        ] {
            let mut v = vec!["--shared-dir=/tmp", "--socket-path=/s"];
            v.extend_from_slice(args);
            let e = parse(&v).unwrap_err();
            assert!(e.0.starts_with(&format!("{flag}: invalid rule '")), "{e}");
            assert!(
                e.0.contains("<type>:<source base>:<target base>:<count>"),
                "{e}"
            );
        }
    }

    #[test]
    fn id_maps_repeat_and_reach_the_config() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--uid-map=:0:100000:65536:",
            "--gid-map=:0:100000:1000:",
            "--gid-map=:1000:200000:10:",
        ])
        .unwrap();
        assert_eq!(c.uid_map.len(), 1);
        assert_eq!(c.gid_map.len(), 2);
        assert_eq!(c.uid_map[0].host_id, 100000);
    }

    #[test]
    fn malformed_id_map_is_refused_naming_the_flag() {
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--uid-map=0:1:2"]).unwrap_err();
        assert!(e.0.starts_with("--uid-map:"), "{e}");
    }

    #[test]
    fn log_level_refusal_names_the_flag() {
        assert!(log_level("loud").unwrap_err().0.starts_with("--log-level:"));
        assert_eq!(log_level("debug").unwrap(), log::LevelFilter::Debug);
    }
}
