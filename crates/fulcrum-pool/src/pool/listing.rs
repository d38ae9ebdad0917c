//! A pool's connections as SHOW SERVERS lists them: each open one, idle
//! when on the idle list (`used` past `server_check_delay`), else active.

use std::sync::Arc;

use super::Inner;
use crate::coarse;
use crate::servers::{Entry, ListServers, ServerRow, ServerState};

impl<C: Send> ListServers for Inner<C> {
    /// Each open connection: idle when on the idle list (`used` past
    /// `server_check_delay`), else active (checked out).
    fn servers(&self) -> Vec<ServerRow> {
        let Some(labels) = self.labels.get() else {
            return Vec::new();
        };
        let now = coarse::ms();
        let idle: std::collections::HashMap<*const Entry, u64> = self
            .idle_list()
            .iter()
            .map(|i| (Arc::as_ptr(&i.entry), i.since_ms))
            .collect();
        let lifetime = self.settings.lifetime.map(|l| l.as_millis() as u64);
        self.entries
            .alive()
            .iter()
            .map(|e| {
                let state = match idle.get(&Arc::as_ptr(e)) {
                    None => ServerState::Active,
                    Some(&since) if self.past_check_delay(since, now) => ServerState::Used,
                    Some(_) => ServerState::Idle,
                };
                let close_needed = self.is_retired(e.born)
                    || lifetime.is_some_and(|l| now.saturating_sub(e.born_ms()) >= l);
                e.row(labels, state, close_needed)
            })
            .collect()
    }
}
