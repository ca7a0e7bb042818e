//! `fanout ledger copy`: move a SQLite ledger (its daemon stopped: the copy takes its owner
//! lock, and refuses while a daemon holds it) into an empty PostgreSQL one, in one PostgreSQL transaction (a failed copy leaves the target empty). Subscribers
//! (removed ones too, for their history), secrets, events, deliveries with their status and
//! attempt counts, attempts, limiter and health state come over as they are; deliveries that
//! were in flight come over pending, due at once (their lease died with the daemon). Public
//! delivery ids (`dlv_<id>`) stay the same. Customers, which subscriber each owns and the
//! portal signing key come over too (`customers::copy_customers`): links issued before the
//! move keep working.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::postgres::PgLedger;
use super::sqlite::owner::{OwnerLock, Taker};
use super::LedgerError;

mod customers;

/// Rows read from SQLite and written to PostgreSQL at a time.
const CHUNK: i64 = 5_000;

/// What was copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    pub customers: u64,
    pub subscribers: u64,
    pub secrets: u64,
    pub events: u64,
    pub deliveries: u64,
    /// Deliveries that were in flight and come over pending.
    pub requeued: u64,
    pub attempts: u64,
}

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
        "LOCK TABLE subscribers, subscriber_secrets, events, deliveries, attempts
         IN EXCLUSIVE MODE",
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

    // Subscribers (few: in one go).
    {
        // Before schema 6 who disabled a subscriber is told by the reason the API wrote, as
        // that migration does.
        let by_operator = if version >= 6 {
            "disabled_by_operator"
        } else {
            "COALESCE(disabled_ms IS NOT NULL AND disabled_reason = 'disabled by an operator', 0)"
        };
        let mut st = src.prepare(&format!(
            "SELECT id, url, event_types, rate_per_sec, burst, max_in_flight, timeout_ms, lane,
                 legacy_signature, limiter, created_ms, updated_ms, deleted_ms, disabled_ms,
                 disabled_reason, failing_since_ms, dead_alerted_ms, {by_operator}
             FROM subscribers ORDER BY rowid"
        ))?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, f64>(3)?,
                r.get::<_, i32>(4)?,
                r.get::<_, i32>(5)?,
                r.get::<_, i64>(6)?,
                r.get::<_, String>(7)?,
                r.get::<_, bool>(8)?,
                r.get::<_, Option<String>>(9)?,
                (
                    r.get::<_, i64>(10)?,
                    r.get::<_, i64>(11)?,
                    r.get::<_, Option<i64>>(12)?,
                    r.get::<_, Option<i64>>(13)?,
                    r.get::<_, Option<String>>(14)?,
                    r.get::<_, Option<i64>>(15)?,
                    r.get::<_, Option<i64>>(16)?,
                    r.get::<_, bool>(17)?,
                ),
            ))
        })?;
        let insert = tx
            .prepare(
                "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                     timeout_ms, lane, legacy_signature, limiter, created_ms, updated_ms,
                     deleted_ms, disabled_ms, disabled_reason, failing_since_ms, dead_alerted_ms,
                     disabled_by_operator)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                     $18)",
            )
            .await?;
        for row in rows {
            let (id, url, types, rate, burst, mif, timeout, lane, legacy, limiter, t) = row?;
            tx.execute(
                &insert,
                &[
                    &id, &url, &types, &rate, &burst, &mif, &timeout, &lane, &legacy, &limiter,
                    &t.0, &t.1, &t.2, &t.3, &t.4, &t.5, &t.6, &t.7,
                ],
            )
            .await?;
            done.subscribers += 1;
        }
        let mut st = src.prepare(
            "SELECT subscriber_id, secret, created_ms, expires_ms FROM subscriber_secrets
             ORDER BY rowid",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<i64>>(3)?,
            ))
        })?;
        for row in rows {
            let (sub, secret, created, expires) = row?;
            tx.execute(
                "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms, expires_ms)
                 VALUES ($1, $2, $3, $4)",
                &[&sub, &secret, &created, &expires],
            )
            .await?;
            done.secrets += 1;
        }
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
    }

    // Events, by rowid pages.
    let total: i64 = src.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
    let mut after = 0i64;
    loop {
        let mut st = src.prepare_cached(
            "SELECT rowid, id, type, body, received_ms FROM events WHERE rowid > ?1
             ORDER BY rowid LIMIT ?2",
        )?;
        let page: Vec<(i64, String, String, String, i64)> = st
            .query_map([after, CHUNK], |r| r.try_into())?
            .collect::<Result<_, _>>()?;
        let Some(last) = page.last() else { break };
        after = last.0;
        let ids: Vec<&str> = page.iter().map(|e| e.1.as_str()).collect();
        let types: Vec<&str> = page.iter().map(|e| e.2.as_str()).collect();
        let bodies: Vec<&str> = page.iter().map(|e| e.3.as_str()).collect();
        let at: Vec<i64> = page.iter().map(|e| e.4).collect();
        tx.execute(
            "INSERT INTO events (id, type, body, received_ms)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])",
            &[&ids, &types, &bodies, &at],
        )
        .await?;
        done.events += page.len() as u64;
        progress(&format!("events: {}/{total}", done.events));
    }

    // Deliveries, by id pages; in flight comes over pending, due now.
    let total: i64 = src.query_row("SELECT COUNT(*) FROM deliveries", [], |r| r.get(0))?;
    let mut after = 0i64;
    loop {
        let mut st = src.prepare_cached(
            "SELECT id, subscriber_id, event_id, status, attempts, next_attempt_ms, last_error,
                 created_ms, updated_ms
             FROM deliveries WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        #[allow(clippy::type_complexity)]
        let page: Vec<(
            i64,
            String,
            String,
            String,
            i32,
            i64,
            Option<String>,
            i64,
            i64,
        )> = st
            .query_map([after, CHUNK], |r| r.try_into())?
            .collect::<Result<_, _>>()?;
        let Some(last) = page.last() else { break };
        after = last.0;
        let mut requeued = 0u64;
        let ids: Vec<i64> = page.iter().map(|d| d.0).collect();
        let subs: Vec<&str> = page.iter().map(|d| d.1.as_str()).collect();
        let events: Vec<&str> = page.iter().map(|d| d.2.as_str()).collect();
        let statuses: Vec<&str> = page
            .iter()
            .map(|d| {
                if d.3 == "in_flight" {
                    requeued += 1;
                    "pending"
                } else {
                    d.3.as_str()
                }
            })
            .collect();
        let attempts: Vec<i32> = page.iter().map(|d| d.4).collect();
        let next: Vec<i64> = page
            .iter()
            .map(|d| if d.3 == "in_flight" { now_ms } else { d.5 })
            .collect();
        let errors: Vec<Option<&str>> = page.iter().map(|d| d.6.as_deref()).collect();
        let created: Vec<i64> = page.iter().map(|d| d.7).collect();
        let updated: Vec<i64> = page.iter().map(|d| d.8).collect();
        tx.execute(
            "INSERT INTO deliveries (id, subscriber_id, event_id, status, attempts,
                 next_attempt_ms, last_error, created_ms, updated_ms)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[],
                                  $6::bigint[], $7::text[], $8::bigint[], $9::bigint[])",
            &[
                &ids, &subs, &events, &statuses, &attempts, &next, &errors, &created, &updated,
            ],
        )
        .await?;
        done.deliveries += page.len() as u64;
        done.requeued += requeued;
        progress(&format!("deliveries: {}/{total}", done.deliveries));
    }

    // Attempts, by id pages.
    let total: i64 = src.query_row("SELECT COUNT(*) FROM attempts", [], |r| r.get(0))?;
    let mut after = 0i64;
    loop {
        let mut st = src.prepare_cached(
            "SELECT id, delivery_id, attempt, at_ms, lane, outcome, status, latency_ms,
                 response_body, error
             FROM attempts WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        #[allow(clippy::type_complexity)]
        let page: Vec<(
            i64,
            i64,
            i32,
            i64,
            String,
            String,
            Option<i32>,
            Option<i64>,
            Option<String>,
            Option<String>,
        )> = st
            .query_map([after, CHUNK], |r| r.try_into())?
            .collect::<Result<_, _>>()?;
        let Some(last) = page.last() else { break };
        after = last.0;
        let ids: Vec<i64> = page.iter().map(|a| a.0).collect();
        let deliveries: Vec<i64> = page.iter().map(|a| a.1).collect();
        let n: Vec<i32> = page.iter().map(|a| a.2).collect();
        let at: Vec<i64> = page.iter().map(|a| a.3).collect();
        let lanes: Vec<&str> = page.iter().map(|a| a.4.as_str()).collect();
        let outcomes: Vec<&str> = page.iter().map(|a| a.5.as_str()).collect();
        let statuses: Vec<Option<i32>> = page.iter().map(|a| a.6).collect();
        let latencies: Vec<Option<i64>> = page.iter().map(|a| a.7).collect();
        let bodies: Vec<Option<&str>> = page.iter().map(|a| a.8.as_deref()).collect();
        let errors: Vec<Option<&str>> = page.iter().map(|a| a.9.as_deref()).collect();
        tx.execute(
            "INSERT INTO attempts (id, delivery_id, attempt, at_ms, lane, outcome, status,
                 latency_ms, response_body, error)
             SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::bigint[], $5::text[],
                                  $6::text[], $7::int[], $8::bigint[], $9::text[], $10::text[])",
            &[
                &ids,
                &deliveries,
                &n,
                &at,
                &lanes,
                &outcomes,
                &statuses,
                &latencies,
                &bodies,
                &errors,
            ],
        )
        .await?;
        done.attempts += page.len() as u64;
        progress(&format!("attempts: {}/{total}", done.attempts));
    }

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
