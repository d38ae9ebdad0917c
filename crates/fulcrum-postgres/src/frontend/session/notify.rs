//! LISTEN/UNLISTEN in transaction pooling, answered by Fulcrum: the
//! client's subscription (`crate::notify`) records the channel, the
//! cluster's listening connection listens for it, and notifications are
//! written to the client when it is owed nothing outside a transaction,
//! as the server delivers them: never inside another answer.
//!
//! A single LISTEN/UNLISTEN as a simple Query is answered at once. Through
//! the extended protocol (asyncpg, JDBC) it is a virtual statement: its
//! Parse, Bind, Describe and Close are answered in the reply queue's order
//! and its Execute does the subscription; nothing of it reaches a server.
//! Several statements in one Query, session pooling, or a client already
//! pinned go to the server as before.

use std::collections::HashMap;

use fulcrum_sql::listen::{listen_statement, ListenStatement};

use super::token::{statement, PositionAnswer};
use super::*;
use crate::notify::{Registry, Subscription};

/// A listening client's part: its subscription, and its LISTEN/UNLISTEN
/// statements and portals of the extended protocol, by name.
pub(super) struct ClientListen {
    subscription: Subscription,
    statements: HashMap<Vec<u8>, ListenStatement>,
    portals: HashMap<Vec<u8>, ListenStatement>,
}

impl ClientListen {
    /// `UNLISTEN *` (DISCARD ALL).
    pub(super) fn unlisten_all(&self) {
        self.subscription.unlisten_all();
    }

    /// The channels it listens to.
    pub(super) fn channels(&self) -> Vec<String> {
        self.subscription.channels()
    }

    /// A notification queued for the client, if any.
    pub(super) fn next_queued(&mut self) -> Option<bytes::Bytes> {
        self.subscription.try_next()
    }

    /// `UNLISTEN channel`, or `*` (`None`), run by the server in a unit.
    pub(super) fn unlisten(&self, channel: Option<&str>) {
        match channel {
            Some(c) => self.subscription.unlisten(c),
            None => self.subscription.unlisten_all(),
        }
    }
}

/// The name an Execute body names (the portal).
fn portal_of(body: &[u8]) -> &[u8] {
    body.split(|&b| b == 0).next().unwrap_or_default()
}

/// The classifier's decision for LISTEN and UNLISTEN (a unit holding one).
pub(super) fn is_listen_decision(d: Decision) -> bool {
    matches!(d, Decision::Pin("LISTEN") | Decision::Pin("UNLISTEN"))
}

impl Session {
    /// Fulcrum answers LISTEN/UNLISTEN itself for this client now.
    pub(super) fn listens_locally(&self) -> bool {
        self.stmts.rewrite && self.engine.pinned().is_none()
    }

    fn client_listen(&mut self) -> &mut ClientListen {
        // The listening connection is the pool's login's (a database's
        // forced one, shared by its clients).
        let (ctx, user, database) = (&self.ctx, &self.id.pool_user, &self.id.database);
        self.listen.get_or_insert_with(|| {
            Box::new(ClientListen {
                subscription: Registry::subscribe(ctx, user, database),
                statements: HashMap::new(),
                portals: HashMap::new(),
            })
        })
    }

    /// Does `op` for the client; the error to answer, if any. A new
    /// channel's LISTEN returns once the server listens to it, so a
    /// notification committed after the client's LISTEN completed reaches it.
    pub(super) async fn apply_listen(&mut self, op: &ListenStatement) -> Option<(String, String)> {
        let limit = self.ctx.config.pool_timeout + self.ctx.config.connect_timeout;
        let subscription = &self.client_listen().subscription;
        match op {
            ListenStatement::Listen(channel) => {
                let confirmation = subscription.listen(channel.clone())?;
                // Boxed: a new channel's wait (its timer included), rare,
                // not carried by every client's task.
                match Box::pin(tokio::time::timeout(limit, confirmation)).await {
                    Ok(Ok(Ok(()))) => None,
                    Ok(Ok(Err(refused))) => {
                        subscription.unlisten(channel);
                        Some(refused)
                    }
                    _ => {
                        subscription.unlisten(channel);
                        Some(("57P03".to_owned(), format!(
                            "fulcrum: cannot listen now: no primary took the listening connection within {limit:?} (pool_timeout + connect_timeout)"
                        )))
                    }
                }
            }
            ListenStatement::Unlisten(channel) => {
                subscription.unlisten(channel);
                None
            }
            ListenStatement::UnlistenAll => {
                subscription.unlisten_all();
                None
            }
        }
    }

    /// Answers a single `LISTEN`/`UNLISTEN` sent as a simple Query (the
    /// frame of `total` bytes at the front of the client buffer).
    pub(super) async fn try_answer_listen(&mut self, total: usize) -> PositionAnswer {
        if !self.listens_locally() || self.owed.unsynced {
            return PositionAnswer::No;
        }
        let Some(op) = statement(&self.client.read_buf[..total], &[b"listen", b"unlisten"])
            .and_then(listen_statement)
        else {
            return PositionAnswer::No;
        };
        if self.owed.ready > 0 || !self.owed.expect.is_empty() {
            return PositionAnswer::Hold;
        }
        if self.engine.status() == Status::Failed {
            let msg =
                "current transaction is aborted, commands ignored until end of transaction block";
            self.answer_local(BytesMut::new(), Some(("25P02", msg.to_owned())), total);
            return PositionAnswer::Answered;
        }
        let error = self.apply_listen(&op).await;
        let mut out = BytesMut::new();
        if error.is_none() {
            backend_msg::command_complete(&mut out, op.tag());
        }
        let error = error.as_ref().map(|(c, m)| (c.as_str(), m.clone()));
        self.answer_local(out, error, total);
        PositionAnswer::Answered
    }

    /// A Parse of a single LISTEN/UNLISTEN (`decision` is the classifier's):
    /// kept as a virtual statement and answered; true when it was one.
    pub(super) fn virtual_parse(&mut self, frame: &[u8], decision: Decision) -> bool {
        let Some(p) = parse_msg(&frame[5..]) else {
            return false;
        };
        let op = (is_listen_decision(decision) && self.listens_locally())
            .then(|| std::str::from_utf8(p.query).ok().and_then(listen_statement))
            .flatten();
        let Some(op) = op else {
            if let Some(l) = self.listen.as_mut() {
                l.statements.remove(p.name);
            }
            return false;
        };
        let name = p.name.to_vec();
        self.stmts.map.remove(&name);
        self.client_listen().statements.insert(name, op);
        let mut reply = BytesMut::with_capacity(5);
        backend_msg::parse_complete(&mut reply);
        self.owed.expect.push(Expect::Synthetic(reply.freeze()));
        true
    }

    /// A Bind of a virtual statement: the portal is virtual too.
    pub(super) fn virtual_bind(&mut self, frame: &[u8]) -> bool {
        let (Some(l), Some(b)) = (self.listen.as_mut(), bind_msg(&frame[5..])) else {
            return false;
        };
        let Some(op) = l.statements.get(b.statement).cloned() else {
            l.portals.remove(b.portal);
            return false;
        };
        l.portals.insert(b.portal.to_vec(), op);
        let mut reply = BytesMut::with_capacity(5);
        backend_msg::bind_complete(&mut reply);
        self.owed.expect.push(Expect::Synthetic(reply.freeze()));
        true
    }

    /// A Describe or Close (`tag`) of a virtual statement or portal.
    pub(super) fn virtual_target(&mut self, tag: u8, frame: &[u8]) -> bool {
        let (Some(l), Some((kind, name))) = (self.listen.as_mut(), target_msg(&frame[5..])) else {
            return false;
        };
        let names = if kind == b'S' {
            &mut l.statements
        } else {
            &mut l.portals
        };
        if !names.contains_key(name) {
            return false;
        }
        let mut reply = BytesMut::with_capacity(11);
        match (tag, kind) {
            (b'C', _) => {
                names.remove(name);
                backend_msg::close_complete(&mut reply);
            }
            (_, b'S') => {
                backend_msg::parameter_description_none(&mut reply);
                backend_msg::no_data(&mut reply);
            }
            _ => backend_msg::no_data(&mut reply),
        }
        self.owed.expect.push(Expect::Synthetic(reply.freeze()));
        true
    }

    /// An Execute of a virtual portal: the subscription changes and the
    /// command's answer joins the reply queue; true when it was one.
    pub(super) async fn virtual_execute(&mut self, frame: &[u8]) -> bool {
        let Some(op) = self
            .listen
            .as_ref()
            .and_then(|l| l.portals.get(portal_of(&frame[5..])).cloned())
        else {
            return false;
        };
        let mut reply = BytesMut::new();
        match self.apply_listen(&op).await {
            None => backend_msg::command_complete(&mut reply, op.tag()),
            Some((code, message)) => {
                backend_msg::error_response(&mut reply, "ERROR", &code, &message)
            }
        }
        self.owed.expect.push(Expect::Synthetic(reply.freeze()));
        true
    }

    /// Notifications may be written now: the client is owed nothing and is
    /// outside a transaction (the server holds them back in one too).
    pub(super) fn may_notify(&self) -> bool {
        self.listen.is_some()
            && self.owed.ready == 0
            && self.owed.expect.is_empty()
            && !self.owed.unsynced
            && self.owed.stream_left == 0
            && self.engine.status() == Status::Idle
            && !self.engine.is_lost()
            && self.txn.run.is_none()
            && self.client.write_buf.len() < FORWARD_WINDOW
    }

    /// The next notification queued for the client.
    pub(super) fn poll_notification(
        listen: &mut Option<Box<ClientListen>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<bytes::Bytes>> {
        match listen.as_mut() {
            Some(l) => l.subscription.poll_next(cx),
            None => std::task::Poll::Pending,
        }
    }

    /// Writes `first` and whatever else is queued for the client.
    pub(super) async fn deliver(&mut self, first: bytes::Bytes) -> Result<(), SessionError> {
        self.client.write_buf.extend_from_slice(&first);
        if let Some(l) = self.listen.as_mut() {
            while self.client.write_buf.len() < FORWARD_WINDOW {
                let Some(next) = l.subscription.try_next() else {
                    break;
                };
                self.client.write_buf.extend_from_slice(&next);
            }
        }
        self.flush_client().await
    }
}
