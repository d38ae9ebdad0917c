//! The file as written: serde structs mirroring the TOML, every value wrapped in
//! `toml::Spanned` so validation can point at its line. No defaults, no checks here.
//!
//! Every key is `Option` (required keys are enforced by `crate::validate`, which can name
//! the table's line), integers are `i64` (ranges are validated with our own messages), and
//! enumerations are strings (so "unknown value" errors can list the choices).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use crate::error::{Lines, Problem};
use crate::keypath::key_path_at;

pub(crate) type Value<T> = Option<Spanned<T>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawConfig {
    pub fulcrum: Value<RawGlobal>,
    pub cluster: Value<Tables<RawCluster>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawGlobal {
    pub admin: Value<String>,
    pub metrics: Value<String>,
    pub log: Value<String>,
    pub workers: Value<Int>,
    pub log_format: Value<String>,
    pub slow_query_threshold: Value<DurationText>,
    pub shutdown_timeout: Value<DurationText>,
    pub upgrade_timeout: Value<DurationText>,
    pub dns_max_ttl: Value<DurationText>,
    pub admin_user: Value<Tables<RawAdminUser>>,
    pub admin_auth: Value<String>,
    pub stats_users: Value<Vec<Spanned<String>>>,
    pub status_key: Value<SecretText>,
    pub tls_mode: Value<String>,
    pub tls_certificate: Value<String>,
    pub tls_private_key: Value<String>,
    pub tls_min_version: Value<String>,
    pub tls_client_ca: Value<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawCluster {
    pub name: Value<String>,
    pub protocol: Value<String>,
    pub listen: Value<String>,
    pub unix_socket_dir: Value<String>,
    pub unix_socket: Value<String>,
    pub unix_socket_mode: Value<String>,
    pub unix_socket_group: Value<String>,
    pub pool_mode: Value<String>,
    pub pool_size: Value<Int>,
    pub client_auth: Value<String>,
    pub auth_hba_file: Value<String>,
    pub pool_timeout: Value<DurationText>,
    pub connect_timeout: Value<DurationText>,
    pub server_connect_timeout: Value<DurationText>,
    pub client_login_timeout: Value<DurationText>,
    pub client_idle_timeout: Value<DurationText>,
    pub idle_transaction_timeout: Value<DurationText>,
    pub query_timeout: Value<DurationText>,
    pub server_idle_timeout: Value<DurationText>,
    pub server_lifetime: Value<DurationText>,
    pub max_message_size: Value<SizeValue>,
    pub max_client_connections: Value<Int>,
    pub max_pending_logins: Value<Int>,
    pub notify_queue: Value<Int>,
    pub max_client_notify_bytes: Value<SizeValue>,
    pub max_prepared_statements: Value<Int>,
    pub max_client_prepared_statements: Value<Int>,
    pub max_client_settings: Value<Int>,
    pub max_client_settings_bytes: Value<SizeValue>,
    pub max_client_prepared_bytes: Value<SizeValue>,
    pub reads_on_primary: Value<bool>,
    pub balance: Value<String>,
    pub default_route: Value<String>,
    pub write_functions: Value<Vec<String>>,
    pub read_only_functions: Value<Vec<String>>,
    pub session_free_functions: Value<Vec<String>>,
    pub function_catalog: Value<bool>,
    pub function_catalog_ttl: Value<DurationText>,
    pub function_catalog_wait: Value<DurationText>,
    pub classifier_cache_size: Value<Int>,
    pub digest_max_entries: Value<Int>,
    pub digest_metrics_top: Value<Int>,
    pub min_pool_size: Value<Int>,
    pub reserve_pool_size: Value<Int>,
    pub reserve_pool_timeout: Value<DurationText>,
    pub server_check_delay: Value<DurationText>,
    pub max_db_connections: Value<Int>,
    pub max_user_connections: Value<Int>,
    pub max_classify_bytes: Value<SizeValue>,
    pub tls_mode: Value<String>,
    pub tls_certificate: Value<String>,
    pub tls_private_key: Value<String>,
    pub tls_min_version: Value<String>,
    pub tls_client_ca: Value<String>,
    pub server_tls: Value<String>,
    pub server_tls_ca: Value<String>,
    pub server_tls_certificate: Value<String>,
    pub server_tls_private_key: Value<String>,
    pub server_channel_binding: Value<String>,
    pub allow_local_infile: Value<bool>,
    pub server_cleartext: Value<bool>,
    pub server_reset_query: Value<String>,
    pub server_reset_query_always: Value<bool>,
    pub connect_query: Value<String>,
    pub health_interval: Value<DurationText>,
    pub health_timeout: Value<DurationText>,
    pub health_failures: Value<Int>,
    pub health_user: Value<String>,
    pub health_password: Value<SecretText>,
    pub health_database: Value<String>,
    pub auth_user: Value<String>,
    pub auth_password: Value<SecretText>,
    pub auth_query: Value<String>,
    pub auth_database: Value<String>,
    pub auth_cache_ttl: Value<DurationText>,
    pub auth_max_connections: Value<Int>,
    pub auth_failed_lookups_per_minute: Value<Int>,
    pub max_lag: Value<SizeValue>,
    pub failover_max_lag: Value<SizeValue>,
    pub failover: Value<String>,
    pub failover_timeout: Value<DurationText>,
    pub failover_command: Value<String>,
    pub topology: Value<String>,
    pub etcd_endpoints: Value<Vec<String>>,
    pub etcd_prefix: Value<String>,
    pub etcd_lease: Value<DurationText>,
    pub etcd_user: Value<String>,
    pub etcd_password: Value<SecretText>,
    pub etcd_tls_ca: Value<String>,
    pub etcd_tls_certificate: Value<String>,
    pub etcd_tls_private_key: Value<String>,
    pub on_coordinator_loss: Value<String>,
    pub patroni_endpoints: Value<Vec<String>>,
    pub patroni_timeout: Value<DurationText>,
    pub patroni_user: Value<String>,
    pub patroni_password: Value<SecretText>,
    pub patroni_tls_ca: Value<String>,
    pub patroni_tls_certificate: Value<String>,
    pub patroni_tls_private_key: Value<String>,
    pub instance_name: Value<String>,
    pub consistency: Value<String>,
    pub causal_timeout: Value<DurationText>,
    pub causal_wait: Value<String>,
    pub transaction_replay: Value<bool>,
    pub transaction_replay_max_size: Value<SizeValue>,
    pub transaction_replay_timeout: Value<DurationText>,
    pub transaction_replay_debug: Value<bool>,
    pub transaction_replay_resolve_commits: Value<bool>,
    pub backend: Value<Tables<RawBackend>>,
    pub user: Value<Tables<RawUser>>,
    pub user_default: Value<Tables<RawUserDefault>>,
    pub database: Value<Tables<RawDatabase>>,
    pub mirror: Value<Tables<RawMirror>>,
    pub cache: Value<Single<RawCache>>,
}

/// `[cluster.cache]`: the result cache (one table, not an array).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawCache {
    pub mode: Value<String>,
    pub max_memory: Value<SizeValue>,
    pub ttl: Value<DurationText>,
    pub max_result: Value<SizeValue>,
    pub isolation: Value<String>,
    pub invalidation: Value<String>,
    pub rule: Value<Tables<RawCacheRule>>,
}

/// `[[cluster.cache.rule]]`: tables whose reads are kept.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawCacheRule {
    pub tables: Value<Vec<Spanned<String>>>,
    pub ttl: Value<DurationText>,
    pub in_transactions: Value<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawMirror {
    pub cluster: Value<String>,
    pub address: Value<String>,
    pub user: Value<String>,
    pub password: Value<SecretText>,
    pub exposure: Value<Fraction>,
    pub mirror_writes: Value<bool>,
    pub mirror_queue: Value<Int>,
    pub mirror_max_transaction_bytes: Value<SizeValue>,
    pub mirror_mode: Value<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawDatabase {
    pub name: Value<String>,
    pub server_database: Value<String>,
    pub server_user: Value<String>,
    pub server_password: Value<SecretText>,
    pub connect_query: Value<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawBackend {
    pub address: Value<String>,
    pub role: Value<String>,
    pub weight: Value<Int>,
    pub server_tls: Value<String>,
    pub server_tls_ca: Value<String>,
    pub server_tls_certificate: Value<String>,
    pub server_tls_private_key: Value<String>,
    pub server_channel_binding: Value<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawAdminUser {
    pub name: Value<String>,
    pub password: Value<SecretText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawUser {
    pub name: Value<String>,
    pub password: Value<SecretText>,
    pub server_user: Value<String>,
    pub server_password: Value<SecretText>,
    pub pool_mode: Value<String>,
    pub pool_size: Value<Int>,
    pub max_user_connections: Value<Int>,
}

/// `[[cluster.user_default]]`: the pool settings of users not listed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
pub(crate) struct RawUserDefault {
    pub pool_mode: Value<String>,
    pub pool_size: Value<Int>,
    pub max_user_connections: Value<Int>,
}

/// Deserializes the document, turning TOML and serde errors into located problems.
pub(crate) fn deserialize(text: &str, lines: &Lines) -> Result<RawConfig, Problem> {
    let doc = toml::de::DeTable::parse(text).map_err(|e| syntax_problem(text, lines, &e))?;
    RawConfig::deserialize(toml::de::Deserializer::from(doc)).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let key = key_path_at(text, span.clone()).unwrap_or_else(|| "(document)".into());
        // Users write TOML keys, not serde fields.
        let reason = crate::suggest::unknown_key(e.message());
        Problem::new(lines.line(span.start), key, reason)
    })
}

fn syntax_problem(text: &str, lines: &Lines, e: &toml::de::Error) -> Problem {
    let span = e.span().unwrap_or(0..0);
    let line = lines.line(span.start);
    // The parser says only "duplicate key"; name it, since the first definition may be far away.
    let snippet = text.get(span.clone()).unwrap_or("").trim();
    let line_text = text.get(..span.start).map_or("", |before| {
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        text[start..].lines().next().unwrap_or("").trim()
    });
    let message = match e.message() {
        "duplicate key" if line_text.starts_with('[') => {
            let header = line_text
                .find(']')
                .map_or(line_text, |end| &line_text[..=end]);
            format!("duplicate table {header}")
        }
        "duplicate key" if snippet.starts_with(['"', '\'']) => format!("duplicate key {snippet}"),
        "duplicate key" if !snippet.is_empty() => format!("duplicate key {snippet:?}"),
        other => other.to_string(),
    };
    Problem::syntax(line, message)
}

/// A TOML integer. (Deserializing `i64` directly would make serde say "expected i64".)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                i64::try_from(v)
                    .map(Int)
                    .map_err(|_| E::custom("integer too large"))
            }
        }
        d.deserialize_i64(V)
    }
}

/// A number that may be written as an integer (`exposure = 1`) or not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fraction(pub f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Fraction;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number from 0 to 1")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Fraction, E> {
                Ok(Fraction(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fraction, E> {
                Ok(Fraction(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fraction, E> {
                Ok(Fraction(v as f64))
            }
        }
        d.deserialize_any(V)
    }
}

/// A password: the text itself, or where to read it: `{ file = "path" }`
/// (the file's contents, one trailing newline dropped) or `{ env = "NAME" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecretText {
    Text(String),
    File(String),
    Env(String),
}

impl<'de> Deserialize<'de> for SecretText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SecretText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a password string, { file = \"path\" } or { env = \"VARIABLE\" }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SecretText, E> {
                Ok(SecretText::Text(v.to_string()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<SecretText, A::Error> {
                let mut found: Option<SecretText> = None;
                while let Some(key) = map.next_key::<String>()? {
                    let value: String = map.next_value()?;
                    let source = match key.as_str() {
                        "file" => SecretText::File(value),
                        "env" => SecretText::Env(value),
                        other => {
                            return Err(de::Error::custom(format!(
                            "unknown key `{other}` in a password table, expected `file` or `env`"
                        )))
                        }
                    };
                    if found.replace(source).is_some() {
                        return Err(de::Error::custom(
                            "a password comes from one place: `file` or `env`, not both",
                        ));
                    }
                }
                found.ok_or_else(|| {
                    de::Error::custom("an empty password table: give `file` or `env`")
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration string such as `"5s"`, parsed later by [`crate::parse_duration`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DurationText(pub String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string such as \"5s\" or \"500ms\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A size: a string such as `"256MB"` (parsed later by [`crate::parse_size`]) or a
/// plain integer number of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SizeValue {
    Text(String),
    Bytes(i64),
}

impl<'de> Deserialize<'de> for SizeValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SizeValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size string such as \"256MB\" or an integer number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SizeValue, E> {
                Ok(SizeValue::Text(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SizeValue, E> {
                Ok(SizeValue::Bytes(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Names the `[[header]]` of an array of tables, for "expected an array of tables" errors.
pub(crate) trait TableHeader {
    const HEADER: &'static str;
}
impl TableHeader for RawCluster {
    const HEADER: &'static str = "[[cluster]]";
}
impl TableHeader for RawBackend {
    const HEADER: &'static str = "[[cluster.backend]]";
}
impl TableHeader for RawUser {
    const HEADER: &'static str = "[[cluster.user]]";
}
impl TableHeader for RawUserDefault {
    const HEADER: &'static str = "[[cluster.user_default]]";
}
impl TableHeader for RawDatabase {
    const HEADER: &'static str = "[[cluster.database]]";
}
impl TableHeader for RawMirror {
    const HEADER: &'static str = "[[cluster.mirror]]";
}
impl TableHeader for RawCache {
    const HEADER: &'static str = "[cluster.cache] (single brackets)";
}
impl TableHeader for RawCacheRule {
    const HEADER: &'static str = "[[cluster.cache.rule]]";
}
impl TableHeader for RawAdminUser {
    const HEADER: &'static str = "[[fulcrum.admin_user]]";
}

/// One table that is not an array (`[cluster.cache]`). Exists to replace
/// serde's confusing message for `[[cluster.cache]]` (double brackets) with
/// the header meant.
#[derive(Debug)]
pub(crate) struct Single<T>(pub T);

impl<'de, T: Deserialize<'de> + TableHeader> Deserialize<'de> for Single<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + TableHeader> Visitor<'de> for V<T> {
            type Value = Single<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "one table, starting with {}", T::HEADER)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Single<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Single)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// An array of tables. Exists to replace serde's "expected a sequence" (what a user who
/// wrote `[cluster]` instead of `[[cluster]]` would see) with the header they meant.
#[derive(Debug)]
pub(crate) struct Tables<T>(pub Vec<Spanned<T>>);

impl<'de, T: Deserialize<'de> + TableHeader> Deserialize<'de> for Tables<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + TableHeader> Visitor<'de> for V<T> {
            type Value = Tables<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an array of tables, each starting with {}", T::HEADER)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tables<T>, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Tables(items))
            }
        }
        d.deserialize_seq(V(PhantomData))
    }
}
