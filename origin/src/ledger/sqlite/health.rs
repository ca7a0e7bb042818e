//! Subscriber health in the ledger: disabled subscribers, the start of a run of failures, and
//! the dead-count alert's state. The decisions are `crate::alert::rules`'; this stores them.

use fanout_core::breaker::Breaker;
use rusqlite::{params, Connection, OptionalExtension};

use super::limiters::{read_limiter, store_limiters, StoredLimiter};
use crate::alert::Notice;
use crate::ledger::error::LedgerError;
use crate::ledger::rules::{dead_check, dead_rearms, health_writes};
use crate::model::{Disabled, HealthWrite};

pub fn apply_health(c: &Connection, writes: &[HealthWrite]) -> Result<(), LedgerError> {
    let mut failing =
        c.prepare_cached("UPDATE subscribers SET failing_since_ms = ?2 WHERE id = ?1")?;
    // Disabling a subscriber that is already disabled keeps the first reason.
    let mut disable = c.prepare_cached(
        "UPDATE subscribers SET disabled_ms = ?2, disabled_reason = ?3
         WHERE id = ?1 AND disabled_ms IS NULL",
    )?;
    for w in health_writes(writes) {
        match w {
            HealthWrite::FailingSince {
                subscriber,
                since_ms,
            } => failing.execute(params![subscriber, since_ms])?,
            HealthWrite::Disable {
                subscriber,
                disabled,
            } => disable.execute(params![subscriber, disabled.at_ms, disabled.reason])?,
        };
    }
    Ok(())
}

/// How many of `subscriber`'s deliveries are dead, counting no further than `cap` (so the
/// cost never depends on the size of the dead-letter queue).
pub fn dead_count_capped(c: &Connection, subscriber: &str, cap: u64) -> Result<u64, LedgerError> {
    let n: i64 = c
        .prepare_cached(
            "SELECT COUNT(*) FROM (SELECT 1 FROM deliveries
             WHERE subscriber_id = ?1 AND status = 'dead' LIMIT ?2)",
        )?
        .query_row(params![subscriber, cap.min(i64::MAX as u64) as i64], |r| {
            r.get(0)
        })?;
    Ok(n.max(0) as u64)
}

/// After new deliveries of `subs` went dead: apply the dead-count rule to each live one,
/// store its state, and return the alerts to raise.
pub fn check_dead_counts(
    c: &Connection,
    subs: &[String],
    threshold: u64,
    now_ms: i64,
) -> Result<Vec<Notice>, LedgerError> {
    let mut state = c.prepare_cached(
        "SELECT dead_alerted_ms FROM subscribers WHERE id = ?1 AND deleted_ms IS NULL",
    )?;
    let mut store =
        c.prepare_cached("UPDATE subscribers SET dead_alerted_ms = ?2 WHERE id = ?1")?;
    let mut out = Vec::new();
    for sub in subs {
        let Some(alerted_ms) = state
            .query_row([sub], |r| r.get::<_, Option<i64>>(0))
            .optional()?
        else {
            continue;
        };
        let dead = dead_count_capped(c, sub, threshold)?;
        let check = dead_check(sub, alerted_ms, dead, threshold, now_ms);
        if let Some(mark) = check.mark {
            store.execute(params![sub, mark])?;
        }
        out.extend(check.notice);
    }
    Ok(out)
}

/// Re-arm the dead-count alert of every subscriber whose dead count is back below the
/// threshold (a replay): its next crossing is reported again. Returns how many.
pub fn rearm_dead_alerts(c: &Connection, threshold: u64) -> Result<usize, LedgerError> {
    let alerted: Vec<String> = c
        .prepare_cached("SELECT id FROM subscribers WHERE dead_alerted_ms IS NOT NULL")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut n = 0;
    for sub in alerted {
        if dead_rearms(dead_count_capped(c, &sub, threshold)?, threshold) {
            c.prepare_cached("UPDATE subscribers SET dead_alerted_ms = NULL WHERE id = ?1")?
                .execute([&sub])?;
            n += 1;
        }
    }
    Ok(n)
}

/// An operator disables (`Some`) or re-enables (`None`) a subscriber. Re-enabling starts
/// afresh: no run of failures, the breaker closed (a Retry-After pause still holds). Returns
/// whether anything changed.
pub fn set_disabled(
    c: &Connection,
    id: &str,
    disabled: Option<&Disabled>,
) -> Result<bool, LedgerError> {
    let n = match disabled {
        Some(d) => c.execute(
            "UPDATE subscribers SET disabled_ms = ?2, disabled_reason = ?3,
                 disabled_by_operator = ?4
             WHERE id = ?1 AND deleted_ms IS NULL AND disabled_ms IS NULL",
            params![id, d.at_ms, d.reason, d.by_operator],
        )?,
        None => c.execute(
            "UPDATE subscribers SET disabled_ms = NULL, disabled_reason = NULL,
                 disabled_by_operator = 0, failing_since_ms = NULL
             WHERE id = ?1 AND deleted_ms IS NULL AND disabled_ms IS NOT NULL",
            [id],
        )?,
    };
    if n > 0 && disabled.is_none() {
        // A state that does not decode is left for the dispatcher, which starts it empty.
        if let StoredLimiter::Decoded(mut limiter) = read_limiter(c, id)? {
            limiter.breaker = Breaker::default();
            store_limiters(c, &[(id.to_string(), limiter)])?;
        }
    }
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sqlite::{
        apply, claim, create_subscriber, get_subscriber, ingest, load_limiter, replay_step,
    };
    use crate::ledger::{DeliveryFilter, Outcome, Transition};

    fn db_with(sub: &str, events: usize) -> Connection {
        let c = crate::ledger::sqlite::test_db();
        let s = crate::ledger::test_subscriber(sub, &["*"]);
        create_subscriber(&c, &s, "s").unwrap();
        ingest(&c, &crate::ledger::test_events(events), 0).unwrap();
        c
    }

    /// Lease `n` of `sub`'s deliveries and kill them.
    fn kill(c: &Connection, sub: &str, n: usize) {
        let claims = claim(c, &[(sub.to_string(), n)], &[], 1, 1000).unwrap();
        let outcomes: Vec<Outcome> = claims[0]
            .claimed
            .iter()
            .map(|d| Outcome {
                rowid: d.rowid,
                transition: Transition::Dead {
                    reason: "gone".into(),
                },
                attempt: None,
            })
            .collect();
        apply(c, &outcomes, &[], 2).unwrap();
    }

    #[test]
    fn dead_count_alerts_once_per_crossing_and_rearms_after_a_replay() {
        let c = db_with("a", 10);
        let subs = vec!["a".to_string(), "gone".to_string()];
        kill(&c, "a", 2);
        assert_eq!(dead_count_capped(&c, "a", 100).unwrap(), 2);
        assert_eq!(dead_count_capped(&c, "a", 1).unwrap(), 1);
        assert!(check_dead_counts(&c, &subs, 3, 5).unwrap().is_empty());
        kill(&c, "a", 1);
        let alerts = check_dead_counts(&c, &subs, 3, 6).unwrap();
        assert_eq!(alerts.len(), 1);
        assert_eq!((alerts[0].subscriber.as_str(), alerts[0].at_ms), ("a", 6));
        kill(&c, "a", 2);
        assert!(check_dead_counts(&c, &subs, 3, 7).unwrap().is_empty());
        // Nothing to re-arm while still above.
        assert_eq!(rearm_dead_alerts(&c, 3).unwrap(), 0);
        replay_step(
            &c,
            &DeliveryFilter {
                subscriber: Some("a".into()),
                status: Some(crate::model::Status::Dead),
                limit: 100,
                ..Default::default()
            },
            8,
        )
        .unwrap();
        assert_eq!(rearm_dead_alerts(&c, 3).unwrap(), 1);
        kill(&c, "a", 3);
        assert_eq!(check_dead_counts(&c, &subs, 3, 9).unwrap().len(), 1);
    }

    #[test]
    fn disable_and_reenable() {
        let c = db_with("a", 0);
        let d = Disabled {
            at_ms: 5,
            reason: "the endpoint answered 410 Gone".into(),
            by_operator: false,
        };
        apply_health(
            &c,
            &[
                HealthWrite::FailingSince {
                    subscriber: "a".into(),
                    since_ms: Some(3),
                },
                HealthWrite::Disable {
                    subscriber: "a".into(),
                    disabled: d.clone(),
                },
            ],
        )
        .unwrap();
        // The last change of a turn wins.
        apply_health(
            &c,
            &[
                HealthWrite::FailingSince {
                    subscriber: "a".into(),
                    since_ms: None,
                },
                HealthWrite::FailingSince {
                    subscriber: "a".into(),
                    since_ms: Some(3),
                },
            ],
        )
        .unwrap();
        let mut limiter = load_limiter(&c, "a", 0).unwrap();
        limiter.breaker.open_until_ms = Some(99);
        limiter.breaker.consecutive_failures = 20;
        store_limiters(&c, &[("a".into(), limiter)]).unwrap();
        let s = get_subscriber(&c, "a").unwrap();
        assert_eq!(s.health.disabled, Some(d.clone()));
        assert_eq!(s.health.failing_since_ms, Some(3));
        // A second disable keeps the first reason.
        let later = Disabled {
            at_ms: 9,
            reason: "other".into(),
            by_operator: true,
        };
        assert!(!set_disabled(&c, "a", Some(&later)).unwrap());
        assert_eq!(get_subscriber(&c, "a").unwrap().health.disabled, Some(d));
        assert!(set_disabled(&c, "a", None).unwrap());
        assert!(!set_disabled(&c, "a", None).unwrap());
        let s = get_subscriber(&c, "a").unwrap();
        assert_eq!(s.health, Default::default());
        assert_eq!(
            load_limiter(&c, "a", 0).unwrap().breaker,
            Breaker::default()
        );
        assert!(set_disabled(&c, "a", Some(&later)).unwrap());
        assert!(!set_disabled(&c, "nobody", None).unwrap());
    }

    #[test]
    fn the_dead_count_uses_its_index() {
        let c = db_with("a", 0);
        let plan: Vec<String> = c
            .prepare(
                "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM (SELECT 1 FROM deliveries
                 WHERE subscriber_id = ?1 AND status = 'dead' LIMIT ?2)",
            )
            .unwrap()
            .query_map(params!["a", 100], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter()
                .any(|l| l.contains("USING COVERING INDEX deliveries_subscriber_status")),
            "{plan:?}"
        );
    }
}
