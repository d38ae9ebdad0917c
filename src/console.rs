//! What the tests read from Fulcrum's admin console besides logging in
//! ([`crate::console_connect`]): mirroring's diff as `SHOW MIRROR` lists it,
//! and the clients a binary upgrade moved as `SHOW UPGRADE` counts them.

use tokio_postgres::SimpleQueryMessage;

use crate::connect::console_connect;

/// One row of `SHOW MIRROR`: the digest's query text, and its units sent,
/// dropped and differing.
pub type MirrorRow = (String, u64, u64, u64);

/// `SHOW MIRROR` on the console at `admin_port`, every target's rows.
pub async fn show_mirror(admin_port: u16) -> Vec<MirrorRow> {
    let field = |r: &tokio_postgres::SimpleQueryRow, name: &str| -> u64 {
        r.get(name).and_then(|v| v.parse().ok()).unwrap_or_default()
    };
    console_connect(admin_port)
        .await
        .simple_query("SHOW MIRROR")
        .await
        .expect("SHOW MIRROR")
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some((
                r.get("query").unwrap_or_default().to_owned(),
                field(r, "sent"),
                field(r, "dropped"),
                field(r, "differing"),
            )),
            _ => None,
        })
        .collect()
}

/// SHOW UPGRADE's `clients` row on the console (its detail), once it
/// counts `want`; the last seen after 10 s.
pub async fn upgrade_clients_row(admin_port: u16, want: &str) -> String {
    let console = console_connect(admin_port).await;
    let mut detail = String::new();
    for _ in 0..200 {
        let rows = console.simple_query("SHOW UPGRADE").await.unwrap();
        detail = rows
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) if r.get(0) == Some("clients") => {
                    r.get(5).map(str::to_string)
                }
                _ => None,
            })
            .collect();
        if detail == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    detail
}
