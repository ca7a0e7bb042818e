//! The producer's outbox (`fanout serve --outbox URL`): a producer writes its event into a
//! table of its own database in the same transaction as the business change, and this task
//! moves every committed row into the ledger, exactly once, then out of the outbox.
//!
//! One round: take the oldest rows (`postgres.rs`: `FOR UPDATE SKIP LOCKED` in a transaction
//! of the producer's database; `sqlite.rs`: a short read), sort them into events and rejections
//! (`plan.rs`, pure, with the check `POST /v1/events` uses), ingest the events through the
//! ledger's contract (answered once durable), and only then delete the rows and move the
//! rejected ones to `<table>_rejected`. When the ledger cannot write, the rows stay. Rows are
//! never read by "id above the last one seen": a lower id can commit after a higher one.
//! The next round starts at once after a full batch; otherwise on a PostgreSQL `NOTIFY` from
//! the table's trigger, or after `--outbox-poll`.
//!
//! It does NOT deliver anything (the dispatcher does, told which subscribers have work), write
//! the producer's business tables, or read the ledger's tables.

pub mod plan;
pub mod postgres;
pub mod sqlite;

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use crate::dispatch::Control;
use crate::ledger::store::Store;
use crate::ledger::{Deliveries as _, LedgerError};
use crate::metrics::Metrics;
use postgres::PgOutbox;
use sqlite::SqliteOutbox;

/// The outbox table's default name.
pub const DEFAULT_TABLE: &str = "fanout_outbox";
/// The polling period when nothing wakes the task sooner.
pub const DEFAULT_POLL: Duration = Duration::from_secs(1);
/// The polling period of a SQLite outbox (no `NOTIFY`): a cheap read of an index.
pub const DEFAULT_SQLITE_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The outbox's database could not be read or written.
    #[error("the outbox cannot be read: {0}")]
    Source(String),
    /// The ledger refused the events (they stay in the outbox).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{0}")]
    Config(String),
}

/// Where the outbox is: a PostgreSQL URL or a SQLite file.
#[derive(Clone, PartialEq, Eq)]
pub enum OutboxLocation {
    Postgres(String),
    Sqlite(PathBuf),
}

impl OutboxLocation {
    /// `postgres://…` (checked as the ledger's URLs are), `sqlite:PATH` or a path.
    pub fn parse(text: &str) -> Result<OutboxLocation, OutboxError> {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            crate::ledger::postgres::parse_url(text)
                .map_err(|e| OutboxError::Config(format!("outbox: {e}")))?;
            return Ok(OutboxLocation::Postgres(text.to_string()));
        }
        let path = text.strip_prefix("sqlite:").unwrap_or(text);
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() || path.contains("://") {
            return Err(OutboxError::Config(format!(
                "the outbox {text:?} is neither postgres://user@host:port/dbname nor a SQLite file"
            )));
        }
        Ok(OutboxLocation::Sqlite(PathBuf::from(path)))
    }

    /// For logs, messages and `/healthz`: the path, or the URL without its password.
    pub fn redacted(&self) -> String {
        match self {
            OutboxLocation::Sqlite(p) => p.display().to_string(),
            OutboxLocation::Postgres(u) => crate::redact::database_url(u),
        }
    }

    fn default_poll(&self) -> Duration {
        match self {
            OutboxLocation::Postgres(_) => DEFAULT_POLL,
            OutboxLocation::Sqlite(_) => DEFAULT_SQLITE_POLL,
        }
    }
}

impl std::fmt::Debug for OutboxLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `fanout serve --outbox …` as validated.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    pub at: OutboxLocation,
    pub table: String,
    pub poll: Duration,
    pub batch: usize,
}

impl OutboxConfig {
    /// From `--outbox`, `--outbox-table` and `--outbox-poll` (its default by the kind).
    pub fn new(
        at: &str,
        table: Option<String>,
        poll: Option<Duration>,
    ) -> Result<OutboxConfig, OutboxError> {
        let at = OutboxLocation::parse(at)?;
        let table = table.unwrap_or_else(|| DEFAULT_TABLE.to_string());
        plan::check_table(&table).map_err(OutboxError::Config)?;
        Ok(OutboxConfig {
            poll: poll.unwrap_or_else(|| at.default_poll()),
            at,
            table,
            batch: plan::DEFAULT_BATCH,
        })
    }
}

/// The DDL `fanout outbox schema` prints for this kind of database.
pub fn schema(at: &OutboxLocation, table: &str) -> String {
    match at {
        OutboxLocation::Postgres(_) => postgres::ddl(table),
        OutboxLocation::Sqlite(_) => sqlite::ddl(table),
    }
}

/// `fanout outbox init`: create the outbox (idempotent).
pub async fn init(at: &OutboxLocation, table: &str) -> Result<(), OutboxError> {
    match at {
        OutboxLocation::Postgres(url) => PgOutbox::new(url, table)?.init().await,
        OutboxLocation::Sqlite(path) => SqliteOutbox::new(path.clone(), table).init(),
    }
}

/// Either kind of outbox, as a round uses it.
enum Source {
    Pg(Box<PgOutbox>),
    Sqlite(SqliteOutbox),
}

impl Source {
    async fn take(&mut self, batch: usize) -> Result<Vec<plan::Row>, OutboxError> {
        match self {
            Source::Pg(s) => s.take(batch).await,
            Source::Sqlite(s) => s.take(batch).await,
        }
    }

    async fn finish(
        &mut self,
        rejected: Vec<(i64, String)>,
        ids: Vec<i64>,
    ) -> Result<(), OutboxError> {
        match self {
            Source::Pg(s) => s.finish(&rejected, &ids).await,
            Source::Sqlite(s) => s.finish(rejected, ids).await,
        }
    }

    async fn abandon(&mut self) {
        if let Source::Pg(s) = self {
            s.abandon().await;
        }
    }
}

/// What the task needs of the daemon.
#[derive(Debug)]
pub struct Daemon {
    pub store: Store,
    pub control: UnboundedSender<Control>,
    pub metrics: Arc<Metrics>,
    pub max_event_bytes: usize,
    /// OpenTelemetry (`crate::trace`): a span per round that ingests, its context stored with
    /// the round's events.
    pub telemetry: crate::trace::Telemetry,
}

/// Move rows into the ledger until `stop` turns true.
pub async fn run(
    cfg: OutboxConfig,
    daemon: Daemon,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), OutboxError> {
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut source = match &cfg.at {
        OutboxLocation::Postgres(url) => {
            let pg = PgOutbox::new(url, &cfg.table)?;
            pg.listen(wake.clone(), stop.clone());
            Source::Pg(Box::new(pg))
        }
        OutboxLocation::Sqlite(path) => Source::Sqlite(SqliteOutbox::new(path.clone(), &cfg.table)),
    };
    let stats = &daemon.metrics.outbox;
    let mut failures = 0u32;
    loop {
        let taken = match round(&mut source, &cfg, &daemon).await {
            Ok(n) => {
                failures = 0;
                stats.reading_again();
                Some(n)
            }
            Err(e) => {
                failures += 1;
                stats.rounds_failed.fetch_add(1, Relaxed);
                if let OutboxError::Source(why) = &e {
                    stats.cannot_read(why, crate::time::now_ms());
                }
                if failures == 1 || failures.is_multiple_of(60) {
                    tracing::warn!(error = %e, failures, "an outbox round failed; its rows stay in the outbox");
                }
                None
            }
        };
        match plan::next(taken, cfg.batch, failures, cfg.poll) {
            plan::Next::Now => {
                if *stop.borrow() {
                    return Ok(());
                }
            }
            plan::Next::Wait(d) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = wake.notified() => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
            }
        }
    }
}

/// One round; the number of rows taken.
async fn round(source: &mut Source, cfg: &OutboxConfig, d: &Daemon) -> Result<usize, OutboxError> {
    let rows = source.take(cfg.batch).await?;
    let stats = &d.metrics.outbox;
    let oldest_ms = rows
        .first()
        .map_or(0, |r| (r.age_secs.max(0.0) * 1000.0) as i64);
    stats.oldest_age_ms.store(oldest_ms, Relaxed);
    if rows.is_empty() {
        source.abandon().await;
        return Ok(0);
    }
    let taken = rows.len();
    let plan::Batch {
        mut events,
        rejected,
        ids,
    } = plan::plan(&rows, d.max_event_bytes);
    if !events.is_empty() {
        let span = d.telemetry.outbox(events.len());
        if let Some(tp) = span.stored() {
            for e in &mut events {
                e.traceparent = Some(tp.to_string());
            }
        }
        let ingested = d.store.ingest(events, crate::time::now_ms()).await;
        span.end_round(ingested.as_ref().err().map(|_| "ledger"));
        match ingested {
            Ok((results, touched)) => {
                let dups = results.iter().filter(|r| r.duplicate).count() as u64;
                d.metrics
                    .events_ingested
                    .fetch_add(results.len() as u64 - dups, Relaxed);
                d.metrics.events_duplicate.fetch_add(dups, Relaxed);
                if !touched.is_empty() {
                    let _ = d.control.send(Control::Due(touched));
                }
            }
            Err(e) => {
                source.abandon().await;
                return Err(e.into());
            }
        }
    }
    let rejections = rejected.len() as u64;
    if rejections > 0 {
        // The ids only: a payload may hold anything.
        let rows: Vec<i64> = rejected.iter().map(|(id, _)| *id).collect();
        tracing::warn!(
            ?rows,
            "outbox rows that are not events moved to the rejected table"
        );
    }
    source.finish(rejected, ids).await?;
    stats.rows_read.fetch_add(taken as u64, Relaxed);
    stats.rows_rejected.fetch_add(rejections, Relaxed);
    Ok(taken)
}
