//! Protocol-level prepared statements under transaction pooling. A client's
//! named statement is prepared on the server under a name derived from its
//! definition (query text and parameter types), shared by every client that
//! prepares the same definition, so a server connection prepares it once.
//! The registry holds its statements weakly: one no client holds any more
//! is dropped, so it grows with what connected clients hold, not with
//! everything ever prepared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

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
    /// Its query may commit (COMMIT, END, ...): an Execute of it in flight
    /// when the server dies may have committed, so it is never replayed.
    pub may_commit: bool,
    /// The registry's schema generation when the name was given.
    pub generation: u64,
}

impl ClientStatement {
    /// The Parse body after the statement name: query text and parameter types.
    pub fn definition(&self) -> &[u8] {
        &self.parse[5 + self.server_name.len() + 1..]
    }
}

/// Definitions held by this cluster's clients, each with its server-side
/// name (one shared `ClientStatement` per definition and generation).
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
    names: Mutex<Names>,
    next: AtomicU64,
    generation: AtomicU64,
}

/// The registry's map, and the size at which it is next swept of
/// statements no client holds (amortised: twice the live size).
#[derive(Debug, Default)]
struct Names {
    map: HashMap<Bytes, Weak<ClientStatement>>,
    sweep_at: usize,
}

impl Names {
    fn sweep(&mut self) {
        self.map.retain(|_, s| s.strong_count() > 0);
        self.sweep_at = (2 * self.map.len()).max(1024);
    }
}

impl StatementRegistry {
    /// The client statement for a Parse `definition` (bytes after its name):
    /// the one other clients hold for it, or a new one.
    pub fn statement(
        &self,
        definition: &[u8],
        query: &[u8],
        decision: Decision,
    ) -> Arc<ClientStatement> {
        let generation = self.generation();
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = names.map.get(definition).and_then(Weak::upgrade) {
            if held.generation == generation {
                return held;
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let server_name: Arc<str> = format!("fulcrum_{id}").into();
        let mut parse = BytesMut::with_capacity(definition.len() + server_name.len() + 6);
        put_parse(&mut parse, server_name.as_bytes(), definition);
        let stmt = Arc::new(ClientStatement {
            server_name,
            parse: parse.freeze(),
            query: Bytes::copy_from_slice(query),
            decision,
            may_commit: fulcrum_sql::statements::may_commit(query),
            generation,
        });
        names
            .map
            .insert(Bytes::copy_from_slice(definition), Arc::downgrade(&stmt));
        if names.map.len() >= names.sweep_at {
            names.sweep();
        }
        stmt
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
            let current = names.map.get(definition).and_then(Weak::upgrade);
            if current.is_none_or(|c| c.server_name == stmt.server_name) {
                names.map.remove(definition);
            }
        }
        self.statement(definition, &stmt.query, stmt.decision)
    }

    /// Statements some client holds (swept first).
    pub fn len(&self) -> usize {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.sweep();
        names.map.len()
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
        assert!(Arc::ptr_eq(&a, &b), "one shared statement");
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
    fn statements_no_client_holds_are_dropped() {
        let r = StatementRegistry::default();
        let kept = r.statement(b"SELECT 0\0\0\0", b"SELECT 0", Decision::Read);
        let mut held = Vec::new();
        for i in 0..10_000 {
            let q = format!("SELECT {i} + 1");
            let def = format!("{q}\0\0\0");
            held.push(r.statement(def.as_bytes(), q.as_bytes(), Decision::Read));
        }
        assert_eq!(r.len(), 10_001);
        drop(held);
        assert_eq!(r.len(), 1, "only the statement still held is left");
        // Sweeps also run as it grows: without len(), the map stays bounded.
        for i in 0..10_000 {
            let q = format!("SELECT {i} + 2");
            let def = format!("{q}\0\0\0");
            drop(r.statement(def.as_bytes(), q.as_bytes(), Decision::Read));
        }
        assert!(r.names.lock().unwrap().map.len() <= 2048);
        assert_eq!(
            r.statement(b"SELECT 0\0\0\0", b"SELECT 0", Decision::Read)
                .server_name,
            kept.server_name
        );
    }

    #[test]
    fn parameter_types_are_part_of_the_definition() {
        let r = StatementRegistry::default();
        let a = r.statement(b"SELECT $1\0\0\x01\0\0\0\x17", b"SELECT $1", Decision::Read);
        let b = r.statement(b"SELECT $1\0\0\x01\0\0\0\x19", b"SELECT $1", Decision::Read);
        assert_ne!(a.server_name, b.server_name);
    }
}
