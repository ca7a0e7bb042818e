//! The dispatcher's writes on SQLite: claims (leases), results applied, leases released, and
//! which subscribers have work due. Functions over a connection inside the caller's
//! transaction; `dispatch.rs` strings them into a turn.

use std::collections::HashMap;

use fanout_core::limiter::LimiterState;
use rusqlite::{params, Connection};

use super::ingest::{multi_row_sql, ROWS_PER_INSERT};
use super::limiters::store_limiters;
use super::ordered;
use crate::ledger::error::LedgerError;
use crate::ledger::rules::{ended_key, requests, run_tail, written};
use crate::model::{AttemptRecord, Claim, Claimed, Order, Outcome, Transition};
use crate::ordering::HELD_MS;

/// Lease up to `limit` due deliveries of each subscriber until `lease_until_ms`, oldest due
/// first, and store the limiter states that granted them.
#[cfg(test)]
pub fn claim(
    c: &Connection,
    wants: &[(String, usize)],
    limiters: &[(String, LimiterState)],
    now_ms: i64,
    lease_until_ms: i64,
) -> Result<Vec<Claim>, LedgerError> {
    claim_runs(c, wants, &HashMap::new(), limiters, now_ms, lease_until_ms)
}

/// [`claim`] where the subscribers of `runs` (`Turn::runs`, with their deliveries per request)
/// are claimed in runs: `limit / per` due heads, each leased with up to `per - 1` of its key's
/// held deliveries after it, in sequence order (`Claim::runs`).
pub fn claim_runs(
    c: &Connection,
    wants: &[(String, usize)],
    runs: &HashMap<&str, usize>,
    limiters: &[(String, LimiterState)],
    now_ms: i64,
    lease_until_ms: i64,
) -> Result<Vec<Claim>, LedgerError> {
    let mut select = c.prepare_cached(
        "SELECT d.id, d.event_id, e.type, e.body, d.attempts, d.sequence, e.received_ms,
             d.ordering_key, d.previous_sequence, e.traceparent
         FROM deliveries d JOIN events e ON e.id = d.event_id
         WHERE d.subscriber_id = ?1 AND d.status = 'pending' AND d.next_attempt_ms <= ?2
         ORDER BY d.next_attempt_ms, d.id LIMIT ?3",
    )?;
    // A head's run: its key's held deliveries, lowest number first (pending only; the
    // partial index `deliveries_ordered` is named by its own predicate, written out).
    let mut held = c.prepare_cached(
        "SELECT d.id, d.event_id, e.type, e.body, d.attempts, d.sequence, e.received_ms,
             d.ordering_key, d.previous_sequence, e.traceparent
         FROM deliveries d JOIN events e ON e.id = d.event_id
         WHERE d.subscriber_id = ?1 AND d.ordering_key = ?2 AND d.next_attempt_ms = ?3
           AND d.ordering_key IS NOT NULL AND d.status IN ('pending', 'in_flight')
           AND d.status = 'pending'
         ORDER BY d.sequence LIMIT ?4",
    )?;
    // One statement per subscriber for the whole claim: the ids as a JSON array.
    let mut lease = c.prepare_cached(
        "UPDATE deliveries SET status = 'in_flight', lease_expires_ms = ?2, updated_ms = ?3
         WHERE id IN (SELECT value FROM json_each(?1))",
    )?;
    let mut next = c.prepare_cached(
        "SELECT MIN(next_attempt_ms) FROM deliveries
         WHERE subscriber_id = ?1 AND status = 'pending' AND next_attempt_ms < ?2",
    )?;
    let mut out = Vec::with_capacity(wants.len());
    for (sub, limit) in wants {
        let per = runs.get(sub.as_str()).copied();
        let heads = per.map_or(*limit, |p| requests(*limit, p));
        let tail = per.map_or(0, run_tail);
        let mut claimed: Vec<Claimed> = if heads == 0 {
            Vec::new()
        } else {
            select
                .query_map(params![sub, now_ms, heads as i64], claimed_row)?
                .collect::<Result<_, _>>()?
        };
        let mut sizes = Vec::new();
        if tail > 0 {
            let mut with_runs = Vec::with_capacity(claimed.len() * (tail + 1));
            // A key's run is taken once, even if (against the rule) two of its heads were due.
            let mut keys = std::collections::HashSet::new();
            for head in claimed {
                let key = head.order.as_ref().map(|o| o.key.clone());
                with_runs.push(head);
                let mut n = 1;
                if let Some(key) = key.filter(|k| keys.insert(k.clone())) {
                    let run =
                        held.query_map(params![sub, key, HELD_MS, tail as i64], claimed_row)?;
                    for d in run {
                        with_runs.push(d?);
                        n += 1;
                    }
                }
                sizes.push(n);
            }
            claimed = with_runs;
        }
        if !claimed.is_empty() {
            let ids = id_list(claimed.iter().map(|d| d.rowid));
            lease.execute(params![ids, lease_until_ms, now_ms])?;
        }
        let next_due_ms: Option<i64> = next.query_row(params![sub, HELD_MS], |r| r.get(0))?;
        out.push(Claim {
            subscriber_id: sub.clone(),
            claimed,
            next_due_ms,
            // The dispatcher's own limiter granted these: it knows its waits.
            not_before_ms: None,
            runs: sizes,
        });
    }
    store_limiters(c, limiters)?;
    Ok(out)
}

/// A claimed delivery from a row of the claim's SELECTs.
fn claimed_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Claimed> {
    Ok(Claimed {
        rowid: r.get(0)?,
        event_id: r.get(1)?,
        event_type: r.get(2)?,
        body: r.get(3)?,
        attempt: r.get::<_, u32>(4)?.saturating_add(1),
        sequence: r.get::<_, i64>(5)?.max(0) as u64,
        received_ms: r.get(6)?,
        order: Order::of(r.get(7)?, r.get(8)?),
        traceparent: r.get(9)?,
    })
}

/// Row ids as a JSON array, for `id IN (SELECT value FROM json_each(?))`.
pub(super) fn id_list(ids: impl Iterator<Item = i64>) -> String {
    let mut s = String::from("[");
    for (k, id) in ids.enumerate() {
        if k > 0 {
            s.push(',');
        }
        s.push_str(&id.to_string());
    }
    s.push(']');
    s
}

/// Record a batch of outcomes (and the limiter states they produced) in one go. An outcome
/// applies only to a delivery still `in_flight` (its lease), and its attempt is recorded only
/// then: recording the same outcomes twice counts them once. An ordered delivery that ends
/// (`sent`, `dead`) releases its key's next held one (`ordered::release`): returns the
/// subscribers that got work due so.
pub fn apply(
    c: &Connection,
    outcomes: &[Outcome],
    limiters: &[(String, LimiterState)],
    now_ms: i64,
) -> Result<Vec<String>, LedgerError> {
    // What a result writes is `rules::written`'s; a run of sent results (by far the
    // commonest) is one statement.
    let mut write = c.prepare_cached(
        "UPDATE deliveries SET status = ?2, attempts = attempts + ?3,
             next_attempt_ms = COALESCE(?4, next_attempt_ms),
             last_error = CASE WHEN ?6 THEN last_error ELSE ?5 END,
             lease_expires_ms = NULL, updated_ms = ?7
         WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'in_flight'
         RETURNING id, subscriber_id, ordering_key",
    )?;
    // The outcomes that found their delivery in flight (the others were already recorded, or
    // the delivery was taken away: removed subscriber, expired lease).
    let mut applied = vec![false; outcomes.len()];
    // The keys of ordered deliveries that ended.
    let mut ended: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    while i < outcomes.len() {
        let w = written(&outcomes[i]);
        let run = match outcomes[i].transition {
            Transition::Sent => outcomes[i..]
                .iter()
                .take_while(|o| o.transition == Transition::Sent)
                .count(),
            _ => 1,
        };
        let ids = id_list(outcomes[i..i + run].iter().map(|o| o.rowid));
        let (error, keep) = w.last_error.columns();
        let args = params![
            ids,
            w.status.as_str(),
            w.spent,
            w.next_attempt_ms,
            error,
            keep,
            now_ms
        ];
        let mut hit = std::collections::HashSet::new();
        let rows = write.query_map(args, |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })?;
        for row in rows {
            let (id, sub, key) = row?;
            hit.insert(id);
            if let Some(key) = ended_key(Some(w.status), key) {
                ended.push((sub, key));
            }
        }
        for k in i..i + run {
            applied[k] = hit.contains(&outcomes[k].rowid);
        }
        i += run;
    }
    insert_attempts(c, outcomes, &applied)?;
    store_limiters(c, limiters)?;
    if ended.is_empty() {
        return Ok(Vec::new());
    }
    ordered::release(c, &ended, now_ms)
}

/// The attempts of the outcomes that were `applied`, in order, by chunks of rows.
fn insert_attempts(
    c: &Connection,
    outcomes: &[Outcome],
    applied: &[bool],
) -> Result<(), LedgerError> {
    let recorded: Vec<(i64, &AttemptRecord)> = outcomes
        .iter()
        .zip(applied)
        .filter(|(_, applied)| **applied)
        .filter_map(|(o, _)| o.attempt.as_ref().map(|a| (o.rowid, a)))
        .collect();
    for chunk in recorded.chunks(ROWS_PER_INSERT) {
        let sql = multi_row_sql(
            "INSERT INTO attempts (delivery_id, attempt, at_ms, lane, outcome, status, latency_ms,
                 response_body, error)",
            chunk.len(),
            9,
            "",
            "",
        );
        let mut st = c.prepare_cached(&sql)?;
        let latencies: Vec<Option<i64>> = chunk
            .iter()
            .map(|(_, a)| a.latency_ms.map(|l| l as i64))
            .collect();
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(chunk.len() * 9);
        for ((rowid, a), latency) in chunk.iter().zip(&latencies) {
            args.push(rowid);
            args.push(&a.attempt);
            args.push(&a.at_ms);
            args.push(&a.lane);
            args.push(&a.outcome);
            args.push(&a.status);
            args.push(latency);
            args.push(&a.response_body);
            args.push(&a.error);
        }
        st.execute(args.as_slice())?;
    }
    Ok(())
}

/// At start-up every lease belongs to a previous process (one daemon owns a ledger): all of
/// them return to the queue, due now (an ordered key's through [`back_to_queue`]). Returns how
/// many.
pub fn release_all_leases(c: &Connection, now_ms: i64) -> Result<usize, LedgerError> {
    Ok(back_to_queue(c, None, None, now_ms)?.0)
}

/// Leases that outlived their expiry go back to pending. Returns the subscribers concerned.
pub fn release_expired_leases(c: &Connection, now_ms: i64) -> Result<Vec<String>, LedgerError> {
    Ok(back_to_queue(c, Some(now_ms), None, now_ms)?.1)
}

/// Every lease but `held` goes back to pending: a turn that failed wrote nothing here (one
/// local transaction), so this finds none unless the dispatcher lost track of a lease.
/// Returns the subscribers concerned.
pub fn release_strays(
    c: &Connection,
    held: &[i64],
    now_ms: i64,
) -> Result<Vec<String>, LedgerError> {
    Ok(back_to_queue(c, None, Some(&id_list(held.iter().copied())), now_ms)?.1)
}

/// In-flight deliveries whose lease expires before `before` (all of them: `None`), but those
/// `held` names (a JSON array of row ids), back to pending, due now — except
/// an ordered key's: held, then the key's lowest-numbered held delivery goes (`ordered::
/// release`), so a run of one key leased together (`claim_runs`) comes back with one head.
/// Returns how many, and their subscribers.
fn back_to_queue(
    c: &Connection,
    before: Option<i64>,
    held: Option<&str>,
    now_ms: i64,
) -> Result<(usize, Vec<String>), LedgerError> {
    let rows: Vec<(String, Option<String>)> = c
        .prepare_cached(
            "UPDATE deliveries SET status = 'pending', lease_expires_ms = NULL,
                 next_attempt_ms = CASE WHEN ordering_key IS NULL THEN ?2 ELSE ?3 END,
                 updated_ms = ?2
             WHERE status = 'in_flight' AND (?1 IS NULL OR lease_expires_ms < ?1)
               AND (?4 IS NULL OR id NOT IN (SELECT value FROM json_each(?4)))
             RETURNING subscriber_id, ordering_key",
        )?
        .query_map(params![before, now_ms, HELD_MS, held], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let keys: Vec<(String, String)> = rows
        .iter()
        .filter_map(|(s, k)| Some((s.clone(), k.clone()?)))
        .collect();
    ordered::release(c, &keys, now_ms)?;
    let n = rows.len();
    let mut subs: Vec<String> = rows.into_iter().map(|(s, _)| s).collect();
    subs.sort();
    subs.dedup();
    Ok((n, subs))
}

/// Every live subscriber with pending work and when its earliest delivery is due.
pub fn due_summary(c: &Connection) -> Result<Vec<(String, i64)>, LedgerError> {
    let mut st = c.prepare_cached(
        "SELECT s.id, (SELECT MIN(d.next_attempt_ms) FROM deliveries d
                       WHERE d.subscriber_id = s.id AND d.status = 'pending'
                         AND d.next_attempt_ms < ?1)
         FROM subscribers s WHERE s.deleted_ms IS NULL",
    )?;
    let rows = st.query_map([HELD_MS], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        if let (id, Some(due)) = row? {
            out.push((id, due));
        }
    }
    Ok(out)
}
