//! How the PostgreSQL ledger writes, against a throwaway server (tests/common/pg.rs): ingests
//! that wait share one transaction, a turn takes its locks in id order, a full disk is
//! unavailable, the trigger-kept counts follow every change, retention runs on one daemon at a
//! time, a race with a removal is buried. (`fanout ledger copy`: `origin/tests/pg_copy.rs`.)

use std::collections::{BTreeSet, HashMap};

use super::fixtures::{add, claim, ev, evs, ledgers, record, sent, sub, BREAKER, LEASE};
use super::pg::PgServer;
use crate::ledger::postgres::PgLedger;
use crate::ledger::{
    Deliveries, DispatchLedger, Ingested, LedgerError, NewEvent, Subscribers, Transition, Turn,
    Unavailable,
};
use fanout_core::limiter::LimiterState;

/// A PostgreSQL whose disk is full answers as a full SQLite ledger does: ingest fails as
/// `Unavailable::Full` (the API's 503 `unavailable`, not 500), nothing of the refused batch is
/// kept, a dispatcher turn is handed back whole, and ingest is accepted again once the disk
/// has room. The ledger's tables live in a tablespace on a 2 MiB tmpfs.
#[tokio::test]
async fn a_full_disk_is_unavailable_and_ingest_resumes_once_it_has_room() {
    assert!(
        super::pg::is_root(),
        "this test mounts a 2 MiB tmpfs, which needs root: run the tests as root (scripts/test.sh and CI do)"
    );
    let disk = super::pg::SmallDisk::mount(2);
    let server = PgServer::start();
    let c = server.connect("postgres").await;
    for sql in [
        format!(
            "CREATE TABLESPACE small LOCATION '{}'",
            disk.path().display()
        ),
        "CREATE DATABASE full_disk".into(),
        "ALTER DATABASE full_disk SET default_tablespace = small".into(),
    ] {
        c.batch_execute(&sql).await.unwrap();
    }
    let l = PgLedger::open(&server.url("full_disk"), "d1")
        .await
        .unwrap();
    add(&l, sub("a", &["*"], 1000.0, 1000, 100)).await;
    let body = "x".repeat(2000);
    let batch = |k: usize| -> Vec<NewEvent> {
        (0..100)
            .map(|i| NewEvent {
                body: body.clone(),
                ..ev(&format!("b{k}-{i}"), "t")
            })
            .collect()
    };
    let mut accepted = 0;
    let full = loop {
        assert!(accepted < 100, "2 MiB never filled up");
        match l.ingest(batch(accepted), 0).await {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(full, LedgerError::Unavailable(Unavailable::Full)),
        "{full:?}"
    );
    // `/healthz` reads this: the ledger cannot write, and a probe agrees.
    assert!(
        matches!(l.write_state().failing(), Some((Unavailable::Full, _))),
        "{:?}",
        l.write_state().failing()
    );
    assert!(matches!(
        l.probe_room().await,
        Err(LedgerError::Unavailable(Unavailable::Full))
    ));
    assert!(l.write_state().failing().is_some());
    let db = server.connect("full_disk").await;
    let kept: i64 = db
        .query_one("SELECT COUNT(*) FROM events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kept,
        accepted as i64 * 100,
        "only whole acknowledged batches are kept"
    );
    // A dispatcher's turn is handed back whole, with the same kind of error.
    let failed = l
        .record_turn(Turn {
            now_ms: 10,
            claims: vec![("a".into(), 100)],
            lease_until_ms: 10 + LEASE,
            ..Turn::default()
        })
        .await;
    if let Err(e) = &failed {
        assert!(
            matches!(e.error, LedgerError::Unavailable(_)),
            "{:?}",
            e.error
        );
    }
    disk.grow(64);
    // Writable again as soon as a probe finds room, before any producer tries.
    l.probe_room().await.unwrap();
    assert_eq!(l.write_state().failing(), None);
    l.ingest(batch(1000), 0).await.unwrap();
    drop(l);
    drop(server);
}

/// A dispatcher turn takes every subscriber row lock it needs at once, in id order: while
/// another transaction holds "a", a turn that stores "b"'s limiter and claims for "a" waits
/// holding nothing. (Taking "b" first and "a" later is how two daemons' turns deadlock.)
#[tokio::test]
async fn a_turn_takes_its_subscriber_locks_at_once_in_id_order() {
    let server = PgServer::start();
    let l = ledgers(&server, "turnlocks", 1).await.remove(0);
    for id in ["a", "b"] {
        add(&l, sub(id, &["*"], 1000.0, 1000, 100)).await;
    }
    l.ingest(evs("e", 4), 0).await.unwrap();
    let mut holder = server.connect("turnlocks").await;
    let hold = holder.transaction().await.unwrap();
    hold.execute("SELECT 1 FROM subscribers WHERE id = 'a' FOR UPDATE", &[])
        .await
        .unwrap();
    let turn = Turn {
        now_ms: 10,
        limiters: vec![("b".into(), LimiterState::default())],
        claims: vec![("a".into(), 2)],
        lease_until_ms: 10 + LEASE,
        ..Turn::default()
    };
    let ledger = l.clone();
    let running = tokio::spawn(async move { ledger.record_turn(turn).await.map_err(|e| e.error) });
    // Until the turn waits for a lock (bounded: 10 s).
    let probe = server.connect("turnlocks").await;
    for k in 0.. {
        let waiting: i64 = probe
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = 'turnlocks' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(k < 1_000, "the turn never waited for subscriber a");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let free = probe
        .query(
            "SELECT 1 FROM subscribers WHERE id = 'b' FOR UPDATE NOWAIT",
            &[],
        )
        .await;
    assert!(free.is_ok(), "the waiting turn holds b: {free:?}");
    hold.rollback().await.unwrap();
    let recorded = running.await.unwrap().unwrap();
    assert_eq!(recorded.claims.len(), 1);
    assert_eq!(recorded.claims[0].claimed.len(), 2);
}

#[tokio::test]
async fn ingests_that_wait_for_the_counters_share_one_transaction_and_fail_alone() {
    let server = PgServer::start();
    let db = "grouped";
    let l = ledgers(&server, db, 1).await.remove(0);
    add(&l, sub("a", &["*"], 1000.0, 1000, 100)).await;
    l.ingest(evs("w", 1), 0).await.unwrap();
    let probe = server.connect(db).await;
    let mut holder = server.connect(db).await;

    // Both of the daemon's ingest transactions blocked on subscriber a's counter; two more
    // calls queue behind them.
    let hold = holder.transaction().await.unwrap();
    hold.execute(
        "SELECT 1 FROM sequences WHERE subscriber_id = 'a' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let first = queued(&l, evs("first", 1));
    until_lock_waits(&probe, db, 1).await;
    let also = queued(&l, evs("also", 1));
    until_lock_waits(&probe, db, 2).await;
    let second = queued(&l, evs("g", 3));
    let third = queued(&l, vec![ev("g00001", "t"), ev("h", "t")]);
    hold.rollback().await.unwrap();
    let (first, second, third) = (
        first.await.unwrap(),
        second.await.unwrap(),
        third.await.unwrap(),
    );
    assert_eq!(first.0.len(), 1);
    assert_eq!(also.await.unwrap().0[0].deliveries, 1);
    assert_eq!(
        second.0.iter().map(|i| i.deliveries).collect::<Vec<_>>(),
        [1, 1, 1]
    );
    assert!(
        third.0[0].duplicate,
        "the earlier call stored g00001: {third:?}"
    );
    assert_eq!((third.0[1].deliveries, third.0[1].duplicate), (1, false));
    assert_eq!(third.1, ["a"], "each call hears who got work");
    let xmin = |id: &'static str| {
        let probe = &probe;
        async move {
            let row = probe
                .query_one(
                    "SELECT xmin::text FROM deliveries WHERE event_id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            row.get::<_, String>(0)
        }
    };
    let (x_first, x_also) = (xmin("first00000").await, xmin("also00000").await);
    let (x_g, x_h) = (xmin("g00002").await, xmin("h").await);
    assert_eq!(x_g, x_h, "the waiting calls were committed together");
    assert!(x_first != x_g && x_also != x_g && x_first != x_also);
    let numbers: Vec<i64> = probe
        .query("SELECT sequence FROM deliveries ORDER BY sequence", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        numbers,
        (1..=7).collect::<Vec<i64>>(),
        "gap-free across the group"
    );

    // A call PostgreSQL refuses (a NUL in text) queued with a good one: only it fails.
    let hold = holder.transaction().await.unwrap();
    hold.execute(
        "SELECT 1 FROM sequences WHERE subscriber_id = 'a' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let k = queued(&l, evs("k", 1));
    until_lock_waits(&probe, db, 1).await;
    let blocked = [k, queued(&l, evs("l", 1))];
    until_lock_waits(&probe, db, 2).await;
    let mut bad = ev("bad", "t");
    bad.body = "{\"x\":\"\u{0}\"}".into();
    let bad = queued(&l, vec![bad]);
    let good = queued(&l, evs("m", 2));
    hold.rollback().await.unwrap();
    for call in blocked {
        call.await.unwrap();
    }
    assert!(bad.await.is_err());
    let good = good.await.unwrap();
    assert_eq!(
        good.0.iter().map(|i| i.deliveries).collect::<Vec<_>>(),
        [1, 1]
    );
    let last: i64 = probe
        .query_one("SELECT MAX(sequence) FROM deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(last, 11, "the failed call took no number");
}

type Ingest = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(Vec<Ingested>, Vec<String>), LedgerError>>>,
>;

/// `l.ingest(events)`, polled once: queued (or started) before this returns.
fn queued(l: &PgLedger, events: Vec<NewEvent>) -> Ingest {
    let l = l.clone();
    let mut call: Ingest = Box::pin(async move { l.ingest(events, 0).await });
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(call.as_mut().poll(&mut cx).is_pending());
    call
}

/// Until `n` statements on `db` wait for a lock (bounded: 10 s).
async fn until_lock_waits(probe: &tokio_postgres::Client, db: &str, n: i64) {
    for k in 0.. {
        let waiting: i64 = probe
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(k < 1_000, "{waiting} of {n} ingests waited for the counter");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The counts the triggers keep follow every kind of change two daemons make (ingest, claims,
/// results of every kind, replays, lease take-overs, a removed subscriber, retention), before
/// and after a fold, and a fold leaves at most one row per subscriber and status.
#[tokio::test]
async fn kept_counts_follow_every_change_and_fold_to_one_row_per_status() {
    let server = PgServer::start();
    let l = ledgers(&server, "counts", 2).await;
    let c = server.connect("counts").await;
    let check = |what: &'static str| {
        let (l, c) = (l[0].clone(), &c);
        async move {
            assert_eq!(kept(&l, &["a", "b"]).await, counted(c).await, "{what}");
            let totals: BTreeSet<(String, i64)> =
                l.status_counts().await.unwrap().into_iter().collect();
            let mut want: HashMap<String, i64> = HashMap::new();
            for (_, s, n) in counted(c).await {
                *want.entry(s).or_default() += n;
            }
            assert_eq!(totals, want.into_iter().collect(), "{what}: per status");
        }
    };
    for id in ["a", "b"] {
        add(&l[0], sub(id, &["t"], 1e6, 1_000_000, 1_000)).await;
    }
    l[0].ingest(evs("e", 10), 0).await.unwrap();
    l[1].ingest(evs("e", 12), 1).await.unwrap(); // 10 duplicates, 2 new
    check("ingest").await;
    let ca = claim(&l[0], &[("a", 6)], 2, LEASE).await;
    let cb = claim(&l[1], &[("b", 5)], 2, LEASE).await;
    check("claims").await;
    let ida: Vec<i64> = ca[0].claimed.iter().map(|d| d.rowid).collect();
    let idb: Vec<i64> = cb[0].claimed.iter().map(|d| d.rowid).collect();
    let mut failed = sent(ida[1], 3);
    failed.transition = Transition::Retry {
        at_ms: 50,
        error: "status 500".into(),
    };
    if let Some(a) = failed.attempt.as_mut() {
        a.outcome = "failed";
        a.status = Some(500);
    }
    let mut dead = sent(ida[2], 3);
    dead.transition = Transition::Dead {
        reason: "410".into(),
    };
    record(&l[0], vec![sent(ida[0], 3), failed, dead], &[], 3).await;
    record(&l[1], vec![sent(idb[0], 3), sent(idb[1], 3)], &[], 3).await;
    check("results").await;
    // The last error comes from the error rows the attempts trigger appends.
    let ids = vec!["a".to_string(), "b".to_string()];
    let counts = l[0].subscriber_counts(&ids, 4).await.unwrap();
    assert_eq!(counts["a"].last_error, Some((3, "HTTP 500".into())));
    assert_eq!(counts["b"].last_error, None);
    assert_eq!(
        Deliveries::replay_one(&l[0], ida[2], 5, None)
            .await
            .unwrap(),
        "a"
    );
    check("replay").await;
    // Daemon 1's leases lapse; daemon 0 takes them over.
    l[0].release_expired_leases(2 + LEASE + 1).await.unwrap();
    check("lease take-over").await;
    assert!(l[0].fold_counts().await.unwrap());
    check("fold").await;
    let rows: i64 = c
        .query_one(
            "SELECT COUNT(*) FROM (SELECT 1 FROM delivery_counts
             GROUP BY subscriber_id, status HAVING COUNT(*) > 1) t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "one row per subscriber and status after a fold");
    assert_eq!(
        Subscribers::delete_subscriber(&l[0], "b".into(), 6)
            .await
            .unwrap(),
        10
    );
    check("removed subscriber").await;
    // Retention: b's dead deliveries (dead at 6) go with a dead window of 10 at 100.
    let store = crate::ledger::store::Store::Postgres(l[1].clone());
    let removed = crate::retention::pass(
        &store,
        &crate::retention::Retention {
            sent_ms: Some(10),
            dead_ms: Some(10),
        },
        100,
        &Default::default(),
        3,
    )
    .await
    .unwrap();
    assert_eq!(removed.deliveries, 13, "{removed:?}"); // 3 sent, 10 dead
    check("retention").await;
    l[1].fold_counts().await.unwrap();
    check("fold after retention").await;
}

/// What the deliveries table says, counted the slow way: (subscriber, status) -> n.
async fn counted(c: &tokio_postgres::Client) -> BTreeSet<(String, String, i64)> {
    c.query(
        "SELECT subscriber_id, status, COUNT(*) FROM deliveries GROUP BY subscriber_id, status",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// What the ledger's readers report from the counts the triggers keep, in the same shape.
async fn kept(l: &PgLedger, subs: &[&str]) -> BTreeSet<(String, String, i64)> {
    let ids: Vec<String> = subs.iter().map(|s| s.to_string()).collect();
    let mut out = BTreeSet::new();
    for (id, c) in l.subscriber_counts(&ids, 0).await.unwrap() {
        for (status, n) in [
            ("pending", c.pending),
            ("in_flight", c.in_flight),
            ("sent", c.sent),
            ("dead", c.dead),
        ] {
            if n != 0 {
                out.insert((id.clone(), status.to_string(), n));
            }
        }
    }
    // `/metrics`' figures agree with the per-subscriber ones.
    let stats = l.subscriber_stats(BREAKER, 0).await.unwrap();
    for s in stats {
        for (status, n) in [
            ("pending", s.pending),
            ("in_flight", s.in_flight),
            ("sent", s.sent),
            ("dead", s.dead),
        ] {
            assert_eq!(
                out.contains(&(s.id.clone(), status.to_string(), n)),
                n != 0,
                "{} {status} {n}",
                s.id
            );
        }
    }
    out
}

/// Retention purges on one daemon at a time: while another daemon holds the purge a pass
/// removes nothing and records no run, and two daemons' passes at once remove what is due
/// once, in steps, leaving the kept counts true. (What a pass removes and keeps, and its
/// report: `ledger_parity.rs`.)
#[tokio::test]
async fn retention_purges_on_one_daemon_at_a_time() {
    use crate::ledger::store::Store;
    use crate::retention::{pass, Retention, RetentionStats};
    let server = PgServer::start();
    let l = ledgers(&server, "ret", 2).await;
    let c = server.connect("ret").await;
    add(&l[0], sub("a", &["t"], 1e6, 1_000_000, 1_000)).await;
    l[0].ingest(evs("old", 6), 0).await.unwrap();
    let claimed = claim(&l[0], &[("a", 5)], 10, LEASE).await;
    let done: Vec<_> = claimed[0]
        .claimed
        .iter()
        .map(|d| sent(d.rowid, 20))
        .collect();
    record(&l[0], done, &[], 20).await;
    let retention = Retention {
        sent_ms: Some(1_000),
        dead_ms: Some(5_000),
    };
    let stores = [Store::Postgres(l[0].clone()), Store::Postgres(l[1].clone())];

    // Another daemon holds the purge: a pass removes nothing and records no run.
    let holder = server.connect("ret").await;
    let lock = &crate::ledger::postgres::retention::RETENTION_LOCK;
    holder
        .execute("SELECT pg_advisory_lock($1)", &[lock])
        .await
        .unwrap();
    let stats = RetentionStats::default();
    let none = pass(&stores[1], &retention, 10_000, &stats, 2)
        .await
        .unwrap();
    assert_eq!(none, Default::default());
    assert_eq!(
        crate::ledger::Retention::retention_report(&l[0])
            .await
            .unwrap()
            .last_run_at_ms,
        None
    );
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[lock])
        .await
        .unwrap();
    // Two daemons' passes at once, in steps of one: together they remove what is due, once.
    let both = tokio::join!(
        pass(&stores[0], &retention, 10_000, &stats, 1),
        pass(&stores[1], &retention, 10_000, &stats, 1)
    );
    let (x, y) = (both.0.unwrap(), both.1.unwrap());
    assert_eq!(x.deliveries + y.deliveries, 5, "{x:?} {y:?}");
    // The first step removes one: more than one step.
    assert!(stats.steps.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    let r = crate::ledger::Retention::retention_report(&l[1])
        .await
        .unwrap();
    assert_eq!((r.removed_sent, r.removed_dead), (5, 0));
    assert_eq!(r.last_run_at_ms, Some(10_000));
    assert_eq!(
        counted(&c).await,
        [("a".to_string(), "pending".to_string(), 1)]
            .into_iter()
            .collect()
    );
}

/// Found by the fault soak (seed 36): an ingest that read a subscriber as live before its
/// removal committed, and inserted its delivery after the removal had made the subscriber's
/// deliveries dead, left that delivery pending for good (no daemon claims for a removed
/// subscriber, and nothing else ends it). The next rescan (`due_work`) makes it dead as the
/// removal made the others.
#[tokio::test]
async fn a_delivery_an_ingest_left_for_a_removed_subscriber_goes_dead_at_the_next_rescan() {
    let server = PgServer::start();
    let l = ledgers(&server, "bury", 1).await;
    add(&l[0], sub("gone", &["*"], 10.0, 20, 8)).await;
    add(&l[0], sub("kept", &["*"], 10.0, 20, 8)).await;
    l[0].ingest(vec![ev("before", "t")], 1).await.unwrap();
    let now = crate::time::now_ms();
    assert_eq!(
        Subscribers::delete_subscriber(&l[0], "gone".into(), now)
            .await
            .unwrap(),
        1
    );
    // What the race leaves: the ingest's delivery for the removed subscriber, committed after
    // the removal (its statement could see neither the removal nor be seen by it).
    let c = server.connect("bury").await;
    c.batch_execute(
        "INSERT INTO events (id, type, body, received_ms) VALUES ('late', 't', '{}', 3);
         INSERT INTO deliveries (subscriber_id, event_id, status, next_attempt_ms, created_ms,
             updated_ms, sequence)
         VALUES ('gone', 'late', 'pending', 3, 3, 3, 2), ('kept', 'late', 'pending', 3, 3, 3, 2);",
    )
    .await
    .unwrap();
    let statuses = || async {
        c.query(
            "SELECT subscriber_id, event_id, status FROM deliveries ORDER BY subscriber_id, event_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1), r.get::<_, String>(2)))
        .collect::<Vec<_>>()
    };
    let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    DispatchLedger::due_work(&l[0], 5).await.unwrap();
    assert_eq!(
        statuses().await,
        [
            s("gone", "before", "dead"),
            s("gone", "late", "dead"),
            s("kept", "before", "pending"),
            s("kept", "late", "pending"),
        ],
        "only the removed subscriber's deliveries end"
    );
    let (_, error): (i64, Option<String>) = c
        .query_one(
            "SELECT id, last_error FROM deliveries WHERE event_id = 'late' AND subscriber_id = 'gone'",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(error.as_deref(), Some("subscriber removed"));
}
