//! Importing other poolers' configs (`fulcrum import ...`).

pub mod ini;
pub mod pgbouncer;
mod pgbouncer_databases;
mod pgbouncer_keys;
mod pgbouncer_user_pools;
mod pgbouncer_users;
