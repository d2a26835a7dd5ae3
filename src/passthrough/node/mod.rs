//! A node: what the daemon keeps of one host file the guest holds, the tables that find it by
//! node id and by key, the memory it lives in and gives back, and what identifies its file.
//!
//! # Layout
//! Each line uses only the modules of the lines below it (`doc/architecture.md`):
//! - `inode`: the node's data ([`inode::InodeData`]) and the node tables
//!   ([`inode::InodeStore`]), with lookup counts;
//! - `key`: what identifies a host file or a directory's state; `memory`: the memory given
//!   back after FORGET (the allocator's settings, when to give back);
//! - `slab`: the memory of the nodes (slots in chunks of their own, counted references).
//!
//! The tables' tests are in `tests.rs`; the slab's are beside it.

pub mod inode;
pub mod key;
pub mod memory;
pub mod slab;
#[cfg(test)]
mod tests;
