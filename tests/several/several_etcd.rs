//! `topology = "etcd"` against a real three-member etcd: three instances
//! fail over once under pgbench TPC-B and lose no acknowledged
//! transaction; a leader killed in the middle of a failover is replaced
//! and the promotion finished under the same epoch; an instance frozen
//! past its lease never writes to the old primary; with etcd stopped,
//! reads go on, writes hold and nothing is promoted, and the instances
//! converge once etcd is back.
//!
//! Split by theme: `promotion` (one promotion by three instances, a leader
//! killed mid-failover) and `outages` (an instance frozen past its lease,
//! etcd stopped); shared etcd and cluster helpers in `helpers`.

mod helpers;
mod outages;
mod promotion;
