//! SHOW UPGRADE: the binary upgrades this process took part in, one row
//! each: taken over from the process before it, or started by it (handed
//! over, or failed with why). The daemon's upgrade code writes the rows.

use bytes::BytesMut;

use crate::rows::result;
use crate::Admin;

impl Admin {
    pub(super) fn show_upgrade(&self, out: &mut BytesMut) {
        let events = self
            .upgrades
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let rows: Vec<Vec<String>> = events
            .into_iter()
            .map(|e| {
                vec![
                    e.event.to_string(),
                    e.at_unix_ms.to_string(),
                    e.outcome.to_string(),
                    e.pid.map_or_else(String::new, |p| p.to_string()),
                    e.took_ms.to_string(),
                    e.detail,
                ]
            })
            .collect();
        result(
            out,
            &["event", "at_unix_ms", "outcome", "pid", "took_ms", "detail"],
            &rows,
        );
    }
}
