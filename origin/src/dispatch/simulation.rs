//! The dispatcher's state machine run against a model of its ledger and of one subscriber, over
//! random histories: storms of 500s, timeouts, 429s and 503s with and without `Retry-After`,
//! refusals by the shared limiter (another daemon's pause), turns the ledger fails to record,
//! edits of the subscriber and jumps of the clock, on a ledger that grants what is asked
//! (SQLite) or one whose shared limiter decides again (PostgreSQL, by the same pure functions
//! its claim runs). Time is simulated; nothing sleeps.
//!
//! What must hold (issue: a subscriber whose breaker opened was never served again on
//! PostgreSQL, and on SQLite only a cool-down after its probe succeeded):
//! - After every step, a subscriber with due work has sends in flight, a turn being recorded,
//!   or a wake-up no later than the longest wait anything may state (a cool-down, a pause).
//! - Once the storm is over, everything is sent; after the first success, the next send goes
//!   within one turn (the rate's wait for a token, plus a turn).
//! - The watchdog reports nothing in these histories: every wait was stated and kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use fanout_core::wire::{DeliveryResult, TransportError};

use super::plan::RetryRules;
use super::state::{Effect, Event, Meta, Settings, State};
use crate::alert::AlertRules;
use crate::ledger::postgres::{grant_shared, merge_limiter, shared_wait};
use crate::ledger::{Recorded, Turn, TurnError};
use crate::model::{Claim, Claimed, Subscriber, Transition};

/// A small deterministic generator (xorshift64*): each seed is one history, replayable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How the subscriber answers during the storm.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Storm {
    Status500,
    Timeout,
    TooMany { retry_after_ms: Option<u64> },
    Unavailable { retry_after_ms: Option<u64> },
}

impl Storm {
    fn pick(rng: &mut Rng) -> Storm {
        let ra = |rng: &mut Rng| rng.chance(70).then(|| 200 + rng.below(3_000));
        match rng.below(4) {
            0 => Storm::Status500,
            1 => Storm::Timeout,
            2 => Storm::TooMany {
                retry_after_ms: ra(rng),
            },
            _ => Storm::Unavailable {
                retry_after_ms: ra(rng),
            },
        }
    }

    fn answer(self, id: String) -> DeliveryResult {
        let failed = |status, retry_after_ms, error| DeliveryResult::Failed {
            id,
            status,
            retry_after_ms,
            response_body: None,
            error,
            latency_ms: Some(1),
        };
        match self {
            Storm::Status500 => failed(Some(500), None, None),
            Storm::Timeout => failed(None, None, Some(TransportError::Timeout)),
            Storm::TooMany { retry_after_ms } => failed(Some(429), retry_after_ms, None),
            Storm::Unavailable { retry_after_ms } => failed(Some(503), retry_after_ms, None),
        }
    }
}

/// The ledger as the state sees it, for one subscriber `s`: pending deliveries by row id with
/// their due times, those leased, and (PostgreSQL) the shared limiter.
struct Ledger {
    shared: Option<LimiterState>,
    sub: Subscriber,
    breaker: BreakerConfig,
    pending: BTreeMap<i64, i64>,
    leased: BTreeMap<i64, u32>,
    attempts: BTreeMap<i64, u32>,
    sent: usize,
}

impl Ledger {
    fn due(&self, now: i64) -> usize {
        self.pending.values().filter(|&&d| d <= now).count()
    }

    fn next_due(&self) -> Option<i64> {
        self.pending.values().min().copied()
    }

    fn answer(&mut self, turn: &Turn, now: i64) -> Recorded {
        let limits = self.sub.limits.core(self.breaker);
        let ended = turn.outcomes.len() as u32;
        for o in &turn.outcomes {
            self.leased.remove(&o.rowid);
            match &o.transition {
                Transition::Sent => self.sent += 1,
                Transition::Retry { at_ms, .. } | Transition::Defer { at_ms } => {
                    if o.attempt.is_some() {
                        *self.attempts.entry(o.rowid).or_default() += 1;
                    }
                    self.pending.insert(o.rowid, *at_ms);
                }
                Transition::Dead { reason } => panic!("nothing may go dead here: {reason}"),
            }
        }
        if let Some(shared) = self.shared.as_mut() {
            if ended > 0 {
                shared.settle(limits, self.leased.len() as u32 + ended, now);
            }
            if let Some((_, mine)) = turn.limiters.iter().rev().find(|(id, _)| id == "s") {
                *shared = merge_limiter(*shared, *mine);
            }
        }
        let mut claims = Vec::new();
        for (id, most) in &turn.claims {
            assert_eq!(id, "s");
            let busy = self.leased.len() as u32;
            let (granted, reservation) = match self.shared.as_mut() {
                Some(shared) => {
                    let r = grant_shared(shared, limits, busy, *most, now);
                    (r.granted(), Some(r))
                }
                None => (*most, None),
            };
            let picked: Vec<i64> = self
                .pending
                .iter()
                .filter(|(_, &d)| d <= now)
                .map(|(&id, _)| id)
                .take(granted)
                .collect();
            let mut claimed = Vec::new();
            for rowid in picked {
                self.pending.remove(&rowid);
                let attempt = self.attempts.get(&rowid).copied().unwrap_or(0) + 1;
                self.leased.insert(rowid, attempt);
                claimed.push(Claimed {
                    rowid,
                    event_id: format!("e{rowid}"),
                    event_type: "t".into(),
                    body: "{}".into(),
                    attempt,
                });
            }
            let next_due_ms = self.next_due();
            let not_before_ms = match (self.shared.as_mut(), reservation) {
                (Some(shared), Some(r)) => {
                    shared.commit(limits, r, claimed.len());
                    shared_wait(shared, limits, self.leased.len() as u32, next_due_ms, now)
                        .map(|w| now + w as i64)
                }
                _ => None,
            };
            claims.push(Claim {
                subscriber_id: id.clone(),
                claimed,
                next_due_ms,
                not_before_ms,
            });
        }
        Recorded {
            claims,
            notices: Vec::new(),
        }
    }
}

/// One send out: when its answer comes back.
struct Out {
    meta: Meta,
    back_at: i64,
}

/// The longest wait anything in these histories may state: a cool-down (a lost probe is
/// replaced after one), a `Retry-After` (at most 3.2 s here), another daemon's pause.
const LONGEST_WAIT_MS: i64 = COOLDOWN_MS + 1_000;
/// Long beside every other wait, so that a backlog left behind a closed breaker for a
/// cool-down shows.
const COOLDOWN_MS: i64 = 10_000;

fn run(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let postgres = rng.chance(50);
    let storm = Storm::pick(&mut rng);
    let storm_ms = 500 + rng.below(8_000) as i64;
    let latency = 1 + rng.below(150) as i64;
    let breaker = BreakerConfig {
        threshold: 1 + rng.below(25) as u32,
        cooldown_ms: COOLDOWN_MS,
    };
    let mut sub = crate::ledger::test_subscriber("s", &["*"]);
    // (The rate stays: the deadline below is counted from it.)
    sub.limits.max_in_flight = 1 + rng.below(16) as u32;
    sub.limits.rate_per_sec = [5.0, 50.0, 1_000.0][rng.below(3) as usize];
    sub.limits.burst = 1 + rng.below(50) as u32;
    let backlog = 50 + rng.below(300) as i64;
    let history = format!(
        "seed {seed}: {} ledger, storm {storm:?} for {storm_ms} ms, latency {latency} ms, \
         breaker {breaker:?}, limits {:?}, backlog {backlog}",
        if postgres { "PostgreSQL" } else { "SQLite" },
        sub.limits
    );
    let mut ledger = Ledger {
        shared: postgres.then(LimiterState::default),
        sub: sub.clone(),
        breaker,
        pending: (1..=backlog).map(|id| (id, 0)).collect(),
        leased: BTreeMap::new(),
        attempts: BTreeMap::new(),
        sent: 0,
    };
    let mut state = State::new(Settings {
        rules: RetryRules {
            max_attempts: 1_000,
            backoff_scale: 0.01,
        },
        breaker,
        edge: false,
        edge_batch: 100,
        max_total_in_flight: 4_096,
        alert_rules: AlertRules::default(),
    });
    let mut jitter = move || 0.5;
    state.handle(
        Event::Loaded(vec![(sub.clone(), LimiterState::default())]),
        0,
        &mut jitter,
    );
    let mut out: Vec<Out> = Vec::new();
    let mut now: i64 = 0;
    let mut first_success_after_storm: Option<i64> = None;
    // What may delay the send after the first success besides a turn and a token: the pause
    // still running then, and the clock's jumps, other daemons' pauses and ledger failures
    // since.
    let mut excused_ms: i64 = 0;
    let mut next_send_after_success: Option<i64> = None;
    // The storm, a cool-down, then the backlog at the rate (a send with this burst may wait
    // for its answer before the next token accrues), twice over for the clock's jumps.
    let per_send_ms = (1_000.0 / sub.limits.rate_per_sec) as i64 + latency;
    let mut deadline = storm_ms + 2 * COOLDOWN_MS + 30_000 + 2 * backlog * per_send_ms;
    let mut recording: Option<Turn> = None;
    let mut steps = 0;
    let trace = std::env::var("FANOUT_SIM_TRACE").is_ok_and(|t| t == seed.to_string());
    while ledger.sent < backlog as usize {
        steps += 1;
        assert!(now <= deadline, "{history}: not all sent by {now} ms ({} of {backlog}); in flight {}, due {}, limiter {:?}, shared {:?}",
            ledger.sent, state.in_flight_of("s"), ledger.due(now), state.limiter_of("s"), ledger.shared);
        // The ledger answers the turn being recorded (or fails it, now and then).
        if let Some(turn) = recording.take() {
            let effects = if rng.chance(3) {
                excused_ms += 5_000;
                state.handle(
                    Event::NotRecorded(TurnError {
                        turn,
                        error: crate::ledger::LedgerError::Closed,
                    }),
                    now,
                    &mut jitter,
                )
            } else {
                let recorded = ledger.answer(&turn, now);
                state.handle(Event::Recorded(recorded), now, &mut jitter)
            };
            for e in effects {
                if let Effect::Launch { deliveries, .. } = e {
                    for d in &deliveries {
                        out.push(Out {
                            meta: Meta::of(d),
                            back_at: now + latency,
                        });
                    }
                    if first_success_after_storm.is_some() && next_send_after_success.is_none() {
                        next_send_after_success = Some(now);
                    }
                }
            }
        }
        // Now and then: another daemon pauses the shared limiter, the subscriber is edited
        // (same limits), the clock jumps.
        if postgres && rng.chance(1) {
            if let Some(shared) = ledger.shared.as_mut() {
                let pause = 1 + rng.below(3_000) as i64;
                shared.paused_until_ms = Some(now + pause);
                deadline += pause;
                excused_ms += pause;
            }
        }
        if rng.chance(1) {
            // An edit: now and then new limits (the ledger's rows change with it).
            if rng.chance(50) {
                sub.limits.max_in_flight = 1 + rng.below(16) as u32;
                sub.limits.burst = 1 + rng.below(50) as u32;
                ledger.sub = sub.clone();
            }
            state.handle(
                Event::Changed {
                    id: "s".into(),
                    found: Some((sub.clone(), LimiterState::default())),
                },
                now,
                &mut jitter,
            );
        }
        if trace {
            eprintln!(
                "{now}: sent {} due {} out {} wake {} stalled {:?} limiter {:?} shared {:?}",
                ledger.sent,
                ledger.due(now),
                out.len(),
                state.next_wake(now, now + 1_000_000),
                state.stalled(now),
                state.limiter_of("s"),
                ledger.shared
            );
        }
        // A tick: the state records and claims.
        for e in state.handle(Event::Tick, now, &mut jitter) {
            if let Effect::Record(turn) = e {
                recording = Some(turn);
            }
        }
        // The invariant: due work has sends out, a turn under way, or a wake-up in time.
        let wake = state.next_wake(now, now + 1_000_000);
        if ledger.due(now) > 0 && state.in_flight_of("s") == 0 && recording.is_none() {
            assert!(
                wake <= now + LONGEST_WAIT_MS,
                "{history}: due work at {now} ms with nothing out and the next wake-up at {wake}; \
                 limiter {:?}, shared {:?}",
                state.limiter_of("s"),
                ledger.shared
            );
        }
        assert!(
            state.stalled(now).is_empty(),
            "{history}: the watchdog reported {:?} at {now} ms",
            state.stalled(now)
        );
        if recording.is_some() {
            continue;
        }
        // Move the clock to the next thing that happens: a wake-up or an answer.
        let back = out.iter().map(|o| o.back_at).min();
        let mut next = back.map_or(wake, |b| b.min(wake)).max(now + 1);
        if rng.chance(2) {
            let jump = rng.below(3_000) as i64;
            next += jump;
            deadline += jump;
            excused_ms += jump;
        }
        now = next;
        let (done, rest): (Vec<Out>, Vec<Out>) = out.into_iter().partition(|o| o.back_at <= now);
        out = rest;
        if done.is_empty() {
            continue;
        }
        let items: Vec<(Meta, DeliveryResult)> = done
            .into_iter()
            .map(|o| {
                let id = format!("dlv_{}", o.meta.rowid);
                let result = if o.back_at < storm_ms {
                    storm.answer(id)
                } else {
                    DeliveryResult::Delivered {
                        id,
                        status: 200,
                        latency_ms: 1,
                    }
                };
                (o.meta, result)
            })
            .collect();
        if first_success_after_storm.is_none()
            && items
                .iter()
                .any(|(_, r)| matches!(r, DeliveryResult::Delivered { .. }))
        {
            first_success_after_storm = Some(now);
            let paused = |l: Option<LimiterState>| l.and_then(|l| l.paused_until_ms);
            let until = paused(state.limiter_of("s")).max(paused(ledger.shared));
            excused_ms = until.map_or(0, |u| (u - now).max(0));
        }
        let at_ms = now;
        state.handle(
            Event::Results {
                sub: Arc::from("s"),
                lane: "origin",
                items,
                at_ms,
            },
            now,
            &mut jitter,
        );
    }
    // After the first success, the backlog flowed at once: the next send went within a turn
    // and the rate's wait for one token (or a refusal by another daemon's pause).
    if let (Some(ok), Some(next)) = (first_success_after_storm, next_send_after_success) {
        let token_ms = (1_000.0 / sub.limits.rate_per_sec).ceil() as i64;
        assert!(
            next - ok <= token_ms + excused_ms + 250,
            "{history}: first success at {ok} ms, next send only at {next} ms \
             ({excused_ms} ms excused)"
        );
    }
    assert!(steps > 0);
}

#[test]
fn random_histories_keep_every_subscriber_with_due_work_moving() {
    let seeds = std::env::var("FANOUT_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400u64);
    let first = std::env::var("FANOUT_SIM_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0u64);
    for seed in first..first + seeds {
        run(seed);
    }
}

#[test]
fn the_rng_is_deterministic() {
    let mut a = Rng(7);
    let mut b = Rng(7);
    let xs: Vec<u64> = (0..5).map(|_| a.next()).collect();
    let ys: Vec<u64> = (0..5).map(|_| b.next()).collect();
    assert_eq!(xs, ys);
    assert!((0..1000).map(|_| a.unit()).all(|u| (0.0..1.0).contains(&u)));
}
