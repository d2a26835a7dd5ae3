//! The vhost-user transport: the virtio-fs device backend and the adapter from descriptor chains
//! to the FUSE server's byte streams.

pub mod backend;
pub mod descriptor;
mod dirty_log;
pub mod poll;
#[cfg(test)]
mod pool_tests;
pub mod vring;

pub use backend::FsBackend;
