//! Shared helpers for Fulcrum's end-to-end tests (`tests/`) and benchmarks
//! (`benches/`): the config text they run Fulcrum with, and the PostgreSQL
//! startup packet raw-protocol tests send. The clusters and the daemon
//! process come from `fulcrum-testkit`.

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

    /// `host=... port=...` for tokio-postgres, as `user` with the test password.
    pub fn conn_string(&self, user: &str, db: &str) -> String {
        let (host, port) = self.listen.rsplit_once(':').expect("host:port");
        format!("host={host} port={port} user={user} password={APP_PASSWORD} dbname={db} connect_timeout=10")
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
        for user in [APP_USER, APP_MD5_USER, APP_PLAIN_USER, APP_TRUST_USER] {
            t.push_str(&format!(
                "\n[[cluster.user]]\nname = \"{user}\"\npassword = \"{APP_PASSWORD}\"\n"
            ));
        }
        t
    }
}

/// The PostgreSQL protocol 3.0 version code of a startup packet.
pub const PROTOCOL_3_0: i32 = 196_608;

/// A startup packet: length, `code` (a protocol version or a special
/// request code), then `params` as NUL-terminated name/value pairs.
pub fn startup_message(code: i32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    for (name, value) in params {
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut packet = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    packet.extend_from_slice(&body);
    packet
}

/// The sum of the samples of counter `name` whose labels include `label`
/// (e.g. `outcome="replayed"`), from a scrape of `/metrics` on `port`.
pub fn metric_sum(port: u16, name: &str, label: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("read timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("scrape request");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
