//! Every key a table accepts is in docs/configuration.md: the keys are
//! read from the parser itself (its "expected one of" list for a key no
//! table has), so a key added without its documentation fails here.

use super::error_of;

/// The keys accepted by the table `text` puts an unknown key in.
fn keys_of(text: &str) -> Vec<String> {
    let message = error_of(text);
    // "expected one of `a`, `b`, `c`", or for two "expected `a` or `b`".
    let list = message
        .split_once("expected one of ")
        .or_else(|| message.split_once("expected "))
        .unwrap_or_else(|| panic!("no key list in: {message}"))
        .1;
    list.split([',', ' '])
        .filter(|k| k.starts_with('`'))
        .map(|k| k.trim_matches('`').to_owned())
        .collect()
}

#[test]
fn every_key_is_documented() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/configuration.md"
    ))
    .expect("docs/configuration.md");
    // A name no table takes, and nowhere near one (no "did you mean").
    let unknown = "zzzzzzzzzzzzzzzzzzzz = 1";
    let tables = [
        format!("[fulcrum]\n{unknown}\n"),
        format!("[[cluster]]\n{unknown}\n"),
        format!("[[cluster]]\n[[cluster.backend]]\n{unknown}\n"),
        format!("[[cluster]]\n[[cluster.user]]\n{unknown}\n"),
        format!("[[cluster]]\n[[cluster.user_default]]\n{unknown}\n"),
        format!("[[cluster]]\n[[cluster.database]]\n{unknown}\n"),
        format!("[[cluster]]\n[[cluster.mirror]]\n{unknown}\n"),
        format!("[[cluster]]\n[cluster.cache]\n{unknown}\n"),
        format!("[[cluster]]\n[[cluster.cache.rule]]\n{unknown}\n"),
        format!("[fulcrum]\n[[fulcrum.admin_user]]\n{unknown}\n"),
    ];
    let mut missing = Vec::new();
    for text in &tables {
        for key in keys_of(text) {
            // A table is documented under its header, `[[cluster.backend]]`
            // or `[cluster.cache]`.
            if !docs.contains(&format!("`{key}`")) && !docs.contains(&format!(".{key}]")) {
                missing.push(key);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys not in docs/configuration.md: {missing:?}"
    );
}
