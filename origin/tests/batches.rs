//! Batched webhooks end to end, with the real `fanout` binary on a SQLite file and on a real
//! PostgreSQL: a batching subscriber gets `{"events":[…]}` requests of at most `max_events`
//! events and `max_bytes` bytes, signed as one message with the batch's own `webhook-id` and
//! each event's sequence in `webhook-sequences`; a batch takes one token of its rate (100 events
//! at 10 requests/s arrive in well under the 10 s one-per-request would take, and no window
//! holds more requests than the rate allows); a 2xx naming `failed` events retries those alone,
//! a 503 retries the batch's events, each keeping its own attempt count; `max_wait_ms` holds a
//! batch for more events; the bounds are 400s naming the field.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::*;
use fanout_core::sign::{self, Secret};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

/// The event ids a batch request carries, in order.
fn ids_of(r: &Received) -> Vec<String> {
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    body["events"]
        .as_array()
        .unwrap_or_else(|| panic!("not a batch: {}", String::from_utf8_lossy(&r.body)))
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// A receiver that names `e007` and `e008` as failed in the first 2xx that carries `e007`,
/// and answers 503 to the first request carrying `e045`.
async fn picky() -> Subscriber {
    let named: Arc<Mutex<bool>> = Arc::default();
    let refused: Arc<Mutex<bool>> = Arc::default();
    Subscriber::start(move |r, _| {
        let ids = ids_of(r);
        if ids.iter().any(|i| i == "e045")
            && !std::mem::replace(&mut *refused.lock().unwrap(), true)
        {
            return Answer::status(503);
        }
        if ids.iter().any(|i| i == "e007") && !std::mem::replace(&mut *named.lock().unwrap(), true)
        {
            return Answer::status(200)
                .body(r#"{"received": 20, "failed": ["e007", "e008", "not_in_this_batch"]}"#);
        }
        Answer::status(200).body("ok")
    })
    .await
}

async fn scenario(db: &Path) {
    let args = [
        "--backoff-scale",
        "0.001",
        "--max-attempts",
        "5",
        "--breaker-threshold",
        "1000",
    ];
    let daemon = Binary::start(db, &args).await;
    let api = &daemon.api;
    let sink = picky().await;
    let created = api
        .post(
            "/v1/subscribers",
            json!({ "id": "b", "url": sink.url, "event_types": ["x.*"], "lane": "origin",
                "rate_per_sec": 10, "burst": 1, "max_in_flight": 1,
                "batch": { "max_events": 20, "max_bytes": 8192 } }),
        )
        .await;
    assert_eq!(created.0, 201, "{}", created.1);
    assert_eq!(
        created.1["batch"],
        json!({ "max_events": 20, "max_bytes": 8192, "max_wait_ms": 0 })
    );
    let secret = Secret::parse(created.1["secret"].as_str().unwrap()).unwrap();

    // The bounds are 400s naming the field.
    for (batch, extra, says) in [
        (json!({ "max_events": 0 }), json!({}), "batch.max_events"),
        (json!({ "max_events": 1001 }), json!({}), "batch.max_events"),
        (
            json!({ "max_events": 5, "max_bytes": 1_048_577 }),
            json!({}),
            "batch.max_bytes",
        ),
        (
            json!({ "max_events": 5, "max_wait_ms": 10_001 }),
            json!({}),
            "batch.max_wait_ms",
        ),
        (json!({ "max_events": 5, "size": 1 }), json!({}), "size"),
    ] {
        let mut spec =
            json!({ "id": "bad", "url": sink.url, "event_types": ["*"], "batch": batch });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let (status, body) = api.post("/v1/subscribers", spec).await;
        assert_eq!(status, 400, "{batch} {extra}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{batch}: {message}");
    }

    // 100 events of about 150 bytes: five requests' worth at 20 a request.
    let pad = "p".repeat(100);
    let events: Vec<Value> = (0..100)
        .map(|i| json!({ "id": format!("e{i:03}"), "type": "x.1", "pad": pad }))
        .collect();
    let posted = Instant::now();
    api.events(Value::Array(events)).await;
    wait_for("every event sent", LONG, || async {
        api.count("subscriber=b&status=sent").await == 100
    })
    .await;
    let took = posted.elapsed();
    let got = sink.received();
    // One request per token: at 10/s with a burst of 1, 100 single-event requests would need
    // 9.9 s; batches take a handful of tokens.
    assert!(
        took < Duration::from_secs(6),
        "100 events in {} requests took {took:?}",
        got.len()
    );
    assert!(got.len() <= 10, "{} requests for 100 events", got.len());
    // Never faster than the rate: any window holds at most burst + rate × its length.
    for i in 0..got.len() {
        for j in i + 1..got.len() {
            let w = got[j].at.duration_since(got[i].at).as_secs_f64();
            let n = (j - i + 1) as f64;
            assert!(
                n <= 1.0 + 10.0 * w + 0.5,
                "{n} requests within {w:.3} s (rate 10/s, burst 1)"
            );
        }
    }
    let now = fanout_origin::time::now_ms() / 1000;
    let listed: BTreeMap<String, Value> = api
        .deliveries("subscriber=b&limit=1000")
        .await
        .into_iter()
        .map(|d| (d["event_id"].as_str().unwrap().to_string(), d))
        .collect();
    let mut carried: BTreeMap<String, usize> = BTreeMap::new();
    for r in &got {
        assert!(r.body.len() <= 8192, "{} bytes", r.body.len());
        sign::verify(
            std::slice::from_ref(&secret),
            r.header("webhook-id"),
            r.header("webhook-timestamp"),
            r.header("webhook-signature"),
            &r.body,
            now,
        )
        .unwrap();
        let ids = ids_of(r);
        assert!(!ids.is_empty() && ids.len() <= 20, "{} events", ids.len());
        assert!(
            r.header("webhook-id").unwrap().starts_with("msg_batch_"),
            "{:?}",
            r.header("webhook-id")
        );
        // Each element is the event's stored body, and each event's sequence is listed.
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["events"][0]["pad"], pad);
        let sequences: Vec<String> = ids
            .iter()
            .map(|e| listed[e]["sequence"].as_u64().unwrap().to_string())
            .collect();
        assert_eq!(
            r.header("webhook-sequences"),
            Some(sequences.join(",").as_str())
        );
        assert_eq!(r.header("webhook-sequence"), Some(sequences[0].as_str()));
        for id in ids {
            *carried.entry(id).or_default() += 1;
        }
    }
    // Retried alone: the two events the answer named, and the events of the batch that got a
    // 503; every other event went once.
    let refused_batch: HashSet<String> = got
        .iter()
        .map(ids_of)
        .find(|ids| ids.iter().any(|i| i == "e045"))
        .unwrap()
        .into_iter()
        .collect();
    for i in 0..100 {
        let id = format!("e{i:03}");
        let twice = id == "e007" || id == "e008" || refused_batch.contains(&id);
        let want = if twice { 2 } else { 1 };
        assert_eq!(carried.get(&id), Some(&want), "{id} was carried");
        assert_eq!(listed[&id]["attempt_count"], want, "{id}: {}", listed[&id]);
        assert_eq!(listed[&id]["status"], "sent");
    }
    let (_, one) = api
        .get(&format!(
            "/v1/deliveries/{}",
            listed["e007"]["id"].as_str().unwrap()
        ))
        .await;
    let outcomes: Vec<&str> = one["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["failed", "delivered"], "{one}");

    // `max_bytes` cuts a batch: at most 700 bytes a request, each event once.
    let small = Subscriber::ok().await;
    let (status, body) = api
        .post(
            "/v1/subscribers",
            json!({ "id": "s", "url": small.url, "event_types": ["s.*"], "lane": "origin",
                "batch": { "max_events": 100, "max_bytes": 700 } }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let events: Vec<Value> = (0..30)
        .map(|i| json!({ "id": format!("s{i:03}"), "type": "s.1", "pad": pad }))
        .collect();
    api.events(Value::Array(events)).await;
    wait_for("the small batches sent", LONG, || async {
        api.count("subscriber=s&status=sent").await == 30
    })
    .await;
    let mut seen = Vec::new();
    for r in small.received() {
        assert!(r.body.len() <= 700, "{} bytes", r.body.len());
        seen.extend(ids_of(&r));
    }
    seen.sort();
    let want: Vec<String> = (0..30).map(|i| format!("s{i:03}")).collect();
    assert_eq!(seen, want, "each event once");

    // `max_wait_ms`: three events posted one by one go in one request, sent when the first
    // has waited its 1.5 s.
    let waiting = Subscriber::ok().await;
    let (status, body) = api
        .post(
            "/v1/subscribers",
            json!({ "id": "w", "url": waiting.url, "event_types": ["w.*"], "lane": "origin",
                "batch": { "max_events": 100, "max_wait_ms": 1500 } }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let first = Instant::now();
    for i in 0..3 {
        api.events(json!({ "id": format!("w{i}"), "type": "w.1" }))
            .await;
    }
    wait_for("the waiting batch sent", LONG, || async {
        api.count("subscriber=w&status=sent").await == 3
    })
    .await;
    let got = waiting.received();
    let shape: Vec<(Vec<String>, Duration)> = got
        .iter()
        .map(|r| (ids_of(r), r.at.duration_since(first)))
        .collect();
    assert_eq!(got.len(), 1, "one request: {shape:?}");
    assert_eq!(ids_of(&got[0]), ["w0", "w1", "w2"]);
    let waited = got[0].at.duration_since(first);
    assert!(
        waited >= Duration::from_millis(1200),
        "sent after {waited:?}"
    );

    // A PATCH changes the settings, and `null` goes back to one event per request.
    let patch = |batch: Value| {
        api.raw(
            "PATCH",
            "/v1/subscribers/w",
            Some(json!({ "batch": batch }).to_string()),
            true,
        )
    };
    let (_, view) = patch(json!({ "max_events": 5 })).await;
    assert_eq!(
        view["batch"],
        json!({ "max_events": 5, "max_bytes": 1_048_576, "max_wait_ms": 0 })
    );
    assert_eq!(patch(json!({ "max_events": 0 })).await.0, 400);
    let (_, view) = patch(Value::Null).await;
    assert_eq!(view["batch"], Value::Null);
    api.events(json!({ "id": "w9", "type": "w.1", "n": 9 }))
        .await;
    wait_for("the single event sent", LONG, || async {
        waiting.count() == 2
    })
    .await;
    let last = waiting.received().pop().unwrap();
    assert_eq!(last.header("webhook-id"), Some("w9"));
    let body: Value = serde_json::from_slice(&last.body).unwrap();
    assert_eq!(body["n"], 9, "one event's own body: {body}");

    ordered_runs(api).await;
}

/// With ordering by key, a batch is a run of one key in order: three keys of eight events
/// each, five a request. Every request carries one key (its `webhook-ordering-key`), in
/// sequence order, and starts at its key's lowest event not yet acknowledged — after a 503
/// (key b) the same head again, after a 2xx naming one event failed (key a) that event, then
/// its key's next ones. Each event ends sent; the retried ones with two attempts.
async fn ordered_runs(api: &Api) {
    let named: Arc<Mutex<bool>> = Arc::default();
    let refused: Arc<Mutex<bool>> = Arc::default();
    let sink = Subscriber::start(move |r, _| {
        let ids = ids_of(r);
        if ids.iter().any(|i| i == "ob00")
            && !std::mem::replace(&mut *refused.lock().unwrap(), true)
        {
            return Answer::status(503);
        }
        if ids.iter().any(|i| i == "oa02") && !std::mem::replace(&mut *named.lock().unwrap(), true)
        {
            return Answer::status(200).body(r#"{"failed": ["oa02"]}"#);
        }
        Answer::status(200).body("ok")
    })
    .await;
    let (status, body) = api
        .post(
            "/v1/subscribers",
            json!({ "id": "o", "url": sink.url, "event_types": ["o.*"], "lane": "origin",
                "ordering": "key", "ordering_key": "/k", "max_in_flight": 2,
                "batch": { "max_events": 5 } }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let events: Vec<Value> = (0..8)
        .flat_map(|i| {
            ["a", "b", "c"].map(|k| json!({ "id": format!("o{k}{i:02}"), "type": "o.1", "k": k }))
        })
        .collect();
    api.events(Value::Array(events)).await;
    wait_for("every ordered event sent", LONG, || async {
        api.count("subscriber=o&status=sent").await == 24
    })
    .await;
    let listed: BTreeMap<String, Value> = api
        .deliveries("subscriber=o&limit=100")
        .await
        .into_iter()
        .map(|d| (d["event_id"].as_str().unwrap().to_string(), d))
        .collect();
    let seq = |id: &str| listed[id]["sequence"].as_u64().unwrap();
    let mut unacked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in ["a", "b", "c"] {
        unacked.insert(k.into(), (0..8).map(|i| format!("o{k}{i:02}")).collect());
    }
    let got = sink.received();
    let first_with = |id: &str| {
        got.iter()
            .position(|r| ids_of(r).iter().any(|i| i == id))
            .unwrap()
    };
    for (n, r) in got.iter().enumerate() {
        let ids = ids_of(r);
        assert!(ids.len() <= 5, "request {n}: {ids:?}");
        let key = &ids[0][1..2];
        assert!(
            ids.iter().all(|i| &i[1..2] == key),
            "request {n} mixes keys: {ids:?}"
        );
        assert_eq!(r.header("webhook-ordering-key"), Some(key), "request {n}");
        let seqs: Vec<u64> = ids.iter().map(|i| seq(i)).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "request {n}: {ids:?}");
        let left = unacked.get_mut(key).unwrap();
        assert_eq!(
            Some(&ids[0]),
            left.first(),
            "request {n} starts at its key's head: {ids:?}, unacknowledged {left:?}"
        );
        let previous = listed[&ids[0]]["previous_sequence"]
            .as_u64()
            .map(|p| p.to_string());
        assert_eq!(
            r.header("webhook-previous-sequence").map(str::to_string),
            previous
        );
        // What this request acknowledged leaves the key (a 503, or a named failure, not).
        let failed: Vec<&str> = if n == first_with("ob00") {
            ids.iter().map(String::as_str).collect()
        } else if n == first_with("oa02") {
            vec!["oa02"]
        } else {
            vec![]
        };
        left.retain(|i| !ids.contains(i) || failed.contains(&i.as_str()));
    }
    assert!(unacked.values().all(Vec::is_empty), "{unacked:?}");
    let refused = ids_of(&got[first_with("ob00")]);
    for (id, d) in &listed {
        let twice = id == "oa02" || refused.contains(id);
        assert_eq!(d["attempt_count"], if twice { 2 } else { 1 }, "{id}: {d}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    scenario(&dir.path().join("fanout.db")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_postgres() {
    let server = PgServer::start();
    let url = server.database("batches").await;
    scenario(Path::new(&url)).await;
}
