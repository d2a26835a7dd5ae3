//! The command line of the real binary, checked against the reference `virtiofsd` 1.14: every
//! reference flag is accepted (and works) or refused with a message saying it is not
//! implemented yet; deprecated spellings warn; bad values exit 2 naming the flag, what the host
//! lacks (a missing shared directory, ...) exits 1 as with the reference;
//! `--print-capabilities`, `--version`; `--help` and `doc/configuration.md` agree.

use crate::common;

use common::wait_exit;

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use virtiofsd::fuse::abi::{self, ROOT_ID};
use virtiofsd_frontend::FsFrontend;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

/// Every flag of the reference `virtiofsd` 1.14 `--help`.
const REFERENCE_FLAGS: &[&str] = &[
    "--shared-dir",
    "--tag",
    "--socket",
    "--socket-path",
    "--socket-group",
    "--fd",
    "--thread-pool-size",
    "--xattr",
    "--posix-acl",
    "--xattrmap",
    "--sandbox",
    "--readonly",
    "--seccomp",
    "--announce-submounts",
    "--no-announce-submounts",
    "--inode-file-handles",
    "--cache",
    "--allow-mmap",
    "--no-readdirplus",
    "--writeback",
    "--allow-direct-io",
    "--print-capabilities",
    "--modcaps",
    "--log-level",
    "--syslog",
    "--rlimit-nofile",
    "-o",
    "-d",
    "--no-killpriv-v2",
    "--killpriv-v2",
    "-f",
    "--security-label",
    "--uid-map",
    "--gid-map",
    "--translate-uid",
    "--translate-gid",
    "--preserve-noatime",
    "--migration-mode",
    "--migration-on-error",
    "--migration-verify-handles",
    "--migration-confirm-paths",
    "-h",
    "--help",
    "-V",
    "--version",
];

struct Dirs {
    tmp: TempDir,
    share: PathBuf,
    socket: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    let socket = tmp.path().join("vfs.sock");
    Dirs { tmp, share, socket }
}

impl Dirs {
    fn base(&self) -> Vec<String> {
        vec![
            format!("--shared-dir={}", self.share.display()),
            format!("--socket-path={}", self.socket.display()),
        ]
    }

    fn with(&self, extra: &[&str]) -> Vec<String> {
        let mut v = self.base();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }
}

fn run(args: &[String]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .env_remove("RUST_LOG")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .output()
        .expect("run virtiofsd")
}

fn spawn(args: &[String]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        .spawn()
        .expect("start virtiofsd")
}

/// Waits (bounded) for `path` to appear, failing early if the child exits.
fn wait_for_socket(child: &mut Child, path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err).unwrap();
            }
            panic!("virtiofsd exited early ({status:?}): {err}");
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn terminate(child: Child) -> (ExitStatus, String) {
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    wait_exit(child)
}

/// Starts the daemon with `args`, checks that it listens, stops it; returns its stderr.
fn assert_serves(d: &Dirs, args: &[String]) -> String {
    let _ = fs::remove_file(&d.socket);
    let mut child = spawn(args);
    wait_for_socket(&mut child, &d.socket);
    let (status, err) = terminate(child);
    assert_eq!(
        status.code(),
        Some(0),
        "{args:?}: {status:?}, stderr: {err}"
    );
    assert!(!err.contains("ERROR"), "{args:?}: {err}");
    err
}

/// Runs the binary with `args`; expects exit status 2 and every one of `says` in stderr.
fn assert_refused(args: &[String], says: &[&str]) -> String {
    assert_exits(2, args, says)
}

/// Runs the binary with `args`, expects exit status `code` and one message saying each of
/// `says`.
fn assert_exits(code: i32, args: &[String], says: &[&str]) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: status {:?}, stderr: {err}",
        out.status
    );
    for s in says {
        assert!(
            err.contains(s),
            "{args:?}: stderr does not say {s:?}: {err}"
        );
    }
    let messages = err
        .lines()
        .filter(|l| l.starts_with("virtiofsd:") || l.starts_with("error:"))
        .count();
    assert_eq!(messages, 1, "one message: {err}");
    err
}

/// The flags `--help` lists, in the order it lists them.
fn help_flags() -> Vec<String> {
    let out = run(&["--help".to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') || line.len() - t.len() > 6 {
            continue;
        }
        for part in t.split(", ") {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if name.len() > 1 && name != "-" {
                flags.push(name);
            }
            if !part.starts_with('-') {
                break;
            }
        }
    }
    flags
}

/// Flags of this daemon that the reference does not have (each documented as such).
const OWN_FLAGS: &[&str] = &[
    "--flock",
    "--max-data-fds",
    "--max-lock-fds",
    "--max-nodes",
    "--poll-window",
    "--posix-lock",
];

#[test]
fn help_lists_exactly_the_reference_flags_and_our_own() {
    let ours: BTreeSet<String> = help_flags().into_iter().collect();
    let reference: BTreeSet<String> = REFERENCE_FLAGS.iter().map(|s| s.to_string()).collect();
    let own: BTreeSet<String> = OWN_FLAGS.iter().map(|s| s.to_string()).collect();
    let missing: Vec<_> = reference.difference(&ours).collect();
    let extra: BTreeSet<String> = ours.difference(&reference).cloned().collect();
    assert!(missing.is_empty(), "missing from --help: {missing:?}");
    assert_eq!(extra, own, "not in the reference");
}

#[test]
fn help_states_the_confining_defaults() {
    let out = run(&["--help".to_string()]);
    let text = String::from_utf8(out.stdout).unwrap();
    for says in ["[default: namespace]", "[default: kill]"] {
        assert!(text.contains(says), "--help does not say {says:?}");
    }
}

#[test]
fn every_flag_is_documented_and_no_documented_flag_is_stale() {
    let doc =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("doc/configuration.md"))
            .expect("doc/configuration.md");
    // Entries are headings "### `--flag...`", possibly naming several spellings.
    let mut documented = BTreeSet::new();
    for line in doc.lines().filter(|l| l.starts_with("### ")) {
        for part in line.split('`').skip(1).step_by(2) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if name.starts_with('-') {
                documented.insert(name);
            }
        }
    }
    let help: BTreeSet<String> = help_flags().into_iter().collect();
    let undocumented: Vec<_> = help.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&help).collect();
    assert!(
        undocumented.is_empty(),
        "not in doc/configuration.md: {undocumented:?}"
    );
    assert!(stale.is_empty(), "documented but not in --help: {stale:?}");
}

#[test]
fn supported_flags_are_accepted_and_the_daemon_serves() {
    let d = dirs();
    let grp = fs::metadata(d.tmp.path()).unwrap().gid().to_string();
    let cases: &[&[&str]] = &[
        &[],
        &["--tag=share"],
        &["--thread-pool-size=2"],
        &["--xattr"],
        &["--posix-acl=never"],
        &["--sandbox=none"],
        &["--sandbox=namespace"],
        &["--sandbox=chroot"],
        &["--modcaps=+sys_admin:-mknod"],
        &["-o", "sandbox=none,modcaps=-chown"],
        &["--readonly"],
        &["--seccomp=none"],
        &["--seccomp=kill"],
        &["--seccomp=log"],
        &["--seccomp=trap"],
        &["--no-announce-submounts"],
        &["--announce-submounts"],
        &["--inode-file-handles=never"],
        &["--inode-file-handles=prefer"],
        &["--inode-file-handles=fallback"],
        &["--cache=never", "--allow-mmap"],
        &["--cache=metadata"],
        &["--cache=always", "--writeback"],
        &["--no-readdirplus"],
        &["--allow-direct-io"],
        &["--log-level=warn"],
        &["--syslog"],
        &["--rlimit-nofile=0"],
        &["--no-killpriv-v2"],
        &["--killpriv-v2"],
        &["--security-label=never"],
        &["--security-label"],
        &["--security-label=auto"],
        &["--posix-acl"],
        &["--posix-acl=auto"],
        &["--xattrmap=:map::user.virtiofs.:"],
        &[
            "-o",
            "posix_acl,security_label,killpriv_v2,xattrmap=/ok/all///",
        ],
        &["--translate-uid=map:0:0:1", "--translate-gid=map:0:0:1"],
        &["--preserve-noatime"],
        &["--migration-mode=find-paths", "--migration-on-error=abort"],
        &[
            "--migration-mode=find-paths",
            "--migration-on-error=guest-error",
        ],
        &["--migration-verify-handles", "--migration-confirm-paths"],
        &["--migration-mode=file-handles"],
        &["-f"],
        &["-d"],
        &["-o", "cache=auto,no_flock,no_posix_lock"],
    ];
    for extra in cases {
        assert_serves(&d, &d.with(extra));
    }
    let group = format!("--socket-group={grp}");
    assert_serves(&d, &d.with(&[&group]));
    // The deprecated socket spelling.
    assert_serves(
        &d,
        &[
            format!("--shared-dir={}", d.share.display()),
            format!("--socket={}", d.socket.display()),
        ],
    );
    // The shared directory given the legacy way.
    assert_serves(
        &d,
        &[
            format!("-osource={}", d.share.display()),
            format!("--socket-path={}", d.socket.display()),
        ],
    );
}

#[test]
fn bad_values_exit_2_naming_the_flag() {
    let d = dirs();
    let cases: &[(&[&str], &str)] = &[
        (&["--cache=sometimes"], "--cache"),
        (&["--sandbox=jail"], "--sandbox"),
        (&["--modcaps=+no_such_cap"], "--modcaps"),
        (&["--modcaps=sys_admin"], "--modcaps"),
        (&["-o", "sandbox=jail"], "-o sandbox"),
        (&["-o", "modcaps=+no_such_cap"], "-o modcaps"),
        (&["--seccomp=maybe"], "--seccomp"),
        (&["--inode-file-handles=sometimes"], "--inode-file-handles"),
        (&["--inode-file-handles", "never"], "--inode-file-handles"),
        (&["--posix-acl=maybe"], "--posix-acl"),
        (&["--security-label=maybe"], "--security-label"),
        (&["--xattrmap=:map::a."], "--xattrmap"),
        (&["--xattrmap=:nope:all:::"], "--xattrmap"),
        (
            &["--posix-acl", "--translate-uid=map:0:1000:10"],
            "--posix-acl=always",
        ),
        (&["-o", "xattrmap=:ok"], "-o xattrmap"),
        (&["--migration-mode=teleport"], "--migration-mode"),
        (&["--migration-on-error=shrug"], "--migration-on-error"),
        (&["--log-level=loud"], "--log-level"),
        (&["--rlimit-nofile=lots"], "--rlimit-nofile"),
        (&["--rlimit-nofile=-1"], "--rlimit-nofile"),
        (&["--thread-pool-size=many"], "--thread-pool-size"),
        (&["--socket-group="], "--socket-group"),
        (&["--tag="], "--tag"),
        (&["--uid-map=0:1:2"], "--uid-map"),
        (&["--translate-gid=map:0:1"], "--translate-gid"),
        (&["--fd=3"], "--fd"),
        (&["-o", "cache=sometimes"], "-o cache"),
        (&["-o", "loglevel=loud"], "-o loglevel"),
        (&["-o", "no_such_option"], "-o no_such_option"),
        (&["-o", "timeout=1"], "-o timeout"),
        (&["-o", "norace"], "-o norace"),
    ];
    for (extra, flag) in cases {
        assert_refused(&d.with(extra), &[flag]);
    }
    // --socket-group only applies to a socket the daemon creates.
    assert_refused(
        &[
            format!("--shared-dir={}", d.share.display()),
            "--fd=0".into(),
            "--socket-group=0".into(),
        ],
        &["--socket-group"],
    );
    assert!(!d.socket.exists());
}

#[test]
fn what_the_host_lacks_exits_1_naming_the_flag_as_the_reference_does() {
    // A well-formed command line naming what the host does not have: exit 1, as the reference
    // exits for a missing shared directory (launchers see the status they saw with it), with
    // one message naming the flag. Nothing is created.
    let d = dirs();
    let file = d.tmp.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let socket = format!("--socket-path={}", d.socket.display());
    for (dir, says) in [
        (d.tmp.path().join("no-such-dir"), "does not exist"),
        (file.clone(), "is not a directory"),
    ] {
        assert_exits(
            1,
            &[socket.clone(), format!("--shared-dir={}", dir.display())],
            &["--shared-dir", says],
        );
        assert_exits(
            1,
            &[
                "-o".into(),
                format!("source={}", dir.display()),
                socket.clone(),
            ],
            &["--shared-dir", says],
        );
    }
    assert_exits(
        1,
        &d.with(&["--socket-group=no-such-group-here"]),
        &["--socket-group", "unknown group"],
    );
    // An empty group name is a malformed command line, not a missing group.
    assert_exits(2, &d.with(&["--socket-group="]), &["--socket-group"]);
    // A missing shared directory with a malformed flag beside it: the command line is wrong.
    for (bad, flag) in [
        ("--cache=sometimes", "--cache"),
        ("--xattrmap=:nope:all:::", "--xattrmap"),
        ("--modcaps=sys_admin", "--modcaps"),
        ("--translate-uid=map:0:1", "--translate-uid"),
        ("--uid-map=0:1:2", "--uid-map"),
    ] {
        assert_exits(
            2,
            &[
                socket.clone(),
                format!(
                    "--shared-dir={}",
                    d.tmp.path().join("no-such-dir").display()
                ),
                bad.into(),
            ],
            &[flag],
        );
    }
    assert!(!d.socket.exists());
}

#[test]
fn numbers_and_socket_paths_are_refused_saying_what_is_expected() {
    let d = dirs();
    let number = "expected a whole number";
    for (extra, says) in [
        ("--thread-pool-size=-1", number),
        ("--thread-pool-size=1025", "from 0 to 1024"),
        ("--thread-pool-size=18446744073709551615", "from 0 to 1024"),
        ("--rlimit-nofile=-5", number),
        ("--max-nodes=15", "at least 16"),
        ("--max-nodes=many", "at least 16"),
        ("--max-data-fds=0", "at least 1"),
        ("--poll-window=10001", "from 0 to 10000"),
        ("--poll-window=-1", "from 0 to 10000"),
        ("--fd=abc", number),
    ] {
        let mut args = vec![format!("--shared-dir={}", d.share.display())];
        if !extra.starts_with("--fd") {
            args.push(format!("--socket-path={}", d.socket.display()));
        }
        args.push(extra.into());
        assert_refused(&args, &[extra.split('=').next().unwrap(), says]);
    }
    let long = d.tmp.path().join("s".repeat(120));
    let missing = d.tmp.path().join("no-such-dir/vfs.sock");
    // Too long is a wrong command line (2); a directory that is not there, or a directory where
    // the socket should be, is the host's state (1).
    for (socket, code, says) in [
        (&long, 2, "at most 107 bytes"),
        (&missing, 1, "does not exist"),
        (&d.share, 1, "is a directory"),
    ] {
        assert_exits(
            code,
            &[
                format!("--shared-dir={}", d.share.display()),
                format!("--socket-path={}", socket.display()),
            ],
            &["--socket-path", says],
        );
    }
    // Nothing was made next to the refused paths.
    let left: Vec<_> = fs::read_dir(d.tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("share")]);
}

#[test]
fn a_stray_comma_in_o_is_ignored() {
    let d = dirs();
    assert_serves(
        &d,
        &[
            format!("--socket-path={}", d.socket.display()),
            "-o".into(),
            format!("source={},cache=auto,", d.share.display()),
            "--sandbox=none".into(),
        ],
    );
}

#[test]
fn deprecated_spellings_warn_on_stderr() {
    let d = dirs();
    let cases: &[(&[&str], &str)] = &[
        (&["-f"], "-f is deprecated"),
        (&["-d"], "-d is deprecated"),
        (&["-o", "xattr"], "-o is deprecated"),
    ];
    for (extra, says) in cases {
        let err = assert_serves(&d, &d.with(extra));
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    let err = assert_serves(
        &d,
        &[
            format!("--shared-dir={}", d.share.display()),
            format!("--socket={}", d.socket.display()),
        ],
    );
    assert!(err.contains("--socket is deprecated"), "{err}");
    // -d sets the debug level.
    let err = assert_serves(&d, &d.with(&["-d"]));
    assert!(err.contains("DEBUG") || err.contains("INFO"), "{err}");
}

#[test]
fn deprecation_warnings_follow_the_log_level() {
    let d = dirs();
    let serve = |extra: &[&str], rust_log: Option<&str>| -> String {
        let _ = fs::remove_file(&d.socket);
        let mut cmd = Command::new(BIN);
        cmd.args(d.with(extra))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_remove("RUST_LOG");
        if let Some(v) = rust_log {
            cmd.env("RUST_LOG", v);
        }
        let mut child = cmd.spawn().expect("start virtiofsd");
        wait_for_socket(&mut child, &d.socket);
        let (status, err) = terminate(child);
        assert_eq!(
            status.code(),
            Some(0),
            "{extra:?} RUST_LOG={rust_log:?}: {err}"
        );
        err
    };
    // Shown at the default level, at warn, and when RUST_LOG lets this crate's warnings by.
    for (extra, rust_log) in [
        (&["-f"][..], None),
        (&["-f", "--log-level=warn"][..], None),
        (&["-f", "--log-level=off"][..], Some("virtiofsd=warn")),
    ] {
        let err = serve(extra, rust_log);
        assert!(
            err.contains("-f is deprecated"),
            "{extra:?} RUST_LOG={rust_log:?}: {err}"
        );
    }
    // Silenced with the rest of the warnings: --log-level=off or error, or RUST_LOG=error.
    for (extra, rust_log) in [
        (&["-f", "--log-level=off"][..], None),
        (&["-f", "--log-level=error"][..], None),
        (&["-f", "-o", "xattr", "--log-level=off"][..], None),
        (&["-f"][..], Some("error")),
        (&["-f"][..], Some("off")),
    ] {
        let err = serve(extra, rust_log);
        assert!(
            !err.contains("deprecated"),
            "{extra:?} RUST_LOG={rust_log:?}: {err}"
        );
    }
}

/// A minimal JSON reader, enough to check `--print-capabilities`.
mod json {
    #[derive(Debug, PartialEq)]
    pub enum Value {
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
        Other,
    }

    pub fn parse(s: &str) -> Result<Value, String> {
        let b = s.as_bytes();
        let mut i = 0;
        let v = value(b, &mut i)?;
        ws(b, &mut i);
        if i != b.len() {
            return Err(format!("trailing text at {i}"));
        }
        Ok(v)
    }

    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }

    fn expect(b: &[u8], i: &mut usize, c: u8) -> Result<(), String> {
        ws(b, i);
        if b.get(*i) == Some(&c) {
            *i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at {i}", c as char))
        }
    }

    fn string(b: &[u8], i: &mut usize) -> Result<String, String> {
        expect(b, i, b'"')?;
        let start = *i;
        while *i < b.len() && b[*i] != b'"' {
            if b[*i] == b'\\' {
                return Err("escapes not expected".into());
            }
            *i += 1;
        }
        let s = String::from_utf8(b[start..*i].to_vec()).map_err(|e| e.to_string())?;
        expect(b, i, b'"')?;
        Ok(s)
    }

    fn value(b: &[u8], i: &mut usize) -> Result<Value, String> {
        ws(b, i);
        match b.get(*i) {
            Some(b'"') => string(b, i).map(Value::Str),
            Some(b'[') => {
                *i += 1;
                let mut v = Vec::new();
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    return Ok(Value::Arr(v));
                }
                loop {
                    v.push(value(b, i)?);
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b']') => {
                            *i += 1;
                            return Ok(Value::Arr(v));
                        }
                        _ => return Err(format!("bad array at {i}")),
                    }
                }
            }
            Some(b'{') => {
                *i += 1;
                let mut v = Vec::new();
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    return Ok(Value::Obj(v));
                }
                loop {
                    let k = string(b, i)?;
                    expect(b, i, b':')?;
                    v.push((k, value(b, i)?));
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            return Ok(Value::Obj(v));
                        }
                        _ => return Err(format!("bad object at {i}")),
                    }
                }
            }
            Some(c) if c.is_ascii_alphanumeric() || *c == b'-' => {
                while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b".-+".contains(&b[*i])) {
                    *i += 1;
                }
                Ok(Value::Other)
            }
            _ => Err(format!("unexpected text at {i}")),
        }
    }
}

#[test]
fn print_capabilities_is_the_vhost_user_json_and_needs_nothing_else() {
    let out = run(&["--print-capabilities".to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let json::Value::Obj(fields) = json::parse(&text).unwrap() else {
        panic!("not an object: {text}");
    };
    let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    assert_eq!(get("type"), Some(&json::Value::Str("fs".into())), "{text}");
    let Some(json::Value::Arr(features)) = get("features") else {
        panic!("no features: {text}");
    };
    let features: Vec<&str> = features
        .iter()
        .map(|f| match f {
            json::Value::Str(s) => s.as_str(),
            _ => panic!("feature is not a string: {text}"),
        })
        .collect();
    assert!(features.contains(&"separate-options"), "{text}");
    // The negotiation modes of --posix-acl and --security-label are supported.
    for present in [
        "posix-acl-negotiation-mode",
        "security-label-negotiation-mode",
    ] {
        assert!(features.contains(&present), "{text}");
    }
    // Live migration through QEMU (libvirt allows it only with this feature listed).
    assert!(features.contains(&"migrate-precopy"), "{text}");
}

#[test]
fn version_names_the_package_version() {
    let out = run(&["--version".to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    // The reference release it matches, then this package's name and version as build metadata.
    assert_eq!(
        text.trim(),
        format!(
            "virtiofsd 1.14.0+{}.{}",
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(
        text.trim(),
        format!("virtiofsd {}", virtiofsd::cli::VERSION)
    );
    let out = run(&["-V".to_string()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
}

#[test]
fn socket_is_private_or_shared_with_socket_group() {
    let d = dirs();
    let mut child = spawn(&d.base());
    wait_for_socket(&mut child, &d.socket);
    let mode = fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert_eq!(terminate(child).0.code(), Some(0));

    // A group the test's user is in, so that an unprivileged run may give it the socket.
    // SAFETY: getegid has no preconditions.
    let gid = unsafe { libc::getegid() };
    let mut child = spawn(&d.with(&[&format!("--socket-group={gid}")]));
    wait_for_socket(&mut child, &d.socket);
    let meta = fs::metadata(&d.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o770);
    assert_eq!(meta.gid(), gid);
    assert_eq!(terminate(child).0.code(), Some(0));
}

#[test]
fn only_a_socket_at_the_socket_path_is_replaced() {
    let d = dirs();
    let target = d.tmp.path().join("precious");
    fs::write(&target, b"keep me").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    // A regular file and a symbolic link at the path: refused, left as they were.
    fs::write(&d.socket, b"a file").unwrap();
    assert_exits(
        1,
        &d.base(),
        &["--socket-path", "is a regular file, not a socket"],
    );
    assert_eq!(fs::read(&d.socket).unwrap(), b"a file");
    fs::remove_file(&d.socket).unwrap();
    std::os::unix::fs::symlink(&target, &d.socket).unwrap();
    assert_exits(
        1,
        &d.base(),
        &["--socket-path", "is a symbolic link, not a socket"],
    );
    assert!(fs::symlink_metadata(&d.socket)
        .unwrap()
        .file_type()
        .is_symlink());
    fs::remove_file(&d.socket).unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"keep me");
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o600);
    // A socket left by an earlier daemon is replaced.
    drop(std::os::unix::net::UnixListener::bind(&d.socket).unwrap());
    assert_serves(&d, &d.base());
}

/// Events of an inotify watch on `dir` for the name `name`: `IN_CREATE`, `IN_ATTRIB`, ...
struct DirWatch(std::os::fd::OwnedFd);

impl DirWatch {
    fn new(dir: &Path) -> Self {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: inotify_init1 has no preconditions; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` was just made and is owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                fd.as_raw_fd(),
                c.as_ptr(),
                libc::IN_CREATE | libc::IN_ATTRIB,
            )
        };
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        DirWatch(fd)
    }

    /// The masks of the events so far for `name`.
    fn events_for(&self, name: &str) -> Vec<u32> {
        use std::os::fd::AsRawFd;
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = Vec::new();
        loop {
            // SAFETY: reads into `buf`, which is valid for its length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return out;
            }
            let mut at = 0usize;
            let head = std::mem::size_of::<libc::inotify_event>();
            while at + head <= n as usize {
                // SAFETY: the kernel wrote a whole event at `at` (it never splits one); an
                // unaligned read copies it out.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let raw = &buf[at + head..at + head + ev.len as usize];
                let got = raw.split(|b| *b == 0).next().unwrap_or(&[]);
                if got == name.as_bytes() {
                    out.push(ev.mask);
                }
                at += head + ev.len as usize;
            }
        }
    }
}

#[test]
fn the_socket_is_made_with_its_mode_and_group_and_never_changed_by_path() {
    // A local user who can write the socket's directory could swap a symbolic link in after
    // the bind: a chown or chmod by path then would change the link's target. The socket must
    // get its mode and group when it is made, and no change of attributes after.
    let d = dirs();
    let name = d.socket.file_name().unwrap().to_str().unwrap().to_owned();
    // SAFETY: geteuid and getegid have no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let gid = if root {
        4242
    } else {
        // SAFETY: as above.
        unsafe { libc::getegid() }
    };
    for (extra, mode) in [
        (None, 0o700),
        (Some(format!("--socket-group={gid}")), 0o770),
    ] {
        let _ = fs::remove_file(&d.socket);
        let watch = DirWatch::new(d.tmp.path());
        let args = match &extra {
            Some(g) => d.with(&[g.as_str()]),
            None => d.base(),
        };
        let mut child = spawn(&args);
        wait_for_socket(&mut child, &d.socket);
        // The daemon is set up once it answers a frontend; the set-up ends well before that.
        std::thread::sleep(Duration::from_millis(300));
        let meta = fs::symlink_metadata(&d.socket).unwrap();
        assert_eq!(meta.mode() & 0o7777, mode, "{extra:?}");
        if extra.is_some() {
            assert_eq!(meta.gid(), gid);
        }
        let events = watch.events_for(&name);
        assert_eq!(terminate(child).0.code(), Some(0));
        assert!(events.contains(&libc::IN_CREATE), "{extra:?}: {events:x?}");
        assert!(
            events.iter().all(|m| m & libc::IN_ATTRIB == 0),
            "{extra:?}: the socket's attributes were changed after it was made: {events:x?}"
        );
    }
}

/// The soft and hard open-files limits of process `pid`.
fn nofile_limits(pid: u32) -> (String, String) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

#[test]
fn rlimit_nofile_is_set_raised_or_left() {
    let d = dirs();
    let (soft, hard) = nofile_limits(std::process::id());

    let mut child = spawn(&d.with(&["--rlimit-nofile=0"]));
    wait_for_socket(&mut child, &d.socket);
    assert_eq!(nofile_limits(child.id()), (soft.clone(), hard.clone()));
    terminate(child);

    let mut child = spawn(&d.with(&["--rlimit-nofile=512"]));
    wait_for_socket(&mut child, &d.socket);
    assert_eq!(nofile_limits(child.id()).0, "512");
    terminate(child);

    // Default: min(1000000, nr_open), or the hard limit when that cannot be raised.
    let nr_open: u64 = fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = nr_open.min(1_000_000);
    let mut child = spawn(&d.base());
    wait_for_socket(&mut child, &d.socket);
    let (s, h) = nofile_limits(child.id());
    terminate(child);
    let s: u64 = s.parse().unwrap();
    let h: u64 = h.parse().unwrap_or(u64::MAX);
    let old_soft: u64 = soft.parse().unwrap_or(u64::MAX);
    assert!(
        s == want || (s == h && h < want) || old_soft >= want,
        "soft {s}, hard {h}, wanted {want}"
    );
}

/// The status flags of the daemon's descriptors open for I/O on `file` (not `O_PATH` ones).
/// The open flags of every descriptor (but `O_PATH` ones) the daemon `pid`, or the process
/// serving for it in a sandbox (its child), holds on `file`. Descriptors are matched by device
/// and inode: in a sandbox their paths are relative to the shared directory.
fn daemon_fd_flags(pid: u32, file: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let want = fs::metadata(file).unwrap();
    let children = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let mut flags = Vec::new();
    let pids =
        std::iter::once(pid.to_string()).chain(children.split_whitespace().map(String::from));
    for pid in pids {
        for e in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
            let Ok(md) = fs::metadata(e.path()) else {
                continue;
            };
            if (md.dev(), md.ino()) != (want.dev(), want.ino()) {
                continue;
            }
            let info = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap();
            let line = info.lines().find(|l| l.starts_with("flags:")).unwrap();
            let f = i32::from_str_radix(line[6..].trim(), 8).unwrap();
            if f & libc::O_PATH == 0 {
                flags.push(f);
            }
        }
    }
    flags
}

/// Whether the file system under `dir` accepts O_DIRECT at all.
fn supports_direct(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dir.join("f"))
        .is_ok()
}

#[test]
fn o_direct_is_dropped_unless_allow_direct_io() {
    for (allow, expect_direct) in [(false, false), (true, true)] {
        let d = dirs();
        let file = d.share.join("f");
        fs::write(&file, vec![0u8; 4096]).unwrap();
        if expect_direct && !supports_direct(&d.share) {
            eprintln!("skipped: the test directory does not support O_DIRECT");
            continue;
        }
        let mut args = d.with(&["--log-level=error"]);
        if allow {
            args.push("--allow-direct-io".into());
        }
        let mut child = spawn(&args);
        wait_for_socket(&mut child, &d.socket);
        let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
        let mut c = fe.client(0).unwrap();
        c.init().unwrap();
        let e = c.lookup(ROOT_ID, "f").unwrap();
        c.open(e.nodeid, (libc::O_RDONLY | libc::O_DIRECT) as u32)
            .unwrap();
        let flags = daemon_fd_flags(child.id(), &file);
        assert!(!flags.is_empty(), "no descriptor for the open file");
        assert!(
            flags
                .iter()
                .all(|f| (f & libc::O_DIRECT != 0) == expect_direct),
            "allow {allow}: flags {flags:?}"
        );
        fe.disconnect();
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
    }
}

#[test]
fn allow_mmap_offers_direct_io_allow_mmap_with_direct_io_caches_only() {
    let offer = abi::init::ASYNC_READ | abi::init::INIT_EXT | abi::init::DIRECT_IO_ALLOW_MMAP;
    for (extra, expect) in [
        (&["--cache=never", "--allow-mmap"][..], true),
        (&["--cache=metadata", "--allow-mmap"][..], true),
        (&["--cache=never"][..], false),
        (&["--cache=auto", "--allow-mmap"][..], false),
    ] {
        let d = dirs();
        let mut args = d.with(extra);
        args.push("--log-level=error".into());
        let mut child = spawn(&args);
        wait_for_socket(&mut child, &d.socket);
        let mut fe = FsFrontend::connect(&d.socket, 1).unwrap();
        let mut c = fe.client(0).unwrap();
        let out = c
            .init_with(abi::KERNEL_MINOR_VERSION, offer, 131072, true)
            .unwrap();
        let flags = u64::from(out.flags) | (u64::from(out.flags2) << 32);
        assert_eq!(
            flags & abi::init::DIRECT_IO_ALLOW_MMAP != 0,
            expect,
            "{extra:?}: flags {flags:#x}"
        );
        fe.disconnect();
        let (status, err) = wait_exit(child);
        assert_eq!(status.code(), Some(0), "{err}");
    }
}
