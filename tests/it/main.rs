//! The daemon's integration tests, one crate: each module is one former test file
//! (`cargo test --test it migration::` runs what `cargo test --test migration` ran), built and
//! linked once instead of once per file. `tests/common` is their shared harness.
//!
//! They share one process. None of them changes what another one reads: the umask is cleared
//! once for all (`common::clear_umask`), descriptors are counted per share (`locks`), child
//! processes are waited for by pid, and the scenarios of `userns` run in a re-executed copy of
//! this binary. Two files stay crates of their own because they measure the whole process:
//! `tests/allocations.rs` (its own global allocator counts every allocation) and
//! `tests/hostile.rs` (descriptors and resident memory of the process, which the tests of the
//! other modules, running beside them, would change).

#[path = "../common/mod.rs"]
mod common;

mod activation;
mod architecture;
mod cli;
mod docs;
mod file_handles;
mod fuse_ops;
mod fuzz_regressions;
mod idmap;
mod launchers;
mod lifecycle;
mod locks;
mod malformed;
mod migration;
mod modes;
mod msrv;
mod no_open;
mod queues;
mod reuse;
mod rootless;
mod sandbox;
mod seccomp;
mod syslog;
mod userns;
mod xattr_features;
