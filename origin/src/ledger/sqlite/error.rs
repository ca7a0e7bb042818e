//! rusqlite's errors as the contract's [`LedgerError`]: a full disk or size cap, or an I/O
//! error, by SQLite's result code, is [`Unavailable`]; any other failure is kept whole as a
//! driver error. Nothing else is decided here.

use crate::ledger::error::{DriverError, LedgerError, Unavailable};

/// A SQLite failure, as its driver reported it.
#[derive(Debug, thiserror::Error)]
#[error("database error: {0}")]
pub struct SqliteError(#[from] rusqlite::Error);

/// The kind of a SQLite failure that means "cannot write now", by its result code:
/// `SQLITE_FULL` (the disk, or the ledger's size cap `--max-db-size`, is full) or
/// `SQLITE_IOERR` (the operating system failed a read or write).
pub fn classify(e: &rusqlite::Error) -> Option<Unavailable> {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => Some(Unavailable::Full),
        Some(rusqlite::ErrorCode::SystemIoFailure) => Some(Unavailable::Io),
        _ => None,
    }
}

impl From<rusqlite::Error> for LedgerError {
    fn from(e: rusqlite::Error) -> LedgerError {
        match classify(&e) {
            Some(u) => LedgerError::Unavailable(u),
            None if refuses_the_data(&e) => {
                LedgerError::Driver(DriverError::refused(SqliteError(e)))
            }
            None => LedgerError::Driver(DriverError::failed(SqliteError(e))),
        }
    }
}

/// Result codes that refuse the data itself, whenever it is tried: a constraint (also one a
/// trigger raises), a value past `SQLITE_MAX_LENGTH`, a type the column cannot hold.
fn refuses_the_data(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(
            rusqlite::ErrorCode::ConstraintViolation
                | rusqlite::ErrorCode::TooBig
                | rusqlite::ErrorCode::TypeMismatch
        )
    )
}
