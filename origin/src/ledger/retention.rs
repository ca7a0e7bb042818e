//! Retention's contract: the [`Retention`] steps the daemon's retention task runs on either
//! backend, and what they report. Deleting is each backend's own (`sqlite/retention.rs`,
//! `postgres/retention.rs`); this file deletes nothing.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::LedgerError;

/// Which finished deliveries a step removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    Sent,
    Dead,
}

impl Finished {
    /// The status of the deliveries it removes.
    pub fn status(self) -> &'static str {
        match self {
            Finished::Sent => "sent",
            Finished::Dead => "dead",
        }
    }
}

/// What one step removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub deliveries: u64,
    pub attempts: u64,
    pub events: u64,
}

/// What retention has done, in total, and the oldest finished deliveries it kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionReport {
    pub removed_sent: i64,
    pub removed_dead: i64,
    pub removed_attempts: i64,
    pub removed_events: i64,
    /// When the oldest sent delivery still kept was sent.
    pub oldest_sent_at_ms: Option<i64>,
    /// When the oldest dead delivery still kept went dead.
    pub oldest_dead_at_ms: Option<i64>,
    /// The time (the `now` its cut-offs were taken from) of the last pass that completed.
    pub last_run_at_ms: Option<i64>,
}

pub trait Retention {
    /// What retention has removed and the oldest finished deliveries it kept.
    fn retention_report(&self)
        -> impl Future<Output = Result<RetentionReport, LedgerError>> + Send;

    /// One retention step: up to `batch` finished deliveries of `kind` older than `cutoff_ms`
    /// removed (on SQLite in one writer transaction). `None` when another daemon sharing the
    /// ledger is purging; otherwise what was removed and how long the step held the ledger.
    fn purge_finished(
        &self,
        kind: Finished,
        cutoff_ms: i64,
        batch: usize,
    ) -> impl Future<Output = Result<Option<(Removed, Duration)>, LedgerError>> + Send;

    /// One step of the sweep of events no delivery refers to: how many were removed, whether
    /// it caught up, how long it took; `None` when another daemon is purging.
    fn sweep_events(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> impl Future<Output = Result<Option<(u64, bool, Duration)>, LedgerError>> + Send;

    /// One step of trimming the charts' series: up to `batch` rows of resolution
    /// `resolution_ms` older than `cutoff_ms` removed; how many.
    fn purge_series(
        &self,
        resolution_ms: i64,
        cutoff_ms: i64,
        batch: usize,
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// Note that the retention pass run at `now_ms` has completed.
    fn mark_retention_run(
        &self,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;
}
