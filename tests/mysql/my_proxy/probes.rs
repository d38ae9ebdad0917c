//! Session state a MySQL client left without a pin, found by probing a
//! real Fulcrum with one server connection: client A does something and
//! stays connected, client B asks while A is idle, A asks again. A quoted
//! user variable (`SELECT @`v` := 42`, which sqlparser reads as a
//! placeholder) and `SELECT LAST_INSERT_ID(42)` (which sets the value the
//! session's next `LAST_INSERT_ID()` returns) did not pin: A lost its
//! value (the connection was reset for B). Both now pin A: B waits for the
//! one connection (1040) and A keeps its value.

use fulcrum_testkit::{free_port, FulcrumProcess, APP_PASSWORD, APP_USER};

use super::helpers::cluster;

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
    // The primary alone, one server connection, a short wait for it.
    let port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n\n[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_user = \"root\"\nhealth_password = \"\"\n\
         client_auth = \"mysql_native_password\"\npool_size = 1\npool_timeout = \"2s\"\n\
         [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        cluster().primary().addr()
    );
    let _p = FulcrumProcess::start(&config).expect("fulcrum starts");
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
