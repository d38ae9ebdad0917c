//! `[[cluster.mirror]]`: where a cluster's traffic is mirrored to (another
//! `[[cluster]]` of the file, or an address with its own login), to what
//! share of clients, with or without writes, through how long a queue,
//! and whether the client waits for the mirror.

/// One mirror target of a cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Mirror {
    /// What SHOW MIRROR and the metrics call it: the cluster's name, or
    /// the address.
    pub name: String,
    /// Where the mirrored units go (the target cluster's primary backend,
    /// or `address`).
    pub address: String,
    pub login: MirrorLogin,
    /// TLS to the target: a `cluster` target's backend's own
    /// (`server_tls` ...), as its ordinary server connections use; none to
    /// an `address` target.
    pub tls: crate::ServerTls,
    /// The share of clients mirrored (0 to 1), chosen per client at login:
    /// all of a mirrored client's units are mirrored.
    pub exposure: f64,
    /// Units that may write are mirrored too (default: reads only).
    pub mirror_writes: bool,
    /// Units (whole transactions) waiting for the target, per mirrored
    /// client, at most.
    pub mirror_queue: u32,
    /// Client bytes of one transaction (or unit outside one) kept for the
    /// target, at most: past it the transaction is dropped whole (counted)
    /// and no more of it is kept.
    pub mirror_max_transaction_bytes: u64,
    pub mirror_mode: MirrorMode,
}

/// How a mirror logs in.
#[derive(Debug, Clone, PartialEq)]
pub enum MirrorLogin {
    /// `address` with `user` and `password`: every mirrored client as that user.
    Fixed { user: String, password: String },
    /// `cluster = "..."`: as the client's user, with the target cluster's
    /// login for it (its `[[cluster.user]]`); a user it does not list is
    /// not mirrored there (never with this cluster's password).
    ClientUser {
        /// (client user, server user, server password) of the target cluster.
        users: Vec<(String, String, String)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorMode {
    /// Never slows the client: a full queue drops the client's remaining
    /// transaction whole (counted).
    Async,
    /// The client's next unit waits for the mirror (shadow testing).
    Sync,
}

impl Mirror {
    /// The target's login for `user` (`None`: the target has none for it,
    /// and the client is not mirrored there).
    pub fn login_for(&self, user: &str) -> Option<(&str, &str)> {
        match &self.login {
            MirrorLogin::Fixed { user, password } => Some((user, password)),
            MirrorLogin::ClientUser { users } => users
                .iter()
                .find(|(u, _, _)| u == user)
                .map(|(_, su, sp)| (su.as_str(), sp.as_str())),
        }
    }
}
