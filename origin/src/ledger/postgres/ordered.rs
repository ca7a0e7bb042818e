//! Ordered delivery on PostgreSQL (`crate::ordering`), as SQLite's `ordered.rs`, for several
//! daemons: every transaction that decides a key's head — an ingest linking new deliveries,
//! a result ending a head, a replay rejoining — first locks the key's row in `ordering_keys`
//! (in key order, so two never wait on each other in a circle) and only then, in a statement
//! of its own (a snapshot taken after the lock), looks at the key's deliveries. So a key never
//! has two heads: two daemons can never both lease deliveries of one key, because the claim
//! (unchanged) only reaches deliveries that are not held.

use std::collections::BTreeMap;

use deadpool_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::ledger::PgLedger;
use super::listen::{notify_payload, DUE_CHANNEL};
use crate::ledger::deliveries::{HeldKey, HELD_COUNT_MAX};
use crate::ledger::LedgerError;
use crate::model::delivery_public_id;
use crate::ordering::{chain, header_value, HELD_MS};

/// Create the rows of keys `($1[k], $2[k])` that have none yet, in key order.
const KEYS_CREATE: &str = "INSERT INTO ordering_keys (subscriber_id, key, last)
     SELECT s, k, 0 FROM unnest($1::text[], $2::text[]) AS u(s, k) ORDER BY s, k
     ON CONFLICT (subscriber_id, key) DO NOTHING";

/// Lock the rows of keys `($1[k], $2[k])` in key order; their last sequence (0: none).
const KEYS_LOCK: &str = "SELECT subscriber_id, key, last FROM ordering_keys
     WHERE (subscriber_id, key) IN (SELECT s, k FROM unnest($1::text[], $2::text[]) AS u(s, k))
     ORDER BY subscriber_id, key FOR UPDATE";

/// Whether each key has a delivery outstanding (pending, held or not, or in flight).
const KEYS_BUSY: &str = "SELECT u.s, u.k, EXISTS (
         SELECT 1 FROM deliveries d
         WHERE d.subscriber_id = u.s AND d.ordering_key = u.k
           AND d.ordering_key IS NOT NULL AND d.status IN ('pending', 'in_flight'))
     FROM unnest($1::text[], $2::text[]) AS u(s, k)";

/// This ingest's deliveries `($1[k], $2[k])` (subscriber, event): id and sequence.
const NEW_ROWS: &str = "SELECT d.id, d.sequence FROM unnest($1::text[], $2::text[])
         WITH ORDINALITY AS u(s, e, n)
     JOIN deliveries d ON d.event_id = u.e AND d.subscriber_id = u.s ORDER BY u.n";

/// Each delivery's key, previous sequence and held-or-due.
const LINK_ROWS: &str = "UPDATE deliveries d SET ordering_key = u.k, previous_sequence = u.p,
         next_attempt_ms = CASE WHEN u.h THEN 9223372036854775807 ELSE d.next_attempt_ms END
     FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bool[]) AS u(id, k, p, h)
     WHERE d.id = u.id";

/// Each key's new last sequence.
const KEYS_LAST: &str = "UPDATE ordering_keys o SET last = u.l
     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(s, k, l)
     WHERE o.subscriber_id = u.s AND o.key = u.k";

/// Of the (locked) keys, each with no head gets its lowest-numbered held delivery due now
/// (`$3`); returns their subscribers.
const RELEASE: &str = "UPDATE deliveries d SET next_attempt_ms = $3, updated_ms = $3
     FROM (SELECT (SELECT h.id FROM deliveries h
                   WHERE h.subscriber_id = u.s AND h.ordering_key = u.k
                     AND h.ordering_key IS NOT NULL AND h.status IN ('pending', 'in_flight')
                     AND h.status = 'pending' AND h.next_attempt_ms = 9223372036854775807
                   ORDER BY h.sequence LIMIT 1) AS id
           FROM unnest($1::text[], $2::text[]) AS u(s, k)
           WHERE NOT EXISTS (
               SELECT 1 FROM deliveries o
               WHERE o.subscriber_id = u.s AND o.ordering_key = u.k
                 AND o.ordering_key IS NOT NULL AND o.status IN ('pending', 'in_flight')
                 AND o.next_attempt_ms < 9223372036854775807)) n
     WHERE d.id = n.id
     RETURNING d.subscriber_id";

/// Link an ingest's ordered deliveries — `(subscriber, event, key)` in fan-out order, already
/// inserted (due now, without a key) by this transaction — to their keys: each one's key,
/// previous sequence and held-or-due, each key's last sequence. Two round trips.
pub(super) async fn link(
    tx: &deadpool_postgres::ClientWrapper,
    ordered: &[(&str, &str, String)],
) -> Result<(), LedgerError> {
    if ordered.is_empty() {
        return Ok(());
    }
    let subs: Vec<&str> = ordered.iter().map(|(s, _, _)| *s).collect();
    let events: Vec<&str> = ordered.iter().map(|(_, e, _)| *e).collect();
    let keys: Vec<&str> = ordered.iter().map(|(_, _, k)| k.as_str()).collect();
    let (new_rows, create, lock, busy) = tokio::try_join!(
        tx.prepare_cached(NEW_ROWS),
        tx.prepare_cached(KEYS_CREATE),
        tx.prepare_cached(KEYS_LOCK),
        tx.prepare_cached(KEYS_BUSY),
    )?;
    let pairs: &[&(dyn ToSql + Sync)] = &[&subs, &keys];
    let by_event: &[&(dyn ToSql + Sync)] = &[&subs, &events];
    // In this order on the server: the keys' rows created and locked before their deliveries
    // are looked at (the new ones have no key yet, so they are not counted).
    let (rows, _, locked, busy) = tokio::try_join!(
        tx.query(&new_rows, by_event),
        tx.execute(&create, pairs),
        tx.query(&lock, pairs),
        tx.query(&busy, pairs),
    )?;
    if rows.len() != ordered.len() {
        return Err(LedgerError::Invalid(format!(
            "{} of {} ordered deliveries found after their insert",
            rows.len(),
            ordered.len()
        )));
    }
    let mut stored: BTreeMap<(&str, &str), (Option<i64>, bool)> = BTreeMap::new();
    for r in &locked {
        let last: i64 = r.try_get(2)?;
        let (s, k): (&str, &str) = (r.try_get(0)?, r.try_get(1)?);
        stored.insert((s, k), ((last > 0).then_some(last), false));
    }
    for r in &busy {
        let (s, k): (&str, &str) = (r.try_get(0)?, r.try_get(1)?);
        if r.try_get::<_, bool>(2)? {
            stored.entry((s, k)).or_insert((None, false)).1 = true;
        }
    }
    let mut ids = Vec::with_capacity(rows.len());
    let mut keyed = Vec::with_capacity(rows.len());
    for (r, (s, _, k)) in rows.iter().zip(ordered) {
        ids.push(r.try_get::<_, i64>(0)?);
        keyed.push(((*s, k.as_str()), r.try_get::<_, i64>(1)?));
    }
    let (links, lasts) = chain(&keyed, &stored);
    let previous: Vec<Option<i64>> = links.iter().map(|(p, _)| *p).collect();
    let held: Vec<bool> = links.iter().map(|(_, h)| *h).collect();
    let last_subs: Vec<&str> = lasts.keys().map(|(s, _)| *s).collect();
    let last_keys: Vec<&str> = lasts.keys().map(|(_, k)| *k).collect();
    let last_n: Vec<i64> = lasts.values().copied().collect();
    let (set_rows, set_last) =
        tokio::try_join!(tx.prepare_cached(LINK_ROWS), tx.prepare_cached(KEYS_LAST))?;
    let row_args: &[&(dyn ToSql + Sync)] = &[&ids, &keys, &previous, &held];
    let last_args: &[&(dyn ToSql + Sync)] = &[&last_subs, &last_keys, &last_n];
    tokio::try_join!(
        tx.execute(&set_rows, row_args),
        tx.execute(&set_last, last_args),
    )?;
    Ok(())
}

/// Keys (`(subscriber, key)`) whose head may have ended: locked, then each with no head gets
/// its next held delivery due now, announced to every daemon. Returns the subscribers that
/// got one.
pub(super) async fn release(
    tx: &Transaction<'_>,
    keys: &[(String, String)],
    now_ms: i64,
) -> Result<Vec<String>, LedgerError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    let subs: Vec<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let (lock, release) =
        tokio::try_join!(tx.prepare_cached(KEYS_LOCK), tx.prepare_cached(RELEASE))?;
    let pairs: &[&(dyn ToSql + Sync)] = &[&subs, &names];
    let release_args: &[&(dyn ToSql + Sync)] = &[&subs, &names, &now_ms];
    let (_, rows) = tokio::try_join!(tx.query(&lock, pairs), tx.query(&release, release_args))?;
    let mut woken: Vec<String> = rows
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    woken.sort();
    woken.dedup();
    if !woken.is_empty() {
        tx.execute(
            "SELECT pg_notify($1, $2)",
            &[&DUE_CHANNEL, &notify_payload(&woken)],
        )
        .await?;
    }
    Ok(woken)
}

/// Replayed deliveries (just put back to pending by the caller's transaction, which holds
/// their locks) that belong to a key rejoin it: held, then released as [`release`] says.
/// Returns the subscribers of the keys released. The rows are pending already, so the
/// statement names no status: `status = 'pending'` would let the planner read the whole
/// pending list index (`deliveries_pending_by_sub`) instead of these ids by key.
pub(super) async fn rejoin(
    tx: &Transaction<'_>,
    rowids: &[i64],
    now_ms: i64,
) -> Result<Vec<String>, LedgerError> {
    if rowids.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<(String, String)> = tx
        .query(
            "UPDATE deliveries SET next_attempt_ms = $2
             WHERE id = ANY($1) AND ordering_key IS NOT NULL
             RETURNING subscriber_id, ordering_key",
            &[&rowids, &HELD_MS],
        )
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, LedgerError>>()?;
    release(tx, &keys, now_ms).await
}

/// Of subscriber `$1`'s keys in key order, those with a held delivery, with their head and
/// next held delivery; at most `$2` (as SQLite's `ordered::held_keys`).
const HELD_KEYS: &str = "SELECT k.key,
         (SELECT h.id FROM deliveries h
          WHERE h.subscriber_id = k.subscriber_id AND h.ordering_key = k.key
            AND h.next_attempt_ms < 9223372036854775807
            AND h.ordering_key IS NOT NULL AND h.status IN ('pending', 'in_flight')
          LIMIT 1),
         n.id, n.updated_ms,
         (SELECT COUNT(*) FROM (
              SELECT 1 FROM deliveries h
              WHERE h.subscriber_id = k.subscriber_id AND h.ordering_key = k.key
                AND h.next_attempt_ms = 9223372036854775807
                AND h.ordering_key IS NOT NULL AND h.status IN ('pending', 'in_flight')
              LIMIT $3) c)
     FROM ordering_keys k
     JOIN deliveries n ON n.id = (
         SELECT h.id FROM deliveries h
         WHERE h.subscriber_id = k.subscriber_id AND h.ordering_key = k.key
           AND h.next_attempt_ms = 9223372036854775807
           AND h.ordering_key IS NOT NULL AND h.status IN ('pending', 'in_flight')
         ORDER BY h.sequence LIMIT 1)
     WHERE k.subscriber_id = $1 ORDER BY k.key LIMIT $2";

impl PgLedger {
    /// `Deliveries::held_keys` (the subscriber's visibility checked by the caller).
    pub(super) async fn held_keys(
        &self,
        sub: &str,
        limit: usize,
    ) -> Result<Vec<HeldKey>, LedgerError> {
        let rows = {
            let c = self.client().await?;
            c.query(HELD_KEYS, &[&sub, &(limit as i64), &HELD_COUNT_MAX])
                .await?
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let key: String = r.try_get(0)?;
            let head: Option<i64> = r.try_get(1)?;
            out.push(HeldKey {
                ordering_key: header_value(&key),
                head: match head {
                    Some(h) => Some(self.get_delivery(h).await?),
                    None => None,
                },
                held: r.try_get::<_, i64>(4)?.max(0) as u64,
                held_since_ms: r.try_get(3)?,
                next: delivery_public_id(r.try_get(2)?),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    /// `ordering::HELD_MS` as SQL text, as the statements (here and in `leases.rs`) write it.
    const HELD_SQL: &str = "9223372036854775807";

    #[test]
    fn held_sql_is_held_ms() {
        assert_eq!(HELD_SQL, crate::ordering::HELD_MS.to_string());
        for sql in [
            super::LINK_ROWS,
            super::RELEASE,
            super::super::leases::CLAIM_NEXT_DUE,
        ] {
            assert!(sql.contains(HELD_SQL));
        }
    }
}
