//! The types of several Fulcrum instances coordinating (`topology` and
//! its source's keys): who decides a cluster's primary, and what an
//! instance cut off from that source does with writes.

use std::time::Duration;

/// Who decides the cluster's primary (`topology`).
#[derive(Debug, Clone, PartialEq)]
pub enum Topology {
    /// Each instance from its own probes (one Fulcrum, or instances that
    /// never promote).
    Probe,
    /// A leader elected in etcd decides and publishes; every instance
    /// routes by the newest published epoch.
    Etcd(Etcd),
    /// Patroni decides; Fulcrum follows its `GET /cluster`.
    Patroni(Patroni),
}

impl Topology {
    pub fn name(&self) -> &'static str {
        match self {
            Topology::Probe => "probe",
            Topology::Etcd(_) => "etcd",
            Topology::Patroni(_) => "patroni",
        }
    }
}

/// `topology = "etcd"`.
#[derive(Clone)]
pub struct Etcd {
    /// `host:port` of each etcd member's client URL.
    pub endpoints: Vec<String>,
    /// Keys live under `<prefix>/<cluster name>/`.
    pub prefix: String,
    /// The leader's lease; also how long an instance may go without
    /// hearing from etcd before it counts itself cut off.
    pub lease: Duration,
    /// etcd's own authentication (`etcd_user`, `etcd_password`).
    pub user: Option<String>,
    pub password: String,
    /// TLS to etcd (`etcd_tls_ca` and the optional client identity).
    pub tls: Option<std::sync::Arc<fulcrum_tls::rustls::ClientConfig>>,
    /// A digest of the TLS files' contents (equal configs, equal files).
    pub tls_digest: u64,
    pub on_loss: CoordinatorLoss,
    /// This instance's name in the election (`instance_name`; default
    /// host name and process id).
    pub instance: String,
}

impl PartialEq for Etcd {
    fn eq(&self, o: &Etcd) -> bool {
        self.endpoints == o.endpoints
            && self.prefix == o.prefix
            && self.lease == o.lease
            && self.user == o.user
            && self.password == o.password
            && self.tls.is_some() == o.tls.is_some()
            && self.tls_digest == o.tls_digest
            && self.on_loss == o.on_loss
            && self.instance == o.instance
    }
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("tls", &self.tls.is_some())
            .field("on_loss", &self.on_loss)
            .field("instance", &self.instance)
            .finish()
    }
}

/// `topology = "patroni"`.
#[derive(Clone)]
pub struct Patroni {
    /// Base URLs of the Patroni REST APIs (`http://host:8008`, or
    /// `https://host:8008` checked against `tls`).
    pub endpoints: Vec<String>,
    /// How long without an answer from any of them before this instance
    /// counts itself cut off (`patroni_timeout`).
    pub timeout: Duration,
    pub on_loss: CoordinatorLoss,
    /// TLS to the `https://` endpoints (`patroni_tls_ca` and the optional
    /// client identity); set whenever one endpoint is `https://`.
    pub tls: Option<std::sync::Arc<fulcrum_tls::rustls::ClientConfig>>,
    /// A digest of the TLS files' contents (equal configs, equal files).
    pub tls_digest: u64,
    /// HTTP basic authentication to Patroni's REST API (`patroni_user`,
    /// `patroni_password`; only with `https://` endpoints).
    pub user: Option<String>,
    pub password: String,
}

impl Patroni {
    /// Plain `http://` endpoints, no credentials (tests, examples).
    pub fn plain(endpoints: Vec<String>, timeout: Duration, on_loss: CoordinatorLoss) -> Patroni {
        Patroni {
            endpoints,
            timeout,
            on_loss,
            tls: None,
            tls_digest: 0,
            user: None,
            password: String::new(),
        }
    }
}

impl PartialEq for Patroni {
    fn eq(&self, o: &Patroni) -> bool {
        self.endpoints == o.endpoints
            && self.timeout == o.timeout
            && self.on_loss == o.on_loss
            && self.tls.is_some() == o.tls.is_some()
            && self.tls_digest == o.tls_digest
            && self.user == o.user
            && self.password == o.password
    }
}

impl std::fmt::Debug for Patroni {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Patroni")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .field("on_loss", &self.on_loss)
            .field("tls", &self.tls.is_some())
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What an instance cut off from its coordinator does with writes
/// (`on_coordinator_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorLoss {
    /// Writes wait (up to `pool_timeout`) until the coordinator answers.
    Hold,
    /// Writes go on to the last published primary while it answers as one.
    LastKnown,
}
