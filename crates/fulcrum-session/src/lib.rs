//! Fulcrum's session engine, shared by the PostgreSQL and MySQL front ends.
//!
//! It owns, for one client, what does not depend on a wire protocol:
//! - `route`: the one routing decision of a unit of work (classification,
//!   transaction state, pin, consistency, `default_route`) and the one
//!   `Route` type it yields (`fulcrum_pool::Route`, which the router serves);
//! - `state`: the client's life between units as an explicit `Phase`,
//!   moved by `Engine::step`, the transition table: which events attach
//!   and detach a server connection, pin, hold a unit, retry a replica
//!   read, answer a lost transaction (08006 / 08007, with why Fulcrum gave
//!   the connection up: `Engine::take_lost_because`), clean a connection,
//!   drain; and by `Engine::defer`, which moves `Idle` and `Deferred` for
//!   the transaction control Fulcrum answers itself (`txn`);
//! - `replay`: the bounded copy of an open transaction and the checksum of
//!   what its client received, for `transaction_replay`, held by the
//!   `Engine` and changed only through its events (`state/log_events.rs`);
//! - `txn`: transaction control Fulcrum answers itself (a lone `BEGIN`,
//!   `SET TRANSACTION`, the `COMMIT` of an empty transaction);
//! - `unit`: the unit in flight (may write, wrote on the primary, commit in
//!   flight, attach time, held, the replica-read retry copy), held by the
//!   `Engine` and changed only through its events (`state/unit_events.rs`);
//!   the front ends read it through `Engine::unit`;
//! - `cache_txn`: whether a transaction open on a server may be answered
//!   from the result cache (its isolation proven READ COMMITTED, nothing
//!   written in it yet), for MySQL, whose BEGIN goes to the server;
//! - `reads`: read consistency, its steps written once and generic over
//!   the protocol's positions and replica probe.
//!
//! It never touches a socket: the front ends read their protocol, classify
//! with `fulcrum-sql`, feed events in and perform the actions that come
//! out. It is handed bytes to keep or checksum, not to read (a unit's
//! client frames for a retry, an open transaction's for a replay, the
//! client's queued output for the replay checksum). It knows one thing of
//! a wire, behind a choice the front end makes: `replay::Framing`
//! (PostgreSQL's frame header, to leave `ParameterStatus` out of the
//! replay checksum). It reads SQL text in three places: `txn` (a lone
//! transaction-control statement, whether a statement may commit),
//! `reads` (a unit's `fulcrum:` consistency hint) and `cache_txn` (the
//! isolation level a statement names). `reads::Reads::check` awaits only
//! what the front end hands it (its `ReplicaProbe`, and the primary's
//! position under `strong`); everything else is synchronous, so every
//! rule is a unit test without a server.

#![forbid(unsafe_code)]

pub mod cache_txn;
pub mod reads;
pub mod replay;
pub mod route;
pub mod state;
pub mod txn;
pub mod unit;

pub use fulcrum_pool::Route;
pub use reads::{Check, Positions, Reads, ReplicaProbe, SettingAnswer, Shared};
pub use replay::{Compare, Framing, Replay, TxnLog};
pub use route::{decide, Facts, Routing, Target, Txn};
pub use state::{
    Action, Actions, Ending, Engine, Event, Loss, Outcome, Owed, Phase, Resolution, Status,
    SESSION_POOL,
};
pub use unit::{CommitId, Now, Retry, Unit};
