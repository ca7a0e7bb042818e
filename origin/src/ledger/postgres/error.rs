//! The PostgreSQL driver's and pool's errors as the contract's [`LedgerError`]: a server that
//! cannot write now is [`Unavailable`] by its SQLSTATE; a pool that lends no connection, or a
//! connection that failed, is unreachable (the API answers 503); every other failure is kept
//! whole as a driver error. Nothing else is decided here.

use std::sync::Arc;

use crate::ledger::error::{DriverError, LedgerError, Unavailable};

/// Errors of the PostgreSQL driver and pool (cheap to clone, like every `LedgerError`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PgError {
    #[error("{}", describe(.0))]
    Db(Arc<tokio_postgres::Error>),
    #[error("no connection to PostgreSQL: {}", with_causes(.0.as_ref()))]
    Pool(Arc<deadpool_postgres::PoolError>),
    #[error("{0}")]
    Config(String),
    /// The URL or its TLS settings (`crate::pg`).
    #[error(transparent)]
    Url(crate::pg::UrlError),
}

impl PgError {
    /// PostgreSQL cannot be reached now (no pooled connection, or the connection itself
    /// failed rather than the server refusing a statement): the request may succeed later.
    pub fn is_unreachable(&self) -> bool {
        match self {
            PgError::Pool(_) => true,
            PgError::Db(e) => e.as_db_error().is_none() && e.is_closed(),
            PgError::Config(_) | PgError::Url(_) => false,
        }
    }

    /// The server's SQLSTATE, when the server answered with an error.
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            PgError::Db(e) => e.code(),
            _ => None,
        }
    }
}

impl From<PgError> for LedgerError {
    fn from(e: PgError) -> Self {
        if e.is_unreachable() {
            LedgerError::Driver(DriverError::unreachable(e))
        } else if e.code().is_some_and(refuses_the_data) {
            LedgerError::Driver(DriverError::refused(e))
        } else {
            LedgerError::Driver(DriverError::failed(e))
        }
    }
}

/// SQLSTATE classes that refuse the data itself, whenever it is tried: `22` data exception (a
/// value the type cannot hold), `23` integrity constraint violation, `54` program limit
/// exceeded (`54000`: an index row past the btree's maximum). Not `40` (a serialization failure
/// or deadlock succeeds when tried again) nor `53` (insufficient resources).
fn refuses_the_data(code: &tokio_postgres::error::SqlState) -> bool {
    matches!(code.code().get(..2), Some("22" | "23" | "54"))
}

pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
        None => format!("postgres: {}", with_causes(e)),
    }
}

/// `e` and each of its causes that its message does not already say: the driver's "error
/// performing TLS handshake" alone does not tell a wrong CA from a wrong host name.
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

impl From<tokio_postgres::Error> for LedgerError {
    /// A server that cannot write now is told by its SQLSTATE, as SQLite's by its result code:
    /// a full disk (`53100`, also what a table that cannot grow reports) or an I/O error
    /// (`58030`) is [`Unavailable`] (the API answers 503 `unavailable`, a dispatcher turn is
    /// retried whole), every other failure stays PostgreSQL's own.
    fn from(e: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        match e.code() {
            Some(c) if *c == SqlState::DISK_FULL => LedgerError::Unavailable(Unavailable::Full),
            Some(c) if *c == SqlState::IO_ERROR => LedgerError::Unavailable(Unavailable::Io),
            _ => LedgerError::from(PgError::Db(Arc::new(e))),
        }
    }
}

impl From<deadpool_postgres::PoolError> for LedgerError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        LedgerError::from(PgError::Pool(Arc::new(e)))
    }
}
