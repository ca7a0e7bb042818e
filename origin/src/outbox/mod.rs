//! The producer's outbox (`fanout serve --outbox URL`): a producer writes its event into a
//! table of its own database in the same transaction as the business change, and this task
//! moves every committed row into the ledger, exactly once, then out of the outbox.
//!
//! One daemon reads an outbox at a time (its reader's lock: an advisory lock in PostgreSQL, a
//! lock file beside a SQLite file); the others stay on standby and take over when the reader
//! stops. So rows go into the ledger in the outbox's id order, and sequence numbers follow it.
//!
//! One round: take the oldest rows (`postgres.rs`: `FOR UPDATE NOWAIT` in a transaction of the
//! producer's database; `sqlite.rs`: a short read), sort them into events and rejections
//! (`plan.rs`, pure, with the check `POST /v1/events` uses), ingest the events through the
//! ledger's contract (answered once durable), and only then delete the rows and move the
//! rejected ones to `<table>_rejected` (also those the ledger refuses as data, found by
//! ingesting a refused batch event by event, and those reusing an event id with another body).
//! When the ledger cannot write, the rows stay. Rows are never read by "id above the last one
//! seen": a lower id can commit after a higher one.
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
use crate::ledger::{LedgerError, NewEvent};
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
    /// `fanout outbox init` could not create the outbox.
    #[error("the outbox cannot be created: {0}")]
    Create(String),
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
            crate::pg::parse_url(text).map_err(|e| OutboxError::Config(format!("outbox: {e}")))?;
            return Ok(OutboxLocation::Postgres(text.to_string()));
        }
        let path = text.strip_prefix("sqlite:").unwrap_or(text);
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() || path.contains("://") {
            // A URL's scheme only: the rest may hold a password.
            let shown = match text.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://…"),
                None => format!("{text:?}"),
            };
            return Err(OutboxError::Config(format!(
                "the outbox {shown} is neither postgres://user@host:port/dbname nor a SQLite file"
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
    let created = match at {
        OutboxLocation::Postgres(url) => PgOutbox::new(url, table)?.init().await,
        OutboxLocation::Sqlite(path) => SqliteOutbox::new(path.clone(), table).init(),
    };
    created.map_err(|e| match e {
        OutboxError::Source(why) => OutboxError::Create(why),
        other => other,
    })
}

/// Either kind of outbox, as a round uses it.
enum Source {
    Pg(Box<PgOutbox>),
    Sqlite(SqliteOutbox),
}

impl Source {
    /// The outbox `cfg` names (a PostgreSQL one also listens for its `NOTIFY`, waking `wake`).
    fn open(
        cfg: &OutboxConfig,
        wake: &Arc<tokio::sync::Notify>,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<Source, OutboxError> {
        Ok(match &cfg.at {
            OutboxLocation::Postgres(url) => {
                let pg = PgOutbox::new(url, &cfg.table)?;
                pg.listen(wake.clone(), stop.clone());
                Source::Pg(Box::new(pg))
            }
            OutboxLocation::Sqlite(path) => {
                Source::Sqlite(SqliteOutbox::new(path.clone(), &cfg.table))
            }
        })
    }

    /// The oldest rows, or `None` when another daemon reads this outbox.
    async fn take(&mut self, batch: usize) -> Result<Option<Vec<plan::Row>>, OutboxError> {
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

/// Move rows into the ledger until `stop` turns true; nothing else ends it. An outbox that
/// cannot be opened or read (an unreadable certificate, a missing table, its database down)
/// is tried again with backoff ([`plan::next`]) and reported unreadable (`/healthz`,
/// `fanout_outbox_up`, `GET /v1/outbox`, `fanout status`) until a round reads it again.
pub async fn run(cfg: OutboxConfig, daemon: Daemon, mut stop: tokio::sync::watch::Receiver<bool>) {
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut source: Option<Source> = None;
    let stats = &daemon.metrics.outbox;
    let mut failures = 0u32;
    loop {
        let result = match source.as_mut() {
            Some(s) => round(s, &cfg, &daemon).await,
            None => match Source::open(&cfg, &wake, &stop) {
                Ok(s) => round(source.insert(s), &cfg, &daemon).await,
                Err(e) => Err(e),
            },
        };
        let done = match result {
            Ok(taken) => {
                failures = 0;
                if stats.reading_again(taken.is_none()) {
                    tracing::info!("the outbox is read again");
                }
                taken.map_or(plan::Done::Standby, plan::Done::Took)
            }
            Err(e) => {
                failures += 1;
                stats.rounds_failed.fetch_add(1, Relaxed);
                match &e {
                    // The ledger's own failure is the ledger's problem (`/healthz` says so).
                    OutboxError::Ledger(_) => {}
                    OutboxError::Source(why) => stats.cannot_read(why, crate::time::now_ms()),
                    other => stats.cannot_read(&other.to_string(), crate::time::now_ms()),
                }
                if failures == 1 || failures.is_multiple_of(60) {
                    tracing::warn!(error = %e, failures, "an outbox round failed; its rows stay in the outbox, tried again with backoff");
                }
                plan::Done::Failed(failures)
            }
        };
        match plan::next(done, cfg.batch, cfg.poll) {
            plan::Next::Now => {
                if *stop.borrow() {
                    return;
                }
            }
            plan::Next::Wait(d) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = wake.notified() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        }
    }
}

/// One round; the number of rows taken (`None`: another daemon reads the outbox).
async fn round(
    source: &mut Source,
    cfg: &OutboxConfig,
    d: &Daemon,
) -> Result<Option<usize>, OutboxError> {
    let Some(rows) = source.take(cfg.batch).await? else {
        return Ok(None);
    };
    let stats = &d.metrics.outbox;
    let oldest_ms = rows
        .first()
        .map_or(0, |r| (r.age_secs.max(0.0) * 1000.0) as i64);
    stats.oldest_age_ms.store(oldest_ms, Relaxed);
    if rows.is_empty() {
        source.abandon().await;
        return Ok(Some(0));
    }
    let taken = rows.len();
    let plan::Batch {
        events,
        event_rows,
        mut rejected,
        ids,
    } = plan::plan(&rows, d.max_event_bytes);
    if !events.is_empty() {
        let span = d.telemetry.outbox(events.len());
        let traced = |mut events: Vec<NewEvent>| {
            if let Some(tp) = span.stored() {
                for e in &mut events {
                    e.traceparent = Some(tp.to_string());
                }
            }
            events
        };
        let ingested = match ingest(d, traced(events), &event_rows).await {
            // The ledger refuses something in the batch: each event alone (planned again from
            // the rows), so that only the refused ones are rejected.
            Err(e) if e.is_refusal() => {
                let mut refused = Vec::new();
                let again = plan::plan(&rows, d.max_event_bytes);
                let mut result = Ok(());
                for (event, row) in traced(again.events).into_iter().zip(&again.event_rows) {
                    match ingest(d, vec![event], &[*row]).await {
                        Ok(reused) => refused.extend(reused),
                        Err(e) if e.is_refusal() => {
                            refused.push((*row, format!("the ledger refuses this event: {e}")))
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
                result.map(|()| refused)
            }
            other => other,
        };
        span.end_round(ingested.as_ref().err().map(|_| "ledger"));
        match ingested {
            Ok(more) => rejected.extend(more),
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
            "outbox rows that are not events, or that the ledger refuses, moved to the rejected table"
        );
    }
    source.finish(rejected, ids).await?;
    stats.rows_read.fetch_add(taken as u64, Relaxed);
    stats.rows_rejected.fetch_add(rejections, Relaxed);
    Ok(Some(taken))
}

/// Ingest `events` (from outbox rows `rows`, one each) and count them; the rows whose event id
/// the ledger holds with another body, to reject.
async fn ingest(
    d: &Daemon,
    events: Vec<NewEvent>,
    rows: &[i64],
) -> Result<Vec<(i64, String)>, LedgerError> {
    let now = crate::time::now_ms();
    let results = crate::ingest::ingest(&d.store, &d.metrics, &d.control, events, now).await?;
    Ok(results
        .iter()
        .zip(rows)
        .filter(|(r, _)| r.different_body)
        .map(|(_, row)| (*row, plan::ID_REUSED.to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_and_their_messages_show_no_password() {
        let at = OutboxLocation::parse("postgres://shop:pw1@db/shop?password=pw2").unwrap();
        assert_eq!(at.redacted(), "postgres://shop:***@db/shop?password=***");
        assert!(!format!("{at:?}").contains("pw"));
        for bad in ["mysql://shop:pw3@db/shop", "sqlite://"] {
            let e = OutboxLocation::parse(bad).unwrap_err().to_string();
            assert!(e.contains("is neither") && !e.contains("pw3"), "{e}");
        }
        assert_eq!(
            OutboxLocation::parse("sqlite:/data/shop.db").unwrap(),
            OutboxLocation::Sqlite("/data/shop.db".into())
        );
    }
}
