//! Whole-file tests through `crate::parse`: every error path with its exact
//! `file:line: key: reason`, and valid files (including config/*.toml) with their values.

mod backend_user_errors;
mod cache;
mod cluster_errors;
mod coordinator_access;
mod database_logins;
mod documented;
mod file_errors;
mod hba;
mod password_hashes;
mod tls;
mod unix_socket;
mod user_pool;
mod valid;

use std::path::Path;

/// Strips the leading newline and the common indentation, so that line 1 of the TOML is
/// the first line after the opening quote.
pub(crate) fn dedent(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(indent..).unwrap_or("").to_string() + "\n")
        .collect()
}

/// The error message for `text`, read as `fulcrum.toml`.
pub(crate) fn error_of(text: &str) -> String {
    match crate::parse(&dedent(text), Path::new("fulcrum.toml")) {
        Ok(config) => panic!("expected an error, parsed {config:#?}"),
        Err(e) => e.to_string(),
    }
}

/// Checks each `(toml, expected message)` case, reporting every mismatch at once.
pub(crate) fn assert_errors(cases: &[(&str, &str)]) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(text, want)| {
            let got = error_of(text);
            (got != *want).then(|| format!("input:{}\n  want: {want}\n  got:  {got}", dedent(text)))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A minimal valid cluster (10 lines) that cases append keys or tables to.
pub(crate) const MINIMAL: &str = r#"
    [[cluster]]
    name = "main"
    protocol = "postgres"
    listen = "127.0.0.1:6432"
    [[cluster.backend]]
    address = "127.0.0.1:5432"
    role = "primary"
    [[cluster.user]]
    name = "app"
    password = "secret"
"#;
