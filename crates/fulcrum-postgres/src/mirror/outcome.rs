//! What an answer amounts to, for mirroring's diff: the first error's
//! SQLSTATE, the rows returned, the rows a write affected, and an
//! order-insensitive checksum of the rows. Pure over backend messages.

use std::hash::{Hash, Hasher};

use crate::codec::backend_msg::{command_tag, parse_error_fields};

/// Bytes of a row that join the checksum (with its length).
const ROW_HASHED: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    pub error: Option<[u8; 5]>,
    pub rows: u64,
    pub affected: u64,
    pub checksum: u64,
}

impl Outcome {
    /// Takes one backend message (`tag`, `body` after the header).
    pub fn observe(&mut self, tag: u8, body: &[u8]) {
        match tag {
            b'D' => self.row(body, body.len()),
            b'C' => self.affected += affected(command_tag(body)),
            b'E' if self.error.is_none() => {
                let code = parse_error_fields(body).code;
                let mut c = [b'?'; 5];
                for (d, s) in c.iter_mut().zip(code.bytes()) {
                    *d = s;
                }
                self.error = Some(c);
            }
            _ => {}
        }
    }

    /// A DataRow of `len` body bytes, of which `start` is the beginning (a
    /// large row streams through): its length and first `ROW_HASHED` bytes
    /// join the checksum, by addition, so row order does not matter.
    pub fn row(&mut self, start: &[u8], len: usize) {
        self.rows += 1;
        let mut h = std::hash::DefaultHasher::new();
        start[..start.len().min(ROW_HASHED)].hash(&mut h);
        len.hash(&mut h);
        self.checksum = self.checksum.wrapping_add(h.finish());
    }

    /// How it reads in a log line.
    pub fn describe(&self) -> String {
        match self.error {
            Some(code) => format!("error {}", String::from_utf8_lossy(&code)),
            None => format!(
                "{} rows (checksum {:016x}), {} affected",
                self.rows, self.checksum, self.affected
            ),
        }
    }
}

/// The rows a write's CommandComplete tag counts (`INSERT 0 3`, `UPDATE 2`,
/// `DELETE 1`, `MERGE 4`); 0 for other commands.
fn affected(tag: &[u8]) -> u64 {
    let text = std::str::from_utf8(tag).unwrap_or("");
    let mut words = text.split(' ');
    match words.next() {
        Some("INSERT" | "UPDATE" | "DELETE" | "MERGE") => text
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_row(values: &[&str]) -> Vec<u8> {
        let mut b = (values.len() as u16).to_be_bytes().to_vec();
        for v in values {
            b.extend_from_slice(&(v.len() as i32).to_be_bytes());
            b.extend_from_slice(v.as_bytes());
        }
        b
    }

    #[test]
    fn rows_in_another_order_have_the_same_checksum() {
        let (mut a, mut b) = (Outcome::default(), Outcome::default());
        for v in ["1", "2", "3"] {
            a.observe(b'D', &data_row(&[v]));
        }
        for v in ["3", "1", "2"] {
            b.observe(b'D', &data_row(&[v]));
        }
        a.observe(b'C', b"SELECT 3\0");
        b.observe(b'C', b"SELECT 3\0");
        assert_eq!(a, b);
        let mut c = Outcome::default();
        for v in ["1", "2", "4"] {
            c.observe(b'D', &data_row(&[v]));
        }
        assert_ne!(a, c, "another value");
    }

    #[test]
    fn writes_count_affected_rows_and_errors_their_code() {
        let mut o = Outcome::default();
        o.observe(b'C', b"INSERT 0 3\0");
        o.observe(b'C', b"UPDATE 2\0");
        o.observe(b'C', b"BEGIN\0");
        assert_eq!(o.affected, 5);
        o.observe(b'E', b"SERROR\0C23505\0Mduplicate key\0\0");
        o.observe(b'E', b"SERROR\0C25P02\0Maborted\0\0");
        assert_eq!(o.error, Some(*b"23505"), "the first error");
        assert_eq!(o.describe(), "error 23505");
    }
}
