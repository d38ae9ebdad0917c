//! What a MariaDB/MySQL primary says of a database's tables, for the result
//! cache's relation catalog (`fulcrum_cluster::relation_catalog`): one
//! `information_schema` query as the health user. Only a `BASE TABLE` may
//! be kept (not a view, a sequence, a system-versioned or temporary table);
//! a table with triggers, or referenced by a foreign key that cascades or
//! sets on delete or update, makes a write to it wide (the whole database
//! is invalidated).

use fulcrum_cluster::function_catalog::{quote_literal, Wanted};
use fulcrum_cluster::relation_catalog::{Relation, Relations};
use mysql_async::prelude::Queryable;

use super::MyClusterContext;

impl MyClusterContext {
    /// `wanted`'s database's tables, read on the primary (`None`: the
    /// lookup failed, and nothing of the database is kept).
    pub(super) async fn relations_of(&self, w: &Wanted) -> Option<Relations> {
        let primary = self.router.primary()?;
        let b = self.config.backends.get(primary)?;
        let health = &self.config.health;
        let connect =
            crate::backend::health::connect(&b.address, &b.tls, &health.user, &health.password, "");
        let mut conn = tokio::time::timeout(self.config.connect_timeout, connect)
            .await
            .ok()?
            .map_err(
                |e| tracing::debug!(error = %e, "relation catalog: the health user cannot log in"),
            )
            .ok()?;
        let db = quote_literal(&w.database);
        let sql = format!(
            "SELECT LOWER(t.TABLE_NAME), t.TABLE_TYPE = 'BASE TABLE', \
             EXISTS (SELECT 1 FROM information_schema.TRIGGERS g \
               WHERE g.EVENT_OBJECT_SCHEMA = t.TABLE_SCHEMA AND g.EVENT_OBJECT_TABLE = t.TABLE_NAME) \
             OR EXISTS (SELECT 1 FROM information_schema.REFERENTIAL_CONSTRAINTS r \
               WHERE r.UNIQUE_CONSTRAINT_SCHEMA = t.TABLE_SCHEMA AND r.REFERENCED_TABLE_NAME = t.TABLE_NAME \
               AND (r.DELETE_RULE NOT IN ('RESTRICT', 'NO ACTION') \
                 OR r.UPDATE_RULE NOT IN ('RESTRICT', 'NO ACTION'))) \
             FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = {db}"
        );
        let rows: Option<Vec<(String, i64, i64)>> = conn.query(sql).await.ok();
        let _ = conn.disconnect().await;
        Some(relations_from(rows?))
    }
}

/// Rows of (name, base table, wide) as the catalog keeps them.
fn relations_from(rows: Vec<(String, i64, i64)>) -> Relations {
    let mut relations = Relations::new();
    for (name, base, wide) in rows {
        let keepable = base != 0;
        relations.add(
            &name,
            Relation {
                keepable,
                // A view written through, or anything not a plain table.
                wide: wide != 0 || !keepable,
            },
        );
    }
    relations
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::relations_from;

    #[test]
    fn only_base_tables_are_kept_and_triggers_make_writes_wide() {
        let r = relations_from(vec![
            ("t".into(), 1, 0),
            ("v".into(), 0, 0),
            ("audited".into(), 1, 1),
        ]);
        let n = |s: &str| vec![Arc::<str>::from(s)];
        assert!(r.keepable(&n("t")) && !r.wide_writes(&n("t")));
        assert!(!r.keepable(&n("v")) && r.wide_writes(&n("v")));
        assert!(r.keepable(&n("audited")) && r.wide_writes(&n("audited")));
        assert!(!r.keepable(&n("unknown")) && r.wide_writes(&n("unknown")));
    }
}
