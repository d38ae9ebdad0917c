//! Client commands (the command phase): which command a packet is, the SQL of
//! COM_QUERY and COM_STMT_PREPARE, the statement id of the statement commands
//! and rewriting it in place (client ids map to per-server-connection ids),
//! and COM_STMT_PREPARE_OK with its statement id rewritten the other way.
//! Command bytes are mysql_common's `Command`; the rest is byte offsets, read
//! and rewritten in place, so hand-written.
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_command_phase.html>.

use mysql_common::constants::Command as Com;
use mysql_common::io::ParseBuf;
use mysql_common::packets::StmtPacket;
use mysql_common::proto::MyDeserialize;

use super::wire::DecodeError;

/// The command byte of a client packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Quit,
    InitDb,
    Query,
    FieldList,
    Statistics,
    ProcessKill,
    Ping,
    ChangeUser,
    StmtPrepare,
    StmtExecute,
    StmtSendLongData,
    StmtClose,
    StmtReset,
    SetOption,
    StmtFetch,
    ResetConnection,
    /// MariaDB's array binding; carries a statement id like COM_STMT_EXECUTE.
    StmtBulkExecute,
    Unknown(u8),
}

const TABLE: [(Com, Command); 17] = [
    (Com::COM_QUIT, Command::Quit),
    (Com::COM_INIT_DB, Command::InitDb),
    (Com::COM_QUERY, Command::Query),
    (Com::COM_FIELD_LIST, Command::FieldList),
    (Com::COM_STATISTICS, Command::Statistics),
    (Com::COM_PROCESS_KILL, Command::ProcessKill),
    (Com::COM_PING, Command::Ping),
    (Com::COM_CHANGE_USER, Command::ChangeUser),
    (Com::COM_STMT_PREPARE, Command::StmtPrepare),
    (Com::COM_STMT_EXECUTE, Command::StmtExecute),
    (Com::COM_STMT_SEND_LONG_DATA, Command::StmtSendLongData),
    (Com::COM_STMT_CLOSE, Command::StmtClose),
    (Com::COM_STMT_RESET, Command::StmtReset),
    (Com::COM_SET_OPTION, Command::SetOption),
    (Com::COM_STMT_FETCH, Command::StmtFetch),
    (Com::COM_RESET_CONNECTION, Command::ResetConnection),
    (Com::COM_STMT_BULK_EXECUTE, Command::StmtBulkExecute),
];

impl Command {
    pub fn from_byte(b: u8) -> Command {
        TABLE
            .iter()
            .find(|(com, _)| *com as u8 == b)
            .map_or(Command::Unknown(b), |&(_, c)| c)
    }

    pub fn byte(self) -> u8 {
        match self {
            Command::Unknown(b) => b,
            c => TABLE
                .iter()
                .find(|(_, x)| *x == c)
                .map_or(0, |&(com, _)| com as u8),
        }
    }

    /// Commands whose body starts with a 4-byte statement id.
    pub fn has_statement_id(self) -> bool {
        matches!(
            self,
            Command::StmtExecute
                | Command::StmtSendLongData
                | Command::StmtClose
                | Command::StmtReset
                | Command::StmtFetch
                | Command::StmtBulkExecute
        )
    }

    /// Commands the server never answers: the client sends the next command at once.
    pub fn has_no_response(self) -> bool {
        matches!(
            self,
            Command::Quit | Command::StmtClose | Command::StmtSendLongData
        )
    }
}

/// MariaDB: a COM_STMT_EXECUTE with this id runs the statement prepared last
/// on the connection (sent right behind COM_STMT_PREPARE); it must not be mapped.
pub const LAST_PREPARED: u32 = u32::MAX;

/// The command of a client packet.
pub fn command(payload: &[u8]) -> Result<Command, DecodeError> {
    payload
        .first()
        .map(|&b| Command::from_byte(b))
        .ok_or(DecodeError::Truncated("command byte"))
}

fn body_of(payload: &[u8], want: Command) -> Option<&[u8]> {
    match payload.split_first() {
        Some((&b, body)) if b == want.byte() => Some(body),
        _ => None,
    }
}

/// The SQL of a COM_QUERY (to the end of the packet); `None` for other commands.
pub fn query_text(payload: &[u8]) -> Option<&[u8]> {
    body_of(payload, Command::Query)
}

/// The SQL of a COM_STMT_PREPARE; `None` for other commands.
pub fn prepare_text(payload: &[u8]) -> Option<&[u8]> {
    body_of(payload, Command::StmtPrepare)
}

/// The schema of a COM_INIT_DB; `None` for other commands.
pub fn init_db_schema(payload: &[u8]) -> Option<&[u8]> {
    body_of(payload, Command::InitDb)
}

/// Builds a command packet payload: the command byte, then `body`.
pub fn build_command(cmd: Command, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + body.len());
    out.push(cmd.byte());
    out.extend_from_slice(body);
    out
}

fn id_bytes(payload: &[u8]) -> Result<[u8; 4], DecodeError> {
    payload
        .get(1..5)
        .map(|b| [b[0], b[1], b[2], b[3]])
        .ok_or(DecodeError::Truncated("statement id"))
}

/// The statement id of COM_STMT_EXECUTE, SEND_LONG_DATA, CLOSE, RESET, FETCH
/// (or MariaDB's BULK_EXECUTE); `Ok(None)` for other commands.
pub fn statement_id(payload: &[u8]) -> Result<Option<u32>, DecodeError> {
    if !command(payload)?.has_statement_id() {
        return Ok(None);
    }
    id_bytes(payload).map(|b| Some(u32::from_le_bytes(b)))
}

/// Rewrites the statement id of a statement command in place.
pub fn set_statement_id(payload: &mut [u8], id: u32) -> Result<(), DecodeError> {
    if !command(payload)?.has_statement_id() {
        return Err(DecodeError::Malformed("command carries no statement id"));
    }
    id_bytes(payload)?;
    payload[1..5].copy_from_slice(&id.to_le_bytes());
    Ok(())
}

/// COM_STMT_PREPARE_OK: the first packet of a successful prepare's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOk {
    pub statement_id: u32,
    pub num_columns: u16,
    pub num_params: u16,
    pub warnings: u16,
}

/// Parses COM_STMT_PREPARE_OK with mysql_common's `StmtPacket`: 0x00, statement
/// id, columns, params, a filler byte, warnings (12 bytes).
pub fn parse_prepare_ok(payload: &[u8]) -> Result<PrepareOk, DecodeError> {
    if payload.len() < 12 {
        return Err(DecodeError::Truncated("COM_STMT_PREPARE_OK"));
    }
    let p = StmtPacket::deserialize((), &mut ParseBuf(payload))
        .map_err(|_| DecodeError::Malformed("not a COM_STMT_PREPARE_OK"))?;
    Ok(PrepareOk {
        statement_id: p.statement_id(),
        num_columns: p.num_columns(),
        num_params: p.num_params(),
        warnings: p.warning_count(),
    })
}

/// Builds COM_STMT_PREPARE_OK (mysql_common's `StmtPacket` has no constructor).
pub fn build_prepare_ok(p: &PrepareOk) -> Vec<u8> {
    let mut out = vec![0x00];
    out.extend_from_slice(&p.statement_id.to_le_bytes());
    out.extend_from_slice(&p.num_columns.to_le_bytes());
    out.extend_from_slice(&p.num_params.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&p.warnings.to_le_bytes());
    out
}

/// Rewrites the statement id of a COM_STMT_PREPARE_OK in place.
pub fn set_prepare_ok_statement_id(payload: &mut [u8], id: u32) -> Result<(), DecodeError> {
    parse_prepare_ok(payload)?;
    payload[1..5].copy_from_slice(&id.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests;
