//! The ledger: the contract every backend implements, and the one place that picks a backend.
//! `sqlite/` (the embedded ledger, one daemon) and `postgres/` (shared by several daemons) are
//! siblings implementing it; `store.rs` chooses one from the configuration.

pub mod copy;
pub mod dispatch;
pub mod postgres;
pub mod sqlite;
pub mod store;
mod write_state;

pub use dispatch::{DispatchLedger, Recorded, Turn, TurnError};
pub use write_state::WriteState;
// Kept importable from `crate::ledger` while the backends are reshaped.
pub use sqlite::*;
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
        })
        .collect()
}

/// A subscriber row for the ledger's unit tests: origin lane, 10/s, burst 20.
#[cfg(test)]
pub(crate) fn test_subscriber(id: &str, types: &[&str]) -> crate::model::Subscriber {
    use crate::model::{Lane, Limits, Subscriber};
    Subscriber {
        id: id.into(),
        url: "https://example.com/h".into(),
        event_types: types.iter().map(|s| s.to_string()).collect(),
        limits: Limits {
            rate_per_sec: 10.0,
            burst: 20,
            max_in_flight: 8,
            timeout_ms: 1000,
        },
        lane: Lane::Origin,
        legacy_signature: false,
        secrets: vec![],
        created_ms: 0,
        updated_ms: 0,
        health: Default::default(),
        customer: None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("database error: {0}")]
    Sqlite(rusqlite::Error),
    /// The ledger cannot write now (its size cap or the disk is full, or the disk fails);
    /// nothing of the failed operation was kept. It may succeed again later.
    #[error("the ledger cannot write: {0}")]
    Unavailable(Unavailable),
    #[error("schema: {0}")]
    Schema(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// Refused for now, by a rate limit: it may succeed after `retry_after_ms`.
    #[error("too soon: {message}")]
    TooSoon {
        message: String,
        retry_after_ms: i64,
    },
    #[error("the ledger is closed")]
    Closed,
    #[error(transparent)]
    Postgres(#[from] postgres::PgError),
    /// Another process (a daemon, or a `fanout ledger copy`) owns this SQLite ledger.
    #[error("the ledger {db} is owned by another daemon: {owner}")]
    Owned { db: String, owner: String },
    /// A file of the ledger (its lock, its record) could not be opened, locked or written.
    #[error("{0}")]
    File(String),
}

/// Why the ledger cannot write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// `SQLITE_FULL`: the disk, or the ledger's size cap (`--max-db-size`), is full.
    Full,
    /// `SQLITE_IOERR`: the operating system failed a read or write.
    Io,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unavailable::Full => "the disk or the ledger's size cap is full",
            Unavailable::Io => "the disk reported an I/O error",
        })
    }
}

impl Unavailable {
    /// The kind of a SQLite failure that means "cannot write now", by its result code.
    pub fn classify(e: &rusqlite::Error) -> Option<Unavailable> {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => Some(Unavailable::Full),
            Some(rusqlite::ErrorCode::SystemIoFailure) => Some(Unavailable::Io),
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for LedgerError {
    fn from(e: rusqlite::Error) -> LedgerError {
        match Unavailable::classify(&e) {
            Some(u) => LedgerError::Unavailable(u),
            None => LedgerError::Sqlite(e),
        }
    }
}
