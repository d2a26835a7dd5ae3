//! Fuzz target: passthrough filesystem operation sequences on a temporary directory.
//! The harness is `harness/passthrough_ops.rs`, which `tests/it/fuzz_regressions.rs` also replays.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::passthrough_ops::run(data));
