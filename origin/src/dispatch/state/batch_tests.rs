//! Batching subscribers in the state (`fanout_core::batch`): a batch is one request against
//! the cap and the rate, and a claim is cut into requests by `max_bytes`.

use fanout_core::limiter::LimiterState;

use super::tests::{delivered, on, settings, subscriber, Queue};
use super::*;
use crate::dispatch::vocab::Meta;
use crate::model::{Claimed, Transition};

/// A batching subscriber: its claim asks `max_events` deliveries per request its limiter
/// grants, each request is one slot of its in-flight cap and one token, and its result (one
/// per event) frees that one slot once.
#[test]
fn a_batch_is_one_request_against_the_cap_and_the_rate() {
    use fanout_core::batch::BatchSpec;
    let mut state = State::new(settings(100));
    let mut s = subscriber("b", 2);
    s.limits.rate_per_sec = 1.0;
    s.limits.burst = 2;
    s.batch = Some(BatchSpec {
        max_events: 10,
        max_bytes: 1_048_576,
        max_wait_ms: 0,
    });
    on(
        &mut state,
        Event::Loaded(vec![(s, LimiterState::default())]),
        0,
    );
    let mut q = Queue::with(&[("b", 45)]);
    let Some(Effect::Record(turn)) = on(&mut state, Event::Tick, 1).into_iter().next() else {
        panic!("a tick records a turn");
    };
    // Two requests (its cap and its burst), ten deliveries each.
    assert_eq!(turn.claims, [("b".to_string(), 20)]);
    assert_eq!(turn.batch_per, [("b".to_string(), 10)]);
    let effects = on(&mut state, Event::Recorded(q.answer(&turn)), 1);
    let batches: Vec<Vec<Claimed>> = effects
        .into_iter()
        .find_map(|e| match e {
            Effect::Launch { sends: batches, .. } => Some(batches),
            _ => None,
        })
        .expect("a batch launch");
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10]);
    assert_eq!(state.in_flight_of("b"), 2);
    assert_eq!(state.in_flight(), 2);
    // Nothing more while both requests are out: the cap counts requests.
    let effects = on(&mut state, Event::Tick, 2);
    assert!(
        effects
            .iter()
            .all(|e| !matches!(e, Effect::Record(t) if !t.asks().is_empty())),
        "{effects:?}"
    );
    // One request's results, one per event, free one slot; a second report frees nothing.
    let metas: Vec<Meta> = batches[0].iter().map(Meta::of).collect();
    on(&mut state, delivered("b", &metas, 3), 3);
    assert_eq!(state.in_flight_of("b"), 1);
    on(&mut state, delivered("b", &metas, 3), 3);
    assert_eq!(state.in_flight_of("b"), 1);
    // Its burst is spent (two tokens, two requests): the next request waits for a token.
    let limiter = state.limiter_of("b").expect("known");
    assert!(
        limiter.bucket.is_some_and(|b| b.tokens < 1.0),
        "{limiter:?}"
    );
}

/// A claim cut into requests: groups of `per` in order, each sent up to what fits `max_bytes`,
/// the rest handed back; the next claim asks what fitted.
#[test]
fn cut_batches_table() {
    use super::claims::cut_batches;
    use crate::payload::Payload;
    use fanout_core::batch::BatchSpec;
    let claimed = |sizes: &[usize]| -> Vec<Claimed> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Claimed {
                rowid: i as i64 + 1,
                event_id: format!("e{i}"),
                event_type: "t".into(),
                body: "x".repeat(n),
                attempt: 1,
                sequence: 0,
                received_ms: 0,
                order: None,
                traceparent: None,
            })
            .collect()
    };
    let spec = |max_events, max_bytes| BatchSpec {
        max_events,
        max_bytes,
        max_wait_ms: 0,
    };
    // (spec, per, sizes) -> (request sizes, handed back, next per)
    type Case<'a> = (BatchSpec, usize, &'a [usize], &'a [usize], usize, usize);
    let cases: &[Case] = &[
        (spec(4, 1 << 20), 4, &[10; 9], &[4, 4, 1], 0, 4),
        // A full group that fit: ask more next time, up to max_events.
        (spec(8, 1 << 20), 4, &[10; 8], &[4, 4], 0, 8),
        // 13 + 100 + 1 + 100 = 214 fits 250, a third does not: two of each group of four go.
        (spec(8, 250), 4, &[100; 8], &[2, 2], 4, 2),
        // One event larger than max_bytes goes alone; the group's rest comes back.
        (spec(8, 250), 3, &[500, 10, 10], &[1], 2, 1),
    ];
    for &(spec, per, sizes, want, back, next) in cases {
        let groups = super::claims::groups(sizes.len(), per, &[]);
        let (batches, rest, got_next) =
            cut_batches(spec, per, &groups, claimed(sizes), Payload::Full, None);
        let lens: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(
            (lens.as_slice(), rest.len(), got_next),
            (want, back, next),
            "{spec:?} {per} {sizes:?}"
        );
        // Order is kept: requests, then what came back, are the claim's rows in order.
        let mut rows: Vec<i64> = batches.iter().flatten().map(|d| d.rowid).collect();
        rows.extend(rest.iter().map(|d| d.rowid));
        rows.sort_unstable();
        assert_eq!(rows, (1..=sizes.len() as i64).collect::<Vec<_>>());
    }
}

/// An edge call of a batching subscriber that the edge refuses (a 4xx no retry can change) is
/// each event's failed attempt, retried with backoff: not split and sent again at once (its
/// batches are cut again at the next try), which would loop.
#[test]
fn a_refused_edge_call_of_batches_counts_attempts() {
    use crate::dispatch::vocab::{EdgeFailure, Lane};
    use fanout_core::batch::BatchSpec;
    let mut state = State::new(Settings {
        edge: true,
        ..settings(100)
    });
    let mut s = subscriber("b", 4);
    s.lane = Lane::Edge;
    s.batch = Some(BatchSpec {
        max_events: 5,
        max_bytes: 1_048_576,
        max_wait_ms: 0,
    });
    on(
        &mut state,
        Event::Loaded(vec![(s, LimiterState::default())]),
        0,
    );
    let mut q = Queue::with(&[("b", 10)]);
    let Some(Effect::Record(turn)) = on(&mut state, Event::Tick, 1).into_iter().next() else {
        panic!("a tick records a turn");
    };
    let metas: Vec<Meta> = on(&mut state, Event::Recorded(q.answer(&turn)), 1)
        .into_iter()
        .find_map(|e| match e {
            Effect::Launch { sends: batches, .. } => {
                Some(batches.iter().flatten().map(Meta::of).collect())
            }
            _ => None,
        })
        .expect("a batch launch");
    assert_eq!(metas.len(), 10);
    let refused = EdgeFailure::Refused {
        status: 400,
        error: "invalid_request: unknown field `batch`".into(),
    };
    on(
        &mut state,
        Event::EdgeFailed {
            sub: Arc::from("b"),
            items: metas,
            failure: refused,
        },
        5,
    );
    assert_eq!(state.in_flight_of("b"), 0, "both requests' slots back");
    let Some(Effect::Record(turn)) = on(&mut state, Event::Flush, 5).into_iter().next() else {
        panic!("the outcomes are recorded");
    };
    assert_eq!(turn.outcomes.len(), 10);
    for o in &turn.outcomes {
        assert!(
            matches!(&o.transition, Transition::Retry { at_ms, .. } if *at_ms > 5),
            "{o:?}"
        );
    }
}

/// An ordered delivery of key `key`, numbered `rowid`, with a body of `size` bytes.
fn keyed(rowid: i64, key: &str, size: usize) -> Claimed {
    Claimed {
        rowid,
        event_id: format!("e{rowid}"),
        event_type: "t".into(),
        body: "x".repeat(size),
        attempt: 1,
        sequence: rowid as u64,
        received_ms: 0,
        order: Some(crate::model::Order {
            key: key.into(),
            previous: (rowid > 1).then_some(rowid as u64 - 1),
        }),
        traceparent: None,
    }
}

/// Results of subscriber `sub`'s deliveries `rowids` (key "a"): a 2xx for those `ok`, a 503
/// for the others.
fn answered(sub: &str, rowids: &[(i64, bool)], at: i64) -> Event {
    use crate::dispatch::vocab::{Attempted, Lane};
    use fanout_core::wire::DeliveryResult;
    let items = rowids
        .iter()
        .map(|&(rowid, ok)| {
            let result = if ok {
                DeliveryResult::Delivered {
                    id: "d".into(),
                    status: 200,
                    latency_ms: 1,
                    failed: vec![],
                }
            } else {
                DeliveryResult::Failed {
                    id: "d".into(),
                    status: Some(503),
                    retry_after_ms: None,
                    response_body: None,
                    error: None,
                    latency_ms: Some(1),
                }
            };
            (Meta::of(&keyed(rowid, "a", 1)), Attempted::reported(result))
        })
        .collect();
    Event::Results {
        sub: Arc::from(sub),
        lane: Lane::Origin,
        items,
        at_ms: at,
    }
}

/// Each outcome of a turn: its row and the due time it leaves (`None`: sent or dead).
fn waits_of(turn: &crate::dispatch::vocab::Turn) -> Vec<(i64, Option<i64>)> {
    turn.outcomes
        .iter()
        .map(|o| {
            let at = match &o.transition {
                Transition::Retry { at_ms, .. } | Transition::Defer { at_ms } => Some(*at_ms),
                _ => None,
            };
            (o.rowid, at)
        })
        .collect()
}

/// An ordered batching subscriber: its turn asks runs (`Turn::runs`), the ledger's runs are
/// its requests (one slot each), and a request's results leave its key one head — the first
/// delivery that waits keeps its retry, every later one that waits is held behind it. What a
/// request could not fit (`max_bytes`) goes back held, not due.
#[test]
fn an_ordered_batch_is_a_run_of_one_key_and_keeps_one_head() {
    use crate::ordering::{Ordering, HELD_MS};
    use fanout_core::batch::BatchSpec;
    let mut state = State::new(settings(100));
    let mut s = subscriber("o", 2);
    s.ordering = Ordering::Key;
    s.ordering_key = Some("/k".into());
    s.batch = Some(BatchSpec {
        max_events: 3,
        max_bytes: 200,
        max_wait_ms: 0,
    });
    on(
        &mut state,
        Event::Loaded(vec![(s, LimiterState::default())]),
        0,
    );
    let Some(Effect::Record(turn)) = on(&mut state, Event::Tick, 1).into_iter().next() else {
        panic!("a tick records a turn");
    };
    assert_eq!(turn.claims, [("o".to_string(), 6)]);
    assert_eq!(turn.batch_per, [("o".to_string(), 3)]);
    assert_eq!(turn.runs, ["o".to_string()]);
    // Two runs: key "a" three deliveries (the third does not fit 200 bytes), key "b" two.
    let claim = crate::model::Claim {
        subscriber_id: "o".into(),
        claimed: vec![
            keyed(1, "a", 40),
            keyed(2, "a", 40),
            keyed(3, "a", 150),
            keyed(4, "b", 40),
            keyed(5, "b", 40),
        ],
        next_due_ms: None,
        not_before_ms: None,
        runs: vec![3, 2],
    };
    let recorded = |claims| {
        Event::Recorded(crate::dispatch::vocab::Recorded {
            claims,
            notices: vec![],
            due: vec![],
        })
    };
    let batches: Vec<Vec<i64>> = on(&mut state, recorded(vec![claim]), 1)
        .into_iter()
        .find_map(|e| match e {
            Effect::Launch { sends: batches, .. } => Some(
                batches
                    .iter()
                    .map(|b| b.iter().map(|d| d.rowid).collect())
                    .collect(),
            ),
            _ => None,
        })
        .expect("a batch launch");
    assert_eq!(batches, [vec![1, 2], vec![4, 5]]);
    assert_eq!(state.in_flight_of("o"), 2);
    // Key "a"'s request fails whole; the one that did not fit came back held.
    on(&mut state, answered("o", &[(1, false), (2, false)], 5), 5);
    assert_eq!(state.in_flight_of("o"), 1, "one request's slot back");
    let Some(Effect::Record(turn)) = on(&mut state, Event::Flush, 5).into_iter().next() else {
        panic!("the outcomes are recorded");
    };
    let waits = waits_of(&turn);
    assert_eq!(waits.len(), 3, "{waits:?}");
    assert_eq!(waits[0], (3, Some(HELD_MS)), "what did not fit is held");
    assert_eq!(waits[1].0, 1);
    assert!(
        waits[1].1.is_some_and(|at| at > 5 && at < HELD_MS),
        "the first failed keeps its retry: {waits:?}"
    );
    assert_eq!(
        waits[2],
        (2, Some(HELD_MS)),
        "a later failed is held behind it"
    );
    on(&mut state, recorded(vec![]), 5);
    // Key "b"'s request: its first sent, its second failed: that one is the head.
    on(&mut state, answered("o", &[(4, true), (5, false)], 6), 6);
    assert_eq!(state.in_flight_of("o"), 0);
    assert_eq!(state.runs.len(), 0, "every run's results are in");
    let Some(Effect::Record(turn)) = on(&mut state, Event::Flush, 7).into_iter().next() else {
        panic!("the outcomes are recorded");
    };
    let waits = waits_of(&turn);
    assert_eq!(waits[0], (4, None), "{waits:?}");
    assert!(
        waits[1].1.is_some_and(|at| at > 6 && at < HELD_MS),
        "{waits:?}"
    );
}
