//! MariaDB GTID positions (`domain-server-seq` lists such as
//! `0-1-1200,1-2-37`) reduced to what the health loop compares: one number
//! that grows with every transaction, the sum of the sequence numbers over the
//! domains. Pure.

/// Parses a GTID list into (domain, server, seq) triples; `None` if malformed.
pub fn parse_gtid_list(s: &str) -> Option<Vec<(u32, u32, u64)>> {
    let s = s.trim();
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',')
        .map(|g| {
            let mut parts = g.trim().splitn(3, '-');
            let domain = parts.next()?.parse().ok()?;
            let server = parts.next()?.parse().ok()?;
            let seq = parts.next()?.parse().ok()?;
            Some((domain, server, seq))
        })
        .collect()
}

/// The position of a GTID list: the sum of its sequence numbers (each
/// domain only grows, so the sum orders positions of one cluster).
pub fn gtid_position(s: &str) -> Option<u64> {
    parse_gtid_list(s).map(|l| l.iter().map(|&(_, _, seq)| seq).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtid_lists_parse_and_sum() {
        assert_eq!(parse_gtid_list("0-1-1200"), Some(vec![(0, 1, 1200)]));
        assert_eq!(gtid_position("0-1-1200,1-2-37"), Some(1237));
        assert_eq!(gtid_position(""), Some(0));
        assert_eq!(gtid_position(" 0-1-5 , 2-3-4 "), Some(9));
    }

    #[test]
    fn malformed_lists_are_none() {
        assert_eq!(gtid_position("0-1"), None);
        assert_eq!(gtid_position("a-b-c"), None);
        assert_eq!(gtid_position("0-1-2,"), None);
    }
}
