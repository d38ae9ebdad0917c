//! Statement classification: given statement text and a dialect, decide what
//! it is (read, read that must see the primary, write, transaction control,
//! session state, or unknown) so the router can pick a backend, and in the
//! same pass what each statement does to the session (`Effects`: settings to
//! replay, pins, DEALLOCATE, transaction control). Pure: no I/O,
//! no tokio, no sockets. `sqlparser` is the authority; decisions are cached by
//! a literal-normalised fingerprint, so a repeated statement is parsed once.
//! When in doubt the answer is the primary: a wrong "read" is a correctness
//! bug, a wrong "write" only costs scale. The same pass tells the result
//! cache which tables a read may be kept for and what a write may change
//! (`CacheFacts`; a read not surely repeatable is never kept, a write the
//! AST cannot place changes everything).

#![forbid(unsafe_code)]

mod cache;
mod cache_facts;
mod calls;
mod classifier;
pub mod consistency;
mod decision;
mod dialect;
mod effects;
pub mod encoding;
mod fingerprint;
mod functions;
mod hints;
mod identity;
mod lex;
pub mod listen;
mod mysql;
mod rules;
mod session_facts;
mod set_config;
pub mod statements;
mod temp_schema;

pub use cache_facts::{CacheFacts, Writes};
pub use classifier::{Classified, Classifier, ClassifierConfig, ClassifierStats};
pub use decision::{Decision, PinReason};
pub use dialect::Dialect;
pub use effects::{Effect, Effects};
pub use fingerprint::{
    block_comment_end, fingerprint, normalize, scan, scan_bytes, stable_id, Scan,
};
pub use hints::{no_cache, Hint};
pub use identity::{select_connection_id, with_connection_id, Identity};
pub use set_config::set_config_statement;
