//! The passthrough filesystem: serves a host directory.

pub mod config;

pub use config::{CacheMode, Config};

/// Placeholder until the implementation lands.
pub struct PassthroughFs;
