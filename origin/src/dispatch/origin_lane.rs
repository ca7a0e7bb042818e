//! The origin lane: one signed POST per delivery from the daemon itself. No redirects, a
//! timeout, kept-alive connections, and an SSRF guard that resolves the host and refuses
//! private, loopback and link-local addresses (loopback only with `--allow-loopback`).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use fanout_core::endpoint::{check_url, is_forbidden_ip};
use fanout_core::retry::{parse_retry_after, result_for, Attempt};
use fanout_core::sign::{self, Secret};
use fanout_core::wire::{DeliveryResult, TransportError, RESPONSE_BODY_LIMIT};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::time::now_ms;

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
#[error("name resolution failed: {message}")]
pub struct DnsFailure {
    pub permanent: bool,
    message: String,
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
                .map_err(|e| {
                    let message = e.to_string();
                    let lower = message.to_ascii_lowercase();
                    // getaddrinfo's EAI_NONAME / EAI_NODATA: the name does not exist.
                    let permanent = lower.contains("not known")
                        || lower.contains("no address associated")
                        || lower.contains("nodename nor servname");
                    Box::new(DnsFailure { permanent, message })
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

/// The HTTP client of the origin lane.
pub fn client(allow_loopback: bool) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(std::sync::Arc::new(GuardedResolver { allow_loopback }))
        .pool_max_idle_per_host(512)
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("fanout/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Map a transport error to the core's classes by walking its causes.
pub fn classify_error(e: &reqwest::Error) -> TransportError {
    if e.is_timeout() {
        return TransportError::Timeout;
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
        let text = c.to_string().to_ascii_lowercase();
        if text.contains("certificate") || text.contains("handshake") {
            return TransportError::Tls;
        }
        if text.contains("timed out") {
            return TransportError::Timeout;
        }
        cause = c.source();
    }
    TransportError::Connect
}

/// What one delivery needs to be sent.
#[derive(Debug, Clone)]
pub struct Outgoing<'a> {
    pub delivery_id: &'a str,
    pub event_id: &'a str,
    pub url: &'a str,
    pub secrets: &'a [Secret],
    pub legacy_signature: bool,
    pub timeout_ms: u64,
}

/// Send one delivery and report it as the edge would.
pub async fn deliver(
    http: &reqwest::Client,
    s: &Outgoing<'_>,
    body: String,
    allow_loopback: bool,
) -> DeliveryResult {
    // The check parses the URL; the request reuses that parse.
    let Ok(url) = check_url(s.url, allow_loopback) else {
        return result_for(
            s.delivery_id,
            &Attempt::Transport(TransportError::RefusedUrl),
            0,
            None,
        );
    };
    let now = now_ms();
    let signed = sign::sign_headers(s.secrets, s.event_id, now.div_euclid(1000), body.as_bytes());
    let mut req = http
        .post(url)
        .timeout(Duration::from_millis(s.timeout_ms))
        .header("content-type", "application/json")
        .header(sign::HEADER_ID, signed.id)
        .header(sign::HEADER_TIMESTAMP, signed.timestamp)
        .header(sign::HEADER_SIGNATURE, signed.signature);
    if s.legacy_signature {
        if let Some(first) = s.secrets.first() {
            req = req.header(sign::HEADER_LEGACY, first.sign_legacy(body.as_bytes()));
        }
    }
    let started = Instant::now();
    let resp = match req.body(body).send().await {
        Ok(r) => r,
        Err(e) => {
            let latency = started.elapsed().as_millis() as u64;
            return result_for(
                s.delivery_id,
                &Attempt::Transport(classify_error(&e)),
                latency,
                None,
            );
        }
    };
    let status = resp.status().as_u16();
    let retry_after_ms = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, now_ms()));
    let body = read_prefix(resp).await;
    let latency = started.elapsed().as_millis() as u64;
    result_for(
        s.delivery_id,
        &Attempt::Status {
            status,
            retry_after_ms,
        },
        latency,
        Some(&body),
    )
}

/// The first [`RESPONSE_BODY_LIMIT`] bytes of a response body (lossy UTF-8); a body that fails
/// mid-way keeps what arrived.
async fn read_prefix(mut resp: reqwest::Response) -> String {
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < RESPONSE_BODY_LIMIT {
        match resp.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    buf.truncate(RESPONSE_BODY_LIMIT);
    String::from_utf8_lossy(&buf).into_owned()
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
}

#[cfg(test)]
mod resolver_tests {
    use super::*;

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
}
