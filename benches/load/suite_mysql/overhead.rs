//! `my-overhead-N` (published scenario 3): the latency Fulcrum adds to a
//! trivial query, `SELECT VERSION()` from a sysbench Lua script, with
//! percentiles from sysbench's latency histogram.

use fulcrum_testkit::{FulcrumProcess, MariaNode};

use super::{rounds_text, sysbench_sample, TempFile, POOL_SIZE};
use crate::fulcrum::fulcrum_alive;
use crate::report::{self, Goal, Row, Scenario};
use crate::{Options, Result};

/// `my-overhead-*`: sysbench `--threads`, one scenario each.
pub(super) const OVERHEAD_CLIENTS: [u32; 3] = [1, 5, 45];
/// `my-overhead-1`: the most Fulcrum may add to the p50, in ms.
const OVERHEAD_GOAL_MS: f64 = 0.050;
/// sysbench's latency histogram: 1,024 logarithmic buckets from 0.001 ms to
/// 100,000 ms (`sb_histogram_init` in sysbench 1.0).
const HISTOGRAM_BUCKETS: f64 = 1024.0;
const HISTOGRAM_RANGE: (f64, f64) = (0.001, 100_000.0);

/// `my-overhead-*`: one `SELECT VERSION()` per sysbench event, on one
/// connection per thread opened before the clock starts.
pub(super) const SELECT_VERSION_SCRIPT: &str = r#"-- Fulcrum load bench: one SELECT VERSION() per event.
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end

function thread_done()
  con:disconnect()
end

function event()
  con:query("SELECT VERSION()")
end
"#;

/// One `my-overhead-N`: `SELECT VERSION()` at `clients` threads directly
/// and through Fulcrum on `listen`.
pub(super) fn overhead(
    opts: &Options,
    clients: u32,
    script: &TempFile,
    primary: &MariaNode,
    listen: &str,
    fulcrum: &FulcrumProcess,
) -> Result<Scenario> {
    let mut scenario = Scenario::new(
        &format!("my-overhead-{clients}"),
        format!(
            "MariaDB per-query overhead: SELECT VERSION(), {}, uncapped",
            clients_text(clients)
        ),
        format!(
            "The shape of published scenario 3 (the latency a proxy adds to a trivial \
             query). One MariaDB server, uncapped; a sysbench 1.0 Lua script whose event is \
             one `SELECT VERSION()` on a connection per thread opened before the clock \
             starts; {clients} sysbench threads, so TPS is queries per second. \
             Targets: the server directly, and Fulcrum in front of it (`workers = {}`, \
             transaction pooling, `pool_size = {POOL_SIZE}`). Latency percentiles come \
             from sysbench's `--histogram`. {}",
            opts.workers,
            rounds_text(opts)
        ),
    );
    scenario.rows = vec![
        Row::new(
            format!("MariaDB direct, {}", clients_text(clients)),
            primary.addr(),
        ),
        Row::new(format!("Fulcrum, {}", clients_text(clients)), listen),
    ];
    let script_path = script.path();
    report::alternate(
        &mut scenario.rows,
        opts.rounds,
        true,
        |row, warm_up| {
            sysbench_sample(opts, &row.addr, &[script_path.as_str()], clients, warm_up)
                .map(|(sample, _)| sample)
        },
        || fulcrum_alive(fulcrum),
    )?;
    let (direct, proxied) = (&scenario.rows[0], &scenario.rows[1]);
    let (Some(d), Some(f)) = (direct.latency(0), proxied.latency(0)) else {
        return Err("no p50 from sysbench's histogram".into());
    };
    let added = f - d;
    if clients == 1 {
        scenario.goals.push(Goal {
            what: format!(
                "added latency p50, 1 client, SELECT VERSION() (MariaDB): <= \
                 {OVERHEAD_GOAL_MS:.3} ms over direct"
            ),
            measured: format!("{added:.3} ms"),
            met: added <= OVERHEAD_GOAL_MS,
        });
    }
    scenario.notes.push(format!(
        "Added at p50 (median of rounds, Fulcrum minus direct): {added:.3} ms ({d:.3} ms \
         direct, {f:.3} ms through Fulcrum). {}",
        histogram_note(d)
    ));
    Ok(scenario)
}

/// "1 client", "5 clients".
pub(super) fn clients_text(clients: u32) -> String {
    match clients {
        1 => "1 client".into(),
        n => format!("{n} clients"),
    }
}

/// How fine sysbench's latency histogram is around `ms`.
fn histogram_note(ms: f64) -> String {
    let (low, high) = HISTOGRAM_RANGE;
    let step = (high / low).powf(1.0 / HISTOGRAM_BUCKETS);
    format!(
        "sysbench's histogram has {HISTOGRAM_BUCKETS} logarithmic buckets from {low} ms to \
         {:.0} s, each {:.1} % wider than the one below, and prints bucket values to 0.001 \
         ms: around {ms:.3} ms a percentile is known to about {:.3} ms, so each p50 here \
         is exact to that step and the difference to about twice it.",
        high / 1000.0,
        100.0 * (step - 1.0),
        (ms * (step - 1.0)).max(0.001)
    )
}
