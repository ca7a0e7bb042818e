//! The loop of a ledger thread, with group commit: transactional operations found queued
//! together share one SQLite transaction, each under its own savepoint (its failure undoes only
//! its own changes), and none is answered before that transaction has committed.
//!
//! Why: a commit appends every page the transaction changed to the WAL. For a small transaction
//! (one event from a producer that sends them one at a time) the commit was most of the
//! writer's work, and consecutive small transactions change mostly the same pages: committed
//! together, those pages are written once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

use rusqlite::Connection;

use super::LedgerError;

/// Most operations committed together (the writer never waits for more: a group is whatever
/// was already queued).
const MAX_GROUP: usize = 64;

pub(super) enum Job {
    /// Runs alone, outside any transaction.
    Call(Box<dyn FnOnce(&mut Connection) + Send>),
    /// Runs inside a transaction, possibly shared with other queued `Tx` jobs.
    Tx(Box<dyn TxJob>),
}

/// One transactional operation and its caller's answer.
pub(super) trait TxJob: Send {
    /// Do the work on `conn`, inside the transaction. Returns whether to keep its changes and
    /// the answer to give once the transaction has ended.
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Answer>);
    /// The transaction could not be started: answer with the error, without running.
    fn fail(self: Box<Self>, error: &LedgerError);
}

pub(super) trait Answer: Send {
    /// `Ok` once the transaction committed; the commit's error otherwise.
    fn send(self: Box<Self>, committed: Result<(), &LedgerError>);
}

/// A closure and where its result goes.
pub(super) struct Op<T, F> {
    pub f: F,
    pub reply: tokio::sync::oneshot::Sender<Result<T, LedgerError>>,
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
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Answer>) {
        let Op { f, reply } = *self;
        let out = f(conn);
        (out.is_ok(), Box::new(Pending { out, reply }))
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
    match e {
        LedgerError::Sqlite(rusqlite::Error::SqliteFailure(code, msg)) => {
            LedgerError::Sqlite(rusqlite::Error::SqliteFailure(*code, msg.clone()))
        }
        LedgerError::Sqlite(other) => LedgerError::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        )),
        LedgerError::Unavailable(u) => LedgerError::Unavailable(*u),
        LedgerError::Schema(m) => LedgerError::Schema(m.clone()),
        LedgerError::NotFound(m) => LedgerError::NotFound(m.clone()),
        LedgerError::Conflict(m) => LedgerError::Conflict(m.clone()),
        LedgerError::Invalid(m) => LedgerError::Invalid(m.clone()),
        LedgerError::Closed => LedgerError::Closed,
        LedgerError::Postgres(e) => LedgerError::Postgres(e.clone()),
        LedgerError::Owned { db, owner } => LedgerError::Owned {
            db: db.clone(),
            owner: owner.clone(),
        },
    }
}

/// Serve jobs until every sender is gone.
pub(super) fn serve(conn: &mut Connection, rx: &mpsc::Receiver<Job>) {
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
                // A panicking job fails its own caller (its reply channel drops), not the ledger.
                if catch_unwind(AssertUnwindSafe(|| f(conn))).is_err() {
                    tracing::error!("a ledger operation panicked");
                }
            }
            Job::Tx(first) => {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(Job::Tx(job)) => group.push(job),
                        Ok(other) => {
                            carried = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                run_group(conn, group);
            }
        }
    }
}

/// One transaction for the whole group, a savepoint per job, answers after the commit.
fn run_group(conn: &Connection, group: Vec<Box<dyn TxJob>>) {
    if let Err(e) = conn.execute_batch("BEGIN") {
        let e = LedgerError::from(e);
        for job in group {
            job.fail(&e);
        }
        return;
    }
    let mut answers: Vec<Box<dyn Answer>> = Vec::with_capacity(group.len());
    let mut broken: Option<LedgerError> = None;
    let mut jobs = group.into_iter();
    for job in jobs.by_ref() {
        if let Err(e) = conn.execute_batch("SAVEPOINT job") {
            job.fail(&LedgerError::from(e));
            continue;
        }
        let keep = match catch_unwind(AssertUnwindSafe(|| job.run(conn))) {
            Ok((keep, answer)) => {
                answers.push(answer);
                keep
            }
            Err(_) => {
                // Its reply channel dropped with it: its caller sees the ledger as closed.
                tracing::error!("a ledger operation panicked; its changes were rolled back");
                false
            }
        };
        let end = if keep {
            "RELEASE job"
        } else {
            "ROLLBACK TO job; RELEASE job"
        };
        // This fails only if SQLite already rolled the whole transaction back (an I/O error,
        // a full disk): then nothing of the group is kept.
        if let Err(e) = conn.execute_batch(end) {
            broken = Some(LedgerError::from(e));
            break;
        }
    }
    let ended = match broken {
        Some(e) => Err(e),
        None => conn.execute_batch("COMMIT").map_err(LedgerError::from),
    };
    match ended {
        Ok(()) => {
            for answer in answers {
                answer.send(Ok(()));
            }
        }
        Err(e) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            tracing::error!(error = %e, "a ledger transaction failed; every operation in it fails");
            for answer in answers {
                answer.send(Err(&e));
            }
            for job in jobs {
                job.fail(&e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Ledger, LedgerError};
    use std::time::Duration;

    /// Operations queued behind a slow one run as one group: a failing one and a panicking one
    /// lose only their own changes and fail only their own callers.
    #[tokio::test]
    async fn a_group_keeps_each_operations_own_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("l.db")).unwrap();
        ledger
            .call(|c| Ok(c.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")?))
            .await
            .unwrap();
        // Hold the writer so that the next operations are all queued when it looks.
        let hold = ledger.call(|_| {
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        });
        let mut ops = Vec::new();
        for k in 0..10i64 {
            let l = ledger.clone();
            ops.push(tokio::spawn(async move {
                l.tx(move |c| {
                    c.execute("INSERT INTO t (k) VALUES (?1)", [k])?;
                    match k {
                        3 => Err(LedgerError::Invalid("no".into())),
                        5 => panic!("operation {k} panics"),
                        _ => Ok(k),
                    }
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        hold.await.unwrap();
        let mut got = Vec::new();
        for op in ops {
            got.push(op.await.unwrap());
        }
        for (k, r) in got.iter().enumerate() {
            match k {
                3 => assert!(matches!(r, Err(LedgerError::Invalid(_))), "{k}: {r:?}"),
                5 => assert!(matches!(r, Err(LedgerError::Closed)), "{k}: {r:?}"),
                _ => assert_eq!(r.as_ref().ok(), Some(&(k as i64)), "{k}: {r:?}"),
            }
        }
        let kept: Vec<i64> = ledger
            .read(|c| {
                let mut st = c.prepare("SELECT k FROM t ORDER BY k")?;
                let rows = st.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        assert_eq!(kept, vec![0, 1, 2, 4, 6, 7, 8, 9]);
        // The writer still works after all that.
        assert_eq!(ledger.tx(|_| Ok(1)).await.unwrap(), 1);
    }
}
