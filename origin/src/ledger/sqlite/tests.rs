//! The SQLite ledger's operations, tested together on one in-memory connection.

use super::*;
use crate::ledger::sqlite::ingest::ROWS_PER_INSERT;
use crate::ledger::{AttemptRecord, DeliveryFilter, NewEvent, Outcome, Transition};
use crate::model::Status;
use crate::model::Subscriber;

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
