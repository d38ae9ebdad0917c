//! Validation errors of `[fulcrum]` and `[[cluster]]` keys, and of rules across clusters.

use super::{assert_errors, MINIMAL};

/// `MINIMAL` with `line` inserted after `listen` (the inserted key is on line 5).
fn with_key(line: &str) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    MINIMAL.replace(listen, &format!("{listen}    {line}\n"))
}

/// `MINIMAL` without the line containing `needle`.
fn without(needle: &str) -> String {
    MINIMAL
        .lines()
        .filter(|l| !l.contains(needle))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// `MINIMAL` followed by a second valid cluster (lines 11-20: name on 12, listen on 14).
fn two_clusters(name: &str, listen: &str) -> String {
    let second = MINIMAL
        .replace("name = \"main\"", &format!("name = \"{name}\""))
        .replace("127.0.0.1:6432", listen)
        .replace("127.0.0.1:5432", "127.0.0.1:5433");
    format!("{MINIMAL}{}", second.trim_start_matches('\n'))
}

#[test]
fn global_keys_are_validated() {
    assert_errors(&[
        (
            &format!("[fulcrum]\nadmin = \"localhost:6480\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.admin: invalid address \"localhost:6480\": expected an IP address \
             and port, e.g. \"127.0.0.1:6432\"",
        ),
        (
            &format!("[fulcrum]\nmetrics = \"127.0.0.1\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.metrics: invalid address \"127.0.0.1\": expected an IP address \
             and port, e.g. \"127.0.0.1:6432\"",
        ),
        (
            &format!("[fulcrum]\nlog = \"\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.log: must not be empty",
        ),
        (
            &format!("[fulcrum]\nstatus_key = \"short\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.status_key: must be at least 16 characters: it guards a page that may be on a public port",
        ),
        (
            &format!("[fulcrum]\nlog = \"degub\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.log: \"degub\" is neither a level (trace, debug, info, warn, error, off) \
             nor a target Fulcrum logs under (fulcrum..., sqlparser, ...)",
        ),
        (
            &format!("[fulcrum]\nlog = \"fulcrum=loud\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.log: not a log filter (error parsing level filter: expected one of \"off\", \
             \"error\", \"warn\", \"info\", \"debug\", \"trace\", or a number 0-5); e.g. \"info\" or \
             \"fulcrum_cluster=debug,info\"",
        ),
        (
            &format!("[fulcrum]\ndns_max_ttl = \"15\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.dns_max_ttl: invalid duration \"15\": missing unit (us, ms, s, m, h), e.g. \"15s\"",
        ),
        (
            &format!("[fulcrum]\nadmin_auth = \"trust\"\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.admin_auth: unknown value \"trust\", expected one of \
             \"scram-sha-256\", \"md5\"",
        ),
        (
            &format!("[fulcrum]\nstats_users = [\"watcher\"]\n{MINIMAL}"),
            "fulcrum.toml:2: fulcrum.stats_users: \"watcher\" is not a [[fulcrum.admin_user]]; \
             stats users log in as admin users do",
        ),
    ]);
}

#[test]
fn listen_addresses_must_not_collide() {
    assert_errors(&[
        (
            &format!("[fulcrum]\nadmin = \"127.0.0.1:6480\"\nmetrics = \"127.0.0.1:6480\"\n{MINIMAL}"),
            "fulcrum.toml:3: fulcrum.metrics: 127.0.0.1:6480 is already used by fulcrum.admin (line 2)",
        ),
        (
            &format!("[fulcrum]\nmetrics = \"127.0.0.1:6432\"\n{MINIMAL}"),
            "fulcrum.toml:7: cluster[0].listen: 127.0.0.1:6432 is already used by fulcrum.metrics (line 2)",
        ),
        (
            &two_clusters("other", "127.0.0.1:6432"),
            "fulcrum.toml:14: cluster[1].listen: 127.0.0.1:6432 is shared with cluster \"main\", and neither lists \
             [[cluster.database]]: on a shared port each cluster but one must list the databases it serves",
        ),
        (
            &two_clusters("other", "0.0.0.0:6432"),
            "fulcrum.toml:14: cluster[1].listen: 0.0.0.0:6432 overlaps cluster[0].listen = 127.0.0.1:6432 \
             (line 4): both would listen on port 6432",
        ),
    ]);
}

#[test]
fn cluster_names_must_be_present_non_empty_and_unique() {
    assert_errors(&[
        (&without("name = \"main\""), "fulcrum.toml:1: cluster[0].name: required key is missing"),
        (
            &MINIMAL.replace("name = \"main\"", "name = \" \""),
            "fulcrum.toml:2: cluster[0].name: must not be empty",
        ),
        (
            &two_clusters("main", "127.0.0.1:6433"),
            "fulcrum.toml:12: cluster[1].name: cluster name \"main\" is already used by cluster[0] (line 2)",
        ),
    ]);
}

#[test]
fn required_cluster_keys_must_be_present_and_valid() {
    assert_errors(&[
        (&without("protocol"), "fulcrum.toml:1: cluster[0].protocol: required key is missing"),
        (
            &MINIMAL.replace("\"postgres\"", "\"postgresql\""),
            "fulcrum.toml:3: cluster[0].protocol: unknown value \"postgresql\", expected one of \"postgres\", \"mysql\"",
        ),
        (&without("listen"), "fulcrum.toml:1: cluster[0].listen: required key is missing"),
        (
            &MINIMAL.replace("127.0.0.1:6432", "localhost:6432"),
            "fulcrum.toml:4: cluster[0].listen: invalid address \"localhost:6432\": expected an IP address \
             and port, e.g. \"127.0.0.1:6432\"",
        ),
    ]);
}

#[test]
fn optional_cluster_keys_are_validated() {
    assert_errors(&[
        (
            &with_key("pool_mode = \"sometimes\""),
            "fulcrum.toml:5: cluster[0].pool_mode: unknown value \"sometimes\", expected one of \"session\", \"transaction\", \"statement\"",
        ),
        (&with_key("pool_size = 0"), "fulcrum.toml:5: cluster[0].pool_size: must be at least 1, got 0"),
        (
            &with_key("min_pool_size = 30"),
            "fulcrum.toml:5: cluster[0].min_pool_size: must not exceed pool_size (20)",
        ),
        (
            &with_key("min_pool_size = 5\nmax_db_connections = 4"),
            "fulcrum.toml:6: cluster[0].max_db_connections: must be 0 (no cap) or at least min_pool_size (5)",
        ),
        (
            &with_key("min_pool_size = 5\nmax_user_connections = 2"),
            "fulcrum.toml:6: cluster[0].max_user_connections: must be 0 (no cap) or at least min_pool_size (5)",
        ),
        (
            &with_key("reserve_pool_timeout = \"0s\""),
            "fulcrum.toml:5: cluster[0].reserve_pool_timeout: must be greater than zero",
        ),
        (
            &with_key("digest_max_entries = -1"),
            "fulcrum.toml:5: cluster[0].digest_max_entries: must be at least 0, got -1",
        ),
        (
            &with_key("digest_metrics_top = \"50\""),
            "fulcrum.toml:5: cluster[0].digest_metrics_top: invalid type: string \"50\", expected an integer",
        ),
        (
            &with_key("pool_size = 5000000000"),
            "fulcrum.toml:5: cluster[0].pool_size: must be at most 4294967295, got 5000000000",
        ),
        (
            &with_key("client_auth = \"password\""),
            "fulcrum.toml:5: cluster[0].client_auth: unknown value \"password\", expected one of \
             \"scram-sha-256\", \"md5\", \"trust\", \"cert\", \"hba\"",
        ),
        (
            &with_key("pool_timeout = \"5\""),
            "fulcrum.toml:5: cluster[0].pool_timeout: invalid duration \"5\": missing unit (us, ms, s, m, h), e.g. \"5s\"",
        ),
        (&with_key("pool_timeout = \"0s\""), "fulcrum.toml:5: cluster[0].pool_timeout: must be greater than zero"),
        (
            &with_key("connect_timeout = \"3 secs\""),
            "fulcrum.toml:5: cluster[0].connect_timeout: invalid duration \"3 secs\": unknown unit \"secs\", \
             expected one of us, ms, s, m, h",
        ),
        (
            &with_key("server_idle_timeout = \"1.5h\""),
            "fulcrum.toml:5: cluster[0].server_idle_timeout: invalid duration \"1.5h\": fractions are not \
             supported; use a smaller unit, e.g. \"1500ms\"",
        ),
        (
            &with_key("max_message_size = \"16mb\""),
            "fulcrum.toml:5: cluster[0].max_message_size: invalid size \"16mb\": unknown unit \"mb\", expected \
             one of B, kB (or KB), MB, GB, TB (1024-based)",
        ),
        (&with_key("max_message_size = 0"), "fulcrum.toml:5: cluster[0].max_message_size: must be greater than zero"),
        (
            &with_key("max_message_size = -1"),
            "fulcrum.toml:5: cluster[0].max_message_size: must not be negative, got -1",
        ),
        (
            &with_key("max_client_connections = 0"),
            "fulcrum.toml:5: cluster[0].max_client_connections: must be at least 1, got 0",
        ),
        (
            &with_key("max_prepared_statements = -1"),
            "fulcrum.toml:5: cluster[0].max_prepared_statements: must be at least 0, got -1",
        ),
    ]);
}

#[test]
fn health_and_failover_keys_are_validated() {
    assert_errors(&[
        (
            &with_key("health_interval = \"1\""),
            "fulcrum.toml:5: cluster[0].health_interval: invalid duration \"1\": missing unit (us, ms, s, m, h), e.g. \"1s\"",
        ),
        (&with_key("health_timeout = \"0ms\""), "fulcrum.toml:5: cluster[0].health_timeout: must be greater than zero"),
        (&with_key("health_failures = 0"), "fulcrum.toml:5: cluster[0].health_failures: must be at least 1, got 0"),
        (&with_key("health_user = \" \""), "fulcrum.toml:5: cluster[0].health_user: must not be empty"),
        (
            &with_key("failover = \"auto\""),
            "fulcrum.toml:5: cluster[0].failover: unknown value \"auto\", expected one of \"none\", \"follow\", \"promote\"",
        ),
        (
            &with_key("failover_timeout = \"3 sec\""),
            "fulcrum.toml:5: cluster[0].failover_timeout: invalid duration \"3 sec\": unknown unit \"sec\", \
             expected one of us, ms, s, m, h",
        ),
        (&with_key("failover_command = \"\""), "fulcrum.toml:5: cluster[0].failover_command: must not be empty"),
        (&with_key("max_lag = \"0s\""), "fulcrum.toml:5: cluster[0].max_lag: must be greater than zero"),
        (&with_key("max_lag = 0"), "fulcrum.toml:5: cluster[0].max_lag: must be greater than zero"),
        (
            &with_key("max_lag = \"16mb\""),
            "fulcrum.toml:5: cluster[0].max_lag: invalid size \"16mb\": unknown unit \"mb\", expected \
             one of B, kB (or KB), MB, GB, TB (1024-based); or a duration such as \"2s\" for a limit in time",
        ),
    ]);
}

#[test]
fn consistency_keys_are_validated() {
    assert_errors(&[
        (
            &with_key("consistency = \"causal\""),
            "fulcrum.toml:5: cluster[0].consistency: unknown value \"causal\", expected one of \"eventual\", \"session\", \"user\", \"strong\"",
        ),
        (
            &with_key("causal_wait = \"sometimes\""),
            "fulcrum.toml:5: cluster[0].causal_wait: unknown value \"sometimes\", expected one of \"auto\", \"always\", \"never\"",
        ),
        (
            &with_key("causal_timeout = \"1\""),
            "fulcrum.toml:5: cluster[0].causal_timeout: invalid duration \"1\": missing unit (us, ms, s, m, h), e.g. \"1s\"",
        ),
        (
            &with_key("transaction_replay = \"yes\""),
            "fulcrum.toml:5: cluster[0].transaction_replay: invalid type: string \"yes\", expected a boolean",
        ),
        (
            &with_key("transaction_replay_max_size = \"lots\""),
            "fulcrum.toml:5: cluster[0].transaction_replay_max_size: invalid size \"lots\": expected a whole number and an optional unit (B, kB (or KB), MB, GB, TB), e.g. \"16MB\"",
        ),
        (
            &with_key("transaction_replay_timeout = \"30\""),
            "fulcrum.toml:5: cluster[0].transaction_replay_timeout: invalid duration \"30\": missing unit (us, ms, s, m, h), e.g. \"30s\"",
        ),
    ]);
}

#[test]
fn auth_query_keys_are_validated() {
    assert_errors(&[
        (
            &with_key("auth_query = \"SELECT 1\""),
            "fulcrum.toml:5: cluster[0].auth_query: needs auth_user (the login that runs auth_query)",
        ),
        (
            &with_key("auth_user = \"nobody\""),
            "fulcrum.toml:5: cluster[0].auth_user: \"nobody\" is not a [[cluster.user]]; add one or set auth_password",
        ),
        (
            &with_key("auth_user = \"app\"\nauth_query = \"SELECT passwd FROM pg_shadow WHERE usename = 'x'\""),
            "fulcrum.toml:6: cluster[0].auth_query: must use $1 for the login name",
        ),
        (
            &with_key("auth_user = \"app\"\nclient_auth = \"trust\""),
            "fulcrum.toml:5: cluster[0].auth_user: auth_query needs client_auth = \"scram-sha-256\" or \"md5\": \
             Fulcrum logs in to the server with what the client proves (client_auth is \"trust\")",
        ),
        (
            &with_key("auth_user = \"app\"\nauth_cache_ttl = \"soon\""),
            "fulcrum.toml:6: cluster[0].auth_cache_ttl: invalid duration \"soon\": expected a whole number and a unit (us, ms, s, m, h), e.g. \"5s\"",
        ),
    ]);
}

#[test]
fn auth_query_defaults_and_users_from_the_server_only() {
    let c = crate::parse(
        &crate::tests::dedent(
            r#"
            [[cluster]]
            name = "main"
            protocol = "postgres"
            listen = "127.0.0.1:6432"
            auth_user = "pgbouncer"
            auth_password = "pw"
            [[cluster.backend]]
            address = "127.0.0.1:5432"
            role = "primary"
            "#,
        ),
        std::path::Path::new("fulcrum.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let cluster = &c.clusters[0];
    assert!(cluster.users.is_empty());
    let aq = cluster.auth_query.as_ref().expect("auth_query");
    assert_eq!(aq.user, "pgbouncer");
    assert_eq!(aq.query, crate::defaults::AUTH_QUERY_PG);
    assert_eq!(aq.database, "postgres");
    assert_eq!(aq.cache_ttl, std::time::Duration::from_secs(60));
    // The probes default to the auth user.
    assert_eq!(cluster.health.user, "pgbouncer");
    assert_eq!(cluster.health.password, "pw");
}

#[test]
fn each_protocol_takes_its_own_client_auth_names() {
    let mysql = MINIMAL.replace("protocol = \"postgres\"", "protocol = \"mysql\"");
    let with =
        |base: &str, line: &str| base.replace("listen = ", &format!("{line}\n    listen = "));
    assert_errors(&[
        (
            &with(&mysql, "client_auth = \"scram-sha-256\""),
            "fulcrum.toml:4: cluster[0].client_auth: \"scram-sha-256\" is a PostgreSQL method; MySQL clusters take \
             \"mysql_native_password\", \"caching_sha2_password\" or \"trust\"",
        ),
        (
            &with(MINIMAL, "client_auth = \"caching_sha2_password\""),
            "fulcrum.toml:4: cluster[0].client_auth: \"caching_sha2_password\" is a MySQL method; PostgreSQL clusters \
             take \"scram-sha-256\", \"md5\", \"trust\", \"cert\" or \"hba\"",
        ),
        (
            &with(&mysql, "max_db_connections = 10"),
            "fulcrum.toml:4: cluster[0].max_db_connections: PostgreSQL only: a MySQL server connection serves \
             every schema; use max_user_connections",
        ),
    ]);
    let ok = crate::parse(
        &crate::tests::dedent(&with(&mysql, "client_auth = \"caching_sha2_password\"")),
        std::path::Path::new("fulcrum.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ok.clusters[0].client_auth,
        crate::ClientAuth::CachingSha2Password
    );
}

#[test]
fn server_connect_timeout_is_pgbouncers_name_for_connect_timeout() {
    let with = |line: &str| MINIMAL.replace("listen = ", &format!("{line}\n    listen = "));
    let c = crate::parse(
        &crate::tests::dedent(&with("server_connect_timeout = \"7s\"")),
        std::path::Path::new("fulcrum.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.clusters[0].connect_timeout,
        std::time::Duration::from_secs(7)
    );
    assert_errors(&[(
        &with("connect_timeout = \"3s\"\n    server_connect_timeout = \"7s\""),
        "fulcrum.toml:5: cluster[0].server_connect_timeout: is another name for connect_timeout, which is set too: keep one",
    )]);
}

#[test]
fn clusters_of_one_protocol_share_a_port_by_database() {
    // `second` gets its own cluster name and backend on the same listen.
    let pair = |first_extra: &str, second_extra: &str, second_protocol: &str| {
        let first = MINIMAL.replace(
            "    [[cluster.backend]]",
            &format!("{first_extra}    [[cluster.backend]]"),
        );
        let second = MINIMAL
            .replace("name = \"main\"", "name = \"other\"")
            .replace(
                "protocol = \"postgres\"",
                &format!("protocol = \"{second_protocol}\""),
            )
            .replace("127.0.0.1:5432", "127.0.0.1:5433")
            .replace(
                "    [[cluster.backend]]",
                &format!("{second_extra}    [[cluster.backend]]"),
            );
        format!("{first}{}", second.trim_start_matches('\n'))
    };
    let db = |name: &str| format!("    [[cluster.database]]\n    name = \"{name}\"\n");
    let ok = crate::parse(
        &crate::tests::dedent(&pair("", &db("reports"), "postgres")),
        std::path::Path::new("fulcrum.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ok.clusters[0].listen, ok.clusters[1].listen);
    assert_eq!(ok.clusters[1].databases[0].name, "reports");
    let pick = |db| {
        crate::cluster_for_database(&ok.clusters, |c| c, db)
            .map(|c| c.name.as_str())
            .unwrap()
    };
    assert_eq!(pick("reports"), "other", "the cluster listing it");
    assert_eq!(pick("app"), "main", "the one listing none takes the rest");
    assert_errors(&[
        (
            &pair(&db("app"), &db("app"), "postgres"),
            "fulcrum.toml:16: cluster[1].listen: 127.0.0.1:6432 is shared with cluster \"main\", which also lists \
             database \"app\": a database picks one cluster",
        ),
        (
            &pair("", &db("reports"), "mysql"),
            "fulcrum.toml:14: cluster[1].listen: 127.0.0.1:6432 is already used by cluster \"main\", of the other \
             protocol: only clusters of one protocol share a port",
        ),
    ]);
}

#[test]
fn topology_keys_are_validated() {
    assert_errors(&[
        (
            &with_key("topology = \"consul\""),
            "fulcrum.toml:5: cluster[0].topology: unknown value \"consul\", expected one of \"probe\", \"etcd\", \"patroni\"",
        ),
        (
            &with_key("topology = \"etcd\""),
            "fulcrum.toml:1: cluster[0].etcd_endpoints: required key is missing",
        ),
        (
            &with_key("etcd_endpoints = [\"127.0.0.1:2379\"]"),
            "fulcrum.toml:5: cluster[0].etcd_endpoints: is set but topology is not \"etcd\" (it is \"probe\")",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1\"]"),
            "fulcrum.toml:6: cluster[0].etcd_endpoints: \"127.0.0.1\" is not host:port",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = []"),
            "fulcrum.toml:6: cluster[0].etcd_endpoints: must list at least one endpoint",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1:2379\"]\n    etcd_prefix = \"fulcrum\""),
            "fulcrum.toml:7: cluster[0].etcd_prefix: must start with \"/\"",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1:2379\"]\n    etcd_lease = \"1s\""),
            "fulcrum.toml:7: cluster[0].etcd_lease: must be at least 2s (etcd's own minimum lease)",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1:2379\"]\n    etcd_user = \"root\""),
            "fulcrum.toml:7: cluster[0].etcd_user: needs etcd_password as well",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1:2379\"]\n    etcd_tls_certificate = \"c.pem\""),
            "fulcrum.toml:7: cluster[0].etcd_tls_certificate: needs etcd_tls_ca as well (TLS to etcd is on when it is set)",
        ),
        (
            &with_key("topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1:2379\"]\n    on_coordinator_loss = \"panic\""),
            "fulcrum.toml:7: cluster[0].on_coordinator_loss: unknown value \"panic\", expected one of \"hold\", \"last_known\"",
        ),
        (
            &with_key("on_coordinator_loss = \"hold\""),
            "fulcrum.toml:5: cluster[0].on_coordinator_loss: is set but topology is \"probe\": there is no coordinator to lose",
        ),
        (
            &with_key("topology = \"patroni\"\n    patroni_endpoints = [\"127.0.0.1:8008\"]"),
            "fulcrum.toml:6: cluster[0].patroni_endpoints: \"127.0.0.1:8008\" is not a Patroni REST URL (http://host:port or https://host:port)",
        ),
        (
            &with_key("topology = \"patroni\"\n    patroni_endpoints = [\"http://127.0.0.1:8008\"]\n    failover = \"promote\""),
            "fulcrum.toml:7: cluster[0].failover: failover = \"promote\" cannot go with topology = \"patroni\": Patroni promotes, Fulcrum follows (use failover = \"follow\")",
        ),
        (
            &with_key("topology = \"patroni\"\n    patroni_endpoints = [\"http://127.0.0.1:8008\"]\n    etcd_prefix = \"/x\""),
            "fulcrum.toml:7: cluster[0].etcd_prefix: is set but topology is not \"etcd\" (it is \"patroni\")",
        ),
    ]);
}

/// `MINIMAL` with a `[[cluster.mirror]]` table of `keys` (header on line
/// 11, the first key on line 12).
fn with_mirror(keys: &str) -> String {
    let keys: Vec<String> = keys.lines().map(|l| format!("    {l}\n")).collect();
    format!("{MINIMAL}    [[cluster.mirror]]\n{}", keys.concat())
}

#[test]
fn mirror_keys_are_validated() {
    let other_protocol = format!(
        "{}    [[cluster.mirror]]\n    cluster = \"my\"\n{}",
        MINIMAL,
        MINIMAL
            .replace("name = \"main\"", "name = \"my\"")
            .replace("\"postgres\"", "\"mysql\"")
            .replace("127.0.0.1:6432", "127.0.0.1:6433")
            .replace("127.0.0.1:5432", "127.0.0.1:3306")
            .trim_start_matches('\n')
    );
    assert_errors(&[
        (
            &with_mirror("exposure = 0.5"),
            "fulcrum.toml:11: cluster[0].mirror[0].cluster: required key is missing: the target, cluster = \"name\" or address = \"host:port\"",
        ),
        (
            &with_mirror("cluster = \"b\"\naddress = \"127.0.0.1:5433\""),
            "fulcrum.toml:13: cluster[0].mirror[0].address: give cluster or address, not both",
        ),
        (
            &with_mirror("cluster = \"b\"\nuser = \"u\""),
            "fulcrum.toml:12: cluster[0].mirror[0].user: only with address (a cluster target logs in as the client's user, with that cluster's login)",
        ),
        (
            &with_mirror("address = \"127.0.0.1:5433\""),
            "fulcrum.toml:11: cluster[0].mirror[0].user: required key is missing",
        ),
        (
            &with_mirror("address = \"127.0.0.1:5433\"\nuser = \"u\"\nexposure = 1.5"),
            "fulcrum.toml:14: cluster[0].mirror[0].exposure: must be from 0 to 1 (the share of clients mirrored), got 1.5",
        ),
        (
            &with_mirror("address = \"127.0.0.1:5433\"\nuser = \"u\"\nmirror_mode = \"fast\""),
            "fulcrum.toml:14: cluster[0].mirror[0].mirror_mode: unknown value \"fast\", expected one of \"async\", \"sync\"",
        ),
        (
            &with_mirror("address = \"127.0.0.1:5433\"\nuser = \"u\"\nmirror_queue = 0"),
            "fulcrum.toml:14: cluster[0].mirror[0].mirror_queue: must be at least 1, got 0",
        ),
        (
            &with_mirror("address = \"127.0.0.1:5433\"\nuser = \"u\"\nmirror_max_transaction_bytes = 0"),
            "fulcrum.toml:14: cluster[0].mirror[0].mirror_max_transaction_bytes: must be greater than zero",
        ),
        (
            &with_mirror("address = \"127.0.0.1:5433\"\nuser = \"u\"\nmirror_max_transaction_bytes = \"lots\""),
            "fulcrum.toml:14: cluster[0].mirror[0].mirror_max_transaction_bytes: invalid size \"lots\": expected a whole number and an optional unit (B, kB (or KB), MB, GB, TB), e.g. \"16MB\"",
        ),
        (
            &with_mirror("cluster = \"nope\""),
            "fulcrum.toml:12: cluster[0].mirror[0].cluster: no [[cluster]] is named \"nope\" (there are: main)",
        ),
        (
            &with_mirror("cluster = \"main\""),
            "fulcrum.toml:12: cluster[0].mirror[0].cluster: a cluster cannot mirror to itself",
        ),
        (
            &other_protocol,
            "fulcrum.toml:12: cluster[0].mirror[0].cluster: cluster \"my\" speaks another protocol",
        ),
    ]);
}

#[test]
fn a_mirror_cluster_target_resolves_to_its_primary_and_logins() {
    let text = format!(
        "{}    [[cluster.mirror]]\n    cluster = \"shadow\"\n    exposure = 1\n{}",
        MINIMAL,
        MINIMAL
            .replace("name = \"main\"", "name = \"shadow\"")
            .replace("127.0.0.1:6432", "127.0.0.1:6433")
            .replace("127.0.0.1:5432", "127.0.0.1:5440")
            .trim_start_matches('\n')
    );
    let config = crate::parse(&super::dedent(&text), std::path::Path::new("f.toml")).unwrap();
    let m = &config.clusters[0].mirrors[0];
    assert_eq!(m.address, "127.0.0.1:5440");
    assert_eq!(m.exposure, 1.0);
    assert!(!m.mirror_writes);
    assert_eq!(m.mirror_mode, crate::MirrorMode::Async);
    assert_eq!(m.mirror_max_transaction_bytes, 4 * 1024 * 1024);
    assert_eq!(m.login_for("app"), Some(("app", "secret")));
    // A user the target cluster does not list is not mirrored: never with
    // this cluster's password.
    assert_eq!(m.login_for("nobody"), None);
}
