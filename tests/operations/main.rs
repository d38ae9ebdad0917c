//! Running Fulcrum: the admin console, metrics and health endpoints,
//! reloads, shutdown, clusters sharing a port, logging, the command line
//! (version, completions, systemd notification), `--check` of configs and
//! binary upgrades (SIGUSR2).
//! One test binary; each module was a binary of its own before. Every test
//! starts the clusters it needs (most change them or the daemon's config).

mod admin;
mod cli;
mod config_check;
mod logging;
mod metrics;
mod reload;
mod shared_port;
mod shutdown;
mod status_page;
mod upgrade;
mod upgrade_clients;
