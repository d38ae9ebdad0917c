//! Validates one `[[cluster]]` with its `[[cluster.user]]` and
//! `[[cluster.database]]` tables: per-key values, then the rules across
//! them (no duplicates, budgets that can be met). The credential keys are
//! in `credentials`, the backends in `backends`, the health and failover
//! keys in `health`, the result cache in `cache`.

use toml::Spanned;

use super::backends::backends;
use super::credentials;
use super::health::health;
use super::table::Table;
use crate::error::{Lines, Problem};
use crate::raw::{RawCluster, Tables, Value};
use crate::types::{
    defaults, BalancePolicy, CausalWait, ClientAuth, Cluster, Consistency, DefaultRoute, Protocol,
};

const PROTOCOLS: &[(&str, Protocol)] =
    &[("postgres", Protocol::Postgres), ("mysql", Protocol::Mysql)];
const BALANCES: &[(&str, BalancePolicy)] = &[
    ("round_robin", BalancePolicy::RoundRobin),
    ("weighted", BalancePolicy::Weighted),
    ("least_connections", BalancePolicy::LeastConnections),
    ("random", BalancePolicy::Random),
    ("p2c", BalancePolicy::P2c),
];
const DEFAULT_ROUTES: &[(&str, DefaultRoute)] = &[
    ("primary", DefaultRoute::Primary),
    ("replica", DefaultRoute::Replica),
];
const CAUSAL_WAITS: &[(&str, CausalWait)] = &[
    ("auto", CausalWait::Auto),
    ("always", CausalWait::Always),
    ("never", CausalWait::Never),
];
pub(super) fn cluster(
    raw: &Spanned<RawCluster>,
    index: usize,
    lines: &Lines,
    global: Option<&Spanned<crate::raw::RawGlobal>>,
    base: &std::path::Path,
) -> Result<Cluster, Problem> {
    let t = Table::new(lines, format!("cluster[{index}]"), raw.span());
    let c = raw.get_ref();
    let gt = global.map(|g| Table::new(lines, "fulcrum", g.span()));
    let name = t.text(&c.name, "name", None)?;
    let protocol = t.choice(&c.protocol, "protocol", PROTOCOLS, None)?;
    let listen = t.socket_addr(t.required(&c.listen, "listen")?, "listen")?;
    let pool_mode = super::user_pool::cluster_pool_mode(&t, c, protocol)?;
    let pool_size = t.u32_at_least(&c.pool_size, "pool_size", 1, defaults::POOL_SIZE)?;
    let client_auth = credentials::client_auth(&t, c, protocol)?;
    let unix_socket =
        super::unix_socket::unix_socket(&t, c, protocol, listen.port(), client_auth, base)?;
    let pool_timeout = t.duration(&c.pool_timeout, "pool_timeout", defaults::POOL_TIMEOUT)?;
    // `server_connect_timeout` is PgBouncer's name for the same setting.
    let connect_timeout = match (&c.connect_timeout, &c.server_connect_timeout) {
        (Some(_), Some(v)) => {
            return Err(t.error(
                v,
                "server_connect_timeout",
                "is another name for connect_timeout, which is set too: keep one",
            ))
        }
        (None, Some(_)) => t.duration(
            &c.server_connect_timeout,
            "server_connect_timeout",
            defaults::CONNECT_TIMEOUT,
        )?,
        _ => t.duration(
            &c.connect_timeout,
            "connect_timeout",
            defaults::CONNECT_TIMEOUT,
        )?,
    };
    // "0s" is off, as 0 is in PgBouncer: no limit but max_pending_logins.
    let client_login_timeout = match &c.client_login_timeout {
        None => defaults::CLIENT_LOGIN_TIMEOUT,
        Some(_) => t
            .duration_or_off(&c.client_login_timeout, "client_login_timeout")?
            .unwrap_or(defaults::CLIENT_LOGIN_TIMEOUT_OFF),
    };
    let client_idle_timeout = t.duration_or_off(&c.client_idle_timeout, "client_idle_timeout")?;
    let idle_transaction_timeout =
        t.duration_or_off(&c.idle_transaction_timeout, "idle_transaction_timeout")?;
    let query_timeout = t.duration_or_off(&c.query_timeout, "query_timeout")?;
    let server_idle_timeout = t.duration(
        &c.server_idle_timeout,
        "server_idle_timeout",
        defaults::SERVER_IDLE_TIMEOUT,
    )?;
    let server_lifetime = match &c.server_lifetime {
        None => Some(defaults::SERVER_LIFETIME),
        Some(_) => t.duration_or_off(&c.server_lifetime, "server_lifetime")?,
    };
    let max_message_size = t.size(
        &c.max_message_size,
        "max_message_size",
        defaults::MAX_MESSAGE_SIZE,
    )?;
    let max_client_connections = t.u32_at_least(
        &c.max_client_connections,
        "max_client_connections",
        1,
        defaults::MAX_CLIENT_CONNECTIONS,
    )?;
    let notify_queue =
        t.u32_at_least(&c.notify_queue, "notify_queue", 1, defaults::NOTIFY_QUEUE)?;
    let max_client_notify_bytes = t.size(
        &c.max_client_notify_bytes,
        "max_client_notify_bytes",
        defaults::MAX_CLIENT_NOTIFY_BYTES,
    )?;
    let max_pending_logins = t.u32_at_least(
        &c.max_pending_logins,
        "max_pending_logins",
        1,
        defaults::MAX_PENDING_LOGINS,
    )?;
    let max_prepared_statements = t.u32_at_least(
        &c.max_prepared_statements,
        "max_prepared_statements",
        0,
        defaults::MAX_PREPARED_STATEMENTS,
    )?;
    let max_client_prepared_statements = t.u32_at_least(
        &c.max_client_prepared_statements,
        "max_client_prepared_statements",
        1,
        defaults::MAX_CLIENT_PREPARED_STATEMENTS,
    )?;
    let max_client_settings = t.u32_at_least(
        &c.max_client_settings,
        "max_client_settings",
        1,
        defaults::MAX_CLIENT_SETTINGS,
    )?;
    let max_client_settings_bytes = t.size(
        &c.max_client_settings_bytes,
        "max_client_settings_bytes",
        defaults::MAX_CLIENT_SETTINGS_BYTES,
    )?;
    let max_client_prepared_bytes = t.size(
        &c.max_client_prepared_bytes,
        "max_client_prepared_bytes",
        defaults::MAX_CLIENT_PREPARED_BYTES,
    )?;
    let reads_on_primary = c.reads_on_primary.as_ref().is_some_and(|v| *v.get_ref());
    let balance = t.choice(&c.balance, "balance", BALANCES, Some(defaults::BALANCE))?;
    let default_route = t.choice(
        &c.default_route,
        "default_route",
        DEFAULT_ROUTES,
        Some(defaults::DEFAULT_ROUTE),
    )?;
    let write_functions = function_list(&t, &c.write_functions, "write_functions")?;
    let read_only_functions = function_list(&t, &c.read_only_functions, "read_only_functions")?;
    let session_free_functions =
        function_list(&t, &c.session_free_functions, "session_free_functions")?;
    let function_catalog_ttl = t.duration(
        &c.function_catalog_ttl,
        "function_catalog_ttl",
        defaults::FUNCTION_CATALOG_TTL,
    )?;
    let function_catalog_wait = t.duration(
        &c.function_catalog_wait,
        "function_catalog_wait",
        defaults::FUNCTION_CATALOG_WAIT,
    )?;
    let function_catalog = c
        .function_catalog
        .as_ref()
        .is_none_or(|v| *v.get_ref())
        .then_some(function_catalog_ttl);
    let classifier_cache_size = t.u32_at_least(
        &c.classifier_cache_size,
        "classifier_cache_size",
        0,
        defaults::CLASSIFIER_CACHE_SIZE,
    )?;
    let digests = crate::types::Digests {
        max_entries: t.u32_at_least(
            &c.digest_max_entries,
            "digest_max_entries",
            0,
            defaults::DIGEST_MAX_ENTRIES,
        )?,
        metrics_top: t.u32_at_least(&c.digest_metrics_top, "digest_metrics_top", 0, 0)?,
    };
    let budgets = pool_budgets(&t, c, pool_size, protocol)?;
    let pool_rules = super::user_pool::Rules {
        protocol,
        min_pool_size: budgets.min_pool_size,
    };
    let max_classify_bytes = t.size(
        &c.max_classify_bytes,
        "max_classify_bytes",
        defaults::MAX_CLASSIFY_BYTES,
    )?;
    let tls = crate::tls::client_tls(
        &t,
        c,
        gt.as_ref(),
        global.map(|g| g.get_ref()),
        protocol,
        base,
    )?;
    if client_auth == ClientAuth::Cert {
        let auth_value = c.client_auth.as_ref().expect("cert is never the default");
        if protocol != Protocol::Postgres {
            return Err(t.error(
                auth_value,
                "client_auth",
                "\"cert\" is for PostgreSQL clusters only",
            ));
        }
        let ready = tls
            .as_ref()
            .is_some_and(|tls| tls.mode == crate::TlsMode::Require && tls.client_ca.is_some());
        if !ready {
            return Err(t.error(
                auth_value,
                "client_auth",
                "client_auth = \"cert\" needs tls_mode = \"require\" and tls_client_ca (the CA that signs the clients' certificates)",
            ));
        }
    }
    let hba = super::hba::hba(&t, c, client_auth, tls.as_ref(), base)?;
    let allow_local_infile = c.allow_local_infile.as_ref().is_some_and(|v| *v.get_ref());
    let server_reset_query = c.server_reset_query.as_ref().map_or_else(
        || "DISCARD ALL".to_owned(),
        |v| v.get_ref().trim().to_owned(),
    );
    let server_reset_query_always = c
        .server_reset_query_always
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    let server_cleartext = c.server_cleartext.as_ref().is_some_and(|v| *v.get_ref());
    let backends = backends(&t, c, &name, base)?;
    let connect_query = super::databases::connect_query(&t, &c.connect_query)?;
    let databases = super::databases::databases(&t, c, protocol, base)?;
    let mirrors = super::mirror::mirrors(&t, c, base)?;
    // With auth_user, users may all come from the server.
    let users = if c.user.is_none() && c.auth_user.is_some() {
        Vec::new()
    } else {
        credentials::users(&t, &c.user, &name, protocol, client_auth, base, pool_rules)?
    };
    let user_default = super::user_pool::user_default(&t, c, pool_rules)?;
    let auth_query = credentials::auth_query(&t, c, protocol, &users, base)?;
    if let (Some(_), Some(v), ClientAuth::Trust | ClientAuth::Cert) =
        (&auth_query, &c.auth_user, client_auth)
    {
        return Err(t.error(
            v,
            "auth_user",
            format!(
                "auth_query needs client_auth = \"scram-sha-256\" or \"md5\": Fulcrum logs in to the server with what the client proves (client_auth is {:?})",
                client_auth.name()
            ),
        ));
    }
    let health = health(&t, c, protocol, &users, auth_query.as_ref(), base)?;
    let topology = super::topology::topology(&t, c, &health, base)?;
    let consistency = t.choice(
        &c.consistency,
        "consistency",
        Consistency::NAMES,
        Some(defaults::CONSISTENCY),
    )?;
    let causal_timeout = t.duration(
        &c.causal_timeout,
        "causal_timeout",
        defaults::CAUSAL_TIMEOUT,
    )?;
    let causal_wait = t.choice(
        &c.causal_wait,
        "causal_wait",
        CAUSAL_WAITS,
        Some(defaults::CAUSAL_WAIT),
    )?;
    let transaction_replay = transaction_replay(&t, c)?;
    let cache = super::cache::cache(&t, c)?;
    Ok(Cluster {
        name,
        protocol,
        listen,
        unix_socket,
        pool_mode,
        pool_size,
        client_auth,
        hba,
        pool_timeout,
        connect_timeout,
        client_login_timeout,
        client_idle_timeout,
        idle_transaction_timeout,
        query_timeout,
        server_idle_timeout,
        server_lifetime,
        max_message_size,
        max_client_connections,
        notify_queue,
        max_client_notify_bytes,
        max_pending_logins,
        max_prepared_statements,
        max_client_prepared_statements,
        max_client_settings,
        max_client_settings_bytes,
        max_client_prepared_bytes,
        reads_on_primary,
        balance,
        default_route,
        write_functions,
        read_only_functions,
        session_free_functions,
        function_catalog,
        function_catalog_wait,
        classifier_cache_size,
        digests,
        budgets,
        max_classify_bytes,
        tls,
        allow_local_infile,
        server_reset_query,
        server_reset_query_always,
        connect_query,
        server_cleartext,
        health,
        topology,
        auth_query,
        consistency,
        causal_timeout,
        causal_wait,
        transaction_replay,
        backends,
        users,
        user_default,
        databases,
        mirrors,
        cache,
    })
}

/// `transaction_replay` and its limits (read even when off, so a typo in
/// them is caught before the feature is turned on).
fn transaction_replay(
    t: &Table,
    c: &RawCluster,
) -> Result<Option<crate::types::TransactionReplay>, Problem> {
    let max_size = t.size(
        &c.transaction_replay_max_size,
        "transaction_replay_max_size",
        defaults::TRANSACTION_REPLAY_MAX_SIZE,
    )?;
    let timeout = t.duration(
        &c.transaction_replay_timeout,
        "transaction_replay_timeout",
        defaults::TRANSACTION_REPLAY_TIMEOUT,
    )?;
    let on = c.transaction_replay.as_ref().is_some_and(|v| *v.get_ref());
    let debug = c
        .transaction_replay_debug
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    let resolve_commits = c
        .transaction_replay_resolve_commits
        .as_ref()
        .is_none_or(|v| *v.get_ref());
    Ok(on.then_some(crate::types::TransactionReplay {
        max_size,
        timeout,
        debug,
        resolve_commits,
    }))
}

/// PgBouncer's pool budgets. `min_pool_size` above `pool_size` could never
/// be met, and a per-database or per-user cap below it would keep a pool
/// from ever reaching its minimum: both are errors.
fn pool_budgets(
    t: &Table,
    c: &RawCluster,
    pool_size: u32,
    protocol: Protocol,
) -> Result<crate::types::PoolBudgets, Problem> {
    if let (Protocol::Mysql, Some(v)) = (protocol, &c.max_db_connections) {
        return Err(t.error(
            v,
            "max_db_connections",
            "PostgreSQL only: a MySQL server connection serves every schema; \
             use max_user_connections",
        ));
    }
    let min_pool_size = t.u32_at_least(&c.min_pool_size, "min_pool_size", 0, 0)?;
    if min_pool_size > pool_size {
        if let Some(v) = &c.min_pool_size {
            return Err(t.error(
                v,
                "min_pool_size",
                format!("must not exceed pool_size ({pool_size})"),
            ));
        }
    }
    let max_db_connections = t.u32_at_least(&c.max_db_connections, "max_db_connections", 0, 0)?;
    let max_user_connections =
        t.u32_at_least(&c.max_user_connections, "max_user_connections", 0, 0)?;
    for (value, name, cap) in [
        (
            &c.max_db_connections,
            "max_db_connections",
            max_db_connections,
        ),
        (
            &c.max_user_connections,
            "max_user_connections",
            max_user_connections,
        ),
    ] {
        if cap > 0 && cap < min_pool_size {
            if let Some(v) = value {
                return Err(t.error(
                    v,
                    name,
                    format!("must be 0 (no cap) or at least min_pool_size ({min_pool_size})"),
                ));
            }
        }
    }
    Ok(crate::types::PoolBudgets {
        min_pool_size,
        reserve_pool_size: t.u32_at_least(&c.reserve_pool_size, "reserve_pool_size", 0, 0)?,
        reserve_pool_timeout: t.duration(
            &c.reserve_pool_timeout,
            "reserve_pool_timeout",
            defaults::RESERVE_POOL_TIMEOUT,
        )?,
        max_db_connections,
        max_user_connections,
        // "0s" means every reuse is checked, as PgBouncer's 0.
        server_check_delay: match &c.server_check_delay {
            None => defaults::SERVER_CHECK_DELAY,
            Some(_) => t
                .duration_or_off(&c.server_check_delay, "server_check_delay")?
                .unwrap_or(std::time::Duration::ZERO),
        },
    })
}

/// A list of SQL function names: identifiers, optionally schema-qualified.
fn function_list(t: &Table, raw: &Value<Vec<String>>, name: &str) -> Result<Vec<String>, Problem> {
    let Some(list) = raw else {
        return Ok(Vec::new());
    };
    for f in list.get_ref() {
        let ok = !f.is_empty()
            && f.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
            });
        if !ok {
            return Err(t.error(list, name, format!("{f:?} is not a function name")));
        }
    }
    // Only the unqualified name is matched (schema-qualified calls match too).
    Ok(list
        .get_ref()
        .iter()
        .map(|f| f.rsplit('.').next().unwrap_or(f).to_ascii_lowercase())
        .collect())
}

/// The tables of an array, or a problem saying the cluster needs at least one.
pub(super) fn non_empty<'r, T>(
    t: &Table,
    raw: &'r Value<Tables<T>>,
    name: &str,
    reason: String,
) -> Result<&'r [Spanned<T>], Problem> {
    match raw {
        None => Err(t.error_at_header(name, reason)),
        Some(tables) if tables.get_ref().0.is_empty() => Err(t.error(tables, name, reason)),
        Some(tables) => Ok(&tables.get_ref().0),
    }
}
