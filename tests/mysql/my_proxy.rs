//! The MySQL front end on a real MariaDB primary with two GTID replicas (the
//! testkit's; the `app` user has no SUPER, so a write misrouted to a
//! read-only replica fails with 1290): the `mariadb` command-line client and
//! mysql_async through Fulcrum, reads spread over the replicas, writes and
//! transactions on the primary, session state kept, bad logins refused.
//!
//! Split by theme: `routing` (reads, writes, transactions, functions and
//! the catalog), `sessions` (session state, prepared statements, COM_CHANGE_USER,
//! large payloads, LOAD DATA, what is left for the next client) and `clients`
//! (logins, KILL QUERY, mariadb-admin, timeouts, digests, server checks);
//! shared cluster and daemon helpers in `helpers`.

mod clients;
mod encoding;
mod helpers;
mod probes;
mod routing;
mod sessions;
