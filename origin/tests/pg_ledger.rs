//! The PostgreSQL ledger's operations, each against a throwaway PostgreSQL server the test
//! starts itself (tests/common/pg.rs): migrations, ingest, claims by several daemons at once,
//! leases and their owners, the shared limiter, the API's reads and writes, and
//! `fanout ledger copy`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use common::pg::PgServer;
use fanout_core::breaker::BreakerConfig;
use fanout_core::retry::Attempt;
use fanout_origin::ledger::pg::{Announcement, Feedback, LeasedOutcome, PgLedger};
use fanout_origin::ledger::{
    AttemptRecord, DeliveryFilter, HealthWrite, LedgerError, NewEvent, Outcome, Transition,
};
use fanout_origin::model::{Disabled, Lane, Limits, Status, Subscriber};

const BREAKER: BreakerConfig = BreakerConfig {
    threshold: 20,
    cooldown_ms: 30_000,
};
const LEASE: i64 = 60_000;

fn sub(id: &str, types: &[&str], rate: f64, burst: u32, max_in_flight: u32) -> Subscriber {
    Subscriber {
        id: id.into(),
        url: "https://example.com/h".into(),
        event_types: types.iter().map(|s| s.to_string()).collect(),
        limits: Limits {
            rate_per_sec: rate,
            burst,
            max_in_flight,
            timeout_ms: 1000,
        },
        lane: Lane::Origin,
        legacy_signature: false,
        secrets: vec![],
        created_ms: 0,
        updated_ms: 0,
        health: Default::default(),
        customer: None,
    }
}

fn ev(id: &str, ty: &str) -> NewEvent {
    NewEvent {
        id: id.into(),
        event_type: ty.into(),
        body: format!("{{\"id\":\"{id}\"}}"),
    }
}

fn evs(prefix: &str, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| ev(&format!("{prefix}{i:05}"), "t"))
        .collect()
}

fn sent(rowid: i64, lease: Option<i64>, at_ms: i64) -> LeasedOutcome {
    LeasedOutcome {
        outcome: Outcome {
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
        },
        lease_expires_ms: lease,
    }
}

/// A fresh database on `server` and `n` daemons' handles on it.
async fn ledgers(server: &PgServer, db: &str, n: usize) -> Vec<PgLedger> {
    let url = server.database(db).await;
    let mut out = Vec::new();
    for k in 0..n {
        out.push(PgLedger::open(&url, &format!("daemon-{k}")).await.unwrap());
    }
    out
}

#[tokio::test]
async fn migrations_run_once_even_when_daemons_start_together_and_a_newer_schema_is_refused() {
    let server = PgServer::start();
    let url = server.database("m").await;
    // Three daemons opening a blank database at the same instant migrate it once.
    let opens: Vec<_> = (0..3)
        .map(|k| {
            let url = url.clone();
            tokio::spawn(async move { PgLedger::open(&url, &format!("d{k}")).await })
        })
        .collect();
    for o in opens {
        o.await.unwrap().unwrap();
    }
    let c = server.connect("m").await;
    let v: i32 = c
        .query_one("SELECT version FROM schema_version", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, fanout_origin::ledger::pg::SCHEMA_VERSION);
    // Opening again changes nothing.
    PgLedger::open(&url, "again").await.unwrap();
    // A database written by a newer fanout is refused, naming both versions.
    c.execute("UPDATE schema_version SET version = version + 1", &[])
        .await
        .unwrap();
    match PgLedger::open(&url, "old").await {
        Err(LedgerError::Schema(m)) => assert!(m.contains("newer than this fanout"), "{m}"),
        other => panic!("expected a schema refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn ingest_fans_out_once_per_subscriber_and_event_and_wakes_other_daemons() {
    let server = PgServer::start();
    let l = ledgers(&server, "i", 2).await;
    l[0].create_subscriber(&sub("a", &["video.*"], 10.0, 20, 8), "s")
        .await
        .unwrap();
    l[0].create_subscriber(&sub("b", &["video.trending"], 10.0, 20, 8), "s")
        .await
        .unwrap();
    l[0].create_subscriber(&sub("c", &["audio.*"], 10.0, 20, 8), "s")
        .await
        .unwrap();
    let mut listener = l[1].listen().await.unwrap();
    let (out, touched) = l[0]
        .ingest(
            &[
                ev("e1", "video.trending"),
                ev("e2", "video.new"),
                ev("e1", "video.trending"),
            ],
            5,
        )
        .await
        .unwrap();
    let got: Vec<(u32, bool)> = out.iter().map(|o| (o.deliveries, o.duplicate)).collect();
    assert_eq!(got, vec![(2, false), (1, false), (0, true)]);
    assert_eq!(touched, vec!["a".to_string(), "b".to_string()]);
    // The other daemon hears of it.
    let heard = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("no notification")
        .unwrap();
    assert_eq!(
        heard,
        Announcement::Due(vec!["a".to_string(), "b".to_string()])
    );
    // A change to a subscriber is announced too.
    l[0].rotate_secret("c", "s2", 7, 0).await.unwrap();
    let heard = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("no notification")
        .unwrap();
    assert_eq!(heard, Announcement::Changed("c".into()));
    // Re-sending through the other daemon creates nothing.
    let (again, touched) = l[1].ingest(&[ev("e2", "video.new")], 6).await.unwrap();
    assert_eq!((again[0].deliveries, again[0].duplicate), (0, true));
    assert!(touched.is_empty());
    let all = l[1]
        .list_deliveries(&DeliveryFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let pairs: BTreeSet<(String, String)> = all
        .iter()
        .map(|d| (d.subscriber_id.clone(), d.event_id.clone()))
        .collect();
    assert_eq!(all.len(), 3);
    assert_eq!(pairs.len(), 3);
}

#[tokio::test]
async fn leases_carry_their_owner_and_a_stale_result_is_ignored() {
    let server = PgServer::start();
    let l = ledgers(&server, "l", 2).await;
    l[0].create_subscriber(&sub("a", &["*"], 1000.0, 1000, 100), "s")
        .await
        .unwrap();
    l[0].ingest(&evs("e", 3), 0).await.unwrap();
    // Daemon 0 leases all three until 10 + LEASE, and dies.
    let c0 = l[0]
        .claim(&[("a".into(), 10)], BREAKER, 10, LEASE)
        .await
        .unwrap();
    assert_eq!(c0[0].claimed.len(), 3);
    assert_eq!(c0[0].in_flight, 3);
    let lease0 = c0[0].lease_expires_ms;
    // Before expiry daemon 1 gets nothing; after it, daemon 1 takes them over.
    let early = l[1]
        .claim(&[("a".into(), 10)], BREAKER, 20, LEASE)
        .await
        .unwrap();
    assert!(early[0].claimed.is_empty());
    assert_eq!(early[0].in_flight, 3);
    let late = l[1]
        .claim(&[("a".into(), 10)], BREAKER, lease0 + 1, LEASE)
        .await
        .unwrap();
    assert_eq!(late[0].claimed.len(), 3);
    let ids: Vec<i64> = late[0].claimed.iter().map(|d| d.rowid).collect();
    // Daemon 0 comes back with results for what it no longer holds: ignored, nothing counted.
    let stale = l[0]
        .apply(
            &ids.iter()
                .map(|&id| sent(id, Some(lease0), 30))
                .collect::<Vec<_>>(),
            &[],
            BREAKER,
            lease0 + 2,
        )
        .await
        .unwrap();
    assert_eq!((stale.recorded, stale.stale.len()), (0, 3));
    // Without the lease, the owner still decides.
    let stale = l[0]
        .apply(&[sent(ids[0], None, 30)], &[], BREAKER, lease0 + 2)
        .await
        .unwrap();
    assert_eq!(stale.recorded, 0);
    // Daemon 1's own results count, once.
    let lease1 = late[0].lease_expires_ms;
    let done = l[1]
        .apply(
            &ids.iter()
                .map(|&id| sent(id, Some(lease1), 40))
                .collect::<Vec<_>>(),
            &[],
            BREAKER,
            lease0 + 3,
        )
        .await
        .unwrap();
    assert_eq!(done.recorded, 3);
    let twice = l[1]
        .apply(&[sent(ids[0], Some(lease1), 40)], &[], BREAKER, lease0 + 4)
        .await
        .unwrap();
    assert_eq!(twice.recorded, 0, "a result recorded twice counts once");
    let d = l[0].get_delivery(ids[0]).await.unwrap();
    assert_eq!(d.status, Status::Sent);
    assert_eq!(d.attempt_count, 1);
    assert_eq!(d.attempts.map(|a| a.len()), Some(1));
    // A daemon restarting under its name gives back what it held.
    l[0].ingest(&evs("f", 2), 0).await.unwrap();
    let c = l[0]
        .claim(&[("a".into(), 10)], BREAKER, lease0 + 5, LEASE)
        .await
        .unwrap();
    assert_eq!(c[0].claimed.len(), 2);
    assert_eq!(l[0].release_own_leases(lease0 + 6).await.unwrap(), 2);
    assert_eq!(l[1].release_own_leases(lease0 + 6).await.unwrap(), 0);
    let c = l[1]
        .claim(&[("a".into(), 10)], BREAKER, lease0 + 7, LEASE)
        .await
        .unwrap();
    assert_eq!(c[0].claimed.len(), 2);
}

/// Four daemons claim one backlog at once, each recording what it got: every delivery is
/// leased exactly once.
#[tokio::test]
async fn concurrent_claimers_never_get_the_same_delivery() {
    let server = PgServer::start();
    let l = ledgers(&server, "c", 4).await;
    for s in ["a", "b"] {
        l[0].create_subscriber(&sub(s, &["*"], 1e6, 1_000_000, 1_000_000), "s")
            .await
            .unwrap();
    }
    let n = 3_000;
    l[0].ingest(&evs("e", n), 0).await.unwrap();
    let got: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let mut tasks = Vec::new();
    for ledger in l.clone() {
        let got = got.clone();
        tasks.push(tokio::spawn(async move {
            let mut now = 1;
            loop {
                let claims = ledger
                    .claim(&[("a".into(), 37), ("b".into(), 53)], BREAKER, now, LEASE)
                    .await
                    .unwrap();
                let mut outcomes = Vec::new();
                for c in &claims {
                    for d in &c.claimed {
                        outcomes.push(sent(d.rowid, Some(c.lease_expires_ms), now));
                    }
                }
                if outcomes.is_empty() {
                    return;
                }
                got.lock()
                    .unwrap()
                    .extend(outcomes.iter().map(|o| o.outcome.rowid));
                let applied = ledger.apply(&outcomes, &[], BREAKER, now).await.unwrap();
                assert_eq!(applied.recorded, outcomes.len());
                now += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got = got.lock().unwrap().clone();
    let distinct: BTreeSet<i64> = got.iter().copied().collect();
    assert_eq!(got.len(), 2 * n, "each delivery claimed once");
    assert_eq!(distinct.len(), 2 * n);
    let counts = l[0].status_counts().await.unwrap();
    assert_eq!(counts, vec![("sent".to_string(), 2 * n as i64)]);
}

/// Three daemons claiming for one subscriber at the same instants: together they get what one
/// limiter grants — the burst, then the rate — and never more than the in-flight cap.
#[tokio::test]
async fn the_shared_limiter_never_grants_more_than_the_bucket_across_claimers() {
    let server = PgServer::start();
    let l = ledgers(&server, "r", 3).await;
    l[0].create_subscriber(&sub("slow", &["*"], 20.0, 40, 1_000), "s")
        .await
        .unwrap();
    l[0].create_subscriber(&sub("capped", &["*"], 1e6, 1_000_000, 5), "s")
        .await
        .unwrap();
    l[0].ingest(&evs("e", 500), 0).await.unwrap();
    let t0 = 1_000_000;
    // All three at t0, each asking for far more than the burst, many times.
    let grab = |now: i64, who: &'static str| {
        let l = l.clone();
        async move {
            let mut tasks = Vec::new();
            for ledger in l {
                tasks.push(tokio::spawn(async move {
                    let mut total = 0;
                    for _ in 0..5 {
                        let c = ledger
                            .claim(&[(who.to_string(), 100)], BREAKER, now, LEASE)
                            .await
                            .unwrap();
                        total += c[0].claimed.len();
                    }
                    total
                }));
            }
            let mut sum = 0;
            for t in tasks {
                sum += t.await.unwrap();
            }
            sum
        }
    };
    assert_eq!(
        grab(t0, "slow").await,
        40,
        "the burst, once, across daemons"
    );
    // While the whole burst is out, nothing accrues (a send counts against the burst until
    // its answer is back: the subscriber may see it at any instant in between).
    assert_eq!(grab(t0 + 500, "slow").await, 0);
    // Every daemon records its answers: half a second later, 10 more tokens (20/s), however
    // many ask.
    let pg = server.connect("r").await;
    for (k, ledger) in l.iter().enumerate() {
        let mine: Vec<LeasedOutcome> = pg
            .query(
                "SELECT id FROM deliveries WHERE subscriber_id = 'slow' AND lease_owner = $1",
                &[&format!("daemon-{k}")],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| sent(r.get(0), None, t0))
            .collect();
        ledger.apply(&mine, &[], BREAKER, t0).await.unwrap();
    }
    assert_eq!(grab(t0 + 1_000, "slow").await, 10);
    assert_eq!(grab(t0 + 1_000, "slow").await, 0);
    // The in-flight cap is counted from every daemon's live leases.
    assert_eq!(grab(t0, "capped").await, 5);
    let c = l[2]
        .claim(&[("capped".into(), 100)], BREAKER, t0 + 1, LEASE)
        .await
        .unwrap();
    assert_eq!((c[0].claimed.len(), c[0].in_flight), (0, 5));
}

/// A 429 with Retry-After seen by one daemon pauses the subscriber for every daemon.
#[tokio::test]
async fn a_retry_after_pause_is_shared_by_every_daemon() {
    let server = PgServer::start();
    let l = ledgers(&server, "p", 2).await;
    l[0].create_subscriber(&sub("a", &["*"], 1000.0, 1000, 100), "s")
        .await
        .unwrap();
    l[0].ingest(&evs("e", 10), 0).await.unwrap();
    let t0 = 5_000;
    let c = l[0]
        .claim(&[("a".into(), 1)], BREAKER, t0, LEASE)
        .await
        .unwrap();
    let d = &c[0].claimed[0];
    let retry = LeasedOutcome {
        outcome: Outcome {
            rowid: d.rowid,
            transition: Transition::Retry {
                at_ms: t0 + 2_000,
                error: "status 429".into(),
            },
            attempt: None,
        },
        lease_expires_ms: Some(c[0].lease_expires_ms),
    };
    let feedback = Feedback {
        subscriber_id: "a".into(),
        attempt: Attempt::Status {
            status: 429,
            retry_after_ms: Some(2_000),
        },
        at_ms: t0 + 10,
    };
    l[0].apply(&[retry], &[feedback], BREAKER, t0 + 10)
        .await
        .unwrap();
    let paused = l[1]
        .claim(&[("a".into(), 5)], BREAKER, t0 + 1_000, LEASE)
        .await
        .unwrap();
    assert!(paused[0].claimed.is_empty());
    assert_eq!(paused[0].wait_ms, Some(1_010));
    let stats = l[1].subscriber_stats(BREAKER, t0 + 1_000).await.unwrap();
    assert_eq!(stats[0].paused_until_ms, Some(t0 + 2_010));
    let after = l[1]
        .claim(&[("a".into(), 5)], BREAKER, t0 + 2_011, LEASE)
        .await
        .unwrap();
    assert_eq!(after[0].claimed.len(), 5);
}

#[tokio::test]
async fn subscribers_deliveries_replay_health_and_stats_as_on_sqlite() {
    let server = PgServer::start();
    let l = ledgers(&server, "api", 1).await.remove(0);
    let a = sub("a", &["*"], 1000.0, 1000, 100);
    l.create_subscriber(&a, "whsec_one").await.unwrap();
    assert!(matches!(
        l.create_subscriber(&a, "x").await,
        Err(LedgerError::Conflict(_))
    ));
    let mut changed = a.clone();
    changed.url = "https://example.com/other".into();
    changed.limits.burst = 7;
    changed.updated_ms = 3;
    l.update_subscriber(&changed).await.unwrap();
    let got = l.get_subscriber("a").await.unwrap();
    assert_eq!(
        (got.url.as_str(), got.limits.burst),
        ("https://example.com/other", 7)
    );
    l.rotate_secret("a", "whsec_two", 10, 100).await.unwrap();
    let got = l.get_subscriber("a").await.unwrap();
    assert_eq!(got.active_secrets(50).len(), 2);
    assert_eq!(got.active_secrets(200), vec!["whsec_two".to_string()]);
    assert!(matches!(
        l.rotate_secret("nobody", "s", 1, 1).await,
        Err(LedgerError::NotFound(_))
    ));

    // Deliveries: two dead, one pending; list, detail, replay one and in bulk.
    l.ingest(&evs("e", 3), 0).await.unwrap();
    let c = l
        .claim(&[("a".into(), 2)], BREAKER, 1, LEASE)
        .await
        .unwrap();
    let ids: Vec<i64> = c[0].claimed.iter().map(|d| d.rowid).collect();
    assert!(matches!(
        l.replay_one(ids[0], 2).await,
        Err(LedgerError::Conflict(_))
    ));
    let dead = |rowid| LeasedOutcome {
        outcome: Outcome {
            rowid,
            transition: Transition::Dead {
                reason: "gone".into(),
            },
            attempt: None,
        },
        lease_expires_ms: None,
    };
    l.apply(&[dead(ids[0]), dead(ids[1])], &[], BREAKER, 5)
        .await
        .unwrap();
    let dead_filter = DeliveryFilter {
        status: Some(Status::Dead),
        subscriber: Some("a".into()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(l.list_deliveries(&dead_filter).await.unwrap().len(), 2);
    let page = l
        .list_deliveries(&DeliveryFilter {
            after: Some(ids[0]),
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, format!("dlv_{}", ids[1]));
    let notices = l
        .check_dead_counts(&["a".to_string(), "gone".to_string()], 2, 6)
        .await
        .unwrap();
    assert_eq!(notices.len(), 1);
    assert!(l
        .check_dead_counts(&["a".to_string()], 2, 7)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(l.replay_one(ids[0], 8).await.unwrap(), "a");
    assert_eq!(l.rearm_dead_alerts(2).await.unwrap(), 1);
    let (n, subs) = l
        .replay_bulk(
            &DeliveryFilter {
                subscriber: Some("a".into()),
                ..Default::default()
            },
            9,
        )
        .await
        .unwrap();
    assert_eq!((n, subs), (1, vec!["a".to_string()]));
    assert!(l.list_deliveries(&dead_filter).await.unwrap().is_empty());
    let d = l.get_delivery(ids[1]).await.unwrap();
    assert_eq!(
        (d.status.as_str(), d.next_attempt_at_ms),
        ("pending", Some(9))
    );
    assert!(matches!(
        l.get_delivery(999_999).await,
        Err(LedgerError::NotFound(_))
    ));

    // Health: disable stops claims; re-enabling resets the breaker and the failure run.
    l.apply_health(&[
        HealthWrite::FailingSince {
            subscriber: "a".into(),
            since_ms: Some(3),
        },
        HealthWrite::Disable {
            subscriber: "a".into(),
            disabled: Disabled {
                at_ms: 11,
                reason: "410".into(),
            },
        },
    ])
    .await
    .unwrap();
    let s = l.get_subscriber("a").await.unwrap();
    assert_eq!(s.health.failing_since_ms, Some(3));
    assert!(l
        .claim(&[("a".into(), 5)], BREAKER, 12, LEASE)
        .await
        .unwrap()
        .is_empty());
    assert!(l.set_disabled("a", None, 13).await.unwrap());
    assert!(!l.set_disabled("a", None, 13).await.unwrap());
    assert_eq!(
        l.get_subscriber("a").await.unwrap().health,
        Default::default()
    );
    let stats = l.subscriber_stats(BREAKER, 14).await.unwrap();
    assert_eq!((stats[0].pending, stats[0].sent, stats[0].dead), (3, 0, 0));
    let counts = l.subscriber_counts(&["a".to_string()], 14).await.unwrap();
    assert_eq!(counts["a"].pending, 3);
    assert_eq!(l.due_summary().await.unwrap(), vec![("a".to_string(), 0)]);

    // Removal: unfinished work goes dead, the subscriber can come back with a new secret.
    assert_eq!(l.delete_subscriber("a", 20).await.unwrap(), 3);
    assert!(matches!(
        l.get_subscriber("a").await,
        Err(LedgerError::NotFound(_))
    ));
    assert!(matches!(
        l.replay_one(ids[0], 21).await,
        Err(LedgerError::Conflict(_))
    ));
    l.create_subscriber(&a, "whsec_three").await.unwrap();
    assert_eq!(l.list_subscribers().await.unwrap()[0].secrets.len(), 1);
}

/// Results and their attempts, in order, for outcomes of every kind in one call.
#[tokio::test]
async fn apply_records_every_transition_and_its_attempt() {
    let server = PgServer::start();
    let l = ledgers(&server, "t", 1).await.remove(0);
    l.create_subscriber(&sub("a", &["*"], 1e6, 1_000_000, 1_000), "s")
        .await
        .unwrap();
    l.ingest(&evs("e", 4), 0).await.unwrap();
    let c = l
        .claim(&[("a".into(), 4)], BREAKER, 1, LEASE)
        .await
        .unwrap();
    let ids: Vec<i64> = c[0].claimed.iter().map(|d| d.rowid).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first");
    assert!(c[0]
        .claimed
        .iter()
        .all(|d| d.attempt == 1 && d.body.contains(&d.event_id)));
    let lease = Some(c[0].lease_expires_ms);
    let mut retry = sent(ids[1], lease, 2);
    retry.outcome.transition = Transition::Retry {
        at_ms: 99,
        error: "status 500".into(),
    };
    let defer = LeasedOutcome {
        outcome: Outcome {
            rowid: ids[2],
            transition: Transition::Defer { at_ms: 77 },
            attempt: None,
        },
        lease_expires_ms: lease,
    };
    let mut dead = sent(ids[3], lease, 2);
    dead.outcome.transition = Transition::Dead {
        reason: "410".into(),
    };
    let applied = l
        .apply(
            &[sent(ids[0], lease, 2), retry, defer, dead],
            &[],
            BREAKER,
            3,
        )
        .await
        .unwrap();
    assert_eq!(applied.recorded, 4);
    let view = |k: usize| {
        let l = l.clone();
        let id = ids[k];
        async move { l.get_delivery(id).await.unwrap() }
    };
    let (d0, d1, d2, d3) = (view(0).await, view(1).await, view(2).await, view(3).await);
    let summary = |d: &fanout_origin::ledger::DeliveryView| {
        (
            d.status,
            d.attempt_count,
            d.next_attempt_at_ms,
            d.last_error.clone(),
            d.attempts.as_ref().map_or(0, |a| a.len()),
        )
    };
    assert_eq!(summary(&d0), (Status::Sent, 1, None, None, 1));
    assert_eq!(
        summary(&d1),
        (Status::Pending, 1, Some(99), Some("status 500".into()), 1)
    );
    assert_eq!(summary(&d2), (Status::Pending, 0, Some(77), None, 0));
    assert_eq!(summary(&d3), (Status::Dead, 1, None, Some("410".into()), 1));
    let counts: HashMap<String, i64> = l.status_counts().await.unwrap().into_iter().collect();
    assert_eq!(counts.get("in_flight"), None);
}

/// `fanout ledger copy` moves a SQLite ledger with its history: statuses, attempts, limiter
/// state and ids survive, in-flight work comes over pending, and a second copy into the now
/// non-empty database is refused.
#[tokio::test]
async fn ledger_copy_moves_a_sqlite_ledger_into_an_empty_postgres_one() {
    use fanout_origin::ledger::{self as sq, Ledger};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fanout.db");
    let n = 12_000; // more than one copy chunk
    {
        let ledger = Ledger::open(&path).unwrap();
        let (a, b) = (
            sub("a", &["*"], 1e6, 1_000_000, 100_000),
            sub("gone", &["*"], 5.0, 9, 3),
        );
        ledger
            .tx(move |c| {
                sq::create_subscriber(c, &a, "whsec_a")?;
                sq::create_subscriber(c, &b, "whsec_b")?;
                sq::ingest(c, &evs("e", n), 1)?;
                // Dead and sent deliveries with attempts, some still in flight.
                let claims = sq::claim(c, &[("a".into(), 3)], &[], 2, 100_000)?;
                let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
                let mut o0 = sent(ids[0], None, 3).outcome;
                let mut o1 = sent(ids[1], None, 3).outcome;
                o1.transition = Transition::Dead {
                    reason: "410".into(),
                };
                o0.transition = Transition::Sent;
                sq::apply(c, &[o0, o1], &[], 4)?;
                let limiter = fanout_core::limiter::LimiterState {
                    paused_until_ms: Some(123_456),
                    ..Default::default()
                };
                sq::store_limiters(c, &[("a".into(), limiter)])?;
                sq::delete_subscriber(c, "gone", 5)?;
                Ok(())
            })
            .await
            .unwrap();
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

    let pg = PgLedger::open(&url, "after-copy").await.unwrap();
    let counts: HashMap<String, i64> = pg.status_counts().await.unwrap().into_iter().collect();
    assert_eq!(counts.get("sent"), Some(&1));
    assert_eq!(counts.get("in_flight"), None);
    // The removed subscriber's deliveries went dead with it (n) plus the 410 one.
    assert_eq!(counts.get("dead"), Some(&(n as i64 + 1)));
    assert_eq!(counts.get("pending"), Some(&(n as i64 - 2)));
    let subs = pg.list_subscribers().await.unwrap();
    assert_eq!(subs.len(), 1, "removed subscribers stay removed");
    assert_eq!(subs[0].secrets[0].secret, "whsec_a");
    assert_eq!(
        pg.load_limiter("a", 0).await.unwrap().paused_until_ms,
        Some(123_456)
    );
    let dead = pg
        .list_deliveries(&DeliveryFilter {
            status: Some(Status::Dead),
            subscriber: Some("a".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let detail = pg
        .get_delivery(dead[0].id.trim_start_matches("dlv_").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(detail.attempts.map(|a| a.len()), Some(1));
    assert_eq!(detail.last_error.as_deref(), Some("410"));
    // New rows continue after the copied ids.
    let (_, _) = pg.ingest(&[ev("new", "t")], 9).await.unwrap();
    let newest = pg
        .list_deliveries(&DeliveryFilter {
            event: Some("new".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(newest[0].id, format!("dlv_{}", 2 * n + 1));

    // Not into a ledger that holds anything.
    let again = copy(url);
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("not empty"), "{stderr}");
}

/// A live daemon's leases are renewed; a dead one's lapse after `LEASE_MS` and are taken over.
#[tokio::test]
async fn renewed_leases_hold_and_lapsed_ones_are_taken_over() {
    use fanout_origin::ledger::pg::LEASE_MS;
    let server = PgServer::start();
    let l = ledgers(&server, "renew", 2).await;
    l[0].create_subscriber(&sub("a", &["*"], 1e6, 1_000_000, 100), "s")
        .await
        .unwrap();
    l[0].ingest(&evs("e", 4), 0).await.unwrap();
    let t0 = 1_000;
    let c = l[0]
        .claim(&[("a".into(), 4)], BREAKER, t0, LEASE_MS)
        .await
        .unwrap();
    assert_eq!(c[0].claimed.len(), 4);
    // Alive: renewed just before expiry, so the other daemon gets nothing after it.
    assert_eq!(l[0].renew_leases(t0 + LEASE_MS - 1).await.unwrap(), 4);
    assert_eq!(l[1].renew_leases(t0 + LEASE_MS - 1).await.unwrap(), 0);
    let held = l[1]
        .claim(&[("a".into(), 4)], BREAKER, t0 + LEASE_MS + 1, LEASE_MS)
        .await
        .unwrap();
    assert!(held[0].claimed.is_empty());
    // Dead (no more renewals): lapsed, swept, and taken over.
    let lapsed = t0 + 2 * LEASE_MS;
    assert_eq!(
        l[1].release_expired_leases(lapsed).await.unwrap(),
        vec!["a".to_string()]
    );
    let taken = l[1]
        .claim(&[("a".into(), 4)], BREAKER, lapsed, LEASE_MS)
        .await
        .unwrap();
    assert_eq!(taken[0].claimed.len(), 4);
}

/// A daemon on PostgreSQL serves customers like one on SQLite (they were refused with 501
/// `not_supported` before migration 3); with PostgreSQL gone, ingest answers 503 `unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_are_served_on_postgres_and_a_lost_server_is_unavailable() {
    let mut server = PgServer::start();
    let url = server.database("c").await;
    let daemon = common::Daemon::start_with(|mut s| {
        s.db = Some(url.clone().into());
        s
    })
    .await;
    let api = &daemon.api;
    let (s, body) = api
        .post(
            "/v1/customers",
            serde_json::json!({ "id": "acme", "weight": 3 }),
        )
        .await;
    assert_eq!(
        (s, body["weight"].clone()),
        (201, serde_json::json!(3)),
        "{body}"
    );
    let (s, body) = api.get("/v1/customers").await;
    assert_eq!(
        (s, body["customers"][0]["id"].clone()),
        (200, "acme".into()),
        "{body}"
    );
    let spec = serde_json::json!({ "id": "s1", "url": "http://127.0.0.1:9/h", "event_types": ["*"], "rate_per_sec": 0.001, "customer": "acme" });
    let (s, body) = api.post("/v1/subscribers", spec).await;
    assert_eq!(
        (s, body["customer"].clone()),
        (201, "acme".into()),
        "{body}"
    );
    let nobody = serde_json::json!({ "id": "s2", "url": "http://127.0.0.1:9/h", "event_types": ["*"], "customer": "nobody" });
    let (s, body) = api.post("/v1/subscribers", nobody).await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (400, "invalid_request".into()),
        "{body}"
    );
    let plain = serde_json::json!({ "id": "s2", "url": "http://127.0.0.1:9/h", "event_types": ["*"], "rate_per_sec": 0.001 });
    let (s, body) = api.post("/v1/subscribers", plain).await;
    assert_eq!(
        (s, body["customer"].clone()),
        (201, serde_json::Value::Null),
        "{body}"
    );
    let patch = serde_json::json!({ "customer": "acme" }).to_string();
    let (s, body) = api
        .raw("PATCH", "/v1/subscribers/s2", Some(patch), true)
        .await;
    assert_eq!(
        (s, body["customer"].clone()),
        (200, "acme".into()),
        "{body}"
    );
    let (s, body) = api.get("/v1/customers/acme").await;
    assert_eq!(
        (s, body["subscribers"].clone()),
        (200, serde_json::json!(2)),
        "{body}"
    );

    server.stop();
    let (s, body) = api
        .post(
            "/v1/events",
            serde_json::json!([{ "id": "e1", "type": "t", "data": {} }]),
        )
        .await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (503, "unavailable".into()),
        "{body}"
    );
}
