//! Request extensions: the records that follow the arguments of a request
//! (`fuse_in_header::total_extlen` 8-byte units).
//!
//! Each record starts with a `fuse_ext_header` (`size` including the header, a multiple of 8;
//! `type`). Types 0 to 31 are a security context (`FUSE_SECURITY_CTX`), the type being the
//! number of contexts: each is a `fuse_secctx` (`size` of the value, padding), the attribute
//! name with its NUL, then the value, the whole padded to 8 bytes. Type 32 lists the caller's
//! supplementary groups (`FUSE_CREATE_SUPP_GROUP`). Other types are skipped.
//!
//! Every length is checked against the bytes that are really there; anything that does not fit
//! is `EINVAL`.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;

use super::abi::{self, Pod};
use crate::filesystem::SecCtx;

/// Largest number of security contexts in one extension (types 0 to 31).
const MAX_NR_SECCTX: u32 = 31;
/// Longest attribute name, with its NUL (`XATTR_NAME_MAX` + 1).
const NAME_MAX_NUL: usize = 256;
/// Largest attribute value (`XATTR_SIZE_MAX`).
const VALUE_MAX: usize = 65536;

/// What the extensions of one request carry.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Extensions<'a> {
    /// The first supplementary group sent (`FUSE_EXT_GROUPS`).
    pub supp_group: Option<u32>,
    /// The security contexts sent (`FUSE_SECURITY_CTX`).
    pub secctx: Vec<SecCtx<'a>>,
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// `n` rounded up to a multiple of 8 (`FUSE_REC_ALIGN`); `None` on overflow.
fn align8(n: usize) -> Option<usize> {
    n.checked_add(7).map(|n| n & !7)
}

/// Parses the extensions `ext` (the bytes after a request's arguments).
pub fn parse(mut ext: &[u8]) -> io::Result<Extensions<'_>> {
    let mut out = Extensions::default();
    let mut secctx_seen = false;
    while !ext.is_empty() {
        let hdr = abi::ExtHeader::from_prefix(ext).ok_or_else(einval)?;
        let size = hdr.size as usize;
        if size < size_of::<abi::ExtHeader>() || size % 8 != 0 || size > ext.len() {
            return Err(einval());
        }
        let body = &ext[size_of::<abi::ExtHeader>()..size];
        match hdr.typ {
            n @ 0..=MAX_NR_SECCTX => {
                if secctx_seen {
                    return Err(einval());
                }
                secctx_seen = true;
                parse_secctx(n, body, &mut out.secctx)?;
            }
            abi::EXT_GROUPS => {
                let count = u32::from_prefix(body).ok_or_else(einval)?;
                if count > 0 {
                    out.supp_group = Some(u32::from_prefix(&body[4..]).ok_or_else(einval)?);
                }
            }
            _ => {}
        }
        ext = &ext[size..];
    }
    Ok(out)
}

/// Parses `nr` security contexts from `body`.
fn parse_secctx<'a>(nr: u32, mut body: &'a [u8], out: &mut Vec<SecCtx<'a>>) -> io::Result<()> {
    for _ in 0..nr {
        let value_len = u32::from_prefix(body).ok_or_else(einval)? as usize;
        if value_len > VALUE_MAX {
            return Err(einval());
        }
        // The fixed part: size and padding.
        let rest = body.get(8..).ok_or_else(einval)?;
        let nul = rest
            .iter()
            .take(NAME_MAX_NUL)
            .position(|&b| b == 0)
            .ok_or_else(einval)?;
        if nul == 0 {
            return Err(einval());
        }
        let name = CStr::from_bytes_with_nul(&rest[..=nul]).map_err(|_| einval())?;
        let value_end = (nul + 1).checked_add(value_len).ok_or_else(einval)?;
        let value = rest.get(nul + 1..value_end).ok_or_else(einval)?;
        out.push(SecCtx { name, value });
        let record = align8(8 + value_end).ok_or_else(einval)?;
        // The last record may end without its padding only if nothing follows it.
        body = body.get(record..).unwrap_or(&[]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One extension record: header (size, type) then `body`, padded to 8.
    fn record(typ: u32, body: &[u8]) -> Vec<u8> {
        let size = align8(8 + body.len()).unwrap();
        let mut v = Vec::new();
        v.extend_from_slice(&(size as u32).to_le_bytes());
        v.extend_from_slice(&typ.to_le_bytes());
        v.extend_from_slice(body);
        v.resize(size, 0);
        v
    }

    /// One `fuse_secctx` with its name and value, padded to 8.
    fn secctx(name: &str, value: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(value.len() as u32).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(name.as_bytes());
        v.push(0);
        v.extend_from_slice(value);
        v.resize(align8(v.len()).unwrap(), 0);
        v
    }

    fn groups(gs: &[u32]) -> Vec<u8> {
        let mut b = (gs.len() as u32).to_le_bytes().to_vec();
        for g in gs {
            b.extend_from_slice(&g.to_le_bytes());
        }
        record(abi::EXT_GROUPS, &b)
    }

    fn errno(r: io::Result<Extensions<'_>>) -> i32 {
        r.unwrap_err().raw_os_error().unwrap()
    }

    #[test]
    fn a_security_context_and_a_group_as_linux_sends_them() {
        let label = b"system_u:object_r:container_file_t:s0\0";
        let mut ext = record(1, &secctx("security.selinux", label));
        ext.extend(groups(&[4242]));
        let e = parse(&ext).unwrap();
        assert_eq!(e.supp_group, Some(4242));
        assert_eq!(e.secctx.len(), 1);
        assert_eq!(e.secctx[0].name, c"security.selinux");
        assert_eq!(e.secctx[0].value, label);
    }

    #[test]
    fn no_extension_and_an_empty_security_context() {
        assert_eq!(parse(&[]).unwrap(), Extensions::default());
        // nr_secctx 0: the LSM had nothing to say.
        assert_eq!(parse(&record(0, &[])).unwrap(), Extensions::default());
    }

    #[test]
    fn two_contexts_in_one_extension() {
        let mut body = secctx("security.a", b"1");
        body.extend(secctx("security.bb", b"22222222"));
        let ext = record(2, &body);
        let e = parse(&ext).unwrap();
        let got: Vec<_> = e.secctx.iter().map(|c| (c.name, c.value)).collect();
        assert_eq!(
            got,
            [
                (c"security.a", &b"1"[..]),
                (c"security.bb", &b"22222222"[..])
            ]
        );
    }

    #[test]
    fn unknown_extension_types_are_skipped() {
        let mut ext = record(77, b"whatever");
        ext.extend(groups(&[5]));
        assert_eq!(parse(&ext).unwrap().supp_group, Some(5));
    }

    #[test]
    fn malformed_extensions_are_einval_never_a_panic() {
        let good = record(1, &secctx("security.selinux", b"label"));
        let mut cases: Vec<Vec<u8>> = vec![
            // Header cut short, size below the header, not a multiple of 8, beyond the data.
            vec![16, 0, 0],
            [4u32.to_le_bytes(), 1u32.to_le_bytes()].concat(),
            [12u32.to_le_bytes(), 0u32.to_le_bytes(), 0u32.to_le_bytes()].concat(),
            [64u32.to_le_bytes(), 0u32.to_le_bytes()].concat(),
            // A context count with no contexts.
            record(1, &[]),
            record(3, &secctx("security.a", b"x")),
            // Value longer than the record.
            record(1, &{
                let mut b = secctx("security.a", b"x");
                b[0] = 200;
                b
            }),
            // Value size beyond XATTR_SIZE_MAX.
            record(1, &{
                let mut b = secctx("security.a", b"x");
                b[0..4].copy_from_slice(&(VALUE_MAX as u32 + 1).to_le_bytes());
                b
            }),
            // Name without NUL, empty name, name too long.
            record(
                1,
                &[
                    1, 0, 0, 0, 0, 0, 0, 0, b'a', b'b', b'c', b'd', b'e', b'f', b'g', b'h',
                ],
            ),
            record(1, &secctx("", b"x")),
            record(1, &secctx(&"n".repeat(300), b"x")),
            // Two security context extensions.
            [good.clone(), good.clone()].concat(),
            // Groups: a count with the header cut short.
            [8u32.to_le_bytes(), abi::EXT_GROUPS.to_le_bytes()].concat(),
        ];
        // Every truncation of a good request is refused too.
        for cut in 1..good.len() {
            cases.push(good[..cut].to_vec());
        }
        for (i, c) in cases.iter().enumerate() {
            assert_eq!(errno(parse(c)), libc::EINVAL, "case {i}: {c:?}");
        }
        assert!(parse(&good).is_ok());
    }

    #[test]
    fn a_value_of_the_largest_size_is_accepted() {
        let value = vec![7u8; VALUE_MAX];
        let ext = record(1, &secctx("security.big", &value));
        assert_eq!(parse(&ext).unwrap().secctx[0].value.len(), VALUE_MAX);
    }
}
