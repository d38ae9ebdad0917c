//! Session settings with a version that stands for their content: what a
//! client has set (`desired`) and what a server connection carries
//! (`applied`). Every checkout asks whether the two agree; with the
//! version that is one integer comparison, not a walk over both maps
//! (issue 28).
//!
//! Equal contents get equal versions: each new content is looked up in a
//! process-wide table, so the many clients that never SET anything, or
//! share the same startup parameters, share a version with the connections
//! they leave behind. Versions are never reused, so equal versions always
//! mean equal contents. The table is bounded in bytes, not only in count:
//! a content over [`INTERN_MAX_BYTES`] is never stored (it gets a version of
//! its own), and when the stored contents pass [`TABLE_MAX_BYTES`] the table
//! is emptied; contents seen again get a new version, and two settings whose
//! versions differ are then compared in full: slower, never wrong. (Before,
//! 600 distinct 2 kB SETs from one client stored 600 growing copies of its
//! map, 370 MB, for the life of the process.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::conn::SessionParams;

/// Most distinct contents remembered.
const TABLE_MAX: usize = 4096;
/// Largest content stored in the table, in bytes of keys and statements.
pub const INTERN_MAX_BYTES: usize = 8 * 1024;
/// Most bytes of contents the table holds.
const TABLE_MAX_BYTES: usize = 1024 * 1024;

/// The version of the empty settings (never given to anything else).
const EMPTY: u64 = 0;

static NEXT: AtomicU64 = AtomicU64::new(EMPTY + 1);

/// Contents by version, and the bytes they hold.
#[derive(Default)]
struct Table {
    versions: HashMap<SessionParams, u64>,
    bytes: usize,
}

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(Table::default()))
}

/// The bytes of a content: its keys and statements.
pub fn bytes_of(map: &SessionParams) -> usize {
    map.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The version of `map`'s content.
fn version_of(map: &SessionParams) -> u64 {
    version_in(table(), map)
}

/// The version of `map`'s content, as `table` remembers it.
fn version_in(table: &Mutex<Table>, map: &SessionParams) -> u64 {
    if map.is_empty() {
        return EMPTY;
    }
    let bytes = bytes_of(map);
    if bytes > INTERN_MAX_BYTES {
        // Not stored: compared in full when versions differ.
        return NEXT.fetch_add(1, Ordering::Relaxed);
    }
    let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&v) = table.versions.get(map) {
        return v;
    }
    if table.versions.len() >= TABLE_MAX || table.bytes + bytes > TABLE_MAX_BYTES {
        table.versions = HashMap::new();
        table.bytes = 0;
    }
    let v = NEXT.fetch_add(1, Ordering::Relaxed);
    table.versions.insert(map.clone(), v);
    table.bytes += bytes;
    v
}

/// Parameter key -> the statement that set it, with its content's version.
/// Read through `Deref`; changed only through the methods below, which
/// keep the version right.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    map: SessionParams,
    version: u64,
    /// `bytes_of(map)`, kept as the map changes (read on every detach).
    bytes: usize,
}

impl Settings {
    pub fn new(map: SessionParams) -> Settings {
        Settings {
            version: version_of(&map),
            bytes: bytes_of(&map),
            map,
        }
    }

    pub fn insert(&mut self, key: String, stmt: String) {
        let (klen, slen) = (key.len(), stmt.len());
        match self.map.insert(key, stmt) {
            Some(old) => self.bytes = self.bytes - old.len() + slen,
            None => self.bytes += klen + slen,
        }
        self.version = version_of(&self.map);
    }

    pub fn remove(&mut self, key: &str) {
        if let Some(old) = self.map.remove(key) {
            self.bytes -= key.len() + old.len();
            self.version = version_of(&self.map);
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.version = EMPTY;
        self.bytes = 0;
    }

    /// The bytes of its keys and statements.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Settings not known (a large content dropped to free its memory):
    /// equal to nothing, so the next checkout resets and applies in full.
    pub fn unknown() -> Settings {
        Settings {
            map: SessionParams::new(),
            version: UNKNOWN,
            bytes: 0,
        }
    }

    /// Whether a connection carrying these needs `RESET ALL` before others.
    pub fn needs_reset(&self) -> bool {
        !self.map.is_empty() || self.version == UNKNOWN
    }
}

/// The version of settings not known (never given to a content).
const UNKNOWN: u64 = u64::MAX;

impl std::ops::Deref for Settings {
    type Target = SessionParams;
    fn deref(&self) -> &SessionParams {
        &self.map
    }
}

/// Same content: the same version, or (after the table was emptied) the
/// same maps.
impl PartialEq for Settings {
    fn eq(&self, other: &Settings) -> bool {
        if self.version == UNKNOWN || other.version == UNKNOWN {
            return false;
        }
        self.version == other.version || self.map == other.map
    }
}

impl Eq for Settings {}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> SessionParams {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equal_contents_share_a_version_and_different_ones_do_not() {
        let a = Settings::new(map(&[("application_name", "SET application_name = 'a'")]));
        let b = Settings::new(map(&[("application_name", "SET application_name = 'a'")]));
        let c = Settings::new(map(&[("application_name", "SET application_name = 'c'")]));
        assert_eq!(a.version, b.version);
        assert_ne!(a.version, c.version);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(Settings::default().version, Settings::new(map(&[])).version);
    }

    #[test]
    fn every_change_moves_the_version_with_the_content() {
        let start = map(&[("DateStyle", "SET DateStyle = 'ISO'")]);
        let client = Settings::new(start.clone());
        let mut server = client.clone();
        server.insert("search_path".into(), "SET search_path = x".into());
        assert_ne!(server, client, "a SET on the server");
        server.remove("search_path");
        assert_eq!(server, client, "and its RESET");
        server.remove("not set");
        assert_eq!(server, client);
        server.clear();
        assert_ne!(server, client, "RESET ALL");
        assert_eq!(server, Settings::default());
        let mut back = Settings::default();
        back.insert("DateStyle".into(), "SET DateStyle = 'ISO'".into());
        assert_eq!(back, client, "the same content by another road");
    }

    #[test]
    fn an_emptied_table_gives_new_versions_and_comparison_stays_right() {
        // A table of this test's own: the process-wide one is left alone.
        let local = Mutex::new(Table::default());
        let settings = |m: SessionParams| Settings {
            version: version_in(&local, &m),
            bytes: bytes_of(&m),
            map: m,
        };
        let first = settings(map(&[("TimeZone", "SET TimeZone = 'UTC'")]));
        // Fill the table past its size: it is emptied on the way.
        for i in 0..=TABLE_MAX {
            let _ = settings(map(&[("x", &format!("SET x = {i}"))]));
        }
        let again = settings(map(&[("TimeZone", "SET TimeZone = 'UTC'")]));
        assert_ne!(
            first.version, again.version,
            "seen again after the table emptied"
        );
        assert_eq!(first, again, "equal maps, whatever their versions");
        let other = settings(map(&[("TimeZone", "SET TimeZone = 'CET'")]));
        assert_ne!(first, other);
        assert_ne!(again, other);
    }

    #[test]
    fn the_table_is_bounded_in_bytes_and_large_contents_are_not_stored() {
        let local = Mutex::new(Table::default());
        let big = "x".repeat(2048);
        let mut m = SessionParams::new();
        // 600 distinct 2 kB settings, one more each time (the growing map
        // of one client): the table never holds more than its byte bound.
        for i in 0..600 {
            m.insert(format!("app.k{i}"), format!("SET app.k{i} = '{big}'"));
            let _ = version_in(&local, &m);
            let t = local.lock().unwrap();
            assert!(t.bytes <= TABLE_MAX_BYTES, "{} bytes at {i}", t.bytes);
            assert_eq!(t.bytes, bytes_of_all(&t));
        }
        // Equal large contents still compare equal, in full.
        let a = Settings::new(m.clone());
        let b = Settings::new(m);
        assert_ne!(a.version, b.version);
        assert_eq!(a, b);
        assert_eq!(a.bytes(), bytes_of(&a));
        let mut c = a.clone();
        c.insert("app.k0".into(), "SET app.k0 = 1".into());
        c.remove("app.k1");
        assert_eq!(c.bytes(), bytes_of(&c), "kept as the map changes");
        c.clear();
        assert_eq!(c.bytes(), 0);
        // Settings not known equal nothing, not even empty ones.
        assert_ne!(Settings::unknown(), Settings::default());
        assert!(Settings::unknown().needs_reset());
        assert!(!Settings::default().needs_reset());
    }

    fn bytes_of_all(t: &Table) -> usize {
        t.versions.keys().map(bytes_of).sum()
    }
}
