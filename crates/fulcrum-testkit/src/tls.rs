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
    /// The CA's key, to sign more certificates (`client`).
    pub ca_key: PathBuf,
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
        let mut make_ca = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
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
        let mut request = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
        request
            .arg("req")
            .args(ec)
            .args(["-subj", "/CN=localhost"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr);
        process::run(&mut request, None, &target)?;
        let mut sign = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
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
            ca_key,
        })
    }

    /// A client certificate signed by this CA for the subject `/CN=cn`,
    /// with its key: (certificate, key).
    pub fn client(&self, cn: &str) -> Result<(PathBuf, PathBuf)> {
        let tag: String = cn
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = |f: &str| self.dir.join(format!("client-{tag}-{f}"));
        let (cert, key, csr, ext) = (
            path("cert.pem"),
            path("key.pem"),
            path("req.csr"),
            path("ext.cnf"),
        );
        let target = format!("client certificate for {cn}");
        // Extensions make it an X.509 v3 certificate, which webpki requires.
        std::fs::write(&ext, "extendedKeyUsage=clientAuth\n")
            .map_err(|e| crate::TestkitError::io(format!("writing {}", ext.display()), e))?;
        let mut request = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
        request
            .args([
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-subj", &format!("/CN={cn}")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&csr);
        process::run(&mut request, None, &target)?;
        let mut sign = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
        sign.args(["x509", "-req", "-days", "2", "-set_serial", "7"])
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(&self.ca)
            .arg("-CAkey")
            .arg(&self.ca_key)
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&cert);
        process::run(&mut sign, None, &target)?;
        // libpq refuses a key file others may read.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| crate::TestkitError::io(format!("chmod {}", key.display()), e))?;
        Ok((cert, key))
    }

    /// Replaces the server certificate with one of the same CA that expired
    /// in 2020 (`openssl ca` sets past dates; `x509 -days` cannot).
    pub fn expire_server_certificate(&self) -> Result<()> {
        let path = |f: &str| self.dir.join(format!("expired-{f}"));
        let (conf, index, csr, ext) = (
            path("ca.cnf"),
            path("index.txt"),
            path("req.csr"),
            path("ext.cnf"),
        );
        let io = |what: &Path, e| crate::TestkitError::io(format!("writing {}", what.display()), e);
        std::fs::write(&index, "").map_err(|e| io(&index, e))?;
        std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
            .map_err(|e| io(&ext, e))?;
        std::fs::write(
            &conf,
            format!(
                "[ca]\ndefault_ca = d\n[d]\ndatabase = {}\nnew_certs_dir = {}\n\
                 default_md = sha256\npolicy = p\nrand_serial = yes\n[p]\ncommonName = supplied\n",
                index.display(),
                self.dir.display()
            ),
        )
        .map_err(|e| io(&conf, e))?;
        let target = "an expired server certificate".to_string();
        let mut request = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
        request
            .args(["req", "-new", "-key"])
            .arg(&self.key)
            .args(["-subj", "/CN=localhost", "-out"])
            .arg(&csr);
        process::run(&mut request, None, &target)?;
        let mut sign = Command::new(crate::tool("/usr/bin/openssl", "openssl"));
        sign.args(["ca", "-batch", "-notext", "-config"])
            .arg(&conf)
            .args([
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
            ])
            .arg("-cert")
            .arg(&self.ca)
            .arg("-keyfile")
            .arg(&self.ca_key)
            .arg("-extfile")
            .arg(&ext)
            .arg("-in")
            .arg(&csr)
            .arg("-out")
            .arg(&self.cert);
        process::run(&mut sign, None, &target)?;
        Ok(())
    }
}
