//! Subscriber health on PostgreSQL (as `sqlite/health.rs`): runs of failures and disabling
//! stored, dead counts checked against the alert threshold once per crossing, and re-armed.

use deadpool_postgres::Transaction;

use super::ledger::PgLedger;
use crate::alert::Notice;
use crate::ledger::rules::{dead_check, dead_rearms, health_writes};
use crate::ledger::HealthWrite;
use crate::ledger::LedgerError;

use super::subscribers::announce_change;

impl PgLedger {
    pub(super) async fn apply_health_in(
        tx: &Transaction<'_>,
        writes: &[HealthWrite],
    ) -> Result<(), LedgerError> {
        for w in health_writes(writes) {
            match w {
                HealthWrite::FailingSince {
                    subscriber,
                    since_ms,
                } => {
                    tx.execute(
                        "UPDATE subscribers SET failing_since_ms = $2 WHERE id = $1",
                        &[subscriber, since_ms],
                    )
                    .await?
                }
                HealthWrite::Disable {
                    subscriber,
                    disabled,
                } => {
                    announce_change(tx, subscriber).await?;
                    tx.execute(
                        "UPDATE subscribers SET disabled_ms = $2, disabled_reason = $3
                         WHERE id = $1 AND disabled_ms IS NULL",
                        &[subscriber, &disabled.at_ms, &disabled.reason],
                    )
                    .await?
                }
            };
        }
        Ok(())
    }

    /// Alert once when a subscriber's dead count reaches `threshold` (the mark is shared by
    /// every daemon: the row is locked while it is checked), inside the turn's transaction.
    pub(super) async fn check_dead_counts_in(
        tx: &Transaction<'_>,
        subs: &[String],
        threshold: u64,
        now_ms: i64,
    ) -> Result<Vec<Notice>, LedgerError> {
        let mut sorted: Vec<&String> = subs.iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut out = Vec::new();
        for sub in sorted {
            let Some(row) = tx
                .query_opt(
                    "SELECT dead_alerted_ms FROM subscribers
                     WHERE id = $1 AND deleted_ms IS NULL FOR UPDATE",
                    &[sub],
                )
                .await?
            else {
                continue;
            };
            let alerted_ms: Option<i64> = row.try_get(0)?;
            let dead = dead_count_on(tx, sub, threshold).await?;
            let check = dead_check(sub, alerted_ms, dead, threshold, now_ms);
            if let Some(mark) = check.mark {
                tx.execute(
                    "UPDATE subscribers SET dead_alerted_ms = $2 WHERE id = $1",
                    &[sub, &mark],
                )
                .await?;
            }
            out.extend(check.notice);
        }
        Ok(out)
    }

    /// Re-arm the dead-count alert of subscribers back under the threshold.
    pub(super) async fn rearm_dead_alerts(&self, threshold: u64) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        let alerted: Vec<String> = c
            .query(
                "SELECT id FROM subscribers WHERE dead_alerted_ms IS NOT NULL",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let mut n = 0;
        for sub in alerted {
            if dead_rearms(dead_count_on(&c, &sub, threshold).await?, threshold) {
                n += c
                    .execute(
                        "UPDATE subscribers SET dead_alerted_ms = NULL WHERE id = $1",
                        &[&sub],
                    )
                    .await?;
            }
        }
        Ok(n)
    }
}

pub(super) async fn dead_count_on(
    c: &impl deadpool_postgres::GenericClient,
    subscriber: &str,
    cap: u64,
) -> Result<u64, LedgerError> {
    let cap = cap.min(i64::MAX as u64) as i64;
    let n: i64 = c
        .query_one(
            "SELECT COUNT(*) FROM (SELECT 1 FROM deliveries
             WHERE subscriber_id = $1 AND status = 'dead' LIMIT $2) t",
            &[&subscriber, &cap],
        )
        .await?
        .try_get(0)?;
    Ok(n.max(0) as u64)
}
