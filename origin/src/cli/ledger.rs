//! The commands that work on a ledger directly, not through the API: `fanout backup` (a
//! consistent copy of a SQLite ledger) and `fanout ledger copy` (SQLite into PostgreSQL).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::client::{print, ClientError};

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Copy a SQLite ledger into an empty PostgreSQL one (stop the daemon first): customers
    /// and which subscribers each owns, the portal's signing key (portal links keep working),
    /// subscribers (removed ones too) with their secrets, signing keys, content filters,
    /// ordering, batch and trace settings, and limiter and health state, events, deliveries with their status, public ids, sequence
    /// numbers (and each subscriber's counter), ordering keys (and each key's last number),
    /// and attempts; deliveries in flight come over pending, due at once. Progress goes to
    /// stderr.
    Copy(LedgerCopyArgs),
}

#[derive(Debug, Args)]
pub struct LedgerCopyArgs {
    /// The SQLite ledger file (or sqlite:PATH)
    #[arg(long)]
    pub from: PathBuf,
    /// The PostgreSQL ledger, postgres://user@host:port/dbname; its tables must be empty
    #[arg(long)]
    pub to: String,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The ledger to copy (a file path or sqlite:PATH)
    #[arg(long, env = "FANOUT_DB")]
    pub db: PathBuf,
    /// The new file to write (must not exist)
    #[arg(long)]
    pub to: PathBuf,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

/// `fanout ledger copy`: both ends named as `--db` takes them.
pub(super) async fn ledger_copy(a: LedgerCopyArgs) -> Result<(), ClientError> {
    use crate::config::LedgerLocation;
    let from = match LedgerLocation::parse(&a.from) {
        Ok(LedgerLocation::Sqlite(p)) => p,
        Ok(LedgerLocation::Postgres(_)) => {
            return Err(ClientError::Input(
                "--from must be a SQLite ledger file (sqlite:PATH or a path)".into(),
            ))
        }
        Err(e) => return Err(ClientError::Input(e.0)),
    };
    let to = match LedgerLocation::parse(std::path::Path::new(&a.to)) {
        Ok(LedgerLocation::Postgres(url)) => url,
        Ok(LedgerLocation::Sqlite(_)) => {
            return Err(ClientError::Input(
                "--to must be a PostgreSQL URL like postgres://user@host:5432/dbname".into(),
            ))
        }
        Err(e) => return Err(ClientError::Input(e.0)),
    };
    crate::ledger::copy::copy_sqlite_to_pg(&from, &to, crate::time::now_ms(), |line| {
        eprintln!("fanout ledger copy: {line}")
    })
    .await?;
    Ok(())
}

/// What `fanout backup` answers for a PostgreSQL ledger.
pub const PG_BACKUP: &str = "fanout backup copies a SQLite ledger; back up a PostgreSQL \
     ledger with PostgreSQL's own tools, e.g. pg_dump --format=custom --file=FILE \
     postgres://user@host/dbname (consistent while the daemons serve); restored, the daemons \
     take over leases that were in flight once they expire";

/// `fanout backup`: not a client of the API (it reads the ledger file) and not a daemon (it
/// takes no ownership lock).
/// A PostgreSQL ledger is refused: its consistent copy is PostgreSQL's own (`pg_dump`).
pub(super) fn backup(a: BackupArgs) -> Result<(), ClientError> {
    use crate::config::LedgerLocation;
    let db = match LedgerLocation::parse(&a.db) {
        Ok(LedgerLocation::Sqlite(path)) => path,
        Ok(LedgerLocation::Postgres(_)) => return Err(ClientError::Input(PG_BACKUP.into())),
        Err(e) => return Err(ClientError::Input(e.0)),
    };
    let r = crate::ledger::sqlite::backup::backup(&db, &a.to, crate::time::now_ms())?;
    if a.json {
        print(&r);
    } else {
        println!(
            "backed up {} to {}: {} events, {} deliveries ({} leases returned to pending), {} bytes",
            db.display(),
            a.to.display(),
            r.events,
            r.deliveries,
            r.leases_released,
            r.bytes
        );
    }
    Ok(())
}
