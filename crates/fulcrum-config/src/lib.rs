//! Fulcrum's configuration: the TOML file format, its validation, and errors
//! that name `file:line: key: reason`. Knows nothing about sockets or protocols.
//!
//! Reading a file takes three steps, each its own module: `raw` deserializes the TOML into
//! structs that keep every value's byte span, `validate` (pure) applies defaults and checks
//! values and cross-key rules, and `error` turns spans into line numbers.
//!
//! Keys in errors are dotted paths with zero-based array indices, as the tables appear in
//! the file: `fulcrum.admin`, `cluster[0].pool_size`, `cluster[1].backend[2].role`. Indices
//! rather than cluster names, because the name itself may be the missing or broken value.
//! The key format is documented for users in docs/configuration.md.

#![forbid(unsafe_code)]

mod addr;
mod cache;
mod coordination;
mod error;
pub mod hba;
mod keypath;
pub mod log_filter;
mod mirror;
mod private_file;
mod raw;
mod server_tls;
mod suggest;
#[cfg(test)]
mod tests;
mod tls;
mod types;
mod units;
mod validate;

use std::path::Path;

pub use error::ConfigError;
pub use server_tls::{local_link, may_send_password, ChannelBinding, ServerTls, ServerTlsMode};
pub use tls::{ClientTls, TlsMode, TlsVersion};
pub use types::*;
pub use units::{parse_duration, parse_size};

/// Reads and parses the configuration file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let mut text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    let config = parse(&text, path);
    // The file may hold passwords: its text is cleared once parsed.
    zeroize::Zeroize::zeroize(&mut text);
    config
}

/// Parses configuration `text`; `path` is used in error messages and as [`Config::source`].
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let lines = error::Lines::new(text);
    let raw = raw::deserialize(text, &lines).map_err(|p| p.into_error(path))?;
    validate::validate(&raw, &lines, path).map_err(|p| p.into_error(path))
}
