//! `LISTEN` and `UNLISTEN` as PostgreSQL reads them: the channel a single
//! statement names, folded as the server folds identifiers (unquoted:
//! lower case; quoted: as written; both cut to 63 bytes), so Fulcrum's
//! subscriptions match the channel names in the server's notifications.

use sqlparser::ast::Statement;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// PostgreSQL's identifier limit (NAMEDATALEN - 1).
const NAME_MAX: usize = 63;

/// A single LISTEN or UNLISTEN statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenStatement {
    Listen(String),
    Unlisten(String),
    /// `UNLISTEN *`.
    UnlistenAll,
}

impl ListenStatement {
    /// The command tag the server answers it with.
    pub fn tag(&self) -> &'static str {
        match self {
            ListenStatement::Listen(_) => "LISTEN",
            _ => "UNLISTEN",
        }
    }
}

/// `text` as one LISTEN/UNLISTEN statement, or `None` (another statement,
/// several statements, or text the parser refuses).
pub fn listen_statement(text: &str) -> Option<ListenStatement> {
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, text).ok()?;
    if statements.len() != 1 {
        return None;
    }
    match statements.pop()? {
        Statement::LISTEN { channel } => Some(ListenStatement::Listen(fold(
            &channel.value,
            channel.quote_style,
        ))),
        Statement::UNLISTEN { channel }
            if channel.quote_style.is_none() && channel.value == "*" =>
        {
            Some(ListenStatement::UnlistenAll)
        }
        Statement::UNLISTEN { channel } => Some(ListenStatement::Unlisten(fold(
            &channel.value,
            channel.quote_style,
        ))),
        _ => None,
    }
}

/// An identifier as the server stores it.
pub(crate) fn fold(value: &str, quote: Option<char>) -> String {
    let mut name = if quote.is_some() {
        value.to_owned()
    } else {
        value.to_ascii_lowercase()
    };
    if name.len() > NAME_MAX {
        let mut end = NAME_MAX;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// `LISTEN` for `channel`, quoted so the server keeps it as it is.
pub fn quoted_listen(verb: &str, channel: &str) -> String {
    format!("{verb} \"{}\"", channel.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_fold_as_the_server_folds_them() {
        assert_eq!(
            listen_statement("LISTEN Orders"),
            Some(ListenStatement::Listen("orders".into()))
        );
        assert_eq!(
            listen_statement("listen \"Orders\";"),
            Some(ListenStatement::Listen("Orders".into()))
        );
        assert_eq!(
            listen_statement("UNLISTEN \"a\"\"b\""),
            Some(ListenStatement::Unlisten("a\"b".into()))
        );
        assert_eq!(
            listen_statement("UNLISTEN *"),
            Some(ListenStatement::UnlistenAll)
        );
        assert_eq!(
            listen_statement("UNLISTEN \"*\""),
            Some(ListenStatement::Unlisten("*".into())),
            "a quoted star is a channel"
        );
        let long = "c".repeat(70);
        assert_eq!(
            listen_statement(&format!("LISTEN {long}")),
            Some(ListenStatement::Listen("c".repeat(63)))
        );
    }

    #[test]
    fn other_text_is_not_a_listen() {
        assert_eq!(listen_statement("LISTEN a; LISTEN b"), None);
        assert_eq!(listen_statement("SELECT 1"), None);
        assert_eq!(listen_statement("LISTEN"), None);
        assert_eq!(listen_statement("NOTIFY a"), None);
    }

    #[test]
    fn a_channel_is_quoted_back_safely() {
        assert_eq!(quoted_listen("LISTEN", "a\"b"), "LISTEN \"a\"\"b\"");
        assert_eq!(quoted_listen("UNLISTEN", "Orders"), "UNLISTEN \"Orders\"");
    }
}
