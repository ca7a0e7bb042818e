//! Rows once (`ledger/rows/`): a subscriber and a customer with every field away from its
//! default, written through the contract and read back, come back as they were on both
//! backends (each driver's cells and values, the one column list); on PostgreSQL an integer
//! past a 32-bit column is refused, never cut. `fanout ledger copy` reads a ledger from before
//! most columns through the column lists' `before`s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::PgServer;
use fanout_core::batch::BatchSpec;
use fanout_origin::customer::Customer;
use fanout_origin::ledger::store::{Location, OpenOptions, Store};
use fanout_origin::ledger::{Customers, Deliveries, LedgerError, Subscribers};
use fanout_origin::model::{Disabled, Lane, Limits, Ordering, Payload, Scheme, Subscriber};

fn customer() -> Customer {
    Customer {
        id: "acme".into(),
        weight: 7,
        max_in_flight: Some(40),
        portal_nonce: "nonce".into(),
        created_ms: 3,
        updated_ms: 4,
    }
}

fn full_subscriber() -> Subscriber {
    Subscriber {
        id: "full".into(),
        url: "https://example.com/{type}".into(),
        event_types: vec!["video.*".into(), "invoice.paid".into()],
        limits: Limits {
            rate_per_sec: 2.5,
            burst: 7,
            max_in_flight: 3,
            timeout_ms: 4_500,
        },
        lane: Lane::Edge,
        legacy_signature: true,
        created_ms: 11,
        updated_ms: 11,
        customer: Some("acme".into()),
        filter: Some(serde_json::json!({ "region": "eu" })),
        customer_filter: Some(serde_json::json!({ "amount": { "$gt": 5 } })),
        payload: Payload::Thin,
        ordering: Ordering::Key,
        ordering_key: Some("/video_id".into()),
        propagate_trace: true,
        signature: Scheme::Both,
        batch: Some(BatchSpec {
            max_events: 10,
            max_bytes: 65_536,
            max_wait_ms: 200,
        }),
        ..Subscriber::new(
            "",
            "",
            &[],
            Limits {
                rate_per_sec: 1.0,
                burst: 1,
                max_in_flight: 1,
                timeout_ms: 1,
            },
        )
    }
}

/// Create, read, change (every definition field, and disabled) and read again.
async fn round_trip(store: &Store) -> Subscriber {
    store.create_customer(customer()).await.unwrap();
    assert_eq!(store.customer("acme".into()).await.unwrap(), customer());

    let mut s = full_subscriber();
    let got = store
        .create_subscriber(s.clone(), "whsec_x".into())
        .await
        .unwrap();
    assert_eq!(got.secrets.len(), 1);
    s.secrets = got.secrets.clone();
    assert_eq!(got, s);
    assert_eq!(store.subscriber("full".into(), None).await.unwrap(), s);

    let mut next = s.clone();
    next.url = "https://example.org/h".into();
    next.event_types = vec!["*".into()];
    next.limits = Limits {
        rate_per_sec: 0.5,
        burst: 1,
        max_in_flight: 9,
        timeout_ms: 100,
    };
    next.lane = Lane::Origin;
    next.legacy_signature = false;
    next.customer = None;
    next.filter = None;
    next.customer_filter = Some(serde_json::json!({ "kind": "x" }));
    next.payload = Payload::Full;
    next.ordering = Ordering::Subscriber;
    next.ordering_key = None;
    next.propagate_trace = false;
    next.signature = Scheme::Ed25519;
    next.batch = None;
    next.updated_ms = 30;
    next.health.disabled = Some(Disabled {
        at_ms: 31,
        reason: "by hand".into(),
        by_operator: true,
    });
    let sent = next.clone();
    store
        .update_subscriber("full".into(), None, move |_| {
            Ok::<_, LedgerError>((sent, true))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.subscriber("full".into(), None).await.unwrap(), next);
    next
}

#[tokio::test]
async fn a_full_subscriber_comes_back_as_stored_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (store, _held) = Store::open(Location::Sqlite(&path), OpenOptions::default())
        .await
        .unwrap();
    round_trip(&store).await;
}

#[tokio::test]
async fn a_full_subscriber_comes_back_as_stored_on_postgres() {
    let server = PgServer::start();
    let url = server.database("rows").await;
    let opts = OpenOptions {
        daemon: "rows".into(),
        ..OpenOptions::default()
    };
    let (store, _held) = Store::open(Location::Postgres(&url), opts).await.unwrap();
    let mut s = round_trip(&store).await;
    // The health columns the dispatcher writes read back too.
    server
        .connect("rows")
        .await
        .execute("UPDATE subscribers SET failing_since_ms = 29", &[])
        .await
        .unwrap();
    s.health.failing_since_ms = Some(29);
    assert_eq!(store.subscriber("full".into(), None).await.unwrap(), s);

    // A burst past PostgreSQL's INTEGER is refused whole, not stored cut to fit.
    let mut big = full_subscriber();
    big.id = "big".into();
    big.customer = None;
    big.limits.burst = u32::MAX;
    assert!(store
        .create_subscriber(big, "whsec_y".into())
        .await
        .is_err());
    assert!(store.subscriber("big".into(), None).await.is_err());
}

/// A SQLite ledger at schema 2 (the oldest the copy takes), as its migrations made it.
const SCHEMA_2: &str = "
    CREATE TABLE subscribers (
        id TEXT PRIMARY KEY, url TEXT NOT NULL, event_types TEXT NOT NULL,
        rate_per_sec REAL NOT NULL, burst INTEGER NOT NULL, max_in_flight INTEGER NOT NULL,
        timeout_ms INTEGER NOT NULL, lane TEXT NOT NULL, legacy_signature INTEGER NOT NULL DEFAULT 0,
        limiter TEXT, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, deleted_ms INTEGER,
        disabled_ms INTEGER, disabled_reason TEXT, failing_since_ms INTEGER, dead_alerted_ms INTEGER);
    CREATE TABLE subscriber_secrets (
        subscriber_id TEXT NOT NULL REFERENCES subscribers(id), secret TEXT NOT NULL,
        created_ms INTEGER NOT NULL, expires_ms INTEGER);
    CREATE TABLE events (
        id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, body TEXT NOT NULL, received_ms INTEGER NOT NULL);
    CREATE TABLE deliveries (
        id INTEGER PRIMARY KEY, subscriber_id TEXT NOT NULL, event_id TEXT NOT NULL,
        status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_attempt_ms INTEGER NOT NULL,
        lease_expires_ms INTEGER, last_error TEXT, created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL, UNIQUE (subscriber_id, event_id));
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY, delivery_id INTEGER NOT NULL, attempt INTEGER NOT NULL,
        at_ms INTEGER NOT NULL, lane TEXT NOT NULL, outcome TEXT NOT NULL, status INTEGER,
        latency_ms INTEGER, response_body TEXT, error TEXT);
    INSERT INTO subscribers VALUES ('old', 'https://example.com/h', '[\"*\"]', 2.0, 4, 2, 1000,
        'origin', 1, NULL, 1, 2, NULL, 5, 'disabled by an operator', 3, NULL);
    INSERT INTO subscriber_secrets VALUES ('old', 'whsec_old', 1, NULL);
    INSERT INTO events VALUES ('e1', 't', '{}', 4), ('e2', 't', '{}', 4);
    INSERT INTO deliveries VALUES (10, 'old', 'e1', 'sent', 1, 4, NULL, NULL, 4, 6),
        (11, 'old', 'e2', 'in_flight', 1, 4, 999, NULL, 4, 6);
    INSERT INTO attempts VALUES (1, 10, 1, 5, 'origin', 'delivered', 200, 12, 'ok', NULL);
    PRAGMA user_version = 2;
";

#[tokio::test]
async fn a_ledger_from_before_most_columns_copies_with_their_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(SCHEMA_2)
        .unwrap();
    let server = PgServer::start();
    let url = server.database("old").await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["ledger", "copy", "--from"])
        .arg(&path)
        .args(["--to", &url])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "1 subscribers, 2 events, 2 deliveries (1 were in flight: now pending), 1 attempts"
        ),
        "{stderr}"
    );
    let opts = OpenOptions {
        daemon: "after".into(),
        ..OpenOptions::default()
    };
    let (store, _held) = Store::open(Location::Postgres(&url), opts).await.unwrap();
    let s = store.subscriber("old".into(), None).await.unwrap();
    // Disabled by the reason an operator's disable wrote before schema 6.
    assert_eq!(
        s.health.disabled,
        Some(Disabled {
            at_ms: 5,
            reason: "disabled by an operator".into(),
            by_operator: true,
        })
    );
    assert_eq!(s.health.failing_since_ms, Some(3));
    assert_eq!(
        (
            s.payload,
            s.ordering,
            s.signature,
            s.propagate_trace,
            s.legacy_signature
        ),
        (Payload::Full, Ordering::None, Scheme::Hmac, false, true)
    );
    assert_eq!((s.customer, s.filter, s.batch), (None, None, None));
    assert_eq!(s.secrets.len(), 1);
    assert_eq!(s.secrets[0].signing_key, None);
    // Numbered per subscriber in id order; the one in flight is pending, due now.
    let sent = store.get_delivery(10, None).await.unwrap();
    let requeued = store.get_delivery(11, None).await.unwrap();
    assert_eq!((sent.sequence, requeued.sequence), (1, 2));
    assert_eq!(requeued.status, fanout_origin::model::Status::Pending);
    assert!(requeued.next_attempt_at_ms.unwrap() > 1_000);
    assert_eq!(sent.attempts.unwrap().len(), 1);
}
