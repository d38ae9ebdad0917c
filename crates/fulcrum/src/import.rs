//! Importing other poolers' configs (`fulcrum import ...`).

pub mod ini;
pub mod pgbouncer;
mod pgbouncer_keys;
mod pgbouncer_users;
