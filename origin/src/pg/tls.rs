//! TLS to PostgreSQL, with rustls, chosen by the URL's `sslmode` as libpq names them:
//!
//! - `disable`: no TLS.
//! - `prefer` (the default, as libpq's): TLS when the server offers it (its certificate not
//!   checked, as `require`), otherwise plain; a server that answers the TLS request with "no"
//!   (a Unix socket, `ssl=off`) is spoken to in plain text. So a connection to a server that
//!   can encrypt is encrypted, and one that cannot still connects, as with `psql`.
//! - `require`: TLS or no connection; the server's certificate is not checked (encryption
//!   against eavesdroppers only, as libpq's `require` without a root certificate).
//! - `verify-full`: TLS, the server's certificate chain checked against the roots and its name
//!   against the URL's host. The roots are the system's (its CA bundle, as OpenSSL finds it),
//!   or the PEM file given by `sslrootcert=PATH` (`sslrootcert=system`: the system's).
//!
//! `verify-ca` (a chain check without the name) is refused: use `verify-full`. The parsing
//! ([`TlsParams::split`]) is pure; [`Tls::from_params`] reads the roots.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Why the URL's TLS settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error(
        "sslmode={0} is not supported: use disable, prefer, require or verify-full \
         (verify-full checks the certificate chain and the host name)"
    )]
    Mode(String),
    #[error("sslrootcert is used with sslmode=verify-full only")]
    RootCertWithoutVerify,
    #[error("cannot read the CA certificates in sslrootcert={path}: {why}")]
    RootCert { path: String, why: String },
    #[error("no system CA certificates were found ({0}); give the CA with sslrootcert=PATH")]
    NoSystemRoots(String),
    #[error("{0}")]
    Rustls(String),
}

/// The TLS a URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// Encrypted when the server offers it, the certificate not checked; plain otherwise.
    Prefer,
    /// Encrypted, the certificate not checked.
    Require,
    /// Encrypted, the chain and the host name checked against these roots.
    VerifyFull(Roots),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    System,
    File(PathBuf),
}

/// The URL's TLS parameters, and the URL without those tokio-postgres does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: Mode,
    /// The URL for tokio-postgres: `sslmode` set to what it speaks (`disable`, `prefer` or
    /// `require`), `sslrootcert` removed.
    pub url: String,
}

impl TlsParams {
    /// Take `sslmode` and `sslrootcert` out of a `postgres://…?…` URL's query.
    pub fn split(url: &str) -> Result<TlsParams, TlsError> {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let mut mode = None;
        let mut root = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let value = || {
                url::form_urlencoded::parse(format!("v={v}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            };
            match k {
                "sslmode" => mode = Some(value()),
                "sslrootcert" => root = Some(value()),
                _ => rest.push(pair),
            }
        }
        let mode = match (mode.as_deref().unwrap_or("prefer"), root) {
            ("disable" | "prefer" | "require", Some(_)) => {
                return Err(TlsError::RootCertWithoutVerify)
            }
            ("disable", None) => Mode::Off,
            ("prefer", None) => Mode::Prefer,
            ("require", None) => Mode::Require,
            ("verify-full", None) => Mode::VerifyFull(Roots::System),
            ("verify-full", Some(r)) if r == "system" => Mode::VerifyFull(Roots::System),
            ("verify-full", Some(r)) => Mode::VerifyFull(Roots::File(PathBuf::from(r))),
            (other, _) => return Err(TlsError::Mode(other.to_string())),
        };
        rest.push(match mode {
            Mode::Off => "sslmode=disable",
            Mode::Prefer => "sslmode=prefer",
            Mode::Require | Mode::VerifyFull(_) => "sslmode=require",
        });
        Ok(TlsParams {
            mode,
            url: format!("{base}?{}", rest.join("&")),
        })
    }
}

/// The connector every PostgreSQL connection of the ledger uses (cheap to clone).
#[derive(Clone)]
pub enum Tls {
    /// `sslmode` is `disable`: never asked to connect.
    Off,
    Rustls(Arc<ClientConfig>),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tls::Off => "Tls::Off",
            Tls::Rustls(_) => "Tls::Rustls",
        })
    }
}

impl Tls {
    pub fn from_params(mode: &Mode) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        let config = match mode {
            Mode::Off => return Ok(Tls::Off),
            Mode::Prefer | Mode::Require => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
                .with_no_client_auth(),
            Mode::VerifyFull(roots) => builder
                .with_root_certificates(root_store(roots)?)
                .with_no_client_auth(),
        };
        Ok(Tls::Rustls(Arc::new(config)))
    }
}

fn root_store(roots: &Roots) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let why = |e: String| TlsError::RootCert {
                path: path.display().to_string(),
                why: e,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| why(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| why(e.to_string()))?;
            if certs.is_empty() {
                return Err(why("it holds no PEM certificate".into()));
            }
            for c in certs {
                store.add(c).map_err(|e| why(e.to_string()))?;
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
                return Err(TlsError::NoSystemRoots(if errors.is_empty() {
                    "the system's CA bundle is empty".into()
                } else {
                    errors.join("; ")
                }));
            }
        }
    }
    Ok(store)
}

/// `sslmode=require`: any certificate, but the handshake's signatures are still checked (the
/// session is encrypted to whoever holds the key of the certificate shown).
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, io::Error> {
        match self {
            Tls::Off => Ok(Connect::Off),
            // No host name: a Unix socket, where the server answers the TLS request "no"
            // (and tokio-postgres refuses TLS without a name before asking the connector).
            Tls::Rustls(_) if domain.is_empty() => Ok(Connect::Off),
            Tls::Rustls(config) => {
                let name = ServerName::try_from(domain.to_string())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                Ok(Connect::Rustls(config.clone(), name))
            }
        }
    }
}

/// One connection's handshake.
#[derive(Debug)]
pub enum Connect {
    Off,
    Rustls(Arc<ClientConfig>, ServerName<'static>),
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            match self {
                // tokio-postgres asks only when the URL's sslmode is not `disable` (which
                // `TlsParams::split` sets whenever the connector is `Off`) and the server
                // offered TLS with a host name to check (never on a Unix socket).
                Connect::Off => Err(io::Error::other("TLS is off for this connection")),
                Connect::Rustls(config, name) => {
                    let tls = tokio_rustls::TlsConnector::from(config)
                        .connect(name, stream)
                        .await?;
                    Ok(RustlsStream(Box::new(tls)))
                }
            }
        })
    }
}

/// A TLS session with the server.
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S> std::fmt::Debug for RustlsStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RustlsStream")
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_table() {
        let base = "postgres://fanout@db.internal:5432/fanout";
        // (the URL's query, the mode and the query tokio-postgres gets, or the refusal)
        type Row<'a> = (&'a str, Result<(Mode, &'a str), TlsError>);
        let rows: &[Row] = &[
            ("", Ok((Mode::Prefer, "?sslmode=prefer"))),
            (
                "?connect_timeout=3",
                Ok((Mode::Prefer, "?connect_timeout=3&sslmode=prefer")),
            ),
            ("?sslmode=disable", Ok((Mode::Off, "?sslmode=disable"))),
            ("?sslmode=prefer", Ok((Mode::Prefer, "?sslmode=prefer"))),
            ("?sslmode=require", Ok((Mode::Require, "?sslmode=require"))),
            (
                "?sslmode=verify-full&keepalives_idle=5",
                Ok((
                    Mode::VerifyFull(Roots::System),
                    "?keepalives_idle=5&sslmode=require",
                )),
            ),
            (
                "?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem",
                Ok((
                    Mode::VerifyFull(Roots::File("/etc/ca x.pem".into())),
                    "?sslmode=require",
                )),
            ),
            (
                "?sslrootcert=system&sslmode=verify-full",
                Ok((Mode::VerifyFull(Roots::System), "?sslmode=require")),
            ),
            (
                "?sslmode=verify-ca",
                Err(TlsError::Mode("verify-ca".into())),
            ),
            ("?sslmode=allow", Err(TlsError::Mode("allow".into()))),
            (
                "?sslmode=require&sslrootcert=/ca.pem",
                Err(TlsError::RootCertWithoutVerify),
            ),
        ];
        for (query, expected) in rows {
            let got = TlsParams::split(&format!("{base}{query}"));
            let expected = expected.clone().map(|(mode, q)| TlsParams {
                mode,
                url: format!("{base}{q}"),
            });
            assert_eq!(got, expected, "{query}");
        }
    }
}
