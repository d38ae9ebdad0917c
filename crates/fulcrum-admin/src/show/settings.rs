//! SHOW CONFIG, SHOW LISTS, SHOW STATS, SHOW TOTALS and SHOW VERSION: the
//! running config (global keys and each cluster's main ones, its
//! `client_auth` and hba file and its `[cluster.cache]` included; never a
//! password), counts of what
//! Fulcrum holds, and traffic figures.

use bytes::BytesMut;

use super::{pool_mode, protocol};
use crate::rows::result;
use crate::stats::StatFigures;
use crate::Admin;

impl Admin {
    /// SHOW VERSION.
    pub(super) fn show_version(&self, out: &mut BytesMut) {
        result(
            out,
            &["version"],
            &[vec![format!("Fulcrum {}", env!("CARGO_PKG_VERSION"))]],
        )
    }

    /// SHOW STATS (a row per database, PgBouncer's, from the clients'
    /// counts: `fulcrum_cluster::client_stats`) or, `totals`, SHOW TOTALS
    /// (one row, from the clusters' metrics); the averages from each
    /// row's [`Period`](crate::stats::Period).
    pub(super) fn show_stats(&self, totals: bool, out: &mut BytesMut) {
        use crate::stats::Period;
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static PERIODS: OnceLock<Mutex<HashMap<String, Period>>> = OnceLock::new();
        let per_row: Vec<(String, StatFigures)> = if totals {
            let mut all = StatFigures::default();
            for c in self.clusters() {
                all.add(&StatFigures::of(&self.metrics, c.as_ref()));
            }
            vec![("total".into(), all)]
        } else {
            self.database_rows()
        };
        let now = std::time::Instant::now();
        let mut periods = PERIODS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = |n: &str| format!("{}{n}", if totals { "totals/" } else { "" });
        let rows: Vec<Vec<String>> = per_row
            .iter()
            .map(|(n, f)| {
                let period = periods
                    .entry(key(n))
                    .or_insert_with(|| Period::new(crate::started()));
                let (older, seconds) = period.advance(f, now);
                f.row(n, &older, seconds)
            })
            .collect();
        drop(periods);
        result(out, &StatFigures::COLUMNS, &rows);
    }

    /// A row per database its clients named (a MySQL client without a
    /// schema: its cluster's name), the same name in several clusters
    /// summed, as PgBouncer knows a database once; and the databases
    /// `[[cluster.database]]` lists, at zero until a client comes.
    fn database_rows(&self) -> Vec<(String, StatFigures)> {
        let mut rows: std::collections::BTreeMap<String, StatFigures> = Default::default();
        for c in self.clusters() {
            for d in &c.config().databases {
                rows.entry(d.name.clone()).or_default();
            }
        }
        for ((cluster, database), t) in fulcrum_cluster::clients::registry().database_totals() {
            let name = if database.is_empty() {
                cluster
            } else {
                database
            };
            rows.entry(name.to_string())
                .or_default()
                .add(&StatFigures::from_totals(&t));
        }
        rows.into_iter().collect()
    }

    /// SHOW CONFIG: the global settings and each cluster's main ones.
    pub(super) fn show_config(&self, out: &mut BytesMut) {
        let config = self.config();
        let g = &config.fulcrum;
        let opt = |a: Option<std::net::SocketAddr>| a.map_or("off".to_owned(), |a| a.to_string());
        let mut rows = vec![
            vec!["fulcrum.admin".into(), opt(g.admin)],
            vec!["fulcrum.metrics".into(), opt(g.metrics)],
            vec!["fulcrum.log".into(), g.log.clone()],
            vec!["fulcrum.workers".into(), g.workers.to_string()],
            vec![
                "fulcrum.shutdown_timeout".into(),
                format!("{:?}", g.shutdown_timeout),
            ],
            vec!["fulcrum.admin_auth".into(), g.admin_auth.name().into()],
        ];
        for c in &config.clusters {
            rows.extend(cluster_rows(c));
        }
        result(out, &["key", "value"], &rows);
    }

    /// SHOW LISTS: PgBouncer's keys (databases, users, pools, clients and
    /// servers free, used and logging in; Fulcrum has no DNS cache, so the
    /// dns_* keys are 0), then Fulcrum's own counts.
    pub(super) fn show_lists(&self, out: &mut BytesMut) {
        let clusters = self.clusters();
        let backends: usize = clusters.iter().map(|c| c.config().backends.len()).sum();
        let pools: Vec<_> = clusters.iter().flat_map(|c| c.pools()).collect();
        let clients: i64 = clusters.iter().map(|c| c.clients()).sum();
        let databases: std::collections::HashSet<&str> =
            pools.iter().map(|p| p.database.as_str()).collect();
        let users: std::collections::HashSet<&str> =
            pools.iter().map(|p| p.user.as_str()).collect();
        let (used_servers, free_servers) = pools
            .iter()
            .fold((0, 0), |(a, i), p| (a + p.active, i + p.idle));
        let rows = vec![
            vec!["databases".into(), databases.len().to_string()],
            vec!["users".into(), users.len().to_string()],
            vec!["pools".into(), pools.len().to_string()],
            vec!["free_clients".into(), "0".into()],
            vec!["used_clients".into(), clients.to_string()],
            vec!["login_clients".into(), "0".into()],
            vec!["free_servers".into(), free_servers.to_string()],
            vec!["used_servers".into(), used_servers.to_string()],
            vec!["dns_names".into(), "0".into()],
            vec!["dns_zones".into(), "0".into()],
            vec!["dns_queries".into(), "0".into()],
            vec!["dns_pending".into(), "0".into()],
            vec!["clusters".into(), clusters.len().to_string()],
            vec!["backends".into(), backends.to_string()],
            vec!["clients".into(), clients.to_string()],
            vec!["admin_users".into(), self.users().len().to_string()],
        ];
        result(out, &["list", "items"], &rows);
    }

    /// SHOW HELP: a row per command.
    pub(super) fn show_help(&self, out: &mut BytesMut) {
        let rows: Vec<Vec<String>> = super::HELP
            .iter()
            .map(|(c, what)| vec![(*c).to_owned(), (*what).to_owned()])
            .collect();
        result(out, &["command", "does"], &rows);
    }
}

/// SHOW CONFIG's rows for one cluster: `cluster.<name>.<key>` and its
/// value, `auth_hba_file` only when `client_auth = "hba"` reads one, then
/// `cache.<key>` (sizes in bytes, the rules counted).
fn cluster_rows(c: &fulcrum_config::Cluster) -> Vec<Vec<String>> {
    let k = |key: &str| format!("cluster.{}.{key}", c.name);
    let mut rows = vec![
        vec![k("protocol"), protocol(c)],
        vec![k("listen"), c.listen.to_string()],
        vec![k("pool_mode"), pool_mode(c)],
        vec![k("pool_size"), c.pool_size.to_string()],
        vec![k("client_auth"), c.client_auth.name().into()],
    ];
    if let Some(hba) = &c.hba {
        rows.push(vec![k("auth_hba_file"), hba.path.display().to_string()]);
    }
    rows.extend([
        vec![k("balance"), format!("{:?}", c.balance)],
        vec![k("failover"), format!("{:?}", c.health.failover)],
        vec![k("health_interval"), format!("{:?}", c.health.interval)],
        vec![k("max_lag"), format!("{:?}", c.health.max_lag)],
        vec![
            k("backends"),
            c.backends
                .iter()
                .map(|b| b.address.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ],
        vec![
            k("users"),
            c.users
                .iter()
                .map(|u| u.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ],
    ]);
    let cache = &c.cache;
    rows.extend([
        vec![k("cache.mode"), cache.mode.name().into()],
        vec![k("cache.max_memory"), cache.max_memory.to_string()],
        vec![k("cache.ttl"), format!("{:?}", cache.ttl)],
        vec![k("cache.max_result"), cache.max_result.to_string()],
        vec![k("cache.isolation"), cache.isolation.name().into()],
        vec![k("cache.invalidation"), cache.invalidation.name().into()],
        vec![k("cache.rules"), cache.rules.len().to_string()],
    ]);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(cluster_keys: &str, dir: &std::path::Path) -> Vec<Vec<String>> {
        let toml = format!(
            "[[cluster]]\nname = \"main\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:6432\"\n{cluster_keys}\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:5432\"\nrole = \"primary\"\n\
             [[cluster.user]]\nname = \"app\"\npassword = \"secret\"\n"
        );
        let config = fulcrum_config::parse(&toml, &dir.join("fulcrum.toml")).expect("valid");
        cluster_rows(&config.clusters[0])
    }

    fn value<'a>(rows: &'a [Vec<String>], key: &str) -> Option<&'a str> {
        rows.iter().find(|r| r[0] == key).map(|r| r[1].as_str())
    }

    #[test]
    fn client_auth_is_listed_and_the_hba_file_when_it_is_read() {
        let dir = std::env::temp_dir().join(format!("fulcrum-show-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = rows("client_auth = \"md5\"", &dir);
        assert_eq!(value(&plain, "cluster.main.client_auth"), Some("md5"));
        assert_eq!(
            value(&plain, "cluster.main.auth_hba_file"),
            None,
            "{plain:?}"
        );

        std::fs::write(
            dir.join("hba.conf"),
            "host all all 127.0.0.1/32 scram-sha-256\n",
        )
        .unwrap();
        let hba = rows("client_auth = \"hba\"\nauth_hba_file = \"hba.conf\"", &dir);
        assert_eq!(value(&hba, "cluster.main.client_auth"), Some("hba"));
        assert_eq!(
            value(&hba, "cluster.main.auth_hba_file"),
            Some(dir.join("hba.conf").display().to_string().as_str()),
            "the file read, joined to the config's directory: {hba:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cache_keys_are_listed() {
        let dir = std::env::temp_dir().join(format!("fulcrum-show-cache-{}", std::process::id()));
        let off = rows("", &dir);
        assert_eq!(value(&off, "cluster.main.cache.mode"), Some("off"));
        assert_eq!(
            value(&off, "cluster.main.cache.max_memory"),
            Some("268435456")
        );
        assert_eq!(value(&off, "cluster.main.cache.ttl"), Some("60s"));
        assert_eq!(
            value(&off, "cluster.main.cache.max_result"),
            Some("1048576")
        );
        assert_eq!(value(&off, "cluster.main.cache.isolation"), Some("user"));
        assert_eq!(
            value(&off, "cluster.main.cache.invalidation"),
            Some("stream")
        );
        assert_eq!(value(&off, "cluster.main.cache.rules"), Some("0"));
        let on = rows(
            "cache = { mode = \"rules\", ttl = \"2m\", isolation = \"shared\", \
             invalidation = \"proxy\", rule = [{ tables = [\"a\"] }, { tables = [\"b\"] }] }",
            &dir,
        );
        assert_eq!(value(&on, "cluster.main.cache.mode"), Some("rules"));
        assert_eq!(value(&on, "cluster.main.cache.ttl"), Some("120s"));
        assert_eq!(value(&on, "cluster.main.cache.isolation"), Some("shared"));
        assert_eq!(value(&on, "cluster.main.cache.invalidation"), Some("proxy"));
        assert_eq!(value(&on, "cluster.main.cache.rules"), Some("2"));
    }
}
