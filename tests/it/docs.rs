//! The documents against the binary, wherever that can be checked mechanically:
//!
//! - the long flags `virtiofsd --help` lists are exactly those `doc/virtiofsd.1` describes
//!   (`tests/it/cli.rs` checks `doc/configuration.md` the same way);
//! - a document that says a flag, or a value of one, does not exist ("has no `--x`", "is not
//!   available", ...; libvirt's `<sandbox mode='...'/>` stands for `--sandbox=...`) is checked
//!   by starting the binary with it: the claim holds only if the binary refuses it;
//! - the vhost-user descriptor `packaging/50-qemu-virtiofsd.json`, and every such JSON a document
//!   shows, lists the features `--print-capabilities` prints;
//! - the version has the form `README.md` explains, and every document naming the reference
//!   release this daemon matches names the one the version says; the Debian package
//!   (`debian/`) carries the crate's name and version and provides that release;
//! - every document `doc/launchers.md` says a launcher's test lives in exists;
//! - the man page's EXIT STATUS gives each exit status the binary exits with for a case it
//!   names (a missing shared directory, an unknown flag, ...);
//! - a document (or `--help`) that says a default is the reference's says so only of defaults
//!   that are the same in both (the reference 1.14's, checked against its `--help` when it is
//!   installed).

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

/// The defaults of the reference `virtiofsd` 1.14, as its `--help` prints them. Checked
/// against the reference's own `--help` when it is installed (`/opt/ref-virtiofsd`, as
/// `tests/bench/reference.sh` installs it, or `REF_VIRTIOFSD`).
const REFERENCE_DEFAULTS: &[(&str, &str)] = &[
    ("--thread-pool-size", "0"),
    ("--posix-acl", "never"),
    ("--sandbox", "namespace"),
    ("--seccomp", "kill"),
    ("--inode-file-handles", "prefer"),
    ("--cache", "auto"),
    ("--log-level", "info"),
    ("--security-label", "never"),
    ("--migration-mode", "find-paths"),
    ("--migration-on-error", "abort"),
];

/// The `[default: X]` of each long flag in a `--help` text.
fn help_defaults(help: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut flag = None;
    for l in help.lines() {
        if l.starts_with("  ") && !l.starts_with("       ") {
            flag = long_flags_in(l.trim_start()).into_iter().next();
        }
        if let (Some(f), Some(i)) = (&flag, l.find("[default: ")) {
            let v: String = l[i + 10..].chars().take_while(|c| *c != ']').collect();
            out.insert(f.clone(), v);
        }
    }
    out
}

fn binary_help(bin: &str) -> String {
    let out = Command::new(bin).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{bin} --help");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_reference_defaults_listed_here_are_the_reference_s() {
    let bin = std::env::var("REF_VIRTIOFSD")
        .unwrap_or_else(|_| "/opt/ref-virtiofsd/bin/virtiofsd".to_owned());
    if !Path::new(&bin).exists() {
        eprintln!("skipped: no reference virtiofsd at {bin} (set REF_VIRTIOFSD)");
        return;
    }
    let theirs = help_defaults(&binary_help(&bin));
    for (flag, want) in REFERENCE_DEFAULTS {
        assert_eq!(
            theirs.get(*flag).map(String::as_str),
            Some(*want),
            "{bin} --help: the default of {flag}"
        );
    }
}

/// Sentences that say a default of this daemon is the reference's, and which flag (with the
/// value, when the sentence gives it as `--x=v`) each one is about, as
/// `(line number, flag, value)`. A sentence names its flags, or is about the flag of the
/// section it is in (a markdown heading or a man page `.TP` tag that starts with a flag);
/// "every default" is about all of them.
fn same_default_claims(text: &str) -> Vec<(usize, String, Option<String>)> {
    const SAME: &[&str] = &["as the reference", "default is the reference's"];
    let mut out = Vec::new();
    let mut section: Option<String> = None;
    // A paragraph: (first line number, joined text).
    let mut paragraphs: Vec<(usize, String, Option<String>)> = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    let mut after_tp = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.replace("\\-", "-");
        // A markdown heading, a man page's .TP tag, or a flag's first line in --help.
        let heading = line.starts_with('#')
            || (after_tp && line.starts_with('.'))
            || (line.starts_with("  ") && !line.starts_with("       ") && line.contains("--"));
        after_tp = line == ".TP";
        if heading {
            section = long_flags_in(&line).into_iter().next();
        }
        if line.trim().is_empty() || line.starts_with('#') || line == ".TP" || line == ".PP" {
            if let Some((start, t)) = cur.take() {
                paragraphs.push((start, t, section.clone()));
            }
            continue;
        }
        let words = line
            .trim_start_matches(['.', 'B', 'I', 'R'])
            .trim_start()
            .to_owned();
        match &mut cur {
            Some((_, t)) => {
                t.push(' ');
                t.push_str(&words);
            }
            None => cur = Some((n + 1, words)),
        }
    }
    if let Some((start, t)) = cur.take() {
        paragraphs.push((start, t, section));
    }
    for (start, text, section) in paragraphs {
        for sentence in text.split(". ") {
            let lower = sentence.to_lowercase();
            if !lower.contains("default") || !SAME.iter().any(|p| lower.contains(p)) {
                continue;
            }
            // "Every default is the reference's but one: `--x` ...": what follows "but" is the
            // exception, not a claim.
            let (claim, except) = match lower.find(" but ") {
                Some(i) => (&sentence[..i], long_flags_in(&sentence[i..])),
                None => (sentence, Vec::new()),
            };
            let mut with_value = Vec::new();
            let mut rest = claim;
            while let Some(i) = rest.find("--") {
                let token: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '=' | '_'))
                    .collect();
                rest = &rest[i + token.len().max(2)..];
                if let Some((f, v)) = token.split_once('=') {
                    if !v.is_empty() {
                        with_value.push((f.to_owned(), Some(v.to_owned())));
                    }
                }
            }
            if !with_value.is_empty() {
                out.extend(with_value.into_iter().map(|(f, v)| (start, f, v)));
                continue;
            }
            let named = long_flags_in(claim);
            if !named.is_empty() {
                out.extend(named.into_iter().map(|f| (start, f, None)));
            } else if lower.contains("every default") {
                for (f, _) in REFERENCE_DEFAULTS {
                    if !except.iter().any(|e| e == f) {
                        out.push((start, (*f).to_owned(), None));
                    }
                }
            } else if let Some(f) = &section {
                out.push((start, f.clone(), None));
            }
        }
    }
    out
}

#[test]
fn the_same_default_finder_sees_what_it_must() {
    let found = same_default_claims(
        "Every default is the reference's.\n\
         \n\
         Every default is the reference's but one: `--cache` is `x` here.\n\
         \n\
         ### `--inode-file-handles=never|prefer|mandatory`\n\
         \n\
         Whether inodes are referenced by handle. Default `never`, as the\n\
         reference. Nothing else.\n\
         \n\
         Defaults as the reference's (`--sandbox=namespace`, `--cache=auto`).\n",
    );
    assert_eq!(found.len(), 2 * REFERENCE_DEFAULTS.len() + 2, "{found:?}");
    assert!(!found.contains(&(3, "--cache".to_owned(), None)));
    assert!(found.contains(&(3, "--sandbox".to_owned(), None)));
    assert!(found.contains(&(7, "--inode-file-handles".to_owned(), None)));
    assert!(found.contains(&(10, "--sandbox".to_owned(), Some("namespace".to_owned()))));
    let man = same_default_claims(
        ".TP\n.BI \\-\\-inode\\-file\\-handles= MODE\n.B never\n(the default, as the reference's).\n",
    );
    assert_eq!(man, [(2, "--inode-file-handles".to_owned(), None)]);
    let help = same_default_claims(
        "      --inode-file-handles=<MODE>\n          When to use handles\n\n          \
         \"never\" (the default, as the reference's): an inode keeps it.\n",
    );
    assert_eq!(help, [(4, "--inode-file-handles".to_owned(), None)]);
}

#[test]
fn no_document_says_a_default_is_the_reference_s_when_it_is_not() {
    let ours = help_defaults(&binary_help(BIN));
    let reference: std::collections::BTreeMap<&str, &str> =
        REFERENCE_DEFAULTS.iter().copied().collect();
    // Each default the table lists is one --help prints.
    for (flag, _) in REFERENCE_DEFAULTS {
        assert!(
            ours.contains_key(*flag),
            "--help gives no default for {flag}"
        );
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    let mut texts = vec![("--help".to_owned(), binary_help(BIN))];
    for doc in documents() {
        if let Ok(text) = fs::read_to_string(&doc) {
            let rel = doc.strip_prefix(root()).unwrap().display().to_string();
            texts.push((rel, text));
        }
    }
    for (rel, text) in texts {
        for (line, flag, value) in same_default_claims(&text) {
            let Some(theirs) = reference.get(flag.as_str()) else {
                continue;
            };
            checked += 1;
            let said = value.as_deref().unwrap_or(ours[&flag].as_str());
            if said != *theirs || ours[&flag] != *theirs {
                wrong.push(format!(
                    "{rel}:{line}: says the default of {flag} ({said}) is the reference's; \
                     ours is {}, the reference 1.14's {theirs}",
                    ours[&flag]
                ));
            }
        }
    }
    assert!(checked > 0, "no claim found");
    assert!(
        wrong.is_empty(),
        "{checked} claims checked:\n{}",
        wrong.join("\n")
    );
}

/// The vhost-user JSON blocks (```json fences holding `"type": "fs"`) of a document.
fn json_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("```json") {
        let body = &rest[i + 7..];
        let end = body.find("```").unwrap_or(body.len());
        if body[..end].contains("\"type\": \"fs\"") {
            out.push(body[..end].to_owned());
        }
        rest = &body[end..];
        rest = rest.strip_prefix("```").unwrap_or(rest);
    }
    out
}

#[test]
fn the_documents_show_the_features_the_binary_prints() {
    let out = Command::new(BIN)
        .arg("--print-capabilities")
        .output()
        .unwrap();
    let printed = features(&String::from_utf8(out.stdout).unwrap());
    let mut shown = 0;
    let mut wrong = Vec::new();
    for doc in documents() {
        let Ok(text) = fs::read_to_string(&doc) else {
            continue;
        };
        let rel = doc.strip_prefix(root()).unwrap().display().to_string();
        for block in json_blocks(&text) {
            shown += 1;
            if features(&block) != printed {
                wrong.push(format!("{rel}: shows {:?}", features(&block)));
            }
        }
        // "Not listed ...: `feature`" of a feature the binary lists.
        for (n, line) in text.lines().enumerate() {
            if !line.to_lowercase().contains("not listed") {
                continue;
            }
            for f in &printed {
                if line.contains(&format!("`{f}`")) {
                    wrong.push(format!("{rel}:{}: says {f} is not listed", n + 1));
                }
            }
        }
    }
    assert!(
        shown > 0,
        "no document shows the --print-capabilities output"
    );
    assert!(
        wrong.is_empty(),
        "--print-capabilities lists {printed:?}:\n{}",
        wrong.join("\n")
    );
}

/// The `mode` values libvirt's domain schema allows for a virtiofs `<binary>`'s `<cache>`: read
/// from the installed schema when there is one, else those of libvirt 9.0's.
fn libvirt_cache_modes() -> Vec<String> {
    let rng = fs::read_to_string("/usr/share/libvirt/schemas/domaincommon.rng").unwrap_or_default();
    if let Some(i) = rng.find("<element name=\"cache\">") {
        let el = &rng[i..];
        let el = &el[..el.find("</element>").unwrap_or(el.len())];
        if el.contains("<attribute name=\"mode\">") {
            let modes: Vec<String> = el
                .split("<value>")
                .skip(1)
                .map(|v| v[..v.find('<').unwrap_or(0)].to_owned())
                .collect();
            if !modes.is_empty() {
                return modes;
            }
        }
    }
    vec!["none".to_owned(), "always".to_owned()]
}

#[test]
fn the_libvirt_cache_modes_the_documents_use_are_libvirt_s() {
    let allowed = libvirt_cache_modes();
    assert!(allowed.contains(&"always".to_owned()), "{allowed:?}");
    let mut wrong = Vec::new();
    let mut seen = 0;
    for doc in documents() {
        let Ok(text) = fs::read_to_string(&doc) else {
            continue;
        };
        let rel = doc.strip_prefix(root()).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            for (i, _) in line.match_indices("<cache mode='") {
                let mode: String = line[i + 13..].chars().take_while(|c| *c != '\'').collect();
                seen += 1;
                if !allowed.contains(&mode) {
                    wrong.push(format!("{rel}:{}: <cache mode='{mode}'/>", n + 1));
                }
            }
        }
    }
    assert!(seen > 0, "no document shows a libvirt <cache> element");
    assert!(
        wrong.is_empty(),
        "libvirt's schema allows {allowed:?}:\n{}",
        wrong.join("\n")
    );
}

/// The man page's EXIT STATUS entries: each status with its text (`\-` made `-`, macros out).
fn man_exit_statuses() -> std::collections::BTreeMap<i32, String> {
    let page = read("doc/virtiofsd.1").replace("\\-", "-");
    let section = page
        .split(".SH EXIT STATUS")
        .nth(1)
        .expect("an EXIT STATUS section");
    let section = section.split("\n.SH ").next().unwrap();
    let mut out = std::collections::BTreeMap::new();
    for entry in section.split(".TP\n").skip(1) {
        let mut lines = entry.lines();
        let code: i32 = lines
            .next()
            .and_then(|l| l.strip_prefix(".B "))
            .and_then(|c| c.trim().parse().ok())
            .expect("a .B N tag");
        let text: Vec<&str> = lines
            .map(|l| l.trim_start_matches(['.', 'B', 'I', 'R']).trim_start())
            .collect();
        out.insert(code, text.join(" "));
    }
    out
}

#[test]
fn the_man_page_exit_statuses_are_the_binary_s() {
    let statuses = man_exit_statuses();
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    fs::create_dir(&share).unwrap();
    let file = tmp.path().join("file");
    fs::write(&file, b"x").unwrap();
    let sock = format!("--socket-path={}", tmp.path().join("s.sock").display());
    let dir = |p: &Path| format!("--shared-dir={}", p.display());
    // (the command line, what the man page's entry for its exit status says)
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![sock.clone(), dir(&tmp.path().join("missing"))],
            "the shared directory does not exist",
        ),
        (vec![sock.clone(), dir(&file)], "is not a directory"),
        (
            vec![
                dir(&share),
                format!("--socket-path={}/no-such-dir/s.sock", tmp.path().display()),
            ],
            "the socket's directory does not exist",
        ),
        (
            vec![
                dir(&share),
                sock.clone(),
                "--socket-group=no-such-group-x".into(),
            ],
            "--socket-group is unknown",
        ),
        (
            vec![dir(&share), sock.clone(), "--no-such-flag".into()],
            "an unknown flag",
        ),
        (
            vec![dir(&share), sock.clone(), "--cache=sometimes".into()],
            "a malformed value",
        ),
        (
            vec![
                dir(&share),
                format!("--socket-path={}/{}", tmp.path().display(), "s".repeat(120)),
            ],
            "too long a socket path",
        ),
    ];
    for (args, says) in cases {
        let out = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let code = out.status.code().expect("an exit status");
        let text = statuses
            .get(&code)
            .unwrap_or_else(|| panic!("{args:?}: exit {code}, which the man page does not list"));
        assert!(
            text.contains(says),
            "{args:?}: exit {code}, whose man page entry does not say {says:?}: {text}"
        );
    }
}
