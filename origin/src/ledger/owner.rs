//! One SQLite ledger, one daemon: `fanout serve` holds an exclusive lock on `<db>.lock` for as
//! long as it runs, and writes who it is (pid, host, since) into that file. A second daemon on
//! the same ledger finds the lock taken and refuses to start, naming the owner. The operating
//! system drops the lock when its process ends, however it ends (`kill -9` included), so a stale
//! file never blocks a restart.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::LedgerError;

/// Who owns a ledger, as its lock file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    pub host: String,
    pub since_ms: i64,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} on host {} since {}",
            self.pid,
            self.host,
            crate::time::format_rfc3339(self.since_ms)
        )
    }
}

/// The held lock; dropping it (or the process ending) releases the ledger.
#[derive(Debug)]
pub struct OwnerLock {
    _file: File,
    path: PathBuf,
}

/// `<db>.lock` beside the database file.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

impl OwnerLock {
    /// Take the ledger at `db` for this process, or fail with [`LedgerError::Owned`].
    pub fn acquire(db: &Path, now_ms: i64) -> Result<OwnerLock, LedgerError> {
        let path = lock_path(db);
        let cannot = |e: std::io::Error| {
            LedgerError::Schema(format!("cannot open the lock file {}: {e}", path.display()))
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(cannot)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let owner = serde_json::from_str::<Owner>(&text)
                    .map(|o| o.to_string())
                    .unwrap_or_else(|_| "another process (its record is unreadable)".into());
                return Err(LedgerError::Owned {
                    db: db.display().to_string(),
                    owner,
                });
            }
            Err(TryLockError::Error(e)) => return Err(cannot(e)),
        }
        let me = Owner {
            pid: std::process::id(),
            host: host_name(),
            since_ms: now_ms,
        };
        let record = serde_json::to_string(&me)
            .map_err(|e| LedgerError::Schema(format!("cannot encode the owner record: {e}")))?;
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(record.as_bytes()))
            .and_then(|()| file.sync_all())
            .map_err(cannot)?;
        Ok(OwnerLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_and_named_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("f.db");
        let first = OwnerLock::acquire(&db, 1_700_000_000_000).unwrap();
        match OwnerLock::acquire(&db, 1_700_000_000_001) {
            Err(LedgerError::Owned { owner, .. }) => {
                assert!(
                    owner.contains(&format!("pid {}", std::process::id())),
                    "{owner}"
                );
                assert!(owner.contains("2023-11-14T22:13:20"), "{owner}");
            }
            other => panic!("expected Owned, got {other:?}"),
        }
        drop(first);
        OwnerLock::acquire(&db, 1_700_000_000_002).unwrap();
    }
}
