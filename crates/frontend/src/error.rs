//! The frontend's error, and the result types of its calls.

use std::time::Duration;

/// Errors of the frontend itself (FUSE-level errors are replies, see [`Reply`](super::Reply)).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    /// A vhost-user request failed (daemon rejected it or the socket broke).
    #[error("vhost-user: {0}")]
    Vhost(#[from] vhost::Error),
    /// The daemon does not offer what a virtio-fs frontend needs.
    #[error("vhost-user handshake: {0}")]
    Handshake(String),
    /// Invalid frontend configuration or argument.
    #[error("invalid frontend configuration: {0}")]
    Config(String),
    /// Guest memory (or a client's buffer arena) is exhausted.
    #[error("out of guest memory: {requested} bytes requested, {available} available")]
    OutOfGuestMemory { requested: u64, available: u64 },
    /// A buffer lies outside guest memory.
    #[error("guest range {addr:#x}+{len:#x} is outside guest memory")]
    AddressOutOfRange { addr: u64, len: u64 },
    /// Not enough free descriptors for the chain.
    #[error("virtqueue full: {needed} descriptors needed, {free} free")]
    QueueFull { needed: usize, free: usize },
    /// A checked method was asked to build a malformed chain.
    #[error("invalid descriptor chain: {0}")]
    InvalidChain(String),
    /// The feature needed for this was not negotiated.
    #[error("{0} was not negotiated")]
    NotNegotiated(&'static str),
    /// The vring does not exist or was already handed out.
    #[error("vring {0} does not exist or is already in use")]
    NoSuchQueue(usize),
    /// Nothing came back from the device in time.
    #[error("timed out after {waited:?} waiting for vring {queue} ({in_flight} chains in flight)")]
    Timeout {
        queue: usize,
        waited: Duration,
        in_flight: usize,
    },
    /// Waiting for a used entry while the device owns no chain.
    #[error("waiting on vring {queue} but no chain is in flight")]
    Idle { queue: usize },
    /// The device returned a head it did not own.
    #[error("device returned head {id} on vring {queue}, which it does not own")]
    UnknownUsedId { queue: usize, id: u32 },
    /// The device moved `used.idx` by more than the queue size.
    #[error("device set used.idx of vring {queue} to {used_idx} (driver at {last_used})")]
    UsedRingCorrupt {
        queue: usize,
        used_idx: u16,
        last_used: u16,
    },
    /// The device's reply violates the FUSE or virtio-fs protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
}

impl Error {
    pub(crate) fn io(what: &'static str, source: std::io::Error) -> Self {
        Error::Io { what, source }
    }

    /// Whether this is a [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }
}

/// Result type of the frontend.
pub type Result<T> = std::result::Result<T, Error>;

/// Outcome of a typed FUSE request (the `try_*` helpers of [`FuseClient`](super::FuseClient)): `Err` for a
/// transport or protocol failure, `Ok(Err(e))` for a FUSE error reply with positive errno `e`,
/// `Ok(Ok(v))` for success. The panicking helpers (`lookup`, `read`, ...) unwrap the outer one.
pub type FuseResult<T> = Result<std::result::Result<T, i32>>;
