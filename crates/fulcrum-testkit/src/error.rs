//! The harness's one error type. Every variant names what was being done, to
//! which node or process, and carries the tail of the relevant stderr or log,
//! so a failing test says why without anyone digging through a temp dir.

use std::path::PathBuf;
use std::time::Duration;

/// Result alias used throughout the harness.
pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// A filesystem or spawn operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// An external command ran and exited unsuccessfully.
    #[error("{target}: `{command}` exited with {status}\n--- stderr (tail) ---\n{stderr_tail}")]
    CommandFailed {
        /// What the command was aimed at, e.g. `replica1 (port 41235)`.
        target: String,
        command: String,
        status: String,
        stderr_tail: String,
    },

    /// A database server (PostgreSQL or MariaDB) did not come up.
    #[error("{node} (port {port}) did not start: {reason}\n--- {} (tail) ---\n{log_tail}", log.display())]
    NodeStart {
        node: String,
        port: u16,
        reason: String,
        log: PathBuf,
        log_tail: String,
    },

    /// The Fulcrum daemon did not come up (exited, or never listened).
    #[error("fulcrum ({}) did not start: {reason}\n--- {} (tail) ---\n{log_tail}", bin.display(), log.display())]
    FulcrumStart {
        bin: PathBuf,
        reason: String,
        log: PathBuf,
        log_tail: String,
    },

    /// A condition polled for did not become true in time.
    #[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },

    /// A command succeeded but printed something the harness cannot read.
    #[error("cannot parse {what}: {reason}\n--- output ---\n{output}")]
    Parse {
        what: String,
        reason: String,
        output: String,
    },

    /// A required executable is missing.
    #[error("no `{name}` executable found (looked in: {searched}); {hint}")]
    BinaryNotFound {
        name: String,
        searched: String,
        hint: String,
    },

    /// The caller asked for something the harness cannot do.
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl TestkitError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        TestkitError::Io {
            context: context.into(),
            source,
        }
    }
}

/// The last `max_lines` lines of `text` (and at most ~8 KiB), for error messages.
pub(crate) fn tail(text: &str, max_lines: usize) -> String {
    let text = text.trim_end();
    let start = text
        .rmatch_indices('\n')
        .nth(max_lines.saturating_sub(1))
        .map_or(0, |(i, _)| i + 1);
    let mut out = &text[start..];
    const MAX_BYTES: usize = 8 * 1024;
    if out.len() > MAX_BYTES {
        let mut cut = out.len() - MAX_BYTES;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out = &out[cut..];
    }
    if out.is_empty() {
        "(empty)".to_string()
    } else {
        out.to_string()
    }
}

/// The tail of a log file, or a note saying why it could not be read.
pub(crate) fn file_tail(path: &std::path::Path, max_lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), max_lines),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a\nb\nc", 5), "a\nb\nc");
        assert_eq!(tail("only", 1), "only");
        assert_eq!(tail("", 3), "(empty)");
    }
}
