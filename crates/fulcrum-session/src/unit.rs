//! The unit of work in flight, as the engine knows it whatever the
//! protocol: whether it may write, whether it wrote on the primary (its
//! commit position is then learnt), whether a COMMIT is in flight (a lost
//! server then leaves the outcome unknown), when its server connection was
//! attached, the time as read once per wake-up (`Now`), and the copy of a replica read's client frames kept to send it
//! again elsewhere if the replica dies before answering.

use std::time::{Duration, Instant};

use fulcrum_pool::BackendId;

/// Most bytes of a replica read kept for a retry; a larger unit is not
/// retried.
pub const RETRY_MAX: usize = 1024 * 1024;

/// The unit in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unit {
    /// The routing decision said it may write.
    pub may_write: bool,
    /// It runs on the primary and may have written: its position is learnt
    /// when it ends (read-your-writes).
    pub wrote_on_primary: bool,
    /// A statement that may commit (COMMIT, END, COMMIT PREPARED, a write
    /// outside a transaction) was sent and not answered yet.
    pub commit_in_flight: bool,
    /// What the server said of the transaction whose COMMIT is in flight,
    /// asked just ahead of it: a new primary can then say whether it
    /// committed (`transaction_replay`; docs/failover.md).
    pub commit_id: CommitId,
    /// When its server connection was attached (latency, slow log).
    pub attached_at: Option<Instant>,
    /// When the command that needed a server connection arrived: the
    /// proxy's own time (`fulcrum_proxy_seconds`) runs from it until the
    /// command is written to the server.
    pub arrived_at: Option<Instant>,
    /// The time, read at most once per wake-up of the session: the unit's
    /// start, its attach, its digest stamps, and on the way back their
    /// finishes and the unit's end share one read each way.
    pub now: Now,
    /// The next unit needs another connection and waits, buffered, until
    /// the attached one has answered (the engine's `Hold`).
    pub held: bool,
    pub retry: Retry,
}

impl Unit {
    /// The unit's server connection was attached at `at` (the time of
    /// the wake-up that attached it, or the end of a checkout that waited).
    pub fn attached(&mut self, at: Instant) {
        self.attached_at = Some(at);
    }

    /// The unit is over: how long it held its connection (once), as of
    /// this wake-up.
    pub fn finished(&mut self) -> Option<std::time::Duration> {
        let at = self.attached_at.take()?;
        Some(self.now.since(at))
    }
}

/// The time as read once for one wake-up of a session (issue 28: one clock
/// read serves every stamp made while handling what arrived). A precise
/// read costs a `clock_gettime` (an `rdtsc` in a VM and its conversion);
/// a unit used to make eight.
///
/// It also keeps the last time span measured to it ([`since`](Self::since)):
/// a statement's digest stamp and its unit usually start at the same
/// wake-up and end at the same one, and an `Instant` subtraction costs
/// about 55 instructions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    at: Option<Instant>,
    since: Option<(Instant, Duration)>,
}

impl Now {
    /// A new wake-up: the next [`get`](Self::get) reads the clock.
    pub fn reset(&mut self) {
        *self = Now::default();
    }

    /// The time of this wake-up (read on first use).
    pub fn get(&mut self) -> Instant {
        *self.at.get_or_insert_with(Instant::now)
    }

    /// The time from `start` to this wake-up (0 if `start` is later).
    pub fn since(&mut self, start: Instant) -> Duration {
        match self.since {
            Some((s, took)) if s == start && self.at.is_some() => took,
            _ => {
                let took = self.get().saturating_duration_since(start);
                self.since = Some((start, took));
                took
            }
        }
    }

    /// A wait within the wake-up ended at `until` (when there was one, as
    /// `fulcrum_cluster::attach` reports it): later stamps use that time.
    pub fn waited(&mut self, until: Option<Instant>) {
        if until.is_some() {
            *self = Now {
                at: until,
                since: None,
            };
        }
    }
}

/// The identity of a committing transaction, as its server gave it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CommitId {
    /// Not asked, or not answered.
    #[default]
    Unknown,
    /// The transaction had no id: it wrote nothing, so whether its COMMIT
    /// ran changes nothing.
    NothingWritten,
    /// The server's id of the transaction (PostgreSQL: its 64-bit xid8).
    Id(u64),
}

/// A replica read that may be sent again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retry {
    /// The client frames sent so far (a protocol that keeps its own copy
    /// leaves this empty).
    frames: Vec<u8>,
    armed: bool,
    /// Where the client's output stood when the unit was attached: replies
    /// before it stay when the unit is sent again.
    client_mark: usize,
    /// The unit is being sent again, avoiding this backend (no second retry).
    again: Option<BackendId>,
}

impl Retry {
    /// A unit was attached: it may be retried when `eligible` (a read on a
    /// replica outside a transaction) and it is not a retry itself.
    pub fn arm(&mut self, eligible: bool, client_mark: usize) {
        self.frames.clear();
        self.armed = eligible && self.again.is_none();
        self.client_mark = client_mark;
    }

    /// Keeps a client frame of the armed unit; past `RETRY_MAX` the unit is
    /// no longer retried.
    pub fn keep(&mut self, frame: &[u8]) {
        if !self.armed {
            return;
        }
        if self.frames.len() + frame.len() <= RETRY_MAX {
            self.frames.extend_from_slice(frame);
        } else {
            self.disarm();
        }
    }

    /// Its answer has started (or the unit is over): a lost replica can no
    /// longer be hidden.
    pub fn disarm(&mut self) {
        self.armed = false;
        self.frames.clear();
    }

    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Armed with frames kept.
    pub fn has_frames(&self) -> bool {
        self.armed && !self.frames.is_empty()
    }

    /// Sends the unit again, avoiding `dead`: the frames to send and where
    /// the client's output is cut back to.
    pub fn take(&mut self, dead: BackendId) -> (Vec<u8>, usize) {
        self.armed = false;
        self.again = Some(dead);
        (std::mem::take(&mut self.frames), self.client_mark)
    }

    /// The retry was sent.
    pub fn done(&mut self) {
        self.again = None;
    }

    /// The backend a unit being retried must not go back to.
    pub fn avoid(&self) -> Option<BackendId> {
        self.again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_read_keeps_its_frames_until_it_is_answered() {
        let mut r = Retry::default();
        r.arm(true, 3);
        r.keep(b"Q....");
        assert!(r.has_frames());
        let (frames, mark) = r.take(2);
        assert_eq!((frames.as_slice(), mark), (&b"Q...."[..], 3));
        assert_eq!(r.avoid(), Some(2));
        r.arm(true, 0);
        assert!(!r.armed(), "a retry is not retried again");
        r.done();
        r.arm(true, 0);
        r.keep(b"x");
        r.disarm();
        assert!(!r.has_frames());
    }

    #[test]
    fn a_unit_too_large_to_keep_is_not_retried() {
        let mut r = Retry::default();
        r.arm(true, 0);
        r.keep(&vec![0; RETRY_MAX]);
        assert!(r.has_frames());
        r.keep(b"one more");
        assert!(!r.armed());
        r.arm(false, 0);
        r.keep(b"Q");
        assert!(!r.has_frames(), "not eligible: nothing kept");
    }

    #[test]
    fn a_span_measured_twice_in_one_wake_up_is_the_same_and_a_new_wake_up_measures_again() {
        let start = Instant::now();
        let mut now = Now::default();
        let took = now.since(start);
        assert_eq!(now.since(start), took, "the same wake-up, the same span");
        let later = start + Duration::from_millis(5);
        assert_eq!(now.since(later), now.get().saturating_duration_since(later));
        // A wait that ended later moves the wake-up's time, and the span.
        now.waited(Some(start + Duration::from_secs(1)));
        assert_eq!(now.since(start), Duration::from_secs(1));
        now.reset();
        std::thread::sleep(Duration::from_millis(2));
        assert!(now.since(start) < Duration::from_secs(1), "read anew");
    }
}
