//! The SQLite ledger: the source of truth. One connection, owned by one writer thread; every
//! operation is a closure sent to that thread and runs in its own transaction, so batches
//! (an ingest of 100 events, a dispatcher tick's claims, a burst of results) commit at once.
//!
//! Invariants: a delivery exists at most once per `(subscriber_id, event_id)`; a delivery is
//! `in_flight` only while leased by the dispatcher; nothing is ever deleted.

mod queries;
mod schema;

use std::path::Path;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags};

pub use queries::*;
pub use schema::VERSION as SCHEMA_VERSION;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("schema: {0}")]
    Schema(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("the ledger is closed")]
    Closed,
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A handle to the ledger's writer thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    tx: mpsc::Sender<Job>,
}

/// Open (creating if needed) and migrate the database, with the pragmas the daemon relies on.
pub fn open_connection(path: &Path) -> Result<Connection, LedgerError> {
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(LedgerError::Schema(format!(
            "could not switch {} to WAL mode (got {mode})",
            path.display()
        )));
    }
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL;
         PRAGMA busy_timeout = 5000;
         PRAGMA cache_size = -8192;
         PRAGMA temp_store = MEMORY;",
    )?;
    conn.set_prepared_statement_cache_capacity(64);
    schema::migrate(&mut conn)?;
    Ok(conn)
}

impl Ledger {
    /// Open the ledger and start its writer thread. The thread ends when the last handle is
    /// dropped.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let mut conn = open_connection(path)?;
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("fanout-ledger".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job(&mut conn);
                }
                // Fold the WAL back into the main file on a clean exit.
                let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
            })
            .map_err(|e| LedgerError::Schema(format!("cannot start the ledger thread: {e}")))?;
        Ok(Ledger { tx })
    }

    /// Run `f` on the writer thread.
    pub async fn call<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        let (otx, orx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Box::new(move |conn| {
                let _ = otx.send(f(conn));
            }))
            .map_err(|_| LedgerError::Closed)?;
        orx.await.map_err(|_| LedgerError::Closed)?
    }

    /// Run `f` in one transaction on the writer thread.
    pub async fn tx<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, LedgerError> + Send + 'static,
    {
        self.call(move |conn| {
            let tx = conn.transaction()?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }
}
