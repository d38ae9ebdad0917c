//! Result sets as the console sends them: RowDescription (every column
//! text, OID 25), DataRows, CommandComplete. Pure functions over bytes.

use bytes::{BufMut, BytesMut};
use fulcrum_postgres::codec::backend_msg;

const TEXT_OID: u32 = 25;

/// Appends a whole result: description, rows, `SHOW` completion tag.
pub fn result(out: &mut BytesMut, columns: &[&str], rows: &[Vec<String>]) {
    row_description(out, columns);
    for r in rows {
        data_row(out, r);
    }
    backend_msg::command_complete(out, "SHOW");
}

pub fn row_description(out: &mut BytesMut, columns: &[&str]) {
    out.put_u8(b'T');
    let at = out.len();
    out.put_i32(0);
    out.put_u16(columns.len() as u16);
    for c in columns {
        out.put_slice(c.as_bytes());
        out.put_u8(0);
        out.put_u32(0); // table oid
        out.put_i16(0); // column number
        out.put_u32(TEXT_OID);
        out.put_i16(-1); // size
        out.put_i32(-1); // modifier
        out.put_i16(0); // text format
    }
    let len = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

pub fn data_row(out: &mut BytesMut, values: &[String]) {
    out.put_u8(b'D');
    let at = out.len();
    out.put_i32(0);
    out.put_u16(values.len() as u16);
    for v in values {
        out.put_i32(v.len() as i32);
        out.put_slice(v.as_bytes());
    }
    let len = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_postgres::codec::backend_msg::parse_data_row;
    use fulcrum_postgres::codec::frame::check_frame;

    #[test]
    fn rows_have_exact_lengths_and_parse_back() {
        let mut out = BytesMut::new();
        result(&mut out, &["a", "bb"], &[vec!["1".into(), "two".into()]]);
        let t = check_frame(&out, 1 << 20).unwrap().unwrap();
        assert_eq!(t.tag, b'T');
        let rest = &out[t.total..];
        let d = check_frame(rest, 1 << 20).unwrap().unwrap();
        assert_eq!(d.tag, b'D');
        let cols = parse_data_row(&rest[5..d.total]).unwrap();
        assert_eq!(cols, vec![Some(&b"1"[..]), Some(&b"two"[..])]);
        let c = check_frame(&rest[d.total..], 1 << 20).unwrap().unwrap();
        assert_eq!(c.tag, b'C');
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) for milliseconds since the Unix epoch, as
/// PgBouncer shows times.
pub fn utc_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod time_tests {
    use super::utc_time;

    #[test]
    fn utc_times_format_like_pgbouncer() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00");
        assert_eq!(utc_time(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc_time(1_795_435_200_123), "2026-11-23 12:00:00");
    }
}
