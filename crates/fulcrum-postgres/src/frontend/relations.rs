//! PostgreSQL's side of the relation catalog
//! (`fulcrum_cluster::relation_catalog`, the result cache's word on what
//! a statement's text cannot show): the one `pg_class` query that reads a
//! database's relations on the primary, and the connection catalog
//! lookups (functions and relations) read with.

use fulcrum_cluster::function_catalog::Wanted;
use fulcrum_cluster::relation_catalog::{Relation, Relations};

use super::ClusterContext;
use crate::backend::{Credential, ServerConn};

/// Every relation of the database but indexes, composite types and TOAST:
/// its name, whether reads of it may be kept (an ordinary permanent table,
/// no partition and in no inheritance tree, outside the system schemas),
/// and whether a write to it may change more than itself (anything but
/// such a table, a user trigger, a rule, a foreign key referencing it with
/// a cascading, SET NULL or SET DEFAULT action, or a system relation).
pub const RELATIONS_QUERY: &str = "\
SELECT c.relname::text, \
 (c.relkind = 'r' AND c.relpersistence <> 't' AND NOT c.relispartition AND NOT sys \
  AND NOT inherits)::text, \
 (c.relkind <> 'r' OR c.relispartition OR sys OR inherits \
  OR EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal) \
  OR EXISTS (SELECT 1 FROM pg_rewrite w WHERE w.ev_class = c.oid AND w.rulename <> '_RETURN') \
  OR EXISTS (SELECT 1 FROM pg_constraint f WHERE f.contype = 'f' AND f.confrelid = c.oid \
   AND (f.confdeltype IN ('c', 'n', 'd') OR f.confupdtype IN ('c', 'n', 'd'))))::text \
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, \
 LATERAL (SELECT n.nspname IN ('pg_catalog', 'information_schema') AS sys, \
  EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid OR i.inhparent = c.oid) AS inherits) x \
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND n.nspname NOT LIKE 'pg\\_toast%'";

/// Whether a transaction naming no isolation level runs READ COMMITTED on
/// this database for every user (the result cache's `in_transactions`):
/// the default the lookup's login sees, and no `ALTER DATABASE` or
/// `ALTER ROLE ... SET default_transaction_isolation` for this database or
/// all of them that says another level (so the login the lookup ran as
/// does not matter).
pub const ISOLATION_QUERY: &str = "\
SELECT (current_setting('default_transaction_isolation') IN ('read committed', 'read uncommitted') \
 AND NOT EXISTS (SELECT 1 FROM pg_db_role_setting s, unnest(s.setconfig) c \
  WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) \
   AND lower(c) LIKE 'default\\_transaction\\_isolation=%' \
   AND lower(replace(c, '''', '')) NOT IN ('default_transaction_isolation=read committed', \
    'default_transaction_isolation=read uncommitted')))::text";

/// The relations in the rows of [`RELATIONS_QUERY`].
pub fn relations_of_rows(rows: &[Vec<Option<String>>]) -> Relations {
    let mut relations = Relations::new();
    for row in rows {
        if let (Some(Some(name)), Some(Some(keepable)), Some(Some(wide))) =
            (row.first(), row.get(1), row.get(2))
        {
            relations.add(
                name,
                Relation {
                    keepable: keepable == "true",
                    wide: wide != "false",
                },
            );
        }
    }
    relations
}

impl ClusterContext {
    /// A connection to the primary for a catalog lookup: with the login of
    /// the client that asked, or, at start and after a failover (no client
    /// asked), as the health user.
    pub(super) async fn catalog_conn(&self, w: &Wanted) -> Option<ServerConn> {
        let primary = self.router.primary()?;
        if w.user.is_empty() {
            let target = crate::backend::ServerTarget {
                address: self.backends[primary].clone(),
                user: self.config.health.user.clone(),
                credential: Credential::Password(self.config.health.password.clone()),
                database: w.database.to_string(),
                allow_cleartext: self.config.server_cleartext,
                tls: self
                    .config
                    .backends
                    .get(primary)
                    .and_then(|b| crate::backend::ServerTlsTarget::from_config(&b.tls)),
            };
            crate::backend::connect(&target, self.config.connect_timeout)
                .await
                .ok()
        } else {
            self.open(primary, &w.user, &w.database).await.ok()
        }
    }

    /// [`RELATIONS_QUERY`] on the primary (`pg_class` shows every login
    /// the same relations).
    pub(super) async fn relations_of(&self, w: &Wanted) -> Option<Relations> {
        let mut conn = self.catalog_conn(w).await?;
        let rows = conn.query_rows(RELATIONS_QUERY).await.ok()?;
        let mut relations = relations_of_rows(&rows);
        let isolation = conn.query_rows(ISOLATION_QUERY).await.ok()?;
        relations.read_committed = isolation
            .first()
            .and_then(|row| row.first())
            .is_some_and(|v| v.as_deref() == Some("true"));
        Some(relations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, keepable: &str, wide: &str) -> Vec<Option<String>> {
        vec![Some(name.into()), Some(keepable.into()), Some(wide.into())]
    }

    #[test]
    fn rows_become_relations() {
        let r = relations_of_rows(&[
            row("Accounts", "true", "false"),
            row("orders", "true", "true"),
            row("v", "false", "true"),
            vec![Some("broken".into()), None, None],
        ]);
        let n = |s: &str| -> std::sync::Arc<str> { s.into() };
        assert!(r.keepable(&[n("accounts")]));
        assert!(!r.wide_writes(&[n("accounts")]));
        assert!(r.wide_writes(&[n("orders")]));
        assert!(!r.keepable(&[n("v")]));
        assert!(r.get("broken").is_none());
    }
}
