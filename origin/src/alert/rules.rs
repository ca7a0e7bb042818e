//! When a subscriber's trouble is worth an operator's attention, and when it is disabled.
//! Pure: times, counts and the previous state come in as arguments; the dispatcher keeps the
//! state (in the ledger) and the sender does the I/O.
//!
//! Alerts fire on a change, never per delivery: the breaker going from closed to open (a failed
//! half-open probe re-opens it without a new alert), the dead count crossing the threshold from
//! below (re-armed only once it is back below), and the subscriber becoming disabled.

use fanout_core::breaker::Breaker;
use fanout_core::retry::{classify, Attempt, Class};

use crate::model::{Disabled, Health};

pub const DEFAULT_DEAD_THRESHOLD: u64 = 100;
pub const DEFAULT_DISABLE_AFTER_MS: i64 = 5 * 86_400_000;

/// The thresholds in force (`--dead-alert-threshold`, `--disable-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlertRules {
    /// Alert when this many of a subscriber's deliveries are dead (at least 1).
    pub dead_threshold: u64,
    /// Disable a subscriber whose attempts have all failed for this long; `None`: never.
    pub disable_after_ms: Option<i64>,
}

impl Default for AlertRules {
    fn default() -> Self {
        AlertRules {
            dead_threshold: DEFAULT_DEAD_THRESHOLD,
            disable_after_ms: Some(DEFAULT_DISABLE_AFTER_MS),
        }
    }
}

/// An operational event about one subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alert {
    BreakerOpened {
        consecutive_failures: u32,
        open_until_ms: i64,
        last_error: Option<String>,
    },
    DeadThreshold {
        /// At least this many are dead (the count stops at the threshold).
        dead: u64,
        threshold: u64,
    },
    Disabled {
        reason: String,
        failing_since_ms: Option<i64>,
    },
    /// A delivery went dead for a failure that is not the subscriber's: the daemon could not
    /// sign or encode it, or the edge refused it on its own, up to the attempt limit.
    DeliveryNotSent {
        delivery: String,
        event_id: String,
        reason: String,
    },
}

impl Alert {
    /// The event's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Alert::BreakerOpened { .. } => "fanout.subscriber.breaker_opened",
            Alert::DeadThreshold { .. } => "fanout.subscriber.dead_threshold",
            Alert::Disabled { .. } => "fanout.subscriber.disabled",
            Alert::DeliveryNotSent { .. } => "fanout.delivery.not_sent",
        }
    }

    /// The event's `details`.
    pub fn details(&self) -> serde_json::Value {
        match self {
            Alert::BreakerOpened {
                consecutive_failures,
                open_until_ms,
                last_error,
            } => serde_json::json!({
                "consecutive_failures": consecutive_failures,
                "open_until_ms": open_until_ms,
                "last_error": last_error,
            }),
            Alert::DeadThreshold { dead, threshold } => {
                serde_json::json!({ "dead": dead, "threshold": threshold })
            }
            Alert::Disabled {
                reason,
                failing_since_ms,
            } => serde_json::json!({
                "reason": reason,
                "failing_since_ms": failing_since_ms,
            }),
            Alert::DeliveryNotSent {
                delivery,
                event_id,
                reason,
            } => serde_json::json!({
                "delivery": delivery,
                "event_id": event_id,
                "reason": reason,
            }),
        }
    }
}

/// One attempt as the rules see it: when, what came back, and the subscriber's breaker before
/// and after the attempt was counted.
#[derive(Debug, Clone)]
pub struct Seen<'a> {
    pub at_ms: i64,
    pub attempt: &'a Attempt,
    pub breaker_before: &'a Breaker,
    pub breaker_after: &'a Breaker,
    /// What went wrong, in a few words, for the alert.
    pub error: Option<&'a str>,
}

/// What one attempt changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterAttempt {
    pub health: Health,
    pub alerts: Vec<Alert>,
}

/// Fold one attempt into a subscriber's health: a success ends a run of failures; a 410 disables
/// at once; a failure `disable_after_ms` or more after the run began disables; the breaker
/// opening from closed is reported.
pub fn after_attempt(prev: &Health, seen: &Seen<'_>, rules: &AlertRules) -> AfterAttempt {
    let mut health = prev.clone();
    let mut alerts = Vec::new();
    let failed = !matches!(classify(seen.attempt), Class::Success);
    health.failing_since_ms = if failed {
        Some(prev.failing_since_ms.unwrap_or(seen.at_ms))
    } else {
        None
    };
    if seen.breaker_before.open_until_ms.is_none() {
        if let Some(open_until_ms) = seen.breaker_after.open_until_ms {
            alerts.push(Alert::BreakerOpened {
                consecutive_failures: seen.breaker_after.consecutive_failures,
                open_until_ms,
                last_error: seen.error.map(str::to_string),
            });
        }
    }
    if prev.disabled.is_none() && failed {
        let gone = matches!(seen.attempt, Attempt::Status { status: 410, .. });
        let reason = match (health.failing_since_ms, rules.disable_after_ms) {
            _ if gone => Some("the endpoint answered 410 Gone".to_string()),
            (Some(since), Some(after)) if seen.at_ms - since >= after => Some(format!(
                "every attempt failed for {} (since {}); last: {}",
                crate::duration::format_duration(after),
                crate::time::format_rfc3339(since),
                seen.error.unwrap_or("failed"),
            )),
            _ => None,
        };
        if let Some(reason) = reason {
            health.disabled = Some(Disabled {
                at_ms: seen.at_ms,
                reason: reason.clone(),
                by_operator: false,
            });
            alerts.push(Alert::Disabled {
                reason,
                failing_since_ms: health.failing_since_ms,
            });
        }
    }
    AfterAttempt { health, alerts }
}

/// The dead-count rule: `alerted` says whether the current crossing was already reported;
/// `dead` is the subscriber's dead count (it may stop counting at the threshold). Returns the
/// new `alerted` and the alert to send, if any.
pub fn after_dead_count(alerted: bool, dead: u64, threshold: u64) -> (bool, Option<Alert>) {
    let threshold = threshold.max(1);
    match (dead >= threshold, alerted) {
        (true, false) => (true, Some(Alert::DeadThreshold { dead, threshold })),
        (true, true) => (true, None),
        (false, _) => (false, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_core::wire::TransportError;

    const DAY: i64 = 86_400_000;
    const RULES: AlertRules = AlertRules {
        dead_threshold: 100,
        disable_after_ms: Some(5 * DAY),
    };

    fn status(status: u16) -> Attempt {
        Attempt::Status {
            status,
            retry_after_ms: None,
        }
    }

    fn closed() -> Breaker {
        Breaker::default()
    }

    fn open(failures: u32, until: i64) -> Breaker {
        Breaker {
            consecutive_failures: failures,
            open_until_ms: Some(until),
            probe_started_ms: None,
        }
    }

    fn failing(since: i64) -> Health {
        Health {
            failing_since_ms: Some(since),
            disabled: None,
        }
    }

    fn disabled(since: Option<i64>) -> Health {
        Health {
            failing_since_ms: since,
            disabled: Some(Disabled {
                at_ms: 1,
                reason: "x".into(),
                by_operator: false,
            }),
        }
    }

    /// What the table checks of an outcome: failing since, disabled, alert kinds.
    type Expect = (Option<i64>, bool, &'static [&'static str]);
    /// A case: name, health before, the attempt, when, the breaker before and after, the rules.
    type Row = (
        &'static str,
        Health,
        Attempt,
        i64,
        Breaker,
        Breaker,
        AlertRules,
        Expect,
    );

    /// Each row's attempt after its previous health, compared with what it expects.
    fn check(cases: Vec<Row>) {
        for (name, prev, attempt, at_ms, before, after, rules, expected) in cases {
            let seen = Seen {
                at_ms,
                attempt: &attempt,
                breaker_before: &before,
                breaker_after: &after,
                error: Some("status 500"),
            };
            let out = after_attempt(&prev, &seen, &rules);
            let kinds: Vec<&str> = out.alerts.iter().map(Alert::kind).collect();
            assert_eq!(
                (
                    out.health.failing_since_ms,
                    out.health.disabled.is_some(),
                    kinds.as_slice()
                ),
                expected,
                "{name}"
            );
        }
    }

    /// Runs of failures and the breaker's alert.
    #[test]
    fn attempt_table_runs_and_breaker() {
        let timeout = || Attempt::Transport(TransportError::Timeout);
        check(vec![
            (
                "first failure starts the run",
                Health::default(),
                status(500),
                10,
                closed(),
                closed(),
                RULES,
                (Some(10), false, &[]),
            ),
            (
                "a later failure keeps the start",
                failing(10),
                timeout(),
                20,
                closed(),
                closed(),
                RULES,
                (Some(10), false, &[]),
            ),
            (
                "a success ends the run",
                failing(10),
                status(200),
                20,
                closed(),
                closed(),
                RULES,
                (None, false, &[]),
            ),
            (
                "the breaker opening from closed is reported",
                failing(10),
                status(500),
                20,
                closed(),
                open(20, 30_020),
                RULES,
                (Some(10), false, &["fanout.subscriber.breaker_opened"]),
            ),
            (
                "a failed probe re-opens it without a new alert",
                failing(10),
                status(500),
                40_000,
                open(20, 30_020),
                open(21, 70_000),
                RULES,
                (Some(10), false, &[]),
            ),
        ]);
    }

    /// Disabling: at once on a 410, after failing for the whole limit, once.
    #[test]
    fn attempt_table_disabling() {
        let timeout = || Attempt::Transport(TransportError::Timeout);
        check(vec![
            (
                "a 410 disables at once",
                Health::default(),
                status(410),
                10,
                closed(),
                closed(),
                RULES,
                (Some(10), true, &["fanout.subscriber.disabled"]),
            ),
            (
                "a 404 does not disable",
                Health::default(),
                status(404),
                10,
                closed(),
                closed(),
                RULES,
                (Some(10), false, &[]),
            ),
            (
                "failing just short of the limit",
                failing(0),
                status(503),
                5 * DAY - 1,
                open(30, 5 * DAY),
                open(31, 6 * DAY),
                RULES,
                (Some(0), false, &[]),
            ),
            (
                "failing for the whole limit disables",
                failing(0),
                status(503),
                5 * DAY,
                open(30, 5 * DAY),
                open(31, 6 * DAY),
                RULES,
                (Some(0), true, &["fanout.subscriber.disabled"]),
            ),
            (
                "a test-sized limit",
                failing(1000),
                timeout(),
                3000,
                closed(),
                closed(),
                AlertRules {
                    disable_after_ms: Some(2000),
                    ..RULES
                },
                (Some(1000), true, &["fanout.subscriber.disabled"]),
            ),
            (
                "no limit: never disabled for failing",
                failing(0),
                status(500),
                100 * DAY,
                open(30, 0),
                open(31, 1),
                AlertRules {
                    disable_after_ms: None,
                    ..RULES
                },
                (Some(0), false, &[]),
            ),
            (
                "already disabled: not again",
                disabled(Some(0)),
                status(410),
                6 * DAY,
                closed(),
                closed(),
                RULES,
                (Some(0), true, &[]),
            ),
            (
                "breaker and disable in one attempt",
                failing(0),
                status(410),
                10,
                closed(),
                open(20, 30_010),
                RULES,
                (
                    Some(0),
                    true,
                    &[
                        "fanout.subscriber.breaker_opened",
                        "fanout.subscriber.disabled",
                    ],
                ),
            ),
            (
                "a success while disabled stays disabled",
                disabled(Some(0)),
                status(200),
                10,
                closed(),
                closed(),
                RULES,
                (None, true, &[]),
            ),
        ]);
    }

    #[test]
    fn disabling_says_why_and_when() {
        let attempt = status(410);
        let seen = Seen {
            at_ms: 77,
            attempt: &attempt,
            breaker_before: &closed(),
            breaker_after: &closed(),
            error: None,
        };
        let out = after_attempt(&Health::default(), &seen, &RULES);
        let d = out.health.disabled.unwrap();
        assert_eq!(
            (d.at_ms, d.reason.as_str()),
            (77, "the endpoint answered 410 Gone")
        );
        let attempt = status(500);
        let seen = Seen {
            at_ms: 5 * DAY,
            attempt: &attempt,
            error: Some("status 500"),
            ..seen
        };
        let out = after_attempt(&failing(0), &seen, &RULES);
        let reason = out.health.disabled.unwrap().reason;
        assert!(reason.contains("for 5d"), "{reason}");
        assert!(reason.contains("1970-01-01T00:00:00.000Z"), "{reason}");
        assert!(reason.ends_with("last: status 500"), "{reason}");
    }

    #[test]
    fn dead_count_table() {
        // (alerted before, dead count, threshold) -> (alerted after, alert sent)
        let cases: &[(bool, u64, u64, bool, bool)] = &[
            (false, 0, 100, false, false),
            (false, 99, 100, false, false),
            (false, 100, 100, true, true),
            (true, 100, 100, true, false),
            (true, 5000, 100, true, false),
            (true, 99, 100, false, false), // back below (a replay): re-armed
            (false, 150, 100, true, true), // the next crossing alerts again
            (false, 1, 1, true, true),
            (false, 1, 0, true, true), // a threshold of 0 means 1
        ];
        for &(alerted, dead, threshold, after, alert) in cases {
            let (now, sent) = after_dead_count(alerted, dead, threshold);
            assert_eq!(
                (now, sent.is_some()),
                (after, alert),
                "{alerted} {dead}/{threshold}"
            );
        }
        let (_, sent) = after_dead_count(false, 100, 100);
        assert_eq!(
            sent.map(|a| (a.kind(), a.details())),
            Some((
                "fanout.subscriber.dead_threshold",
                serde_json::json!({ "dead": 100, "threshold": 100 })
            ))
        );
    }
}
