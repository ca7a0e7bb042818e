//! Ingest on SQLite: events stored and fanned out to the live subscribers whose patterns and
//! content filters match (`ledger::fanout`), in a few multi-row statements per batch (not one
//! per row).

use std::fmt::Write as _;

use std::collections::HashSet;

use rusqlite::Connection;

use super::ordered;
use crate::ledger::deliveries::{Ingested, NewEvent};
use crate::ledger::error::LedgerError;
use crate::ledger::fanout::{candidates, ordering_keys, Candidate, CandidateRow, Selector};
use crate::ledger::sequence;

/// Rows per multi-row `INSERT`: ingest and the attempts of a dispatcher turn go in as a few
/// statements, not one per row.
///
/// Such statements use `INSERT OR IGNORE`, not `ON CONFLICT DO NOTHING`: a multi-row statement
/// that could abort half-way makes SQLite keep a statement journal (a copy of every page it
/// changes, so it can undo just that statement), which cost about as much as the inserts
/// themselves. Under `OR IGNORE` no row can abort the statement. That is the same behaviour
/// here: the only constraint those rows can break is the uniqueness being ignored (their
/// columns are never NULL and `status` is a literal that passes its CHECK).
pub(super) const ROWS_PER_INSERT: usize = 64;

/// `{head} VALUES (row 1), (row 2), … {tail}` with `n` rows of `per_row` numbered parameters
/// each (`?1` …), every row ending with the shared trailing parameter text `shared`.
pub(super) fn multi_row_sql(
    head: &str,
    n: usize,
    per_row: usize,
    shared: &str,
    tail: &str,
) -> String {
    let mut sql = String::with_capacity(head.len() + tail.len() + n * (per_row * 6 + 24));
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for r in 0..n {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for k in 0..per_row {
            if k > 0 {
                sql.push_str(", ");
            }
            let _ = write!(sql, "?{}", r * per_row + k + 1);
        }
        sql.push_str(shared);
        sql.push(')');
    }
    sql.push(' ');
    sql.push_str(tail);
    sql
}

/// Store events and fan each out to every live subscriber whose patterns and filter match
/// (`ledger::fanout`). Returns the per-event outcome and the subscribers that got new work.
///
/// Events go in by chunks of `ROWS_PER_INSERT` (`RETURNING` tells which ids are new), and each
/// new event's deliveries in one statement: rows, order and counts are those of inserting them
/// one by one.
pub fn ingest(
    c: &Connection,
    events: &[NewEvent],
    now_ms: i64,
) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
    // Deliveries are created in id order with nondecreasing `created_ms` (a clock that went
    // back, or a call that waited in the writer's queue, takes the latest time already
    // stored), so a time range is an id range (`filter_sql`).
    let latest: Option<i64> = c
        .prepare_cached("SELECT MAX(created_ms) FROM deliveries")?
        .query_row([], |r| r.get(0))?;
    let now_ms = latest.map_or(now_ms, |t| t.max(now_ms));
    let subs = candidates(
        c.prepare_cached(
            "SELECT id, event_types, filter, customer_filter, ordering, ordering_key
             FROM subscribers WHERE deleted_ms IS NULL",
        )?
        .query_map([], |r| {
            Ok(CandidateRow {
                id: r.get(0)?,
                event_types: r.get(1)?,
                filter: r.get(2)?,
                customer_filter: r.get(3)?,
                ordering: r.get(4)?,
                ordering_key: r.get(5)?,
            })
        })?
        .collect::<Result<_, _>>()?,
    );
    // The ids stored by this call. A repeated id within the call is new only the first time.
    let mut fresh: HashSet<String> = HashSet::with_capacity(events.len());
    for chunk in events.chunks(ROWS_PER_INSERT) {
        let sql = multi_row_sql(
            "INSERT OR IGNORE INTO events (id, type, body, traceparent, received_ms)",
            chunk.len(),
            4,
            &format!(", ?{}", chunk.len() * 4 + 1),
            "RETURNING id",
        );
        let mut st = c.prepare_cached(&sql)?;
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(chunk.len() * 4 + 1);
        for e in chunk {
            args.push(&e.id);
            args.push(&e.event_type);
            args.push(&e.body);
            args.push(&e.traceparent);
        }
        args.push(&now_ms);
        let ids = st.query_map(args.as_slice(), |r| r.get::<_, String>(0))?;
        for id in ids {
            fresh.insert(id?);
        }
    }
    // The fan-out, in order: each new event's matching subscribers (indexes into `subs`), and
    // each event's part of it (`None` for a duplicate). Its sequence numbers are reserved at
    // once, before the deliveries go in.
    let mut parts: Vec<Option<std::ops::Range<usize>>> = Vec::with_capacity(events.len());
    let mut fan_out: Vec<usize> = Vec::new();
    let mut keys: Vec<Option<String>> = Vec::new();
    let mut selector = Selector::new(&subs);
    let mut same_body = c.prepare_cached("SELECT body = ?2 FROM events WHERE id = ?1")?;
    let mut different = vec![false; events.len()];
    for (n, e) in events.iter().enumerate() {
        if !fresh.remove(&e.id) {
            // A duplicate: its id stored before (or earlier in this call) with this body?
            different[n] =
                !same_body.query_row(rusqlite::params![e.id, e.body], |r| r.get::<_, bool>(0))?;
            parts.push(None);
            continue;
        }
        let from = fan_out.len();
        let to = selector.select(e);
        ordering_keys(&subs, e, to, &mut keys);
        fan_out.extend_from_slice(to);
        parts.push(Some(from..fan_out.len()));
    }
    let numbers = reserve_sequences(c, |i| subs[i].id.as_str(), &fan_out)?;
    let links = link_ordered(c, &subs, &fan_out, &keys, &numbers)?;
    let mut touched = vec![false; subs.len()];
    let mut out = Vec::with_capacity(events.len());
    for ((e, part), different_body) in events.iter().zip(parts).zip(different) {
        let is_new = part.is_some();
        let idx = part.unwrap_or_default();
        for &i in &fan_out[idx.clone()] {
            touched[i] = true;
        }
        let part = Part {
            to: &fan_out[idx.clone()],
            numbers: &numbers[idx.clone()],
            keys: &keys[idx.clone()],
            links: &links[idx],
        };
        let created = insert_deliveries(c, &subs, e, &part, now_ms)?;
        out.push(Ingested {
            id: e.id.clone(),
            deliveries: created,
            duplicate: !is_new,
            different_body,
        });
    }
    let touched = subs
        .into_iter()
        .zip(touched)
        .filter_map(|(s, t)| t.then_some(s.id))
        .collect();
    Ok((out, touched))
}

/// One new event's part of the fan-out: its subscribers (indexes into the candidates), their
/// numbers, keys and links (`None` for unordered).
struct Part<'a> {
    to: &'a [usize],
    numbers: &'a [i64],
    keys: &'a [Option<String>],
    links: &'a [Option<ordered::Link>],
}

/// The ordered deliveries of the fan-out linked to their keys (`ordered::link`), before any is
/// inserted: `None` for each unordered one.
fn link_ordered(
    c: &Connection,
    subs: &[Candidate],
    fan_out: &[usize],
    keys: &[Option<String>],
    numbers: &[i64],
) -> Result<Vec<Option<ordered::Link>>, LedgerError> {
    let mut out = vec![None; fan_out.len()];
    let at: Vec<usize> = (0..fan_out.len()).filter(|&k| keys[k].is_some()).collect();
    if at.is_empty() {
        return Ok(out);
    }
    let ordered: Vec<(&str, &str, i64)> = at
        .iter()
        .map(|&k| {
            (
                subs[fan_out[k]].id.as_str(),
                keys[k].as_deref().unwrap_or(""),
                numbers[k],
            )
        })
        .collect();
    for (k, l) in at.into_iter().zip(ordered::link(c, &ordered)?) {
        out[k] = Some(l);
    }
    Ok(out)
}

/// One new event's deliveries ([`Part`]): the unordered ones by statements of up to
/// `ROWS_PER_INSERT` rows, the ordered ones with their keys (`ordered::insert`). Returns how
/// many were created: all of them (a new event has no delivery yet); one that was not would
/// leave its number unused, so that is an error and nothing of the call is kept.
fn insert_deliveries(
    c: &Connection,
    subs: &[Candidate],
    e: &NewEvent,
    part: &Part<'_>,
    now_ms: i64,
) -> Result<u32, LedgerError> {
    if part.keys.iter().all(Option::is_none) {
        return insert_plain(c, subs, e, part.to, part.numbers, now_ms);
    }
    let mut rows = Vec::new();
    for k in 0..part.to.len() {
        if let (Some(key), Some(link)) = (&part.keys[k], part.links[k]) {
            rows.push((
                subs[part.to[k]].id.as_str(),
                part.numbers[k],
                key.as_str(),
                link,
            ));
        }
    }
    let n = ordered::insert(c, &e.id, &rows, now_ms)?;
    let plain = (0..part.to.len()).filter(|&k| part.keys[k].is_none());
    let (to, numbers): (Vec<usize>, Vec<i64>) =
        plain.map(|k| (part.to[k], part.numbers[k])).unzip();
    Ok(n + insert_plain(c, subs, e, &to, &numbers, now_ms)?)
}

/// Unordered deliveries of one event to `to`, numbered `numbers` (see [`insert_deliveries`]).
fn insert_plain(
    c: &Connection,
    subs: &[Candidate],
    e: &NewEvent,
    to: &[usize],
    numbers: &[i64],
    now_ms: i64,
) -> Result<u32, LedgerError> {
    let mut created = 0u32;
    for (part, seqs) in to
        .chunks(ROWS_PER_INSERT)
        .zip(numbers.chunks(ROWS_PER_INSERT))
    {
        let n = part.len();
        let sql = multi_row_sql(
            "INSERT OR IGNORE INTO deliveries (subscriber_id, sequence, event_id, status, next_attempt_ms, created_ms, updated_ms)",
            n,
            2,
            &format!(", ?{e}, 'pending', ?{t}, ?{t}, ?{t}", e = 2 * n + 1, t = 2 * n + 2),
            "",
        );
        let mut st = c.prepare_cached(&sql)?;
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(2 * n + 2);
        for (&i, seq) in part.iter().zip(seqs) {
            args.push(&subs[i].id);
            args.push(seq);
        }
        args.push(&e.id);
        args.push(&now_ms);
        let n_created = st.execute(args.as_slice())?;
        if n_created != n {
            return Err(LedgerError::Invalid(format!(
                "event {}: {n_created} of {n} deliveries created; sequence numbers must not skip",
                e.id
            )));
        }
        created += n_created as u32;
    }
    Ok(created)
}

/// Reserve the sequence numbers of a fan-out (indexes of subscribers, their ids by `id_of`, in order): one upsert per
/// subscriber moves its counter, and each delivery gets its number (`ledger::sequence`).
pub(super) fn reserve_sequences<'a>(
    c: &Connection,
    id_of: impl Fn(usize) -> &'a str,
    fan_out: &[usize],
) -> Result<Vec<i64>, LedgerError> {
    let mut reserve = c.prepare_cached(
        "INSERT INTO sequences (subscriber_id, last) VALUES (?1, ?2)
         ON CONFLICT (subscriber_id) DO UPDATE SET last = last + excluded.last
         RETURNING last",
    )?;
    let mut reserved = Vec::new();
    for (i, n) in sequence::tally(fan_out) {
        let last: i64 = reserve.query_row(rusqlite::params![id_of(i), n], |r| r.get(0))?;
        reserved.push((i, last));
    }
    sequence::assign(fan_out, &reserved)
}
