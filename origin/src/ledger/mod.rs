//! The ledger: the contract every backend implements, and the one place that picks a backend.
//!
//! This folder's own files are the contract: the traits the dispatcher (`dispatch.rs`), the API
//! (`subscribers.rs`, `deliveries.rs`, `customers.rs`, `stats.rs`) and retention
//! (`retention.rs`) call, the rows they speak, the one error (`error.rs`, naming no driver), the
//! one customer-scope rule (`scope.rs`), the one delivery-filter builder (`filter.rs`),
//! whether writes fail (`write_state.rs`) and each table's columns, values and decoding
//! (`rows/`, read through a `Cells` trait each backend implements once for its driver). None of
//! them names a driver, runs SQL or holds a connection.
//!
//! `sqlite/` (the embedded ledger, one daemon) and `postgres/` (shared by several daemons) are
//! siblings implementing the contract, each split by subject; neither imports the other.
//! `store.rs` is the one place that chooses a backend (from the configuration) and forwards the
//! contract to it; `copy/` (`fanout ledger copy`) is the one place that names both drivers: it
//! decodes each table with one and encodes it with the other, by `rows/`' column lists.

pub mod copy;
pub mod customers;
pub mod deliveries;
pub mod dispatch;
pub mod error;
pub mod fanout;
pub mod filter;
pub mod postgres;
pub mod retention;
pub mod rows;
pub mod rules;
pub mod scope;
pub mod sequence;
pub mod series;
pub mod sqlite;
pub mod stats;
pub mod store;
pub mod subscribers;
mod write_state;

pub use customers::Customers;
pub use deliveries::{
    AttemptRecordView, Deliveries, DeliveryFilter, DeliveryView, HeldKey, Ingested, NewEvent,
    ReplayStep,
};
pub use dispatch::{Announcement, DispatchLedger, Recorded, Turn, TurnError};
pub use error::{DriverError, LedgerError, Unavailable};
pub use retention::{Finished, Removed, Retention, RetentionReport};
pub use stats::{MetricsSnapshot, Observe, SubscriberStats};
pub use subscribers::{SubscriberCounts, Subscribers};
pub use write_state::WriteState;
// The dispatcher's domain types live in the model; these names are kept for existing callers.
pub use crate::model::{AttemptRecord, Claim, Claimed, HealthWrite, Outcome, Transition};

/// `n` events `e0`, `e1`, … of type `t` with body `{}`, for the ledger's unit tests.
#[cfg(test)]
pub(crate) fn test_events(n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| NewEvent {
            id: format!("e{i}"),
            event_type: "t".into(),
            body: "{}".into(),
            traceparent: None,
        })
        .collect()
}

/// A subscriber row for the ledger's unit tests: origin lane, 10/s, burst 20.
#[cfg(test)]
pub(crate) fn test_subscriber(id: &str, types: &[&str]) -> crate::model::Subscriber {
    use crate::model::{Lane, Limits, Subscriber};
    let limits = Limits {
        rate_per_sec: 10.0,
        burst: 20,
        max_in_flight: 8,
        timeout_ms: 1000,
    };
    Subscriber {
        lane: Lane::Origin,
        ..Subscriber::new(id, "https://example.com/h", types, limits)
    }
}
