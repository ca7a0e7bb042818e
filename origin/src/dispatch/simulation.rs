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
use super::state::{Settings, State};
use super::vocab::{Attempted, Effect, Event, Lane, Meta};
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
    /// Leases but `held` back to pending, due at `now`; whether there were any. (Leases here
    /// never expire: on PostgreSQL the daemon renews its own while it lives.)
    fn release_strays(&mut self, held: &[i64], now: i64) -> bool {
        let strays: Vec<i64> = self
            .leased
            .keys()
            .filter(|id| !held.contains(id))
            .copied()
            .collect();
        for id in &strays {
            self.leased.remove(id);
            self.pending.insert(*id, now);
        }
        !strays.is_empty()
    }

    fn due(&self, now: i64) -> usize {
        self.pending.values().filter(|&&d| d <= now).count()
    }

    fn next_due(&self) -> Option<i64> {
        self.pending.values().min().copied()
    }

    fn answer(&mut self, turn: &Turn, now: i64) -> Recorded {
        let limits = self.sub.limits.core(self.breaker);
        let mut ended = 0u32;
        for o in &turn.outcomes {
            // A result for a delivery not leased (written before, by a turn whose answer was
            // lost) is stale: ignored, as the ledgers do.
            if self.leased.remove(&o.rowid).is_none() {
                continue;
            }
            ended += 1;
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
                    sequence: rowid as u64,
                    received_ms: 0,
                    order: None,
                    traceparent: None,
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
                runs: Vec::new(),
            });
        }
        Recorded {
            claims,
            notices: Vec::new(),
            due: Vec::new(),
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

/// One history under way: the model ledger, the state, the sends out, the clock, and what the
/// checks need to know.
struct Sim {
    seed: u64,
    rng: Rng,
    postgres: bool,
    storm: Storm,
    storm_ms: i64,
    latency: i64,
    sub: Subscriber,
    backlog: i64,
    history: String,
    ledger: Ledger,
    state: State,
    out: Vec<Out>,
    now: i64,
    first_success_after_storm: Option<i64>,
    /// What may delay the send after the first success besides a turn and a token: the pause
    /// still running then, and the clock's jumps, other daemons' pauses and ledger failures
    /// since.
    excused_ms: i64,
    next_send_after_success: Option<i64>,
    deadline: i64,
    recording: Option<Turn>,
}

fn jitter() -> f64 {
    0.5
}

impl Sim {
    fn new(seed: u64) -> Sim {
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
        let ledger = Ledger {
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
            event_url: None,
            alert_rules: AlertRules::default(),
        });
        state.handle(
            Event::Loaded(vec![(sub.clone(), LimiterState::default())]),
            0,
            &mut jitter,
        );
        // The storm, a cool-down, then the backlog at the rate (a send with this burst may
        // wait for its answer before the next token accrues), twice over for the clock's
        // jumps.
        let per_send_ms = (1_000.0 / sub.limits.rate_per_sec) as i64 + latency;
        let deadline = storm_ms + 2 * COOLDOWN_MS + 30_000 + 2 * backlog * per_send_ms;
        Sim {
            seed,
            rng,
            postgres,
            storm,
            storm_ms,
            latency,
            sub,
            backlog,
            history,
            ledger,
            state,
            out: Vec::new(),
            now: 0,
            first_success_after_storm: None,
            excused_ms: 0,
            next_send_after_success: None,
            deadline,
            recording: None,
        }
    }

    /// The ledger answers the turn being recorded (or fails it, now and then; on PostgreSQL
    /// half of those failures come after the turn was written: the connection lost the
    /// commit's answer); what it leases goes out.
    fn answer_turn(&mut self) {
        let Some(turn) = self.recording.take() else {
            return;
        };
        let now = self.now;
        let effects = if self.rng.chance(3) {
            self.excused_ms += 5_000;
            if self.postgres && self.rng.chance(50) {
                self.ledger.answer(&turn, now);
            }
            let failed = TurnError {
                turn,
                error: crate::ledger::LedgerError::Closed,
            };
            self.state
                .handle(Event::NotRecorded(failed), now, &mut jitter)
        } else {
            let recorded = self.ledger.answer(&turn, now);
            self.state
                .handle(Event::Recorded(recorded), now, &mut jitter)
        };
        let mut effects: std::collections::VecDeque<Effect> = effects.into();
        while let Some(e) = effects.pop_front() {
            if let Effect::ReleaseStrays { held, now_ms } = &e {
                if self.ledger.release_strays(held, *now_ms) {
                    let due = Event::Due(vec!["s".to_string()]);
                    effects.extend(self.state.handle(due, now, &mut jitter));
                }
            }
            if let Effect::Launch { sends, .. } = e {
                for d in sends.iter().flatten() {
                    self.out.push(Out {
                        meta: Meta::of(d),
                        back_at: now + self.latency,
                    });
                }
                if self.first_success_after_storm.is_some()
                    && self.next_send_after_success.is_none()
                {
                    self.next_send_after_success = Some(now);
                }
            }
        }
    }

    /// Now and then: another daemon pauses the shared limiter, the subscriber is edited
    /// (same limits, or now and then new ones: the ledger's rows change with it).
    fn disturb(&mut self) {
        if self.postgres && self.rng.chance(1) {
            if let Some(shared) = self.ledger.shared.as_mut() {
                let pause = 1 + self.rng.below(3_000) as i64;
                shared.paused_until_ms = Some(self.now + pause);
                self.deadline += pause;
                self.excused_ms += pause;
            }
        }
        if self.rng.chance(1) {
            if self.rng.chance(50) {
                self.sub.limits.max_in_flight = 1 + self.rng.below(16) as u32;
                self.sub.limits.burst = 1 + self.rng.below(50) as u32;
                self.ledger.sub = self.sub.clone();
            }
            let found = Some((self.sub.clone(), LimiterState::default()));
            let changed = Event::Changed {
                id: "s".into(),
                found,
            };
            self.state.handle(changed, self.now, &mut jitter);
        }
    }

    /// A tick: the state records and claims; then the invariants.
    fn tick(&mut self) {
        let now = self.now;
        if std::env::var("FANOUT_SIM_TRACE").is_ok_and(|t| t == self.seed.to_string()) {
            eprintln!(
                "{now}: sent {} due {} out {} wake {} stalled {:?} limiter {:?} shared {:?}",
                self.ledger.sent,
                self.ledger.due(now),
                self.out.len(),
                self.state.next_wake(now, now + 1_000_000),
                self.state.stalled(now),
                self.state.limiter_of("s"),
                self.ledger.shared
            );
        }
        for e in self.state.handle(Event::Tick, now, &mut jitter) {
            if let Effect::Record(turn) = e {
                self.recording = Some(turn);
            }
        }
        // The invariant: due work has sends out, a turn under way, or a wake-up in time.
        let wake = self.state.next_wake(now, now + 1_000_000);
        if self.ledger.due(now) > 0 && self.state.in_flight_of("s") == 0 && self.recording.is_none()
        {
            assert!(
                wake <= now + LONGEST_WAIT_MS,
                "{}: due work at {now} ms with nothing out and the next wake-up at {wake}; \
                 limiter {:?}, shared {:?}",
                self.history,
                self.state.limiter_of("s"),
                self.ledger.shared
            );
        }
        assert!(
            self.state.stalled(now).is_empty(),
            "{}: the watchdog reported {:?} at {now} ms",
            self.history,
            self.state.stalled(now)
        );
    }

    /// Move the clock to the next thing that happens (a wake-up or an answer, now and then
    /// with a jump), and hand the state the answers back by then.
    fn advance(&mut self) {
        let wake = self.state.next_wake(self.now, self.now + 1_000_000);
        let back = self.out.iter().map(|o| o.back_at).min();
        let mut next = back.map_or(wake, |b| b.min(wake)).max(self.now + 1);
        if self.rng.chance(2) {
            let jump = self.rng.below(3_000) as i64;
            next += jump;
            self.deadline += jump;
            self.excused_ms += jump;
        }
        self.now = next;
        let now = next;
        let (done, rest): (Vec<Out>, Vec<Out>) = std::mem::take(&mut self.out)
            .into_iter()
            .partition(|o| o.back_at <= now);
        self.out = rest;
        if done.is_empty() {
            return;
        }
        let (storm, storm_ms) = (self.storm, self.storm_ms);
        let items: Vec<(Meta, Attempted)> = done
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
                        failed: Vec::new(),
                    }
                };
                (o.meta, Attempted::reported(result))
            })
            .collect();
        if self.first_success_after_storm.is_none()
            && items
                .iter()
                .any(|(_, r)| matches!(r.result, DeliveryResult::Delivered { .. }))
        {
            self.first_success_after_storm = Some(now);
            let paused = |l: Option<LimiterState>| l.and_then(|l| l.paused_until_ms);
            let until = paused(self.state.limiter_of("s")).max(paused(self.ledger.shared));
            self.excused_ms = until.map_or(0, |u| (u - now).max(0));
        }
        let results = Event::Results {
            sub: Arc::from("s"),
            lane: Lane::Origin,
            items,
            at_ms: now,
        };
        self.state.handle(results, now, &mut jitter);
    }
}

fn run(seed: u64) {
    let mut sim = Sim::new(seed);
    let mut steps = 0;
    while sim.ledger.sent < sim.backlog as usize {
        steps += 1;
        let now = sim.now;
        assert!(now <= sim.deadline, "{}: not all sent by {now} ms ({} of {}); in flight {}, due {}, limiter {:?}, shared {:?}",
            sim.history, sim.ledger.sent, sim.backlog, sim.state.in_flight_of("s"), sim.ledger.due(now), sim.state.limiter_of("s"), sim.ledger.shared);
        sim.answer_turn();
        sim.disturb();
        sim.tick();
        if sim.recording.is_some() {
            continue;
        }
        sim.advance();
    }
    // After the first success, the backlog flowed at once: the next send went within a turn
    // and the rate's wait for one token (or a refusal by another daemon's pause).
    if let (Some(ok), Some(next)) = (sim.first_success_after_storm, sim.next_send_after_success) {
        let token_ms = (1_000.0 / sim.sub.limits.rate_per_sec).ceil() as i64;
        assert!(
            next - ok <= token_ms + sim.excused_ms + 250,
            "{}: first success at {ok} ms, next send only at {next} ms \
             ({} ms excused)",
            sim.history,
            sim.excused_ms
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
