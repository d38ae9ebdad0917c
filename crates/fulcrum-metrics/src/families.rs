//! The metric families, all named `fulcrum_*` and described in
//! docs/metrics.md, registered in one registry per process.

use std::sync::{Arc, Mutex};

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::Source;

/// Query latency buckets, in seconds: 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Buckets for the time Fulcrum itself adds, in seconds: 10 µs to 100 ms.
const OVERHEAD_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1,
];

pub struct Metrics {
    registry: Registry,
    pub queries: IntCounterVec,
    pub transactions: IntCounterVec,
    pub client_connections: IntGaugeVec,
    pub clients_waiting: IntGaugeVec,
    pub bytes: IntCounterVec,
    pub query_seconds: HistogramVec,
    pub pool_wait_seconds: HistogramVec,
    pub proxy_seconds: HistogramVec,
    pub errors: IntCounterVec,
    pub server_connections: IntGaugeVec,
    pub backend_up: IntGaugeVec,
    pub backend_state: IntGaugeVec,
    pub backend_primary: IntGaugeVec,
    pub lag_bytes: IntGaugeVec,
    pub lag_seconds: GaugeVec,
    /// The top digests (`digest_metrics_top`), rebuilt at every scrape.
    pub digest_calls: IntGaugeVec,
    pub digest_errors: IntGaugeVec,
    pub digest_rows: IntGaugeVec,
    pub digest_seconds: GaugeVec,
    pub digest_p99_seconds: GaugeVec,
    pub failovers: IntCounterVec,
    pub classifier_hits: IntCounterVec,
    pub classifier_misses: IntCounterVec,
    pub unparsed: IntCounterVec,
    pub oversized: IntCounterVec,
    pub client_timeouts: IntCounterVec,
    pub transaction_replays: IntCounterVec,
    pub server_checks: IntCounterVec,
    pub function_lookups: IntCounterVec,
    pub relation_lookups: IntCounterVec,
    pub cache_hits: IntCounterVec,
    pub cache_misses: IntCounterVec,
    pub cache_invalidations: IntCounterVec,
    pub cache_bytes: IntGaugeVec,
    pub auth_lookups: IntCounterVec,
    pub prepared_statements: IntGaugeVec,
    pub failover_blocked: IntGaugeVec,
    pub reload_pending_restart: prometheus::IntGauge,
    pub upgrades: IntCounterVec,
    pub upgrade_clients: IntGaugeVec,
    pub topology_source: IntGaugeVec,
    pub topology_epoch: IntGaugeVec,
    pub topology_leader: IntGaugeVec,
    pub topology_cut_off: IntGaugeVec,
    pub topology_contact_age: GaugeVec,
    pub probe_login_refused: IntGaugeVec,
    pub causal_reads: IntCounterVec,
    pub position_queries: IntCounterVec,
    pub clients_by_user: IntGaugeVec,
    pub listen_reconnects: IntCounterVec,
    pub notifications: IntCounterVec,
    pub listen_channels: IntGaugeVec,
    pub mirror_sent: IntCounterVec,
    pub mirror_dropped: IntCounterVec,
    pub mirror_differing: IntCounterVec,
    pub mirror_skipped_clients: IntCounterVec,
    /// The status page's recent totals per cluster (`history.rs`).
    pub history: crate::history::History,
    /// By cluster name: a reload replaces a cluster's source.
    sources: Mutex<Vec<(String, Arc<dyn Source>)>>,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn gauge_f(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    histogram_with(r, name, help, labels, LATENCY_BUCKETS)
}

fn histogram_with(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid histogram");
    r.register(Box::new(h.clone())).expect("registered once");
    h
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let cb = &["cluster", "backend"];
        let lag_seconds = GaugeVec::new(
            Opts::new(
                "fulcrum_replication_lag_seconds",
                "Replica lag behind the primary in time, as the health loop measured it.",
            ),
            cb,
        )
        .expect("valid gauge");
        r.register(Box::new(lag_seconds.clone()))
            .expect("registered once");
        let dl = &["cluster", "digest", "query"];
        let float_gauge = |name: &str, help: &str| {
            let g = GaugeVec::new(Opts::new(name, help), dl).expect("valid gauge");
            r.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let digest_seconds = float_gauge("fulcrum_query_digest_seconds", "Total time of a digest's executions (from the statement's hand-over to the server to its last reply), for the top digest_metrics_top digests by that time, since the digest entered the table.");
        let digest_p99_seconds = float_gauge("fulcrum_query_digest_p99_seconds", "99th percentile latency of a top digest's executions, from a histogram of √2-wide buckets (the bucket's upper edge).");
        // The standard process series (process_cpu_seconds_total,
        // process_resident_memory_bytes, process_open_fds, ...), read from
        // /proc at each scrape.
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("registered once");
        gauge(
            &r,
            "fulcrum_build_info",
            "Always 1: the running Fulcrum's version, as a label.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        let reload_pending_restart = prometheus::IntGauge::new(
            "fulcrum_reload_pending_restart",
            "Changes in the file that only a restart applies, one each (fulcrum.admin, metrics, workers, log_format, shutdown_timeout; a cluster added, removed, or given a new protocol or listen; a cluster's max_client_connections, max_pending_logins and client_login_timeout): they keep their running values until then; 0 when the file and the process agree.",
        )
        .expect("valid gauge");
        r.register(Box::new(reload_pending_restart.clone()))
            .expect("registered once");
        Metrics {
            reload_pending_restart,
            upgrade_clients: gauge(&r, "fulcrum_upgrade_clients", "In a process started by a binary upgrade: the old process's clients, as it last reported them, by state: handed_over (moved here with their sessions), left_tls and left_pinned (still there: a TLS session cannot move, a pinned one moves once it unpins), closed (ended there by upgrade_timeout).", &["state"]),
            upgrades: counter(&r, "fulcrum_upgrades_total", "Binary upgrades (SIGUSR2, the console's UPGRADE) started by this process, by outcome: handed_over (the new process took the listeners), failed (it did not start, failed its config check or did not answer; this process kept serving).", &["outcome"]),
            queries: counter(&r, "fulcrum_queries_total", "Statements (simple queries, extended-protocol executes, MySQL commands) forwarded, by the backend that ran them and their route (read: sent to a reader, write: to the primary).", &["cluster", "backend", "route"]),
            transactions: counter(&r, "fulcrum_transactions_total", "Units of work (a statement outside a transaction, or a whole transaction) that held a server connection, by backend and route.", &["cluster", "backend", "route"]),
            client_connections: gauge(&r, "fulcrum_client_connections", "Client connections open now (logged in).", &["cluster"]),
            clients_waiting: gauge(&r, "fulcrum_clients_waiting", "Clients waiting for a server connection now.", &["cluster"]),
            bytes: counter(&r, "fulcrum_bytes_total", "Bytes forwarded: in from clients to servers, out from servers to clients.", &["cluster", "direction"]),
            query_seconds: histogram(&r, "fulcrum_unit_duration_seconds", "Time a unit of work held its server connection, end to end as Fulcrum saw it.", &["cluster", "route"]),
            proxy_seconds: histogram_with(&r, "fulcrum_proxy_seconds", "Time Fulcrum itself spends on a unit of work before the server sees it: from the client's message to its hand-over to the server connection (classification, routing, pool checkout, session sync, consistency checks).", &["cluster"], OVERHEAD_BUCKETS),
            pool_wait_seconds: histogram(&r, "fulcrum_pool_wait_seconds", "Time a unit of work waited for a server connection (checkout from the pool, opening one if needed).", &["cluster"]),
            errors: counter(&r, "fulcrum_errors_total", "Errors sent to clients: SQLSTATE class (PostgreSQL, e.g. 42 or 08) or error code (MySQL, e.g. 1146).", &["cluster", "code"]),
            server_connections: gauge(&r, "fulcrum_server_connections", "Server connections in the pools now: active (checked out) or idle.", &["cluster", "backend", "state"]),
            backend_up: gauge(&r, "fulcrum_backend_up", "1 if the backend answers its health probes, else 0.", cb),
            backend_state: gauge(&r, "fulcrum_backend_state", "1 for the backend's current health state (up, lagging, down, stale), 0 for the others.", &["cluster", "backend", "state"]),
            backend_primary: gauge(&r, "fulcrum_backend_primary", "1 if the backend is the current write target, else 0.", cb),
            lag_bytes: gauge(&r, "fulcrum_replication_lag_bytes", "Replica lag behind the primary: WAL bytes (PostgreSQL) or GTID transactions (MariaDB) not yet replayed.", cb),
            lag_seconds,
            digest_calls: gauge(&r, "fulcrum_query_digest_calls", "Executions of a top digest (normalised statement; digest_metrics_top by total time) since it entered the table.", &["cluster", "digest", "query"]),
            digest_errors: gauge(&r, "fulcrum_query_digest_errors", "Executions of a top digest that ended in an error.", &["cluster", "digest", "query"]),
            digest_rows: gauge(&r, "fulcrum_query_digest_rows", "Rows a top digest's executions returned or changed.", &["cluster", "digest", "query"]),
            digest_seconds,
            digest_p99_seconds,
            failovers: counter(&r, "fulcrum_failovers_total", "Promotions done by this process.", &["cluster"]),
            classifier_hits: counter(&r, "fulcrum_classifier_cache_hits_total", "Statements classified from the fingerprint cache.", &["cluster"]),
            classifier_misses: counter(&r, "fulcrum_classifier_cache_misses_total", "Statements that had to be parsed.", &["cluster"]),
            unparsed: counter(&r, "fulcrum_unparsed_statements_total", "Statements the SQL parser could not parse (routed by default_route).", &["cluster"]),
            probe_login_refused: gauge(&r, "fulcrum_probe_login_refused", "1 while the health probe's own login to this backend is refused (health_user / health_password, or its rights): the backend stays in service on its configured role, unobserved (no lag, not promoted), else 0.", &["cluster", "backend"]),
            failover_blocked: gauge(&r, "fulcrum_failover_blocked", "1 while the health loop holds back an automatic promotion because every candidate is further behind than failover_max_lag (SHOW CLUSTERS says why), else 0.", &["cluster"]),
            topology_source: gauge(&r, "fulcrum_topology_source", "1 for the source that decides the cluster's primary (topology = \"etcd\" or \"patroni\"; absent with \"probe\").", &["cluster", "source"]),
            topology_epoch: gauge(&r, "fulcrum_topology_epoch", "The newest topology epoch this instance has seen (etcd: the leader's published epoch; Patroni: the leader's timeline, or a count of leader changes).", &["cluster"]),
            topology_leader: gauge(&r, "fulcrum_topology_leader", "1 while this instance leads the cluster's topology in etcd (only the leader promotes), else 0.", &["cluster"]),
            topology_cut_off: gauge(&r, "fulcrum_topology_cut_off", "1 while this instance has not heard from etcd or Patroni for longer than etcd_lease / patroni_timeout: it promotes nothing and writes follow on_coordinator_loss.", &["cluster"]),
            topology_contact_age: gauge_f(&r, "fulcrum_topology_contact_age_seconds", "Seconds since etcd or Patroni last answered this instance (-1: never).", &["cluster"]),
            prepared_statements: gauge(&r, "fulcrum_prepared_statements", "Distinct protocol-level prepared statements the cluster's clients hold now (PostgreSQL, transaction pooling).", &["cluster"]),
            transaction_replays: counter(&r, "fulcrum_transaction_replays_total", "Transactions whose server died before COMMIT was sent, sent again to a primary (transaction_replay): outcome replayed (the client saw nothing) or failed (no primary in time, or an answer differed: the client got the error it gets without replay).", &["cluster", "outcome"]),
            server_checks: counter(&r, "fulcrum_server_checks_total", "Idle server connections checked before reuse (server_check_delay): outcome passed (handed out) or failed (closed, the next one tried).", &["cluster", "outcome"]),
            function_lookups: counter(&r, "fulcrum_function_catalog_lookups_total", "Reads of a database's user functions from the primary's catalog (function_catalog): outcome loaded, or failed (retried after 5 s; until then the functions' reads go to the primary).", &["cluster", "outcome"]),
            relation_lookups: counter(&r, "fulcrum_relation_catalog_lookups_total", "Reads of a database's relations from the primary's catalog for the result cache: outcome loaded, or failed (retried after 5 s; until then nothing of the database is kept and its writes invalidate it whole).", &["cluster", "outcome"]),
            auth_lookups: counter(&r, "fulcrum_auth_query_lookups_total", "Logins of users not in the config looked up for auth_query, by outcome: cached (a fresh cached answer), found or missing (auth_query ran on the primary), limited (not run: the client's address found nobody auth_failed_lookups_per_minute times this minute; refused as an unknown user), failed (auth_user could not log in or the query failed).", &["cluster", "outcome"]),
            client_timeouts: counter(&r, "fulcrum_client_timeouts_total", "Clients closed by a timeout: kind login (client_login_timeout), client_idle (client_idle_timeout) , idle_transaction (idle_transaction_timeout) or query (query_timeout: a statement cancelled, the client stays).", &["cluster", "kind"]),
            oversized: counter(&r, "fulcrum_oversized_statements_total", "Statements longer than max_classify_bytes, not parsed (routed by default_route).", &["cluster"]),
            causal_reads: counter(&r, "fulcrum_causal_reads_total", "Reads that had a position to respect (consistency session or strong), by where they ran: replica (already past it), waited (a replica after waiting), primary (fallback).", &["cluster", "outcome"]),
            position_queries: counter(&r, "fulcrum_position_queries_total", "Queries sent to the primary for its current position (consistency strong); reads asking at the same time share one.", &["cluster"]),
            clients_by_user: gauge(&r, "fulcrum_clients", "Client connections now, by user and state: active (a unit of work holds a server connection), waiting (for one), idle.", &["cluster", "user", "state"]),
            listen_reconnects: counter(&r, "fulcrum_listen_reconnects_total", "Times a listening server connection (LISTEN/NOTIFY in transaction pooling, one per database and user) was opened again and its channels listened to again: after a failover, a switchover or a lost connection. Notifications sent while it was away are lost.", &["cluster"]),
            notifications: counter(&r, "fulcrum_notifications_total", "Notifications from the listening connections, by outcome: delivered (queued for a subscribed client, one per client) or dropped (the client already had notify_queue notifications, or max_client_notify_bytes of them, waiting).", &["cluster", "outcome"]),
            listen_channels: gauge(&r, "fulcrum_listen_channels", "Channels Fulcrum listens to on the primary now for its clients (transaction pooling), over all databases and users.", &["cluster"]),
            mirror_sent: counter(&r, "fulcrum_mirror_sent_total", "Units of work (a statement, or an extended-protocol batch up to Sync) replayed on a mirror target and answered ([[cluster.mirror]]).", &["cluster", "target"]),
            mirror_dropped: counter(&r, "fulcrum_mirror_dropped_total", "Units of work not mirrored: the client's queue was full (mirror_queue; the rest of its transaction went with it), the target was down, the unit cannot be replayed (COPY), or its transaction was over mirror_max_transaction_bytes.", &["cluster", "target"]),
            mirror_differing: counter(&r, "fulcrum_mirror_differing_total", "Mirrored units whose answer differed from the primary's: error or success and its SQLSTATE, rows returned or affected, or the checksum of the rows (order-insensitive).", &["cluster", "target"]),
            mirror_skipped_clients: counter(&r, "fulcrum_mirror_skipped_clients_total", "Clients drawn for a mirror target but not mirrored there, by reason: no_login (the target cluster lists no [[cluster.user]] for the client's user).", &["cluster", "target", "reason"]),
            cache_hits: counter(&r, "fulcrum_cache_hits_total", "Reads answered from the result cache ([cluster.cache]), byte for byte what the server sent when the entry was filled.", &["cluster"]),
            cache_misses: counter(&r, "fulcrum_cache_misses_total", "Cacheable reads not found in the result cache (each went to a server, and filled the entry unless a write overtook it or another client was filling it).", &["cluster"]),
            cache_invalidations: counter(&r, "fulcrum_cache_invalidations_total", "Result-cache entries dropped, by source: proxy (a write through Fulcrum), stream (the primary's change stream, or the stream lost), ttl, memory (evicted for max_memory), flush (FLUSH CACHE).", &["cluster", "source"]),
            cache_bytes: gauge(&r, "fulcrum_cache_bytes", "Bytes the result cache's entries hold now: answers, keys and bookkeeping (at most max_memory).", &["cluster"]),
            registry: r,
            history: crate::history::History::default(),
            sources: Mutex::new(Vec::new()),
        }
    }

    /// Sets the source of scrape-time figures for `cluster` (replacing the
    /// one it had).
    pub fn set_source(&self, cluster: &str, source: Arc<dyn Source>) {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources.retain(|(name, _)| name != cluster);
        sources.push((cluster.to_owned(), source));
    }

    /// The text exposition of every family, after the sources refreshed.
    pub fn encode(&self) -> String {
        let sources = self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Per-user client gauges are rebuilt from scratch at every scrape:
        // a user whose clients all left disappears.
        self.clients_by_user.reset();
        // So are the top digests: one that left the top N disappears.
        self.digest_calls.reset();
        self.digest_errors.reset();
        self.digest_rows.reset();
        self.digest_seconds.reset();
        self.digest_p99_seconds.reset();
        for (_, s) in sources {
            s.refresh(self);
        }
        let mut out = Vec::with_capacity(16 * 1024);
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Sets a counter to at least `value` (scrape-time counters kept
    /// elsewhere as totals).
    pub fn catch_up(counter: &prometheus::IntCounter, value: u64) {
        let now = counter.get();
        if value > now {
            counter.inc_by(value - now);
        }
    }
}

#[cfg(test)]
mod documented {
    use super::*;

    /// Every family this file defines (each `"fulcrum_..."` name in it,
    /// registered or not yet sampled) and every family the registry
    /// gathers (the process series) is in docs/metrics.md.
    #[test]
    fn every_metric_is_documented() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/metrics.md"
        ))
        .expect("docs/metrics.md");
        let source = include_str!("families.rs");
        let mut names: Vec<String> = source
            .split("\"fulcrum_")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter(|n| {
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            })
            .map(|n| format!("fulcrum_{n}"))
            .collect();
        names.extend(
            Metrics::new()
                .registry
                .gather()
                .iter()
                .map(|f| f.name().to_owned()),
        );
        names.sort();
        names.dedup();
        assert!(names.len() > 30, "{names:?}");
        let missing: Vec<&String> = names
            .iter()
            .filter(|name| !docs.contains(&format!("`{name}`")))
            .collect();
        assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
    }

    /// The Grafana dashboard (docs/grafana-dashboard.json) asks only for
    /// series Fulcrum exports: every `fulcrum_...` and `process_...` name in
    /// its queries (a histogram's `_bucket` counted as its family) is a
    /// documented metric, and it asks for some of each kind.
    #[test]
    fn the_grafana_dashboard_uses_documented_metrics() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/");
        let docs = std::fs::read_to_string(format!("{root}metrics.md")).expect("docs/metrics.md");
        let dashboard = std::fs::read_to_string(format!("{root}grafana-dashboard.json"))
            .expect("the dashboard");
        let mut used = Vec::new();
        for prefix in ["fulcrum_", "process_"] {
            for rest in dashboard.split(prefix).skip(1) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let name = format!("{prefix}{name}");
                let family = name.strip_suffix("_bucket").unwrap_or(&name).to_owned();
                used.push(family);
            }
        }
        used.sort();
        used.dedup();
        assert!(used.len() > 20, "{used:?}");
        let missing: Vec<&String> = used
            .iter()
            .filter(|n| !docs.contains(&format!("`{n}`")) && !docs.contains(&format!("`{n}`,")))
            .collect();
        assert!(
            missing.is_empty(),
            "the dashboard asks for undocumented series: {missing:?}"
        );
    }
}
