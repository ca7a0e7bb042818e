//! Configuration, layered: built-in defaults < config file < `FANOUT_*` environment < flags
//! (clap merges the last two). Validated once, at start-up, with messages that say what to fix.

use fanout_core::breaker::{self, BreakerConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fanout_core::sign::Secret;
use serde::Deserialize;

use crate::alert::rules::{DEFAULT_DEAD_THRESHOLD, DEFAULT_DISABLE_AFTER_MS};
use crate::alert::{AlertRules, AlertTarget};
use crate::duration::parse_duration;
use crate::payload::EventUrl;
use crate::retention::{Retention, DEFAULT_RETAIN_DEAD_MS, DEFAULT_RETAIN_SENT_MS};
use crate::server::{ServerLimits, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS};

pub const DEFAULT_DB: &str = "./fanout.db";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;
pub const DEFAULT_ROTATION_GRACE_SECS: u64 = 24 * 3600;
pub const DEFAULT_EDGE_BATCH: usize = 100;
pub const DEFAULT_MAX_TOTAL_IN_FLIGHT: usize = 4096;
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Every setting, each optional: one layer (file, or flags and environment).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The ledger: a SQLite file (a path or sqlite:PATH), or a PostgreSQL database
    /// (postgres://user@host:port/dbname) [default: ./fanout.db]
    #[arg(long, env = "FANOUT_DB")]
    pub db: Option<PathBuf>,
    /// Address of the HTTP API [default: 127.0.0.1:8080]
    #[arg(long, env = "FANOUT_LISTEN")]
    pub listen: Option<String>,
    /// Base URL of the edge Worker; without it everything goes by the origin lane
    /// [default: none]
    #[arg(long, env = "FANOUT_EDGE_URL")]
    pub edge_url: Option<String>,
    /// The edge's EDGE_SIGNING_KEY (a whsec_ secret) that signs every call to it; required
    /// with --edge-url [default: none]
    #[arg(long, env = "FANOUT_EDGE_KEY")]
    pub edge_key: Option<String>,
    /// Bearer token that producer and admin calls must carry (required) [default: none]
    #[arg(long, env = "FANOUT_API_TOKEN")]
    pub api_token: Option<String>,
    /// Let subscribers use http://127.0.0.1 and http://localhost endpoints (development, tests)
    /// [default: false]
    #[arg(long, env = "FANOUT_ALLOW_LOOPBACK", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_loopback: Option<bool>,
    /// Attempts before a delivery is dead [default: 8]
    #[arg(long, env = "FANOUT_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// Multiplies retry backoff delays (not Retry-After); below 1 for tests [default: 1]
    #[arg(long, env = "FANOUT_BACKOFF_SCALE")]
    pub backoff_scale: Option<f64>,
    /// Largest event accepted, in bytes [default: 65536]
    #[arg(long, env = "FANOUT_MAX_EVENT_BYTES")]
    pub max_event_bytes: Option<usize>,
    /// How long a rotated-out secret keeps signing, in seconds [default: 86400]
    #[arg(long, env = "FANOUT_ROTATION_GRACE_SECS")]
    pub rotation_grace_secs: Option<u64>,
    /// Deliveries per edge call (at most 500) [default: 100]
    #[arg(long, env = "FANOUT_EDGE_BATCH")]
    pub edge_batch: Option<usize>,
    /// Most deliveries in flight across all subscribers [default: 4096]
    #[arg(long, env = "FANOUT_MAX_TOTAL_IN_FLIGHT")]
    pub max_total_in_flight: Option<usize>,
    /// Consecutive failed attempts that open a subscriber's breaker (a 429 or 503 with
    /// Retry-After is not one) [default: 20]
    #[arg(long, env = "FANOUT_BREAKER_THRESHOLD")]
    pub breaker_threshold: Option<u32>,
    /// How long an open breaker holds before one probe goes: 30s, 2m [default: 30s]
    #[arg(long, env = "FANOUT_BREAKER_COOLDOWN")]
    pub breaker_cooldown: Option<String>,
    /// Operator endpoint for alerts (breaker opened, dead threshold crossed, subscriber
    /// disabled), sent signed; without it alerts are only logged [default: none]
    #[arg(long, env = "FANOUT_ALERT_URL")]
    pub alert_url: Option<String>,
    /// The whsec_ secret that signs alerts (Standard Webhooks headers); required with
    /// --alert-url [default: none]
    #[arg(long, env = "FANOUT_ALERT_SECRET")]
    pub alert_secret: Option<String>,
    /// Alert when this many of a subscriber's deliveries are dead [default: 100]
    #[arg(long, env = "FANOUT_DEAD_ALERT_THRESHOLD")]
    pub dead_alert_threshold: Option<u64>,
    /// Disable a subscriber whose attempts have all failed for this long: 5d, 12h, 30s, or
    /// "never" [default: 5d]
    #[arg(long, env = "FANOUT_DISABLE_AFTER")]
    pub disable_after: Option<String>,
    /// How long sent deliveries (with their attempts) are kept: 90s, 12h, 7d, or "forever"
    /// [default: 7d]
    #[arg(long, env = "FANOUT_RETAIN_SENT")]
    pub retain_sent: Option<String>,
    /// How long dead deliveries (with their attempts) are kept for replay: 90s, 12h, 30d, or
    /// "forever" [default: 30d]
    #[arg(long, env = "FANOUT_RETAIN_DEAD")]
    pub retain_dead: Option<String>,
    /// Cap on the ledger's size, like 500MiB or 20GiB: past it ingest answers 503 `unavailable`
    /// (as on a full disk) until there is room [default: no cap]
    #[arg(long, env = "FANOUT_MAX_DB_SIZE")]
    pub max_db_size: Option<String>,
    /// Close a connection that has not sent a whole request head within this long, like 10s
    /// [default: 10s]
    #[arg(long, env = "FANOUT_HEADER_TIMEOUT")]
    pub header_timeout: Option<String>,
    /// Answer 408 to a request whose body has not arrived within this long, and close a
    /// connection whose client has read nothing of an answer for this long [default: 30s]
    #[arg(long, env = "FANOUT_BODY_TIMEOUT")]
    pub body_timeout: Option<String>,
    /// Most connections served at once; past it 16 more answer /healthz only (anything else
    /// 503 with Retry-After), then new ones wait [default: 4096]
    #[arg(long, env = "FANOUT_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Origins allowed to frame the customer portal, comma-separated
    /// (https://app.example.com); without it nobody may frame it [default: none]
    #[arg(long, env = "FANOUT_PORTAL_FRAME_ANCESTORS", value_delimiter = ',')]
    pub portal_frame_ancestors: Option<Vec<String>>,
    /// A producer's outbox to move into the ledger: postgres://user@host:port/dbname or a
    /// SQLite file (`fanout outbox init` creates its table) [default: none]
    #[arg(long, env = "FANOUT_OUTBOX")]
    pub outbox: Option<String>,
    /// The outbox's table [default: fanout_outbox]
    #[arg(long, env = "FANOUT_OUTBOX_TABLE")]
    pub outbox_table: Option<String>,
    /// How often the outbox is read when nothing wakes the daemon sooner (PostgreSQL wakes it
    /// by NOTIFY): 1s, 50ms [default: 1s on PostgreSQL, 20ms on SQLite]
    #[arg(long, env = "FANOUT_OUTBOX_POLL")]
    pub outbox_poll: Option<String>,
    /// Where a thin webhook says its event can be fetched: a URL template with {id}
    /// (https://api.example.com/events/{id}), sent as the thin body's "url" [default: none]
    #[arg(long, env = "FANOUT_EVENT_URL")]
    pub event_url: Option<String>,
    /// The address people reach this daemon at (https://fanout.example.com): portal links are
    /// built from it, never from a request's Host [default: http:// and the address it listens
    /// on, 0.0.0.0 and [::] as 127.0.0.1]
    #[arg(long, env = "FANOUT_PUBLIC_URL")]
    pub public_url: Option<String>,
}

impl Settings {
    /// `self` over `lower`: each setting from `self` when present.
    pub fn over(self, lower: Settings) -> Settings {
        Settings {
            db: self.db.or(lower.db),
            listen: self.listen.or(lower.listen),
            edge_url: self.edge_url.or(lower.edge_url),
            edge_key: self.edge_key.or(lower.edge_key),
            api_token: self.api_token.or(lower.api_token),
            allow_loopback: self.allow_loopback.or(lower.allow_loopback),
            max_attempts: self.max_attempts.or(lower.max_attempts),
            backoff_scale: self.backoff_scale.or(lower.backoff_scale),
            max_event_bytes: self.max_event_bytes.or(lower.max_event_bytes),
            rotation_grace_secs: self.rotation_grace_secs.or(lower.rotation_grace_secs),
            edge_batch: self.edge_batch.or(lower.edge_batch),
            max_total_in_flight: self.max_total_in_flight.or(lower.max_total_in_flight),
            breaker_threshold: self.breaker_threshold.or(lower.breaker_threshold),
            breaker_cooldown: self.breaker_cooldown.or(lower.breaker_cooldown),
            alert_url: self.alert_url.or(lower.alert_url),
            alert_secret: self.alert_secret.or(lower.alert_secret),
            dead_alert_threshold: self.dead_alert_threshold.or(lower.dead_alert_threshold),
            disable_after: self.disable_after.or(lower.disable_after),
            retain_sent: self.retain_sent.or(lower.retain_sent),
            retain_dead: self.retain_dead.or(lower.retain_dead),
            max_db_size: self.max_db_size.or(lower.max_db_size),
            header_timeout: self.header_timeout.or(lower.header_timeout),
            body_timeout: self.body_timeout.or(lower.body_timeout),
            max_connections: self.max_connections.or(lower.max_connections),
            portal_frame_ancestors: self.portal_frame_ancestors.or(lower.portal_frame_ancestors),
            outbox: self.outbox.or(lower.outbox),
            outbox_table: self.outbox_table.or(lower.outbox_table),
            outbox_poll: self.outbox_poll.or(lower.outbox_poll),
            event_url: self.event_url.or(lower.event_url),
            public_url: self.public_url.or(lower.public_url),
        }
    }

    /// Read a TOML config file with the same names as the flags (`edge_url = "…"`).
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config file {}: {e}", path.display())))?;
        toml::from_str(&text)
            .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// Where the ledger lives (`--db`).
#[derive(Clone, PartialEq, Eq)]
pub enum LedgerLocation {
    /// The embedded SQLite ledger in this file (one owning daemon).
    Sqlite(PathBuf),
    /// A PostgreSQL database several daemons may share: its connection URL.
    Postgres(String),
}

impl LedgerLocation {
    /// `postgres://…` or `postgresql://…` is PostgreSQL; `sqlite:PATH` or a plain path is SQLite;
    /// any other `scheme://` is refused rather than taken for a file name.
    pub fn parse(text: &Path) -> Result<LedgerLocation, ConfigError> {
        let Some(t) = text.to_str() else {
            return Ok(LedgerLocation::Sqlite(text.to_path_buf()));
        };
        if t.starts_with("postgres://") || t.starts_with("postgresql://") {
            crate::pg::parse_url(t).map_err(|e| ConfigError(format!("--db: {e}")))?;
            return Ok(LedgerLocation::Postgres(t.to_string()));
        }
        if let Some(path) = t.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(ConfigError("--db sqlite: needs a file path".into()));
            }
            return Ok(LedgerLocation::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = t.split_once("://") {
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+')
            {
                return Err(ConfigError(format!(
                    "--db {scheme}://… is not a ledger: use a file path, sqlite:PATH or \
                     postgres://user@host:port/dbname"
                )));
            }
        }
        Ok(LedgerLocation::Sqlite(PathBuf::from(t)))
    }

    /// For logs and messages: the path, or the URL without its password.
    pub fn redacted(&self) -> String {
        match self {
            LedgerLocation::Sqlite(p) => p.display().to_string(),
            LedgerLocation::Postgres(u) => crate::redact::database_url(u),
        }
    }
}

impl std::fmt::Debug for LedgerLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerLocation::Sqlite(_) => write!(f, "Sqlite({})", self.redacted()),
            LedgerLocation::Postgres(_) => write!(f, "Postgres({})", self.redacted()),
        }
    }
}

/// The validated configuration of `fanout serve`.
#[derive(Debug, Clone)]
pub struct Config {
    pub db: LedgerLocation,
    pub listen: SocketAddr,
    pub edge: Option<(String, Secret)>,
    pub api_token: String,
    pub allow_loopback: bool,
    pub max_attempts: u32,
    pub backoff_scale: f64,
    pub max_event_bytes: usize,
    pub rotation_grace_secs: u64,
    pub edge_batch: usize,
    pub max_total_in_flight: usize,
    /// When a subscriber's breaker opens and how long it holds.
    pub breaker: BreakerConfig,
    /// Where alerts are sent, if anywhere.
    pub alert: Option<AlertTarget>,
    pub alert_rules: AlertRules,
    /// How long finished deliveries are kept.
    pub retention: Retention,
    /// The ledger's size cap (`--max-db-size`), if any.
    pub max_db_bytes: Option<u64>,
    pub server_limits: ServerLimits,
    pub body_timeout: Duration,
    /// The portal's CSP `frame-ancestors` source list (`'none'` unless configured).
    pub portal_frame_ancestors: String,
    /// The producer's outbox this daemon reads (`--outbox`), if any.
    pub outbox: Option<crate::outbox::OutboxConfig>,
    /// `--event-url`: the `url` of thin webhooks, if any.
    pub event_url: Option<EventUrl>,
    /// `--public-url`, without a trailing `/`, if given (`public_url`).
    pub public_url: Option<String>,
}

/// What portal links are built from without `--public-url`: `http://` and the address the
/// daemon listens on, an unspecified one (0.0.0.0, [::]) as loopback (pure).
pub fn default_public_url(local: SocketAddr) -> String {
    let ip = match local.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, local.port()))
}

/// `--public-url`: an http(s) URL with a host and no query, fragment or credentials; kept
/// without its trailing `/`. Without it, a daemon listening beyond loopback is warned that its
/// portal links name its listen address.
fn public_url(
    given: Option<String>,
    listen: SocketAddr,
    warnings: &mut Vec<String>,
) -> Result<Option<String>, ConfigError> {
    let Some(text) = given else {
        if !listen.ip().is_loopback() {
            warnings.push(format!(
                "--public-url is not set: portal links name http://{listen}; set it to the \
                 address people reach this daemon at"
            ));
        }
        return Ok(None);
    };
    let bad = |why: &str| ConfigError(format!("--public-url {text:?}: {why}"));
    let u = url::Url::parse(&text).map_err(|e| bad(&e.to_string()))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(bad("must be an http:// or https:// URL with a host"));
    }
    if u.query().is_some()
        || u.fragment().is_some()
        || !u.username().is_empty()
        || u.password().is_some()
    {
        return Err(bad("must have no query, fragment or credentials"));
    }
    Ok(Some(u.as_str().trim_end_matches('/').to_string()))
}

/// `--outbox` with `--outbox-table` and `--outbox-poll` (10ms to 1h).
fn outbox_settings(
    at: Option<String>,
    table: Option<String>,
    poll: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<Option<crate::outbox::OutboxConfig>, ConfigError> {
    let Some(at) = at.filter(|a| !a.trim().is_empty()) else {
        if table.is_some() || poll.is_some() {
            warnings.push("--outbox-table or --outbox-poll is set without --outbox".into());
        }
        return Ok(None);
    };
    let poll = poll
        .map(|p| duration_setting("outbox-poll", Some(p), Duration::ZERO, 10))
        .transpose()?;
    if poll.is_some_and(|d| d > Duration::from_secs(3600)) {
        return Err(ConfigError("--outbox-poll must be at most 1h".into()));
    }
    crate::outbox::OutboxConfig::new(&at, table, poll)
        .map(Some)
        .map_err(|e| ConfigError(format!("--outbox: {e}")))
}

/// Bytes in a size like `500MiB`, `20GiB`, `64KiB` or `4096` (units are powers of 1024; `KB`,
/// `MB`, `GB`, `TB` and single letters mean the same).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// A duration setting of at least `min_ms`, or the default.
fn duration_setting(
    name: &str,
    value: Option<&str>,
    default: Duration,
    min_ms: i64,
) -> Result<Duration, ConfigError> {
    match value.map(str::trim) {
        None => Ok(default),
        Some(text) => match parse_duration(text) {
            Some(ms) if ms >= min_ms => Ok(Duration::from_millis(ms as u64)),
            _ => Err(ConfigError(format!(
                "--{name} {text:?} is not a duration of at least {min_ms}ms like 10s or 1m"
            ))),
        },
    }
}

/// `--breaker-threshold` (1 to 1000) and `--breaker-cooldown` (1s to 1h), or their defaults.
fn breaker_settings(
    threshold: Option<u32>,
    cooldown: Option<&str>,
) -> Result<BreakerConfig, ConfigError> {
    let default = BreakerConfig::default();
    let threshold = threshold.unwrap_or(default.threshold);
    if !(1..=breaker::MAX_THRESHOLD).contains(&threshold) {
        return Err(ConfigError(format!(
            "--breaker-threshold must be 1 to {}, not {threshold}",
            breaker::MAX_THRESHOLD
        )));
    }
    let cooldown = duration_setting(
        "breaker-cooldown",
        cooldown,
        Duration::from_millis(default.cooldown_ms as u64),
        breaker::MIN_COOLDOWN_MS,
    )?;
    if cooldown > Duration::from_millis(breaker::MAX_COOLDOWN_MS as u64) {
        return Err(ConfigError(format!(
            "--breaker-cooldown must be at most 1h, not {}s",
            cooldown.as_secs()
        )));
    }
    Ok(BreakerConfig {
        threshold,
        cooldown_ms: cooldown.as_millis() as i64,
    })
}

/// A duration setting that may be turned off: `default_ms` when not set, `None` for one of
/// `off` (`never`, `forever`), else a duration of at least 1s.
fn optional_duration(
    flag: &str,
    text: Option<&str>,
    default_ms: i64,
    off: &[&str],
    like: &str,
) -> Result<Option<i64>, ConfigError> {
    match text.map(str::trim) {
        None => Ok(Some(default_ms)),
        Some(t) if off.contains(&t) => Ok(None),
        Some(t) => match parse_duration(t) {
            Some(ms) if ms >= 1000 => Ok(Some(ms)),
            _ => Err(ConfigError(format!(
                "--{flag} {t:?} is not a duration of at least 1s like {like} (or \"{}\")",
                off.first().copied().unwrap_or("never")
            ))),
        },
    }
}

/// `--listen` and `--api-token` (required; a short one beyond loopback is warned about).
fn listen_and_token(
    listen: Option<String>,
    api_token: Option<String>,
    warnings: &mut Vec<String>,
) -> Result<(SocketAddr, String), ConfigError> {
    let listen_text = listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let Ok(listen) = listen_text.parse::<SocketAddr>() else {
        return Err(ConfigError(format!(
            "--listen {listen_text:?} is not an address like 127.0.0.1:8080"
        )));
    };
    let Some(api_token) = api_token.filter(|t| !t.trim().is_empty()) else {
        return Err(ConfigError(
            "an API token is required: set --api-token or FANOUT_API_TOKEN".into(),
        ));
    };
    if api_token.len() < 16 && !listen.ip().is_loopback() {
        warnings.push(
            "the API token is shorter than 16 characters and the API listens beyond loopback"
                .into(),
        );
    }
    Ok((listen, api_token))
}

/// `--edge-url` with its `--edge-key`: the edge lane, or none.
fn edge_target(
    url: Option<String>,
    key: Option<String>,
    warnings: &mut Vec<String>,
) -> Result<Option<(String, Secret)>, ConfigError> {
    match (url.filter(|u| !u.is_empty()), key.filter(|k| !k.is_empty())) {
        (None, None) => Ok(None),
        (None, Some(_)) => {
            warnings.push("--edge-key is set without --edge-url: the edge lane is off".into());
            Ok(None)
        }
        (Some(_), None) => Err(ConfigError(
            "--edge-url needs --edge-key (the edge's EDGE_SIGNING_KEY, whsec_…)".into(),
        )),
        (Some(url), Some(key)) => {
            match url::Url::parse(&url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
                    if u.scheme() == "http"
                        && !matches!(u.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"))
                    {
                        warnings.push(format!(
                            "the edge URL {} is plain http beyond loopback",
                            crate::redact::url(&url)
                        ));
                    }
                }
                _ => {
                    return Err(ConfigError(format!(
                        "--edge-url {} is not an http(s) URL",
                        crate::redact::url(&url)
                    )))
                }
            }
            let key = Secret::parse(&key).map_err(|e| ConfigError(format!("--edge-key: {e}")))?;
            Ok(Some((url, key)))
        }
    }
}

/// `--max-attempts` (1 to 100) and `--backoff-scale` (above 0, at most 100; below 1 warned).
fn retry_settings(
    max_attempts: Option<u32>,
    backoff_scale: Option<f64>,
    warnings: &mut Vec<String>,
) -> Result<(u32, f64), ConfigError> {
    let max_attempts = max_attempts.unwrap_or(fanout_core::retry::DEFAULT_MAX_ATTEMPTS);
    if !(1..=100).contains(&max_attempts) {
        return Err(ConfigError(format!(
            "--max-attempts must be 1 to 100, not {max_attempts}"
        )));
    }
    let backoff_scale = backoff_scale.unwrap_or(1.0);
    if !(backoff_scale.is_finite() && backoff_scale > 0.0 && backoff_scale <= 100.0) {
        return Err(ConfigError(format!(
            "--backoff-scale must be above 0 and at most 100, not {backoff_scale}"
        )));
    }
    if backoff_scale < 1.0 {
        warnings.push(format!(
            "--backoff-scale {backoff_scale}: retries come faster than the default schedule"
        ));
    }
    Ok((max_attempts, backoff_scale))
}

/// `--max-event-bytes`, `--edge-batch` and `--max-total-in-flight` within their bounds.
fn size_settings(
    max_event_bytes: Option<usize>,
    edge_batch: Option<usize>,
    max_total_in_flight: Option<usize>,
) -> Result<(usize, usize, usize), ConfigError> {
    let max_event_bytes = max_event_bytes.unwrap_or(DEFAULT_MAX_EVENT_BYTES);
    if !(1024..=fanout_core::wire::MAX_BODY_BYTES).contains(&max_event_bytes) {
        return Err(ConfigError(format!(
            "--max-event-bytes must be 1024 to {} (the edge's limit), not {max_event_bytes}",
            fanout_core::wire::MAX_BODY_BYTES
        )));
    }
    let edge_batch = edge_batch.unwrap_or(DEFAULT_EDGE_BATCH);
    if !(1..=fanout_core::wire::MAX_BATCH).contains(&edge_batch) {
        return Err(ConfigError(format!(
            "--edge-batch must be 1 to {}, not {edge_batch}",
            fanout_core::wire::MAX_BATCH
        )));
    }
    let max_total_in_flight = max_total_in_flight.unwrap_or(DEFAULT_MAX_TOTAL_IN_FLIGHT);
    if max_total_in_flight == 0 {
        return Err(ConfigError(
            "--max-total-in-flight must be at least 1".into(),
        ));
    }
    Ok((max_event_bytes, edge_batch, max_total_in_flight))
}

/// `--alert-url` with its `--alert-secret`: where alerts go, or nowhere (logged only).
fn alert_target(
    url: Option<String>,
    secret: Option<String>,
    warnings: &mut Vec<String>,
) -> Result<Option<AlertTarget>, ConfigError> {
    match (
        url.filter(|u| !u.is_empty()),
        secret.filter(|k| !k.is_empty()),
    ) {
        (None, None) => Ok(None),
        (None, Some(_)) => {
            warnings
                .push("--alert-secret is set without --alert-url: alerts are only logged".into());
            Ok(None)
        }
        (Some(_), None) => Err(ConfigError(
            "--alert-url needs --alert-secret (a whsec_ secret the operator's endpoint verifies)"
                .into(),
        )),
        (Some(url), Some(secret)) => {
            match url::Url::parse(&url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => {
                    return Err(ConfigError(format!(
                        "--alert-url {} is not an http(s) URL",
                        crate::redact::url(&url)
                    )))
                }
            }
            let secret =
                Secret::parse(&secret).map_err(|e| ConfigError(format!("--alert-secret: {e}")))?;
            Ok(Some(AlertTarget { url, secret }))
        }
    }
}

/// `--dead-alert-threshold` (at least 1) and `--disable-after` (at least 1s, or `never`).
fn alert_rules(
    dead_threshold: Option<u64>,
    disable_after: Option<&str>,
) -> Result<AlertRules, ConfigError> {
    let dead_threshold = dead_threshold.unwrap_or(DEFAULT_DEAD_THRESHOLD);
    if dead_threshold == 0 {
        return Err(ConfigError(
            "--dead-alert-threshold must be at least 1".into(),
        ));
    }
    let disable_after_ms = optional_duration(
        "disable-after",
        disable_after,
        DEFAULT_DISABLE_AFTER_MS,
        &["never", "off"],
        "5d, 12h, 30s",
    )?;
    Ok(AlertRules {
        dead_threshold,
        disable_after_ms,
    })
}

/// `--retain-sent` and `--retain-dead` (at least 1s, or `forever`).
fn retention_settings(
    sent: Option<&str>,
    dead: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<Retention, ConfigError> {
    let window = |flag: &str, text: Option<&str>, default_ms: i64| {
        optional_duration(flag, text, default_ms, &["forever"], "90s, 12h, 7d")
    };
    let retention = Retention {
        sent_ms: window("retain-sent", sent, DEFAULT_RETAIN_SENT_MS)?,
        dead_ms: window("retain-dead", dead, DEFAULT_RETAIN_DEAD_MS)?,
    };
    if let (Some(sent), Some(dead)) = (retention.sent_ms, retention.dead_ms) {
        if dead < sent {
            warnings.push(
                "--retain-dead is shorter than --retain-sent: dead deliveries, which may \
                 still be replayed, go first"
                    .into(),
            );
        }
    }
    Ok(retention)
}

/// `--max-db-size`: a cap of at least 64KiB (a few pages beyond a new ledger's), or none.
fn max_db_size(text: Option<&str>) -> Result<Option<u64>, ConfigError> {
    const MIN_DB_SIZE: u64 = 64 * 1024;
    match text {
        None => Ok(None),
        Some(text) => match parse_size(text) {
            Some(n) if n >= MIN_DB_SIZE => Ok(Some(n)),
            _ => Err(ConfigError(format!(
                "--max-db-size {text:?} is not a size of at least 64KiB like 500MiB or 20GiB"
            ))),
        },
    }
}

/// `--header-timeout`, `--body-timeout` (each at least 100ms) and `--max-connections`.
fn server_limits(
    header_timeout: Option<&str>,
    body_timeout: Option<&str>,
    max_connections: Option<usize>,
) -> Result<ServerLimits, ConfigError> {
    let header_timeout = duration_setting(
        "header-timeout",
        header_timeout,
        DEFAULT_HEADER_TIMEOUT,
        100,
    )?;
    let body_timeout = duration_setting("body-timeout", body_timeout, DEFAULT_BODY_TIMEOUT, 100)?;
    let max_connections = max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    if max_connections == 0 {
        return Err(ConfigError("--max-connections must be at least 1".into()));
    }
    Ok(ServerLimits {
        header_timeout,
        max_connections,
        write_timeout: body_timeout,
    })
}

/// `--portal-frame-ancestors` as a CSP source list; a plain-http origin is warned about.
fn portal_ancestors(
    origins: Option<Vec<String>>,
    warnings: &mut Vec<String>,
) -> Result<String, ConfigError> {
    let ancestors =
        crate::portal::frame_ancestors(&origins.unwrap_or_default()).map_err(ConfigError)?;
    if ancestors.split(' ').any(|o| o.starts_with("http://")) {
        warnings.push(
            "--portal-frame-ancestors lists a plain-http origin: a portal link framed there \
             travels unencrypted"
                .into(),
        );
    }
    Ok(ancestors)
}

impl Config {
    /// Validate merged settings; also returns warnings about risky combinations.
    pub fn from_settings(s: Settings) -> Result<(Config, Vec<String>), ConfigError> {
        let mut warnings = Vec::new();
        let db = LedgerLocation::parse(s.db.as_deref().unwrap_or_else(|| Path::new(DEFAULT_DB)))?;
        let (listen, api_token) = listen_and_token(s.listen, s.api_token, &mut warnings)?;
        let edge = edge_target(s.edge_url, s.edge_key, &mut warnings)?;
        let allow_loopback = s.allow_loopback.unwrap_or(false);
        if allow_loopback {
            warnings.push("--allow-loopback is on: for development and tests only".into());
        }
        let (max_attempts, backoff_scale) =
            retry_settings(s.max_attempts, s.backoff_scale, &mut warnings)?;
        let (max_event_bytes, edge_batch, max_total_in_flight) =
            size_settings(s.max_event_bytes, s.edge_batch, s.max_total_in_flight)?;
        let breaker = breaker_settings(s.breaker_threshold, s.breaker_cooldown.as_deref())?;
        let alert = alert_target(s.alert_url, s.alert_secret, &mut warnings)?;
        let alert_rules = alert_rules(s.dead_alert_threshold, s.disable_after.as_deref())?;
        let retention = retention_settings(
            s.retain_sent.as_deref(),
            s.retain_dead.as_deref(),
            &mut warnings,
        )?;
        let max_db_bytes = max_db_size(s.max_db_size.as_deref())?;
        let server_limits = server_limits(
            s.header_timeout.as_deref(),
            s.body_timeout.as_deref(),
            s.max_connections,
        )?;
        let portal_frame_ancestors = portal_ancestors(s.portal_frame_ancestors, &mut warnings)?;
        let outbox = outbox_settings(
            s.outbox,
            s.outbox_table,
            s.outbox_poll.as_deref(),
            &mut warnings,
        )?;
        let event_url = s
            .event_url
            .as_deref()
            .map(EventUrl::parse)
            .transpose()
            .map_err(ConfigError)?;
        let public_url = public_url(s.public_url, listen, &mut warnings)?;
        let config = Config {
            db,
            max_db_bytes,
            body_timeout: server_limits.write_timeout,
            server_limits,
            listen,
            edge,
            api_token,
            allow_loopback,
            max_attempts,
            backoff_scale,
            max_event_bytes,
            rotation_grace_secs: s.rotation_grace_secs.unwrap_or(DEFAULT_ROTATION_GRACE_SECS),
            edge_batch,
            max_total_in_flight,
            breaker,
            alert,
            alert_rules,
            retention,
            portal_frame_ancestors,
            outbox,
            event_url,
            public_url,
        };
        Ok((config, warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Settings {
        Settings {
            api_token: Some("token-token-token".into()),
            ..Default::default()
        }
    }

    #[test]
    fn layering() {
        let file = Settings {
            db: Some("file.db".into()),
            listen: Some("127.0.0.1:1".into()),
            ..Default::default()
        };
        let flags = Settings {
            listen: Some("127.0.0.1:2".into()),
            ..Default::default()
        };
        let merged = flags.over(file);
        assert_eq!(merged.db, Some(PathBuf::from("file.db")));
        assert_eq!(merged.listen.as_deref(), Some("127.0.0.1:2"));
        let parsed: Settings =
            toml::from_str("db = \"x.db\"\nallow_loopback = true\nmax_attempts = 3\n").unwrap();
        assert_eq!(
            (parsed.allow_loopback, parsed.max_attempts),
            (Some(true), Some(3))
        );
        assert!(toml::from_str::<Settings>("colour = \"blue\"").is_err());
        // The shipped example, uncommented, is a valid configuration.
        let example: String = include_str!("../fanout.example.toml")
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|l| l.contains(" = "))
                    .unwrap_or("")
            })
            .map(|l| l.split("  #").next().unwrap_or(l).trim().to_string() + "\n")
            .collect();
        let parsed: Settings = toml::from_str(&example).unwrap();
        assert_eq!(parsed.max_attempts, Some(8));
        assert_eq!(parsed.edge_url.as_deref(), Some("http://127.0.0.1:8787"));
        assert_eq!(parsed.max_db_size.as_deref(), Some("20GiB"));
        assert_eq!(
            parsed.event_url.as_deref(),
            Some("https://api.example.com/events/{id}")
        );
        assert_eq!(
            parsed.portal_frame_ancestors,
            Some(vec!["https://app.example.com".to_string()])
        );
    }

    #[test]
    fn public_url_is_validated() {
        let with = |v: Option<&str>, listen: &str| {
            Config::from_settings(Settings {
                public_url: v.map(Into::into),
                listen: Some(listen.into()),
                ..base()
            })
            .map(|(c, w)| (c.public_url, w.iter().any(|w| w.contains("--public-url"))))
            .map_err(|e| e.0)
        };
        let local = "127.0.0.1:8080";
        assert_eq!(with(None, local), Ok((None, false)));
        assert_eq!(with(None, "0.0.0.0:8080"), Ok((None, true)));
        for (given, kept) in [
            ("https://fanout.example.com/", "https://fanout.example.com"),
            ("http://10.0.0.5:8080", "http://10.0.0.5:8080"),
            ("https://example.com/fanout/", "https://example.com/fanout"),
        ] {
            assert_eq!(
                with(Some(given), "0.0.0.0:8080"),
                Ok((Some(kept.into()), false))
            );
        }
        assert_eq!(
            default_public_url("0.0.0.0:8080".parse().unwrap()),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            default_public_url("[::]:80".parse().unwrap()),
            "http://[::1]:80"
        );
        assert_eq!(
            default_public_url("10.1.2.3:9".parse().unwrap()),
            "http://10.1.2.3:9"
        );
        for bad in [
            "fanout.example.com",
            "ftp://x.example",
            "https://x.example/?a=1",
            "https://u:p@x.example",
            "https://x.example/#f",
        ] {
            assert!(with(Some(bad), local).is_err(), "{bad}");
        }
    }

    #[test]
    fn event_url_is_validated() {
        let with = |v: &str| Settings {
            event_url: Some(v.into()),
            ..base()
        };
        assert_eq!(Config::from_settings(base()).unwrap().0.event_url, None);
        let (cfg, _) = Config::from_settings(with("https://api.example.com/events/{id}")).unwrap();
        assert_eq!(
            cfg.event_url.map(|u| u.of("evt_1")).as_deref(),
            Some("https://api.example.com/events/evt_1")
        );
        let err = Config::from_settings(with("https://api.example.com/events")).unwrap_err();
        assert!(err.0.contains("--event-url"), "{err}");
    }

    #[test]
    fn portal_frame_ancestors_are_validated() {
        let with = |v: &[&str]| Settings {
            portal_frame_ancestors: Some(v.iter().map(|s| s.to_string()).collect()),
            ..base()
        };
        let (cfg, _) = Config::from_settings(base()).unwrap();
        assert_eq!(cfg.portal_frame_ancestors, "'none'");
        let (cfg, warnings) =
            Config::from_settings(with(&["https://app.example.com", "http://localhost:3000"]))
                .unwrap();
        assert_eq!(
            cfg.portal_frame_ancestors,
            "https://app.example.com http://localhost:3000"
        );
        assert!(warnings.iter().any(|w| w.contains("plain-http")));
        let err = Config::from_settings(with(&["app.example.com/x"])).unwrap_err();
        assert!(err.0.contains("--portal-frame-ancestors"), "{err}");
    }

    #[test]
    fn size_table() {
        for (text, want) in [
            ("4096", Some(4096)),
            ("64KiB", Some(64 << 10)),
            ("64k", Some(64 << 10)),
            ("500MiB", Some(500 << 20)),
            ("500 MB", Some(500 << 20)),
            ("20GiB", Some(20u64 << 30)),
            ("1TiB", Some(1u64 << 40)),
            ("", None),
            ("MiB", None),
            ("1.5GiB", None),
            ("-1", None),
            ("12 parsecs", None),
            ("99999999999999999999", None),
            ("18446744073709551615T", None),
        ] {
            assert_eq!(parse_size(text), want, "{text:?}");
        }
    }

    #[test]
    fn ledger_location_table() {
        use LedgerLocation::{Postgres, Sqlite};
        let cases: &[(&str, Result<LedgerLocation, &str>)] = &[
            ("./fanout.db", Ok(Sqlite("./fanout.db".into()))),
            (
                "/var/lib/fanout/f.db",
                Ok(Sqlite("/var/lib/fanout/f.db".into())),
            ),
            ("sqlite:data/f.db", Ok(Sqlite("data/f.db".into()))),
            ("sqlite:///abs/f.db", Ok(Sqlite("/abs/f.db".into()))),
            ("sqlite:", Err("needs a file path")),
            (
                "postgres://fanout@db.internal:5432/fanout",
                Ok(Postgres("postgres://fanout@db.internal:5432/fanout".into())),
            ),
            (
                "postgresql://u:pw@127.0.0.1/x",
                Ok(Postgres("postgresql://u:pw@127.0.0.1/x".into())),
            ),
            ("postgres://u@h:notaport/x", Err("not a PostgreSQL URL")),
            ("mysql://u@h/x", Err("is not a ledger")),
        ];
        for (text, expected) in cases {
            match (LedgerLocation::parse(Path::new(text)), expected) {
                (Ok(got), Ok(want)) => assert_eq!(&got, want, "{text}"),
                (Err(ConfigError(m)), Err(part)) => assert!(m.contains(part), "{text}: {m}"),
                (got, want) => panic!("{text}: got {got:?}, expected {want:?}"),
            }
        }
        // A password never reaches a log line or a Debug print.
        let located = LedgerLocation::parse(Path::new("postgres://u:hunter2@h/x")).unwrap();
        assert!(!format!("{located:?} {}", located.redacted()).contains("hunter2"));
        let (c, _) = Config::from_settings(Settings {
            db: Some("postgres://u@127.0.0.1:5432/x".into()),
            ..base()
        })
        .unwrap();
        assert!(matches!(c.db, Postgres(_)));
    }

    #[test]
    fn breaker_settings_table() {
        let cfg = |threshold: Option<u32>, cooldown: Option<&str>| {
            Config::from_settings(Settings {
                breaker_threshold: threshold,
                breaker_cooldown: cooldown.map(str::to_string),
                ..base()
            })
            .map(|(c, _)| (c.breaker.threshold, c.breaker.cooldown_ms))
            .map_err(|e| e.0)
        };
        type Case<'a> = (Option<u32>, Option<&'a str>, Result<(u32, i64), &'a str>);
        let cases: &[Case] = &[
            (None, None, Ok((20, 30_000))),
            (Some(5), Some("3s"), Ok((5, 3_000))),
            (Some(1), Some("1h"), Ok((1, 3_600_000))),
            (Some(0), None, Err("--breaker-threshold must be 1 to 1000")),
            (
                Some(1001),
                None,
                Err("--breaker-threshold must be 1 to 1000"),
            ),
            (None, Some("500ms"), Err("--breaker-cooldown")),
            (
                None,
                Some("2h"),
                Err("--breaker-cooldown must be at most 1h"),
            ),
            (None, Some("soon"), Err("--breaker-cooldown")),
        ];
        for (threshold, cooldown, want) in cases {
            let got = cfg(*threshold, *cooldown);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{threshold:?} {cooldown:?}"),
                (Err(w), Err(g)) => assert!(g.contains(w), "{threshold:?} {cooldown:?}: {g}"),
                _ => panic!("{threshold:?} {cooldown:?}: {got:?}, want {want:?}"),
            }
        }
    }

    fn check(cases: Vec<(&str, Settings, Result<(), &str>)>) {
        for (name, s, expected) in cases {
            match (Config::from_settings(s), expected) {
                (Ok(_), Ok(())) => {}
                (Err(ConfigError(m)), Err(part)) => assert!(m.contains(part), "{name}: {m}"),
                (got, exp) => panic!("{name}: got {got:?}, expected {exp:?}"),
            }
        }
    }

    #[test]
    fn outbox_table() {
        let with = |at: &str, table: Option<&str>, poll: Option<&str>| Settings {
            outbox: Some(at.into()),
            outbox_table: table.map(str::to_string),
            outbox_poll: poll.map(str::to_string),
            ..base()
        };
        check(vec![
            ("pg", with("postgres://u@h:5432/shop", None, None), Ok(())),
            (
                "sqlite",
                with("sqlite:/data/shop.db", Some("out_2"), Some("50ms")),
                Ok(()),
            ),
            (
                "scheme",
                with("mysql://h/shop", None, None),
                Err("neither postgres"),
            ),
            (
                "table",
                with("shop.db", Some("Out"), None),
                Err("must be 1 to 50"),
            ),
            ("poll", with("shop.db", None, Some("2h")), Err("at most 1h")),
            (
                "poll unit",
                with("shop.db", None, Some("soon")),
                Err("--outbox-poll"),
            ),
        ]);
        let (cfg, _) = Config::from_settings(with("shop.db", None, None)).unwrap();
        let outbox = cfg.outbox.unwrap();
        assert_eq!(outbox.table, "fanout_outbox");
        assert_eq!(outbox.poll, crate::outbox::DEFAULT_SQLITE_POLL);
        let (cfg, _) = Config::from_settings(with("postgres://u@h/s", None, None)).unwrap();
        assert_eq!(cfg.outbox.unwrap().poll, crate::outbox::DEFAULT_POLL);
    }

    #[test]
    fn validation_table() {
        let key = Secret::from_bytes(&[7u8; 32]).unwrap().encode();
        let cases: Vec<(&str, Settings, Result<(), &str>)> = vec![
            ("defaults", base(), Ok(())),
            (
                "no token",
                Settings::default(),
                Err("API token is required"),
            ),
            (
                "bad listen",
                Settings {
                    listen: Some("nowhere".into()),
                    ..base()
                },
                Err("is not an address"),
            ),
            (
                "edge without key",
                Settings {
                    edge_url: Some("http://127.0.0.1:8787".into()),
                    ..base()
                },
                Err("needs --edge-key"),
            ),
            (
                "edge with bad key",
                Settings {
                    edge_url: Some("http://127.0.0.1:8787".into()),
                    edge_key: Some("nope".into()),
                    ..base()
                },
                Err("--edge-key"),
            ),
            (
                "edge ok",
                Settings {
                    edge_url: Some("http://127.0.0.1:8787".into()),
                    edge_key: Some(key.clone()),
                    ..base()
                },
                Ok(()),
            ),
            (
                "edge not a url",
                Settings {
                    edge_url: Some("edge".into()),
                    edge_key: Some(key),
                    ..base()
                },
                Err("not an http(s) URL"),
            ),
            (
                "zero attempts",
                Settings {
                    max_attempts: Some(0),
                    ..base()
                },
                Err("--max-attempts"),
            ),
            (
                "zero scale",
                Settings {
                    backoff_scale: Some(0.0),
                    ..base()
                },
                Err("--backoff-scale"),
            ),
            (
                "tiny events",
                Settings {
                    max_event_bytes: Some(10),
                    ..base()
                },
                Err("--max-event-bytes"),
            ),
            (
                "huge batch",
                Settings {
                    edge_batch: Some(501),
                    ..base()
                },
                Err("--edge-batch"),
            ),
        ];
        check(cases);
    }

    #[test]
    fn alert_and_retention_table() {
        let alert_key = Secret::from_bytes(&[9u8; 32]).unwrap().encode();
        let cases: Vec<(&str, Settings, Result<(), &str>)> = vec![
            (
                "alerts ok",
                Settings {
                    alert_url: Some("https://ops.example/fanout".into()),
                    alert_secret: Some(alert_key.clone()),
                    dead_alert_threshold: Some(5),
                    disable_after: Some("30s".into()),
                    ..base()
                },
                Ok(()),
            ),
            (
                "alert url without a secret",
                Settings {
                    alert_url: Some("https://ops.example/fanout".into()),
                    ..base()
                },
                Err("--alert-url needs --alert-secret"),
            ),
            (
                "alert secret not whsec_",
                Settings {
                    alert_url: Some("https://ops.example/fanout".into()),
                    alert_secret: Some("hunter2".into()),
                    ..base()
                },
                Err("--alert-secret"),
            ),
            (
                "alert url not a url",
                Settings {
                    alert_url: Some("ops".into()),
                    alert_secret: Some(alert_key.clone()),
                    ..base()
                },
                Err("--alert-url"),
            ),
            (
                "alert url not http, its token not shown",
                Settings {
                    alert_url: Some("ftp://ops.example/hook/T0K3N".into()),
                    alert_secret: Some(alert_key),
                    ..base()
                },
                Err("--alert-url ftp://ops.example:21 is not an http(s) URL"),
            ),
            (
                "zero dead threshold",
                Settings {
                    dead_alert_threshold: Some(0),
                    ..base()
                },
                Err("--dead-alert-threshold"),
            ),
            (
                "disable after nonsense",
                Settings {
                    disable_after: Some("soon".into()),
                    ..base()
                },
                Err("--disable-after"),
            ),
            (
                "disable after too short",
                Settings {
                    disable_after: Some("10ms".into()),
                    ..base()
                },
                Err("--disable-after"),
            ),
            (
                "retention ok",
                Settings {
                    retain_sent: Some("90s".into()),
                    retain_dead: Some("forever".into()),
                    ..base()
                },
                Ok(()),
            ),
            (
                "retention nonsense",
                Settings {
                    retain_sent: Some("a week".into()),
                    ..base()
                },
                Err("--retain-sent"),
            ),
            (
                "retention too short",
                Settings {
                    retain_dead: Some("500ms".into()),
                    ..base()
                },
                Err("--retain-dead"),
            ),
            (
                "never disable",
                Settings {
                    disable_after: Some("never".into()),
                    ..base()
                },
                Ok(()),
            ),
        ];
        check(cases);
    }

    #[test]
    fn defaults_and_durations() {
        let (c, _) = Config::from_settings(base()).unwrap();
        assert_eq!(
            (
                c.db,
                c.listen.to_string(),
                c.max_attempts,
                c.max_event_bytes
            ),
            (
                LedgerLocation::Sqlite(PathBuf::from(DEFAULT_DB)),
                DEFAULT_LISTEN.to_string(),
                8,
                65536
            )
        );
        assert!(c.alert.is_none());
        assert_eq!(c.alert_rules, AlertRules::default());
        assert_eq!(c.alert_rules.disable_after_ms, Some(5 * 86_400_000));
        let (c, _) = Config::from_settings(Settings {
            disable_after: Some("2s".into()),
            ..base()
        })
        .unwrap();
        assert_eq!(c.alert_rules.disable_after_ms, Some(2000));
        let (c, _) = Config::from_settings(base()).unwrap();
        assert_eq!(
            (c.retention.sent_ms, c.retention.dead_ms),
            (Some(7 * 86_400_000), Some(30 * 86_400_000))
        );
        let (c, warnings) = Config::from_settings(Settings {
            retain_sent: Some("12h".into()),
            retain_dead: Some("1h".into()),
            ..base()
        })
        .unwrap();
        assert_eq!(
            (c.retention.sent_ms, c.retention.dead_ms),
            (Some(12 * 3_600_000), Some(3_600_000))
        );
        assert!(
            warnings.iter().any(|w| w.contains("--retain-dead")),
            "{warnings:?}"
        );
    }
}
