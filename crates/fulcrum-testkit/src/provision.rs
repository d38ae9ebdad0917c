//! What the tests need beyond Rust, provisioned on first use, so that the
//! README's one test command (`cargo test --workspace`) works on a fresh
//! machine:
//!
//! - **Debian tools** ([`tool`]): a missing one (sysbench, openssl,
//!   promtool, ...) is installed with `apt-get` when the tests run as root
//!   (CI does), once per package, under a lock shared by every test
//!   binary, with services kept from starting (`policy-rc.d`); otherwise
//!   the test fails naming the package to install.
//! - **Python drivers** ([`python`]): psycopg 3 (pure-Python and binary
//!   builds), asyncpg and PyMySQL, pinned, in a virtual environment under the target
//!   directory (Debian's own python3 refuses a bare `pip install`, PEP 668),
//!   made once and reused while its requirement list is unchanged.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Python packages the driver tests run, pinned.
pub const PYTHON_REQUIREMENTS: &[&str] = &[
    "psycopg==3.3.9",
    "psycopg-binary==3.3.9",
    "PyMySQL==1.2.4",
    "asyncpg==0.31.0",
];

/// `path` if it exists; else, as root, the Debian `package` that holds it
/// is installed first. Panics (naming the package) when it cannot be had.
pub fn tool(path: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.exists() {
        return p;
    }
    let _lock = lock("apt");
    if !p.exists() {
        if let Err(why) = apt_install(&[package]) {
            panic!(
                "{path} is missing and could not be installed ({why}): apt-get install {package}"
            );
        }
    }
    assert!(
        p.exists(),
        "{path}: installing {package} did not provide it"
    );
    p
}

/// The directory the build writes to (`CARGO_TARGET_DIR`, else the
/// `target` above this test binary).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(|| std::env::temp_dir().join("fulcrum-target"))
}

/// The Python of the tests' virtual environment, with
/// [`PYTHON_REQUIREMENTS`] installed (made on first use).
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let dir = target_dir().join("fulcrum-python");
            let python = dir.join("bin").join("python3");
            let marker = dir.join("requirements.txt");
            let wanted = PYTHON_REQUIREMENTS.join("\n");
            let _lock = lock("python");
            if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str())
                && python.exists()
            {
                return python;
            }
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.parent().expect("a parent")).expect("target directory");
            let made = || {
                Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&dir)
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            if !made() {
                // Debian's python3 makes environments with python3-venv.
                let _apt = lock("apt");
                if let Err(why) = apt_install(&["python3-venv"]) {
                    panic!(
                        "python3 -m venv failed and python3-venv could not be installed ({why})"
                    );
                }
                assert!(made(), "python3 -m venv {} failed", dir.display());
            }
            let out = Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(PYTHON_REQUIREMENTS)
                .output()
                .expect("run pip");
            assert!(
                out.status.success(),
                "pip install {} failed:\n{}",
                PYTHON_REQUIREMENTS.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::write(&marker, &wanted).expect("write the requirement list");
            python
        })
        .clone()
}

/// An exclusive lock shared by every test process of this target
/// directory (released when dropped).
fn lock(name: &str) -> File {
    let dir = target_dir();
    let _ = std::fs::create_dir_all(&dir);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!(".fulcrum-{name}.lock")))
        .expect("lock file");
    file.lock().expect("lock");
    file
}

/// `apt-get install` of `packages`, as root, services kept from starting.
fn apt_install(packages: &[&str]) -> Result<(), String> {
    if !crate::is_root() {
        return Err("not root".into());
    }
    // Once per machine boot is enough for the package lists.
    let updated = std::env::temp_dir().join("fulcrum-apt-updated");
    if !updated.exists() {
        let ok = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=300", "update", "-qq"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err("apt-get update failed".into());
        }
        let _ = std::fs::write(&updated, b"");
    }
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let made_policy = !policy.exists()
        && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok()
        && Command::new("chmod")
            .args(["+x", "/usr/sbin/policy-rc.d"])
            .status()
            .is_ok_and(|s| s.success());
    let out = Command::new("apt-get")
        // Another apt-get (another checkout's tests, CI) may hold dpkg's lock.
        .args(["-o", "DPkg::Lock::Timeout=300"])
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output();
    if made_policy {
        let _ = std::fs::remove_file(policy);
    }
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(e.to_string()),
    }
}
