//! Live migration: what the daemon's state looks like on the way from the source daemon to the
//! destination one.
//!
//! QEMU stops the device, asks the source daemon for its state (`SET_DEVICE_STATE_FD`, save),
//! puts the bytes into its migration stream, and gives them to the destination daemon
//! (`SET_DEVICE_STATE_FD`, load) before the guest runs again; `CHECK_DEVICE_STATE` then tells
//! each QEMU whether its side worked. The guest keeps its node ids, its open handles and the
//! FUSE session it agreed on in `INIT`: the destination serves them from the state.
//!
//! This module holds the container the state travels in: a header with a magic, a format
//! version and the payload length, then the payload, then a checksum. [`open`] refuses a truncated, corrupted or foreign blob before any of it is used;
//! [`Decoder`] refuses a payload whose fields run past its end. What goes into the payload is
//! the business of each layer: the FUSE server's session ([`server`](crate::server)) and the
//! file system's nodes and handles (the daemon's `passthrough::migration`). The options of a
//! migration (`--migration-*`) are the daemon's (its `migration` module).

use std::ffi::CString;
use std::fmt;

/// First bytes of a state blob.
pub const MAGIC: [u8; 8] = *b"VFSD-MIG";
/// Version of the payload format. A destination refuses any other.
pub const VERSION: u32 = 1;
/// Header: magic, version, payload length.
const HEADER_LEN: usize = 8 + 4 + 8;
/// Most bytes a destination accepts as a state (memory stays bounded whatever the stream
/// holds): room for millions of nodes.
pub const MAX_STATE: usize = 256 << 20;

/// Why a state could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state is {len} bytes, shorter than its {HEADER_LEN}-byte header")]
    TooShort { len: usize },
    #[error(
        "state does not start with this daemon's magic (not a virtio-fs state of this daemon)"
    )]
    Foreign,
    #[error("state format version {found}, this daemon reads version {VERSION}")]
    Version { found: u32 },
    #[error("state says its payload is {said} bytes, but {got} bytes follow the header")]
    Length { said: u64, got: usize },
    #[error("state checksum does not match (corrupted in transit)")]
    Checksum,
    #[error("state is larger than {MAX_STATE} bytes")]
    TooLarge,
    #[error("state ends inside {what}")]
    Truncated { what: &'static str },
    #[error("state has {n} bytes after its last field")]
    Trailing { n: usize },
    #[error("state field {what} is invalid: {why}")]
    Invalid { what: &'static str, why: String },
    #[error("{0}")]
    Refused(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl StateError {
    pub fn invalid(what: &'static str, why: impl fmt::Display) -> Self {
        StateError::Invalid {
            what,
            why: why.to_string(),
        }
    }
}

/// FNV-1a, 64 bits: catches a blob changed in transit (not a defence against a forger, who
/// controls the checksum too; what a forged state can name is limited by the loader).
fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Wraps `payload` in the header and checksum.
pub fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + 8);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&checksum(payload).to_le_bytes());
    out
}

/// The payload of a sealed state, once its header, length and checksum are proven.
pub fn open(blob: &[u8]) -> Result<&[u8], StateError> {
    if blob.len() > MAX_STATE {
        return Err(StateError::TooLarge);
    }
    if blob.len() < HEADER_LEN {
        if blob.len() >= MAGIC.len() && blob[..MAGIC.len()] != MAGIC {
            return Err(StateError::Foreign);
        }
        return Err(StateError::TooShort { len: blob.len() });
    }
    if blob[..8] != MAGIC {
        return Err(StateError::Foreign);
    }
    let version = u32::from_le_bytes([blob[8], blob[9], blob[10], blob[11]]);
    if version != VERSION {
        return Err(StateError::Version { found: version });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&blob[12..20]);
    let said = u64::from_le_bytes(len);
    let rest = &blob[HEADER_LEN..];
    let got = rest.len().saturating_sub(8);
    if rest.len() < 8 || said != got as u64 {
        return Err(StateError::Length { said, got });
    }
    let (payload, sum) = rest.split_at(got);
    let mut s = [0u8; 8];
    s.copy_from_slice(sum);
    if checksum(payload) != u64::from_le_bytes(s) {
        return Err(StateError::Checksum);
    }
    Ok(payload)
}

/// Builds a payload: little-endian integers and length-prefixed byte strings.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        Encoder::default()
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// A byte string, prefixed with its length (u32).
    pub fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
    }

    /// Starts a section: its length is filled in by [`Encoder::end`], so a reader can check
    /// it consumed exactly the section.
    pub fn begin(&mut self) -> usize {
        let at = self.buf.len();
        self.u64(0);
        at
    }

    pub fn end(&mut self, at: usize) {
        let len = (self.buf.len() - at - 8) as u64;
        self.buf[at..at + 8].copy_from_slice(&len.to_le_bytes());
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads a payload, refusing any field that runs past its end.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], StateError> {
        if self.buf.len() < n {
            return Err(StateError::Truncated { what });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, StateError> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, StateError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, StateError> {
        Ok(self.u32(what)? as i32)
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, StateError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub fn bool(&mut self, what: &'static str) -> Result<bool, StateError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(StateError::invalid(what, format!("{v} is not a boolean"))),
        }
    }

    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], StateError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    /// A name: a non-empty byte string without `/` or NUL, other than `.` and `..`.
    pub fn name(&mut self, what: &'static str) -> Result<CString, StateError> {
        let b = self.plain_name(what)?;
        CString::new(b).map_err(|_| StateError::invalid(what, "contains a NUL byte"))
    }

    /// A name as [`Decoder::name`] checks it, borrowed from the payload.
    pub fn plain_name(&mut self, what: &'static str) -> Result<&'a [u8], StateError> {
        let b = self.bytes(what)?;
        if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
            return Err(StateError::invalid(what, "not a file name"));
        }
        Ok(b)
    }

    /// The bytes not read yet (with [`Decoder::consumed_since`], the raw bytes of fields a
    /// reader keeps without copying them).
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// The bytes read since `rest` was what [`Decoder::rest`] gave.
    pub fn consumed_since(&self, rest: &'a [u8]) -> &'a [u8] {
        &rest[..rest.len().saturating_sub(self.buf.len())]
    }

    /// A count of items each at least `min_size` bytes long, refused when the rest of the
    /// payload cannot hold that many (a reader that keeps decoded items must still bound what
    /// they cost: an item may take more room decoded than its bytes in the payload).
    pub fn count(&mut self, what: &'static str, min_size: usize) -> Result<usize, StateError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_size.max(1)) > self.buf.len() {
            return Err(StateError::Truncated { what });
        }
        Ok(n)
    }

    /// A section written by [`Encoder::begin`]/[`Encoder::end`], as its own decoder.
    pub fn section(&mut self, what: &'static str) -> Result<Decoder<'a>, StateError> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).map_err(|_| StateError::Truncated { what })?;
        Ok(Decoder::new(self.take(n, what)?))
    }

    /// Refuses bytes left after the last field.
    pub fn finish(&self) -> Result<(), StateError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(StateError::Trailing { n }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut e = Encoder::new();
        e.u64(7);
        let s = e.begin();
        e.bytes(b"name");
        e.bool(true);
        e.end(s);
        seal(&e.into_bytes())
    }

    #[test]
    fn a_sealed_state_opens_and_reads_back() {
        let blob = sample();
        let payload = open(&blob).unwrap();
        let mut d = Decoder::new(payload);
        assert_eq!(d.u64("a").unwrap(), 7);
        let mut s = d.section("s").unwrap();
        assert_eq!(s.name("n").unwrap().as_bytes(), b"name");
        assert!(s.bool("b").unwrap());
        s.finish().unwrap();
        d.finish().unwrap();
    }

    #[test]
    fn every_truncation_is_refused() {
        let blob = sample();
        for n in 0..blob.len() {
            assert!(open(&blob[..n]).is_err(), "{n} bytes accepted");
        }
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let blob = sample();
        for i in 0..blob.len() {
            let mut bad = blob.clone();
            bad[i] ^= 0x40;
            assert!(open(&bad).is_err(), "byte {i} flipped accepted");
        }
    }

    #[test]
    fn foreign_and_future_blobs_say_so() {
        assert!(matches!(
            open(b"QEVM\0\0\0\x03 some other stream"),
            Err(StateError::Foreign)
        ));
        let mut blob = sample();
        blob[8] = 2;
        assert!(matches!(open(&blob), Err(StateError::Version { found: 2 })));
    }

    #[test]
    fn fields_past_the_end_and_bad_names_are_refused() {
        let mut e = Encoder::new();
        e.u32(1_000_000);
        let b = e.into_bytes();
        assert!(Decoder::new(&b).count("nodes", 16).is_err());
        assert!(Decoder::new(&b).bytes("name").is_err());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            let mut e = Encoder::new();
            e.bytes(bad);
            let b = e.into_bytes();
            assert!(Decoder::new(&b).name("name").is_err(), "{bad:?}");
        }
        let mut e = Encoder::new();
        e.u8(2);
        let b = e.into_bytes();
        assert!(Decoder::new(&b).bool("flag").is_err());
    }
}
