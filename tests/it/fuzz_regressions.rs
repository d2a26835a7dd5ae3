//! Replays every input under `tests/fuzz/regressions/<target>/` through the harness the fuzz
//! target `<target>` runs (`tests/fuzz/harness/`), so an input that once crashed a target, or
//! covers a path worth keeping (malformed headers, huge lengths, descriptor loops), stays a
//! plain `cargo test` check. See `tests/fuzz/README.md` for how to add one.

#[path = "../fuzz/harness/mod.rs"]
mod harness;

use std::path::Path;

fn replay(target: &str) {
    let run = harness::by_name(target).expect("known target");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/regressions")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| run(&data));
        assert!(
            r.is_ok(),
            "{target}: {} failed (see the panic above)",
            f.display()
        );
    }
}

#[test]
fn fuse_server_regressions() {
    replay("fuse_server");
}

#[test]
fn queue_path_regressions() {
    replay("queue_path");
}

#[test]
fn passthrough_ops_regressions() {
    replay("passthrough_ops");
}

#[test]
fn migration_state_regressions() {
    replay("migration_state");
}

/// Every directory under `regressions/` names a target, so no input is silently skipped.
#[test]
fn every_regression_directory_names_a_target() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/regressions");
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            let name = e.file_name().into_string().unwrap();
            assert!(
                harness::by_name(&name).is_some(),
                "regressions/{name} names no fuzz target"
            );
        }
    }
}
