//! The one place that chooses a backend: [`Store`] is the embedded SQLite ledger or a
//! PostgreSQL one shared by several daemons, opened from the configuration's `--db`
//! ([`Store::open`]), and forwards every trait of the contract to it by one `match` per
//! operation (the `forward!` macro). The dispatcher, the API and retention see only the
//! contract; nothing else in the daemon names a backend. What a backend needs beside its
//! operations (SQLite's owner lock, PostgreSQL's background rounds and `LISTEN`) is started
//! here too, and held by [`Held`] for as long as the daemon serves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;

use super::customers::Customers;
use super::deliveries::{
    Deliveries, DeliveryFilter, DeliveryView, HeldKey, Ingested, NewEvent, ReplayStep,
};
use super::dispatch::Announcement;
use super::dispatch::{DispatchLedger, Recorded, Turn, TurnError};
use super::error::LedgerError;
use super::postgres::listen;
use super::postgres::{PgLedger, Rounds};
use super::retention::{Finished, Removed, Retention, RetentionReport};
use super::series::SeriesLedger;
use super::sqlite::owner::{OwnerLock, Taker};
use super::sqlite::{Ledger, LedgerOptions};
use super::stats::{MetricsSnapshot, Observe};
use super::subscribers::{SubscriberCounts, Subscribers};
use super::write_state::WriteState;
use crate::customer::Customer;
use crate::keyring::NewSecret;
use crate::model::{InFlight, Share, Subscriber};
use crate::series::buckets::SeriesRow;

/// A ledger, whichever backend holds it. Cheap to clone.
#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(Ledger),
    Postgres(PgLedger),
}

/// Where the ledger is, as `--db` names it.
#[derive(Debug, Clone, Copy)]
pub enum Location<'a> {
    /// The embedded SQLite ledger in this file (one owning daemon).
    Sqlite(&'a std::path::Path),
    /// A PostgreSQL database several daemons may share: its connection URL.
    Postgres(&'a str),
}

/// How to open a [`Store`] besides where.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// SQLite: the most bytes the file may hold (`--max-db-size`).
    pub max_bytes: Option<u64>,
    /// PostgreSQL: the breaker settings the shared limiter is asked with.
    pub breaker: BreakerConfig,
    /// PostgreSQL: this daemon's name in the leases it takes (unique among the daemons).
    pub daemon: String,
}

/// What an open store holds while the daemon serves: SQLite's owner lock (released when this
/// drops, after [`Store::close`]), PostgreSQL's background rounds (ended when this drops).
#[derive(Debug)]
pub struct Held {
    owner: Option<OwnerLock>,
    _rounds: Option<Rounds>,
}

impl Held {
    /// The owner lock's path (SQLite); `None` on a shared PostgreSQL ledger.
    pub fn lock(&self) -> Option<String> {
        self.owner.as_ref().map(|o| o.path().display().to_string())
    }
}

impl Store {
    /// Open the ledger `--db` names, as a daemon that serves it: SQLite under its owner lock
    /// (refused while another daemon holds it), PostgreSQL with its background rounds (clock,
    /// lease renewal, count folds, statistics, probes for room) started.
    pub async fn open(at: Location<'_>, opts: OpenOptions) -> Result<(Store, Held), LedgerError> {
        match at {
            Location::Sqlite(path) => {
                let owner = OwnerLock::acquire(path, crate::time::now_ms(), Taker::Serve)?;
                let ledger = Ledger::open_with(
                    path,
                    LedgerOptions {
                        max_bytes: opts.max_bytes,
                    },
                )?;
                let held = Held {
                    owner: Some(owner),
                    _rounds: None,
                };
                Ok((Store::Sqlite(ledger), held))
            }
            Location::Postgres(url) => {
                let pg = PgLedger::open(url, &opts.daemon)
                    .await?
                    .with_breaker(opts.breaker);
                tracing::info!(daemon = %opts.daemon, "sharing a PostgreSQL ledger");
                let held = Held {
                    owner: None,
                    _rounds: Some(pg.start_rounds()),
                };
                Ok((Store::Postgres(pg), held))
            }
        }
    }

    /// Whether other daemons may share this ledger (PostgreSQL): then it can be out of reach
    /// while this daemon runs, and `/healthz` asks whether it answers.
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Postgres(_))
    }

    /// Whether the ledger can write, as its last writes found it (atomics only).
    pub fn write_state(&self) -> Arc<WriteState> {
        match self {
            Store::Sqlite(l) => l.write_state(),
            Store::Postgres(p) => p.write_state(),
        }
    }

    /// Hand `to` what other daemons sharing the ledger announce, each mapped by `map`; listening
    /// has begun when this returns. Nothing on SQLite (one daemon: nobody else announces).
    pub async fn announce_to<T: Send + 'static>(
        &self,
        to: tokio::sync::mpsc::UnboundedSender<T>,
        map: fn(Announcement) -> T,
    ) {
        if let Store::Postgres(p) = self {
            listen::forward(p.clone(), to, map).await;
        }
    }

    /// Wait until everything queued before this call is committed (SQLite's writer); at once
    /// on PostgreSQL.
    pub async fn close(&self) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => l.call(|_| Ok(())).await,
            Store::Postgres(_) => Ok(()),
        }
    }
}

impl From<Ledger> for Store {
    fn from(l: Ledger) -> Store {
        Store::Sqlite(l)
    }
}

impl From<PgLedger> for Store {
    fn from(p: PgLedger) -> Store {
        Store::Postgres(p)
    }
}

/// Methods of `$trait` that forward to the backend: one `match`, no boxing, no allocation.
macro_rules! forward {
    ($trait:ident: $(fn $m:ident(&self $(, $a:ident: $t:ty)*) -> $r:ty;)*) => {
        $(
            async fn $m(&self $(, $a: $t)*) -> $r {
                match self {
                    Store::Sqlite(l) => $trait::$m(l $(, $a)*).await,
                    Store::Postgres(p) => $trait::$m(p $(, $a)*).await,
                }
            }
        )*
    };
}

impl DispatchLedger for Store {
    forward! { DispatchLedger:
        fn dispatch_subscribers(&self) -> Result<Vec<(Subscriber, LimiterState)>, LedgerError>;
        fn dispatch_subscriber(&self, id: &str) -> Result<Option<(Subscriber, LimiterState)>, LedgerError>;
        fn dispatch_customers(&self) -> Result<Vec<(String, u32, Option<u32>)>, LedgerError>;
        fn record_turn(&self, turn: Turn) -> Result<Recorded, TurnError>;
        fn due_work(&self, dead_threshold: u64) -> Result<Vec<(String, i64)>, LedgerError>;
        fn release_expired_leases(&self, now_ms: i64) -> Result<Vec<String>, LedgerError>;
        fn release_all_leases(&self, now_ms: i64) -> Result<usize, LedgerError>;
        fn release_strays(&self, held: Vec<i64>, now_ms: i64) -> Result<Vec<String>, LedgerError>;
        fn share(&self, in_flight: &[(Option<String>, usize)]) -> Result<Option<(Share, InFlight)>, LedgerError>;
        fn leave(&self) -> Result<(), LedgerError>;
    }
}

impl Subscribers for Store {
    forward! { Subscribers:
        fn subscriber(&self, id: String, scope: Option<String>) -> Result<Subscriber, LedgerError>;
        fn create_subscriber(&self, s: Subscriber, secret: NewSecret) -> Result<Subscriber, LedgerError>;
        fn subscribers(&self, only: Option<String>, with_stats: bool, scope: Option<String>)
            -> Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError>;
        fn delete_subscriber(&self, id: String, now_ms: i64) -> Result<u64, LedgerError>;
        fn rotate_secret(&self, id: String, secret: NewSecret, now_ms: i64, grace_ms: i64, scope: Option<String>)
            -> Result<(), LedgerError>;
    }

    async fn update_subscriber<E, F>(
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
            Store::Sqlite(l) => l.update_subscriber(id, scope, change).await,
            Store::Postgres(p) => Subscribers::update_subscriber(p, id, scope, change).await,
        }
    }
}

impl Deliveries for Store {
    forward! { Deliveries:
        fn ingest(&self, events: Vec<NewEvent>, now_ms: i64) -> Result<(Vec<Ingested>, Vec<String>), LedgerError>;
        fn list_deliveries(&self, filter: DeliveryFilter) -> Result<Vec<DeliveryView>, LedgerError>;
        fn get_delivery(&self, rowid: i64, scope: Option<String>) -> Result<DeliveryView, LedgerError>;
        fn replay_one(&self, rowid: i64, now_ms: i64, scope: Option<String>) -> Result<String, LedgerError>;
        fn replay_step(&self, filter: DeliveryFilter, now_ms: i64) -> Result<ReplayStep, LedgerError>;
        fn count_replayable(&self, filter: DeliveryFilter) -> Result<u64, LedgerError>;
        fn held_keys(&self, subscriber: String, limit: usize, scope: Option<String>) -> Result<Vec<HeldKey>, LedgerError>;
        fn ingest_test(&self, subscriber: String, event: NewEvent, now_ms: i64, scope: Option<String>)
            -> Result<i64, LedgerError>;
    }
}

impl Customers for Store {
    forward! { Customers:
        fn create_customer(&self, cu: Customer) -> Result<(), LedgerError>;
        fn customer(&self, id: String) -> Result<Customer, LedgerError>;
        fn delete_customer(&self, id: String) -> Result<(), LedgerError>;
        fn revoke_portal_links(&self, id: String, nonce: String, now_ms: i64) -> Result<(), LedgerError>;
        fn portal_key(&self, fresh: Vec<u8>, now_ms: i64) -> Result<Vec<u8>, LedgerError>;
        fn customers(&self, only: Option<String>) -> Result<Vec<(Customer, u32)>, LedgerError>;
    }

    async fn update_customer<E, F>(
        &self,
        id: String,
        change: F,
    ) -> Result<Result<Customer, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Customer) -> Result<Customer, E> + Send + 'static,
    {
        match self {
            Store::Sqlite(l) => l.update_customer(id, change).await,
            Store::Postgres(p) => Customers::update_customer(p, id, change).await,
        }
    }
}

impl Retention for Store {
    forward! { Retention:
        fn retention_report(&self) -> Result<RetentionReport, LedgerError>;
        fn purge_finished(&self, kind: Finished, cutoff_ms: i64, batch: usize)
            -> Result<Option<(Removed, Duration)>, LedgerError>;
        fn sweep_events(&self, cutoff_ms: i64, batch: usize) -> Result<Option<(u64, bool, Duration)>, LedgerError>;
        fn mark_retention_run(&self, now_ms: i64) -> Result<(), LedgerError>;
        fn purge_series(&self, resolution_ms: i64, cutoff_ms: i64, batch: usize) -> Result<u64, LedgerError>;
    }
}

impl SeriesLedger for Store {
    forward! { SeriesLedger:
        fn add_series(&self, rows: Vec<SeriesRow>) -> Result<(), LedgerError>;
        fn read_series(&self, resolution_ms: i64, from_ms: i64, to_ms: i64, subscriber: Option<String>, scope: Option<String>)
            -> Result<Vec<SeriesRow>, LedgerError>;
    }
}

impl Observe for Store {
    forward! { Observe:
        fn ping(&self) -> Result<(), LedgerError>;
        fn metrics_snapshot(&self, now_ms: i64, breaker: BreakerConfig) -> Result<MetricsSnapshot, LedgerError>;
    }
}

/// Fixtures for the unit tests of the layers above the contract (the API, retention), which
/// name no backend.
#[cfg(test)]
impl Store {
    /// A fresh ledger in `dir` (an embedded one: the cheapest to make).
    pub(crate) fn scratch(dir: &std::path::Path) -> Store {
        Store::Sqlite(Ledger::open(&dir.join("scratch.db")).expect("a scratch ledger opens"))
    }

    /// Keep the ledger's writer busy for `d`, as a long transaction would: everything that
    /// writes waits behind it. Only an embedded ledger has one writer to hold.
    pub(crate) async fn hold_writer(&self, d: Duration) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.call(move |_| {
                    std::thread::sleep(d);
                    Ok(())
                })
                .await
            }
            Store::Postgres(_) => Err(LedgerError::Invalid("no single writer to hold".into())),
        }
    }
}
