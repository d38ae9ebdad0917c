//! Byte-level steps the identifier scans share (`temp_schema`, `identity`):
//! past a quoted run, past a line comment. Pure functions over bytes.

/// The index after the closing `quote` of a run that starts at `i` (just
/// past the opening one): a doubled quote is one character, and with
/// `backslash` (MySQL strings) so is a backslash and what follows it.
/// `b.len()` when it never closes.
pub(crate) fn skip_quoted(b: &[u8], i: usize, quote: u8, backslash: bool) -> usize {
    quoted_end(b, i, quote, backslash).unwrap_or(b.len())
}

/// [`skip_quoted`], telling a run that never closes apart: `None`.
#[inline]
pub(crate) fn quoted_end(b: &[u8], mut i: usize, quote: u8, backslash: bool) -> Option<usize> {
    while i < b.len() {
        if backslash && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i] == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// The index of the newline ending the line comment at `i` (or `b.len()`).
pub(crate) fn line_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i] != b'\n' {
        i += 1;
    }
    i
}
