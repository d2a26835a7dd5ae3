//! The minimum Rust is a promise of four files (`Cargo.toml`'s `rust-version`,
//! `tests/cargo-env.sh`'s `RUST_MIN`, `debian/control`'s `rustc (>= …)`, the README) and of
//! `Cargo.lock`: a locked crate that needs a newer compiler breaks `cargo build --locked` with
//! the minimum (uuid 1.29 needs 1.89). These tests keep the files in step and check every crate
//! of the lock file that is built on this platform against the minimum, so that a `cargo
//! update` cannot raise it unnoticed. `tests/min-rust.sh` then builds with that release itself.

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The value of the first line `key = "value"` of `text` (TOML as cargo writes it).
fn toml_str<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(key)?.trim_start().strip_prefix('=')?;
        rest.trim().strip_prefix('"')?.strip_suffix('"')
    })
}

/// A version as numbers, missing parts 0: "1.85" is [1, 85, 0].
fn version(s: &str) -> [u64; 3] {
    let mut v = [0; 3];
    for (slot, part) in v.iter_mut().zip(s.split('.')) {
        *slot = part
            .parse()
            .unwrap_or_else(|_| panic!("not a version: {s}"));
    }
    v
}

fn workspace_min() -> String {
    toml_str(&read("Cargo.toml"), "rust-version")
        .expect("Cargo.toml has no rust-version")
        .to_string()
}

/// The manifest of every package of the workspace's resolve for this platform (`cargo
/// metadata --locked --filter-platform`): each package object has exactly one
/// `"manifest_path"`.
fn locked_manifests() -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--filter-platform",
            &triple,
        ])
        .current_dir(ROOT)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = String::from_utf8(out.stdout).expect("UTF-8 metadata");
    const KEY: &str = "\"manifest_path\":\"";
    json.match_indices(KEY)
        .map(|(i, _)| {
            let rest = &json[i + KEY.len()..];
            rest[..rest.find('"').expect("a closed string")].to_string()
        })
        .collect()
}

#[test]
fn version_parsing_orders_releases() {
    assert!(version("1.89") > version("1.85"));
    assert!(version("1.85.1") > version("1.85"));
    assert_eq!(version("1.85.0"), version("1.85"));
    assert!(version("1.100") > version("1.99.9"));
}

#[test]
fn the_minimum_is_named_alike_everywhere() {
    let min = workspace_min();
    let env = read("tests/cargo-env.sh");
    assert!(
        env.lines().any(|l| l == format!("RUST_MIN={min}")),
        "tests/cargo-env.sh: RUST_MIN is not {min}"
    );
    let control = read("debian/control");
    assert!(
        control.contains(&format!("rustc (>= {min})")),
        "debian/control: Build-Depends names no rustc (>= {min})"
    );
    assert!(
        read("README.md").contains(&format!("**Rust {min} or later.**")),
        "README.md does not ask for Rust {min} or later"
    );
}

#[test]
fn every_locked_crate_builds_with_the_minimum_rust() {
    let min = workspace_min();
    let manifests = locked_manifests();
    let registry: Vec<&String> = manifests
        .iter()
        .filter(|p| p.contains("/registry/src/"))
        .collect();
    assert!(
        registry.iter().any(|p| p.contains("/vhost-")),
        "cargo metadata listed no registry crate such as vhost: {manifests:?}"
    );
    let mut too_new = Vec::new();
    for path in registry {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let name = toml_str(&text, "name").unwrap_or(path);
        let v = toml_str(&text, "version").unwrap_or("?");
        if let Some(rv) = toml_str(&text, "rust-version") {
            if version(rv) > version(&min) {
                too_new.push(format!("{name} {v} needs Rust {rv}"));
            }
        }
    }
    assert!(
        too_new.is_empty(),
        "Cargo.lock has crates newer than the minimum Rust {min}: {too_new:?}\n\
         pin each to its newest release for {min}: cargo update -p NAME --precise VERSION"
    );
}
