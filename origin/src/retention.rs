//! The retention task: every so often, remove finished deliveries past their window, in small
//! steps through the ledger's writer (`ledger::retention` does the removing; on PostgreSQL
//! `ledger::postgres::retention`, one daemon at a time), yielding between steps so that ingest and
//! the dispatcher never wait behind a long purge.
//!
//! What to purge and when is decided by [`plan`] (pure, takes `now`); [`pass`] carries it out.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::format_duration;
use crate::ledger::retention::{self as purge, Finished, Removed, Retention as Purge};
use crate::ledger::LedgerError;
/// Kept with the daemon's other counters; named here too, where the task fills it.
pub use crate::metrics::RetentionStats;
use crate::series::buckets::{COARSE_MS, FINE_MS, KEEP_COARSE_MS, KEEP_FINE_MS};

pub const DEFAULT_RETAIN_SENT_MS: i64 = 7 * 86_400_000;
pub const DEFAULT_RETAIN_DEAD_MS: i64 = 30 * 86_400_000;

/// Deliveries removed by the first step of a pass; later steps adapt ([`next_batch`]).
pub const BATCH: usize = 500;
/// What one step should hold the writer for, at most: steps that take longer halve the next
/// batch, steps far shorter double it, between [`MIN_BATCH`] and [`MAX_BATCH`].
pub const STEP_TARGET: Duration = Duration::from_millis(20);
pub const MIN_BATCH: usize = 25;
pub const MAX_BATCH: usize = 2_000;

/// The size of the next step after one of `batch` rows took `took` (pure): a cold cache or a
/// busy machine shrinks the steps, so one step never holds the writer much longer than
/// [`STEP_TARGET`] twice in a row.
pub fn next_batch(batch: usize, took: Duration) -> usize {
    let next = if took > STEP_TARGET {
        batch / 2
    } else if took * 4 < STEP_TARGET {
        batch * 2
    } else {
        batch
    };
    next.clamp(MIN_BATCH, MAX_BATCH)
}
/// The writer is left alone this long between two steps.
const BETWEEN_STEPS: Duration = Duration::from_millis(10);

/// How long finished deliveries are kept (`None`: forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub sent_ms: Option<i64>,
    pub dead_ms: Option<i64>,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            sent_ms: Some(DEFAULT_RETAIN_SENT_MS),
            dead_ms: Some(DEFAULT_RETAIN_DEAD_MS),
        }
    }
}

impl Retention {
    /// How often a pass runs: a tenth of the shorter window, between 1 s and 1 min.
    pub fn every(&self) -> Option<Duration> {
        let shortest = match (self.sent_ms, self.dead_ms) {
            (None, None) => return None,
            (a, b) => a.into_iter().chain(b).min().unwrap_or(60_000),
        };
        Some(Duration::from_millis(
            (shortest / 10).clamp(1_000, 60_000) as u64
        ))
    }

    /// A window as the flags write it (`7d`, `forever`).
    pub fn text(ms: Option<i64>) -> String {
        ms.map_or_else(|| "forever".to_string(), format_duration)
    }
}

/// What one pass does at `now_ms`: which finished deliveries to purge before which cut-off,
/// and the cut-off of the sweep of events that no delivery refers to (the sent window: an
/// event that matched nobody counts as delivered to nobody).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub finished: Vec<(Finished, i64)>,
    pub events_before_ms: Option<i64>,
    /// The charts' rows to trim: (bucket size, cut-off), whatever the delivery windows.
    pub series: Vec<(i64, i64)>,
}

pub fn plan(r: &Retention, now_ms: i64) -> Plan {
    let cut = |w: Option<i64>| w.map(|w| now_ms.saturating_sub(w));
    let mut finished = Vec::new();
    if let Some(c) = cut(r.sent_ms) {
        finished.push((Finished::Sent, c));
    }
    if let Some(c) = cut(r.dead_ms) {
        finished.push((Finished::Dead, c));
    }
    Plan {
        finished,
        events_before_ms: cut(r.sent_ms),
        series: vec![
            (FINE_MS, now_ms.saturating_sub(KEEP_FINE_MS)),
            (COARSE_MS, now_ms.saturating_sub(KEEP_COARSE_MS)),
        ],
    }
}

/// One pass: every step of `plan(retention, now_ms)`, each in its own transaction. Returns
/// what was removed. On a ledger shared by several daemons a pass ends early when another
/// daemon holds the purge (its pass does the work).
pub async fn pass(
    ledger: &impl Purge,
    retention: &Retention,
    now_ms: i64,
    stats: &RetentionStats,
    batch: usize,
) -> Result<Removed, LedgerError> {
    let p = plan(retention, now_ms);
    let mut total = Removed::default();
    let mut batch = batch;
    for (kind, cutoff) in p.finished {
        loop {
            let size = batch;
            let Some((r, took)) = ledger.purge_finished(kind, cutoff, size).await? else {
                return Ok(total);
            };
            stats.observe(took);
            batch = next_batch(size, took);
            total.deliveries += r.deliveries;
            total.attempts += r.attempts;
            total.events += r.events;
            if (r.deliveries as usize) < size {
                break;
            }
            tokio::time::sleep(BETWEEN_STEPS).await;
        }
    }
    if let Some(cutoff) = p.events_before_ms {
        loop {
            let size = batch;
            let Some((removed, caught_up, took)) = ledger.sweep_events(cutoff, size).await? else {
                return Ok(total);
            };
            stats.observe(took);
            batch = next_batch(size, took);
            total.events += removed;
            if caught_up {
                break;
            }
            tokio::time::sleep(BETWEEN_STEPS).await;
        }
    }
    for (resolution, cutoff) in p.series {
        while ledger.purge_series(resolution, cutoff, MAX_BATCH).await? as usize >= MAX_BATCH {
            tokio::time::sleep(BETWEEN_STEPS).await;
        }
    }
    ledger.mark_retention_run(now_ms).await?;
    Ok(total)
}

/// Run passes until `stop` turns true.
pub async fn run(
    ledger: impl Purge + Send + Sync,
    retention: Retention,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let stats = &metrics.retention;
    // Kept forever, finished deliveries are never purged, but the charts' rows still are.
    let every = retention.every().unwrap_or(Duration::from_secs(60));
    loop {
        match pass(&ledger, &retention, crate::time::now_ms(), stats, BATCH).await {
            Ok(r) if r != Removed::default() => tracing::info!(
                deliveries = r.deliveries,
                attempts = r.attempts,
                events = r.events,
                "retention removed finished deliveries"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "a retention pass failed; the next one retries"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// What `GET /v1/retention` and `fanout status` show.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RetentionView {
    pub retain_sent: String,
    pub retain_dead: String,
    #[serde(flatten)]
    pub report: purge::RetentionReport,
    /// The longest a retention step held the ledger's writer since the daemon started (on
    /// PostgreSQL: the longest step's transaction, this daemon's steps only).
    pub longest_step_ms: f64,
}

impl RetentionView {
    pub fn of(r: &Retention, report: purge::RetentionReport, stats: &RetentionStats) -> Self {
        RetentionView {
            retain_sent: Retention::text(r.sent_ms),
            retain_dead: Retention::text(r.dead_ms),
            report,
            longest_step_ms: stats.longest_step_us.load(Relaxed) as f64 / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_table() {
        let day = 86_400_000;
        // The charts' rows: fine ones kept two hours, coarse ones two days.
        let series = vec![(FINE_MS, 100 * day - 2 * 3_600_000), (COARSE_MS, 98 * day)];
        let cases: Vec<(Retention, Plan)> = vec![
            (
                Retention::default(),
                Plan {
                    finished: vec![
                        (Finished::Sent, 100 * day - 7 * day),
                        (Finished::Dead, 100 * day - 30 * day),
                    ],
                    events_before_ms: Some(93 * day),
                    series: series.clone(),
                },
            ),
            (
                Retention {
                    sent_ms: None,
                    dead_ms: Some(day),
                },
                Plan {
                    finished: vec![(Finished::Dead, 99 * day)],
                    events_before_ms: None,
                    series: series.clone(),
                },
            ),
            (
                Retention {
                    sent_ms: None,
                    dead_ms: None,
                },
                Plan {
                    finished: vec![],
                    events_before_ms: None,
                    series: series.clone(),
                },
            ),
        ];
        for (r, want) in cases {
            assert_eq!(plan(&r, 100 * day), want, "{r:?}");
        }
    }

    #[test]
    fn next_batch_table() {
        let ms = Duration::from_millis;
        for (batch, took, want) in [
            (500, ms(40), 250),    // too long: halve
            (500, ms(21), 250),    // just over the target
            (500, ms(20), 500),    // on target: keep
            (500, ms(6), 500),     // a quarter or more of the target: keep
            (500, ms(4), 1_000),   // far shorter: double
            (1_500, ms(1), 2_000), // never above the ceiling
            (30, ms(900), 25),     // never below the floor
        ] {
            assert_eq!(next_batch(batch, took), want, "{batch} in {took:?}");
        }
    }

    #[test]
    fn pass_interval_and_text() {
        let r = |s, d| Retention {
            sent_ms: s,
            dead_ms: d,
        };
        assert_eq!(r(None, None).every(), None);
        assert_eq!(Retention::default().every(), Some(Duration::from_secs(60)));
        assert_eq!(r(Some(30_000), None).every(), Some(Duration::from_secs(3)));
        assert_eq!(r(Some(2_000), None).every(), Some(Duration::from_secs(1)));
        assert_eq!(Retention::text(None), "forever");
        assert_eq!(Retention::text(Some(7 * 86_400_000)), "7d");
    }

    /// A pass through the real ledger thread: more finished deliveries than one step's batch
    /// are removed over several steps, each measured.
    #[tokio::test]
    async fn a_pass_takes_several_bounded_steps() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = crate::ledger::sqlite::Ledger::open(&dir.path().join("l.db")).unwrap();
        ledger
            .tx(|c| {
                crate::ledger::sqlite::create_subscriber(
                    c,
                    &crate::ledger::test_subscriber("a", &["*"]),
                    "s",
                )?;
                crate::ledger::sqlite::ingest(c, &crate::ledger::test_events(25), 0)?;
                c.execute("UPDATE deliveries SET status = 'sent', updated_ms = 10", [])?;
                Ok(())
            })
            .await
            .unwrap();
        let stats = RetentionStats::default();
        let r = Retention {
            sent_ms: Some(1_000),
            dead_ms: None,
        };
        let store = crate::ledger::store::Store::Sqlite(ledger.clone());
        let removed = pass(&store, &r, 2_000, &stats, 10).await.unwrap();
        assert_eq!((removed.deliveries, removed.events), (25, 25));
        // Two delivery steps (the first of 10, the next at least MIN_BATCH: the other 15) and
        // one sweep step.
        assert_eq!(stats.steps.load(Relaxed), 3);
        assert!(stats.longest_step_us.load(Relaxed) > 0);
        let report = ledger
            .read(|c| crate::ledger::sqlite::report(c))
            .await
            .unwrap();
        assert_eq!(
            (report.removed_sent, report.last_run_at_ms),
            (25, Some(2_000))
        );
    }
}
