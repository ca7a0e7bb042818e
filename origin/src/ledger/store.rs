//! The API's ledger: the embedded SQLite one or a PostgreSQL one shared by several daemons,
//! behind the same operations. The API never sees which (nor SQL, nor a connection).
//!
//! Operations that take a `scope` (a portal token's customer; `None`: the operator) act only on
//! what that customer owns (`crate::customer::sees`), checked in the transaction that acts:
//! anything else is `NotFound`, exactly as for an id that does not exist. Customers themselves
//! are in `store/customers.rs`.

mod customers;

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use super::postgres::PgLedger;
use super::retention::{self as purge, Finished, Removed, RetentionReport};
use super::status::SubscriberCounts;
use super::{DeliveryFilter, DeliveryView, Ingested, Ledger, LedgerError, NewEvent};
use crate::customer::sees;
use crate::model::{delivery_public_id, Subscriber};

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

/// `NotFound` for a subscriber outside the caller's scope, as for one that does not exist.
fn unseen_subscriber(id: &str) -> LedgerError {
    LedgerError::NotFound(format!("subscriber {id}"))
}

/// `NotFound` for a delivery outside the caller's scope, as for one that does not exist.
fn unseen_delivery(rowid: i64) -> LedgerError {
    LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid)))
}

/// On SQLite, inside the caller's transaction: the live subscriber `id` if `scope` sees it.
fn visible_subscriber(
    c: &rusqlite::Connection,
    id: &str,
    scope: Option<&str>,
) -> Result<Subscriber, LedgerError> {
    let s = super::get_subscriber(c, id)?;
    if sees(scope, s.customer.as_deref()) {
        Ok(s)
    } else {
        Err(unseen_subscriber(id))
    }
}

/// On SQLite, inside the caller's transaction: `NotFound` unless `scope` sees delivery `rowid`.
fn check_delivery_visible(
    c: &rusqlite::Connection,
    rowid: i64,
    scope: Option<&str>,
) -> Result<(), LedgerError> {
    let owner = super::delivery_owner(c, rowid)?;
    if sees(scope, owner.as_deref()) {
        Ok(())
    } else {
        Err(unseen_delivery(rowid))
    }
}

impl Store {
    /// One live subscriber as stored (with its secrets), if `scope` sees it.
    pub async fn subscriber(
        &self,
        id: String,
        scope: Option<String>,
    ) -> Result<Subscriber, LedgerError> {
        let s = match self {
            Store::Sqlite(l) => {
                let lookup = id.clone();
                l.read(move |c| super::get_subscriber(c, &lookup)).await?
            }
            Store::Postgres(p) => p.get_subscriber(&id).await?,
        };
        if sees(scope.as_deref(), s.customer.as_deref()) {
            Ok(s)
        } else {
            Err(unseen_subscriber(&id))
        }
    }

    /// Store events and fan them out; the per-event outcome and the subscribers with new work.
    pub async fn ingest(
        &self,
        events: Vec<NewEvent>,
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx_shared(move |c| super::ingest(c, &events, now_ms))
                    .await
            }
            Store::Postgres(p) => p.ingest(&events, now_ms).await,
        }
    }

    /// Create a subscriber with its first secret; returns it as stored. A customer it names
    /// must exist (`Invalid` otherwise).
    pub async fn create_subscriber(
        &self,
        s: Subscriber,
        secret: String,
    ) -> Result<Subscriber, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    super::check_customer_exists(c, s.customer.as_deref())?;
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

    /// One subscriber (`only`) or every live one, those `scope` sees, with their figures when
    /// `with_stats`. `only` outside the scope: none.
    pub async fn subscribers(
        &self,
        only: Option<String>,
        with_stats: bool,
        scope: Option<String>,
    ) -> Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.read(move |c| {
                    let snapshot = c.transaction()?;
                    let mut subs = match &only {
                        Some(id) => vec![super::get_subscriber(&snapshot, id)?],
                        None => super::list_subscribers(&snapshot)?,
                    };
                    subs.retain(|s| sees(scope.as_deref(), s.customer.as_deref()));
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
                let mut subs = match &only {
                    Some(id) => vec![p.get_subscriber(id).await?],
                    None => p.list_subscribers().await?,
                };
                subs.retain(|s| sees(scope.as_deref(), s.customer.as_deref()));
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

    /// Change a live subscriber `scope` sees, in one transaction: `change` gets it as stored
    /// and returns the next definition and whether its disabled state was set (or refuses with
    /// its own error, changing nothing). A customer the next definition names must exist
    /// (`Invalid` otherwise).
    pub async fn update_subscriber<E, F>(
        &self,
        id: String,
        scope: Option<String>,
        change: F,
    ) -> Result<Result<Subscriber, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Subscriber) -> Result<(Subscriber, bool), E> + Send + 'static,
    {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    let current = visible_subscriber(c, &id, scope.as_deref())?;
                    let (next, toggled) = match change(current) {
                        Ok(n) => n,
                        Err(e) => return Ok(Err(e)),
                    };
                    super::check_customer_exists(c, next.customer.as_deref())?;
                    super::update_subscriber(c, &next)?;
                    if toggled {
                        super::set_disabled(c, &next.id, next.health.disabled.as_ref())?;
                    }
                    Ok(Ok(next))
                })
                .await
            }
            Store::Postgres(p) => p.change_subscriber(&id, scope.as_deref(), change).await,
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

    /// Add `secret` as the current secret of a live subscriber `scope` sees; the others keep
    /// signing until `now + grace_ms`.
    pub async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        now_ms: i64,
        grace_ms: i64,
        scope: Option<String>,
    ) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    visible_subscriber(c, &id, scope.as_deref())?;
                    super::rotate_secret(c, &id, &secret, now_ms, grace_ms)
                })
                .await
            }
            Store::Postgres(p) => {
                p.rotate_secret_scoped(&id, &secret, now_ms, grace_ms, scope.as_deref())
                    .await
            }
        }
    }

    /// Deliveries matching the filter (its `customer` is the caller's scope).
    pub async fn list_deliveries(
        &self,
        filter: DeliveryFilter,
    ) -> Result<Vec<DeliveryView>, LedgerError> {
        match self {
            Store::Sqlite(l) => l.read(move |c| super::list_deliveries(c, &filter)).await,
            Store::Postgres(p) => p.list_deliveries(&filter).await,
        }
    }

    /// One delivery with its attempts, if `scope` sees it.
    pub async fn get_delivery(
        &self,
        rowid: i64,
        scope: Option<String>,
    ) -> Result<DeliveryView, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.read(move |c| {
                    check_delivery_visible(c, rowid, scope.as_deref())?;
                    super::get_delivery(c, rowid)
                })
                .await
            }
            Store::Postgres(p) => {
                let owner = p.delivery_owner(rowid).await?;
                if !sees(scope.as_deref(), owner.as_deref()) {
                    return Err(unseen_delivery(rowid));
                }
                p.get_delivery(rowid).await
            }
        }
    }

    /// Replay one delivery `scope` sees; returns its subscriber.
    pub async fn replay_one(
        &self,
        rowid: i64,
        now_ms: i64,
        scope: Option<String>,
    ) -> Result<String, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    check_delivery_visible(c, rowid, scope.as_deref())?;
                    super::replay_one(c, rowid, now_ms)
                })
                .await
            }
            Store::Postgres(p) => p.replay_one_scoped(rowid, now_ms, scope.as_deref()).await,
        }
    }

    /// One step of a bulk replay: the first `filter.limit` deliveries matching it after
    /// `filter.after` (its `customer` is the caller's scope), each transaction short (the
    /// caller steps on, as retention does); a filter naming a subscriber that does not exist,
    /// or that the scope does not see, is `NotFound`.
    pub async fn replay_step(
        &self,
        filter: DeliveryFilter,
        now_ms: i64,
    ) -> Result<super::ReplayStep, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    if let Some(s) = &filter.subscriber {
                        visible_subscriber(c, s, filter.customer.as_deref())?;
                    }
                    super::replay_step(c, &filter, now_ms)
                })
                .await
            }
            Store::Postgres(p) => {
                if let Some(s) = &filter.subscriber {
                    self.subscriber(s.clone(), filter.customer.clone()).await?;
                }
                p.replay_step(&filter, now_ms).await
            }
        }
    }

    /// How many deliveries a bulk replay would replay now, changing nothing.
    pub async fn count_replayable(&self, filter: DeliveryFilter) -> Result<u64, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                let n = l
                    .read(move |c| {
                        if let Some(s) = &filter.subscriber {
                            visible_subscriber(c, s, filter.customer.as_deref())?;
                        }
                        super::count_replayable(c, &filter)
                    })
                    .await?;
                Ok(n as u64)
            }
            Store::Postgres(p) => {
                if let Some(s) = &filter.subscriber {
                    self.subscriber(s.clone(), filter.customer.clone()).await?;
                }
                p.count_replayable(&filter).await
            }
        }
    }

    /// Store a test event and a delivery of it to live subscriber `subscriber` alone, if
    /// `scope` sees it. Returns the delivery's row id.
    pub async fn ingest_test(
        &self,
        subscriber: String,
        event: NewEvent,
        now_ms: i64,
        scope: Option<String>,
    ) -> Result<i64, LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    visible_subscriber(c, &subscriber, scope.as_deref())?;
                    super::ingest_test(c, &subscriber, &event, now_ms)
                })
                .await
            }
            Store::Postgres(p) => {
                p.ingest_test(&subscriber, &event, now_ms, scope.as_deref())
                    .await
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
    pub async fn metrics_snapshot(
        &self,
        now_ms: i64,
        breaker: fanout_core::breaker::BreakerConfig,
    ) -> Result<MetricsSnapshot, LedgerError> {
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
