//! Running Fulcrum: the admin console, metrics, reload, shutdown, shared
//! ports, logging, the command line and `--check`. One test binary; each
//! module was a test binary of its own before.

mod admin;
mod cli;
mod config_check;
mod logging;
mod metrics;
mod reload;
mod shared_port;
mod shutdown;
