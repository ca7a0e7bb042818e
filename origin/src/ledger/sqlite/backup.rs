//! `fanout backup`: a consistent copy of a SQLite ledger, also while its daemon serves.
//!
//! `VACUUM INTO` from a read-only connection: it reads one snapshot (a WAL read transaction,
//! which never blocks the daemon's writer) and writes it compacted into a new file. The copy's
//! leases are then returned to the queue, as a daemon starting on it would do, so a restored
//! ledger holds every delivery the snapshot held, none of them stuck in flight. A backup is not
//! a daemon: it takes no ownership lock and writes nothing to the source.
//!
//! The copy is written to a hidden file beside the destination (created 0600: it holds every
//! signing secret) and renamed to the destination only once it is complete and synced; a
//! backup that fails (a full disk, an I/O error) removes what it wrote, so nothing partial is
//! ever left under the destination's name to be mistaken for a backup or to block the retry.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use super::leases::release_all_leases;
use super::{files, schema};
use crate::ledger::error::{LedgerError, Unavailable};

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackupReport {
    pub events: i64,
    pub deliveries: i64,
    /// Deliveries that were in flight in the snapshot, pending in the copy.
    pub leases_released: usize,
    pub bytes: u64,
}

/// Why a backup failed: the ledger it reads, or the destination it writes.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("no ledger at {0}")]
    NoLedger(String),
    #[error("{0} already exists: a backup never overwrites a file")]
    Exists(String),
    #[error("the destination {0} is not a UTF-8 file path")]
    NotUtf8(String),
    #[error("{path} has schema version {found}, newer than this fanout ({known})")]
    Newer {
        path: String,
        found: i64,
        known: i64,
    },
    #[error("cannot read the ledger {path}: {source}")]
    Source { path: String, source: LedgerError },
    /// Nothing of the backup is left at the destination (or beside it).
    #[error("cannot write the backup {path}: {why}; nothing was left there")]
    Destination { path: String, why: WriteFailure },
}

/// Why the destination could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteFailure {
    #[error("no space left on the device that holds it")]
    NoRoom,
    #[error("the device that holds it reported an I/O error")]
    Io,
    #[error("{0}")]
    Ledger(LedgerError),
    #[error("{0}")]
    File(std::io::Error),
}

impl From<LedgerError> for WriteFailure {
    fn from(e: LedgerError) -> WriteFailure {
        match e {
            LedgerError::Unavailable(Unavailable::Full) => WriteFailure::NoRoom,
            LedgerError::Unavailable(Unavailable::Io) => WriteFailure::Io,
            other => WriteFailure::Ledger(other),
        }
    }
}

impl From<rusqlite::Error> for WriteFailure {
    fn from(e: rusqlite::Error) -> WriteFailure {
        LedgerError::from(e).into()
    }
}

impl From<std::io::Error> for WriteFailure {
    fn from(e: std::io::Error) -> WriteFailure {
        match e.kind() {
            std::io::ErrorKind::StorageFull => WriteFailure::NoRoom,
            _ => WriteFailure::File(e),
        }
    }
}

/// The hidden file a backup is written to before it takes the destination's name; removed
/// (with any file SQLite kept beside it) unless [`Partial::keep`] renamed it into place.
struct Partial {
    path: PathBuf,
    done: bool,
}

impl Partial {
    fn beside(to: &Path) -> Partial {
        let name = to
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "backup".into());
        Partial {
            path: to.with_file_name(format!(".{name}.{}.partial", std::process::id())),
            done: false,
        }
    }

    /// Sync the finished copy, rename it to `to` and sync the directory.
    fn keep(mut self, to: &Path) -> std::io::Result<()> {
        std::fs::File::open(&self.path)?.sync_all()?;
        std::fs::rename(&self.path, to)?;
        self.done = true;
        if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
            for companion in files::companions(&self.path) {
                let _ = std::fs::remove_file(companion);
            }
        }
    }
}

pub fn backup(from: &Path, to: &Path, now_ms: i64) -> Result<BackupReport, BackupError> {
    if !from.exists() {
        return Err(BackupError::NoLedger(from.display().to_string()));
    }
    if to.symlink_metadata().is_ok() {
        return Err(BackupError::Exists(to.display().to_string()));
    }
    let source = |e: rusqlite::Error| BackupError::Source {
        path: from.display().to_string(),
        source: e.into(),
    };
    let src = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(source)?;
    src.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(source)?;
    let version: i64 = src
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(source)?;
    if version > schema::VERSION {
        return Err(BackupError::Newer {
            path: from.display().to_string(),
            found: version,
            known: schema::VERSION,
        });
    }
    let partial = Partial::beside(to);
    let target = partial
        .path
        .to_str()
        .ok_or_else(|| BackupError::NotUtf8(to.display().to_string()))?
        .to_string();
    let destination = |why: WriteFailure| BackupError::Destination {
        path: to.display().to_string(),
        why,
    };
    // Created here, empty and 0600 (`VACUUM INTO` writes into an empty file as into a new one,
    // and would create a new one with the umask's mode).
    files::create_new_private(&partial.path).map_err(|e| destination(e.into()))?;
    src.execute("VACUUM INTO ?1", [&target])
        .map_err(|e| destination(e.into()))?;
    drop(src);
    let (events, deliveries, leases_released) =
        release_copied_leases(&partial.path, now_ms).map_err(|e| destination(e.into()))?;
    partial.keep(to).map_err(|e| destination(e.into()))?;
    let bytes = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    Ok(BackupReport {
        events,
        deliveries,
        leases_released,
        bytes,
    })
}

/// Return the copy's leases to the queue; its event and delivery counts.
fn release_copied_leases(copy: &Path, now_ms: i64) -> Result<(i64, i64, usize), LedgerError> {
    let mut copy = Connection::open(copy)?;
    let tx = copy.transaction()?;
    let released = release_all_leases(&tx, now_ms)?;
    let events: i64 = tx.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
    let deliveries: i64 = tx.query_row("SELECT COUNT(*) FROM deliveries", [], |r| r.get(0))?;
    tx.commit()?;
    Ok((events, deliveries, released))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sqlite::{claim, create_subscriber, ingest, Ledger};
    use crate::ledger::{test_events, test_subscriber};

    /// A backup taken while a writer holds the ledger open has every committed row, its leases
    /// pending; it refuses to overwrite.
    #[tokio::test]
    async fn copies_a_live_ledger_and_releases_its_leases() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("live.db");
        let ledger = Ledger::open(&db).unwrap();
        ledger
            .tx(|c| {
                create_subscriber(c, &test_subscriber("a", &["*"]), "s")?;
                ingest(c, &test_events(10), 5)?;
                claim(c, &[("a".into(), 4)], &[], 10, 99_999)?;
                Ok(())
            })
            .await
            .unwrap();
        let to = dir.path().join("copy.db");
        let report = backup(&db, &to, 777).unwrap();
        assert_eq!(
            report,
            BackupReport {
                events: 10,
                deliveries: 10,
                leases_released: 4,
                bytes: report.bytes
            }
        );
        let copy = Connection::open(&to).unwrap();
        let pending: i64 = copy
            .query_row(
                "SELECT COUNT(*) FROM deliveries WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(pending, 10);
        // The live ledger still has its leases: the backup wrote nothing to it.
        let in_flight: i64 = ledger
            .read(|c| {
                Ok(c.query_row(
                    "SELECT COUNT(*) FROM deliveries WHERE status = 'in_flight'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(in_flight, 4);
        assert!(matches!(backup(&db, &to, 778), Err(BackupError::Exists(_))));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&to).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, files::PRIVATE);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains("partial"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
