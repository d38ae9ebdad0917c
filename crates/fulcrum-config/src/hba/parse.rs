//! pg_hba.conf's format over `&str`, as PgBouncer reads it: the line types
//! `local`, `host`, `hostssl`, `hostnossl`; comma lists of names with `all`,
//! `sameuser`, quoted names and `@file` (read through the caller's closure);
//! addresses as `all`, CIDR or address and mask; the methods Fulcrum has.
//! Whatever PgBouncer refuses (`+group`, `samerole`, options after the
//! method) is an error naming the line, never a line silently skipped.

use std::net::IpAddr;

use super::{Address, ConnKind, HbaMethod, HbaRule, Names};

/// A bad line: its 1-based number (0: the file as a whole) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HbaError {
    pub line: usize,
    pub reason: String,
}

/// How deep `@file`s may name other `@file`s.
const MAX_INCLUDE_DEPTH: usize = 8;

/// One word of a line; a quoted one is always a plain name (`"all"` is a
/// user called all).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    quoted: bool,
}

/// The rules in `text`. `read` returns the text of an `@file` by the name
/// written after the `@` (the caller resolves it against the hba file's
/// directory).
pub fn parse(
    text: &str,
    read: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Vec<HbaRule>, HbaError> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let fail = |reason: String| HbaError {
            line: i + 1,
            reason,
        };
        let fields = fields(line).map_err(fail)?;
        if fields.is_empty() {
            continue;
        }
        rules.push(rule(i + 1, &fields, read).map_err(fail)?);
    }
    Ok(rules)
}

/// Splits a line into fields (whitespace-separated), each a comma list of
/// tokens; `#` outside quotes starts a comment.
fn fields(line: &str) -> Result<Vec<Vec<Token>>, String> {
    let mut out: Vec<Vec<Token>> = Vec::new();
    let mut chars = line.chars().peekable();
    let mut field: Vec<Token> = Vec::new();
    let mut after_comma = false;
    loop {
        let mut space = false;
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
            space = true;
        }
        if space && !after_comma && !field.is_empty() {
            out.push(std::mem::take(&mut field));
        }
        match chars.peek() {
            None | Some('#') => break,
            Some(',') => return Err("a list item is empty (two commas, or a comma first)".into()),
            Some('"') => {
                chars.next();
                let mut text = String::new();
                loop {
                    match chars.next() {
                        None => return Err("a quoted name has no closing quote".into()),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            text.push('"');
                        }
                        Some('"') => break,
                        Some(c) => text.push(c),
                    }
                }
                field.push(Token { text, quoted: true });
            }
            Some(_) => {
                let mut text = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || matches!(c, ',' | '#' | '"') {
                        break;
                    }
                    text.push(c);
                    chars.next();
                }
                field.push(Token {
                    text,
                    quoted: false,
                });
            }
        }
        if chars
            .peek()
            .is_some_and(|c| !c.is_whitespace() && !matches!(c, ',' | '#'))
        {
            return Err("a quote inside a name: quote the whole name".into());
        }
        after_comma = chars.peek() == Some(&',');
        if after_comma {
            chars.next();
        }
    }
    if after_comma {
        return Err("a list ends with a comma".into());
    }
    if !field.is_empty() {
        out.push(field);
    }
    Ok(out)
}

/// The one plain word of a field that is not a list (type, address, method).
fn word<'f>(fields: &'f [Vec<Token>], at: usize, what: &str) -> Result<&'f str, String> {
    match fields.get(at).map(Vec::as_slice) {
        None => Err(format!("the {what} is missing")),
        Some([t]) if !t.quoted => Ok(&t.text),
        Some(_) => Err(format!("the {what} must be one unquoted word")),
    }
}

fn rule(
    line: usize,
    fields: &[Vec<Token>],
    read: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<HbaRule, String> {
    let kind = match word(fields, 0, "connection type")? {
        "local" => ConnKind::Local,
        "host" => ConnKind::Host,
        "hostssl" => ConnKind::HostSsl,
        "hostnossl" => ConnKind::HostNoSsl,
        other => {
            return Err(format!(
                "unknown connection type {other:?}, expected local, host, hostssl or hostnossl"
            ))
        }
    };
    let databases = names(
        fields.get(1).ok_or("the database column is missing")?,
        true,
        read,
        0,
    )?;
    let users = names(
        fields.get(2).ok_or("the user column is missing")?,
        false,
        read,
        0,
    )?;
    let (address, next) = match kind {
        ConnKind::Local => (None, 3),
        _ => {
            let (a, used) = address(fields)?;
            (Some(a), 3 + used)
        }
    };
    let method = method(word(fields, next, "authentication method")?)?;
    if let Some(extra) = fields.get(next + 1) {
        let extra: Vec<&str> = extra.iter().map(|t| t.text.as_str()).collect();
        return Err(format!(
            "unsupported option {:?} after the method: Fulcrum takes none (as PgBouncer)",
            extra.join(",")
        ));
    }
    match (method, kind) {
        (HbaMethod::Cert, ConnKind::HostSsl) | (HbaMethod::Peer, ConnKind::Local) => {}
        (HbaMethod::Cert, _) => {
            return Err("cert authentication is only supported on hostssl lines".into())
        }
        (HbaMethod::Peer, _) => {
            return Err(
                "peer authentication is only supported on local lines (Unix sockets)".into(),
            )
        }
        _ => {}
    }
    Ok(HbaRule {
        line,
        kind,
        databases,
        users,
        address,
        method,
    })
}

fn method(word: &str) -> Result<HbaMethod, String> {
    Ok(match word {
        "trust" => HbaMethod::Trust,
        "reject" => HbaMethod::Reject,
        "md5" => HbaMethod::Md5,
        "scram-sha-256" => HbaMethod::ScramSha256,
        "cert" => HbaMethod::Cert,
        "peer" => HbaMethod::Peer,
        "password" => HbaMethod::Password,
        other => {
            return Err(format!(
                "unknown authentication method {other:?}, expected trust, reject, md5, scram-sha-256, password, cert or peer"
            ))
        }
    })
}

/// The address column (and the mask column after it when the address has
/// no `/`); with how many fields were used.
fn address(fields: &[Vec<Token>]) -> Result<(Address, usize), String> {
    let text = word(fields, 3, "address")?;
    match text {
        "all" => return Ok((Address::All, 1)),
        "samehost" | "samenet" => {
            return Err(format!(
                "address {text:?} is not supported by Fulcrum: write the networks (e.g. 10.0.0.0/8)"
            ))
        }
        _ => {}
    }
    let ip = |s: &str| -> Result<IpAddr, String> {
        s.parse().map_err(|_| {
            format!("{s:?} is not an IP address (host names are not supported; write e.g. 10.0.0.0/8 or ::1/128)")
        })
    };
    if let Some((addr, bits)) = text.split_once('/') {
        let addr = ip(addr)?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits: u32 = bits
            .parse()
            .ok()
            .filter(|b| *b <= max)
            .ok_or_else(|| format!("invalid CIDR mask in {text:?}: expected /0 to /{max}"))?;
        let mask = match addr {
            IpAddr::V4(_) => IpAddr::V4(u32::MAX.checked_shl(32 - bits).unwrap_or(0).into()),
            IpAddr::V6(_) => IpAddr::V6(u128::MAX.checked_shl(128 - bits).unwrap_or(0).into()),
        };
        return Ok((Address::Net { addr, mask }, 1));
    }
    let addr = ip(text)?;
    let mask_text = word(fields, 4, "mask (or a CIDR address such as 10.0.0.0/8)")?;
    let mask = ip(mask_text)?;
    if mask.is_ipv4() != addr.is_ipv4() {
        return Err(format!(
            "the mask {mask_text:?} is not of the address {text:?}'s family"
        ));
    }
    Ok((Address::Net { addr, mask }, 2))
}

/// A database (`is_db`) or user column: keywords, names, `@file`s.
fn names(
    field: &[Token],
    is_db: bool,
    read: &mut dyn FnMut(&str) -> Result<String, String>,
    depth: usize,
) -> Result<Names, String> {
    let mut out = Names::default();
    for t in field {
        let text = t.text.as_str();
        if t.quoted {
            out.names.push(t.text.clone());
            continue;
        }
        match text {
            "all" => out.all = true,
            "sameuser" if is_db => out.same_user = true,
            "samerole" | "samegroup" if is_db => {
                return Err(format!(
                    "{text} is not supported (nor by PgBouncer): list the databases"
                ))
            }
            "replication" if is_db => {
                return Err(
                    "replication is not supported: Fulcrum does not proxy replication connections"
                        .into(),
                )
            }
            _ if text.starts_with('+') => {
                return Err(format!(
                    "{text}: +group (role membership) is not supported (nor by PgBouncer): list the users, or name a file of them with @file"
                ))
            }
            _ if text.starts_with('@') => {
                let more = include(&text[1..], is_db, read, depth)?;
                out.all |= more.all;
                out.same_user |= more.same_user;
                out.names.extend(more.names);
            }
            _ => out.names.push(t.text.clone()),
        }
    }
    Ok(out)
}

/// The names in an `@file`: separated by whitespace or commas, `#` comments.
fn include(
    name: &str,
    is_db: bool,
    read: &mut dyn FnMut(&str) -> Result<String, String>,
    depth: usize,
) -> Result<Names, String> {
    if name.is_empty() {
        return Err("@ without a file name".into());
    }
    if depth >= MAX_INCLUDE_DEPTH {
        return Err(format!(
            "@{name}: @files nest more than {MAX_INCLUDE_DEPTH} deep"
        ));
    }
    let text = read(name).map_err(|e| format!("@{name}: {e}"))?;
    let mut out = Names::default();
    for (i, line) in text.lines().enumerate() {
        let fail = |e: String| format!("@{name} line {}: {e}", i + 1);
        for field in fields(line).map_err(fail)? {
            let more = names(&field, is_db, read, depth + 1).map_err(fail)?;
            out.all |= more.all;
            out.same_user |= more.same_user;
            out.names.extend(more.names);
        }
    }
    Ok(out)
}
