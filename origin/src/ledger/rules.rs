//! The ledger's decisions that are the same on every backend, as pure functions: each backend
//! reads the rows (under its own locks, in its own transaction), hands them here with `now`,
//! and writes what comes back. What differs between the backends — locking, group commit,
//! leases and their owners, `LISTEN`/`NOTIFY`, the clock — stays in `sqlite/` and `postgres/`.
//! (`crate::ordering::chain`, how an ingest links ordered deliveries, is one more such rule.)

use crate::alert::rules::after_dead_count;
use crate::alert::Notice;
use crate::ledger::deliveries::ReplayStep;
use crate::ledger::error::{id_still_holds_history, subscriber_exists, LedgerError};
use crate::model::{delivery_public_id, HealthWrite, Outcome, Status, Transition};

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

/// How a recorded result changes its delivery's row (when the delivery is still in flight
/// under the lease it was sent under: that check is the backend's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written<'a> {
    pub status: Status,
    /// Attempts it spends.
    pub spent: i32,
    /// Its new due time; `None`: unchanged.
    pub next_attempt_ms: Option<i64>,
    pub last_error: LastError<'a>,
}

/// What a result does to a delivery's `last_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastError<'a> {
    Clear,
    Set(&'a str),
    Keep,
}

impl<'a> LastError<'a> {
    /// As two columns: the error to store, and whether the stored one is kept instead.
    pub fn columns(self) -> (Option<&'a str>, bool) {
        match self {
            LastError::Clear => (None, false),
            LastError::Set(e) => (Some(e), false),
            LastError::Keep => (None, true),
        }
    }
}

/// The row change a result makes: sent spends its attempt and clears the error; a retry
/// spends it, is due again at its time and keeps why; dead keeps why and spends an attempt
/// only if one was made (a delivery given up without a send spends none); a deferral spends
/// nothing and keeps the last error.
pub fn written(o: &Outcome) -> Written<'_> {
    let (status, spent, next_attempt_ms, last_error) = match &o.transition {
        Transition::Sent => (Status::Sent, 1, None, LastError::Clear),
        Transition::Retry { at_ms, error } => {
            (Status::Pending, 1, Some(*at_ms), LastError::Set(error))
        }
        Transition::Dead { reason } => (
            Status::Dead,
            i32::from(o.attempt.is_some()),
            None,
            LastError::Set(reason),
        ),
        Transition::Defer { at_ms } => (Status::Pending, 0, Some(*at_ms), LastError::Keep),
    };
    Written {
        status,
        spent,
        next_attempt_ms,
        last_error,
    }
}

/// The ordering key whose head a recorded result ended, if any: a delivery of an ordered key
/// (`ordering_key`) that is now `sent` or `dead` (`crate::ordering`: its key's next held one
/// may go). A retry or a deferral keeps it the head.
pub fn ended_key<K>(status: Option<Status>, ordering_key: Option<K>) -> Option<K> {
    ordering_key.filter(|_| matches!(status, Some(Status::Sent | Status::Dead)))
}

/// A delivery as a replay of it reads it: its subscriber, its status, whether the subscriber
/// is live (exists and is not removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayRow<'a> {
    pub subscriber: &'a str,
    pub status: Option<Status>,
    pub subscriber_live: bool,
}

/// Whether delivery `rowid` (its row, `None` when there is none) may be replayed: not found,
/// in flight (it is being sent) and a removed subscriber's are refused. `Ok(rejoins)`: it goes
/// back to the queue, and `rejoins` when it had ended (not pending): an ordered one then
/// rejoins its key (a held one stays held).
pub fn replay_one(rowid: i64, row: Option<ReplayRow<'_>>) -> Result<bool, LedgerError> {
    let row = row
        .ok_or_else(|| LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid))))?;
    if row.status == Some(Status::InFlight) {
        return Err(LedgerError::Conflict(format!(
            "delivery {} is in flight",
            delivery_public_id(rowid)
        )));
    }
    if !row.subscriber_live {
        return Err(LedgerError::Conflict(format!(
            "subscriber {} has been removed",
            row.subscriber
        )));
    }
    Ok(row.status != Some(Status::Pending))
}

/// The ids one step of a bulk replay takes: the first `limit` of `parts` (each in id order:
/// one per subscriber for a customer's replay, else one).
pub fn replay_ids(parts: Vec<Vec<i64>>, limit: usize) -> Vec<i64> {
    let mut ids: Vec<i64> = parts.into_iter().flatten().collect();
    ids.sort_unstable();
    ids.truncate(limit);
    ids
}

/// What a step that looked at `ids` (of at most `limit`) did: `replayed` holds the subscriber
/// of each delivery it put back (those in flight, pending or taken by another transaction are
/// not); the next step starts after its last id; none is needed after a short one.
pub fn replay_step(ids: &[i64], limit: usize, mut replayed: Vec<String>) -> ReplayStep {
    let n = replayed.len() as u64;
    replayed.sort();
    replayed.dedup();
    ReplayStep {
        replayed: n,
        subscribers: replayed,
        last: ids.last().copied(),
        done: ids.len() < limit,
    }
}

/// A batching subscriber's claim (`Turn::batch_per`) of `asked` deliveries, `per` to a
/// request: the requests it takes, each one send against the limiter and the in-flight cap.
/// In runs of one ordered key (`Turn::runs`) each request is a due head.
pub fn requests(asked: usize, per: usize) -> usize {
    asked.div_ceil(per.max(1))
}

/// In a claim in runs, how many of a head's key's held deliveries (the lowest-numbered
/// first) are leased with it: the rest of its request.
pub fn run_tail(per: usize) -> usize {
    per.max(1) - 1
}

/// What the ledger holds under the id a new subscriber asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredId<'a> {
    Free,
    /// A live subscriber.
    Live,
    /// A removed subscriber of `owner` (its customer; `None`: the operator's), with
    /// deliveries still kept under the id or none.
    Removed {
        owner: Option<&'a str>,
        kept: bool,
    },
}

/// What creating the subscriber does with its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdUse {
    Insert,
    /// The removed subscriber's row (and its secrets) goes first; when none of its
    /// deliveries is kept, its counters are forgotten too (the id starts afresh).
    Replace {
        forget: bool,
    },
}

/// Whether subscriber `id` may be created for `customer` over what is `stored` under it: a
/// live one is a conflict, and so is a removed one of another owner whose deliveries are
/// still kept (the new owner would see and replay them) until retention removes them.
pub fn subscriber_id(
    id: &str,
    stored: StoredId<'_>,
    customer: Option<&str>,
) -> Result<IdUse, LedgerError> {
    match stored {
        StoredId::Free => Ok(IdUse::Insert),
        StoredId::Live => Err(subscriber_exists(id)),
        StoredId::Removed { owner, kept } if kept && owner != customer => {
            Err(id_still_holds_history(id))
        }
        StoredId::Removed { kept, .. } => Ok(IdUse::Replace { forget: !kept }),
    }
}

/// Whether customer `id`, which owns `live` subscribers not removed, may be removed: only
/// once it owns none (each must be removed or moved first).
pub fn customer_removable(id: &str, live: i64) -> Result<(), LedgerError> {
    if live > 0 {
        return Err(LedgerError::Conflict(format!(
            "customer {id} still owns {live} subscriber(s): remove them or move them to \
             another customer first"
        )));
    }
    Ok(())
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
    #[test]
    fn results_written_table() {
        use crate::model::AttemptRecord;
        let attempt = AttemptRecord {
            attempt: 1,
            at_ms: 5,
            lane: "origin",
            outcome: "failed",
            status: Some(500),
            latency_ms: Some(1),
            response_body: None,
            error: None,
        };
        let retry = Transition::Retry {
            at_ms: 70,
            error: "status 500".into(),
        };
        let dead = Transition::Dead {
            reason: "gone".into(),
        };
        use LastError::*;
        // (result, whether an attempt was made) -> (status, spent, due, last error)
        type Case<'a> = (Transition, bool, Status, i32, Option<i64>, LastError<'a>);
        let cases: &[Case] = &[
            (Transition::Sent, true, Status::Sent, 1, None, Clear),
            (
                retry.clone(),
                true,
                Status::Pending,
                1,
                Some(70),
                Set("status 500"),
            ),
            (dead.clone(), true, Status::Dead, 1, None, Set("gone")),
            (dead, false, Status::Dead, 0, None, Set("gone")),
            (
                Transition::Defer { at_ms: 80 },
                false,
                Status::Pending,
                0,
                Some(80),
                Keep,
            ),
        ];
        for (transition, tried, status, spent, next, error) in cases {
            let o = Outcome {
                rowid: 1,
                transition: transition.clone(),
                attempt: tried.then(|| attempt.clone()),
            };
            let want = Written {
                status: *status,
                spent: *spent,
                next_attempt_ms: *next,
                last_error: *error,
            };
            assert_eq!(written(&o), want, "{transition:?}");
        }
        assert_eq!(Clear.columns(), (None, false));
        assert_eq!(Set("x").columns(), (Some("x"), false));
        assert_eq!(Keep.columns(), (None, true));
    }

    #[test]
    fn ended_keys_table() {
        // (status now, its key) -> the key whose head ended
        let cases: &[(Option<Status>, Option<&str>, Option<&str>)] = &[
            (Some(Status::Sent), Some("k"), Some("k")),
            (Some(Status::Dead), Some(""), Some("")),
            (Some(Status::Sent), None, None),
            (Some(Status::Pending), Some("k"), None),
            (Some(Status::InFlight), Some("k"), None),
            (None, Some("k"), None),
        ];
        for &(status, key, ended) in cases {
            assert_eq!(ended_key(status, key), ended, "{status:?} {key:?}");
        }
    }
    #[test]
    fn replay_one_table() {
        use Status::*;
        // (status, subscriber live) -> Ok(rejoins) or the error's kind and text
        type Case = (Option<Status>, bool, Result<bool, &'static str>);
        let cases: &[Case] = &[
            (Some(Dead), true, Ok(true)),
            (Some(Sent), true, Ok(true)),
            (Some(Pending), true, Ok(false)),
            (
                Some(InFlight),
                true,
                Err("conflict: delivery dlv_7 is in flight"),
            ),
            (
                Some(InFlight),
                false,
                Err("conflict: delivery dlv_7 is in flight"),
            ),
            (
                Some(Dead),
                false,
                Err("conflict: subscriber a has been removed"),
            ),
            (
                Some(Pending),
                false,
                Err("conflict: subscriber a has been removed"),
            ),
        ];
        let said = |e: LedgerError| match e {
            LedgerError::Conflict(m) => format!("conflict: {m}"),
            LedgerError::NotFound(m) => format!("not found: {m}"),
            other => format!("{other:?}"),
        };
        for &(status, live, want) in cases {
            let row = ReplayRow {
                subscriber: "a",
                status,
                subscriber_live: live,
            };
            let got = replay_one(7, Some(row)).map_err(said);
            assert_eq!(got, want.map_err(String::from), "{status:?} live {live}");
        }
        assert_eq!(
            replay_one(7, None).map_err(said),
            Err("not found: delivery dlv_7".to_string())
        );
    }

    #[test]
    fn replay_step_table() {
        // (the parts' ids, limit, the replayed deliveries' subscribers) ->
        // (ids taken, replayed, subscribers, last, done)
        type Case = (
            Vec<Vec<i64>>,
            usize,
            Vec<&'static str>,
            Vec<i64>,
            u64,
            Vec<&'static str>,
            Option<i64>,
            bool,
        );
        let cases: Vec<Case> = vec![
            (vec![vec![]], 3, vec![], vec![], 0, vec![], None, true),
            (
                vec![vec![1, 2, 3]],
                3,
                vec!["b", "a", "b"],
                vec![1, 2, 3],
                3,
                vec!["a", "b"],
                Some(3),
                false,
            ),
            (
                vec![vec![4, 9]],
                3,
                vec!["a"],
                vec![4, 9],
                1,
                vec!["a"],
                Some(9),
                true,
            ),
            // A customer's: its subscribers' first ids, merged.
            (
                vec![vec![2, 8, 9], vec![1, 3, 10]],
                3,
                vec!["x", "y"],
                vec![1, 2, 3],
                2,
                vec!["x", "y"],
                Some(3),
                false,
            ),
        ];
        for (parts, limit, subs, ids, replayed, subscribers, last, done) in cases {
            let taken = replay_ids(parts.clone(), limit);
            assert_eq!(taken, ids, "{parts:?}");
            let subs = subs.into_iter().map(String::from).collect();
            let want = ReplayStep {
                replayed,
                subscribers: subscribers.into_iter().map(String::from).collect(),
                last,
                done,
            };
            assert_eq!(replay_step(&taken, limit, subs), want, "{parts:?}");
        }
    }
    #[test]
    fn runs_table() {
        // (asked, per request) -> (requests, held deliveries leased with each head)
        let cases: &[(usize, usize, usize, usize)] = &[
            (0, 4, 0, 3),
            (1, 4, 1, 3),
            (4, 4, 1, 3),
            (5, 4, 2, 3),
            (8, 4, 2, 3),
            (3, 1, 3, 0),
            (3, 0, 3, 0), // a per of 0 counts as 1
        ];
        for &(asked, per, heads, tail) in cases {
            assert_eq!(
                (requests(asked, per), run_tail(per)),
                (heads, tail),
                "{asked} by {per}"
            );
        }
    }
    #[test]
    fn subscriber_id_table() {
        use IdUse::*;
        let removed = |owner, kept| StoredId::Removed { owner, kept };
        // (stored under the id, the new subscriber's customer) -> its use, or the refusal
        type Case<'a> = (StoredId<'a>, Option<&'a str>, Result<IdUse, &'a str>);
        let cases: &[Case] = &[
            (StoredId::Free, None, Ok(Insert)),
            (StoredId::Free, Some("c"), Ok(Insert)),
            (StoredId::Live, None, Err("subscriber s already exists")),
            (
                removed(None, false),
                Some("c"),
                Ok(Replace { forget: true }),
            ),
            (
                removed(Some("c"), true),
                Some("c"),
                Ok(Replace { forget: false }),
            ),
            (removed(None, true), None, Ok(Replace { forget: false })),
            (
                removed(Some("c"), true),
                Some("d"),
                Err("belonged to a removed subscriber"),
            ),
            (
                removed(Some("c"), true),
                None,
                Err("belonged to a removed subscriber"),
            ),
            (
                removed(None, true),
                Some("c"),
                Err("belonged to a removed subscriber"),
            ),
        ];
        for &(stored, customer, want) in cases {
            match (subscriber_id("s", stored, customer), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{stored:?} {customer:?}"),
                (Err(LedgerError::Conflict(m)), Err(want)) => {
                    assert!(m.contains(want), "{stored:?} {customer:?}: {m}")
                }
                (got, want) => panic!("{stored:?} {customer:?}: {got:?}, not {want:?}"),
            }
        }
    }
    #[test]
    fn customer_removal_table() {
        // (live subscribers it owns) -> refused with
        let cases: &[(i64, Option<&str>)] = &[
            (0, None),
            (-1, None),
            (1, Some("customer c still owns 1 subscriber(s)")),
            (7, Some("customer c still owns 7 subscriber(s)")),
        ];
        for &(live, refused) in cases {
            match (customer_removable("c", live), refused) {
                (Ok(()), None) => {}
                (Err(LedgerError::Conflict(m)), Some(want)) => assert!(m.contains(want), "{m}"),
                (got, want) => panic!("{live}: {got:?}, not {want:?}"),
            }
        }
    }
}
