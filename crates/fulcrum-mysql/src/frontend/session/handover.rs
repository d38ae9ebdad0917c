//! A binary upgrade's hand-over of this client (`fulcrum_cluster::handover`),
//! MySQL's part: at a transaction boundary, the session's snapshot (the
//! connection id the client was given, its capabilities, character set,
//! scramble and multi-statements option, its schema, the SET statements
//! replayed on its server connections, its prepared statements by the ids
//! Fulcrum gave it, the result cache's opt-out, its read consistency and
//! causal position), and the session resumed from one in the new process.
//! The client sees nothing: no greeting, the same `CONNECTION_ID()`, the
//! same statement ids and settings; its next command (sequence id 0) is
//! read there. A TLS client, or a pinned one (session pooling, user
//! variables, temporary tables, autocommit off, ...), stays.

use std::sync::Arc;

use fulcrum_cluster::clients::Stay;
use fulcrum_cluster::handover::wire::{Fields, Reader};
use fulcrum_cluster::handover::{self, ClientHead};
use fulcrum_config::Consistency;
use fulcrum_pool::Need;

use super::*;

/// The snapshot's layout; a new process reading another is refused.
const VERSION: u64 = 1;

/// A prepared statement as it is carried: the client's id, its text, its
/// parameter count and the parameter types the client bound last (sent
/// again to a server connection that has not seen them).
#[derive(Debug, Clone, PartialEq, Eq)]
struct CarriedStmt {
    id: u32,
    sql: String,
    num_params: u16,
    types: Option<Vec<u8>>,
}

/// A client's session as a binary upgrade carries it (the snapshot read).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HandedOver {
    connection_id: u32,
    caps: u32,
    charset: u8,
    scramble: [u8; 20],
    multi_statements: bool,
    schema: Option<String>,
    /// The client's SET statements, in the order they are replayed.
    desired: Vec<String>,
    statements: Vec<CarriedStmt>,
    next_stmt: u32,
    last_stmt: Option<u32>,
    cache_off: bool,
    consistency: String,
    need: Need<String>,
}

fn flag(r: &mut Reader<'_>) -> Option<bool> {
    match r.number()? {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

fn small<T: TryFrom<u64>>(r: &mut Reader<'_>) -> Option<T> {
    T::try_from(r.number()?).ok()
}

impl HandedOver {
    /// The snapshot's bytes: fields in order, the version first.
    fn write(&self) -> Vec<u8> {
        let mut f = Fields::default();
        f.number(VERSION)
            .number(self.connection_id.into())
            .number(self.caps.into())
            .number(self.charset.into())
            .bytes(&self.scramble)
            .number(self.multi_statements.into());
        match &self.schema {
            Some(s) => f.number(1).text(s),
            None => f.number(0),
        };
        f.number(self.desired.len() as u64);
        for set in &self.desired {
            f.text(set);
        }
        f.number(self.next_stmt.into());
        match self.last_stmt {
            Some(id) => f.number(1).number(id.into()),
            None => f.number(0),
        };
        f.number(self.statements.len() as u64);
        for s in &self.statements {
            f.number(s.id.into())
                .text(&s.sql)
                .number(s.num_params.into());
            match &s.types {
                Some(t) => f.number(1).bytes(t),
                None => f.number(0),
            };
        }
        f.number(self.cache_off.into()).text(&self.consistency);
        match &self.need {
            Need::Nothing => f.number(0),
            Need::At(p) => f.number(1).text(p),
            Need::Unknown => f.number(2),
        };
        f.into_bytes()
    }

    /// Reads a snapshot [`write`](Self::write) wrote; `None` for another
    /// version or anything malformed.
    pub(crate) fn read(snapshot: &[u8]) -> Option<HandedOver> {
        let mut r = Reader::new(snapshot);
        if r.number()? != VERSION {
            return None;
        }
        let connection_id = small(&mut r)?;
        let caps = small(&mut r)?;
        let charset = small(&mut r)?;
        let scramble = r.bytes()?.try_into().ok()?;
        let multi_statements = flag(&mut r)?;
        let schema = match flag(&mut r)? {
            true => Some(r.text()?.to_owned()),
            false => None,
        };
        let mut desired = Vec::new();
        for _ in 0..r.number()? {
            desired.push(r.text()?.to_owned());
        }
        let next_stmt = small(&mut r)?;
        let last_stmt = match flag(&mut r)? {
            true => Some(small(&mut r)?),
            false => None,
        };
        let mut statements = Vec::new();
        for _ in 0..r.number()? {
            let id = small(&mut r)?;
            let sql = r.text()?.to_owned();
            let num_params = small(&mut r)?;
            let types = match flag(&mut r)? {
                true => Some(r.bytes()?.to_vec()),
                false => None,
            };
            statements.push(CarriedStmt {
                id,
                sql,
                num_params,
                types,
            });
        }
        let cache_off = flag(&mut r)?;
        let consistency = r.text()?.to_owned();
        let need = match r.number()? {
            0 => Need::Nothing,
            1 => Need::At(r.text()?.to_owned()),
            2 => Need::Unknown,
            _ => return None,
        };
        r.at_end().then_some(HandedOver {
            connection_id,
            caps,
            charset,
            scramble,
            multi_statements,
            schema,
            desired,
            statements,
            next_stmt,
            last_stmt,
            cache_off,
            consistency,
            need,
        })
    }

    /// The login the session is rebuilt from, as `login` would have made
    /// it (`user` is the client's head's); the client is past its OK, so
    /// no sequence id is owed.
    pub(crate) fn login(&self, user: &str) -> Login {
        Login {
            user: user.into(),
            schema: self.schema.clone(),
            caps: C::from_bits_retain(self.caps),
            charset: self.charset,
            connection_id: self.connection_id,
            next_seq: 0,
            scramble: self.scramble,
        }
    }

    /// The id the client was given (what `CONNECTION_ID()` answers).
    pub(crate) fn connection_id(&self) -> u32 {
        self.connection_id
    }

    /// Another id for it, when its own is taken in this process.
    pub(crate) fn renumber(&mut self, id: u32) {
        self.connection_id = id;
    }
}

impl Session {
    /// A drain or an upgrade's hand-over was raised (checked before each
    /// command): true when the session ends here, silently: moved to the
    /// new process, or drained at a transaction boundary.
    pub(super) async fn leave_now(&mut self) -> Result<bool, SessionError> {
        if self.client_entry.handing_over() {
            if self.at_boundary() {
                if self.try_hand_over().await? {
                    return Ok(true);
                }
            } else if !self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT) {
                // Autocommit off: always in a transaction, never at a
                // boundary; it stays, pinned as such.
                if let Some(sink) = handover::sink() {
                    sink.stays(&self.client_entry.clone_entry(), Some(Stay::Pinned));
                }
            }
        }
        Ok(self.client_entry.draining() && self.at_boundary())
    }

    /// At a transaction boundary, an upgrade asked this client to move:
    /// true when it is the new process's now (the session ends here
    /// without a word to it); false when it stays (TLS, pinned, or the
    /// hand-over failed: recorded on its entry), or waits for its next
    /// boundary (its connection is kept for `LAST_INSERT_ID()`).
    async fn try_hand_over(&mut self) -> Result<bool, SessionError> {
        let Some(sink) = handover::sink() else {
            return Ok(false);
        };
        let entry = self.client_entry.clone_entry();
        let pinned = self.engine.pinned().is_some();
        if !sink.may_move(&entry, self.client.stream().movable_socket(), pinned) {
            return Ok(false);
        }
        if self.engine.kept_for_next() || self.engine.was_let_go() || self.txn.run.is_some() {
            // Held for the next command only: it moves after that one.
            return Ok(false);
        }
        // Answers queued for it go out first; its server connection goes
        // back at the session's cleanup, as between units.
        self.flush().await?;
        let head = ClientHead {
            protocol: "mysql".into(),
            cluster: self.ctx.config.name.clone(),
            user: self.user.to_string(),
            database: self.schema.clone().unwrap_or_default(),
            peer: entry.peer.clone(),
            unix: self.client.stream().is_unix(),
            state: self.snapshot(),
        };
        let socket = self.client.stream().movable_socket().expect("checked");
        // Boxed: a rare path, kept out of every idle session's future.
        Ok(Box::pin(sink.hand_over(head, socket)).await)
    }

    /// The session as the new process takes it up (see [`HandedOver`]).
    fn snapshot(&self) -> Vec<u8> {
        let mut statements: Vec<CarriedStmt> = self
            .prepared
            .map
            .iter()
            .map(|(&id, s)| CarriedStmt {
                id,
                sql: s.sql.to_string(),
                num_params: s.num_params,
                types: s.types.as_ref().map(|t| t.to_vec()),
            })
            .collect();
        statements.sort_unstable_by_key(|s| s.id);
        let (mode, need) = self.reads.carried();
        HandedOver {
            connection_id: self.hello.connection_id,
            caps: self.hello.caps.bits(),
            charset: self.hello.charset,
            scramble: self.hello.scramble,
            multi_statements: self.hello.multi_statements,
            schema: self.schema.clone(),
            desired: self.desired.clone(),
            statements,
            next_stmt: self.prepared.next,
            last_stmt: self.prepared.last,
            cache_off: self.cache.off,
            consistency: mode.name().to_owned(),
            need,
        }
        .write()
    }

    /// A client a binary upgrade's old process handed over: its session
    /// taken up from `carried` (no handshake, no OK: the client is past
    /// them; its next packet is a command), then served until it leaves.
    pub(crate) async fn run_resumed(&mut self, carried: HandedOver) -> Result<(), SessionError> {
        // As at a login: the function catalog reads the schema first (up
        // to `function_catalog_wait`), so the statements classified below
        // and the client's next ones are not pinned for a call this process
        // cannot prove yet.
        if let Some(schema) = self.schema.clone() {
            let options = (self.hello.wire_format.bits(), self.hello.charset);
            self.ctx
                .catalog_at_login(&self.user, options, &schema)
                .await;
        }
        self.resume_from(carried);
        self.serve_logged_in().await
    }

    /// Settings, statements (prepared on a server connection at their
    /// first use, as after any prepare under transaction pooling, and
    /// classified by this process's rules), the cache opt-out, read
    /// consistency.
    fn resume_from(&mut self, carried: HandedOver) {
        self.hello.multi_statements = carried.multi_statements;
        for set in &carried.desired {
            if let Some(t) = crate::codec::wait_timeout::session_wait_timeout(set) {
                self.wait_timeout = Some(t);
            }
        }
        self.desired = carried.desired;
        let schema = self.schema.clone().unwrap_or_default();
        let options = (self.hello.wire_format.bits(), self.hello.charset);
        for s in carried.statements {
            let sql: Arc<str> = s.sql.into();
            let decision = self.ctx.classify_for(&sql, &self.user, options, &schema);
            let stmt = self.new_client_stmt(sql, s.num_params, decision, s.types.map(Arc::from));
            self.prepared.map.insert(s.id, stmt);
        }
        self.prepared.next = carried.next_stmt.max(1);
        self.prepared.last = carried.last_stmt;
        self.cache.off = carried.cache_off;
        let mode = Consistency::from_name(&carried.consistency).unwrap_or(self.reads.session());
        self.reads.resume(mode, carried.need);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HandedOver {
        HandedOver {
            connection_id: (1 << 30) + 7,
            caps: 0x00ff_a685,
            charset: 45,
            scramble: *b"0123456789abcdefghij",
            multi_statements: true,
            schema: Some("shop".into()),
            desired: vec!["SET NAMES latin1".into(), "SET sql_mode = ''".into()],
            statements: vec![
                CarriedStmt {
                    id: 1,
                    sql: "SELECT ? + 1".into(),
                    num_params: 1,
                    types: Some(vec![8, 0]),
                },
                CarriedStmt {
                    id: 3,
                    sql: "SELECT 1".into(),
                    num_params: 0,
                    types: None,
                },
            ],
            next_stmt: 4,
            last_stmt: Some(3),
            cache_off: true,
            consistency: "causal".into(),
            need: Need::At("0-1-42".into()),
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written() {
        let h = sample();
        assert_eq!(HandedOver::read(&h.write()), Some(sample()));
        let mut bare = sample();
        bare.schema = None;
        bare.statements.clear();
        bare.last_stmt = None;
        bare.need = Need::Unknown;
        let bytes = bare.write();
        assert_eq!(HandedOver::read(&bytes).as_ref(), Some(&bare));
    }

    #[test]
    fn another_version_or_a_cut_snapshot_is_refused() {
        let bytes = sample().write();
        for cut in 0..bytes.len() {
            assert_eq!(HandedOver::read(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(HandedOver::read(&padded), None);
        let mut other = bytes;
        other[4 + 7] = 2; // the version's last byte
        assert_eq!(HandedOver::read(&other), None);
    }

    #[test]
    fn the_login_is_the_one_the_client_had() {
        let login = sample().login("app");
        assert_eq!(&*login.user, "app");
        assert_eq!(login.schema.as_deref(), Some("shop"));
        assert_eq!(login.connection_id, (1 << 30) + 7);
        assert_eq!(login.charset, 45);
        assert_eq!(login.next_seq, 0);
        assert_eq!(&login.scramble, b"0123456789abcdefghij");
    }
}
