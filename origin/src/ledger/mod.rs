//! The SQLite ledger: the source of truth. One connection, owned by one writer thread; every
//! operation is a closure sent to that thread and runs in its own transaction, so batches
//! (an ingest of 100 events, a dispatcher tick's claims, a burst of results) commit at once.
//!
//! Invariants: a delivery exists at most once per `(subscriber_id, event_id)`; a delivery is
//! `in_flight` only while leased by the dispatcher; nothing is ever deleted.

mod health;
mod queries;
mod schema;
mod stats;
pub mod status;

use std::path::Path;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags};

pub use health::*;
pub use queries::*;
pub use schema::VERSION as SCHEMA_VERSION;
pub use stats::{subscriber_stats, SubscriberStats};

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

/// A handle to the ledger's threads: one writer, and one reader (WAL lets it read a consistent
/// snapshot while the writer commits) for the API's queries. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    tx: mpsc::Sender<Job>,
    reader: mpsc::Sender<Job>,
}

fn spawn_worker(
    name: &str,
    mut conn: Connection,
    checkpoint: bool,
) -> Result<mpsc::Sender<Job>, LedgerError> {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                // A panicking job fails its own caller (its reply channel drops), not the ledger.
                let run = std::panic::AssertUnwindSafe(|| job(&mut conn));
                if std::panic::catch_unwind(run).is_err() {
                    tracing::error!("a ledger operation panicked; its transaction was rolled back");
                }
            }
            if checkpoint {
                // Fold the WAL back into the main file on a clean exit.
                let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
            }
        })
        .map_err(|e| LedgerError::Schema(format!("cannot start the {name} thread: {e}")))?;
    Ok(tx)
}

async fn run_on<T, F>(worker: &mpsc::Sender<Job>, f: F) -> Result<T, LedgerError>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
{
    let (otx, orx) = tokio::sync::oneshot::channel();
    worker
        .send(Box::new(move |conn| {
            let _ = otx.send(f(conn));
        }))
        .map_err(|_| LedgerError::Closed)?;
    orx.await.map_err(|_| LedgerError::Closed)?
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
        let writer = open_connection(path)?;
        let reader = open_connection(path)?;
        reader.execute_batch("PRAGMA query_only = ON;")?;
        Ok(Ledger {
            tx: spawn_worker("fanout-ledger", writer, true)?,
            reader: spawn_worker("fanout-reader", reader, false)?,
        })
    }

    /// Run `f` on the writer thread.
    pub async fn call<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        run_on(&self.tx, f).await
    }

    /// Run a read-only `f` on the reader thread: it sees every transaction committed before it
    /// starts, and never waits for the writer.
    pub async fn read<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        run_on(&self.reader, f).await
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
