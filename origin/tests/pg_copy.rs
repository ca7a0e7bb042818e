//! `fanout ledger copy` from a SQLite ledger into a throwaway PostgreSQL server
//! (tests/common/pg.rs), through the binary and the contract only. (Customers and portal links
//! over the copy: `pg_customers.rs`.)

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::pg::PgServer;
use fanout_core::breaker::BreakerConfig;
use fanout_origin::ledger::postgres::PgLedger;
use fanout_origin::ledger::{
    AttemptRecord, DeliveryFilter, DispatchLedger, NewEvent, Outcome, Transition, Turn,
};
use fanout_origin::model::{Lane, Limits, Status, Subscriber};

const BREAKER: BreakerConfig = BreakerConfig {
    threshold: 20,
    cooldown_ms: 30_000,
};

fn sub(id: &str, rate: f64, burst: u32, max_in_flight: u32) -> Subscriber {
    Subscriber {
        lane: Lane::Origin,
        ..Subscriber::new(
            id,
            "https://example.com/h",
            &["*"],
            Limits {
                rate_per_sec: rate,
                burst,
                max_in_flight,
                timeout_ms: 1000,
            },
        )
    }
}

fn ev(id: &str) -> NewEvent {
    NewEvent {
        id: id.into(),
        event_type: "t".into(),
        body: format!("{{\"id\":\"{id}\"}}"),
        traceparent: None,
    }
}

fn sent(rowid: i64, at_ms: i64) -> Outcome {
    Outcome {
        rowid,
        transition: Transition::Sent,
        attempt: Some(AttemptRecord {
            attempt: 1,
            at_ms,
            lane: "origin",
            outcome: "delivered",
            status: Some(200),
            latency_ms: Some(1),
            response_body: None,
            error: None,
        }),
    }
}

/// `fanout ledger copy` moves a SQLite ledger with its history: statuses, attempts, limiter
/// state and ids survive, in-flight work comes over pending, and a second copy into the now
/// non-empty database is refused.
#[tokio::test]
async fn ledger_copy_moves_a_sqlite_ledger_into_an_empty_postgres_one() {
    use fanout_origin::ledger::sqlite::Ledger;
    use fanout_origin::ledger::store::Store;
    use fanout_origin::ledger::{Deliveries as _, Observe as _, Subscribers as _};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fanout.db");
    let n = 12_000; // more than one copy chunk
    {
        let ledger = Store::from(Ledger::open(&path).unwrap());
        let (mut a, b) = (sub("a", 1e6, 1_000_000, 100_000), sub("gone", 5.0, 9, 3));
        a.payload = fanout_origin::model::Payload::Thin;
        a.signature = fanout_origin::model::Scheme::Both;
        let keys = fanout_origin::keyring::NewSecret {
            secret: "whsec_a".into(),
            signing_key: Some(fanout_origin::keyring::new_signing_key(&[5; 32])),
        };
        ledger.create_subscriber(a, keys).await.unwrap();
        ledger.create_subscriber(b, "whsec_b".into()).await.unwrap();
        ledger
            .ingest((0..n).map(|i| ev(&format!("e{i:05}"))).collect(), 1)
            .await
            .unwrap();
        // Dead and sent deliveries with attempts, one still in flight, and a limiter.
        let turn = |t: Turn| {
            let ledger = ledger.clone();
            async move { ledger.record_turn(t).await.map_err(|e| e.error).unwrap() }
        };
        let leased = turn(Turn {
            now_ms: 2,
            claims: vec![("a".into(), 3)],
            lease_until_ms: 100_000,
            ..Turn::default()
        })
        .await;
        let ids: Vec<i64> = leased.claims[0].claimed.iter().map(|d| d.rowid).collect();
        let mut gone = sent(ids[1], 3);
        gone.transition = Transition::Dead {
            reason: "410".into(),
        };
        let limiter = fanout_core::limiter::LimiterState {
            paused_until_ms: Some(123_456),
            ..Default::default()
        };
        turn(Turn {
            now_ms: 4,
            outcomes: vec![sent(ids[0], 3), gone],
            limiters: vec![("a".into(), limiter)],
            ..Turn::default()
        })
        .await;
        ledger.delete_subscriber("gone".into(), 5).await.unwrap();
        // Both filters come over (set after ingest: the events match neither): the operator's
        // and the customer's own.
        ledger
            .update_subscriber("a".into(), None, |mut x| {
                x.filter = Some(serde_json::json!({ "customer": "acme" }));
                x.customer_filter = Some(serde_json::json!({ "amount": { "$gt": 5 } }));
                Ok::<_, String>((x, false))
            })
            .await
            .unwrap()
            .unwrap();
        ledger.close().await.unwrap();
    }
    let server = PgServer::start();
    let url = server.database("copy").await;
    let copy = |url: String| {
        let path = path.clone();
        std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["ledger", "copy", "--from"])
            .arg(&path)
            .args(["--to", &url])
            .output()
            .unwrap()
    };
    let out = copy(url.clone());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("events: {n}/{n}")), "{stderr}");
    assert!(
        stderr.contains("deliveries: 10000/"),
        "progress by chunks: {stderr}"
    );
    assert!(stderr.contains("1 were in flight"), "{stderr}");

    let pg = Store::from(PgLedger::open(&url, "after-copy").await.unwrap());
    let (by_status, _, _) = pg.metrics_snapshot(9, BREAKER).await.unwrap();
    let counts: HashMap<String, i64> = by_status.into_iter().filter(|(_, n)| *n != 0).collect();
    assert_eq!(counts.get("sent"), Some(&1));
    assert_eq!(counts.get("in_flight"), None);
    // The removed subscriber's deliveries went dead with it (n) plus the 410 one.
    assert_eq!(counts.get("dead"), Some(&(n as i64 + 1)));
    assert_eq!(counts.get("pending"), Some(&(n as i64 - 2)));
    let subs = pg.subscribers(None, false, None).await.unwrap().0;
    assert_eq!(subs.len(), 1, "removed subscribers stay removed");
    assert_eq!(subs[0].secrets[0].secret, "whsec_a");
    assert_eq!(subs[0].payload, fanout_origin::model::Payload::Thin);
    assert_eq!(
        (subs[0].filter.clone(), subs[0].customer_filter.clone()),
        (
            Some(serde_json::json!({ "customer": "acme" })),
            Some(serde_json::json!({ "amount": { "$gt": 5 } }))
        )
    );
    // The scheme and the Ed25519 signing key come over with the secret.
    assert_eq!(subs[0].signature, fanout_origin::model::Scheme::Both);
    assert_eq!(
        subs[0].secrets[0].signing_key,
        Some(fanout_origin::keyring::new_signing_key(&[5; 32]))
    );
    let (_, limiter) = pg.dispatch_subscriber("a").await.unwrap().unwrap();
    assert_eq!(limiter.paused_until_ms, Some(123_456));
    let dead = pg
        .list_deliveries(DeliveryFilter {
            status: Some(Status::Dead),
            subscriber: Some("a".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let detail = pg
        .get_delivery(dead[0].id.trim_start_matches("dlv_").parse().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(detail.attempts.map(|a| a.len()), Some(1));
    assert_eq!(detail.last_error.as_deref(), Some("410"));
    // New rows continue after the copied ids (an event both filters let through; one the
    // customer's refuses makes no delivery).
    let mut new = ev("new");
    new.body = r#"{"id":"new","customer":"acme","amount":10}"#.into();
    let mut small = ev("small");
    small.body = r#"{"id":"small","customer":"acme","amount":1}"#.into();
    let (made, _) = pg.ingest(vec![new, small], 9).await.unwrap();
    assert_eq!(
        made.iter().map(|m| m.deliveries).collect::<Vec<_>>(),
        [1, 0]
    );
    let newest = pg
        .list_deliveries(DeliveryFilter {
            event: Some("new".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(newest[0].id, format!("dlv_{}", 2 * n + 1));
    // Sequence numbers came over, and the counter goes on from them.
    assert_eq!(newest[0].sequence, n as u64 + 1);
    assert_eq!(dead[0].sequence, 2, "the 410 was a's second delivery");

    // Not into a ledger that holds anything.
    let again = copy(url);
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("not empty"), "{stderr}");
}
