//! PgBouncer's `[users]` section: each user's `pool_mode`, `pool_size` and
//! `max_user_connections`, as lines for that user's `[[cluster.user]]`;
//! what cannot be carried over is a note.

use std::collections::BTreeMap;

use super::ini::{conn_params, Ini};

/// The `[[cluster.user]]` lines of each user in `[users]` (by name), and a
/// note for each setting left out.
pub(super) fn user_pools(ini: &Ini, notes: &mut Vec<String>) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (user, value) in ini.section("users") {
        let mut lines = Vec::new();
        for (k, v) in conn_params(value) {
            match k.as_str() {
                "pool_mode" => match v.as_str() {
                    "session" | "transaction" | "statement" => {
                        lines.push(format!("pool_mode = \"{v}\""));
                    }
                    other => notes.push(format!(
                        "[users] {user}: pool_mode={other} is not a PgBouncer pool mode; left out"
                    )),
                },
                "pool_size" => match v.parse::<u32>() {
                    Ok(n) if n > 0 => lines.push(format!("pool_size = {n}")),
                    // PgBouncer's 0: the database's size.
                    Ok(_) => {}
                    Err(_) => notes.push(format!(
                        "[users] {user}: pool_size={v} is not a number; left out"
                    )),
                },
                "max_user_connections" => match v.parse::<u32>() {
                    Ok(n) if n > 0 => lines.push(format!("max_user_connections = {n}")),
                    // PgBouncer's 0: the global max_user_connections.
                    Ok(_) => {}
                    Err(_) => notes.push(format!(
                        "[users] {user}: max_user_connections={v} is not a number; left out"
                    )),
                },
                other => notes.push(format!(
                    "[users] {user}: {other}={v} not carried over (Fulcrum's per-user keys are pool_mode, pool_size and max_user_connections)"
                )),
            }
        }
        if !lines.is_empty() {
            out.insert(user.clone(), lines);
        }
    }
    out
}

/// A note for each `[users]` entry with settings whose user is not a
/// `[[cluster.user]]` (not in the auth file, or a hash `client_auth`
/// cannot check).
pub(super) fn unplaced(left: BTreeMap<String, Vec<String>>, notes: &mut Vec<String>) {
    for (user, lines) in left {
        notes.push(format!(
            "[users] {user}: not a [[cluster.user]] (not in the auth file, or its hash cannot be checked), so its {} could not be carried over; add the user, or use [[cluster.user_default]] for every auth_query user",
            lines
                .iter()
                .map(|l| l.replace(" = ", "=").replace('"', ""))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
}
