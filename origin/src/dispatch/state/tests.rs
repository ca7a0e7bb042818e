//! The state machine's scenario tests (the invariants' tables are in `tables`).

use std::collections::HashMap;
use std::sync::Arc;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use fanout_core::wire::{DeliveryResult, TransportError};

use super::*;
use crate::alert::AlertRules;
use crate::dispatch::plan::RetryRules;
use crate::dispatch::vocab::{Attempted, Lane, Meta, Recorded, Turn, TurnError};
use crate::model::{Claim, Claimed, Share, Subscriber, Transition};

/// The scenario's ledger: how many deliveries each subscriber has pending, handed out with
/// fresh row ids when a turn claims them. (What the state is told, not a stand-in for
/// SQLite: the ledger's own behaviour is tested against SQLite in `ledger`.)
#[derive(Debug, Default)]
pub(super) struct Queue {
    pending: HashMap<String, usize>,
    next_rowid: i64,
}

impl Queue {
    pub(super) fn with(subs: &[(&str, usize)]) -> Queue {
        Queue {
            pending: subs.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            next_rowid: 1,
        }
    }

    pub(super) fn answer(&mut self, turn: &Turn) -> Recorded {
        let mut claims = Vec::new();
        for (sub, n) in &turn.claims {
            let left = self.pending.entry(sub.clone()).or_default();
            let k = (*n).min(*left);
            *left -= k;
            let claimed = (0..k)
                .map(|_| {
                    self.next_rowid += 1;
                    Claimed {
                        rowid: self.next_rowid,
                        event_id: format!("e{}", self.next_rowid),
                        event_type: "t".into(),
                        body: "{}".into(),
                        attempt: 1,
                        sequence: 1,
                        received_ms: 0,
                        order: None,
                        traceparent: None,
                    }
                })
                .collect();
            claims.push(Claim {
                subscriber_id: sub.clone(),
                claimed,
                next_due_ms: (*left > 0).then_some(0),
                not_before_ms: None,
                runs: Vec::new(),
            });
        }
        Recorded {
            claims,
            notices: turn.notices.clone(),
            due: vec![],
        }
    }
}

pub(super) fn settings(max_total: usize) -> Settings {
    Settings {
        rules: RetryRules {
            max_attempts: 3,
            backoff_scale: 1.0,
        },
        breaker: BreakerConfig::default(),
        edge: false,
        edge_batch: 100,
        max_total_in_flight: max_total,
        event_url: None,
        alert_rules: AlertRules::default(),
    }
}

pub(super) fn subscriber(id: &str, max_in_flight: u32) -> Subscriber {
    let mut s = crate::ledger::test_subscriber(id, &["*"]);
    s.limits.max_in_flight = max_in_flight;
    s.limits.burst = 1000;
    s.limits.rate_per_sec = 1000.0;
    s
}

pub(super) fn on(state: &mut State, event: Event, now: i64) -> Vec<Effect> {
    state.handle(event, now, &mut || 0.0)
}

/// Tick and record the turn as the queue answers it; the launched deliveries by subscriber.
pub(super) fn tick(state: &mut State, q: &mut Queue, now: i64) -> Vec<(String, Vec<Meta>)> {
    let mut launched = Vec::new();
    for effect in on(state, Event::Tick, now) {
        let Effect::Record(turn) = effect else {
            panic!("a tick only records: {effect:?}");
        };
        for e in on(state, Event::Recorded(q.answer(&turn)), now) {
            if let Effect::Launch { target, sends, .. } = e {
                launched.push((
                    target.id.to_string(),
                    sends.iter().flatten().map(Meta::of).collect(),
                ));
            }
        }
    }
    launched
}

pub(super) fn delivered(sub: &str, metas: &[Meta], at: i64) -> Event {
    Event::Results {
        sub: Arc::from(sub),
        lane: Lane::Origin,
        items: metas
            .iter()
            .map(|m| {
                (
                    m.clone(),
                    Attempted::reported(DeliveryResult::Delivered {
                        id: format!("dlv_{}", m.rowid),
                        status: 200,
                        latency_ms: 1,
                        failed: Vec::new(),
                    }),
                )
            })
            .collect(),
        at_ms: at,
    }
}

/// A subscriber's 500.
fn status_500() -> Attempted {
    Attempted::reported(DeliveryResult::Failed {
        id: "d".into(),
        status: Some(500),
        retry_after_ms: None,
        response_body: None,
        error: None,
        latency_ms: Some(1),
    })
}

fn count(launched: &[(String, Vec<Meta>)], sub: &str) -> usize {
    launched
        .iter()
        .filter(|(s, _)| s == sub)
        .map(|(_, m)| m.len())
        .sum()
}

/// The watchdog, by script: a subscriber whose claims the ledger refuses again and again
/// (short waits, for ever) is reported once, 10 s after it was first ready, and cleared
/// by its next send; a wait stated and kept (a breaker's cool-down) and a dispatcher held
/// by its ledger are not stalls.
#[test]
fn the_watchdog_reports_readiness_never_acted_on() {
    let stalls = |effects: &[Effect]| -> Option<(Vec<String>, Vec<String>)> {
        effects.iter().find_map(|e| match e {
            Effect::Stalls(r) => Some((
                r.began.iter().map(|s| s.to_string()).collect(),
                r.ended.iter().map(|s| s.to_string()).collect(),
            )),
            _ => None,
        })
    };
    let refused = |at: i64| Recorded {
        claims: vec![Claim {
            subscriber_id: "a".into(),
            claimed: vec![],
            next_due_ms: Some(0),
            not_before_ms: Some(at),
            runs: Vec::new(),
        }],
        notices: vec![],
        due: vec![],
    };
    let mut state = State::new(settings(100));
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
        0,
    );
    // Refused every 500 ms: ready since 0, reported at the first look past 10 s.
    let mut reported = None;
    for k in 0..30 {
        let now = k * 500;
        let mut effects = on(&mut state, Event::Tick, now);
        effects.extend(on(&mut state, Event::Recorded(refused(now + 500)), now));
        if let Some(r) = stalls(&effects) {
            reported = Some((now, r));
            break;
        }
    }
    assert_eq!(
        reported,
        Some((10_500, (vec!["a".to_string()], vec![]))),
        "reported once, 10 s after it was ready"
    );
    assert_eq!(state.stalled(10_500)[0].since_ms, 0);
    // Its next claim goes through: the send clears it.
    let mut q = Queue::with(&[("a", 3)]);
    let effects = on(&mut state, Event::Tick, 11_000);
    let [Effect::Record(turn), ..] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    let effects = on(&mut state, Event::Recorded(q.answer(turn)), 11_000);
    assert_eq!(stalls(&effects), Some((vec![], vec!["a".to_string()])));

    // A breaker open for a 30 s cool-down (a wait stated and kept), then a ledger that
    // fails for 20 s: nothing is reported.
    let mut state = State::new(Settings {
        breaker: BreakerConfig {
            threshold: 5,
            cooldown_ms: 30_000,
        },
        ..settings(100)
    });
    let mut q = Queue::with(&[("b", 100)]);
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("b", 8), LimiterState::default())]),
        0,
    );
    let out = tick(&mut state, &mut q, 0);
    let items: Vec<(Meta, Attempted)> =
        out[0].1.iter().map(|m| (m.clone(), status_500())).collect();
    let mut seen = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let results = Event::Results {
            sub: Arc::from("b"),
            lane: Lane::Origin,
            items: vec![item],
            at_ms: 10 + i as i64,
        };
        on(&mut state, results, 10 + i as i64);
    }
    for now in (100..30_000).step_by(1_000) {
        let effects = on(&mut state, Event::Tick, now);
        seen.extend(stalls(&effects));
        for e in effects {
            if let Effect::Record(turn) = e {
                seen.extend(stalls(&on(
                    &mut state,
                    Event::Recorded(q.answer(&turn)),
                    now,
                )));
            }
        }
    }
    let breaker = state.limiter_of("b").map(|l| l.breaker);
    assert_eq!(
        breaker.and_then(|b| b.open_until_ms),
        Some(30_017),
        "{breaker:?}"
    );
    for now in (30_000..50_000).step_by(1_000) {
        let effects = on(&mut state, Event::Tick, now);
        seen.extend(stalls(&effects));
        for e in effects {
            if let Effect::Record(turn) = e {
                let failed = TurnError {
                    turn,
                    error: crate::ledger::LedgerError::Closed,
                };
                seen.extend(stalls(&on(&mut state, Event::NotRecorded(failed), now)));
            }
        }
    }
    let effects = on(&mut state, Event::Tick, 50_000);
    seen.extend(stalls(&effects));
    assert_eq!(seen, vec![], "no stall reported");
}

/// On PostgreSQL the daemons share one limiter, which may hold less than a daemon's own
/// copy (another daemon spent it). A claim that comes back empty because the shared
/// limiter says wait is not asked again before then, however much new work is announced
/// meanwhile: each announcement (one per ingest) used to cost a whole turn that got nothing.
#[test]
fn a_claim_the_shared_limiter_refused_waits_for_it() {
    let mut state = State::new(settings(1000));
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("a", 10), LimiterState::default())]),
        0,
    );
    // What a tick asks for; a turn that asks nothing (a limiter to store) is recorded.
    let asks = |state: &mut State, now: i64| -> Vec<(String, usize)> {
        let asked = match on(state, Event::Tick, now).as_slice() {
            [Effect::Record(turn)] => turn.asks(),
            [] => return Vec::new(),
            other => panic!("{other:?}"),
        };
        if asked.is_empty() {
            on(state, Event::Recorded(Recorded::default()), now);
        }
        asked
    };
    assert_eq!(asks(&mut state, 10), vec![("a".to_string(), 10)]);
    let refused = Recorded {
        claims: vec![Claim {
            subscriber_id: "a".into(),
            claimed: vec![],
            next_due_ms: Some(5),
            not_before_ms: Some(510),
            runs: Vec::new(),
        }],
        notices: vec![],
        due: vec![],
    };
    assert!(on(&mut state, Event::Recorded(refused), 10).is_empty());
    for now in [20, 200, 509] {
        on(&mut state, Event::Due(vec!["a".into()]), now);
        assert_eq!(asks(&mut state, now), vec![], "asked again at {now}");
        assert_eq!(state.next_wake(now, 10_000), 510);
    }
    assert_eq!(asks(&mut state, 510), vec![("a".to_string(), 10)]);
}

/// Two daemons sharing a ledger each ask to claim only for the subscribers they own —
/// together every subscriber, none twice — and wake for no other's work; when one
/// leaves, the other looks at its subscribers at once.
#[test]
fn daemons_sharing_a_ledger_claim_each_for_its_own_subscribers() {
    let ids: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let mut q = Queue::with(&ids.iter().map(|s| (s.as_str(), 5)).collect::<Vec<_>>());
    let members = vec!["a:1".to_string(), "b:1".to_string()];
    let mut daemons: Vec<State> = Vec::new();
    for me in &members {
        let mut st = State::new(settings(1000));
        let loaded = ids
            .iter()
            .map(|s| (subscriber(s, 100), LimiterState::default()));
        on(&mut st, Event::Loaded(loaded.collect()), 0);
        on(
            &mut st,
            Event::Share(Some(Share::new(me, members.clone()))),
            0,
        );
        daemons.push(st);
    }
    let mut asked: Vec<BTreeSet<String>> = Vec::new();
    for st in &mut daemons {
        let launched = tick(st, &mut q, 10);
        // Nothing of the other's is due for it: it sleeps until its next timer.
        assert_eq!(st.next_wake(10, 1_000), 1_000);
        asked.push(
            launched
                .into_iter()
                .map(|(s, m)| {
                    assert_eq!(m.len(), 5, "{s}: all its pending");
                    s
                })
                .collect(),
        );
    }
    assert!(asked[0].is_disjoint(&asked[1]), "{asked:?}");
    assert_eq!(asked[0].len() + asked[1].len(), ids.len(), "{asked:?}");
    assert!(!asked[0].is_empty() && !asked[1].is_empty(), "{asked:?}");
    // b leaves (stopped, or aged out): a takes its subscribers' new work at once.
    for s in &asked[1] {
        q.pending.insert(s.clone(), 3);
    }
    let a = &mut daemons[0];
    on(
        a,
        Event::Share(Some(Share::new("a:1", vec!["a:1".into()]))),
        20,
    );
    assert_eq!(a.next_wake(20, 1_000), 20);
    let taken: BTreeSet<String> = tick(a, &mut q, 20).into_iter().map(|(s, _)| s).collect();
    assert_eq!(taken, asked[1]);
    // Alone on its ledger (no share), a daemon owns everything.
    assert!(ids.iter().all(|s| State::new(settings(1)).owns(s)));
}

/// What happens to the subscriber while its sends are out.
#[derive(Debug, Clone, Copy)]
enum Change {
    Edit {
        max_in_flight: u32,
    },
    Delete,
    DeleteAndRecreate,
    /// Its results arrive twice.
    DuplicateResults,
}

/// In-flight accounting stays exact whatever happens to a subscriber while its sends are
/// out: no cap is exceeded (the subscriber's, or the global one shared with `b`), and once
/// every result is back no slot is held.
#[test]
fn in_flight_stays_exact_while_sends_are_out() {
    // (change, a's sends out when the change comes, then the most a may launch before its
    // results are back; a and b share the 2 slots left under the global cap of 10)
    let cases: &[(Change, usize, usize)] = &[
        (Change::Edit { max_in_flight: 3 }, 8, 0),
        (Change::Edit { max_in_flight: 12 }, 8, 4),
        (Change::Delete, 8, 0),
        (Change::DeleteAndRecreate, 8, 0),
        (Change::DuplicateResults, 8, 0),
    ];
    for &(change, first, a_more) in cases {
        let mut state = State::new(settings(10));
        let mut q = Queue::with(&[("a", 100), ("b", 100)]);
        let limiter = LimiterState::default();
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 8), limiter)]),
            0,
        );
        let out = tick(&mut state, &mut q, 0);
        assert_eq!(count(&out, "a"), first, "{change:?}: first launch");
        let a_out = out[0].1.clone();
        on(
            &mut state,
            Event::Changed {
                id: "b".into(),
                found: Some((subscriber("b", 8), limiter)),
            },
            1,
        );
        match change {
            Change::Edit { max_in_flight } => {
                let found = Some((subscriber("a", max_in_flight), limiter));
                on(
                    &mut state,
                    Event::Changed {
                        id: "a".into(),
                        found,
                    },
                    1,
                );
            }
            Change::Delete | Change::DeleteAndRecreate => {
                on(
                    &mut state,
                    Event::Changed {
                        id: "a".into(),
                        found: None,
                    },
                    1,
                );
                if matches!(change, Change::DeleteAndRecreate) {
                    let found = Some((subscriber("a", 8), LimiterState::default()));
                    on(
                        &mut state,
                        Event::Changed {
                            id: "a".into(),
                            found,
                        },
                        2,
                    );
                }
            }
            Change::DuplicateResults => {}
        }
        let more = tick(&mut state, &mut q, 3);
        assert!(
            count(&more, "a") <= a_more,
            "{change:?}: a while its sends are out"
        );
        assert_eq!(
            count(&more, "a") + count(&more, "b"),
            2,
            "{change:?}: the global cap's last slots"
        );
        assert!(state.in_flight() <= 10, "{change:?}: global cap");
        // The results come back late (and, in one case, twice).
        on(&mut state, delivered("a", &a_out, 50), 50);
        if matches!(change, Change::DuplicateResults) {
            on(&mut state, delivered("a", &a_out, 51), 51);
        }
        let more_a: Vec<Meta> = more
            .iter()
            .filter(|(s, _)| s == "a")
            .flat_map(|(_, m)| m.clone())
            .collect();
        let b_metas: Vec<Meta> = more
            .iter()
            .filter(|(s, _)| s == "b")
            .flat_map(|(_, m)| m.clone())
            .collect();
        assert_eq!(
            state.in_flight(),
            more_a.len() + b_metas.len(),
            "{change:?}: exactly what is still out"
        );
        on(&mut state, delivered("a", &more_a, 60), 60);
        on(&mut state, delivered("b", &b_metas, 60), 60);
        assert_eq!(state.in_flight(), 0, "{change:?}: no slot leaks");
        assert_eq!(state.in_flight_of("a"), 0, "{change:?}");
        // Whatever still exists can be sent its full share again.
        let again = tick(&mut state, &mut q, 100);
        let a_cap = match change {
            Change::Edit { max_in_flight } => max_in_flight as usize,
            Change::Delete => 0,
            _ => 8,
        };
        assert!(count(&again, "a") <= a_cap, "{change:?}: a afterwards");
        assert_eq!(
            count(&again, "a") + count(&again, "b"),
            (a_cap + 8).min(10),
            "{change:?}: every slot usable afterwards"
        );
    }
}

/// Announcements missed while a daemon was not listening (its LISTEN connection lost, or
/// not yet open when it loaded) are made up by loading every subscriber again: one created
/// meanwhile is served, one removed meanwhile is not claimed for any more (its sends still
/// out count until they come back), one unchanged keeps its sends in flight.
#[test]
fn loading_every_subscriber_again_makes_up_for_missed_announcements() {
    let mut state = State::new(settings(100));
    let mut q = Queue::with(&[("a", 100), ("b", 100), ("c", 100)]);
    let l = LimiterState::default();
    let loaded =
        |ids: &[&str]| Event::Loaded(ids.iter().map(|id| (subscriber(id, 4), l)).collect());
    on(&mut state, loaded(&["a", "b"]), 0);
    let out = tick(&mut state, &mut q, 0);
    let counts = |out: &[(String, Vec<Meta>)]| ["a", "b", "c"].map(|s| count(out, s));
    assert_eq!(counts(&out), [4, 4, 0]);
    // b removed and c created through another daemon; neither heard.
    on(&mut state, loaded(&["a", "c"]), 1);
    assert_eq!(state.in_flight(), 8, "b's sends still out are counted");
    let more = tick(&mut state, &mut q, 2);
    assert_eq!(counts(&more), [0, 0, 4], "a is full, b is gone, c is new");
    let b_out = out.iter().find(|(s, _)| s == "b").map(|(_, m)| m.clone());
    on(&mut state, delivered("b", &b_out.unwrap_or_default(), 3), 3);
    assert_eq!(state.in_flight(), 8);
    assert_eq!(state.in_flight_of("b"), 0);
    let later = tick(&mut state, &mut q, 4);
    assert_eq!(
        counts(&later),
        [0, 0, 0],
        "nothing for b, even with its slots free"
    );
}

/// Daemons sharing a ledger tell each other what they have in flight per customer: the
/// weighted share and a customer's cap count the others' with this daemon's own, so the
/// weights hold across the daemons (a daemon that owns only the heavy customer's endpoints
/// gives it all its budget; the other gives the light one more) and the cap is the
/// customer's, not each daemon's.
#[test]
fn the_weighted_share_and_caps_count_what_other_daemons_have_in_flight() {
    let owned = |id: &str, customer: &str| {
        let mut s = subscriber(id, 32);
        s.customer = Some(customer.into());
        (s, LimiterState::default())
    };
    // (in flight elsewhere, big's grant, small's grant); budget 10, weights 4:1, small's
    // customer capped at 8.
    type Elsewhere = &'static [(Option<&'static str>, usize)];
    let cases: &[(Elsewhere, usize, usize)] = &[
        (&[], 8, 2),
        (&[(Some("big"), 10)], 6, 4),
        (&[(Some("big"), 40), (Some("small"), 4)], 6, 4),
        (&[(Some("big"), 40), (Some("small"), 7)], 9, 1),
        (&[(Some("small"), 8), (None, 30)], 10, 0),
    ];
    for &(elsewhere, big, small) in cases {
        let mut state = State::new(settings(10));
        let mut q = Queue::with(&[("b1", 100), ("s1", 100)]);
        on(
            &mut state,
            Event::Customers(vec![("big".into(), 4, None), ("small".into(), 1, Some(8))]),
            0,
        );
        on(
            &mut state,
            Event::Loaded(vec![owned("b1", "big"), owned("s1", "small")]),
            0,
        );
        let told = elsewhere
            .iter()
            .map(|(c, n)| (c.map(str::to_string), *n))
            .collect();
        on(&mut state, Event::Elsewhere(told), 0);
        let out = tick(&mut state, &mut q, 0);
        assert_eq!(
            (count(&out, "b1"), count(&out, "s1")),
            (big, small),
            "elsewhere {elsewhere:?}"
        );
        assert_eq!(
            state.in_flight_by_customer(),
            vec![
                (Some("big".to_string()), big),
                (Some("small".to_string()), small)
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect::<Vec<_>>(),
            "what this daemon tells the others"
        );
    }
}

/// A turn the ledger could not record comes back whole: its results go first into the next
/// turn (none lost, none twice), its health changes and alerts too, and the tokens its claims
/// reserved are given back exactly.
#[test]
fn a_turn_not_recorded_is_retried_whole() {
    let mut state = State::new(settings(100));
    let mut q = Queue::with(&[("a", 3)]);
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
        0,
    );
    let out = tick(&mut state, &mut q, 0);
    let metas = out[0].1.clone();
    assert_eq!(metas.len(), 3);
    // Two results, one failing (a health change), then the turn that records them fails.
    on(&mut state, delivered("a", &metas[..1], 10), 10);
    on(
        &mut state,
        Event::Results {
            sub: Arc::from("a"),
            lane: Lane::Origin,
            items: vec![(metas[1].clone(), status_500())],
            at_ms: 10,
        },
        10,
    );
    q.pending.insert("a".into(), 5);
    on(&mut state, Event::Due(vec!["a".into()]), 10);
    let limiter_before = state.limiter_of("a");
    let effects = on(&mut state, Event::Tick, 20);
    let [Effect::Record(turn)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(turn.outcomes.len(), 2);
    assert_eq!(turn.health.len(), 1);
    assert_eq!(turn.claims, vec![("a".to_string(), 7)]);
    let first = turn.clone();
    on(
        &mut state,
        Event::NotRecorded(TurnError {
            turn: first.clone(),
            error: crate::ledger::LedgerError::Closed,
        }),
        20,
    );
    // The reserved tokens are back: the limiter is as before the tick, refilled to 20.
    let mut expected = limiter_before.unwrap_or_default();
    let _ = expected.plan(
        subscriber("a", 8).limits.core(BreakerConfig::default()),
        1,
        20,
        0,
    );
    assert_eq!(state.limiter_of("a"), Some(expected), "tokens given back");
    assert_eq!(state.in_flight(), 1, "nothing launched");
    // Nothing is retried before the ledger's retry time; then the same writes go first.
    assert!(on(&mut state, Event::Tick, 21).is_empty());
    on(&mut state, delivered("a", &metas[2..], 22), 22);
    let effects = on(&mut state, Event::Tick, 20 + LEDGER_RETRY_MS);
    let [Effect::Record(retried)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    let rowids: Vec<i64> = retried.outcomes.iter().map(|o| o.rowid).collect();
    assert_eq!(rowids, vec![metas[0].rowid, metas[1].rowid, metas[2].rowid]);
    assert_eq!(retried.outcomes[..2], first.outcomes[..]);
    assert_eq!(retried.health[..1], first.health[..]);
    assert_eq!(retried.claims, vec![("a".to_string(), 8)]);
    let launched = on(
        &mut state,
        Event::Recorded(q.answer(retried)),
        20 + LEDGER_RETRY_MS,
    );
    // The launch, then the leases of a turn that may have been written all the same go back
    // but those out: the five just launched (the first three's results are written).
    let [Effect::Launch { sends, .. }, Effect::ReleaseStrays { held, .. }] = launched.as_slice()
    else {
        panic!("{launched:?}");
    };
    let mut out: Vec<i64> = sends.iter().flatten().map(|d| d.rowid).collect();
    out.sort_unstable();
    assert_eq!(held, &out);
    assert_eq!(state.in_flight(), 5);
    // Everything was recorded once: the next turn carries no result again.
    let effects = on(&mut state, Event::Tick, 21 + LEDGER_RETRY_MS);
    let [Effect::Record(next)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert!(
        next.outcomes.is_empty() && next.health.is_empty(),
        "{next:?}"
    );
}

fn unsendable(sub: &str, meta: &Meta) -> Event {
    Event::Unsendable {
        sub: Arc::from(sub),
        lane: Lane::Origin,
        items: vec![meta.clone()],
        error: "the subscriber has no usable signing secret".into(),
    }
}

/// A delivery the daemon itself cannot send counts attempts like a failed send and goes
/// dead at the limit with the reason; the subscriber's limiter and health are untouched,
/// and the dispatcher goes on sending the others.
#[test]
fn poison_goes_dead_after_the_attempt_limit() {
    let mut state = State::new(settings(100));
    let mut q = Queue::with(&[("a", 2)]);
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
        0,
    );
    let out = tick(&mut state, &mut q, 0);
    let (poison, good) = (out[0].1[0].clone(), out[0].1[1].clone());
    let limiter = state.limiter_of("a");
    // (attempt, expected transition)
    let cases: Vec<(u32, Transition)> = vec![
        (
            1,
            Transition::Retry {
                at_ms: 1_000 + 1_000,
                error: "not sent: the subscriber has no usable signing secret".into(),
            },
        ),
        (
            3,
            Transition::Dead {
                reason: "gave up after 3 attempts; last: not sent: the subscriber has no usable signing secret".into(),
            },
        ),
    ];
    for (attempt, expected) in cases {
        let mut state = State::new(settings(100));
        let mut q = Queue::with(&[("a", 1)]);
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
            0,
        );
        let out = tick(&mut state, &mut q, 0);
        let mut meta = out[0].1[0].clone();
        meta.attempt = attempt;
        on(&mut state, unsendable("a", &meta), 1_000);
        let effects = on(&mut state, Event::Tick, 1_000);
        let [Effect::Record(turn)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(turn.outcomes.len(), 1);
        assert_eq!(turn.outcomes[0].transition, expected, "attempt {attempt}");
        let rec = turn.outcomes[0]
            .attempt
            .as_ref()
            .map(|a| (a.attempt, a.outcome));
        assert_eq!(
            rec,
            Some((attempt, "failed")),
            "attempt {attempt} is recorded"
        );
        assert!(turn.health.is_empty(), "not the subscriber's failure");
        let alerts: Vec<&str> = turn.notices.iter().map(|n| n.alert.kind()).collect();
        let dead = matches!(expected, Transition::Dead { .. });
        assert_eq!(
            alerts,
            if dead {
                vec!["fanout.delivery.not_sent"]
            } else {
                vec![]
            },
            "attempt {attempt}: an alert when it goes dead"
        );
        assert_eq!(state.in_flight(), 0);
    }
    // In the first state: the poison fails, the good one is delivered, both recorded.
    on(&mut state, unsendable("a", &poison), 5);
    on(&mut state, delivered("a", &[good], 5), 5);
    assert_eq!(
        state.limiter_of("a").map(|l| l.breaker),
        limiter.map(|l| l.breaker)
    );
    assert_eq!(state.in_flight(), 0);
}

/// Backoff comes from the clock the test moves: a 500 at t is retried at t + 1 s (jitter
/// 0), a timeout likewise, and the tick before that time sends nothing.
#[test]
fn retries_wait_for_the_clock() {
    let mut state = State::new(settings(100));
    let mut q = Queue::with(&[("a", 1)]);
    on(
        &mut state,
        Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
        0,
    );
    let out = tick(&mut state, &mut q, 0);
    let failed = DeliveryResult::Failed {
        id: "d".into(),
        status: None,
        retry_after_ms: None,
        response_body: None,
        error: Some(TransportError::Timeout),
        latency_ms: Some(1),
    };
    on(
        &mut state,
        Event::Results {
            sub: Arc::from("a"),
            lane: Lane::Origin,
            items: vec![(out[0].1[0].clone(), Attempted::reported(failed))],
            at_ms: 5_000,
        },
        5_000,
    );
    let effects = on(&mut state, Event::Tick, 5_000);
    let [Effect::Record(turn)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(
        turn.outcomes[0].transition,
        Transition::Retry {
            at_ms: 6_000,
            error: "timeout".into()
        }
    );
    on(&mut state, Event::Recorded(Recorded::default()), 5_000);
    assert_eq!(state.next_wake(5_001, 100_000), 6_000);
}
