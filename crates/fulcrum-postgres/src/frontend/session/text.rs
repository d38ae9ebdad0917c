//! Small pure helpers over statement text and frames that the session
//! reads: whether a unit executes, may commit, is DDL, whether an error
//! makes a shared statement stale, and the notification pid rewrite.

use super::*;

pub(super) use fulcrum_session::txn::may_commit;

/// Whether the unit at the front of `buf` runs anything (a simple Query,
/// an Execute or a function call before its Sync): a unit that only
/// prepares or describes statements writes nothing.
pub(super) fn unit_executes(buf: &[u8], max: u64) -> bool {
    let mut at = 0;
    while let Ok(Some(h)) = check_frame(&buf[at..], max) {
        match h.tag {
            b'Q' | b'E' | b'F' => return true,
            b'S' => return false,
            _ => {}
        }
        at += h.total;
        if at >= buf.len() {
            break;
        }
    }
    // The rest has not arrived yet: it may execute.
    true
}

/// A NotificationResponse from the client's own server connection carries
/// that backend's pid; the client knows Fulcrum's (BackendKeyData), so it
/// is given that one (clients skip their own notifications by pid).
pub(super) fn own_notification_pid(frame: &mut [u8], server_pid: i32, client_pid: i32) {
    if frame.len() >= 9 && frame[5..9] == server_pid.to_be_bytes() {
        frame[5..9].copy_from_slice(&client_pid.to_be_bytes());
    }
}

/// A CommandComplete tag of DDL (`CREATE TYPE`, `DROP TABLE`, `ALTER ...`).
pub(super) fn is_ddl_tag(tag: &[u8]) -> bool {
    tag.starts_with(b"CREATE ") || tag.starts_with(b"DROP ") || tag.starts_with(b"ALTER ")
}

/// Errors after which a shared server-side statement is not used again:
/// its cached plan cannot change result type (0A000), a type or object it
/// was prepared with is gone (XX000 "cache lookup failed", 42704), or the
/// server does not have it (26000).
pub(super) fn statement_went_stale(code: &str) -> bool {
    matches!(code, "0A000" | "XX000" | "42704" | "26000")
}

/// The session effects of a simple Query whose first word is DEALLOCATE.
pub(super) fn deallocate_ops(ctx: &ClusterContext, body: &[u8]) -> Option<Effects> {
    let text = query_text(body)?;
    if !first_word(text).eq_ignore_ascii_case(b"deallocate") {
        return None;
    }
    Some(ctx.classify_unit(std::str::from_utf8(text).ok()?).effects)
}

/// Reads under `session` and `strong` respect a position.
pub(super) fn route_is_causal(c: fulcrum_config::Consistency) -> bool {
    c != fulcrum_config::Consistency::Eventual
}

#[cfg(test)]
mod tests {
    use super::own_notification_pid;

    #[test]
    fn own_notifications_carry_the_pid_the_client_knows() {
        // NotificationResponse: 'A', length, pid, channel, payload.
        let mut frame = b"A\0\0\0\x0f\0\0\x01\x02ch\0p\0".to_vec();
        own_notification_pid(&mut frame, 0x0102, 77);
        assert_eq!(&frame[5..9], &77i32.to_be_bytes());
        let mut other = b"A\0\0\0\x0f\0\0\x09\x09ch\0p\0".to_vec();
        own_notification_pid(&mut other, 0x0102, 77);
        assert_eq!(
            &other[5..9],
            &0x0909i32.to_be_bytes(),
            "another backend's pid stays"
        );
    }
}

#[cfg(test)]
mod unit_executes_tests {
    use super::unit_executes;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![tag];
        f.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn a_prepare_only_unit_executes_nothing() {
        let unit = [
            frame(b'P', b"s0\0SELECT $1::int\0\0\0"),
            frame(b'D', b"Ss0\0"),
            frame(b'S', b""),
            frame(b'Q', b"INSERT INTO t VALUES (1)\0"),
        ]
        .concat();
        assert!(!unit_executes(&unit, 1 << 20), "stops at the first Sync");
        let exec = [
            frame(b'B', b"\0s0\0\0\0\0\0\0\0"),
            frame(b'E', b"\0\0\0\0\0"),
            frame(b'S', b""),
        ]
        .concat();
        assert!(unit_executes(&exec, 1 << 20));
        assert!(unit_executes(&frame(b'Q', b"SELECT 1\0"), 1 << 20));
        assert!(
            unit_executes(&frame(b'P', b"s0\0SELECT 1\0\0\0"), 1 << 20),
            "incomplete: may execute"
        );
    }
}

/// A statement so decided may write (and so get a transaction id).
pub(super) fn may_write(decision: Decision) -> bool {
    // A pinned unit (a DO block, a user function) may write too.
    matches!(
        decision,
        Decision::Write | Decision::Primary | Decision::Unknown | Decision::Pin(_)
    )
}
