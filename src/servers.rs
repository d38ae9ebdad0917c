//! What the tests read from the servers themselves, behind Fulcrum's back:
//! status counters that show where statements ran.

use fulcrum_testkit::MariaNode;

/// The MariaDB server's `Com_select` (SELECTs it ran, all sessions), as
/// the superuser reads it.
pub fn com_select(node: &MariaNode) -> u64 {
    node.sql("SHOW GLOBAL STATUS LIKE 'Com_select'")
        .unwrap()
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap()
}
