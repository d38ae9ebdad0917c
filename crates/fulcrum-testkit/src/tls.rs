//! Test certificates, made at test time with Debian's openssl (nothing
//! secret is committed): a certificate authority and a server certificate
//! it signs, for `localhost` and `127.0.0.1`, in a new scratch directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Result;
use crate::process;

/// A CA and one server certificate signed by it (PEM files).
#[derive(Debug, Clone)]
pub struct TestCerts {
    pub dir: PathBuf,
    /// The CA's certificate: what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate and its key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCerts {
    /// A new CA and server certificate in a new directory.
    pub fn new() -> Result<TestCerts> {
        let dir = crate::scratch::create("tls", false)?;
        TestCerts::in_dir(&dir, "server")
    }

    /// A new CA and server certificate named `name-*.pem` in `dir`.
    pub fn in_dir(dir: &Path, name: &str) -> Result<TestCerts> {
        let path = |f: &str| dir.join(format!("{name}-{f}"));
        let (ca, ca_key, cert, key, csr, ext) = (
            path("ca.pem"),
            path("ca-key.pem"),
            path("cert.pem"),
            path("key.pem"),
            path("req.csr"),
            path("ext.cnf"),
        );
        std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
            .map_err(|e| crate::TestkitError::io(format!("writing {}", ext.display()), e))?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let target = format!("test certificates in {}", dir.display());
        let mut make_ca = Command::new("openssl");
        make_ca
            .args(["req", "-x509"])
            .args(ec)
            .args([
                "-days",
                "2",
                "-subj",
                &format!("/CN=fulcrum test CA {name}"),
            ])
            .arg("-keyout")
            .arg(&ca_key)
            .arg("-out")
            .arg(&ca);
        process::run(&mut make_ca, None, &target)?;
        let mut request = Command::new("openssl");
        request
            .arg("req")
            .args(ec)
            .args(["-subj", "/CN=localhost"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr);
        process::run(&mut request, None, &target)?;
        let mut sign = Command::new("openssl");
        sign.args(["x509", "-req", "-days", "2", "-set_serial", "1"])
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(&ca)
            .arg("-CAkey")
            .arg(&ca_key)
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&cert);
        process::run(&mut sign, None, &target)?;
        Ok(TestCerts {
            dir: dir.to_owned(),
            ca,
            cert,
            key,
        })
    }
}
