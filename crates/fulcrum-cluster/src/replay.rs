//! Driving a transaction replay (`transaction_replay`), written once for
//! both protocols. The engine keeps the transaction's log and checksum
//! (`fulcrum_session::TxnLog`); this is the run that follows a lost
//! server: it starts from the log, marks where the client's output stood,
//! waits for a primary to take it ([`attach_primary`], through the
//! protocol's `Checkouts`), compares the replayed output with what the
//! client received and drops it ([`ReplayRun::progress`]), and ends by
//! matching (the client goes on) or failing (the client gets the error it
//! would have got without replay), counted in the metrics and logged.
//!
//! The protocol keeps only what is about its bytes: which client frames
//! start and spoil a transaction, how to send the frames again through its
//! own path, and its error for a failed replay. What it must restore on
//! failure (PostgreSQL's pipelined input, MySQL's sequence id) rides in
//! the run as `lost`.

use bytes::BytesMut;
use fulcrum_net::Connection;
use fulcrum_pool::{BackendId, PrimaryWait};
use fulcrum_session::{Compare, Engine, Replay};
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

/// Feeds what was queued for the client since the last call to the open
/// transaction's checksum (before it can be written). Nothing while a
/// replay runs: its output is compared, not absorbed.
pub fn absorb_output<S: AsyncRead + AsyncWrite + Unpin>(
    engine: &mut Engine,
    replaying: bool,
    client: &Connection<S>,
) {
    if !replaying && engine.txn_log.is_open() {
        let position = client.output_position();
        engine.txn_log.absorb(&client.write_buf, position);
    }
}

impl<X> ReplayRun<X> {
    /// Starts replaying the logged transaction of `engine` (its output so
    /// far absorbed first), with `transaction_replay_timeout` to finish.
    pub fn start<C, P, Sc, S: AsyncRead + AsyncWrite + Unpin>(
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        client: &Connection<S>,
        lost: X,
    ) -> ReplayRun<X> {
        absorb_output(engine, false, client);
        let replay = engine.txn_log.start_replay(client.output_position());
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

    /// When the replay gives up waiting for a primary.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// Still within `transaction_replay_timeout`.
    pub fn live(&self) -> bool {
        tokio::time::Instant::now() < self.deadline
    }

    /// The replay's own server died: the comparison starts over, its
    /// output so far dropped, and the log follows the new attempt.
    /// `started`: the attempt starts with the transaction already begun.
    pub fn restart<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        engine: &mut Engine,
        client: &mut Connection<S>,
        started: bool,
    ) {
        tracing::info!("the replay's server was lost too; replaying again");
        self.replay.restart();
        client.write_buf.truncate(self.mark);
        let position = client.output_position();
        engine.txn_log.restart(position, &self.replay, started);
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

    /// The replay matched: the log follows it, and the client goes on (the
    /// protocol tells the engine `Event::Replayed` and carries out what it
    /// asks).
    pub fn matched<C, P, Sc>(
        self,
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        backend: BackendId,
    ) -> X {
        engine.txn_log.replayed(&self.replay);
        core.metrics.transaction_replay("replayed");
        tracing::info!(server = %core.address(backend), "transaction replayed; its answers matched what the client had received");
        self.lost
    }

    /// The replay cannot finish: its output is dropped and the log closed;
    /// the protocol answers the client (the engine's `ReplayFailed` step
    /// is the protocol's, with its answer).
    pub fn failed<C, P, Sc, S: AsyncRead + AsyncWrite + Unpin>(
        self,
        core: &ClusterCore<C, P, Sc>,
        engine: &mut Engine,
        client: &mut Connection<S>,
        why: &str,
    ) -> X {
        tracing::warn!(cluster = %core.config.name, %why, "transaction replay failed");
        core.metrics.transaction_replay("failed");
        client.write_buf.truncate(self.mark);
        engine.txn_log.close();
        self.lost
    }
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
