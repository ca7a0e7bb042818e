//! The ledger's files are private to the daemon's user: they hold every subscriber's signing
//! secrets and the portal key. The database, its lock record and every backup are created
//! 0600 whatever the umask; SQLite creates the `-wal` and `-shm` files with the database's
//! mode. Files left by an earlier version (or by hand) with group or other bits are made 0600
//! when the daemon opens them.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Owner read and write, nothing for anyone else.
pub const PRIVATE: u32 = 0o600;

/// Open `path` read-write, creating it 0600 if it does not exist (the umask cannot widen
/// that; the explicit `fchmod` also undoes a umask that would narrow it). An existing file with
/// group or other bits is made 0600 (`tighten`).
pub fn open_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(PRIVATE)
        .open(path)?;
    tighten(&file, path);
    Ok(file)
}

/// [`make_private`], logged: a file that cannot be changed (another user's) is a warning, not
/// a failure: the daemon can still run, and the operator is told what stays readable.
fn tighten(file: &File, path: &Path) {
    match make_private(file) {
        Ok(true) => tracing::info!(file = %path.display(), "made the ledger file 0600"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            file = %path.display(),
            error = %e,
            "cannot make the ledger file 0600: other users may read it"
        ),
    }
}

/// Create `path`, which must not exist, 0600.
pub fn create_new_private(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(PRIVATE)
        .open(path)?;
    make_private(&file)?;
    Ok(file)
}

/// Set `file` to 0600 unless it already is; true when it was changed.
pub fn make_private(file: &File) -> io::Result<bool> {
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode == PRIVATE {
        return Ok(false);
    }
    file.set_permissions(std::fs::Permissions::from_mode(PRIVATE))?;
    Ok(true)
}

/// The files SQLite keeps beside a database: its write-ahead log, the log's shared-memory
/// index and a rollback journal.
pub fn companions(db: &Path) -> [PathBuf; 3] {
    ["-wal", "-shm", "-journal"].map(|suffix| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    })
}

/// Make the companions of `db` that exist 0600 (the database itself is opened with
/// [`open_private`]; SQLite creates missing ones with the database's mode).
pub fn tighten_companions(db: &Path) {
    for path in companions(db) {
        if let Ok(file) = File::open(&path) {
            tighten(&file, &path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_and_existing_files_end_0600() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("fresh");
        drop(open_private(&fresh).unwrap());
        assert_eq!(mode(&fresh), PRIVATE);
        let old = dir.path().join("old");
        std::fs::write(&old, b"x").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_private(&old).unwrap());
        assert_eq!(mode(&old), PRIVATE);
        assert_eq!(std::fs::read(&old).unwrap(), b"x", "never truncated");
        let wal = &companions(&old)[0];
        std::fs::write(wal, b"").unwrap();
        std::fs::set_permissions(wal, std::fs::Permissions::from_mode(0o664)).unwrap();
        tighten_companions(&old);
        assert_eq!(mode(wal), PRIVATE);
        assert!(create_new_private(&old).is_err(), "create_new never reuses");
    }
}
