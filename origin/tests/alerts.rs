//! Alerts and disabling, end to end: real subscriber servers that fail, a real operator endpoint
//! that checks every alert's Standard Webhooks signature with `fanout_core::sign::verify`, a
//! real SQLite ledger, and the daemon in-process or as the real binary (for its log).
// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

use fanout_origin::config::Settings;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

/// Every alert the operator endpoint received, signatures verified.
fn alerts(op: &Subscriber) -> Vec<Value> {
    signed_alerts(op)
}

fn of_type(alerts: &[Value], kind: &str) -> Vec<Value> {
    let kind = format!("fanout.subscriber.{kind}");
    alerts
        .iter()
        .filter(|a| a["type"] == kind.as_str())
        .cloned()
        .collect()
}

/// The in-process daemon, sending alerts to `op`.
async fn daemon(op: &Subscriber, adjust: impl FnOnce(Settings) -> Settings) -> Daemon {
    let url = op.url.clone();
    Daemon::start_with(move |s| {
        adjust(Settings {
            alert_url: Some(url),
            alert_secret: Some(alert_secret().encode()),
            max_attempts: Some(100),
            backoff_scale: Some(0.001),
            ..s
        })
    })
    .await
}

async fn subscriber_view(api: &Api, id: &str) -> Value {
    let (status, body) = api.get(&format!("/v1/subscribers/{id}?stats=true")).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn patch(api: &Api, id: &str, body: Value) -> Value {
    let (status, body) = api
        .raw(
            "PATCH",
            &format!("/v1/subscribers/{id}"),
            Some(body.to_string()),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The real binary with its stderr (the log) collected.
fn binary_with_log(db: &std::path::Path, extra: &[&str]) -> (Binary, Arc<Mutex<Vec<String>>>) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args([
            "serve",
            "--db",
            db.to_str().unwrap(),
            "--listen",
            &listen,
            "--allow-loopback",
        ])
        .args(extra)
        .env_remove("FANOUT_EDGE_URL")
        .env_remove("FANOUT_EDGE_KEY")
        .env("FANOUT_API_TOKEN", TOKEN)
        .env("FANOUT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push(line);
        }
    });
    let api = Api::new(format!("http://{listen}"));
    (Binary { api, child }, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opening_after_twenty_failures_alerts_once_and_logs_a_warning() {
    let op = Subscriber::ok().await;
    let flaky = Subscriber::start(|_, _| Answer::status(500)).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = alert_secret().encode();
    let (bin, log) = binary_with_log(
        &dir.path().join("fanout.db"),
        &[
            "--max-attempts",
            "100",
            "--backoff-scale",
            "0.001",
            "--alert-url",
            &op.url,
            "--alert-secret",
            &secret,
        ],
    );
    let api = bin.api.clone();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_for("the binary's healthz", LONG, || {
        let probe = http.get(format!("{}/healthz", api.base)).send();
        async move { probe.await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    // One at a time, so the failures that open the breaker are exactly the first 20 sends.
    let mut spec = sub_spec("flaky", &flaky.url, &["t.*"]);
    spec["max_in_flight"] = json!(1);
    api.subscriber(spec).await;
    api.events(events("b", 25, "t.x")).await;

    wait_for("the breaker to open and be reported", LONG, || {
        let (api, op) = (api.clone(), &op);
        async move {
            let v = subscriber_view(&api, "flaky").await;
            v["stats"]["breaker"]["state"] == "open"
                && !of_type(&alerts(op), "breaker_opened").is_empty()
        }
    })
    .await;
    wait_for("the warning in the daemon's log", LONG, || {
        let log = log.clone();
        async move {
            log.lock().unwrap().iter().any(|l| {
                l.contains("WARN")
                    && l.contains("subscriber alert")
                    && l.contains("flaky")
                    && l.contains("fanout.subscriber.breaker_opened")
            })
        }
    })
    .await;
    // While the breaker is open nothing more is sent (the probe comes after 30 s).
    assert_eq!(flaky.count(), 20);
    let all = alerts(&op);
    let breaker = of_type(&all, "breaker_opened");
    assert_eq!(breaker.len(), 1, "{all:?}");
    assert_eq!(breaker[0]["subscriber"], "flaky");
    assert_eq!(breaker[0]["details"]["consecutive_failures"], 20);
    assert!(breaker[0]["details"]["open_until_ms"].as_i64().is_some());
    assert_eq!(breaker[0]["details"]["last_error"], "status 500");
    assert_eq!(all.len(), 1, "no other alert: {all:?}");
    let v = subscriber_view(&api, "flaky").await;
    assert_eq!(v["disabled"], false, "{v}");
    assert_eq!(v["stats"]["dead"], 0, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_the_dead_threshold_alerts_once_per_crossing() {
    let op = Subscriber::ok().await;
    let missing = Subscriber::start(|_, _| Answer::status(404)).await;
    let d = daemon(&op, |s| Settings {
        dead_alert_threshold: Some(5),
        ..s
    })
    .await;
    d.api
        .subscriber(sub_spec("sink", &missing.url, &["t.*"]))
        .await;
    d.api.events(events("d", 8, "t.x")).await;
    wait_for("8 dead and the crossing reported", LONG, || {
        let (api, op) = (d.api.clone(), &op);
        async move {
            api.count("status=dead&subscriber=sink").await == 8
                && !of_type(&alerts(op), "dead_threshold").is_empty()
        }
    })
    .await;
    let dead = of_type(&alerts(&op), "dead_threshold");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["subscriber"], "sink");
    assert_eq!(
        dead[0]["details"],
        json!({ "dead": 5, "threshold": 5 }),
        "{dead:?}"
    );

    // A replay takes the count back to 0; when they die again, that is a new crossing.
    let (status, body) = d
        .api
        .post(
            "/v1/replay",
            json!({ "subscriber": "sink", "status": "dead" }),
        )
        .await;
    assert_eq!((status, &body["replayed"]), (202, &json!(8)), "{body}");
    wait_for("the second crossing reported", LONG, || {
        let op = &op;
        async move { of_type(&alerts(op), "dead_threshold").len() >= 2 }
    })
    .await;
    wait_for("all 8 dead again", LONG, || {
        let api = d.api.clone();
        async move { api.count("status=dead&subscriber=sink").await == 8 }
    })
    .await;
    assert_eq!(missing.count(), 16);
    let all = alerts(&op);
    assert_eq!(of_type(&all, "dead_threshold").len(), 2, "{all:?}");
    assert_eq!(
        all.len(),
        2,
        "a 404 does not disable; 16 failures open no breaker"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_disables_at_once_and_a_re_enable_delivers_what_waited() {
    let op = Subscriber::ok().await;
    let gone = Subscriber::start(|_, _| Answer::status(410)).await;
    let healthy = Subscriber::ok().await;
    let d = daemon(&op, |s| s).await;
    let mut spec = sub_spec("gone", &gone.url, &["t.*"]);
    spec["max_in_flight"] = json!(1);
    d.api.subscriber(spec).await;
    d.api.events(events("first", 1, "t.x")).await;
    wait_for(
        "the 410 to disable the subscriber and be reported",
        LONG,
        || {
            let (api, op) = (d.api.clone(), &op);
            async move {
                subscriber_view(&api, "gone").await["disabled"] == true
                    && !of_type(&alerts(op), "disabled").is_empty()
            }
        },
    )
    .await;
    let v = subscriber_view(&d.api, "gone").await;
    assert_eq!(
        v["disabled_reason"], "the endpoint answered 410 Gone",
        "{v}"
    );
    assert!(v["disabled_at_ms"].as_i64().is_some(), "{v}");
    let disabled = of_type(&alerts(&op), "disabled");
    assert_eq!(disabled.len(), 1);
    assert_eq!(disabled[0]["subscriber"], "gone");
    assert_eq!(
        disabled[0]["details"]["reason"],
        "the endpoint answered 410 Gone"
    );
    // The one delivery that got the 410 is dead.
    assert_eq!(d.api.count("status=dead&subscriber=gone").await, 1);

    // Later events are kept for it, pending, and not sent, while another subscriber gets them.
    d.api
        .subscriber(sub_spec("healthy", &healthy.url, &["t.*"]))
        .await;
    d.api.events(events("later", 3, "t.x")).await;
    wait_for(
        "the healthy subscriber to get the later events",
        LONG,
        || {
            let h = &healthy;
            async move { h.count() == 3 }
        },
    )
    .await;
    wait_for("the healthy subscriber's deliveries recorded", LONG, || {
        let api = d.api.clone();
        async move { api.count("status=sent&subscriber=healthy").await == 3 }
    })
    .await;
    assert_eq!(gone.count(), 1, "nothing is sent to a disabled subscriber");
    assert_eq!(d.api.count("status=pending&subscriber=gone").await, 3);

    // The endpoint is back: re-enabling sends what waited.
    gone.answer(|_, _| Answer::status(200));
    let v = patch(&d.api, "gone", json!({ "disabled": false })).await;
    assert_eq!(
        (&v["disabled"], &v["disabled_reason"]),
        (&json!(false), &Value::Null),
        "{v}"
    );
    wait_for("the 3 waiting deliveries sent", LONG, || {
        let api = d.api.clone();
        async move { api.count("status=sent&subscriber=gone").await == 3 }
    })
    .await;
    assert_eq!(gone.count(), 4);
    assert_eq!(of_type(&alerts(&op), "disabled").len(), 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_for_disable_after_disables_and_a_re_enable_delivers() {
    let op = Subscriber::ok().await;
    let down = Subscriber::start(|_, _| Answer::status(503)).await;
    let d = daemon(&op, |s| Settings {
        disable_after: Some("2s".into()),
        ..s
    })
    .await;
    d.api
        .subscriber(sub_spec("down", &down.url, &["t.*"]))
        .await;
    // One event: its retries fail for 2 s, in fewer than the breaker's 20 attempts.
    d.api.events(events("c", 1, "t.x")).await;
    wait_for(
        "the subscriber disabled after 2 s of failures",
        LONG,
        || {
            let (api, op) = (d.api.clone(), &op);
            async move {
                subscriber_view(&api, "down").await["disabled"] == true
                    && !of_type(&alerts(op), "disabled").is_empty()
            }
        },
    )
    .await;
    let v = subscriber_view(&d.api, "down").await;
    let reason = v["disabled_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("every attempt failed for 2s") && reason.ends_with("last: status 503"),
        "{reason}"
    );
    let since = v["failing_since_ms"].as_i64().unwrap();
    let at = v["disabled_at_ms"].as_i64().unwrap();
    assert!(at - since >= 2000, "{v}");
    let disabled = of_type(&alerts(&op), "disabled");
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    assert_eq!(disabled[0]["details"]["failing_since_ms"], since);
    assert!(of_type(&alerts(&op), "breaker_opened").is_empty());
    let attempts = down.count();
    assert!((2..20).contains(&attempts), "{attempts} attempts");
    // The delivery is kept, pending, for a re-enable.
    assert_eq!(d.api.count("status=pending&subscriber=down").await, 1);

    down.answer(|_, _| Answer::status(200));
    let v = patch(&d.api, "down", json!({ "disabled": false })).await;
    assert_eq!(
        (&v["disabled"], &v["failing_since_ms"]),
        (&json!(false), &Value::Null),
        "{v}"
    );
    wait_for("the waiting delivery sent", LONG, || {
        let api = d.api.clone();
        async move { api.count("status=sent&subscriber=down").await == 1 }
    })
    .await;
    assert_eq!(down.count(), attempts + 1);
    // An operator can disable too.
    let v = patch(&d.api, "down", json!({ "disabled": true })).await;
    assert_eq!(
        (&v["disabled"], &v["disabled_reason"]),
        (&json!(true), &json!("disabled by an operator")),
        "{v}"
    );
    d.stop().await;
}
