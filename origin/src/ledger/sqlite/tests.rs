//! The SQLite ledger's operations, tested together on one in-memory connection.

use super::*;
use crate::ledger::sqlite::ingest::ROWS_PER_INSERT;
use crate::ledger::Ingested;
use crate::ledger::{AttemptRecord, DeliveryFilter, LedgerError, NewEvent, Outcome, Transition};
use crate::model::Subscriber;
use crate::model::{Status, MIN_ROTATION_INTERVAL_MS};
use rusqlite::Connection;

use crate::ledger::sqlite::test_db as db;

fn sub(id: &str, types: &[&str]) -> Subscriber {
    crate::ledger::test_subscriber(id, types)
}

fn ev(id: &str, ty: &str) -> NewEvent {
    NewEvent {
        id: id.into(),
        event_type: ty.into(),
        body: format!("{{\"id\":\"{id}\"}}"),
        traceparent: None,
    }
}

/// A customer's list, its count and a replay step cost what the customer's own deliveries
/// do (a portal token's scope): the same SQLite VM steps whether another subscriber has
/// 1,000 or 10,000 deliveries in the same status, created before the customer's.
#[test]
fn a_customers_lists_cost_its_own_deliveries_not_the_ledgers() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let steps = |others: usize| -> u64 {
        let mut c = db();
        c.execute(
            "INSERT INTO customers (id, weight, portal_nonce, created_ms, updated_ms)
                 VALUES ('acme', 1, 'n', 0, 0)",
            [],
        )
        .unwrap();
        create_subscriber(&c, &sub("big", &["big.*"]), "s").unwrap();
        let mut mine = sub("mine", &["mine.*"]);
        mine.customer = Some("acme".into());
        create_subscriber(&c, &mine, "s").unwrap();
        let big: Vec<NewEvent> = (0..others).map(|i| ev(&format!("b{i}"), "big.x")).collect();
        ingest(&c, &big, 1).unwrap();
        let own: Vec<NewEvent> = (0..3).map(|i| ev(&format!("m{i}"), "mine.x")).collect();
        ingest(&c, &own, 2).unwrap();
        c.execute("UPDATE deliveries SET status = 'dead'", [])
            .unwrap();
        let counted = Arc::new(AtomicU64::new(0));
        let counter = counted.clone();
        c.progress_handler(
            1,
            Some(move || {
                counter.fetch_add(1, Ordering::Relaxed);
                false
            }),
        )
        .unwrap();
        let scoped = DeliveryFilter {
            customer: Some("acme".into()),
            limit: 10,
            ..Default::default()
        };
        let dead = DeliveryFilter {
            status: Some(Status::Dead),
            ..scoped.clone()
        };
        assert_eq!(list_deliveries(&c, &dead).unwrap().len(), 3);
        assert_eq!(list_deliveries(&c, &scoped).unwrap().len(), 3);
        assert_eq!(count_replayable(&c, &dead).unwrap(), 3);
        assert_eq!(replay_step(&c, &dead, 3).unwrap().replayed, 3);
        c.progress_handler(0, None::<fn() -> bool>).unwrap();
        counted.load(Ordering::Relaxed)
    };
    let (small, large) = (steps(1_000), steps(10_000));
    assert!(
        large <= small + small / 10,
        "{small} VM steps, then {large}"
    );
}

/// Rotations: the first at once, then at most one per `MIN_ROTATION_INTERVAL_MS`; however
/// many, two secrets sign (the current one and the one it replaced) and two are stored.
#[test]
fn rotations_keep_two_secrets_and_wait_their_interval() {
    let c = db();
    create_subscriber(&c, &sub("a", &["*"]), "s0").unwrap();
    let stored = |c: &Connection| -> i64 {
        c.query_row(
            "SELECT COUNT(*) FROM subscriber_secrets WHERE subscriber_id = 'a'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let day = 86_400_000;
    rotate_secret(&c, "a", "s1", 10, day).unwrap();
    match rotate_secret(&c, "a", "x", 10 + 30_000, day) {
        Err(LedgerError::TooSoon { retry_after_ms, .. }) => {
            assert_eq!(retry_after_ms, MIN_ROTATION_INTERVAL_MS - 30_000)
        }
        other => panic!("{other:?}"),
    }
    let mut t = 10;
    for k in 2..300 {
        t += MIN_ROTATION_INTERVAL_MS;
        rotate_secret(&c, "a", &format!("s{k}"), t, day).unwrap();
    }
    let s = get_subscriber(&c, "a").unwrap();
    assert_eq!(
        s.active_secrets(t),
        vec!["s299".to_string(), "s298".to_string()]
    );
    assert_eq!(stored(&c), 2);
}

#[test]
fn ingest_fans_out_once_per_subscriber_and_event() {
    let c = db();
    create_subscriber(&c, &sub("a", &["video.*"]), "s").unwrap();
    create_subscriber(&c, &sub("b", &["video.trending"]), "s").unwrap();
    create_subscriber(&c, &sub("c", &["audio.*"]), "s").unwrap();
    let (out, touched) = ingest(
        &c,
        &[
            ev("e1", "video.trending"),
            ev("e2", "video.new"),
            ev("e1", "video.trending"),
        ],
        5,
    )
    .unwrap();
    let got: Vec<(u32, bool)> = out.iter().map(|o| (o.deliveries, o.duplicate)).collect();
    assert_eq!(got, vec![(2, false), (1, false), (0, true)]);
    assert_eq!(touched, vec!["a".to_string(), "b".to_string()]);
    let (again, _) = ingest(&c, &[ev("e2", "video.new")], 6).unwrap();
    assert_eq!(
        again[0],
        Ingested {
            id: "e2".into(),
            deliveries: 0,
            duplicate: true,
            different_body: false,
        }
    );
    // The id reused for another body: a duplicate that says so, stored body unchanged.
    let mut other = ev("e2", "video.new");
    other.body = r#"{"id":"e2","other":true}"#.into();
    let (reused, touched) = ingest(&c, &[other.clone(), other], 7).unwrap();
    let got: Vec<(u32, bool, bool)> = reused
        .iter()
        .map(|o| (o.deliveries, o.duplicate, o.different_body))
        .collect();
    assert_eq!(got, vec![(0, true, true), (0, true, true)]);
    assert!(touched.is_empty());
    let body: String = c
        .query_row("SELECT body FROM events WHERE id = 'e2'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(body, r#"{"id":"e2"}"#);
}

#[test]
fn claim_apply_and_lease_release() {
    let c = db();
    create_subscriber(&c, &sub("a", &["*"]), "s").unwrap();
    ingest(&c, &[ev("e1", "t"), ev("e2", "t"), ev("e3", "t")], 0).unwrap();
    let claims = claim(&c, &[("a".into(), 2)], &[], 10, 1000).unwrap();
    assert_eq!(claims[0].claimed.len(), 2);
    assert_eq!(claims[0].next_due_ms, Some(0));
    let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
    let rec = |outcome| {
        Some(AttemptRecord {
            attempt: 1,
            at_ms: 10,
            lane: "origin",
            outcome,
            status: Some(500),
            latency_ms: Some(3),
            response_body: None,
            error: None,
        })
    };
    apply(
        &c,
        &[
            Outcome {
                rowid: ids[0],
                transition: Transition::Sent,
                attempt: rec("delivered"),
            },
            Outcome {
                rowid: ids[1],
                transition: Transition::Retry {
                    at_ms: 50,
                    error: "status 500".into(),
                },
                attempt: rec("failed"),
            },
        ],
        &[],
        20,
    )
    .unwrap();
    let d0 = get_delivery(&c, ids[0]).unwrap();
    assert_eq!(
        (
            d0.status.as_str(),
            d0.attempt_count,
            d0.attempts.map(|a| a.len())
        ),
        ("sent", 1, Some(1))
    );
    let d1 = get_delivery(&c, ids[1]).unwrap();
    assert_eq!(
        (d1.status.as_str(), d1.next_attempt_at_ms),
        ("pending", Some(50))
    );
    // The third is leased and then lost: it comes back once its lease expires.
    let claims = claim(&c, &[("a".into(), 5)], &[], 20, 100).unwrap();
    assert_eq!(claims[0].claimed.len(), 1);
    assert_eq!(claims[0].next_due_ms, Some(50));
    assert!(release_expired_leases(&c, 99).unwrap().is_empty());
    assert_eq!(
        release_expired_leases(&c, 101).unwrap(),
        vec!["a".to_string()]
    );
    assert_eq!(release_all_leases(&c, 200).unwrap(), 0);
    assert_eq!(due_summary(&c).unwrap(), vec![("a".to_string(), 50)]);
}

/// The leases a dispatcher does not know of (`release_strays`) go back due now, those it
/// holds stay leased (on SQLite a failed turn wrote nothing, so this is the same rule as on
/// PostgreSQL, where a turn can be written though its answer was lost).
#[test]
fn leases_but_those_held_are_released_as_strays() {
    use crate::ledger::sqlite::leases::release_strays;
    let c = db();
    create_subscriber(&c, &sub("a", &["*"]), "s").unwrap();
    ingest(&c, &[ev("e1", "t"), ev("e2", "t"), ev("e3", "t")], 0).unwrap();
    let claims = claim(&c, &[("a".into(), 3)], &[], 0, 1_000).unwrap();
    let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(release_strays(&c, &ids, 10).unwrap(), Vec::<String>::new());
    assert_eq!(
        release_strays(&c, &ids[..1], 10).unwrap(),
        vec!["a".to_string()]
    );
    let status = |id| {
        let d = get_delivery(&c, id).unwrap();
        (d.status.as_str().to_string(), d.next_attempt_at_ms)
    };
    assert_eq!(status(ids[0]).0, "in_flight");
    assert_eq!(status(ids[1]), ("pending".to_string(), Some(10)));
    assert_eq!(status(ids[2]), ("pending".to_string(), Some(10)));
}

#[test]
fn replay_and_removal() {
    let c = db();
    create_subscriber(&c, &sub("a", &["*"]), "s").unwrap();
    ingest(&c, &[ev("e1", "t"), ev("e2", "t")], 0).unwrap();
    let claims = claim(&c, &[("a".into(), 2)], &[], 0, 100).unwrap();
    let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
    assert!(matches!(
        replay_one(&c, ids[0], 1),
        Err(LedgerError::Conflict(_))
    ));
    let dead = |id| Outcome {
        rowid: id,
        transition: Transition::Dead {
            reason: "gone".into(),
        },
        attempt: None,
    };
    apply(&c, &[dead(ids[0]), dead(ids[1])], &[], 5).unwrap();
    let f = DeliveryFilter {
        status: Some(Status::Dead),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(list_deliveries(&c, &f).unwrap().len(), 2);
    assert_eq!(replay_one(&c, ids[0], 6).unwrap(), "a");
    assert_eq!(
        replay_step(
            &c,
            &DeliveryFilter {
                subscriber: Some("a".into()),
                limit: 100,
                ..Default::default()
            },
            7
        )
        .unwrap()
        .replayed,
        1
    );
    assert_eq!(list_deliveries(&c, &f).unwrap().len(), 0);
    assert_eq!(delete_subscriber(&c, "a", 8).unwrap(), 2);
    assert!(matches!(
        replay_one(&c, ids[0], 9),
        Err(LedgerError::Conflict(_))
    ));
    assert!(get_subscriber(&c, "a").is_err());
    create_subscriber(&c, &sub("a", &["*"]), "s2").unwrap();
    assert_eq!(get_subscriber(&c, "a").unwrap().secrets.len(), 1);
}

/// Multi-row statements: more events and attempts than one chunk holds, a repeat across
/// chunks, mixed types and outcomes — the same rows as one statement per row.
#[test]
fn large_batches_span_chunks_in_order() {
    let c = db();
    create_subscriber(&c, &sub("a", &["video.*"]), "s").unwrap();
    create_subscriber(&c, &sub("b", &["*"]), "s").unwrap();
    let n = ROWS_PER_INSERT * 2 + 7;
    let mut evs: Vec<NewEvent> = (0..n)
        .map(|i| {
            ev(
                &format!("e{i:03}"),
                if i % 3 == 0 { "audio.x" } else { "video.x" },
            )
        })
        .collect();
    evs.push(ev("e000", "video.x")); // a repeat, in another chunk
    let (out, touched) = ingest(&c, &evs, 1).unwrap();
    assert_eq!(touched, vec!["a".to_string(), "b".to_string()]);
    for (i, o) in out.iter().enumerate().take(n) {
        let want = if i % 3 == 0 { 1 } else { 2 };
        assert_eq!((o.deliveries, o.duplicate), (want, false), "{}", o.id);
    }
    assert_eq!((out[n].deliveries, out[n].duplicate), (0, true));
    let body: String = c
        .query_row("SELECT type FROM events WHERE id = 'e000'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(body, "audio.x", "the first occurrence is the one stored");

    let claims = claim(&c, &[("b".into(), n)], &[], 5, 1000).unwrap();
    let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
    assert_eq!(ids.len(), n);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first");
    let in_flight: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM deliveries WHERE subscriber_id = 'b' AND status = 'in_flight'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(in_flight, n as i64);
    let rec = |k: usize| AttemptRecord {
        attempt: 1,
        at_ms: 10 + k as i64,
        lane: "origin",
        outcome: "delivered",
        status: Some(200),
        latency_ms: Some(k as u64),
        response_body: Some(format!("r{k}")),
        error: None,
    };
    // Runs of Sent broken by a retry and a deferral (which records no attempt).
    let outcomes: Vec<Outcome> = ids
        .iter()
        .enumerate()
        .map(|(k, &rowid)| Outcome {
            rowid,
            transition: match k {
                3 => Transition::Retry {
                    at_ms: 99,
                    error: "status 500".into(),
                },
                4 => Transition::Defer { at_ms: 77 },
                _ => Transition::Sent,
            },
            attempt: (k != 4).then(|| rec(k)),
        })
        .collect();
    apply(&c, &outcomes, &[], 20).unwrap();
    let counts: Vec<(String, i64)> = status_counts(&c).unwrap();
    let count = |s: &str| counts.iter().find(|(k, _)| k == s).map_or(0, |(_, n)| *n);
    assert_eq!(count("sent"), n as i64 - 2);
    assert_eq!(count("in_flight"), 0);
    let d3 = get_delivery(&c, ids[3]).unwrap();
    assert_eq!(
        (d3.status.as_str(), d3.next_attempt_at_ms),
        ("pending", Some(99))
    );
    let d4 = get_delivery(&c, ids[4]).unwrap();
    assert_eq!((d4.attempt_count, d4.next_attempt_at_ms), (0, Some(77)));
    // Every attempt recorded once, in outcome order, with its own values.
    let recorded: Vec<(i64, i64, String)> = c
        .prepare("SELECT delivery_id, latency_ms, response_body FROM attempts ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let expected: Vec<(i64, i64, String)> = ids
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != 4)
        .map(|(k, &id)| (id, k as i64, format!("r{k}")))
        .collect();
    assert_eq!(recorded, expected);
}

/// The `traceparent` an event arrived with comes back with each claim of its deliveries;
/// none stays none.
#[test]
fn an_events_traceparent_comes_back_with_its_claims() {
    let c = db();
    create_subscriber(&c, &sub("a", &["*"]), "s").unwrap();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = NewEvent {
        traceparent: Some(tp.into()),
        ..ev("e1", "t")
    };
    ingest(&c, &[traced, ev("e2", "t")], 0).unwrap();
    let claims = claim(&c, &[("a".into(), 5)], &[], 10, 1000).unwrap();
    let got: Vec<(&str, Option<&str>)> = claims[0]
        .claimed
        .iter()
        .map(|d| (d.event_id.as_str(), d.traceparent.as_deref()))
        .collect();
    assert_eq!(got, [("e1", Some(tp)), ("e2", None)]);
}

/// An ordered batching subscriber's claim in runs (`claim_runs`): each due head leased with
/// up to `per - 1` of its key's held deliveries, in sequence order; leases that expire give
/// each key back one head (its lowest number), the rest held; unordered leases come back due.
#[test]
fn runs_of_one_key_are_leased_together_and_come_back_with_one_head() {
    use crate::ledger::sqlite::leases::{claim_runs, release_expired_leases};
    use crate::ordering::{Ordering as Order, HELD_MS};
    use std::collections::HashMap;
    let c = db();
    let mut s = sub("o", &["o.*"]);
    s.ordering = Order::Key;
    s.ordering_key = Some("/k".into());
    create_subscriber(&c, &s, "s").unwrap();
    // Keys a, b interleaved, four each: a1 b1 a2 b2 …
    let events: Vec<NewEvent> = (1..=4)
        .flat_map(|i| {
            ["a", "b"].map(|k| NewEvent {
                id: format!("{k}{i}"),
                event_type: "o.x".into(),
                body: format!("{{\"k\":\"{k}\"}}"),
                traceparent: None,
            })
        })
        .collect();
    ingest(&c, &events, 1).unwrap();
    let runs: HashMap<&str, usize> = [("o", 3)].into();
    let claimed = |now: i64| {
        let claim = claim_runs(&c, &[("o".into(), 6)], &runs, &[], now, now + 100)
            .unwrap()
            .remove(0);
        let ids: Vec<String> = claim.claimed.iter().map(|d| d.event_id.clone()).collect();
        (ids, claim.runs)
    };
    let runs_of_three = (
        ["a1", "a2", "a3", "b1", "b2", "b3"]
            .map(String::from)
            .to_vec(),
        vec![3, 3],
    );
    assert_eq!(claimed(10), runs_of_three);
    // Nothing more is due: the fourth of each key is held behind its run.
    assert_eq!(claimed(11).0, Vec::<String>::new());
    // The leases expire: each key's lowest number is its head again, due; the rest held.
    release_expired_leases(&c, 200).unwrap();
    let due: Vec<(String, i64)> = c
        .prepare("SELECT event_id, next_attempt_ms FROM deliveries ORDER BY sequence")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (id, at) in &due {
        let head = id == "a1" || id == "b1";
        assert_eq!(*at, if head { 200 } else { HELD_MS }, "{id}");
    }
    assert_eq!(claimed(300), runs_of_three);
}
