//! Built-in functions and system variables that decide routing: ones that
//! write or depend on the primary or on session state (the statement goes to
//! the primary), and functions that take session-level locks (the client is
//! pinned).

use crate::dialect::Dialect;

/// Functions whose call sends a read to the primary.
pub(crate) fn primary_functions(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::Postgres => &[
            "nextval",
            "setval",
            "currval",
            "lastval",
            "pg_advisory_xact_lock",
            "pg_advisory_xact_lock_shared",
            "pg_try_advisory_xact_lock",
            "pg_try_advisory_xact_lock_shared",
            "txid_current",
            "pg_current_xact_id",
            "pg_current_wal_lsn",
            "pg_current_wal_insert_lsn",
            "pg_current_wal_flush_lsn",
            "set_config",
            "pg_notify",
            "pg_switch_wal",
            "pg_create_restore_point",
            "pg_terminate_backend",
            "pg_cancel_backend",
            "pg_reload_conf",
            "lo_create",
            "lo_import",
            "lo_unlink",
        ],
        Dialect::MySql => &[
            "last_insert_id",
            "found_rows",
            "row_count",
            "is_free_lock",
            "is_used_lock",
            "nextval",
            "lastval",
            "setval",
            "master_pos_wait",
            "master_gtid_wait",
        ],
    }
}

/// MySQL/MariaDB system variables that hold what this session last wrote
/// (`@@identity`, `@@session.last_insert_id`, MariaDB's `@@last_gtid`): only
/// the primary connection knows them, so reading one needs the primary.
pub(crate) const PRIMARY_VARIABLES: &[&str] = &["identity", "last_insert_id", "last_gtid"];

/// Functions that take or release session-level locks: the client is pinned.
pub(crate) fn pin_functions(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::Postgres => &[
            "pg_advisory_lock",
            "pg_advisory_lock_shared",
            "pg_try_advisory_lock",
            "pg_try_advisory_lock_shared",
            "pg_advisory_unlock",
            "pg_advisory_unlock_shared",
            "pg_advisory_unlock_all",
        ],
        Dialect::MySql => &["get_lock", "release_lock", "release_all_locks"],
    }
}
