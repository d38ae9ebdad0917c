//! Several Fulcrum instances, one truth about a cluster's primary. With
//! `topology = "etcd"` the instances elect a leader with an etcd lease;
//! only the leader promotes, and it publishes the topology (primary,
//! replicas, an epoch that only grows) that every instance routes by
//! (`elected`). With `topology = "patroni"` every instance follows
//! Patroni's `GET /cluster` and never promotes (`patroni`). Fulcrum grows
//! no consensus of its own. The health loop (fulcrum-cluster) asks an
//! [`Authority`] for a [`Verdict`] each round. A topology in etcd counts
//! only if the leader wrote it in its own lease-bound transaction
//! (`proof`): a direct write to the prefix is refused.

#![forbid(unsafe_code)]

pub mod elected;
pub mod etcd;
pub mod http;
pub mod patroni;
pub mod proof;
pub mod published;

use std::sync::Arc;
use std::time::Instant;

use thiserror::Error;
use tokio::sync::watch;

pub use elected::Elected;
pub use patroni::{Followed, Member};
pub use published::{Published, Stage};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoordError {
    /// No answer, or not an HTTP answer.
    #[error("{0}")]
    Http(String),
    /// etcd answered with an error.
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("patroni: {0}")]
    Patroni(String),
}

/// What the coordinator says, as of its last answer.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The newest published topology seen (Patroni: its running leader).
    pub published: Option<Published>,
    /// This instance leads (etcd), and has heard from etcd within its lease.
    pub leading: bool,
    /// Who leads (etcd: the leader key's holder; Patroni: its leader member).
    pub leader: Option<String>,
    /// Not heard from the coordinator for longer than the lease
    /// (`etcd_lease`, `patroni_timeout`).
    pub cut_off: bool,
    pub last_heard: Option<Instant>,
    /// Until when, without news, the published primary may take writes.
    pub valid_until: Option<Instant>,
    pub last_error: Option<String>,
    /// Patroni: each member as it reports it (role, state, lag), so a
    /// replica it reports stopped or behind serves no reads. Empty with
    /// etcd.
    pub members: Vec<Member>,
}

/// Who decides the primary of one cluster.
#[derive(Clone)]
pub enum Authority {
    /// This instance's own probes.
    Probe,
    Etcd(Arc<Elected>),
    Patroni(Arc<Followed>),
}

impl Authority {
    /// Builds the authority `topology` names, and starts its background
    /// task (etcd), which runs until `stop` turns true.
    pub fn start(
        cluster: &str,
        topology: &fulcrum_config::Topology,
        stop: watch::Receiver<bool>,
    ) -> Authority {
        match topology {
            fulcrum_config::Topology::Probe => Authority::Probe,
            fulcrum_config::Topology::Etcd(settings) => {
                let elected = Elected::new(cluster, settings);
                tokio::spawn(elected.clone().run(stop));
                Authority::Etcd(elected)
            }
            fulcrum_config::Topology::Patroni(settings) => {
                Authority::Patroni(Arc::new(Followed::new(cluster, settings)))
            }
        }
    }

    pub fn source(&self) -> &'static str {
        match self {
            Authority::Probe => "probe",
            Authority::Etcd(_) => "etcd",
            Authority::Patroni(_) => "patroni",
        }
    }

    /// `None` with `topology = "probe"`.
    pub fn verdict(&self, now: Instant) -> Option<Verdict> {
        match self {
            Authority::Probe => None,
            Authority::Etcd(e) => Some(e.verdict(now)),
            Authority::Patroni(p) => Some(p.verdict(now)),
        }
    }

    /// Reads the coordinator's state now where it is polled (Patroni);
    /// etcd's is kept current by its own task and watch.
    pub async fn refresh(&self) {
        if let Authority::Patroni(p) = self {
            p.refresh().await;
        }
    }

    /// Changes the health loop should act on at once (etcd: a new epoch,
    /// a lead won or lost).
    pub fn changes(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Authority::Etcd(e) => Some(e.changes()),
            _ => None,
        }
    }
}
