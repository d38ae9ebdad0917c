//! SHOW QUERIES (the statement digests of every cluster, or one, by total
//! time) and SHOW MEM (what the process holds: resident memory, clients,
//! pools, server connections, digests).

use bytes::BytesMut;

use crate::execute::Failure;
use crate::rows::result;
use crate::Admin;

impl Admin {
    /// SHOW QUERIES: every cluster's digests (or one's), by total time.
    pub(crate) fn show_queries(
        &self,
        target: Option<&str>,
        out: &mut BytesMut,
    ) -> Result<(), Failure> {
        let clusters = self.targets(target)?;
        let mut rows: Vec<(u64, Vec<String>)> = Vec::new();
        for c in &clusters {
            for d in c.digests().rows() {
                rows.push((
                    d.total_us,
                    vec![
                        c.config().name.clone(),
                        format!("{:016x}", d.id),
                        d.text.clone(),
                        d.calls.to_string(),
                        d.errors.to_string(),
                        d.rows.to_string(),
                        d.total_us.to_string(),
                        d.avg_us().to_string(),
                        d.p50_us.to_string(),
                        d.p99_us.to_string(),
                        d.max_us.to_string(),
                        d.on_primary.to_string(),
                        d.on_replica.to_string(),
                        d.first_seen_s.to_string(),
                        d.last_seen_s.to_string(),
                    ],
                ));
            }
        }
        rows.sort_by_key(|r| std::cmp::Reverse(r.0));
        let rows: Vec<Vec<String>> = rows.into_iter().map(|(_, r)| r).collect();
        result(
            out,
            &[
                "cluster",
                "digest",
                "query",
                "calls",
                "errors",
                "rows",
                "total_us",
                "avg_us",
                "p50_us",
                "p99_us",
                "max_us",
                "primary",
                "replica",
                "first_seen_s",
                "last_seen_s",
            ],
            &rows,
        );
        Ok(())
    }

    /// SHOW MEM.
    pub(crate) fn show_mem(&self, out: &mut BytesMut) {
        let mut rows = vec![vec![
            "process_rss".to_string(),
            String::new(),
            "1".into(),
            resident_bytes().map_or(String::new(), |b| b.to_string()),
        ]];
        rows.push(vec![
            "clients".into(),
            String::new(),
            fulcrum_cluster::clients::registry()
                .snapshot()
                .len()
                .to_string(),
            String::new(),
        ]);
        for c in &self.clusters() {
            let name = c.config().name.clone();
            let (open, pools) = c
                .pools()
                .iter()
                .fold((0, 0), |(o, n), p| (o + p.active + p.idle, n + 1));
            let digests = c.digests();
            rows.push(vec![
                "pools".into(),
                name.clone(),
                pools.to_string(),
                String::new(),
            ]);
            rows.push(vec![
                "server_connections".into(),
                name.clone(),
                open.to_string(),
                String::new(),
            ]);
            rows.push(vec![
                "digests".into(),
                name,
                digests.len().to_string(),
                digests.approx_bytes().to_string(),
            ]);
        }
        result(out, &["name", "cluster", "items", "bytes"], &rows);
    }
}

/// This process's resident memory (`VmRSS` in /proc/self/status), in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
