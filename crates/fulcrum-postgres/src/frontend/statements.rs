//! Protocol-level prepared statements under transaction pooling. A client's
//! named statement is prepared on the server under a name derived from its
//! definition (query text and parameter types), shared by every client that
//! prepares the same definition, so a server connection prepares it once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use fulcrum_sql::Decision;

use crate::codec::frontend_msg::put_parse;

/// One client statement: the server-side name and the Parse that creates it.
#[derive(Debug)]
pub struct ClientStatement {
    pub server_name: Arc<str>,
    pub parse: Bytes,
    pub query: Bytes,
    /// How its query routes (classified once, at Parse).
    pub decision: Decision,
    /// The registry's schema generation when the name was given.
    pub generation: u64,
}

impl ClientStatement {
    /// The Parse body after the statement name: query text and parameter types.
    pub fn definition(&self) -> &[u8] {
        &self.parse[5 + self.server_name.len() + 1..]
    }
}

/// Definitions seen by this cluster, each with its server-side name.
/// Grows with the number of distinct statement definitions (not with clients).
///
/// A prepared statement can go stale on a server: a type or table it was
/// prepared with is dropped and created again, and PostgreSQL then answers
/// "cache lookup failed" or "cached plan must not change result type" for
/// as long as it lives. Because statements are shared across clients, a
/// client could meet one prepared by another before the change. So DDL
/// seen through Fulcrum starts a new schema generation (every statement
/// gets a new server-side name at its next use), and a stale-statement
/// error renews that one statement (`renew`).
#[derive(Debug, Default)]
pub struct StatementRegistry {
    names: Mutex<HashMap<Bytes, (Arc<str>, u64)>>,
    next: AtomicU64,
    generation: AtomicU64,
}

impl StatementRegistry {
    /// The client statement for a Parse `definition` (bytes after its name).
    pub fn statement(
        &self,
        definition: &[u8],
        query: &[u8],
        decision: Decision,
    ) -> Arc<ClientStatement> {
        let generation = self.generation();
        let server_name = {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            match names.get(definition) {
                Some((n, g)) if *g == generation => n.clone(),
                _ => {
                    let id = self.next.fetch_add(1, Ordering::Relaxed);
                    let n: Arc<str> = format!("fulcrum_{id}").into();
                    names.insert(Bytes::copy_from_slice(definition), (n.clone(), generation));
                    n
                }
            }
        };
        let mut parse = BytesMut::with_capacity(definition.len() + server_name.len() + 6);
        put_parse(&mut parse, server_name.as_bytes(), definition);
        Arc::new(ClientStatement {
            server_name,
            parse: parse.freeze(),
            query: Bytes::copy_from_slice(query),
            decision,
            generation,
        })
    }

    /// The current schema generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// DDL ran: every statement gets a new server-side name at its next use.
    pub fn schema_changed(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// `stmt` as it should be used now: itself, or under a new name when
    /// the schema generation moved on since it was named.
    pub fn current(&self, stmt: &Arc<ClientStatement>) -> Arc<ClientStatement> {
        if stmt.generation == self.generation() {
            stmt.clone()
        } else {
            self.statement(stmt.definition(), &stmt.query, stmt.decision)
        }
    }

    /// Retires `stmt`'s server-side name (it went stale on a server): the
    /// next Parse of the same definition gets a new name, so every server
    /// connection prepares it afresh. Returns `stmt` under its new name.
    pub fn renew(&self, stmt: &ClientStatement) -> Arc<ClientStatement> {
        let definition = stmt.definition();
        {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            if names
                .get(definition)
                .is_some_and(|(n, _)| *n == stmt.server_name)
            {
                names.remove(definition);
            }
        }
        self.statement(definition, &stmt.query, stmt.decision)
    }

    pub fn len(&self) -> usize {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_definition_shares_a_name() {
        let r = StatementRegistry::default();
        let a = r.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read);
        let b = r.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read);
        let c = r.statement(b"SELECT 2\0\0\0", b"SELECT 2", Decision::Read);
        assert_eq!(a.server_name, b.server_name);
        assert_ne!(a.server_name, c.server_name);
        assert_eq!(r.len(), 2);
        assert_eq!(&a.parse[5..], b"fulcrum_0\0SELECT 1\0\0\0");
    }

    #[test]
    fn a_renewed_statement_gets_a_new_name_for_everyone() {
        let r = StatementRegistry::default();
        let a = r.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read);
        assert_eq!(a.definition(), b"SELECT 1\0\0\0");
        let renewed = r.renew(&a);
        assert_ne!(renewed.server_name, a.server_name);
        assert_eq!(renewed.definition(), a.definition());
        let later = r.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read);
        assert_eq!(later.server_name, renewed.server_name, "others follow");
        assert_eq!(r.len(), 1);
        // Renewing an old copy again does not retire the new name.
        let again = r.renew(&a);
        assert_eq!(again.server_name, renewed.server_name);
    }

    #[test]
    fn a_schema_change_renames_every_statement_at_its_next_use() {
        let r = StatementRegistry::default();
        let a = r.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read);
        assert!(
            Arc::ptr_eq(&r.current(&a), &a),
            "unchanged schema: same statement"
        );
        r.schema_changed();
        let now = r.current(&a);
        assert_ne!(now.server_name, a.server_name);
        assert_eq!(now.definition(), a.definition());
        let other = r.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read);
        assert_eq!(other.server_name, now.server_name);
        assert!(Arc::ptr_eq(&r.current(&now), &now));
    }

    #[test]
    fn parameter_types_are_part_of_the_definition() {
        let r = StatementRegistry::default();
        let a = r.statement(b"SELECT $1\0\0\x01\0\0\0\x17", b"SELECT $1", Decision::Read);
        let b = r.statement(b"SELECT $1\0\0\x01\0\0\0\x19", b"SELECT $1", Decision::Read);
        assert_ne!(a.server_name, b.server_name);
    }
}
