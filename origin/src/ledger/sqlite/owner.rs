//! One SQLite ledger, one owner: `fanout serve` (and `fanout ledger copy`, which must not run
//! beside a daemon) holds an exclusive lock on the database file itself for as long as it
//! runs. The lock belongs to the file, not to the path that named it: a symlink, a hard link or
//! another spelling of the path (`./`, `..`) finds it taken. The owner writes who it is (what,
//! pid, host, since) into `<db>.lock` beside the file's real path, so a second process refused
//! can name it. The operating system drops the lock when its process ends, however it ends
//! (`kill -9` included), so a stale record never blocks a restart.
//!
//! The lock is `flock(2)` on an open file description of our own: SQLite's own locks are POSIX
//! record locks, which on Linux neither see nor disturb it. One caution goes with it: closing
//! any descriptor of the database file drops every POSIX lock the process holds on it, so the
//! lock is taken before the ledger's connections open and let go only when the daemon stops
//! (`crate::run`), and nothing in the daemon opens and closes the database file while its
//! connections are open (`Ledger::open_with` makes the file private before it connects).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::files;
use crate::ledger::error::LedgerError;

/// Who owns a ledger, as its lock record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// `serve` or `ledger copy` (absent in records written before it was kept).
    #[serde(default)]
    pub command: Option<String>,
    pub pid: u32,
    pub host: String,
    pub since_ms: i64,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(c) = &self.command {
            write!(f, "fanout {c}, ")?;
        }
        write!(
            f,
            "pid {} on host {} since {}",
            self.pid,
            self.host,
            crate::time::format_rfc3339(self.since_ms)
        )
    }
}

/// What takes the lock, and whether it may create the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taker {
    /// `fanout serve`: creates an empty ledger file (0600) when there is none.
    Serve,
    /// `fanout ledger copy`: the ledger must exist.
    Copy,
}

impl Taker {
    fn command(self) -> &'static str {
        match self {
            Taker::Serve => "serve",
            Taker::Copy => "ledger copy",
        }
    }
}

/// The held lock; dropping it (or the process ending) releases the ledger.
#[derive(Debug)]
pub struct OwnerLock {
    _db: File,
    _record: File,
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

/// The owner named by the record at `record`, for a refusal's message.
fn recorded_owner(record: &Path) -> String {
    let mut text = String::new();
    match File::open(record).and_then(|mut f| f.read_to_string(&mut text)) {
        Ok(_) => serde_json::from_str::<Owner>(&text)
            .map(|o| o.to_string())
            .unwrap_or_else(|_| "another process (its record is unreadable)".into()),
        Err(_) => format!(
            "another process, which opened it under another name (no owner record at {})",
            record.display()
        ),
    }
}

impl OwnerLock {
    /// Take the ledger at `db` for this process, or fail with [`LedgerError::Owned`] when any
    /// other process holds it, under whatever name.
    pub fn acquire(db: &Path, now_ms: i64, taker: Taker) -> Result<OwnerLock, LedgerError> {
        let cannot = |what: &str, path: &Path, e: std::io::Error| {
            LedgerError::File(format!("cannot {what} {}: {e}", path.display()))
        };
        let file = match taker {
            Taker::Serve => files::open_private(db),
            Taker::Copy => OpenOptions::new().read(true).open(db),
        }
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if taker == Taker::Copy => {
                LedgerError::NotFound(format!("no SQLite ledger at {}", db.display()))
            }
            _ => cannot("open the ledger", db, e),
        })?;
        // The file's one real name: where its owner record is, whatever path named it here.
        let real = std::fs::canonicalize(db).map_err(|e| cannot("resolve", db, e))?;
        let path = lock_path(&real);
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LedgerError::Owned {
                    db: db.display().to_string(),
                    owner: recorded_owner(&path),
                });
            }
            Err(TryLockError::Error(e)) => return Err(cannot("lock the ledger", db, e)),
        }
        let me = Owner {
            command: Some(taker.command().into()),
            pid: std::process::id(),
            host: host_name(),
            since_ms: now_ms,
        };
        let record = serde_json::to_string(&me)
            .map_err(|e| LedgerError::File(format!("cannot encode the owner record: {e}")))?;
        let mut record_file =
            files::open_private(&path).map_err(|e| cannot("open the lock record", &path, e))?;
        record_file
            .set_len(0)
            .and_then(|()| record_file.seek(SeekFrom::Start(0)))
            .and_then(|_| record_file.write_all(record.as_bytes()))
            .and_then(|()| record_file.sync_all())
            .map_err(|e| cannot("write the lock record", &path, e))?;
        Ok(OwnerLock {
            _db: file,
            _record: record_file,
            path,
        })
    }

    /// The owner record's path.
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
        let first = OwnerLock::acquire(&db, 1_700_000_000_000, Taker::Serve).unwrap();
        match OwnerLock::acquire(&db, 1_700_000_000_001, Taker::Copy) {
            Err(LedgerError::Owned { owner, .. }) => {
                assert!(
                    owner.contains(&format!("pid {}", std::process::id())),
                    "{owner}"
                );
                assert!(owner.contains("2023-11-14T22:13:20"), "{owner}");
                assert!(owner.starts_with("fanout serve, "), "{owner}");
            }
            other => panic!("expected Owned, got {other:?}"),
        }
        drop(first);
        OwnerLock::acquire(&db, 1_700_000_000_002, Taker::Copy).unwrap();
    }

    /// The lock is the file's: another name for it (a symlink, a hard link, `..`) is refused.
    #[test]
    fn every_name_of_the_file_is_the_same_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("f.db");
        let _first = OwnerLock::acquire(&db, 1_700_000_000_000, Taker::Serve).unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let hard = dir.path().join("hard.db");
        std::fs::hard_link(&db, &hard).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let spelled = dir.path().join("sub").join("..").join("f.db");
        for other in [&link, &spelled, &hard] {
            match OwnerLock::acquire(other, 1_700_000_000_001, Taker::Serve) {
                Err(LedgerError::Owned { owner, .. }) if other == &hard => {
                    assert!(owner.contains("under another name"), "{owner}")
                }
                Err(LedgerError::Owned { owner, .. }) => {
                    assert!(owner.starts_with("fanout serve, pid"), "{owner}")
                }
                res => panic!("{}: expected Owned, got {res:?}", other.display()),
            }
        }
        assert!(
            !lock_path(&hard).exists(),
            "a refused process writes no record"
        );
    }
}
