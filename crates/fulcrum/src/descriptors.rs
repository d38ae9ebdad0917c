//! The file descriptors the daemon needs: every client a listener may hold
//! (logged in and still logging in), every server connection its pools may
//! open, and some room for the console, metrics and health probes. At start
//! the soft RLIMIT_NOFILE is raised to cover them (up to the hard limit); a
//! hard limit too low is logged, naming the limit and the need.

use fulcrum_config::Config;

/// Descriptors kept for everything that is not a client or a pool
/// connection: listeners, the console, metrics, health probes, logs.
const SPARE: u64 = 256;

/// The descriptors `config` may need at once.
pub fn needed(config: &Config) -> u64 {
    let per_cluster: u64 = config
        .clusters
        .iter()
        .map(|c| {
            let clients = u64::from(c.max_client_connections) + u64::from(c.max_pending_logins);
            // One pool per (backend, user) at least; more databases open more.
            let servers =
                u64::from(c.pool_size) * c.backends.len() as u64 * (c.users.len().max(1) as u64);
            clients + servers
        })
        .sum();
    per_cluster + SPARE
}

/// Raises the soft RLIMIT_NOFILE towards `needed(config)`; returns the
/// limit in force afterwards.
pub fn raise_for(config: &Config) -> Option<u64> {
    let want = needed(config);
    match rlimit::increase_nofile_limit(want) {
        Ok(now) if now >= want => {
            tracing::debug!(limit = now, needed = want, "open-file limit");
            Some(now)
        }
        Ok(now) => {
            tracing::warn!(
                limit = now,
                needed = want,
                "RLIMIT_NOFILE (open files) is {now}, below the {want} the configuration may need \
                 (max_client_connections + max_pending_logins + pool connections per cluster); \
                 raise the hard limit (ulimit -Hn, LimitNOFILE= in systemd) or lower those keys"
            );
            Some(now)
        }
        Err(e) => {
            tracing::warn!(error = %e, needed = want, "cannot read or raise RLIMIT_NOFILE");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_pending_logins_and_pools_are_counted() {
        let config = fulcrum_config::parse(
            "[[cluster]]\nname = \"a\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:1\"\n\
             pool_size = 10\nmax_client_connections = 100\nmax_pending_logins = 20\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:2\"\nrole = \"primary\"\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:3\"\nrole = \"replica\"\n\
             [[cluster.user]]\nname = \"u\"\npassword = \"p\"\n",
            std::path::Path::new("t.toml"),
        )
        .expect("valid");
        assert_eq!(needed(&config), 100 + 20 + 10 * 2 + SPARE);
    }
}
