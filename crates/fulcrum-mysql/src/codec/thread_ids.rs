//! Connection ids in a process-list answer (`SHOW PROCESSLIST`,
//! `information_schema.PROCESSLIST`): which column holds them, and a text
//! row with its id replaced (a server thread's id made the id Fulcrum gave
//! the client it serves). Pure functions over payloads.

use super::wire::{read_lenenc_str, write_lenenc_str, Reader};

/// Whether the column definition `def` is a process list's `Id` column.
pub fn is_id_column(def: &[u8]) -> bool {
    let mut r = Reader::new(def);
    let mut part = || r.lenenc_bytes("column definition").ok();
    let (_catalog, _schema, _table) = (part(), part(), part());
    let (org_table, name, org_name) = (part(), part(), part());
    let id = |s: Option<&[u8]>| s.is_some_and(|s| s.eq_ignore_ascii_case(b"id"));
    let listed = org_table.is_some_and(|t| t.is_empty() || t.eq_ignore_ascii_case(b"processlist"));
    listed && (id(name) || id(org_name))
}

/// The text row `row` with the number in column `column` replaced by
/// `to(number)`; `None` when nothing changes (no such column, NULL, not a
/// number, or `to` gives nothing).
pub fn replace_id(row: &[u8], column: usize, to: impl Fn(u64) -> Option<u32>) -> Option<Vec<u8>> {
    let mut at = 0;
    for _ in 0..column {
        let (_, used) = read_lenenc_str(row.get(at..)?).ok()?;
        at += used;
    }
    let (value, used) = read_lenenc_str(row.get(at..)?).ok()?;
    let id: u64 = std::str::from_utf8(value?).ok()?.parse().ok()?;
    let new = to(id)?;
    let mut out = Vec::with_capacity(row.len() + 4);
    out.extend_from_slice(&row[..at]);
    write_lenenc_str(&mut out, new.to_string().as_bytes());
    out.extend_from_slice(&row[at + used..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(org_table: &str, name: &str) -> Vec<u8> {
        let mut d = Vec::new();
        for part in ["def", "information_schema", "p", org_table, name, name] {
            write_lenenc_str(&mut d, part.as_bytes());
        }
        d.extend_from_slice(&[0x0c, 63, 0, 21, 0, 0, 0, 8, 0, 0, 0, 0, 0]);
        d
    }

    #[test]
    fn the_id_column_is_the_process_lists() {
        assert!(is_id_column(&def("", "Id")));
        assert!(is_id_column(&def("PROCESSLIST", "ID")));
        assert!(!is_id_column(&def("accounts", "id")));
        assert!(!is_id_column(&def("PROCESSLIST", "USER")));
        assert!(!is_id_column(&[0xfc]));
    }

    #[test]
    fn a_rows_id_is_replaced_in_place() {
        let mut row = Vec::new();
        for v in ["12", "app", "localhost:1"] {
            write_lenenc_str(&mut row, v.as_bytes());
        }
        let to = |id| (id == 12).then_some(1_073_741_825);
        let out = replace_id(&row, 0, to).expect("replaced");
        let mut r = Reader::new(&out);
        let mut next = || r.lenenc_bytes("v").unwrap().to_vec();
        assert_eq!(next(), b"1073741825");
        assert_eq!(next(), b"app");
        assert_eq!(next(), b"localhost:1");
        assert_eq!(replace_id(&row, 0, |_| None), None);
        assert_eq!(replace_id(&row, 1, to), None, "not a number");
        assert_eq!(replace_id(&row, 5, to), None, "no such column");
        assert_eq!(replace_id(&[0xfb], 0, to), None, "NULL");
    }
}
