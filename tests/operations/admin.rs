//! The admin console through tokio-postgres (psql speaks the same protocol):
//! every SHOW command's shape, DISABLE draining a backend from reads and
//! ENABLE bringing it back, PAUSE holding new queries until RESUME, SET log,
//! clear errors (never a dropped connection) for bad commands, and logins
//! by SCRAM-SHA-256 (default) or md5 (`admin_auth`).
//!
//! Split by theme: `show` (every SHOW command's columns, no pools for
//! unknown databases), `show_activity` (SHOW SERVERS, QUERIES and POOLS
//! under load), `control` (DISABLE/ENABLE, PAUSE/RESUME, RECONNECT,
//! WAIT_CLOSE, KILL, switchover) and `access` (logins, bad commands,
//! connection caps, TLS and stats users, the pgbouncer exporter); shared
//! setup and queries in `helpers`.

mod access;
mod control;
mod helpers;
mod show;
mod show_activity;
