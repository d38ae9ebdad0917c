//! What a statement is, for routing purposes, and how the decisions of several
//! statements sent together combine (the strictest wins).

/// Why a statement pins its client to one server connection.
pub type PinReason = &'static str;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// A plain read: a replica may serve it.
    Read,
    /// A read that must run on the primary (locking read, a function that
    /// writes or depends on primary or session state, a hint).
    Primary,
    /// Changes data or schema.
    Write,
    /// Opens a transaction; `read_only` ones may run on a replica.
    Begin { read_only: bool },
    /// Ends a transaction (COMMIT, ROLLBACK, END, ABORT).
    End,
    /// Other transaction control (SAVEPOINT, RELEASE, SET TRANSACTION,
    /// PostgreSQL SET LOCAL).
    Txn,
    /// `SET TRANSACTION READ ONLY`.
    TxnReadOnly,
    /// A session setting replayed on every server connection the client uses.
    Set,
    /// Session state that cannot be replayed: keep the client on its connection.
    Pin(PinReason),
    /// sqlparser cannot parse it: treated as a write.
    Unknown,
}

impl Decision {
    /// The corpus label (tests/corpus/README.md).
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Read => "read",
            Decision::Primary => "primary",
            Decision::Write => "write",
            Decision::Begin { read_only: false } => "begin",
            Decision::Begin { read_only: true } => "begin_ro",
            Decision::End => "commit",
            Decision::Txn => "txn",
            Decision::TxnReadOnly => "txn_ro",
            Decision::Set => "set",
            Decision::Pin(_) => "pin",
            Decision::Unknown => "unknown",
        }
    }

    /// True when the statement must run on the primary outside a transaction.
    pub fn needs_primary(&self) -> bool {
        !matches!(
            self,
            Decision::Read | Decision::Begin { read_only: true } | Decision::TxnReadOnly
        )
    }

    fn rank(&self) -> u8 {
        match self {
            Decision::Read => 0,
            Decision::Set => 1,
            Decision::TxnReadOnly | Decision::Txn | Decision::End => 2,
            Decision::Begin { read_only: true } => 3,
            Decision::Begin { read_only: false } => 4,
            Decision::Primary => 5,
            Decision::Write => 6,
            // A pin also means the primary, and must never be lost in a mix.
            Decision::Pin(_) => 7,
            Decision::Unknown => 8,
        }
    }

    /// The decision for two statements sent together: the strictest, except
    /// that a transaction opened with other statements keeps its `Begin`
    /// unless something in it writes.
    pub fn combine(self, other: Decision) -> Decision {
        match (self, other) {
            (Decision::Begin { read_only: a }, Decision::Begin { read_only: b }) => {
                Decision::Begin { read_only: a && b }
            }
            (
                b @ Decision::Begin { read_only: true },
                Decision::Read
                | Decision::End
                | Decision::Txn
                | Decision::TxnReadOnly
                | Decision::Set,
            )
            | (
                Decision::Read
                | Decision::End
                | Decision::Txn
                | Decision::TxnReadOnly
                | Decision::Set,
                b @ Decision::Begin { read_only: true },
            ) => b,
            (Decision::Begin { read_only: true }, Decision::Primary)
            | (Decision::Primary, Decision::Begin { read_only: true }) => {
                Decision::Begin { read_only: false }
            }
            // BEGIN; SET TRANSACTION READ ONLY
            (Decision::Begin { read_only: false }, Decision::TxnReadOnly) => {
                Decision::Begin { read_only: true }
            }
            (a, b) => {
                if a.rank() >= b.rank() {
                    a
                } else {
                    b
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictest_wins() {
        assert_eq!(Decision::Read.combine(Decision::Write), Decision::Write);
        assert_eq!(Decision::Read.combine(Decision::Read), Decision::Read);
        assert_eq!(Decision::Primary.combine(Decision::Read), Decision::Primary);
        assert_eq!(
            Decision::Pin("x").combine(Decision::Read),
            Decision::Pin("x")
        );
        assert_eq!(
            Decision::Unknown.combine(Decision::Write),
            Decision::Unknown
        );
    }

    #[test]
    fn transactions_keep_their_begin() {
        let ro = Decision::Begin { read_only: true };
        let rw = Decision::Begin { read_only: false };
        assert_eq!(ro.combine(Decision::Read), ro);
        assert_eq!(rw.combine(Decision::Read), rw);
        assert_eq!(ro.combine(Decision::Primary), rw);
        assert_eq!(ro.combine(Decision::Write), Decision::Write);
        assert_eq!(rw.combine(Decision::End), rw);
    }

    #[test]
    fn only_reads_and_read_only_transactions_may_leave_the_primary() {
        assert!(!Decision::Read.needs_primary());
        assert!(!Decision::Begin { read_only: true }.needs_primary());
        assert!(Decision::Set.needs_primary());
        assert!(Decision::Unknown.needs_primary());
        assert!(Decision::Primary.needs_primary());
    }
}
