//! The shared prepared statements a server connection holds, by server-side
//! name, each with when it was last used. Bounded like PgBouncer's
//! `max_prepared_statements`: when a new one would exceed the bound, the
//! least recently used ones not used by the unit in progress are closed on
//! the server (and prepared again if a client uses them later).

use std::collections::HashMap;
use std::sync::Arc;

/// Whether a server-side prepared statement is confirmed or only sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    Pending,
    Ready,
}

#[derive(Debug, Default)]
pub struct ServerStatements {
    map: HashMap<Arc<str>, (Prepared, u64)>,
    /// Advances on every use.
    clock: u64,
    /// The clock when the unit in progress attached: statements used since
    /// are never evicted (a Bind of this unit may still name them).
    unit_start: u64,
}

impl ServerStatements {
    /// A client's unit starts using this connection.
    pub fn begin_unit(&mut self) {
        self.clock += 1;
        self.unit_start = self.clock;
    }

    /// True when `name` is prepared (or being prepared) here; marks it used.
    pub fn use_if_present(&mut self, name: &Arc<str>) -> bool {
        self.clock += 1;
        match self.map.get_mut(name) {
            Some((_, used)) => {
                *used = self.clock;
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// `name` was sent to be prepared.
    pub fn insert_pending(&mut self, name: Arc<str>) {
        self.clock += 1;
        self.map.insert(name, (Prepared::Pending, self.clock));
    }

    /// The server confirmed `name` (ParseComplete).
    pub fn confirm(&mut self, name: Arc<str>) {
        self.clock += 1;
        let used = self.clock;
        self.map
            .entry(name)
            .and_modify(|e| e.0 = Prepared::Ready)
            .or_insert((Prepared::Ready, used));
    }

    pub fn remove(&mut self, name: &str) {
        self.map.remove(name);
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Forgets statements that were sent but not confirmed (after an error
    /// the server skipped them).
    pub fn drop_pending(&mut self) {
        self.map.retain(|_, (s, _)| *s == Prepared::Ready);
    }

    /// Makes room for one more under `max` (0: no bound): the least recently
    /// used confirmed statements not used by the unit in progress are
    /// forgotten and returned, for the caller to close on the server. Fewer
    /// (or none) when the rest are in use by this unit.
    pub fn evict_for_one(&mut self, max: usize) -> Vec<Arc<str>> {
        if max == 0 || self.map.len() < max {
            return Vec::new();
        }
        // Evict a tenth at once, so the scan is paid once per many Parses.
        let want = self.map.len() + 1 - max + max / 10;
        let mut old: Vec<(u64, Arc<str>)> = self
            .map
            .iter()
            .filter(|(_, (s, used))| *s == Prepared::Ready && *used < self.unit_start)
            .map(|(n, (_, used))| (*used, n.clone()))
            .collect();
        old.sort_unstable_by_key(|(used, _)| *used);
        old.truncate(want);
        for (_, name) in &old {
            self.map.remove(name);
        }
        old.into_iter().map(|(_, n)| n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> Arc<str> {
        format!("fulcrum_{i}").into()
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let mut s = ServerStatements::default();
        s.begin_unit();
        for i in 0..10 {
            s.insert_pending(name(i));
            s.confirm(name(i));
        }
        s.begin_unit();
        assert!(s.use_if_present(&name(0)), "0 is used again");
        s.begin_unit();
        let gone = s.evict_for_one(10);
        assert_eq!(gone, vec![name(1), name(2)], "a tenth more than needed");
        assert_eq!(s.len(), 8);
        assert!(s.contains("fulcrum_0"));
        assert!(s.evict_for_one(10).is_empty(), "room enough");
    }

    #[test]
    fn statements_of_the_unit_in_progress_stay() {
        let mut s = ServerStatements::default();
        s.begin_unit();
        for i in 0..4 {
            s.insert_pending(name(i));
            s.confirm(name(i));
        }
        assert!(s.evict_for_one(4).is_empty(), "all in use by this unit");
        s.begin_unit();
        s.use_if_present(&name(3));
        assert_eq!(s.evict_for_one(4), vec![name(0)]);
        s.insert_pending(name(9));
        assert!(
            s.evict_for_one(4)
                .iter()
                .all(|n| n.as_ref() != "fulcrum_9" && n.as_ref() != "fulcrum_3"),
            "pending and just-used ones stay"
        );
    }

    #[test]
    fn no_bound_means_no_eviction() {
        let mut s = ServerStatements::default();
        for i in 0..100 {
            s.insert_pending(name(i));
            s.confirm(name(i));
        }
        s.begin_unit();
        assert!(s.evict_for_one(0).is_empty());
    }
}
