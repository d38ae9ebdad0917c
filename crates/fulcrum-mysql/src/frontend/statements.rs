//! Prepared statements in transaction pooling, the pure part: the ids
//! Fulcrum gives clients, what it keeps of each statement (text, parameter
//! count, routing decision, the parameter types last bound), and
//! COM_STMT_EXECUTE's parameter-type block, which must be sent again when a
//! statement runs on a server connection that has not seen those types
//! (clients send types only on the first execute after binding).
//!
//! COM_STMT_EXECUTE: 0x17, statement id (4), flags (1), iteration count (4),
//! then with parameters: NULL bitmap ((n + 7) / 8), new-params-bound flag (1),
//! types (2 × n) if the flag is 1, values.

use std::sync::Arc;

use fulcrum_sql::Decision;

/// A client's prepared statement.
#[derive(Debug, Clone)]
pub struct ClientStmt {
    pub sql: Arc<str>,
    pub num_params: u16,
    pub decision: Decision,
    /// Its text may commit (read once, at prepare): an execute of it in
    /// flight when the server dies is never replayed.
    pub may_commit: bool,
    /// The parameter types the client bound last (2 bytes each); shared,
    /// so an execute's look at them copies no bytes.
    pub types: Option<Arc<[u8]>>,
    /// Its digest (statistics), when digests are on.
    pub digest: Option<Arc<fulcrum_metrics::Digest>>,
}

/// Offset of the NULL bitmap in a COM_STMT_EXECUTE payload.
const PARAMS_AT: usize = 10;

/// The cursor flags byte of a COM_STMT_EXECUTE (0: no cursor).
pub fn execute_flags(payload: &[u8]) -> Option<u8> {
    payload.get(5).copied()
}

/// The types block of a COM_STMT_EXECUTE, if this execute carries one.
/// `None` for a malformed packet or one without types.
pub fn execute_types(payload: &[u8], num_params: u16) -> Option<&[u8]> {
    if num_params == 0 {
        return None;
    }
    let n = usize::from(num_params);
    let flag_at = PARAMS_AT + n.div_ceil(8);
    if *payload.get(flag_at)? != 1 {
        return None;
    }
    payload.get(flag_at + 1..flag_at + 1 + 2 * n)
}

/// The execute with `types` bound (flag set and types inserted) when it
/// carries none; `None` when it already carries them or is malformed.
pub fn with_types(payload: &[u8], num_params: u16, types: &[u8]) -> Option<Vec<u8>> {
    let n = usize::from(num_params);
    if n == 0 || types.len() != 2 * n {
        return None;
    }
    let flag_at = PARAMS_AT + n.div_ceil(8);
    if *payload.get(flag_at)? != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(payload.len() + types.len());
    out.extend_from_slice(&payload[..flag_at]);
    out.push(1);
    out.extend_from_slice(types);
    out.extend_from_slice(&payload[flag_at + 1..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An execute of statement 7 with 2 parameters, types optional.
    fn execute(types: Option<&[u8]>, values: &[u8]) -> Vec<u8> {
        let mut p = vec![0x17, 7, 0, 0, 0, 0, 1, 0, 0, 0];
        p.push(0); // NULL bitmap for 2 params
        match types {
            Some(t) => {
                p.push(1);
                p.extend_from_slice(t);
            }
            None => p.push(0),
        }
        p.extend_from_slice(values);
        p
    }

    const TYPES: [u8; 4] = [8, 0, 253, 0]; // LONGLONG, VAR_STRING
    const VALUES: [u8; 10] = [5, 0, 0, 0, 0, 0, 0, 0, 1, b'x'];

    #[test]
    fn types_are_read_when_bound() {
        assert_eq!(
            execute_types(&execute(Some(&TYPES), &VALUES), 2),
            Some(&TYPES[..])
        );
        assert_eq!(execute_types(&execute(None, &VALUES), 2), None);
        assert_eq!(execute_types(&[0x17, 7, 0, 0, 0, 0, 1, 0, 0, 0], 0), None);
        assert_eq!(execute_types(&[0x17, 7], 2), None, "truncated");
    }

    #[test]
    fn types_are_inserted_into_an_execute_without_them() {
        let bare = execute(None, &VALUES);
        assert_eq!(
            with_types(&bare, 2, &TYPES),
            Some(execute(Some(&TYPES), &VALUES))
        );
        assert_eq!(
            with_types(&execute(Some(&TYPES), &VALUES), 2, &TYPES),
            None,
            "already bound"
        );
        assert_eq!(with_types(&bare, 2, &TYPES[..2]), None, "wrong length");
        assert_eq!(with_types(&[0x17], 2, &TYPES), None, "truncated");
    }
}
