//! A COMMIT in flight when its server died, resolved instead of answered
//! 08007 (`transaction_replay`; docs/failover.md, "A COMMIT in flight").
//! With the first unit of a replayable transaction that may write,
//! Fulcrum asks `pg_current_xact_id_if_assigned()` through a statement of
//! its own, shared and prepared like clients' statements: inside the
//! client's extended-protocol batch before its Sync (answered in the same
//! flush), or with a Sync of its own behind a simple query; a COMMIT
//! reached with the id still unknown gets the question ahead of it. The
//! answer never reaches the client. If the server dies before the COMMIT
//! is answered, the new primary is asked `pg_xact_status(xid)`:
//! committed, the client gets its COMMIT's success; not committed, the
//! transaction is replayed there; no answer (or the id's answer never
//! came), 08007 as before.
//!
//! A transaction id is only meaningful below the new primary's commit
//! floor (`Router::commit_floor`, read by Fulcrum right after it promoted
//! it): ids at or above it were never the old primary's on this server
//! and may already name a transaction of the new one's.

use fulcrum_cluster::replay::attach_primary;
use fulcrum_session::{CommitId, Resolution};
use fulcrum_sql::statements::is_plain_commit;

use super::*;

/// The transaction's id, NULL if it wrote nothing.
const COMMIT_ID_SQL: &str = "SELECT pg_current_xact_id_if_assigned()::text";
/// The portal Fulcrum's own question runs in (closed right after).
const COMMIT_ID_PORTAL: &[u8] = b"fulcrum_commit_id";

impl Session {
    /// Whether Fulcrum may ask the server for the open transaction's id
    /// now: a replayable transaction on an attached connection whose id is
    /// not known yet.
    fn may_ask_commit_id(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(|s| knows_commit_ids(&s.reported))
            && self
                .ctx
                .config
                .transaction_replay
                .is_some_and(|r| r.resolve_commits)
            && !matches!(self.engine.unit().commit_id, CommitId::Id(_))
            && self.engine.log_open()
            && self.engine.status() != Status::Failed
            && self.replayable()
    }

    /// Queues the question: Bind, Execute and Close of Fulcrum's own
    /// statement (prepared on the connection when missing, as shared
    /// statements are: the server neither parses nor plans it again).
    /// `in_batch`: inside the client's extended-protocol batch, just before
    /// its Sync, so the answer comes in the same flush as the client's;
    /// otherwise with a Sync of its own. The id is unknown until the
    /// answer arrives.
    fn ask_commit_id(&mut self, in_batch: bool) {
        // Held by the session, so every client shares one server-side name
        // (the registry keeps only what someone holds).
        let stmt = match self.txn.commit_id_statement.take() {
            // Renamed when DDL started a new schema generation.
            Some(s) => self.ctx.statements.current(&s),
            None => {
                let definition = [COMMIT_ID_SQL.as_bytes(), b"\0\0\0"].concat();
                self.ctx
                    .statements
                    .statement(&definition, COMMIT_ID_SQL.as_bytes(), Decision::Read)
            }
        };
        self.prepare_on_server(&stmt);
        self.txn.commit_id_statement = Some(stmt.clone());
        put_bind(
            &mut self.to_server,
            COMMIT_ID_PORTAL,
            stmt.server_name.as_bytes(),
            &[0, 0, 0, 0, 0, 0],
        );
        put_execute(&mut self.to_server, COMMIT_ID_PORTAL);
        put_target(&mut self.to_server, b'C', b'P', COMMIT_ID_PORTAL);
        if !in_batch {
            put_sync(&mut self.to_server);
        }
        self.owed.expect.push(Expect::CommitId { in_batch });
        self.engine.commit_id_asked();
    }

    /// Whether the unit being queued may write, read once (a Query's
    /// classification or a Bind's statement set it).
    fn unit_may_write(&mut self) -> bool {
        std::mem::take(&mut self.txn.unit_writes)
            && !self.engine.unit().commit_in_flight
            && self.may_ask_commit_id()
    }

    /// A simple Query of a replayable transaction was just queued: if it
    /// may write and the transaction's id is not known, the id is asked
    /// right behind it, so it is known, a round trip before, when the
    /// COMMIT comes.
    pub(super) fn ask_commit_id_behind(&mut self) {
        if self.unit_may_write() {
            self.ask_commit_id(false);
        }
    }

    /// The client's Sync is next: if its batch may write and the
    /// transaction's id is not known, the id is asked inside the batch.
    pub(super) fn ask_commit_id_before_sync(&mut self) {
        if self.owed.unsynced && !self.owed.expect.sync_is_ignored() && self.unit_may_write() {
            self.ask_commit_id(true);
        }
    }

    /// Before the client frame at the front (`tag`, `total` bytes) goes to
    /// the server: when it starts a lone COMMIT of a replayable transaction
    /// whose id is not known yet (a write Fulcrum did not see as one, or
    /// pipelined right before it), with nothing else in flight, the id is
    /// asked ahead of it, on the same write.
    pub(super) fn ask_commit_id_ahead(&mut self, tag: u8, total: usize) {
        if self.engine.status() != Status::InTransaction
            || self.owed.unsynced
            || self.owed.ready > 0
            || !self.owed.expect.is_empty()
            || !self.may_ask_commit_id()
        {
            return;
        }
        let body = &self.client.read_buf[5..total];
        let commits = match tag {
            b'Q' => query_text(body).is_some_and(is_plain_commit),
            b'P' => parse_msg(body).is_some_and(|p| is_plain_commit(p.query)),
            // A statement prepared earlier; not the unnamed one (a simple
            // query ahead of its Bind would drop it).
            b'B' => bind_msg(body).is_some_and(|b| {
                !b.statement.is_empty()
                    && self
                        .stmts
                        .map
                        .get(b.statement)
                        .is_some_and(|s| s.may_commit && is_plain_commit(&s.query))
            }),
            _ => false,
        };
        if commits {
            self.ask_commit_id(false);
        }
    }

    /// The engine said Resolve: asks the new primary what became of the
    /// transaction whose COMMIT was in flight, and acts on the answer.
    pub(super) async fn resolve_commit(&mut self) -> Result<(), SessionError> {
        let id = self.engine.resolving_commit();
        let (resolution, position) = match id {
            CommitId::NothingWritten => (Resolution::Committed, None),
            CommitId::Id(xid) => self.ask_new_primary(xid).await,
            CommitId::Unknown => (Resolution::Unknown, None),
        };
        let label = match resolution {
            Resolution::Committed => "commit_confirmed",
            Resolution::NotCommitted => "commit_not_committed",
            Resolution::Unknown => "commit_unknown",
        };
        self.ctx.metrics.transaction_replay(label);
        tracing::info!(commit_id = ?id, outcome = label, "server lost with a COMMIT in flight; asked the primary");
        let mut committed = false;
        if resolution == Resolution::Committed {
            // After waiting for the new primary: the clock is read again
            // for the digests the answer ends.
            self.engine.new_wake();
            let mut out = BytesMut::new();
            committed = self.owed.expect.answer_commit(&mut out, self.engine.now());
            if committed {
                self.client.write_buf.extend_from_slice(&out);
            }
        }
        let resolution = if resolution == Resolution::Committed && !committed {
            Resolution::Unknown
        } else {
            resolution
        };
        let actions = self.engine.step(Event::Resolved(resolution));
        if committed {
            self.committed_without_server(position);
        }
        // Replay, Fail, or (committed) a pending drain's Close.
        let carried = self.carry_out(actions).await?;
        debug_assert_eq!(carried, Carried::Done, "Resolved holds nothing");
        Ok(())
    }

    /// `pg_xact_status` of `xid` on whatever primary takes it within
    /// `transaction_replay_timeout`, and that primary's position.
    async fn ask_new_primary(&mut self, xid: u64) -> (Resolution, Option<u64>) {
        let timeout = self
            .ctx
            .config
            .transaction_replay
            .map(|l| l.timeout)
            .unwrap_or_default();
        let deadline = tokio::time::Instant::now() + timeout;
        let ctx = self.ctx.clone();
        let Some((primary, mut conn)) = attach_primary(&ctx, deadline, self).await else {
            return (Resolution::Unknown, None);
        };
        let floor = ctx.router.commit_floor(primary);
        let answer = match floor {
            // Not promoted by Fulcrum (or the same primary back from a
            // restart): its ids cannot be told from the old one's.
            None => None,
            Some(f) => {
                let sql = format!(
                    "SELECT CASE WHEN '{xid}'::xid8 < '{f}'::xid8 THEN pg_xact_status('{xid}'::xid8) END, \
                     pg_current_wal_flush_lsn()::text"
                );
                conn.query_rows(&sql).await.ok()
            }
        };
        let row = answer.as_ref().and_then(|rows| rows.first());
        let cell = |i: usize| row.and_then(|r| r.get(i)).and_then(|c| c.as_deref());
        let resolution = match (floor, cell(0)) {
            (None, _) => Resolution::Unknown,
            // At or above the floor: it never reached this primary.
            (Some(f), _) if xid >= f => Resolution::NotCommitted,
            _ if row.is_none() => Resolution::Unknown,
            (_, Some("committed")) => Resolution::Committed,
            (_, Some("aborted")) => Resolution::NotCommitted,
            _ => Resolution::Unknown,
        };
        let position = cell(1).and_then(fulcrum_cluster::lag::parse_lsn);
        if row.is_some() || floor.is_none() {
            conn.release();
        } else {
            conn.discard();
        }
        (resolution, position)
    }

    /// The COMMIT committed with its server gone: the client is between
    /// transactions, what it set in the transaction is its session's now,
    /// and its reads must see what it wrote (`position`, the new primary's).
    fn committed_without_server(&mut self, position: Option<u64>) {
        self.owed.ready = 0;
        self.owed.unsynced = false;
        self.owed.stream_left = 0;
        self.to_server.clear();
        // (Its id was taken when the resolution started.)
        self.engine.unit_lost();
        self.engine.log_closed();
        self.set_status(b'I');
        for op in std::mem::take(&mut self.params.txn_ops) {
            match op {
                Effect::Set { key, stmt } => {
                    self.params.desired.insert(key, stmt);
                }
                Effect::Reset { key } => {
                    match self.params.startup.get(&key) {
                        Some(s) => self.params.desired.insert(key, s.clone()),
                        None => self.params.desired.remove(&key),
                    };
                }
                Effect::ResetAll | Effect::DiscardAll => {
                    self.params.desired = Settings::new(self.params.startup.clone());
                }
                _ => {}
            }
        }
        self.params.txn_committed = None;
        self.reads
            .learning(&self.ctx.reads(&self.id.user, &self.id.database));
        self.on_position(position);
    }
}

/// `pg_current_xact_id_if_assigned()` and `pg_xact_status(xid8)` exist
/// from PostgreSQL 13 on (the server's `server_version`, as it reported
/// it at login); older servers are not asked, and keep 08007.
fn knows_commit_ids(reported: &std::collections::BTreeMap<String, String>) -> bool {
    reported
        .get("server_version")
        .and_then(|v| {
            v.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|major| major.parse::<u32>().ok())
        })
        .is_some_and(|major| major >= 13)
}

#[cfg(test)]
mod tests {
    use super::knows_commit_ids;

    #[test]
    fn only_servers_from_13_on_are_asked() {
        let version = |v: &str| {
            let mut m = std::collections::BTreeMap::new();
            m.insert("server_version".to_owned(), v.to_owned());
            knows_commit_ids(&m)
        };
        assert!(version("15.20 (Debian 15.20-0+deb12u1)"));
        assert!(version("13.0"));
        assert!(!version("12.19"));
        assert!(!version("9.6.24"));
        assert!(!knows_commit_ids(&Default::default()));
    }
}
