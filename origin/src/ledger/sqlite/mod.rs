//! The SQLite ledger: the source of truth of a single daemon. One connection, owned by one
//! writer thread; every operation is a closure sent to that thread and runs in a transaction,
//! so batches (an ingest of 100 events, a dispatcher tick's claims, a burst of results) commit
//! at once. Operations queued together share one transaction, each under its own savepoint
//! (group commit, see `writer.rs`); each is answered only once that transaction has committed.
//! A third connection checkpoints the WAL into the database file on its own thread.
//!
//! Files by subject: `subscribers.rs`, `ingest.rs`, `leases.rs` (the dispatcher's writes),
//! `deliveries.rs` (lists, replays, test events), `customers.rs`, `limiters.rs`, `health.rs`,
//! `stats.rs`, `status.rs`,
//! `retention.rs`, `series.rs` (the charts' buckets), `dispatch.rs` (the contract's `DispatchLedger`), `schema.rs`; the file's own
//! machinery: `ledger.rs` (the handle), `writer.rs`, `backup.rs`, `owner.rs` (the one daemon's
//! lock), `files.rs`, `error.rs` (rusqlite's errors into the contract's). Nothing here is
//! PostgreSQL's, and nothing outside this folder (but the copy command) names rusqlite.
//!
//! Invariants: a delivery exists at most once per `(subscriber_id, event_id)`; a delivery is
//! `in_flight` only while leased by the dispatcher; deliveries, attempts and events are deleted
//! only by `retention.rs` (finished deliveries past their window), never anything pending or in
//! flight.

pub mod backup;
mod cells;
mod customers;
mod deliveries;
mod dispatch;
mod error;
mod files;
mod health;
mod ingest;
mod leases;
mod ledger;
mod limiters;
mod ordered;
pub(super) mod owner;
#[cfg(test)]
mod plans;
mod retention;
mod schema;
mod series;
mod stats;
mod status;
mod subscribers;
#[cfg(test)]
mod tests;
mod writer;

// The door: the handle (`Ledger::open`) and `fanout backup`; the contract's
// implementations come with the handle. The rest is for the ledger's own files (the store,
// the copy) only.
pub use ledger::Ledger;
pub(super) use ledger::LedgerOptions;

pub(super) use schema::VERSION as SCHEMA_VERSION;

/// What the crate's unit tests outside `ledger/` read directly.
#[cfg(test)]
pub(crate) use {
    ingest::ingest, retention::report, stats::subscriber_stats, subscribers::create_subscriber,
};

/// The backend's own tests name its operations from here.
#[cfg(test)]
use {deliveries::*, health::*, leases::*, limiters::*, subscribers::*};

/// An empty, migrated in-memory ledger for the ledger's unit tests.
#[cfg(test)]
pub(crate) fn test_db() -> rusqlite::Connection {
    let mut c = rusqlite::Connection::open_in_memory().unwrap();
    schema::migrate(&mut c).unwrap();
    c
}
