//! A producer's outbox in a SQLite file: its DDL, and the reads and writes of one round, each
//! a short transaction so the producer's own writers are not held up: the oldest rows read
//! (no lock kept), then — only after the ledger has committed their events — one
//! `BEGIN IMMEDIATE` that moves the rejections to `<table>_rejected` and deletes the rows.
//! A crash in between leaves the rows, read again by the next round (ingest is idempotent by
//! event id). SQLite has no `NOTIFY`: the file is polled (`--outbox-poll`).
//!
//! One daemon reads an outbox at a time, so that its rows go into the ledger in its order:
//! the reader holds `flock(2)` on `<file>.<table>.reader` beside the producer's file (never on
//! the database file itself, whose POSIX locks SQLite owns); another daemon on the same host
//! stays on standby and takes over at its next round once the operating system dropped the
//! lock, which it does when the reader's process ends, however it ends.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags};

use super::plan::Row;
use super::OutboxError;

/// How long a statement waits for the producer's write lock before failing the round.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The DDL for `table`: idempotent (`init` may run again). `AUTOINCREMENT`: ids never go back,
/// also once the outbox was emptied.
pub fn ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);
{rejected}CREATE INDEX IF NOT EXISTS \"{table}_rejected_id\" ON \"{table}_rejected\" (id);
",
        rejected = rejected_ddl(table, "")
    )
}

/// `<table>_rejected` (named with `suffix`): every rejection is kept, also of a row whose id
/// an earlier rejected row had (`id` is not unique).
fn rejected_ddl(table: &str, suffix: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}_rejected{suffix}\" (
    id INTEGER NOT NULL,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL,
    rejected_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    error TEXT NOT NULL
);
"
    )
}

/// An older `<table>_rejected` whose `id` was its primary key (a second rejection of one id
/// was dropped) rebuilt without it, in `init`'s transaction (no table yet: nothing to do).
fn upgrade_rejected(c: &Connection, table: &str) -> rusqlite::Result<()> {
    let keyed: bool = c.query_row(
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('{table}_rejected') WHERE pk > 0)"
        ),
        [],
        |r| r.get(0),
    )?;
    if keyed {
        c.execute_batch(&format!(
            "{new}INSERT INTO \"{table}_rejected_new\" SELECT id, payload, created_at, rejected_at, error
                 FROM \"{table}_rejected\" ORDER BY id;
             DROP TABLE \"{table}_rejected\";
             ALTER TABLE \"{table}_rejected_new\" RENAME TO \"{table}_rejected\";",
            new = rejected_ddl(table, "_new")
        ))?;
    }
    Ok(())
}

/// The outbox in one SQLite file, read by this daemon. Cheap to clone.
#[derive(Clone)]
pub struct SqliteOutbox {
    path: Arc<PathBuf>,
    table: Arc<str>,
    conn: Arc<Mutex<Option<Connection>>>,
    /// The reader's lock file, held (locked) while this daemon is the outbox's reader.
    reader: Arc<Mutex<Option<File>>>,
}

impl std::fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutbox")
            .field("path", &self.path)
            .field("table", &self.table)
            .finish()
    }
}

impl SqliteOutbox {
    pub fn new(path: PathBuf, table: &str) -> SqliteOutbox {
        SqliteOutbox {
            path: Arc::new(path),
            table: Arc::from(table),
            conn: Arc::default(),
            reader: Arc::default(),
        }
    }

    /// Run `work` on the connection (opened when there is none) on a blocking thread; a failure
    /// closes it, so the next round opens the file again.
    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection, &str) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, OutboxError> {
        let me = self.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let mut slot = me
                .conn
                .lock()
                .map_err(|_| OutboxError::Source("a previous round panicked".into()))?;
            if slot.is_none() {
                *slot = Some(open(&me.path, false).map_err(source)?);
            }
            let Some(conn) = slot.as_mut() else {
                return Err(OutboxError::Source("no connection".into()));
            };
            let result = work(conn, &me.table);
            if result.is_err() {
                *slot = None;
            }
            result.map_err(source)
        })
        .await;
        joined.map_err(|e| OutboxError::Source(format!("the outbox's thread failed: {e}")))?
    }

    /// Whether this daemon is the outbox's reader, taking the reader's lock when it is free.
    async fn is_reader(&self) -> Result<bool, OutboxError> {
        let me = self.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let mut slot = me
                .reader
                .lock()
                .map_err(|_| OutboxError::Source("a previous round panicked".into()))?;
            if slot.is_some() {
                return Ok(true);
            }
            let mut name = me.path.as_os_str().to_owned();
            name.push(format!(".{}.reader", me.table));
            let path = PathBuf::from(name);
            let cannot = |e: std::io::Error| {
                OutboxError::Source(format!("the reader's lock {}: {e}", path.display()))
            };
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(cannot)?;
            match file.try_lock() {
                Ok(()) => {
                    *slot = Some(file);
                    Ok(true)
                }
                Err(TryLockError::WouldBlock) => Ok(false),
                Err(TryLockError::Error(e)) => Err(cannot(e)),
            }
        })
        .await;
        joined.map_err(|e| OutboxError::Source(format!("the outbox's thread failed: {e}")))?
    }

    /// The oldest `batch` rows (a read: no lock is kept); `None` when another daemon is the
    /// outbox's reader.
    pub async fn take(&self, batch: usize) -> Result<Option<Vec<Row>>, OutboxError> {
        if !self.is_reader().await? {
            return Ok(None);
        }
        self.with(move |conn, t| {
            let mut st = conn.prepare_cached(&format!(
                "SELECT id, payload, (julianday('now') - julianday(created_at)) * 86400.0 \
                 FROM \"{t}\" ORDER BY id LIMIT ?1"
            ))?;
            let rows = st.query_map([batch as i64], |r| {
                let payload = match r.get::<_, Value>(1)? {
                    Value::Text(s) => Some(s),
                    Value::Blob(b) => String::from_utf8(b).ok(),
                    _ => None,
                };
                Ok(Row {
                    id: r.get(0)?,
                    payload,
                    age_secs: r.get::<_, Option<f64>>(2)?.unwrap_or(0.0),
                })
            })?;
            rows.collect()
        })
        .await
        .map(Some)
    }

    /// One short write transaction: `rejected` moved to `<table>_rejected`, `ids` deleted.
    pub async fn finish(
        &self,
        rejected: Vec<(i64, String)>,
        ids: Vec<i64>,
    ) -> Result<(), OutboxError> {
        self.with(move |conn, t| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            {
                let mut reject = tx.prepare_cached(&format!(
                    "INSERT INTO \"{t}_rejected\" (id, payload, created_at, error) \
                     SELECT id, CAST(payload AS TEXT), created_at, ?2 FROM \"{t}\" WHERE id = ?1"
                ))?;
                for (id, error) in &rejected {
                    reject.execute(params![id, error])?;
                }
                let mut delete =
                    tx.prepare_cached(&format!("DELETE FROM \"{t}\" WHERE id = ?1"))?;
                for id in &ids {
                    delete.execute([id])?;
                }
            }
            tx.commit()
        })
        .await
    }

    /// Create the file (if missing) and the tables (idempotent).
    pub fn init(&self) -> Result<(), OutboxError> {
        let mut conn = open(&self.path, true).map_err(source)?;
        let tx = conn.transaction().map_err(source)?;
        let table = &self.table;
        upgrade_rejected(&tx, table).map_err(source)?;
        tx.execute_batch(&ddl(table)).map_err(source)?;
        tx.commit().map_err(source)
    }
}

/// Open the producer's file (created only by `init`), waiting up to `BUSY_TIMEOUT` for its
/// writers.
fn open(path: &std::path::Path, create: bool) -> rusqlite::Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// A driver error, as the outbox reports it (the file is named where the outbox is).
fn source(e: rusqlite::Error) -> OutboxError {
    OutboxError::Source(e.to_string())
}
