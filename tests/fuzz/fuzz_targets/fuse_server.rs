//! Fuzz target: the FUSE server fed raw request bytes.
//! The harness is `harness/fuse_server.rs`, which `tests/it/fuzz_regressions.rs` also replays.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::fuse_server::run(data));
