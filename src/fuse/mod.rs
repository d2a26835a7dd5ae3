//! The FUSE protocol: wire format ([`abi`]), request/reply byte streams ([`io`]) and the request
//! dispatcher ([`server`]). Nothing in this module knows about virtio or vhost-user.

pub mod abi;
pub mod ext;
pub mod io;
pub mod server;
