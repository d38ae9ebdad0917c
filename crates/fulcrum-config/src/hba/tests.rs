//! The parser's errors line by line, and the matcher's choices as a table.

use std::net::IpAddr;
use std::path::PathBuf;

use super::*;

fn no_files(name: &str) -> Result<String, String> {
    Err(format!("no file {name} in this test"))
}

fn rules(text: &str) -> Hba {
    let rules = parse(text, &mut no_files).unwrap_or_else(|e| panic!("{text}: {e:?}"));
    Hba {
        path: PathBuf::from("hba.conf"),
        rules,
    }
}

fn error(text: &str) -> (usize, String) {
    let e = parse(text, &mut no_files).expect_err(text);
    (e.line, e.reason)
}

fn host(addr: &str, tls: bool) -> Conn {
    Conn::Host {
        addr: addr.parse::<IpAddr>().unwrap(),
        tls,
    }
}

const FILE: &str = r#"
# TYPE     DATABASE        USER           ADDRESS          METHOD
host       all             blocked        127.0.0.1/32     reject
hostssl    all             app            127.0.0.1/32     cert
host       all             app,"Quoted U" 127.0.0.1/32     scram-sha-256
host       sameuser        all            10.0.0.0 255.0.0.0 trust
hostnossl  "all"           all            ::1/128          md5
host       all             all            all              md5  # the rest
local      all             all                             peer
"#;

#[test]
fn the_first_line_that_applies_decides() {
    let hba = rules(FILE);
    let use_ = |method, line| Verdict::Use { method, line };
    let cases: &[(Conn, &str, &str, Verdict)] = &[
        (
            host("127.0.0.1", false),
            "db",
            "blocked",
            Verdict::Rejected { line: 3 },
        ),
        (
            host("127.0.0.1", true),
            "db",
            "app",
            use_(HbaMethod::Cert, 4),
        ),
        (
            host("127.0.0.1", false),
            "db",
            "app",
            use_(HbaMethod::ScramSha256, 5),
        ),
        (
            host("127.0.0.1", false),
            "db",
            "Quoted U",
            use_(HbaMethod::ScramSha256, 5),
        ),
        (
            host("127.0.0.1", false),
            "db",
            "quoted u",
            use_(HbaMethod::Md5, 8),
        ),
        // sameuser: the database named as the user.
        (
            host("10.1.2.3", false),
            "bob",
            "bob",
            use_(HbaMethod::Trust, 6),
        ),
        (
            host("10.1.2.3", false),
            "other",
            "bob",
            use_(HbaMethod::Md5, 8),
        ),
        (
            host("11.1.2.3", false),
            "bob",
            "bob",
            use_(HbaMethod::Md5, 8),
        ),
        // An IPv4-mapped client matches IPv4 lines.
        (
            host("::ffff:10.9.9.9", false),
            "bob",
            "bob",
            use_(HbaMethod::Trust, 6),
        ),
        // Quoted "all" is a database called all.
        (host("::1", false), "all", "x", use_(HbaMethod::Md5, 7)),
        (host("::1", false), "other", "x", use_(HbaMethod::Md5, 8)),
        (host("::1", true), "all", "x", use_(HbaMethod::Md5, 8)),
        (
            Conn::Local { peer_uid: Some(1) },
            "db",
            "app",
            use_(HbaMethod::Peer, 9),
        ),
    ];
    for (conn, db, user, want) in cases {
        assert_eq!(hba.decide(conn, db, user), *want, "{conn:?} {db} {user}");
    }
}

#[test]
fn no_line_and_reject_lines_are_refused_in_postgresql_words() {
    let hba = rules("host all blocked 127.0.0.1/32 reject\nhostssl all all 10.0.0.0/8 md5\n");
    let c = host("127.0.0.1", false);
    let v = hba.decide(&c, "d", "blocked");
    assert_eq!(
        refusal(v, &c, "d", "blocked").unwrap(),
        "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"blocked\", database \"d\", no encryption"
    );
    let c = host("10.0.0.1", false);
    let v = hba.decide(&c, "d", "u");
    assert_eq!(
        v,
        Verdict::NoEntry,
        "hostssl does not take a plain connection"
    );
    assert_eq!(
        refusal(v, &c, "d", "u").unwrap(),
        "no pg_hba.conf entry for host \"10.0.0.1\", user \"u\", database \"d\", no encryption"
    );
    let c = host("1.2.3.4", true);
    assert_eq!(
        refusal(hba.decide(&c, "d", "u"), &c, "d", "u").unwrap(),
        "no pg_hba.conf entry for host \"1.2.3.4\", user \"u\", database \"d\", SSL encryption"
    );
    let local = Conn::Local { peer_uid: None };
    assert_eq!(hba.decide(&local, "d", "u"), Verdict::NoEntry);
    assert!(refusal(hba.decide(&local, "d", "u"), &local, "d", "u")
        .unwrap()
        .contains("host \"[local]\""));
    let empty = rules("# nothing\n\n");
    assert_eq!(empty.decide(&c, "d", "u"), Verdict::NoEntry);
}

#[test]
fn networks_match_by_their_mask() {
    let hba = rules("host all all 192.168.0.0/16 trust\nhost all all fe80::/10 md5\nhost all all 0.0.0.0/0 reject\n");
    let cases = [
        (
            "192.168.200.1",
            Verdict::Use {
                method: HbaMethod::Trust,
                line: 1,
            },
        ),
        ("192.169.0.1", Verdict::Rejected { line: 3 }),
        (
            "fe80::1",
            Verdict::Use {
                method: HbaMethod::Md5,
                line: 2,
            },
        ),
        ("fec0::1", Verdict::NoEntry),
    ];
    for (addr, want) in cases {
        assert_eq!(hba.decide(&host(addr, false), "d", "u"), want, "{addr}");
    }
}

#[test]
fn at_files_are_read_through_the_caller() {
    let mut read = |name: &str| match name {
        "users.txt" => Ok("alice, bob # the team\n\"Carol X\"\n@more.txt\n".to_string()),
        "more.txt" => Ok("dave\n".to_string()),
        "loop.txt" => Ok("@loop.txt\n".to_string()),
        other => Err(format!("cannot read {other}: No such file")),
    };
    let parsed = parse("host all @users.txt,eve all md5\n", &mut read).unwrap();
    assert_eq!(
        parsed[0].users.names,
        ["alice", "bob", "Carol X", "dave", "eve"]
    );
    let e = parse("\nhost all @missing.txt all md5\n", &mut read).unwrap_err();
    assert_eq!(
        (e.line, e.reason.as_str()),
        (2, "@missing.txt: cannot read missing.txt: No such file")
    );
    let e = parse("host all @loop.txt all md5\n", &mut read).unwrap_err();
    assert!(e.reason.contains("nest more than 8 deep"), "{}", e.reason);
}

#[test]
fn bad_lines_name_their_line_and_fault() {
    let cases: &[(&str, usize, &str)] = &[
        ("\nhosts all all all md5", 2, "unknown connection type \"hosts\", expected local, host, hostssl or hostnossl"),
        ("host all", 1, "the user column is missing"),
        ("host all all", 1, "the address is missing"),
        ("host all all all", 1, "the authentication method is missing"),
        ("host all all all ident", 1, "unknown authentication method \"ident\", expected trust, reject, md5, scram-sha-256, password, cert or peer"),
        ("host all all all password", 1, "ok"),
        ("host all all all md5 clientcert=verify-full", 1, "unsupported option \"clientcert=verify-full\" after the method: Fulcrum takes none (as PgBouncer)"),
        ("host all +admins all md5", 1, "+admins: +group (role membership) is not supported (nor by PgBouncer): list the users, or name a file of them with @file"),
        ("host samerole all all md5", 1, "samerole is not supported (nor by PgBouncer): list the databases"),
        ("host replication all all md5", 1, "replication is not supported: Fulcrum does not proxy replication connections"),
        ("host all all example.com md5", 1, "\"example.com\" is not an IP address (host names are not supported; write e.g. 10.0.0.0/8 or ::1/128)"),
        ("host all all samenet md5", 1, "address \"samenet\" is not supported by Fulcrum: write the networks (e.g. 10.0.0.0/8)"),
        ("host all all 10.0.0.0/33 md5", 1, "invalid CIDR mask in \"10.0.0.0/33\": expected /0 to /32"),
        ("host all all ::1/129 md5", 1, "invalid CIDR mask in \"::1/129\": expected /0 to /128"),
        ("host all all 10.0.0.1 md5", 1, "\"md5\" is not an IP address (host names are not supported; write e.g. 10.0.0.0/8 or ::1/128)"),
        ("host all all 10.0.0.1", 1, "the mask (or a CIDR address such as 10.0.0.0/8) is missing"),
        ("host all all 10.0.0.0 ffff:: md5", 1, "the mask \"ffff::\" is not of the address \"10.0.0.0\"'s family"),
        ("host all all all cert", 1, "cert authentication is only supported on hostssl lines"),
        ("host all all all peer", 1, "peer authentication is only supported on local lines (Unix sockets)"),
        ("host all a,,b all md5", 1, "a list item is empty (two commas, or a comma first)"),
        ("host all a, all md5", 1, "\"md5\" is not an IP address (host names are not supported; write e.g. 10.0.0.0/8 or ::1/128)"),
        ("host all a,", 1, "a list ends with a comma"),
        ("host all \"open all md5", 1, "a quoted name has no closing quote"),
        ("host all a\"b\" all md5", 1, "a quote inside a name: quote the whole name"),
        ("host all,x all all md5 ", 1, "ok"),
    ];
    for (text, line, reason) in cases {
        match parse(text, &mut no_files) {
            Ok(_) => assert_eq!(*reason, "ok", "{text} parsed"),
            Err(e) => assert_eq!((e.line, e.reason.as_str()), (*line, *reason), "{text}"),
        }
    }
    // "a, all" is the list [a, all]: what follows is the address.
    assert!(error("host all a, all md5").1.starts_with("\"md5\""));
}

#[test]
fn a_file_reads_with_its_at_files_beside_it() {
    let dir = std::env::temp_dir().join(format!("fulcrum-hba-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("admins"), "root\n").unwrap();
    std::fs::write(
        dir.join("hba.conf"),
        "host all @admins 127.0.0.1/32 trust\n",
    )
    .unwrap();
    let hba = Hba::load(&dir.join("hba.conf")).unwrap();
    assert_eq!(hba.rules[0].users.names, ["root"]);
    let e = Hba::load(&dir.join("missing.conf")).unwrap_err();
    assert_eq!(e.line, 0);
    assert!(e.reason.starts_with("cannot read:"), "{}", e.reason);
    std::fs::remove_dir_all(&dir).unwrap();
}
