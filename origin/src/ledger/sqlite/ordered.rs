//! Ordered delivery on SQLite (`crate::ordering`): an ingest's ordered deliveries linked to
//! their keys (previous sequence, held or not), a key's next held delivery released when its
//! head ends, and replayed deliveries rejoining their keys. Functions over a connection inside
//! the caller's transaction; each key costs an index probe or two (`deliveries_ordered`), so
//! unordered work pays nothing.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, Connection};

use super::deliveries::get_delivery;
use super::leases::id_list;
use crate::ledger::deliveries::{HeldKey, HELD_COUNT_MAX};
use crate::ledger::error::LedgerError;
use crate::model::delivery_public_id;
use crate::ordering::{chain, header_value, HELD_MS};

/// An ordered delivery's place in its key: its previous sequence and whether it is held.
pub type Link = (Option<i64>, bool);

/// Link an ingest's ordered deliveries, `(subscriber, key, sequence)` in fan-out order, before
/// any of them is inserted, and move each key's last sequence.
pub fn link(c: &Connection, ordered: &[(&str, &str, i64)]) -> Result<Vec<Link>, LedgerError> {
    let mut read = c.prepare_cached(
        "SELECT (SELECT last FROM ordering_keys WHERE subscriber_id = ?1 AND key = ?2),
                EXISTS (SELECT 1 FROM deliveries
                        WHERE subscriber_id = ?1 AND ordering_key = ?2
                          AND ordering_key IS NOT NULL AND status IN ('pending', 'in_flight'))",
    )?;
    let mut stored: BTreeMap<(&str, &str), (Option<i64>, bool)> = BTreeMap::new();
    for (s, k, _) in ordered {
        if !stored.contains_key(&(*s, *k)) {
            let state = read.query_row(params![s, k], |r| Ok((r.get(0)?, r.get(1)?)))?;
            stored.insert((*s, *k), state);
        }
    }
    let keyed: Vec<((&str, &str), i64)> = ordered.iter().map(|(s, k, n)| ((*s, *k), *n)).collect();
    let (links, lasts) = chain(&keyed, &stored);
    let mut write = c.prepare_cached(
        "INSERT INTO ordering_keys (subscriber_id, key, last) VALUES (?1, ?2, ?3)
         ON CONFLICT (subscriber_id, key) DO UPDATE SET last = excluded.last",
    )?;
    for ((s, k), last) in lasts {
        write.execute(params![s, k, last])?;
    }
    Ok(links)
}

/// One event's ordered deliveries: `(subscriber, sequence, key, link)`. Like the unordered
/// insert, every one must be created (its number would be lost otherwise).
pub fn insert(
    c: &Connection,
    event_id: &str,
    rows: &[(&str, i64, &str, Link)],
    now_ms: i64,
) -> Result<u32, LedgerError> {
    let mut st = c.prepare_cached(
        "INSERT OR IGNORE INTO deliveries (subscriber_id, sequence, event_id, status,
             next_attempt_ms, created_ms, updated_ms, ordering_key, previous_sequence)
         VALUES (?1, ?2, ?3, 'pending', ?4, ?5, ?5, ?6, ?7)",
    )?;
    for (sub, seq, key, (previous, held)) in rows {
        let due = if *held { HELD_MS } else { now_ms };
        if st.execute(params![sub, seq, event_id, due, now_ms, key, previous])? != 1 {
            return Err(LedgerError::Invalid(format!(
                "event {event_id}: an ordered delivery was not created; sequence numbers must not skip"
            )));
        }
    }
    Ok(rows.len() as u32)
}

/// Each key (`(subscriber, key)`) that has no head any more gets its lowest-numbered held
/// delivery due now. Returns the subscribers that got one (the dispatcher is woken for them).
pub fn release(
    c: &Connection,
    keys: &[(String, String)],
    now_ms: i64,
) -> Result<Vec<String>, LedgerError> {
    let mut head = c.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM deliveries
                        WHERE subscriber_id = ?1 AND ordering_key = ?2 AND next_attempt_ms < ?3
                          AND ordering_key IS NOT NULL AND status IN ('pending', 'in_flight'))",
    )?;
    let mut promote = c.prepare_cached(
        "UPDATE deliveries SET next_attempt_ms = ?4, updated_ms = ?4
         WHERE id = (SELECT id FROM deliveries
                     WHERE subscriber_id = ?1 AND ordering_key = ?2 AND next_attempt_ms = ?3
                       AND ordering_key IS NOT NULL AND status IN ('pending', 'in_flight')
                     ORDER BY sequence LIMIT 1)",
    )?;
    let mut woken = BTreeSet::new();
    let distinct: BTreeSet<&(String, String)> = keys.iter().collect();
    for (s, k) in distinct {
        let busy: bool = head.query_row(params![s, k, HELD_MS], |r| r.get(0))?;
        if !busy && promote.execute(params![s, k, HELD_MS, now_ms])? > 0 {
            woken.insert(s.clone());
        }
    }
    Ok(woken.into_iter().collect())
}

/// Replayed deliveries (just put back to pending, due now) that belong to a key rejoin it:
/// held, then the key's lowest-numbered held delivery goes if the key has no head. Returns the
/// subscribers of the keys released.
pub fn rejoin(c: &Connection, rowids: &[i64], now_ms: i64) -> Result<Vec<String>, LedgerError> {
    if rowids.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<(String, String)> = c
        .prepare_cached(
            "UPDATE deliveries SET next_attempt_ms = ?2
             WHERE id IN (SELECT value FROM json_each(?1))
               AND ordering_key IS NOT NULL AND status = 'pending'
             RETURNING subscriber_id, ordering_key",
        )?
        .query_map(params![id_list(rowids.iter().copied()), HELD_MS], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    release(c, &keys, now_ms)
}

/// The statement behind [`held_keys`]: of subscriber `?1`'s keys in key order, those with a
/// held delivery (due at `?2`), with their head and next held delivery; at most `?3`.
const HELD_KEYS: &str = "SELECT k.key,
         (SELECT h.id FROM deliveries h
          WHERE h.subscriber_id = k.subscriber_id AND h.ordering_key = k.key
            AND h.next_attempt_ms < ?2
            AND h.ordering_key IS NOT NULL AND h.status IN ('pending', 'in_flight')
          LIMIT 1),
         n.id, n.updated_ms
     FROM ordering_keys k
     JOIN deliveries n ON n.id = (
         SELECT h.id FROM deliveries h
         WHERE h.subscriber_id = k.subscriber_id AND h.ordering_key = k.key
           AND h.next_attempt_ms = ?2
           AND h.ordering_key IS NOT NULL AND h.status IN ('pending', 'in_flight')
         ORDER BY h.sequence LIMIT 1)
     WHERE k.subscriber_id = ?1 ORDER BY k.key LIMIT ?3";

/// How many deliveries of key (`?1`, `?2`) are held (due at `?3`), up to `?4`.
const HELD_COUNT: &str = "SELECT COUNT(*) FROM (
         SELECT 1 FROM deliveries
         WHERE subscriber_id = ?1 AND ordering_key = ?2 AND next_attempt_ms = ?3
           AND ordering_key IS NOT NULL AND status IN ('pending', 'in_flight')
         LIMIT ?4)";

/// `Deliveries::held_keys` on one connection (the subscriber's visibility checked by the
/// caller).
pub fn held_keys(c: &Connection, sub: &str, limit: usize) -> Result<Vec<HeldKey>, LedgerError> {
    let rows: Vec<(String, Option<i64>, i64, i64)> = c
        .prepare_cached(HELD_KEYS)?
        .query_map(params![sub, HELD_MS, limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut count = c.prepare_cached(HELD_COUNT)?;
    let mut out = Vec::with_capacity(rows.len());
    for (key, head, next, since) in rows {
        let held: i64 =
            count.query_row(params![sub, key, HELD_MS, HELD_COUNT_MAX], |r| r.get(0))?;
        out.push(HeldKey {
            ordering_key: header_value(&key),
            head: head.map(|h| get_delivery(c, h)).transpose()?,
            held: held.max(0) as u64,
            held_since_ms: since,
            next: delivery_public_id(next),
        });
    }
    Ok(out)
}
