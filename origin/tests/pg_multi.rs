//! Several real `fanout` daemons over one PostgreSQL ledger (a throwaway server), killed with
//! SIGKILL and restarted while they deliver: nothing is lost, duplicates stay within what was in
//! flight at the kills, a limited subscriber's rate holds across daemons, nothing is left stuck.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::*;
use serde_json::json;

const FAST: [&str; 4] = ["f1", "f2", "f3", "f4"];
const FAST_IN_FLIGHT: usize = 64;
const SLOW_RATE: f64 = 20.0;
const SLOW_BURST: f64 = 40.0;
const SLOW_IN_FLIGHT: usize = 8;

/// A subscriber that keeps its own token bucket of `rate`/s and `burst`, measured at arrival,
/// and answers 429 (with Retry-After) to whatever arrives beyond it; it counts those.
async fn strict_partner(rate: f64, burst: f64) -> (Subscriber, Arc<Mutex<usize>>) {
    let bucket = Arc::new(Mutex::new((burst, Instant::now())));
    let refused = Arc::new(Mutex::new(0usize));
    let r = refused.clone();
    let sub = Subscriber::start(move |rec, _| {
        let mut b = bucket.lock().unwrap();
        let elapsed = rec.at.saturating_duration_since(b.1).as_secs_f64();
        b.0 = (b.0 + elapsed * rate).min(burst);
        b.1 = b.1.max(rec.at);
        if b.0 >= 1.0 - 1e-9 {
            b.0 -= 1.0;
            Answer::status(200)
        } else {
            *r.lock().unwrap() += 1;
            Answer::status(429).header("retry-after", "1")
        }
    })
    .await;
    (sub, refused)
}

/// Deliveries per status, read from the database itself.
async fn statuses(pg: &tokio_postgres::Client) -> HashMap<String, i64> {
    pg.query(
        "SELECT status, COUNT(*) FROM deliveries GROUP BY status",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The most requests in any window of arrivals, less what `burst + rate × t` allows for that
/// window: positive means the rate was exceeded somewhere.
fn worst_excess(arrivals: &[Instant], rate: f64, burst: f64) -> f64 {
    let mut worst = f64::MIN;
    for i in 0..arrivals.len() {
        for j in i..arrivals.len() {
            let t = arrivals[j].duration_since(arrivals[i]).as_secs_f64();
            let n = (j - i + 1) as f64;
            worst = worst.max(n - (burst + rate * t));
        }
    }
    worst
}

async fn ingest_anywhere(daemons: &[Binary], batch: serde_json::Value) {
    for d in daemons.iter().cycle().take(daemons.len() * 3) {
        let (status, _) = d.api.post("/v1/events", batch.clone()).await;
        if status == 202 {
            return;
        }
    }
    panic!("no daemon took the batch");
}

/// Subscribers `s0`..`s7` to every event, created through `d`, each with its own sink.
async fn eight_subscribers(d: &Binary) -> (Vec<String>, Vec<Subscriber>) {
    let ids: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    let mut sinks = Vec::new();
    for id in &ids {
        let sink = Subscriber::ok().await;
        d.api.subscriber(sub_spec(id, &sink.url, &["*"])).await;
        sinks.push(sink);
    }
    (ids, sinks)
}

/// 20 events ingested through `d`: within `within`, every one is sent to each of the
/// subscribers `ids` (the ledger's count), and each sink received all 20.
async fn every_sink_gets_20(
    d: &Binary,
    pg: &tokio_postgres::Client,
    ids: &[String],
    sinks: &[Subscriber],
    within: Duration,
) {
    let n = 20;
    d.api.events(events("a", n, "t")).await;
    let all = (n * ids.len()) as i64;
    wait_for("all sent", within, || async {
        statuses(pg).await.get("sent").copied() == Some(all)
    })
    .await;
    for (id, sink) in ids.iter().zip(sinks) {
        assert_eq!(sink.distinct_ids().0.len(), n, "{id}");
    }
}

/// Three daemons, 20,000 events to four fast subscribers and 400 of them to one limited to
/// 20/s burst 40 that answers 429 past that; one daemon killed with SIGKILL every few seconds
/// and restarted in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_daemons_killed_and_restarted_lose_nothing_and_hold_the_rate() {
    let server = PgServer::start();
    let url = server.database("multi").await;
    let db = Path::new(&url);
    let extra = ["--max-attempts", "20", "--backoff-scale", "0.01"];
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut daemons = Vec::new();
    for &p in &ports {
        daemons.push(Binary::start_at(p, db, &extra).await);
    }
    let mut fast = Vec::new();
    for id in FAST {
        let s = Subscriber::ok().await;
        daemons[0]
            .api
            .subscriber(json!({ "id": id, "url": s.url, "event_types": ["*"],
                "rate_per_sec": 100000, "burst": 100000, "max_in_flight": FAST_IN_FLIGHT,
                "lane": "origin" }))
            .await;
        fast.push(s);
    }
    let (slow, refused) = strict_partner(SLOW_RATE, SLOW_BURST).await;
    daemons[1]
        .api
        .subscriber(
            json!({ "id": "slow", "url": slow.url, "event_types": ["slow.*"],
            "rate_per_sec": SLOW_RATE, "burst": SLOW_BURST as u32,
            "max_in_flight": SLOW_IN_FLIGHT, "lane": "origin" }),
        )
        .await;
    let (n_events, n_slow) = (20_000usize, 400usize);
    let every = n_events / n_slow;
    for chunk in 0..(n_events / 500) {
        let batch: Vec<serde_json::Value> = (chunk * 500..(chunk + 1) * 500)
            .map(|i| {
                let ty = if i % every == 0 { "slow.x" } else { "fast.x" };
                json!({ "id": format!("e{i:05}"), "type": ty })
            })
            .collect();
        ingest_anywhere(&daemons, serde_json::Value::Array(batch)).await;
    }
    let expected = (n_events * FAST.len() + n_slow) as i64;
    let pg = server.connect("multi").await;

    // Kill one daemon every few seconds and restart it in place, until everything is sent.
    let started = Instant::now();
    let mut kills = 0usize;
    let mut k = 0;
    loop {
        let s = statuses(&pg).await;
        if s.get("sent").copied().unwrap_or(0) == expected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not finished after 600 s: {s:?}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        if kills < 8 {
            daemons[k].kill9();
            kills += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            daemons[k] = Binary::start_at(ports[k], db, &extra).await;
            k = (k + 1) % daemons.len();
        }
    }
    let s = statuses(&pg).await;
    assert_eq!(s.get("sent").copied(), Some(expected), "{s:?}");
    assert_eq!(s.len(), 1, "nothing pending, in flight or dead: {s:?}");

    // Every delivery arrived at least once; duplicates only from what was in flight at a kill.
    let mut dupes = 0;
    for (id, sub) in FAST.iter().zip(&fast) {
        let (ids, d) = sub.distinct_ids();
        assert_eq!(ids.len(), n_events, "{id}");
        dupes += d;
    }
    let (slow_ids, slow_dupes) = slow.distinct_ids();
    assert_eq!(slow_ids.len(), n_slow);
    dupes += slow_dupes;
    let bound = kills * (FAST.len() * FAST_IN_FLIGHT + SLOW_IN_FLIGHT);
    eprintln!(
        "{kills} kills, {dupes} duplicates (bound {bound}), {} s",
        started.elapsed().as_secs()
    );
    assert!(dupes <= bound, "{dupes} duplicates > {bound}");

    // The limited subscriber: within burst + rate × t in every window, never a 429.
    let arrivals: Vec<Instant> = slow.received().iter().map(|r| r.at).collect();
    let excess = worst_excess(&arrivals, SLOW_RATE, SLOW_BURST);
    assert!(
        excess <= 0.0,
        "the limited subscriber got {excess} too many in some window"
    );
    assert_eq!(
        *refused.lock().unwrap(),
        0,
        "the limited subscriber answered 429"
    );
}

/// Two daemons; one dies for good mid-way: the other finishes everything, its leases included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_one_of_two_daemons_dies_for_good_the_other_finishes_everything() {
    let server = PgServer::start();
    let url = server.database("two").await;
    let db = Path::new(&url);
    let extra = ["--max-attempts", "20", "--backoff-scale", "0.01"];
    let mut a = Binary::start(db, &extra).await;
    // Slow answers keep many sends out when the first daemon dies.
    let mut sinks = Vec::new();
    for id in ["s1", "s2"] {
        let sink =
            Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_millis(50))).await;
        a.api
            .subscriber(json!({ "id": id, "url": sink.url, "event_types": ["*"],
                "rate_per_sec": 100000, "burst": 100000, "max_in_flight": 32,
                "lane": "origin" }))
            .await;
        sinks.push(sink);
    }
    let n = 3_000usize;
    for chunk in 0..(n / 500) {
        a.api.events(events(&format!("c{chunk}"), 500, "t")).await;
    }
    let pg = server.connect("two").await;
    wait_for("some sent", Duration::from_secs(30), || async {
        statuses(&pg).await.get("sent").copied().unwrap_or(0) > 200
    })
    .await;
    // Kill it while it holds leases (sends out), so the survivor must take them over.
    let port = a.api.base.rsplit(':').next().unwrap().to_string();
    let held = || {
        let pg = &pg;
        let pattern = format!("%:{port}");
        async move {
            pg.query_one(
                "SELECT COUNT(*) FROM deliveries WHERE status = 'in_flight' AND lease_owner LIKE $1",
                &[&pattern],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    wait_for(
        "the first daemon holding leases",
        Duration::from_secs(30),
        || async { held().await > 0 },
    )
    .await;
    // The second daemon comes up while the first holds leases; then the first dies.
    let b = Binary::start(db, &extra).await;
    a.kill9();
    let orphaned = held().await;
    eprintln!("the first daemon died holding {orphaned} leases");
    assert!(orphaned > 0, "it died holding none: nothing to take over");
    let deadline = Instant::now() + Duration::from_secs(120);
    while statuses(&pg).await.get("sent").copied().unwrap_or(0) < 2 * n as i64 {
        if Instant::now() > deadline {
            let rows: Vec<String> = pg
                .query(
                    "SELECT status || ' ' || COALESCE(lease_owner, '-') || ' ' || COUNT(*)
                     FROM deliveries GROUP BY status, lease_owner",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("the survivor did not finish in 120 s: {rows:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = statuses(&pg).await;
    assert_eq!(s.len(), 1, "nothing pending, in flight or dead: {s:?}");
    for sink in &sinks {
        let (ids, _) = sink.distinct_ids();
        assert_eq!(ids.len(), n);
    }
    drop(b);
}

/// Two daemons split the subscribers between them: each subscriber's deliveries all go out
/// through one daemon (so their turns never wait on each other's subscriber locks), both
/// work, and when one stops the other takes its subscribers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemons_split_the_subscribers_and_the_survivor_takes_them_over_at_once() {
    let server = PgServer::start();
    let url = server.database("share").await;
    let db = Path::new(&url);
    let mut daemons = vec![Binary::start(db, &[]).await, Binary::start(db, &[]).await];
    let (ids, sinks) = eight_subscribers(&daemons[0]).await;
    for d in &daemons {
        d.sees_daemons(2).await;
    }
    // Every daemon has read the other (a second more: the last to write has been read too).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let n = 200;
    ingest_anywhere(&daemons, events("a", n, "t")).await;
    let pg = server.connect("share").await;
    let all = (n * ids.len()) as i64;
    wait_for("all sent", Duration::from_secs(60), || async {
        statuses(&pg).await.get("sent").copied() == Some(all)
    })
    .await;
    let delivered = |id: &str| {
        format!("fanout_delivery_results_total{{subscriber=\"{id}\",lane=\"origin\",outcome=\"delivered\"}}")
    };
    let mut owned = [0usize; 2];
    for id in &ids {
        let mut by = Vec::new();
        for d in &daemons {
            by.push(d.metric(&delivered(id)).await);
        }
        assert_eq!(by.iter().sum::<f64>(), n as f64, "{id}: {by:?}");
        let senders: Vec<usize> = (0..2).filter(|&k| by[k] > 0.0).collect();
        assert_eq!(senders.len(), 1, "{id} was sent by both daemons: {by:?}");
        owned[senders[0]] += 1;
    }
    assert!(
        owned.iter().all(|&k| k > 0),
        "one daemon sent everything: {owned:?}"
    );
    // One stops (SIGTERM): it leaves the share, the other owns every subscriber within its
    // next read of the share (a second), well before the stopped one would age out (5 s).
    daemons[1].terminate();
    let left = daemons.remove(0);
    let t = Instant::now();
    wait_for("the survivor alone", Duration::from_secs(3), || async {
        left.metric("fanout_daemons").await == 1.0
    })
    .await;
    eprintln!(
        "the survivor owned everything {} ms after the stop",
        t.elapsed().as_millis()
    );
    left.api.events(events("b", n, "t")).await;
    wait_for("the second batch sent", Duration::from_secs(30), || async {
        statuses(&pg).await.get("sent").copied() == Some(2 * all)
    })
    .await;
    for (id, sink) in ids.iter().zip(&sinks) {
        assert!(left.metric(&delivered(id)).await >= n as f64, "{id}");
        assert_eq!(sink.distinct_ids().0.len(), 2 * n, "{id}");
    }
}

/// The LISTEN connections of both daemons are cut (as a restarted PostgreSQL or a proxy's idle
/// timeout would). Subscribers created through one daemon before the other listens again were
/// never announced to it; it reads every subscriber again once it listens, so those it owns
/// are served too (none is left to a daemon that never heard of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribers_created_while_a_daemon_was_not_listening_are_served() {
    let server = PgServer::start();
    let url = server.database("relisten").await;
    let db = Path::new(&url);
    let daemons = vec![Binary::start(db, &[]).await, Binary::start(db, &[]).await];
    for d in &daemons {
        d.sees_daemons(2).await;
    }
    let pg = server.connect("relisten").await;
    let listening = || async {
        pg.query_one(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    assert_eq!(listening().await, 2);
    pg.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'",
        &[],
    )
    .await
    .unwrap();
    wait_for(
        "the LISTEN connections gone",
        Duration::from_secs(5),
        || async { listening().await == 0 },
    )
    .await;
    // Within the second before they listen again.
    let t = Instant::now();
    let (ids, sinks) = eight_subscribers(&daemons[0]).await;
    let unheard = listening().await;
    eprintln!(
        "8 subscribers created in {} ms, {unheard} daemons listening meanwhile",
        t.elapsed().as_millis()
    );
    wait_for(
        "both daemons listen again",
        Duration::from_secs(10),
        || async { listening().await == 2 },
    )
    .await;
    every_sink_gets_20(&daemons[0], &pg, &ids, &sinks, Duration::from_secs(30)).await;
}

/// A daemon's listening connection goes silent on the way (a load balancer that drops idle
/// connections without a word: the socket stays open, nothing arrives). The daemon asks it
/// every few seconds whether it still answers, listens again when it does not, and reads every
/// subscriber again: subscribers created through the other daemon meanwhile are served, those it
/// owns included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listening_connection_that_went_silent_is_noticed_and_replaced() {
    let server = PgServer::start();
    let url = server.database("silent").await;
    let proxy = common::pg::SilencingProxy::start(server.port).await;
    let proxied = url.replace(&format!(":{}/", server.port), &format!(":{}/", proxy.port));
    let direct = Binary::start(Path::new(&url), &[]).await;
    let behind = Binary::start(Path::new(&proxied), &[]).await;
    direct.sees_daemons(2).await;
    behind.sees_daemons(2).await;
    assert_eq!(
        proxy.silence_listeners(),
        1,
        "the proxied daemon's LISTEN connection"
    );
    let t = Instant::now();
    let (ids, sinks) = eight_subscribers(&direct).await;
    let pg = server.connect("silent").await;
    every_sink_gets_20(&direct, &pg, &ids, &sinks, Duration::from_secs(40)).await;
    eprintln!(
        "all sent {} ms after the listening connection went silent",
        t.elapsed().as_millis()
    );
}

/// `/healthz` never waits on a stalled PostgreSQL server (every one of its processes stopped,
/// its connections open and silent): it answers 503 `ledger_unavailable` within its bound, and
/// 200 again once the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healthz_answers_within_its_bound_while_the_server_is_stalled() {
    let server = PgServer::start();
    let url = server.database("stalled").await;
    let daemon = Binary::start(Path::new(&url), &[]).await;
    let http = reqwest::Client::new();
    let healthz = || async {
        let started = Instant::now();
        let r = http
            .get(format!("{}/healthz", daemon.api.base))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("/healthz answers within 10 s");
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap();
        (status, body, started.elapsed())
    };
    wait_for("healthz 200", Duration::from_secs(20), || async {
        healthz().await.0 == 200
    })
    .await;
    server.stall();
    let (status, body, took) = healthz().await;
    server.resume();
    assert_eq!(status, 503, "{body}");
    assert!(
        body["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["code"] == "ledger_unavailable"),
        "{body}"
    );
    assert!(took < Duration::from_secs(2), "/healthz took {took:?}");
    wait_for("healthz 200 again", Duration::from_secs(20), || async {
        healthz().await.0 == 200
    })
    .await;
}
