//! The first look at a client's Query frame, made once per frame: its
//! text's length (routing and handling read the text from there, no NUL
//! searched again), whether it may be a pid call, and whether its first
//! word is one of Fulcrum's own answers' words. Pure over the bytes.

use crate::codec::frontend_msg::{parse_msg, query_text};
use fulcrum_sql::statements::first_word;

/// What one look at a Query's body tells, before any of Fulcrum's own
/// answers reads its text: the text's length (found once for the whole
/// unit: routing and handling read it from here), whether it may be a call
/// of `signal.rs`, and whether it starts with a word another answer is for
/// (settings and causal tokens, DEALLOCATE, transaction control).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct QueryLook {
    pub(super) text: Option<usize>,
    pub(super) pid_call: bool,
    pub(super) local: bool,
}

pub(super) fn query_look(body: &[u8]) -> QueryLook {
    let Some(text) = query_text(body) else {
        return QueryLook::default();
    };
    let first = first_word(text);
    let pid_call = first.eq_ignore_ascii_case(b"select")
        && super::signal::select_list_opens_with_p(text, first);
    QueryLook {
        text: Some(text.len()),
        pid_call,
        local: answer_word(first),
    }
}

/// `first` is a statement's first word that one of Fulcrum's own answers
/// may be for (a short list, told apart by length first).
fn answer_word(first: &[u8]) -> bool {
    const WORDS: [&[u8]; 12] = [
        b"listen",
        b"unlisten",
        b"set",
        b"reset",
        b"show",
        b"deallocate",
        b"begin",
        b"start",
        b"commit",
        b"end",
        b"rollback",
        b"abort",
    ];
    if !(3..=10).contains(&first.len()) {
        return false;
    }
    WORDS
        .iter()
        .any(|w| w.len() == first.len() && first.eq_ignore_ascii_case(w))
}

/// The statement text of the Query or Parse at the front of `buf`.
pub(super) fn unit_text(buf: &[u8]) -> Option<&[u8]> {
    let body = buf.get(5..)?;
    match buf[0] {
        b'Q' => query_text(body),
        b'P' => parse_msg(body).map(|p| p.query),
        _ => None,
    }
}
