//! The loop of a ledger thread, with group commit: transactional operations found queued
//! together share one SQLite transaction, each under its own savepoint (its failure undoes only
//! its own changes) unless it is guarded by the group ([`Guard::Group`], ingest: its failure
//! undoes and fails the whole group), and none is answered before that transaction has
//! committed and, on the writer, before the WAL holding it has been synced to the disk.
//!
//! Why: a commit appends every page the transaction changed to the WAL. For a small transaction
//! (one event from a producer that sends them one at a time) the commit was most of the
//! writer's work, and consecutive small transactions change mostly the same pages: committed
//! together, those pages are written once.
//!
//! Durability is pipelined: the writer commits with `synchronous = NORMAL` (SQLite appends the
//! frames to the WAL without syncing it) and hands the group's answers to its two syncer
//! threads; one of them syncs the WAL file (`fdatasync`) and only then answers them. Meanwhile
//! the writer already runs the next group, whose commit the other syncer can sync while the
//! first sync still runs (a sync covers every group committed before it started, whichever
//! returns first). While both syncers are busy the writer keeps its transaction open: what
//! arrives meanwhile joins that group (it could not be synced sooner anyway), so a page the
//! group's operations all change (the same index leaves, for events that come one at a time)
//! is written to the WAL once per sync instead of once per operation. A checkpoint syncs the WAL before copying frames
//! out of it, so a frame is never lost to a WAL that restarts. Operations that run outside a
//! transaction (`Job::Call`) commit under `synchronous = FULL` instead (SQLite syncs inside
//! their commit).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;

use crate::ledger::error::{LedgerError, Unavailable};

/// Makes everything the writer has committed so far durable (in the daemon: [`wal_sync`]).
pub(super) type SyncFn = Box<dyn Fn() -> Result<(), LedgerError> + Send + Sync>;

/// The answers of one committed group, waiting for the sync that makes it durable.
type Committed = Vec<Box<dyn Answer>>;

/// Syncs the WAL file of the database `conn` has open: `fdatasync` on a descriptor of our own,
/// opened at the first sync (the WAL exists once a write transaction has committed). `synced`
/// counts the syncs that succeeded.
pub(super) fn wal_sync(
    conn: &Connection,
    synced: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<SyncFn, LedgerError> {
    let db = conn
        .path()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| LedgerError::Schema("the ledger is not a file: nothing to sync".into()))?;
    let wal = std::path::PathBuf::from(format!("{db}-wal"));
    let file: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    Ok(Box::new(move || {
        let f = match file.get() {
            Some(f) => f,
            None => {
                let opened = std::fs::File::open(&wal).map_err(io_unavailable)?;
                file.get_or_init(|| opened)
            }
        };
        f.sync_data().map_err(io_unavailable)?;
        synced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }))
}

/// A failed sync, typed like a failed SQLite write: by the error's kind, never its text.
fn io_unavailable(e: std::io::Error) -> LedgerError {
    LedgerError::Unavailable(match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => Unavailable::Full,
        _ => Unavailable::Io,
    })
}

/// Most operations committed together. A group is whatever was already queued, and, while the
/// syncer is still syncing an earlier commit, whatever arrives until it is done.
const MAX_GROUP: usize = 64;

/// Syncs that may run at once.
const SYNCERS: usize = 2;

/// The writer checkpoints the WAL itself once it holds this many pages (16 MiB) — between
/// groups, never inside a commit, so no group's answers wait for a checkpoint (SQLite's own
/// autocheckpoint runs inside the commit: its page copies and two `fsync`s delayed the group
/// just committed). The checkpoint thread's passive checkpoints do most of the work; only the
/// writer can finish one under a steady stream (no commit lands while it runs), so the WAL
/// restarts.
const CHECKPOINT_PAGES: usize = 4000;

/// How often a writer with a group open looks whether the syncer is done (it waits for the
/// next operation at most this long).
const SYNCER_POLL: Duration = Duration::from_micros(200);

/// The writer's side of its syncer: where committed groups go, and how many of them are not
/// yet synced.
struct Syncer<'a> {
    committed: mpsc::Sender<Committed>,
    unsynced: &'a AtomicUsize,
}

impl Syncer<'_> {
    fn busy(&self) -> bool {
        self.unsynced.load(Ordering::Acquire) >= SYNCERS
    }
}

pub(super) enum Job {
    /// Runs alone, outside any transaction.
    Call(Box<dyn FnOnce(&mut Connection) + Send>),
    /// Runs inside a transaction, possibly shared with other queued `Tx` jobs.
    Tx(Box<dyn TxJob>),
}

/// One transactional operation and its caller's answer.
pub(super) trait TxJob: Send {
    /// Do the work on `conn`, inside the transaction. Returns its error, if any (its changes
    /// are then undone), and the answer to give once the transaction has ended.
    fn run(self: Box<Self>, conn: &Connection) -> (Result<(), LedgerError>, Box<dyn Answer>);
    /// Whether it runs under a savepoint of its own, so that its failure undoes only its own
    /// changes. Without one ([`Guard::Group`]) a failure undoes the whole group.
    fn guard(&self) -> Guard;
    /// The transaction could not be started: answer with the error, without running.
    fn fail(self: Box<Self>, error: &LedgerError);
}

pub(super) trait Answer: Send {
    /// `Ok` once the transaction committed; the commit's error otherwise.
    fn send(self: Box<Self>, committed: Result<(), &LedgerError>);
}

/// What a failed operation undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard {
    /// Its own changes: it runs under a savepoint.
    Own,
    /// The whole group: it runs without a savepoint, and should it fail (or panic) the group's
    /// transaction is rolled back and every operation in it fails with its error. For the hot
    /// path (ingest), whose only failures are the ledger's own (a full disk, an I/O error),
    /// which break the transaction anyway: a savepoint copies every page the operation changes
    /// before changing it, a tenth of the writer's time on single events.
    Group,
}

/// A closure and where its result goes.
pub(super) struct Op<T, F> {
    pub f: F,
    pub reply: tokio::sync::oneshot::Sender<Result<T, LedgerError>>,
    pub guard: Guard,
}

struct Pending<T> {
    out: Result<T, LedgerError>,
    reply: tokio::sync::oneshot::Sender<Result<T, LedgerError>>,
}

impl<T, F> TxJob for Op<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> (Result<(), LedgerError>, Box<dyn Answer>) {
        let Op { f, reply, .. } = *self;
        let out = f(conn);
        let status = out.as_ref().map(|_| ()).map_err(again);
        (status, Box::new(Pending { out, reply }))
    }

    fn guard(&self) -> Guard {
        self.guard
    }

    fn fail(self: Box<Self>, error: &LedgerError) {
        let _ = self.reply.send(Err(again(error)));
    }
}

impl<T: Send> Answer for Pending<T> {
    fn send(self: Box<Self>, committed: Result<(), &LedgerError>) {
        let out = match (self.out, committed) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => Err(again(e)),
            (Err(e), _) => Err(e),
        };
        let _ = self.reply.send(out);
    }
}

/// The same error for another caller (a failed commit fails every operation in it).
fn again(e: &LedgerError) -> LedgerError {
    e.again()
}

/// Serve jobs until every sender is gone. With `sync` (the writer), answers wait for the sync
/// that covers their commit, done on a thread of its own while the next group runs; without it
/// (a reader), they go as soon as the transaction ends.
pub(super) fn serve(conn: &mut Connection, rx: &mpsc::Receiver<Job>, sync: Option<SyncFn>) {
    let Some(sync) = sync else {
        return serve_jobs(conn, rx, None, None);
    };
    // Replaces SQLite's autocheckpoint: the pages in the WAL after each commit.
    let wal_pages = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = wal_pages.clone();
    if let Err(e) = conn.wal_hook(Some(
        move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
            seen.store(pages.max(0) as usize, Ordering::Relaxed);
            Ok(())
        },
    )) {
        tracing::error!(error = %e, "cannot watch the ledger's WAL; SQLite checkpoints it inside commits");
    }
    let wal_pages = &*wal_pages;
    let unsynced = AtomicUsize::new(0);
    let (committed, to_sync) = mpsc::channel::<Committed>();
    let to_sync = std::sync::Mutex::new(to_sync);
    std::thread::scope(|scope| {
        let unsynced = &unsynced;
        let to_sync = &to_sync;
        let sync = &sync;
        for _ in 0..SYNCERS {
            let syncer = std::thread::Builder::new()
                .name("fanout-sync".into())
                .spawn_scoped(scope, move || sync_loop(to_sync, sync, unsynced));
            if let Err(e) = syncer {
                tracing::error!(error = %e, "cannot start the ledger's sync thread; it commits with a sync each");
                return serve_jobs(conn, rx, None, Some(wal_pages));
            }
        }
        let syncer = Syncer {
            committed,
            unsynced,
        };
        serve_jobs(conn, rx, Some(&syncer), Some(wal_pages));
        // `syncer` drops here: the syncer thread answers what is left, then ends (joined by
        // scope).
    });
}

/// Run jobs as they come: groups (answered through `syncer` when there is one), and, on the
/// writer (`wal_pages`: the WAL's size after its last commit), a checkpoint between them once
/// the WAL holds `CHECKPOINT_PAGES` pages, with or without a syncer.
fn serve_jobs(
    conn: &mut Connection,
    rx: &mpsc::Receiver<Job>,
    syncer: Option<&Syncer<'_>>,
    wal_pages: Option<&AtomicUsize>,
) {
    if syncer.is_none() {
        // No syncer: every commit syncs by itself.
        if let Err(e) = conn.execute_batch("PRAGMA synchronous = FULL;") {
            tracing::error!(error = %e, "cannot make the ledger's commits durable");
        }
    }
    let mut carried: Option<Job> = None;
    loop {
        let job = match carried.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        match job {
            Job::Call(f) => {
                // Outside a transaction: whatever it commits is synced inside its own commit.
                let pipelined = syncer.is_some();
                if pipelined {
                    let _ = conn.execute_batch("PRAGMA synchronous = FULL;");
                }
                // A panicking job fails its own caller (its reply channel drops), not the ledger.
                if catch_unwind(AssertUnwindSafe(|| f(conn))).is_err() {
                    tracing::error!("a ledger operation panicked");
                }
                if pipelined && conn.is_autocommit() {
                    let _ = conn.execute_batch("PRAGMA synchronous = NORMAL;");
                }
            }
            Job::Tx(first) => carried = run_group(conn, first, rx, syncer),
        }
        if let Some(wal_pages) = wal_pages {
            if wal_pages.load(Ordering::Relaxed) >= CHECKPOINT_PAGES {
                wal_pages.store(0, Ordering::Relaxed);
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "checkpoint failed");
                }
            }
        }
    }
}

/// Sync, then answer, everything committed since the last sync began; `unsynced` counts the
/// groups handed over and not yet answered.
fn sync_loop(
    to_sync: &std::sync::Mutex<mpsc::Receiver<Committed>>,
    sync: &SyncFn,
    unsynced: &AtomicUsize,
) {
    loop {
        // Under the receiver's lock: the first group, and every group queued behind it.
        let (answers, groups) = {
            let Ok(rx) = to_sync.lock() else { return };
            let Ok(mut answers) = rx.recv() else { return };
            let mut groups = 1;
            while let Ok(more) = rx.try_recv() {
                answers.extend(more);
                groups += 1;
            }
            (answers, groups)
        };
        let synced = sync();
        if let Err(e) = &synced {
            tracing::error!(error = %e, "syncing the ledger's WAL failed; every operation it covered fails");
        }
        for answer in answers {
            answer.send(synced.as_ref().map(|_| ()));
        }
        unsynced.fetch_sub(groups, Ordering::AcqRel);
    }
}

/// One transaction for a group, a savepoint per job, answers after the commit (and, with a
/// syncer, after it has synced it). The group is `first` and whatever is queued behind it;
/// while the syncer is still busy with an earlier commit, also whatever arrives until it is
/// done. Returns a `Job::Call` that arrived meanwhile (it runs after this commit).
fn run_group(
    conn: &Connection,
    first: Box<dyn TxJob>,
    rx: &mpsc::Receiver<Job>,
    syncer: Option<&Syncer<'_>>,
) -> Option<Job> {
    if let Err(e) = conn.execute_batch("BEGIN") {
        first.fail(&LedgerError::from(e));
        return None;
    }
    let mut answers: Vec<Box<dyn Answer>> = Vec::new();
    let mut broken: Option<LedgerError> = None;
    let mut carried: Option<Job> = None;
    let mut ran = 0;
    let mut next = Some(first);
    loop {
        if let Some(job) = next.take() {
            ran += 1;
            if let Err(e) = run_one(conn, job, &mut answers) {
                broken = Some(e);
                break;
            }
        }
        if ran >= MAX_GROUP {
            break;
        }
        match rx.try_recv() {
            Ok(Job::Tx(job)) => {
                next = Some(job);
                continue;
            }
            Ok(other) => {
                carried = Some(other);
                break;
            }
            Err(mpsc::TryRecvError::Disconnected) => break,
            Err(mpsc::TryRecvError::Empty) => {}
        }
        // Nothing queued: commit now, unless the syncer is still syncing an earlier commit.
        if !syncer.is_some_and(Syncer::busy) {
            break;
        }
        match rx.recv_timeout(SYNCER_POLL) {
            Ok(Job::Tx(job)) => next = Some(job),
            Ok(other) => {
                carried = Some(other);
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let ended = match broken {
        Some(e) => Err(e),
        None => conn.execute_batch("COMMIT").map_err(LedgerError::from),
    };
    match ended {
        Ok(()) => match syncer {
            Some(syncer) => {
                syncer.unsynced.fetch_add(1, Ordering::AcqRel);
                if let Err(mpsc::SendError(answers)) = syncer.committed.send(answers) {
                    // The syncer is gone (it panicked): nothing says these are durable.
                    for answer in answers {
                        answer.send(Err(&LedgerError::Closed));
                    }
                }
            }
            None => {
                for answer in answers {
                    answer.send(Ok(()));
                }
            }
        },
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            tracing::error!(error = %e, "a ledger transaction failed; every operation in it fails");
            for answer in answers {
                answer.send(Err(&e));
            }
        }
    }
    carried
}

/// One job of a group, under its own savepoint unless its guard is the group: its answer
/// joins `answers` (a panicking job has none: its reply channel dropped with it). `Err` when
/// the transaction has to end without committing: SQLite rolled it back (an I/O error, a full
/// disk), or a job guarded by the group failed.
fn run_one(
    conn: &Connection,
    job: Box<dyn TxJob>,
    answers: &mut Vec<Box<dyn Answer>>,
) -> Result<(), LedgerError> {
    let guard = job.guard();
    if guard == Guard::Own {
        if let Err(e) = savepoint(conn, "SAVEPOINT job") {
            job.fail(&e);
            return Ok(());
        }
    }
    let status = match catch_unwind(AssertUnwindSafe(|| job.run(conn))) {
        Ok((status, answer)) => {
            answers.push(answer);
            status
        }
        Err(_) => {
            // Its caller sees the ledger as closed.
            tracing::error!("a ledger operation panicked; its changes were rolled back");
            Err(LedgerError::Closed)
        }
    };
    match (guard, status) {
        (Guard::Group, status) => status,
        (Guard::Own, Ok(())) => savepoint(conn, "RELEASE job"),
        (Guard::Own, Err(_)) => {
            savepoint(conn, "ROLLBACK TO job")?;
            savepoint(conn, "RELEASE job")
        }
    }
}

/// Open, release or roll back to a job's savepoint (statements prepared once per connection).
fn savepoint(conn: &Connection, sql: &str) -> Result<(), LedgerError> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::ledger::{open_connection, Ledger};
    use super::{serve, Guard, Job, Op, SyncFn};
    use crate::ledger::error::{LedgerError, Unavailable};
    use std::sync::{mpsc, Mutex};
    use std::time::Duration;

    type Reply = tokio::sync::oneshot::Receiver<Result<i64, LedgerError>>;

    /// An insert of `k` into `t`, queued on the writer; its answer comes on the receiver.
    fn insert(jobs: &mpsc::Sender<Job>, k: i64) -> Reply {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let f = move |c: &rusqlite::Connection| {
            c.execute("INSERT INTO t (k) VALUES (?1)", [k])?;
            Ok(k)
        };
        jobs.send(Job::Tx(Box::new(Op {
            f,
            reply,
            guard: Guard::Own,
        })))
        .unwrap();
        answer
    }

    /// A sync the test holds: each call reports that it started and waits for the test's go
    /// (`Ok` or the error to fail with).
    fn held_sync() -> (
        SyncFn,
        mpsc::Receiver<()>,
        mpsc::Sender<Result<(), LedgerError>>,
    ) {
        let (started, syncing) = mpsc::channel();
        let (go, gate) = mpsc::channel::<Result<(), LedgerError>>();
        let gate = Mutex::new(gate);
        let sync: SyncFn = Box::new(move || {
            started.send(()).unwrap();
            gate.lock().unwrap().recv().unwrap()
        });
        (sync, syncing, go)
    }

    /// Wait (bounded: 10 s) for the next sync to start.
    fn started(syncing: &mpsc::Receiver<()>, what: &str) {
        syncing
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{what} never started"));
    }

    fn writer(db: &std::path::Path, sync: SyncFn) -> mpsc::Sender<Job> {
        let mut conn = open_connection(db).unwrap();
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .unwrap();
        let (jobs, rx) = mpsc::channel();
        std::thread::spawn(move || serve(&mut conn, &rx, Some(sync)));
        jobs
    }

    /// Pipelined durability, as a table of steps: a committed operation is not answered until
    /// a sync after its commit has returned; up to two syncs run at once; what arrives while
    /// both run waits in the writer's open transaction and is committed, as one group, as soon
    /// as one of them is done; one sync then answers it.
    #[test]
    fn answers_wait_for_a_sync_and_what_arrives_while_both_run_is_one_commit_and_one_sync() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let (sync, syncing, go) = held_sync();
        let jobs = writer(&db, sync);
        let rows = || {
            open_connection(&db)
                .unwrap()
                .query_row("SELECT COUNT(*) FROM t", [], |r| r.get::<_, i64>(0))
                .unwrap()
        };

        let mut a = insert(&jobs, 1);
        started(&syncing, "a's sync");
        let mut b = insert(&jobs, 2);
        started(&syncing, "b's sync, beside a's");
        assert_eq!(rows(), 2);
        let mut c = insert(&jobs, 3);
        let mut d = insert(&jobs, 4);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(rows(), 2, "c and d wait, uncommitted, while both syncs run");
        for (name, r) in [("a", &mut a), ("b", &mut b), ("c", &mut c), ("d", &mut d)] {
            assert!(
                r.try_recv().is_err(),
                "{name} answered before its sync returned"
            );
        }
        go.send(Ok(())).unwrap(); // a's sync returns
        assert_eq!(a.blocking_recv().unwrap().unwrap(), 1);
        started(&syncing, "the sync of c and d, committed together");
        assert_eq!(rows(), 4);
        std::thread::sleep(Duration::from_millis(50));
        assert!(b.try_recv().is_err() && c.try_recv().is_err() && d.try_recv().is_err());
        go.send(Ok(())).unwrap();
        go.send(Ok(())).unwrap();
        assert_eq!(b.blocking_recv().unwrap().unwrap(), 2);
        assert_eq!(c.blocking_recv().unwrap().unwrap(), 3);
        assert_eq!(d.blocking_recv().unwrap().unwrap(), 4);
        assert!(
            syncing.try_recv().is_err(),
            "c and d needed one sync, not one each"
        );
    }

    /// With no checkpoint thread, the writer alone keeps the WAL bounded under a steady
    /// stream of commits: it checkpoints between groups once the WAL holds
    /// `CHECKPOINT_PAGES` pages (SQLite's own autocheckpoint is replaced by its WAL hook).
    #[test]
    fn the_writer_checkpoints_between_groups_and_the_wal_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let mut conn = open_connection(&db).unwrap();
        conn.execute_batch("CREATE TABLE b (v BLOB)").unwrap();
        let (jobs, rx) = mpsc::channel();
        let synced: SyncFn = Box::new(|| Ok(()));
        std::thread::spawn(move || serve(&mut conn, &rx, Some(synced)));
        let page = 4096u64;
        let blob = 64 * 1024;
        let written = 2 * super::CHECKPOINT_PAGES as u64 * page;
        for _ in 0..written / blob as u64 {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let f = move |c: &rusqlite::Connection| {
                c.execute("INSERT INTO b (v) VALUES (zeroblob(?1))", [blob])?;
                Ok(0i64)
            };
            jobs.send(Job::Tx(Box::new(Op {
                f,
                reply,
                guard: Guard::Group,
            })))
            .unwrap();
            answer.blocking_recv().unwrap().unwrap();
        }
        let wal = std::fs::metadata(format!("{}-wal", db.display()))
            .unwrap()
            .len();
        let bound = (super::CHECKPOINT_PAGES as u64 + 64) * (page + 24);
        assert!(
            wal <= bound,
            "{written} bytes written, the WAL is {wal} bytes (bound {bound})"
        );
    }

    /// A sync that fails fails every operation it covered, typed (a full disk is `Full`), and
    /// the writer carries on with the next.
    #[test]
    fn a_failed_sync_fails_the_operations_it_covered() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let (sync, syncing, go) = held_sync();
        let jobs = writer(&db, sync);
        let a = insert(&jobs, 1);
        syncing.recv().unwrap();
        go.send(Err(LedgerError::Unavailable(Unavailable::Full)))
            .unwrap();
        assert!(matches!(
            a.blocking_recv().unwrap(),
            Err(LedgerError::Unavailable(Unavailable::Full))
        ));
        let b = insert(&jobs, 2);
        syncing.recv().unwrap();
        go.send(Ok(())).unwrap();
        assert_eq!(b.blocking_recv().unwrap().unwrap(), 2);
    }

    /// Operations 0..n queued together behind a slow one (so that they all run as one group
    /// unless a failure ends it), each inserting its `k` under the guard `guard(k)`; 3 fails
    /// and 5 panics. Returns each one's answer and the rows kept, once the ledger has been
    /// seen to write again.
    async fn grouped(n: i64, guard: fn(i64) -> Guard) -> (Vec<Result<i64, LedgerError>>, Vec<i64>) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("l.db")).unwrap();
        ledger
            .call(|c| Ok(c.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")?))
            .await
            .unwrap();
        // Hold the writer (queued first: a future sends nothing until polled) so that the
        // next operations are all queued when it looks.
        let l = ledger.clone();
        let hold = tokio::spawn(async move {
            l.call(|_| {
                std::thread::sleep(Duration::from_millis(300));
                Ok(())
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut ops = Vec::new();
        for k in 0..n {
            let l = ledger.clone();
            ops.push(tokio::spawn(async move {
                let f = move |c: &rusqlite::Connection| {
                    c.execute("INSERT INTO t (k) VALUES (?1)", [k])?;
                    match k {
                        3 => Err(LedgerError::Invalid("no".into())),
                        5 => panic!("operation {k} panics"),
                        _ => Ok(k),
                    }
                };
                match guard(k) {
                    Guard::Own => l.tx(f).await,
                    Guard::Group => l.tx_shared(f).await,
                }
            }));
        }
        hold.await.unwrap().unwrap();
        let mut got = Vec::new();
        for op in ops {
            got.push(op.await.unwrap());
        }
        let kept: Vec<i64> = ledger
            .read(|c| {
                let mut st = c.prepare("SELECT k FROM t ORDER BY k")?;
                let rows = st.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        // The writer still works after all that.
        assert_eq!(ledger.tx(|_| Ok(1)).await.unwrap(), 1);
        assert_eq!(ledger.tx_shared(|_| Ok(2)).await.unwrap(), 2);
        (got, kept)
    }

    /// Operations guarded by their own savepoint: a failing one and a panicking one lose only
    /// their own changes and fail only their own callers.
    #[tokio::test]
    async fn a_group_keeps_each_operations_own_outcome() {
        let (got, kept) = grouped(10, |_| Guard::Own).await;
        for (k, r) in got.iter().enumerate() {
            match k {
                3 => assert!(matches!(r, Err(LedgerError::Invalid(_))), "{k}: {r:?}"),
                5 => assert!(matches!(r, Err(LedgerError::Closed)), "{k}: {r:?}"),
                _ => assert_eq!(r.as_ref().ok(), Some(&(k as i64)), "{k}: {r:?}"),
            }
        }
        assert_eq!(kept, vec![0, 1, 2, 4, 6, 7, 8, 9]);
    }

    /// An operation guarded by its group (ingest) that fails or panics takes its group down:
    /// the operations that ran before it in the same transaction (guarded by their own
    /// savepoint or not) fail with its error and keep nothing; those queued after it run in
    /// the next group as usual.
    #[tokio::test]
    async fn a_failure_guarded_by_the_group_fails_the_whole_group() {
        let guard = |k| if k == 1 { Guard::Own } else { Guard::Group };
        let (got, kept) = grouped(9, guard).await;
        for (k, r) in got.iter().enumerate() {
            match k {
                0..=3 => assert!(matches!(r, Err(LedgerError::Invalid(_))), "{k}: {r:?}"),
                4 | 5 => assert!(matches!(r, Err(LedgerError::Closed)), "{k}: {r:?}"),
                _ => assert_eq!(r.as_ref().ok(), Some(&(k as i64)), "{k}: {r:?}"),
            }
        }
        assert_eq!(kept, vec![6, 7, 8]);
    }
}
