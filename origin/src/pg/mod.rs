//! Speaking to a PostgreSQL server, for the ledger's PostgreSQL backend (`ledger/postgres/`) and
//! a producer's outbox in PostgreSQL (`outbox/postgres.rs`) alike: the URL grammar
//! ([`parse_url`], libpq's `postgres://user@host:port/dbname?…` with our keepalive and connect
//! timeout defaults) and the TLS its `sslmode` asks for ([`tls`]). It names no ledger and no
//! outbox: both turn [`UrlError`] into their own errors.

pub mod tls;

use std::str::FromStr;

/// Why a PostgreSQL URL cannot be used (never repeating its password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0}")]
    Config(String),
    #[error("TLS to PostgreSQL: {0}")]
    Tls(tls::TlsError),
}

/// TCP keepalives on every connection unless the URL sets its own (`keepalives_idle`, …): the
/// first probe after 30 s without traffic, then every 10 s, the connection given up after 3
/// unanswered. Idle connections stay open through proxies and load balancers that drop idle
/// ones silently (after minutes, for most), and a server gone is noticed within a minute
/// instead of the system's default two hours.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;
/// A connection not made within this long fails (unless the URL sets `connect_timeout`): a
/// server behind a black hole costs a pool checkout or a new listener seconds, not the
/// system's two minutes.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `url` parsed, or why not (without repeating a password), with `KEEPALIVE_IDLE`, the rest
/// and `CONNECT_TIMEOUT` where the URL leaves them to the defaults, and the TLS its
/// `sslmode` (and `sslrootcert`) ask for (`tls.rs`).
pub fn parse_url(url: &str) -> Result<(tokio_postgres::Config, tls::Mode), UrlError> {
    let params = tls::TlsParams::split(url).map_err(UrlError::Tls)?;
    let mut config = tokio_postgres::Config::from_str(&params.url).map_err(|e| {
        UrlError::Config(format!(
            "not a PostgreSQL URL like postgres://user@host:5432/dbname: {e}"
        ))
    })?;
    // tokio-postgres' default idle time is two hours; the URL's own setting is kept.
    if config.get_keepalives_idle() == tokio_postgres::Config::new().get_keepalives_idle() {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    Ok((config, params.mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Keepalives and the connect timeout: ours where the URL leaves the defaults, the URL's
    /// own where it sets them.
    #[test]
    fn urls_get_keepalives_and_a_connect_timeout_unless_they_set_their_own() {
        let s = Duration::from_secs;
        // (URL's query, keepalives on, idle, interval, retries, connect timeout)
        type Case = (&'static str, bool, Duration, Duration, u32, Duration);
        let cases: &[Case] = &[
            ("", true, s(30), s(10), 3, s(10)),
            ("?keepalives_idle=600", true, s(600), s(10), 3, s(10)),
            (
                "?keepalives_interval=2&keepalives_retries=9",
                true,
                s(30),
                s(2),
                9,
                s(10),
            ),
            ("?keepalives=0", false, s(30), s(10), 3, s(10)),
            ("?connect_timeout=3", true, s(30), s(10), 3, s(3)),
        ];
        for &(query, on, idle, interval, retries, connect) in cases {
            let (c, _) = parse_url(&format!("postgres://u@db:5432/fanout{query}")).unwrap();
            assert_eq!(
                (
                    c.get_keepalives(),
                    c.get_keepalives_idle(),
                    c.get_keepalives_interval(),
                    c.get_keepalives_retries(),
                    c.get_connect_timeout().copied()
                ),
                (on, idle, Some(interval), Some(retries), Some(connect)),
                "{query}"
            );
        }
    }
}
