//! The documents against the binary, wherever that can be checked mechanically:
//!
//! - the long flags `virtiofsd --help` lists are exactly those `doc/virtiofsd.1` describes
//!   (`tests/cli.rs` checks `doc/configuration.md` the same way);
//! - a document that says a flag, or a value of one, does not exist ("has no `--x`", "is not
//!   available", ...; libvirt's `<sandbox mode='...'/>` stands for `--sandbox=...`) is checked
//!   by starting the binary with it: the claim holds only if the binary refuses it;
//! - the vhost-user descriptor `packaging/50-qemu-virtiofsd.json` lists the features
//!   `--print-capabilities` prints;
//! - the version has the form `README.md` explains, and every document naming the reference
//!   release this daemon matches names the one the version says; the Debian package
//!   (`debian/`) carries the crate's name and version and provides that release;
//! - every document `doc/launchers.md` says a launcher's test lives in exists.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_virtiofsd");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The long flags `--help` lists.
fn help_long_flags() -> BTreeSet<String> {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("       "))
        .flat_map(|l| long_flags_in(l.trim_start()).into_iter().take(1))
        .collect()
}

/// The `--name` tokens of `text`, in order (without `=value`).
fn long_flags_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let before = rest[..i].chars().last();
        let name: String = rest[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        rest = &rest[i + 2 + name.len()..];
        let glob = rest.starts_with('*');
        if !name.is_empty()
            && !name.ends_with('-')
            && !glob
            && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            out.push(format!("--{name}"));
        }
    }
    out
}

/// The long options the man page describes: the tag line of each `.TP` entry.
fn man_long_flags() -> BTreeSet<String> {
    let page = read("doc/virtiofsd.1");
    let lines: Vec<&str> = page.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == ".TP")
        .flat_map(|w| long_flags_in(&w[1].replace("\\-", "-")))
        .collect()
}

#[test]
fn the_man_page_describes_exactly_the_long_flags_of_help() {
    let help = help_long_flags();
    assert!(help.contains("--shared-dir") && help.len() > 30, "{help:?}");
    let man = man_long_flags();
    let missing: Vec<_> = help.difference(&man).collect();
    let stale: Vec<_> = man.difference(&help).collect();
    assert!(
        missing.is_empty(),
        "in --help, not in doc/virtiofsd.1: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "in doc/virtiofsd.1, not in --help: {stale:?}"
    );
}

/// The documents whose claims are checked.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md"), root().join("doc/virtiofsd.1")];
    for dir in ["doc", "qemu-examples", "packaging"] {
        for e in fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() && !docs.contains(&p) {
                docs.push(p);
            }
        }
    }
    docs.sort();
    docs
}

/// Phrases that say the flag right after them is not there ("has no `--x`").
const NONE_OF: &[&str] = &["has no ", "there is no ", "no such flag "];
/// Phrases that say the flag right before them is not there ("`--x` is not available").
const NOT_THERE: &[&str] = &["is not available", "are not available", "does not exist"];

/// The flag (`--x` or `--x=v`) a piece of text starts with, after quotes and spaces; libvirt's
/// `<sandbox mode='m'/>` is `--sandbox=m`.
fn flag_at(text: &str) -> Option<String> {
    let t = text.trim_start_matches(['`', '\'', '"', ' ']);
    if let Some(rest) = t.strip_prefix("<sandbox mode='") {
        let mode: String = rest.chars().take_while(|c| *c != '\'').collect();
        return Some(format!("--sandbox={mode}"));
    }
    let token: String = t
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '='))
        .collect();
    (token.starts_with("--") && !long_flags_in(&token).is_empty())
        .then(|| token.trim_end_matches('=').to_owned())
}

/// The flags (with their value, when given as `--x=v`) a document claims are absent, as
/// `(line number, flag)`.
fn absence_claims(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let plain = line.replace("\\-", "-");
        let lower = plain.to_lowercase();
        for phrase in NONE_OF {
            for (i, _) in lower.match_indices(phrase) {
                if let Some(flag) = flag_at(&plain[i + phrase.len()..]) {
                    out.push((n + 1, flag));
                }
            }
        }
        for phrase in NOT_THERE {
            for (i, _) in lower.match_indices(phrase) {
                // The last flag before the phrase.
                let before = &plain[..i];
                let last = before
                    .match_indices("--")
                    .chain(before.match_indices("<sandbox mode="))
                    .map(|(j, _)| j)
                    .filter(|&j| flag_at(&before[j..]).is_some())
                    .max();
                if let Some(j) = last {
                    out.push((n + 1, flag_at(&before[j..]).unwrap()));
                }
            }
        }
    }
    out
}

/// Whether the binary accepts `flag` on an otherwise valid command line: it starts listening
/// (accepted) or exits (refused).
fn binary_accepts(flag: &str) -> bool {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("s.sock");
    let mut child = Command::new(BIN)
        .arg(format!("--shared-dir={}", tmp.path().display()))
        .arg(format!("--socket-path={}", socket.display()))
        .arg("--log-level=error")
        .arg(flag)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.success();
        }
        if socket.exists() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
            return true;
        }
        assert!(
            Instant::now() < deadline,
            "{flag}: neither listens nor exits"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_claim_finder_sees_what_it_must() {
    let found = absence_claims(
        "This daemon has no `--posix-acl` flag.\n\
         <!-- <sandbox mode='chroot'/> is not available -->\n\
         Flags such as `--xattr` work.\n\
         The `--migration-*` flags are refused; there is no --no-such-thing here.\n",
    );
    assert_eq!(
        found,
        [
            (1, "--posix-acl".to_owned()),
            (2, "--sandbox=chroot".to_owned()),
            (4, "--no-such-thing".to_owned())
        ]
    );
    assert!(binary_accepts("--xattr"));
    assert!(!binary_accepts("--no-such-thing"));
}

#[test]
fn no_document_says_a_flag_the_binary_accepts_does_not_exist() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let Ok(text) = fs::read_to_string(&doc) else {
            continue;
        };
        for (line, flag) in absence_claims(&text) {
            checked += 1;
            if binary_accepts(&flag) {
                let rel = doc.strip_prefix(root()).unwrap().display().to_string();
                wrong.push(format!(
                    "{rel}:{line}: says {flag} is not there; the binary accepts it"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{checked} claims checked:\n{}",
        wrong.join("\n")
    );
}

/// The `"features"` strings of a vhost-user JSON text, in order.
fn features(json: &str) -> Vec<String> {
    let start = json.find("\"features\"").expect("a features list");
    let list = &json[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    list.split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

#[test]
fn the_vhost_user_descriptor_lists_the_features_the_binary_prints() {
    let out = Command::new(BIN)
        .arg("--print-capabilities")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let printed = features(&String::from_utf8(out.stdout).unwrap());
    assert!(
        printed.contains(&"separate-options".to_owned()),
        "{printed:?}"
    );
    let listed = features(&read("packaging/50-qemu-virtiofsd.json"));
    assert_eq!(
        listed, printed,
        "packaging/50-qemu-virtiofsd.json and --print-capabilities disagree"
    );
}

/// What `virtiofsd --version` prints after `virtiofsd `.
fn version() -> String {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim()
        .strip_prefix("virtiofsd ")
        .unwrap_or_else(|| panic!("--version: {text}"))
        .to_owned()
}

/// The reference release the version says this daemon matches: `MAJOR.MINOR`. The version is
/// `RELEASE+PACKAGE.PACKAGE_VERSION` (README.md, "Version"): the reference release, then this
/// package's name and its own version as build metadata.
fn reference_level() -> String {
    let v = version();
    let (release, build) = v.split_once('+').expect("a +PACKAGE.VERSION part");
    let own = build
        .strip_prefix(concat!(env!("CARGO_PKG_NAME"), "."))
        .unwrap_or_else(|| panic!("{v}: the build metadata does not name the package"));
    assert_eq!(own, env!("CARGO_PKG_VERSION"), "{v}");
    assert_ne!(
        env!("CARGO_PKG_NAME"),
        "virtiofsd",
        "the reference's crate name"
    );
    assert_ne!(
        own, release,
        "{v}: the package's version is its own, not the reference's"
    );
    // Build metadata: dot-separated identifiers of ASCII letters, digits and hyphens.
    assert!(
        build
            .split('.')
            .all(|i| !i.is_empty() && i.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')),
        "{v}: not semantic-versioning build metadata"
    );
    let parts: Vec<u32> = release.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{v}");
    assert!(parts[0] >= 1, "{v}: below the reference's 1.x");
    format!("{}.{}", parts[0], parts[1])
}

#[test]
fn the_version_names_the_reference_release_the_documents_name() {
    let level = reference_level();
    let mut wrong = Vec::new();
    let mut named = 0;
    for doc in documents() {
        let text = fs::read_to_string(&doc).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            // "the reference `virtiofsd` 1.14", "reference virtiofsd 1.14"
            let plain = line.replace('`', "");
            let Some(i) = plain.find("reference virtiofsd ") else {
                continue;
            };
            let said: String = plain[i + 20..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let said = said.trim_end_matches('.');
            if said.is_empty() {
                continue;
            }
            named += 1;
            if !said.starts_with(&level) {
                let rel = doc.strip_prefix(root()).unwrap().display().to_string();
                wrong.push(format!("{rel}:{}: names reference {said}", n + 1));
            }
        }
    }
    assert!(named > 0, "no document names the reference release");
    assert!(
        wrong.is_empty(),
        "the version says reference {level}:\n{}",
        wrong.join("\n")
    );
    // The man page's .TH names the package and its version, as a distribution's pages do.
    assert!(
        read("doc/virtiofsd.1").contains(&format!(
            "\"{} {}\"",
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION")
        )),
        "the man page's .TH line names another package or version"
    );
}

/// The Debian package carries the crate's name and version, and provides the reference release
/// the version says this daemon matches.
#[test]
fn the_debian_package_names_the_crate_version_and_the_reference_release() {
    let changelog = read("debian/changelog");
    let first = changelog.lines().next().unwrap_or_default();
    let want = format!("{} ({}-", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"));
    assert!(
        first.starts_with(&want),
        "debian/changelog: {first:?}, expected {want}N)"
    );
    let control = read("debian/control");
    let v = version();
    let release = v.split_once('+').unwrap().0;
    for line in [
        format!("Source: {}", env!("CARGO_PKG_NAME")),
        format!("Package: {}", env!("CARGO_PKG_NAME")),
        format!("Provides: virtiofsd (= {release})"),
        "Conflicts: virtiofsd".to_owned(),
    ] {
        assert!(
            control.lines().any(|l| l == line),
            "debian/control has no line {line:?}"
        );
    }
    // The copyright file states Cargo.toml's license.
    assert!(read("Cargo.toml").contains("license = \"Apache-2.0 OR BSD-3-Clause\""));
    assert!(read("debian/copyright")
        .lines()
        .any(|l| l == "License: Apache-2.0 or BSD-3-Clause"));
}

#[test]
fn every_test_the_launcher_table_names_exists() {
    let table = read("doc/launchers.md");
    let mut named = 0;
    for token in table.split('`') {
        let t = token.split_whitespace().next().unwrap_or("");
        let file = t.split("::").next().unwrap_or("");
        if file.starts_with("tests/") && (file.ends_with(".rs") || file.ends_with(".sh")) {
            named += 1;
            let text = read(file);
            if let Some(name) = t.split("::").nth(1) {
                assert!(
                    text.contains(&format!("fn {name}(")) || text.contains(&format!("{name}()")),
                    "doc/launchers.md names {t}, which {file} does not define"
                );
            }
        }
    }
    assert!(named >= 5, "doc/launchers.md names {named} tests");
}
