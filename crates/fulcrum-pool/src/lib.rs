//! Protocol-neutral pooling and backend selection. Knows nothing about wire
//! protocols: a pooled connection is any `Poolable` value, and the router only
//! answers "which backend serves this route".

#![forbid(unsafe_code)]

pub mod balance;
pub mod budget;
pub mod causal;
pub mod coalesce;
pub mod pool;
pub mod primary_wait;
pub mod router;

pub use balance::Balance;
pub use budget::{Budget, Budgets};
pub use causal::{when_behind, when_behind_now, Causal, Need, UserNeed, UserPositions, WhenBehind};
pub use coalesce::Coalesced;
pub use pool::{CheckHook, Checkout, Pool, PoolError, PoolSettings, PoolStats, Poolable};
pub use primary_wait::PrimaryWait;
pub use router::{Admission, BackendId, Route, Router};
