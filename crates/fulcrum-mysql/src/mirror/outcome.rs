//! What a MySQL answer amounts to, for mirroring's diff: its error code,
//! its rows (of result sets, or the rows an OK says it changed), and an
//! order-insensitive checksum of the rows. Pure over packet payloads.

use std::hash::{Hash, Hasher};

/// Bytes of a row that join the checksum (with its length).
const ROW_HASHED: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    pub error: Option<u16>,
    pub rows: u64,
    pub checksum: u64,
}

impl Outcome {
    /// A row packet's payload.
    pub fn row(&mut self, payload: &[u8]) {
        let mut h = std::hash::DefaultHasher::new();
        payload[..payload.len().min(ROW_HASHED)].hash(&mut h);
        payload.len().hash(&mut h);
        self.checksum = self.checksum.wrapping_add(h.finish());
    }

    /// The answer's end, as its tracker summed it up.
    pub fn end(&mut self, reply: &crate::frontend::reply::Reply) {
        self.rows = reply.rows;
        self.error = reply.error_code.or(reply.error.then_some(0));
    }

    pub fn describe(&self) -> String {
        match self.error {
            Some(code) => format!("error {code}"),
            None => format!("{} rows (checksum {:016x})", self.rows, self.checksum),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_in_another_order_have_the_same_checksum() {
        let (mut a, mut b, mut c) = (Outcome::default(), Outcome::default(), Outcome::default());
        for r in [&b"\x011"[..], b"\x012", b"\x013"] {
            a.row(r);
        }
        for r in [&b"\x013"[..], b"\x011", b"\x012"] {
            b.row(r);
        }
        for r in [&b"\x011"[..], b"\x012", b"\x014"] {
            c.row(r);
        }
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
