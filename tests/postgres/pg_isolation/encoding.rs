//! Statements in a client encoding other than UTF-8, on one shared server
//! connection: a LATIN1 client's `set_config` whose text is not UTF-8 is
//! classified all the same (it pins), and a client whose encoding Fulcrum
//! cannot lex (SJIS: a character's second byte may be `\`) is pinned from
//! its first statement, so a statement hidden behind what Fulcrum reads as
//! a string literal reaches no other client. Both were reproduced leaks:
//! the second client, served while the first was idle, saw its setting.

use super::{cluster, start, CALL_TIMEOUT};
use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};

/// Client A runs `statement` (raw bytes, in `encoding`) and stays
/// connected; client B, same encoding, asks for setting `name` while A is
/// idle, then again after A has left. Prints A's status, what B got while
/// A was there (a value, or the SQLSTATE of its refusal), and what a client
/// gets after A left.
const SCRIPT: &str = r#"
import os, psycopg
DSN, ENC, NAME = os.environ['DSN'], os.environ['ENC'], os.environ['NAME']
STATEMENT = bytes.fromhex(os.environ['STATEMENT'])
def connect():
    return psycopg.connect(DSN, autocommit=True, options=f"-c client_encoding={ENC}")
probe = f"select coalesce(current_setting('{NAME}', true), '')"
a = connect()
r = a.pgconn.exec_(STATEMENT)
print(r.status == psycopg.pq.ExecStatus.TUPLES_OK)
try:
    b = connect()
    print(repr(b.execute(probe).fetchone()[0]))
    b.close()
except psycopg.Error as e:
    print(e.sqlstate)
print(a.execute(probe).fetchone()[0] != '')
a.close()
c = connect()
print(repr(c.execute(probe).fetchone()[0]))
"#;

fn leave_and_probe(encoding: &str, statement: &[u8], name: &str) -> String {
    // One server connection, and a short wait for it: a pinned A makes B's
    // login time out (53300) instead of reaching A's session.
    let (_p, cfg) = start(1, &["pool_timeout = \"2s\""]);
    let (host, port) = cfg.listen.rsplit_once(':').expect("host:port");
    let dsn = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10"
    );
    let hex: String = statement.iter().map(|b| format!("{b:02x}")).collect();
    fulcrum_suite::run_python(
        "psycopg",
        SCRIPT,
        &[
            ("DSN", &dsn),
            ("ENC", encoding),
            ("NAME", name),
            ("STATEMENT", &hex),
        ],
        CALL_TIMEOUT * 6,
    )
}

/// LATIN1: `'café'` is not UTF-8. The statement is a `set_config` all the
/// same: A keeps its connection, B is refused it, and the client after A
/// starts clean.
#[test]
fn a_latin1_set_config_pins_its_client() {
    let _ = cluster();
    let out = leave_and_probe(
        "LATIN1",
        b"SELECT set_config('app.iso_latin1', 'caf\xe9', false)",
        "app.iso_latin1",
    );
    assert_eq!(
        out, "True\n53300\nTrue\n''\n",
        "A ran it, B waited, A kept it"
    );
}

/// SJIS: `\xd0\x81\\` is, for the server, two characters (the second ends
/// in the byte `\`), so the `'` after it ends the literal and the
/// `set_config` runs; Fulcrum, reading UTF-8, sees `\'` inside one string
/// literal. A is pinned for its encoding before anything runs.
#[test]
fn a_statement_hidden_by_sjis_reaches_no_other_client() {
    let _ = cluster();
    let hidden: &[u8] = b"SELECT E'\xd0\x81\\', set_config(concat(chr(97), chr(46), chr(115)), current_user, false) --'";
    let out = leave_and_probe("SJIS", hidden, "a.s");
    assert_eq!(
        out, "True\n53300\nTrue\n''\n",
        "A ran it, B waited, A kept it"
    );
}
