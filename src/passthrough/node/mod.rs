//! A node: what the daemon keeps of one host file the guest holds, the tables that find it by
//! node id and by key, the memory it lives in, and what identifies its file.
//!
//! # Layout
//! Each line uses only the modules of the lines below it (`doc/architecture.md`):
//! - `inode`: the node's data ([`inode::InodeData`]) and the node tables
//!   ([`inode::InodeStore`]), with lookup counts, and the memory given back after FORGET;
//! - `key`: what identifies a host file or a directory's state;
//! - `slab`: the memory of the nodes (slots in chunks of their own, counted references).

pub mod inode;
pub mod key;
pub mod slab;
