//! Finds the dotted key path (`cluster[0].backend[1].role`) of the key or value at a byte
//! span. serde errors from the toml crate carry a span but no public key path.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// The key path whose key or value span is exactly `span` (else contains it), deepest first.
///
/// Table spans cover only their `[header]`, not their contents, so the whole tree is
/// searched rather than pruned by containment. Exact matches win because a header such as
/// `[cluster.a.b]` contains the spans of both `a` and `b`, and an error about `a` points at `a`.
pub(crate) fn key_path_at(text: &str, span: Range<usize>) -> Option<String> {
    let doc = DeTable::parse(text).ok()?;
    let mut best = None;
    walk_table(doc.get_ref(), "", 0, &span, &mut best);
    best.map(|(_, path)| path)
}

/// Rank (exact match, depth) and path of the best match so far.
type Best = Option<((bool, usize), String)>;

fn walk_table(
    table: &DeTable<'_>,
    prefix: &str,
    depth: usize,
    span: &Range<usize>,
    best: &mut Best,
) {
    for (key, value) in table.iter() {
        let name = render_key(key.get_ref());
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}.{name}")
        };
        consider(&key.span(), span, depth + 1, &path, best);
        walk_value(value, &path, depth + 1, span, best);
    }
}

fn walk_value(
    value: &Spanned<DeValue<'_>>,
    path: &str,
    depth: usize,
    span: &Range<usize>,
    best: &mut Best,
) {
    consider(&value.span(), span, depth, path, best);
    match value.get_ref() {
        DeValue::Table(table) => walk_table(table, path, depth, span, best),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk_value(item, &format!("{path}[{i}]"), depth + 1, span, best);
            }
        }
        _ => {}
    }
}

fn consider(
    candidate: &Range<usize>,
    span: &Range<usize>,
    depth: usize,
    path: &str,
    best: &mut Best,
) {
    if !(candidate.start <= span.start && span.end <= candidate.end) {
        return;
    }
    let rank = (candidate == span, depth);
    match best {
        Some((r, _)) if *r >= rank => {}
        _ => *best = Some((rank, path.to_string())),
    }
}

/// Bare keys as written; anything else quoted, as TOML would need it.
fn render_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_of(text: &str, needle: &str) -> Option<String> {
        let start = text.find(needle).expect("needle in text");
        key_path_at(text, start..start + needle.len())
    }

    #[test]
    fn finds_keys_values_and_array_elements() {
        let text = "[fulcrum]\nlog = \"info\"\n\n[[cluster]]\nname = \"a\"\n\n[[cluster]]\nname = \"b\"\n\n[[cluster.backend]]\nadress = 1\n";
        assert_eq!(path_of(text, "\"info\"").as_deref(), Some("fulcrum.log"));
        assert_eq!(path_of(text, "\"b\"").as_deref(), Some("cluster[1].name"));
        assert_eq!(
            path_of(text, "adress").as_deref(),
            Some("cluster[1].backend[0].adress")
        );
        assert_eq!(
            path_of(text, "[[cluster.backend]]").as_deref(),
            Some("cluster[1].backend[0]")
        );
    }

    #[test]
    fn prefers_the_key_named_by_the_span_over_deeper_headers() {
        let text = "[[cluster]]\n[cluster.a.b]\n";
        assert_eq!(path_of(text, "a").as_deref(), Some("cluster[0].a"));
        assert_eq!(path_of(text, "b").as_deref(), Some("cluster[0].a.b"));
    }

    #[test]
    fn finds_inline_tables_and_quotes_odd_keys() {
        let text = "[[cluster]]\nbackend = [{ address = \"x\" }, { \"we ight\" = 1 }]\n";
        assert_eq!(
            path_of(text, "\"we ight\"").as_deref(),
            Some("cluster[0].backend[1].\"we ight\"")
        );
    }
}
