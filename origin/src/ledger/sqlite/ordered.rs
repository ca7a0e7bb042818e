//! Ordered delivery on SQLite (`crate::ordering`): an ingest's ordered deliveries linked to
//! their keys (previous sequence, held or not), a key's next held delivery released when its
//! head ends, and replayed deliveries rejoining their keys. Functions over a connection inside
//! the caller's transaction; each key costs an index probe or two (`deliveries_ordered`), so
//! unordered work pays nothing.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{params, Connection};

use crate::ledger::error::LedgerError;
use crate::ordering::{chain, HELD_MS};

/// An ordered delivery's place in its key: its previous sequence and whether it is held.
pub use crate::ordering::Link;

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
        if let std::collections::btree_map::Entry::Vacant(slot) = stored.entry((*s, *k)) {
            slot.insert(read.query_row(params![s, k], |r| Ok((r.get(0)?, r.get(1)?)))?);
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
                       AND status = 'pending'
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
        .query_map(params![json_ids(rowids), HELD_MS], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    release(c, &keys, now_ms)
}

/// Row ids as a JSON array, for `id IN (SELECT value FROM json_each(?))`.
fn json_ids(rowids: &[i64]) -> String {
    let ids: Vec<String> = rowids.iter().map(i64::to_string).collect();
    format!("[{}]", ids.join(","))
}
