//! The SQLite ledger's handle: a writer thread, a reader thread and a checkpointer over one
//! WAL-mode file; every operation is a closure run on one of them. What the operations do is
//! in the files beside this one; this file only opens, runs and reports whether writes fail.

use std::path::Path;
use std::sync::{mpsc, Arc};

use rusqlite::{Connection, OpenFlags};

use super::{files, schema, writer};
use crate::ledger::error::LedgerError;
use crate::ledger::write_state::WriteState;

use writer::Job;

/// A handle to the ledger's threads: one writer, and one reader (WAL lets it read a consistent
/// snapshot while the writer commits) for the API's queries. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    tx: mpsc::Sender<Job>,
    reader: mpsc::Sender<Job>,
    /// Dropped with the last handle, which ends the checkpointer.
    _checkpointer: mpsc::Sender<()>,
    writes: Arc<WriteState>,
}

/// Options of [`Ledger::open_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerOptions {
    /// Most bytes the database file may hold (`PRAGMA max_page_count`); past it every write
    /// that needs a new page fails as [`Unavailable::Full`](crate::ledger::Unavailable::Full), like a full disk. `None`: no cap.
    pub max_bytes: Option<u64>,
}

/// A thread serving `conn`. The writer passes `sync` (its answers wait for the WAL's sync) and
/// folds the WAL back into the database when it ends.
fn spawn_worker(
    name: &str,
    mut conn: Connection,
    sync: Option<writer::SyncFn>,
) -> Result<mpsc::Sender<Job>, LedgerError> {
    let (tx, rx) = mpsc::channel::<Job>();
    let checkpoint = sync.is_some();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            writer::serve(&mut conn, &rx, sync);
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

/// While the ledger cannot write, the writer is probed this often (every this many checkpoints).
const PROBE_EVERY_CHECKPOINTS: u32 = 10;

/// Copies committed pages from the WAL into the database file (and syncs it) beside the writer
/// instead of inside its commits: a passive checkpoint never blocks the writer or the readers.
/// While the ledger cannot write it also probes the writer every second ([`probe_room`]), so
/// the ledger reports itself writable again without waiting for the next producer.
fn spawn_checkpointer(
    conn: Connection,
    writer: mpsc::Sender<Job>,
    writes: Arc<WriteState>,
) -> Result<mpsc::Sender<()>, LedgerError> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("fanout-checkpoint".into())
        .spawn(move || {
            let mut turn = 0u32;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(CHECKPOINT_EVERY) {
                if let Err(e) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE);") {
                    tracing::warn!(error = %e, "checkpoint failed");
                }
                turn = turn.wrapping_add(1);
                if turn.is_multiple_of(PROBE_EVERY_CHECKPOINTS) && writes.failing().is_some() {
                    let writes = writes.clone();
                    let _ = writer.send(Job::Call(Box::new(move |c| {
                        if probe_room(c).is_ok() {
                            writes.recovered();
                        }
                    })));
                }
            }
        })
        .map_err(|e| LedgerError::Schema(format!("cannot start the checkpoint thread: {e}")))?;
    Ok(tx)
}

/// Whether the writer has room for a little more: allocate 64 KiB in a transaction that is
/// rolled back. It fails with [`Unavailable::Full`](crate::ledger::Unavailable::Full) against the size cap; a disk that fails to
/// take a commit is seen by the next real write.
fn probe_room(c: &mut Connection) -> Result<(), LedgerError> {
    let tried = c
        .execute_batch(
            "BEGIN;
             CREATE TABLE fanout_probe (b BLOB);
             INSERT INTO fanout_probe VALUES (zeroblob(65536));",
        )
        .map_err(LedgerError::from);
    if !c.is_autocommit() {
        c.execute_batch("ROLLBACK")?;
    }
    tried
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
        Ledger::open_with(path, LedgerOptions::default())
    }

    /// [`Ledger::open`] with options. The writer's commits are durable: an operation is
    /// answered only once the WAL holding its commit has been synced, so what it wrote survives
    /// a power loss (group commit shares one commit among the operations queued together, and
    /// the writer's sync thread one sync among the groups committed while the last ran:
    /// `writer.rs`).
    pub(in crate::ledger) fn open_with(
        path: &Path,
        opts: LedgerOptions,
    ) -> Result<Ledger, LedgerError> {
        // Created 0600 here, not by SQLite (which would follow the umask); SQLite gives the
        // `-wal` and `-shm` files it creates the database's mode.
        files::open_private(path).map_err(|e| {
            LedgerError::File(format!("cannot open the ledger {}: {e}", path.display()))
        })?;
        files::tighten_companions(path);
        let writer = open_connection(path)?;
        let writes = Arc::new(WriteState::default());
        let sync = writer::wal_sync(&writer, writes.syncs.clone())?;
        if let Some(max) = opts.max_bytes {
            let page: i64 = writer.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let want = (max / page.max(1) as u64).clamp(1, i64::MAX as u64) as i64;
            let got: i64 =
                writer.query_row(&format!("PRAGMA max_page_count = {want}"), [], |r| r.get(0))?;
            if got > want {
                tracing::warn!(
                    max_bytes = max,
                    size_bytes = got * page,
                    "the ledger is already larger than its size cap: every write that grows it fails"
                );
            }
        }
        // Checkpoints run on their own thread (below). Under a steady stream of commits a
        // passive checkpoint never quite catches up, so the writer still checkpoints what is
        // left once the WAL passes 4000 pages (`writer.rs`, after the commit's answers are on
        // their way), and when the WAL restarts its file is cut back to 16 MiB. (Cutting it to
        // 4 MiB cost a quarter of the writer's time on single-event commits: the file was
        // shrunk and grown again each time.)
        writer.execute_batch("PRAGMA journal_size_limit = 16777216;")?;
        let reader = open_connection(path)?;
        reader.execute_batch("PRAGMA query_only = ON;")?;
        let tx = spawn_worker("fanout-ledger", writer, Some(sync))?;
        Ok(Ledger {
            reader: spawn_worker("fanout-reader", reader, None)?,
            _checkpointer: spawn_checkpointer(open_connection(path)?, tx.clone(), writes.clone())?,
            tx,
            writes,
        })
    }

    /// Whether the ledger can write (atomics: never waits behind the writer).
    pub(in crate::ledger) fn write_state(&self) -> Arc<WriteState> {
        self.writes.clone()
    }

    /// Run `f` on the writer thread.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        let r = run_on(&self.tx, f).await;
        self.writes.observe(&r);
        r
    }

    /// Run a read-only `f` on the reader thread: it sees every transaction committed before it
    /// starts, and never waits for the writer.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        run_on(&self.reader, f).await
    }

    /// Run `f` in a transaction on the writer thread: all of its changes are kept or none, and
    /// it returns once they are committed. An `Err` from `f` undoes them. The transaction may
    /// be shared with other operations queued at the same time (each under its own savepoint).
    pub(crate) async fn tx<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        self.tx_guarded(f, writer::Guard::Own).await
    }

    /// [`Ledger::tx`] for an operation whose only failures are the ledger's own (a full disk,
    /// an I/O error): it runs without a savepoint of its own, and should it fail, every
    /// operation sharing its transaction fails with its error and nothing of them is kept.
    /// Ingest: a savepoint per operation cost a tenth of the writer's time on single events.
    pub(super) async fn tx_shared<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        self.tx_guarded(f, writer::Guard::Group).await
    }

    async fn tx_guarded<T, F>(&self, f: F, guard: writer::Guard) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx
            .send(Job::Tx(Box::new(writer::Op { f, reply, guard })))
            .map_err(|_| LedgerError::Closed)?;
        let r = answer.await.map_err(|_| LedgerError::Closed)?;
        self.writes.observe(&r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::error::Unavailable;
    use crate::ledger::sqlite::ingest;
    use crate::ledger::NewEvent;
    use std::time::{Duration, Instant};

    /// Every answered operation waited for a sync of the WAL: operations run one after the
    /// other (each awaited before the next) need a sync each, and the ledger stays in WAL mode.
    #[tokio::test]
    async fn the_writer_answers_after_the_wal_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("l.db")).unwrap();
        let mode: String = ledger
            .call(|c| Ok(c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        let before = ledger.write_state().syncs();
        for i in 0..5 {
            let events = vec![NewEvent {
                id: format!("e{i}"),
                event_type: "t".into(),
                body: "{}".into(),
                traceparent: None,
            }];
            ledger.tx(move |c| ingest(c, &events, 0)).await.unwrap();
            assert!(
                ledger.write_state().syncs() > before + i,
                "operation {i} was answered before a sync covered it"
            );
        }
    }

    /// Past its size cap a write fails as `Unavailable::Full` (by SQLite's result code), the
    /// write state says so, and once there is room again (here: the cap raised) the probe
    /// notices by itself and writes succeed, with everything answered before still there.
    #[tokio::test]
    async fn a_full_ledger_is_unavailable_then_writable_again_by_itself() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open_with(
            &dir.path().join("l.db"),
            LedgerOptions {
                max_bytes: Some(256 * 1024),
            },
        )
        .unwrap();
        let mut kept = 0usize;
        let failure = loop {
            let events: Vec<NewEvent> = (0..10)
                .map(|i| NewEvent {
                    id: format!("e{kept}_{i}"),
                    event_type: "t".into(),
                    body: format!("{{\"pad\":\"{}\"}}", "x".repeat(2000)),
                    traceparent: None,
                })
                .collect();
            match ledger.tx(move |c| ingest(c, &events, 0)).await {
                Ok(_) => kept += 10,
                Err(e) => break e,
            }
            assert!(kept < 10_000, "the cap never filled");
        };
        assert!(
            matches!(failure, LedgerError::Unavailable(Unavailable::Full)),
            "{failure:?}"
        );
        assert!(kept > 0);
        let state = ledger.write_state();
        assert_eq!(state.failing().map(|(why, _)| why), Some(Unavailable::Full));
        // Still full: the probe keeps reporting it.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(state.failing().is_some());
        ledger
            .call(|c| Ok(c.execute_batch("PRAGMA max_page_count = 100000")?))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while state.failing().is_some() {
            assert!(Instant::now() < deadline, "the probe never saw room");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let events = vec![NewEvent {
            id: "after".into(),
            event_type: "t".into(),
            body: "{}".into(),
            traceparent: None,
        }];
        ledger.tx(move |c| ingest(c, &events, 0)).await.unwrap();
        let stored: i64 = ledger
            .read(|c| Ok(c.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(stored as usize, kept + 1);
    }
}
