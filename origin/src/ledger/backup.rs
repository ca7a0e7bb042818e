//! `fanout backup`: a consistent copy of a SQLite ledger, also while its daemon serves.
//!
//! `VACUUM INTO` from a read-only connection: it reads one snapshot (a WAL read transaction,
//! which never blocks the daemon's writer) and writes it compacted into a new file. The copy's
//! leases are then returned to the queue, as a daemon starting on it would do, so a restored
//! ledger holds every delivery the snapshot held, none of them stuck in flight. A backup is not
//! a daemon: it takes no ownership lock and writes nothing to the source.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use super::{release_all_leases, schema, LedgerError};

/// What a backup holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackupReport {
    pub events: i64,
    pub deliveries: i64,
    /// Deliveries that were in flight in the snapshot, pending in the copy.
    pub leases_released: usize,
    pub bytes: u64,
}

pub fn backup(from: &Path, to: &Path, now_ms: i64) -> Result<BackupReport, LedgerError> {
    if !from.exists() {
        return Err(LedgerError::NotFound(format!(
            "no ledger at {}",
            from.display()
        )));
    }
    if to.exists() {
        return Err(LedgerError::Conflict(format!(
            "{} already exists: a backup never overwrites a file",
            to.display()
        )));
    }
    let src = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    src.busy_timeout(std::time::Duration::from_secs(5))?;
    let version: i64 = src.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > schema::VERSION {
        return Err(LedgerError::Schema(format!(
            "{} has schema version {version}, newer than this fanout ({})",
            from.display(),
            schema::VERSION
        )));
    }
    let target = to
        .to_str()
        .ok_or_else(|| LedgerError::Invalid(format!("{} is not UTF-8", to.display())))?;
    src.execute("VACUUM INTO ?1", [target])?;
    drop(src);
    let mut copy = Connection::open(to)?;
    let tx = copy.transaction()?;
    let leases_released = release_all_leases(&tx, now_ms)?;
    let events: i64 = tx.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
    let deliveries: i64 = tx.query_row("SELECT COUNT(*) FROM deliveries", [], |r| r.get(0))?;
    tx.commit()?;
    drop(copy);
    let bytes = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    Ok(BackupReport {
        events,
        deliveries,
        leases_released,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{claim, create_subscriber, ingest, test_events, test_subscriber, Ledger};

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
        assert!(matches!(
            backup(&db, &to, 778),
            Err(LedgerError::Conflict(_))
        ));
    }
}
