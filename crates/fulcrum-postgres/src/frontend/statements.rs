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
}

/// Definitions seen by this cluster, each with its server-side name.
/// Grows with the number of distinct statement definitions (not with clients).
#[derive(Debug, Default)]
pub struct StatementRegistry {
    names: Mutex<HashMap<Bytes, Arc<str>>>,
    next: AtomicU64,
}

impl StatementRegistry {
    /// The client statement for a Parse `definition` (bytes after its name).
    pub fn statement(
        &self,
        definition: &[u8],
        query: &[u8],
        decision: Decision,
    ) -> Arc<ClientStatement> {
        let server_name = {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            match names.get(definition) {
                Some(n) => n.clone(),
                None => {
                    let id = self.next.fetch_add(1, Ordering::Relaxed);
                    let n: Arc<str> = format!("fulcrum_{id}").into();
                    names.insert(Bytes::copy_from_slice(definition), n.clone());
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
        })
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
    fn parameter_types_are_part_of_the_definition() {
        let r = StatementRegistry::default();
        let a = r.statement(b"SELECT $1\0\0\x01\0\0\0\x17", b"SELECT $1", Decision::Read);
        let b = r.statement(b"SELECT $1\0\0\x01\0\0\0\x19", b"SELECT $1", Decision::Read);
        assert_ne!(a.server_name, b.server_name);
    }
}
