//! `fanout listen` as a developer runs it: the real binary against a real daemon, receiving
//! webhooks, verifying them, forwarding to a real server, failing on purpose, and cleaning up
//! after Ctrl-C and after `kill -9`.
// Test support: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{wait_for, Api, Daemon, Subscriber, TOKEN};
use fanout_origin::config::Settings;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A running `fanout listen` with its output read line by line.
struct Listener {
    child: Child,
    /// Its temporary subscriber's id, from the banner.
    id: String,
    /// Its receiver, from the banner.
    url: String,
    /// The signing secret, from the banner.
    secret: String,
    /// What it said on stderr up to its banner.
    said: Vec<String>,
    stdout: mpsc::UnboundedReceiver<String>,
    stderr: mpsc::UnboundedReceiver<String>,
}

fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

async fn next_with(rx: &mut mpsc::UnboundedReceiver<String>, needle: &str) -> String {
    let found = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(line) = rx.recv().await {
            if line.contains(needle) {
                return Some(line);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        Ok(None) => panic!("the listener's output ended without a line holding {needle:?}"),
        Err(_) => panic!("no line holding {needle:?} within 15 s"),
    }
}

/// `fanout listen` on any free port unless `extra` names one.
fn spawn(api: &Api, extra: &[&str]) -> Child {
    let port: &[&str] = if extra.contains(&"--port") {
        &[]
    } else {
        &["--port", "0"]
    };
    Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["listen", "--server", &api.base])
        .args(port)
        .args(extra)
        .env("FANOUT_API_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

impl Listener {
    /// Start one and wait until it says it is ready (its subscriber registered).
    async fn start(api: &Api, extra: &[&str]) -> Listener {
        let mut child = spawn(api, extra);
        let stdout = lines_of(child.stdout.take().unwrap());
        let mut stderr = lines_of(child.stderr.take().unwrap());
        let mut said = Vec::new();
        let first = loop {
            let line = next_with(&mut stderr, "").await;
            said.push(line.clone());
            if line.contains("receiving on") {
                break line;
            }
        };
        // "fanout listen: receiving on http://127.0.0.1:PORT/ as subscriber ID (events …"
        let words: Vec<&str> = first.split_whitespace().collect();
        let url = words[4].to_string();
        let id = words[7].to_string();
        let secret = next_with(&mut stderr, "signing secret").await;
        let secret = secret.split_whitespace().last().unwrap().to_string();
        next_with(&mut stderr, "Ready.").await;
        Listener {
            child,
            id,
            url,
            secret,
            said,
            stdout,
            stderr,
        }
    }

    /// Ctrl-C, and wait for it to exit 0 after saying it removed its subscriber.
    async fn interrupt(mut self) {
        self.signal("-INT");
        next_with(&mut self.stderr, "removed subscriber").await;
        assert!(self.child.wait().unwrap().success());
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([name, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {name}");
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// POST a webhook straight to a listener, signed with `secret`.
async fn post_signed(url: &str, secret: &str, id: &str, body: &str) -> reqwest::Response {
    let secret = fanout_core::sign::Secret::parse(secret).unwrap();
    let now = unix_now();
    reqwest::Client::new()
        .post(url)
        .header("webhook-id", id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", secret.sign(id, now, body.as_bytes()))
        .header("webhook-sequence", "41")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn subscriber_status(api: &Api, id: &str) -> u16 {
    api.get(&format!("/v1/subscribers/{id}")).await.0
}

/// An event arrives, verified and with its id on the line; `--forward-to` hands the same body
/// and signature headers on; a forged webhook is answered 401 and printed NOT VERIFIED; Ctrl-C
/// removes the subscriber and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_verifies_forwards_and_removes_its_subscriber_on_ctrl_c() {
    let d = Daemon::start().await;
    let app = Subscriber::ok().await;
    let to = format!("{}/hooks", app.url);
    let mut l = Listener::start(&d.api, &["--events", "try.*", "--forward-to", &to]).await;
    assert!(l.id.starts_with("listen_"), "{}", l.id);
    let (status, sub) = d.api.get(&format!("/v1/subscribers/{}", l.id)).await;
    assert_eq!(
        (status, sub["lane"].clone()),
        (200, json!("origin")),
        "{sub}"
    );

    let event = json!({"id": "evt_try_1", "type": "try.it", "video": "v_42"});
    d.api.events(event.clone()).await;
    let line = next_with(&mut l.stdout, "evt_try_1").await;
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cols[1..],
        [
            "evt_try_1",
            "try.it",
            "seq",
            cols[4],
            "200",
            "verified",
            "forwarded:",
            "200"
        ],
        "{line}"
    );
    let got = app.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].path, "/hooks");
    assert_eq!(
        serde_json::from_slice::<Value>(&got[0].body).unwrap(),
        event
    );
    assert_eq!(got[0].header("webhook-id"), Some("evt_try_1"));
    assert!(got[0]
        .header("webhook-signature")
        .unwrap()
        .starts_with("v1,"));

    // A webhook signed with another secret: answered 401, shown as not verified, not forwarded.
    let forged = fanout_core::sign::Secret::from_bytes(&[7u8; 32]).unwrap();
    let body = r#"{"id":"evt_forged","type":"try.it"}"#;
    let resp = post_signed(&l.url, &forged.encode(), "evt_forged", body).await;
    assert_eq!(resp.status().as_u16(), 401);
    let line = next_with(&mut l.stdout, "evt_forged").await;
    assert!(
        line.contains(" 401  NOT VERIFIED (no signature matches)"),
        "{line}"
    );
    assert_eq!(app.received().len(), 1, "a forged webhook is not forwarded");

    let id = l.id.clone();
    l.interrupt().await;
    assert_eq!(subscriber_status(&d.api, &id).await, 404);
    d.stop().await;
}

/// `--status 500` makes the daemon retry (attempts on the delivery); after `kill -9` the
/// listener's reaper removes the subscriber, so nothing keeps failing and new events make
/// no deliveries for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_on_purpose_is_retried_and_kill_9_leaves_nothing_behind() {
    let d = Daemon::start_with(|s| Settings {
        max_attempts: Some(8),
        ..s
    })
    .await;
    let mut l = Listener::start(&d.api, &["--events", "fail.*", "--status", "500"]).await;
    let ingested = d
        .api
        .events(json!({"id": "evt_fail_1", "type": "fail.it"}))
        .await;
    assert_eq!(ingested["deliveries"], 1, "{ingested}");
    next_with(&mut l.stdout, "evt_fail_1").await;
    let list = d.api.deliveries(&format!("subscriber={}", l.id)).await;
    let delivery = list[0]["id"].as_str().unwrap().to_string();
    let api = d.api.clone();
    wait_for(
        "a second attempt, both answered 500",
        Duration::from_secs(15),
        || {
            let api = api.clone();
            let path = format!("/v1/deliveries/{delivery}");
            async move {
                let (_, v) = api.get(&path).await;
                let statuses: Vec<Value> = v["attempts"]
                    .as_array()
                    .map(|a| a.iter().map(|t| t["status"].clone()).collect())
                    .unwrap_or_default();
                statuses.len() >= 2 && statuses.iter().all(|s| *s == json!(500))
            }
        },
    )
    .await;

    l.child.kill().unwrap();
    l.child.wait().unwrap();
    let id = l.id.clone();
    wait_for(
        "the reaper removed the subscriber",
        Duration::from_secs(10),
        || {
            let api = api.clone();
            let id = id.clone();
            async move { subscriber_status(&api, &id).await == 404 }
        },
    )
    .await;
    let (_, v) = d.api.get(&format!("/v1/deliveries/{delivery}")).await;
    assert_eq!(
        v["status"], "dead",
        "its unfinished delivery is dead, not retried: {v}"
    );
    let ingested = d
        .api
        .events(json!({"id": "evt_fail_2", "type": "fail.it"}))
        .await;
    assert_eq!(ingested["deliveries"], 0, "{ingested}");
    d.stop().await;
}

/// A daemon that refuses http://127.0.0.1 subscribers: the listener says which flag admits
/// them, exits 1 and leaves nothing registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_refusing_loopback_is_explained() {
    let d = Daemon::start_with(|s| Settings {
        allow_loopback: Some(false),
        ..s
    })
    .await;
    let api = d.api.clone();
    let out = tokio::task::spawn_blocking(move || spawn(&api, &[]).wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--allow-loopback"), "{stderr}");
    let (_, list) = d.api.get("/v1/subscribers").await;
    assert_eq!(list["subscribers"], json!([]), "{list}");
    d.stop().await;
}

/// The rehearsal flags shape the answer: `--fail-rate 1 --retry-after 7 --delay 300ms` answers
/// a verified webhook 503 with `Retry-After: 7` no sooner than 300 ms, and `-v` prints the body
/// under the line (which shows the `webhook-sequence` it was given); `--retry-after` alone
/// answers 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rehearsal_flags_shape_the_answer() {
    let d = Daemon::start().await;
    let mut failing = Listener::start(
        &d.api,
        &[
            "--events",
            "r.*",
            "--fail-rate",
            "1",
            "--retry-after",
            "7",
            "--delay",
            "300ms",
            "-v",
        ],
    )
    .await;
    let body = r#"{"id":"evt_r1","type":"r.one"}"#;
    let started = std::time::Instant::now();
    let resp = post_signed(&failing.url, &failing.secret, "evt_r1", body).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "7");
    let line = next_with(&mut failing.stdout, "evt_r1").await;
    assert!(
        line.ends_with("evt_r1  r.one  seq 41  503  verified"),
        "{line}"
    );
    assert_eq!(next_with(&mut failing.stdout, "").await, body);

    let paused = Listener::start(&d.api, &["--events", "p.*", "--retry-after", "2"]).await;
    let resp = post_signed(&paused.url, &paused.secret, "evt_p1", body).await;
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "2");
    failing.interrupt().await;
    paused.interrupt().await;
    d.stop().await;
}

/// The second line of defence after `kill -9`: a subscriber left on this port by an earlier
/// listener (same id, same URL) is replaced by the next listener there; one of the same name
/// pointing elsewhere is someone else's and is left alone, with a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_on_the_same_port_is_replaced_and_a_stranger_is_not() {
    let d = Daemon::start().await;
    let port = common::free_port().to_string();
    let first = Listener::start(&d.api, &["--port", &port]).await;
    let (id, url) = (first.id.clone(), first.url.clone());
    first.interrupt().await;
    // What a listener killed with its reaper leaves: its subscriber, as it registered it.
    d.api
        .subscriber(json!({"id": id, "url": url, "event_types": ["*"], "lane": "origin"}))
        .await;
    let mut second = Listener::start(&d.api, &["--port", &port]).await;
    assert_eq!(second.id, id);
    assert!(second.said[0].contains("replaced"), "{:?}", second.said);
    d.api
        .events(json!({"id": "evt_after", "type": "x.y"}))
        .await;
    next_with(&mut second.stdout, "evt_after  x.y").await;
    second.interrupt().await;

    d.api
        .subscriber(json!({"id": id, "url": "http://127.0.0.1:1/theirs", "event_types": ["*"]}))
        .await;
    let api = d.api.clone();
    let args = ["--port", port.as_str()].map(String::from);
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        spawn(&api, &args).wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not a listener's"), "{stderr}");
    let (status, theirs) = d.api.get(&format!("/v1/subscribers/{id}")).await;
    assert_eq!(
        (status, theirs["url"].clone()),
        (200, json!("http://127.0.0.1:1/theirs"))
    );
    d.stop().await;
}

/// `fanout status --json`'s `stats` of subscriber `id`.
async fn status_of(api: &Api, id: &str) -> Value {
    let base = api.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["status", "--json", "--server", &base])
            .env("FANOUT_API_TOKEN", TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let subs = all["subscribers"].as_array().unwrap();
    let me = subs.iter().find(|s| s["id"] == json!(id)).unwrap();
    me["stats"].clone()
}

/// A new session on a port starts with fresh counters: `fanout status` counts what was sent
/// since its subscriber was created, not the kept deliveries of the session before it under
/// the same id (they stay kept, and listed by `fanout deliveries`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_starts_with_fresh_counters() {
    let d = Daemon::start().await;
    let port = common::free_port().to_string();
    let mut first = Listener::start(&d.api, &["--port", &port]).await;
    let id = first.id.clone();
    for event in ["evt_one", "evt_two"] {
        d.api.events(json!({"id": event, "type": "x.y"})).await;
        next_with(&mut first.stdout, event).await;
    }
    wait_for(
        "the first session's 2 sent",
        Duration::from_secs(10),
        || async { status_of(&d.api, &id).await["sent"] == json!(2) },
    )
    .await;
    first.interrupt().await;

    let mut second = Listener::start(&d.api, &["--port", &port]).await;
    assert_eq!(second.id, id);
    let fresh = status_of(&d.api, &id).await;
    assert_eq!(
        (fresh["sent"].clone(), fresh["dead"].clone()),
        (json!(0), json!(0)),
        "{fresh}"
    );
    d.api
        .events(json!({"id": "evt_three", "type": "x.y"}))
        .await;
    next_with(&mut second.stdout, "evt_three").await;
    wait_for(
        "the second session's 1 sent",
        Duration::from_secs(10),
        || async { status_of(&d.api, &id).await["sent"] == json!(1) },
    )
    .await;
    // The earlier session's deliveries are still kept under the id.
    let (_, kept) = d
        .api
        .get(&format!("/v1/deliveries?subscriber={id}&status=sent"))
        .await;
    assert_eq!(kept["deliveries"].as_array().unwrap().len(), 3, "{kept}");
    second.interrupt().await;
    d.stop().await;
}
