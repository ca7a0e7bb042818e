//! The `fanout` command line: `serve`, client commands that talk to a running daemon's API
//! (`status`, `subscriber add|list|remove`, `send`, `deliveries`, `replay`), and `load`.
//! Listings print a table for people and JSON with `--json`; progress bars go to stderr only
//! when it is a terminal.

use std::io::Read as _;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use fanout_core::breaker::BreakerState;
use serde_json::{json, Value};

use crate::api::views::{
    Deleted, DeliveryList, DeliveryView, IngestedBatch, Replayed, ReplayedOne, SubscriberInput,
    SubscriberList, SubscriberView,
};
use crate::config::{Settings, DEFAULT_LISTEN};
use crate::model::Lane;
use crate::retention::RetentionView;

#[derive(Debug, Parser)]
#[command(
    name = "fanout",
    version,
    about = "Rate-limited webhook fan-out: the origin daemon and its client"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr: text (colour only on a terminal) or json (one object per line)
    #[arg(long, env = "FANOUT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
// Parsed once at start-up and matched once: boxing `serve`'s settings would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run the daemon: ledger, dispatcher and HTTP API
    Serve(ServeArgs),
    /// Manage subscribers
    Subscriber {
        #[command(subcommand)]
        command: SubscriberCommand,
    },
    /// Manage customers (owners of subscribers) and links to their portal
    Customer {
        #[command(subcommand)]
        command: CustomerCommand,
    },
    /// Send events (one JSON object, an array, or one object per line) from a file or stdin
    Send(SendArgs),
    /// List deliveries, e.g. `fanout deliveries --status dead`
    Deliveries(DeliveriesArgs),
    /// Replay one delivery by id, or every delivery matching the filters (dead by default)
    Replay(ReplayArgs),
    /// Per-subscriber status: lane, rate, backlog, sent, dead, disabled, pause and breaker,
    /// last error
    Status(StatusArgs),
    /// Flood a URL, or the edge for one subscriber, for a bounded time; report accepted,
    /// throttled and the achieved rate
    Load(LoadArgs),
    /// Write a consistent copy of a SQLite ledger, also while its daemon serves; leases in
    /// the copy return to pending (a PostgreSQL ledger is backed up with pg_dump)
    Backup(BackupArgs),
    /// Work on a ledger directly (the daemon stopped)
    Ledger {
        #[command(subcommand)]
        command: LedgerCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Copy a SQLite ledger into an empty PostgreSQL one (stop the daemon first): subscribers,
    /// events, deliveries with their status, attempts and limiter state; deliveries in flight
    /// come over pending. Progress goes to stderr.
    Copy(LedgerCopyArgs),
}

#[derive(Debug, Args)]
pub struct LedgerCopyArgs {
    /// The SQLite ledger file (or sqlite:PATH)
    #[arg(long)]
    pub from: PathBuf,
    /// The PostgreSQL ledger, postgres://user@host:port/dbname; its tables must be empty
    #[arg(long)]
    pub to: String,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The ledger to copy (a file path or sqlite:PATH)
    #[arg(long, env = "FANOUT_DB")]
    pub db: PathBuf,
    /// The new file to write (must not exist)
    #[arg(long)]
    pub to: PathBuf,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (same names as the flags, with underscores)
    #[arg(long, env = "FANOUT_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

impl ServeArgs {
    /// Flags and environment over the config file.
    pub fn merged(self) -> Result<Settings, crate::config::ConfigError> {
        let file = match &self.config {
            Some(p) => Settings::from_file(p)?,
            None => Settings::default(),
        };
        Ok(self.settings.over(file))
    }
}

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Base URL of the daemon's API [default: http://<--listen>]
    #[arg(long, env = "FANOUT_SERVER")]
    pub server: Option<String>,
    /// Address the daemon listens on, used when --server is not given
    #[arg(long, env = "FANOUT_LISTEN")]
    pub listen: Option<String>,
    /// Bearer token of the daemon's API
    #[arg(long, env = "FANOUT_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SubscriberCommand {
    /// Add a subscriber; prints it with its generated secret
    Add(SubscriberAdd),
    /// List subscribers
    List {
        /// Print the daemon's JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a subscriber (its unfinished deliveries go dead)
    Remove {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a subscriber's active signing secrets, newest first (a rotated-out one with the
    /// time it stops signing)
    Secret {
        id: String,
        /// Print the daemon's JSON instead of one line per secret
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

fn parse_lane(s: &str) -> Result<Lane, String> {
    Lane::parse(s).ok_or_else(|| format!("{s:?} is not a lane: edge, origin or auto"))
}

#[derive(Debug, Args)]
pub struct SubscriberAdd {
    pub id: String,
    pub url: String,
    /// Event type or prefix pattern like video.* (repeatable) [default: *]
    #[arg(long = "event-type", short = 't')]
    pub event_types: Vec<String>,
    #[arg(long)]
    pub rate_per_sec: Option<f64>,
    #[arg(long)]
    pub burst: Option<u32>,
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// edge, origin or auto
    #[arg(long, value_parser = parse_lane)]
    pub lane: Option<Lane>,
    /// Also send the legacy X-Fanout-Signature header
    #[arg(long)]
    pub legacy_signature: bool,
    /// The customer that owns this endpoint (see `fanout customer add`)
    #[arg(long)]
    pub customer: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// File of events; stdin when absent or `-`
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub subscriber: Option<String>,
    #[arg(long)]
    pub event: Option<String>,
    /// Unix ms or RFC 3339
    #[arg(long)]
    pub since: Option<String>,
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub limit: Option<usize>,
    /// Show one delivery with its attempts
    #[arg(long)]
    pub id: Option<String>,
    /// Print the daemon's JSON instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the daemon's JSON (subscribers with their stats) instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["url", "edge_url"])))]
pub struct LoadArgs {
    /// Flood this URL: 2xx counts as accepted, 429 as throttled
    #[arg(long)]
    pub url: Option<String>,
    /// Flood the edge's POST /v1/deliveries for one subscriber (needs --edge-key)
    #[arg(long, requires = "edge_key")]
    pub edge_url: Option<String>,
    /// The edge's EDGE_SIGNING_KEY (whsec_…)
    #[arg(long, env = "FANOUT_EDGE_KEY", hide_env_values = true)]
    pub edge_key: Option<String>,
    /// Where the edge delivers; without it a local sink is started on 127.0.0.1 (which only
    /// a local edge can reach)
    #[arg(long)]
    pub sink: Option<String>,
    /// The load subscriber's id [default: a fresh load_<hex>, so its bucket starts full]
    #[arg(long)]
    pub subscriber: Option<String>,
    /// The subscriber's rate, per second
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// The subscriber's burst
    #[arg(long, default_value_t = 20)]
    pub burst: u32,
    /// The subscriber's in-flight cap
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: u32,
    /// Deliveries per edge call
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Concurrent workers, each making one call at a time
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// How long to flood: 10s, 500ms, 2m (at most 1h)
    #[arg(long, default_value = "10s", value_parser = crate::term::parse_duration)]
    pub duration: std::time::Duration,
    /// HTTP method for --url
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// Request body for --url (sent as application/json)
    #[arg(long, default_value = "{}")]
    pub body: String,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// One delivery (dlv_…); without it, every match of the filters
    pub id: Option<String>,
    #[arg(long)]
    pub subscriber: Option<String>,
    /// dead (default) or sent
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub since: Option<String>,
    #[arg(long)]
    pub until: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A client command failed; the message is for the operator.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {0}: {1}")]
    Unreachable(String, String),
    #[error("{status}: {message}")]
    Api { status: u16, message: String },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("backup: {0}")]
    Backup(#[from] crate::ledger::sqlite::backup::BackupError),
}

struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    fn new(args: &ClientArgs) -> Result<Client, ClientError> {
        let base = match &args.server {
            Some(s) => s.trim_end_matches('/').to_string(),
            None => format!(
                "http://{}",
                args.listen.as_deref().unwrap_or(DEFAULT_LISTEN)
            ),
        };
        let token = args
            .api_token
            .clone()
            .ok_or_else(|| ClientError::Input("set --api-token or FANOUT_API_TOKEN".into()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ClientError::Input(e.to_string()))?;
        Ok(Client { base, token, http })
    }

    /// A text answer to a GET (`/metrics`), or `None` when there is none.
    async fn text(&self, path: &str) -> Option<String> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    /// One API call, its answer decoded into the view type the API writes.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ClientError::Unreachable(self.base.clone(), e.to_string()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Unreachable(self.base.clone(), e.to_string()))?;
        if status >= 400 {
            let message = serde_json::from_slice::<fanout_core::wire::ErrorBody>(&bytes)
                .map(|e| e.error.message)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ClientError::Api { status, message });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            ClientError::Unreachable(
                self.base.clone(),
                format!("the answer to {path} is not what this version expects: {e}"),
            )
        })
    }
}

fn query(pairs: &[(&str, &Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Events from a file's text: a JSON value (object or array), or one object per line.
pub fn events_from_text(text: &str) -> Result<Vec<Box<serde_json::value::RawValue>>, ClientError> {
    use serde_json::value::RawValue;
    if let Ok(raw) = serde_json::from_str::<Box<RawValue>>(text) {
        if raw.get().starts_with('[') {
            return serde_json::from_str::<Vec<Box<RawValue>>>(raw.get())
                .map_err(|e| ClientError::Input(format!("not a JSON array of events: {e}")));
        }
        return Ok(vec![raw]);
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Box<RawValue>>(l)
                .map_err(|e| ClientError::Input(format!("line {}: not JSON: {e}", i + 1)))
        })
        .collect()
}

fn print<T: serde::Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// `fanout ledger copy`: both ends named as `--db` takes them.
async fn ledger_copy(a: LedgerCopyArgs) -> Result<(), ClientError> {
    use crate::config::LedgerLocation;
    let from = match LedgerLocation::parse(&a.from) {
        Ok(LedgerLocation::Sqlite(p)) => p,
        Ok(LedgerLocation::Postgres(_)) => {
            return Err(ClientError::Input(
                "--from must be a SQLite ledger file (sqlite:PATH or a path)".into(),
            ))
        }
        Err(e) => return Err(ClientError::Input(e.0)),
    };
    let to = match LedgerLocation::parse(std::path::Path::new(&a.to)) {
        Ok(LedgerLocation::Postgres(url)) => url,
        Ok(LedgerLocation::Sqlite(_)) => {
            return Err(ClientError::Input(
                "--to must be a PostgreSQL URL like postgres://user@host:5432/dbname".into(),
            ))
        }
        Err(e) => return Err(ClientError::Input(e.0)),
    };
    crate::ledger::copy::copy_sqlite_to_pg(&from, &to, crate::time::now_ms(), |line| {
        eprintln!("fanout ledger copy: {line}")
    })
    .await?;
    Ok(())
}

/// Run a client command: each is its own function below.
pub async fn run_client(command: Command) -> Result<(), ClientError> {
    match command {
        Command::Serve(_) => Err(ClientError::Input("serve is not a client command".into())),
        Command::Customer { command } => run_customer(command).await,
        Command::Subscriber { command } => match command {
            SubscriberCommand::Add(a) => subscriber_add(a).await,
            SubscriberCommand::List { json, client } => subscriber_list(&client, json).await,
            SubscriberCommand::Remove { id, client } => subscriber_remove(&client, &id).await,
            SubscriberCommand::Secret { id, json, client } => {
                subscriber_secret(&id, json, &client).await
            }
        },
        Command::Send(a) => send(a).await,
        Command::Deliveries(a) => deliveries(a).await,
        Command::Replay(a) => replay(a).await,
        Command::Status(a) => status(a).await,
        Command::Load(a) => load(a).await,
        Command::Ledger {
            command: LedgerCommand::Copy(a),
        } => ledger_copy(a).await,
        Command::Backup(a) => backup(a),
    }
}

/// What `fanout backup` answers for a PostgreSQL ledger.
pub const PG_BACKUP: &str = "fanout backup copies a SQLite ledger; back up a PostgreSQL \
     ledger with PostgreSQL's own tools, e.g. pg_dump --format=custom --file=FILE \
     postgres://user@host/dbname (consistent while the daemons serve); restored, the daemons \
     take over leases that were in flight once they expire";

/// `fanout backup`: not a client of the API (it reads the ledger file) and not a daemon (it
/// takes no ownership lock).
/// A PostgreSQL ledger is refused: its consistent copy is PostgreSQL's own (`pg_dump`).
fn backup(a: BackupArgs) -> Result<(), ClientError> {
    use crate::config::LedgerLocation;
    let db = match LedgerLocation::parse(&a.db) {
        Ok(LedgerLocation::Sqlite(path)) => path,
        Ok(LedgerLocation::Postgres(_)) => return Err(ClientError::Input(PG_BACKUP.into())),
        Err(e) => return Err(ClientError::Input(e.0)),
    };
    let r = crate::ledger::sqlite::backup::backup(&db, &a.to, crate::time::now_ms())?;
    if a.json {
        print(&r);
    } else {
        println!(
            "backed up {} to {}: {} events, {} deliveries ({} leases returned to pending), {} bytes",
            db.display(),
            a.to.display(),
            r.events,
            r.deliveries,
            r.leases_released,
            r.bytes
        );
    }
    Ok(())
}

/// `fanout subscriber add`: prints the new subscriber with its secret.
async fn subscriber_add(a: SubscriberAdd) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let input = SubscriberInput {
        id: Some(a.id),
        url: Some(a.url),
        event_types: Some(if a.event_types.is_empty() {
            vec!["*".to_string()]
        } else {
            a.event_types
        }),
        rate_per_sec: a.rate_per_sec,
        burst: a.burst,
        max_in_flight: a.max_in_flight,
        timeout_ms: a.timeout_ms,
        lane: a.lane,
        legacy_signature: a.legacy_signature.then_some(true),
        customer: a.customer.map(Some),
        ..SubscriberInput::default()
    };
    let body = serde_json::to_vec(&input).map_err(|e| ClientError::Input(e.to_string()))?;
    let created: SubscriberView = client
        .call(reqwest::Method::POST, "/v1/subscribers", Some(body))
        .await?;
    print(&created);
    Ok(())
}

/// `fanout subscriber list`.
async fn subscriber_list(client: &ClientArgs, json: bool) -> Result<(), ClientError> {
    let list: SubscriberList = Client::new(client)?
        .call(reqwest::Method::GET, "/v1/subscribers", None)
        .await?;
    if json {
        print(&list);
    } else {
        print!("{}", subscribers_table(&list));
    }
    Ok(())
}

/// `fanout subscriber remove`.
async fn subscriber_remove(client: &ClientArgs, id: &str) -> Result<(), ClientError> {
    let path = format!("/v1/subscribers/{}", encode(id));
    let deleted: Deleted = Client::new(client)?
        .call(reqwest::Method::DELETE, &path, None)
        .await?;
    print(&deleted);
    Ok(())
}

/// `fanout send`: events from a file or stdin, 1000 per request; prints the totals.
async fn send(a: SendArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let text = match a.file.as_deref() {
        Some(p) if p.as_os_str() != "-" => std::fs::read_to_string(p)
            .map_err(|e| ClientError::Input(format!("cannot read {}: {e}", p.display())))?,
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| ClientError::Input(format!("cannot read stdin: {e}")))?;
            s
        }
    };
    let events = events_from_text(&text)?;
    if events.is_empty() {
        return Err(ClientError::Input("no events to send".into()));
    }
    let (mut new, mut dup, mut deliveries) = (0u64, 0u64, 0u64);
    let progress = crate::term::bar(events.len() as u64, "events");
    for chunk in events.chunks(1000) {
        let body = serde_json::to_vec(chunk).map_err(|e| ClientError::Input(e.to_string()))?;
        let answer: IngestedBatch = client
            .call(reqwest::Method::POST, "/v1/events", Some(body))
            .await?;
        for e in answer.events {
            if e.duplicate {
                dup += 1;
            } else {
                new += 1;
            }
            deliveries += u64::from(e.deliveries);
        }
        progress.inc(chunk.len() as u64);
    }
    progress.finish_and_clear();
    print(&json!({ "events": new, "duplicates": dup, "deliveries": deliveries }));
    Ok(())
}

/// `fanout deliveries`: one delivery with its attempts, or a page of them.
async fn deliveries(a: DeliveriesArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    match &a.id {
        Some(id) => {
            let d: DeliveryView = client
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/deliveries/{}", encode(id)),
                    None,
                )
                .await?;
            if a.json {
                print(&d);
            } else {
                print!("{}", delivery_detail(&d));
            }
        }
        None => {
            let limit = a.limit.map(|l| l.to_string());
            let q = query(&[
                ("status", &a.status),
                ("subscriber", &a.subscriber),
                ("event", &a.event),
                ("since", &a.since),
                ("until", &a.until),
                ("limit", &limit),
            ]);
            let page: DeliveryList = client
                .call(reqwest::Method::GET, &format!("/v1/deliveries{q}"), None)
                .await?;
            if a.json {
                print(&page);
            } else {
                print!("{}", deliveries_table(&page));
            }
        }
    }
    Ok(())
}

/// `fanout replay`: one delivery by id, or every one matching the filters.
async fn replay(a: ReplayArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    match &a.id {
        Some(id) => {
            let one: ReplayedOne = client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/deliveries/{}/replay", encode(id)),
                    None,
                )
                .await?;
            print(&one);
        }
        None => {
            let mut body = json!({ "subscriber": a.subscriber, "status": a.status, "since": a.since, "until": a.until });
            let progress = crate::term::spinner("replaying…");
            // The daemon replays at most REPLAY_PER_CALL per call and says where to go on.
            let mut total = 0;
            let replayed = loop {
                let step = client
                    .call::<Replayed>(
                        reqwest::Method::POST,
                        "/v1/replay",
                        Some(body.to_string().into_bytes()),
                    )
                    .await;
                match step {
                    Ok(r) if r.more => {
                        total += r.replayed;
                        body["after"] = json!(r.next);
                    }
                    Ok(r) => {
                        break Ok(Replayed {
                            replayed: total + r.replayed,
                            ..r
                        })
                    }
                    Err(e) => break Err(e),
                }
            };
            progress.finish_and_clear();
            print(&replayed?);
        }
    }
    Ok(())
}

/// `fanout status`.
async fn status(a: StatusArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let list: SubscriberList = client
        .call(reqwest::Method::GET, "/v1/subscribers?stats=true", None)
        .await?;
    let retention: RetentionView = client
        .call(reqwest::Method::GET, "/v1/retention", None)
        .await?;
    // The daemon's clock against its PostgreSQL server's, from its `/metrics` (absent when
    // they cannot be read: the rest of the status stands without it).
    let clock = client
        .text("/metrics")
        .await
        .as_deref()
        .and_then(clock_offset);
    if a.json {
        let mut v = serde_json::to_value(&list).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "retention".into(),
                serde_json::to_value(&retention).unwrap_or_default(),
            );
            if let Some(offset) = clock {
                o.insert("clock_offset_seconds".into(), offset.into());
            }
        }
        print(&v);
    } else {
        let now = crate::time::now_ms();
        print!("{}", status_table(&list, now));
        println!("{}", retention_line(&retention, now));
        if let Some(line) = clock.and_then(clock_line) {
            println!("{line}");
        }
    }
    Ok(())
}

/// The `fanout_clock_offset_seconds` sample of a `/metrics` text (pure).
pub fn clock_offset(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("fanout_clock_offset_seconds "))?
        .trim()
        .parse()
        .ok()
}

/// `fanout status`'s warning when the daemon's host clock is more than
/// [`crate::time::CLOCK_WARN_MS`] off its PostgreSQL server's (`offset_s`: the server's less
/// the host's); nothing otherwise (pure).
pub fn clock_line(offset_s: f64) -> Option<String> {
    if offset_s.abs() * 1000.0 <= crate::time::CLOCK_WARN_MS as f64 {
        return None;
    }
    let how = if offset_s > 0.0 { "behind" } else { "ahead of" };
    Some(format!(
        "clock: this daemon's host is {:.1} s {how} the PostgreSQL server's (the daemon keeps \
         the server's time; set the host's clock right)",
        offset_s.abs()
    ))
}

/// `fanout status`'s last line: what retention keeps and has removed (pure).
pub fn retention_line(v: &RetentionView, now_ms: i64) -> String {
    use crate::term::human_duration;
    let kept = |window: &str, oldest: Option<i64>| {
        let age = oldest.map_or("none kept".to_string(), |t| {
            format!("oldest {} ago", human_duration(now_ms - t))
        });
        format!("{window} ({age})")
    };
    let r = &v.report;
    let last = r.last_run_at_ms.map_or("not run yet".to_string(), |t| {
        format!("last pass {} ago", human_duration(now_ms - t))
    });
    format!(
        "retention: sent kept {}, dead kept {}; removed {} sent, {} dead, {} attempts, {} events; {last}",
        kept(&v.retain_sent, r.oldest_sent_at_ms),
        kept(&v.retain_dead, r.oldest_dead_at_ms),
        r.removed_sent,
        r.removed_dead,
        r.removed_attempts,
        r.removed_events,
    )
}

async fn load(a: LoadArgs) -> Result<(), ClientError> {
    use crate::load::{self, LoadPlan, Target};
    let input = ClientError::Input;
    let mut sink_count = None;
    let target = match (&a.url, &a.edge_url) {
        (Some(url), _) => {
            url::Url::parse(url).map_err(|e| input(format!("--url {url:?}: {e}")))?;
            Target::Url {
                url: url.clone(),
                method: reqwest::Method::from_bytes(a.method.to_uppercase().as_bytes())
                    .map_err(|_| input(format!("--method {:?} is not an HTTP method", a.method)))?,
                body: a.body.clone(),
            }
        }
        (None, Some(edge)) => {
            let parsed =
                url::Url::parse(edge).map_err(|e| input(format!("--edge-url {edge:?}: {e}")))?;
            let key = a.edge_key.as_deref().unwrap_or_default();
            let key = fanout_core::sign::Secret::parse(key)
                .map_err(|e| input(format!("--edge-key: {e}")))?;
            let sink = match &a.sink {
                Some(s) => s.clone(),
                None => {
                    let local =
                        matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
                    if !local {
                        return Err(input(
                            "a deployed edge cannot reach a local sink: pass --sink https://…"
                                .into(),
                        ));
                    }
                    let (url, count) = load::start_sink().await.map_err(input)?;
                    sink_count = Some(count);
                    url
                }
            };
            Target::Edge {
                base_url: edge.clone(),
                client: crate::dispatch::edge_lane::EdgeClient::new(
                    edge,
                    key,
                    crate::outbound::Outbound::new(false)
                        .map_err(|e| input(format!("cannot build the HTTP client: {e}")))?,
                ),
                subscriber: fanout_core::wire::SubscriberSpec {
                    id: a.subscriber.clone().unwrap_or_else(|| load::run_id("load")),
                    url: sink,
                    secrets: vec![load::new_secret().map_err(input)?],
                    rate_per_sec: a.rate,
                    burst: a.burst,
                    max_in_flight: a.max_in_flight,
                    timeout_ms: 10_000,
                    legacy_signature: false,
                },
                batch: a.batch,
            }
        }
        (None, None) => return Err(input("give --url or --edge-url".into())),
    };
    let plan = LoadPlan {
        target,
        workers: a.workers,
        duration: a.duration,
    };
    plan.validate().map_err(input)?;
    let total_ms = a.duration.as_millis() as u64;
    let progress = crate::term::bar(total_ms, "ms");
    let bar = progress.clone();
    let report = load::run(plan, sink_count, move |elapsed, accepted, throttled| {
        bar.set_position((elapsed.as_millis() as u64).min(total_ms));
        bar.set_message(format!("accepted {accepted}, throttled {throttled}"));
    })
    .await
    .map_err(input)?;
    progress.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", load::human(&report));
    }
    if report.requests > 0 && report.errors == report.requests {
        return Err(input(format!(
            "every call failed: {}",
            report.first_error.as_deref().unwrap_or("unknown error")
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `fanout customer …`

#[derive(Debug, Subcommand)]
pub enum CustomerCommand {
    /// Add a customer
    Add {
        id: String,
        /// Its share of the dispatcher under contention, relative to other customers [default: 1]
        #[arg(long)]
        weight: Option<u32>,
        /// Most deliveries in flight across all its endpoints
        #[arg(long)]
        max_in_flight: Option<u32>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List customers
    List {
        /// Print the daemon's JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one customer
    Show {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a customer that owns no subscriber; its portal links stop working
    Remove {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// End every portal link issued for the customer so far (a leaked link); new links work
    RevokeLinks {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a link to the customer's portal (the URL carries a token: treat it as a secret)
    Portal {
        id: String,
        /// How long the link works, in seconds [default: 3600]
        #[arg(long)]
        ttl_secs: Option<u64>,
        /// Print the daemon's JSON (url, token, expires_at_ms) instead of the URL
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Decode a daemon answer into its API view type.
fn view<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ClientError> {
    serde_json::from_value(v)
        .map_err(|e| ClientError::Input(format!("unexpected answer from the daemon: {e}")))
}

async fn run_customer(command: CustomerCommand) -> Result<(), ClientError> {
    use crate::customer::{CustomerList, CustomerView, PortalLink};
    use reqwest::Method;
    match command {
        CustomerCommand::Add {
            id,
            weight,
            max_in_flight,
            client,
        } => {
            let mut body = json!({ "id": id });
            if let Some(w) = weight {
                body["weight"] = json!(w);
            }
            if let Some(m) = max_in_flight {
                body["max_in_flight"] = json!(m);
            }
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::POST,
                    "/v1/customers",
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            print(&v);
        }
        CustomerCommand::List { json, client } => {
            let v = Client::new(&client)?
                .call::<Value>(Method::GET, "/v1/customers", None)
                .await?;
            if json {
                print(&v);
            } else {
                print!("{}", customers_table(&view::<CustomerList>(v)?.customers));
            }
        }
        CustomerCommand::Show { id, client } => {
            let v = Client::new(&client)?
                .call::<Value>(Method::GET, &format!("/v1/customers/{}", encode(&id)), None)
                .await?;
            let c: CustomerView = view(v.clone())?;
            print(&serde_json::to_value(c).unwrap_or(v));
        }
        CustomerCommand::Remove { id, client } => {
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::DELETE,
                    &format!("/v1/customers/{}", encode(&id)),
                    None,
                )
                .await?;
            print(&v);
        }
        CustomerCommand::RevokeLinks { id, client } => {
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::POST,
                    &format!("/v1/customers/{}/portal/revoke", encode(&id)),
                    None,
                )
                .await?;
            print(&v);
        }
        CustomerCommand::Portal {
            id,
            ttl_secs,
            json,
            client,
        } => {
            let body = match ttl_secs {
                Some(t) => json!({ "ttl_secs": t }),
                None => json!({}),
            };
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::POST,
                    &format!("/v1/customers/{}/portal", encode(&id)),
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            let link: PortalLink = view(v)?;
            if json {
                print(&serde_json::to_value(&link).unwrap_or_default());
            } else {
                println!("{}", link.url);
            }
        }
    }
    Ok(())
}

/// Customers as a table: id, weight, in-flight cap, subscribers.
pub fn customers_table(customers: &[crate::customer::CustomerView]) -> String {
    let mut out = format!(
        "{:<24} {:>6} {:>13} {:>11}\n",
        "CUSTOMER", "WEIGHT", "MAX IN FLIGHT", "SUBSCRIBERS"
    );
    for c in customers {
        let cap = c.max_in_flight.map_or("-".to_string(), |m| m.to_string());
        out.push_str(&format!(
            "{:<24} {:>6} {:>13} {:>11}\n",
            c.id, c.weight, cap, c.subscribers
        ));
    }
    out
}

/// A number as the tables show it (`10`, `2.5`).
fn num(x: f64) -> String {
    crate::term::human_number(x)
}

/// An optional figure: `-` when absent.
fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// `fanout status`: one row per subscriber from `GET /v1/subscribers?stats=true` (pure).
pub fn status_table(list: &SubscriberList, now_ms: i64) -> String {
    use crate::term::{clip, human_duration};
    if list.subscribers.is_empty() {
        return "no subscribers\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .subscribers
        .iter()
        .map(|s| {
            let (v, st) = (&s.view, s.stats.as_ref());
            let mut state = Vec::new();
            if let Some(stall) = st.and_then(|st| st.stalled.as_ref()) {
                state.push(format!(
                    "STALLED {} (due work, nothing sent)",
                    human_duration(now_ms - stall.since_ms)
                ));
            }
            if v.disabled {
                state.push(match &v.disabled_reason {
                    Some(reason) => format!("disabled: {}", clip(reason, 40)),
                    None => "disabled".into(),
                });
            }
            if let Some(until) = st.and_then(|st| st.paused_until_ms) {
                state.push(format!("paused {}", human_duration(until - now_ms)));
            }
            match st.map(|st| st.breaker.state) {
                Some(BreakerState::Open) => state.push("breaker open".into()),
                Some(BreakerState::HalfOpen) => state.push("breaker half-open".into()),
                Some(BreakerState::Closed) | None => {}
            }
            if st.is_some_and(|st| st.limiter_error.is_some()) {
                state.push("limiter state reset".into());
            }
            if state.is_empty() {
                state.push(if st.is_none() { "-" } else { "ok" }.into());
            }
            let last_error = match (
                st.and_then(|st| st.last_error.as_deref()),
                st.and_then(|st| st.last_error_at_ms),
            ) {
                (Some(e), Some(at)) => {
                    format!("{} ago: {}", human_duration(now_ms - at), clip(e, 48))
                }
                (Some(e), None) => clip(e, 48),
                _ => String::new(),
            };
            vec![
                v.id.clone(),
                v.lane.as_str().into(),
                num(v.rate_per_sec),
                v.burst.to_string(),
                opt(st.map(|st| st.pending)),
                opt(st.map(|st| st.in_flight)),
                opt(st.map(|st| st.sent)),
                opt(st.map(|st| st.dead)),
                state.join(", "),
                last_error,
            ]
        })
        .collect();
    crate::term::table(
        &[
            "SUBSCRIBER",
            "LANE",
            "RATE/S",
            "BURST",
            "PENDING",
            "IN FLIGHT",
            "SENT",
            "DEAD",
            "STATE",
            "LAST ERROR",
        ],
        &rows,
    )
}

/// `fanout subscriber secret ID`: `GET /v1/subscribers/{id}/secret`, read as its view.
async fn subscriber_secret(id: &str, json: bool, client: &ClientArgs) -> Result<(), ClientError> {
    let path = format!("/v1/subscribers/{}/secret", encode(id));
    let v = Client::new(client)?
        .call(reqwest::Method::GET, &path, None)
        .await?;
    let secrets: crate::model::SecretsView = view(v)?;
    if json {
        print(&serde_json::to_value(&secrets).unwrap_or_default());
    } else {
        print!("{}", secrets_lines(&secrets));
    }
    Ok(())
}

/// One line per secret, newest first: the secret, a tab, `current` or `until <unix ms>` (pure).
pub fn secrets_lines(v: &crate::model::SecretsView) -> String {
    v.secrets
        .iter()
        .map(|s| match s.expires_at_ms {
            None => format!("{}\tcurrent\n", s.secret),
            Some(ms) => format!("{}\tuntil {ms}\n", s.secret),
        })
        .collect()
}

/// `fanout subscriber list` as a table (pure).
pub fn subscribers_table(list: &SubscriberList) -> String {
    if list.subscribers.is_empty() {
        return "no subscribers\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .subscribers
        .iter()
        .map(|s| {
            let v = &s.view;
            vec![
                v.id.clone(),
                v.lane.as_str().into(),
                num(v.rate_per_sec),
                v.burst.to_string(),
                v.max_in_flight.to_string(),
                v.event_types.join(","),
                v.url.clone(),
            ]
        })
        .collect();
    crate::term::table(
        &[
            "ID",
            "LANE",
            "RATE/S",
            "BURST",
            "MAX IN FLIGHT",
            "EVENT TYPES",
            "URL",
        ],
        &rows,
    )
}

/// `fanout deliveries` as a table (pure); says how to get the next page.
pub fn deliveries_table(page: &DeliveryList) -> String {
    if page.deliveries.is_empty() {
        return "no deliveries\n".into();
    }
    let rows: Vec<Vec<String>> = page
        .deliveries
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                d.subscriber_id.clone(),
                d.event_id.clone(),
                d.event_type.clone(),
                d.status.as_str().into(),
                d.attempt_count.to_string(),
                d.last_error
                    .as_deref()
                    .map(|e| crate::term::clip(e, 60))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = crate::term::table(
        &[
            "ID",
            "SUBSCRIBER",
            "EVENT",
            "TYPE",
            "STATUS",
            "ATTEMPTS",
            "LAST ERROR",
        ],
        &rows,
    );
    if let Some(next) = &page.next {
        out.push_str(&format!(
            "({} shown; more after {next}: use --limit, or --json for the `next` cursor)\n",
            page.deliveries.len()
        ));
    }
    out
}

/// One delivery with its attempts (pure).
pub fn delivery_detail(d: &DeliveryView) -> String {
    let mut out = String::new();
    for (key, value) in [
        ("id", d.id.clone()),
        ("subscriber_id", d.subscriber_id.clone()),
        ("event_id", d.event_id.clone()),
        ("event_type", d.event_type.clone()),
        ("status", d.status.as_str().into()),
        ("attempt_count", d.attempt_count.to_string()),
        ("next_attempt_at_ms", opt(d.next_attempt_at_ms)),
        ("last_error", opt(d.last_error.as_deref())),
    ] {
        out.push_str(&format!("{key:<20}{value}\n"));
    }
    let rows: Vec<Vec<String>> = d
        .attempts
        .iter()
        .flatten()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                a.at_ms.to_string(),
                a.lane.as_str().into(),
                a.outcome.as_str().into(),
                opt(a.status),
                opt(a.latency_ms),
                a.error.clone().unwrap_or_default(),
                a.response_body
                    .as_deref()
                    .map(|b| crate::term::clip(b, 60))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&crate::term::table(
            &[
                "ATTEMPT", "AT (MS)", "LANE", "OUTCOME", "STATUS", "LATENCY", "ERROR", "BODY",
            ],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::views::{AttemptRecordView, SubscriberStats, ViewWithStats};
    use crate::model::{AttemptOutcome, Status};

    #[test]
    fn secrets_as_lines() {
        use crate::model::{SecretView, SecretsView};
        let v = SecretsView {
            secrets: vec![
                SecretView {
                    secret: "whsec_new".into(),
                    expires_at_ms: None,
                },
                SecretView {
                    secret: "whsec_old".into(),
                    expires_at_ms: Some(1_700_000_000_000),
                },
            ],
        };
        assert_eq!(
            secrets_lines(&v),
            "whsec_new\tcurrent\nwhsec_old\tuntil 1700000000000\n"
        );
        assert_eq!(secrets_lines(&SecretsView { secrets: vec![] }), "");
    }

    #[test]
    fn events_text_table() {
        let cases: &[(&str, Option<usize>)] = &[
            (r#"{"id":"a","type":"t"}"#, Some(1)),
            (r#"[{"id":"a","type":"t"},{"id":"b","type":"t"}]"#, Some(2)),
            (
                "{\"id\":\"a\",\"type\":\"t\"}\n\n{\"id\":\"b\",\"type\":\"t\"}\n",
                Some(2),
            ),
            ("{\"id\":\"a\"\nnope", None),
        ];
        for &(text, expected) in cases {
            assert_eq!(
                events_from_text(text).ok().map(|v| v.len()),
                expected,
                "{text:?}"
            );
        }
    }

    fn view(id: &str, lane: Lane, rate_per_sec: f64, burst: u32) -> SubscriberView {
        SubscriberView {
            id: id.into(),
            url: "https://example.com/h".into(),
            event_types: vec!["*".into()],
            rate_per_sec,
            burst,
            max_in_flight: 8,
            timeout_ms: 10_000,
            lane,
            legacy_signature: false,
            created_at_ms: 0,
            updated_at_ms: 0,
            active_secrets: 1,
            disabled: false,
            disabled_reason: None,
            disabled_at_ms: None,
            failing_since_ms: None,
            customer: None,
            secret: None,
        }
    }

    fn stats(
        (pending, in_flight, sent, dead): (i64, i64, i64, i64),
        paused_until_ms: Option<i64>,
        breaker: BreakerState,
        last_error: Option<(&str, i64)>,
    ) -> SubscriberStats {
        SubscriberStats {
            pending,
            in_flight,
            sent,
            dead,
            tokens: 0.0,
            paused_until_ms,
            breaker: fanout_core::breaker::BreakerView {
                state: breaker,
                consecutive_failures: 0,
                open_until_ms: None,
            },
            last_error: last_error.map(|(e, _)| e.to_string()),
            last_error_at_ms: last_error.map(|(_, at)| at),
            stalled: None,
            limiter_error: None,
        }
    }

    #[test]
    fn clock_warning_from_the_metrics() {
        let metrics = "# TYPE fanout_daemons gauge\nfanout_daemons 2\n\
                       # TYPE fanout_clock_offset_seconds gauge\nfanout_clock_offset_seconds -59.998\n";
        assert_eq!(clock_offset(metrics), Some(-59.998));
        assert_eq!(clock_offset("fanout_daemons 1\n"), None);
        assert_eq!(
            clock_line(-59.998).as_deref(),
            Some(
                "clock: this daemon's host is 60.0 s ahead of the PostgreSQL server's (the \
                 daemon keeps the server's time; set the host's clock right)"
            )
        );
        assert!(clock_line(2.5).is_some_and(|l| l.contains("2.5 s behind")));
        assert_eq!(clock_line(0.9), None);
        assert_eq!(clock_line(-1.0), None);
        assert_eq!(clock_line(0.0), None);
    }

    #[test]
    fn retention_line_table() {
        let v: RetentionView = serde_json::from_value(json!({ "retain_sent": "7d",
            "retain_dead": "forever", "removed_sent": 120, "removed_dead": 3,
            "removed_attempts": 130, "removed_events": 121, "oldest_sent_at_ms": 3_600_000,
            "oldest_dead_at_ms": null, "last_run_at_ms": 7_170_000, "longest_step_ms": 4.5 }))
        .unwrap();
        assert_eq!(
            retention_line(&v, 7_200_000),
            "retention: sent kept 7d (oldest 1h00m ago), dead kept forever (none kept); removed \
             120 sent, 3 dead, 130 attempts, 121 events; last pass 30s ago"
        );
    }

    #[test]
    fn status_table_shows_backlog_pause_breaker_and_last_error() {
        let mut gone = view("gone", Lane::Origin, 1.0, 1);
        gone.disabled = true;
        gone.disabled_reason = Some("the endpoint answered 410 Gone".into());
        let v = SubscriberList {
            subscribers: vec![
                ViewWithStats {
                    view: view("partner", Lane::Edge, 10.0, 20),
                    stats: Some(stats(
                        (120, 8, 4000, 2),
                        Some(61_000),
                        BreakerState::Closed,
                        Some(("429: rate limited", 55_000)),
                    )),
                },
                ViewWithStats {
                    view: view("crm", Lane::Auto, 2.5, 5),
                    stats: Some(SubscriberStats {
                        stalled: Some(crate::model::StallView {
                            since_ms: 15_000,
                            not_before_ms: None,
                            next_due_ms: Some(0),
                            paused_until_ms: None,
                            breaker: BreakerState::Open,
                        }),
                        ..stats((0, 0, 7, 0), None, BreakerState::Open, None)
                    }),
                },
                ViewWithStats {
                    view: view("new", Lane::Origin, 100.0, 100),
                    stats: Some(stats((0, 0, 0, 0), None, BreakerState::Closed, None)),
                },
                ViewWithStats {
                    view: gone,
                    stats: Some(stats((3, 0, 0, 1), None, BreakerState::Open, None)),
                },
            ],
        };
        let t = status_table(&v, 60_000);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(
            lines[0].starts_with("SUBSCRIBER  LANE    RATE/S  BURST  PENDING"),
            "{t}"
        );
        for (line, cells) in lines[1..].iter().zip([
            &[
                "partner",
                "edge",
                "10",
                "20",
                "120",
                "8",
                "4000",
                "2",
                "paused 1s",
                "5s ago: 429: rate limited",
            ][..],
            &[
                "crm",
                "auto",
                "2.5",
                "5",
                "0",
                "0",
                "7",
                "0",
                "STALLED 45s (due work, nothing sent), breaker open",
            ][..],
            &["new", "origin", "100", "100", "0", "0", "0", "0", "ok"][..],
            &[
                "gone",
                "origin",
                "1",
                "1",
                "3",
                "0",
                "0",
                "1",
                "disabled: the endpoint answered 410 Gone, breaker open",
            ][..],
        ]) {
            let mut rest = *line;
            for cell in cells {
                let at = rest
                    .find(cell)
                    .unwrap_or_else(|| panic!("{cell} in {line}"));
                rest = &rest[at + cell.len()..];
            }
        }
        assert_eq!(
            status_table(
                &SubscriberList {
                    subscribers: vec![]
                },
                0
            ),
            "no subscribers\n"
        );
    }

    #[test]
    fn deliveries_table_and_detail() {
        let dead = DeliveryView {
            id: "dlv_1".into(),
            subscriber_id: "s".into(),
            event_id: "e1".into(),
            event_type: "video.x".into(),
            status: Status::Dead,
            attempt_count: 3,
            next_attempt_at_ms: None,
            last_error: Some("gone".into()),
            created_at_ms: 0,
            updated_at_ms: 0,
            attempts: None,
        };
        let v = DeliveryList {
            deliveries: vec![dead.clone()],
            next: Some("dlv_1".into()),
        };
        let t = deliveries_table(&v);
        assert!(
            t.starts_with("ID     SUBSCRIBER  EVENT  TYPE     STATUS  ATTEMPTS  LAST ERROR\n"),
            "{t}"
        );
        assert!(
            t.contains("dlv_1  s           e1     video.x  dead    3         gone\n"),
            "{t}"
        );
        assert!(t.contains("more after dlv_1"), "{t}");
        let d = DeliveryView {
            status: Status::Sent,
            attempts: Some(vec![AttemptRecordView {
                attempt: 1,
                at_ms: 5,
                lane: Lane::Edge,
                outcome: AttemptOutcome::Failed,
                status: Some(503),
                latency_ms: Some(40),
                error: None,
                response_body: Some("busy".into()),
            }]),
            ..dead
        };
        let t = delivery_detail(&d);
        assert!(t.contains("status              sent\n"), "{t}");
        assert!(
            t.contains("1        5        edge  failed   503     40"),
            "{t}"
        );
    }

    #[test]
    fn load_arguments() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("fanout").chain(args.iter().copied()))
                .map(|c| match c.command {
                    Command::Load(l) => (l.workers, l.duration.as_millis(), l.rate, l.burst),
                    other => panic!("{other:?}"),
                })
                .map_err(|e| e.kind())
        };
        assert_eq!(
            parse(&[
                "load",
                "--url",
                "http://127.0.0.1:1/",
                "--duration",
                "1500ms"
            ]),
            Ok((8, 1500, 10.0, 20))
        );
        assert_eq!(
            parse(&[
                "load",
                "--edge-url",
                "http://127.0.0.1:8787",
                "--edge-key",
                "whsec_x",
                "--rate",
                "5",
                "--burst",
                "7",
                "--workers",
                "2"
            ]),
            Ok((2, 10_000, 5.0, 7))
        );
        assert!(parse(&["load"]).is_err(), "a target is required");
        assert!(
            parse(&["load", "--edge-url", "http://127.0.0.1:8787"]).is_err()
                || std::env::var("FANOUT_EDGE_KEY").is_ok()
        );
        assert!(parse(&["load", "--url", "http://x/", "--duration", "soon"]).is_err());
    }

    #[test]
    fn customers_table_lists_weight_cap_and_subscribers() {
        let c = |id: &str, weight, cap, subscribers| crate::customer::CustomerView {
            id: id.into(),
            weight,
            max_in_flight: cap,
            subscribers,
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        let t = customers_table(&[c("acme", 4, Some(20), 3), c("globex", 1, None, 0)]);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[1], ["acme", "4", "20", "3"]);
        assert_eq!(lines[2], ["globex", "1", "-", "0"]);
    }

    #[test]
    fn cli_parses() {
        Cli::command_check();
    }

    impl Cli {
        fn command_check() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
            let cli = Cli::try_parse_from([
                "fanout",
                "serve",
                "--db",
                "x.db",
                "--allow-loopback",
                "--max-attempts",
                "3",
            ])
            .unwrap();
            match cli.command {
                Command::Serve(s) => {
                    assert_eq!(s.settings.allow_loopback, Some(true));
                    assert_eq!(s.settings.max_attempts, Some(3));
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
