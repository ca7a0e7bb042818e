//! The PostgreSQL ledger's own behaviour, each against a throwaway PostgreSQL server the test
//! starts itself (tests/common/pg.rs): migrations by several daemons at once, announcements
//! between daemons, claims by several daemons at once, leases and their owners, the shared
//! limiter. What both backends do alike is `origin/tests/ledger_parity.rs`; how PostgreSQL
//! writes (group commit, locks, a full disk, kept counts, retention's lock) is `writes.rs`; its
//! query plans and upkeep `plans.rs`; a daemon that loses its server `pg_customers.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::fixtures::{
    add, claim, ev, evs, in_flight, ledgers, record, sent, sub, turn, BREAKER, LEASE,
};
use super::pg::PgServer;
use crate::ledger::dispatch::Announcement;
use crate::ledger::postgres::PgLedger;
use crate::ledger::{
    Deliveries, DeliveryFilter, DispatchLedger, LedgerError, NewEvent, Outcome, Subscribers,
    Transition, Turn,
};
use crate::model::Status;
use fanout_core::retry::Attempt;

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
    assert_eq!(v, crate::ledger::postgres::schema::VERSION);
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

/// The next announcement `listener` hears (bounded: 5 s).
async fn hear(listener: &mut crate::ledger::postgres::listen::Listener) -> Announcement {
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv());
    next.await.expect("no notification").unwrap()
}

/// Another daemon hears of an ingest's new work and of a changed subscriber (`LISTEN`), and an
/// event sent again through it creates nothing. (How ingest fans out: `ledger_parity.rs`.)
#[tokio::test]
async fn ingest_and_changes_wake_other_daemons_and_a_resend_through_them_is_a_duplicate() {
    let server = PgServer::start();
    let l = ledgers(&server, "i", 2).await;
    for (id, ty) in [("a", "video.*"), ("b", "video.trending"), ("c", "audio.*")] {
        add(&l[0], sub(id, &[ty], 10.0, 20, 8)).await;
    }
    let mut listener = l[1].listen().await.unwrap();
    let (_, touched) = l[0]
        .ingest(vec![ev("e1", "video.trending"), ev("e2", "video.new")], 5)
        .await
        .unwrap();
    assert_eq!(touched, ["a", "b"]);
    let due = Announcement::Due(vec!["a".to_string(), "b".to_string()]);
    assert_eq!(hear(&mut listener).await, due);
    Subscribers::rotate_secret(&l[0], "c".into(), "s2".into(), 7, 0, None)
        .await
        .unwrap();
    assert_eq!(hear(&mut listener).await, Announcement::Changed("c".into()));
    let (again, touched) = l[1].ingest(vec![ev("e2", "video.new")], 6).await.unwrap();
    assert_eq!((again[0].deliveries, again[0].duplicate), (0, true));
    assert!(touched.is_empty());
    let all = DeliveryFilter {
        limit: 100,
        ..Default::default()
    };
    assert_eq!(
        Deliveries::list_deliveries(&l[1], all.clone())
            .await
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn leases_carry_their_owner_and_a_stale_result_is_ignored() {
    let server = PgServer::start();
    let l = ledgers(&server, "l", 2).await;
    add(&l[0], sub("a", &["*"], 1000.0, 1000, 100)).await;
    l[0].ingest(evs("e", 3), 0).await.unwrap();
    // Daemon 0 leases all three until 10 + LEASE, and dies.
    let c0 = claim(&l[0], &[("a", 10)], 10, LEASE).await;
    assert_eq!(c0[0].claimed.len(), 3);
    assert_eq!(in_flight(&server, "l", "a", 10).await, 3);
    let lease0 = 10 + LEASE;
    // Before expiry daemon 1 gets nothing; after it, daemon 1 takes them over.
    let early = claim(&l[1], &[("a", 10)], 20, LEASE).await;
    assert!(early[0].claimed.is_empty());
    assert_eq!(in_flight(&server, "l", "a", 20).await, 3);
    let late = claim(&l[1], &[("a", 10)], lease0 + 1, LEASE).await;
    assert_eq!(late[0].claimed.len(), 3);
    let ids: Vec<i64> = late[0].claimed.iter().map(|d| d.rowid).collect();
    // Daemon 0 comes back with results for what it no longer holds: ignored, nothing counted
    // (the owner decides: a turn's results carry no lease).
    let stale: Vec<Outcome> = ids.iter().map(|&id| sent(id, 30)).collect();
    record(&l[0], stale, &[], lease0 + 2).await;
    for &id in &ids {
        let d = Deliveries::get_delivery(&l[0], id, None).await.unwrap();
        assert_eq!((d.status, d.attempt_count), (Status::InFlight, 0));
    }
    // Daemon 1's own results count, once.
    let done: Vec<Outcome> = ids.iter().map(|&id| sent(id, 40)).collect();
    record(&l[1], done, &[], lease0 + 3).await;
    for &id in &ids {
        let d = Deliveries::get_delivery(&l[0], id, None).await.unwrap();
        assert_eq!((d.status, d.attempt_count), (Status::Sent, 1));
    }
    record(&l[1], vec![sent(ids[0], 40)], &[], lease0 + 4).await;
    let d = Deliveries::get_delivery(&l[0], ids[0], None).await.unwrap();
    assert_eq!(d.status, Status::Sent);
    assert_eq!(d.attempt_count, 1);
    assert_eq!(d.attempts.map(|a| a.len()), Some(1));
    // A daemon restarting under its name gives back what it held.
    l[0].ingest(evs("f", 2), 0).await.unwrap();
    let c = claim(&l[0], &[("a", 10)], lease0 + 5, LEASE).await;
    assert_eq!(c[0].claimed.len(), 2);
    assert_eq!(l[0].release_own_leases(lease0 + 6).await.unwrap(), 2);
    assert_eq!(l[1].release_own_leases(lease0 + 6).await.unwrap(), 0);
    let c = claim(&l[1], &[("a", 10)], lease0 + 7, LEASE).await;
    assert_eq!(c[0].claimed.len(), 2);
}

/// Four daemons claim one backlog at once, each recording what it got: every delivery is
/// leased exactly once.
#[tokio::test]
async fn concurrent_claimers_never_get_the_same_delivery() {
    let server = PgServer::start();
    let l = ledgers(&server, "c", 4).await;
    for s in ["a", "b"] {
        add(&l[0], sub(s, &["*"], 1e6, 1_000_000, 1_000_000)).await;
    }
    let n = 3_000;
    l[0].ingest(evs("e", n), 0).await.unwrap();
    let got: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let mut tasks = Vec::new();
    for ledger in l.clone() {
        let got = got.clone();
        tasks.push(tokio::spawn(async move {
            let mut now = 1;
            loop {
                let claims = claim(&ledger, &[("a", 37), ("b", 53)], now, LEASE).await;
                let mut outcomes = Vec::new();
                for c in &claims {
                    for d in &c.claimed {
                        outcomes.push(sent(d.rowid, now));
                    }
                }
                if outcomes.is_empty() {
                    return;
                }
                got.lock().unwrap().extend(outcomes.iter().map(|o| o.rowid));
                record(&ledger, outcomes, &[], now).await;
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
    add(&l[0], sub("slow", &["*"], 20.0, 40, 1_000)).await;
    add(&l[0], sub("capped", &["*"], 1e6, 1_000_000, 5)).await;
    l[0].ingest(evs("e", 500), 0).await.unwrap();
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
                        let c = claim(&ledger, &[(who, 100)], now, LEASE).await;
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
        let mine: Vec<Outcome> = pg
            .query(
                "SELECT id FROM deliveries WHERE subscriber_id = 'slow' AND lease_owner = $1",
                &[&format!("daemon-{k}")],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| sent(r.get(0), t0))
            .collect();
        record(ledger, mine, &[], t0).await;
    }
    assert_eq!(grab(t0 + 1_000, "slow").await, 10);
    assert_eq!(grab(t0 + 1_000, "slow").await, 0);
    // The in-flight cap is counted from every daemon's live leases.
    assert_eq!(grab(t0, "capped").await, 5);
    let c = claim(&l[2], &[("capped", 100)], t0 + 1, LEASE).await;
    assert_eq!(c[0].claimed.len(), 0);
    assert_eq!(in_flight(&server, "r", "capped", t0 + 1).await, 5);
}

/// A 429 with Retry-After seen by one daemon pauses the subscriber for every daemon.
#[tokio::test]
async fn a_retry_after_pause_is_shared_by_every_daemon() {
    let server = PgServer::start();
    let l = ledgers(&server, "p", 2).await;
    add(&l[0], sub("a", &["*"], 1000.0, 1000, 100)).await;
    l[0].ingest(evs("e", 10), 0).await.unwrap();
    let t0 = 5_000;
    let c = claim(&l[0], &[("a", 1)], t0, LEASE).await;
    let d = &c[0].claimed[0];
    let retry = Outcome {
        rowid: d.rowid,
        transition: Transition::Retry {
            at_ms: t0 + 2_000,
            error: "status 429".into(),
        },
        attempt: None,
    };
    let answer = Attempt::Status {
        status: 429,
        retry_after_ms: Some(2_000),
    };
    record(&l[0], vec![retry], &[("a", answer, t0 + 10)], t0 + 10).await;
    // Daemon 1's turn is told to wait until the pause is over (its own copy of the limiter
    // knows nothing of the 429 another daemon got).
    let paused = claim(&l[1], &[("a", 5)], t0 + 1_000, LEASE).await;
    assert!(paused[0].claimed.is_empty());
    assert_eq!(paused[0].not_before_ms, Some(t0 + 2_010));
    let stats = l[1].subscriber_stats(BREAKER, t0 + 1_000).await.unwrap();
    assert_eq!(stats[0].paused_until_ms, Some(t0 + 2_010));
    let after = claim(&l[1], &[("a", 5)], t0 + 2_011, LEASE).await;
    assert_eq!(after[0].claimed.len(), 5);
}

/// A turn that leases up to the in-flight cap tells its daemon no wait: a result frees a
/// slot, and the daemon asks again as soon as one comes back (a wait here held every
/// subscriber at its cap back for a quarter of a second per turn).
#[tokio::test]
async fn a_full_in_flight_cap_is_no_wait() {
    let server = PgServer::start();
    let l = ledgers(&server, "cap", 1).await;
    add(&l[0], sub("a", &["*"], 1000.0, 1000, 2)).await;
    l[0].ingest(evs("e", 5), 0).await.unwrap();
    let c = claim(&l[0], &[("a", 5)], 5_000, LEASE).await;
    assert_eq!(c[0].claimed.len(), 2);
    assert_eq!(c[0].not_before_ms, None);
}

/// A live daemon's leases are renewed; a dead one's lapse after `LEASE_MS` and are taken over.
#[tokio::test]
async fn renewed_leases_hold_and_lapsed_ones_are_taken_over() {
    use crate::ledger::postgres::dispatch::LEASE_MS;
    let server = PgServer::start();
    let l = ledgers(&server, "renew", 2).await;
    add(&l[0], sub("a", &["*"], 1e6, 1_000_000, 100)).await;
    l[0].ingest(evs("e", 4), 0).await.unwrap();
    let t0 = 1_000;
    let c = claim(&l[0], &[("a", 4)], t0, LEASE_MS).await;
    assert_eq!(c[0].claimed.len(), 4);
    // Alive: renewed just before expiry, so the other daemon gets nothing after it.
    assert_eq!(l[0].renew_leases(t0 + LEASE_MS - 1).await.unwrap(), 4);
    assert_eq!(l[1].renew_leases(t0 + LEASE_MS - 1).await.unwrap(), 0);
    let held = claim(&l[1], &[("a", 4)], t0 + LEASE_MS + 1, LEASE_MS).await;
    assert!(held[0].claimed.is_empty());
    // Dead (no more renewals): lapsed, swept, and taken over.
    let lapsed = t0 + 2 * LEASE_MS;
    assert_eq!(
        l[1].release_expired_leases(lapsed).await.unwrap(),
        vec!["a".to_string()]
    );
    let taken = claim(&l[1], &[("a", 4)], lapsed, LEASE_MS).await;
    assert_eq!(taken[0].claimed.len(), 4);
}

/// A turn written though its answer was lost (a connection that failed after the commit
/// reached the server, as in the fault soak's PostgreSQL restarts) leaves leases the
/// dispatcher does not know of; the daemon's renewals would keep them for as long as it
/// lives. `release_strays` returns this daemon's leases but those it holds, and no other
/// daemon's.
#[tokio::test]
async fn leases_of_a_turn_whose_answer_was_lost_are_released_but_those_held() {
    use crate::ledger::postgres::dispatch::LEASE_MS;
    let server = PgServer::start();
    let l = ledgers(&server, "strays", 2).await;
    add(&l[0], sub("a", &["*"], 1e6, 1_000_000, 100)).await;
    l[0].ingest(evs("e", 5), 0).await.unwrap();
    let t0 = 1_000;
    // Daemon 0 holds one send; a lost answer leased it three more; daemon 1 holds one.
    let mine = claim(&l[0], &[("a", 4)], t0, LEASE_MS)
        .await
        .remove(0)
        .claimed;
    assert_eq!(mine.len(), 4);
    let other = claim(&l[1], &[("a", 1)], t0, LEASE_MS)
        .await
        .remove(0)
        .claimed;
    assert_eq!(other.len(), 1);
    // Renewed, the strays never lapse.
    assert_eq!(l[0].renew_leases(t0 + LEASE_MS - 1).await.unwrap(), 4);
    let held = [mine[0].rowid];
    let at = t0 + 2_000;
    assert_eq!(
        l[0].release_strays(&held, at).await.unwrap(),
        vec!["a".to_string()]
    );
    // Nothing left to release; the held lease and daemon 1's are still in flight.
    assert!(l[0].release_strays(&held, at).await.unwrap().is_empty());
    let c = server.connect("strays").await;
    let rows = c
        .query(
            "SELECT id, status, lease_owner, next_attempt_ms FROM deliveries ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    for r in rows {
        let id: i64 = r.get(0);
        let status: String = r.get(1);
        let owner: Option<String> = r.get(2);
        if id == mine[0].rowid {
            assert_eq!(
                (status.as_str(), owner.as_deref()),
                ("in_flight", Some("daemon-0"))
            );
        } else if id == other[0].rowid {
            assert_eq!(
                (status.as_str(), owner.as_deref()),
                ("in_flight", Some("daemon-1"))
            );
        } else {
            assert_eq!(
                (status.as_str(), owner, r.get::<_, i64>(3)),
                ("pending", None, at)
            );
        }
    }
    // Due at once: the next claim of either daemon takes them.
    let again = claim(&l[1], &[("a", 10)], at, LEASE_MS).await;
    assert_eq!(again[0].claimed.len(), 3);
}

/// A claim keeps only the tokens of what it leased: asking for more than is due takes nothing
/// from the shared bucket for what it did not find.
#[tokio::test]
async fn a_claim_takes_tokens_only_for_what_it_leased() {
    let server = PgServer::start();
    let l = ledgers(&server, "tokens", 1).await.remove(0);
    // A burst of 10 refilling one token per 1,000 s: nothing refills during the test.
    add(&l, sub("a", &["*"], 0.001, 10, 100)).await;
    l.ingest(evs("x", 3), 0).await.unwrap();
    let t0 = 1_000;
    let first = claim(&l, &[("a", 10)], t0, LEASE).await;
    assert_eq!(first[0].claimed.len(), 3);
    l.ingest(evs("y", 9), t0).await.unwrap();
    let second = claim(&l, &[("a", 10)], t0, LEASE).await;
    // 10 - 3 tokens left (and room for 10 - 3 while three are open).
    assert_eq!(second[0].claimed.len(), 7);
    assert_eq!(in_flight(&server, "tokens", "a", t0).await, 10);
}

/// A batching subscriber's claim (`Turn::batch_per`) is in requests: every
/// daemon counts a batch in flight once (by its lead, `batch_lead`) against the in-flight cap,
/// and the shared bucket pays one token per batch.
#[tokio::test]
async fn daemons_count_a_batch_in_flight_as_one_request() {
    let server = PgServer::start();
    let l = ledgers(&server, "batch", 2).await;
    // Two requests in flight at most; a burst of 3 refilling one token per 1,000 s.
    add(&l[0], sub("b", &["*"], 0.001, 3, 2)).await;
    l[0].ingest(evs("x", 23), 0).await.unwrap();
    let per = [("b".to_string(), 5)];
    let t0 = 1_000;
    let claim = |k: usize, asked: usize| {
        let l = l[k].clone();
        let per = per.clone();
        async move {
            let t = Turn {
                now_ms: t0,
                claims: vec![("b".into(), asked)],
                batch_per: per.to_vec(),
                lease_until_ms: t0 + LEASE,
                ..Turn::default()
            };
            turn(&l, t).await.claims.remove(0)
        }
    };
    let requests = || in_flight(&server, "batch", "b", t0);
    // Daemon 0 asks one request's worth: five deliveries, one request out.
    let first = claim(0, 5).await;
    assert_eq!((first.claimed.len(), requests().await), (5, 1));
    // Daemon 1 asks three requests' worth: the cap leaves one more request, five deliveries.
    let second = claim(1, 15).await;
    assert_eq!((second.claimed.len(), requests().await), (5, 2));
    // Both requests out: nothing more, whoever asks.
    assert_eq!(claim(0, 5).await.claimed.len(), 0);
    assert_eq!(claim(1, 5).await.claimed.len(), 0);
    // Each group names its first delivery, in the order leased.
    let c = server.connect("batch").await;
    let leads: Vec<(i64, Option<i64>)> = c
        .query(
            "SELECT id, batch_lead FROM deliveries WHERE status = 'in_flight' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(leads.len(), 10);
    for group in leads.chunks(5) {
        assert!(
            group.iter().all(|(_, lead)| *lead == Some(group[0].0)),
            "{leads:?}"
        );
    }
    // One request ends (its five recorded sent): one token is left of the burst of 3 (two
    // batches took one each), so one more batch goes.
    let done: Vec<Outcome> = first
        .claimed
        .iter()
        .map(|d| sent(d.rowid, t0 + 1))
        .collect();
    record(&l[0], done, &[], t0 + 1).await;
    let third = claim(0, 15).await;
    assert_eq!(third.claimed.len(), 5, "one token left: one batch");
    assert_eq!(claim(1, 15).await.claimed.len(), 0, "the bucket is empty");
}

/// An ordered batching subscriber's turn claims in runs (`Turn::runs`): each due head with up
/// to `per - 1` of its key's held deliveries after it, one request each against the cap (the
/// run names its head in `batch_lead`). Another daemon finds nothing more (the rest is held).
/// When the leases expire, each key's head comes back due and its run held, so the daemon that
/// takes over gets the same runs in the same order.
#[tokio::test]
async fn an_ordered_batching_claim_takes_runs_and_an_expired_run_keeps_one_head() {
    use crate::ordering::Ordering;
    let server = PgServer::start();
    let l = ledgers(&server, "runs", 2).await;
    let mut s = sub("o", &["*"], 1000.0, 1000, 4);
    s.ordering = Ordering::Key;
    s.ordering_key = Some("/k".into());
    add(&l[0], s).await;
    let events: Vec<NewEvent> = (1..=4)
        .flat_map(|i| {
            ["a", "b"].map(|k| NewEvent {
                id: format!("{k}{i}"),
                event_type: "t".into(),
                body: format!("{{\"k\":\"{k}\"}}"),
                traceparent: None,
            })
        })
        .collect();
    l[0].ingest(events, 0).await.unwrap();
    let turn = |now: i64| Turn {
        now_ms: now,
        claims: vec![("o".into(), 12)],
        batch_per: vec![("o".into(), 3)],
        runs: vec!["o".into()],
        lease_until_ms: now + LEASE,
        ..Turn::default()
    };
    let t0 = 1_000;
    let first = l[0]
        .record_turn(turn(t0))
        .await
        .map_err(|e| e.error)
        .unwrap()
        .claims
        .remove(0);
    let ids: Vec<&str> = first.claimed.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3", "b1", "b2", "b3"]);
    assert_eq!(first.runs, [3, 3]);
    let c = server.connect("runs").await;
    let open: i64 = c
        .query_one(
            "SELECT COUNT(*) FILTER (WHERE batch_lead IS NULL OR batch_lead = id)
             FROM deliveries WHERE status = 'in_flight'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 2, "two requests in flight");
    let other = l[1]
        .record_turn(turn(t0 + 1))
        .await
        .map_err(|e| e.error)
        .unwrap();
    assert!(
        other.claims.iter().all(|c| c.claimed.is_empty()),
        "each key's fourth is held behind its run: {:?}",
        other.claims
    );
    // Past the lease (15 s on PostgreSQL): daemon 1 takes the runs over, whole and in order.
    let later = t0 + 16_000;
    let taken = l[1]
        .record_turn(turn(later))
        .await
        .map_err(|e| e.error)
        .unwrap()
        .claims
        .remove(0);
    let ids: Vec<&str> = taken.claimed.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["a1", "a2", "a3", "b1", "b2", "b3"]);
    assert_eq!(taken.runs, [3, 3]);
}
