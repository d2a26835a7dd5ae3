//! The FUSE protocol as the daemon serves it: wire format ([`abi`]), request/reply byte streams
//! ([`io`]), request extensions ([`ext`]), the request dispatcher ([`server`]), the
//! [`filesystem::FileSystem`] trait it calls, the migration state's container and codec
//! ([`migration`]) and the rate limit of the warnings a guest can cause ([`throttle`]).
//!
//! Nothing in this crate knows about virtio or vhost-user: it has no such dependency. The
//! daemon (`virtiofsd-dropin`) serves it over virtqueues and a host directory; the test
//! frontend, the benchmark and the fuzz harness speak it too.

pub mod abi;
pub mod ext;
pub mod filesystem;
pub mod io;
pub mod migration;
pub mod server;
pub mod throttle;
