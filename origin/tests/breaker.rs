//! Storms, then health, through the real `fanout` binary on each ledger: a subscriber whose
//! breaker opened is served again, its backlog flowing as soon as the probe succeeds; a 429
//! with `Retry-After` pauses it without opening the breaker; on PostgreSQL, with one daemon
//! and with two. And the dispatcher's watchdog: a subscriber held past the waits it was told
//! is reported (`/metrics`, the API, `fanout status`), then recovers.
//!
//! Found by a fault soak: on PostgreSQL a subscriber whose breaker opened was never served
//! again (the shared limiter refused every probe); on SQLite its backlog waited a whole
//! cool-down after the probe succeeded.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::*;
use serde_json::{json, Value};

/// How long the subscribers misbehave.
const STORM: Duration = Duration::from_secs(5);
/// The breaker's cool-down (`--breaker-cooldown`), short for the test.
const COOLDOWN: Duration = Duration::from_secs(3);
const EVENTS: usize = 300;

fn flags() -> Vec<&'static str> {
    vec![
        "--breaker-cooldown",
        "3s",
        "--breaker-threshold",
        "5",
        "--max-attempts",
        "100",
        "--backoff-scale",
        "0.01",
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Storm {
    /// 500s, which count toward the breaker.
    Errors,
    /// 429 with `Retry-After: 2`, which pause and do not.
    TooMany,
}

#[derive(Debug, Clone, Copy)]
enum Ledger {
    Sqlite,
    Postgres { daemons: usize },
}

/// A sink that answers the storm until `healthy_at`, 200 after.
async fn stormy(storm: Storm, healthy_at: Instant) -> Subscriber {
    Subscriber::start(move |rec, _| {
        if rec.at >= healthy_at {
            Answer::status(200)
        } else if storm == Storm::Errors {
            Answer::status(500)
        } else {
            Answer::status(429).header("retry-after", "2")
        }
    })
    .await
}

async fn stats(d: &Binary, id: &str) -> Value {
    let (status, body) = d.api.get(&format!("/v1/subscribers/{id}?stats=true")).await;
    assert_eq!(status, 200, "{body}");
    body["stats"].clone()
}

/// Each subscriber gets `EVENTS` events during a storm, then health: every one is delivered
/// within the storm, a cool-down and the drain; after a subscriber's first success the next
/// request follows within a second (one turn, not a cool-down); a 429 storm never opens a
/// breaker; the watchdog reports nothing.
async fn storm_then_health(storm: Storm, ledger: Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let server;
    let db = match ledger {
        Ledger::Sqlite => dir.path().join("fanout.db").to_str().unwrap().to_string(),
        Ledger::Postgres { .. } => {
            server = PgServer::start();
            server.database("fanout").await
        }
    };
    let n_daemons = match ledger {
        Ledger::Sqlite => 1,
        Ledger::Postgres { daemons } => daemons,
    };
    let mut daemons = Vec::new();
    for _ in 0..n_daemons {
        daemons.push(Binary::start(Path::new(&db), &flags()).await);
    }
    if n_daemons > 1 {
        daemons[0].sees_daemons(n_daemons).await;
    }
    // Several subscribers on two daemons, so that each daemon owns some.
    let n_subs = if n_daemons > 1 { 4 } else { 1 };
    let healthy_at = Instant::now() + STORM;
    let mut sinks = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n_subs {
        let sink = stormy(storm, healthy_at).await;
        let id = format!("stormy{i}");
        let mut spec = sub_spec(&id, &sink.url, &["*"]);
        spec["rate_per_sec"] = json!(2000);
        spec["burst"] = json!(500);
        spec["max_in_flight"] = json!(8);
        daemons[0].api.subscriber(spec).await;
        sinks.push(sink);
        ids.push(id);
    }
    for d in &daemons {
        wait_for(
            "every daemon knows every subscriber",
            Duration::from_secs(10),
            || async {
                let (_, list) = d.api.get("/v1/subscribers").await;
                list["subscribers"].as_array().map_or(0, Vec::len) == n_subs
            },
        )
        .await;
    }
    for k in 0..EVENTS / 100 {
        let (status, _) = daemons[k % n_daemons]
            .api
            .post("/v1/events", events(&format!("e{k}_"), 100, "t"))
            .await;
        assert_eq!(status, 202);
    }
    // While it storms and drains: a 429 storm never opens a breaker.
    let within = STORM + COOLDOWN + Duration::from_secs(10);
    let started = Instant::now();
    loop {
        let mut all_sent = true;
        for id in &ids {
            let st = stats(&daemons[0], id).await;
            if storm == Storm::TooMany {
                assert_eq!(st["breaker"]["state"], "closed", "{id}: {st}");
                assert_eq!(st["breaker"]["consecutive_failures"], 0, "{id}: {st}");
            }
            all_sent &= st["sent"] == json!(EVENTS);
        }
        if all_sent {
            break;
        }
        assert!(
            started.elapsed() < within,
            "{storm:?} on {ledger:?}: not all sent within {within:?}: {:?}",
            futures_stats(&daemons[0], &ids).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (id, sink) in ids.iter().zip(&sinks) {
        let arrivals: Vec<Instant> = sink.received().iter().map(|r| r.at).collect();
        let first_ok = arrivals
            .iter()
            .position(|&at| at >= healthy_at)
            .unwrap_or_else(|| panic!("{id}: nothing after the storm"));
        let next = arrivals.get(first_ok + 1).copied();
        let gap = next.map(|n| n.duration_since(arrivals[first_ok]));
        assert!(
            gap.is_some_and(|g| g < Duration::from_secs(1)),
            "{storm:?} on {ledger:?}: {id}'s backlog waited {gap:?} after its first success"
        );
        let (distinct, total) = sink.distinct_ids();
        assert_eq!(distinct.len(), EVENTS, "{id}: {total} requests");
        if storm == Storm::TooMany {
            // A pause per 429: the backlog resumed soon after the storm's last pause.
            assert!(
                arrivals[first_ok].duration_since(healthy_at) < Duration::from_secs(4),
                "{id}: first success {:?} after the storm",
                arrivals[first_ok].duration_since(healthy_at)
            );
        }
    }
    for d in &daemons {
        assert_eq!(d.metric("fanout_dispatcher_stalls_total").await, 0.0);
    }
}

async fn futures_stats(d: &Binary, ids: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    for id in ids {
        out.push(stats(d, id).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_then_health_on_sqlite() {
    storm_then_health(Storm::Errors, Ledger::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_then_health_on_postgres() {
    storm_then_health(Storm::Errors, Ledger::Postgres { daemons: 1 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_then_health_on_two_postgres_daemons() {
    storm_then_health(Storm::Errors, Ledger::Postgres { daemons: 2 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_storm_then_health_on_sqlite() {
    storm_then_health(Storm::TooMany, Ledger::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_storm_then_health_on_postgres() {
    storm_then_health(Storm::TooMany, Ledger::Postgres { daemons: 1 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_storm_then_health_on_two_postgres_daemons() {
    storm_then_health(Storm::TooMany, Ledger::Postgres { daemons: 2 }).await;
}

/// Another daemon's pause of `held`, as it writes one into the shared limiter: a second
/// from now.
async fn pause_a_second(pg: &tokio_postgres::Client) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let row = pg
        .query_one("SELECT limiter FROM subscribers WHERE id = 'held'", &[])
        .await
        .unwrap();
    let mut limiter: Value = match row.get::<_, Option<String>>(0) {
        Some(s) => serde_json::from_str(&s).unwrap(),
        None => json!({ "bucket": null, "paused_until_ms": null,
            "breaker": { "consecutive_failures": 0, "open_until_ms": null, "probe_started_ms": null } }),
    };
    limiter["paused_until_ms"] = json!(now + 1_000);
    pg.execute(
        "UPDATE subscribers SET limiter = $1 WHERE id = 'held'",
        &[&limiter.to_string()],
    )
    .await
    .unwrap();
}

/// The watchdog, end to end: another daemon (here the test, writing the shared limiter row
/// as a daemon would) keeps pausing a subscriber a second at a time, so each claim is
/// refused with a short wait and nothing is sent for far longer than any wait stated. The
/// daemon reports it once — log, `/metrics`, the API, `fanout status` — and when the pauses
/// stop, the backlog flows and the report clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_reports_a_subscriber_held_past_its_stated_waits() {
    let server = PgServer::start();
    let url = server.database("fanout").await;
    let pg = server.connect("fanout").await;
    let d = Binary::start(Path::new(&url), &flags()).await;
    let sink = Subscriber::ok().await;
    d.api.subscriber(sub_spec("held", &sink.url, &["*"])).await;
    pause_a_second(&pg).await;
    d.api.events(events("h", 5, "t")).await;
    let held_since = Instant::now();
    // Every 300 ms the pause is pushed a second further: every claim is refused.
    let stalled = loop {
        pause_a_second(&pg).await;
        let st = stats(&d, "held").await;
        if !st["stalled"].is_null() {
            break st["stalled"].clone();
        }
        assert!(
            held_since.elapsed() < Duration::from_secs(25),
            "no stall reported: {st}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(sink.count(), 0, "nothing was sent while held");
    assert!(
        held_since.elapsed() >= Duration::from_secs(10),
        "reported after {:?}: before the stated wait and the margin",
        held_since.elapsed()
    );
    assert!(stalled["since_ms"].is_i64(), "{stalled}");
    assert_eq!(stalled["breaker"], "closed", "{stalled}");
    assert_eq!(
        d.metric("fanout_subscriber_stalled{subscriber=\"held\"}")
            .await,
        1.0
    );
    assert_eq!(d.metric("fanout_dispatcher_stalls_total").await, 1.0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["status", "--server", &d.api.base])
        .env("FANOUT_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("held") && l.contains("STALLED")),
        "{table}"
    );
    // The pauses stop: everything goes, and the report clears (counted once).
    wait_for("the held backlog sent", Duration::from_secs(10), || async {
        sink.count() == 5
    })
    .await;
    wait_for("the stall cleared", Duration::from_secs(10), || async {
        stats(&d, "held").await["stalled"].is_null()
    })
    .await;
    assert_eq!(
        d.metric("fanout_subscriber_stalled{subscriber=\"held\"}")
            .await,
        0.0
    );
    assert_eq!(d.metric("fanout_dispatcher_stalls_total").await, 1.0);
}
