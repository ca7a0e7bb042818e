//! The ledger's one error, whichever backend answers. It names no driver: each backend turns
//! its driver's errors into it in its own folder (`sqlite/error.rs`, `postgres/error.rs`),
//! deciding there, by the driver's codes, what is [`Unavailable`] and what is unreachable.

use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The backend's driver failed (its own error, kept whole behind [`DriverError`]).
    #[error(transparent)]
    Driver(DriverError),
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
    /// Another process (a daemon, or a `fanout ledger copy`) owns this SQLite ledger.
    #[error("the ledger {db} is owned by another daemon: {owner}")]
    Owned { db: String, owner: String },
    /// A file of the ledger (its lock, its record) could not be opened, locked or written.
    #[error("{0}")]
    File(String),
}

impl LedgerError {
    /// The same error for another caller (a failed group commit fails every operation in it).
    pub fn again(&self) -> LedgerError {
        match self {
            LedgerError::Driver(e) => LedgerError::Driver(e.clone()),
            LedgerError::Unavailable(u) => LedgerError::Unavailable(*u),
            LedgerError::Schema(m) => LedgerError::Schema(m.clone()),
            LedgerError::NotFound(m) => LedgerError::NotFound(m.clone()),
            LedgerError::Conflict(m) => LedgerError::Conflict(m.clone()),
            LedgerError::Invalid(m) => LedgerError::Invalid(m.clone()),
            LedgerError::TooSoon {
                message,
                retry_after_ms,
            } => LedgerError::TooSoon {
                message: message.clone(),
                retry_after_ms: *retry_after_ms,
            },
            LedgerError::Closed => LedgerError::Closed,
            LedgerError::Owned { db, owner } => LedgerError::Owned {
                db: db.clone(),
                owner: owner.clone(),
            },
            LedgerError::File(m) => LedgerError::File(m.clone()),
        }
    }
}

/// A driver's error, as its backend classified it ([`DriverKind`]), and the driver's own error
/// for the log. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DriverError {
    kind: DriverKind,
    source: Arc<dyn std::error::Error + Send + Sync>,
}

/// What a driver's error says about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverKind {
    /// A statement failed for a reason of the moment or of the ledger's own (it may succeed
    /// again).
    Failed,
    /// No connection: the request may succeed later.
    Unreachable,
    /// The database refuses the data itself (a value past a limit of its, a constraint): the
    /// same data fails again, whenever tried.
    Refused,
}

impl DriverError {
    /// A driver's failure to answer (the server refused, a statement failed, …).
    pub fn failed(e: impl std::error::Error + Send + Sync + 'static) -> DriverError {
        DriverError::of(DriverKind::Failed, e)
    }

    /// The ledger could not be reached (no connection, or the connection itself failed).
    pub fn unreachable(e: impl std::error::Error + Send + Sync + 'static) -> DriverError {
        DriverError::of(DriverKind::Unreachable, e)
    }

    /// The database refuses the data of the operation (decided by each backend from its
    /// driver's codes: a data exception, a program limit, a constraint).
    pub fn refused(e: impl std::error::Error + Send + Sync + 'static) -> DriverError {
        DriverError::of(DriverKind::Refused, e)
    }

    fn of(kind: DriverKind, e: impl std::error::Error + Send + Sync + 'static) -> DriverError {
        DriverError {
            kind,
            source: Arc::new(e),
        }
    }

    /// The ledger could not be reached now: the request may succeed later.
    pub fn is_unreachable(&self) -> bool {
        self.kind == DriverKind::Unreachable
    }

    /// The data of the operation is refused: trying the same again fails the same way.
    pub fn is_refused(&self) -> bool {
        self.kind == DriverKind::Refused
    }
}

impl LedgerError {
    /// The ledger refuses what it was given (not "cannot now"): an outbox moves such an event
    /// to `<table>_rejected` instead of trying it for ever.
    pub fn is_refusal(&self) -> bool {
        matches!(self, LedgerError::Driver(d) if d.is_refused())
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

/// Why the ledger cannot write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// The disk, or the ledger's size cap (`--max-db-size`), is full.
    Full,
    /// The operating system failed a read or write.
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

// The refusals both backends answer with, worded once.

/// A subscriber created under the id of a live one.
pub fn subscriber_exists(id: &str) -> LedgerError {
    LedgerError::Conflict(format!("subscriber {id} already exists"))
}

/// A removed subscriber's id asked for by another owner while its deliveries are kept.
pub fn id_still_holds_history(id: &str) -> LedgerError {
    LedgerError::Conflict(format!(
        "the id {id} belonged to a removed subscriber of another owner whose deliveries are \
         still kept: choose another id, or reuse it once retention has removed them"
    ))
}

/// A rotation of `id`'s secret refused for `wait_ms` more.
pub fn rotation_too_soon(id: &str, wait_ms: i64) -> LedgerError {
    LedgerError::TooSoon {
        message: format!(
            "the secret of {id} was rotated less than {} s ago: rotate again in {} s",
            crate::model::MIN_ROTATION_INTERVAL_MS / 1000,
            (wait_ms + 999) / 1000
        ),
        retry_after_ms: wait_ms,
    }
}

/// A test event to `subscriber` refused for `wait_ms` more.
pub fn test_too_soon(subscriber: &str, wait_ms: i64) -> LedgerError {
    LedgerError::TooSoon {
        message: format!(
            "{subscriber} has a test event on its way or was sent one less than {} s ago: one \
             test event at a time, one every {} s",
            crate::model::MIN_TEST_INTERVAL_MS / 1000,
            crate::model::MIN_TEST_INTERVAL_MS / 1000
        ),
        retry_after_ms: wait_ms,
    }
}
