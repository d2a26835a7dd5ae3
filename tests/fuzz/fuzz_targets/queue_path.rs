//! Fuzz target: the virtqueue path from raw guest memory to replies.
//! The harness is `harness/queue_path.rs`, which `tests/it/fuzz_regressions.rs` also replays.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::queue_path::run(data));
