//! The state machine's invariants as tables: a script of `(time_ms, event)` drives a fresh
//! state, and the effects it returns, one line each, are compared with the expected list.
//! A model ledger answers every `Record` effect at once (handing out row ids 1, 2, 3… in
//! claim order), so a script holds only what the executor would feed in; reads, the share
//! and results are events of the script.
//!
//! The effect lines: `record` with its non-empty parts (`claims=a:8` asked, `until=` the
//! lease, `out=1:sent` the outcomes, `limiters=a`, `health=a`, `dead=a`,
//! `notices=fanout.…`), `launch a [1,2] per=6`, `raise …`, `stalls began=[a] ended=[]`,
//! `read …`, `sweep`, `share`, `leave`, `no_edge a`. A record the model ledger fails is
//! followed by `(not recorded)`.

use std::collections::HashMap;
use std::sync::Arc;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use fanout_core::wire::{DeferReason, DeliveryResult};

use super::{Settings, State, LEASE_MS, SHARE_EVERY_MS, SWEEP_EVERY_MS};
use crate::alert::AlertRules;
use crate::dispatch::plan::RetryRules;
use crate::dispatch::vocab::{
    Attempted, Control, Effect, Event, Lane, Meta, Read, Recorded, Turn, TurnError,
};
use crate::ledger::LedgerError;
use crate::model::{Claim, Claimed, Limits, Share, Subscriber, Transition};

/// The ledger as the tables need it: pending deliveries per subscriber, and how it answers.
#[derive(Debug, Default)]
struct Ledger {
    pending: HashMap<String, usize>,
    next_rowid: i64,
    /// The records (counted from 0) it fails.
    fail: Vec<usize>,
    records: usize,
    /// Each claim is refused with a wait of this long (another daemon's share of the limiter).
    refuse_ms: Option<i64>,
    /// Records are not answered: the script holds the answers.
    silent: bool,
}

impl Ledger {
    fn with(pending: &[(&str, usize)]) -> Ledger {
        Ledger {
            pending: pending.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            next_rowid: 1,
            ..Ledger::default()
        }
    }

    fn answer(&mut self, turn: Turn) -> Event {
        self.records += 1;
        if self.fail.contains(&(self.records - 1)) {
            return Event::NotRecorded(TurnError {
                turn,
                error: LedgerError::Closed,
            });
        }
        let mut claims = Vec::new();
        for (sub, n) in &turn.claims {
            let left = self.pending.entry(sub.clone()).or_default();
            let k = if self.refuse_ms.is_some() {
                0
            } else {
                (*n).min(*left)
            };
            *left -= k;
            let claimed = (0..k)
                .map(|_| {
                    self.next_rowid += 1;
                    claimed(self.next_rowid - 1)
                })
                .collect();
            claims.push(Claim {
                subscriber_id: sub.clone(),
                claimed,
                next_due_ms: (*left > 0).then_some(turn.now_ms),
                not_before_ms: self.refuse_ms.map(|w| turn.now_ms + w),
                runs: Vec::new(),
            });
        }
        Event::Recorded(Recorded {
            claims,
            notices: turn.notices,
            due: vec![],
        })
    }
}

fn claimed(rowid: i64) -> Claimed {
    Claimed {
        rowid,
        event_id: format!("e{rowid}"),
        event_type: "t".into(),
        body: "{}".into(),
        attempt: 1,
        sequence: rowid as u64,
        received_ms: 0,
        order: None,
        traceparent: None,
    }
}

/// Run `script` on a fresh state with `settings`, the model ledger answering its records;
/// every effect as a line, prefixed with its time.
fn run(settings: Settings, ledger: &mut Ledger, script: Script) -> Vec<String> {
    let mut state = State::new(settings);
    let mut lines = Vec::new();
    for (at, event) in script {
        let mut queue = state.handle(event, at, &mut || 0.0);
        while !queue.is_empty() {
            let effect = queue.remove(0);
            lines.push(format!("{at}: {}", show(&effect, at)));
            if let Effect::Record(turn) = effect {
                if ledger.silent {
                    continue;
                }
                let answer = ledger.answer(turn);
                if matches!(answer, Event::NotRecorded(_)) {
                    lines.push(format!("{at}: (not recorded)"));
                }
                queue.extend(state.handle(answer, at, &mut || 0.0));
            }
        }
    }
    lines
}

fn show(effect: &Effect, now: i64) -> String {
    match effect {
        Effect::Record(turn) => show_turn(turn, now),
        Effect::Launch {
            target,
            sends,
            per_call,
            ..
        } if target.batch.is_some() => {
            let rows: Vec<Vec<i64>> = sends
                .iter()
                .map(|b| b.iter().map(|d| d.rowid).collect())
                .collect();
            format!("launch batches {} {rows:?} per={per_call}", target.id)
        }
        Effect::Launch {
            target,
            sends,
            per_call,
            ..
        } => {
            let rows: Vec<i64> = sends.iter().flatten().map(|d| d.rowid).collect();
            format!("launch {} {rows:?} per={per_call}", target.id)
        }
        Effect::Raise(notices) => {
            let kinds: Vec<&str> = notices.iter().map(|n| n.alert.kind()).collect();
            format!("raise {}", kinds.join(","))
        }
        Effect::Stalls(r) => format!("stalls began={:?} ended={:?}", r.began, r.ended),
        Effect::Read(Read::Customers) => "read customers".into(),
        Effect::Read(Read::Subscribers) => "read subscribers".into(),
        Effect::Read(Read::Subscriber(id)) => format!("read subscriber {id}"),
        Effect::Read(Read::DueWork { .. }) => "read due_work".into(),
        Effect::SweepLeases { now_ms } => format!("sweep before {now_ms}"),
        Effect::ReleaseStrays { held, now_ms } => {
            format!("release strays but {held:?} at {now_ms}")
        }
        Effect::Share { in_flight } => format!("share {in_flight:?}"),
        Effect::Leave => "leave".into(),
        Effect::NoEdge { subscriber } => format!("no_edge {subscriber}"),
    }
}

fn show_turn(turn: &Turn, now: i64) -> String {
    let mut parts = vec!["record".to_string()];
    let asks = turn.asks();
    if !asks.is_empty() {
        let asks: Vec<String> = asks.iter().map(|(s, n)| format!("{s}:{n}")).collect();
        parts.push(format!("claims={}", asks.join(",")));
        parts.push(format!("until=+{}", turn.lease_until_ms - now));
    }
    if !turn.outcomes.is_empty() {
        let out: Vec<String> = turn
            .outcomes
            .iter()
            .map(|o| {
                let t = match &o.transition {
                    Transition::Sent => "sent".to_string(),
                    Transition::Retry { at_ms, .. } => format!("retry@{at_ms}"),
                    Transition::Defer { at_ms } => format!("defer@{at_ms}"),
                    Transition::Dead { .. } => "dead".to_string(),
                };
                format!("{}:{t}", o.rowid)
            })
            .collect();
        parts.push(format!("out={}", out.join(",")));
    }
    if !turn.limiters.is_empty() {
        let mut ids: Vec<&str> = turn.limiters.iter().map(|(s, _)| s.as_str()).collect();
        ids.sort();
        parts.push(format!("limiters={}", ids.join(",")));
    }
    if !turn.health.is_empty() {
        parts.push(format!("health={}", turn.health.len()));
    }
    if !turn.dead.is_empty() {
        parts.push(format!("dead={}", turn.dead.join(",")));
    }
    if !turn.notices.is_empty() {
        let kinds: Vec<&str> = turn.notices.iter().map(|n| n.alert.kind()).collect();
        parts.push(format!("notices={}", kinds.join(",")));
    }
    parts.join(" ")
}

fn settings(max_total: usize) -> Settings {
    Settings {
        rules: RetryRules {
            max_attempts: 3,
            backoff_scale: 1.0,
        },
        breaker: BreakerConfig {
            threshold: 2,
            cooldown_ms: 10_000,
        },
        edge: false,
        edge_batch: 100,
        max_total_in_flight: max_total,
        event_url: None,
        alert_rules: AlertRules::default(),
    }
}

fn sub(id: &str, max_in_flight: u32, customer: Option<&str>) -> (Subscriber, LimiterState) {
    let limits = Limits {
        rate_per_sec: 1000.0,
        burst: 1000,
        max_in_flight,
        timeout_ms: 1000,
    };
    let s = Subscriber {
        lane: Lane::Origin,
        customer: customer.map(str::to_string),
        ..Subscriber::new(id, "https://example.com/h", &["*"], limits)
    };
    (s, LimiterState::default())
}

fn loaded(subs: Vec<(Subscriber, LimiterState)>) -> Event {
    Event::Loaded(subs)
}

fn meta(rowid: i64) -> Meta {
    Meta::of(&claimed(rowid))
}

/// `sub`'s deliveries `rows` answered, each with `result(id)`, back at `at`.
fn results(sub: &str, rows: &[i64], at: i64, result: fn(String) -> DeliveryResult) -> Event {
    Event::Results {
        sub: Arc::from(sub),
        lane: Lane::Origin,
        items: rows
            .iter()
            .map(|&r| (meta(r), Attempted::reported(result(format!("dlv_{r}")))))
            .collect(),
        at_ms: at,
    }
}

fn ok(id: String) -> DeliveryResult {
    DeliveryResult::Delivered {
        id,
        status: 200,
        latency_ms: 1,
        failed: Vec::new(),
    }
}

fn status_500(id: String) -> DeliveryResult {
    DeliveryResult::Failed {
        id,
        status: Some(500),
        retry_after_ms: None,
        response_body: None,
        error: None,
        latency_ms: Some(1),
    }
}

fn too_many_5s(id: String) -> DeliveryResult {
    DeliveryResult::Failed {
        id,
        status: Some(429),
        retry_after_ms: Some(5_000),
        response_body: None,
        error: None,
        latency_ms: Some(1),
    }
}

fn paused_5s(id: String) -> DeliveryResult {
    DeliveryResult::Deferred {
        id,
        retry_after_ms: 5_000,
        reason: DeferReason::Paused,
    }
}

/// A script: at each time, an event.
type Script = Vec<(i64, Event)>;

fn check(name: &str, got: Vec<String>, expected: &[&str]) {
    assert_eq!(
        got,
        expected.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        "{name}:\n{}",
        got.join("\n")
    );
}

/// Limits: a subscriber's `max_in_flight` and the global cap hold from claim to result; a
/// result frees exactly its slot, a second result for it frees nothing.
#[test]
fn limits_and_in_flight_caps_table() {
    let cases: Vec<(&str, usize, Script, Vec<&str>)> = vec![
        (
            "a subscriber's cap",
            100,
            vec![
                (0, loaded(vec![sub("a", 2, None)])),
                (0, Event::Tick),
                (1, Event::Tick),
                (2, results("a", &[1], 2, ok)),
                (2, Event::Tick),
            ],
            vec![
                "0: record claims=a:2 until=+330000 limiters=a",
                "0: launch a [1, 2] per=6",
                // Only the limiter the claim committed is written: no slot is free.
                "1: record limiters=a",
                "2: record claims=a:1 until=+330000 out=1:sent limiters=a",
                "2: launch a [3] per=6",
            ],
        ),
        (
            "the global cap, and a result counted once",
            3,
            vec![
                (0, loaded(vec![sub("a", 8, None)])),
                (0, Event::Tick),
                (1, results("a", &[1], 1, ok)),
                (1, results("a", &[1], 1, ok)),
                (1, Event::Tick),
            ],
            vec![
                "0: record claims=a:3 until=+330000 limiters=a",
                "0: launch a [1, 2, 3] per=6",
                "1: record claims=a:1 until=+330000 out=1:sent limiters=a",
                "1: launch a [4] per=6",
            ],
        ),
        (
            "a subscriber removed while its sends are out keeps its slots until they are back",
            100,
            vec![
                (0, loaded(vec![sub("a", 2, None)])),
                (0, Event::Tick),
                (1, loaded(vec![])),
                (2, loaded(vec![sub("a", 2, None)])),
                (2, Event::Tick),
                (3, results("a", &[1, 2], 3, ok)),
                (3, Event::Tick),
            ],
            vec![
                "0: record claims=a:2 until=+330000 limiters=a",
                "0: launch a [1, 2] per=6",
                // Re-created with its two sends out: no slot free.
                "2: record limiters=a",
                "3: record claims=a:2 until=+330000 out=1:sent,2:sent limiters=a",
                "3: launch a [3, 4] per=6",
            ],
        ),
    ];
    for (name, max_total, script, expected) in cases {
        let mut ledger = Ledger::with(&[("a", 10)]);
        check(
            name,
            run(settings(max_total), &mut ledger, script),
            &expected,
        );
    }
}

/// Fairness: the global budget is shared by weight between customers, round-robin within;
/// a customer's cap holds, and what other daemons have in flight counts.
#[test]
fn fairness_table() {
    let customers = || {
        Event::Customers(vec![
            ("big".into(), 3, None),
            ("small".into(), 1, None),
            ("capped".into(), 1, Some(1)),
        ])
    };
    let two = || {
        loaded(vec![
            sub("a", 100, Some("big")),
            sub("b", 100, Some("small")),
        ])
    };
    let cases: Vec<(&str, Script, Vec<&str>)> = vec![
        (
            "weights 3:1 share a budget of 8",
            vec![(0, customers()), (0, two()), (0, Event::Tick)],
            vec![
                "0: record claims=a:6,b:2 until=+330000 limiters=a,b",
                "0: launch a [1, 2, 3, 4, 5, 6] per=6",
                "0: launch b [7, 8] per=6",
            ],
        ),
        (
            // 4 at the other daemons + 8 here: big's share 9 (5 more), small's 3.
            "what the others have in flight counts against the weight",
            vec![
                (0, customers()),
                (0, two()),
                (0, Event::Elsewhere(vec![(Some("big".into()), 4)])),
                (0, Event::Tick),
            ],
            vec![
                "0: record claims=a:5,b:3 until=+330000 limiters=a,b",
                "0: launch a [1, 2, 3, 4, 5] per=6",
                "0: launch b [6, 7, 8] per=6",
            ],
        ),
        (
            "a customer's cap",
            vec![
                (0, customers()),
                (0, loaded(vec![sub("c", 100, Some("capped"))])),
                (0, Event::Tick),
                (1, Event::Tick),
            ],
            vec![
                "0: record claims=c:1 until=+330000 limiters=c",
                "0: launch c [1] per=6",
                "1: record limiters=c",
            ],
        ),
    ];
    for (name, script, expected) in cases {
        let mut ledger = Ledger::with(&[("a", 10), ("b", 10), ("c", 10)]);
        check(name, run(settings(8), &mut ledger, script), &expected);
    }
}

/// The breaker: `threshold` failures in a row open it; nothing is claimed during its
/// cool-down; then one probe; the probe's success closes it and the backlog flows.
#[test]
fn breaker_table() {
    let script = vec![
        (0, loaded(vec![sub("a", 1, None)])),
        (0, Event::Tick),
        (10, results("a", &[1], 10, status_500)),
        (10, Event::Tick),
        (20, results("a", &[2], 20, status_500)),
        (20, Event::Tick),
        (5_000, Event::Tick),
        (10_020, Event::Tick),
        (10_030, results("a", &[3], 10_030, ok)),
        (10_030, Event::Tick),
    ];
    let expected = [
        "0: record claims=a:1 until=+330000 limiters=a",
        "0: launch a [1] per=6",
        "10: record claims=a:1 until=+330000 out=1:retry@1010 limiters=a health=1",
        "10: launch a [2] per=6",
        // The second failure opens the breaker (threshold 2): an alert, no claim.
        "20: record out=2:retry@1020 limiters=a notices=fanout.subscriber.breaker_opened",
        "20: raise fanout.subscriber.breaker_opened",
        // The cool-down (10 s) over: one probe.
        "10020: record claims=a:1 until=+330000 limiters=a",
        "10020: launch a [3] per=6",
        "10030: record claims=a:1 until=+330000 out=3:sent limiters=a health=1",
        "10030: launch a [4] per=6",
    ];
    let mut ledger = Ledger::with(&[("a", 10)]);
    check(
        "breaker",
        run(settings(100), &mut ledger, script),
        &expected,
    );
}

/// `Retry-After`: a 429 or 503 with `Retry-After` pauses its subscriber that long (never
/// shortened by a later, shorter one); a deferral for a pause holds it likewise; the retry
/// is due no sooner.
#[test]
fn retry_after_table() {
    type Answer = fn(String) -> DeliveryResult;
    let cases: Vec<(&str, Answer, Vec<&str>)> = vec![
        (
            "a 429 with Retry-After: 5 s",
            too_many_5s,
            vec![
                "0: record claims=a:1 until=+330000 limiters=a",
                "0: launch a [1] per=6",
                "10: record out=1:retry@5010 limiters=a health=1",
                "5010: record claims=a:1 until=+330000 limiters=a",
                "5010: launch a [2] per=6",
            ],
        ),
        (
            "the edge deferred it: paused for 5 s",
            paused_5s,
            vec![
                "0: record claims=a:1 until=+330000 limiters=a",
                "0: launch a [1] per=6",
                "10: record out=1:defer@5010 limiters=a",
                "5010: record claims=a:1 until=+330000 limiters=a",
                "5010: launch a [2] per=6",
            ],
        ),
    ];
    for (name, answer, expected) in cases {
        let script = vec![
            (0, loaded(vec![sub("a", 1, None)])),
            (0, Event::Tick),
            (10, results("a", &[1], 10, answer)),
            (10, Event::Tick),
            (2_000, Event::Tick),
            (5_009, Event::Tick),
            (5_010, Event::Tick),
        ];
        let mut ledger = Ledger::with(&[("a", 10)]);
        check(name, run(settings(100), &mut ledger, script), &expected);
    }
}

/// A turn the ledger could not record comes back whole and is retried first, after a wait
/// that doubles; one turn is recorded at a time.
#[test]
fn a_turn_not_recorded_is_retried_whole_table() {
    let script = vec![
        (0, loaded(vec![sub("a", 2, None)])),
        (0, Event::Tick),
        (10, results("a", &[1], 10, ok)),
        (10, Event::Tick),
        (50, Event::Tick),
        (110, Event::Tick),
        (300, Event::Tick),
        (310, Event::Tick),
    ];
    let expected = [
        "0: record claims=a:2 until=+330000 limiters=a",
        "0: launch a [1, 2] per=6",
        "10: record claims=a:1 until=+330000 out=1:sent limiters=a",
        "10: (not recorded)",
        // 100 ms later, the same results and claims again.
        "110: record claims=a:1 until=+330000 out=1:sent limiters=a",
        "110: (not recorded)",
        // Then 200 ms.
        "310: record claims=a:1 until=+330000 out=1:sent limiters=a",
        "310: launch a [3] per=6",
        // A failed turn may have been written (its answer lost): every lease but those out
        // (2, and 3 just launched) goes back to the queue.
        "310: release strays but [2, 3] at 310",
    ];
    let mut ledger = Ledger::with(&[("a", 10)]);
    ledger.fail = vec![1, 2];
    check("ledger", run(settings(100), &mut ledger, script), &expected);
}

/// At most one turn is being recorded at a time: ticks and results meanwhile record nothing;
/// the results wait for the next turn, after the answer.
#[test]
fn one_turn_at_a_time_table() {
    let answer = |rows: &[i64]| {
        Event::Recorded(Recorded {
            claims: vec![Claim {
                subscriber_id: "a".into(),
                claimed: rows.iter().map(|&r| claimed(r)).collect(),
                next_due_ms: None,
                not_before_ms: None,
                runs: Vec::new(),
            }],
            notices: vec![],
            due: vec![],
        })
    };
    let script = vec![
        (0, loaded(vec![sub("a", 2, None)])),
        (0, Event::Tick),
        (1, Event::Tick),
        (2, answer(&[1, 2])),
        (3, Event::Tick),
        (4, results("a", &[1], 4, ok)),
        (4, Event::Tick),
        (5, Event::Flush),
        (6, Event::Recorded(Recorded::default())),
        (6, Event::Flush),
    ];
    let expected = [
        "0: record claims=a:2 until=+330000 limiters=a",
        "2: launch a [1, 2] per=6",
        "3: record limiters=a",
        "6: record out=1:sent limiters=a",
    ];
    let mut ledger = Ledger {
        silent: true,
        ..Ledger::default()
    };
    check(
        "one at a time",
        run(settings(100), &mut ledger, script),
        &expected,
    );
}

/// Leases and the periodic work run on the state's deadlines: the share and a rescan at the
/// first wake, the share every second, the rescan every 2 s, the sweep every 5 s; a swept
/// lease's subscriber is due at once; every claim leases for `LEASE_MS`.
#[test]
fn leases_and_timers_table() {
    let script = vec![
        (0, Event::Start),
        (0, loaded(vec![sub("a", 8, None)])),
        (0, Event::Timers),
        (999, Event::Timers),
        (1_000, Event::Timers),
        (2_000, Event::Timers),
        (SWEEP_EVERY_MS, Event::Timers),
        (SWEEP_EVERY_MS, Event::Due(vec!["a".into()])),
        (SWEEP_EVERY_MS, Event::Tick),
    ];
    let expected = [
        "0: read customers",
        "0: read subscribers",
        "0: share []",
        "0: read due_work",
        "1000: share []",
        "2000: read due_work",
        "2000: share []",
        "5000: sweep before 5000",
        "5000: read due_work",
        "5000: share []",
        "5000: record claims=a:8 until=+330000 limiters=a",
        "5000: launch a [1, 2, 3, 4, 5, 6, 7, 8] per=6",
    ];
    let mut ledger = Ledger::with(&[("a", 10)]);
    let got = run(settings(100), &mut ledger, script);
    check("timers", got, &expected);
    let mut state = State::new(settings(100));
    state.handle(Event::Timers, 0, &mut || 0.0);
    assert_eq!(
        state.deadline(0),
        SHARE_EVERY_MS,
        "the executor sleeps until the share"
    );
    assert_eq!(LEASE_MS, 330_000);
}

/// Control messages become reads of the ledger; a replayed subscriber is due once the queue
/// is read; stopping leaves the share.
#[test]
fn controls_table() {
    let script = vec![
        (0, loaded(vec![sub("a", 8, None)])),
        (0, Event::Control(Control::Changed("a".into()))),
        (0, Event::Control(Control::Customers)),
        (0, Event::Control(Control::Reload)),
        (0, Event::Control(Control::Replayed(vec!["a".into()]))),
        (0, Event::DueWork(vec![])),
        (0, Event::Tick),
        (1, Event::Stop),
    ];
    let expected = [
        "0: read subscriber a",
        "0: read customers",
        "0: read customers",
        "0: read subscribers",
        "0: read due_work",
        "0: read due_work",
        "0: record claims=a:8 until=+330000 limiters=a",
        "0: launch a [1, 2, 3, 4, 5, 6, 7, 8] per=6",
        "1: leave",
    ];
    let mut ledger = Ledger::with(&[("a", 10)]);
    check(
        "controls",
        run(settings(100), &mut ledger, script),
        &expected,
    );
}

/// A daemon sharing the ledger claims only for the subscribers it owns, and those it gains
/// are due at once.
#[test]
fn share_table() {
    let share = Share::new("d1", vec!["d2".to_string()]);
    let ids: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let mine = ids
        .iter()
        .find(|id| share.owns(id))
        .expect("d1 owns one of ten");
    let theirs = ids
        .iter()
        .find(|id| !share.owns(id))
        .expect("d2 owns one of ten");
    let script = vec![
        (0, loaded(vec![sub(mine, 2, None), sub(theirs, 2, None)])),
        (0, Event::Share(Some(share.clone()))),
        (0, Event::Tick),
        (10, Event::Share(None)),
        (10, Event::Tick),
    ];
    let got = run(
        settings(100),
        &mut Ledger::with(&[(mine, 10), (theirs, 10)]),
        script,
    );
    let mut both = [mine.as_str(), theirs.as_str()];
    both.sort();
    let expected = [
        format!("0: record claims={mine}:2 until=+330000 limiters={mine}"),
        format!("0: launch {mine} [1, 2] per=6"),
        // Alone again: the other's subscriber is due at once (its cap holds the first; the
        // first's committed limiter is written).
        format!(
            "10: record claims={theirs}:2 until=+330000 limiters={}",
            both.join(",")
        ),
        format!("10: launch {theirs} [3, 4] per=6"),
    ];
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    check("share", got, &expected);
}

/// The watchdog: a subscriber ready to send whose claims the ledger refuses again and again
/// is reported once, 10 s after it was first ready; a dispatcher held (a gap between looks)
/// starts counting afresh.
#[test]
fn watchdog_table() {
    let mut script = vec![(0, loaded(vec![sub("a", 2, None)]))];
    script.extend((0..=102).map(|k| (k * 100, Event::Tick)));
    let mut ledger = Ledger::with(&[("a", 10)]);
    ledger.refuse_ms = Some(50);
    let got: Vec<String> = run(settings(100), &mut ledger, script)
        .into_iter()
        .filter(|l| l.contains("stalls"))
        .collect();
    check("watchdog", got, &["10100: stalls began=[\"a\"] ended=[]"]);
}

/// Stopping: leave the share, then wait for the sends in flight until `DRAIN_MS` later, or
/// until they are all back.
#[test]
fn stopping_drains_until_its_deadline() {
    let mut state = State::new(settings(100));
    let mut ledger = Ledger::with(&[("a", 10)]);
    let j = &mut || 0.0;
    state.handle(loaded(vec![sub("a", 2, None)]), 0, j);
    for effect in state.handle(Event::Tick, 0, j) {
        if let Effect::Record(turn) = effect {
            state.handle(ledger.answer(turn), 0, j);
        }
    }
    assert_eq!(state.draining(0), None, "not stopping");
    assert_eq!(state.handle(Event::Stop, 100, j), vec![Effect::Leave]);
    let until = 100 + super::DRAIN_MS;
    assert_eq!(state.draining(100), Some(until));
    assert_eq!(state.draining(until), None, "the wait is over");
    state.handle(results("a", &[1, 2], 200, ok), 200, j);
    assert_eq!(state.draining(200), None, "everything is back");
}
