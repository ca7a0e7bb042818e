//! Space on PostgreSQL: the ledger's tables that churn, vacuumed by the daemon as soon as a
//! share of them is dead, rather than waiting for autovacuum.
//!
//! Every delivery is written three times (created, leased, finished) and removed by
//! retention; the kept counts are folded every second; every version leaves a dead tuple and
//! an entry in each index, whose space is reused only once a vacuum has marked it free. With
//! PostgreSQL's defaults autovacuum looks once a minute and waits until a fifth of a table is
//! dead, so a table holds up to minutes of dead versions on top of what it keeps; and a crash
//! recovery (an immediate restart, a power cut) resets the statistics it reads. Measured in the
//! fault soak (BENCHMARKS.md, issue 27): the kept rows level off once the retention window has
//! passed while the files go on growing.
//!
//! So every daemon looks every [`VACUUM_EVERY`] at the server's count of dead tuples for each
//! table of [`CHURNED`] and runs `VACUUM (SKIP_LOCKED)` on those [`to_vacuum`] picks. A plain
//! `VACUUM` reads and writes beside the daemons (it takes no lock that ingest, claims or
//! results wait on); `SKIP_LOCKED` leaves a table another daemon or autovacuum is vacuuming,
//! so several daemons never queue on each other. Nothing here runs `VACUUM FULL`.

use std::time::Duration;

use super::ledger::{every, PgLedger};
use crate::ledger::error::LedgerError;

/// How often a daemon reads the dead-tuple counts.
pub const VACUUM_EVERY: Duration = Duration::from_secs(10);

/// The ledger's tables whose rows are updated or deleted as traffic flows (the others change
/// when an operator does something).
pub const CHURNED: &[&str] = &[
    "deliveries",
    "attempts",
    "events",
    "delivery_counts",
    "last_errors",
    "daemons",
    "series",
    "sequences",
    "ordering_keys",
    "retention",
    "retention_sweep",
];

/// A table is vacuumed once it has this many dead tuples …
const MIN_DEAD: i64 = 1_000;
/// … and at least this share of its live rows (one tenth: the table keeps at most that much
/// slack between two vacuums, and a large table is not rescanned for a handful of rows).
const DEAD_PER_LIVE: i64 = 10;

/// What the server counts for one table (`pg_stat_user_tables`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dead {
    pub table: String,
    pub live: i64,
    pub dead: i64,
}

/// The tables to vacuum now (pure). Right after a crash recovery the server counts from
/// zero (`live` 0): the dead tuples counted since then decide, so the vacuum that also frees
/// what died before the crash comes after [`MIN_DEAD`] more, not after a fifth of the table.
pub fn to_vacuum(tables: &[Dead]) -> Vec<&str> {
    tables
        .iter()
        .filter(|t| t.dead >= MIN_DEAD.max(t.live / DEAD_PER_LIVE))
        .map(|t| t.table.as_str())
        .collect()
}

impl PgLedger {
    /// Vacuum the tables of [`CHURNED`] that [`to_vacuum`] picks from the server's counts;
    /// returns those it asked for (a table another session is vacuuming is skipped).
    pub(super) async fn vacuum_churned(&self) -> Result<Vec<String>, LedgerError> {
        let c = self.client().await?;
        let names: Vec<String> = CHURNED.iter().map(|t| t.to_string()).collect();
        let rows = c
            .query(
                "SELECT relname::text, n_live_tup, n_dead_tup FROM pg_stat_user_tables
                 WHERE schemaname = current_schema() AND relname = ANY($1)",
                &[&names],
            )
            .await?;
        let mut tables = Vec::with_capacity(rows.len());
        for r in &rows {
            tables.push(Dead {
                table: r.try_get(0)?,
                live: r.try_get(1)?,
                dead: r.try_get(2)?,
            });
        }
        let mut done = Vec::new();
        for table in to_vacuum(&tables) {
            // Only names of `CHURNED` reach the statement (the query above asks for no other).
            let Some(name) = CHURNED.iter().find(|&&n| n == table) else {
                continue;
            };
            c.batch_execute(&format!("VACUUM (SKIP_LOCKED) {name}"))
                .await?;
            done.push(name.to_string());
        }
        if !done.is_empty() {
            tracing::debug!(tables = ?done, "vacuumed the ledger's dead tuples");
        }
        Ok(done)
    }

    /// Vacuum what churned ([`PgLedger::vacuum_churned`]) every [`VACUUM_EVERY`] until
    /// `stop` fires or is dropped.
    pub(super) fn keep_vacuumed(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        every(
            VACUUM_EVERY,
            None,
            stop,
            "vacuum the ledger's dead tuples",
            move || {
                let me = me.clone();
                async move { me.vacuum_churned().await.map(drop) }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_tables_are_vacuumed() {
        let t = |table: &str, live, dead| Dead {
            table: table.into(),
            live,
            dead,
        };
        let cases: Vec<(Vec<Dead>, Vec<&str>)> = vec![
            // Few dead tuples: left to the next look (or autovacuum).
            (vec![t("deliveries", 0, 999)], vec![]),
            // Right after a crash recovery the counts start at zero: the dead counted since.
            (vec![t("deliveries", 0, 1_000)], vec!["deliveries"]),
            // A tenth of the live rows dead.
            (vec![t("deliveries", 50_000, 4_999)], vec![]),
            (vec![t("deliveries", 50_000, 5_000)], vec!["deliveries"]),
            // A small table churning (the kept counts): the floor decides.
            (
                vec![
                    t("delivery_counts", 300, 1_500),
                    t("attempts", 20_000, 1_500),
                ],
                vec!["delivery_counts"],
            ),
            (vec![], vec![]),
        ];
        for (tables, want) in cases {
            assert_eq!(to_vacuum(&tables), want, "{tables:?}");
        }
    }
}
