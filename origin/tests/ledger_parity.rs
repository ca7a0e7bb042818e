//! One suite of the ledger's contract, run on both backends: every case below is an
//! `async fn(Store, now)` that speaks only the contract's traits (`Subscribers`, `Deliveries`,
//! `Customers`, `DispatchLedger`, `Retention`, `SeriesLedger`, `Observe`) through a
//! [`Store`], and each runs once on a fresh SQLite file and once on a fresh database of one
//! throwaway PostgreSQL server (tests/common/pg.rs). Time is the case's `now` and what it
//! adds to it; nothing sleeps. What only PostgreSQL does (several daemons, locks, leases and
//! their owners, plans, vacuum) is tested in the `pg_*.rs` files; what only SQLite does (the
//! owner lock, backups, the file's size) beside its backend.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use fanout_origin::alert::rules::Alert;
use fanout_origin::customer::Customer;
use fanout_origin::ledger::postgres::PgLedger;
use fanout_origin::ledger::series::SeriesLedger;
use fanout_origin::ledger::sqlite::Ledger;
use fanout_origin::ledger::store::Store;
use fanout_origin::ledger::{
    AttemptRecord, Claim, Customers, Deliveries, DeliveryFilter, DeliveryView, DispatchLedger,
    Finished, HealthWrite, LedgerError, NewEvent, Observe, Outcome, Recorded, Retention,
    Subscribers, Transition, Turn,
};
use fanout_origin::model::{Disabled, Lane, Limits, Status, Subscriber};
use fanout_origin::ordering::Ordering;
use fanout_origin::series::buckets::{Counts, Gauges, SeriesRow, HIST_LEN};

/// The time every case starts at (a case adds to it; no clock is read).
const NOW: i64 = 1_000_000;
/// How long a case's leases last: under PostgreSQL's own bound (`LEASE_MS`, 15 s).
const LEASE: i64 = 10_000;
const BREAKER: BreakerConfig = BreakerConfig {
    threshold: 20,
    cooldown_ms: 30_000,
};

type CaseFn = fn(Store, i64) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// The table: each case's name and its function.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        &[$((stringify!($case), |s, now| Box::pin($case(s, now)))),*]
    };
}

const CASES: &[(&str, CaseFn)] = cases![
    subscribers_are_created_read_changed_and_rotated,
    every_subscriber_field_round_trips_and_filters_decide_at_ingest,
    removing_a_subscriber_ends_its_work_and_its_id_comes_back_new,
    ingest_fans_out_once_per_subscriber_and_event,
    deliveries_are_listed_by_every_filter_and_page,
    a_turn_records_every_transition_and_its_attempt_once,
    leases_expire_and_strays_are_released_but_those_held,
    replays_of_one_and_in_steps_and_their_count,
    dead_counts_alert_once_per_crossing_and_rearm_after_a_replay,
    health_writes_stop_claims_and_a_reenable_resets_them,
    customers_weights_subscribers_and_portal_links,
    a_test_event_goes_to_its_one_subscriber,
    an_events_traceparent_comes_back_with_its_claims,
    ordered_keys_hold_back_and_runs_are_leased_together,
    an_expired_run_comes_back_with_one_head_per_key,
    retention_removes_finished_deliveries_past_their_window,
    retention_forgets_a_key_idle_past_it,
    a_removed_ids_history_is_forgotten_once_none_of_its_deliveries_is_kept,
    series_rows_add_up_are_scoped_and_trimmed,
    gauges_pings_and_the_share,
];

#[tokio::test]
async fn every_case_on_sqlite() {
    let mut failed = Vec::new();
    let started = Instant::now();
    for (name, case) in CASES {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::from(Ledger::open(&dir.path().join("parity.db")).unwrap());
        if let Err(e) = tokio::spawn(case(store, NOW)).await {
            failed.push(format!("{name}: {e}"));
        }
    }
    eprintln!("sqlite: {} cases in {:?}", CASES.len(), started.elapsed());
    assert!(
        failed.is_empty(),
        "failed on sqlite:\n{}",
        failed.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_on_postgres() {
    let server = common::pg::PgServer::start();
    let started = Instant::now();
    let mut failed = Vec::new();
    for (name, case) in CASES {
        let url = server.database(name).await;
        let store = Store::from(PgLedger::open(&url, "parity").await.unwrap());
        if let Err(e) = tokio::spawn(case(store, NOW)).await {
            failed.push(format!("{name}: {e}"));
        }
    }
    eprintln!("postgres: {} cases in {:?}", CASES.len(), started.elapsed());
    assert!(
        failed.is_empty(),
        "failed on postgres:\n{}\n{}",
        failed.join("\n"),
        server.log()
    );
}

// ---- fixtures ----

/// A subscriber to every type in `types`, whose limits never hold a case's claims back.
fn sub(id: &str, types: &[&str]) -> Subscriber {
    Subscriber {
        lane: Lane::Origin,
        ..Subscriber::new(
            id,
            "https://example.com/h",
            types,
            Limits {
                rate_per_sec: 1e6,
                burst: 1_000_000,
                max_in_flight: 1_000,
                timeout_ms: 1000,
            },
        )
    }
}

/// An ordered subscriber keyed by the body's `k` (`/k`), with `max_in_flight` requests.
fn ordered(id: &str, max_in_flight: u32) -> Subscriber {
    let mut s = sub(id, &["*"]);
    s.limits.max_in_flight = max_in_flight;
    s.ordering = Ordering::Key;
    s.ordering_key = Some("/k".into());
    s
}

fn ev(id: &str, ty: &str) -> NewEvent {
    NewEvent {
        id: id.into(),
        event_type: ty.into(),
        body: format!("{{\"id\":\"{id}\"}}"),
        traceparent: None,
    }
}

/// Event `id` of type `t` for ordered key `k`.
fn keyed(id: &str, k: &str) -> NewEvent {
    NewEvent {
        body: format!("{{\"k\":\"{k}\"}}"),
        ..ev(id, "t")
    }
}

fn evs(prefix: &str, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| ev(&format!("{prefix}{i:02}"), "t"))
        .collect()
}

async fn add(s: &Store, sub: Subscriber) -> Subscriber {
    s.create_subscriber(sub, "whsec_s".into()).await.unwrap()
}

async fn record(s: &Store, turn: Turn) -> Recorded {
    s.record_turn(turn).await.map_err(|e| e.error).unwrap()
}

/// A turn at `now` that only leases up to `n` of `id`'s due deliveries for [`LEASE`].
async fn claim(s: &Store, id: &str, n: usize, now: i64) -> Claim {
    let mut r = record(
        s,
        Turn {
            now_ms: now,
            claims: vec![(id.into(), n)],
            lease_until_ms: now + LEASE,
            ..Turn::default()
        },
    )
    .await;
    assert_eq!(r.claims.len(), 1, "{r:?}");
    r.claims.remove(0)
}

/// A turn at `now` that records `outcomes` and leases nothing.
async fn finish(s: &Store, outcomes: Vec<Outcome>, now: i64) -> Recorded {
    record(
        s,
        Turn {
            now_ms: now,
            outcomes,
            ..Turn::default()
        },
    )
    .await
}

fn rowids(c: &Claim) -> Vec<i64> {
    c.claimed.iter().map(|d| d.rowid).collect()
}

fn attempt(at_ms: i64, outcome: &'static str, status: u16) -> Option<AttemptRecord> {
    Some(AttemptRecord {
        attempt: 1,
        at_ms,
        lane: "origin",
        outcome,
        status: Some(status),
        latency_ms: Some(1),
        response_body: None,
        error: None,
    })
}

fn sent(rowid: i64, at_ms: i64) -> Outcome {
    Outcome {
        rowid,
        transition: Transition::Sent,
        attempt: attempt(at_ms, "delivered", 200),
    }
}

fn dead(rowid: i64, at_ms: i64) -> Outcome {
    Outcome {
        rowid,
        transition: Transition::Dead {
            reason: "410".into(),
        },
        attempt: attempt(at_ms, "rejected", 410),
    }
}

fn all(limit: usize) -> DeliveryFilter {
    DeliveryFilter {
        limit,
        ..Default::default()
    }
}

fn rowid_of(d: &DeliveryView) -> i64 {
    d.id.trim_start_matches("dlv_").parse().unwrap()
}

fn event_ids(ds: &[DeliveryView]) -> Vec<String> {
    ds.iter().map(|d| d.event_id.clone()).collect()
}

/// Deliveries per status, from `/metrics`' snapshot.
async fn statuses(s: &Store, now: i64) -> Vec<(String, i64)> {
    let mut by = s.metrics_snapshot(now, BREAKER).await.unwrap().0;
    by.retain(|(_, n)| *n != 0);
    by.sort();
    by
}

fn counts(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = pairs.iter().map(|(s, n)| (s.to_string(), *n)).collect();
    v.sort();
    v
}

// ---- cases ----

/// Create (a taken id is a conflict), read, change in one transaction (a change that refuses
/// changes nothing; a customer that does not exist is invalid), list with figures, and
/// rotate secrets: at most one rotation a minute, two secrets sign, two are kept.
async fn subscribers_are_created_read_changed_and_rotated(s: Store, now: i64) {
    let a = sub("a", &["*"]);
    let stored = s
        .create_subscriber(a.clone(), "whsec_one".into())
        .await
        .unwrap();
    assert_eq!(stored.active_secrets(now), ["whsec_one"]);
    assert!(matches!(
        s.create_subscriber(a.clone(), "x".into()).await,
        Err(LedgerError::Conflict(_))
    ));
    assert!(matches!(
        s.subscriber("nobody".into(), None).await,
        Err(LedgerError::NotFound(_))
    ));
    let changed = s
        .update_subscriber("a".into(), None, |mut x| {
            x.url = "https://example.com/other".into();
            x.limits.burst = 7;
            Ok::<_, String>((x, false))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(changed.limits.burst, 7);
    let refused = s
        .update_subscriber("a".into(), None, |mut x| {
            x.url = "https://example.com/never".into();
            Err::<(Subscriber, bool), _>("no".to_string())
        })
        .await
        .unwrap();
    assert_eq!(refused.unwrap_err(), "no");
    let unknown = s
        .update_subscriber("a".into(), None, |mut x| {
            x.customer = Some("nobody".into());
            Ok::<_, String>((x, false))
        })
        .await;
    assert!(
        matches!(unknown, Err(LedgerError::Invalid(_))),
        "{unknown:?}"
    );
    let got = s.subscriber("a".into(), None).await.unwrap();
    assert_eq!(
        (got.url.as_str(), got.limits.burst, got.customer),
        ("https://example.com/other", 7, None)
    );
    add(&s, sub("b", &["t"])).await;
    let (listed, figures) = s.subscribers(None, false, None).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|x| x.id.as_str()).collect();
    assert_eq!((ids, figures), (vec!["a", "b"], None));
    s.ingest(evs("e", 2), now).await.unwrap();
    let (one, figures) = s.subscribers(Some("b".into()), true, None).await.unwrap();
    assert_eq!(one.len(), 1);
    let figures = figures.unwrap();
    assert_eq!((figures["b"].pending, figures["b"].sent), (2, 0));

    s.rotate_secret("a".into(), "whsec_two".into(), now + 10, 100, None)
        .await
        .unwrap();
    let got = s.subscriber("a".into(), None).await.unwrap();
    assert_eq!(got.active_secrets(now + 50).len(), 2);
    assert_eq!(got.active_secrets(now + 200), ["whsec_two"]);
    let soon = s
        .rotate_secret("a".into(), "whsec_soon".into(), now + 40, 100, None)
        .await;
    let minute = fanout_origin::model::MIN_ROTATION_INTERVAL_MS;
    match soon {
        Err(LedgerError::TooSoon { retry_after_ms, .. }) => {
            assert_eq!(retry_after_ms, minute - 30)
        }
        other => panic!("{other:?}"),
    }
    for k in 1..=3 {
        let at = now + 10 + k * minute;
        s.rotate_secret(
            "a".into(),
            format!("whsec_{k}").as_str().into(),
            at,
            100,
            None,
        )
        .await
        .unwrap();
    }
    let got = s.subscriber("a".into(), None).await.unwrap();
    assert_eq!(
        got.active_secrets(now + 10 + 3 * minute),
        ["whsec_3", "whsec_2"]
    );
    assert_eq!(got.secrets.len(), 2, "{:?}", got.secrets);
    assert!(matches!(
        s.rotate_secret("nobody".into(), "s".into(), now, 1, None)
            .await,
        Err(LedgerError::NotFound(_))
    ));
}

/// Every field of a subscriber comes back as written, created and then changed to other
/// values (its secret with its signing key too), and its filters decide at ingest which
/// events make deliveries.
async fn every_subscriber_field_round_trips_and_filters_decide_at_ingest(s: Store, now: i64) {
    use fanout_core::batch::BatchSpec;
    use fanout_origin::keyring::{new_signing_key, NewSecret};
    s.create_customer(Customer {
        id: "acme".into(),
        weight: 1,
        max_in_flight: None,
        portal_nonce: "n".into(),
        created_ms: now,
        updated_ms: now,
    })
    .await
    .unwrap();
    let mut x = sub("full", &["video.*", "audio.new"]);
    x.url = "https://example.com/full?x=1".into();
    x.limits = Limits {
        rate_per_sec: 2.5,
        burst: 7,
        max_in_flight: 3,
        timeout_ms: 4_500,
    };
    x.lane = Lane::Edge;
    x.legacy_signature = true;
    (x.created_ms, x.updated_ms) = (now, now);
    x.customer = Some("acme".into());
    x.filter = Some(serde_json::json!({ "region": "eu" }));
    x.customer_filter = Some(serde_json::json!({ "amount": { "$gt": 5 } }));
    x.payload = fanout_origin::payload::Payload::Thin;
    x.ordering = Ordering::Subscriber;
    x.propagate_trace = true;
    x.signature = fanout_core::sign::Scheme::Both;
    x.batch = Some(BatchSpec {
        max_events: 10,
        max_bytes: 65_536,
        max_wait_ms: 200,
    });
    let key = new_signing_key(&[7; 32]);
    let keys = NewSecret {
        secret: "whsec_full".into(),
        signing_key: Some(key.clone()),
    };
    s.create_subscriber(x.clone(), keys).await.unwrap();
    let mut got = s.subscriber("full".into(), None).await.unwrap();
    let secrets = std::mem::take(&mut got.secrets);
    assert_eq!(got, x);
    let stored: Vec<(&str, Option<&str>, i64)> = secrets
        .iter()
        .map(|g| (g.secret.as_str(), g.signing_key.as_deref(), g.created_ms))
        .collect();
    assert_eq!(stored, [("whsec_full", Some(key.as_str()), now)]);
    let body = |region: &str, amount: i64| format!(r#"{{"region":"{region}","amount":{amount}}}"#);
    let events = [
        ("in", "video.x", body("eu", 10)),
        ("other_region", "video.x", body("us", 10)),
        ("too_small", "video.x", body("eu", 1)),
        ("other_type", "audio.old", body("eu", 10)),
    ];
    let events: Vec<NewEvent> = events
        .iter()
        .map(|(id, ty, body)| NewEvent {
            body: body.clone(),
            ..ev(id, ty)
        })
        .collect();
    let (made, _) = s.ingest(events, now + 1).await.unwrap();
    let made: Vec<u32> = made.iter().map(|m| m.deliveries).collect();
    assert_eq!(made, [1, 0, 0, 0], "both filters and the types decide");

    let mut y = sub("full", &["t"]);
    y.url = "https://example.com/other".into();
    (y.created_ms, y.updated_ms) = (now, now + 2);
    y.lane = Lane::Auto;
    y.ordering = Ordering::Key;
    y.ordering_key = Some("/k".into());
    y.secrets = secrets.clone();
    let next = y.clone();
    s.update_subscriber("full".into(), None, move |_| Ok::<_, String>((next, false)))
        .await
        .unwrap()
        .unwrap();
    let got = s.subscriber("full".into(), None).await.unwrap();
    assert_eq!(got, y);
}

/// Removing a subscriber makes its unfinished work dead (a replay of it is then refused),
/// and the dispatcher no longer sees it; created again, the id starts anew with one secret.
async fn removing_a_subscriber_ends_its_work_and_its_id_comes_back_new(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    add(&s, sub("kept", &["*"])).await;
    s.ingest(evs("e", 3), now).await.unwrap();
    let c = claim(&s, "a", 1, now + 1).await;
    let dispatch = s.dispatch_subscribers().await.unwrap();
    assert_eq!(dispatch.len(), 2);
    assert_eq!(s.delete_subscriber("a".into(), now + 2).await.unwrap(), 3);
    assert!(matches!(
        s.subscriber("a".into(), None).await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(s.dispatch_subscriber("a").await.unwrap().is_none());
    let ids: Vec<String> = s
        .dispatch_subscribers()
        .await
        .unwrap()
        .into_iter()
        .map(|(x, _)| x.id)
        .collect();
    assert_eq!(ids, ["kept"]);
    assert!(matches!(
        s.replay_one(rowids(&c)[0], now + 3, None).await,
        Err(LedgerError::Conflict(_))
    ));
    let d = s.get_delivery(rowids(&c)[0], None).await.unwrap();
    assert_eq!(
        (d.status, d.last_error.as_deref()),
        (Status::Dead, Some("subscriber removed"))
    );
    assert_eq!(
        s.due_work(5).await.unwrap(),
        [("kept".to_string(), now)],
        "only the live subscriber has work"
    );
    // The result of a send to a removed subscriber, coming back late, changes nothing.
    finish(&s, vec![sent(rowids(&c)[0], now + 4)], now + 4).await;
    assert_eq!(
        s.get_delivery(rowids(&c)[0], None).await.unwrap().status,
        Status::Dead
    );
    s.create_subscriber(sub("a", &["*"]), "whsec_again".into())
        .await
        .unwrap();
    let (listed, _) = s.subscribers(Some("a".into()), false, None).await.unwrap();
    assert_eq!(listed[0].active_secrets(now + 5), ["whsec_again"]);
}

/// Each event makes one delivery per matching subscriber, once: a repeat is a duplicate (one
/// with another body says so, and the stored body stays), and the answer names who got work.
async fn ingest_fans_out_once_per_subscriber_and_event(s: Store, now: i64) {
    add(&s, sub("a", &["video.*"])).await;
    add(&s, sub("b", &["video.trending"])).await;
    add(&s, sub("c", &["audio.*"])).await;
    let (out, touched) = s
        .ingest(
            vec![
                ev("e1", "video.trending"),
                ev("e2", "video.new"),
                ev("e1", "video.trending"),
            ],
            now,
        )
        .await
        .unwrap();
    let got: Vec<(u32, bool)> = out.iter().map(|o| (o.deliveries, o.duplicate)).collect();
    assert_eq!(got, [(2, false), (1, false), (0, true)]);
    assert_eq!(touched, ["a", "b"]);
    let (again, touched) = s
        .ingest(vec![ev("e2", "video.new")], now + 1)
        .await
        .unwrap();
    let got: Vec<(u32, bool, bool)> = again
        .iter()
        .map(|o| (o.deliveries, o.duplicate, o.different_body))
        .collect();
    assert_eq!(got, [(0, true, false)]);
    assert!(touched.is_empty());
    let mut other = ev("e2", "video.new");
    other.body = r#"{"id":"e2","other":true}"#.into();
    let (reused, touched) = s.ingest(vec![other.clone(), other], now + 2).await.unwrap();
    let got: Vec<(u32, bool, bool)> = reused
        .iter()
        .map(|o| (o.deliveries, o.duplicate, o.different_body))
        .collect();
    assert_eq!(got, [(0, true, true), (0, true, true)]);
    assert!(touched.is_empty());
    let listed = s.list_deliveries(all(100)).await.unwrap();
    let mut pairs: Vec<(String, String)> = listed
        .iter()
        .map(|d| (d.subscriber_id.clone(), d.event_id.clone()))
        .collect();
    pairs.sort();
    let want = [("a", "e1"), ("a", "e2"), ("b", "e1")];
    assert_eq!(pairs, want.map(|(x, y)| (x.to_string(), y.to_string())));
    // The first body is the one sent; each subscriber numbers its own deliveries.
    let c = claim(&s, "a", 10, now + 3).await;
    let bodies: Vec<(&str, &str, u64)> = c
        .claimed
        .iter()
        .map(|d| (d.event_id.as_str(), d.body.as_str(), d.sequence))
        .collect();
    assert_eq!(
        bodies,
        [("e1", r#"{"id":"e1"}"#, 1), ("e2", r#"{"id":"e2"}"#, 2)]
    );
}

/// Lists by status, subscriber, event, type, customer and time, newest last, paged by
/// `after`; one delivery's detail; an unknown one is not found.
async fn deliveries_are_listed_by_every_filter_and_page(s: Store, now: i64) {
    s.create_customer(Customer {
        id: "acme".into(),
        weight: 1,
        max_in_flight: None,
        portal_nonce: "n".into(),
        created_ms: now,
        updated_ms: now,
    })
    .await
    .unwrap();
    add(&s, sub("a", &["*"])).await;
    let mut owned = sub("owned", &["x"]);
    owned.customer = Some("acme".into());
    add(&s, owned).await;
    s.ingest(vec![ev("e1", "t"), ev("e2", "x")], now)
        .await
        .unwrap();
    s.ingest(vec![ev("e3", "t")], now + 100).await.unwrap();
    let c = claim(&s, "a", 1, now + 200).await;
    finish(&s, vec![dead(rowids(&c)[0], now + 201)], now + 201).await;
    let list = |f: DeliveryFilter| {
        let s = s.clone();
        async move { event_ids(&s.list_deliveries(f).await.unwrap()) }
    };
    let whole = s.list_deliveries(all(10)).await.unwrap();
    assert_eq!(event_ids(&whole), ["e1", "e2", "e2", "e3"]);
    let ids: Vec<i64> = whole.iter().map(rowid_of).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "in id order: {ids:?}");
    let f = DeliveryFilter::default;
    let rows: Vec<(DeliveryFilter, Vec<&str>)> = vec![
        (
            DeliveryFilter {
                status: Some(Status::Dead),
                ..f()
            },
            vec!["e1"],
        ),
        (
            DeliveryFilter {
                status: Some(Status::Pending),
                subscriber: Some("a".into()),
                ..f()
            },
            vec!["e2", "e3"],
        ),
        (
            DeliveryFilter {
                event: Some("e2".into()),
                ..f()
            },
            vec!["e2", "e2"],
        ),
        (
            DeliveryFilter {
                event_type: Some("x".into()),
                subscriber: Some("owned".into()),
                ..f()
            },
            vec!["e2"],
        ),
        (
            DeliveryFilter {
                customer: Some("acme".into()),
                ..f()
            },
            vec!["e2"],
        ),
        (
            DeliveryFilter {
                since_ms: Some(now + 50),
                ..f()
            },
            vec!["e3"],
        ),
        (
            DeliveryFilter {
                until_ms: Some(now + 50),
                ..f()
            },
            vec!["e1", "e2", "e2"],
        ),
        (
            DeliveryFilter {
                after: Some(ids[1]),
                ..f()
            },
            vec!["e2", "e3"],
        ),
        (
            DeliveryFilter {
                after: Some(ids[0]),
                limit: 1,
                ..f()
            },
            vec!["e2"],
        ),
    ];
    for (filter, want) in rows {
        let limit = if filter.limit == 0 { 10 } else { filter.limit };
        let got = list(DeliveryFilter {
            limit,
            ..filter.clone()
        })
        .await;
        assert_eq!(got, want, "{filter:?}");
    }
    let d = s.get_delivery(ids[0], None).await.unwrap();
    assert_eq!(
        (
            d.status,
            d.attempt_count,
            d.last_error.as_deref(),
            d.sequence
        ),
        (Status::Dead, 1, Some("410"), 1)
    );
    assert_eq!(d.attempts.map(|a| a.len()), Some(1));
    assert!(matches!(
        s.get_delivery(999_999, None).await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(matches!(
        s.get_delivery(ids[0], Some("acme".into())).await,
        Err(LedgerError::NotFound(_))
    ));
}

/// A turn's claims lease the oldest due first; its results of every kind are recorded with
/// their attempts (a deferral has none); a turn recorded again counts each result once.
async fn a_turn_records_every_transition_and_its_attempt_once(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    s.ingest(evs("e", 4), now).await.unwrap();
    let c = claim(&s, "a", 4, now + 1).await;
    let ids = rowids(&c);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first");
    assert!(c
        .claimed
        .iter()
        .all(|d| d.attempt == 1 && d.body.contains(&d.event_id) && d.received_ms == now));
    assert_eq!(statuses(&s, now + 1).await, counts(&[("in_flight", 4)]));
    let retry = Outcome {
        rowid: ids[1],
        transition: Transition::Retry {
            at_ms: now + 99,
            error: "status 500".into(),
        },
        attempt: attempt(now + 2, "failed", 500),
    };
    let defer = Outcome {
        rowid: ids[2],
        transition: Transition::Defer { at_ms: now + 77 },
        attempt: None,
    };
    let outcomes = vec![sent(ids[0], now + 2), retry, defer, dead(ids[3], now + 1)];
    finish(&s, outcomes.clone(), now + 3).await;
    // Again, as after an answer that was lost: nothing more.
    finish(&s, outcomes, now + 4).await;
    let mut got = Vec::new();
    for id in &ids {
        let d = s.get_delivery(*id, None).await.unwrap();
        got.push((
            d.status,
            d.attempt_count,
            d.next_attempt_at_ms,
            d.last_error.clone(),
            d.attempts.as_ref().map_or(0, |a| a.len()),
        ));
    }
    assert_eq!(
        got,
        [
            (Status::Sent, 1, None, None, 1),
            (
                Status::Pending,
                1,
                Some(now + 99),
                Some("status 500".into()),
                1
            ),
            (Status::Pending, 0, Some(now + 77), None, 0),
            (Status::Dead, 1, None, Some("410".into()), 1),
        ]
    );
    let d = s.get_delivery(ids[1], None).await.unwrap();
    let a = &d.attempts.unwrap()[0];
    assert_eq!((a.attempt, a.at_ms, a.status), (1, now + 2, Some(500)));
    assert_eq!(
        statuses(&s, now + 5).await,
        counts(&[("dead", 1), ("pending", 2), ("sent", 1)])
    );
    // The last failed attempt is the subscriber's last error.
    let (_, figures) = s.subscribers(Some("a".into()), true, None).await.unwrap();
    let a = &figures.unwrap()["a"];
    assert_eq!((a.pending, a.sent, a.dead), (2, 1, 1));
    assert_eq!(a.last_error, Some((now + 2, "HTTP 500".to_string())));
    // Each when it is due: the deferred one first (its first attempt), then the retried one
    // (its second).
    let c = claim(&s, "a", 4, now + 80).await;
    assert_eq!((rowids(&c), c.next_due_ms), (vec![ids[2]], Some(now + 99)));
    assert_eq!(c.claimed[0].attempt, 1);
    let c = claim(&s, "a", 4, now + 100).await;
    let next: Vec<(i64, u32)> = c.claimed.iter().map(|d| (d.rowid, d.attempt)).collect();
    assert_eq!((next, c.next_due_ms), (vec![(ids[1], 2)], None));
}

/// Leases end by expiry (due again at once), as strays (every lease but those the caller
/// holds) and all at start-up; `due_work` then says when each subscriber has work.
async fn leases_expire_and_strays_are_released_but_those_held(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    s.ingest(evs("e", 5), now).await.unwrap();
    let c = claim(&s, "a", 3, now).await;
    let ids = rowids(&c);
    assert_eq!(ids.len(), 3);
    assert_eq!(c.next_due_ms, Some(now), "two more are due");
    assert!(s
        .release_expired_leases(now + LEASE - 1)
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .release_strays(ids.clone(), now + 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        s.release_strays(ids[..1].to_vec(), now + 10).await.unwrap(),
        ["a"]
    );
    let view = |id: i64| {
        let s = s.clone();
        async move {
            let d = s.get_delivery(id, None).await.unwrap();
            (d.status, d.next_attempt_at_ms)
        }
    };
    assert_eq!(view(ids[0]).await.0, Status::InFlight);
    assert_eq!(view(ids[1]).await, (Status::Pending, Some(now + 10)));
    assert_eq!(view(ids[2]).await, (Status::Pending, Some(now + 10)));
    assert_eq!(
        s.release_expired_leases(now + LEASE + 1).await.unwrap(),
        ["a"]
    );
    assert_eq!(view(ids[0]).await, (Status::Pending, Some(now + LEASE + 1)));
    assert_eq!(s.due_work(5).await.unwrap(), [("a".to_string(), now)]);
    let t = now + 2 * LEASE;
    assert_eq!(claim(&s, "a", 2, t).await.claimed.len(), 2);
    assert_eq!(s.release_all_leases(t + 1).await.unwrap(), 2);
    assert_eq!(s.release_all_leases(t + 1).await.unwrap(), 0);
    let c = claim(&s, "a", 10, t + 2).await;
    assert_eq!(c.claimed.len(), 5);
    // All in flight: nothing is due on an embedded ledger; a shared one says when the
    // leases lapse (another daemon's may, and then it takes them over).
    let due = s.due_work(5).await.unwrap();
    let want = s.is_shared().then(|| ("a".to_string(), t + 2 + LEASE));
    assert_eq!(due, Vec::from_iter(want));
}

/// A delivery in flight cannot be replayed; dead ones are, one by one or in steps after a
/// cursor (counted first, changing nothing); a replay is due at its time; a bulk replay
/// naming an unknown subscriber is not found; a scope replays only what it sees.
async fn replays_of_one_and_in_steps_and_their_count(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    s.ingest(evs("e", 5), now).await.unwrap();
    let c = claim(&s, "a", 4, now + 1).await;
    let ids = rowids(&c);
    assert!(matches!(
        s.replay_one(ids[0], now + 2, None).await,
        Err(LedgerError::Conflict(_))
    ));
    let ended: Vec<Outcome> = ids.iter().map(|&id| dead(id, now + 3)).collect();
    finish(&s, ended, now + 3).await;
    let dead_a = DeliveryFilter {
        status: Some(Status::Dead),
        subscriber: Some("a".into()),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(s.count_replayable(dead_a.clone()).await.unwrap(), 4);
    assert_eq!(s.count_replayable(dead_a.clone()).await.unwrap(), 4);
    assert_eq!(s.replay_one(ids[0], now + 4, None).await.unwrap(), "a");
    assert!(matches!(
        s.replay_one(ids[1], now + 4, Some("acme".into())).await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(matches!(
        s.replay_one(999_999, now + 4, None).await,
        Err(LedgerError::NotFound(_))
    ));
    assert_eq!(s.count_replayable(dead_a.clone()).await.unwrap(), 3);
    let first = s
        .replay_step(
            DeliveryFilter {
                limit: 2,
                ..dead_a.clone()
            },
            now + 5,
        )
        .await
        .unwrap();
    assert_eq!(
        (first.replayed, first.subscribers.clone(), first.done),
        (2, vec!["a".to_string()], false)
    );
    let rest = s
        .replay_step(
            DeliveryFilter {
                limit: 2,
                after: first.last,
                ..dead_a.clone()
            },
            now + 6,
        )
        .await
        .unwrap();
    assert_eq!((rest.replayed, rest.done), (1, true));
    assert_eq!(s.count_replayable(dead_a.clone()).await.unwrap(), 0);
    let d = s.get_delivery(ids[3], None).await.unwrap();
    assert_eq!(
        (d.status, d.next_attempt_at_ms),
        (Status::Pending, Some(now + 6))
    );
    assert_eq!(
        (d.attempt_count, d.attempts.map(|a| a.len())),
        (0, Some(1)),
        "a replay starts its count over and keeps the attempts made"
    );
    let nobody = DeliveryFilter {
        subscriber: Some("nobody".into()),
        limit: 10,
        ..Default::default()
    };
    assert!(matches!(
        s.replay_step(nobody, now + 7).await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(s.list_deliveries(dead_a).await.unwrap().is_empty());
}

/// The dead-count alert fires once when a subscriber's dead deliveries reach the threshold
/// (after the turn's own notices), not again while it stays there, and again after a
/// replay took it under the threshold and `due_work` re-armed it.
async fn dead_counts_alert_once_per_crossing_and_rearm_after_a_replay(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    s.ingest(evs("e", 4), now).await.unwrap();
    let ids = rowids(&claim(&s, "a", 4, now).await);
    let dead_turn = |rows: &[i64], at: i64| Turn {
        now_ms: at,
        outcomes: rows.iter().map(|&id| dead(id, at)).collect(),
        dead: vec!["a".into(), "gone".into()],
        dead_threshold: 2,
        ..Turn::default()
    };
    let one = record(&s, dead_turn(&ids[..1], now + 1)).await;
    assert!(one.notices.is_empty(), "one dead is under 2");
    let own = fanout_origin::alert::Notice {
        subscriber: "a".into(),
        at_ms: now,
        alert: Alert::Disabled {
            reason: "x".into(),
            failing_since_ms: None,
        },
    };
    let two = record(
        &s,
        Turn {
            notices: vec![own.clone()],
            ..dead_turn(&ids[1..2], now + 2)
        },
    )
    .await;
    assert_eq!(two.notices.len(), 2, "{:?}", two.notices);
    assert_eq!(two.notices[0], own);
    assert_eq!(
        (two.notices[1].subscriber.as_str(), two.notices[1].at_ms),
        ("a", now + 2)
    );
    assert!(matches!(
        two.notices[1].alert,
        Alert::DeadThreshold { threshold: 2, .. }
    ));
    let three = record(&s, dead_turn(&ids[2..3], now + 3)).await;
    assert!(three.notices.is_empty(), "once per crossing");
    s.replay_one(ids[0], now + 4, None).await.unwrap();
    s.replay_one(ids[1], now + 4, None).await.unwrap();
    // Still alerted until a rescan re-arms it: another dead one says nothing…
    let four = record(&s, dead_turn(&ids[3..4], now + 5)).await;
    assert!(four.notices.is_empty());
    s.replay_one(ids[3], now + 6, None).await.unwrap();
    s.due_work(2).await.unwrap();
    // …and once re-armed, the next crossing alerts again.
    let ids = rowids(&claim(&s, "a", 4, now + 7).await);
    let five = record(&s, dead_turn(&ids[..2], now + 8)).await;
    assert_eq!(five.notices.len(), 1, "{:?}", five.notices);
}

/// Health a turn writes: a failure run and a disable, which stops claims; an update that
/// re-enables clears both. The dispatcher reads the subscriber with it.
async fn health_writes_stop_claims_and_a_reenable_resets_them(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    s.ingest(evs("e", 3), now).await.unwrap();
    let disabled = Disabled {
        at_ms: now + 2,
        reason: "410".into(),
        by_operator: false,
    };
    let r = record(
        &s,
        Turn {
            now_ms: now + 2,
            health: vec![
                HealthWrite::FailingSince {
                    subscriber: "a".into(),
                    since_ms: Some(now + 1),
                },
                HealthWrite::Disable {
                    subscriber: "a".into(),
                    disabled: disabled.clone(),
                },
            ],
            claims: vec![("a".into(), 5)],
            lease_until_ms: now + 2 + LEASE,
            ..Turn::default()
        },
    )
    .await;
    // A shared ledger refuses claims for a disabled subscriber itself (another daemon may
    // have disabled it); on an embedded one its one dispatcher no longer asks.
    let leased: usize = r.claims.iter().map(|c| c.claimed.len()).sum();
    assert_eq!(leased, if s.is_shared() { 0 } else { 3 }, "{r:?}");
    if !s.is_shared() {
        s.release_strays(vec![], now + 2).await.unwrap();
    }
    let got = s.subscriber("a".into(), None).await.unwrap();
    assert_eq!(got.health.failing_since_ms, Some(now + 1));
    assert_eq!(got.health.disabled, Some(disabled));
    let (seen, _) = s.dispatch_subscriber("a").await.unwrap().unwrap();
    assert!(seen.health.disabled.is_some());
    if s.is_shared() {
        assert_eq!(
            claim_any(&s, "a", now + 3).await,
            0,
            "disabled: nothing is claimed"
        );
    }
    s.update_subscriber("a".into(), None, |mut x| {
        x.health.disabled = None;
        Ok::<_, String>((x, true))
    })
    .await
    .unwrap()
    .unwrap();
    let got = s.subscriber("a".into(), None).await.unwrap();
    assert_eq!(got.health, Default::default());
    assert_eq!(claim_any(&s, "a", now + 4).await, 3);
}

/// How many deliveries a turn at `now` leases for `id` (a disabled subscriber may have no
/// claim in the answer at all).
async fn claim_any(s: &Store, id: &str, now: i64) -> usize {
    let r = record(
        s,
        Turn {
            now_ms: now,
            claims: vec![(id.into(), 10)],
            lease_until_ms: now + LEASE,
            ..Turn::default()
        },
    )
    .await;
    r.claims.iter().map(|c| c.claimed.len()).sum()
}

/// Customers: created once, read, listed with their live subscribers, changed in one
/// transaction, never removed while a live subscriber names them; a scope sees its own
/// subscribers only; portal links are revoked by a new nonce; the portal key is made once.
async fn customers_weights_subscribers_and_portal_links(s: Store, now: i64) {
    let acme = Customer {
        id: "acme".into(),
        weight: 3,
        max_in_flight: Some(7),
        portal_nonce: "n1".into(),
        created_ms: now,
        updated_ms: now,
    };
    s.create_customer(acme.clone()).await.unwrap();
    assert!(matches!(
        s.create_customer(acme.clone()).await,
        Err(LedgerError::Conflict(_))
    ));
    assert_eq!(s.customer("acme".into()).await.unwrap(), acme);
    assert!(matches!(
        s.customer("nobody".into()).await,
        Err(LedgerError::NotFound(_))
    ));
    let mut owned = sub("s1", &["*"]);
    owned.customer = Some("acme".into());
    add(&s, owned).await;
    add(&s, sub("s2", &["*"])).await;
    let mut stranger = sub("s3", &["*"]);
    stranger.customer = Some("nobody".into());
    assert!(matches!(
        s.create_subscriber(stranger, "x".into()).await,
        Err(LedgerError::Invalid(_))
    ));
    let listed = s.customers(None).await.unwrap();
    assert_eq!(listed, [(acme.clone(), 1)]);
    assert!(matches!(
        s.customers(Some("nobody".into())).await,
        Err(LedgerError::NotFound(_))
    ));
    let changed = s
        .update_customer("acme".into(), move |mut c| {
            c.weight = 5;
            c.updated_ms = now + 1;
            Ok::<_, String>(c)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(changed.weight, 5);
    let refused = s
        .update_customer("acme".into(), |mut c| {
            c.weight = 9;
            Err::<Customer, _>(c.id)
        })
        .await
        .unwrap();
    assert_eq!(refused.unwrap_err(), "acme");
    assert_eq!(
        s.dispatch_customers().await.unwrap(),
        [("acme".to_string(), 5, Some(7))]
    );
    // A portal's scope: its own subscriber, nobody else's.
    let scope = || Some("acme".to_string());
    let (mine, _) = s.subscribers(None, false, scope()).await.unwrap();
    assert_eq!(
        mine.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(),
        ["s1"]
    );
    assert!(s.subscriber("s1".into(), scope()).await.is_ok());
    assert!(matches!(
        s.subscriber("s2".into(), scope()).await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(matches!(
        s.rotate_secret("s2".into(), "y".into(), now, 0, scope())
            .await,
        Err(LedgerError::NotFound(_))
    ));
    let taken = s
        .update_subscriber("s2".into(), scope(), |x| Ok::<_, String>((x, false)))
        .await;
    assert!(matches!(taken, Err(LedgerError::NotFound(_))), "{taken:?}");
    // Given to the customer by the operator: now it counts and the scope sees it.
    s.update_subscriber("s2".into(), None, |mut x| {
        x.customer = Some("acme".into());
        Ok::<_, String>((x, false))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(s.customers(Some("acme".into())).await.unwrap()[0].1, 2);
    assert!(matches!(
        s.delete_customer("acme".into()).await,
        Err(LedgerError::Conflict(_))
    ));
    s.revoke_portal_links("acme".into(), "n2".into(), now + 2)
        .await
        .unwrap();
    assert_eq!(s.customer("acme".into()).await.unwrap().portal_nonce, "n2");
    assert!(matches!(
        s.revoke_portal_links("nobody".into(), "n".into(), now)
            .await,
        Err(LedgerError::NotFound(_))
    ));
    assert_eq!(s.portal_key(vec![1; 32], now).await.unwrap(), vec![1; 32]);
    assert_eq!(s.portal_key(vec![2; 32], now).await.unwrap(), vec![1; 32]);
    // A removed endpoint keeps its owner while its deliveries are kept: another customer
    // cannot take its id over.
    s.ingest(evs("e", 1), now + 3).await.unwrap();
    for id in ["s1", "s2"] {
        s.delete_subscriber(id.into(), now + 3).await.unwrap();
    }
    s.create_customer(Customer {
        id: "globex".into(),
        ..acme.clone()
    })
    .await
    .unwrap();
    let mut taken = sub("s1", &["*"]);
    taken.customer = Some("globex".into());
    let taken = s.create_subscriber(taken, "x".into()).await;
    assert!(matches!(taken, Err(LedgerError::Conflict(_))), "{taken:?}");
    s.delete_customer("acme".into()).await.unwrap();
    assert!(matches!(
        s.customer("acme".into()).await,
        Err(LedgerError::NotFound(_))
    ));
    assert_eq!(
        s.dispatch_customers().await.unwrap(),
        [("globex".to_string(), 3, Some(7))]
    );
}

/// A test event makes one delivery, to the subscriber named alone (whatever its types), if
/// the scope sees it.
async fn a_test_event_goes_to_its_one_subscriber(s: Store, now: i64) {
    add(&s, sub("a", &["other"])).await;
    add(&s, sub("b", &["*"])).await;
    let rowid = s
        .ingest_test("a".into(), ev("test_1", "fanout.test"), now, None)
        .await
        .unwrap();
    let d = s.get_delivery(rowid, None).await.unwrap();
    assert_eq!(
        (d.subscriber_id.as_str(), d.event_id.as_str(), d.status),
        ("a", "test_1", Status::Pending)
    );
    assert_eq!(s.list_deliveries(all(10)).await.unwrap().len(), 1);
    assert!(matches!(
        s.ingest_test("nobody".into(), ev("test_2", "fanout.test"), now, None)
            .await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(matches!(
        s.ingest_test(
            "a".into(),
            ev("test_3", "fanout.test"),
            now,
            Some("acme".into())
        )
        .await,
        Err(LedgerError::NotFound(_))
    ));
    assert_eq!(claim(&s, "a", 5, now + 1).await.claimed.len(), 1);
}

/// The `traceparent` an event arrived with comes back with each claim of its deliveries;
/// none stays none.
async fn an_events_traceparent_comes_back_with_its_claims(s: Store, now: i64) {
    add(&s, sub("a", &["*"])).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = NewEvent {
        traceparent: Some(tp.into()),
        ..ev("e1", "t")
    };
    s.ingest(vec![traced, ev("e2", "t")], now).await.unwrap();
    let c = claim(&s, "a", 10, now + 1).await;
    let got: Vec<(&str, Option<&str>)> = c
        .claimed
        .iter()
        .map(|d| (d.event_id.as_str(), d.traceparent.as_deref()))
        .collect();
    assert_eq!(got, [("e1", Some(tp)), ("e2", None)]);
}

/// An ordered subscriber's keys hold all but their head back (listed by `held_keys`); a
/// batching turn leases runs of one key (a head and up to `per - 1` held after it, in
/// order); released, each key comes back with one head and the same runs go again.
async fn ordered_keys_hold_back_and_runs_are_leased_together(s: Store, now: i64) {
    add(&s, ordered("o", 4)).await;
    let events: Vec<NewEvent> = (1..=4)
        .flat_map(|i| ["a", "b"].map(|k| keyed(&format!("{k}{i}"), k)))
        .collect();
    s.ingest(events, now).await.unwrap();
    let held = s.held_keys("o".into(), 10, None).await.unwrap();
    let got: Vec<(Option<&str>, Option<&str>, u64, &str)> = held
        .iter()
        .map(|h| {
            (
                h.ordering_key.as_deref(),
                h.head.as_ref().map(|d| d.event_id.as_str()),
                h.held,
                h.next.as_str(),
            )
        })
        .collect();
    let (a2, b2) = (held_view(&s, "a2").await, held_view(&s, "b2").await);
    assert!(a2.held && a2.next_attempt_at_ms.is_none(), "{a2:?}");
    assert_eq!(
        got,
        [
            (Some("a"), Some("a1"), 3, a2.id.as_str()),
            (Some("b"), Some("b1"), 3, b2.id.as_str())
        ]
    );
    assert_eq!(s.held_keys("o".into(), 1, None).await.unwrap().len(), 1);
    assert!(matches!(
        s.held_keys("o".into(), 10, Some("acme".into())).await,
        Err(LedgerError::NotFound(_))
    ));
    let a3 = held_view(&s, "a3").await;
    assert_eq!(
        (a3.ordering_key.as_deref(), a3.previous_sequence),
        (Some("a"), Some(a2.sequence))
    );
    let turn = |at: i64| Turn {
        now_ms: at,
        claims: vec![("o".into(), 12)],
        batch_per: vec![("o".into(), 3)],
        runs: vec!["o".into()],
        lease_until_ms: at + LEASE,
        ..Turn::default()
    };
    let first = record(&s, turn(now + 1)).await.claims.remove(0);
    let ids: Vec<&str> = first.claimed.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3", "b1", "b2", "b3"]);
    assert_eq!(first.runs, [3, 3]);
    let other = record(&s, turn(now + 2)).await;
    assert!(
        other.claims.iter().all(|c| c.claimed.is_empty()),
        "each key's fourth is held behind its run: {:?}",
        other.claims
    );
    // Released (a restart), the runs come back with one head per key, the rest held, and the
    // next turn takes them again, whole and in order.
    let later = now + 10;
    assert_eq!(s.release_all_leases(later).await.unwrap(), 6);
    let heads: Vec<String> = s
        .list_deliveries(DeliveryFilter {
            subscriber: Some("o".into()),
            ..all(20)
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|d| !d.held)
        .map(|d| d.event_id)
        .collect();
    assert_eq!(heads, ["a1", "b1"], "one head per key, the rest held");
    let taken = record(&s, turn(later)).await.claims.remove(0);
    let ids: Vec<&str> = taken.claimed.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3", "b1", "b2", "b3"]);
    assert_eq!(taken.runs, [3, 3]);
}

/// The delivery of event `e` (there is one).
async fn held_view(s: &Store, e: &str) -> DeliveryView {
    let mut got = s
        .list_deliveries(DeliveryFilter {
            event: Some(e.into()),
            ..all(10)
        })
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    got.remove(0)
}

/// Retention removes exactly the sent deliveries past their window and the dead ones past
/// theirs, in steps, with their attempts and events, and sweeps events no delivery refers to
/// (one that matched nobody); it never touches pending or in-flight work, nor finished work
/// within its window. The report says what was removed, what is kept and when a pass ran.
async fn retention_removes_finished_deliveries_past_their_window(s: Store, now: i64) {
    add(&s, sub("a", &["t"])).await;
    let empty = s.retention_report().await.unwrap();
    assert_eq!(empty, Default::default());
    s.ingest(evs("old", 8), now).await.unwrap();
    s.ingest(vec![ev("lonely", "nobody.cares")], now)
        .await
        .unwrap();
    s.ingest(evs("new", 2), now + 5_000).await.unwrap();
    let ids = rowids(&claim(&s, "a", 7, now + 10).await);
    // old00..02 sent at +20 (past the window), old03 sent at +9_500 (within it), old04 dead
    // at +20 (past), old05 dead at +8_000 (within), old06 stays in flight, the rest pending.
    let at = |t: i64| now + t;
    let early = vec![
        sent(ids[0], at(20)),
        sent(ids[1], at(20)),
        sent(ids[2], at(20)),
        dead(ids[4], at(20)),
    ];
    finish(&s, early, at(20)).await;
    finish(&s, vec![dead(ids[5], at(8_000))], at(8_000)).await;
    finish(&s, vec![sent(ids[3], at(9_500))], at(9_500)).await;
    let pass_at = at(10_000);
    let (sent_cut, dead_cut) = (pass_at - 1_000, pass_at - 5_000);
    let mut removed = (0, 0, 0);
    let mut steps = 0;
    for (kind, cut) in [(Finished::Sent, sent_cut), (Finished::Dead, dead_cut)] {
        loop {
            let (r, _) = s.purge_finished(kind, cut, 2).await.unwrap().unwrap();
            steps += 1;
            removed = (
                removed.0 + r.deliveries,
                removed.1 + r.attempts,
                removed.2 + r.events,
            );
            if r.deliveries < 2 {
                break;
            }
        }
    }
    assert!(steps >= 3, "in steps of 2: {steps}");
    assert_eq!(
        (removed.0, removed.1),
        (4, 4),
        "3 sent and 1 dead, their attempts"
    );
    let mut swept = 0;
    loop {
        let (n, caught_up, _) = s.sweep_events(sent_cut, 2).await.unwrap().unwrap();
        swept += n;
        if caught_up {
            break;
        }
    }
    assert_eq!(removed.2 + swept, 5, "their 4 events and `lonely`");
    let mut left: Vec<(String, Status)> = s
        .list_deliveries(all(100))
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.event_id, d.status))
        .collect();
    left.sort_by(|x, y| x.0.cmp(&y.0));
    let want = [
        ("new00", Status::Pending),
        ("new01", Status::Pending),
        ("old03", Status::Sent),
        ("old05", Status::Dead),
        ("old06", Status::InFlight),
        ("old07", Status::Pending),
    ];
    assert_eq!(left, want.map(|(e, st)| (e.to_string(), st)));
    let kept = s.get_delivery(ids[3], None).await.unwrap();
    assert_eq!(
        kept.attempts.map(|a| a.len()),
        Some(1),
        "kept with its attempt"
    );
    // The events of kept deliveries stay: a repeat of one is still a duplicate, of a
    // removed one is new again.
    let (again, _) = s
        .ingest(vec![ev("old03", "t"), ev("old00", "t")], at(10_001))
        .await
        .unwrap();
    let dup: Vec<bool> = again.iter().map(|i| i.duplicate).collect();
    assert_eq!(dup, [true, false]);
    let r = s.retention_report().await.unwrap();
    assert_eq!(
        (
            r.removed_sent,
            r.removed_dead,
            r.removed_attempts,
            r.removed_events
        ),
        (3, 1, 4, 5)
    );
    assert_eq!(
        (r.oldest_sent_at_ms, r.oldest_dead_at_ms, r.last_run_at_ms),
        (Some(at(9_500)), Some(at(8_000)), None)
    );
    s.mark_retention_run(pass_at).await.unwrap();
    assert_eq!(
        s.retention_report().await.unwrap().last_run_at_ms,
        Some(pass_at)
    );
}

/// Retention forgets an ordered key whose last delivery it removes, with nothing
/// outstanding (its next delivery starts over, no previous sequence), and keeps a key whose
/// last delivery is kept (its chain goes on).
async fn retention_forgets_a_key_idle_past_it(s: Store, now: i64) {
    add(&s, ordered("o", 10)).await;
    s.ingest(
        vec![keyed("a1", "a"), keyed("a2", "a"), keyed("b1", "b")],
        now,
    )
    .await
    .unwrap();
    // Each key's head goes at +100; a2, released by a1, at +5_000.
    // An ended head that releases a held delivery makes its subscriber due at once.
    for (at, n, due) in [(now + 100, 2, vec!["o"]), (now + 5_000, 1, vec![])] {
        let c = claim(&s, "o", 10, at).await;
        assert_eq!(c.claimed.len(), n);
        let done = c.claimed.iter().map(|d| sent(d.rowid, at)).collect();
        assert_eq!(finish(&s, done, at).await.due, due);
    }
    let (r, _) = s
        .purge_finished(Finished::Sent, now + 1_000, 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.deliveries, 2, "a1 and b1");
    s.ingest(vec![keyed("a3", "a"), keyed("b2", "b")], now + 6_000)
        .await
        .unwrap();
    let a2 = held_view(&s, "a2").await;
    let a3 = held_view(&s, "a3").await;
    let b2 = held_view(&s, "b2").await;
    assert_eq!(a3.previous_sequence, Some(a2.sequence), "a's chain goes on");
    assert_eq!(b2.previous_sequence, None, "b starts over");
}

/// Chart rows add up per (resolution, bucket, subscriber), gauges keeping the highest; a
/// read takes a window of buckets, of one subscriber or a scope's totals; retention trims
/// rows of one resolution past a cut-off only.
async fn series_rows_add_up_are_scoped_and_trimmed(s: Store, now: i64) {
    let res = 10_000;
    let row = |bucket: i64, id: &str, delivered: u64, backlog: i64| SeriesRow {
        resolution_ms: res,
        bucket_ms: bucket,
        subscriber_id: id.into(),
        counts: Counts {
            delivered,
            ..Counts::default()
        },
        // The latency histogram: `delivered` sends in its fourth bucket.
        latency: (0..HIST_LEN as u64)
            .map(|i| if i == 3 { delivered } else { 0 })
            .collect(),
        gauges: Gauges {
            backlog,
            ..Gauges::default()
        },
    };
    let b0 = now - now % res;
    let rows = vec![
        row(b0, "a", 2, 5),
        row(b0, "*", 2, 5),
        row(b0, "*acme", 1, 1),
        row(b0 + res, "a", 1, 1),
    ];
    s.add_series(rows).await.unwrap();
    s.add_series(vec![row(b0, "a", 3, 4)]).await.unwrap();
    let read = |sub: Option<&str>, scope: Option<&str>| {
        let (s, sub, scope) = (s.clone(), sub.map(String::from), scope.map(String::from));
        async move {
            s.read_series(res, b0, b0 + 2 * res, sub, scope)
                .await
                .unwrap()
                .into_iter()
                .map(|r| {
                    (
                        r.bucket_ms,
                        r.subscriber_id,
                        r.counts.delivered,
                        r.gauges.backlog,
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        read(Some("a"), None).await,
        [(b0, "a".into(), 5, 5), (b0 + res, "a".into(), 1, 1)]
    );
    let first = s.read_series(res, b0, b0 + res, Some("a".into()), None);
    assert_eq!(first.await.unwrap()[0].latency[3], 5, "histograms add");
    assert_eq!(read(None, None).await, [(b0, "*".into(), 2, 5)]);
    assert_eq!(read(None, Some("acme")).await, [(b0, "*acme".into(), 1, 1)]);
    assert!(
        read(Some("a"), Some("acme")).await.is_empty(),
        "a scope reads its own subscribers' rows only"
    );
    let other_res = s
        .read_series(res * 2, b0, b0 + 2 * res, Some("a".into()), None)
        .await
        .unwrap();
    assert!(other_res.is_empty());
    assert_eq!(s.purge_series(res * 2, b0 + res, 10).await.unwrap(), 0);
    assert_eq!(
        s.purge_series(res, b0 + res, 1).await.unwrap(),
        1,
        "bounded"
    );
    assert_eq!(s.purge_series(res, b0 + res, 10).await.unwrap(), 2);
    assert_eq!(s.purge_series(res, b0 + res, 10).await.unwrap(), 0);
    assert_eq!(read(Some("a"), None).await, [(b0 + res, "a".into(), 1, 1)]);
}

/// `/metrics`' figures: deliveries per status and each live subscriber's gauges (its
/// limiter's pause as a turn stored it); the ledger answers a ping; a shared ledger names
/// this daemon in its share, an embedded one has none.
async fn gauges_pings_and_the_share(s: Store, now: i64) {
    s.ping().await.unwrap();
    add(&s, sub("a", &["*"])).await;
    add(&s, sub("b", &["*"])).await;
    s.ingest(evs("e", 2), now).await.unwrap();
    s.ingest(evs("f", 2), now + 100).await.unwrap();
    let paused = LimiterState {
        paused_until_ms: Some(now + 2_000),
        ..Default::default()
    };
    let c = record(
        &s,
        Turn {
            now_ms: now + 101,
            claims: vec![("a".into(), 3), ("b".into(), 1)],
            lease_until_ms: now + 101 + LEASE,
            ..Turn::default()
        },
    )
    .await;
    let ids = rowids(&c.claims[0]);
    assert_eq!((ids.len(), c.claims[1].claimed.len()), (3, 1));
    // a: one sent, one retrying, one dead, one never tried; b: one in flight, disabled.
    let retry = Outcome {
        rowid: ids[1],
        transition: Transition::Retry {
            at_ms: now + 5_000,
            error: "status 503".into(),
        },
        attempt: attempt(now + 102, "failed", 503),
    };
    let ended = vec![sent(ids[0], now + 102), retry, dead(ids[2], now + 102)];
    record(
        &s,
        Turn {
            now_ms: now + 102,
            outcomes: ended,
            limiters: vec![("a".into(), paused)],
            ..Turn::default()
        },
    )
    .await;
    s.update_subscriber("b".into(), None, move |mut x| {
        x.health.disabled = Some(Disabled {
            at_ms: now + 103,
            reason: "by hand".into(),
            by_operator: true,
        });
        Ok::<_, String>((x, true))
    })
    .await
    .unwrap()
    .unwrap();
    let (by_status, stats, report) = s.metrics_snapshot(now + 200, BREAKER).await.unwrap();
    let mut by_status: Vec<(String, i64)> =
        by_status.into_iter().filter(|(_, n)| *n != 0).collect();
    by_status.sort();
    assert_eq!(
        by_status,
        counts(&[("dead", 1), ("in_flight", 1), ("pending", 5), ("sent", 1)])
    );
    assert_eq!(
        (report.oldest_sent_at_ms, report.oldest_dead_at_ms),
        (Some(now + 102), Some(now + 102))
    );
    type Gauge<'a> = (&'a str, [i64; 4], Option<i64>, Option<i64>, &'a str, bool);
    let got: Vec<Gauge> = stats
        .iter()
        .map(|x| {
            (
                x.id.as_str(),
                [x.pending, x.in_flight, x.sent, x.dead],
                x.oldest_pending_at_ms,
                x.paused_until_ms,
                x.breaker.as_str(),
                x.disabled,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "a",
                [2, 0, 1, 1],
                Some(now),
                Some(now + 2_000),
                "closed",
                false
            ),
            ("b", [3, 1, 0, 0], Some(now), None, "closed", true)
        ]
    );
    let (_, limiter) = s.dispatch_subscriber("a").await.unwrap().unwrap();
    assert_eq!(limiter.paused_until_ms, Some(now + 2_000));
    // The share: every subscriber is this daemon's (alone, or on an embedded ledger).
    let share = s.share(&[(None, 1)]).await.unwrap();
    match (s.is_shared(), share) {
        (false, None) => {}
        (true, Some((share, others))) => {
            assert_eq!(share.members(), ["parity"]);
            assert!(share.owns("a") && others.is_empty(), "{others:?}");
        }
        (shared, share) => panic!("shared {shared}, share {share:?}"),
    }
    s.leave().await.unwrap();
}

/// An id brought back while its deliveries are kept goes on from its history (its numbers
/// continue); once retention removed them all, the id created again starts anew: sequence 1
/// and an empty chart.
async fn a_removed_ids_history_is_forgotten_once_none_of_its_deliveries_is_kept(
    s: Store,
    now: i64,
) {
    let sequences = |events: Vec<NewEvent>, at: i64| {
        let s = s.clone();
        async move {
            s.ingest(events, at).await.unwrap();
            let c = claim(&s, "a", 10, at).await;
            let numbers: Vec<u64> = c.claimed.iter().map(|d| d.sequence).collect();
            let done = c.claimed.iter().map(|d| sent(d.rowid, at)).collect();
            finish(&s, done, at).await;
            numbers
        }
    };
    add(&s, sub("a", &["*"])).await;
    assert_eq!(sequences(evs("e", 2), now).await, [1, 2]);
    let chart = SeriesRow {
        resolution_ms: 10_000,
        bucket_ms: now - now % 10_000,
        subscriber_id: "a".into(),
        counts: Counts {
            delivered: 2,
            ..Counts::default()
        },
        latency: Vec::new(),
        gauges: Gauges::default(),
    };
    s.add_series(vec![chart.clone()]).await.unwrap();
    let charted = |s: Store| async move {
        let to = chart.bucket_ms + 10_000;
        let rows = s.read_series(10_000, chart.bucket_ms, to, Some("a".into()), None);
        rows.await.unwrap().len()
    };
    s.delete_subscriber("a".into(), now + 1).await.unwrap();
    add(&s, sub("a", &["*"])).await;
    assert_eq!(
        sequences(evs("f", 1), now + 2).await,
        [3],
        "its history is kept"
    );
    assert_eq!(charted(s.clone()).await, 1);
    s.delete_subscriber("a".into(), now + 3).await.unwrap();
    let (r, _) = s
        .purge_finished(Finished::Sent, now + 10, 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.deliveries, 3);
    add(&s, sub("a", &["*"])).await;
    assert_eq!(
        charted(s.clone()).await,
        0,
        "a new endpoint's chart starts empty"
    );
    assert_eq!(
        sequences(evs("g", 1), now + 20).await,
        [1],
        "and its numbers at 1"
    );
}

/// Expired (the dispatcher's sweep, `release_expired_leases`), a run of one key comes back as
/// a released one does: one head per key, the rest held, so no later delivery of a key is
/// leased before or beside its head.
async fn an_expired_run_comes_back_with_one_head_per_key(s: Store, now: i64) {
    add(&s, ordered("o", 4)).await;
    let events: Vec<NewEvent> = (1..=4)
        .flat_map(|i| ["a", "b"].map(|k| keyed(&format!("{k}{i}"), k)))
        .collect();
    s.ingest(events, now).await.unwrap();
    let turn = |at: i64| Turn {
        now_ms: at,
        claims: vec![("o".into(), 12)],
        batch_per: vec![("o".into(), 3)],
        runs: vec!["o".into()],
        lease_until_ms: at + LEASE,
        ..Turn::default()
    };
    assert_eq!(record(&s, turn(now)).await.claims[0].runs, [3, 3]);
    let later = now + LEASE + 10;
    assert_eq!(s.release_expired_leases(later).await.unwrap(), ["o"]);
    let heads: Vec<String> = s
        .list_deliveries(DeliveryFilter {
            subscriber: Some("o".into()),
            ..all(20)
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|d| !d.held)
        .map(|d| d.event_id)
        .collect();
    assert_eq!(heads, ["a1", "b1"], "one head per key, the rest held");
    let taken = record(&s, turn(later)).await.claims.remove(0);
    let ids: Vec<&str> = taken.claimed.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3", "b1", "b2", "b3"]);
}
