//! The PostgreSQL suite on CPU-capped nodes: read scale-out on 1-3 nodes and
//! sysbench's read, write and combined workloads on a capped primary and replica.

use super::*;

/// Scenario 2 and 1 on capped nodes: a primary and 2 replicas, each server in
/// its own cgroup; pgbench -S read scale-out over 1, 2 and 3 nodes against
/// Pgpool-II on 3; sysbench on the primary and one replica.
pub(super) fn capped(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    let Some(caps) = caps(opts, 3, report) else {
        return Ok(());
    };
    let three = Options {
        replicas: 2,
        ..opts.clone()
    };
    let cluster = start_cluster(&three, init_timeout(opts))?;
    report.version(format!(
        "PostgreSQL {}",
        cluster.primary().sql("SHOW server_version")?.trim()
    ));
    prepare_sysbench(opts, &cluster)?;
    cluster.wait_replicas_caught_up(SYSBENCH_PREPARE_TIMEOUT)?;
    for (i, node) in cluster.nodes().enumerate() {
        caps.add_server(i, node.data_dir())?;
    }
    let primary = cluster.primary().addr();
    let replicas: Vec<String> = cluster.replicas().iter().map(|r| r.addr()).collect();
    let mut sections = Vec::new();
    let mut listens = Vec::new();
    for nodes in 1..=3 {
        let listen = format!("127.0.0.1:{}", free_port());
        sections.push(scale_out_section(
            &format!("nodes{nodes}"),
            &listen,
            &primary,
            &replicas[..nodes - 1],
        ));
        listens.push(listen);
    }
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    let children = SYSBENCH_THREADS + crate::pgpool::SPARE_CHILDREN;
    let pgpool = if Path::new(PGPOOL).is_file() {
        Some((
            Pgpool::start(&primary, &replicas[..1], children)?,
            Pgpool::start(&primary, &replicas, children)?,
        ))
    } else {
        None
    };
    let check = || -> Result<()> {
        fulcrum_alive(&fulcrum)?;
        if let Some((two, three)) = &pgpool {
            two.check_alive()?;
            three.check_alive()?;
        }
        Ok(())
    };
    let throttling = || caps.throttling_all(3);
    let cap = format!("each server capped at {} CPU", opts.cpu_quota);

    // Scenario 2: read scale-out.
    let before = throttling();
    let mut scale = Scenario::new(
        "pg-scale-out",
        "Read scale-out: pgbench -S on 1, 2 and 3 capped nodes (PostgreSQL)",
        format!(
            "`pgbench -S -M simple -c {CLIENTS} -j 2`, scale {}, a primary and 2 streaming \
             replicas, {cap}; Fulcrum (`consistency = \"eventual\"`, `reads_on_primary`) \
             reads from 1, 2 or 3 nodes, Pgpool-II (streaming replication mode, load \
             balancing, equal weights) from 3. The published Pgpool-II figures: 1,552 TPS \
             direct, 1,623 / 2,428 / 2,926 / 3,326 with 1 / 2 / 3 / 4 nodes.",
            opts.scale
        ),
    );
    scale
        .rows
        .push(Row::new(DIRECT, primary.clone()).with_nodes(1));
    for (i, listen) in listens.iter().enumerate() {
        let name = format!("Fulcrum, {} node{}", i + 1, if i == 0 { "" } else { "s" });
        scale
            .rows
            .push(Row::new(name, listen.clone()).with_nodes(i + 1));
    }
    if let Some((_, three)) = &pgpool {
        scale
            .rows
            .push(Row::new("Pgpool-II, 3 nodes", three.addr.clone()).with_nodes(3));
    }
    let args: Vec<String> = ["-S", "-M", "simple", "-c", &CLIENTS.to_string(), "-j", "2"]
        .map(String::from)
        .to_vec();
    alternate(
        &mut scale.rows,
        opts.rounds,
        true,
        |row, warm| {
            let seconds = if warm { WARMUP_SECONDS } else { opts.seconds };
            pgbench_sample(&row.addr, &args, seconds, !warm)
        },
        check,
    )?;
    let after = throttling();
    scale.notes.push(throttle_note(&before, &after, &cluster));
    let direct = scale.rows[0].clone();
    let three_nodes = scale.rows[3].clone();
    scale.goals.push(Goal::ratio_at_least(
        "pgbench -S, 3 capped nodes",
        &three_nodes,
        &direct,
        2.85,
    ));
    if let Some(pool) = scale.row("Pgpool-II, 3 nodes").cloned() {
        scale.goals.push(Goal::ratio_at_least(
            "pgbench -S, 3 capped nodes, ahead of Pgpool-II",
            &three_nodes,
            &pool,
            1.0,
        ));
    }
    report.add(scale);

    // Scenario 1: sysbench on a primary and one replica.
    let workloads: [(&str, &[&str], &str); 4] = [
        ("point-select", &["oltp_point_select"], "simple read"),
        (
            "read-only",
            &["oltp_read_only", "--skip-trx=on"],
            "complex read",
        ),
        ("write-only", &["oltp_write_only"], "write"),
        ("read-write", &["oltp_read_write"], "combined"),
    ];
    for (id, args, shape) in workloads {
        let mut s = Scenario::new(
            &format!("pg-s1-{id}"),
            format!(
                "sysbench {} ({shape}), primary + 1 replica, capped (PostgreSQL)",
                args[0]
            ),
            format!(
                "`sysbench --db-driver=pgsql {} --threads={SYSBENCH_THREADS}`, 2 tables of \
                 {} rows, a primary and 1 streaming replica, {cap}. The published shape \
                 (1 master + 1 slave, 20-65 clients): MySQL Proxy +87.7 % on simple reads, \
                 +92.5 % on complex reads, equal to direct on writes; Pgpool-II 50-58 % of \
                 direct on reads, 84 % on writes.",
                args.join(" "),
                opts.table_size
            ),
        );
        s.rows.push(Row::new(DIRECT, primary.clone()));
        s.rows
            .push(Row::new("Fulcrum, 2 nodes", listens[1].clone()));
        if let Some((two, _)) = &pgpool {
            s.rows
                .push(Row::new("Pgpool-II, 2 nodes", two.addr.clone()));
        }
        alternate(
            &mut s.rows,
            opts.rounds,
            true,
            |row, warm| {
                let seconds = if warm { WARMUP_SECONDS } else { opts.seconds };
                sysbench_sample(opts, &row.addr, args, seconds)
            },
            check,
        )?;
        let (direct, fulcrum) = (s.rows[0].clone(), s.rows[1].clone());
        if id == "write-only" {
            s.goals.push(Goal::ratio_at_least(
                "sysbench oltp_write_only, capped primary",
                &fulcrum,
                &direct,
                0.97,
            ));
        }
        if let Some(pool) = s.row("Pgpool-II, 2 nodes").cloned() {
            s.goals.push(Goal::ratio_at_least(
                &format!("sysbench {}, ahead of Pgpool-II", args[0]),
                &fulcrum,
                &pool,
                1.0,
            ));
        }
        report.add(s);
    }
    drop(pgpool);
    drop(fulcrum);
    drop(cluster);
    drop(caps);
    Ok(())
}

/// The share of CPU periods in which each node's cap held it back.
pub(super) fn throttle_note(
    before: &[Throttling],
    after: &[Throttling],
    cluster: &PgCluster,
) -> String {
    let shares: Vec<String> = before
        .iter()
        .zip(after)
        .zip(cluster.nodes())
        .map(|((&before, after), node)| {
            format!("{} {}", node.name(), after.since(before).percent())
        })
        .collect();
    format!(
        "CPU periods in which the cap throttled each server during this scenario (warm-ups \
         included; a node serves only some targets): {}. A throttled node is the \
         bottleneck, as on a real cluster.",
        shares.join(", ")
    )
}
