//! `webhook-sequence` and thin payloads end to end, with the real `fanout` binary: on a SQLite
//! file, each subscriber's numbers run 1..N in fan-out order without a gap, and a delivery keeps
//! its number through retries (a subscriber answering 500 first), a replay and a SIGKILL of the
//! daemon mid-stream (its restart redelivers with the same numbers); a thin webhook carries
//! `{"id","type","timestamp","url"}`, signed. On PostgreSQL, two daemons ingesting into the same
//! subscribers at once still number each subscriber's deliveries 1..N.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::pg::PgServer;
use common::*;
use fanout_core::sign::{self, Secret};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

/// Each event's `webhook-sequence` as a sink received it: event id → every number it came
/// with (a retry or a redelivery adds the same number again).
fn sequences_received(sink: &Subscriber) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in sink.received() {
        let id = r.header("webhook-id").unwrap().to_string();
        let seq: u64 = r
            .header("webhook-sequence")
            .unwrap_or_else(|| panic!("{id} came without webhook-sequence"))
            .parse()
            .unwrap();
        out.entry(id).or_default().push(seq);
    }
    out
}

/// What the API says: each of the subscriber's deliveries as (event id, sequence), by id.
async fn sequences_listed(api: &Api, sub: &str) -> Vec<(String, u64)> {
    api.deliveries(&format!("subscriber={sub}&limit=10000"))
        .await
        .iter()
        .map(|d| {
            (
                d["event_id"].as_str().unwrap().to_string(),
                d["sequence"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The numbers a sink received are those the ledger fixed, one per event, and they run 1..N
/// in the order the events fanned out (`expected`, ingest order).
fn assert_gap_free(
    who: &str,
    got: &BTreeMap<String, Vec<u64>>,
    listed: &[(String, u64)],
    expected: &[String],
) {
    let by_event: BTreeMap<&str, u64> = listed.iter().map(|(e, s)| (e.as_str(), *s)).collect();
    assert_eq!(
        by_event.len(),
        expected.len(),
        "{who}: one delivery per event"
    );
    for (i, event) in expected.iter().enumerate() {
        assert_eq!(
            by_event.get(event.as_str()),
            Some(&(i as u64 + 1)),
            "{who}: {event} is number {} of the fan-out",
            i + 1
        );
        let seen = got
            .get(event)
            .unwrap_or_else(|| panic!("{who}: {event} never arrived"));
        assert!(
            seen.iter().all(|s| *s == i as u64 + 1),
            "{who}: {event} came with {seen:?}, expected {} every time",
            i + 1
        );
    }
}

/// A subscriber that answers 500 to the first request of each event, 200 to the next.
async fn fails_once() -> Subscriber {
    let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
    Subscriber::start(move |r, _| {
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        if seen.lock().unwrap().insert(id) {
            Answer::status(500)
        } else {
            Answer::status(200)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_hold_through_retries_replays_and_a_kill9_and_thin_bodies_are_signed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let port = free_port();
    // Each of `flaky`'s events fails once: its breaker must not open on a run of them.
    let args = [
        "--breaker-threshold",
        "1000",
        "--max-attempts",
        "5",
        "--backoff-scale",
        "0.001",
        "--event-url",
        "https://api.example.com/events/{id}",
    ];
    let mut daemon = Binary::start_at(port, &db, &args).await;
    let all = Subscriber::ok().await;
    let flaky = fails_once().await;
    // Slow enough that the kill below finds its deliveries under way.
    let slow = Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_millis(5))).await;
    let thin = Subscriber::ok().await;
    daemon
        .api
        .subscriber(sub_spec("all", &all.url, &["*"]))
        .await;
    daemon
        .api
        .subscriber(sub_spec("flaky", &flaky.url, &["x.*"]))
        .await;
    daemon
        .api
        .subscriber(json!({ "id": "slow", "url": slow.url, "event_types": ["*"],
            "rate_per_sec": 1000, "burst": 1000, "max_in_flight": 2, "lane": "origin" }))
        .await;
    // `payload`: by the CLI, refused when unknown, changed by PATCH.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args([
            "subscriber",
            "add",
            "thin",
            &thin.url,
            "-t",
            "y.*",
            "--lane",
            "origin",
        ])
        .args(["--payload", "thin", "--server", &daemon.api.base])
        .env("FANOUT_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, secret) = daemon.api.get("/v1/subscribers/thin/secret").await;
    let thin_secret = secret["secrets"][0]["secret"].as_str().unwrap().to_string();
    let (_, view) = daemon.api.get("/v1/subscribers/thin").await;
    assert_eq!(view["payload"], "thin");
    let (status, body) = daemon
        .api
        .post(
            "/v1/subscribers",
            json!({ "id": "bad", "url": all.url, "payload": "medium" }),
        )
        .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("invalid_request")),
        "{body}"
    );
    let patch = |payload: &str| {
        daemon.api.raw(
            "PATCH",
            "/v1/subscribers/all",
            Some(json!({ "payload": payload }).to_string()),
            true,
        )
    };
    assert_eq!(patch("thin").await.1["payload"], "thin");
    assert_eq!(patch("medium").await.0, 400);
    assert_eq!(patch("full").await.1["payload"], "full");
    let (_, view) = daemon.api.get("/v1/subscribers/all").await;
    assert_eq!(view["payload"], "full");

    // Events of two types, singly and in arrays, one sent twice: fan-out order is ingest order.
    let mut order: Vec<(String, &str)> = Vec::new();
    for round in 0..6 {
        let batch: Vec<Value> = (0..5)
            .map(|i| {
                let ty = if (round + i) % 3 == 0 { "y.1" } else { "x.1" };
                json!({ "id": format!("e{round}_{i}"), "type": ty, "n": i })
            })
            .collect();
        for e in &batch {
            order.push((
                e["id"].as_str().unwrap().to_string(),
                if e["type"] == "y.1" { "y" } else { "x" },
            ));
        }
        if round % 2 == 0 {
            for e in batch {
                daemon.api.events(e).await;
            }
        } else {
            daemon.api.events(Value::Array(batch)).await;
        }
    }
    let dup = daemon
        .api
        .events(json!({ "id": "e0_0", "type": "y.1" }))
        .await;
    assert_eq!(dup["duplicate"], true, "{dup}");
    let every: Vec<String> = order.iter().map(|(e, _)| e.clone()).collect();
    let xs: Vec<String> = order
        .iter()
        .filter(|(_, t)| *t == "x")
        .map(|(e, _)| e.clone())
        .collect();
    let ys: Vec<String> = order
        .iter()
        .filter(|(_, t)| *t == "y")
        .map(|(e, _)| e.clone())
        .collect();
    wait_for("everything sent", LONG, || async {
        daemon.api.count("status=sent").await == 2 * every.len() + xs.len() + ys.len()
    })
    .await;
    assert_eq!(
        flaky.count(),
        2 * xs.len(),
        "each event failed once, then went"
    );
    for (who, sink, expected) in [
        ("all", &all, &every),
        ("flaky", &flaky, &xs),
        ("slow", &slow, &every),
        ("thin", &thin, &ys),
    ] {
        let listed = sequences_listed(&daemon.api, who).await;
        assert_gap_free(who, &sequences_received(sink), &listed, expected);
    }

    // A replay sends the same number again, and GET shows it.
    let listed = daemon.api.deliveries("subscriber=flaky&limit=10000").await;
    let third = listed.iter().find(|d| d["sequence"] == 3).unwrap();
    let (status, _) = daemon
        .api
        .post(
            &format!("/v1/deliveries/{}/replay", third["id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(status, 202);
    wait_for("the replay arrived", LONG, || async {
        flaky.count() == 2 * xs.len() + 1
    })
    .await;
    let last = flaky.received().pop().unwrap();
    assert_eq!(last.header("webhook-id"), third["event_id"].as_str());
    assert_eq!(last.header("webhook-sequence"), Some("3"));
    let (_, one) = daemon
        .api
        .get(&format!("/v1/deliveries/{}", third["id"].as_str().unwrap()))
        .await;
    assert_eq!(one["sequence"], 3, "{one}");

    // Thin bodies: signed like any webhook, the stored body untouched for the others.
    let now = fanout_origin::time::now_ms() / 1000;
    let secret = Secret::parse(&thin_secret).unwrap();
    for r in thin.received() {
        sign::verify(
            std::slice::from_ref(&secret),
            r.header("webhook-id"),
            r.header("webhook-timestamp"),
            r.header("webhook-signature"),
            &r.body,
            now,
        )
        .unwrap();
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let id = r.header("webhook-id").unwrap();
        let keys: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 4, "{body}");
        assert_eq!(body["id"], id);
        assert_eq!(body["type"], "y.1");
        assert_eq!(body["url"], format!("https://api.example.com/events/{id}"));
        let at = fanout_origin::time::parse_time(body["timestamp"].as_str().unwrap()).unwrap();
        assert!((at / 1000 - now).abs() < 120, "{body}");
    }
    for r in all.received() {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["id"], r.header("webhook-id").unwrap());
        assert!(body["n"].is_number(), "a full body is the event's: {body}");
    }

    // SIGKILL while `slow` is being delivered and events are still arriving; after a restart
    // and a re-send of every event (the ones whose answer was lost), numbers run on, 1..N.
    let more: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
    let feed = {
        let api = daemon.api.clone();
        let more = more.clone();
        tokio::spawn(async move {
            for chunk in more.chunks(10) {
                let batch: Vec<Value> = chunk
                    .iter()
                    .map(|id| json!({ "id": id, "type": "x.1" }))
                    .collect();
                let (status, _) = api
                    .raw(
                        "POST",
                        "/v1/events",
                        Some(Value::Array(batch).to_string()),
                        true,
                    )
                    .await;
                if status != 202 {
                    return;
                }
            }
        })
    };
    let before = slow.count();
    wait_for("slow deliveries under way", LONG, || async {
        slow.count() > before + 20
    })
    .await;
    daemon.kill9();
    let _ = feed.await;
    let daemon = Binary::start_at(port, &db, &args).await;
    for chunk in more.chunks(50) {
        let batch: Vec<Value> = chunk
            .iter()
            .map(|id| json!({ "id": id, "type": "x.1" }))
            .collect();
        daemon.api.events(Value::Array(batch)).await;
    }
    let every: Vec<String> = every.into_iter().chain(more.iter().cloned()).collect();
    let xs: Vec<String> = xs.into_iter().chain(more.iter().cloned()).collect();
    wait_for("everything sent after the restart", LONG, || async {
        daemon.api.count("status=sent").await == 2 * every.len() + xs.len() + ys.len()
    })
    .await;
    for (who, sink, expected) in [
        ("all", &all, &every),
        ("flaky", &flaky, &xs),
        ("slow", &slow, &every),
    ] {
        let listed = sequences_listed(&daemon.api, who).await;
        assert_gap_free(who, &sequences_received(sink), &listed, expected);
    }
}

/// Two daemons on one PostgreSQL ledger, each ingesting batches into the same subscribers at
/// the same time: every subscriber's deliveries are numbered 1..N, in id order, and its
/// counter stands at N.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_daemons_ingesting_at_once_number_each_subscriber_without_gaps() {
    let server = PgServer::start();
    let url = server.database("seq").await;
    let db = Path::new(&url);
    let a = Binary::start(db, &[]).await;
    let b = Binary::start(db, &[]).await;
    let sink = Subscriber::ok().await;
    let subs = ["s1", "s2", "s3"];
    for (i, id) in subs.iter().enumerate() {
        let types: &[&str] = if i == 2 { &["odd"] } else { &["*"] };
        a.api.subscriber(sub_spec(id, &sink.url, types)).await;
    }
    let ingest = |api: Api, who: &'static str| {
        tokio::spawn(async move {
            for round in 0..30 {
                let batch: Vec<Value> = (0..20)
                    .map(|i| {
                        let ty = if i % 2 == 1 { "odd" } else { "even" };
                        json!({ "id": format!("{who}_{round}_{i}"), "type": ty })
                    })
                    .collect();
                api.events(Value::Array(batch)).await;
            }
        })
    };
    let (ra, rb) = tokio::join!(ingest(a.api.clone(), "a"), ingest(b.api.clone(), "b"));
    ra.unwrap();
    rb.unwrap();
    let pg = server.connect("seq").await;
    for (id, n) in [("s1", 1200i64), ("s2", 1200), ("s3", 600)] {
        let numbers: Vec<i64> = pg
            .query(
                "SELECT sequence FROM deliveries WHERE subscriber_id = $1 ORDER BY id",
                &[&id],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            numbers,
            (1..=n).collect::<Vec<_>>(),
            "{id}: 1..{n} in id order"
        );
        let last: i64 = pg
            .query_one(
                "SELECT last FROM sequences WHERE subscriber_id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(last, n, "{id}");
    }
}
