//! Fuzz target: a migration destination's passthrough file system fed forged states.
//! The harness is `harness/migration_state.rs`, which `tests/it/fuzz_regressions.rs` also replays.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::migration_state::run(data));
