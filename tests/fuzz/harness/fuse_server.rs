//! The FUSE server fed raw request bytes, over a filesystem with fixed answers.
//!
//! Input: `[init flags: u64]` then up to 16 messages, each `[reply capacity: u16]
//! [request length: u16][request bytes]` (the request is cut short where the input ends). An
//! INIT offering the fuzzed flags is sent first, so every opcode gets past the "before INIT"
//! check. The server must never panic, and every reply it reports must fit its buffer and carry
//! a consistent header.

use virtiofs_fuse::io::{SliceReader, VecWriter};
use virtiofs_fuse::server::Server;

use super::common;

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(data.len());
    let (head, tail) = data.split_at(n);
    *data = tail;
    head
}

fn send(srv: &Server<common::FixedFs>, req: &[u8], cap: usize) {
    let w = VecWriter::new(cap);
    let out = w.output();
    if let Ok(n) = srv.handle_message(SliceReader::new(req), w) {
        if n > 0 {
            common::check_reply(req, &out.borrow(), n, cap);
        }
    }
}

/// Runs one input; panics on a broken invariant.
pub fn run(data: &[u8]) {
    // A fresh server per input: INIT state and negotiated flags must not leak between inputs.
    let srv = Server::new(common::FixedFs::new());
    let mut data = data;
    let mut flags = [0u8; 8];
    let f = take(&mut data, 8);
    flags[..f.len()].copy_from_slice(f);
    let minor = 27 + u32::from(flags[7] & 0x0f).min(14);
    let init = common::init_request(minor, u64::from_le_bytes(flags));
    send(&srv, &init, 4096);
    for _ in 0..16 {
        if data.len() < 4 {
            break;
        }
        let cap = u16::from_le_bytes([data[0], data[1]]) as usize;
        let len = u16::from_le_bytes([data[2], data[3]]) as usize;
        data = &data[4..];
        let req = take(&mut data, len);
        send(&srv, req, cap);
    }
}
