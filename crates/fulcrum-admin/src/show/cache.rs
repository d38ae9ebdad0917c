//! SHOW CACHE: per cluster with a result cache, one line for the cluster
//! (its entries and bytes now, each database's change stream) and one per
//! statement digest (entries, bytes, hits, misses, invalidations by source).

use bytes::BytesMut;
use fulcrum_cache::Source;

use crate::rows::result;
use crate::Admin;

impl Admin {
    pub(super) fn show_cache(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let Some(cache) = c.cache() else {
                continue;
            };
            let name = c.config().name.clone();
            let streams: Vec<String> = cache
                .streams()
                .iter()
                .map(|(db, up)| format!("{db}: {}", if *up { "up" } else { "down" }))
                .collect();
            let streams = match (cache.uses_streams(), streams.is_empty()) {
                (false, _) => "change streams: not used (Fulcrum's own writes only)".to_owned(),
                (true, true) => "change streams: none yet".to_owned(),
                (true, false) => format!("change streams: {}", streams.join(", ")),
            };
            let mut line = vec![
                name.clone(),
                "(cluster)".into(),
                streams,
                cache.len().to_string(),
                cache.bytes().to_string(),
            ];
            line.extend(std::iter::repeat_n(String::new(), 2 + Source::ALL.len()));
            rows.push(line);
            for d in cache.digests() {
                let mut row = vec![
                    name.clone(),
                    format!("{:016x}", d.digest),
                    d.text.to_string(),
                    d.entries.to_string(),
                    d.bytes.to_string(),
                    d.hits.to_string(),
                    d.misses.to_string(),
                ];
                row.extend(d.invalidations.iter().map(|n| n.to_string()));
                rows.push(row);
            }
        }
        let mut columns = vec![
            "cluster", "digest", "query", "entries", "bytes", "hits", "misses",
        ];
        columns.extend([
            "invalidated_proxy",
            "invalidated_stream",
            "invalidated_ttl",
            "invalidated_memory",
            "invalidated_flush",
        ]);
        debug_assert_eq!(Source::ALL.len(), 5);
        result(out, &columns, &rows);
    }
}
