//! The forwarding loop: what one turn may read and which timers it arms,
//! the one future polling every source of a wake-up, and what is done with
//! each wake-up (socket progress, a timer, a notification, a KILL, the drain).

use std::task::{Context, Poll};

use fulcrum_cluster::clients::Watcher;
use fulcrum_net::SessionTimer;

use super::*;

/// What woke the forwarding loop.
enum Wake {
    Io(Io),
    Shutdown,
    Idle(IdleKind),
    QueryTimeout,
    Killed,
    Notified(Option<bytes::Bytes>),
    /// A binary upgrade asks the client to move (`handover.rs`).
    HandOver,
}

/// What one turn of the forwarding loop waits for.
struct Turn {
    /// A replay is under way: the client is not read, nor written to.
    replaying: bool,
    read_client: bool,
    read_server: bool,
    /// The idle timeout armed, and which one.
    idle: Option<(Duration, IdleKind)>,
    /// When `query_timeout` runs out, if armed.
    query_deadline: Option<tokio::time::Instant>,
    /// Notifications may go out.
    notify: bool,
}

impl Session {
    /// The forwarding loop. Reads and writes on both sockets are polled
    /// together, so Fulcrum never waits to write to one side while the
    /// other side waits for it to read (a pipelining client against a
    /// server busy answering). Each side is read only while what waits for
    /// the other stays under `FORWARD_WINDOW` (and a held client under its
    /// own limit): the sockets push back instead of Fulcrum buffering.
    pub(super) async fn forward(&mut self) -> Result<(), SessionError> {
        // Admin KILL (ends the session wherever it stands) and the drain
        // on SIGTERM: one watch, an atomic load per wake-up.
        let mut interrupts = self.id.entry.watcher();
        // Armed only while the client is quiet and a timeout is set; made
        // the first time it is armed, so a session whose cluster sets no
        // timeout carries no timer in its task (112 bytes each).
        let mut idle_sleep = SessionTimer::default();
        // Armed while the server owes an answer and `query_timeout` is set.
        let mut query_sleep = SessionTimer::default();
        loop {
            // A drain or an upgrade's hand-over: one load while neither is.
            if self.id.entry.leaving() && self.at_boundary() {
                // Moved to the new process: the client is its now, and
                // nothing more is said to it here.
                if self.id.entry.handing_over() && self.try_hand_over().await? {
                    return Err(SessionError::ClientGone);
                }
                if self.id.entry.draining() {
                    let msg =
                        "fulcrum: shutting down (SIGTERM); connect again to reach another instance";
                    return Err(self.fatal_client(sqlstate::ADMIN_SHUTDOWN, msg).await);
                }
            }
            // What was queued for the client joins the transaction's
            // checksum before any of it is written.
            self.absorb_output();
            let turn = self.arm_turn(&mut idle_sleep, &mut query_sleep);
            // One future polling each source in turn (what a biased
            // `select!` does, without its per-turn branch bookkeeping): a
            // timer or the notifications only when armed.
            let wake = std::future::poll_fn(|cx| {
                let (idle, query) = (&mut idle_sleep, &mut query_sleep);
                self.poll_wake(cx, &turn, &mut interrupts, idle, query)
            })
            .await;
            // A new wake-up: the stamps made handling it share one clock read.
            self.engine.new_wake();
            // The two wake-ups of every unit are handled here, with no
            // async layer between the loop and the handler.
            match wake {
                Wake::Io(Io::ClientRead(r)) => {
                    let n = r?;
                    if n == 0 {
                        return Err(SessionError::ClientGone);
                    }
                    self.ctx.metrics.bytes_in.inc_by(n as u64);
                    self.id.entry.counts.received(n as u64);
                    self.on_client_input().await?;
                }
                Wake::Io(Io::ServerRead(Ok(n))) if n > 0 => {
                    self.ctx.metrics.bytes_out.inc_by(n as u64);
                    self.id.entry.counts.sent(n as u64);
                    // Progress: `query_timeout` counts from the last of it.
                    self.timer.busy_since = None;
                    self.on_server_input().await?;
                    if self.server.is_none() {
                        // The server closed (a FATAL or shutdown notice):
                        // what Fulcrum answered in its place goes out now.
                        self.flush_client().await?;
                    }
                    // Work held back while a replica finished goes now.
                    if !self.client.read_buf.is_empty() {
                        self.on_client_input().await?;
                    }
                }
                Wake::Io(io) => self.on_io(io).await?,
                other => self.on_other_wake(other).await?,
            }
        }
    }

    /// What this turn reads and waits for; the idle and `query_timeout`
    /// timers are reset to their deadlines when armed.
    #[inline]
    fn arm_turn(&mut self, idle_sleep: &mut SessionTimer, query_sleep: &mut SessionTimer) -> Turn {
        let replaying = self.txn.run.is_some();
        let read_client = !replaying
            && self.to_server.len() < FORWARD_WINDOW
            && self
                .client
                .may_read(self.engine.unit().held, self.ctx.config.max_message_size);
        let read_server = self.client.write_buf.len() < FORWARD_WINDOW;
        let idle = self.idle_timeout();
        if let Some((limit, _)) = idle {
            idle_sleep.arm(tokio::time::Instant::now() + limit);
        }
        let query_deadline = self.query_deadline();
        if let Some(deadline) = query_deadline {
            query_sleep.arm(deadline);
        }
        // Notifications go out only when the client is owed nothing.
        let notify = !replaying && self.may_notify();
        Turn {
            replaying,
            read_client,
            read_server,
            idle,
            query_deadline,
            notify,
        }
    }

    /// Polls each source of a wake-up in turn, the first ready one winning.
    #[inline]
    fn poll_wake(
        &mut self,
        cx: &mut Context<'_>,
        turn: &Turn,
        interrupts: &mut Watcher,
        idle_sleep: &mut SessionTimer,
        query_sleep: &mut SessionTimer,
    ) -> Poll<Wake> {
        use std::task::Poll::Ready;
        // An interrupt first (an atomic load), so a stream that keeps
        // the sockets busy cannot hold off a KILL.
        if let Ready(i) = interrupts.poll(cx) {
            return Ready(match i {
                Interrupt::Killed => Wake::Killed,
                Interrupt::Drain => Wake::Shutdown,
                // The boundary check at the top of the loop moves it.
                Interrupt::HandOver => Wake::HandOver,
            });
        }
        let io = poll_io(
            cx,
            &mut self.client,
            self.server.as_mut(),
            &mut self.to_server,
            turn.read_client,
            turn.read_server,
            !turn.replaying,
        );
        if let Ready(io) = io {
            return Ready(Wake::Io(io));
        }
        if let Some((_, kind)) = turn.idle {
            if idle_sleep.poll_fired(cx) {
                return Ready(Wake::Idle(kind));
            }
        }
        if turn.query_deadline.is_some() && query_sleep.poll_fired(cx) {
            return Ready(Wake::QueryTimeout);
        }
        if turn.notify {
            if let Ready(n) = Session::poll_notification(&mut self.listen, cx) {
                return Ready(Wake::Notified(n));
            }
        }
        Poll::Pending
    }

    /// Progress on a socket other than the reads `forward` handles itself:
    /// a write done or failed (the server given up), a server that closed.
    async fn on_io(&mut self, io: Io) -> Result<(), SessionError> {
        match io {
            Io::ClientWrote(r) => {
                // The answer has started: a lost replica can no longer be hidden.
                self.engine.answered();
                r?;
            }
            Io::ServerWrote(Ok(_)) => {
                if self.to_server.is_empty() {
                    // Synthetic replies queued ahead of anything the
                    // server owes go out now.
                    self.owed.expect.drain_synthetic(
                        &mut self.client.write_buf,
                        status_byte(self.engine.status()),
                    );
                    self.flush_client().await?;
                }
            }
            Io::ServerWrote(Err(_)) => {
                self.to_server.clear();
                // Boxed: a rare path, kept out of every client's task.
                Box::pin(self.after_server_lost()).await?;
            }
            Io::ClientRead(_) => unreachable!("a client read is handled by forward"),
            Io::ServerRead(Ok(n)) if n > 0 => {
                unreachable!("a server read is handled by forward")
            }
            Io::ServerRead(_) => Box::pin(self.after_server_lost()).await?,
        }
        Ok(())
    }

    /// A wake-up not of the sockets: `query_timeout`, a notification, a
    /// KILL or idle timeout (which end the session), or the drain.
    async fn on_other_wake(&mut self, wake: Wake) -> Result<(), SessionError> {
        match wake {
            Wake::QueryTimeout => self.cancel_slow_query(),
            Wake::Notified(Some(frame)) => self.deliver(frame).await?,
            Wake::Notified(None) => self.listen = None,
            Wake::Killed => {
                tracing::info!(user = ?self.id.user, cluster = %self.ctx.name(), "client killed by an administrator");
                return Err(self
                    .fatal_client(
                        "57P01",
                        "terminating connection due to administrator command (fulcrum KILL)",
                    )
                    .await);
            }
            Wake::Idle(kind) => return Err(self.idle_too_long(kind).await),
            Wake::Shutdown => {
                // Close(Drained), now or at the next boundary: the
                // boundary check at the top of the loop performs it.
                let actions = self.engine.step(fulcrum_session::Event::Drain);
                self.carry_out_now(actions);
            }
            // Checked at the top of the loop, at a boundary.
            Wake::HandOver => {}
            Wake::Io(_) => unreachable!("socket progress goes to on_io"),
        }
        Ok(())
    }
}
