//! Several Fulcrum instances in front of one cluster, coordinated through
//! a real etcd (three members on loopback, started by the test kit) or
//! following a real Patroni: one promotion per failover, every instance on
//! the new primary, no write to an old primary from an instance that was
//! frozen or cut off. Each test wrecks its own clusters; they take turns
//! (`fulcrum_suite::serial`). The causal token carries a write across
//! instances; `consistency = "user"` does not. `several_cache`: each
//! instance's result cache learns every write from its own change stream.

mod fleet;
mod several_cache;
mod several_etcd;
mod several_etcd_forged;
mod several_etcd_secure;
mod several_maria;
mod several_patroni;
mod several_patroni_secure;
mod several_token;
