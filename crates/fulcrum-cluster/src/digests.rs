//! A cluster's digest table as its contexts hold it: made on first use from
//! the config, or handed over from the context a reload replaced (so a
//! reload keeps the statistics when `digest_max_entries` is unchanged).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use fulcrum_metrics::DigestTable;
use fulcrum_sql::Dialect;

/// Longest normalised text kept per digest.
pub const DIGEST_TEXT_MAX: usize = 2048;

#[derive(Debug, Default)]
pub struct DigestSlot {
    table: OnceLock<Arc<DigestTable>>,
}

impl DigestSlot {
    /// The table, made with `max_entries` on first use.
    pub fn table(&self, max_entries: u32) -> &Arc<DigestTable> {
        self.table
            .get_or_init(|| Arc::new(DigestTable::new(max_entries as usize)))
    }

    /// Takes `earlier`'s table when it has the same size (call before the
    /// context serves anyone).
    pub fn take_over(&self, earlier: &DigestSlot, max_entries: u32) {
        if let Some(t) = earlier.table.get() {
            if t.max_entries() == max_entries as usize {
                let _ = self.table.set(t.clone());
            }
        }
    }

    /// The entry of a statement whose fingerprint `key` is known already,
    /// seen at `at`: without the table's lock when `memo` (the session's)
    /// holds it.
    pub fn entry_remembered(
        &self,
        max_entries: u32,
        memo: &mut fulcrum_metrics::DigestMemo,
        key: u64,
        sql: &[u8],
        dialect: Dialect,
        at: Instant,
    ) -> Option<Arc<fulcrum_metrics::Digest>> {
        if max_entries == 0 {
            return None;
        }
        self.table(max_entries)
            .remembered(memo, key, at, || digest_text(sql, dialect))
    }

    /// The entry of `sql` (for a prepared statement, looked up once).
    pub fn entry(
        &self,
        max_entries: u32,
        sql: &str,
        dialect: Dialect,
    ) -> Option<Arc<fulcrum_metrics::Digest>> {
        if max_entries == 0 {
            return None;
        }
        let key = fulcrum_sql::fingerprint(sql, dialect);
        self.entry_keyed(max_entries, key, sql.as_bytes(), dialect)
    }

    /// The entry of `sql` whose fingerprint `key` is known already (the
    /// classifier's): the text is read only to name a new digest.
    pub fn entry_keyed(
        &self,
        max_entries: u32,
        key: u64,
        sql: &[u8],
        dialect: Dialect,
    ) -> Option<Arc<fulcrum_metrics::Digest>> {
        if max_entries == 0 {
            return None;
        }
        self.table(max_entries)
            .get(key, || digest_text(sql, dialect))
    }
}

/// What a new digest is shown by: the stable id of `sql`'s normalised
/// text, and that text cut at [`DIGEST_TEXT_MAX`].
fn digest_text(sql: &[u8], dialect: Dialect) -> (u64, String) {
    let sql = String::from_utf8_lossy(sql);
    let id = fulcrum_sql::stable_id(&sql, dialect);
    (id, fulcrum_sql::normalize(&sql, dialect, DIGEST_TEXT_MAX))
}
