//! Protocol-neutral pooling and backend selection: the pools (`pool`, with
//! their budgets, `budget`), the router that answers "which backend serves
//! this route" under a balancing policy (`router`, `balance`), waiting for a
//! primary during a failover (`primary_wait`), and the read-your-writes
//! bookkeeping positions are kept in (`causal`, `coalesce`), and which
//! worker event loop a thread is, so pools keep connections on the loop
//! that opened them (`worker`); `coarse` is the clock the data path reads
//! for deadlines and idle checks; `servers` lists each open server
//! connection for the admin console. It knows no
//! wire protocol and no SQL: a pooled connection is any `Poolable` value,
//! and a position any value the protocol can order.

#![forbid(unsafe_code)]

pub mod balance;
pub mod budget;
pub mod causal;
pub mod coalesce;
pub mod coarse;
pub mod pool;
pub mod primary_wait;
pub mod router;
pub mod servers;
pub mod worker;

pub use balance::Balance;
pub use budget::{Budget, Budgets};
pub use causal::{when_behind, when_behind_now, Causal, Need, UserNeed, UserPositions, WhenBehind};
pub use coalesce::Coalesced;
pub use pool::{CheckHook, Checkout, Pool, PoolError, PoolSettings, PoolStats, Poolable};
pub use primary_wait::PrimaryWait;
pub use router::{Admission, BackendId, Route, Router};
pub use servers::{PoolLabels, ServerIdentity, ServerRow, ServerState};
