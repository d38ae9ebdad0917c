//! Transaction replay (`transaction_replay = true`) on real PostgreSQL
//! clusters whose primary is killed: open transactions (idle, with a
//! statement in flight, through prepared statements) go on on the promoted
//! replica with no error and every row they wrote; one whose rows another
//! client changed meanwhile is caught by the checksum and fails as without
//! replay; a COMMIT in flight at the kill is resolved on the new primary
//! (confirmed when it committed, replayed when it did not); pgbench TPC-B
//! through ten kills gets no error and loses nothing acknowledged.
//!
//! Each test kills its own cluster's primary; they run one at a time (a
//! lock, shared with the binary's other tests that kill servers:
//! `fulcrum_suite::serial`) so failover timings are not distorted on a
//! small machine.
//!
//! Split by theme: `open_transactions` (transactions left open across a
//! primary kill, a primary that comes back late, a switchover), `commits`
//! (pgbench through repeated kills, commits in flight replayed or
//! confirmed) and `replay_lost` (a replay whose own server is lost with a
//! statement that may commit in flight: 08007); shared configs and probes
//! in `helpers`.

mod commits;
mod helpers;
mod open_transactions;
mod replay_lost;
