//! The API's ledger: the embedded SQLite one or a PostgreSQL one shared by several daemons,
//! behind the same operations. The API never sees which (nor SQL, nor a connection).

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use super::pg::PgLedger;
use super::retention::{self as purge, Finished, Removed, RetentionReport};
use super::status::SubscriberCounts;
use super::{DeliveryFilter, DeliveryView, Ingested, Ledger, LedgerError, NewEvent};
use crate::model::Subscriber;

#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(Ledger),
    Postgres(PgLedger),
}

/// What `/metrics` reads from the ledger: deliveries per status, per-subscriber figures, and
/// what retention did.
pub type MetricsSnapshot = (
    Vec<(String, i64)>,
    Vec<super::SubscriberStats>,
    RetentionReport,
);

/// What a PostgreSQL ledger answers to anything about customers: it has none in this version.
pub const NO_CUSTOMERS: &str = "customers need the SQLite ledger in this version";

impl Store {
    /// The SQLite ledger, for what only it keeps (customers, portal tokens' nonces, test
    /// events, replay counts); [`LedgerError::NotSupported`] on PostgreSQL.
    pub fn sqlite(&self) -> Result<&Ledger, LedgerError> {
        match self {
            Store::Sqlite(l) => Ok(l),
            Store::Postgres(_) => Err(LedgerError::NotSupported(NO_CUSTOMERS.into())),
        }
    }

    /// On a PostgreSQL ledger: refuse anything that names a customer.
    pub fn no_customer(customer: Option<&str>) -> Result<(), LedgerError> {
        match customer {
            Some(_) => Err(LedgerError::NotSupported(NO_CUSTOMERS.into())),
            None => Ok(()),
        }
    }

    /// One live subscriber as stored (with its secrets).
    pub async fn subscriber(&self, id: String) -> Result<Subscriber, LedgerError> {
        match self {
            Store::Sqlite(l) => l.read(move |c| super::get_subscriber(c, &id)).await,
            Store::Postgres(p) => p.get_subscriber(&id).await,
        }
    }

    /// Store events and fan them out; the per-event outcome and the subscribers with new work.
    pub async fn ingest(
        &self,
        events: Vec<NewEvent>,
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        match self {
            Store::Sqlite(l) => l.tx(move |c| super::ingest(c, &events, now_ms)).await,
            Store::Postgres(p) => p.ingest(&events, now_ms).await,
        }
    }

    /// Create a subscriber with its first secret; returns it as stored.
    pub async fn create_subscriber(
        &self,
        s: Subscriber,
        secret: String,
    ) -> Result<Subscriber, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    super::create_subscriber(c, &s, &secret)?;
                    super::get_subscriber(c, &s.id)
                })
                .await
            }
            Store::Postgres(p) => {
                p.create_subscriber(&s, &secret).await?;
                p.get_subscriber(&s.id).await
            }
        }
    }

    /// One subscriber (`only`) or every live one, with their figures when `with_stats`.
    pub async fn subscribers(
        &self,
        only: Option<String>,
        with_stats: bool,
    ) -> Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.read(move |c| {
                    let snapshot = c.transaction()?;
                    let subs = match &only {
                        Some(id) => vec![super::get_subscriber(&snapshot, id)?],
                        None => super::list_subscribers(&snapshot)?,
                    };
                    let counts = if with_stats {
                        let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
                        Some(super::status::subscriber_counts(
                            &snapshot,
                            &ids,
                            crate::time::now_ms(),
                        )?)
                    } else {
                        None
                    };
                    Ok((subs, counts))
                })
                .await
            }
            Store::Postgres(p) => {
                let subs = match &only {
                    Some(id) => vec![p.get_subscriber(id).await?],
                    None => p.list_subscribers().await?,
                };
                let counts = if with_stats {
                    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
                    Some(p.subscriber_counts(&ids, crate::time::now_ms()).await?)
                } else {
                    None
                };
                Ok((subs, counts))
            }
        }
    }

    /// Change a subscriber: `change` gets it as stored and returns the next definition and
    /// whether its disabled state was set (or refuses with its own error, changing nothing).
    pub async fn update_subscriber<E, F>(
        &self,
        id: String,
        change: F,
    ) -> Result<Result<Subscriber, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Subscriber) -> Result<(Subscriber, bool), E> + Send + 'static,
    {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    let current = super::get_subscriber(c, &id)?;
                    let (next, toggled) = match change(current) {
                        Ok(n) => n,
                        Err(e) => return Ok(Err(e)),
                    };
                    super::update_subscriber(c, &next)?;
                    if toggled {
                        super::set_disabled(c, &next.id, next.health.disabled.as_ref())?;
                    }
                    Ok(Ok(next))
                })
                .await
            }
            Store::Postgres(p) => {
                let current = p.get_subscriber(&id).await?;
                let (next, toggled) = match change(current) {
                    Ok(n) => n,
                    Err(e) => return Ok(Err(e)),
                };
                p.update_subscriber(&next).await?;
                if toggled {
                    p.set_disabled(&next.id, next.health.disabled.as_ref(), next.updated_ms)
                        .await?;
                }
                Ok(Ok(next))
            }
        }
    }

    /// Remove a subscriber; returns how many of its deliveries went dead.
    pub async fn delete_subscriber(&self, id: String, now_ms: i64) -> Result<u64, LedgerError> {
        match self {
            Store::Sqlite(l) => Ok(l
                .tx(move |c| super::delete_subscriber(c, &id, now_ms))
                .await? as u64),
            Store::Postgres(p) => p.delete_subscriber(&id, now_ms).await,
        }
    }

    pub async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| super::rotate_secret(c, &id, &secret, now_ms, grace_ms))
                    .await
            }
            Store::Postgres(p) => p.rotate_secret(&id, &secret, now_ms, grace_ms).await,
        }
    }

    pub async fn list_deliveries(
        &self,
        filter: DeliveryFilter,
    ) -> Result<Vec<DeliveryView>, LedgerError> {
        match self {
            Store::Sqlite(l) => l.read(move |c| super::list_deliveries(c, &filter)).await,
            Store::Postgres(p) => {
                Store::no_customer(filter.customer.as_deref())?;
                p.list_deliveries(&filter).await
            }
        }
    }

    pub async fn get_delivery(&self, rowid: i64) -> Result<DeliveryView, LedgerError> {
        match self {
            Store::Sqlite(l) => l.read(move |c| super::get_delivery(c, rowid)).await,
            Store::Postgres(p) => p.get_delivery(rowid).await,
        }
    }

    /// Replay one delivery; returns its subscriber.
    pub async fn replay_one(&self, rowid: i64, now_ms: i64) -> Result<String, LedgerError> {
        match self {
            Store::Sqlite(l) => l.tx(move |c| super::replay_one(c, rowid, now_ms)).await,
            Store::Postgres(p) => p.replay_one(rowid, now_ms).await,
        }
    }

    /// Replay what matches; a filter naming a subscriber that does not exist is `NotFound`.
    pub async fn replay_bulk(
        &self,
        filter: DeliveryFilter,
        now_ms: i64,
    ) -> Result<(u64, Vec<String>), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                let (n, subs) = l
                    .tx(move |c| {
                        if let Some(s) = &filter.subscriber {
                            super::get_subscriber(c, s)?;
                        }
                        super::replay_bulk(c, &filter, now_ms)
                    })
                    .await?;
                Ok((n as u64, subs))
            }
            Store::Postgres(p) => {
                Store::no_customer(filter.customer.as_deref())?;
                if let Some(s) = &filter.subscriber {
                    p.get_subscriber(s).await?;
                }
                p.replay_bulk(&filter, now_ms).await
            }
        }
    }

    /// Answers when the ledger does.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.call(|c| Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))?))
                    .await?;
                Ok(())
            }
            Store::Postgres(p) => p.ping().await,
        }
    }

    /// Deliveries per status and per-subscriber figures, for `/metrics` (on SQLite from one
    /// snapshot of the reader connection, so a scrape never holds up the dispatcher's writes).
    pub async fn metrics_snapshot(&self, now_ms: i64) -> Result<MetricsSnapshot, LedgerError> {
        let breaker = fanout_core::breaker::BreakerConfig::default();
        match self {
            Store::Sqlite(l) => {
                l.read(move |c| {
                    let snapshot = c.transaction()?;
                    Ok((
                        super::status_counts(&snapshot)?,
                        super::subscriber_stats(&snapshot, breaker, now_ms)?,
                        purge::report(&snapshot)?,
                    ))
                })
                .await
            }
            Store::Postgres(p) => Ok((
                p.status_counts().await?,
                p.subscriber_stats(breaker, now_ms).await?,
                p.retention_report().await?,
            )),
        }
    }

    /// What retention has removed and the oldest finished deliveries it kept.
    pub async fn retention_report(&self) -> Result<RetentionReport, LedgerError> {
        match self {
            Store::Sqlite(l) => l.read(|c| purge::report(c)).await,
            Store::Postgres(p) => p.retention_report().await,
        }
    }

    /// One retention step: up to `batch` finished deliveries of `kind` older than `cutoff_ms`
    /// removed (on SQLite in one writer transaction). `None` when another daemon sharing the
    /// ledger is purging; otherwise what was removed and how long the step held the ledger.
    pub async fn purge_finished(
        &self,
        kind: Finished,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(Removed, Duration)>, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    let start = Instant::now();
                    let r = purge::purge_finished(c, kind, cutoff_ms, batch)?;
                    Ok(Some((r, start.elapsed())))
                })
                .await
            }
            Store::Postgres(p) => p.purge_finished(kind, cutoff_ms, batch).await,
        }
    }

    /// One step of the sweep of events no delivery refers to: how many were removed, whether
    /// it caught up, how long it took; `None` when another daemon is purging.
    pub async fn sweep_events(
        &self,
        cutoff_ms: i64,
        batch: usize,
    ) -> Result<Option<(u64, bool, Duration)>, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    let start = Instant::now();
                    let (n, done) = purge::sweep_events(c, cutoff_ms, batch)?;
                    Ok(Some((n, done, start.elapsed())))
                })
                .await
            }
            Store::Postgres(p) => p.sweep_events(cutoff_ms, batch).await,
        }
    }

    /// Note that the retention pass run at `now_ms` has completed.
    pub async fn mark_retention_run(&self, now_ms: i64) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => l.tx(move |c| purge::mark_run(c, now_ms)).await,
            Store::Postgres(p) => p.mark_retention_run(now_ms).await,
        }
    }
}
