//! The fuzz harnesses, shared by the cargo-fuzz targets (`fuzz_targets/*.rs`) and by the
//! regression test of the main crate (`tests/it/fuzz_regressions.rs`), which replays every file
//! under `tests/fuzz/regressions/<target>/` through the same `run` function. Each `run` takes
//! the raw input bytes and panics when an invariant breaks.
#![allow(dead_code)]

pub mod common;
pub mod fuse_server;
pub mod migration_state;
pub mod passthrough_ops;
pub mod queue_path;

/// The harness of the fuzz target `name`.
pub fn by_name(name: &str) -> Option<fn(&[u8])> {
    Some(match name {
        "fuse_server" => fuse_server::run,
        "queue_path" => queue_path::run,
        "passthrough_ops" => passthrough_ops::run,
        "migration_state" => migration_state::run,
        _ => return None,
    })
}
