//! A vhost-user virtio-fs daemon: serves a host directory to a Linux guest.
//!
//! Layers, from the wire inwards:
//! - [`vhost_user`]: the vhost-user backend; turns descriptor chains into FUSE byte streams;
//! - [`fuse`]: FUSE wire format and the request dispatcher (no virtio types), and
//!   [`filesystem`], the trait the dispatcher calls: the protocol crate `virtiofs-fuse`
//!   (`crates/fuse/`), re-exported;
//! - [`passthrough`]: the filesystem that serves a host directory;
//! - [`idmap`]: daemon-side uid/gid translation, a filesystem wrapped around the passthrough one;
//! - [`sandbox`]: confining the daemon (`--sandbox`), dropping capabilities (`--modcaps`), the
//!   seccomp filter (`--seccomp`) and the user namespace of `--uid-map`/`--gid-map`
//!   ([`sandbox::userns`]);
//! - [`socket_lock`]: one daemon per socket path (`<socket>.pid`);
//! - [`socket_path`]: what is at a socket path that is not a socket (a leaf, which the
//!   command line and the daemon both use);
//! - [`error`]: showing an error with its causes;
//! - [`os`] and [`mountinfo`]: descriptors and `/proc/self/mountinfo`, as several layers use
//!   them (leaves: they use nothing else of the crate).
//!
//! The test frontend that plays QEMU and the guest kernel (for the integration tests, the
//! benchmark and the fuzz harness) is a crate of its own, `virtiofsd-frontend`
//! (`crates/frontend/`): the daemon is built without it.

pub mod activation;
pub mod cli;
pub mod daemon;
pub mod error;
pub mod idmap;
pub mod logging;
pub mod migration;
pub mod mountinfo;
pub mod os;
pub mod passthrough;
pub mod sandbox;
pub mod socket_lock;
pub mod socket_path;
pub mod vhost_user;

// The FUSE protocol is the crate `virtiofs-fuse` (`crates/fuse/`); its modules keep the paths
// they had in this library (`fuse::abi`, `fuse::server`, `filesystem`, the codec under
// `migration`).
pub use virtiofs_fuse as fuse;
pub use virtiofs_fuse::filesystem;
