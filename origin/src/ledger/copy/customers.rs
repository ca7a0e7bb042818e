//! `fanout ledger copy`'s customers: read from the SQLite file, written into the PostgreSQL
//! copy's transaction.

use deadpool_postgres::Transaction;
use rusqlite::OptionalExtension;

use super::rows::copy_table;
use crate::ledger::error::LedgerError;
use crate::ledger::rows::customers::TABLE;

/// `fanout ledger copy`, after the subscribers (each names its customer): the SQLite ledger's
/// customers (if its schema has them) and its portal signing key (replacing the one a
/// daemon may have made on the empty target), inside the copy's transaction. Returns how many
/// customers. `Conflict` when the target already has customers.
pub(super) async fn copy_customers(
    src: &rusqlite::Connection,
    tx: &Transaction<'_>,
) -> Result<u64, LedgerError> {
    let has_customers: bool = src.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'customers')",
        [],
        |r| r.get(0),
    )?;
    if !has_customers {
        return Ok(0);
    }
    tx.batch_execute("LOCK TABLE customers, portal_key IN EXCLUSIVE MODE")
        .await?;
    let occupied: bool = tx
        .query_one("SELECT EXISTS (SELECT 1 FROM customers)", &[])
        .await?
        .try_get(0)?;
    if occupied {
        return Err(LedgerError::Conflict(
            "the PostgreSQL ledger already has customers: copy only into an empty database".into(),
        ));
    }
    let copied = copy_table(src, tx, &TABLE, |_| {}, &mut |_| {}).await?;
    let key: Option<(Vec<u8>, i64)> = src
        .query_row(
            "SELECT key, created_ms FROM portal_key WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((key, created_ms)) = key {
        tx.execute(
            "INSERT INTO portal_key (id, key, created_ms) VALUES (1, $1, $2)
             ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key, created_ms = EXCLUDED.created_ms",
            &[&key, &created_ms],
        )
        .await?;
    }
    Ok(copied)
}
