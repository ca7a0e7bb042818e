//! Rows once (`ledger/rows/`): a subscriber and a customer with every field away from its
//! default, written through the contract and read back, come back as they were on both
//! backends (each driver's cells and values, the one column list); on PostgreSQL an integer
//! past a 32-bit column is refused, never cut.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::PgServer;
use fanout_core::batch::BatchSpec;
use fanout_origin::customer::Customer;
use fanout_origin::ledger::store::{Location, OpenOptions, Store};
use fanout_origin::ledger::{Customers, LedgerError, Subscribers};
use fanout_origin::model::{Disabled, Health, Lane, Limits, Ordering, Payload, Scheme, Subscriber};

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
        secrets: Vec::new(),
        created_ms: 11,
        updated_ms: 11,
        health: Health::default(),
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
