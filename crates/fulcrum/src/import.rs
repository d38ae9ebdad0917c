//! Importing other poolers' configs (`fulcrum import ...`).

pub mod ini;
pub mod pgbouncer;
