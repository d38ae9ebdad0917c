//! `fulcrum check` on the shipped examples, on broken configs and hba files,
//! on a missing file, with passwords from files and the environment, and
//! with `--connect` reporting each backend's role or refusal.

use std::path::{Path, PathBuf};
use std::process::Command;

use fulcrum_testkit::{fulcrum_bin, run_fulcrum};

use super::helpers::{check, text, TempDir};

/// A valid one-cluster file; the broken cases are edits of it. Line numbers:
/// 1 `[[cluster]]`, 2 name, 3 protocol, 4 listen, 5 `[[cluster.backend]]`,
/// 6 address, 7 role, 8 `[[cluster.user]]`, 9 name, 10 password.
const VALID: &str = r#"[[cluster]]
name = "main"
protocol = "postgres"
listen = "127.0.0.1:6432"
[[cluster.backend]]
address = "127.0.0.1:5432"
role = "primary"
[[cluster.user]]
name = "app"
password = "secret"
"#;

/// `VALID` with `line` added right after the `listen` line (so it is line 5).
fn with_cluster_key(line: &str) -> String {
    VALID.replace(
        "listen = \"127.0.0.1:6432\"\n",
        &format!("listen = \"127.0.0.1:6432\"\n{line}\n"),
    )
}

/// `VALID` twice: the second cluster's table starts on line 11 (name on 12,
/// listen on 14). `edit` adjusts the second copy.
fn two_clusters(edit: impl Fn(&str) -> String) -> String {
    format!("{VALID}{}", edit(VALID))
}

#[test]
fn shipped_example_configs_pass_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no config/*.toml found in {}",
        dir.display()
    );
    // The Docker demo's config is an example too.
    files.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/fulcrum.toml"));
    // config/tls.toml names certificate files its comment says how to make:
    // checked as a copy next to certificates made here.
    let certs_dir = TempDir::new();
    for file in &mut files {
        if file.file_name().is_some_and(|n| n == "tls.toml") {
            let certs = certs_dir.0.join("certs");
            std::fs::create_dir_all(&certs).unwrap();
            fulcrum_testkit::TestCerts::in_dir(&certs, "server").expect("test certificates");
            let copy = certs_dir.write("tls.toml", &std::fs::read_to_string(&*file).unwrap());
            *file = copy;
        }
    }
    for file in files {
        let out = check(&file);
        assert!(
            out.status.success(),
            "{} was rejected ({}):\nstdout: {}\nstderr: {}",
            file.display(),
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).starts_with(&format!("{}: OK", file.display())),
            "{}: {}",
            file.display(),
            text(&out.stdout)
        );
    }
}

#[test]
fn invalid_configs_fail_check_with_file_line_key_and_reason() {
    struct Case {
        what: &'static str,
        toml: String,
        line: usize,
        key: &'static str,
        /// The reason must start with this (its tail may list alternatives).
        reason: &'static str,
    }
    let cases = [
        Case {
            what: "unknown key",
            toml: with_cluster_key("pool_sise = 5"),
            line: 5,
            key: "cluster[0].pool_sise",
            reason: "unknown key `pool_sise`: did you mean `pool_size`?",
        },
        Case {
            what: "wrong type",
            toml: with_cluster_key("pool_size = \"big\""),
            line: 5,
            key: "cluster[0].pool_size",
            reason: "invalid type: string \"big\", expected an integer",
        },
        Case {
            what: "duplicate cluster name",
            toml: two_clusters(|c| c.replace("6432", "6433").replace("5432", "5433")),
            line: 12,
            key: "cluster[1].name",
            reason: "cluster name \"main\" is already used by cluster[0] (line 2)",
        },
        Case {
            what: "a shared listen address without database lists",
            toml: two_clusters(|c| c.replace("\"main\"", "\"other\"").replace("5432", "5433")),
            line: 14,
            key: "cluster[1].listen",
            reason: "127.0.0.1:6432 is shared with cluster \"main\", and neither lists [[cluster.database]]: \
                     on a shared port each cluster but one must list the databases it serves",
        },
        Case {
            what: "no primary-capable backend",
            toml: VALID.replace("role = \"primary\"", "role = \"replica\""),
            line: 5,
            key: "cluster[0].backend",
            reason: "cluster \"main\" has no backend with role \"primary\" or \"auto\", so writes \
                     would have nowhere to go",
        },
        Case {
            what: "bad duration",
            toml: with_cluster_key("pool_timeout = \"5\""),
            line: 5,
            key: "cluster[0].pool_timeout",
            reason: "invalid duration \"5\": missing unit (us, ms, s, m, h), e.g. \"5s\"",
        },
    ];
    let dir = TempDir::new();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let path = dir.write(&format!("case{i}.toml"), &case.toml);
        let out = check(&path);
        let stdout = text(&out.stderr);
        let prefix = format!("{}:{}: {}: ", path.display(), case.line, case.key);
        let lines: Vec<&str> = stdout.lines().collect();
        let ok = out.status.code() == Some(2)
            && lines.len() == 1
            && lines[0]
                .strip_prefix(&prefix)
                .is_some_and(|reason| reason.starts_with(case.reason));
        if !ok {
            failures.push(format!(
                "{}: want exit 2 and `{prefix}{}...` on stderr\n  got {} stderr: {stdout:?} stdout: {:?}",
                case.what,
                case.reason,
                out.status,
                text(&out.stdout)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_bad_hba_line_fails_check_naming_the_hba_file_and_line() {
    let dir = TempDir::new();
    let hba = dir.write(
        "hba.conf",
        "host all app 127.0.0.1/32 scram-sha-256\nhost all all all ident\n",
    );
    let toml = with_cluster_key("client_auth = \"hba\"\nauth_hba_file = \"hba.conf\"");
    let path = dir.write("fulcrum.toml", &toml);
    let out = check(&path);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let want = format!(
        "{}:6: cluster[0].auth_hba_file: {}:2: unknown authentication method \"ident\", expected trust, reject, md5, scram-sha-256, password, cert or peer\n",
        path.display(),
        hba.display()
    );
    assert_eq!(text(&out.stderr), want);
    // Fixed, the file passes.
    dir.write("hba.conf", "host all app 127.0.0.1/32 scram-sha-256\n");
    let out = check(&path);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn missing_config_file_exits_2_naming_the_file() {
    let dir = TempDir::new();
    let missing = dir.0.join("missing.toml");
    let out = run_fulcrum(&["--config".as_ref(), missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}: cannot read: ", missing.display())),
        "stderr: {stderr:?}"
    );

    // `check` reports the same way, on stderr like its other errors, and
    // nothing on stdout.
    let out = check(&missing);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}: cannot read: ", missing.display())),
        "stderr: {stderr:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
}

#[test]
fn passwords_from_files_and_the_environment() {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.0.join("secrets")).unwrap();
    std::fs::write(dir.0.join("secrets/app"), "from-a-file\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let secret = dir.0.join("secrets/app");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Readable by others: refused like PostgreSQL's key file, by file,
        // line and key.
        std::fs::write(dir.0.join("secrets/open"), "pw\n").unwrap();
        std::fs::set_permissions(
            dir.0.join("secrets/open"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
    }
    let config = |password: &str, admin: &str| {
        format!(
            "[fulcrum]\nadmin = \"127.0.0.1:6480\"\n[[fulcrum.admin_user]]\nname = \"ops\"\npassword = {admin}\n\
             [[cluster]]\nname = \"main\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:6432\"\n\
             health_password = {{ env = \"FULCRUM_TEST_HEALTH_PW\" }}\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:5432\"\nrole = \"primary\"\n\
             [[cluster.user]]\nname = \"app\"\npassword = {password}\n"
        )
    };
    let run = |text: &str| {
        let path = dir.write("fulcrum.toml", text);
        let bin = fulcrum_bin();
        Command::new(&bin)
            .args(["check".as_ref(), "--config".as_ref(), path.as_os_str()])
            .env("FULCRUM_TEST_HEALTH_PW", "health-pw")
            .env("FULCRUM_TEST_ADMIN_PW", "admin-pw")
            .env_remove("FULCRUM_TEST_MISSING")
            .output()
            .expect("fulcrum check")
    };
    let ok = run(&config(
        "{ file = \"secrets/app\" }",
        "{ env = \"FULCRUM_TEST_ADMIN_PW\" }",
    ));
    assert!(
        ok.status.success(),
        "{}{}",
        text(&ok.stdout),
        text(&ok.stderr)
    );
    let out = run(&config(
        "{ file = \"secrets/open\" }",
        "{ env = \"FULCRUM_TEST_ADMIN_PW\" }",
    ));
    assert!(!out.status.success());
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        err.contains("fulcrum.toml:16: cluster[0].user[0].password:")
            && err.contains("secrets/open is accessible by others (mode 0644)"),
        "{err}"
    );
    // A missing file and a missing variable name file, line and key.
    let out = run(&config(
        "{ file = \"secrets/nope\" }",
        "{ env = \"FULCRUM_TEST_ADMIN_PW\" }",
    ));
    assert!(!out.status.success());
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        err.contains("fulcrum.toml:16: cluster[0].user[0].password: cannot read")
            && err.contains("secrets/nope"),
        "{err}"
    );
    let out = run(&config("\"plain\"", "{ env = \"FULCRUM_TEST_MISSING\" }"));
    assert!(!out.status.success());
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        err.contains("fulcrum.toml:5: fulcrum.admin_user[0].password: environment variable FULCRUM_TEST_MISSING is not set"),
        "{err}"
    );
    // Neither, or both.
    let out = run(&config("{ vault = \"x\" }", "\"a\""));
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(err.contains("expected `file` or `env`"), "{err}");
    let out = run(&config("{ file = \"a\", env = \"B\" }", "\"a\""));
    let err = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(err.contains("not both"), "{err}");
}

/// `fulcrum check --connect` logs in to each backend with each login and
/// reports the role, or why it failed (exit 1): a good login on the
/// primary, a user (and a database's forced login) whose password the
/// server refuses, a backend that is not there.
#[test]
fn check_connect_reports_each_backends_role_and_each_refusal() {
    let c = fulcrum_suite::pg_primary();
    let nowhere = fulcrum_testkit::free_port();
    let dir = TempDir::new();
    let path = dir.write(
        "connect.toml",
        &format!(
            "[[cluster]]\nname = \"main\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:0\"\n\
             health_user = \"postgres\"\nhealth_password = \"\"\nhealth_timeout = \"2s\"\n\
             [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:{nowhere}\"\nrole = \"replica\"\n\
             [[cluster.user]]\nname = \"{}\"\npassword = \"{}\"\n\
             [[cluster.user]]\nname = \"intruder\"\npassword = \"guess\"\n\
             [[cluster.database]]\nname = \"forced\"\nserver_database = \"app\"\n\
             server_user = \"app_md5\"\nserver_password = \"not-its-password\"\n",
            c.primary().addr(),
            fulcrum_testkit::APP_USER,
            fulcrum_testkit::APP_PASSWORD
        ),
    );
    let out = run_fulcrum(&[
        "check".as_ref(),
        "--connect".as_ref(),
        "--config".as_ref(),
        path.as_os_str(),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let primary = c.primary().addr();
    assert!(
        stdout.contains(&format!("main: {primary} as postgres: ok, primary")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("main: {primary} as app: ok, primary")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "main: {primary} as intruder: FAILED: login refused"
        )),
        "{stderr}"
    );
    // A database's forced login is checked too.
    assert!(
        stderr.contains(&format!(
            "main: {primary} as app_md5: FAILED: login refused"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "main: 127.0.0.1:{nowhere} as postgres: FAILED: cannot connect"
        )),
        "{stderr}"
    );
}
