//! `fanout healthcheck`: GET the daemon's `/healthz`; exit 0 on 200 and 1 otherwise. For a
//! container's `HEALTHCHECK`, where the image (`Containerfile`) has no shell and no curl.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use clap::Args;

use super::client::ClientError;
use crate::config::DEFAULT_LISTEN;

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// Base URL of the daemon [default: http://<--listen>]
    #[arg(long, env = "FANOUT_SERVER")]
    pub server: Option<String>,
    /// Address the daemon listens on, used when --server is not given (0.0.0.0 and [::] are
    /// reached on loopback) [default: 127.0.0.1:8080]
    #[arg(long, env = "FANOUT_LISTEN")]
    pub listen: Option<String>,
}

/// `/healthz`'s URL: `server`, or the listen address with an unspecified IP read as loopback.
fn healthz_url(a: &HealthcheckArgs) -> String {
    if let Some(s) = &a.server {
        return format!("{}/healthz", s.trim_end_matches('/'));
    }
    let listen = a.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let host = match listen.parse::<SocketAddr>() {
        Ok(mut addr) if addr.ip().is_unspecified() => {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
            addr.to_string()
        }
        _ => listen.to_string(),
    };
    format!("http://{host}/healthz")
}

/// `fanout healthcheck`.
pub(super) async fn healthcheck(a: HealthcheckArgs) -> Result<(), ClientError> {
    let url = healthz_url(&a);
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| ClientError::Input(e.to_string()))?;
    let resp = http
        .get(&url)
        .send()
        .await
        .map_err(|e| ClientError::Unreachable(url.clone(), e.to_string()))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    Err(ClientError::Api {
        status: status.as_u16(),
        code: String::new(),
        message: format!("{url}: {}", resp.text().await.unwrap_or_default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_reaches_an_unspecified_listen_address_on_loopback() {
        let url = |server: Option<&str>, listen: Option<&str>| {
            healthz_url(&HealthcheckArgs {
                server: server.map(Into::into),
                listen: listen.map(Into::into),
            })
        };
        for (server, listen, want) in [
            (None, None, "http://127.0.0.1:8080/healthz"),
            (None, Some("0.0.0.0:9000"), "http://127.0.0.1:9000/healthz"),
            (None, Some("[::]:9000"), "http://[::1]:9000/healthz"),
            (None, Some("10.0.0.5:80"), "http://10.0.0.5:80/healthz"),
            (None, Some("localhost:81"), "http://localhost:81/healthz"),
            (
                Some("https://f.example/"),
                Some("0.0.0.0:1"),
                "https://f.example/healthz",
            ),
        ] {
            assert_eq!(url(server, listen), want, "{server:?} {listen:?}");
        }
    }
}
