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
//! mean equal contents. When the table is full it is emptied; contents seen
//! again get a new version, and two settings whose versions differ are then
//! compared in full: slower, never wrong.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::conn::SessionParams;

/// Most distinct contents remembered.
const TABLE_MAX: usize = 4096;

/// The version of the empty settings (never given to anything else).
const EMPTY: u64 = 0;

static NEXT: AtomicU64 = AtomicU64::new(EMPTY + 1);

fn table() -> &'static Mutex<HashMap<SessionParams, u64>> {
    static TABLE: OnceLock<Mutex<HashMap<SessionParams, u64>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The version of `map`'s content.
fn version_of(map: &SessionParams) -> u64 {
    version_in(table(), map)
}

/// The version of `map`'s content, as `table` remembers it.
fn version_in(table: &Mutex<HashMap<SessionParams, u64>>, map: &SessionParams) -> u64 {
    if map.is_empty() {
        return EMPTY;
    }
    let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&v) = table.get(map) {
        return v;
    }
    if table.len() >= TABLE_MAX {
        table.clear();
    }
    let v = NEXT.fetch_add(1, Ordering::Relaxed);
    table.insert(map.clone(), v);
    v
}

/// Parameter key -> the statement that set it, with its content's version.
/// Read through `Deref`; changed only through the methods below, which
/// keep the version right.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    map: SessionParams,
    version: u64,
}

impl Settings {
    pub fn new(map: SessionParams) -> Settings {
        Settings {
            version: version_of(&map),
            map,
        }
    }

    pub fn insert(&mut self, key: String, stmt: String) {
        self.map.insert(key, stmt);
        self.version = version_of(&self.map);
    }

    pub fn remove(&mut self, key: &str) {
        if self.map.remove(key).is_some() {
            self.version = version_of(&self.map);
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.version = EMPTY;
    }
}

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
        let local = Mutex::new(HashMap::new());
        let settings = |m: SessionParams| Settings {
            version: version_in(&local, &m),
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
}
