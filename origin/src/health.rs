//! What `/healthz` reports: whether the dispatcher is running and keeps turning, and whether the
//! ledger can write. Everything here is atomics, written by the parts themselves (the
//! dispatcher's loop beats, the ledger notes its failed writes and recoveries, the supervisor
//! marks a dispatcher that ended); asking never waits behind the writer or the dispatcher.
//!
//! The verdict is a pure function of those figures and `now` ([`verdict`]), tested by a table.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::ledger::{Unavailable, WriteState};

/// The dispatcher's loop turns at least every few seconds (its rescan); one that has not beaten
/// for this long is stalled.
pub const STALL_AFTER_MS: i64 = 30_000;

/// The dispatcher's liveness, for `/healthz` (beaten by its executor's loop): the time (unix ms) its loop last began a turn, 0
/// before the first. A running dispatcher beats at least every couple of seconds
/// (`RESCAN_EVERY_MS`) plus the time of one ledger write; a dispatcher stuck behind the ledger
/// or stopped does not. Cheap to clone; every clone reads the same beat.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat(Arc<AtomicI64>);

impl Heartbeat {
    pub fn beat(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::Relaxed);
    }

    /// The last beat (unix ms), 0 if none yet.
    pub fn last_ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The shared health handle: cheap to clone, read with atomics only.
#[derive(Debug, Clone)]
pub struct Health {
    /// The dispatcher loop's last turn (unix ms; 0 before its first).
    heartbeat: Heartbeat,
    /// Set by the supervisor when the dispatcher task has ended (returned or panicked).
    dispatcher_ended: Arc<AtomicBool>,
    writes: Arc<WriteState>,
}

impl Health {
    pub fn new(writes: Arc<WriteState>, heartbeat: Heartbeat) -> Health {
        Health {
            heartbeat,
            dispatcher_ended: Arc::new(AtomicBool::new(false)),
            writes,
        }
    }

    /// The dispatcher's heartbeat: it beats `now_ms` at every turn of its loop.
    pub fn heartbeat(&self) -> Heartbeat {
        self.heartbeat.clone()
    }

    /// The dispatcher task has ended: the daemon no longer sends anything.
    pub fn dispatcher_ended(&self) {
        self.dispatcher_ended.store(true, Ordering::Release);
    }

    /// The figures as of now, for [`verdict`].
    pub fn snapshot(&self) -> Figures {
        Figures {
            heartbeat_ms: self.heartbeat.last_ms(),
            dispatcher_ended: self.dispatcher_ended.load(Ordering::Acquire),
            ledger_failing: self.writes.failing(),
        }
    }
}

/// What the parts last reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub heartbeat_ms: i64,
    pub dispatcher_ended: bool,
    pub ledger_failing: Option<(Unavailable, i64)>,
}

/// One reason the daemon is unhealthy, as `/healthz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// `dispatcher_not_running`, `dispatcher_stalled` or `ledger_unavailable`.
    pub code: &'static str,
    pub message: String,
}

/// Healthy (no problem) or the list of what is wrong (pure).
pub fn verdict(f: Figures, now_ms: i64) -> Vec<Problem> {
    let mut problems = Vec::new();
    if f.dispatcher_ended {
        problems.push(Problem {
            code: "dispatcher_not_running",
            message: "the dispatcher has stopped: nothing is being sent".into(),
        });
    } else if f.heartbeat_ms == 0 {
        problems.push(Problem {
            code: "dispatcher_not_running",
            message: "the dispatcher has not started yet".into(),
        });
    } else if now_ms - f.heartbeat_ms > STALL_AFTER_MS {
        problems.push(Problem {
            code: "dispatcher_stalled",
            message: format!(
                "the dispatcher's loop last turned {} ms ago (the limit is {STALL_AFTER_MS} ms)",
                now_ms - f.heartbeat_ms
            ),
        });
    }
    if let Some((why, since)) = f.ledger_failing {
        problems.push(Problem {
            code: "ledger_unavailable",
            message: format!(
                "the ledger cannot write ({why}) since {} ms ago",
                (now_ms - since).max(0)
            ),
        });
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_table() {
        let now = 1_000_000;
        let ok = Figures {
            heartbeat_ms: now - 10,
            dispatcher_ended: false,
            ledger_failing: None,
        };
        let cases: &[(&str, Figures, &[&str])] = &[
            ("healthy", ok, &[]),
            (
                "beat exactly at the limit",
                Figures {
                    heartbeat_ms: now - STALL_AFTER_MS,
                    ..ok
                },
                &[],
            ),
            (
                "stalled",
                Figures {
                    heartbeat_ms: now - STALL_AFTER_MS - 1,
                    ..ok
                },
                &["dispatcher_stalled"],
            ),
            (
                "never started",
                Figures {
                    heartbeat_ms: 0,
                    ..ok
                },
                &["dispatcher_not_running"],
            ),
            (
                "ended after beating recently",
                Figures {
                    dispatcher_ended: true,
                    ..ok
                },
                &["dispatcher_not_running"],
            ),
            (
                "ledger full",
                Figures {
                    ledger_failing: Some((Unavailable::Full, now - 5)),
                    ..ok
                },
                &["ledger_unavailable"],
            ),
            (
                "both",
                Figures {
                    heartbeat_ms: 1,
                    ledger_failing: Some((Unavailable::Io, now)),
                    ..ok
                },
                &["dispatcher_stalled", "ledger_unavailable"],
            ),
        ];
        for (name, figures, want) in cases {
            let got: Vec<&str> = verdict(*figures, now).iter().map(|p| p.code).collect();
            assert_eq!(&got, want, "{name}");
        }
    }
}
