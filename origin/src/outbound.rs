//! The daemon's one outbound client: every signed request it makes — a webhook on the origin
//! lane, a call to the edge, an alert to the operator — goes through [`Outbound::post_signed`]:
//! one signing path (Standard Webhooks headers over the exact body, `fanout_core::sign`), one
//! User-Agent, no redirects, no proxy, and errors classified by type ([`SendError::kind`]).
//!
//! Resolver policy: a subscriber's URL is checked by the core's endpoint policy
//! (`fanout_core::endpoint`) and its host is resolved by a guarded resolver that drops
//! forbidden addresses, so a name cannot point the daemon at a private address. The edge and
//! alert URLs come from the operator's own configuration and are trusted: they resolve
//! normally (an alert endpoint on the operator's private network is legitimate).
//!
//! This module does NOT decide what a result means (the core's retry rules do) nor retry.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fanout_core::endpoint::is_forbidden_ip;
use fanout_core::sign::{self, Keys, Secret};
use fanout_core::wire::TransportError;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::time::host_ms;

/// The User-Agent of every request the daemon makes.
pub const USER_AGENT: &str = concat!("fanout/", env!("CARGO_PKG_VERSION"));

/// May a webhook go to this resolved address?
pub fn address_allowed(ip: IpAddr, allow_loopback: bool) -> bool {
    !is_forbidden_ip(ip) || (allow_loopback && ip.is_loopback())
}

/// Every address the name resolved to was forbidden.
#[derive(Debug, thiserror::Error)]
#[error("the endpoint resolves only to private, loopback or link-local addresses")]
pub struct RefusedAddress;

/// Name resolution failed; `permanent` when the name does not exist.
#[derive(Debug, thiserror::Error)]
#[error("name resolution failed")]
pub struct DnsFailure {
    pub permanent: bool,
    #[source]
    source: std::io::Error,
}

/// A resolver that drops forbidden addresses, and fails when none is left.
#[derive(Debug, Clone)]
struct GuardedResolver {
    allow_loopback: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_loopback = self.allow_loopback;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|source| {
                    // The one place the platform gives no type: std reports getaddrinfo's
                    // failures (EAI_NONAME, EAI_AGAIN, …) as `Uncategorized` errors whose
                    // only distinction is glibc's message for the code (gai_strerror).
                    let lower = source.to_string().to_ascii_lowercase();
                    let permanent = lower.contains("not known")
                        || lower.contains("no address associated")
                        || lower.contains("nodename nor servname");
                    Box::new(DnsFailure { permanent, source })
                        as Box<dyn std::error::Error + Send + Sync>
                })?;
            let allowed: Vec<SocketAddr> = addrs
                .filter(|a| address_allowed(a.ip(), allow_loopback))
                .collect();
            if allowed.is_empty() {
                return Err(Box::new(RefusedAddress) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Whose URL a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// A subscriber's: the guarded resolver.
    Subscriber,
    /// The operator's own (edge, alerts): resolved normally.
    Operator,
}

/// What signs a request: the shared core's [`Keys`] (each secret adds a `v1,` signature, each
/// Ed25519 key a `v1a,` one, and the legacy `X-Fanout-Signature` header when asked for),
/// shared by the sends of one launch.
#[derive(Debug, Clone)]
pub struct Signer {
    keys: Arc<Keys>,
}

impl Signer {
    pub fn new(keys: Keys) -> Signer {
        Signer { keys: keys.into() }
    }

    /// One HMAC secret (the origin's calls to the edge, alerts).
    pub fn key(secret: Secret) -> Signer {
        Signer::new(Keys::hmac(vec![secret]))
    }
}

/// A request that got no HTTP answer.
#[derive(Debug, thiserror::Error)]
#[error("request failed: {}", .kind.as_str())]
pub struct SendError {
    pub kind: TransportError,
    #[source]
    source: reqwest::Error,
}

impl From<reqwest::Error> for SendError {
    fn from(source: reqwest::Error) -> SendError {
        SendError {
            kind: classify_error(&source),
            source,
        }
    }
}

/// Map a transport error to the core's classes by the types of its causes.
pub fn classify_error(e: &reqwest::Error) -> TransportError {
    if e.is_timeout() {
        return TransportError::Timeout;
    }
    if e.is_redirect() {
        return TransportError::Redirect;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<RefusedAddress>().is_some() {
            return TransportError::RefusedUrl;
        }
        if let Some(d) = c.downcast_ref::<DnsFailure>() {
            return if d.permanent {
                TransportError::Dns
            } else {
                TransportError::Connect
            };
        }
        if c.downcast_ref::<rustls::Error>().is_some() {
            return TransportError::Tls;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return TransportError::Timeout;
            }
        }
        cause = next_cause(c);
    }
    TransportError::Connect
}

/// The next cause of an error. An `io::Error` wrapping another error reports that error's own
/// source as its source, skipping the wrapped error itself: step into it instead.
fn next_cause<'a>(
    c: &'a (dyn std::error::Error + 'static),
) -> Option<&'a (dyn std::error::Error + 'static)> {
    if let Some(inner) = c
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        return Some(inner);
    }
    c.source()
}

/// The daemon's outbound client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbound {
    subscriber: reqwest::Client,
    operator: reqwest::Client,
}

fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(512)
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(USER_AGENT)
}

impl Outbound {
    pub fn new(allow_loopback: bool) -> Result<Outbound, reqwest::Error> {
        Ok(Outbound {
            subscriber: builder()
                .dns_resolver(Arc::new(GuardedResolver { allow_loopback }))
                .build()?,
            operator: builder().build()?,
        })
    }

    fn client(&self, trust: Trust) -> &reqwest::Client {
        match trust {
            Trust::Subscriber => &self.subscriber,
            Trust::Operator => &self.operator,
        }
    }

    /// POST `body` as JSON to `url`, signed by `signer` under message id `id` at the current
    /// time by the host's wall clock (its receiver compares `webhook-timestamp` with its own;
    /// the PostgreSQL server's clock, the ledger's, may be off), with the `extra` headers besides (a webhook's `webhook-sequence`), within
    /// `timeout`. Any HTTP answer is `Ok`, whatever its status.
    #[allow(clippy::too_many_arguments)] // one signing path for every kind of request
    pub async fn post_signed(
        &self,
        trust: Trust,
        url: impl reqwest::IntoUrl,
        signer: &Signer,
        id: &str,
        body: impl Into<Vec<u8>>,
        extra: &[(&'static str, String)],
        timeout: Duration,
    ) -> Result<reqwest::Response, SendError> {
        let body: Vec<u8> = body.into();
        let signed = sign::sign_headers(&signer.keys, id, host_ms().div_euclid(1000), &body);
        let mut req = self
            .client(trust)
            .post(url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(sign::HEADER_ID, signed.id)
            .header(sign::HEADER_TIMESTAMP, signed.timestamp)
            .header(sign::HEADER_SIGNATURE, signed.signature);
        if let Some(legacy) = signer.keys.legacy_header(&body) {
            req = req.header(sign::HEADER_LEGACY, legacy);
        }
        for (name, value) in extra {
            req = req.header(*name, value);
        }
        let resp = req.body(body).send().await?;
        note_date(&resp);
        Ok(resp)
    }
}

/// Note an answer's `Date` against the host's clock (`crate::time::note_peer_date`: the third
/// clock that tells whether the host's or the PostgreSQL server's is off).
fn note_date(resp: &reqwest::Response) {
    let date = resp
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    if let Some(d) = date {
        crate::time::note_peer_date(d.as_millis() as i64, host_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_policy_table() {
        let cases: &[(&str, bool, bool)] = &[
            ("93.184.216.34", false, true),
            ("127.0.0.1", false, false),
            ("127.0.0.1", true, true),
            ("::1", true, true),
            ("10.0.0.1", true, false),
            ("169.254.169.254", true, false),
            ("192.168.0.10", false, false),
            ("fe80::1", true, false),
            ("2606:4700::1", false, true),
        ];
        for &(ip, allow, expected) in cases {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(
                address_allowed(ip, allow),
                expected,
                "{ip} allow_loopback={allow}"
            );
        }
    }

    /// The guard resolves for real: `localhost` comes back only when loopback is allowed.
    #[tokio::test]
    async fn resolver_refuses_loopback_names_unless_allowed() {
        let name = || -> Name { "localhost".parse().unwrap() };
        let refused = GuardedResolver {
            allow_loopback: false,
        }
        .resolve(name())
        .await;
        let err = refused.err().expect("localhost must be refused");
        assert!(err.downcast_ref::<RefusedAddress>().is_some(), "{err}");
        let allowed = GuardedResolver {
            allow_loopback: true,
        }
        .resolve(name())
        .await
        .unwrap();
        assert!(allowed.into_iter().all(|a| a.ip().is_loopback()));
    }

    /// Errors of real requests, classified by type: a refused connection, a timeout, a TLS
    /// handshake with a server that speaks plain HTTP, a name that resolves only to loopback.
    #[tokio::test]
    async fn real_failures_are_classified_by_type() {
        let out = Outbound::new(false).unwrap();
        let signer = Signer::new(Keys::default());
        // A port nobody listens on: bind, note it, close.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        // A server that accepts and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        // A server that answers anything with plain HTTP (so a TLS handshake fails).
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain_addr = plain.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut s, _)) = plain.accept().await {
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let cases: Vec<(String, Trust, TransportError)> = vec![
            (
                format!("http://{closed}/"),
                Trust::Operator,
                TransportError::Connect,
            ),
            (
                format!("http://{silent_addr}/"),
                Trust::Operator,
                TransportError::Timeout,
            ),
            (
                format!("https://{plain_addr}/"),
                Trust::Operator,
                TransportError::Tls,
            ),
            (
                format!("http://localhost:{}/", closed.port()),
                Trust::Subscriber,
                TransportError::RefusedUrl,
            ),
        ];
        for (url, trust, expected) in cases {
            let err = out
                .post_signed(
                    trust,
                    url.as_str(),
                    &signer,
                    "msg_1",
                    "{}",
                    &[],
                    Duration::from_millis(300),
                )
                .await
                .expect_err(&url);
            assert_eq!(err.kind, expected, "{url}: {err:?}");
        }
    }
}
