//! A fingerprint of a statement with its literals normalised, so that
//! `... WHERE aid = 1` and `... WHERE aid = 2` share one cached decision.
//! Strings, numbers and dollar-quoted bodies become `?`; comments go; runs of
//! white space become one; keywords and unquoted names fold to lower case;
//! quoted names stay as written. No allocation; [`normalize`] gives the
//! same normalised text as a string (for the digest statistics, once per new
//! digest).
//!
//! Two hashes of the same normalised bytes:
//! - [`scan`] / [`fingerprint`]: the key of the decision cache and of the
//!   digest table. SipHash-1-3 under a key drawn at random when the process
//!   starts, so nobody can make two statements share a key on purpose: a
//!   statement that changes session state given the cached decision of a
//!   harmless one would bypass the default-deny rule. (FNV-1a, used before,
//!   is unkeyed and collisions for it are found offline in minutes.)
//! - [`stable_id`]: FNV-1a, the same in every process and release, what
//!   the digest statistics are shown by (computed once per new digest).

use siphasher::sip::SipHasher13;

use crate::dialect::Dialect;

/// Where the normalised bytes go: a hash, or the text itself.
trait Sink {
    fn push(&mut self, b: u8);
    /// The run of name bytes (ASCII letters, digits, `_`) at `b[i..]`, in
    /// lower case; returns the index after it.
    fn word(&mut self, b: &[u8], mut i: usize) -> usize {
        while i < b.len() && LOWER_WORD[b[i] as usize] != 0 {
            self.push(LOWER_WORD[b[i] as usize]);
            i += 1;
        }
        i
    }
    /// A comment was skipped.
    fn comment(&mut self) {}
}

/// What one pass over a statement's text tells: its fingerprint, and
/// whether it has a comment (only then can it carry a `fulcrum:` hint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    pub key: u64,
    pub comments: bool,
}

struct Fnv(u64);

impl Sink for Fnv {
    fn push(&mut self, b: u8) {
        self.0 ^= b as u64;
        self.0 = self.0.wrapping_mul(0x100_0000_01b3);
    }
}

/// Bytes the keyed hash is fed at a time.
const BLOCK: usize = 64;

/// The keyed hash, fed a block at a time. The buffer has room for a block
/// and one more block of a name, so a name is copied with its room checked
/// once per block, not per byte. (Measured against feeding SipHash eight
/// bytes at a time from a register: a third fewer instructions.)
struct Keyed {
    hasher: SipHasher13,
    block: [u8; 2 * BLOCK],
    len: usize,
    comments: bool,
}

impl Keyed {
    #[inline]
    fn flush_full(&mut self) {
        if self.len >= BLOCK {
            std::hash::Hasher::write(&mut self.hasher, &self.block[..self.len]);
            self.len = 0;
        }
    }
}

impl Sink for Keyed {
    #[inline]
    fn push(&mut self, b: u8) {
        self.flush_full();
        self.block[self.len] = b;
        self.len += 1;
    }

    /// Eight bytes at a time while eight remain (`word_bytes`), the rest
    /// one at a time; each block of room is known to be there.
    #[inline]
    fn word(&mut self, b: &[u8], mut i: usize) -> usize {
        loop {
            self.flush_full();
            // Under a block is held: a whole block of room follows it.
            let room = &mut self.block[self.len..self.len + BLOCK];
            let mut n = 0;
            // Not `n + 8 <= BLOCK`: this form lets the compiler drop the
            // range's overflow check whatever `walk` around it looks like
            // (3 instructions per 8 bytes came back when walk was split).
            while n <= BLOCK - 8 {
                let Some(chunk) = b.get(i + n..i + n + 8) else {
                    break;
                };
                let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                let (lowered, k) = word_bytes(x);
                room[n..n + 8].copy_from_slice(&lowered.to_le_bytes());
                n += k;
                if k < 8 {
                    self.len += n;
                    return i + n;
                }
            }
            for (to, &c) in room[n..].iter_mut().zip(&b[i + n..]) {
                let lower = LOWER_WORD[c as usize];
                if lower == 0 {
                    break;
                }
                *to = lower;
                n += 1;
            }
            self.len += n;
            i += n;
            if n < BLOCK || i == b.len() {
                return i;
            }
        }
    }

    fn comment(&mut self) {
        self.comments = true;
    }
}

/// The process's keyed SipHash-1-3 for [`scan`], the state every scan
/// starts from. Its two keys are drawn once: std's `RandomState` (seeded
/// from the operating system's random source) hashing 0 and 1, outputs of
/// a PRF under a secret random key. The hash is `siphasher`'s rather than
/// std's for its one-shot [`SipHasher13::hash`] of a whole slice: a
/// statement's normalised text fits one block (64 bytes) for most
/// statements, and hashing it in one call costs about half the
/// instructions of std's streaming `write` and `finish` (same function,
/// same keys' strength).
fn keys() -> &'static SipHasher13 {
    static KEYS: std::sync::OnceLock<SipHasher13> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        use std::hash::BuildHasher;
        let random = std::collections::hash_map::RandomState::new();
        SipHasher13::new_with_keys(random.hash_one(0u64), random.hash_one(1u64))
    })
}

/// The normalised text, up to a length (longer text ends in `...`).
struct Text {
    out: Vec<u8>,
    max: usize,
}

impl Sink for Text {
    fn push(&mut self, b: u8) {
        if self.out.len() < self.max {
            self.out.push(b);
        } else if self.out.len() == self.max {
            self.out.extend_from_slice(b"...");
        }
    }
}

/// `b[start..]` opens a block comment: the index just past its matching
/// `*/` (comments nest, as in PostgreSQL), or `None` when it never closes.
pub fn block_comment_end(b: &[u8], start: usize) -> Option<usize> {
    let (mut depth, mut i) = (0usize, start);
    while i + 1 < b.len() {
        if b[i] == b'/' && b[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Some(i);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// The fingerprint of `sql` in `dialect`.
pub fn fingerprint(sql: &str, dialect: Dialect) -> u64 {
    scan(sql, dialect).key
}

/// The fingerprint of `sql` and whether it has comments, in one pass.
pub fn scan(sql: &str, dialect: Dialect) -> Scan {
    scan_bytes(sql.as_bytes(), dialect)
}

/// [`scan`] of text that may not be UTF-8 (the fingerprint reads bytes).
#[inline]
pub fn scan_bytes(sql: &[u8], dialect: Dialect) -> Scan {
    let mut h = Keyed {
        hasher: *keys(),
        block: [0; 2 * BLOCK],
        len: 0,
        comments: false,
    };
    walk(sql, dialect, &mut h);
    // What was streamed (statements past a block) and the rest, at once.
    Scan {
        key: h.hasher.hash(&h.block[..h.len]),
        comments: h.comments,
    }
}

/// An id of `sql`'s normalised text that is the same in every process
/// (FNV-1a): what a digest is shown by. Not for anything an attacker's
/// collision could abuse.
pub fn stable_id(sql: &str, dialect: Dialect) -> u64 {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    walk(sql.as_bytes(), dialect, &mut h);
    h.0
}

/// The text the fingerprint hashes (literals as `?`, comments gone, white
/// space collapsed, names in lower case), cut after `max` bytes.
pub fn normalize(sql: &str, dialect: Dialect, max: usize) -> String {
    let mut t = Text {
        out: Vec::with_capacity(sql.len().min(max) + 3),
        max,
    };
    walk(sql.as_bytes(), dialect, &mut t);
    // Only ASCII is lowered and a cut may split a character.
    String::from_utf8_lossy(&t.out).into_owned()
}

/// Feeds `sql`'s normalised bytes to `h`. Names, white space, operators,
/// numbers and `$1` are read here; the other arms are helpers, placed by
/// measured cost (callgrind): quoted names (an ORM quotes every name) and
/// comments (where hints are) are inlined, a string literal is a call (its
/// own tight loop: fewer instructions from literals of a few bytes on) and
/// a dollar quote is cold.
fn walk<S: Sink>(b: &[u8], dialect: Dialect, h: &mut S) {
    let mut i = 0;
    // White space is emitted lazily, so trailing space and comments vanish.
    let mut out = Emit {
        last: b' ',
        pending_space: false,
    };
    while i < b.len() {
        let c = b[i];
        // A name or keyword (most of a statement): a run of letters,
        // digits and `_` hashed in one tight loop. Not an `E'...'` prefix.
        // (Letters and `_` lower above b'9' in the table, digits to
        // themselves, anything else to 0.)
        let lower = LOWER_WORD[c as usize];
        if lower > b'9' && !(lower == b'e' && b.get(i + 1) == Some(&b'\'')) {
            out.space_before(h);
            i = h.word(b, i);
            // Only the class of the last byte is ever asked: a name byte.
            out.last = b'a';
            continue;
        }
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => {
                out.emit(h, b' ');
                i += 1;
            }
            // MySQL reads "..." as a string too (unless ANSI_QUOTES, which
            // Fulcrum does not assume): a literal, never kept in a digest.
            b'\'' | b'"' if c == b'\'' || dialect == Dialect::MySql => {
                i = string(b, i, dialect, &mut out, h);
            }
            b'"' | b'`' => i = quoted_name(b, i, &mut out, h),
            b'-' if b.get(i + 1) == Some(&b'-') => i = line_comment(b, i, h),
            b'#' if dialect == Dialect::MySql => i = line_comment(b, i, h),
            b'/' if b.get(i + 1) == Some(&b'*') => i = block_comment(b, i, dialect, &mut out, h),
            // A `$` before a digit is a parameter (`$1`): the last arm
            // keeps it as it is, without looking for a dollar quote's tag.
            b'$' if dialect == Dialect::Postgres
                && !b.get(i + 1).is_some_and(u8::is_ascii_digit) =>
            {
                i = dollar(b, i, &mut out, h);
            }
            b'0'..=b'9'
                if !(out.last.is_ascii_alphanumeric() || out.last == b'_' || out.last == b'$') =>
            {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
                out.emit(h, b'?');
            }
            // E'...' escape strings: the prefix belongs to the literal.
            b'E' | b'e'
                if b.get(i + 1) == Some(&b'\'')
                    && !(out.last.is_ascii_alphanumeric() || out.last == b'_') =>
            {
                i += 1;
            }
            _ => {
                out.emit(h, c.to_ascii_lowercase());
                i += 1;
            }
        }
    }
}

/// The string literal whose quote is at `b[i]`, emitted as `?` (and its
/// quote after it when it never closes); the index after it. Backslash
/// escapes in MySQL and in PostgreSQL's `E'...'`. Not inlined: measured,
/// the call costs 7 instructions on `'x'` and its loop out of line saves
/// 33 (MySQL) to 89 (PostgreSQL) on `'alice@example.com'`.
#[inline(never)]
fn string<S: Sink>(b: &[u8], i: usize, dialect: Dialect, out: &mut Emit, h: &mut S) -> usize {
    let q = b[i];
    let backslash = dialect == Dialect::MySql || (i > 0 && (b[i - 1] == b'E' || b[i - 1] == b'e'));
    let end = crate::lex::quoted_end(b, i + 1, q, backslash);
    out.emit(h, b'?');
    if end.is_none() {
        // Never the fingerprint of a well-formed statement.
        out.emit(h, q);
    }
    end.unwrap_or(b.len())
}

/// The quoted name whose quote is at `b[i]`, kept as written; the index
/// after its closing quote.
#[inline(always)]
fn quoted_name<S: Sink>(b: &[u8], mut i: usize, out: &mut Emit, h: &mut S) -> usize {
    let q = b[i];
    out.emit(h, q);
    i += 1;
    while i < b.len() && b[i] != q {
        out.emit(h, b[i]);
        i += 1;
    }
    if i < b.len() {
        out.emit(h, q);
    }
    i + 1
}

/// Skips the line comment at `b[i]`; the index of the newline ending it.
#[inline(always)]
fn line_comment<S: Sink>(b: &[u8], i: usize, h: &mut S) -> usize {
    h.comment();
    crate::lex::line_end(b, i)
}

/// Skips the block comment at `b[i]`, or keeps the text of MySQL's
/// `/*! ... */` (the server executes it); the index to go on from.
#[inline(always)]
fn block_comment<S: Sink>(
    b: &[u8],
    i: usize,
    dialect: Dialect,
    out: &mut Emit,
    h: &mut S,
) -> usize {
    h.comment();
    // MySQL executes /*! ... */: keep its text.
    if dialect == Dialect::MySql && b.get(i + 2) == Some(&b'!') {
        out.emit(h, b'!');
        return i + 3;
    }
    block_comment_end(b, i).unwrap_or(b.len())
}

/// The `$` at `b[i]` (PostgreSQL, not before a digit): a dollar-quoted
/// body emitted as `?` when a tag follows, else the `$` itself; the index
/// after it.
#[cold]
#[inline(never)]
fn dollar<S: Sink>(b: &[u8], i: usize, out: &mut Emit, h: &mut S) -> usize {
    let tag_end = b[i + 1..]
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .map(|p| i + 1 + p);
    match tag_end {
        Some(e) if b[e] == b'$' => {
            let tag = &b[i..=e];
            let body = &b[e + 1..];
            out.emit(h, b'?');
            match body.windows(tag.len()).position(|w| w == tag) {
                Some(p) => e + 1 + p + tag.len(),
                None => b.len(),
            }
        }
        _ => {
            out.emit(h, b'$');
            i + 1
        }
    }
}

/// What has been emitted: the last byte, and a space owed before the next.
struct Emit {
    last: u8,
    pending_space: bool,
}

impl Emit {
    /// Emits `c`; white space collapses into one space, emitted only
    /// before something else.
    #[inline(always)]
    fn emit<S: Sink>(&mut self, h: &mut S, c: u8) {
        if c == b' ' {
            if self.last != b' ' {
                self.pending_space = true;
                self.last = b' ';
            }
            return;
        }
        self.space_before(h);
        h.push(c);
        self.last = c;
    }

    #[inline(always)]
    fn space_before<S: Sink>(&mut self, h: &mut S) {
        if self.pending_space {
            h.push(b' ');
            self.pending_space = false;
        }
    }
}

/// For each byte: its lower case when it is an ASCII letter, digit or `_`
/// (part of a name or keyword), else 0.
/// Eight bytes (little-endian) of a name: them lowered, and how many of
/// them, from the first, are name bytes (ASCII letters, digits, `_`).
/// Bytes past those are garbage the caller overwrites or ignores.
#[inline]
fn word_bytes(x: u64) -> (u64, usize) {
    const H: u64 = 0x8080_8080_8080_8080;
    const L: u64 = 0x0101_0101_0101_0101;
    // Per byte, for 7-bit values: the high bit says `v >= c` / `v <= c`
    // (no borrow crosses a byte: each minuend is at least 0x80).
    let v = x & !H;
    let ge = |c: u64| (v | H).wrapping_sub(c * L) & H;
    let le = |c: u64| ((c | 0x80) * L).wrapping_sub(v) & H;
    let digit = ge(0x30) & le(0x39);
    let upper = ge(0x41) & le(0x5a);
    let lower = ge(0x61) & le(0x7a);
    let t = v ^ (0x5f * L);
    let underscore = !((t | H).wrapping_sub(L)) & H;
    let word = (digit | upper | lower | underscore) & !(x & H);
    let k = ((!word & H).trailing_zeros() / 8) as usize;
    (x | (upper >> 2), k.min(8))
}

pub(crate) static LOWER_WORD: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphanumeric() || b == b'_' {
            t[c] = b.to_ascii_lowercase();
        }
        c += 1;
    }
    t
};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod keyed_tests {
    use super::*;

    /// The cache key is keyed (nobody can compute it offline to aim a
    /// collision), the id digests are shown by is the same everywhere.
    #[test]
    fn the_cache_key_is_keyed_and_the_shown_id_is_stable() {
        let sql = "SELECT abalance FROM pgbench_accounts WHERE aid = 7";
        // FNV-1a of "select abalance from pgbench_accounts where aid = ?".
        let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
        for b in b"select abalance from pgbench_accounts where aid = ?" {
            fnv = (fnv ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(stable_id(sql, Dialect::Postgres), fnv);
        assert_ne!(
            scan(sql, Dialect::Postgres).key,
            fnv,
            "not the unkeyed hash"
        );
        let other_key = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write(b"select abalance from pgbench_accounts where aid = ?");
            h.finish()
        };
        assert_ne!(
            scan(sql, Dialect::Postgres).key,
            other_key,
            "another key gives another hash"
        );
        assert_eq!(
            scan(sql, Dialect::Postgres).key,
            scan(
                "select  abalance FROM pgbench_accounts\n where aid =  8",
                Dialect::Postgres
            )
            .key,
            "literals and spacing do not matter"
        );
        // Names longer than the hash's block, and across its boundary.
        let long = "A_1".repeat(50);
        let key = |s: &str| scan(s, Dialect::Postgres).key;
        let upper = format!("SELECT {long} FROM T{long}");
        assert_eq!(key(&upper), key(&upper.to_lowercase()));
        assert_ne!(key(&upper), key(&upper.replacen("A_1", "A_2", 1)));
        assert_ne!(key("SELECT ab FROM t"), key("SELECT a FROM bt"));
        assert_eq!(
            stable_id(&upper, Dialect::Postgres),
            stable_id(&upper.to_lowercase(), Dialect::Postgres)
        );
    }
}
