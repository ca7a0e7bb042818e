//! A subscriber's limiter: token bucket, in-flight cap, Retry-After pause and breaker combined.
//! [`LimiterState::plan`] grants a whole batch at once; [`LimiterState::settle`] closes each send
//! and [`LimiterState::record`] folds its outcome back in. The edge keeps this state in its
//! Durable Object, the origin in SQLite; both call the same functions.
//!
//! Rates as the subscriber measures them: a subscriber limits on the arrival times it sees, and a
//! request arrives at some unknown instant between the start of its send and its answer. So a send
//! counts against the burst for that whole time: while `n` sends are open the bucket holds at
//! most `burst - n` tokens, and the refill that would have gone above that is not kept. Then
//! whatever the latencies, any window of arrivals holds at most `burst + rate × w` requests (the
//! simulation test below checks it against latencies from 10 to 500 ms), and a subscriber whose
//! answers are slow gets at most `burst` requests per round trip. A deferred delivery's
//! `retry_after_ms` stays exact as of the grant: it is when its token exists if the open sends
//! have been answered by then.

use serde::{Deserialize, Serialize};

use crate::breaker::{Admission, Breaker, BreakerConfig};
use crate::bucket::{Bucket, Rate};
use crate::retry::{classify, Attempt, Class};
use crate::wire::{DeferReason, SubscriberStatus};

/// A deferral for want of an in-flight slot is retried after this long at the earliest.
pub const IN_FLIGHT_RETRY_MS: u64 = 250;
/// A 429 without `Retry-After` pauses the subscriber this long.
pub const DEFAULT_429_PAUSE_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub rate: Rate,
    pub max_in_flight: u32,
    pub breaker: BreakerConfig,
}

/// What survives eviction and restart. Decoding is strict (no unknown field, every field
/// present but the optional ones): a state written by another version fails to decode rather
/// than turn silently into a default, full bucket.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterState {
    pub bucket: Option<Bucket>,
    pub paused_until_ms: Option<i64>,
    pub breaker: Breaker,
}

/// The decision for a batch of `n`: the first `send` go now, the rest are deferred, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub send: usize,
    pub deferred: Vec<(DeferReason, u64)>,
}

impl LimiterState {
    /// A limiter whose bucket is empty as of `now_ms`: what a subscriber starts from when its
    /// stored state cannot be trusted (it refills at the subscriber's rate from there).
    pub fn empty(now_ms: i64) -> LimiterState {
        LimiterState {
            bucket: Some(Bucket {
                tokens: 0.0,
                updated_ms: now_ms,
            }),
            ..LimiterState::default()
        }
    }

    /// Grant what the pause, the breaker, the in-flight cap and the bucket allow for `n`
    /// deliveries, `in_flight` being already out. Each deferred delivery gets the exact wait
    /// until its own token exists. Mutates the bucket (refill always stored) and the breaker.
    pub fn plan(&mut self, limits: Limits, in_flight: u32, now_ms: i64, n: usize) -> Plan {
        if let Some(until) = self.paused_until_ms {
            if now_ms < until {
                let wait = (until - now_ms) as u64;
                return Plan {
                    send: 0,
                    deferred: vec![(DeferReason::Paused, wait); n],
                };
            }
            self.paused_until_ms = None;
        }
        let probe = match self.breaker.admit(limits.breaker, now_ms) {
            Admission::Open { retry_after_ms } => {
                return Plan {
                    send: 0,
                    deferred: vec![(DeferReason::BreakerOpen, retry_after_ms); n],
                }
            }
            Admission::Probe => true,
            Admission::Closed => false,
        };
        let slots = limits.max_in_flight.saturating_sub(in_flight) as usize;
        let cap = if probe { slots.min(1) } else { slots };
        let want = n.min(cap).min(u32::MAX as usize) as u32;
        let bucket = self
            .bucket
            .get_or_insert_with(|| Bucket::full(limits.rate, now_ms));
        let room = limits.rate.room(in_flight);
        let granted = bucket.take(limits.rate, room, now_ms, want) as usize;
        if probe && granted > 0 {
            self.breaker.start_probe(now_ms);
        }
        let bucket = *bucket;
        let deferred = (1..=(n - granted) as u32)
            .map(|k| {
                let rate_wait = bucket.wait_ms(limits.rate, k);
                let over_cap = granted + k as usize > cap;
                if probe && over_cap {
                    (DeferReason::BreakerOpen, rate_wait.max(IN_FLIGHT_RETRY_MS))
                } else if over_cap && rate_wait == 0 {
                    (DeferReason::InFlight, IN_FLIGHT_RETRY_MS)
                } else {
                    (DeferReason::Rate, rate_wait)
                }
            })
            .collect();
        Plan {
            send: granted,
            deferred,
        }
    }

    /// A send granted by [`plan`](Self::plan) is over (answered, failed, timed out, or handed
    /// back): bring the bucket up to `now_ms` under the room that held while it was open.
    /// `in_flight` counts the sends open just before this one ended, this one included. Call it
    /// once per ended send, before the caller's own in-flight count drops.
    pub fn settle(&mut self, limits: Limits, in_flight: u32, now_ms: i64) {
        if let Some(bucket) = self.bucket.as_mut() {
            bucket.refill(limits.rate, limits.rate.room(in_flight), now_ms);
        }
    }

    /// Fold one attempt's outcome in: a 429 or 503 with `Retry-After` (a 429 without one too)
    /// pauses the whole subscriber. The breaker counts every failure except a 429 or 503 that
    /// carries `Retry-After`: that is the subscriber managing its load (the pause obeys it), not
    /// failing; it ends a probe without a verdict, and the next probe goes after the pause.
    pub fn record(&mut self, limits: Limits, attempt: &Attempt, now_ms: i64) {
        match classify(attempt) {
            Class::Success => self.breaker.on_success(),
            _ if asks_to_wait(attempt) => self.breaker.on_pushback(),
            Class::Retryable { .. } | Class::Permanent { .. } => {
                self.breaker.on_failure(limits.breaker, now_ms)
            }
        }
        if let Some(pause) = pause_for(attempt) {
            let until = now_ms + pause as i64;
            self.paused_until_ms = Some(self.paused_until_ms.map_or(until, |p| p.max(until)));
        }
    }

    /// The state as `GET /v1/subscribers/{id}` shows it, refilled to `now_ms` (not stored).
    pub fn status(
        &self,
        id: &str,
        limits: Limits,
        in_flight: u32,
        now_ms: i64,
    ) -> SubscriberStatus {
        let tokens = match self.bucket {
            Some(mut b) => {
                b.refill(limits.rate, limits.rate.room(in_flight), now_ms);
                b.tokens
            }
            None => limits.rate.room(in_flight),
        };
        SubscriberStatus {
            id: id.to_string(),
            tokens,
            rate_per_sec: limits.rate.per_sec,
            burst: limits.rate.burst,
            in_flight,
            paused_until_ms: self.paused_until_ms.filter(|&p| p > now_ms),
            breaker: self.breaker.view(limits.breaker, now_ms),
        }
    }
}

/// Tokens (and possibly the breaker's probe) taken from a limiter for deliveries about to be
/// sent: [`LimiterState::commit`] keeps what was used and gives back the rest exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a reservation must be committed (or its tokens stay taken)"]
pub struct Reservation {
    granted: usize,
    /// The breaker's probe before this reservation started one.
    probe_before: Option<Option<i64>>,
    wait_ms: Option<u64>,
}

impl Reservation {
    /// How many deliveries it holds tokens for.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// When nothing was granted: how long until something may be (rate, pause, breaker);
    /// `None` when only a result can free a slot (the in-flight cap).
    pub fn wait_ms(&self) -> Option<u64> {
        self.wait_ms
    }
}

/// The reserve/commit protocol: [`LimiterState::reserve`] takes what the limiter grants now,
/// [`LimiterState::commit`] keeps what was used and gives back the rest exactly — one pair
/// instead of planning on a copy, planning again and refunding by hand.
impl LimiterState {
    /// Take what the limiter allows now of up to `want` deliveries, `in_flight` being out
    /// (what [`plan`](Self::plan) grants, with the same refill and room).
    pub fn reserve(
        &mut self,
        limits: Limits,
        in_flight: u32,
        now_ms: i64,
        want: usize,
    ) -> Reservation {
        if want == 0 {
            return Reservation {
                granted: 0,
                probe_before: None,
                wait_ms: None,
            };
        }
        let probe = self.breaker.probe_started_ms;
        let plan = self.plan(limits, in_flight, now_ms, want);
        let wait_ms = match plan.deferred.first() {
            _ if plan.send > 0 => None,
            Some((DeferReason::InFlight, _)) | None => None,
            Some((_, wait)) => Some((*wait).max(1)),
        };
        Reservation {
            granted: plan.send,
            probe_before: (self.breaker.probe_started_ms != probe).then_some(probe),
            wait_ms,
        }
    }

    /// Give back `n` of the reserved tokens at once (no time passes: the bucket holds them as
    /// if they had never been taken).
    pub fn release(&mut self, limits: Limits, r: &mut Reservation, n: usize) {
        let n = n.min(r.granted);
        if n == 0 {
            return;
        }
        if let Some(b) = self.bucket.as_mut() {
            b.tokens = (b.tokens + n as f64).min(f64::from(limits.rate.burst));
        }
        r.granted -= n;
    }

    /// `used` of the reservation were sent: keep those, give back the rest exactly, and the
    /// breaker's probe too when none was used.
    pub fn commit(&mut self, limits: Limits, mut r: Reservation, used: usize) {
        let used = used.min(r.granted);
        let unused = r.granted - used;
        self.release(limits, &mut r, unused);
        if used == 0 {
            if let Some(before) = r.probe_before {
                self.breaker.probe_started_ms = before;
            }
        }
    }
}

/// A 429 or 503 that says how long to wait (`Retry-After`): flow control, not a failure, as
/// far as the breaker is concerned.
pub fn asks_to_wait(attempt: &Attempt) -> bool {
    matches!(
        attempt,
        Attempt::Status {
            status: 429 | 503,
            retry_after_ms: Some(_),
        }
    )
}

/// How long an attempt pauses its subscriber, if at all.
pub fn pause_for(attempt: &Attempt) -> Option<u64> {
    match *attempt {
        Attempt::Status {
            status: 429 | 503,
            retry_after_ms: Some(ms),
        } => Some(ms),
        Attempt::Status {
            status: 429,
            retry_after_ms: None,
        } => Some(DEFAULT_429_PAUSE_MS),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeferReason::{BreakerOpen, InFlight, Paused};
    const RATE: DeferReason = DeferReason::Rate;

    const LIMITS: Limits = Limits {
        rate: Rate {
            per_sec: 10.0,
            burst: 20,
        },
        max_in_flight: 8,
        breaker: BreakerConfig {
            threshold: 20,
            cooldown_ms: 30_000,
        },
    };

    fn st(status: u16, retry_after_ms: Option<u64>) -> Attempt {
        Attempt::Status {
            status,
            retry_after_ms,
        }
    }

    #[test]
    fn fresh_subscriber_gets_its_burst_capped_by_in_flight() {
        let mut s = LimiterState::default();
        let p = s.plan(LIMITS, 0, 0, 10);
        assert_eq!(p.send, 8);
        assert_eq!(p.deferred, vec![(InFlight, IN_FLIGHT_RETRY_MS); 2]);
        let wide = Limits {
            max_in_flight: 100,
            ..LIMITS
        };
        let mut s = LimiterState::default();
        let p = s.plan(wide, 0, 0, 25);
        assert_eq!(p.send, 20);
        assert_eq!(
            p.deferred,
            vec![
                (RATE, 100),
                (RATE, 200),
                (RATE, 300),
                (RATE, 400),
                (RATE, 500)
            ]
        );
    }

    #[test]
    fn deferred_waits_are_exact_and_honoured() {
        let wide = Limits {
            max_in_flight: 1000,
            ..LIMITS
        };
        let mut s = LimiterState::default();
        assert_eq!(s.plan(wide, 0, 0, 20).send, 20);
        let p = s.plan(wide, 0, 0, 3);
        assert_eq!(p.deferred, vec![(RATE, 100), (RATE, 200), (RATE, 300)]);
        // Coming back at each advertised time yields exactly that one delivery.
        for (_, wait) in p.deferred {
            let again = s.plan(wide, 0, wait as i64, 1);
            assert_eq!(again.send, 1, "at {wait} ms");
        }
    }

    #[test]
    fn pause_defers_everything_until_it_ends() {
        let mut s = LimiterState::default();
        s.record(LIMITS, &st(429, Some(2_000)), 1_000);
        assert_eq!(s.paused_until_ms, Some(3_000));
        let p = s.plan(LIMITS, 0, 1_500, 3);
        assert_eq!(
            p,
            Plan {
                send: 0,
                deferred: vec![(Paused, 1_500); 3]
            }
        );
        assert_eq!(s.plan(LIMITS, 0, 3_000, 1).send, 1);
        // 503 with Retry-After pauses too; a 500 does not; a 429 without Retry-After pauses briefly.
        let cases: &[(Attempt, Option<u64>)] = &[
            (st(503, Some(5_000)), Some(5_000)),
            (st(500, Some(5_000)), None),
            (st(429, None), Some(DEFAULT_429_PAUSE_MS)),
            (st(200, None), None),
        ];
        for (attempt, expected) in cases {
            assert_eq!(pause_for(attempt), *expected, "{attempt:?}");
        }
    }

    #[test]
    fn breaker_opens_after_twenty_failures_then_probes_once() {
        let mut s = LimiterState::default();
        for i in 0..20 {
            s.record(LIMITS, &st(500, None), i);
        }
        let p = s.plan(LIMITS, 0, 100, 2);
        assert_eq!(p.send, 0);
        assert!(p.deferred.iter().all(|(r, _)| *r == BreakerOpen));
        let p = s.plan(LIMITS, 0, 30_019, 3);
        assert_eq!(p.send, 1, "one probe");
        assert!(p.deferred.iter().all(|(r, _)| *r == BreakerOpen));
        s.record(LIMITS, &st(200, None), 30_050);
        assert_eq!(s.plan(LIMITS, 0, 30_060, 3).send, 3);
    }

    #[test]
    fn retry_after_pushback_pauses_without_counting_toward_the_breaker() {
        let limits = Limits {
            breaker: BreakerConfig {
                threshold: 3,
                cooldown_ms: 1_000,
            },
            ..LIMITS
        };
        // (answers, in order) -> (consecutive failures, breaker open?)
        let cases: &[(&[Attempt], u32, bool)] = &[
            (
                &[st(429, Some(10)), st(429, Some(10)), st(429, Some(10))],
                0,
                false,
            ),
            (
                &[st(503, Some(10)), st(503, Some(10)), st(503, Some(10))],
                0,
                false,
            ),
            // Without Retry-After they count as before.
            (&[st(429, None), st(429, None), st(429, None)], 3, true),
            (&[st(503, None), st(503, None), st(503, None)], 3, true),
            // A pushback neither resets nor extends a run of failures.
            (&[st(500, None), st(500, None), st(429, Some(10))], 2, false),
            (&[st(500, None), st(429, Some(10)), st(500, None)], 2, false),
        ];
        for (answers, failures, open) in cases {
            let mut s = LimiterState::default();
            for (i, a) in answers.iter().enumerate() {
                s.record(limits, a, i as i64);
            }
            assert_eq!(s.breaker.consecutive_failures, *failures, "{answers:?}");
            assert_eq!(s.breaker.open_until_ms.is_some(), *open, "{answers:?}");
        }
        // A probe answered with a pushback ends without a verdict: still open (not closed, not
        // re-opened for a cool-down), and the next probe goes once the pause is over.
        let mut s = LimiterState::default();
        for i in 0..3 {
            s.record(limits, &st(500, None), i);
        }
        assert_eq!(s.plan(limits, 0, 1_002, 1).send, 1, "the probe");
        s.record(limits, &st(429, Some(500)), 1_010);
        assert_eq!(s.breaker.probe_started_ms, None);
        assert_eq!(s.plan(limits, 0, 1_200, 1).send, 0, "paused");
        assert_eq!(
            s.plan(limits, 0, 1_510, 1).send,
            1,
            "the next probe after the pause"
        );
    }

    #[test]
    fn in_flight_counts_against_the_cap() {
        let mut s = LimiterState::default();
        let p = s.plan(LIMITS, 8, 0, 2);
        assert_eq!(p.send, 0);
        assert_eq!(p.deferred, vec![(InFlight, IN_FLIGHT_RETRY_MS); 2]);
        assert_eq!(s.plan(LIMITS, 6, 0, 5).send, 2);
    }

    #[test]
    fn status_refills_without_storing() {
        let mut s = LimiterState::default();
        s.plan(
            Limits {
                max_in_flight: 100,
                ..LIMITS
            },
            0,
            0,
            20,
        );
        let view = s.status("sub", LIMITS, 3, 500);
        assert!((view.tokens - 5.0).abs() < 1e-9);
        assert_eq!(view.in_flight, 3);
        assert_eq!(s.bucket.map(|b| b.updated_ms), Some(0));
    }

    #[test]
    fn open_sends_hold_back_the_refill() {
        let wide = Limits {
            max_in_flight: 100,
            ..LIMITS
        };
        let mut s = LimiterState::default();
        assert_eq!(s.plan(wide, 0, 0, 20).send, 20);
        // The burst is still out 300 ms later: what accrued meanwhile is not ours to spend,
        // the subscriber may not have seen those 20 yet.
        let p = s.plan(wide, 20, 300, 5);
        assert_eq!(p.send, 0);
        assert_eq!(p.deferred[0].0, RATE);
        // All 20 answered at 500 ms: the bucket starts refilling from there.
        for open in (1..=20).rev() {
            s.settle(wide, open, 500);
        }
        assert_eq!(s.plan(wide, 0, 599, 5).send, 0);
        assert_eq!(s.plan(wide, 0, 600, 5).send, 1);
        // Settling a send of a subscriber never planned does nothing.
        let mut fresh = LimiterState::default();
        fresh.settle(wide, 3, 1_000);
        assert_eq!(fresh, LimiterState::default());
    }

    /// The subscriber's own limiter (capacity `burst`, refill `rate`, full at the start) over the
    /// arrival times it sees: how many it would refuse.
    fn refused_by_subscriber(arrivals: &mut [f64], rate: Rate) -> usize {
        arrivals.sort_by(f64::total_cmp);
        let (mut tokens, mut last, mut refused) = (f64::from(rate.burst), 0.0, 0);
        for &at in arrivals.iter() {
            tokens = (tokens + (at - last) * rate.per_sec / 1000.0).min(f64::from(rate.burst));
            last = at;
            if tokens + 1e-9 < 1.0 {
                refused += 1;
            } else {
                tokens -= 1.0;
            }
        }
        refused
    }

    /// Sends `backlog` deliveries through the limiter, one planning step per millisecond; each
    /// send takes a latency drawn from [10, 500] ms and reaches the subscriber at a random
    /// instant within it. Returns (delivered, arrival times). `hold` false replays the old
    /// behaviour (the bucket refills to `burst` whatever is open) for the failure check.
    fn simulate(seed: u64, backlog: usize, run_ms: i64, hold: bool) -> (usize, Vec<f64>) {
        let limits = Limits {
            max_in_flight: 100,
            ..LIMITS
        };
        let mut rng = seed;
        let mut draw = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut s = LimiterState::default();
        let mut open: Vec<i64> = Vec::new(); // answer times of the sends still open
        let (mut sent, mut arrivals) = (0usize, Vec::new());
        for now in 0..run_ms {
            open.sort_unstable();
            while open.first().is_some_and(|&end| end <= now) {
                let n = open.len() as u32;
                if hold {
                    s.settle(limits, n, open[0]);
                }
                open.remove(0);
            }
            let in_flight = if hold { open.len() as u32 } else { 0 };
            let want = (backlog - sent).min(limits.max_in_flight as usize - open.len());
            let p = s.plan(limits, in_flight, now, want);
            for _ in 0..p.send {
                let latency = 10.0 + draw() * 490.0;
                arrivals.push(now as f64 + draw() * latency);
                open.push(now + latency.ceil() as i64);
            }
            sent += p.send;
        }
        (sent, arrivals)
    }

    #[test]
    fn arrivals_stay_within_the_limit_when_latencies_vary() {
        for seed in [1u64, 7, 42, 1234, 99_991] {
            let (sent, mut arrivals) = simulate(seed, 400, 20_000, true);
            assert_eq!(
                refused_by_subscriber(&mut arrivals, LIMITS.rate),
                0,
                "seed {seed}"
            );
            // Still the full rate: 20 + 10/s over 20 s, less what the last answers hold back.
            assert!(sent >= 210, "seed {seed}: only {sent} sent in 20 s");
        }
        // Without holding the refill back, the same latencies get refusals.
        let refused: usize = [1u64, 7, 42, 1234, 99_991]
            .iter()
            .map(|&seed| {
                refused_by_subscriber(&mut simulate(seed, 400, 20_000, false).1, LIMITS.rate)
            })
            .sum();
        assert!(refused > 0, "the check can fail");
    }

    /// What a reservation amounts to, for the table.
    #[derive(Debug, PartialEq)]
    enum Grant {
        Send(usize),
        Wait(u64),
        Full,
    }

    #[test]
    fn reserve_commit_table() {
        let fresh = LimiterState::default();
        let mut drained = LimiterState::default();
        drained.plan(
            Limits {
                max_in_flight: 100,
                ..LIMITS
            },
            0,
            0,
            20,
        );
        let mut paused = LimiterState::default();
        paused.record(
            LIMITS,
            &Attempt::Status {
                status: 429,
                retry_after_ms: Some(2_000),
            },
            0,
        );
        let mut broken = LimiterState::default();
        for i in 0..20 {
            broken.record(LIMITS, &st(500, None), i);
        }
        let cases: Vec<(&str, LimiterState, u32, i64, usize, Grant)> = vec![
            (
                "fresh: capped by in-flight",
                fresh,
                0,
                0,
                100,
                Grant::Send(8),
            ),
            ("fresh: fewer wanted", fresh, 0, 0, 3, Grant::Send(3)),
            ("partly in flight", fresh, 6, 0, 100, Grant::Send(2)),
            ("cap reached", fresh, 8, 0, 100, Grant::Full),
            ("nothing wanted", fresh, 0, 0, 0, Grant::Full),
            (
                "bucket empty: wait for the next token",
                drained,
                0,
                0,
                5,
                Grant::Wait(100),
            ),
            ("bucket refilled", drained, 0, 250, 5, Grant::Send(2)),
            ("paused by 429", paused, 0, 500, 5, Grant::Wait(1_500)),
            ("pause over", paused, 0, 2_000, 5, Grant::Send(5)),
            ("breaker open", broken, 0, 100, 5, Grant::Wait(29_919)),
            (
                "breaker half-open: one probe",
                broken,
                0,
                30_019,
                5,
                Grant::Send(1),
            ),
        ];
        for (name, state, in_flight, now, want, expected) in cases {
            let mut held = state;
            let r = held.reserve(LIMITS, in_flight, now, want);
            let got = match (r.granted(), r.wait_ms()) {
                (0, Some(ms)) => Grant::Wait(ms),
                (0, None) => Grant::Full,
                (k, _) => Grant::Send(k),
            };
            assert_eq!(got, expected, "{name}");
            // Nothing used: the limiter is as it was, refilled to `now`, nothing taken.
            let mut unused = held;
            unused.commit(LIMITS, r, 0);
            let mut expected_state = state;
            if want > 0 {
                let _ = expected_state.plan(LIMITS, in_flight, now, 0);
            }
            assert_eq!(
                unused, expected_state,
                "{name}: an unused reservation gives all back"
            );
            let tokens = |s: &LimiterState| s.bucket.map(|b| b.tokens);
            // One used: exactly one token kept.
            if r.granted() > 0 {
                let mut one = held;
                one.commit(LIMITS, r, 1);
                assert_eq!(
                    tokens(&one).map(|t| t.round()),
                    tokens(&unused).map(|t| (t - 1.0).round()),
                    "{name}: one used keeps one token"
                );
            }
        }
    }
}
