//! The state machine's scenarios on the edge lane: the edge's breaker waits, refused calls
//! split until the culprit is alone, calls per grant.

use std::sync::Arc;

use fanout_core::limiter::LimiterState;
use fanout_core::wire::{DeferReason, DeliveryResult};

use super::tests::{delivered, on, settings, subscriber, Queue};
use super::*;
use crate::dispatch::vocab::{Attempted, EdgeFailure, Lane, Meta, Recorded};
use crate::model::{Claim, Claimed, Outcome, Transition};

fn edge_settings() -> Settings {
    Settings {
        edge: true,
        edge_batch: 8,
        ..settings(100)
    }
}

fn edge_failed(sub: &str, metas: &[Meta], failure: EdgeFailure) -> Event {
    Event::EdgeFailed {
        sub: Arc::from(sub),
        items: metas.to_vec(),
        failure,
    }
}

/// Launch a's due work on the edge lane and the call sizes asked for.
fn edge_tick(state: &mut State, q: &mut Queue, now: i64) -> (Vec<Meta>, usize) {
    let mut metas = Vec::new();
    let mut per = 0;
    for effect in on(state, Event::Tick, now) {
        let Effect::Record(turn) = effect else {
            continue;
        };
        for e in on(state, Event::Recorded(q.answer(&turn)), now) {
            if let Effect::Launch {
                sends, per_call, ..
            } = e
            {
                metas.extend(sends.iter().flatten().map(Meta::of));
                per = per_call;
            }
        }
    }
    (metas, per)
}

/// The edge's breaker defers with the wait until its probe is presumed lost; the probe's
/// success (delivered in an earlier call, answered later) ends that wait: the backlog goes
/// at once, not a cool-down later. (The origin's own breaker never opened here: it cannot
/// tell.)
#[test]
fn an_edge_breaker_wait_ends_with_a_delivery() {
    let mut state = State::new(edge_settings());
    let mut q = Queue::with(&[("a", 10)]);
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("a", 2), LimiterState::default())]),
        0,
    );
    let (metas, _) = edge_tick(&mut state, &mut q, 0);
    assert_eq!(metas.len(), 2);
    let deferred = Event::Results {
        sub: Arc::from("a"),
        lane: Lane::Edge,
        items: vec![(
            metas[1].clone(),
            Attempted::reported(DeliveryResult::Deferred {
                id: "d".into(),
                retry_after_ms: 30_000,
                reason: DeferReason::BreakerOpen,
            }),
        )],
        at_ms: 10,
    };
    on(&mut state, deferred, 10);
    on(&mut state, Event::Tick, 10);
    on(&mut state, Event::Recorded(Recorded::default()), 10);
    assert_eq!(
        state.next_wake(10, 100_000),
        30_010,
        "the edge's wait holds"
    );
    let mut probe = delivered("a", &metas[..1], 50);
    if let Event::Results { lane, .. } = &mut probe {
        *lane = Lane::Edge;
    }
    on(&mut state, probe, 50);
    on(&mut state, Event::Tick, 50);
    on(&mut state, Event::Recorded(Recorded::default()), 50);
    assert_eq!(state.next_wake(50, 100_000), 50, "the backlog goes at once");
    let (next, _) = edge_tick(&mut state, &mut q, 50);
    assert_eq!(next.len(), 2);
}

/// A tick after a refused call: the refused `rows` go back due now (no attempt spent); claimed
/// again with a newcomer, the calls they are launched in, as (deliveries, per call).
fn relaunch(state: &mut State, rows: &[Claimed], now: i64) -> Vec<(usize, usize)> {
    let effects = on(state, Event::Tick, now);
    let [Effect::Record(turn)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    let deferred: Vec<&Outcome> = turn
        .outcomes
        .iter()
        .filter(|o| matches!(o.transition, Transition::Defer { .. }))
        .collect();
    assert_eq!(deferred.len(), rows.len());
    assert!(deferred
        .iter()
        .all(|o| o.transition == Transition::Defer { at_ms: now } && o.attempt.is_none()));
    // Claimed again, with a newcomer that was never refused.
    let mut again = rows.to_vec();
    again.push(Claimed {
        rowid: 1_000 + now,
        ..rows[0].clone()
    });
    let recorded = Recorded {
        claims: vec![Claim {
            subscriber_id: "a".into(),
            claimed: again,
            next_due_ms: None,
            not_before_ms: None,
            runs: Vec::new(),
        }],
        notices: vec![],
        due: vec![],
    };
    on(state, Event::Recorded(recorded), now)
        .iter()
        .filter_map(|e| match e {
            Effect::Launch {
                sends, per_call, ..
            } => Some((sends.len(), *per_call)),
            _ => None,
        })
        .collect()
}

/// A recorded outcome: its transition and its attempt's status.
type Seen = (Transition, Option<Option<u16>>);

/// A tick's recorded outcomes, and its dead subscribers.
fn tick_outcomes(state: &mut State, now: i64) -> (Vec<Seen>, Vec<String>) {
    let effects = on(state, Event::Tick, now);
    let turn = effects
        .iter()
        .find_map(|e| match e {
            Effect::Record(t) => Some(t),
            _ => None,
        })
        .expect("a turn");
    let got = turn
        .outcomes
        .iter()
        .map(|o| (o.transition.clone(), o.attempt.as_ref().map(|a| a.status)))
        .collect();
    (got, turn.dead.clone())
}

/// A batch the edge refuses with a 4xx that retrying cannot change is split until one
/// delivery is refused alone; that one counts attempts and goes dead with the edge's error.
/// A transient failure defers without spending an attempt. Every delivery put back has a
/// due time.
#[test]
fn edge_refusals_split_then_count_attempts() {
    let mut state = State::new(edge_settings());
    let mut q = Queue::with(&[("a", 8)]);
    let mut sub = subscriber("a", 8);
    sub.lane = Lane::Edge;
    on(
        &mut state,
        Event::Loaded(vec![(sub, LimiterState::default())]),
        0,
    );
    let refused = || EdgeFailure::Refused {
        status: 413,
        error: "payload_too_large: too big".into(),
    };
    let (metas, per) = edge_tick(&mut state, &mut q, 0);
    assert_eq!((metas.len(), per), (8, 6));
    // The whole call refused: its deliveries go back due now, and are sent again in calls
    // half as big — however the answers of other calls are ordered — until alone.
    let claimed: Vec<Claimed> = metas
        .iter()
        .map(|m| Claimed {
            rowid: m.rowid,
            event_id: m.event_id.clone(),
            event_type: m.event_type.clone(),
            body: "{}".into(),
            attempt: m.attempt,
            sequence: 1,
            received_ms: 0,
            order: None,
            traceparent: None,
        })
        .collect();
    on(&mut state, edge_failed("a", &metas, refused()), 10);
    assert_eq!(
        relaunch(&mut state, &claimed, 10),
        vec![(1, 6), (8, 4)],
        "the newcomer as usual, the refused 8 in calls of 4"
    );
    // The half without the culprit is delivered (answered last, say); the other half is
    // refused again: calls of 2.
    let half: Vec<Meta> = metas[..4].to_vec();
    let newcomer = Meta {
        rowid: 1_010,
        ..metas[0].clone()
    };
    on(&mut state, delivered("a", &[newcomer], 25), 25);
    on(&mut state, edge_failed("a", &half, refused()), 30);
    on(&mut state, delivered("a", &metas[4..], 30), 30);
    assert_eq!(
        relaunch(&mut state, &claimed[..4], 30),
        vec![(1, 6), (4, 2)],
        "the refused 4 in calls of 2"
    );
    let metas = half;
    // One delivery refused alone: a failed attempt with the edge's status and error.
    on(&mut state, edge_failed("a", &metas[..1], refused()), 40);
    // A transient failure: deferred with a due time, no attempt.
    on(
        &mut state,
        edge_failed(
            "a",
            &metas[1..2],
            EdgeFailure::Transient {
                error: "edge answered 503".into(),
            },
        ),
        40,
    );
    // The last attempt refused: dead with the edge's error.
    let mut last = metas[2].clone();
    last.attempt = 3;
    on(&mut state, edge_failed("a", &[last], refused()), 40);
    let (got, dead) = tick_outcomes(&mut state, 40);
    let error = "edge refused the delivery: status 413: payload_too_large: too big";
    assert_eq!(
        got,
        vec![
            (
                Transition::Retry {
                    at_ms: 40 + 1_000,
                    error: error.into()
                },
                Some(Some(413))
            ),
            (Transition::Defer { at_ms: 40 + 500 }, None),
            (
                Transition::Dead {
                    reason: format!("gave up after 3 attempts; last: {error}")
                },
                Some(Some(413))
            ),
        ]
    );
    assert_eq!(dead, vec!["a".to_string()], "its dead count is checked");
    // An endpoint the edge refuses: dead at once, every delivery.
    let ep = EdgeFailure::EndpointRefused {
        error: "private address".into(),
    };
    on(&mut state, edge_failed("a", &metas[3..], ep), 50);
    let late = Meta {
        rowid: 1_030,
        ..metas[0].clone()
    };
    on(&mut state, delivered("a", &[late], 50), 50);
    assert_eq!(state.in_flight(), 0);
}

#[test]
fn edge_calls_per_grant_table() {
    // (granted, cap) -> per call
    let cases: &[(usize, usize, usize)] = &[
        (1, 100, 6),
        (16, 100, 6),
        (24, 100, 6),
        (25, 100, 7),
        (100, 100, 25),
        (500, 100, 100),
        (500, 20, 20),
        (16, 4, 4),
        (0, 100, 6),
        (10, 0, 1),
    ];
    for &(n, cap, expected) in cases {
        assert_eq!(edge_per_call(n, cap), expected, "{n} granted, cap {cap}");
    }
}
