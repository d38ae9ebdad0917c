//! One (database, user)'s listening connection: who listens to which
//! channel, and the task that keeps a server connection on the primary
//! listening to all of them. A channel's first subscriber sends `LISTEN`
//! and waits until the server has answered it; its last one leaving sends
//! `UNLISTEN`. When the primary changes, or the connection is lost, the
//! task opens a new one on the primary and listens again
//! (`fulcrum_listen_reconnects_total`); what was notified in between is
//! lost, as it is across a server restart.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fulcrum_pool::BackendId;
use tokio::sync::{mpsc, oneshot};

use crate::backend::ServerConn;
use crate::codec::backend_msg::{notification_channel, parse_error_fields};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::put_query;
use crate::frontend::context::ClusterContext;

/// How often the task checks that its connection is still on the primary.
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// The pause before opening a connection again after a failed attempt.
const RETRY_AFTER: Duration = Duration::from_millis(250);

/// What the server said to a `LISTEN`: done, or its error (SQLSTATE, message).
pub type Outcome = Result<(), (String, String)>;
/// What a client waiting for its `LISTEN` hears.
pub type Confirmation = oneshot::Receiver<Outcome>;

pub struct Hub {
    user: Arc<str>,
    database: Arc<str>,
    ctx: Weak<ClusterContext>,
    state: Mutex<State>,
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    clients: HashMap<u64, Client>,
    /// Subscribers per channel (a channel is here while one listens).
    channels: HashMap<String, HashSet<u64>>,
    /// Channels the server has confirmed on the current connection.
    listening: HashSet<String>,
    /// Clients waiting for the server's LISTEN of a channel.
    waiting: HashMap<String, Vec<oneshot::Sender<Outcome>>>,
    /// Times a connection was opened again (`SHOW LISTENERS`).
    reconnects: u64,
    /// The backend the connection listens on now.
    on: Option<BackendId>,
}

struct Client {
    queue: mpsc::Sender<Bytes>,
    /// The bytes of `queue`, bounded (`max_client_notify_bytes`).
    queued: Arc<super::Queued>,
    channels: HashSet<String>,
}

enum Command {
    Listen(String),
    Unlisten(String),
}

/// One hub's row in `SHOW LISTENERS`.
pub struct Listing {
    pub database: Arc<str>,
    pub user: Arc<str>,
    pub channels: usize,
    pub clients: usize,
    pub subscriptions: usize,
    pub backend: Option<BackendId>,
    pub reconnects: u64,
}

impl Hub {
    /// A hub for `user` on `database`, its task started.
    pub(super) fn start(ctx: &Arc<ClusterContext>, user: Arc<str>, database: Arc<str>) -> Arc<Hub> {
        let (commands, rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            user,
            database,
            ctx: Arc::downgrade(ctx),
            state: Mutex::new(State::default()),
            commands,
        });
        tokio::spawn(run(hub.clone(), rx));
        hub
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn join(&self, queue: mpsc::Sender<Bytes>, queued: Arc<super::Queued>) -> u64 {
        let mut s = self.state();
        s.next_id += 1;
        let id = s.next_id;
        s.clients.insert(
            id,
            Client {
                queue,
                queued,
                channels: HashSet::new(),
            },
        );
        id
    }

    /// Subscribes client `id` to `channel`. `Some`: the server has not
    /// confirmed the channel yet; the client's answer waits for it.
    pub(super) fn listen(&self, id: u64, channel: String) -> Option<Confirmation> {
        let mut s = self.state();
        let client = s.clients.get_mut(&id)?;
        if !client.channels.insert(channel.clone()) {
            return None; // Listening already: nothing changes.
        }
        let subscribers = s.channels.entry(channel.clone()).or_default();
        let first = subscribers.is_empty();
        subscribers.insert(id);
        if s.listening.contains(&channel) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        s.waiting.entry(channel.clone()).or_default().push(tx);
        drop(s);
        if first {
            self.gauge(1);
            let _ = self.commands.send(Command::Listen(channel));
        }
        Some(rx)
    }

    pub(super) fn unlisten(&self, id: u64, channel: &str) {
        let mut s = self.state();
        if let Some(client) = s.clients.get_mut(&id) {
            client.channels.remove(channel);
        }
        self.drop_subscriber(&mut s, id, channel);
    }

    pub(super) fn unlisten_all(&self, id: u64) {
        let mut s = self.state();
        let channels = match s.clients.get_mut(&id) {
            Some(c) => std::mem::take(&mut c.channels),
            None => return,
        };
        for channel in channels {
            self.drop_subscriber(&mut s, id, &channel);
        }
    }

    /// The channels client `id` listens to.
    pub(super) fn channels_of(&self, id: u64) -> Vec<String> {
        let s = self.state();
        let mut out: Vec<String> = s
            .clients
            .get(&id)
            .map(|c| c.channels.iter().cloned().collect())
            .unwrap_or_default();
        out.sort();
        out
    }

    pub(super) fn leave(&self, id: u64) {
        self.unlisten_all(id);
        self.state().clients.remove(&id);
    }

    fn drop_subscriber(&self, s: &mut State, id: u64, channel: &str) {
        let Some(subscribers) = s.channels.get_mut(channel) else {
            return;
        };
        if !subscribers.remove(&id) || !subscribers.is_empty() {
            return;
        }
        s.channels.remove(channel);
        s.listening.remove(channel);
        self.gauge(-1);
        let _ = self.commands.send(Command::Unlisten(channel.to_owned()));
    }

    fn gauge(&self, delta: i64) {
        if let Some(ctx) = self.ctx.upgrade() {
            ctx.metrics.listen_channels(delta);
        }
    }

    fn has_channels(&self) -> bool {
        !self.state().channels.is_empty()
    }

    pub(super) fn listing(&self) -> Listing {
        let s = self.state();
        Listing {
            database: self.database.clone(),
            user: self.user.clone(),
            channels: s.channels.len(),
            clients: s
                .clients
                .values()
                .filter(|c| !c.channels.is_empty())
                .count(),
            subscriptions: s.channels.values().map(HashSet::len).sum(),
            backend: s.on,
            reconnects: s.reconnects,
        }
    }

    /// Queues a NotificationResponse for every client listening to its
    /// channel; returns (queued, dropped).
    fn fan_out(&self, frame: Bytes) -> (u64, u64) {
        let Some(channel) =
            notification_channel(&frame[5..]).and_then(|c| std::str::from_utf8(c).ok())
        else {
            return (0, 0);
        };
        let s = self.state();
        let Some(subscribers) = s.channels.get(channel) else {
            return (0, 0);
        };
        let (mut queued, mut dropped) = (0, 0);
        for id in subscribers {
            if let Some(client) = s.clients.get(id) {
                // Past max_client_notify_bytes: dropped, as past notify_queue.
                if !client.queued.reserve(frame.len()) {
                    dropped += 1;
                    continue;
                }
                match client.queue.try_send(frame.clone()) {
                    Ok(()) => queued += 1,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        client.queued.release(frame.len());
                        dropped += 1;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        client.queued.release(frame.len());
                    }
                }
            }
        }
        (queued, dropped)
    }

    /// The server answered the LISTEN of `channel` (`Ok`) or refused it.
    fn confirmed(&self, channel: &str, outcome: Outcome) {
        let mut s = self.state();
        if outcome.is_ok() && s.channels.contains_key(channel) {
            s.listening.insert(channel.to_owned());
        }
        for waiter in s.waiting.remove(channel).unwrap_or_default() {
            let _ = waiter.send(outcome.clone());
        }
    }

    /// The connection is gone: nothing is confirmed on the next one yet.
    fn lost(&self) {
        let mut s = self.state();
        s.listening.clear();
        s.on = None;
    }
}

/// The listening connection and the statements it still owes answers to
/// (`Some(channel)` for a LISTEN a client may wait for).
struct Listening {
    backend: BackendId,
    server: ServerConn,
    owed: VecDeque<Option<String>>,
    error: Option<(String, String)>,
}

impl Listening {
    async fn send(&mut self, sql: &str, waits: Option<String>) -> std::io::Result<()> {
        let mut out = BytesMut::with_capacity(sql.len() + 6);
        put_query(&mut out, sql);
        self.owed.push_back(waits);
        self.server.io.send(&out).await
    }

    /// Handles the complete frames read so far; false when the server sent
    /// something a listening connection cannot go on after.
    fn take_frames(&mut self, hub: &Hub, ctx: &ClusterContext) -> bool {
        let (mut queued, mut dropped) = (0, 0);
        loop {
            let h = match check_frame(&self.server.io.read_buf, u32::MAX as u64) {
                Ok(Some(h)) if self.server.io.read_buf.len() >= h.total => h,
                Ok(_) => break,
                Err(_) => return false,
            };
            let frame = self.server.io.read_buf.split_to(h.total).freeze();
            match h.tag {
                b'A' => {
                    // Its own allocation: a slice of the read buffer would
                    // keep the whole buffer alive while any client holds it,
                    // past what max_client_notify_bytes counts. Its pid is
                    // the Fulcrum client's that sent it, when one did.
                    let own = Bytes::copy_from_slice(&frame);
                    let (q, d) = hub.fan_out(ctx.notifications.senders.rewrite(own));
                    queued += q;
                    dropped += d;
                }
                b'E' => {
                    let fields = parse_error_fields(&frame[5..]);
                    if fields.severity == "FATAL" || fields.severity == "PANIC" {
                        return false;
                    }
                    self.error = Some((fields.code, fields.message));
                }
                b'Z' => {
                    let error = self.error.take();
                    if let Some(Some(channel)) = self.owed.pop_front() {
                        if let Some(e) = &error {
                            tracing::warn!(cluster = %ctx.name(), user = %hub.user, database = %hub.database, channel = %channel, code = %e.0, error = %e.1, "LISTEN refused by the server");
                        }
                        hub.confirmed(&channel, error.map_or(Ok(()), Err));
                    }
                }
                _ => {}
            }
        }
        ctx.metrics.notifications("delivered", queued);
        ctx.metrics.notifications("dropped", dropped);
        true
    }
}

/// Opens a connection on the primary and listens to every channel.
async fn open(hub: &Hub, ctx: &ClusterContext) -> Option<Listening> {
    let backend = ctx.router.primary()?;
    let server = match ctx.open(backend, &hub.user, &hub.database).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(cluster = %ctx.name(), user = %hub.user, database = %hub.database, error = %e, "listening connection: could not connect to the primary");
            return None;
        }
    };
    let mut listening = Listening {
        backend,
        server,
        owed: VecDeque::new(),
        error: None,
    };
    let channels: Vec<String> = hub.state().channels.keys().cloned().collect();
    for channel in channels {
        let sql = fulcrum_sql::listen::quoted_listen("LISTEN", &channel);
        listening.send(&sql, Some(channel)).await.ok()?;
    }
    hub.state().on = Some(backend);
    Some(listening)
}

/// The hub's task: (re)opens the listening connection while any channel
/// is listened to, passes LISTEN/UNLISTEN on, fans notifications out, and
/// follows the primary. Ends with the cluster's context.
async fn run(hub: Arc<Hub>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut conn: Option<Listening> = None;
    let mut opened_before = false;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if conn.is_none() && hub.has_channels() {
            let Some(ctx) = hub.ctx.upgrade() else {
                return;
            };
            // What was asked while there was no connection is in the state
            // the new connection listens to.
            while commands.try_recv().is_ok() {}
            conn = open(&hub, &ctx).await;
            match &conn {
                Some(c) => {
                    if opened_before {
                        ctx.metrics.listen_reconnect();
                        hub.state().reconnects += 1;
                        tracing::info!(cluster = %ctx.name(), user = %hub.user, database = %hub.database, backend = %ctx.backends[c.backend], "listening again on the primary (notifications sent meanwhile are lost)");
                    }
                    opened_before = true;
                }
                None => {
                    drop(ctx);
                    tokio::time::sleep(RETRY_AFTER).await;
                    continue;
                }
            }
        }
        let read = async {
            match conn.as_mut() {
                Some(c) => c.server.io.read_more().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                if let Some(c) = conn.as_mut() {
                    let sent = match command {
                        Command::Listen(channel) => {
                            let sql = fulcrum_sql::listen::quoted_listen("LISTEN", &channel);
                            c.send(&sql, Some(channel)).await
                        }
                        Command::Unlisten(channel) => {
                            let sql = fulcrum_sql::listen::quoted_listen("UNLISTEN", &channel);
                            c.send(&sql, None).await
                        }
                    };
                    if sent.is_err() {
                        conn = None;
                        hub.lost();
                    }
                }
            }
            r = read => {
                let Some(ctx) = hub.ctx.upgrade() else { return };
                let alive = matches!(r, Ok(n) if n > 0)
                    && conn.as_mut().is_some_and(|c| c.take_frames(&hub, &ctx));
                if !alive {
                    tracing::info!(cluster = %ctx.name(), user = %hub.user, database = %hub.database, "listening connection lost");
                    conn = None;
                    hub.lost();
                }
            }
            _ = tick.tick() => {
                let Some(ctx) = hub.ctx.upgrade() else { return };
                let Some(c) = conn.as_mut() else { continue };
                if ctx.router.primary() != Some(c.backend) {
                    // A failover or switchover: listen on the new primary.
                    conn = None;
                    hub.lost();
                } else if c.owed.is_empty() && !hub.has_channels() {
                    // Nobody listens: the connection goes.
                    let _ = c.server.io.send(b"X\0\0\0\x04").await;
                    conn = None;
                    hub.lost();
                    opened_before = false;
                }
            }
        }
    }
}
