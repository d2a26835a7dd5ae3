//! `/proc/self/mountinfo`, as the sandbox and a migration destination read it.

/// Undoes the octal escapes of a path in `/proc/self/mountinfo` (`\040` for a space, `\011`,
/// `\012`, `\134`).
pub fn unescape(field: impl AsRef<[u8]>) -> Vec<u8> {
    let b = field.as_ref();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |j: usize| b.get(j).filter(|c| (b'0'..=b'7').contains(c)).copied();
        if b[i] == b'\\' {
            if let (Some(x), Some(y), Some(z)) = (octal(i + 1), octal(i + 2), octal(i + 3)) {
                let v =
                    (u32::from(x - b'0') << 6) | (u32::from(y - b'0') << 3) | u32::from(z - b'0');
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}
