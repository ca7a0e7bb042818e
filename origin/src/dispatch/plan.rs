//! The dispatcher's pure decisions: how much a subscriber may be sent now (pacing), in what
//! order subscribers are served (fairness), and what a result does to a delivery (state
//! transitions). Time and jitter come in as arguments; nothing here does I/O.

use fanout_core::limiter::{LimiterState, Limits};
use fanout_core::retry::{classify, next_step, Attempt, Class, Next};
use fanout_core::wire::{DeferReason, DeliveryResult, TransportError};

use crate::model::{AttemptRecord, Transition};

/// The retry rules in force (DESIGN.md's, with a scale for tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryRules {
    pub max_attempts: u32,
    /// Multiplies computed backoff delays (never a subscriber's `Retry-After`). 1.0 in
    /// production; tests use a small value.
    pub backoff_scale: f64,
}

impl RetryRules {
    /// A computed backoff delay, scaled.
    pub fn scale(&self, delay_ms: i64) -> i64 {
        (delay_ms.max(0) as f64 * self.backoff_scale).round() as i64
    }
}

impl Default for RetryRules {
    fn default() -> Self {
        RetryRules {
            max_attempts: fanout_core::retry::DEFAULT_MAX_ATTEMPTS,
            backoff_scale: 1.0,
        }
    }
}

/// Tokens (and possibly the breaker's probe) taken from a limiter for deliveries about to be
/// leased: [`ReserveCommit::commit`] keeps what was used and gives back the rest exactly.
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

/// The limiter's reserve/commit protocol.
pub trait ReserveCommit {
    /// Take what the limiter allows now of up to `want` deliveries, `in_flight` being out.
    fn reserve(&mut self, limits: Limits, in_flight: u32, now_ms: i64, want: usize) -> Reservation;
    /// Give back `n` of the reserved tokens at once.
    fn release(&mut self, limits: Limits, r: &mut Reservation, n: usize);
    /// `used` of the reservation were sent: keep those, give back the rest exactly (and the
    /// breaker's probe when none was used).
    fn commit(&mut self, limits: Limits, r: Reservation, used: usize);
}

impl ReserveCommit for LimiterState {
    fn reserve(&mut self, limits: Limits, in_flight: u32, now_ms: i64, want: usize) -> Reservation {
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

    fn release(&mut self, limits: Limits, r: &mut Reservation, n: usize) {
        let n = n.min(r.granted);
        if n == 0 {
            return;
        }
        if let Some(b) = self.bucket.as_mut() {
            b.tokens = (b.tokens + n as f64).min(f64::from(limits.rate.burst));
        }
        r.granted -= n;
    }

    fn commit(&mut self, limits: Limits, mut r: Reservation, used: usize) {
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

/// Give `budget` sends to subscribers wanting `wants[i]`, one at a time round-robin from
/// `start`, so a subscriber with a deep queue never crowds out the others.
pub fn share(wants: &[usize], budget: usize, start: usize) -> Vec<usize> {
    let n = wants.len();
    let mut got = vec![0usize; n];
    if n == 0 {
        return got;
    }
    let mut left = budget;
    loop {
        let mut progressed = false;
        for k in 0..n {
            if left == 0 {
                return got;
            }
            let i = (start + k) % n;
            if got[i] < wants[i] {
                got[i] += 1;
                left -= 1;
                progressed = true;
            }
        }
        if !progressed {
            return got;
        }
    }
}

/// The attempt a result reports, for the limiter (pause, breaker); `None` when nothing was sent.
pub fn attempt_of(r: &DeliveryResult) -> Option<Attempt> {
    match r {
        DeliveryResult::Delivered { status, .. } => Some(Attempt::Status {
            status: *status,
            retry_after_ms: None,
        }),
        DeliveryResult::Deferred { .. } => None,
        DeliveryResult::Failed {
            status: Some(status),
            retry_after_ms,
            ..
        } => Some(Attempt::Status {
            status: *status,
            retry_after_ms: *retry_after_ms,
        }),
        DeliveryResult::Failed { error, .. } => {
            Some(Attempt::Transport(error.unwrap_or(TransportError::Connect)))
        }
        DeliveryResult::Rejected {
            status: Some(status),
            ..
        } => Some(Attempt::Status {
            status: *status,
            retry_after_ms: None,
        }),
        DeliveryResult::Rejected { .. } => Some(Attempt::Transport(TransportError::RefusedUrl)),
    }
}

fn describe(r: &DeliveryResult) -> String {
    match r {
        DeliveryResult::Failed {
            status: Some(s),
            error: Some(e),
            ..
        } => format!("status {s} ({})", e.as_str()),
        DeliveryResult::Failed {
            status: Some(s), ..
        } => format!("status {s}"),
        DeliveryResult::Failed { error: Some(e), .. } => e.as_str().to_string(),
        DeliveryResult::Failed { .. } => "failed".to_string(),
        DeliveryResult::Rejected {
            status: Some(s),
            reason,
            ..
        } => format!("{reason} (status {s})"),
        DeliveryResult::Rejected { reason, .. } => reason.clone(),
        other => other.outcome().to_string(),
    }
}

/// What `result` (for attempt number `attempt`) does to its delivery.
pub fn transition_for(
    result: &DeliveryResult,
    attempt: u32,
    rules: RetryRules,
    now_ms: i64,
    jitter: f64,
) -> Transition {
    match result {
        DeliveryResult::Delivered { .. } => Transition::Sent,
        DeliveryResult::Deferred { retry_after_ms, .. } => Transition::Defer {
            at_ms: now_ms + (*retry_after_ms).min(fanout_core::retry::MAX_RETRY_AFTER_MS) as i64,
        },
        DeliveryResult::Rejected { .. } => Transition::Dead {
            reason: describe(result),
        },
        DeliveryResult::Failed { .. } => {
            let Some(a) = attempt_of(result) else {
                return Transition::Dead {
                    reason: describe(result),
                };
            };
            let class = classify(&a);
            match next_step(&class, attempt, rules.max_attempts, now_ms, jitter) {
                Next::Sent => Transition::Sent,
                Next::Dead { reason } => Transition::Dead {
                    reason: format!("{reason}; last: {}", describe(result)),
                },
                Next::RetryAt { at_ms } => {
                    let delay = (at_ms - now_ms).max(0);
                    let scaled = match class {
                        Class::Retryable {
                            retry_after_ms: Some(_),
                        } => delay,
                        _ => rules.scale(delay),
                    };
                    Transition::Retry {
                        at_ms: now_ms + scaled,
                        error: describe(result),
                    }
                }
            }
        }
    }
}

/// The attempt record of a result, `None` for a deferral (nothing was sent).
/// `measured_latency_ms` stands in when the result carries none (a rejection by the origin lane).
pub fn attempt_record(
    result: &DeliveryResult,
    attempt: u32,
    lane: &'static str,
    at_ms: i64,
    measured_latency_ms: Option<u64>,
) -> Option<AttemptRecord> {
    let (status, latency_ms, body, error) = match result {
        DeliveryResult::Deferred { .. } => return None,
        DeliveryResult::Delivered {
            status, latency_ms, ..
        } => (Some(*status), Some(*latency_ms), None, None),
        DeliveryResult::Failed {
            status,
            response_body,
            error,
            latency_ms,
            ..
        } => (
            *status,
            *latency_ms,
            response_body.clone(),
            error.map(|e| e.as_str().to_string()),
        ),
        DeliveryResult::Rejected {
            status,
            reason,
            response_body,
            ..
        } => (*status, None, response_body.clone(), Some(reason.clone())),
    };
    Some(AttemptRecord {
        attempt,
        at_ms,
        lane,
        outcome: result.outcome(),
        status,
        latency_ms: latency_ms.or(measured_latency_ms),
        response_body: body.map(|b| fanout_core::retry::truncate_body(&b)),
        error,
    })
}

/// How long a batch waits after the edge was unreachable or failing, by consecutive failures:
/// 0.5 s doubling to 10 s.
pub fn edge_retry_ms(consecutive_failures: u32) -> u64 {
    (500u64 << consecutive_failures.min(5)).min(10_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_core::breaker::BreakerConfig;
    use fanout_core::bucket::Rate;

    /// What a reservation amounts to, for the table.
    #[derive(Debug, PartialEq)]
    enum Grant {
        Send(usize),
        Wait(u64),
        Full,
    }

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

    #[test]
    fn share_table() {
        let cases: &[(&[usize], usize, usize, &[usize])] = &[
            (&[10, 10, 10], 6, 0, &[2, 2, 2]),
            (&[10, 1, 10], 7, 0, &[3, 1, 3]),
            (&[10, 10, 10], 7, 1, &[2, 3, 2]),
            (&[1000, 2, 3], 10, 0, &[5, 2, 3]),
            (&[0, 0], 5, 0, &[0, 0]),
            (&[3, 4], 100, 0, &[3, 4]),
            (&[], 5, 0, &[]),
        ];
        for &(wants, budget, start, expected) in cases {
            assert_eq!(
                share(wants, budget, start),
                expected,
                "{wants:?} {budget} from {start}"
            );
        }
    }

    fn failed(
        status: Option<u16>,
        retry_after_ms: Option<u64>,
        error: Option<TransportError>,
    ) -> DeliveryResult {
        DeliveryResult::Failed {
            id: "d".into(),
            status,
            retry_after_ms,
            response_body: None,
            error,
            latency_ms: Some(5),
        }
    }

    #[test]
    fn transition_table() {
        let rules = RetryRules {
            max_attempts: 3,
            backoff_scale: 1.0,
        };
        let scaled = RetryRules {
            max_attempts: 3,
            backoff_scale: 0.01,
        };
        let now = 1_000_000;
        let cases: Vec<(&str, DeliveryResult, u32, RetryRules, Transition)> = vec![
            (
                "delivered",
                DeliveryResult::Delivered {
                    id: "d".into(),
                    status: 200,
                    latency_ms: 3,
                },
                1,
                rules,
                Transition::Sent,
            ),
            (
                "deferred: exactly retry_after_ms, no attempt spent",
                DeliveryResult::Deferred {
                    id: "d".into(),
                    retry_after_ms: 150,
                    reason: DeferReason::Rate,
                },
                3,
                rules,
                Transition::Defer { at_ms: now + 150 },
            ),
            (
                "rejected 410",
                DeliveryResult::Rejected {
                    id: "d".into(),
                    status: Some(410),
                    reason: "gone".into(),
                    response_body: None,
                },
                1,
                rules,
                Transition::Dead {
                    reason: "gone (status 410)".into(),
                },
            ),
            (
                "500: backoff 2^1 s with jitter 0",
                failed(Some(500), None, None),
                1,
                rules,
                Transition::Retry {
                    at_ms: now + 1_000,
                    error: "status 500".into(),
                },
            ),
            (
                "500: backoff scaled",
                failed(Some(500), None, None),
                2,
                scaled,
                Transition::Retry {
                    at_ms: now + 20,
                    error: "status 500".into(),
                },
            ),
            (
                "429: Retry-After wins, never scaled",
                failed(Some(429), Some(120_000), None),
                1,
                scaled,
                Transition::Retry {
                    at_ms: now + 120_000,
                    error: "status 429".into(),
                },
            ),
            (
                "timeout retries",
                failed(None, None, Some(TransportError::Timeout)),
                2,
                rules,
                Transition::Retry {
                    at_ms: now + 2_000,
                    error: "timeout".into(),
                },
            ),
            (
                "last attempt: dead",
                failed(Some(503), None, None),
                3,
                rules,
                Transition::Dead {
                    reason: "gave up after 3 attempts; last: status 503".into(),
                },
            ),
            (
                "404 in a failed result is still permanent",
                failed(Some(404), None, None),
                1,
                rules,
                Transition::Dead {
                    reason: "not_found; last: status 404".into(),
                },
            ),
            (
                "dns failure is permanent",
                failed(None, None, Some(TransportError::Dns)),
                1,
                rules,
                Transition::Dead {
                    reason: "dns; last: dns".into(),
                },
            ),
            (
                "redirect retries",
                failed(Some(302), None, Some(TransportError::Redirect)),
                1,
                rules,
                Transition::Retry {
                    at_ms: now + 1_000,
                    error: "status 302 (redirect)".into(),
                },
            ),
        ];
        for (name, result, attempt, rules, expected) in cases {
            assert_eq!(
                transition_for(&result, attempt, rules, now, 0.0),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn attempt_records() {
        let deferred = DeliveryResult::Deferred {
            id: "d".into(),
            retry_after_ms: 1,
            reason: DeferReason::Paused,
        };
        assert_eq!(attempt_record(&deferred, 1, "edge", 5, None), None);
        assert_eq!(attempt_of(&deferred), None);
        let long = "x".repeat(10_000);
        let busy = DeliveryResult::Failed {
            id: "d".into(),
            status: Some(429),
            retry_after_ms: Some(2000),
            response_body: Some(long),
            error: None,
            latency_ms: Some(7),
        };
        let rec = attempt_record(&busy, 2, "origin", 5, Some(1)).unwrap();
        assert_eq!(
            (
                rec.attempt,
                rec.lane,
                rec.outcome,
                rec.status,
                rec.latency_ms
            ),
            (2, "origin", "failed", Some(429), Some(7))
        );
        assert_eq!(
            rec.response_body.map(|b| b.len()),
            Some(fanout_core::wire::RESPONSE_BODY_LIMIT)
        );
        assert_eq!(
            attempt_of(&busy),
            Some(Attempt::Status {
                status: 429,
                retry_after_ms: Some(2000)
            })
        );
        let timeout = failed(None, None, Some(TransportError::Timeout));
        assert_eq!(
            attempt_record(&timeout, 1, "origin", 5, None)
                .unwrap()
                .error
                .as_deref(),
            Some("timeout")
        );
    }

    #[test]
    fn edge_retry_table() {
        let cases: &[(u32, u64)] = &[
            (0, 500),
            (1, 1_000),
            (2, 2_000),
            (4, 8_000),
            (5, 10_000),
            (60, 10_000),
        ];
        for &(n, ms) in cases {
            assert_eq!(edge_retry_ms(n), ms, "{n}");
        }
    }
}
