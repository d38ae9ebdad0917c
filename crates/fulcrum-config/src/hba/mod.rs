//! Host-based access rules (`client_auth = "hba"`, `auth_hba_file`): the
//! rules read from a file in pg_hba.conf's format, as PgBouncer reads it
//! (`parse`), and the pure matcher that picks, for one connection, user and
//! database, the first line that applies (`Hba::decide`), with PostgreSQL's
//! words for a refusal. No I/O here but the file reads `load` does at the edge.

mod parse;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use parse::{parse, HbaError};

/// The rules of one `auth_hba_file`, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hba {
    /// The file they were read from (as the config names it, joined to the
    /// config's directory).
    pub path: PathBuf,
    pub rules: Vec<HbaRule>,
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HbaRule {
    /// 1-based line number in the file.
    pub line: usize,
    pub kind: ConnKind,
    pub databases: Names,
    pub users: Names,
    /// `None` on `local` lines.
    pub address: Option<Address>,
    pub method: HbaMethod,
}

/// The first column: what connections the line is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// Unix-domain sockets.
    Local,
    /// TCP, with or without TLS.
    Host,
    /// TCP with TLS only.
    HostSsl,
    /// TCP without TLS only.
    HostNoSsl,
}

/// A database or user column: `all`, `sameuser` (databases only), names
/// (written in the line or read from `@file`s).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    pub all: bool,
    /// The database named as the user.
    pub same_user: bool,
    pub names: Vec<String>,
}

impl Names {
    fn matches(&self, name: &str, user: &str) -> bool {
        self.all || (self.same_user && name == user) || self.names.iter().any(|n| n == name)
    }
}

/// The address column: `all`, or a network as address and mask (a CIDR
/// `10.0.0.0/8` or an address with a mask column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address {
    All,
    Net { addr: IpAddr, mask: IpAddr },
}

impl Address {
    fn matches(&self, client: IpAddr) -> bool {
        // A client on an IPv6 socket with an IPv4-mapped address matches IPv4 lines.
        let client = client.to_canonical();
        match (*self, client) {
            (Address::All, _) => true,
            (Address::Net { addr, mask }, client) => match (addr, mask, client) {
                (IpAddr::V4(a), IpAddr::V4(m), IpAddr::V4(c)) => {
                    let m = u32::from(m);
                    u32::from(a) & m == u32::from(c) & m
                }
                (IpAddr::V6(a), IpAddr::V6(m), IpAddr::V6(c)) => {
                    let m = u128::from(m);
                    u128::from(a) & m == u128::from(c) & m
                }
                _ => false,
            },
        }
    }
}

/// The method column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HbaMethod {
    Trust,
    Reject,
    Md5,
    ScramSha256,
    /// The password in clear text (PostgreSQL's and PgBouncer's `password`).
    Password,
    /// The TLS client certificate names the user (`hostssl` lines only).
    Cert,
    /// The client's OS user is the user asked for (`local` lines only).
    Peer,
}

impl HbaMethod {
    pub fn name(self) -> &'static str {
        match self {
            HbaMethod::Trust => "trust",
            HbaMethod::Reject => "reject",
            HbaMethod::Md5 => "md5",
            HbaMethod::ScramSha256 => "scram-sha-256",
            HbaMethod::Password => "password",
            HbaMethod::Cert => "cert",
            HbaMethod::Peer => "peer",
        }
    }

    /// Whether the method asks the client for a password.
    pub fn asks_password(self) -> bool {
        matches!(
            self,
            HbaMethod::Md5 | HbaMethod::ScramSha256 | HbaMethod::Password
        )
    }
}

/// How a client is connected, as far as the rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    /// A Unix-domain socket, with the peer's uid when the OS told it.
    Local { peer_uid: Option<u32> },
    /// TCP from `addr`, on TLS or not.
    Host { addr: IpAddr, tls: bool },
}

/// What the rules say about one login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The line at `line` applies, with its method (never `Reject`).
    Use { method: HbaMethod, line: usize },
    /// A `reject` line applies.
    Rejected { line: usize },
    /// No line applies (refused too).
    NoEntry,
}

impl Hba {
    /// The rules of the file at `path`; `@file` names are read relative to
    /// its directory.
    pub fn load(path: &Path) -> Result<Hba, HbaError> {
        let text = std::fs::read_to_string(path).map_err(|e| HbaError {
            line: 0,
            reason: format!("cannot read: {e}"),
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut read = |name: &str| {
            let file = dir.join(name);
            std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))
        };
        let rules = parse(&text, &mut read)?;
        Ok(Hba {
            path: path.to_owned(),
            rules,
        })
    }

    /// The first line that applies to `conn` logging in as `user` to
    /// `database` (the name the client asked for), as PostgreSQL decides.
    pub fn decide(&self, conn: &Conn, database: &str, user: &str) -> Verdict {
        let rule = self.rules.iter().find(|r| {
            let place = match (r.kind, conn) {
                (ConnKind::Local, Conn::Local { .. }) => true,
                (ConnKind::Local, Conn::Host { .. }) | (_, Conn::Local { .. }) => false,
                (ConnKind::HostSsl, Conn::Host { tls: false, .. })
                | (ConnKind::HostNoSsl, Conn::Host { tls: true, .. }) => false,
                (_, Conn::Host { addr, .. }) => r.address.is_some_and(|a| a.matches(*addr)),
            };
            place && r.databases.matches(database, user) && r.users.matches(user, user)
        });
        match rule {
            None => Verdict::NoEntry,
            Some(r) if r.method == HbaMethod::Reject => Verdict::Rejected { line: r.line },
            Some(r) => Verdict::Use {
                method: r.method,
                line: r.line,
            },
        }
    }
}

/// PostgreSQL's words for a refused login (SQLSTATE 28000), for
/// `Verdict::Rejected` and `Verdict::NoEntry`; `None` for `Verdict::Use`.
pub fn refusal(verdict: Verdict, conn: &Conn, database: &str, user: &str) -> Option<String> {
    let (host, encryption) = match conn {
        Conn::Local { .. } => ("[local]".to_string(), "no encryption"),
        Conn::Host { addr, tls } => (
            addr.to_canonical().to_string(),
            if *tls {
                "SSL encryption"
            } else {
                "no encryption"
            },
        ),
    };
    let head = match verdict {
        Verdict::Use { .. } => return None,
        Verdict::Rejected { .. } => "pg_hba.conf rejects connection",
        Verdict::NoEntry => "no pg_hba.conf entry",
    };
    Some(format!(
        "{head} for host \"{host}\", user \"{user}\", database \"{database}\", {encryption}"
    ))
}
