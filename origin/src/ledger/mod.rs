//! The SQLite ledger: the source of truth. One connection, owned by one writer thread; every
//! operation is a closure sent to that thread and runs in a transaction, so batches (an ingest
//! of 100 events, a dispatcher tick's claims, a burst of results) commit at once. Operations
//! queued together share one transaction, each under its own savepoint (group commit, see
//! `writer.rs`); each is answered only once that transaction has committed. A third connection
//! checkpoints the WAL into the database file on its own thread.
//!
//! Invariants: a delivery exists at most once per `(subscriber_id, event_id)`; a delivery is
//! `in_flight` only while leased by the dispatcher; deliveries, attempts and events are deleted
//! only by `retention` (finished deliveries past their window), never anything pending or in
//! flight.

pub mod backup;
mod customers;
mod health;
pub mod ops;
#[cfg(test)]
mod plans;
mod queries;
pub mod retention;
mod schema;
mod stats;
pub mod status;
mod writer;

/// An empty, migrated in-memory ledger for the ledger's unit tests.
#[cfg(test)]
pub(crate) fn test_db() -> rusqlite::Connection {
    let mut c = rusqlite::Connection::open_in_memory().unwrap();
    schema::migrate(&mut c).unwrap();
    c
}

/// `n` events `e0`, `e1`, … of type `t` with body `{}`, for the ledger's unit tests.
#[cfg(test)]
pub(crate) fn test_events(n: usize) -> Vec<queries::NewEvent> {
    (0..n)
        .map(|i| queries::NewEvent {
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

use std::path::Path;
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags};

pub use customers::*;
pub use health::*;
pub use ops::{DispatchLedger, Recorded, Turn, TurnError};
pub use queries::*;
pub use schema::VERSION as SCHEMA_VERSION;
pub use stats::{subscriber_stats, SubscriberStats};
// The dispatcher's domain types live in the model; these names are kept for existing callers.
pub use crate::model::{AttemptRecord, Claim, Claimed, HealthWrite, Outcome, Transition};

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

use writer::Job;

/// A handle to the ledger's threads: one writer, and one reader (WAL lets it read a consistent
/// snapshot while the writer commits) for the API's queries. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    tx: mpsc::Sender<Job>,
    reader: mpsc::Sender<Job>,
    /// Dropped with the last handle, which ends the checkpointer.
    _checkpointer: mpsc::Sender<()>,
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
            writer::serve(&mut conn, &rx);
            if checkpoint {
                // Fold the WAL back into the main file on a clean exit.
                let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);");
            }
        })
        .map_err(|e| LedgerError::Schema(format!("cannot start the {name} thread: {e}")))?;
    Ok(tx)
}

/// How often the checkpointer folds the WAL back into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Copies committed pages from the WAL into the database file (and syncs it) beside the writer
/// instead of inside its commits: a passive checkpoint never blocks the writer or the readers.
fn spawn_checkpointer(conn: Connection) -> Result<mpsc::Sender<()>, LedgerError> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("fanout-checkpoint".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(CHECKPOINT_EVERY) {
                if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE);") {
                    tracing::warn!(error = %e, "checkpoint failed");
                }
            }
        })
        .map_err(|e| LedgerError::Schema(format!("cannot start the checkpoint thread: {e}")))?;
    Ok(tx)
}

async fn run_on<T, F>(worker: &mpsc::Sender<Job>, f: F) -> Result<T, LedgerError>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
{
    let (otx, orx) = tokio::sync::oneshot::channel();
    worker
        .send(Job::Call(Box::new(move |conn| {
            let _ = otx.send(f(conn));
        })))
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
        // Checkpoints run on their own thread (below). Under a steady stream of commits a
        // passive checkpoint never quite catches up, so the writer still checkpoints what is
        // left once the WAL passes 4000 pages (16 MiB; the default is 1000), and when the WAL
        // restarts its file is cut back to 16 MiB. (Cutting it to 4 MiB cost a quarter of the
        // writer's time on single-event commits: the file was shrunk and grown again each time.)
        writer.execute_batch(
            "PRAGMA wal_autocheckpoint = 4000;
             PRAGMA journal_size_limit = 16777216;",
        )?;
        let reader = open_connection(path)?;
        reader.execute_batch("PRAGMA query_only = ON;")?;
        Ok(Ledger {
            tx: spawn_worker("fanout-ledger", writer, true)?,
            reader: spawn_worker("fanout-reader", reader, false)?,
            _checkpointer: spawn_checkpointer(open_connection(path)?)?,
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

    /// Run `f` in a transaction on the writer thread: all of its changes are kept or none, and
    /// it returns once they are committed. An `Err` from `f` undoes them. The transaction may
    /// be shared with other operations queued at the same time (each under its own savepoint).
    pub async fn tx<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx
            .send(Job::Tx(Box::new(writer::Op { f, reply })))
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }
}
