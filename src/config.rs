//! The config texts the tests run Fulcrum with: a one-cluster PostgreSQL
//! config with the testkit's users ([`PgProxyConfig`]), a one-cluster MySQL
//! config ([`maria_toml`]), and a metrics listener or the admin console
//! added to either ([`with_metrics`], [`with_console`]).

use fulcrum_testkit::{
    free_port, MariaCluster, APP_MD5_USER, APP_PASSWORD, APP_PLAIN_USER, APP_TRUST_USER, APP_USER,
};

/// A one-cluster MySQL config (cluster `shop`) for Fulcrum in front of `c`,
/// listening on `port`: the primary and every replica as backends, the
/// testkit's `app` user, probes as `root`; `extra` holds more `key = value`
/// lines for the `[[cluster]]` table.
pub fn maria_toml(c: &MariaCluster, port: u16, extra: &str) -> String {
    let mut t = format!(
        "[fulcrum]\nlog = \"info\"\n\n[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_user = \"root\"\nhealth_password = \"\"\n{extra}\n"
    );
    t.push_str(&format!(
        "[[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n",
        c.primary().addr()
    ));
    for r in c.replicas() {
        t.push_str(&format!(
            "[[cluster.backend]]\naddress = \"{}\"\nrole = \"replica\"\n",
            r.addr()
        ));
    }
    t.push_str(&format!(
        "[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n"
    ));
    t
}

/// A one-cluster PostgreSQL config for Fulcrum, with the testkit's users.
#[derive(Debug, Clone)]
pub struct PgProxyConfig {
    pub listen: String,
    pub pool_mode: &'static str,
    pub pool_size: u32,
    pub client_auth: &'static str,
    /// (address, role)
    pub backends: Vec<(String, &'static str)>,
    /// Extra `key = value` lines for the `[[cluster]]` table.
    pub extra: Vec<String>,
    /// (user, lines) added to that user's `[[cluster.user]]` table.
    pub user_keys: Vec<(String, String)>,
    pub log: &'static str,
}

impl PgProxyConfig {
    /// Transaction pooling, 20 server connections, SCRAM, on a free port.
    pub fn new(primary: &str) -> PgProxyConfig {
        PgProxyConfig {
            listen: format!("127.0.0.1:{}", free_port()),
            pool_mode: "transaction",
            pool_size: 20,
            client_auth: "scram-sha-256",
            backends: vec![(primary.to_owned(), "primary")],
            extra: Vec::new(),
            user_keys: Vec::new(),
            log: if std::env::var_os("FULCRUM_TEST_TRACE").is_some() {
                "trace"
            } else {
                "info"
            },
        }
    }

    pub fn pool_mode(mut self, mode: &'static str) -> Self {
        self.pool_mode = mode;
        self
    }

    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool_size = n;
        self
    }

    pub fn client_auth(mut self, auth: &'static str) -> Self {
        self.client_auth = auth;
        self
    }

    pub fn replica(mut self, address: &str) -> Self {
        self.backends.push((address.to_owned(), "replica"));
        self
    }

    pub fn extra(mut self, line: &str) -> Self {
        self.extra.push(line.to_owned());
        self
    }

    /// Adds `lines` to `user`'s `[[cluster.user]]` table; a user not among
    /// the harness's four gets a table of its own, with the test password.
    pub fn user_keys(mut self, user: &str, lines: &str) -> Self {
        self.user_keys.push((user.to_owned(), lines.to_owned()));
        self
    }

    /// `host=... port=...` for tokio-postgres, as `user` with the test password.
    pub fn conn_string(&self, user: &str, db: &str) -> String {
        pg_conn_string(&self.listen, user, db)
    }

    pub fn to_toml(&self) -> String {
        let mut t = format!(
            "[fulcrum]\nlog = \"{}\"\n\n[[cluster]]\nname = \"main\"\nprotocol = \"postgres\"\nlisten = \"{}\"\npool_mode = \"{}\"\npool_size = {}\nclient_auth = \"{}\"\n",
            self.log, self.listen, self.pool_mode, self.pool_size, self.client_auth
        );
        for line in &self.extra {
            t.push_str(line);
            t.push('\n');
        }
        for (address, role) in &self.backends {
            t.push_str(&format!(
                "\n[[cluster.backend]]\naddress = \"{address}\"\nrole = \"{role}\"\nweight = 1\n"
            ));
        }
        let mut users: Vec<&str> = vec![APP_USER, APP_MD5_USER, APP_PLAIN_USER, APP_TRUST_USER];
        for (user, _) in &self.user_keys {
            if !users.contains(&user.as_str()) {
                users.push(user);
            }
        }
        for user in users {
            t.push_str(&format!(
                "\n[[cluster.user]]\nname = \"{user}\"\npassword = \"{APP_PASSWORD}\"\n"
            ));
            for (_, lines) in self.user_keys.iter().filter(|(u, _)| u == user) {
                t.push_str(lines);
                t.push('\n');
            }
        }
        t
    }
}

/// A tokio-postgres connection string for `listen` (`HOST:PORT`), as `user`
/// with the testkit's password, database `db`, a 10 s connect timeout.
pub fn pg_conn_string(listen: &str, user: &str, db: &str) -> String {
    let (host, port) = listen.rsplit_once(':').expect("host:port");
    format!("host={host} port={port} user={user} password={APP_PASSWORD} dbname={db} connect_timeout=10")
}

/// The admin console login [`with_console`] configures.
pub const CONSOLE_USER: &str = "ops";
/// [`CONSOLE_USER`]'s password.
pub const CONSOLE_PASSWORD: &str = "ops-secret";

/// `toml` with the admin console on `127.0.0.1:ADMIN_PORT` and the
/// [`CONSOLE_USER`] login: `admin` first in the `[fulcrum]` table (spelled
/// on a line of its own), the `[[fulcrum.admin_user]]` table just before the
/// first `[[cluster]]`.
pub fn with_console(toml: &str, admin_port: u16) -> String {
    assert!(
        toml.contains("[fulcrum]\n") && toml.contains("[[cluster]]"),
        "no [fulcrum] table or no [[cluster]] in:\n{toml}"
    );
    toml.replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nadmin = \"127.0.0.1:{admin_port}\"\n"),
        1,
    )
    .replacen(
        "[[cluster]]",
        &format!(
            "[[fulcrum.admin_user]]\nname = \"{CONSOLE_USER}\"\npassword = \"{CONSOLE_PASSWORD}\"\n\n[[cluster]]"
        ),
        1,
    )
}

/// `toml` with `metrics = "127.0.0.1:METRICS_PORT"` in its `[fulcrum]` table
/// (which must be spelled `[fulcrum]` on a line of its own, as every config
/// built here is).
pub fn with_metrics(toml: &str, metrics_port: u16) -> String {
    assert!(
        toml.contains("[fulcrum]\n"),
        "no [fulcrum] table in:\n{toml}"
    );
    toml.replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nmetrics = \"127.0.0.1:{metrics_port}\"\n"),
        1,
    )
}
