//! Valid files: every key read into the expected `Config`, defaults filled in, and the
//! shipped examples in config/*.toml accepted by `load`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{dedent, MINIMAL};
use crate::{
    defaults, load, parse, Backend, BalancePolicy, ClientAuth, Cluster, Config, ConfigError,
    DefaultRoute, Failover, Global, Health, LogFormat, MaxLag, PoolMode, Protocol, Role, User,
};

fn parse_ok(text: &str) -> Config {
    parse(&dedent(text), Path::new("fulcrum.toml")).unwrap_or_else(|e| panic!("{e}"))
}

fn backend(address: &str, role: Role, weight: u32) -> Backend {
    Backend {
        address: address.into(),
        role,
        weight,
        // The default: TLS when the server offers it (libpq's and PgBouncer's).
        tls: crate::ServerTls {
            mode: crate::ServerTlsMode::Prefer,
            ..crate::ServerTls::disabled()
        },
    }
}

fn user(name: &str, password: &str) -> User {
    User::new(name, password)
}

#[test]
fn every_key_is_read_into_the_config() {
    let config = parse_ok(
        r#"
        [fulcrum]
        admin = "127.0.0.1:6480"
        metrics = "[::1]:9930"
        log = "fulcrum=debug,info"
        workers = 2
        log_format = "json"
        slow_query_threshold = "250ms"
        shutdown_timeout = "10s"
        dns_max_ttl = "0s"
        admin_auth = "md5"

        [[fulcrum.admin_user]]
        name = "ops"
        password = "ops secret"

        [[cluster]]
        name = "main"
        protocol = "postgres"
        listen = "0.0.0.0:6432"
        pool_mode = "session"
        pool_size = 7
        client_auth = "md5"
        pool_timeout = "250ms"
        connect_timeout = "2s"
        client_login_timeout = "5s"
        client_idle_timeout = "1m"
        idle_transaction_timeout = "0s"
        server_idle_timeout = "1h"
        server_lifetime = "0s"
        max_message_size = "64kB"
        max_client_connections = 50
        max_pending_logins = 16
        max_prepared_statements = 0
        reads_on_primary = true
        balance = "least_connections"
        default_route = "replica"
        write_functions = ["audit.log_event", "bump"]
        read_only_functions = ["my_pure_fn"]
        classifier_cache_size = 0
        max_classify_bytes = "4kB"
        health_interval = "500ms"
        health_timeout = "250ms"
        health_failures = 3
        health_user = "postgres"
        health_password = ""
        max_lag = "16MB"
        failover_max_lag = "30s"
        failover = "promote"
        failover_timeout = "2s"
        failover_command = "/usr/local/bin/notify %h:%p %H:%r"

        [[cluster.backend]]
        address = "db-primary.internal:5432"
        role = "primary"
        weight = 0

        [[cluster.backend]]
        address = "[::1]:5433"
        role = "replica"
        weight = 3

        [[cluster.user]]
        name = "app"
        password = "secret"

        [[cluster.user]]
        name = "report"
        password = "also secret"

        [[cluster]]
        name = "shop"
        protocol = "mysql"
        listen = "127.0.0.1:6433"
        client_auth = "trust"
        max_message_size = 1048576
        max_lag = "2s"
        failover = "none"
        allow_local_infile = true
        backend = [{ address = "127.0.0.1:3306", role = "auto" }]
        user = [{ name = "shop", password = "" }]
        "#,
    );
    let want = Config {
        source: PathBuf::from("fulcrum.toml"),
        fulcrum: Global {
            admin: Some("127.0.0.1:6480".parse().unwrap()),
            metrics: Some("[::1]:9930".parse().unwrap()),
            log: "fulcrum=debug,info".into(),
            workers: 2,
            log_format: LogFormat::Json,
            slow_query_threshold: Some(Duration::from_millis(250)),
            shutdown_timeout: Duration::from_secs(10),
            upgrade_timeout: Duration::from_secs(600),
            dns_max_ttl: Duration::ZERO,
            admin_users: vec![user("ops", "ops secret")],
            admin_auth: ClientAuth::Md5,
            stats_users: Vec::new(),
            status_key: None,
            admin_tls: None,
        },
        clusters: vec![
            Cluster {
                name: "main".into(),
                protocol: Protocol::Postgres,
                listen: "0.0.0.0:6432".parse().unwrap(),
                unix_socket: None,
                pool_mode: PoolMode::Session,
                pool_size: 7,
                client_auth: ClientAuth::Md5,
                hba: None,
                pool_timeout: Duration::from_millis(250),
                connect_timeout: Duration::from_secs(2),
                client_login_timeout: Duration::from_secs(5),
                client_idle_timeout: Some(Duration::from_secs(60)),
                idle_transaction_timeout: None,
                query_timeout: None,
                server_idle_timeout: Duration::from_secs(3600),
                server_lifetime: None,
                max_message_size: 64 * 1024,
                max_client_connections: 50,
                notify_queue: defaults::NOTIFY_QUEUE,
                max_client_notify_bytes: defaults::MAX_CLIENT_NOTIFY_BYTES,
                max_pending_logins: 16,
                max_prepared_statements: 0,
                max_client_prepared_statements: defaults::MAX_CLIENT_PREPARED_STATEMENTS,
                max_client_settings: defaults::MAX_CLIENT_SETTINGS,
                max_client_settings_bytes: defaults::MAX_CLIENT_SETTINGS_BYTES,
                max_client_prepared_bytes: defaults::MAX_CLIENT_PREPARED_BYTES,
                reads_on_primary: true,
                balance: BalancePolicy::LeastConnections,
                default_route: DefaultRoute::Replica,
                write_functions: vec!["log_event".into(), "bump".into()],
                read_only_functions: vec!["my_pure_fn".into()],
                session_free_functions: vec![],
                function_catalog: Some(defaults::FUNCTION_CATALOG_TTL),
                function_catalog_wait: defaults::FUNCTION_CATALOG_WAIT,
                classifier_cache_size: 0,
                digests: Default::default(),
                budgets: Default::default(),
                max_classify_bytes: 4096,
                tls: None,
                allow_local_infile: false,
                server_reset_query: "DISCARD ALL".into(),
                server_reset_query_always: false,
                connect_query: None,
                server_cleartext: false,
                auth_query: None,
                topology: crate::Topology::Probe,
                health: Health {
                    interval: Duration::from_millis(500),
                    timeout: Duration::from_millis(250),
                    failures: 3,
                    user: "postgres".into(),
                    password: String::new(),
                    database: "postgres".into(),
                    max_lag: Some(MaxLag::Bytes(16 * 1024 * 1024)),
                    failover_max_lag: MaxLag::Time(Duration::from_secs(30)),
                    failover: Failover::Promote,
                    failover_timeout: Duration::from_secs(2),
                    failover_command: Some("/usr/local/bin/notify %h:%p %H:%r".into()),
                },
                consistency: defaults::CONSISTENCY,
                causal_timeout: defaults::CAUSAL_TIMEOUT,
                causal_wait: defaults::CAUSAL_WAIT,
                transaction_replay: None,
                backends: vec![
                    backend("db-primary.internal:5432", Role::Primary, 0),
                    backend("[::1]:5433", Role::Replica, 3),
                ],
                users: vec![user("app", "secret"), user("report", "also secret")],
                user_default: Default::default(),
                databases: vec![],
                mirrors: vec![],
                cache: Default::default(),
            },
            Cluster {
                name: "shop".into(),
                protocol: Protocol::Mysql,
                listen: "127.0.0.1:6433".parse().unwrap(),
                unix_socket: None,
                pool_mode: defaults::POOL_MODE,
                pool_size: defaults::POOL_SIZE,
                client_auth: ClientAuth::Trust,
                hba: None,
                pool_timeout: defaults::POOL_TIMEOUT,
                connect_timeout: defaults::CONNECT_TIMEOUT,
                client_login_timeout: defaults::CLIENT_LOGIN_TIMEOUT,
                client_idle_timeout: None,
                idle_transaction_timeout: None,
                query_timeout: None,
                server_idle_timeout: defaults::SERVER_IDLE_TIMEOUT,
                server_lifetime: Some(defaults::SERVER_LIFETIME),
                max_message_size: 1024 * 1024,
                max_client_connections: defaults::MAX_CLIENT_CONNECTIONS,
                notify_queue: defaults::NOTIFY_QUEUE,
                max_client_notify_bytes: defaults::MAX_CLIENT_NOTIFY_BYTES,
                max_pending_logins: defaults::MAX_PENDING_LOGINS,
                max_prepared_statements: defaults::MAX_PREPARED_STATEMENTS,
                max_client_prepared_statements: defaults::MAX_CLIENT_PREPARED_STATEMENTS,
                max_client_settings: defaults::MAX_CLIENT_SETTINGS,
                max_client_settings_bytes: defaults::MAX_CLIENT_SETTINGS_BYTES,
                max_client_prepared_bytes: defaults::MAX_CLIENT_PREPARED_BYTES,
                reads_on_primary: false,
                balance: defaults::BALANCE,
                default_route: defaults::DEFAULT_ROUTE,
                write_functions: vec![],
                read_only_functions: vec![],
                session_free_functions: vec![],
                function_catalog: Some(defaults::FUNCTION_CATALOG_TTL),
                function_catalog_wait: defaults::FUNCTION_CATALOG_WAIT,
                classifier_cache_size: defaults::CLASSIFIER_CACHE_SIZE,
                digests: Default::default(),
                budgets: Default::default(),
                max_classify_bytes: defaults::MAX_CLASSIFY_BYTES,
                tls: None,
                allow_local_infile: true,
                server_reset_query: "DISCARD ALL".into(),
                server_reset_query_always: false,
                connect_query: None,
                server_cleartext: false,
                auth_query: None,
                topology: crate::Topology::Probe,
                health: Health {
                    interval: defaults::HEALTH_INTERVAL,
                    timeout: defaults::HEALTH_TIMEOUT,
                    failures: defaults::HEALTH_FAILURES,
                    user: "shop".into(),
                    password: String::new(),
                    database: String::new(), // no default database for MySQL probes
                    max_lag: Some(MaxLag::Time(Duration::from_secs(2))),
                    failover_max_lag: MaxLag::Time(Duration::from_secs(2)),
                    failover: Failover::None,
                    failover_timeout: defaults::FAILOVER_TIMEOUT,
                    failover_command: None,
                },
                consistency: defaults::CONSISTENCY,
                causal_timeout: defaults::CAUSAL_TIMEOUT,
                causal_wait: defaults::CAUSAL_WAIT,
                transaction_replay: None,
                backends: vec![backend("127.0.0.1:3306", Role::Auto, defaults::WEIGHT)],
                users: vec![user("shop", "")],
                user_default: Default::default(),
                databases: vec![],
                mirrors: vec![],
                cache: Default::default(),
            },
        ],
    };
    assert_eq!(config, want);
}

#[test]
fn omitted_keys_take_their_documented_defaults() {
    let config = parse_ok(MINIMAL);
    assert_eq!(
        config.fulcrum,
        Global {
            admin: None,
            metrics: None,
            log: "info".into(),
            workers: 0,
            log_format: LogFormat::Text,
            slow_query_threshold: None,
            shutdown_timeout: Duration::from_secs(30),
            upgrade_timeout: Duration::from_secs(600),
            dns_max_ttl: Duration::from_secs(15),
            admin_users: vec![],
            admin_auth: ClientAuth::ScramSha256,
            stats_users: Vec::new(),
            status_key: None,
            admin_tls: None,
        }
    );
    let c = &config.clusters[0];
    assert_eq!(c.pool_mode, PoolMode::Transaction);
    assert_eq!(c.pool_size, 20);
    assert_eq!(c.client_auth, ClientAuth::ScramSha256);
    assert_eq!(c.pool_timeout, Duration::from_secs(5));
    assert_eq!(c.connect_timeout, Duration::from_secs(3));
    assert_eq!(c.client_login_timeout, Duration::from_secs(15));
    assert_eq!(c.server_idle_timeout, Duration::from_secs(600));
    assert_eq!(c.server_lifetime, Some(Duration::from_secs(3600)));
    assert_eq!(c.max_message_size, 64 * 1024 * 1024);
    assert_eq!(c.max_client_settings, 1_000);
    assert_eq!(c.max_client_connections, 10_000);
    assert_eq!(c.max_pending_logins, 512);
    assert_eq!(c.max_prepared_statements, 1_000);
    assert_eq!(c.health.interval, Duration::from_secs(1));
    assert_eq!(c.health.timeout, Duration::from_secs(1));
    assert_eq!(c.health.failures, 2);
    assert_eq!(
        c.health.user, c.users[0].name,
        "probes log in as the first user"
    );
    assert_eq!(c.health.password, c.users[0].password);
    assert_eq!(c.health.database, "postgres");
    assert_eq!(c.health.max_lag, None);
    assert_eq!(c.health.failover_max_lag, MaxLag::Bytes(16 * 1024 * 1024));
    assert_eq!(c.health.failover, Failover::Follow);
    assert_eq!(c.health.failover_timeout, Duration::from_secs(3));
    assert_eq!(c.health.failover_command, None);
    assert_eq!(
        c.backends,
        vec![backend("127.0.0.1:5432", Role::Primary, 1)]
    );
}

#[test]
fn listeners_on_port_zero_never_collide() {
    // Tests let the OS pick ports; several clusters may all say port 0.
    let second = MINIMAL
        .replace("\"main\"", "\"b\"")
        .replace("127.0.0.1:6432", "127.0.0.1:0");
    let text = format!(
        "{}{}",
        MINIMAL.replace("127.0.0.1:6432", "127.0.0.1:0"),
        second
    );
    assert_eq!(parse_ok(&text).clusters.len(), 2);
}

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config")
        .join(name)
}

#[test]
fn shipped_example_config_loads_with_the_contract_values() {
    let config = load(&shipped("fulcrum.toml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.fulcrum.admin,
        Some("127.0.0.1:6480".parse().unwrap())
    );
    assert_eq!(
        config.fulcrum.metrics,
        Some("127.0.0.1:9930".parse().unwrap())
    );
    assert_eq!(config.fulcrum.log, "info");
    let [c] = config.clusters.as_slice() else {
        panic!("one cluster")
    };
    assert_eq!((c.name.as_str(), c.protocol), ("main", Protocol::Postgres));
    assert_eq!(c.listen, "127.0.0.1:6432".parse().unwrap());
    assert_eq!(
        (c.pool_mode, c.pool_size, c.client_auth),
        (PoolMode::Transaction, 20, ClientAuth::ScramSha256)
    );
    assert_eq!(
        c.backends,
        vec![backend("127.0.0.1:5432", Role::Primary, 1)]
    );
    assert_eq!(c.users, vec![user("app", "secret")]);
}

#[test]
fn shipped_session_pool_config_loads() {
    let config = load(&shipped("session-pool.toml")).unwrap_or_else(|e| panic!("{e}"));
    let [c] = config.clusters.as_slice() else {
        panic!("one cluster")
    };
    assert_eq!(
        (c.pool_mode, c.client_auth),
        (PoolMode::Session, ClientAuth::Md5)
    );
    let roles: Vec<(&str, Role)> = c
        .backends
        .iter()
        .map(|b| (b.address.as_str(), b.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("127.0.0.1:55432", Role::Primary),
            ("127.0.0.1:55433", Role::Replica),
            ("127.0.0.1:55434", Role::Replica)
        ]
    );
}

#[test]
fn an_unreadable_file_is_a_read_error() {
    let path = Path::new("/nonexistent/fulcrum.toml");
    let err = load(path).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Read { error, .. } if error.kind() == std::io::ErrorKind::NotFound)
    );
    assert_eq!(
        err.to_string(),
        "/nonexistent/fulcrum.toml: cannot read: No such file or directory (os error 2)"
    );
}

#[test]
fn passwords_never_appear_in_debug_output() {
    let config = parse_ok(MINIMAL);
    assert!(!format!("{config:?}").contains("secret"));
}

#[test]
fn a_zero_login_timeout_is_off_as_in_pgbouncer() {
    let text = MINIMAL.replace(
        "listen = \"127.0.0.1:6432\"",
        "listen = \"127.0.0.1:6432\"\n    client_login_timeout = \"0s\"",
    );
    let c = &parse_ok(&text).clusters[0];
    assert_eq!(c.client_login_timeout, defaults::CLIENT_LOGIN_TIMEOUT_OFF);
    assert!(c.client_login_timeout > Duration::from_secs(365 * 86_400));
}
