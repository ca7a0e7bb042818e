//! Test support: the daemon in-process on port 0 (or the real binary), real SQLite files in a
//! temp dir, and real subscriber HTTP servers on 127.0.0.1:0 that record what they receive.
// Test support: a failed unwrap is a failed test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use fanout_origin::config::{Config, Settings};
use serde_json::{json, Value};

pub const TOKEN: &str = "test-token-0123456789";

/// Poll `check` until it holds or `timeout` passes.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Subscribers

#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// How a subscriber answers.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            headers: vec![],
            body: String::new(),
            delay: Duration::ZERO,
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Answer {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn body(mut self, b: &str) -> Answer {
        self.body = b.into();
        self
    }
    pub fn delay(mut self, d: Duration) -> Answer {
        self.delay = d;
        self
    }
}

type Behaviour = Arc<dyn Fn(&Received, usize) -> Answer + Send + Sync>;

#[derive(Clone)]
struct SubState {
    log: Arc<Mutex<Vec<Received>>>,
    behaviour: Arc<Mutex<Behaviour>>,
}

pub struct Subscriber {
    pub url: String,
    log: Arc<Mutex<Vec<Received>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    task: tokio::task::JoinHandle<()>,
}

async fn record(
    State(s): State<SubState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let rec = Received {
        path: uri.path().to_string(),
        headers,
        body,
        at: Instant::now(),
    };
    let n = {
        let mut log = s.log.lock().unwrap();
        log.push(rec.clone());
        log.len()
    };
    let behaviour = s.behaviour.lock().unwrap().clone();
    let answer = behaviour(&rec, n);
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    let mut resp = (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
    for (k, v) in answer.headers {
        resp.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            axum::http::HeaderValue::from_str(&v).unwrap(),
        );
    }
    resp
}

impl Subscriber {
    /// A subscriber that answers 200 to everything.
    pub async fn ok() -> Subscriber {
        Subscriber::start(|_, _| Answer::status(200)).await
    }

    pub async fn start(
        f: impl Fn(&Received, usize) -> Answer + Send + Sync + 'static,
    ) -> Subscriber {
        let log = Arc::new(Mutex::new(Vec::new()));
        let behaviour: Arc<Mutex<Behaviour>> = Arc::new(Mutex::new(Arc::new(f)));
        let state = SubState {
            log: log.clone(),
            behaviour: behaviour.clone(),
        };
        let app = axum::Router::new().fallback(record).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Subscriber {
            url,
            log,
            behaviour,
            task,
        }
    }

    /// Change how it answers from now on.
    pub fn answer(&self, f: impl Fn(&Received, usize) -> Answer + Send + Sync + 'static) {
        *self.behaviour.lock().unwrap() = Arc::new(f);
    }

    pub fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Distinct `webhook-id`s received and how many requests repeated one.
    pub fn distinct_ids(&self) -> (std::collections::BTreeSet<String>, usize) {
        let log = self.log.lock().unwrap();
        let ids: std::collections::BTreeSet<String> = log
            .iter()
            .filter_map(|r| r.header("webhook-id").map(str::to_string))
            .collect();
        let dupes = log.len() - ids.len();
        (ids, dupes)
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon

/// An HTTP client for the daemon's API.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    http: reqwest::Client,
}

impl Api {
    /// `fanout ARGS… --server BASE` (the real binary, as a client) with the daemon's token:
    /// (succeeded, stdout, stderr).
    pub async fn fanout(&self, args: &[&str]) -> (bool, String, String) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let base = self.base.clone();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
                .args(&args)
                .args(["--server", &base])
                .env("FANOUT_API_TOKEN", TOKEN)
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .unwrap()
    }

    pub fn new(base: String) -> Api {
        Api {
            base,
            token: TOKEN.into(),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        auth: bool,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.base));
        if auth {
            req = req.bearer_auth(&self.token);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.raw("GET", path, None, true).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.raw("POST", path, Some(body.to_string()), true).await
    }

    /// Create a subscriber; returns its secret.
    pub async fn subscriber(&self, spec: Value) -> String {
        let (status, body) = self.post("/v1/subscribers", spec.clone()).await;
        assert_eq!(status, 201, "creating {spec}: {body}");
        body["secret"].as_str().unwrap().to_string()
    }

    pub async fn events(&self, events: Value) -> Value {
        let (status, body) = self.post("/v1/events", events).await;
        assert_eq!(status, 202, "{body}");
        body
    }

    pub async fn deliveries(&self, query: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/v1/deliveries?{query}")).await;
        assert_eq!(status, 200, "{body}");
        body["deliveries"].as_array().unwrap().clone()
    }

    pub async fn count(&self, query: &str) -> usize {
        self.deliveries(&format!("{query}&limit=10000")).await.len()
    }
}

/// The ledger the daemon tests run on: SQLite, or with `FANOUT_TEST_LEDGER=postgres` a
/// throwaway PostgreSQL server per daemon (scripts/test.sh runs the suite both ways).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn backend() -> Backend {
    match std::env::var("FANOUT_TEST_LEDGER").as_deref() {
        Ok("postgres") => Backend::Postgres,
        Ok("sqlite") | Err(_) => Backend::Sqlite,
        Ok(other) => panic!("FANOUT_TEST_LEDGER={other:?}: expected sqlite or postgres"),
    }
}

/// The daemon running in-process on port 0.
pub struct Daemon {
    pub api: Api,
    pub dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The PostgreSQL server of its ledger, when the tests run on PostgreSQL (stopped after
    /// the daemon).
    pub pg: Option<pg::PgServer>,
}

pub fn settings(dir: &std::path::Path) -> Settings {
    Settings {
        db: Some(dir.join("fanout.db")),
        listen: Some("127.0.0.1:0".into()),
        api_token: Some(TOKEN.into()),
        allow_loopback: Some(true),
        max_attempts: Some(3),
        backoff_scale: Some(0.01),
        ..Default::default()
    }
}

impl Daemon {
    pub async fn start() -> Daemon {
        Daemon::start_with(|s| s).await
    }

    pub async fn start_with(adjust: impl FnOnce(Settings) -> Settings) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut base = settings(dir.path());
        let pg = match backend() {
            Backend::Sqlite => None,
            Backend::Postgres => {
                let server = pg::PgServer::start();
                base.db = Some(server.database("fanout").await.into());
                Some(server)
            }
        };
        let (cfg, _) = Config::from_settings(adjust(base)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            fanout_origin::run(cfg, listener, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        let api = Api::new(base);
        let probe = api.clone();
        wait_for("healthz", Duration::from_secs(10), || {
            let p = probe.clone();
            async move { p.raw("GET", "/healthz", None, false).await.0 == 200 }
        })
        .await;
        Daemon {
            api,
            dir,
            stop: Some(tx),
            task: Some(task),
            pg,
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

/// The real `fanout` binary as a child process.
pub struct Binary {
    pub api: Api,
    pub child: Child,
}

pub use pg::free_port;

impl Binary {
    pub async fn start(db: &std::path::Path, extra: &[&str]) -> Binary {
        Binary::start_at(free_port(), db, extra).await
    }

    /// On a given port (a daemon restarted in the same place).
    pub async fn start_at(port: u16, db: &std::path::Path, extra: &[&str]) -> Binary {
        Binary::start_env(port, db, extra, &[]).await
    }

    /// On a given port, with these variables added to its environment.
    pub async fn start_env(
        port: u16,
        db: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Binary {
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "serve",
            "--db",
            db.to_str().unwrap(),
            "--listen",
            &listen,
            "--allow-loopback",
        ];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(&args)
            .env("FANOUT_API_TOKEN", TOKEN)
            .env("FANOUT_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let api = Api::new(format!("http://{listen}"));
        let probe = api.clone();
        wait_for("the binary's healthz", Duration::from_secs(20), || {
            let p = probe.clone();
            async move {
                match p.http.get(format!("{}/healthz", p.base)).send().await {
                    Ok(r) => r.status().as_u16() == 200,
                    Err(_) => false,
                }
            }
        })
        .await;
        Binary { api, child }
    }

    /// SIGTERM, and wait for it to exit: a graceful stop.
    pub fn terminate(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap();
    }

    /// One sample of its `/metrics` (0 when absent): `name{labels}` exactly as exposed.
    pub async fn metric(&self, sample: &str) -> f64 {
        let (_, body) = self.api.raw("GET", "/metrics", None, false).await;
        let text = body.as_str().unwrap_or_default().to_string();
        text.lines()
            .filter_map(|l| l.strip_prefix(sample))
            .filter_map(|rest| rest.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Wait until this daemon's dispatcher sees `n` daemons sharing its ledger.
    pub async fn sees_daemons(&self, n: usize) {
        wait_for(
            &format!("{n} daemons seen"),
            Duration::from_secs(10),
            || async { self.metric("fanout_daemons").await == n as f64 },
        )
        .await;
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sub_spec(id: &str, url: &str, types: &[&str]) -> Value {
    json!({ "id": id, "url": url, "event_types": types, "rate_per_sec": 1000, "burst": 1000, "max_in_flight": 32, "lane": "origin" })
}

pub fn events(prefix: &str, n: usize, ty: &str) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({ "id": format!("{prefix}_{i:05}"), "type": ty, "n": i }))
            .collect(),
    )
}

/// The secret alerts are signed with in the tests that receive them.
pub fn alert_secret() -> fanout_core::sign::Secret {
    fanout_core::sign::Secret::from_bytes(&[42u8; 32]).unwrap()
}

/// Every alert the operator endpoint `op` received, each one's Standard Webhooks signature
/// verified with [`alert_secret`], parsed.
pub fn signed_alerts(op: &Subscriber) -> Vec<Value> {
    let now_secs = fanout_origin::time::now_ms() / 1000;
    op.received()
        .iter()
        .map(|r| {
            fanout_core::sign::verify(
                &[alert_secret()],
                r.header("webhook-id"),
                r.header("webhook-timestamp"),
                r.header("webhook-signature"),
                &r.body,
                now_secs,
            )
            .unwrap_or_else(|e| panic!("alert signature refused: {e:?}"));
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["id"].as_str(), r.header("webhook-id"), "{v}");
            assert!(v["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");
            v
        })
        .collect()
}

pub mod pg;
