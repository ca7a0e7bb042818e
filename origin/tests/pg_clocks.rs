//! Real `fanout` daemons whose hosts' clocks are wrong share one PostgreSQL ledger (a throwaway
//! server): one daemon runs 60 s ahead and one 60 s behind (libfaketime shifts the time the
//! process reads; its monotonic clock is left alone). They agree on the server's clock, so no
//! lease is taken from a live daemon, nothing waits for a skew, and each reports its offset.
//! Webhooks are signed with the host's clock, the one their receivers compare with: a PostgreSQL
//! server whose clock is off (libfaketime on the server) signs nothing, and is named.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::pg::PgServer;
use common::*;
use serde_json::json;

/// libfaketime's preload library (`scripts/setup.sh` installs Debian's `libfaketime`), or
/// `FANOUT_LIBFAKETIME`.
fn libfaketime() -> PathBuf {
    if let Some(p) = std::env::var_os("FANOUT_LIBFAKETIME") {
        return PathBuf::from(p);
    }
    ["x86_64-linux-gnu", "aarch64-linux-gnu", ""]
        .iter()
        .map(|arch| {
            Path::new("/usr/lib")
                .join(arch)
                .join("faketime/libfaketime.so.1")
        })
        .find(|p| p.exists())
        .expect("libfaketime is not installed (run scripts/setup.sh)")
}

/// A daemon whose process reads the time shifted by `shift` (`+60s`, `-60s`).
async fn shifted(db: &Path, extra: &[&str], shift: &str) -> Binary {
    let lib = libfaketime();
    Binary::start_env(
        free_port(),
        db,
        extra,
        &[
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("FAKETIME", shift),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
    .await
}

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

/// 40 webhooks (10 events, ingested half through each daemon, to 4 subscribers that take a
/// second to answer, two at a time) go out once each, all within seconds, while one daemon's
/// clock is 60 s ahead and the other's 60 s behind; each daemon shows its offset from the
/// server's clock (`/metrics`, `fanout status`), and each webhook carries the time of the host
/// that sent it (what a receiver would be right to refuse: the host's clock is wrong).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemons_60s_ahead_and_behind_send_each_webhook_once_on_time() {
    let server = PgServer::start();
    let url = server.database("clocks").await;
    let db = Path::new(&url);
    let ahead = shifted(db, &[], "+60s").await;
    let behind = shifted(db, &[], "-60s").await;
    ahead.sees_daemons(2).await;
    behind.sees_daemons(2).await;
    let mut sinks = Vec::new();
    for i in 0..4 {
        let sink =
            Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_secs(1))).await;
        ahead
            .api
            .subscriber(
                json!({ "id": format!("s{i}"), "url": sink.url, "event_types": ["*"],
                "rate_per_sec": 1000, "burst": 1000, "max_in_flight": 2, "lane": "origin" }),
            )
            .await;
        sinks.push(sink);
    }
    let pg = server.connect("clocks").await;
    ahead.api.events(events("ahead", 5, "t")).await;
    behind.api.events(events("behind", 5, "t")).await;
    // Wait for all 40 sent; when they are not, say where they are and what the sinks got.
    let all_sent = HashMap::from([("sent".to_string(), 40)]);
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut now = statuses(&pg).await;
    while now != all_sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = statuses(&pg).await;
    }
    let got: Vec<(usize, usize)> = sinks
        .iter()
        .map(|s| {
            let (ids, dupes) = s.distinct_ids();
            (ids.len(), dupes)
        })
        .collect();
    assert_eq!(now, all_sent, "sinks' (distinct, repeated): {got:?}");
    let now_s = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()) as i64;
    let mut received = 0;
    for (i, sink) in sinks.iter().enumerate() {
        let (ids, dupes) = sink.distinct_ids();
        assert_eq!((ids.len(), dupes), (10, 0), "s{i}: distinct, repeated");
        for r in sink.received() {
            let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
            assert!(
                (ts - now_s - 60).abs() <= 10 || (ts - now_s + 60).abs() <= 10,
                "s{i}: webhook-timestamp {ts}, now {now_s}: not a shifted host's"
            );
        }
        received += sink.count();
    }
    assert_eq!(received, 40);
    let a = ahead.metric("fanout_clock_offset_seconds").await;
    let b = behind.metric("fanout_clock_offset_seconds").await;
    assert!(
        (a + 60.0).abs() < 1.0,
        "ahead: server's clock {a} s from the host's"
    );
    assert!(
        (b - 60.0).abs() < 1.0,
        "behind: server's clock {b} s from the host's"
    );
    // `fanout status` says so too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["status", "--server", &ahead.api.base])
        .env("FANOUT_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Which clock is off is named once the daemon heard a subscriber's `Date`, which it may
    // not have (the other daemon may own all four).
    assert!(
        out.status.success() && text.contains("60.0 s") && text.contains("the PostgreSQL server's"),
        "{text}"
    );
}

/// The PostgreSQL server's clock 600 s ahead (libfaketime on the server), the host's right:
/// the webhooks carry the host's time, which their receiver compares with its own, and the
/// daemon names the server's clock as the one that is off (its subscriber's `Date` agrees with
/// the host's), in `/metrics` and `fanout status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_600s_ahead_signs_nothing_and_is_named() {
    let lib = libfaketime();
    let server = PgServer::start_env(
        &["-c", "fsync=off", "-c", "synchronous_commit=off"],
        &[
            ("LD_PRELOAD", lib.to_str().unwrap()),
            ("FAKETIME", "+600s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let url = server.database("skewed").await;
    let daemon = Binary::start(Path::new(&url), &[]).await;
    let sink = Subscriber::start(|_, _| Answer::status(200)).await;
    daemon
        .api
        .subscriber(json!({ "id": "s", "url": sink.url, "event_types": ["*"], "lane": "origin" }))
        .await;
    daemon.api.events(events("e", 3, "t")).await;
    wait_for("3 webhooks", Duration::from_secs(20), || async {
        sink.count() == 3
    })
    .await;
    let now_s = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()) as i64;
    for r in sink.received() {
        let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
        assert!(
            (ts - now_s).abs() <= 10,
            "webhook-timestamp {ts}, now {now_s}: not the host's clock"
        );
    }
    let offset = daemon.metric("fanout_clock_offset_seconds").await;
    assert!(
        (offset - 600.0).abs() < 2.0,
        "server's clock {offset} s ahead"
    );
    let peers = daemon.metric("fanout_peer_clock_offset_seconds").await;
    assert!(peers.abs() <= 2.0, "the subscriber's Date {peers} s off");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["status", "--server", &daemon.api.base])
        .env("FANOUT_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains("the PostgreSQL server's clock is 600.0 s ahead of this host's"),
        "{text}"
    );
}
