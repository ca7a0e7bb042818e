//! Faults the daemon must hold, against the real `fanout` binary: a full ledger, a second
//! daemon on the same ledger, a dispatcher that cannot start, a stored limiter that does not
//! decode, and a thousand half-open connections.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The binary with its stderr in a file (read with [`Run::log`]).
struct Run {
    api: Api,
    child: Child,
    log: PathBuf,
}

// Test support: a failed unwrap is a failed test.
#[allow(clippy::unwrap_used)]
impl Run {
    fn spawn(db: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Run {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let log = db.with_extension(format!("{port}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["serve", "--db", db.to_str().unwrap(), "--listen", &listen])
            .arg("--allow-loopback")
            .args(extra)
            .env("FANOUT_API_TOKEN", TOKEN)
            .env("FANOUT_LOG", "info")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Run {
            api: Api::new(format!("http://{listen}")),
            child,
            log,
        }
    }

    async fn start(db: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Run {
        let run = Run::spawn(db, extra, envs);
        let api = run.api.clone();
        wait_for("healthz 200", Duration::from_secs(20), || {
            let api = api.clone();
            async move { healthz(&api).await.0 == 200 }
        })
        .await;
        run
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for the process to exit on its own; its exit code.
    fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn healthz(api: &Api) -> (u16, Value) {
    match reqwest::Client::new()
        .get(format!("{}/healthz", api.base))
        .timeout(Duration::from_secs(2))
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

// Test support: a failed unwrap is a failed test.
#[allow(clippy::unwrap_used)]
/// Events with ~2 KB bodies, so that a small ledger fills in a few requests.
fn padded(prefix: &str, n: usize) -> Value {
    let pad = "x".repeat(2000);
    Value::Array(
        (0..n)
            .map(|i| json!({ "id": format!("{prefix}_{i:04}"), "type": "t.x", "pad": pad }))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ledger_answers_503_unavailable_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let run = Run::start(&db, &["--max-db-size", "512KiB"], &[]).await;
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for batch in 0..200 {
        let body = padded(&format!("e{batch:03}"), 10);
        let (status, answer) = run.api.post("/v1/events", body.clone()).await;
        match status {
            202 => acknowledged.extend(
                body.as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["id"].as_str().unwrap().to_string()),
            ),
            _ => {
                refused = Some((status, answer));
                break;
            }
        }
    }
    let (status, answer) = refused.expect("the cap never filled");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
    assert!(!acknowledged.is_empty());
    let (status, health) = healthz(&run.api).await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(
        health["problems"][0]["code"], "ledger_unavailable",
        "{health}"
    );
    // Still refused while nothing changed; the daemon stays up.
    let (status, _) = run.api.post("/v1/events", padded("again", 10)).await;
    assert_eq!(status, 503);
    drop(run);

    // Room again (a larger cap): every acknowledged event is there, and ingest accepts.
    let run = Run::start(&db, &["--max-db-size", "64MiB"], &[]).await;
    let stored: Vec<String> = {
        let c = rusqlite::Connection::open(&db).unwrap();
        let mut st = c.prepare("SELECT id FROM events ORDER BY id").unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    acknowledged.sort();
    assert_eq!(stored, acknowledged);
    let (status, answer) = run.api.post("/v1/events", padded("later", 10)).await;
    assert_eq!(status, 202, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_ledger_refuses_naming_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let mut first = Run::start(&db, &[], &[]).await;
    let mut second = Run::spawn(&db, &[], &[]);
    let code = second.exit_code(Duration::from_secs(20));
    assert_ne!(code, Some(0));
    let log = second.log();
    assert!(log.contains("owned by another daemon"), "{log}");
    assert!(log.contains(&format!("pid {}", first.child.id())), "{log}");
    // The first one is unharmed.
    assert_eq!(healthz(&first.api).await.0, 200);
    // kill -9 leaves the lock file behind; it does not block the next start.
    first.kill9();
    let third = Run::start(&db, &[], &[]).await;
    assert_eq!(healthz(&third.api).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_that_cannot_start_stops_the_daemon_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let run = Run::start(&db, &[], &[]).await;
    run.api
        .subscriber(sub_spec("broken", "http://127.0.0.1:9/", &["t.*"]))
        .await;
    drop(run);
    // A row the dispatcher cannot read (a text rate).
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE subscribers SET rate_per_sec = 'fast' WHERE id = 'broken'",
            [],
        )
        .unwrap();
    let mut run = Run::spawn(&db, &[], &[]);
    let code = run.exit_code(Duration::from_secs(20));
    assert_ne!(code, Some(0));
    let log = run.log();
    assert!(log.contains("the dispatcher stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_limiter_that_does_not_decode_starts_empty_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let sub = Subscriber::ok().await;
    let run = Run::start(&db, &[], &[]).await;
    let mut spec = sub_spec("partner", &sub.url, &["t.*"]);
    spec["rate_per_sec"] = json!(1);
    spec["burst"] = json!(20);
    run.api.subscriber(spec).await;
    drop(run);
    // A full bucket written by "another version": a field this one does not know.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE subscribers SET limiter = '{\"bucket\":{\"tokens\":20.0,\"updated_ms\":0,\"unit\":\"ms\"},\"paused_until_ms\":null,\"breaker\":{\"consecutive_failures\":0,\"open_until_ms\":null,\"probe_started_ms\":null}}' WHERE id = 'partner'",
            [],
        )
        .unwrap();
    let run = Run::start(&db, &[], &[]).await;
    let (status, view) = run.api.get("/v1/subscribers/partner?stats=true").await;
    assert_eq!(status, 200, "{view}");
    assert!(
        view["stats"]["limiter_error"]
            .as_str()
            .is_some_and(|e| e.contains("unit")),
        "{view}"
    );
    run.api.events(events("evt_lim", 20, "t.x")).await;
    // From an empty bucket at 1/s: the deliveries go out one a second, never the burst of 20.
    // Waits for the fourth to arrive (so sending works), then reads their arrival times.
    wait_for("four deliveries", Duration::from_secs(15), || async {
        sub.count() >= 4
    })
    .await;
    let at: Vec<Instant> = sub.received().iter().map(|r| r.at).collect();
    let spread = at[3].duration_since(at[0]);
    assert!(
        spread >= Duration::from_millis(2_500),
        "the first four deliveries arrived within {spread:?}: a burst, not 1/s from an empty bucket"
    );
    let log = run.log();
    assert!(
        log.contains("WARN") && log.contains("does not decode") && log.contains("partner"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_half_open_connections_do_not_stop_the_api_and_are_closed() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let run = Run::start(&db, &["--header-timeout", "2s"], &[]).await;
    let addr = run.api.base.trim_start_matches("http://").to_string();
    let mut socks = Vec::new();
    for _ in 0..1000 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /v1/subscri").await.unwrap();
        socks.push(s);
    }
    let opened = Instant::now();
    let (status, _) = healthz(&run.api).await;
    assert_eq!(status, 200);
    let (status, body) = run.api.get("/v1/subscribers").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        opened.elapsed() < Duration::from_millis(1500),
        "the API took {:?} behind 1000 half-open connections",
        opened.elapsed()
    );
    // After the header timeout (2 s, and a little) every one of them has been closed by the
    // server: a read finds the end of the stream (or a 408 and then the end) at once.
    tokio::time::sleep_until((opened + Duration::from_secs(4)).into()).await;
    let mut reads = tokio::task::JoinSet::new();
    for mut s in socks {
        reads.spawn(async move {
            let mut buf = [0u8; 512];
            loop {
                match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return true,
                    Ok(Ok(_)) => continue,
                    Err(_) => return false,
                }
            }
        });
    }
    let mut closed = 0;
    while let Some(was) = reads.join_next().await {
        closed += usize::from(was.unwrap());
    }
    assert_eq!(
        closed, 1000,
        "closed by the server after the header timeout"
    );
}

/// Whether the peer has closed `s` (an end of stream or a reset), without reading from it.
async fn closed_by_peer(s: &tokio::net::tcp::OwnedReadHalf) -> bool {
    use tokio::io::Interest;
    match s.ready(Interest::READABLE).await {
        Ok(r) => r.is_read_closed() || r.is_error(),
        Err(_) => true,
    }
}

/// `--max-connections 50` taken by 15 HTTP/2 connections that answer PINGs and never open a
/// stream, 10 that open one and grant it no flow-control window, and 25 HTTP/1 clients that
/// pipeline requests and never read an answer: `/healthz`
/// and a producer are still answered at once (the reserve: 200, and 503 with `Retry-After`),
/// the producer's events are taken as soon as the server has closed the idle ones (after
/// `--header-timeout`) and the stuck ones (no progress for `--body-timeout`), and every one of
/// the 50 is closed by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_and_unread_pipelines_do_not_hold_the_connection_slots() {
    use tokio::io::AsyncWriteExt as _;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let extra = [
        "--max-connections",
        "50",
        "--header-timeout",
        "2s",
        "--body-timeout",
        "2s",
    ];
    let run = Run::start(&db, &extra, &[]).await;
    let addr = run.api.base.trim_start_matches("http://").to_string();
    // HTTP/2 (prior knowledge): the client answers the server's PINGs by itself; it keeps its
    // handle to open streams and never uses it. Each task ends when the server closes.
    let mut idle = tokio::task::JoinSet::new();
    let (mut held, mut held_streams) = (Vec::new(), Vec::new());
    for i in 0..25 {
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let windowless = i >= 15;
        let (mut streams, conn) = h2::client::Builder::new()
            .initial_window_size(if windowless { 0 } else { 65_535 })
            .handshake::<_, bytes::Bytes>(tcp)
            .await
            .unwrap();
        idle.spawn(async move {
            let _ = conn.await;
        });
        if windowless {
            let req = axum::http::Request::get(format!("http://{addr}/openapi.json"))
                .body(())
                .unwrap();
            streams = streams.ready().await.unwrap();
            let (answer, _) = streams.send_request(req, true).unwrap();
            held.push(answer);
        }
        held_streams.push(streams);
    }
    // HTTP/1: 300 pipelined requests for a 70 KB document, written while the server reads
    // them; nothing is ever read back (and the receive buffer is small).
    let mut stuck = Vec::new();
    let mut writers = tokio::task::JoinSet::new();
    let pipeline = "GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n".repeat(300);
    for _ in 0..25 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let (r, mut w) = sock
            .connect(addr.parse().unwrap())
            .await
            .unwrap()
            .into_split();
        let pipeline = pipeline.clone();
        writers.spawn(async move {
            let _ = w.write_all(pipeline.as_bytes()).await;
            // Keep the write half (dropping it would half-close the connection).
            std::future::pending::<()>().await;
            drop(w);
        });
        stuck.push(r);
    }
    // Every slot is taken (the daemon has accepted them all): a request now is answered only
    // if the daemon keeps an answer for it.
    let filled = Instant::now();
    let (status, body) = healthz(&run.api).await;
    assert_eq!(status, 200, "{body}");
    let producer = reqwest::Client::new();
    let ingest = || {
        producer
            .post(format!("{}/v1/events", run.api.base))
            .bearer_auth(TOKEN)
            .json(&json!({ "id": "evt_slots", "type": "t.x" }))
            .timeout(Duration::from_secs(2))
            .send()
    };
    let first = ingest().await.expect("the producer is answered");
    assert!(
        matches!(first.status().as_u16(), 202 | 503),
        "{}",
        first.status()
    );
    assert!(
        filled.elapsed() < Duration::from_secs(3),
        "answered after {:?}",
        filled.elapsed()
    );
    // The idle and stuck connections are closed by the server, and the producer gets in.
    wait_for(
        "the producer's events taken",
        Duration::from_secs(15),
        || async { matches!(ingest().await, Ok(r) if r.status().as_u16() == 202) },
    )
    .await;
    // Then every one of the 50 is closed by the server.
    let within = Duration::from_secs(15);
    let h2_closed =
        tokio::time::timeout(within, async { while idle.join_next().await.is_some() {} }).await;
    let deadline = tokio::time::Instant::now() + within;
    let mut h1_closed = 0;
    for s in &stuck {
        let closed = tokio::time::timeout_at(deadline, async {
            while !closed_by_peer(s).await {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        h1_closed += usize::from(closed.is_ok());
    }
    assert!(
        h2_closed.is_ok() && h1_closed == 25,
        "not closed by the server: {} HTTP/2, {} HTTP/1",
        idle.len(),
        25 - h1_closed
    );
    writers.abort_all();
    drop((held, held_streams));
}

/// Every error path we can provoke, at `FANOUT_LOG=trace`: the log holds no URL path or query,
/// no response body, no secret, no token, and (stderr being a file) no colour escape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_at_trace_hold_no_secret_path_query_or_body() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let failing = Subscriber::start(|_, _| Answer::status(500).body("BODY-SECRET-500")).await;
    let limited = Subscriber::start(|_, _| {
        Answer::status(429)
            .header("retry-after", "1")
            .body("BODY-SECRET-429")
    })
    .await;
    let slow = Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_secs(3))).await;
    let edge_key = "whsec_ZWRnZS1rZXktZWRnZS1rZXktZWRnZS1rZXkx";
    let alert_secret = "whsec_YWxlcnQta2V5LWFsZXJ0LWtleS1hbGVydC0x";
    let run = Run::start(
        &db,
        &[
            "--max-attempts",
            "1",
            "--dead-alert-threshold",
            "1",
            "--alert-url",
            "http://127.0.0.1:9/alert-secret-path?key=QUERY-SECRET-ALERT",
            "--alert-secret",
            alert_secret,
            "--edge-url",
            "http://127.0.0.1:9/edge-secret-path?k=QUERY-SECRET-EDGE",
            "--edge-key",
            edge_key,
        ],
        &[("FANOUT_LOG", "trace")],
    )
    .await;
    let mut secrets = vec![];
    for (id, url, timeout) in [
        (
            "s_500",
            format!("{}/hook-secret-a?tok=QUERY-SECRET-A", failing.url),
            10_000,
        ),
        (
            "s_429",
            format!("{}/hook-secret-b?tok=QUERY-SECRET-B", limited.url),
            10_000,
        ),
        (
            "s_slow",
            format!("{}/hook-secret-c?tok=QUERY-SECRET-C", slow.url),
            200,
        ),
        (
            "s_refused",
            "http://127.0.0.1:9/hook-secret-d?tok=QUERY-SECRET-D".into(),
            10_000,
        ),
    ] {
        let mut spec = sub_spec(id, &url, &["t.*"]);
        spec["timeout_ms"] = json!(timeout);
        secrets.push(run.api.subscriber(spec).await);
    }
    let mut spec = sub_spec(
        "s_edge",
        &format!("{}/hook-secret-e?tok=QUERY-SECRET-E", failing.url),
        &["t.*"],
    );
    spec["lane"] = json!("edge");
    secrets.push(run.api.subscriber(spec).await);
    run.api.events(events("evt_log", 3, "t.x")).await;
    // A wrong token.
    let mut wrong = run.api.clone();
    wrong.token = "WRONG-TOKEN-SECRET-0123".into();
    assert_eq!(wrong.get("/v1/subscribers").await.0, 401);
    // Wait until every path has run: deaths (500, timeout, refused), the 429, an edge call
    // that failed, and the alert given up after its retries (1 s + 5 s + 30 s).
    wait_for("every error path logged", Duration::from_secs(60), || {
        let log = run.log();
        async move {
            log.contains("edge call failed")
                && log.contains("alert not delivered")
                && log.contains("s_refused")
                && log.contains("s_slow")
        }
    })
    .await;
    assert!(failing.count() > 0 && limited.count() > 0 && slow.count() > 0);
    let log = run.log();
    assert!(
        log.contains("TRACE") || log.contains("DEBUG"),
        "not at trace?"
    );
    let mut forbidden: Vec<String> = [
        "secret-path",
        "hook-secret",
        "QUERY-SECRET",
        "BODY-SECRET",
        "WRONG-TOKEN",
        TOKEN,
        edge_key,
        alert_secret,
        "\u{1b}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    forbidden.extend(secrets);
    for f in &forbidden {
        if let Some(line) = log.lines().find(|l| l.contains(f.as_str())) {
            panic!("the log holds {f:?}: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let run = Run::start(&db, &["--log-format", "json"], &[]).await;
    let log = run.log();
    let lines: Vec<&str> = log.lines().collect();
    assert!(!lines.is_empty());
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{line}"
        );
    }
    assert!(log.contains("fanout serving"));
}
