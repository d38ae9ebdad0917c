//! Driving a transaction replay (`transaction_replay`), written once for
//! both protocols. The engine keeps the transaction's log and checksum
//! (`fulcrum_session::TxnLog`); this is the run that follows a lost
//! server: it starts from the log, marks where the client's output stood,
//! waits for a primary to take it ([`attach_replay`], through the
//! protocol's `Checkouts`), compares the replayed output with what the
//! client received and drops it ([`ReplayRun::progress`]), and ends by
//! matching (the client goes on) or failing (the client gets the error it
//! would have got without replay), counted in the metrics and logged.
//!
//! Written here too, so each protocol's orchestration is only its own
//! part: whether a transaction is replayable now ([`replayable`]), each
//! attempt's start or start-over with the lost unit forgotten
//! ([`ReplayRun::attempt`]), the engine told of the attached primary
//! (`replay_attached`), and its `Replayed` / `ReplayFailed` steps (the
//! [`ReplayRun::matched`] / [`ReplayRun::failed`] ends return the actions
//! for the protocol to carry out; [`ReplayRun::lost_server`] ends a run
//! whose engine already left `Replaying` with its server's loss).
//!
//! The protocol keeps only what is about its bytes: which client frames
//! start and spoil a transaction, how to send the frames again through its
//! own path, what of its session an attempt resets, and its error for a
//! failed replay. What it must restore on failure (PostgreSQL's pipelined
//! input, MySQL's sequence id) rides in the run as `lost`.

use bytes::BytesMut;
use fulcrum_net::Connection;
use fulcrum_pool::{BackendId, Checkout, PrimaryWait};
use fulcrum_session::{Actions, Compare, Engine, Event, Replay};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::attach::{Checkouts, Failure};
use crate::context::ClusterCore;

/// A replay under way.
pub struct ReplayRun<X> {
    pub replay: Replay,
    /// The client's `write_buf` length when it started: before it, what
    /// the client was owed already; after it, replayed output being
    /// compared and dropped.
    mark: usize,
    deadline: tokio::time::Instant,
    /// What the protocol restores when the replay ends.
    pub lost: X,
}

/// Where a replay stands after its output was compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Matching so far: the output was taken; the client must not be
    /// written to yet.
    Held,
    /// Everything the client had received was replayed identically: what
    /// followed it is in the client's buffer, to be written.
    Matched,
    /// The replayed answers differ.
    Differs,
}

/// Why a replay failed, in the words both protocols log and tell: no
/// primary in time, or the new primary owing nothing more before the
/// client's answers were all replayed.
pub const NO_PRIMARY: &str = "no primary took it within transaction_replay_timeout";
pub const ANSWERED_LESS: &str = "the replayed transaction answered less than before";

/// The open transaction can be replayed if its server dies now: a run
/// under way while its time lasts; otherwise a replayable log of a client
/// that is not pinned, and `extra` (the protocol's own conditions).
pub fn replayable<X>(run: Option<&ReplayRun<X>>, engine: &Engine, extra: bool) -> bool {
    match run {
        Some(run) => run.live(),
        None => engine.replayable_log() && engine.pinned().is_none() && extra,
    }
}

/// A protocol session as a replay's wait for a primary borrows it: its
/// checkouts and its engine.
pub trait ReplaySession: Checkouts {
    fn engine(&mut self) -> &mut Engine;
}

/// Feeds what was queued for the client since the last call to the open
/// transaction's checksum (before it can be written). Nothing while a
/// replay runs: its output is compared, not absorbed.
pub fn absorb_output<S: AsyncRead + AsyncWrite + Unpin>(
    engine: &mut Engine,
    replaying: bool,
    client: &Connection<S>,
) {
    if !replaying && engine.log_open() {
        let position = client.output_position();
        engine.output_absorbed(&client.write_buf, position);
    }
}

impl<X> ReplayRun<X> {
    /// The engine said Replay (or an attempt's own server was lost): the
    /// first time, the logged transaction becomes the run in `slot`
    /// (`lost`: what the protocol restores when it ends, taken from the
    /// client connection before anything else); after that, the run starts
    /// over ([`restart`](Self::restart), `started` as there). Either way
    /// the lost unit is forgotten (the transaction gets a new id where it
    /// is replayed). Returns when the run gives up waiting for a primary.
    pub fn attempt<C, P, Sc, S: AsyncRead + AsyncWrite + Unpin>(
        slot: &mut Option<Box<ReplayRun<X>>>,
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        client: &mut Connection<S>,
        started: bool,
        lost: impl FnOnce(&mut Connection<S>) -> X,
    ) -> tokio::time::Instant {
        let deadline = match slot {
            Some(run) => {
                run.restart(engine, client, started);
                run.deadline
            }
            None => {
                let lost = lost(client);
                let run = ReplayRun::start(core, engine, client, lost);
                slot.insert(Box::new(run)).deadline
            }
        };
        engine.unit_lost();
        deadline
    }

    /// Starts replaying the logged transaction of `engine` (its output so
    /// far absorbed first), with `transaction_replay_timeout` to finish.
    fn start<C, P, Sc, S: AsyncRead + AsyncWrite + Unpin>(
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        client: &Connection<S>,
        lost: X,
    ) -> ReplayRun<X> {
        absorb_output(engine, false, client);
        let replay = engine.replay_started(client.output_position());
        let timeout = core
            .config
            .transaction_replay
            .map(|l| l.timeout)
            .unwrap_or_default();
        tracing::info!(
            cluster = %core.config.name,
            bytes = replay.frames.len(),
            "server lost in a transaction; replaying it on the primary (transaction_replay)"
        );
        ReplayRun {
            replay,
            mark: client.write_buf.len(),
            deadline: tokio::time::Instant::now() + timeout,
            lost,
        }
    }

    /// Still within `transaction_replay_timeout`.
    pub fn live(&self) -> bool {
        tokio::time::Instant::now() < self.deadline
    }

    /// The replay's own server died: the comparison starts over, its
    /// output so far dropped, and the log follows the new attempt.
    /// `started`: the attempt starts with the transaction already begun.
    fn restart<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        engine: &mut Engine,
        client: &mut Connection<S>,
        started: bool,
    ) {
        tracing::info!("the replay's server was lost too; replaying again");
        self.replay.restart();
        client.write_buf.truncate(self.mark);
        let position = client.output_position();
        engine.replay_restarted(position, &self.replay, started);
    }

    /// Compares the replayed output queued since the last call and drops
    /// it; on a match, what followed the replayed part stays queued.
    pub fn progress(&mut self, out: &mut BytesMut) -> Progress {
        let new = out.split_off(self.mark);
        match self.replay.compare(&new) {
            Compare::More => Progress::Held,
            Compare::Matched { taken } => {
                out.extend_from_slice(&new[taken..]);
                Progress::Matched
            }
            Compare::Differs => Progress::Differs,
        }
    }

    /// The replayed answers read "differently than before" (`functions`:
    /// the protocol's words for what changes from run to run), and where.
    pub fn differs(&self, functions: &str) -> String {
        format!(
            "the replayed transaction answered differently than before (a row changed, or {functions} in it): {}",
            self.replay.difference()
        )
    }

    /// The replay matched: the log follows it, and the client goes on; the
    /// engine has stepped `Event::Replayed`, and the protocol carries out
    /// the actions returned.
    pub fn matched<C, P, Sc>(
        self,
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        backend: BackendId,
    ) -> (X, Actions) {
        engine.replay_matched(&self.replay);
        core.metrics.transaction_replay("replayed");
        tracing::info!(server = %core.address(backend), "transaction replayed; its answers matched what the client had received");
        (self.lost, engine.step(Event::Replayed))
    }

    /// The replay cannot finish: its output is dropped, the log closed and
    /// its server connection (`server`) closed, which rolls the replayed
    /// statements back; the engine has stepped `Event::ReplayFailed` (the
    /// transaction lost), and the protocol answers the client and carries
    /// out the actions returned.
    pub fn failed<C, P, Sc, S: AsyncRead + AsyncWrite + Unpin, Sv>(
        self,
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        client: &mut Connection<S>,
        server: Option<Checkout<Sv>>,
        why: &str,
    ) -> (X, Actions) {
        let lost = self.lost_server(core, engine, client, why);
        if let Some(server) = server {
            server.discard();
        }
        (lost, engine.step(Event::ReplayFailed))
    }

    /// The replay's own server was lost and the engine left `Replaying`
    /// with that loss (a replayed statement that may commit was in flight:
    /// its `ServerLost` step went to `Lost` and asked `Fail(Unknown)`). The
    /// run ends as a failed one does (its output dropped, the log closed)
    /// but with no `ReplayFailed` step: the engine has settled the loss, and
    /// the protocol restores `lost` before carrying out that step's actions,
    /// so the client is answered once, from where it stood.
    pub fn lost_server<C, P, Sc, S: AsyncRead + AsyncWrite + Unpin>(
        self,
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        client: &mut Connection<S>,
        why: &str,
    ) -> X {
        tracing::warn!(cluster = %core.config.name, %why, "transaction replay failed");
        core.metrics.transaction_replay("failed");
        client.write_buf.truncate(self.mark);
        engine.log_closed();
        self.lost
    }
}

/// A replay attempt's connection to the primary ([`attach_primary`]), the
/// engine told it is attached (the clock read again after the wait);
/// `None`: none before `deadline`.
pub async fn attach_replay<K: ReplaySession, C, P, Sc>(
    core: &ClusterCore<C, P, Sc>,
    deadline: tokio::time::Instant,
    k: &mut K,
) -> Option<(BackendId, K::Conn)> {
    let attached = attach_primary(core, deadline, k).await?;
    k.engine().replay_attached();
    Some(attached)
}

/// A connection to whatever primary there is before `deadline` (the dead
/// one is suspect, so the health loop looks at it at once), checked out
/// by the protocol; `None`: none in time. A primary that cannot take it
/// yet is tried again as the wait allows.
pub async fn attach_primary<K: Checkouts, C, P, Sc>(
    core: &ClusterCore<C, P, Sc>,
    deadline: tokio::time::Instant,
    k: &mut K,
) -> Option<(BackendId, K::Conn)> {
    let mut primaries = PrimaryWait::new(&core.router, deadline, true);
    while let Some((primary, _admission)) = primaries.next().await {
        match k.checkout(primary).await {
            Ok(conn) => return Some((primary, conn)),
            Err(e) => {
                let why = match k.failure(primary, &e, true) {
                    Failure::Down(why) | Failure::Refused(why) => why,
                    Failure::Other => format!(
                        "the primary {} cannot take the replay yet",
                        core.address(primary)
                    ),
                };
                tracing::debug!(error = %why, "replay: the primary cannot take it yet");
                primaries.down(primary, why);
            }
        }
    }
    None
}
