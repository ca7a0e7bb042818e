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
            Effect::LaunchBatches { batches, .. } => Some(batches),
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
        let (batches, rest, got_next) = cut_batches(spec, per, claimed(sizes), Payload::Full, None);
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
            Effect::LaunchBatches { batches, .. } => {
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
