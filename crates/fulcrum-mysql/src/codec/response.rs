//! Server responses Fulcrum reads to track state, or writes in a server's
//! place: what kind the first packet of a response is, OK (including its
//! session-state changes, where GTIDs arrive), EOF in both forms, and the
//! server status flags (autocommit, in-transaction, more results) from either.
//! Hand-written: OK is read after every statement, so this borrows from the
//! packet and allocates nothing unless session state is asked for; mysql_common
//! has no OK builder, leaves the GTID tracker's layout undecoded, and rejects
//! a whole session state for one tracker type it does not know.
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_basic_ok_packet.html>.

use mysql_common::constants::{CapabilityFlags as C, SessionStateType as T, StatusFlags};

use super::packet::MAX_PAYLOAD;
use super::wire::{write_lenenc_int, write_lenenc_str, DecodeError, Reader};

pub const OK: u8 = 0x00;
pub const EOF: u8 = 0xFE;
pub const ERR: u8 = 0xFF;
pub const LOCAL_INFILE: u8 = 0xFB;

/// What the first packet of a command's response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind {
    Ok,
    Err,
    /// Old-style EOF, or the OK-as-EOF (0xFE) form under `DEPRECATE_EOF`.
    Eof,
    /// `LOAD DATA LOCAL INFILE`: the server asks the client for a file.
    LocalInfile,
    /// A result set with this many columns follows.
    ResultSet {
        columns: u64,
    },
}

/// Classifies the first packet of a response by its first byte (a column
/// count can never start with 0xFE, 0xFB or 0xFF, so the byte is enough).
/// COM_CHANGE_USER is answered by an auth exchange instead, where 0xFE is an
/// AuthSwitchRequest: see `auth_packets::classify_auth_reply`.
pub fn classify(payload: &[u8]) -> Result<ResponseKind, DecodeError> {
    match payload.first() {
        None => Err(DecodeError::Truncated("response header")),
        Some(&OK) => Ok(ResponseKind::Ok),
        Some(&ERR) => Ok(ResponseKind::Err),
        Some(&EOF) => Ok(ResponseKind::Eof),
        Some(&LOCAL_INFILE) => Ok(ResponseKind::LocalInfile),
        Some(_) => Reader::new(payload)
            .lenenc_u64("column count")
            .map(|columns| ResponseKind::ResultSet { columns }),
    }
}

/// Whether a packet read among a result set's rows ends it (EOF, or OK-as-EOF).
/// A row may start with 0xFE too (a value of 16 MiB or more), but then its
/// first packet is full, which a terminator never is.
pub fn is_result_set_end(payload: &[u8], caps: C) -> bool {
    let limit = match caps.contains(C::CLIENT_DEPRECATE_EOF) {
        true => MAX_PAYLOAD,
        false => 9,
    };
    payload.first() == Some(&EOF) && payload.len() < limit
}

/// The server status flags of an OK, OK-as-EOF or old-style EOF packet;
/// `None` for anything else or a malformed one. Call it where 0x00 and 0xFE
/// mean OK and EOF: on a response's first packet or a result set's end (a row
/// may start with 0x00 too). An old EOF is exactly 5 bytes
/// (0xFE, warnings, status); an OK-as-EOF is at least 7.
pub fn status_flags(payload: &[u8]) -> Option<StatusFlags> {
    let at = status_offset(payload)?;
    let bytes = payload.get(at..at + 2)?;
    Some(StatusFlags::from_bits_retain(u16::from_le_bytes([
        bytes[0], bytes[1],
    ])))
}

/// Where the status flags of an OK, OK-as-EOF or old-style EOF packet
/// start in its payload (as [`status_flags`] reads them).
fn status_offset(payload: &[u8]) -> Option<usize> {
    let mut r = Reader::new(payload);
    match r.u8("header").ok()? {
        EOF if payload.len() == 5 => Some(3),
        OK | EOF => {
            r.lenenc_u64("affected rows").ok()?;
            r.lenenc_u64("last insert id").ok()?;
            let at = payload.len() - r.rest().len();
            (payload.len() >= at + 2).then_some(at)
        }
        _ => None,
    }
}

/// Rewrites in place the status flags of an OK, OK-as-EOF or old-style
/// EOF packet's `payload` to `f` of them (the result cache gives a stored
/// answer the transaction status of the client it answers); false, with
/// nothing changed, when `payload` is none of those.
pub fn set_status_flags(payload: &mut [u8], f: impl FnOnce(StatusFlags) -> StatusFlags) -> bool {
    let Some(old) = status_flags(payload) else {
        return false;
    };
    let Some(at) = status_offset(payload) else {
        return false;
    };
    payload[at..at + 2].copy_from_slice(&f(old).bits().to_le_bytes());
    true
}

/// An OK packet, borrowing its strings from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OkPacket<'a> {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: StatusFlags,
    pub warnings: u16,
    pub info: &'a [u8],
    /// Encoded session-state changes; see [`parse_session_state`].
    pub session_state: &'a [u8],
}

impl Default for OkPacket<'_> {
    fn default() -> Self {
        OkPacket {
            affected_rows: 0,
            last_insert_id: 0,
            status: StatusFlags::empty(),
            warnings: 0,
            info: b"",
            session_state: b"",
        }
    }
}

/// Parses an OK (0x00) or OK-as-EOF (0xFE) packet. `caps` are the connection's
/// negotiated flags: with `SESSION_TRACK` the info string is followed by the
/// session state when `SERVER_SESSION_STATE_CHANGED` is set.
pub fn parse_ok(payload: &[u8], caps: C) -> Result<OkPacket<'_>, DecodeError> {
    let mut r = Reader::new(payload);
    if !matches!(r.u8("OK header")?, OK | EOF) {
        return Err(DecodeError::Malformed("not an OK packet"));
    }
    let mut ok = OkPacket {
        affected_rows: r.lenenc_u64("affected rows")?,
        last_insert_id: r.lenenc_u64("last insert id")?,
        status: StatusFlags::from_bits_retain(r.u16("status flags")?),
        warnings: r.u16("warnings")?,
        ..OkPacket::default()
    };
    if caps.contains(C::CLIENT_SESSION_TRACK) {
        if !r.is_empty() {
            ok.info = r.lenenc_bytes("info")?;
        }
        if ok
            .status
            .contains(StatusFlags::SERVER_SESSION_STATE_CHANGED)
            && !r.is_empty()
        {
            ok.session_state = r.lenenc_bytes("session state")?;
        }
    } else if !r.is_empty() {
        // Documented as string<EOF>, but servers write it length-encoded: take
        // the length-encoded string when it fills the rest exactly.
        let rest = r.rest();
        ok.info = match r.lenenc_str("info") {
            Ok(Some(info)) if r.is_empty() => info,
            _ => rest,
        };
    }
    Ok(ok)
}

fn put_ok(out: &mut Vec<u8>, header: u8, ok: &OkPacket<'_>, caps: C) {
    out.push(header);
    write_lenenc_int(out, ok.affected_rows);
    write_lenenc_int(out, ok.last_insert_id);
    out.extend_from_slice(&ok.status.bits().to_le_bytes());
    out.extend_from_slice(&ok.warnings.to_le_bytes());
    let state_changed = ok
        .status
        .contains(StatusFlags::SERVER_SESSION_STATE_CHANGED);
    if caps.contains(C::CLIENT_SESSION_TRACK) {
        // As the server does: info only when there is info or state to follow.
        if state_changed || !ok.info.is_empty() {
            write_lenenc_str(out, ok.info);
        }
        if state_changed {
            write_lenenc_str(out, ok.session_state);
        }
    } else if !ok.info.is_empty() {
        write_lenenc_str(out, ok.info);
    }
}

/// Builds an OK packet (header 0x00).
pub fn build_ok(ok: &OkPacket<'_>, caps: C) -> Vec<u8> {
    let mut out = Vec::with_capacity(11 + ok.info.len() + ok.session_state.len());
    put_ok(&mut out, OK, ok, caps);
    out
}

/// Builds the OK-as-EOF (header 0xFE) that ends a result set under `DEPRECATE_EOF`.
pub fn build_ok_as_eof(ok: &OkPacket<'_>, caps: C) -> Vec<u8> {
    let mut out = Vec::with_capacity(11 + ok.info.len() + ok.session_state.len());
    put_ok(&mut out, EOF, ok, caps);
    out
}

/// Builds an old-style EOF: 0xFE, warnings, status flags.
pub fn build_eof(warnings: u16, status: StatusFlags) -> Vec<u8> {
    let mut out = vec![EOF];
    out.extend_from_slice(&warnings.to_le_bytes());
    out.extend_from_slice(&status.bits().to_le_bytes());
    out
}

/// Parses an old-style EOF: (warnings, status flags).
pub fn parse_eof(payload: &[u8]) -> Result<(u16, StatusFlags), DecodeError> {
    let mut r = Reader::new(payload);
    if r.u8("EOF header")? != EOF || payload.len() > 5 {
        return Err(DecodeError::Malformed("not an old-style EOF packet"));
    }
    let warnings = r.u16("warnings")?;
    Ok((
        warnings,
        StatusFlags::from_bits_retain(r.u16("status flags")?),
    ))
}

/// One entry of an OK packet's session-state information.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionChange<'a> {
    /// A tracked system variable changed (MariaDB reports `last_gtid` so).
    SystemVariable {
        name: &'a [u8],
        value: &'a [u8],
    },
    Schema(&'a [u8]),
    /// `session_track_state_change`: whether any session state changed.
    StateChange(bool),
    /// MySQL's `session_track_gtids`: the GTID set in text form.
    Gtids(&'a [u8]),
    TransactionCharacteristics(&'a [u8]),
    /// `session_track_transaction_info`: 8 characters, e.g. `T_______`.
    TransactionState(&'a [u8]),
    /// A tracker type this crate does not know, kept raw.
    Unknown {
        kind: u8,
        data: &'a [u8],
    },
}

fn value<'a>(d: &mut Reader<'a>) -> Result<&'a [u8], DecodeError> {
    d.lenenc_bytes("session state value")
}

/// Decodes [`OkPacket::session_state`] into its entries. A system-variables
/// entry holding several name/value pairs yields one change per pair.
pub fn parse_session_state(state: &[u8]) -> Result<Vec<SessionChange<'_>>, DecodeError> {
    let mut out = Vec::new();
    let mut r = Reader::new(state);
    while !r.is_empty() {
        let kind = r.u8("session state type")?;
        let mut d = Reader::new(r.lenenc_bytes("session state entry")?);
        match T::try_from(kind) {
            Ok(T::SESSION_TRACK_SYSTEM_VARIABLES) => {
                while !d.is_empty() {
                    let name = d.lenenc_bytes("system variable name")?;
                    let value = value(&mut d)?;
                    out.push(SessionChange::SystemVariable { name, value });
                }
            }
            Ok(T::SESSION_TRACK_SCHEMA) => out.push(SessionChange::Schema(value(&mut d)?)),
            Ok(T::SESSION_TRACK_STATE_CHANGE) => {
                out.push(SessionChange::StateChange(value(&mut d)? == b"1"))
            }
            Ok(T::SESSION_TRACK_GTIDS) => {
                // One byte of encoding specification (0: text), then the set.
                d.u8("GTID encoding")?;
                out.push(SessionChange::Gtids(value(&mut d)?));
            }
            Ok(T::SESSION_TRACK_TRANSACTION_CHARACTERISTICS) => {
                out.push(SessionChange::TransactionCharacteristics(value(&mut d)?))
            }
            Ok(T::SESSION_TRACK_TRANSACTION_STATE) => {
                out.push(SessionChange::TransactionState(value(&mut d)?))
            }
            Err(_) => out.push(SessionChange::Unknown {
                kind,
                data: d.take_rest(),
            }),
        }
    }
    Ok(out)
}

/// Encodes session-state entries as a server does (one entry per change).
pub fn encode_session_state(changes: &[SessionChange<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in changes {
        let mut data = Vec::new();
        let kind = match *c {
            SessionChange::SystemVariable { name, value } => {
                write_lenenc_str(&mut data, name);
                write_lenenc_str(&mut data, value);
                T::SESSION_TRACK_SYSTEM_VARIABLES as u8
            }
            SessionChange::Schema(s) => {
                write_lenenc_str(&mut data, s);
                T::SESSION_TRACK_SCHEMA as u8
            }
            SessionChange::StateChange(b) => {
                write_lenenc_str(&mut data, if b { b"1" } else { b"0" });
                T::SESSION_TRACK_STATE_CHANGE as u8
            }
            SessionChange::Gtids(g) => {
                data.push(0);
                write_lenenc_str(&mut data, g);
                T::SESSION_TRACK_GTIDS as u8
            }
            SessionChange::TransactionCharacteristics(s) => {
                write_lenenc_str(&mut data, s);
                T::SESSION_TRACK_TRANSACTION_CHARACTERISTICS as u8
            }
            SessionChange::TransactionState(s) => {
                write_lenenc_str(&mut data, s);
                T::SESSION_TRACK_TRANSACTION_STATE as u8
            }
            SessionChange::Unknown { kind, data: raw } => {
                data.extend_from_slice(raw);
                kind
            }
        };
        out.push(kind);
        write_lenenc_str(&mut out, &data);
    }
    out
}

/// The GTID a write produced, from either server's tracker: MySQL's
/// `session_track_gtids` entry or MariaDB's `last_gtid` system variable.
pub fn last_gtid<'a>(changes: &[SessionChange<'a>]) -> Option<&'a [u8]> {
    changes.iter().rev().find_map(|c| match *c {
        SessionChange::Gtids(g) => Some(g),
        SessionChange::SystemVariable {
            name: b"last_gtid",
            value,
        } => Some(value),
        _ => None,
    })
}

#[cfg(test)]
mod tests;
