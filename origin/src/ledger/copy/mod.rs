//! `fanout ledger copy`: move a SQLite ledger (its daemon stopped: the copy takes its owner
//! lock, and refuses while a daemon holds it) into an empty PostgreSQL one, in one PostgreSQL
//! transaction (a failed copy leaves the target empty). Each table both backends keep comes
//! over as its column list in `ledger/rows/` says (`rows.rs` decodes with one driver and
//! encodes with the other; no code per column): subscribers (removed ones too, for their
//! history) with their limiter, health and filters, secrets, customers, events, deliveries
//! with their status and attempt counts, attempts, the sequence counters. Deliveries that were
//! in flight come over pending, due at once (their lease died with the daemon). Public delivery
//! ids (`dlv_<id>`) and sequence numbers stay the same; the portal signing key comes over too
//! (`customers.rs`): links issued before the move keep working. The one place in the daemon
//! that names both drivers; it decides nothing either backend does at run time.

use std::path::Path;

use deadpool_postgres::Transaction;
use rusqlite::{Connection, OpenFlags};

use super::postgres::PgLedger;
use super::sqlite::owner::{OwnerLock, Taker};
use super::LedgerError;

mod customers;
mod rows;

pub use rows::Copied;
use rows::{copy_table, has_column, requeue};

use super::rows::{deliveries, subscribers, tables};

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

    let quiet = &mut |_: &str| {};
    done.subscribers = copy_table(&src, &tx, &subscribers::TABLE, |_| {}, quiet).await?;
    done.secrets = copy_table(&src, &tx, &subscribers::SECRETS, |_| {}, quiet).await?;
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

    done.events = copy_table(&src, &tx, &tables::EVENTS, |_| {}, &mut progress).await?;
    let (status, due) = (deliveries::DELIVERY_STATUS, deliveries::DELIVERY_DUE);
    let requeued = &mut 0;
    done.deliveries = copy_table(
        &src,
        &tx,
        &deliveries::DELIVERIES,
        |page| *requeued += requeue(page, status, due, now_ms),
        &mut progress,
    )
    .await?;
    done.requeued = *requeued;
    copy_sequences(&src, &tx).await?;
    copy_table(&src, &tx, &tables::ORDERING_KEYS, |_| {}, quiet).await?;
    done.attempts = copy_table(&src, &tx, &deliveries::ATTEMPTS, |_| {}, &mut progress).await?;

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

/// Each subscriber's sequence counter: the source's (retention may have removed deliveries
/// whose numbers it counts), or, from a ledger from before sequence numbers, its deliveries
/// numbered per subscriber in id order and the counters seeded from them (as the migration
/// that added them does).
async fn copy_sequences(src: &Connection, tx: &Transaction<'_>) -> Result<(), LedgerError> {
    if has_column(src, "deliveries", "sequence")? {
        copy_table(src, tx, &tables::SEQUENCES, |_| {}, &mut |_| {}).await?;
        return Ok(());
    }
    tx.batch_execute(
        "UPDATE deliveries d SET sequence = n.k
             FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY subscriber_id ORDER BY id) AS k
                   FROM deliveries) n
             WHERE d.id = n.id;
         INSERT INTO sequences (subscriber_id, last)
             SELECT subscriber_id, MAX(sequence) FROM deliveries GROUP BY subscriber_id;",
    )
    .await?;
    Ok(())
}
