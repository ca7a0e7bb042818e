//! Ingest on SQLite: events stored and fanned out to the live subscribers whose patterns and
//! content filters match (`ledger::fanout`), in a few multi-row statements per batch (not one
//! per row).

use std::fmt::Write as _;

use rusqlite::Connection;

use crate::ledger::deliveries::{Ingested, NewEvent};
use crate::ledger::error::LedgerError;
use crate::ledger::fanout::{candidates, Selector};

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
            "SELECT id, event_types, filter FROM subscribers WHERE deleted_ms IS NULL",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?,
    );
    // The ids stored by this call. A repeated id within the call is new only the first time.
    let mut fresh: std::collections::HashSet<String> =
        std::collections::HashSet::with_capacity(events.len());
    for chunk in events.chunks(ROWS_PER_INSERT) {
        let sql = multi_row_sql(
            "INSERT OR IGNORE INTO events (id, type, body, received_ms)",
            chunk.len(),
            3,
            &format!(", ?{}", chunk.len() * 3 + 1),
            "RETURNING id",
        );
        let mut st = c.prepare_cached(&sql)?;
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(chunk.len() * 3 + 1);
        for e in chunk {
            args.push(&e.id);
            args.push(&e.event_type);
            args.push(&e.body);
        }
        args.push(&now_ms);
        let ids = st.query_map(args.as_slice(), |r| r.get::<_, String>(0))?;
        for id in ids {
            fresh.insert(id?);
        }
    }
    let mut touched = vec![false; subs.len()];
    let mut out = Vec::with_capacity(events.len());
    let mut selector = Selector::new(&subs);
    for e in events {
        let is_new = fresh.remove(&e.id);
        let mut created = 0u32;
        if is_new {
            let idx = selector.select(e);
            for part in idx.chunks(ROWS_PER_INSERT) {
                let n = part.len();
                let sql = multi_row_sql(
                    "INSERT OR IGNORE INTO deliveries (subscriber_id, event_id, status, next_attempt_ms, created_ms, updated_ms)",
                    n,
                    1,
                    &format!(", ?{e}, 'pending', ?{t}, ?{t}, ?{t}", e = n + 1, t = n + 2),
                    "",
                );
                let mut st = c.prepare_cached(&sql)?;
                let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(n + 2);
                for &i in part {
                    args.push(&subs[i].id);
                }
                args.push(&e.id);
                args.push(&now_ms);
                let n_created = st.execute(args.as_slice())?;
                created += n_created as u32;
                if n_created > 0 {
                    // A new event has no delivery yet, so every row is created; should one
                    // ever not be, its subscriber is only told to look for work it lacks.
                    for &i in part {
                        touched[i] = true;
                    }
                }
            }
        }
        out.push(Ingested {
            id: e.id.clone(),
            deliveries: created,
            duplicate: !is_new,
        });
    }
    let touched = subs
        .into_iter()
        .zip(touched)
        .filter_map(|(s, t)| t.then_some(s.id))
        .collect();
    Ok((out, touched))
}
