//! Routing hints written in comments: `/* fulcrum:primary */` and
//! `/* fulcrum:replica */`, anywhere in the statement.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    Primary,
    Replica,
}

/// The hint in `sql`, if any; `primary` wins when both appear.
pub fn hint(sql: &str) -> Option<Hint> {
    let at = sql.find("fulcrum:")?;
    let rest = &sql[at..];
    if rest.contains("fulcrum:primary") {
        Some(Hint::Primary)
    } else if rest.contains("fulcrum:replica") {
        Some(Hint::Replica)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hints_anywhere() {
        assert_eq!(hint("/* fulcrum:primary */ SELECT 1"), Some(Hint::Primary));
        assert_eq!(hint("SELECT 1 /* fulcrum:replica */"), Some(Hint::Replica));
        assert_eq!(
            hint("SELECT 1 -- fulcrum:replica fulcrum:primary"),
            Some(Hint::Primary)
        );
        assert_eq!(hint("SELECT 'fulcrum:' /* none */"), None);
        assert_eq!(hint("SELECT 1"), None);
    }
}
