//! The MySQL protocol end to end: real clients (mysql_async, the `mariadb`
//! client, sysbench, PyMySQL) through a real Fulcrum daemon in front of
//! real MariaDB GTID clusters: proxying, routing by the corpus, sysbench
//! OLTP, drivers, bad input, credentials and TLS. One test binary; each
//! module was a binary of its own before.
//!
//! Clusters: `my_drivers`, `my_bad_input`, `my_connect_query`,
//! `my_server_refusal`, `my_unix_socket`, `my_upgrade` and `my_upgrade_clients` share one primary with a replica
//! (`fulcrum_suite::maria_one_replica`); `my_proxy` (64 MiB
//! packets), `my_sysbench` (which counts `Com_select` per server),
//! `my_credentials` (its own server-side users), `my_tls` (a TLS-only
//! server) and `my_cache` (writes behind Fulcrum's back, no replica; `my_cache_scope` shares it) keep
//! their own; other tests start one each.

mod my_bad_input;
mod my_cache;
mod my_cache_scope;
mod my_cache_stream;
mod my_connect_query;
mod my_credentials;
mod my_drivers;
mod my_identity;
mod my_mirror;
mod my_mirror_reads;
mod my_proxy;
mod my_routing;
mod my_server_refusal;
mod my_sysbench;
mod my_tls;
mod my_unix_socket;
mod my_upgrade;
mod my_upgrade_clients;
