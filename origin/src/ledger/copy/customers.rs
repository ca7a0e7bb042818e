//! `fanout ledger copy`'s customers: read from the SQLite file, written into the PostgreSQL
//! copy's transaction.

use deadpool_postgres::Transaction;
use rusqlite::OptionalExtension;

use crate::ledger::error::LedgerError;

fn int(n: u32) -> i32 {
    n.min(i32::MAX as u32) as i32
}

/// `fanout ledger copy`, after the subscribers: the SQLite ledger's customers (if its schema
/// has them), which subscriber each owns, and its portal signing key (replacing the one a
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
    let customers = crate::ledger::sqlite::list_customers(src)?;
    let ids: Vec<&str> = customers.iter().map(|c| c.id.as_str()).collect();
    let weights: Vec<i32> = customers.iter().map(|c| int(c.weight)).collect();
    let caps: Vec<Option<i32>> = customers.iter().map(|c| c.max_in_flight.map(int)).collect();
    let nonces: Vec<&str> = customers.iter().map(|c| c.portal_nonce.as_str()).collect();
    let created: Vec<i64> = customers.iter().map(|c| c.created_ms).collect();
    let updated: Vec<i64> = customers.iter().map(|c| c.updated_ms).collect();
    tx.execute(
        "INSERT INTO customers (id, weight, max_in_flight, portal_nonce, created_ms, updated_ms)
         SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::text[], $5::bigint[],
                              $6::bigint[])",
        &[&ids, &weights, &caps, &nonces, &created, &updated],
    )
    .await?;
    // Removed subscribers keep their owner too: no other customer takes their history over.
    let mut st = src.prepare("SELECT id, customer FROM subscribers WHERE customer IS NOT NULL")?;
    let owned: Vec<(String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let subs: Vec<&str> = owned.iter().map(|(s, _)| s.as_str()).collect();
    let owners: Vec<&str> = owned.iter().map(|(_, c)| c.as_str()).collect();
    tx.execute(
        "UPDATE subscribers s SET customer = u.c
         FROM unnest($1::text[], $2::text[]) AS u(id, c) WHERE s.id = u.id",
        &[&subs, &owners],
    )
    .await?;
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
    Ok(customers.len() as u64)
}
