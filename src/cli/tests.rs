//! The command line's unit tests: flags to settings, and the refusals.

use clap::Parser;

use super::*;
use crate::passthrough::CacheMode;
use crate::sandbox::{caps, seccomp, SandboxMode};

fn settings_with(args: &[&str], activated: Option<RawFd>) -> Result<Box<Settings>, UsageError> {
    let mut v = vec!["virtiofsd"];
    v.extend_from_slice(args);
    match Args::try_parse_from(v)
        .expect("clap accepts")
        .into_command(|| Ok(activated))?
    {
        Command::Run(s) => Ok(s),
        Command::PrintCapabilities => panic!("not a run"),
    }
}

fn settings(args: &[&str]) -> Result<Box<Settings>, UsageError> {
    settings_with(args, None)
}

fn parse(args: &[&str]) -> Result<DaemonConfig, UsageError> {
    settings(args).map(|s| s.daemon)
}

/// The settings of a command line of a shared directory, a socket path and `extra`.
fn run(extra: &[&str]) -> Result<Box<Settings>, UsageError> {
    let mut v = vec!["--shared-dir=/tmp", "--socket-path=/s"];
    v.extend_from_slice(extra);
    settings(&v)
}

/// The daemon configuration of a command line of a shared directory, a socket path and `extra`.
fn config(extra: &[&str]) -> Result<DaemonConfig, UsageError> {
    run(extra).map(|s| s.daemon)
}

/// What clap says when it refuses `args` (after a shared directory and a socket path);
/// checks that it exits with status 2 and says each of `says`.
fn clap_refuses(args: &[&str], says: &[&str]) -> String {
    let mut v = vec!["virtiofsd", "--shared-dir=/tmp", "--socket-path=/s"];
    v.extend_from_slice(args);
    let e = Args::try_parse_from(v).expect_err("clap refuses");
    assert_eq!(e.exit_code(), 2, "{e}");
    let e = e.to_string();
    for s in says {
        assert!(e.contains(s), "{args:?}: does not say {s:?}: {e}");
    }
    e
}

#[test]
fn minimal_command_line_gives_auto_cache_and_socket_path() {
    let s = settings(&["--shared-dir=/tmp", "--socket-path=/tmp/s"]).unwrap();
    let c = &s.daemon;
    assert_eq!(c.socket, SocketSpec::Path("/tmp/s".into()));
    assert_eq!(c.fs.cache, CacheMode::Auto);
    assert!(!c.fs.readonly && !c.fs.xattr && c.fs.readdirplus);
    assert!(!c.fs.allow_direct_io && !c.fs.allow_mmap && !c.fs.preserve_noatime);
    assert_eq!(s.process.rlimit_nofile, None);
    assert_eq!(s.process.socket_group, None);
    assert_eq!(s.log.level, log::LevelFilter::Info);
    assert!(!s.log.syslog);
    assert!(s.warnings.is_empty());
}

#[test]
fn missing_socket_is_refused_naming_the_flag() {
    let e = parse(&["--shared-dir=/tmp"]).unwrap_err();
    assert!(e.to_string().contains("--socket-path"), "{e}");
}

#[test]
fn an_activated_socket_is_used_only_without_a_socket_flag() {
    let s = settings_with(&["--shared-dir=/tmp"], Some(3)).unwrap();
    assert_eq!(s.daemon.socket, SocketSpec::Fd(3));
    let s = settings_with(&["--shared-dir=/tmp", "--socket-path=/s"], Some(3)).unwrap();
    assert_eq!(s.daemon.socket, SocketSpec::Path("/s".into()));
    let e = settings_with(&["--shared-dir=/tmp", "--socket-group=0"], Some(3)).unwrap_err();
    assert!(e.to_string().starts_with("--socket-group:"), "{e}");
}

#[test]
fn deprecated_socket_alias_works_and_warns() {
    let s = settings(&["--shared-dir=/tmp", "--socket=/tmp/s"]).unwrap();
    assert_eq!(s.daemon.socket, SocketSpec::Path("/tmp/s".into()));
    assert!(s.warnings[0].contains("--socket"), "{:?}", s.warnings);
    // --socket-path wins when both are given.
    let s = settings(&["--shared-dir=/tmp", "--socket=/a", "--socket-path=/b"]).unwrap();
    assert_eq!(s.daemon.socket, SocketSpec::Path("/b".into()));
}

#[test]
fn bad_cache_mode_is_refused_naming_the_choices() {
    clap_refuses(
        &["--cache=sometimes"],
        &["'sometimes'", "--cache", "never, metadata, auto, always"],
    );
    // The old C daemon's spelling is still accepted.
    let c = config(&["--cache=none"]).unwrap();
    assert_eq!(c.fs.cache, CacheMode::Never);
}

#[test]
fn shared_dir_must_exist() {
    let e = parse(&["--shared-dir=/nonexistent/dir", "--socket-path=/s"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--shared-dir: '/nonexistent/dir' does not exist; expected --shared-dir=DIR"
    );
}

#[test]
fn shared_dir_must_be_a_directory() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let arg = format!("--shared-dir={}", f.path().display());
    let e = parse(&[arg.as_str(), "--socket-path=/s"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "--shared-dir: '{}' is not a directory; expected --shared-dir=DIR",
            f.path().display()
        )
    );
}

#[test]
fn migration_flags_reach_the_filesystem_config() {
    let m = |v: &[&str]| run(v).map(|s| s.daemon.fs.migration);
    assert_eq!(m(&[]).unwrap(), migration::Options::default());
    let kubevirt = m(&[
        "--migration-mode=find-paths",
        "--migration-on-error=guest-error",
    ]);
    assert_eq!(
        kubevirt.unwrap(),
        migration::Options {
            on_error: migration::OnError::GuestError,
            ..Default::default()
        }
    );
    let checked = m(&["--migration-verify-handles", "--migration-confirm-paths"]).unwrap();
    assert!(checked.verify_handles && checked.confirm_paths);
    assert_eq!(
        m(&["--migration-mode=file-handles"]).unwrap().mode,
        migration::Mode::FileHandles
    );
    for flag in ["--migration-verify-handles", "--migration-confirm-paths"] {
        let e = config(&["--migration-mode=file-handles", flag]).unwrap_err();
        assert!(e.to_string().starts_with(flag), "{e}");
        assert!(e.to_string().contains("find-paths"), "{e}");
    }
}

#[test]
fn sandbox_defaults_to_namespace_and_modcaps_reach_the_process_options() {
    let s = run(&[]).unwrap();
    assert_eq!(s.process.sandbox, SandboxMode::Namespace);
    assert_eq!(s.process.modcaps, caps::ModCaps::default());
    for (kind, mode) in [
        ("namespace", SandboxMode::Namespace),
        ("chroot", SandboxMode::Chroot),
        ("none", SandboxMode::None),
    ] {
        let s = run(&[&format!("--sandbox={kind}")]).unwrap();
        assert_eq!(s.process.sandbox, mode);
        let s = run(&["-o", &format!("sandbox={kind}")]).unwrap();
        assert_eq!(s.process.sandbox, mode);
    }
    let s = run(&["--modcaps=+SYS_ADMIN:-mknod"]).unwrap();
    assert_eq!(
        s.process.modcaps,
        caps::ModCaps(vec![(true, caps::CAP_SYS_ADMIN), (false, caps::CAP_MKNOD)])
    );
    let s = run(&["-o", "modcaps=-chown"]).unwrap();
    assert_eq!(
        s.process.modcaps,
        caps::ModCaps(vec![(false, caps::CAP_CHOWN)])
    );
}

#[test]
fn bad_modcaps_are_refused_naming_the_flag() {
    for (bad, says) in [
        ("+nonsense", "unknown capability 'nonsense'"),
        (
            "sys_admin",
            "entry 'sys_admin' does not start with + (keep) or - (drop)",
        ),
        ("", "an entry is empty"),
        ("+chown:", "an entry is empty"),
    ] {
        clap_refuses(
            &[&format!("--modcaps={bad}")],
            &[
                &format!("invalid value '{bad}' for '--modcaps <CAPS>': {says}"),
                "expected +CAP:-CAP...",
            ],
        );
    }
}

#[test]
fn announce_submounts_reaches_the_filesystem_config_and_the_last_of_a_pair_wins() {
    let on = config(&["--announce-submounts"]);
    assert!(on.unwrap().fs.announce_submounts);
    let legacy = parse(&["--socket-path=/s", "-o", "source=/tmp,announce_submounts"]);
    assert!(legacy.unwrap().fs.announce_submounts);
    let off = config(&["--announce-submounts", "--no-announce-submounts"]);
    assert!(!off.unwrap().fs.announce_submounts);
    let default = config(&[]).unwrap();
    assert!(
        default.fs.announce_submounts,
        "on by default, as in the reference"
    );
    let on_again = config(&["--no-announce-submounts", "--announce-submounts"]);
    assert!(on_again.unwrap().fs.announce_submounts);
}

#[test]
fn inode_file_handles_reach_the_filesystem_config() {
    use crate::passthrough::InodeFileHandles;
    let mode = |extra: &[&str]| run(extra).map(|s| (s.daemon.fs.inode_file_handles, s.warnings));
    // The reference's default: no file handles, so no CAP_DAC_READ_SEARCH.
    assert_eq!(mode(&[]).unwrap(), (InodeFileHandles::Never, vec![]));
    for (arg, want) in [
        ("--inode-file-handles=never", InodeFileHandles::Never),
        ("--inode-file-handles=prefer", InodeFileHandles::Prefer),
        (
            "--inode-file-handles=mandatory",
            InodeFileHandles::Mandatory,
        ),
    ] {
        assert_eq!(mode(&[arg]).unwrap(), (want, vec![]), "{arg}");
    }
    let (m, warnings) = mode(&["--inode-file-handles=fallback"]).unwrap();
    assert_eq!(m, InodeFileHandles::Prefer);
    assert!(
        warnings[0].contains("--inode-file-handles=prefer"),
        "{warnings:?}"
    );
    let e = clap_refuses(
        &["--inode-file-handles=always"],
        &[
            "'always'",
            "--inode-file-handles",
            "never, prefer, mandatory",
        ],
    );
    assert!(!e.contains("fallback"), "{e}");
}

#[test]
fn seccomp_defaults_to_kill_and_takes_each_action() {
    let s = run(&[]).unwrap();
    assert_eq!(s.process.seccomp, seccomp::Action::Kill);
    for (flag, action) in [
        ("--seccomp=kill", seccomp::Action::Kill),
        ("--seccomp=log", seccomp::Action::Log),
        ("--seccomp=trap", seccomp::Action::Trap),
        ("--seccomp=none", seccomp::Action::None),
    ] {
        let s = run(&[flag]).unwrap();
        assert_eq!(s.process.seccomp, action, "{flag}");
    }
    clap_refuses(
        &["--seccomp=maybe"],
        &["'maybe'", "--seccomp", "kill, log, trap, none"],
    );
}

#[test]
fn defaults_of_refused_flags_are_accepted() {
    config(&[
        "--sandbox=none",
        "--seccomp=none",
        "--inode-file-handles=never",
        "--posix-acl=never",
        "--security-label=never",
        "--no-announce-submounts",
        "--no-killpriv-v2",
        "--migration-mode=find-paths",
        "--migration-on-error=abort",
    ])
    .unwrap();
    // The last of a pair wins.
    config(&[
        "--announce-submounts",
        "--no-announce-submounts",
        "--killpriv-v2",
        "--no-killpriv-v2",
    ])
    .unwrap();
}

#[test]
fn invalid_values_of_refused_flags_are_invalid_not_unimplemented() {
    clap_refuses(
        &["--sandbox=jail"],
        &["'jail'", "--sandbox", "namespace, chroot, none"],
    );
    for (flag, value) in [
        ("--migration-mode", "teleport"),
        ("--migration-on-error", "shrug"),
    ] {
        let e = clap_refuses(&[&format!("{flag}={value}")], &[flag]);
        assert!(!e.contains("not implemented"), "{e}");
    }
}

#[test]
fn flags_map_to_the_filesystem_config() {
    let s = settings(&[
        "--shared-dir=/tmp",
        "--fd=3",
        "--cache=always",
        "--xattr",
        "--readonly",
        "--no-readdirplus",
        "--thread-pool-size=4",
        "--allow-direct-io",
        "--allow-mmap",
        "--preserve-noatime",
        "--rlimit-nofile=5000",
        "--syslog",
        "--log-level=warn",
    ])
    .unwrap();
    let c = &s.daemon;
    assert_eq!(c.socket, SocketSpec::Fd(3));
    assert_eq!(c.fs.cache, CacheMode::Always);
    assert!(c.fs.xattr && c.fs.readonly && !c.fs.readdirplus);
    assert!(c.fs.allow_direct_io && c.fs.allow_mmap && c.fs.preserve_noatime);
    assert_eq!(c.thread_pool_size, 4);
    assert_eq!(s.process.rlimit_nofile, Some(5000));
    assert!(s.log.syslog);
    assert_eq!(s.log.level, log::LevelFilter::Warn);
}

#[test]
fn repeated_flags_take_the_last_value() {
    let c = parse(&[
        "--shared-dir=/nonexistent",
        "--shared-dir=/tmp",
        "--socket-path=/s",
        "--cache=never",
        "--cache=metadata",
    ])
    .unwrap();
    assert_eq!(c.fs.cache, CacheMode::Metadata);
    assert_eq!(c.fs.root_dir, PathBuf::from("/tmp"));
}

#[test]
fn socket_group_takes_a_name_or_a_number() {
    let s = run(&["--socket-group=root"]).unwrap();
    assert_eq!(s.process.socket_group, Some(0));
    let s = run(&["--socket-group=4242"]).unwrap();
    assert_eq!(s.process.socket_group, Some(4242));
    let e = run(&["--socket-group=no-such-group-here"]).unwrap_err();
    assert!(
        e.to_string().starts_with("--socket-group: unknown group"),
        "{e}"
    );
}

#[test]
fn legacy_options_map_to_the_flags() {
    let s = settings(&[
        "--socket-path=/s",
        "-o",
        "source=/tmp,cache=none,xattr,writeback,no_readdirplus",
        "-o",
        "loglevel=debug,allow_direct_io,no_flock,no_posix_lock,no_killpriv_v2,sandbox=none",
    ])
    .unwrap();
    let c = &s.daemon;
    assert_eq!(c.fs.root_dir, PathBuf::from("/tmp"));
    assert_eq!(c.fs.cache, CacheMode::Never);
    assert!(c.fs.xattr && c.fs.writeback && !c.fs.readdirplus && c.fs.allow_direct_io);
    assert_eq!(s.log.level, log::LevelFilter::Debug);
    assert!(
        s.warnings.iter().any(|w| w.contains("-o")),
        "{:?}",
        s.warnings
    );
    // -o applies after the flags, and the no_ forms undo them.
    let c = config(&[
        "-o",
        "no_xattr,readdirplus,no_writeback,log_level=err,cache=metadata",
        "--xattr",
        "--no-readdirplus",
        "--writeback",
    ])
    .unwrap();
    assert!(!c.fs.xattr && c.fs.readdirplus && !c.fs.writeback);
    assert_eq!(c.fs.cache, CacheMode::Metadata);
}

#[test]
fn unsupported_legacy_options_are_refused_naming_them() {
    for (opt, says) in [
        ("xattrmap=:map::a.", "incomplete"),
        ("sandbox=jail", "invalid value 'jail'"),
        ("modcaps=+nonsense", "unknown capability 'nonsense'"),
        ("timeout=5", "not supported"),
        ("norace", "not supported"),
        ("bogus", "unknown legacy option"),
        ("cache=sometimes", "invalid cache mode"),
        ("loglevel=loud", "invalid level"),
    ] {
        let e = config(&["-o", opt]).unwrap_err();
        let key = opt.split('=').next().unwrap();
        assert!(
            e.to_string().starts_with(&format!("-o {key}")),
            "{opt}: {e}"
        );
        assert!(e.to_string().contains(says), "{opt}: {e}");
    }
}

#[test]
fn xattr_features_reach_the_config_and_imply_xattr() {
    let c = config(&[]).unwrap();
    assert!(c.fs.xattrmap.is_none() && !c.fs.killpriv_v2);
    assert_eq!(c.fs.posix_acl, Negotiate::Never);
    assert_eq!(c.fs.security_label, Negotiate::Never);
    for (flag, check) in [
        (
            "--posix-acl",
            (|c: &Config| c.posix_acl == Negotiate::Always) as fn(&Config) -> bool,
        ),
        ("--posix-acl=auto", |c| c.posix_acl == Negotiate::Auto),
        ("--security-label", |c| {
            c.security_label == Negotiate::Always
        }),
        ("--security-label=auto", |c| {
            c.security_label == Negotiate::Auto
        }),
        ("--xattrmap=:map::user.virtiofs.:", |c| c.xattrmap.is_some()),
    ] {
        let c = config(&[flag]).unwrap();
        assert!(check(&c.fs), "{flag}");
        assert!(c.fs.xattr, "{flag} implies --xattr");
    }
    let c = config(&["--killpriv-v2"]).unwrap();
    assert!(c.fs.killpriv_v2 && !c.fs.xattr);
    let legacy = "source=/tmp,killpriv_v2,posix_acl,security_label,xattrmap=/ok/all///";
    let c = parse(&["--socket-path=/s", "-o", legacy]).unwrap();
    assert!(c.fs.killpriv_v2 && c.fs.xattr && c.fs.xattrmap.is_some());
    assert_eq!(c.fs.posix_acl, Negotiate::Always);
    assert_eq!(c.fs.security_label, Negotiate::Always);
    let c = config(&["-o", "no_killpriv_v2"]);
    assert!(!c.unwrap().fs.killpriv_v2);
}

#[test]
fn bad_xattrmap_and_acl_with_translation_are_refused_naming_the_flag() {
    clap_refuses(
        &["--xattrmap=:frob:all:::"],
        &["'--xattrmap <RULES>': rule 1: unknown type 'frob'"],
    );
    clap_refuses(&["--xattrmap="], &["'--xattrmap <RULES>': no rules"]);
    let e = config(&["--posix-acl=auto", "--translate-uid=map:0:1000:10"]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("--posix-acl=auto: cannot be used together"),
        "{e}"
    );
    // Never is fine with a translation.
    config(&["--posix-acl=never", "--translate-gid=map:0:1000:10"]).unwrap();
}

#[test]
fn compat_debug_and_foreground_warn() {
    let s = run(&["-d", "-f"]).unwrap();
    assert_eq!(s.log.level, log::LevelFilter::Debug);
    assert!(s.warnings.iter().any(|w| w.contains("-d")));
    assert!(s.warnings.iter().any(|w| w.contains("-f")));
}

#[test]
fn print_capabilities_needs_nothing_else() {
    let args = Args::try_parse_from(["virtiofsd", "--print-capabilities"]).unwrap();
    assert!(matches!(
        args.into_command(|| panic!("not consulted")),
        Ok(Command::PrintCapabilities)
    ));
    assert!(CAPABILITIES.contains("\"separate-options\""));
    assert!(CAPABILITIES.contains("\"migrate-precopy\""));
}

#[test]
fn translate_flags_repeat_and_reach_the_config() {
    let c = config(&[
        "--translate-uid=map:0:100000:65536",
        "--translate-uid",
        "forbid-guest:70000:10",
        "--translate-gid=squash-host:0:100:1000",
    ])
    .unwrap();
    assert_eq!(c.translate.uid.to_host(5), Ok(100005));
    assert!(c.translate.uid.to_host(70009).is_err());
    assert_eq!(c.translate.gid.to_guest(999), 100);
    let c = config(&[]).unwrap();
    assert!(c.translate.is_empty());
}

#[test]
fn bad_translate_rules_are_refused_naming_the_flag_and_the_form() {
    let form = "<type>:<source base>:<target base>:<count>";
    // A rule wrong on its own: clap refuses it.
    for (flag, rule, says) in [
        ("--translate-uid", "map:0:1000", "takes 3 numbers"),
        ("--translate-gid", "guest:0:1000:x", "'x' is not an id"),
        ("--translate-gid", "guest:4294967290:0:10", "runs past"),
    ] {
        clap_refuses(
            &[&format!("{flag}={rule}")],
            &[
                &format!("invalid value '{rule}' for '{flag} <RULE>': "),
                says,
                form,
            ],
        );
    }
    // Rules that overlap: refused naming the flag and the later rule.
    let e = config(&[
        "--translate-uid=guest:0:1000:10",
        "--translate-uid=map:9:0:1",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("--translate-uid: invalid rule 'map:9:0:1': guest ids 9 to 9"),
        "{e}"
    );
    assert!(e.contains(form), "{e}");
}

#[test]
fn id_maps_repeat_and_reach_the_config() {
    let c = config(&[
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
    clap_refuses(
        &["--uid-map=0:1:2"],
        &[
            "invalid value '0:1:2' for '--uid-map <MAP>': it must start with a delimiter",
            "expected :namespace_id:host_id:count:",
        ],
    );
    // Ranges that are each fine may still overlap: refused naming the flag.
    let e = config(&["--gid-map=:0:1000:10:", "--gid-map=:5:2000:10:"]).unwrap_err();
    assert!(e.to_string().starts_with("--gid-map: ranges"), "{e}");
}

#[test]
fn log_level_refusal_names_the_flag_and_the_levels() {
    clap_refuses(
        &["--log-level=loud"],
        &[
            "'loud'",
            "--log-level",
            "error, warn, info, debug, trace, off",
        ],
    );
    let s = run(&["--log-level=trace"]);
    assert_eq!(s.unwrap().log.level, log::LevelFilter::Trace);
}

#[test]
fn tag_and_fd_are_refused_by_clap_saying_what_is_expected() {
    for bad in [String::new(), "t".repeat(37)] {
        clap_refuses(
            &[&format!("--tag={bad}")],
            &["'--tag <TAG>': expected a tag of 1 to 36 bytes"],
        );
    }
    let tag = "t".repeat(36);
    let c = config(&[&format!("--tag={tag}")]);
    assert_eq!(c.unwrap().tag, Some(tag));
    for bad in ["-1", "x", "2147483648"] {
        let e = Args::try_parse_from(["virtiofsd", "--shared-dir=/tmp", &format!("--fd={bad}")])
            .expect_err("clap refuses")
            .to_string();
        assert!(
            e.contains(&format!(
                "invalid value '{bad}' for '--fd <FD>': expected a whole number"
            )),
            "{e}"
        );
    }
}

#[test]
fn locks_are_on_by_default_and_each_kind_turns_off() {
    let c = config(&[]).unwrap();
    assert!(c.fs.posix_lock && c.fs.flock);
    assert_eq!(
        c.fs.max_lock_fds,
        crate::passthrough::config::DEFAULT_MAX_LOCK_FDS
    );
    let c = config(&["-o", "no_posix_lock"]).unwrap();
    assert!(!c.fs.posix_lock && c.fs.flock);
    let c = config(&["-o", "no_flock"]).unwrap();
    assert!(c.fs.posix_lock && !c.fs.flock);
    let c = config(&["-o", "no_posix_lock,no_flock,posix_lock,flock"]).unwrap();
    assert!(c.fs.posix_lock && c.fs.flock);
    let c = config(&["--posix-lock=off", "--flock=off"]).unwrap();
    assert!(!c.fs.posix_lock && !c.fs.flock);
    let c = config(&["--posix-lock=off", "--posix-lock", "--flock=on"]).unwrap();
    assert!(c.fs.posix_lock && c.fs.flock);
    let c = config(&["--max-lock-fds=8"]).unwrap();
    assert_eq!(c.fs.max_lock_fds, 8);
    for bad in ["--posix-lock=maybe", "--flock=", "--max-lock-fds=0"] {
        let v = ["virtiofsd", "--shared-dir=/tmp", "--socket-path=/s", bad];
        assert!(Args::try_parse_from(v).is_err(), "{bad}");
    }
}
