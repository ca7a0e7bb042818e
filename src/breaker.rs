//! Circuit breaker: after `threshold` consecutive failures it opens for `cooldown_ms`, then lets
//! exactly one probe through; the probe's success closes it, its failure re-opens it.

use serde::{Deserialize, Serialize};

/// When a breaker opens and how long it holds: the origin's `--breaker-threshold` and
/// `--breaker-cooldown`, carried to the edge in every call (`wire::SubscriberSpec::breaker`) so
/// that a subscriber's breaker means the same on both lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    pub threshold: u32,
    pub cooldown_ms: i64,
}

/// The most consecutive failures a breaker may be set to wait for.
pub const MAX_THRESHOLD: u32 = 1000;
/// The shortest and longest cooldowns a breaker may be set to.
pub const MIN_COOLDOWN_MS: i64 = 1_000;
pub const MAX_COOLDOWN_MS: i64 = 3_600_000;

impl BreakerConfig {
    /// A threshold of 1 to [`MAX_THRESHOLD`] and a cooldown of [`MIN_COOLDOWN_MS`] to
    /// [`MAX_COOLDOWN_MS`], or what is wrong (named as the wire's fields).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_THRESHOLD).contains(&self.threshold) {
            return Err(format!(
                "threshold must be 1 to {MAX_THRESHOLD}, not {}",
                self.threshold
            ));
        }
        if !(MIN_COOLDOWN_MS..=MAX_COOLDOWN_MS).contains(&self.cooldown_ms) {
            return Err(format!(
                "cooldown_ms must be {MIN_COOLDOWN_MS} to {MAX_COOLDOWN_MS}, not {}",
                self.cooldown_ms
            ));
        }
        Ok(())
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            threshold: 20,
            cooldown_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Breaker {
    pub consecutive_failures: u32,
    /// Open until this unix ms; `None` when closed.
    pub open_until_ms: Option<i64>,
    /// When the half-open probe was let through, if one is out.
    pub probe_started_ms: Option<i64>,
}

/// What the breaker allows right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Closed,
    /// Half-open: exactly one request may go.
    Probe,
    Open {
        retry_after_ms: u64,
    },
}

/// The breaker's state as views show it (`closed`, `open`, `half_open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerView {
    pub state: BreakerState,
    pub consecutive_failures: u32,
    pub open_until_ms: Option<i64>,
}

impl Breaker {
    pub fn admit(&self, cfg: BreakerConfig, now_ms: i64) -> Admission {
        let Some(until) = self.open_until_ms else {
            return Admission::Closed;
        };
        if now_ms < until {
            return Admission::Open {
                retry_after_ms: (until - now_ms) as u64,
            };
        }
        match self.probe_started_ms {
            // A probe is out; if it was lost (eviction, crash) for a whole cool-down, allow another.
            Some(started) if now_ms - started < cfg.cooldown_ms => Admission::Open {
                retry_after_ms: (started + cfg.cooldown_ms - now_ms) as u64,
            },
            _ => Admission::Probe,
        }
    }

    pub fn start_probe(&mut self, now_ms: i64) {
        self.probe_started_ms = Some(now_ms);
    }

    pub fn on_success(&mut self) {
        *self = Breaker::default();
    }

    /// An answer that is neither success nor failure (a 429 or 503 with `Retry-After`): the
    /// run of failures stands as it was, and a probe out is over without a verdict (the next
    /// one may go when the subscriber's pause allows).
    pub fn on_pushback(&mut self) {
        self.probe_started_ms = None;
    }

    pub fn on_failure(&mut self, cfg: BreakerConfig, now_ms: i64) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        let probe_failed = self.probe_started_ms.is_some();
        if probe_failed || self.consecutive_failures >= cfg.threshold {
            self.open_until_ms = Some(now_ms + cfg.cooldown_ms);
            self.probe_started_ms = None;
        }
    }

    pub fn view(&self, cfg: BreakerConfig, now_ms: i64) -> BreakerView {
        let state = match self.admit(cfg, now_ms) {
            Admission::Closed => BreakerState::Closed,
            Admission::Probe => BreakerState::HalfOpen,
            Admission::Open { .. } if self.probe_started_ms.is_some() => BreakerState::HalfOpen,
            Admission::Open { .. } => BreakerState::Open,
        };
        BreakerView {
            state,
            consecutive_failures: self.consecutive_failures,
            open_until_ms: self.open_until_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BreakerConfig = BreakerConfig {
        threshold: 3,
        cooldown_ms: 1000,
    };

    #[test]
    fn opens_after_threshold_then_probes() {
        let mut b = Breaker::default();
        for _ in 0..2 {
            b.on_failure(CFG, 0);
            assert_eq!(b.admit(CFG, 0), Admission::Closed);
        }
        b.on_failure(CFG, 0);
        assert_eq!(
            b.admit(CFG, 0),
            Admission::Open {
                retry_after_ms: 1000
            }
        );
        assert_eq!(b.admit(CFG, 999), Admission::Open { retry_after_ms: 1 });
        assert_eq!(b.admit(CFG, 1000), Admission::Probe);
        b.start_probe(1000);
        assert_eq!(
            b.admit(CFG, 1001),
            Admission::Open {
                retry_after_ms: 999
            }
        );
        assert_eq!(b.view(CFG, 1001).state, BreakerState::HalfOpen);
    }

    #[test]
    fn probe_outcomes() {
        // (probe succeeds?) -> admission right after
        for (ok, expected) in [
            (true, Admission::Closed),
            (
                false,
                Admission::Open {
                    retry_after_ms: 1000,
                },
            ),
        ] {
            let mut b = Breaker {
                consecutive_failures: 3,
                open_until_ms: Some(0),
                probe_started_ms: None,
            };
            assert_eq!(b.admit(CFG, 10), Admission::Probe);
            b.start_probe(10);
            if ok {
                b.on_success()
            } else {
                b.on_failure(CFG, 10)
            }
            assert_eq!(b.admit(CFG, 10), expected, "probe ok={ok}");
        }
    }

    #[test]
    fn lost_probe_is_replaced_after_a_cooldown() {
        let mut b = Breaker {
            consecutive_failures: 3,
            open_until_ms: Some(0),
            probe_started_ms: None,
        };
        b.start_probe(0);
        assert!(matches!(b.admit(CFG, 500), Admission::Open { .. }));
        assert_eq!(b.admit(CFG, 1000), Admission::Probe);
    }

    #[test]
    fn success_resets_the_count() {
        let mut b = Breaker::default();
        b.on_failure(CFG, 0);
        b.on_failure(CFG, 0);
        b.on_success();
        b.on_failure(CFG, 0);
        assert_eq!(b.admit(CFG, 0), Admission::Closed);
        assert_eq!(b.view(CFG, 0).consecutive_failures, 1);
    }
}
