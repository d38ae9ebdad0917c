//! Command-line options: [`USAGE`], and [`Options`] parsed from the bench's
//! arguments with each mode's defaults and the combinations it refuses.

use crate::mode_scale_out::SCALE_OUT_NODES;
use crate::pgbench::Workload;

pub(crate) const USAGE: &str = "\
usage: cargo bench --bench load -- [options]
  --seconds N     length of each pgbench run (default 10)
  --clients N     pgbench -c (default 16)
  --jobs N        pgbench -j (default 2)
  --rounds N      rounds; each runs every target once (default 3)
  --scale N       pgbench -i -s (default 10)
  --protocol P    pgbench -M: simple, extended or prepared (default simple)
  --workers N     Fulcrum's [fulcrum] workers (default 1)
  --baseline PATH default mode: also measure the Fulcrum binary at PATH
                  (e.g. an earlier commit's release build) as the target
                  \"Fulcrum (baseline)\", side by side in the same run
  --replicas N    streaming replicas, listed as Fulcrum replicas (default 0)
  --cpu-split     each proxy's own user and system CPU and context switches
                  per pgbench -S transaction, side by side: Fulcrum with
                  default settings, Fulcrum with workers = 1, PgBouncer
                  (-M simple only: 1.18 has no prepared statements in
                  transaction pooling), for -M simple and prepared at 16
                  and 64 clients; report in target/bench-cpu-split.md
  --tls           default mode with TLS on both sides: PostgreSQL with
                  ssl = on, Fulcrum with tls_mode and server_tls = require,
                  PgBouncer with client_tls_sslmode and server_tls_sslmode =
                  require, pgbench with sslmode=require (Pgpool-II left out)
  --consistency-cost
                  compare direct, Fulcrum consistency=eventual and
                  consistency=session instead of direct/Fulcrum/PgBouncer
  --balance       the balance policies (round_robin, least_connections,
                  p2c) on 3 nodes capped at --cpu-quota, beside direct and
                  Pgpool-II; report in target/bench-balance.md
  --slow-node     with --balance: the second replica runs CPU-heavy queries
                  of its own throughout (one slow node of three)
  --nodes N       with --balance: the proxies read from the first N nodes
                  (1 to 3, default 3)
  --digest-cost   compare direct, Fulcrum with digest statistics off
                  (digest_max_entries = 0) and on (the default), as
                  --consistency-cost does; report in target/bench-digests.md
  --replay-cost   compare direct, Fulcrum with transaction_replay off and
                  on, as --consistency-cost does (default workloads
                  tpcb,select); report in target/bench-replay.md
  --mirror-cost   compare direct, Fulcrum without a mirror and with an
                  async [[cluster.mirror]] of every client (writes too) to a
                  second cluster capped at 0.2 CPU, as --consistency-cost
                  does; report in target/bench-mirror.md
  --mysql-replay-cost
                  the same on MariaDB with sysbench, as
                  --mysql-consistency-cost; target/bench-mysql-replay.md
  --workload LIST comma-separated: select (pgbench -S), tpcb (pgbench's
                  default script), write-read (UPDATE then SELECT of one row,
                  autocommit), mixed (each transaction TPC-B 1 in 10, -S 9
                  in 10, one user); default select, or tpcb,select with
                  --consistency-cost
  --mysql-consistency-cost
                  the same on MariaDB (a primary and --replicas GTID replicas,
                  default 1) with sysbench oltp_read_write and oltp_read_only
                  --skip-trx=on: --clients is --threads, --seconds is --time
  --table-size N  sysbench --table-size, 2 tables (default 10000)
  --ps-mode M     sysbench --db-ps-mode: auto or disable (default auto)
  --scale-out     read scale-out: a primary and 2 streaming replicas, each in
                  its own CPU-capped cgroup; targets PostgreSQL direct and
                  Fulcrum reading from 1, 2 and 3 nodes (pgbench -S); writes
                  docs/img/scale-out.png
  --cache         the result cache (issue 46): one primary capped at
                  --cpu-quota, pgbench -M prepared then -M simple (only
                  --protocol's mode when given) reading pgbench_accounts with
                  aid random in 1..1000, -c 8 and -s 1 unless given; targets
                  PostgreSQL direct, Fulcrum without a cache and Fulcrum with
                  a rule on pgbench_accounts; report in target/bench-cache.md
  --mysql-cache   the same on MariaDB: one primary capped at --cpu-quota,
                  sysbench oltp_point_select (--table-size 500 unless given:
                  1,000 keys in 2 tables), --db-ps-mode auto then disable
                  (only --ps-mode's when given), -c 8 unless given; targets
                  MariaDB direct, Fulcrum without a cache and Fulcrum with a
                  rule on sbtest1 and sbtest2; target/bench-mysql-cache.md
  --cpu-period MS --balance, --scale-out, --cache, --mysql-cache: the CFS
                  period of the caps (default 100; the quota is --cpu-quota
                  x this, at least 1 ms)
  --cpu-quota F   --scale-out, --cache, --mysql-cache: CPUs per capped
                  server (default 0.3; 0 runs uncapped and --scale-out plots
                  to target/ instead of docs/img/)
  --suite         the whole suite (docs/benchmarks.md, The suite): the
                  published comparisons (scenarios 1-4) on PostgreSQL and
                  MariaDB clusters it starts, uncapped and CPU-capped, against
                  direct, Fulcrum, PgBouncer and Pgpool-II; rewrites the suite
                  section of docs/benchmarks-suite.md and docs/img/suite-*.png
                  (--seconds, --rounds, --cpu-quota apply; defaults 8 s, 2
                  rounds, 0.3 CPU)
  --mysql-cpu-quota F
                  --suite: CPUs per MariaDB server when capped (default 0.1:
                  a point select costs MariaDB less than pgbench -S costs
                  PostgreSQL, so at 0.3 the 2 cores run out before the caps do)
  --only DB       --suite: postgres or mysql only
  --skip LIST     --suite: parts to leave out, comma-separated: pg-uncapped,
                  pg-connections, pg-capped, my-uncapped, my-s1 (the MariaDB
                  scenario 1 runs; my-scale-out stays)
  --relay KIND    --suite, --balance: the plain TCP relay of the control row,
                  haproxy (default) or socat
  --mysql-setting K=V
                  --suite: a mariadbd option for the capped MariaDB cluster
                  (repeatable; after the suite's own thread_handling=
                  pool-of-threads and thread_pool_size=1), e.g.
                  thread_handling=one-thread-per-connection
  --no-docs       --suite: write target/bench-suite-<db>.md and target/suite-img/
                  only
Environment: FULCRUM_BIN=path skips building the daemon.";

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) seconds: u64,
    pub(crate) clients: u32,
    pub(crate) jobs: u32,
    pub(crate) rounds: usize,
    pub(crate) scale: u32,
    pub(crate) protocol: String,
    /// Fulcrum's `[fulcrum] workers` (1: one event-loop thread, like PgBouncer).
    pub(crate) workers: u32,
    /// `--baseline PATH`: a second Fulcrum binary measured beside this one.
    pub(crate) baseline: Option<std::path::PathBuf>,
    /// Streaming replicas started and listed in Fulcrum's config.
    pub(crate) replicas: usize,
    /// Direct vs Fulcrum `eventual` vs `session` instead of the proxies.
    pub(crate) consistency_cost: bool,
    /// What pgbench runs, one measurement per entry, in order.
    pub(crate) workloads: Vec<Workload>,
    /// `--digest-cost`: Fulcrum with digest statistics off vs on.
    pub(crate) digest_cost: bool,
    /// `--replay-cost` / `--mysql-replay-cost`: transaction_replay off vs on.
    pub(crate) replay_cost: bool,
    /// `--mirror-cost`: Fulcrum without and with an async mirror.
    pub(crate) mirror_cost: bool,
    /// `--balance`: the read-balancing policies on the capped 3-node regime.
    pub(crate) balance: bool,
    /// `--balance --slow-node`: one replica busy with its own CPU-heavy queries.
    pub(crate) slow_node: bool,
    /// `--balance --nodes N`: the proxies read from the first N nodes (1 to 3).
    pub(crate) balance_nodes: usize,
    /// `--consistency-cost` on MariaDB with sysbench.
    pub(crate) mysql_consistency_cost: bool,
    /// sysbench `--table-size` (rows in each of its 2 tables).
    pub(crate) table_size: u64,
    /// sysbench `--db-ps-mode`.
    pub(crate) ps_mode: String,
    /// Direct vs Fulcrum on 1, 2 and 3 CPU-capped nodes.
    pub(crate) scale_out: bool,
    /// `--scale-out`: CPUs per PostgreSQL server's cgroup (0: no cgroups).
    pub(crate) cpu_quota: f64,
    /// `--cpu-period MS`: the cgroups' CPU period, in µs (default 100 ms).
    pub(crate) cpu_period_us: u64,
    /// `--suite`: scenarios 1-4 on both databases, into docs/benchmarks-suite.md.
    pub(crate) suite: bool,
    /// `--suite --only postgres|mysql`: one database only.
    pub(crate) only: Option<String>,
    /// `--suite --no-docs`: report into target/ only, leave docs/ alone.
    pub(crate) no_docs: bool,
    /// `--suite`: CPUs per MariaDB server in the capped regime.
    pub(crate) mysql_cpu_quota: f64,
    /// `--suite --skip a,b`: parts left out (pg-uncapped, pg-connections,
    /// pg-capped, my-uncapped, my-s1).
    pub(crate) skip: Vec<String>,
    /// `--suite --mysql-setting K=V`: options of the capped MariaDB servers.
    pub(crate) mysql_settings: Vec<(String, String)>,
    /// `--relay`: the control row's TCP relay.
    pub(crate) relay: crate::relay::RelayKind,
    /// `--tls`: the default mode with TLS from clients and to the server.
    pub(crate) tls: bool,
    /// `--cpu-split`: each proxy's user and system CPU and switches per
    /// transaction, -M simple and prepared, 16 and 64 clients.
    pub(crate) cpu_split: bool,
    /// `--cache`: direct vs Fulcrum without and with a result-cache rule.
    pub(crate) cache: bool,
    /// `--protocol` was given (`--cache` then runs that mode only).
    pub(crate) protocol_given: bool,
    /// `--mysql-cache`: `--cache` on MariaDB with sysbench.
    pub(crate) mysql_cache: bool,
    /// `--ps-mode` was given (`--mysql-cache` then runs that mode only).
    pub(crate) ps_mode_given: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options, String> {
        let mut opts = Options {
            seconds: 10,
            clients: 16,
            jobs: 2,
            rounds: 3,
            scale: 10,
            protocol: "simple".into(),
            workers: 1,
            baseline: None,
            replicas: 0,
            consistency_cost: false,
            digest_cost: false,
            replay_cost: false,
            mirror_cost: false,
            balance: false,
            slow_node: false,
            balance_nodes: 3,
            workloads: Vec::new(),
            mysql_consistency_cost: false,
            table_size: 10_000,
            ps_mode: "auto".into(),
            scale_out: false,
            cpu_quota: 0.3,
            cpu_period_us: crate::cpu_caps::CPU_PERIOD_US,
            suite: false,
            only: None,
            no_docs: false,
            skip: Vec::new(),
            mysql_settings: Vec::new(),
            relay: crate::relay::RelayKind::Haproxy,
            mysql_cpu_quota: 0.1,
            tls: false,
            cpu_split: false,
            cache: false,
            protocol_given: false,
            mysql_cache: false,
            ps_mode_given: false,
        };
        let mut replicas_given = false;
        let (mut seconds_given, mut rounds_given) = (false, false);
        let (mut clients_given, mut scale_given) = (false, false);
        let mut table_size_given = false;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            if flag == "--bench" {
                continue;
            }
            if flag == "--consistency-cost" {
                opts.consistency_cost = true;
                continue;
            }
            if flag == "--balance" {
                opts.balance = true;
                continue;
            }
            if flag == "--slow-node" {
                opts.slow_node = true;
                continue;
            }
            if flag == "--digest-cost" {
                // The consistency comparison's machinery, other variants.
                opts.digest_cost = true;
                opts.consistency_cost = true;
                continue;
            }
            if flag == "--mirror-cost" {
                opts.mirror_cost = true;
                opts.consistency_cost = true;
                continue;
            }
            if flag == "--replay-cost" {
                opts.replay_cost = true;
                opts.consistency_cost = true;
                continue;
            }
            if flag == "--mysql-replay-cost" {
                opts.replay_cost = true;
                opts.mysql_consistency_cost = true;
                continue;
            }
            if flag == "--mysql-consistency-cost" {
                opts.mysql_consistency_cost = true;
                continue;
            }
            if flag == "--scale-out" {
                opts.scale_out = true;
                continue;
            }
            if flag == "--suite" {
                opts.suite = true;
                continue;
            }
            if flag == "--tls" {
                opts.tls = true;
                continue;
            }
            if flag == "--cpu-split" {
                opts.cpu_split = true;
                continue;
            }
            if flag == "--cache" {
                opts.cache = true;
                continue;
            }
            if flag == "--mysql-cache" {
                opts.cache = true;
                opts.mysql_cache = true;
                continue;
            }
            if flag == "--no-docs" {
                opts.no_docs = true;
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = |min: u64| -> Result<u64, String> {
                match value.parse::<u64>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(format!("{flag} {value}: expected a whole number >= {min}")),
                }
            };
            match flag.as_str() {
                "--seconds" => {
                    opts.seconds = number(1)?;
                    seconds_given = true;
                }
                "--clients" => {
                    opts.clients = number(1)? as u32;
                    clients_given = true;
                }
                "--jobs" => opts.jobs = number(1)? as u32,
                "--rounds" => {
                    opts.rounds = number(1)? as usize;
                    rounds_given = true;
                }
                "--scale" => {
                    opts.scale = number(1)? as u32;
                    scale_given = true;
                }
                "--workers" => opts.workers = number(0)? as u32,
                "--baseline" => opts.baseline = Some(value.into()),
                "--nodes" => {
                    let n = number(1)? as usize;
                    if n > SCALE_OUT_NODES {
                        return Err(format!("--nodes {n}: at most {SCALE_OUT_NODES}"));
                    }
                    opts.balance_nodes = n;
                }
                "--replicas" => {
                    opts.replicas = number(0)? as usize;
                    replicas_given = true;
                }
                "--table-size" => {
                    opts.table_size = number(1)?;
                    table_size_given = true;
                }
                "--cpu-quota" => match value.parse::<f64>() {
                    Ok(q) if (0.0..=64.0).contains(&q) => opts.cpu_quota = q,
                    _ => return Err(format!("--cpu-quota {value}: expected CPUs, e.g. 0.3")),
                },
                "--cpu-period" => match value.parse::<u64>() {
                    Ok(ms) if (1..=1000).contains(&ms) => opts.cpu_period_us = ms * 1000,
                    _ => {
                        return Err(format!(
                            "--cpu-period {value}: expected milliseconds from 1 to 1000, e.g. 5"
                        ))
                    }
                },
                "--mysql-cpu-quota" => match value.parse::<f64>() {
                    Ok(q) if (0.0..=64.0).contains(&q) => opts.mysql_cpu_quota = q,
                    _ => {
                        return Err(format!(
                            "--mysql-cpu-quota {value}: expected CPUs, e.g. 0.1"
                        ))
                    }
                },
                "--ps-mode" if ["auto", "disable"].contains(&value.as_str()) => {
                    opts.ps_mode = value.clone();
                    opts.ps_mode_given = true;
                }
                "--ps-mode" => return Err(format!("--ps-mode {value}: expected auto or disable")),
                "--workload" => {
                    opts.workloads = value
                        .split(',')
                        .map(|w| {
                            Workload::parse(w.trim())
                                .ok_or_else(|| format!("--workload {value}: unknown workload {w}"))
                        })
                        .collect::<Result<_, _>>()?
                }
                "--protocol" if ["simple", "extended", "prepared"].contains(&value.as_str()) => {
                    opts.protocol = value.clone();
                    opts.protocol_given = true;
                }
                "--protocol" => return Err(format!("--protocol {value}: unknown mode")),
                "--only" if ["postgres", "mysql"].contains(&value.as_str()) => {
                    opts.only = Some(value.clone())
                }
                "--only" => return Err(format!("--only {value}: expected postgres or mysql")),
                "--mysql-setting" => match value.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() => opts
                        .mysql_settings
                        .push((k.trim().to_string(), v.trim().to_string())),
                    _ => {
                        return Err(format!(
                            "--mysql-setting {value}: expected key=value, e.g. thread_handling=one-thread-per-connection"
                        ))
                    }
                },
                "--relay" => match crate::relay::RelayKind::parse(value) {
                    Some(kind) => opts.relay = kind,
                    None => return Err(format!("--relay {value}: expected socat or haproxy")),
                },
                "--skip" => opts.skip = value.split(',').map(|v| v.trim().to_string()).collect(),
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if opts.cache {
            if !clients_given {
                opts.clients = 8;
            }
            if !scale_given {
                opts.scale = 1;
            }
            if opts.mysql_cache && !table_size_given {
                opts.table_size = 500;
            }
        }
        // pgbench refuses more threads than clients.
        opts.jobs = opts.jobs.min(opts.clients);
        if opts.suite {
            if opts.scale_out || opts.consistency_cost || opts.cache || opts.mysql_consistency_cost
            {
                return Err("--suite is a run of its own".into());
            }
            if !opts.workloads.is_empty() || replicas_given {
                return Err("--suite chooses its own workloads and replicas".into());
            }
            if !seconds_given {
                opts.seconds = 8;
            }
            if !rounds_given {
                opts.rounds = 2;
            }
            return Ok(opts);
        }
        if opts.slow_node && !opts.balance {
            return Err("--slow-node is for --balance".into());
        }
        if opts.only.is_some() || opts.no_docs {
            return Err("--only and --no-docs are for --suite".into());
        }
        if opts.cpu_period_us != crate::cpu_caps::CPU_PERIOD_US
            && !opts.balance
            && !opts.scale_out
            && !opts.cache
        {
            return Err("--cpu-period is for --balance, --scale-out and --cache".into());
        }
        if (opts.cpu_quota * opts.cpu_period_us as f64) < 1000.0 && opts.cpu_quota > 0.0 {
            return Err(format!(
                "--cpu-quota {} x --cpu-period {} ms is under the kernel's 1 ms minimum quota: use a longer period",
                opts.cpu_quota,
                opts.cpu_period_us / 1000
            ));
        }
        if opts.cache {
            if opts.balance
                || opts.scale_out
                || opts.consistency_cost
                || opts.mysql_consistency_cost
            {
                return Err("--cache is a run of its own".into());
            }
            if opts.replicas > 0 || !opts.workloads.is_empty() {
                return Err("--cache starts one primary and runs its own point read".into());
            }
            opts.workloads = vec![Workload::PointRead];
            return Ok(opts);
        }
        if opts.balance {
            if opts.scale_out || opts.consistency_cost || opts.mysql_consistency_cost {
                return Err("--balance is a run of its own".into());
            }
            opts.replicas = SCALE_OUT_NODES - 1;
            opts.workloads = vec![Workload::Select];
            return Ok(opts);
        }
        if opts.scale_out {
            if opts.consistency_cost || opts.mysql_consistency_cost {
                return Err("--scale-out is a run of its own".into());
            }
            if replicas_given && opts.replicas != SCALE_OUT_NODES - 1 {
                return Err(format!(
                    "--scale-out always starts {} replicas",
                    SCALE_OUT_NODES - 1
                ));
            }
            if !opts.workloads.is_empty() && opts.workloads != [Workload::Select] {
                return Err("--scale-out runs pgbench -S only".into());
            }
            opts.replicas = SCALE_OUT_NODES - 1;
            opts.workloads = vec![Workload::Select];
            return Ok(opts);
        }
        if opts.mysql_consistency_cost {
            if opts.consistency_cost {
                return Err(
                    "--consistency-cost and --mysql-consistency-cost are separate runs".into(),
                );
            }
            if !opts.workloads.is_empty() {
                return Err("--workload is for pgbench; --mysql-consistency-cost runs \
                            oltp_read_write and oltp_read_only"
                    .into());
            }
            if !replicas_given {
                opts.replicas = 1;
            }
            return Ok(opts);
        }
        if opts.workloads.is_empty() {
            opts.workloads = if opts.consistency_cost {
                vec![Workload::TpcB, Workload::Select]
            } else {
                vec![Workload::Select]
            };
        }
        if !opts.consistency_cost && opts.workloads != [Workload::Select] {
            return Err("--workload other than select needs --consistency-cost".into());
        }
        Ok(opts)
    }
}
