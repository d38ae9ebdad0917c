//! Character sets whose multibyte characters may end in a backslash (gbk,
//! sjis, big5, cp932, gb18030), on one shared server connection. In gbk
//! the bytes `\xe3\x81\x82\x5c` are two characters, so the quote after them
//! ends a literal that Fulcrum, reading `\'` as an escaped quote, takes to
//! go on: `SELECT 'x...\', @g := 42 -- '` sets a user variable Fulcrum
//! never sees. A reproduced leak: the next client, served while the first
//! was idle, read `@g`. Such a client is now pinned, whether the character
//! set came with its handshake or a `SET NAMES`. And a latin1 client's
//! `SELECT 'caf\xe9', @g := 42`, not UTF-8, is classified all the same (it
//! was routed as if empty, and leaked the same way).

use super::helpers::start_one_connection;

/// Client A sets `@g` behind what Fulcrum reads as a string and stays
/// connected; client B, same character set, asks for `@g` while A is idle
/// (`B 42` would be the leak; `B 1040` is the pool's one connection held
/// by pinned A); after A leaves, a client asks again.
const SCRIPT: &str = r#"
HIDDEN = bytes.fromhex(os.environ['HIDDEN'])
CHARSET = os.environ['CHARSET']
if os.environ['HOW'] == 'handshake':
    # The character set in the handshake only, as a C client sends it.
    pymysql.connections.Connection.set_character_set = lambda self, c, col=None: None
def client():
    if os.environ['HOW'] == 'handshake':
        return connect(charset=CHARSET, autocommit=True)
    c = connect(charset='utf8mb4', autocommit=True)
    c.cursor().execute("SET NAMES " + CHARSET)
    return c
def probe(c):
    cur = c.cursor()
    cur.execute("SELECT @g")
    return cur.fetchone()[0]
a = client()
cur = a.cursor()
cur.execute(HIDDEN)
print("A", cur.fetchone()[1])
try:
    print("B", probe(client()))
except pymysql.err.OperationalError as e:
    print("B", e.args[0])
print("A", probe(a))
a.close()
print("C", probe(client()))
"#;

/// In gbk, `\xe3\x81\x82\x5c` is two characters: the quote after them ends
/// the literal.
const GBK_HIDDEN: &[u8] = b"SELECT 'x\xe3\x81\x82\\', @g := 42 -- '";

fn hide_and_probe(how: &str, charset: &str, hidden: &[u8]) -> String {
    let (_p, port) = start_one_connection();
    let hex: String = hidden.iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "os.environ['HOW'] = '{how}'\nos.environ['CHARSET'] = '{charset}'\n\
         os.environ['HIDDEN'] = '{hex}'\n{SCRIPT}"
    );
    crate::my_drivers::pymysql(&format!("127.0.0.1:{port}"), &script)
}

#[test]
fn a_gbk_handshake_pins_its_client() {
    let out = hide_and_probe("handshake", "gbk", GBK_HIDDEN);
    assert_eq!(out, "A 42\nB 1040\nA 42\nC None\n");
}

#[test]
fn set_names_gbk_pins_its_client() {
    let out = hide_and_probe("set_names", "gbk", GBK_HIDDEN);
    assert_eq!(out, "A 42\nB 1040\nA 42\nC None\n");
}

#[test]
fn a_latin1_user_variable_pins_its_client() {
    let out = hide_and_probe("handshake", "latin1", b"SELECT 'caf\xe9', @g := 42");
    assert_eq!(out, "A 42\nB 1040\nA 42\nC None\n");
}
