//! The unit in flight as the engine keeps it: the front ends tell it what
//! happened to the unit (routed, attached, a COMMIT sent or answered, its
//! transaction's id learnt, its answer started, its server lost) through
//! these methods, and read it through [`Engine::unit`]; they never write
//! its fields. Each method is one event, so what a unit knows changes in
//! one place and is unit-tested here.

use std::time::{Duration, Instant};

use fulcrum_pool::BackendId;

use super::Engine;
use crate::route::Routing;
use crate::unit::{CommitId, Unit};

impl Engine {
    /// The unit in flight, read-only.
    pub fn unit(&self) -> &Unit {
        &self.unit
    }

    /// The engine with whether the unit before any routing may write
    /// (PostgreSQL counts its login's connection as one that may; MySQL
    /// does not).
    pub fn with_may_write(mut self, may_write: bool) -> Engine {
        self.unit.may_write = may_write;
        self
    }

    /// The time of this wake-up (the clock is read on first use).
    pub fn now(&mut self) -> Instant {
        self.unit.now.get()
    }

    /// The time from `start` to this wake-up: computed once for a digest
    /// stamp and its unit, which start and end together.
    pub fn since(&mut self, start: Instant) -> Duration {
        self.unit.now.since(start)
    }

    /// A new wake-up of the session (or the end of a wait within one): the
    /// next [`now`](Self::now) reads the clock again.
    pub fn new_wake(&mut self) {
        self.unit.now.reset();
    }

    /// A command that needs a server connection arrived: the proxy's own
    /// time (`fulcrum_proxy_seconds`) runs from now.
    pub fn arrived(&mut self) {
        self.unit.arrived_at = Some(self.unit.now.get());
    }

    /// The command was written to its server: when it had arrived, if the
    /// proxy's time is still to be observed (once).
    pub fn forwarded(&mut self) -> Option<Instant> {
        self.unit.arrived_at.take()
    }

    /// `route::decide` placed the unit: whether it may write.
    pub fn routed(&mut self, routing: &Routing) {
        self.unit.may_write = routing.may_write;
    }

    /// The unit's server connection was attached, from the primary or not,
    /// after a wait that ended at `waited_until` (if there was one): a unit
    /// that may write on the primary has its position learnt when it ends.
    pub fn attached(&mut self, on_primary: bool, waited_until: Option<Instant>) {
        self.unit.wrote_on_primary = on_primary && self.unit.may_write;
        self.unit.now.waited(waited_until);
        let now = self.unit.now.get();
        self.unit.attached(now);
    }

    /// A replay's connection to the new primary was attached, after waiting
    /// for it: the replayed transaction writes there.
    pub fn replay_attached(&mut self) {
        self.unit.now.reset();
        let now = self.unit.now.get();
        self.unit.attached(now);
        self.unit.wrote_on_primary = true;
    }

    /// A unit rides along on the primary connection held for Fulcrum's
    /// position query (`Settling`): it counts as a unit from now, and may
    /// write (its routing's `may_write`). Returns the time of the wake-up.
    pub fn rides_along(&mut self, may_write: bool) -> Instant {
        self.unit.wrote_on_primary = may_write;
        let now = self.unit.now.get();
        if self.unit.attached_at.is_none() {
            self.unit.attached(now);
        }
        now
    }

    /// Whether the next unit waits, buffered, until the attached connection
    /// has answered (the engine's `Hold` was asked and a connection is
    /// attached).
    pub fn holding(&mut self, held: bool) {
        self.unit.held = held;
    }

    /// A transaction is open on the primary: it may write.
    pub fn txn_on_primary(&mut self) {
        self.unit.wrote_on_primary = true;
    }

    /// The unit that may have written on the primary is over: its position
    /// is learnt now (or not needed), once.
    pub fn write_over(&mut self) {
        self.unit.wrote_on_primary = false;
    }

    /// A statement that may commit (COMMIT, END, COMMIT PREPARED, a write
    /// outside a transaction) is sent.
    pub fn commit_sent(&mut self) {
        self.unit.commit_in_flight = true;
    }

    /// A command is about to be sent that may commit or not (MySQL decides
    /// it per command).
    pub fn sending(&mut self, may_commit: bool) {
        self.unit.commit_in_flight = may_commit;
    }

    /// What was in flight was answered: its outcome is known.
    pub fn commit_answered(&mut self) {
        self.unit.commit_in_flight = false;
    }

    /// The server died: whether a COMMIT was in flight (it no longer is).
    pub fn commit_lost(&mut self) -> bool {
        std::mem::take(&mut self.unit.commit_in_flight)
    }

    /// Fulcrum asked the server for the open transaction's id: unknown
    /// until it answers.
    pub fn commit_id_asked(&mut self) {
        self.unit.commit_id = CommitId::Unknown;
    }

    /// The server said what the open transaction's id is.
    pub fn commit_id_learnt(&mut self, id: CommitId) {
        self.unit.commit_id = id;
    }

    /// The transaction is over: its id with it.
    pub fn txn_ended(&mut self) {
        self.unit.commit_id = CommitId::Unknown;
    }

    /// The COMMIT in flight is being resolved on a new primary: its
    /// transaction's id, taken.
    pub fn resolving_commit(&mut self) -> CommitId {
        std::mem::take(&mut self.unit.commit_id)
    }

    /// The unit was attached: it may be sent again elsewhere when
    /// `eligible` (a read on a replica outside a transaction) and it is not
    /// a retry itself; `client_mark` is where the client's output stood.
    pub fn may_retry(&mut self, eligible: bool, client_mark: usize) {
        self.unit.retry.arm(eligible, client_mark);
    }

    /// A client frame of the unit goes to the server (kept while the unit
    /// may be retried).
    pub fn unit_frame(&mut self, frame: &[u8]) {
        self.unit.retry.keep(frame);
    }

    /// The unit's answer has started (or the unit is over): a lost server
    /// can no longer be hidden by sending the unit again.
    pub fn answered(&mut self) {
        self.unit.retry.disarm();
    }

    /// The replica `dead` died before answering: the unit is sent again,
    /// avoiding it. The frames to send and where the client's output is cut
    /// back to.
    pub fn retry_elsewhere(&mut self, dead: BackendId) -> (Vec<u8>, usize) {
        self.unit.retry.take(dead)
    }

    /// The retry was sent (or failed to attach): the next unit may go
    /// anywhere.
    pub fn retry_sent(&mut self) {
        self.unit.retry.done();
    }

    /// The unit's server connection is gone (died, or given up): nothing
    /// of it to time, and nothing to send again.
    pub fn connection_lost(&mut self) {
        self.unit.attached_at = None;
        self.unit.retry.disarm();
    }

    /// The unit is settled without its server (answered as failed, replayed
    /// elsewhere, or its COMMIT confirmed by a new primary): no COMMIT in
    /// flight, no transaction id, no connection to time, nothing to retry.
    pub fn unit_lost(&mut self) {
        self.unit.commit_in_flight = false;
        self.unit.commit_id = CommitId::Unknown;
        self.connection_lost();
    }

    /// The unit is over: how long it held its connection (once), as of
    /// this wake-up.
    pub fn unit_over(&mut self) -> Option<Duration> {
        self.unit.finished()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Phase;

    fn routing(may_write: bool) -> Routing {
        let mut f = crate::route::Facts::idle(if may_write {
            fulcrum_sql::Decision::Write
        } else {
            fulcrum_sql::Decision::Read
        });
        f.attached = false;
        let r = crate::route::decide(&f);
        assert_eq!(r.may_write, may_write);
        r
    }

    #[test]
    fn a_unit_wrote_on_the_primary_only_if_it_may_write_and_went_there() {
        let mut e = Engine::new(None);
        e.routed(&routing(true));
        e.attached(true, None);
        assert!(e.unit().wrote_on_primary);
        assert!(e.unit().attached_at.is_some());
        e.routed(&routing(false));
        e.attached(true, None);
        assert!(!e.unit().wrote_on_primary, "a read writes nothing");
        e.routed(&routing(true));
        e.attached(false, None);
        assert!(!e.unit().wrote_on_primary, "not on the primary");
        e.write_over();
        e.txn_on_primary();
        assert!(e.unit().wrote_on_primary);
        e.write_over();
        assert!(!e.unit().wrote_on_primary);
    }

    #[test]
    fn an_attach_after_a_wait_is_stamped_when_the_wait_ended() {
        let mut e = Engine::new(None);
        let before = e.now();
        let until = before + Duration::from_millis(50);
        e.attached(true, Some(until));
        assert_eq!(e.unit().attached_at, Some(until));
        assert_eq!(e.now(), until, "later stamps use the wait's end");
        assert_eq!(e.unit_over(), Some(Duration::ZERO));
        assert_eq!(e.unit_over(), None, "a unit ends once");
    }

    #[test]
    fn a_replay_attaches_on_a_new_wake_and_writes_on_the_primary() {
        let mut e = Engine::new(None).with_may_write(false);
        let before = e.now();
        std::thread::sleep(Duration::from_millis(2));
        e.replay_attached();
        assert!(e.unit().wrote_on_primary);
        assert!(e.unit().attached_at.is_some_and(|at| at > before));
    }

    #[test]
    fn a_unit_riding_along_keeps_the_first_attach_time() {
        let mut e = Engine::new(None);
        e.attached(true, None);
        let at = e.unit().attached_at;
        e.new_wake();
        std::thread::sleep(Duration::from_millis(2));
        let now = e.rides_along(false);
        assert!(now > at.unwrap());
        assert_eq!(e.unit().attached_at, at, "still attached since then");
        assert!(!e.unit().wrote_on_primary);
        let _ = e.unit_over();
        assert_eq!(e.rides_along(true), now, "the same wake-up");
        assert_eq!(e.unit().attached_at, Some(now));
        assert!(e.unit().wrote_on_primary);
    }

    #[test]
    fn commit_facts_follow_their_events() {
        let mut e = Engine::new(None);
        e.commit_sent();
        assert!(e.unit().commit_in_flight);
        e.commit_answered();
        assert!(!e.unit().commit_in_flight);
        e.sending(true);
        assert!(e.commit_lost());
        assert!(!e.commit_lost(), "taken");
        e.commit_id_learnt(CommitId::Id(7));
        assert_eq!(e.resolving_commit(), CommitId::Id(7));
        assert_eq!(e.unit().commit_id, CommitId::Unknown, "taken");
        e.commit_id_learnt(CommitId::NothingWritten);
        e.txn_ended();
        assert_eq!(e.unit().commit_id, CommitId::Unknown);
        e.commit_id_learnt(CommitId::Id(8));
        e.commit_id_asked();
        assert_eq!(e.unit().commit_id, CommitId::Unknown);
    }

    #[test]
    fn a_lost_unit_forgets_its_commit_its_connection_and_its_retry() {
        let mut e = Engine::new(None);
        e.attached(false, None);
        e.may_retry(true, 0);
        e.unit_frame(b"Q...");
        e.commit_sent();
        e.commit_id_learnt(CommitId::Id(3));
        e.unit_lost();
        let u = e.unit();
        assert!(!u.commit_in_flight && u.attached_at.is_none() && !u.retry.armed());
        assert_eq!(u.commit_id, CommitId::Unknown);
        assert_eq!(e.phase(), Phase::Idle, "the phase is the transitions'");

        e.attached(false, None);
        e.may_retry(true, 0);
        e.commit_sent();
        e.connection_lost();
        let u = e.unit();
        assert!(u.attached_at.is_none() && !u.retry.armed());
        assert!(u.commit_in_flight, "only the connection is forgotten");
    }

    #[test]
    fn a_retry_is_sent_once_avoiding_the_dead_replica() {
        let mut e = Engine::new(None);
        e.may_retry(true, 4);
        e.unit_frame(b"Q....");
        assert!(e.unit().retry.has_frames());
        assert_eq!(e.retry_elsewhere(2), (b"Q....".to_vec(), 4));
        assert_eq!(e.unit().retry.avoid(), Some(2));
        e.may_retry(true, 0);
        assert!(!e.unit().retry.armed(), "a retry is not retried");
        e.retry_sent();
        assert_eq!(e.unit().retry.avoid(), None);
        e.may_retry(true, 0);
        e.unit_frame(b"x");
        e.answered();
        assert!(!e.unit().retry.has_frames(), "its answer started");
        e.holding(true);
        assert!(e.unit().held);
    }

    #[test]
    fn the_proxy_time_is_observed_once_per_arrival() {
        let mut e = Engine::new(None);
        assert_eq!(e.forwarded(), None);
        let now = e.now();
        e.arrived();
        assert_eq!(e.forwarded(), Some(now));
        assert_eq!(e.forwarded(), None);
    }
}
