//! tokio-postgres over rustls (the adapter a rustls application writes,
//! with the `tls-server-end-point` binding tokio-postgres asks for): the
//! TLS clients of the end-to-end tests.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fulcrum_tls::rustls::pki_types::ServerName;
use fulcrum_tls::rustls::ClientConfig;
use fulcrum_tls::tokio_rustls::client::TlsStream;
use fulcrum_tls::tokio_rustls::TlsConnector;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

pub struct MakeRustls(pub Arc<ClientConfig>);
pub struct Connect(Arc<ClientConfig>, ServerName<'static>);
pub struct Stream<S>(TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for MakeRustls {
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(Connect(self.0.clone(), name))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for Connect {
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = TlsConnector::from(self.0).connect(self.1, stream).await?;
            Ok(Stream(tls))
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let cert = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first());
        match cert.and_then(|c| fulcrum_tls::certificate_hash(c.as_ref())) {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// TLS trusting `ca`, checking the server's name.
pub fn trusting(ca: &std::path::Path) -> MakeRustls {
    MakeRustls(
        fulcrum_tls::client_config(fulcrum_tls::Verify::Full, Some(ca), None, &[])
            .expect("client TLS config"),
    )
}

/// A login through `cfg`'s listener over TLS, trusting `ca` (the listener
/// has `tls_mode` "allow" or "require" with a certificate `ca` signed).
pub async fn connect(
    cfg: &crate::PgProxyConfig,
    ca: &std::path::Path,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let conn_str = format!(
        "{} sslmode=require",
        cfg.conn_string(fulcrum_testkit::APP_USER, fulcrum_testkit::APP_DB)
    );
    let (client, conn) = tokio_postgres::connect(&conn_str, trusting(ca)).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// The listener lines (`[[cluster]]` keys) for client TLS with `certs`.
pub fn listener_tls(certs: &fulcrum_testkit::TestCerts) -> [String; 3] {
    [
        "tls_mode = \"allow\"".to_string(),
        format!("tls_certificate = \"{}\"", certs.cert.display()),
        format!("tls_private_key = \"{}\"", certs.key.display()),
    ]
}

/// `client` runs a long sleep, and a cancel request with its key (sent to
/// the listener, as a driver sends it: over TLS trusting `ca` when given)
/// ends it with 57014 within 10 s.
pub async fn cancel_a_sleep(client: &tokio_postgres::Client, ca: Option<&std::path::Path>) {
    let cancel = client.cancel_token();
    let sleeping = client.simple_query("SELECT pg_sleep(20)");
    let canceller = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        match ca {
            Some(ca) => cancel.cancel_query(trusting(ca)).await,
            None => cancel.cancel_query(tokio_postgres::NoTls).await,
        }
    };
    let started = std::time::Instant::now();
    let (slept, cancelled) = tokio::join!(sleeping, canceller);
    cancelled.expect("the cancel request is taken");
    let e = slept.expect_err("the sleep is cancelled");
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("57014"),
        "{e:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
