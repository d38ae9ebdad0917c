//! Application drivers through Fulcrum, as their users call them: psycopg 3
//! with the system libpq 15 (the pure-Python build Debian and Ubuntu users
//! get) and with its bundled libpq (the binary build), against a real
//! primary with two streaming replicas behind a transaction-pooling listener.
//! Each call is bounded: a client that would wait forever fails the test.
//!
//! psycopg and psycopg-binary 3.3 run in the test kit's Python
//! environment (`fulcrum_testkit::python`, made on first use).

use std::sync::{Once, OnceLock};
use std::time::Duration;

use fulcrum_suite::{pg_two_replicas, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};

/// How long one driver script may run before the test calls it a hang.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(30);

/// The binary's shared primary with two replicas (`pg_proxy` uses it too),
/// where `app` may create the tables and types the scripts make.
fn cluster() -> &'static PgCluster {
    static GRANT: Once = Once::new();
    let c = pg_two_replicas();
    GRANT.call_once(|| {
        c.primary()
            .sql(&format!("GRANT CREATE ON SCHEMA public TO {APP_USER}"))
            .expect("grant");
    });
    c
}

/// One Fulcrum for this module's tests: transaction pooling over the cluster.
fn proxy() -> &'static (FulcrumProcess, PgProxyConfig) {
    static PROXY: OnceLock<(FulcrumProcess, PgProxyConfig)> = OnceLock::new();
    PROXY.get_or_init(|| {
        let c = cluster();
        let mut cfg = PgProxyConfig::new(&c.primary().addr()).pool_size(4);
        for r in c.replicas() {
            cfg = cfg.replica(&r.addr());
        }
        let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
        (p, cfg)
    })
}

/// libpq's conninfo for the proxy.
fn dsn() -> String {
    let (host, port) = proxy().1.listen.rsplit_once(':').expect("host:port");
    format!("host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10")
}

/// The two psycopg builds: `python` uses the system libpq (15 here), `binary`
/// the libpq bundled with psycopg-binary (17 or later).
const IMPLS: [&str; 2] = ["python", "binary"];

/// Runs `script` with psycopg's `impl_` build; `DSN` is in its environment.
/// Returns its standard output; panics (naming the build) if it fails or
/// runs past `SCRIPT_TIMEOUT`.
fn psycopg(impl_: &str, script: &str) -> String {
    psycopg_at(impl_, &dsn(), script)
}

/// `psycopg`, against the conninfo `dsn`.
fn psycopg_at(impl_: &str, dsn: &str, script: &str) -> String {
    let prelude = "import os, psycopg\nDSN = os.environ['DSN']\nassert psycopg.pq.__impl__ == os.environ['PSYCOPG_IMPL'], psycopg.pq.__impl__\n";
    fulcrum_suite::run_python(
        &format!("psycopg ({impl_})"),
        &format!("{prelude}{script}"),
        &[("PSYCOPG_IMPL", impl_), ("DSN", dsn)],
        SCRIPT_TIMEOUT,
    )
}

#[test]
fn executemany_in_a_transaction_is_answered() {
    // psycopg pipelines Parse/Bind/Describe/Execute per row, with a Flush
    // and no Sync, inside the transaction Fulcrum answered BEGIN for.
    let script = r#"
rows = [(i,) for i in range(20)]
with psycopg.connect(DSN) as conn:
    with conn.transaction():
        cur = conn.cursor()
        cur.executemany("select %s::int", rows)
        cur.executemany("select %s::int", rows, returning=True)
        got = []
        while True:
            got.append(cur.fetchone()[0])
            if not cur.nextset():
                break
        print(sum(got))
    conn.execute("select 1")
    with conn.transaction():
        conn.execute("select 1")
        with conn.transaction():
            conn.cursor().executemany("select %s::int", rows)
    print("done")
"#;
    for impl_ in IMPLS {
        let out = psycopg(impl_, script);
        assert_eq!(out, format!("{}\ndone\n", (0..20).sum::<i32>()), "{impl_}");
    }
}

#[test]
fn a_large_executemany_with_large_answers_completes() {
    // psycopg writes the whole batch while it reads; its answers are ten
    // times larger than its requests. Fulcrum must keep reading the server
    // while it writes to it, or both wait on each other forever.
    let script = r#"
rows = [(i,) for i in range(20000)]
with psycopg.connect(DSN) as conn:
    with conn.transaction():
        cur = conn.cursor()
        cur.executemany("select %s::int, repeat('x', 2000)", rows, returning=True)
        n = 0
        while True:
            n += len(cur.fetchone()[1])
            if not cur.nextset():
                break
        print(n)
"#;
    for impl_ in IMPLS {
        assert_eq!(psycopg(impl_, script), "40000000\n", "{impl_}");
    }
}

#[test]
fn evicting_a_prepared_statement_is_answered() {
    // prepared_max = 1: the second statement evicts the first. libpq 15 has
    // no protocol Close, so psycopg sends `DEALLOCATE _pg3_0` as a simple
    // query; libpq 17+ sends a Close. Both must be answered.
    let script = r#"
with psycopg.connect(DSN, autocommit=True, prepare_threshold=0) as conn:
    conn.prepared_max = 1
    for i in range(3):
        print(conn.execute("select %s::bigint", (i,)).fetchone()[0])
        print(conn.execute("select %s::text", (str(i),)).fetchone()[0])
with psycopg.connect(DSN, prepare_threshold=0) as conn:
    conn.prepared_max = 1
    with conn.transaction():
        print(conn.execute("select 7::bigint").fetchone()[0])
        print(conn.execute("select 8::text").fetchone()[0])
        print(conn.execute("select 9::int").fetchone()[0])
"#;
    for impl_ in IMPLS {
        assert_eq!(
            psycopg(impl_, script),
            "0\n0\n1\n1\n2\n2\n7\n8\n9\n",
            "{impl_}"
        );
    }
}

#[test]
fn prepared_statements_survive_types_made_again() {
    // A statement prepared (and shared by Fulcrum across clients) before a
    // type it uses is dropped and created again is prepared afresh, as on a
    // direct connection: no "cache lookup failed" or "cached plan must not
    // change result type", for this client or the next ones.
    let script = r#"
with psycopg.connect(DSN, autocommit=True, prepare_threshold=0) as conn:
    for round in range(2):
        conn.execute("drop table if exists drv_t")
        conn.execute("drop type if exists drv_mood")
        conn.execute("create type drv_mood as enum ('a', 'b')")
        conn.execute("create table drv_t (id int, m drv_mood)")
        print(conn.execute("insert into drv_t values (%s, %s) returning m", (1, 'a')).fetchone()[0])
        print(conn.execute("select m from drv_t where id = %s", (1,)).fetchone()[0])
        conn.execute("drop table drv_t")
        conn.execute("drop type drv_mood")
        conn.execute("create type drv_mood as enum ('a', 'b', 'c')")
        conn.execute("create table drv_t (id int, m drv_mood, note text)")
        print(conn.execute("insert into drv_t values (%s, %s) returning m", (2, 'c')).fetchone()[0])
        print(conn.execute("select m from drv_t where id = %s", (2,)).fetchone()[0])
"#;
    // Twice per build: the second run meets the statements the first left
    // prepared on the pooled server connections.
    for impl_ in IMPLS.iter().chain(IMPLS.iter()) {
        assert_eq!(
            psycopg(impl_, script),
            "a\na\nc\nc\na\na\nc\nc\n",
            "{impl_}"
        );
    }
}

#[test]
fn notifications_carry_the_notifying_backends_pid() {
    // Transaction pooling: Fulcrum answers LISTEN and listens on the
    // primary itself; a notification carries the pid Fulcrum gave the
    // client that ran the NOTIFY, the one its pg_backend_pid() answers
    // (tests/postgres/pg_pids.rs).
    let script = r#"
with psycopg.connect(DSN, autocommit=True) as conn, psycopg.connect(DSN, autocommit=True) as other:
    conn.execute("listen drv_ch")
    with conn.transaction():
        mine = conn.execute("select pg_backend_pid()").fetchone()[0]
        conn.execute("notify drv_ch, 'mine'")
    with other.transaction():
        theirs = other.execute("select pg_backend_pid()").fetchone()[0]
        other.execute("notify drv_ch, 'theirs'")
    seen = []
    for n in conn.notifies(timeout=5, stop_after=2):
        seen.append((n.payload, n.pid == (mine if n.payload == 'mine' else theirs)))
    print(sorted(seen))
"#;
    for impl_ in IMPLS {
        assert_eq!(
            psycopg(impl_, script),
            "[('mine', True), ('theirs', True)]\n",
            "{impl_}"
        );
    }
}

/// Session pooling: the client's server connection is its own for the
/// session, so it is given that server's process id and cancel key: the
/// pid psycopg reports is `pg_backend_pid()`, `pg_terminate_backend` on it
/// ends this client, and a cancel with that key still goes through Fulcrum
/// (psycopg's own suite had 4 failures of this kind). Transaction pooling
/// keeps Fulcrum's own pid (the client has no server of its own), and
/// `pg_backend_pid()` answers it.
#[test]
fn session_pooling_gives_the_client_its_servers_pid() {
    let c = cluster();
    let cfg = PgProxyConfig::new(&c.primary().addr()).pool_mode("session");
    let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    let (host, port) = p.listen_addrs()[0]
        .rsplit_once(':')
        .map(|(h, p)| (h.to_owned(), p.to_owned()))
        .unwrap();
    let dsn = format!("host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10");
    let script = r#"
import threading
with psycopg.connect(DSN, autocommit=True) as conn:
    pid = conn.execute("select pg_backend_pid()").fetchone()[0]
    print("same pid", pid == conn.info.backend_pid)
    # Its own notifications carry the pid it was given (its server's).
    conn.execute("listen own_ch")
    conn.execute("notify own_ch, 'mine'")
    print("own notification", [n.pid == conn.info.backend_pid for n in conn.notifies(timeout=5, stop_after=1)])
    threading.Timer(0.5, conn.cancel).start()
    try:
        conn.execute("select pg_sleep(10)")
        print("not cancelled")
    except psycopg.errors.QueryCanceled:
        print("cancelled")
    print("after cancel", conn.execute("select 1").fetchone()[0])
    with psycopg.connect(DSN, autocommit=True) as other:
        print("terminated", other.execute("select pg_terminate_backend(%s)", (pid,)).fetchone()[0])
    try:
        conn.execute("select 1")
        print("still alive")
    except psycopg.OperationalError:
        print("ended")
"#;
    for impl_ in IMPLS {
        assert_eq!(
            psycopg_at(impl_, &dsn, script),
            "same pid True\nown notification [True]\ncancelled\nafter cancel 1\nterminated True\nended\n",
            "{impl_}\n{}",
            p.log_contents()
        );
    }
    // Transaction pooling: Fulcrum's own pid, read back by
    // pg_backend_pid() too (Fulcrum answers it: tests/postgres/pg_pids.rs),
    // and cancel still works.
    let script = r#"
import threading
with psycopg.connect(DSN, autocommit=True) as conn:
    pid = conn.execute("select pg_backend_pid()").fetchone()[0]
    print("same pid", pid == conn.info.backend_pid)
    threading.Timer(0.5, conn.cancel).start()
    try:
        conn.execute("select pg_sleep(10)")
        print("not cancelled")
    except psycopg.errors.QueryCanceled:
        print("cancelled")
"#;
    assert_eq!(psycopg("python", script), "same pid True\ncancelled\n");
}
