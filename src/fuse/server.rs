//! FUSE request dispatch.
