//! `Table`: one TOML table being validated. Its helpers read a key, apply the default, check
//! the value and, on failure, return a `Problem` naming `path.key` at the value's line.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use crate::addr::parse_listen_address;
use crate::error::{Lines, Problem};
use crate::raw::{DurationText, Int, SizeValue, Value};
use crate::units::{parse_duration, parse_size};

pub(crate) struct Table<'a> {
    lines: &'a Lines,
    /// Key path of this table, e.g. `cluster[0].backend[1]`.
    path: String,
    /// Where the table's header is; "missing key" errors point here.
    header: Range<usize>,
}

impl<'a> Table<'a> {
    pub fn new(lines: &'a Lines, path: impl Into<String>, header: Range<usize>) -> Self {
        Table {
            lines,
            path: path.into(),
            header,
        }
    }

    /// A nested table such as `backend[1]` inside `cluster[0]`.
    pub fn child(&self, name: &str, header: Range<usize>) -> Table<'a> {
        Table::new(self.lines, self.key(name), header)
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.path)
    }

    pub fn line(&self, span: &Range<usize>) -> usize {
        self.lines.line(span.start)
    }

    pub fn header_line(&self) -> usize {
        self.line(&self.header)
    }

    /// A problem with the value of `name` (or, for keys that are tables, its header).
    pub fn error<T>(&self, value: &Spanned<T>, name: &str, reason: impl Into<String>) -> Problem {
        Problem::new(self.line(&value.span()), self.key(name), reason)
    }

    /// A problem with the table as a whole, reported at its header under `name`.
    pub fn error_at_header(&self, name: &str, reason: impl Into<String>) -> Problem {
        Problem::new(self.header_line(), self.key(name), reason)
    }

    pub fn required<'r, T>(
        &self,
        value: &'r Value<T>,
        name: &str,
    ) -> Result<&'r Spanned<T>, Problem> {
        value
            .as_ref()
            .ok_or_else(|| self.error_at_header(name, "required key is missing"))
    }

    /// A non-blank string; `default: None` makes the key required.
    pub fn text(
        &self,
        value: &Value<String>,
        name: &str,
        default: Option<&str>,
    ) -> Result<String, Problem> {
        let Some(value) = value else {
            return match default {
                Some(d) => Ok(d.to_string()),
                None => Err(self.error_at_header(name, "required key is missing")),
            };
        };
        if value.get_ref().trim().is_empty() {
            return Err(self.error(value, name, "must not be empty"));
        }
        Ok(value.get_ref().clone())
    }

    /// A password's text: as written, or read from the file (relative to
    /// `base`; one trailing newline dropped) or environment variable it names.
    pub fn secret(
        &self,
        value: &Spanned<crate::raw::SecretText>,
        name: &str,
        base: &std::path::Path,
    ) -> Result<String, Problem> {
        use crate::raw::SecretText;
        match value.get_ref() {
            SecretText::Text(t) => Ok(t.clone()),
            SecretText::File(path) => {
                let full = base.join(path);
                crate::private_file::check(&full).map_err(|why| self.error(value, name, why))?;
                let mut text = std::fs::read_to_string(&full).map_err(|e| {
                    self.error(value, name, format!("cannot read {}: {e}", full.display()))
                })?;
                let trimmed = text.strip_suffix('\n').unwrap_or(&text);
                let secret = trimmed.strip_suffix('\r').unwrap_or(trimmed).to_owned();
                // Only the one copy kept stays in memory.
                zeroize::Zeroize::zeroize(&mut text);
                Ok(secret)
            }
            SecretText::Env(var) => std::env::var(var).map_err(|e| {
                let why = match e {
                    std::env::VarError::NotPresent => "is not set".to_string(),
                    std::env::VarError::NotUnicode(_) => "is not valid UTF-8".to_string(),
                };
                self.error(value, name, format!("environment variable {var} {why}"))
            }),
        }
    }

    /// One of a fixed set of strings; `default: None` makes the key required.
    pub fn choice<E: Copy>(
        &self,
        value: &Value<String>,
        name: &str,
        options: &[(&str, E)],
        default: Option<E>,
    ) -> Result<E, Problem> {
        let value = match (value, default) {
            (Some(v), _) => v,
            (None, Some(d)) => return Ok(d),
            (None, None) => return Err(self.error_at_header(name, "required key is missing")),
        };
        let given = value.get_ref().as_str();
        if let Some((_, e)) = options.iter().find(|(text, _)| *text == given) {
            return Ok(*e);
        }
        let expected: Vec<String> = options
            .iter()
            .map(|(text, _)| format!("{text:?}"))
            .collect();
        let reason = format!(
            "unknown value {given:?}, expected one of {}",
            expected.join(", ")
        );
        Err(self.error(value, name, reason))
    }

    /// An integer in `min..=u32::MAX`, or `default` when absent.
    pub fn u32_at_least(
        &self,
        value: &Value<Int>,
        name: &str,
        min: u32,
        default: u32,
    ) -> Result<u32, Problem> {
        let Some(value) = value else {
            return Ok(default);
        };
        let Int(n) = *value.get_ref();
        if n < i64::from(min) {
            return Err(self.error(value, name, format!("must be at least {min}, got {n}")));
        }
        u32::try_from(n).map_err(|_| {
            self.error(
                value,
                name,
                format!("must be at most {}, got {n}", u32::MAX),
            )
        })
    }

    /// A non-zero duration such as `"5s"`, or `default` when absent. Zero is rejected: none of
    /// the timeouts has a sensible "0" (it would fail or close everything at once).
    pub fn duration(
        &self,
        value: &Value<DurationText>,
        name: &str,
        default: Duration,
    ) -> Result<Duration, Problem> {
        let Some(value) = value else {
            return Ok(default);
        };
        let d = parse_duration(&value.get_ref().0).map_err(|e| self.error(value, name, e))?;
        if d.is_zero() {
            return Err(self.error(value, name, "must be greater than zero"));
        }
        Ok(d)
    }

    /// An optional duration where `0` (or absence) means off.
    pub fn duration_or_off(
        &self,
        value: &Value<DurationText>,
        name: &str,
    ) -> Result<Option<Duration>, Problem> {
        let Some(value) = value else {
            return Ok(None);
        };
        let d = parse_duration(&value.get_ref().0).map_err(|e| self.error(value, name, e))?;
        Ok((!d.is_zero()).then_some(d))
    }

    /// A non-zero size such as `"256MB"` or a byte count, or `default` when absent.
    pub fn size(&self, value: &Value<SizeValue>, name: &str, default: u64) -> Result<u64, Problem> {
        let Some(value) = value else {
            return Ok(default);
        };
        let bytes = match value.get_ref() {
            SizeValue::Text(text) => parse_size(text).map_err(|e| self.error(value, name, e))?,
            SizeValue::Bytes(n) => u64::try_from(*n)
                .map_err(|_| self.error(value, name, format!("must not be negative, got {n}")))?,
        };
        if bytes == 0 {
            return Err(self.error(value, name, "must be greater than zero"));
        }
        Ok(bytes)
    }

    /// An `ip:port` to listen on.
    pub fn socket_addr(&self, value: &Spanned<String>, name: &str) -> Result<SocketAddr, Problem> {
        parse_listen_address(value.get_ref()).map_err(|e| self.error(value, name, e))
    }
}
