//! The SQL dialects Fulcrum classifies, mapped to sqlparser's.

use sqlparser::dialect::{Dialect as SqlDialect, MySqlDialect, PostgreSqlDialect};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    Postgres,
    MySql,
}

impl Dialect {
    pub(crate) fn parser_dialect(&self) -> &'static dyn SqlDialect {
        match self {
            Dialect::Postgres => &PostgreSqlDialect {},
            Dialect::MySql => &MySqlDialect {},
        }
    }
}
