//! Session state a MySQL client left without a pin, found by probing a
//! real Fulcrum with one server connection: client A does something and
//! stays connected, client B asks while A is idle, A asks again. A quoted
//! user variable (`SELECT @`v` := 42`, which sqlparser reads as a
//! placeholder) and `SELECT LAST_INSERT_ID(42)` (which sets the value the
//! session's next `LAST_INSERT_ID()` returns) did not pin: A lost its
//! value (the connection was reset for B). Both now pin A: B waits for the
//! one connection (1040) and A keeps its value.

use super::helpers::start_one_connection;

const SCRIPT: &str = r#"
LEAVE, PROBE = os.environ['LEAVE'], os.environ['PROBE']
def client():
    return connect(autocommit=True)
def probe(c):
    cur = c.cursor()
    cur.execute(PROBE)
    return cur.fetchone()[0]
a = client()
a.cursor().execute(LEAVE)
try:
    print("B", probe(client()))
except pymysql.err.OperationalError as e:
    print("B", e.args[0])
print("A", probe(a))
a.close()
"#;

fn leave_and_probe(leave: &str, probe: &str) -> String {
    let (_p, port) = start_one_connection();
    let script =
        format!("os.environ['LEAVE'] = {leave:?}\nos.environ['PROBE'] = {probe:?}\n{SCRIPT}");
    crate::my_drivers::pymysql(&format!("127.0.0.1:{port}"), &script)
}

#[test]
fn a_backquoted_user_variable_pins_its_client() {
    let out = leave_and_probe("SELECT @`iso_bt` := 42", "SELECT @`iso_bt`");
    assert_eq!(out, "B 1040\nA 42\n");
}

#[test]
fn last_insert_id_with_an_argument_pins_its_client() {
    let out = leave_and_probe("SELECT LAST_INSERT_ID(42)", "SELECT LAST_INSERT_ID()");
    assert_eq!(out, "B 1040\nA 42\n");
}
