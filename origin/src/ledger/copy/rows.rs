//! `fanout ledger copy`'s tables, each read from the SQLite snapshot and written into the
//! PostgreSQL copy's transaction: subscribers and their secrets at once (few), events,
//! deliveries and attempts by pages of ids.

use deadpool_postgres::Transaction;
use rusqlite::Connection;

use crate::ledger::error::LedgerError;

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

/// The subscribers, removed ones too (for their history).
pub(super) async fn copy_subscribers(
    src: &Connection,
    tx: &Transaction<'_>,
    version: i64,
    done: &mut Copied,
) -> Result<(), LedgerError> {
    // Before schema 6 who disabled a subscriber is told by the reason the API wrote, as
    // that migration does.
    let by_operator = if version >= 6 {
        "disabled_by_operator"
    } else {
        "COALESCE(disabled_ms IS NOT NULL AND disabled_reason = 'disabled by an operator', 0)"
    };
    // A ledger from before sequence numbers and thin payloads: every subscriber full.
    let payload = if has_column(src, "subscribers", "payload")? {
        "payload"
    } else {
        "'full'"
    };
    // A ledger from before Ed25519 signatures: every subscriber signs with HMAC.
    let signature = if has_column(src, "subscribers", "signature")? {
        "signature"
    } else {
        "'hmac'"
    };
    let mut st = src.prepare(&format!(
        "SELECT id, url, event_types, rate_per_sec, burst, max_in_flight, timeout_ms, lane,
             legacy_signature, limiter, created_ms, updated_ms, deleted_ms, disabled_ms,
             disabled_reason, failing_since_ms, dead_alerted_ms, {by_operator}, {payload},
             {signature}
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
                r.get::<_, String>(18)?,
                r.get::<_, String>(19)?,
            ),
        ))
    })?;
    let insert = tx
        .prepare(
            "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                 timeout_ms, lane, legacy_signature, limiter, created_ms, updated_ms,
                 deleted_ms, disabled_ms, disabled_reason, failing_since_ms, dead_alerted_ms,
                 disabled_by_operator, payload, signature)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18, $19, $20)",
        )
        .await?;
    for row in rows {
        let (id, url, types, rate, burst, mif, timeout, lane, legacy, limiter, t) = row?;
        tx.execute(
            &insert,
            &[
                &id, &url, &types, &rate, &burst, &mif, &timeout, &lane, &legacy, &limiter, &t.0,
                &t.1, &t.2, &t.3, &t.4, &t.5, &t.6, &t.7, &t.8, &t.9,
            ],
        )
        .await?;
        done.subscribers += 1;
    }
    Ok(())
}

/// Which subscribers' webhooks carry `traceparent` (after `copy_subscribers`; a ledger from
/// before OpenTelemetry has none).
pub(super) async fn copy_propagate_trace(
    src: &Connection,
    tx: &Transaction<'_>,
) -> Result<(), LedgerError> {
    if !has_column(src, "subscribers", "propagate_trace")? {
        return Ok(());
    }
    let ids: Vec<String> = src
        .prepare("SELECT id FROM subscribers WHERE propagate_trace")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    tx.execute(
        "UPDATE subscribers SET propagate_trace = TRUE WHERE id = ANY($1)",
        &[&ids],
    )
    .await?;
    Ok(())
}

/// Each subscriber's `batch` settings (after `copy_subscribers`; a ledger from before batched
/// webhooks has none).
pub(super) async fn copy_batch(src: &Connection, tx: &Transaction<'_>) -> Result<(), LedgerError> {
    if !has_column(src, "subscribers", "batch")? {
        return Ok(());
    }
    let rows: Vec<(String, String)> = src
        .prepare("SELECT id, batch FROM subscribers WHERE batch IS NOT NULL")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let (ids, batches): (Vec<String>, Vec<String>) = rows.into_iter().unzip();
    tx.execute(
        "UPDATE subscribers s SET batch = u.b FROM unnest($1::text[], $2::text[]) AS u(id, b)
         WHERE s.id = u.id",
        &[&ids, &batches],
    )
    .await?;
    Ok(())
}

/// The subscribers' secrets, with their Ed25519 signing keys.
pub(super) async fn copy_secrets(
    src: &Connection,
    tx: &Transaction<'_>,
    done: &mut Copied,
) -> Result<(), LedgerError> {
    // A ledger from before Ed25519 signatures has no signing keys.
    let signing_key = if has_column(src, "subscriber_secrets", "signing_key")? {
        "signing_key"
    } else {
        "NULL"
    };
    let mut st = src.prepare(&format!(
        "SELECT subscriber_id, secret, created_ms, expires_ms, {signing_key}
         FROM subscriber_secrets ORDER BY rowid"
    ))?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, Option<i64>>(3)?,
            r.get::<_, Option<String>>(4)?,
        ))
    })?;
    for row in rows {
        let (sub, secret, created, expires, key) = row?;
        tx.execute(
            "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms, expires_ms,
                 signing_key)
             VALUES ($1, $2, $3, $4, $5)",
            &[&sub, &secret, &created, &expires, &key],
        )
        .await?;
        done.secrets += 1;
    }
    Ok(())
}

/// The events, by rowid pages.
pub(super) async fn copy_events(
    src: &Connection,
    tx: &Transaction<'_>,
    done: &mut Copied,
    progress: &mut impl FnMut(&str),
) -> Result<(), LedgerError> {
    let total: i64 = src.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
    // A ledger from before OpenTelemetry: no event carries a trace.
    let traceparent = if has_column(src, "events", "traceparent")? {
        "traceparent"
    } else {
        "NULL"
    };
    let mut after = 0i64;
    loop {
        let mut st = src.prepare_cached(&format!(
            "SELECT rowid, id, type, body, received_ms, {traceparent} FROM events
             WHERE rowid > ?1 ORDER BY rowid LIMIT ?2"
        ))?;
        let page: Vec<(i64, String, String, String, i64, Option<String>)> = st
            .query_map([after, CHUNK], |r| r.try_into())?
            .collect::<Result<_, _>>()?;
        let Some(last) = page.last() else { break };
        after = last.0;
        let ids: Vec<&str> = page.iter().map(|e| e.1.as_str()).collect();
        let types: Vec<&str> = page.iter().map(|e| e.2.as_str()).collect();
        let bodies: Vec<&str> = page.iter().map(|e| e.3.as_str()).collect();
        let at: Vec<i64> = page.iter().map(|e| e.4).collect();
        let traces: Vec<Option<&str>> = page.iter().map(|e| e.5.as_deref()).collect();
        tx.execute(
            "INSERT INTO events (id, type, body, received_ms, traceparent)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])",
            &[&ids, &types, &bodies, &at, &traces],
        )
        .await?;
        done.events += page.len() as u64;
        progress(&format!("events: {}/{total}", done.events));
    }

    Ok(())
}

/// The deliveries, by id pages; those in flight come over pending, due now.
pub(super) async fn copy_deliveries(
    src: &Connection,
    tx: &Transaction<'_>,
    now_ms: i64,
    done: &mut Copied,
    progress: &mut impl FnMut(&str),
) -> Result<(), LedgerError> {
    let total: i64 = src.query_row("SELECT COUNT(*) FROM deliveries", [], |r| r.get(0))?;
    // A ledger from before sequence numbers has none: they are numbered below, as the
    // migration that added them does.
    let numbered = has_column(src, "deliveries", "sequence")?;
    let sequence = if numbered { "sequence" } else { "0" };
    let mut after = 0i64;
    loop {
        let mut st = src.prepare_cached(&format!(
            "SELECT id, subscriber_id, event_id, status, attempts, next_attempt_ms, last_error,
                 created_ms, updated_ms, {sequence}
             FROM deliveries WHERE id > ?1 ORDER BY id LIMIT ?2"
        ))?;
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
        let sequences: Vec<i64> = page.iter().map(|d| d.9).collect();
        tx.execute(
            "INSERT INTO deliveries (id, subscriber_id, event_id, status, attempts,
                 next_attempt_ms, last_error, created_ms, updated_ms, sequence)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[],
                                  $6::bigint[], $7::text[], $8::bigint[], $9::bigint[],
                                  $10::bigint[])",
            &[
                &ids, &subs, &events, &statuses, &attempts, &next, &errors, &created, &updated,
                &sequences,
            ],
        )
        .await?;
        done.deliveries += page.len() as u64;
        done.requeued += requeued;
        progress(&format!("deliveries: {}/{total}", done.deliveries));
    }

    Ok(())
}

/// Each subscriber's sequence counter: the source's (retention may have removed deliveries
/// whose numbers it counts), or, from a ledger from before sequence numbers, its deliveries
/// numbered per subscriber in id order and the counters seeded from them.
pub(super) async fn copy_sequences(
    src: &Connection,
    tx: &Transaction<'_>,
) -> Result<(), LedgerError> {
    let has_table: bool = src.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sequences')",
        [],
        |r| r.get(0),
    )?;
    if !has_table || !has_column(src, "deliveries", "sequence")? {
        tx.batch_execute(
            "UPDATE deliveries d SET sequence = n.k
                 FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY subscriber_id ORDER BY id) AS k
                       FROM deliveries) n
                 WHERE d.id = n.id;
             INSERT INTO sequences (subscriber_id, last)
                 SELECT subscriber_id, MAX(sequence) FROM deliveries GROUP BY subscriber_id;",
        )
        .await?;
        return Ok(());
    }
    let mut st = src.prepare("SELECT subscriber_id, last FROM sequences")?;
    let rows: Vec<(String, i64)> = st
        .query_map([], |r| r.try_into())?
        .collect::<Result<_, _>>()?;
    let subs: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let lasts: Vec<i64> = rows.iter().map(|r| r.1).collect();
    tx.execute(
        "INSERT INTO sequences (subscriber_id, last)
         SELECT * FROM unnest($1::text[], $2::bigint[])",
        &[&subs, &lasts],
    )
    .await?;
    Ok(())
}

/// Whether the source's `table` has `column` (it may be from an older schema).
fn has_column(src: &Connection, table: &str, column: &str) -> Result<bool, LedgerError> {
    Ok(src.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
        [table, column],
        |r| r.get(0),
    )?)
}

/// The attempts, by id pages.
pub(super) async fn copy_attempts(
    src: &Connection,
    tx: &Transaction<'_>,
    done: &mut Copied,
    progress: &mut impl FnMut(&str),
) -> Result<(), LedgerError> {
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

    Ok(())
}

/// The subscribers' content filters, the operator's `filter` and the `customer_filter` (a
/// ledger from before either existed has none of it).
pub(super) async fn copy_filters(
    src: &Connection,
    tx: &Transaction<'_>,
) -> Result<(), LedgerError> {
    for column in ["filter", "customer_filter"] {
        if !has_column(src, "subscribers", column)? {
            continue;
        }
        let mut st = src.prepare(&format!(
            "SELECT id, {column} FROM subscribers WHERE {column} IS NOT NULL"
        ))?;
        let filtered: Vec<(String, String)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let (subs, filters): (Vec<String>, Vec<String>) = filtered.into_iter().unzip();
        tx.execute(
            &format!(
                "UPDATE subscribers s SET {column} = u.f
                 FROM unnest($1::text[], $2::text[]) AS u(id, f) WHERE s.id = u.id"
            ),
            &[&subs, &filters],
        )
        .await?;
    }
    Ok(())
}

/// Ordered delivery (`crate::ordering`; a ledger from before it has none): each subscriber's
/// ordering, each ordered delivery's key and previous sequence (held ones come over held:
/// their due time is copied as it is), and each key's last sequence.
pub(super) async fn copy_ordering(
    src: &Connection,
    tx: &Transaction<'_>,
) -> Result<(), LedgerError> {
    if !has_column(src, "deliveries", "ordering_key")? {
        return Ok(());
    }
    let mut st =
        src.prepare("SELECT id, ordering, ordering_key FROM subscribers WHERE ordering <> 'none'")?;
    let subs: Vec<(String, String, Option<String>)> = st
        .query_map([], |r| r.try_into())?
        .collect::<Result<_, _>>()?;
    let ids: Vec<&str> = subs.iter().map(|s| s.0.as_str()).collect();
    let orderings: Vec<&str> = subs.iter().map(|s| s.1.as_str()).collect();
    let pointers: Vec<Option<&str>> = subs.iter().map(|s| s.2.as_deref()).collect();
    tx.execute(
        "UPDATE subscribers s SET ordering = u.o, ordering_key = u.k
         FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, o, k) WHERE s.id = u.id",
        &[&ids, &orderings, &pointers],
    )
    .await?;
    let mut after = 0i64;
    loop {
        let mut st = src.prepare_cached(
            "SELECT id, ordering_key, previous_sequence FROM deliveries
             WHERE id > ?1 AND ordering_key IS NOT NULL ORDER BY id LIMIT ?2",
        )?;
        let page: Vec<(i64, String, Option<i64>)> = st
            .query_map([after, CHUNK], |r| r.try_into())?
            .collect::<Result<_, _>>()?;
        let Some(last) = page.last() else { break };
        after = last.0;
        let ids: Vec<i64> = page.iter().map(|d| d.0).collect();
        let keys: Vec<&str> = page.iter().map(|d| d.1.as_str()).collect();
        let previous: Vec<Option<i64>> = page.iter().map(|d| d.2).collect();
        tx.execute(
            "UPDATE deliveries d SET ordering_key = u.k, previous_sequence = u.p
             FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS u(id, k, p) WHERE d.id = u.id",
            &[&ids, &keys, &previous],
        )
        .await?;
    }
    let mut st = src.prepare("SELECT subscriber_id, key, last FROM ordering_keys")?;
    let rows: Vec<(String, String, i64)> = st
        .query_map([], |r| r.try_into())?
        .collect::<Result<_, _>>()?;
    let subs: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let keys: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    let lasts: Vec<i64> = rows.iter().map(|r| r.2).collect();
    tx.execute(
        "INSERT INTO ordering_keys (subscriber_id, key, last)
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
        &[&subs, &keys, &lasts],
    )
    .await?;
    Ok(())
}
