//! The ledger's decisions that are the same on every backend, as pure functions: each backend
//! reads the rows (under its own locks, in its own transaction), hands them here with `now`,
//! and writes what comes back. What differs between the backends — locking, group commit,
//! leases and their owners, `LISTEN`/`NOTIFY`, the clock — stays in `sqlite/` and `postgres/`.
//! (`crate::ordering::chain`, how an ingest links ordered deliveries, is one more such rule.)

use crate::alert::rules::after_dead_count;
use crate::alert::Notice;
use crate::model::HealthWrite;

/// What checking one subscriber's dead count against the alert threshold decides.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadCheck {
    /// The subscriber's new `dead_alerted_ms`, when it changes (`Some(None)`: cleared).
    pub mark: Option<Option<i64>>,
    /// The alert to raise once the transaction commits.
    pub notice: Option<Notice>,
}

/// The dead-count alert for `subscriber` whose stored mark is `alerted_ms` (set when the
/// current crossing was reported) and whose dead count is `dead` (counted up to `threshold`):
/// the alert fires once per crossing (`alert::rules::after_dead_count`), and the mark records
/// when.
pub fn dead_check(
    subscriber: &str,
    alerted_ms: Option<i64>,
    dead: u64,
    threshold: u64,
    now_ms: i64,
) -> DeadCheck {
    let (alerted, alert) = after_dead_count(alerted_ms.is_some(), dead, threshold);
    DeadCheck {
        mark: (alerted != alerted_ms.is_some()).then_some(alerted.then_some(now_ms)),
        notice: alert.map(|alert| Notice {
            subscriber: subscriber.to_string(),
            at_ms: now_ms,
            alert,
        }),
    }
}

/// Whether an alerted subscriber whose dead count is now `dead` (counted up to `threshold`) is
/// re-armed: it is back under the threshold (a replay), so its next crossing is reported.
pub fn dead_rearms(dead: u64, threshold: u64) -> bool {
    !after_dead_count(true, dead, threshold).0
}

/// The health changes of a turn as they are written, in the order to write them: last first,
/// and of each subscriber's run-of-failures changes only its last (a flapping endpoint makes
/// many in one turn). Every disable is kept: the ledger keeps the first reason it stores.
pub fn health_writes(writes: &[HealthWrite]) -> Vec<&HealthWrite> {
    let mut latest = std::collections::HashSet::new();
    writes
        .iter()
        .rev()
        .filter(|w| match w {
            HealthWrite::FailingSince { subscriber, .. } => latest.insert(subscriber.as_str()),
            HealthWrite::Disable { .. } => true,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::Alert;

    #[test]
    fn dead_count_table() {
        // (alerted_ms, dead, threshold, now) -> (mark, alerted with this dead count)
        type Case = (Option<i64>, u64, u64, i64, Option<Option<i64>>, Option<u64>);
        let cases: &[Case] = &[
            (None, 0, 3, 5, None, None),             // under, never alerted: nothing
            (None, 2, 3, 5, None, None),             // still under
            (None, 3, 3, 6, Some(Some(6)), Some(3)), // crossing: alert, mark now
            (Some(6), 3, 3, 7, None, None),          // still over, already told
            (Some(6), 2, 3, 8, Some(None), None),    // back under: the mark clears
            (None, 1, 0, 9, Some(Some(9)), Some(1)), // threshold 0 counts as 1
            (None, 0, 0, 9, None, None),
        ];
        for &(alerted_ms, dead, threshold, now, mark, alert) in cases {
            let got = dead_check("a", alerted_ms, dead, threshold, now);
            let want = DeadCheck {
                mark,
                notice: alert.map(|dead| Notice {
                    subscriber: "a".into(),
                    at_ms: now,
                    alert: Alert::DeadThreshold {
                        dead,
                        threshold: threshold.max(1),
                    },
                }),
            };
            assert_eq!(got, want, "{alerted_ms:?} dead {dead} of {threshold}");
        }
    }

    #[test]
    fn rearm_table() {
        // (dead, threshold, re-armed)
        let cases: &[(u64, u64, bool)] = &[
            (0, 3, true),
            (2, 3, true),
            (3, 3, false),
            (4, 3, false),
            (0, 0, true),
            (1, 0, false),
        ];
        for &(dead, threshold, rearmed) in cases {
            assert_eq!(
                dead_rearms(dead, threshold),
                rearmed,
                "{dead} of {threshold}"
            );
        }
    }
    #[test]
    fn health_writes_table() {
        use crate::model::Disabled;
        let failing = |s: &str, at: Option<i64>| HealthWrite::FailingSince {
            subscriber: s.into(),
            since_ms: at,
        };
        let disable = |s: &str, why: &str| HealthWrite::Disable {
            subscriber: s.into(),
            disabled: Disabled {
                at_ms: 1,
                reason: why.into(),
                by_operator: false,
            },
        };
        // (the turn's changes, what is written in order)
        let cases: Vec<(Vec<HealthWrite>, Vec<HealthWrite>)> = vec![
            (vec![], vec![]),
            (vec![failing("a", Some(1))], vec![failing("a", Some(1))]),
            (
                vec![
                    failing("a", Some(1)),
                    failing("a", None),
                    failing("a", Some(3)),
                ],
                vec![failing("a", Some(3))],
            ),
            (
                vec![
                    failing("a", Some(1)),
                    failing("b", Some(2)),
                    failing("a", None),
                ],
                vec![failing("a", None), failing("b", Some(2))],
            ),
            (
                vec![disable("a", "x"), failing("a", Some(1)), disable("a", "y")],
                vec![disable("a", "y"), failing("a", Some(1)), disable("a", "x")],
            ),
        ];
        for (turn, written) in &cases {
            let got: Vec<HealthWrite> = health_writes(turn).into_iter().cloned().collect();
            assert_eq!(&got, written, "{turn:?}");
        }
    }
}
