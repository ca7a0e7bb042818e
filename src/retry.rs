//! Retry rules shared by both lanes: `Retry-After` parsing, outcome classification, backoff with
//! jitter, and the next step for a delivery after an attempt.

use crate::wire::{DeliveryResult, TransportError, RESPONSE_BODY_LIMIT};

/// Longest backoff between two attempts (without a `Retry-After`).
pub const MAX_BACKOFF_MS: u64 = 600_000;
/// A subscriber's `Retry-After` is obeyed up to a day.
pub const MAX_RETRY_AFTER_MS: u64 = 86_400_000;
/// Attempts before a delivery is dead.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// Parse a `Retry-After` value, either delta-seconds or an HTTP-date, into milliseconds from
/// `now_ms`. A date in the past means "now" (0). Garbage gives `None`.
pub fn parse_retry_after(value: &str, now_ms: i64) -> Option<u64> {
    let v = value.trim();
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = v.parse().ok()?;
        return Some(secs.saturating_mul(1000).min(MAX_RETRY_AFTER_MS));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at_ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis()
        .min(i64::MAX as u128) as i64;
    Some((at_ms.saturating_sub(now_ms)).clamp(0, MAX_RETRY_AFTER_MS as i64) as u64)
}

/// What one attempt came to, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Status {
        status: u16,
        retry_after_ms: Option<u64>,
    },
    Transport(TransportError),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    Success,
    Retryable { retry_after_ms: Option<u64> },
    Permanent { reason: &'static str },
}

/// 2xx succeed; 404, 410, refused URLs, non-existent names and TLS failures are permanent;
/// everything else (408, 425, 429, 5xx, other 4xx, 3xx, timeouts, connection errors) retries.
pub fn classify(attempt: &Attempt) -> Class {
    match *attempt {
        Attempt::Status { status, .. } if (200..300).contains(&status) => Class::Success,
        Attempt::Status { status: 404, .. } => Class::Permanent {
            reason: "not_found",
        },
        Attempt::Status { status: 410, .. } => Class::Permanent { reason: "gone" },
        Attempt::Status { retry_after_ms, .. } => Class::Retryable { retry_after_ms },
        Attempt::Transport(TransportError::Dns) => Class::Permanent { reason: "dns" },
        Attempt::Transport(TransportError::Tls) => Class::Permanent { reason: "tls" },
        Attempt::Transport(TransportError::RefusedUrl) => Class::Permanent {
            reason: "refused_url",
        },
        Attempt::Transport(
            TransportError::Timeout
            | TransportError::Connect
            | TransportError::Redirect
            | TransportError::NamedFailed,
        ) => Class::Retryable {
            retry_after_ms: None,
        },
    }
}

/// `min(600 s, 2^attempt × U[0.5, 1.0])`, with `jitter` in [0, 1] drawn by the caller.
pub fn backoff_ms(attempt: u32, jitter: f64) -> u64 {
    let factor = 0.5 + 0.5 * jitter.clamp(0.0, 1.0);
    let base_ms = 2f64.powi(attempt.min(30) as i32) * 1000.0;
    ((base_ms * factor) as u64).min(MAX_BACKOFF_MS)
}

/// What happens to a delivery after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Sent,
    RetryAt { at_ms: i64 },
    Dead { reason: String },
}

/// `attempt` is the number of the attempt just made (1-based).
pub fn next_step(class: &Class, attempt: u32, max_attempts: u32, now_ms: i64, jitter: f64) -> Next {
    match class {
        Class::Success => Next::Sent,
        Class::Permanent { reason } => Next::Dead {
            reason: (*reason).to_string(),
        },
        Class::Retryable { .. } if attempt >= max_attempts => Next::Dead {
            reason: format!("gave up after {attempt} attempts"),
        },
        Class::Retryable { retry_after_ms } => {
            let delay = retry_after_ms.unwrap_or_else(|| backoff_ms(attempt, jitter));
            Next::RetryAt {
                at_ms: now_ms + delay as i64,
            }
        }
    }
}

/// Cut a response body to [`RESPONSE_BODY_LIMIT`] bytes at a character boundary.
pub fn truncate_body(body: &str) -> String {
    if body.len() <= RESPONSE_BODY_LIMIT {
        return body.to_string();
    }
    let mut end = RESPONSE_BODY_LIMIT;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].to_string()
}

/// Turn one attempt into the wire result both lanes report.
pub fn result_for(
    id: &str,
    attempt: &Attempt,
    latency_ms: u64,
    response_body: Option<&str>,
) -> DeliveryResult {
    let id = id.to_string();
    let body = response_body.filter(|b| !b.is_empty()).map(truncate_body);
    match (classify(attempt), attempt) {
        (Class::Success, Attempt::Status { status, .. }) => DeliveryResult::Delivered {
            id,
            status: *status,
            latency_ms,
            failed: Vec::new(),
        },
        (Class::Permanent { reason }, Attempt::Status { status, .. }) => DeliveryResult::Rejected {
            id,
            status: Some(*status),
            reason: reason.to_string(),
            response_body: body,
        },
        (Class::Permanent { reason }, Attempt::Transport(_)) => DeliveryResult::Rejected {
            id,
            status: None,
            reason: reason.to_string(),
            response_body: None,
        },
        (
            _,
            Attempt::Status {
                status,
                retry_after_ms,
            },
        ) => DeliveryResult::Failed {
            id,
            status: Some(*status),
            retry_after_ms: *retry_after_ms,
            response_body: body,
            error: if (300..400).contains(status) {
                Some(TransportError::Redirect)
            } else {
                None
            },
            latency_ms: Some(latency_ms),
        },
        (_, Attempt::Transport(e)) => DeliveryResult::Failed {
            id,
            status: None,
            retry_after_ms: None,
            response_body: None,
            error: Some(*e),
            latency_ms: Some(latency_ms),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_table() {
        // Sun, 06 Nov 1994 08:49:37 GMT = 784111777 s.
        let now = 784_111_777_000i64;
        let cases: &[(&str, Option<u64>)] = &[
            ("120", Some(120_000)),
            (" 2 ", Some(2_000)),
            ("0", Some(0)),
            ("Sun, 06 Nov 1994 08:49:47 GMT", Some(10_000)),
            ("Sunday, 06-Nov-94 08:49:47 GMT", Some(10_000)),
            ("Sun Nov  6 08:49:47 1994", Some(10_000)),
            ("Sun, 06 Nov 1994 08:49:27 GMT", Some(0)), // in the past
            ("99999999999", Some(MAX_RETRY_AFTER_MS)),
            ("-5", None),
            ("1.5", None),
            ("soon", None),
            ("", None),
        ];
        for &(input, expected) in cases {
            assert_eq!(parse_retry_after(input, now), expected, "{input:?}");
        }
    }

    #[test]
    fn classification_table() {
        use TransportError::*;
        let st = |status| Attempt::Status {
            status,
            retry_after_ms: None,
        };
        let retry = Class::Retryable {
            retry_after_ms: None,
        };
        let cases: Vec<(Attempt, Class)> = vec![
            (st(200), Class::Success),
            (st(204), Class::Success),
            (st(299), Class::Success),
            (st(302), retry.clone()),
            (st(400), retry.clone()),
            (
                st(404),
                Class::Permanent {
                    reason: "not_found",
                },
            ),
            (st(408), retry.clone()),
            (st(410), Class::Permanent { reason: "gone" }),
            (st(425), retry.clone()),
            (
                Attempt::Status {
                    status: 429,
                    retry_after_ms: Some(120_000),
                },
                Class::Retryable {
                    retry_after_ms: Some(120_000),
                },
            ),
            (st(500), retry.clone()),
            (st(503), retry.clone()),
            (Attempt::Transport(Timeout), retry.clone()),
            (Attempt::Transport(Connect), retry.clone()),
            (Attempt::Transport(Redirect), retry.clone()),
            (Attempt::Transport(Dns), Class::Permanent { reason: "dns" }),
            (Attempt::Transport(Tls), Class::Permanent { reason: "tls" }),
            (
                Attempt::Transport(RefusedUrl),
                Class::Permanent {
                    reason: "refused_url",
                },
            ),
        ];
        for (attempt, expected) in cases {
            assert_eq!(classify(&attempt), expected, "{attempt:?}");
        }
    }

    #[test]
    fn backoff_table() {
        let cases: &[(u32, f64, u64)] = &[
            (1, 0.0, 1_000),
            (1, 1.0, 2_000),
            (3, 0.5, 6_000),
            (8, 1.0, 256_000),
            (9, 0.0, 256_000),
            (10, 1.0, 600_000),
            (40, 0.3, 600_000),
            (2, 7.0, 4_000), // jitter clamped
        ];
        for &(attempt, jitter, expected) in cases {
            assert_eq!(
                backoff_ms(attempt, jitter),
                expected,
                "attempt {attempt} jitter {jitter}"
            );
        }
    }

    #[test]
    fn next_step_table() {
        let retry = Class::Retryable {
            retry_after_ms: None,
        };
        let ra = Class::Retryable {
            retry_after_ms: Some(120_000),
        };
        let cases: Vec<(Class, u32, Next)> = vec![
            (Class::Success, 1, Next::Sent),
            (
                retry.clone(),
                1,
                Next::RetryAt {
                    at_ms: 1_000 + 1_000,
                },
            ),
            (
                retry.clone(),
                7,
                Next::RetryAt {
                    at_ms: 1_000 + 64_000,
                },
            ),
            (
                retry.clone(),
                8,
                Next::Dead {
                    reason: "gave up after 8 attempts".into(),
                },
            ),
            (
                ra.clone(),
                2,
                Next::RetryAt {
                    at_ms: 1_000 + 120_000,
                },
            ), // Retry-After wins
            (
                Class::Permanent { reason: "gone" },
                1,
                Next::Dead {
                    reason: "gone".into(),
                },
            ),
        ];
        for (class, attempt, expected) in cases {
            assert_eq!(
                next_step(&class, attempt, 8, 1_000, 0.0),
                expected,
                "{class:?} #{attempt}"
            );
        }
    }

    #[test]
    fn results_per_attempt() {
        let ok = result_for(
            "d",
            &Attempt::Status {
                status: 200,
                retry_after_ms: None,
            },
            5,
            Some("hi"),
        );
        assert_eq!(
            ok,
            DeliveryResult::Delivered {
                id: "d".into(),
                status: 200,
                latency_ms: 5,
                failed: Vec::new(),
            }
        );
        let gone = result_for(
            "d",
            &Attempt::Status {
                status: 410,
                retry_after_ms: None,
            },
            5,
            None,
        );
        assert_eq!(gone.outcome(), "rejected");
        let redirect = result_for(
            "d",
            &Attempt::Status {
                status: 302,
                retry_after_ms: None,
            },
            5,
            None,
        );
        assert!(matches!(
            redirect,
            DeliveryResult::Failed {
                status: Some(302),
                error: Some(TransportError::Redirect),
                ..
            }
        ));
        let long = "é".repeat(3000);
        let busy = result_for(
            "d",
            &Attempt::Status {
                status: 429,
                retry_after_ms: Some(2000),
            },
            5,
            Some(&long),
        );
        match busy {
            DeliveryResult::Failed {
                retry_after_ms: Some(2000),
                response_body: Some(b),
                ..
            } => {
                assert!(b.len() <= RESPONSE_BODY_LIMIT && b.len() >= RESPONSE_BODY_LIMIT - 1)
            }
            other => panic!("unexpected {other:?}"),
        }
        let timeout = result_for("d", &Attempt::Transport(TransportError::Timeout), 100, None);
        assert!(matches!(
            timeout,
            DeliveryResult::Failed {
                error: Some(TransportError::Timeout),
                status: None,
                ..
            }
        ));
    }
}
