//! The vhost-user transport: the virtio-fs device backend and the adapter from descriptor chains
//! to the FUSE server's byte streams.

pub mod backend;
pub mod descriptor;
mod dirty_log;
pub mod poll;
pub mod vring;

pub use backend::FsBackend;
