//! `ConfigError`, what callers see, and `Problem`, the line-located error the parsing
//! and validation steps return before the file name is attached.

use std::path::{Path, PathBuf};

/// Why a configuration file was rejected.
///
/// Display formats (the file is shown as the path given to [`crate::load`]/[`crate::parse`]):
///
/// - `file: cannot read: reason` ([`ConfigError::Read`])
/// - `file:line: reason` ([`ConfigError::Syntax`], the file is not valid TOML)
/// - `file:line: key: reason` ([`ConfigError::Invalid`]), where `key` is a dotted path
///   with array indices, e.g. `cluster[0].backend[1].role`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, unreadable, not UTF-8). The I/O error is part
    /// of the message, so it is deliberately not also exposed as `source()` (it would print twice).
    #[error("{}: cannot read: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{}:{line}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A key is unknown, missing, of the wrong type, or has a value that fails validation.
    #[error("{}:{line}: {key}: {reason}", path.display())]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        reason: String,
    },
}

/// An error located in the text but not yet tied to a file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub line: usize,
    /// `None` for TOML syntax errors, which have no key path.
    pub key: Option<String>,
    pub reason: String,
}

impl Problem {
    pub fn new(line: usize, key: impl Into<String>, reason: impl Into<String>) -> Self {
        Problem {
            line,
            key: Some(key.into()),
            reason: reason.into(),
        }
    }

    pub fn syntax(line: usize, reason: impl Into<String>) -> Self {
        Problem {
            line,
            key: None,
            reason: reason.into(),
        }
    }

    pub fn into_error(self, path: &Path) -> ConfigError {
        let path = path.to_owned();
        match self.key {
            Some(key) => ConfigError::Invalid {
                path,
                line: self.line,
                key,
                reason: self.reason,
            },
            None => ConfigError::Syntax {
                path,
                line: self.line,
                message: self.reason,
            },
        }
    }
}

/// Maps byte offsets (what toml spans are) to 1-based line numbers.
pub(crate) struct Lines {
    /// Byte offset at which each line starts; `starts[0] == 0`.
    starts: Vec<usize>,
}

impl Lines {
    pub fn new(text: &str) -> Self {
        let breaks = text.match_indices('\n').map(|(i, _)| i + 1);
        Lines {
            starts: std::iter::once(0).chain(breaks).collect(),
        }
    }

    /// The 1-based line holding byte `offset` (offsets past the end map to the last line).
    pub fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_one_based_lines() {
        let lines = Lines::new("a\nbc\n\nd");
        let want = [(0, 1), (1, 1), (2, 2), (4, 2), (5, 3), (6, 4), (99, 4)];
        for (offset, line) in want {
            assert_eq!(lines.line(offset), line, "offset {offset}");
        }
        assert_eq!(Lines::new("").line(0), 1);
    }

    #[test]
    fn display_formats_match_the_contract() {
        let path = Path::new("fulcrum.toml");
        let invalid = Problem::new(14, "cluster[0].pool_size", "must be at least 1, got 0");
        assert_eq!(
            invalid.into_error(path).to_string(),
            "fulcrum.toml:14: cluster[0].pool_size: must be at least 1, got 0"
        );
        let syntax = Problem::syntax(3, "duplicate key");
        assert_eq!(
            syntax.into_error(path).to_string(),
            "fulcrum.toml:3: duplicate key"
        );
        let read = ConfigError::Read {
            path: path.into(),
            error: std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
        };
        assert_eq!(read.to_string(), "fulcrum.toml: cannot read: not found");
    }
}
