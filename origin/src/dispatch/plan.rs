//! The dispatcher's pure decisions about results: what a result does to a delivery (state
//! transitions), the attempt it records, and how long an edge in trouble is waited for.
//! Time and jitter come in as arguments; nothing here does I/O, keeps state or sees the
//! ledger (`super::state` applies these decisions).

use fanout_core::retry::{classify, next_step, Attempt, Class, Next};
use fanout_core::wire::{DeliveryResult, TransportError};

use crate::model::{AttemptRecord, Lane, Transition};

/// The retry rules in force (docs/src/webhooks.md, "Retries, pauses and the breaker"), with a
/// scale for tests.
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
    lane: Lane,
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
        lane: lane.as_str(),
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
    use fanout_core::wire::DeferReason;

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
        let now = 1_000_000;
        for (name, result, attempt, rules, expected) in transition_cases(now) {
            assert_eq!(
                transition_for(&result, attempt, rules, now, 0.0),
                expected,
                "{name}"
            );
        }
    }

    /// (name, result, attempt number, rules, expected transition) at `now`.
    type TransitionCase = (&'static str, DeliveryResult, u32, RetryRules, Transition);

    fn transition_cases(now: i64) -> Vec<TransitionCase> {
        let rules = RetryRules {
            max_attempts: 3,
            backoff_scale: 1.0,
        };
        let scaled = RetryRules {
            max_attempts: 3,
            backoff_scale: 0.01,
        };
        vec![
            (
                "delivered",
                DeliveryResult::Delivered {
                    id: "d".into(),
                    status: 200,
                    latency_ms: 3,
                    failed: Vec::new(),
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
        ]
        .into_iter()
        .chain(later_cases(now, rules, scaled))
        .collect()
    }

    /// More of [`transition_cases`].
    fn later_cases(now: i64, rules: RetryRules, scaled: RetryRules) -> Vec<TransitionCase> {
        vec![
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
        ]
    }

    #[test]
    fn attempt_records() {
        let deferred = DeliveryResult::Deferred {
            id: "d".into(),
            retry_after_ms: 1,
            reason: DeferReason::Paused,
        };
        assert_eq!(attempt_record(&deferred, 1, Lane::Edge, 5, None), None);
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
        let rec = attempt_record(&busy, 2, Lane::Origin, 5, Some(1)).unwrap();
        assert_eq!(
            (
                rec.attempt,
                rec.lane,
                rec.outcome,
                rec.status,
                rec.latency_ms
            ),
            (2, Lane::Origin.as_str(), "failed", Some(429), Some(7))
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
            attempt_record(&timeout, 1, Lane::Origin, 5, None)
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
