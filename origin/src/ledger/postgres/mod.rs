//! The PostgreSQL ledger: several daemons share one database. Same tables as the SQLite ledger,
//! plus the owner of each lease; the same operations, as async methods over a connection pool
//! (`deadpool-postgres` over `tokio-postgres`).
//!
//! How several daemons share the work without exceeding a subscriber's rate:
//! - A claim runs in one transaction: it locks the claimed subscribers' rows (`FOR UPDATE`, in id
//!   order), counts their in-flight deliveries from live leases, lets the shared core limiter
//!   (the stored bucket, pause and breaker of that row) reserve how many may go, picks and leases
//!   that many due deliveries to this daemon until an expiry in one statement (`FOR UPDATE SKIP
//!   LOCKED`), gives back what it did not find and stores the limiter back. Two daemons claiming
//!   for one subscriber take turns on its row, so their grants add up to what one limiter
//!   allows. A dispatcher turn (results, limiters, claim) is one transaction of six round
//!   trips, whatever its size: statements are prepared once per connection and sent
//!   several at a time where the next does not need the previous answer.
//! - Leases carry their owner (the daemon's id) and expiry. A lease that expired is claimable by
//!   anyone; a result is recorded only while its lease is still the one it was sent under (same
//!   owner, same expiry), so a daemon that comes back after its work was taken over records
//!   nothing for it.
//! - The live daemons split the subscribers (`model::Share`, from the `daemons` table each
//!   dispatcher writes every second): each claims for its own, so their turns do not queue on
//!   each other's subscriber locks. The locks above still decide; the split only spares the wait.
//! - Ingest notifies the other daemons (`NOTIFY fanout_due`) of the subscribers that got work,
//!   on commit; they `LISTEN` instead of polling hard.
//!
//! Invariants: what the SQLite ledger keeps (a delivery exists at most once per
//! `(subscriber_id, event_id)`; deliveries, attempts and events are deleted only by
//! `retention.rs`, finished deliveries past their window, never anything pending or in flight;
//! per-subscriber counts are kept by triggers, never counted from the deliveries), and: a delivery
//! is `in_flight` exactly when it has a lease owner and expiry (a CHECK); this module never
//! waits for a delivery row lock while holding a subscriber row lock it took after it (subscriber
//! rows first, in id order; delivery rows are skipped when locked), so claims never deadlock.
//!
//! Files by subject: `subscribers.rs`, `deliveries.rs`, `customers.rs`, `retention.rs`,
//! `stats.rs` (the contract's traits), `ingest.rs`, `leases.rs` (claims and results),
//! `health.rs`, `dispatch.rs` (`DispatchLedger`: turns, lease renewal, the share), `rows.rs`
//! (rows read into the contract's types), `shared.rs` (the shared limiter's
//! arithmetic, pure), `schema.rs`; the server's own machinery: `ledger.rs` (the handle and its
//! pool), `error.rs` (the driver's errors into the contract's), `listen.rs` (`LISTEN`/`NOTIFY`
//! between daemons), `clock.rs` (one clock for every daemon), `statistics.rs`, `tls.rs`.
//! Nothing here is SQLite's, and nothing outside this folder (but the copy command) names
//! `tokio_postgres` or `deadpool`.

mod clock;
mod customers;
mod deliveries;
mod dispatch;
mod error;
mod growth;
mod health;
mod ingest;
mod leases;
mod ledger;
pub mod listen;
mod retention;
mod rows;
mod schema;
mod shared;
mod statistics;
mod stats;
mod subscribers;
pub mod tls;

pub use crate::ledger::dispatch::Announcement;
pub use dispatch::{LEASE_MS, RENEW_EVERY_MS};
pub use error::PgError;
pub use leases::{Applied, Feedback, LeasedOutcome, PgClaim};
pub use ledger::{parse_url, PgLedger, Rounds};
pub use listen::{Listener, CHANGED_CHANNEL, CUSTOMERS_CHANNEL, DUE_CHANNEL};
pub use retention::{FOLD_EVERY, RETENTION_LOCK};
pub use schema::VERSION as SCHEMA_VERSION;
pub use shared::{grant_shared, merge_limiter, shared_wait};
