//! `fanout ledger copy`: move a SQLite ledger (its daemon stopped: the copy takes its owner
//! lock, and refuses while a daemon holds it) into an empty PostgreSQL one, in one PostgreSQL
//! transaction (a failed copy leaves the target empty). Subscribers (removed ones too, for
//! their history), secrets, events, deliveries with their status and attempt counts, attempts,
//! limiter and health state, content filters come over as they are; deliveries that were in flight come over
//! pending, due at once (their lease died with the daemon). Public delivery ids (`dlv_<id>`)
//! and sequence numbers (with each subscriber's counter) stay the same. Customers, which subscriber each owns and the portal signing key come over
//! too (`customers.rs`): links issued before the move keep working. The one place in the
//! daemon that names both drivers; it decides nothing either backend does at run time.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::postgres::PgLedger;
use super::sqlite::owner::{OwnerLock, Taker};
use super::LedgerError;

mod customers;
mod rows;

use rows::copy_filters;
pub use rows::Copied;
use rows::{
    copy_attempts, copy_deliveries, copy_events, copy_ordering, copy_secrets, copy_sequences,
    copy_subscribers,
};
use rows::{copy_batch, copy_propagate_trace};

/// Copy the SQLite ledger at `from` into the empty PostgreSQL ledger at `to` (created and
/// migrated if needed); `progress` hears a line now and then.
pub async fn copy_sqlite_to_pg(
    from: &Path,
    to: &str,
    now_ms: i64,
    mut progress: impl FnMut(&str),
) -> Result<Copied, LedgerError> {
    // No daemon may write the source meanwhile (what it acknowledged after the snapshot would
    // be left behind), and none may start on it until the copy is done: the copy holds the
    // ledger's owner lock throughout, or refuses while a daemon holds it.
    let _owner = OwnerLock::acquire(from, now_ms, Taker::Copy).map_err(|e| match e {
        LedgerError::Owned { db, owner } => LedgerError::Owned {
            db,
            owner: format!("{owner}; stop it before copying its ledger"),
        },
        other => other,
    })?;
    let src = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let version: i64 = src.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let newest = super::sqlite::SCHEMA_VERSION;
    if !(2..=newest).contains(&version) {
        return Err(LedgerError::Schema(format!(
            "{} has SQLite schema version {version}; this fanout copies versions 2 to {newest}",
            from.display()
        )));
    }
    // One read transaction: a consistent snapshot of the source throughout.
    src.execute_batch("BEGIN")?;
    let ledger = PgLedger::open(to, "fanout-ledger-copy").await?;
    let mut client = ledger.client().await?;
    let tx = client.transaction().await?;
    // Nobody else writes while we check and copy.
    tx.batch_execute(
        "LOCK TABLE subscribers, subscriber_secrets, events, deliveries, attempts, sequences,
             ordering_keys IN EXCLUSIVE MODE",
    )
    .await?;
    let occupied: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM subscribers) OR EXISTS (SELECT 1 FROM events)
                 OR EXISTS (SELECT 1 FROM deliveries) OR EXISTS (SELECT 1 FROM attempts)",
            &[],
        )
        .await?
        .try_get(0)?;
    if occupied {
        return Err(LedgerError::Conflict(
            "the PostgreSQL ledger is not empty: copy only into an empty database".into(),
        ));
    }
    let mut done = Copied::default();

    copy_subscribers(&src, &tx, version, &mut done).await?;
    copy_secrets(&src, &tx, &mut done).await?;
    copy_filters(&src, &tx).await?;
    progress(&format!(
        "subscribers: {} ({} secrets)",
        done.subscribers, done.secrets
    ));
    done.customers = customers::copy_customers(&src, &tx).await?;
    // A ledger from before schema 7 may still have removed subscribers naming a customer
    // that is gone or was created again since: their history is the operator's (as that
    // migration does).
    tx.execute(
        "UPDATE subscribers SET customer = NULL
             WHERE deleted_ms IS NOT NULL AND customer IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM customers c
                               WHERE c.id = subscribers.customer
                                 AND c.created_ms <= subscribers.deleted_ms)",
        &[],
    )
    .await?;
    progress(&format!("customers: {}", done.customers));

    copy_propagate_trace(&src, &tx).await?;
    copy_batch(&src, &tx).await?;
    copy_events(&src, &tx, &mut done, &mut progress).await?;

    copy_deliveries(&src, &tx, now_ms, &mut done, &mut progress).await?;
    copy_sequences(&src, &tx).await?;
    copy_ordering(&src, &tx).await?;

    copy_attempts(&src, &tx, &mut done, &mut progress).await?;

    // New rows continue after the copied ids.
    tx.batch_execute(
        "SELECT setval(pg_get_serial_sequence('deliveries', 'id'),
                       COALESCE((SELECT MAX(id) FROM deliveries), 0) + 1, false);
         SELECT setval(pg_get_serial_sequence('attempts', 'id'),
                       COALESCE((SELECT MAX(id) FROM attempts), 0) + 1, false);",
    )
    .await?;
    tx.commit().await?;
    src.execute_batch("COMMIT")?;
    progress(&format!(
        "done: {} customers, {} subscribers, {} events, {} deliveries ({} were in flight: now pending), {} attempts",
        done.customers, done.subscribers, done.events, done.deliveries, done.requeued, done.attempts
    ));
    Ok(done)
}
