//! `fanout listen`: a receiver on `127.0.0.1:--port` registered with the daemon as a temporary
//! subscriber (`listen_<host>_<port>`). It verifies each webhook's signature with the secret
//! the daemon gave it (the shared core's `sign::verify`), answers as its flags say
//! (`reply::decide`, fed one random draw per webhook), forwards with `--forward-to`, prints
//! one line per webhook on stdout, and removes its subscriber on Ctrl-C or SIGTERM.
//!
//! A listener killed with -9 cannot remove anything itself, so it leaves a *reaper*: a second
//! `fanout` process in its own process group (Ctrl-C and a kill of the listener's group do not
//! reach it) that holds the other end of a pipe from the listener. When the pipe closes without
//! the listener having said it removed its subscriber, the reaper removes it (retrying while
//! the daemon is unreachable, for up to [`REAPER_PATIENCE`]) and exits. Only a subscriber
//! created at the moment this listener registered is removed, never a later listener's. Should
//! the reaper die too, the next `fanout listen` on the same port replaces the leftover (same
//! id, same URL), and meanwhile the daemon's breaker and `--disable-after` bound its failures.
//! This needs nothing of the daemon, so it works with any daemon and either ledger.

pub mod reply;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use clap::Args;
use fanout_core::sign::{self, Secret};
use tokio::io::AsyncWriteExt as _;

use super::client::{encode, Client, ClientArgs, ClientError};
use crate::api::views::{SubscriberInput, SubscriberView};
use crate::model::Lane;
use reply::{Decision, Policy, Seen};

/// How long a reaper keeps trying to remove its subscriber while the daemon is unreachable.
pub const REAPER_PATIENCE: Duration = Duration::from_secs(600);
/// What the listener writes to its reaper: the subscriber exists (with its `created_at_ms`),
/// and, later, it removed the subscriber itself.
const SAY_REGISTERED: &str = "registered";
const SAY_REMOVED: &str = "removed";
/// The largest webhook body the receiver reads: well past any event or batch the daemon
/// sends, so none is refused for its size.
const MAX_WEBHOOK_BYTES: usize = 16 << 20;
/// How long answers under way may take to finish once the listener is told to stop.
const DRAIN: Duration = Duration::from_secs(2);
/// How long a forward may take before the webhook is answered 502.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

fn parse_lane(s: &str) -> Result<Lane, String> {
    Lane::parse(s).ok_or_else(|| format!("{s:?} is not a lane: edge, origin or auto"))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a share between 0 and 1, like 0.3")),
    }
}

fn parse_status(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(n) if (200..=599).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not an HTTP status from 200 to 599")),
    }
}

fn parse_forward(s: &str) -> Result<String, String> {
    match url::Url::parse(s) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(s.to_string()),
        _ => Err(format!("{s:?} is not an http:// or https:// URL")),
    }
}

#[derive(Debug, Args)]
pub struct ListenArgs {
    /// Port of the receiver on 127.0.0.1 (0: any free port)
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// Event types to receive: patterns like video.* (repeatable, or comma-separated)
    /// [default: *]
    #[arg(long, value_delimiter = ',')]
    pub events: Vec<String>,
    /// Also send each webhook (its body and webhook-* headers) to this URL and answer the
    /// daemon what it answers (502 when it cannot be reached) [default: none]
    #[arg(long, value_parser = parse_forward, conflicts_with = "status")]
    pub forward_to: Option<String>,
    /// Answer every verified webhook with this status (a webhook that fails verification is
    /// always answered 401)
    #[arg(long, default_value_t = 200, value_parser = parse_status)]
    pub status: u16,
    /// Answer this share of webhooks (0 to 1, drawn per webhook) with 503
    #[arg(long, default_value_t = 0.0, value_parser = parse_rate)]
    pub fail_rate: f64,
    /// Add `Retry-After: SECS` to every error answer; alone, answer every webhook 429 with it
    /// [default: none]
    #[arg(long, value_name = "SECS")]
    pub retry_after: Option<u64>,
    /// Wait this long before answering each webhook (e.g. 2s; past the subscriber's timeout
    /// the daemon sees a timeout) [default: none, answer at once]
    #[arg(long, value_parser = crate::duration::parse_flag)]
    pub delay: Option<Duration>,
    /// The temporary subscriber's lane: origin (the daemon sends, and reaches 127.0.0.1),
    /// edge (a local `wrangler dev` edge, as scripts/dev.sh runs) or auto
    #[arg(long, value_parser = parse_lane, default_value = "origin")]
    pub lane: Lane,
    /// Print each webhook's body under its line
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The hidden `fanout listen-reaper` a listener starts: see the module doc.
#[derive(Debug, Args)]
pub struct ReaperArgs {
    pub id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What the receiver's handler needs.
struct Receiver {
    secrets: Vec<Secret>,
    policy: Policy,
    forward_to: Option<String>,
    delay: Option<Duration>,
    verbose: bool,
    http: reqwest::Client,
}

/// `fanout listen`.
pub(super) async fn listen(a: ListenArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let socket = tokio::net::TcpListener::bind(("127.0.0.1", a.port))
        .await
        .map_err(|e| {
            ClientError::Input(format!(
                "cannot receive on 127.0.0.1:{}: {e} (another fanout listen? choose a --port)",
                a.port
            ))
        })?;
    let port = socket
        .local_addr()
        .map_err(|e| ClientError::Input(e.to_string()))?
        .port();
    let id = reply::subscriber_id(&hostname(), port);
    let url = format!("http://127.0.0.1:{port}/");
    let events = if a.events.is_empty() {
        vec!["*".to_string()]
    } else {
        a.events.clone()
    };
    let mut reaper = spawn_reaper(&id, &a.client)?;
    let created = register(&client, &id, &url, &events, a.lane).await?;
    tell(
        &mut reaper,
        &format!("{SAY_REGISTERED} {}", created.created_at_ms),
    )
    .await;
    let secret = created
        .secret
        .as_deref()
        .and_then(|s| Secret::parse(s).ok())
        .ok_or_else(|| ClientError::Input("the daemon's answer holds no usable secret".into()))?;
    // Caught from here on: the banner's "Ready." invites a Ctrl-C at once.
    let stop = crate::cli::stop_signal_armed();
    eprint!("{}", banner(&a, &created, &events));
    let receiver = Arc::new(Receiver {
        secrets: vec![secret],
        policy: Policy {
            status: a.status,
            fail_rate: a.fail_rate,
            retry_after: a.retry_after,
            forwarding: a.forward_to.is_some(),
        },
        forward_to: a.forward_to.clone(),
        delay: a.delay,
        verbose: a.verbose,
        http: reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(FORWARD_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Input(e.to_string()))?,
    });
    let app = axum::Router::new()
        .fallback(receive)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_WEBHOOK_BYTES))
        .with_state(receiver);
    // On Ctrl-C, answers under way (a `--delay`) get `DRAIN` to finish, not their whole delay.
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve = axum::serve(socket, app).with_graceful_shutdown(async move {
        stop.await;
        let _ = stopping.send(());
    });
    let served = tokio::select! {
        served = std::future::IntoFuture::into_future(serve) => served,
        _ = async {
            let _ = stopped.await;
            tokio::time::sleep(DRAIN).await;
        } => Ok(()),
    };
    let path = format!("/v1/subscribers/{}", encode(&id));
    let removed = client
        .call::<crate::api::views::Deleted>(reqwest::Method::DELETE, &path, None)
        .await;
    match removed {
        Ok(_) | Err(ClientError::Api { status: 404, .. }) => {
            tell(&mut reaper, SAY_REMOVED).await;
            eprintln!("fanout listen: stopped; removed subscriber {id}");
        }
        // The reaper sees the pipe close without `removed` and keeps trying.
        Err(e) => {
            return Err(ClientError::Input(format!(
                "stopped, but could not remove subscriber {id} ({e}); its reaper keeps trying \
                 for {} minutes",
                REAPER_PATIENCE.as_secs() / 60
            )))
        }
    }
    drop(reaper.stdin.take());
    served.map_err(|e| ClientError::Input(format!("the receiver failed: {e}")))
}

/// The lines `fanout listen` starts with (on stderr): where it receives, as whom, the secret
/// to verify forwarded webhooks with, and how it answers.
fn banner(a: &ListenArgs, created: &SubscriberView, events: &[String]) -> String {
    let mut answers = match (&a.forward_to, a.retry_after) {
        (Some(to), _) => format!("forwarding to {to} and answering what it answers"),
        (None, Some(s)) if a.status < 400 && a.fail_rate <= 0.0 => {
            format!("answering 429 with Retry-After: {s}")
        }
        (None, _) => format!("answering {}", a.status),
    };
    if a.fail_rate > 0.0 {
        answers.push_str(&format!(", 503 to {}% of webhooks", a.fail_rate * 100.0));
    }
    if let Some(s) = a
        .retry_after
        .filter(|_| a.status >= 400 || a.fail_rate > 0.0)
    {
        answers.push_str(&format!(", Retry-After: {s} on errors"));
    }
    if let Some(d) = a.delay {
        answers.push_str(&format!(
            ", after {}",
            crate::duration::format_duration(d.as_millis() as i64)
        ));
    }
    format!(
        "fanout listen: receiving on {} as subscriber {} (events {}, lane {})\n  \
         signing secret {}\n  {answers}; a webhook that fails verification is answered 401\n\
         Ready. Ctrl-C removes the subscriber and stops.\n",
        created.url,
        created.id,
        events.join(","),
        created.lane.as_str(),
        created.secret.as_deref().unwrap_or("?"),
    )
}

/// Create the temporary subscriber. A leftover of an earlier listener on this port (same id,
/// same URL) is replaced; a daemon that refuses 127.0.0.1 says which flag admits it.
async fn register(
    client: &Client,
    id: &str,
    url: &str,
    events: &[String],
    lane: Lane,
) -> Result<SubscriberView, ClientError> {
    let input = SubscriberInput {
        id: Some(id.to_string()),
        url: Some(url.to_string()),
        event_types: Some(events.to_vec()),
        lane: Some(lane),
        ..SubscriberInput::default()
    };
    let body = serde_json::to_vec(&input).map_err(|e| ClientError::Input(e.to_string()))?;
    let post = || {
        client.call::<SubscriberView>(reqwest::Method::POST, "/v1/subscribers", Some(body.clone()))
    };
    match post().await {
        Err(ClientError::Api { status: 409, .. }) => {
            let path = format!("/v1/subscribers/{}", encode(id));
            let old: SubscriberView = client.call(reqwest::Method::GET, &path, None).await?;
            if old.url != url {
                return Err(ClientError::Input(format!(
                    "a subscriber named {id} exists and is not a listener's (its URL is {}): remove it or choose another --port",
                    old.url
                )));
            }
            client
                .call::<crate::api::views::Deleted>(reqwest::Method::DELETE, &path, None)
                .await?;
            eprintln!("fanout listen: replaced {id}, left by an earlier listener on this port");
            post().await
        }
        Err(ClientError::Api {
            status,
            code,
            message,
        }) if code == "invalid_url" => Err(ClientError::Input(format!(
            "the daemon refused the receiver's URL {url} ({status}: {message}): a daemon \
             accepts http://127.0.0.1 subscribers only when started with --allow-loopback \
             (FANOUT_ALLOW_LOOPBACK=true), as scripts/dev.sh starts it"
        ))),
        other => other,
    }
}

/// One webhook: verify, decide, forward, wait, print, answer.
async fn receive(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> Response {
    let at_ms = crate::time::host_ms();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let verified = sign::verify(
        &r.secrets,
        header(sign::HEADER_ID),
        header(sign::HEADER_TIMESTAMP),
        header(sign::HEADER_SIGNATURE),
        &body,
        at_ms.div_euclid(1000),
    )
    .map_err(|e| e.to_string());
    let draw = reply::unit(getrandom::u64().unwrap_or(u64::MAX));
    let mut decision = reply::decide(&r.policy, verified.is_ok(), draw);
    let mut forward = None;
    if let (Decision::Forward, Some(to)) = (decision, &r.forward_to) {
        let (result, retry_after) = forward_one(&r.http, to, &headers, body.clone()).await;
        decision = reply::forwarded(&r.policy, result.as_ref().ok().copied(), retry_after);
        forward = Some(result);
    }
    if let Some(d) = r.delay {
        tokio::time::sleep(d).await;
    }
    let (status, retry_after) = match decision {
        Decision::Answer {
            status,
            retry_after,
        } => (status, retry_after),
        // `forwarded` always answers; a forward without a target is a bug here, said as 500.
        Decision::Forward => (500, None),
    };
    print!(
        "{}",
        reply::line(
            &Seen {
                at_ms,
                id: header(sign::HEADER_ID),
                body: &body,
                sequence: header("webhook-sequence"),
                status,
                verified,
                forward,
            },
            r.verbose,
        )
    );
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = code.into_response();
    if let Some(s) = retry_after {
        resp.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from(s));
    }
    resp
}

/// Send one webhook on to `to` with its signature headers: the target's status (or why it
/// could not be reached) and its `Retry-After` in seconds.
async fn forward_one(
    http: &reqwest::Client,
    to: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> (Result<u16, String>, Option<u64>) {
    let mut req = http.post(to).body(body);
    for (name, value) in headers {
        let n = name.as_str();
        if n.starts_with("webhook-") || n == "content-type" || n == sign::HEADER_LEGACY {
            req = req.header(n, value.as_bytes());
        }
    }
    match req.send().await {
        Ok(resp) => {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| fanout_core::retry::parse_retry_after(v, crate::time::host_ms()))
                .map(|ms| ms.div_ceil(1000));
            (Ok(resp.status().as_u16()), retry_after)
        }
        Err(e) if e.is_timeout() => (Err("timed out".into()), None),
        Err(e) if e.is_connect() => (Err("cannot connect".into()), None),
        Err(_) => (Err("request failed".into()), None),
    }
}

/// The machine's name, for the subscriber's id.
fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The reaper

/// Start this listener's reaper: the same binary as `fanout listen-reaper ID`, in its own
/// process group, reading a pipe from this process, silent.
fn spawn_reaper(id: &str, client: &ClientArgs) -> Result<tokio::process::Child, ClientError> {
    let exe = std::env::current_exe().map_err(|e| ClientError::Input(e.to_string()))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["listen-reaper", id])
        .stdin(std::process::Stdio::piped())
        // It holds none of the listener's output, so nothing reading that output waits on it.
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(false);
    for (name, value) in [
        ("FANOUT_SERVER", &client.server),
        ("FANOUT_LISTEN", &client.listen),
        ("FANOUT_API_TOKEN", &client.api_token),
    ] {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    #[cfg(unix)]
    cmd.process_group(0);
    cmd.spawn()
        .map_err(|e| ClientError::Input(format!("cannot start the listener's reaper: {e}")))
}

/// A line to the reaper (best effort: a reaper that is gone cannot be told).
async fn tell(reaper: &mut tokio::process::Child, what: &str) {
    if let Some(stdin) = reaper.stdin.as_mut() {
        let _ = stdin.write_all(format!("{what}\n").as_bytes()).await;
        let _ = stdin.flush().await;
    }
}

/// `fanout listen-reaper ID`: wait for the listener's pipe to close; unless it said it removed
/// its subscriber, remove the one it registered.
pub(super) async fn reap(a: ReaperArgs) -> Result<(), ClientError> {
    use tokio::io::AsyncReadExt as _;
    let mut said = String::new();
    let _ = tokio::io::stdin().read_to_string(&mut said).await;
    let registered_at: Option<i64> = said
        .lines()
        .find_map(|l| l.strip_prefix(SAY_REGISTERED))
        .and_then(|rest| rest.trim().parse().ok());
    let Some(created_at_ms) = registered_at else {
        return Ok(());
    };
    if said.lines().any(|l| l == SAY_REMOVED) {
        return Ok(());
    }
    let client = Client::new(&a.client)?;
    let path = format!("/v1/subscribers/{}", encode(&a.id));
    let deadline = tokio::time::Instant::now() + REAPER_PATIENCE;
    let mut pause = Duration::from_millis(200);
    loop {
        let result = async {
            let now: SubscriberView = client.call(reqwest::Method::GET, &path, None).await?;
            if now.created_at_ms != created_at_ms {
                // A later listener's: not ours to remove.
                return Ok(());
            }
            client
                .call::<crate::api::views::Deleted>(reqwest::Method::DELETE, &path, None)
                .await
                .map(|_| ())
        }
        .await;
        match result {
            Ok(()) | Err(ClientError::Api { status: 404, .. }) => return Ok(()),
            // Refused (the token, say): asking again will not help.
            Err(e @ ClientError::Api { status: ..=499, .. }) => return Err(e),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
        }
    }
}
