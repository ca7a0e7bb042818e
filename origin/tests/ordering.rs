//! Ordered delivery end to end, with the real `fanout` binary on a SQLite file (or, with
//! `FANOUT_TEST_LEDGER=postgres`, a throwaway PostgreSQL): per key, one delivery at a time and
//! in sequence order; a head that fails twice holds back its own key while another key flows,
//! and the next goes as soon as the head succeeds; a dead head lets its key move on, with
//! `webhook-previous-sequence` showing the gap, and its replay keeps its number; the held key
//! is shown by `GET /v1/subscribers/{id}/held`; bad orderings are 400s naming the field. On
//! PostgreSQL, two daemons delivering one ledger's ordered keys never have two deliveries of a
//! key open at once.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);
/// How long the receivers take to answer: two deliveries of one key open at once would
/// arrive closer together than this.
const ANSWER: Duration = Duration::from_millis(15);

/// Where the daemon's ledger goes: a SQLite file in `dir`, or a fresh PostgreSQL database.
async fn ledger(dir: &std::path::Path) -> (PathBuf, Option<PgServer>) {
    match backend() {
        Backend::Sqlite => (dir.join("fanout.db"), None),
        Backend::Postgres => {
            let server = PgServer::start();
            let url = server.database("ordering").await;
            (PathBuf::from(url), Some(server))
        }
    }
}

/// What a receiver saw of one webhook.
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    sequence: u64,
    previous: Option<u64>,
    key: Option<String>,
    at: Instant,
}

fn seen(sink: &Subscriber) -> Vec<Seen> {
    sink.received()
        .iter()
        .map(|r| Seen {
            id: r.header("webhook-id").unwrap().to_string(),
            sequence: r.header("webhook-sequence").unwrap().parse().unwrap(),
            previous: r
                .header("webhook-previous-sequence")
                .map(|p| p.parse().unwrap()),
            key: r.header("webhook-ordering-key").map(str::to_string),
            at: r.at,
        })
        .collect()
}

/// Per key (`key_of` a webhook), the webhooks in arrival order: each arrived at least
/// [`ANSWER`] after the one before it (that one's answer came first: never two open), and
/// their sequence numbers ascend.
fn one_at_a_time(who: &str, all: &[Seen], key_of: impl Fn(&Seen) -> String) {
    let mut by_key: BTreeMap<String, Vec<&Seen>> = BTreeMap::new();
    for s in all {
        by_key.entry(key_of(s)).or_default().push(s);
    }
    for (key, list) in by_key {
        for w in list.windows(2) {
            assert!(
                w[1].at.duration_since(w[0].at) >= ANSWER,
                "{who} key {key}: {} arrived while {} was open",
                w[1].id,
                w[0].id
            );
            assert!(
                w[1].sequence >= w[0].sequence || w[1].id == w[0].id,
                "{who} key {key}: {} (#{}) after {} (#{})",
                w[1].id,
                w[1].sequence,
                w[0].id,
                w[0].sequence
            );
        }
    }
}

fn ev(id: &str, video: &str) -> Value {
    json!({ "id": id, "type": "video.x", "video_id": video })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_head_holds_its_key_only_and_a_dead_head_lets_it_move_on() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _pg) = ledger(dir.path()).await;
    // Backoff 0.5–2 s for the first retries (and more after): far more than a send takes.
    let daemon = Binary::start(
        &db,
        &["--backoff-scale", "0.5", "--breaker-threshold", "1000"],
    )
    .await;
    // `a1` fails (500) at least twice and until key b has all arrived: b flows while a waits
    // (were b held back by a, a1 would fail until dead and the order below would break). `c1`
    // is not found (404: dead at once) until it is replayed.
    let tries: std::sync::Arc<std::sync::Mutex<BTreeMap<String, usize>>> = Default::default();
    let counted = tries.clone();
    let keyed = Subscriber::start(move |r, _| {
        let id = r.header("webhook-id").unwrap().to_string();
        let mut t = counted.lock().unwrap();
        *t.entry(id.clone()).or_default() += 1;
        let b_done = t.get("b5").is_some();
        match (id.as_str(), t[&id]) {
            ("a1", n) if n <= 2 || !b_done => Answer::status(500).delay(ANSWER),
            ("c1", 1) => Answer::status(404).delay(ANSWER),
            _ => Answer::status(200).delay(ANSWER),
        }
    })
    .await;
    let whole = Subscriber::start(|_, _| Answer::status(200).delay(ANSWER)).await;
    let free = Subscriber::ok().await;

    // Validation: 400s that name the field.
    let base = |id: &str| json!({ "id": id, "url": keyed.url, "event_types": ["video.*"] });
    let bad: &[(Value, &str)] = &[
        (json!({ "ordering": "key" }), "ordering_key is required"),
        (
            json!({ "ordering": "key", "ordering_key": "video_id" }),
            "ordering_key \"video_id\" is not a JSON Pointer",
        ),
        (
            json!({ "ordering": "subscriber", "ordering_key": "/a" }),
            "ordering_key is only for ordering \"key\"",
        ),
        (json!({ "ordering": "per-key" }), "ordering"),
    ];
    for (extra, message) in bad {
        let mut body = base("bad");
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, answer) = daemon.api.post("/v1/subscribers", body).await;
        assert_eq!(status, 400, "{extra}: {answer}");
        let text = answer["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{extra}: {text}");
    }

    // `keyed` by the CLI, ordered by /video_id; `whole` ordered as one; `free` unordered.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["subscriber", "add", "keyed", &keyed.url, "-t", "video.*"])
        .args([
            "--lane",
            "origin",
            "--ordering",
            "key",
            "--ordering-key",
            "/video_id",
        ])
        .args(["--max-in-flight", "32", "--server", &daemon.api.base])
        .env("FANOUT_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, view) = daemon.api.get("/v1/subscribers/keyed").await;
    assert_eq!(
        (&view["ordering"], &view["ordering_key"]),
        (&json!("key"), &json!("/video_id"))
    );
    let mut spec = sub_spec("whole", &whole.url, &["video.*"]);
    spec["ordering"] = json!("subscriber");
    daemon.api.subscriber(spec).await;
    daemon
        .api
        .subscriber(sub_spec("free", &free.url, &["video.*"]))
        .await;
    // PATCH keeps the rules: `key` needs its pointer.
    let (status, answer) = daemon
        .api
        .raw(
            "PATCH",
            "/v1/subscribers/free",
            Some(json!({ "ordering": "key" }).to_string()),
            true,
        )
        .await;
    assert_eq!(status, 400, "{answer}");

    // a1 a2 a3 (a1 fails twice), b1..b5, and c1 (dead) c2 c3; then "held" shows key a.
    let mut batch = vec![ev("a1", "a"), ev("a2", "a"), ev("a3", "a")];
    batch.extend((1..=5).map(|i| ev(&format!("b{i}"), "b")));
    batch.extend([ev("c1", "c"), ev("c2", "c"), ev("c3", "c")]);
    daemon.api.events(Value::Array(batch.clone())).await;
    wait_for("key a held behind a failing a1", LONG, || async {
        let (_, held) = daemon.api.get("/v1/subscribers/keyed/held").await;
        held["keys"].as_array().is_some_and(|keys| {
            keys.iter().any(|k| {
                k["ordering_key"] == "a"
                    && k["held"] == 2
                    && k["head"]["event_id"] == "a1"
                    && k["head"]["attempt_count"].as_u64() >= Some(1)
                    && k["head"]["last_error"].as_str().is_some()
            })
        })
    })
    .await;
    let (_, listed) = daemon
        .api
        .get("/v1/deliveries?subscriber=keyed&limit=100")
        .await;
    let a2 = listed["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["event_id"] == "a2")
        .unwrap()
        .clone();
    assert_eq!(
        (&a2["held"], &a2["status"]),
        (&json!(true), &json!("pending")),
        "{a2}"
    );
    assert_eq!(a2["ordering_key"], "a");
    wait_for("everything delivered", LONG, || async {
        daemon.api.count("subscriber=keyed&status=sent").await == 10
            && daemon.api.count("subscriber=keyed&status=dead").await == 1
            && whole.count() == 11
            && free.count() == 11
    })
    .await;

    let got = seen(&keyed);
    one_at_a_time("keyed", &got, |s| s.key.clone().unwrap());
    let order = |key: &str| -> Vec<&str> {
        got.iter()
            .filter(|s| s.key.as_deref() == Some(key))
            .map(|s| s.id.as_str())
            .collect()
    };
    let a = order("a");
    let tried = a.len() - 2;
    assert!(tried >= 3, "a1 failed twice, then went: {a:?}");
    assert_eq!(a[tried..], ["a2", "a3"]);
    assert!(a[..tried].iter().all(|id| *id == "a1"), "{a:?}");
    assert_eq!(order("b"), ["b1", "b2", "b3", "b4", "b5"]);
    assert_eq!(order("c"), ["c1", "c2", "c3"]);
    let at = |id: &str, n: usize| got.iter().filter(|s| s.id == id).nth(n).unwrap().at;
    // Previous sequences chain each key; c2's names the dead c1: the receiver sees the gap.
    let seq: BTreeMap<&str, u64> = got.iter().map(|s| (s.id.as_str(), s.sequence)).collect();
    let prev: BTreeMap<&str, Option<u64>> =
        got.iter().map(|s| (s.id.as_str(), s.previous)).collect();
    for (id, before) in [
        ("a1", None),
        ("a2", Some("a1")),
        ("a3", Some("a2")),
        ("b1", None),
        ("b2", Some("b1")),
        ("c2", Some("c1")),
        ("c3", Some("c2")),
    ] {
        assert_eq!(prev[id], before.map(|b| seq[b]), "{id}'s previous");
    }
    // a2 went as soon as a1 was answered 2xx, not after a backoff (the next would have been
    // 2 s at least).
    let gap = at("a2", 0).duration_since(at("a1", tried - 1));
    assert!(
        gap < Duration::from_millis(1500),
        "a2 came {gap:?} after a1's success"
    );

    // The dead c1 replayed keeps its number (and its previous: none).
    let dead = daemon.api.deliveries("subscriber=keyed&status=dead").await;
    let c1 = dead[0]["id"].as_str().unwrap().to_string();
    // Counted before the replay: its send may arrive before the 202 is read.
    let before = keyed.count();
    let (status, _) = daemon
        .api
        .post(&format!("/v1/deliveries/{c1}/replay"), json!({}))
        .await;
    assert_eq!(status, 202);
    wait_for("c1 again", LONG, || async { keyed.count() == before + 1 }).await;
    let last = seen(&keyed).pop().unwrap();
    assert_eq!(
        (last.id.as_str(), last.sequence, last.previous),
        ("c1", seq["c1"], None)
    );
    let (_, held) = daemon.api.get("/v1/subscribers/keyed/held").await;
    assert_eq!(held["keys"], json!([]), "{held}");

    // Ordering by subscriber: one at a time, chained 1..N, no key header.
    let all = seen(&whole);
    one_at_a_time("whole", &all, |_| String::new());
    for s in &all {
        assert_eq!(
            (s.key.as_deref(), s.previous),
            (None, s.sequence.checked_sub(1).filter(|p| *p > 0)),
            "{s:?}"
        );
    }
    // Unordered: no ordering header at all.
    for s in seen(&free) {
        assert_eq!((s.key, s.previous), (None, None), "{}", s.id);
    }
}

/// Two daemons on one PostgreSQL ledger, four ordered subscribers (the daemons split them,
/// and one daemon stops and comes back mid-stream, moving its subscribers and their open
/// heads to the other): no key ever has two deliveries open, each key's deliveries arrive in
/// sequence order, and each names its key's previous delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_daemons_never_have_two_of_one_key_in_flight() {
    let server = PgServer::start();
    let url = server.database("order2").await;
    let db = PathBuf::from(&url);
    let mut a = Binary::start(&db, &[]).await;
    let b = Binary::start(&db, &[]).await;
    let sink = Subscriber::start(|_, _| Answer::status(200).delay(ANSWER)).await;
    let subs = ["o1", "o2", "o3", "o4"];
    for id in subs {
        let mut spec = sub_spec(id, &format!("{}/{id}", sink.url), &["*"]);
        spec["ordering"] = json!("key");
        spec["ordering_key"] = json!("/k");
        b.api.subscriber(spec).await;
    }
    let ingest = |api: Api, who: &'static str| {
        tokio::spawn(async move {
            for round in 0..5 {
                let batch: Vec<Value> = (0..20)
                    .map(|i| json!({ "id": format!("{who}_{round}_{i}"), "type": "t", "k": i % 5 }))
                    .collect();
                api.events(Value::Array(batch)).await;
            }
        })
    };
    let (ra, rb) = tokio::join!(ingest(a.api.clone(), "a"), ingest(b.api.clone(), "b"));
    ra.unwrap();
    rb.unwrap();
    // A stops while heads are open (it finishes its sends); b takes its subscribers over.
    wait_for("deliveries under way", LONG, || async {
        sink.count() >= 40
    })
    .await;
    a.terminate();
    let a2 = Binary::start(&db, &[]).await;
    wait_for("everything delivered", LONG, || async {
        b.api.count("status=sent").await == 4 * 200
    })
    .await;
    drop(a2);
    let got: Vec<(String, Seen)> = sink
        .received()
        .iter()
        .zip(seen(&sink))
        .map(|(r, s)| (r.path.clone(), s))
        .collect();
    for id in subs {
        let mine: Vec<Seen> = got
            .iter()
            .filter(|(p, _)| p.ends_with(id))
            .map(|(_, s)| s.clone())
            .collect();
        one_at_a_time(id, &mine, |s| s.key.clone().unwrap());
        // At least once: a redelivery (the same id again) adds nothing to the chain.
        let mut once: Vec<&Seen> = Vec::new();
        for s in &mine {
            if !once.iter().any(|o| o.id == s.id) {
                once.push(s);
            }
        }
        assert_eq!(once.len(), 200, "{id}: every event");
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for s in once {
            let key = s.key.clone().unwrap();
            assert_eq!(
                s.previous,
                last.get(&key).copied(),
                "{id} {}: its key's previous",
                s.id
            );
            last.insert(key, s.sequence);
        }
    }
}

/// A 10 KB ordering-key value (past PostgreSQL's btree limit of about 2.7 KB a row): ingest
/// accepts it (202, not a 500 a producer retries for ever) and its key is ordered like any
/// other, one at a time and in sequence, under one bounded key (`sha256:…`) the receiver
/// sees in `webhook-ordering-key`, on either ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_kilobyte_key_is_accepted_and_ordered() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _pg) = ledger(dir.path()).await;
    let daemon = Binary::start(&db, &[]).await;
    let sink = Subscriber::start(|_, _| Answer::status(200).delay(ANSWER)).await;
    let mut spec = sub_spec("keyed", &sink.url, &["video.*"]);
    spec["ordering"] = json!("key");
    spec["ordering_key"] = json!("/video_id");
    daemon.api.subscriber(spec).await;
    // Incompressible (PostgreSQL compresses an index entry first: 10 KB of one letter fits).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let long: String = (0..10 * 1024)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(
                b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                    [(x >> 58) as usize % 62],
            )
        })
        .collect();
    let mut batch: Vec<Value> = (1..=4).map(|i| ev(&format!("l{i}"), &long)).collect();
    batch.push(ev("s1", "short"));
    let (status, answer) = daemon.api.post("/v1/events", Value::Array(batch)).await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer) = daemon
        .api
        .post("/v1/events", json!([ev("l5", &long)]))
        .await;
    assert_eq!(status, 202, "{answer}");
    wait_for("all six delivered", LONG, || async { sink.count() == 6 }).await;
    let got = seen(&sink);
    one_at_a_time("keyed", &got, |s| s.key.clone().unwrap());
    let longs: Vec<&Seen> = got.iter().filter(|s| s.id.starts_with('l')).collect();
    let ids: Vec<&str> = longs.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["l1", "l2", "l3", "l4", "l5"]);
    let key = longs[0].key.clone().unwrap();
    assert!(key.starts_with("sha256:") && key.len() == 71, "{key}");
    for w in longs.windows(2) {
        assert_eq!(w[1].key.as_deref(), Some(key.as_str()));
        assert_eq!(w[1].previous, Some(w[0].sequence), "{} chains", w[1].id);
    }
    let short = got.iter().find(|s| s.id == "s1").unwrap();
    assert_eq!(short.key.as_deref(), Some("short"));
}
