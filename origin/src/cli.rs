//! The `fanout` command line: `serve`, and client commands that talk to a running daemon's API
//! (`subscriber add|list|remove`, `send`, `deliveries`, `replay`).

use std::io::Read as _;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use crate::config::{Settings, DEFAULT_LISTEN};

#[derive(Debug, Parser)]
#[command(
    name = "fanout",
    version,
    about = "Rate-limited webhook fan-out: the origin daemon and its client"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: ledger, dispatcher and HTTP API
    Serve(ServeArgs),
    /// Manage subscribers
    Subscriber {
        #[command(subcommand)]
        command: SubscriberCommand,
    },
    /// Send events (one JSON object, an array, or one object per line) from a file or stdin
    Send(SendArgs),
    /// List deliveries, e.g. `fanout deliveries --status dead`
    Deliveries(DeliveriesArgs),
    /// Replay one delivery by id, or every delivery matching the filters (dead by default)
    Replay(ReplayArgs),
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
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a subscriber (its unfinished deliveries go dead)
    Remove {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
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
    #[arg(long)]
    pub lane: Option<String>,
    /// Also send the legacy X-Fanout-Signature header
    #[arg(long)]
    pub legacy_signature: bool,
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
    #[command(flatten)]
    pub client: ClientArgs,
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

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Value, ClientError> {
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
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status >= 400 {
            let message = value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ClientError::Api { status, message });
        }
        Ok(value)
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

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Run a client command, printing the daemon's answer as JSON.
pub async fn run_client(command: Command) -> Result<(), ClientError> {
    match command {
        Command::Serve(_) => Err(ClientError::Input("serve is not a client command".into())),
        Command::Subscriber { command } => match command {
            SubscriberCommand::Add(a) => {
                let client = Client::new(&a.client)?;
                let types = if a.event_types.is_empty() {
                    vec!["*".to_string()]
                } else {
                    a.event_types
                };
                let mut body = json!({ "id": a.id, "url": a.url, "event_types": types });
                let obj = body
                    .as_object_mut()
                    .ok_or_else(|| ClientError::Input("internal".into()))?;
                if let Some(v) = a.rate_per_sec {
                    obj.insert("rate_per_sec".into(), json!(v));
                }
                if let Some(v) = a.burst {
                    obj.insert("burst".into(), json!(v));
                }
                if let Some(v) = a.max_in_flight {
                    obj.insert("max_in_flight".into(), json!(v));
                }
                if let Some(v) = a.timeout_ms {
                    obj.insert("timeout_ms".into(), json!(v));
                }
                if let Some(v) = a.lane {
                    obj.insert("lane".into(), json!(v));
                }
                if a.legacy_signature {
                    obj.insert("legacy_signature".into(), json!(true));
                }
                let v = client
                    .call(
                        reqwest::Method::POST,
                        "/v1/subscribers",
                        Some(body.to_string().into_bytes()),
                    )
                    .await?;
                print(&v);
                Ok(())
            }
            SubscriberCommand::List { client } => {
                let v = Client::new(&client)?
                    .call(reqwest::Method::GET, "/v1/subscribers", None)
                    .await?;
                print(&v);
                Ok(())
            }
            SubscriberCommand::Remove { id, client } => {
                let path = format!("/v1/subscribers/{}", encode(&id));
                let v = Client::new(&client)?
                    .call(reqwest::Method::DELETE, &path, None)
                    .await?;
                print(&v);
                Ok(())
            }
        },
        Command::Send(a) => {
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
            for chunk in events.chunks(1000) {
                let body =
                    serde_json::to_vec(chunk).map_err(|e| ClientError::Input(e.to_string()))?;
                let v = client
                    .call(reqwest::Method::POST, "/v1/events", Some(body))
                    .await?;
                for e in v
                    .get("events")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if e.get("duplicate").and_then(Value::as_bool) == Some(true) {
                        dup += 1;
                    } else {
                        new += 1;
                    }
                    deliveries += e.get("deliveries").and_then(Value::as_u64).unwrap_or(0);
                }
            }
            print(&json!({ "events": new, "duplicates": dup, "deliveries": deliveries }));
            Ok(())
        }
        Command::Deliveries(a) => {
            let client = Client::new(&a.client)?;
            let v = match &a.id {
                Some(id) => {
                    client
                        .call(
                            reqwest::Method::GET,
                            &format!("/v1/deliveries/{}", encode(id)),
                            None,
                        )
                        .await?
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
                    client
                        .call(reqwest::Method::GET, &format!("/v1/deliveries{q}"), None)
                        .await?
                }
            };
            print(&v);
            Ok(())
        }
        Command::Replay(a) => {
            let client = Client::new(&a.client)?;
            let v = match &a.id {
                Some(id) => {
                    client
                        .call(
                            reqwest::Method::POST,
                            &format!("/v1/deliveries/{}/replay", encode(id)),
                            None,
                        )
                        .await?
                }
                None => {
                    let body = json!({ "subscriber": a.subscriber, "status": a.status, "since": a.since, "until": a.until });
                    client
                        .call(
                            reqwest::Method::POST,
                            "/v1/replay",
                            Some(body.to_string().into_bytes()),
                        )
                        .await?
                }
            };
            print(&v);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
