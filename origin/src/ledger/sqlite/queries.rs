//! The ledger's operations, as plain functions over a connection (the caller chooses the
//! transaction). All statements are prepared once and cached.

use std::fmt::Write as _;

use fanout_core::limiter::LimiterState;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use super::LedgerError;
use crate::model::{
    any_type_matches, delivery_public_id, rotation_wait_ms, AttemptOutcome, AttemptRecord, Claim,
    Claimed, Disabled, Health, Lane, Limits, Outcome, Status, StoredSecret, Subscriber, Transition,
    MIN_ROTATION_INTERVAL_MS,
};

// ---------------------------------------------------------------------------------------------
// Subscribers

const SUBSCRIBER_COLUMNS: &str = "id, url, event_types, rate_per_sec, burst, max_in_flight, \
     timeout_ms, lane, legacy_signature, created_ms, updated_ms, disabled_ms, disabled_reason, \
     failing_since_ms, customer, disabled_by_operator";

fn subscriber_from_row(r: &Row<'_>) -> rusqlite::Result<Subscriber> {
    let types: String = r.get(2)?;
    let lane: String = r.get(7)?;
    Ok(Subscriber {
        id: r.get(0)?,
        url: r.get(1)?,
        event_types: serde_json::from_str(&types).unwrap_or_default(),
        limits: Limits {
            rate_per_sec: r.get(3)?,
            burst: r.get(4)?,
            max_in_flight: r.get(5)?,
            timeout_ms: r.get::<_, i64>(6)?.max(0) as u64,
        },
        lane: Lane::parse(&lane).unwrap_or_default(),
        legacy_signature: r.get(8)?,
        secrets: Vec::new(),
        created_ms: r.get(9)?,
        updated_ms: r.get(10)?,
        health: Health {
            disabled: match (
                r.get::<_, Option<i64>>(11)?,
                r.get::<_, Option<String>>(12)?,
            ) {
                (Some(at_ms), reason) => Some(Disabled {
                    at_ms,
                    reason: reason.unwrap_or_default(),
                    by_operator: r.get(15)?,
                }),
                (None, _) => None,
            },
            failing_since_ms: r.get(13)?,
        },
        customer: r.get(14)?,
    })
}

fn load_secrets(c: &Connection, id: &str) -> Result<Vec<StoredSecret>, LedgerError> {
    let mut st = c.prepare_cached(
        "SELECT secret, created_ms, expires_ms FROM subscriber_secrets
         WHERE subscriber_id = ?1 ORDER BY created_ms DESC, rowid DESC",
    )?;
    let rows = st.query_map([id], |r| {
        Ok(StoredSecret {
            secret: r.get(0)?,
            created_ms: r.get(1)?,
            expires_ms: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn get_subscriber(c: &Connection, id: &str) -> Result<Subscriber, LedgerError> {
    let sql = format!(
        "SELECT {SUBSCRIBER_COLUMNS} FROM subscribers WHERE id = ?1 AND deleted_ms IS NULL"
    );
    let mut st = c.prepare_cached(&sql)?;
    let mut sub = st
        .query_row([id], subscriber_from_row)
        .optional()?
        .ok_or_else(|| LedgerError::NotFound(format!("subscriber {id}")))?;
    sub.secrets = load_secrets(c, id)?;
    Ok(sub)
}

pub fn list_subscribers(c: &Connection) -> Result<Vec<Subscriber>, LedgerError> {
    let sql = format!(
        "SELECT {SUBSCRIBER_COLUMNS} FROM subscribers WHERE deleted_ms IS NULL ORDER BY id"
    );
    let mut st = c.prepare_cached(&sql)?;
    let mut subs = st
        .query_map([], subscriber_from_row)?
        .collect::<Result<Vec<_>, _>>()?;
    for s in &mut subs {
        s.secrets = load_secrets(c, &s.id)?;
    }
    Ok(subs)
}

/// What `create_subscriber` and `update_subscriber` both bind, in one order: ?1 id, ?2 url,
/// ?3 event_types (JSON), ?4 rate_per_sec, ?5 burst, ?6 max_in_flight, ?7 timeout_ms, ?8 lane,
/// ?9 legacy_signature, ?10 the time of the change, ?11 customer.
fn definition_params<'a>(
    s: &'a Subscriber,
    event_types_json: &'a str,
    at_ms: i64,
) -> impl rusqlite::Params + 'a {
    (
        s.id.as_str(),
        s.url.as_str(),
        event_types_json,
        s.limits.rate_per_sec,
        s.limits.burst,
        s.limits.max_in_flight,
        s.limits.timeout_ms as i64,
        s.lane.as_str(),
        s.legacy_signature,
        at_ms,
        s.customer.as_deref(),
    )
}

fn event_types_json(s: &Subscriber) -> String {
    serde_json::to_string(&s.event_types).unwrap_or_else(|_| "[]".into())
}

/// Insert a new subscriber (or bring back a removed one under the same id) with its first
/// secret.
pub fn create_subscriber(c: &Connection, s: &Subscriber, secret: &str) -> Result<(), LedgerError> {
    let existing: Option<(Option<i64>, Option<String>)> = c
        .prepare_cached("SELECT deleted_ms, customer FROM subscribers WHERE id = ?1")?
        .query_row([&s.id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match existing {
        Some((None, _)) => {
            return Err(LedgerError::Conflict(format!(
                "subscriber {} already exists",
                s.id
            )))
        }
        // A removed endpoint's deliveries stay under its id: another owner taking the id over
        // would see and replay them. Refused until retention has removed them.
        Some((Some(_), owner)) if owner != s.customer && has_deliveries(c, &s.id)? => {
            return Err(id_still_holds_history(&s.id))
        }
        Some((Some(_), _)) => {
            c.execute(
                "DELETE FROM subscriber_secrets WHERE subscriber_id = ?1",
                [&s.id],
            )?;
            c.execute("DELETE FROM subscribers WHERE id = ?1", [&s.id])?;
        }
        None => {}
    }
    c.prepare_cached(
        "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
             timeout_ms, lane, legacy_signature, created_ms, updated_ms, customer)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11)",
    )?
    .execute(definition_params(s, &event_types_json(s), s.created_ms))?;
    c.prepare_cached(
        "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![s.id, secret, s.created_ms])?;
    Ok(())
}

/// Whether any delivery is kept under subscriber id `id` (from the kept counts).
fn has_deliveries(c: &Connection, id: &str) -> Result<bool, LedgerError> {
    let n: i64 = c
        .prepare_cached("SELECT COALESCE(SUM(n), 0) FROM delivery_counts WHERE subscriber_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    Ok(n > 0)
}

/// A removed subscriber's id asked for by another owner while its deliveries are kept.
pub fn id_still_holds_history(id: &str) -> LedgerError {
    LedgerError::Conflict(format!(
        "the id {id} belonged to a removed subscriber of another owner whose deliveries are \
         still kept: choose another id, or reuse it once retention has removed them"
    ))
}

/// Store a changed subscriber definition (not its secrets). The limiter state is kept: a
/// change never grants a fresh burst, and a pause still holds.
pub fn update_subscriber(c: &Connection, s: &Subscriber) -> Result<(), LedgerError> {
    let n = c
        .prepare_cached(
            "UPDATE subscribers SET url = ?2, event_types = ?3, rate_per_sec = ?4, burst = ?5,
                 max_in_flight = ?6, timeout_ms = ?7, lane = ?8, legacy_signature = ?9,
                 updated_ms = ?10, customer = ?11
             WHERE id = ?1 AND deleted_ms IS NULL",
        )?
        .execute(definition_params(s, &event_types_json(s), s.updated_ms))?;
    if n == 0 {
        return Err(LedgerError::NotFound(format!("subscriber {}", s.id)));
    }
    Ok(())
}

/// Remove a subscriber: it matches no new event, and its unfinished deliveries go dead
/// (replayable if it comes back). Returns how many deliveries went dead.
pub fn delete_subscriber(c: &Connection, id: &str, now_ms: i64) -> Result<usize, LedgerError> {
    let n = c.execute(
        "UPDATE subscribers SET deleted_ms = ?2, updated_ms = ?2 WHERE id = ?1 AND deleted_ms IS NULL",
        params![id, now_ms],
    )?;
    if n == 0 {
        return Err(LedgerError::NotFound(format!("subscriber {id}")));
    }
    Ok(c.execute(
        "UPDATE deliveries SET status = 'dead', last_error = 'subscriber removed', updated_ms = ?2,
             lease_expires_ms = NULL
         WHERE subscriber_id = ?1 AND status IN ('pending', 'in_flight')",
        params![id, now_ms],
    )?)
}

/// Add `secret` as the current secret; the one it replaces keeps signing until
/// `now + grace_ms`, and any older one stops now (at most `MAX_ACTIVE_SECRETS` sign). A
/// rotation within `MIN_ROTATION_INTERVAL_MS` of the previous one is `TooSoon`.
pub fn rotate_secret(
    c: &Connection,
    id: &str,
    secret: &str,
    now_ms: i64,
    grace_ms: i64,
) -> Result<(), LedgerError> {
    get_subscriber(c, id)?;
    let (current_ms, rotated_before): (Option<i64>, bool) = c
        .prepare_cached(
            "SELECT (SELECT MAX(created_ms) FROM subscriber_secrets
                     WHERE subscriber_id = ?1 AND expires_ms IS NULL),
                    EXISTS (SELECT 1 FROM subscriber_secrets
                            WHERE subscriber_id = ?1 AND expires_ms IS NOT NULL)",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if let Some(wait) = current_ms.and_then(|t| rotation_wait_ms(t, rotated_before, now_ms)) {
        return Err(rotation_too_soon(id, wait));
    }
    // The secrets rotated out before are older than the current one: they stop now.
    c.execute(
        "DELETE FROM subscriber_secrets WHERE subscriber_id = ?1 AND expires_ms IS NOT NULL",
        [id],
    )?;
    c.execute(
        "UPDATE subscriber_secrets SET expires_ms = ?2
         WHERE subscriber_id = ?1 AND expires_ms IS NULL",
        params![id, now_ms + grace_ms],
    )?;
    c.execute(
        "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms) VALUES (?1, ?2, ?3)",
        params![id, secret, now_ms],
    )?;
    c.execute(
        "UPDATE subscribers SET updated_ms = ?2 WHERE id = ?1",
        params![id, now_ms],
    )?;
    Ok(())
}

/// A rotation of `id`'s secret refused for `wait_ms` more.
pub fn rotation_too_soon(id: &str, wait_ms: i64) -> LedgerError {
    LedgerError::TooSoon {
        message: format!(
            "the secret of {id} was rotated less than {} s ago: rotate again in {} s",
            MIN_ROTATION_INTERVAL_MS / 1000,
            (wait_ms + 999) / 1000
        ),
        retry_after_ms: wait_ms,
    }
}

/// A subscriber's limiter as stored by the dispatcher.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredLimiter {
    /// Nothing stored yet: a new subscriber, which starts with a full burst.
    Never,
    Decoded(LimiterState),
    /// A state that does not decode (written by another version, or damaged): why.
    Undecodable(String),
}

pub fn read_limiter(c: &Connection, id: &str) -> Result<StoredLimiter, LedgerError> {
    let raw: Option<Option<String>> = c
        .prepare_cached("SELECT limiter FROM subscribers WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(match raw.flatten() {
        None => StoredLimiter::Never,
        Some(text) => match serde_json::from_str::<LimiterState>(&text) {
            Ok(state) => StoredLimiter::Decoded(state),
            Err(e) => StoredLimiter::Undecodable(e.to_string()),
        },
    })
}

/// The limiter the dispatcher starts a subscriber from. A stored state that does not decode
/// is logged (WARN, naming the subscriber) and replaced by an EMPTY bucket as of `now_ms`,
/// never a full one: trusting nothing, the subscriber gets only what accrues from now.
pub fn load_limiter(c: &Connection, id: &str, now_ms: i64) -> Result<LimiterState, LedgerError> {
    Ok(match read_limiter(c, id)? {
        StoredLimiter::Never => LimiterState::default(),
        StoredLimiter::Decoded(state) => state,
        StoredLimiter::Undecodable(why) => {
            tracing::warn!(
                subscriber = %id,
                error = %why,
                "the stored limiter state does not decode (written by another version?); \
                 the subscriber starts from an empty bucket"
            );
            LimiterState::empty(now_ms)
        }
    })
}

pub fn store_limiters(
    c: &Connection,
    states: &[(String, LimiterState)],
) -> Result<(), LedgerError> {
    let mut st = c.prepare_cached("UPDATE subscribers SET limiter = ?2 WHERE id = ?1")?;
    for (id, state) in states {
        let json = serde_json::to_string(state).unwrap_or_default();
        st.execute(params![id, json])?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Events

/// One event as received: its id, type and exact bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub id: String,
    pub event_type: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ingested {
    pub id: String,
    /// Deliveries this call created for the event (0 for a duplicate).
    pub deliveries: u32,
    pub duplicate: bool,
}

/// Rows per multi-row `INSERT`: ingest and the attempts of a dispatcher turn go in as a few
/// statements, not one per row.
///
/// Such statements use `INSERT OR IGNORE`, not `ON CONFLICT DO NOTHING`: a multi-row statement
/// that could abort half-way makes SQLite keep a statement journal (a copy of every page it
/// changes, so it can undo just that statement), which cost about as much as the inserts
/// themselves. Under `OR IGNORE` no row can abort the statement. That is the same behaviour
/// here: the only constraint those rows can break is the uniqueness being ignored (their
/// columns are never NULL and `status` is a literal that passes its CHECK).
const ROWS_PER_INSERT: usize = 64;

/// `{head} VALUES (row 1), (row 2), … {tail}` with `n` rows of `per_row` numbered parameters
/// each (`?1` …), every row ending with the shared trailing parameter text `shared`.
fn multi_row_sql(head: &str, n: usize, per_row: usize, shared: &str, tail: &str) -> String {
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

/// Store events and fan each out to every live subscriber whose patterns match. Returns the
/// per-event outcome and the subscribers that got new work.
///
/// Events go in by chunks of [`ROWS_PER_INSERT`] (`RETURNING` tells which ids are new), and each
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
    let subs: Vec<(String, Vec<String>)> = c
        .prepare_cached("SELECT id, event_types FROM subscribers WHERE deleted_ms IS NULL")?
        .query_map([], |r| {
            let types: String = r.get(1)?;
            Ok((r.get(0)?, serde_json::from_str(&types).unwrap_or_default()))
        })?
        .collect::<Result<_, _>>()?;
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
    // The subscribers matching the last event type seen (a batch is usually of one type).
    let mut matched: Option<(&str, Vec<usize>)> = None;
    for e in events {
        let is_new = fresh.remove(&e.id);
        let mut created = 0u32;
        if is_new {
            if matched.as_ref().is_none_or(|(t, _)| *t != e.event_type) {
                let idx = subs
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, patterns))| any_type_matches(patterns, &e.event_type))
                    .map(|(i, _)| i)
                    .collect();
                matched = Some((e.event_type.as_str(), idx));
            }
            let idx = matched.as_ref().map_or(&[][..], |(_, m)| m.as_slice());
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
                    args.push(&subs[i].0);
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
        .filter_map(|((id, _), t)| t.then_some(id))
        .collect();
    Ok((out, touched))
}

// ---------------------------------------------------------------------------------------------
// Dispatching: claims, results, leases

/// Lease up to `limit` due deliveries of each subscriber until `lease_until_ms`, oldest due
/// first, and store the limiter states that granted them.
pub fn claim(
    c: &Connection,
    wants: &[(String, usize)],
    limiters: &[(String, LimiterState)],
    now_ms: i64,
    lease_until_ms: i64,
) -> Result<Vec<Claim>, LedgerError> {
    let mut select = c.prepare_cached(
        "SELECT d.id, d.event_id, e.type, e.body, d.attempts
         FROM deliveries d JOIN events e ON e.id = d.event_id
         WHERE d.subscriber_id = ?1 AND d.status = 'pending' AND d.next_attempt_ms <= ?2
         ORDER BY d.next_attempt_ms, d.id LIMIT ?3",
    )?;
    // One statement per subscriber for the whole claim: the ids as a JSON array.
    let mut lease = c.prepare_cached(
        "UPDATE deliveries SET status = 'in_flight', lease_expires_ms = ?2, updated_ms = ?3
         WHERE id IN (SELECT value FROM json_each(?1))",
    )?;
    let mut next = c.prepare_cached(
        "SELECT MIN(next_attempt_ms) FROM deliveries WHERE subscriber_id = ?1 AND status = 'pending'",
    )?;
    let mut out = Vec::with_capacity(wants.len());
    for (sub, limit) in wants {
        let claimed: Vec<Claimed> = if *limit == 0 {
            Vec::new()
        } else {
            select
                .query_map(params![sub, now_ms, *limit as i64], |r| {
                    Ok(Claimed {
                        rowid: r.get(0)?,
                        event_id: r.get(1)?,
                        event_type: r.get(2)?,
                        body: r.get(3)?,
                        attempt: r.get::<_, u32>(4)?.saturating_add(1),
                    })
                })?
                .collect::<Result<_, _>>()?
        };
        if !claimed.is_empty() {
            let ids = id_list(claimed.iter().map(|d| d.rowid));
            lease.execute(params![ids, lease_until_ms, now_ms])?;
        }
        let next_due_ms: Option<i64> = next.query_row([sub], |r| r.get(0))?;
        out.push(Claim {
            subscriber_id: sub.clone(),
            claimed,
            next_due_ms,
            // The dispatcher's own limiter granted these: it knows its waits.
            not_before_ms: None,
        });
    }
    store_limiters(c, limiters)?;
    Ok(out)
}

/// Row ids as a JSON array, for `id IN (SELECT value FROM json_each(?))`.
fn id_list(ids: impl Iterator<Item = i64>) -> String {
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
/// then: recording the same outcomes twice counts them once.
pub fn apply(
    c: &Connection,
    outcomes: &[Outcome],
    limiters: &[(String, LimiterState)],
    now_ms: i64,
) -> Result<(), LedgerError> {
    // Sent is by far the commonest outcome: a run of them is one statement.
    let mut sent = c.prepare_cached(
        "UPDATE deliveries SET status = 'sent', attempts = attempts + 1, lease_expires_ms = NULL,
             last_error = NULL, updated_ms = ?2
         WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'in_flight'
         RETURNING id",
    )?;
    let mut retry = c.prepare_cached(
        "UPDATE deliveries SET status = 'pending', attempts = attempts + 1, next_attempt_ms = ?2,
             lease_expires_ms = NULL, last_error = ?3, updated_ms = ?4
         WHERE id = ?1 AND status = 'in_flight'",
    )?;
    let mut dead = c.prepare_cached(
        "UPDATE deliveries SET status = 'dead', attempts = attempts + ?4, lease_expires_ms = NULL,
             last_error = ?2, updated_ms = ?3
         WHERE id = ?1 AND status = 'in_flight'",
    )?;
    let mut defer = c.prepare_cached(
        "UPDATE deliveries SET status = 'pending', next_attempt_ms = ?2, lease_expires_ms = NULL,
             updated_ms = ?3
         WHERE id = ?1 AND status = 'in_flight'",
    )?;
    // The outcomes that found their delivery in flight (the others were already recorded, or
    // the delivery was taken away: removed subscriber, expired lease).
    let mut applied = vec![false; outcomes.len()];
    // In order: consecutive Sent outcomes are updated together.
    let mut i = 0;
    while i < outcomes.len() {
        let o = &outcomes[i];
        match &o.transition {
            Transition::Sent => {
                let run = outcomes[i..]
                    .iter()
                    .take_while(|o| o.transition == Transition::Sent)
                    .count();
                let ids = id_list(outcomes[i..i + run].iter().map(|o| o.rowid));
                let hit: std::collections::HashSet<i64> = sent
                    .query_map(params![ids, now_ms], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                for k in i..i + run {
                    applied[k] = hit.contains(&outcomes[k].rowid);
                }
                i += run;
                continue;
            }
            Transition::Retry { at_ms, error } => {
                applied[i] = retry.execute(params![o.rowid, at_ms, error, now_ms])? > 0
            }
            Transition::Dead { reason } => {
                applied[i] = dead.execute(params![
                    o.rowid,
                    reason,
                    now_ms,
                    i64::from(o.attempt.is_some())
                ])? > 0
            }
            Transition::Defer { at_ms } => {
                applied[i] = defer.execute(params![o.rowid, at_ms, now_ms])? > 0
            }
        };
        i += 1;
    }
    // The attempts, in order, by chunks of rows.
    let recorded: Vec<(i64, &AttemptRecord)> = outcomes
        .iter()
        .zip(&applied)
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
    store_limiters(c, limiters)?;
    Ok(())
}

/// At start-up every lease belongs to a previous process (one daemon owns a ledger): all of
/// them return to the queue, due now. Returns how many.
pub fn release_all_leases(c: &Connection, now_ms: i64) -> Result<usize, LedgerError> {
    Ok(c.execute(
        "UPDATE deliveries SET status = 'pending', lease_expires_ms = NULL, next_attempt_ms = ?1,
             updated_ms = ?1
         WHERE status = 'in_flight'",
        [now_ms],
    )?)
}

/// Leases that outlived their expiry go back to pending. Returns the subscribers concerned.
pub fn release_expired_leases(c: &Connection, now_ms: i64) -> Result<Vec<String>, LedgerError> {
    let subs: Vec<String> = c
        .prepare_cached(
            "SELECT DISTINCT subscriber_id FROM deliveries
             WHERE status = 'in_flight' AND lease_expires_ms < ?1",
        )?
        .query_map([now_ms], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if !subs.is_empty() {
        c.execute(
            "UPDATE deliveries SET status = 'pending', lease_expires_ms = NULL, next_attempt_ms = ?1,
                 updated_ms = ?1
             WHERE status = 'in_flight' AND lease_expires_ms < ?1",
            [now_ms],
        )?;
    }
    Ok(subs)
}

/// Every live subscriber with pending work and when its earliest delivery is due.
pub fn due_summary(c: &Connection) -> Result<Vec<(String, i64)>, LedgerError> {
    let mut st = c.prepare_cached(
        "SELECT s.id, (SELECT MIN(d.next_attempt_ms) FROM deliveries d
                       WHERE d.subscriber_id = s.id AND d.status = 'pending')
         FROM subscribers s WHERE s.deleted_ms IS NULL",
    )?;
    let rows = st.query_map([], |r| {
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

// ---------------------------------------------------------------------------------------------
// Reading and replaying deliveries

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryFilter {
    pub status: Option<Status>,
    pub subscriber: Option<String>,
    pub event: Option<String>,
    /// Only events of this type.
    pub event_type: Option<String>,
    /// Only deliveries to this customer's subscribers (a portal token's scope).
    pub customer: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Only deliveries with a larger rowid (pagination cursor).
    pub after: Option<i64>,
    pub limit: usize,
}

/// A delivery as the API shows it (and the CLI reads it back: one type both ways).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryView {
    pub id: String,
    pub subscriber_id: String,
    pub event_id: String,
    pub event_type: String,
    pub status: Status,
    pub attempt_count: u32,
    pub next_attempt_at_ms: Option<i64>,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<AttemptRecordView>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecordView {
    pub attempt: u32,
    pub at_ms: i64,
    pub lane: Lane,
    pub outcome: AttemptOutcome,
    pub status: Option<u16>,
    pub latency_ms: Option<i64>,
    pub response_body: Option<String>,
    pub error: Option<String>,
}

const DELIVERY_COLUMNS: &str =
    "d.id, d.subscriber_id, d.event_id, COALESCE(e.type, ''), d.status, \
     d.attempts, d.next_attempt_ms, d.last_error, d.created_ms, d.updated_ms";

/// A text column that must hold one of an enum's names.
fn enum_column<T>(r: &Row<'_>, i: usize, parse: fn(&str) -> Option<T>) -> rusqlite::Result<T> {
    let text: String = r.get(i)?;
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown value {text:?}").into(),
        )
    })
}

fn delivery_from_row(r: &Row<'_>) -> rusqlite::Result<DeliveryView> {
    let status = enum_column(r, 4, Status::parse)?;
    let next: i64 = r.get(6)?;
    Ok(DeliveryView {
        id: delivery_public_id(r.get(0)?),
        subscriber_id: r.get(1)?,
        event_id: r.get(2)?,
        event_type: r.get(3)?,
        next_attempt_at_ms: (status == Status::Pending).then_some(next),
        status,
        attempt_count: r.get(5)?,
        last_error: r.get(7)?,
        created_at_ms: r.get(8)?,
        updated_at_ms: r.get(9)?,
        attempts: None,
    })
}

/// The `WHERE` clause of a delivery filter and its arguments. Every list and bulk replay is
/// an id range (`after`, and the time range as ids: creation times never decrease with ids,
/// see `ingest`) within one index: by status, by subscriber and status, by event, or the
/// rowid itself.
fn filter_sql(f: &DeliveryFilter) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut clauses = Vec::new();
    let mut args: Vec<Value> = Vec::new();
    if let Some(s) = f.status {
        args.push(Value::Text(s.as_str().into()));
        clauses.push(format!("d.status = ?{}", args.len()));
    }
    if let Some(s) = &f.subscriber {
        args.push(Value::Text(s.clone()));
        clauses.push(format!("d.subscriber_id = ?{}", args.len()));
    }
    if let Some(e) = &f.event {
        args.push(Value::Text(e.clone()));
        clauses.push(format!("d.event_id = ?{}", args.len()));
    }
    // Type and customer are residual filters (the unary `+` keeps the planner from driving
    // the query by them): the rows are still read in id order from one index range, and only
    // those that match are kept.
    if let Some(t) = &f.event_type {
        args.push(Value::Text(t.clone()));
        clauses.push(format!(
            "(SELECT type FROM events WHERE id = d.event_id) = ?{}",
            args.len()
        ));
    }
    if let Some(cu) = &f.customer {
        args.push(Value::Text(cu.clone()));
        clauses.push(format!(
            "+d.subscriber_id IN (SELECT id FROM subscribers WHERE customer = ?{})",
            args.len()
        ));
    }
    // The first delivery created at or after a time, by the `deliveries_created` index.
    let first_at = |n: usize| {
        format!("(SELECT id FROM deliveries WHERE created_ms >= ?{n} ORDER BY created_ms LIMIT 1)")
    };
    if let Some(t) = f.since_ms {
        args.push(Value::Integer(t));
        clauses.push(format!("d.id >= {}", first_at(args.len())));
    }
    if let Some(t) = f.until_ms {
        args.push(Value::Integer(t));
        clauses.push(format!(
            "d.id < COALESCE({}, 9223372036854775807)",
            first_at(args.len())
        ));
    }
    args.push(Value::Integer(f.after.unwrap_or(0)));
    clauses.push(format!("d.id > ?{}", args.len()));
    (format!("WHERE {}", clauses.join(" AND ")), args)
}

/// Deliveries matching `f`, in id order, at most `f.limit`. A subscriber without a status is
/// read as one id-ordered range per status, merged: each range is an index's, so no list
/// reads more than `4 × limit` rows whatever the ledger holds. A customer's (a portal token's
/// scope) is read per subscriber it owns, so it reads no other customer's rows.
pub fn list_deliveries(
    c: &Connection,
    f: &DeliveryFilter,
) -> Result<Vec<DeliveryView>, LedgerError> {
    Ok(list_rows(c, f)?.into_iter().map(|(_, d)| d).collect())
}

/// [`list_deliveries`] with each delivery's rowid.
fn list_rows(c: &Connection, f: &DeliveryFilter) -> Result<Vec<(i64, DeliveryView)>, LedgerError> {
    // A customer's list is its subscribers' lists merged: its cost follows the customer's own
    // deliveries, not the ledger's. A subscriber's without a status, its statuses' merged.
    let parts = match customer_ranges(c, f)? {
        Some(per_subscriber) => per_subscriber,
        None if f.subscriber.is_some() && f.status.is_none() && f.event.is_none() => Status::ALL
            .into_iter()
            .map(|status| DeliveryFilter {
                status: Some(status),
                ..f.clone()
            })
            .collect(),
        None => return list_range(c, f),
    };
    let mut all = Vec::new();
    for one in &parts {
        all.extend(list_rows(c, one)?);
    }
    all.sort_by_key(|(rowid, _)| *rowid);
    all.truncate(f.limit);
    Ok(all)
}

/// A filter scoped to a customer without a subscriber or an event, as one filter per
/// subscriber the customer owns or owned (removed ones' deliveries stay its own), found by
/// `subscribers_by_customer`; `None` for any other filter.
fn customer_ranges(
    c: &Connection,
    f: &DeliveryFilter,
) -> Result<Option<Vec<DeliveryFilter>>, LedgerError> {
    let (Some(customer), None, None) = (&f.customer, &f.subscriber, &f.event) else {
        return Ok(None);
    };
    let subs: Vec<String> = c
        .prepare_cached("SELECT id FROM subscribers WHERE customer = ?1 ORDER BY id")?
        .query_map([customer], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(Some(
        subs.into_iter()
            .map(|s| DeliveryFilter {
                subscriber: Some(s),
                ..f.clone()
            })
            .collect(),
    ))
}

fn list_range(c: &Connection, f: &DeliveryFilter) -> Result<Vec<(i64, DeliveryView)>, LedgerError> {
    let (filter, args) = filter_sql(f);
    let sql = format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries d LEFT JOIN events e ON e.id = d.event_id
         {filter} ORDER BY d.id LIMIT {}",
        f.limit
    );
    let mut st = c.prepare_cached(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(args), |r| {
        Ok((r.get::<_, i64>(0)?, delivery_from_row(r)?))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn get_delivery(c: &Connection, rowid: i64) -> Result<DeliveryView, LedgerError> {
    let sql = format!(
        "SELECT {DELIVERY_COLUMNS} FROM deliveries d LEFT JOIN events e ON e.id = d.event_id
         WHERE d.id = ?1"
    );
    let mut d = c
        .prepare_cached(&sql)?
        .query_row([rowid], delivery_from_row)
        .optional()?
        .ok_or_else(|| LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid))))?;
    let mut st = c.prepare_cached(
        "SELECT attempt, at_ms, lane, outcome, status, latency_ms, response_body, error
         FROM attempts WHERE delivery_id = ?1 ORDER BY id",
    )?;
    let attempts = st
        .query_map([rowid], |r| {
            Ok(AttemptRecordView {
                attempt: r.get(0)?,
                at_ms: r.get(1)?,
                lane: enum_column(r, 2, Lane::parse)?,
                outcome: enum_column(r, 3, AttemptOutcome::parse)?,
                status: r.get(4)?,
                latency_ms: r.get(5)?,
                response_body: r.get(6)?,
                error: r.get(7)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    d.attempts = Some(attempts);
    Ok(d)
}

/// Put one delivery back in the queue, due now, with a fresh attempt budget. A delivery in
/// flight cannot be replayed (it is being sent). Returns its subscriber.
pub fn replay_one(c: &Connection, rowid: i64, now_ms: i64) -> Result<String, LedgerError> {
    let row: Option<(String, String)> = c
        .prepare_cached("SELECT subscriber_id, status FROM deliveries WHERE id = ?1")?
        .query_row([rowid], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (sub, status) = row
        .ok_or_else(|| LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid))))?;
    if status == "in_flight" {
        return Err(LedgerError::Conflict(format!(
            "delivery {} is in flight",
            delivery_public_id(rowid)
        )));
    }
    get_subscriber(c, &sub)
        .map_err(|_| LedgerError::Conflict(format!("subscriber {sub} has been removed")))?;
    c.execute(
        "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_ms = ?2,
             last_error = NULL, updated_ms = ?2
         WHERE id = ?1",
        params![rowid, now_ms],
    )?;
    Ok(sub)
}

/// The `WHERE` clause (and its arguments) of the deliveries a bulk replay takes: the filter's,
/// its status defaulting to dead, removed subscribers' skipped.
fn replayable_sql(
    f: &DeliveryFilter,
) -> Result<(String, Vec<rusqlite::types::Value>), LedgerError> {
    let mut f = f.clone();
    if f.status.is_none() {
        f.status = Some(Status::Dead);
    }
    if f.status == Some(Status::InFlight) {
        return Err(LedgerError::Invalid(
            "in-flight deliveries cannot be replayed".into(),
        ));
    }
    let (filter, args) = filter_sql(&f);
    let live = "d.subscriber_id IN (SELECT id FROM subscribers WHERE deleted_ms IS NULL)";
    let filter = format!("{filter} AND {live}");
    Ok((filter, args))
}

/// How many deliveries a bulk replay ([`replay_step`]s) would replay now (a dry run).
pub fn count_replayable(c: &Connection, f: &DeliveryFilter) -> Result<usize, LedgerError> {
    if let Some(per_subscriber) = customer_ranges(c, f)? {
        let mut n = 0;
        for one in per_subscriber {
            n += count_replayable(c, &one)?;
        }
        return Ok(n);
    }
    let (filter, args) = replayable_sql(f)?;
    let n: i64 = c
        .prepare(&format!("SELECT COUNT(*) FROM deliveries d {filter}"))?
        .query_row(rusqlite::params_from_iter(args), |r| r.get(0))?;
    Ok(n.max(0) as usize)
}

/// One step of a bulk replay: the first `f.limit` deliveries matching the filter after
/// `f.after`, in id order (its status defaults to dead; in-flight ones and removed
/// subscribers' are skipped; pending ones are left as they are), put back in the queue.
pub fn replay_step(
    c: &Connection,
    f: &DeliveryFilter,
    now_ms: i64,
) -> Result<ReplayStep, LedgerError> {
    let ids = match customer_ranges(c, f)? {
        // A customer's: its subscribers' first ids, merged.
        Some(per_subscriber) => {
            let mut all = Vec::new();
            for one in per_subscriber {
                all.extend(replayable_ids(c, &one)?);
            }
            all.sort_unstable();
            all.truncate(f.limit);
            all
        }
        None => replayable_ids(c, f)?,
    };
    let mut subs: Vec<String> = c
        .prepare_cached(
            "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_ms = ?1,
                 last_error = NULL, updated_ms = ?1
             WHERE id IN (SELECT value FROM json_each(?2)) AND status IN ('sent', 'dead')
             RETURNING subscriber_id",
        )?
        .query_map(params![now_ms, id_list(ids.iter().copied())], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let replayed = subs.len() as u64;
    subs.sort();
    subs.dedup();
    Ok(ReplayStep {
        replayed,
        subscribers: subs,
        last: ids.last().copied(),
        done: ids.len() < f.limit,
    })
}

/// The first `f.limit` ids a bulk replay with this filter takes after `f.after`.
fn replayable_ids(c: &Connection, f: &DeliveryFilter) -> Result<Vec<i64>, LedgerError> {
    let (filter, args) = replayable_sql(f)?;
    let ids = c
        .prepare_cached(&format!(
            "SELECT d.id FROM deliveries d {filter} ORDER BY d.id LIMIT {}",
            f.limit
        ))?
        .query_map(rusqlite::params_from_iter(args), |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(ids)
}

/// What one step of a bulk replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayStep {
    /// Deliveries put back in the queue.
    pub replayed: u64,
    /// Their subscribers, each once.
    pub subscribers: Vec<String>,
    /// The last delivery id the step looked at: the next step starts after it.
    pub last: Option<i64>,
    /// Nothing matches past it.
    pub done: bool,
}

/// Deliveries per status, for `/metrics`: from the counts the triggers keep, not a scan.
pub fn status_counts(c: &Connection) -> Result<Vec<(String, i64)>, LedgerError> {
    let mut st = c.prepare_cached("SELECT status, SUM(n) FROM delivery_counts GROUP BY status")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Subscriber;

    use crate::ledger::test_db as db;

    fn sub(id: &str, types: &[&str]) -> Subscriber {
        crate::ledger::test_subscriber(id, types)
    }

    fn ev(id: &str, ty: &str) -> NewEvent {
        NewEvent {
            id: id.into(),
            event_type: ty.into(),
            body: format!("{{\"id\":\"{id}\"}}"),
        }
    }

    /// A customer's list, its count and a replay step cost what the customer's own deliveries
    /// do (a portal token's scope): the same SQLite VM steps whether another subscriber has
    /// 1,000 or 10,000 deliveries in the same status, created before the customer's.
    #[test]
    fn a_customers_lists_cost_its_own_deliveries_not_the_ledgers() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        let steps = |others: usize| -> u64 {
            let mut c = db();
            c.execute(
                "INSERT INTO customers (id, weight, portal_nonce, created_ms, updated_ms)
                 VALUES ('acme', 1, 'n', 0, 0)",
                [],
            )
            .unwrap();
            create_subscriber(&c, &sub("big", &["big.*"]), "s").unwrap();
            let mut mine = sub("mine", &["mine.*"]);
            mine.customer = Some("acme".into());
            create_subscriber(&c, &mine, "s").unwrap();
            let big: Vec<NewEvent> = (0..others).map(|i| ev(&format!("b{i}"), "big.x")).collect();
            ingest(&c, &big, 1).unwrap();
            let own: Vec<NewEvent> = (0..3).map(|i| ev(&format!("m{i}"), "mine.x")).collect();
            ingest(&c, &own, 2).unwrap();
            c.execute("UPDATE deliveries SET status = 'dead'", [])
                .unwrap();
            let counted = Arc::new(AtomicU64::new(0));
            let counter = counted.clone();
            c.progress_handler(
                1,
                Some(move || {
                    counter.fetch_add(1, Ordering::Relaxed);
                    false
                }),
            )
            .unwrap();
            let scoped = DeliveryFilter {
                customer: Some("acme".into()),
                limit: 10,
                ..Default::default()
            };
            let dead = DeliveryFilter {
                status: Some(Status::Dead),
                ..scoped.clone()
            };
            assert_eq!(list_deliveries(&c, &dead).unwrap().len(), 3);
            assert_eq!(list_deliveries(&c, &scoped).unwrap().len(), 3);
            assert_eq!(count_replayable(&c, &dead).unwrap(), 3);
            assert_eq!(replay_step(&c, &dead, 3).unwrap().replayed, 3);
            c.progress_handler(0, None::<fn() -> bool>).unwrap();
            counted.load(Ordering::Relaxed)
        };
        let (small, large) = (steps(1_000), steps(10_000));
        assert!(
            large <= small + small / 10,
            "{small} VM steps, then {large}"
        );
    }

    /// Rotations: the first at once, then at most one per `MIN_ROTATION_INTERVAL_MS`; however
    /// many, two secrets sign (the current one and the one it replaced) and two are stored.
    #[test]
    fn rotations_keep_two_secrets_and_wait_their_interval() {
        let c = db();
        create_subscriber(&c, &sub("a", &["*"]), "s0").unwrap();
        let stored = |c: &Connection| -> i64 {
            c.query_row(
                "SELECT COUNT(*) FROM subscriber_secrets WHERE subscriber_id = 'a'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let day = 86_400_000;
        rotate_secret(&c, "a", "s1", 10, day).unwrap();
        match rotate_secret(&c, "a", "x", 10 + 30_000, day) {
            Err(LedgerError::TooSoon { retry_after_ms, .. }) => {
                assert_eq!(retry_after_ms, MIN_ROTATION_INTERVAL_MS - 30_000)
            }
            other => panic!("{other:?}"),
        }
        let mut t = 10;
        for k in 2..300 {
            t += MIN_ROTATION_INTERVAL_MS;
            rotate_secret(&c, "a", &format!("s{k}"), t, day).unwrap();
        }
        let s = get_subscriber(&c, "a").unwrap();
        assert_eq!(
            s.active_secrets(t),
            vec!["s299".to_string(), "s298".to_string()]
        );
        assert_eq!(stored(&c), 2);
    }

    #[test]
    fn ingest_fans_out_once_per_subscriber_and_event() {
        let c = db();
        create_subscriber(&c, &sub("a", &["video.*"]), "s").unwrap();
        create_subscriber(&c, &sub("b", &["video.trending"]), "s").unwrap();
        create_subscriber(&c, &sub("c", &["audio.*"]), "s").unwrap();
        let (out, touched) = ingest(
            &c,
            &[
                ev("e1", "video.trending"),
                ev("e2", "video.new"),
                ev("e1", "video.trending"),
            ],
            5,
        )
        .unwrap();
        let got: Vec<(u32, bool)> = out.iter().map(|o| (o.deliveries, o.duplicate)).collect();
        assert_eq!(got, vec![(2, false), (1, false), (0, true)]);
        assert_eq!(touched, vec!["a".to_string(), "b".to_string()]);
        let (again, _) = ingest(&c, &[ev("e2", "video.new")], 6).unwrap();
        assert_eq!(
            again[0],
            Ingested {
                id: "e2".into(),
                deliveries: 0,
                duplicate: true
            }
        );
    }

    #[test]
    fn claim_apply_and_lease_release() {
        let c = db();
        create_subscriber(&c, &sub("a", &["*"]), "s").unwrap();
        ingest(&c, &[ev("e1", "t"), ev("e2", "t"), ev("e3", "t")], 0).unwrap();
        let claims = claim(&c, &[("a".into(), 2)], &[], 10, 1000).unwrap();
        assert_eq!(claims[0].claimed.len(), 2);
        assert_eq!(claims[0].next_due_ms, Some(0));
        let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
        let rec = |outcome| {
            Some(AttemptRecord {
                attempt: 1,
                at_ms: 10,
                lane: "origin",
                outcome,
                status: Some(500),
                latency_ms: Some(3),
                response_body: None,
                error: None,
            })
        };
        apply(
            &c,
            &[
                Outcome {
                    rowid: ids[0],
                    transition: Transition::Sent,
                    attempt: rec("delivered"),
                },
                Outcome {
                    rowid: ids[1],
                    transition: Transition::Retry {
                        at_ms: 50,
                        error: "status 500".into(),
                    },
                    attempt: rec("failed"),
                },
            ],
            &[],
            20,
        )
        .unwrap();
        let d0 = get_delivery(&c, ids[0]).unwrap();
        assert_eq!(
            (
                d0.status.as_str(),
                d0.attempt_count,
                d0.attempts.map(|a| a.len())
            ),
            ("sent", 1, Some(1))
        );
        let d1 = get_delivery(&c, ids[1]).unwrap();
        assert_eq!(
            (d1.status.as_str(), d1.next_attempt_at_ms),
            ("pending", Some(50))
        );
        // The third is leased and then lost: it comes back once its lease expires.
        let claims = claim(&c, &[("a".into(), 5)], &[], 20, 100).unwrap();
        assert_eq!(claims[0].claimed.len(), 1);
        assert_eq!(claims[0].next_due_ms, Some(50));
        assert!(release_expired_leases(&c, 99).unwrap().is_empty());
        assert_eq!(
            release_expired_leases(&c, 101).unwrap(),
            vec!["a".to_string()]
        );
        assert_eq!(release_all_leases(&c, 200).unwrap(), 0);
        assert_eq!(due_summary(&c).unwrap(), vec![("a".to_string(), 50)]);
    }

    #[test]
    fn replay_and_removal() {
        let c = db();
        create_subscriber(&c, &sub("a", &["*"]), "s").unwrap();
        ingest(&c, &[ev("e1", "t"), ev("e2", "t")], 0).unwrap();
        let claims = claim(&c, &[("a".into(), 2)], &[], 0, 100).unwrap();
        let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
        assert!(matches!(
            replay_one(&c, ids[0], 1),
            Err(LedgerError::Conflict(_))
        ));
        let dead = |id| Outcome {
            rowid: id,
            transition: Transition::Dead {
                reason: "gone".into(),
            },
            attempt: None,
        };
        apply(&c, &[dead(ids[0]), dead(ids[1])], &[], 5).unwrap();
        let f = DeliveryFilter {
            status: Some(Status::Dead),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(list_deliveries(&c, &f).unwrap().len(), 2);
        assert_eq!(replay_one(&c, ids[0], 6).unwrap(), "a");
        assert_eq!(
            replay_step(
                &c,
                &DeliveryFilter {
                    subscriber: Some("a".into()),
                    limit: 100,
                    ..Default::default()
                },
                7
            )
            .unwrap()
            .replayed,
            1
        );
        assert_eq!(list_deliveries(&c, &f).unwrap().len(), 0);
        assert_eq!(delete_subscriber(&c, "a", 8).unwrap(), 2);
        assert!(matches!(
            replay_one(&c, ids[0], 9),
            Err(LedgerError::Conflict(_))
        ));
        assert!(get_subscriber(&c, "a").is_err());
        create_subscriber(&c, &sub("a", &["*"]), "s2").unwrap();
        assert_eq!(get_subscriber(&c, "a").unwrap().secrets.len(), 1);
    }

    /// Multi-row statements: more events and attempts than one chunk holds, a repeat across
    /// chunks, mixed types and outcomes — the same rows as one statement per row.
    #[test]
    fn large_batches_span_chunks_in_order() {
        let c = db();
        create_subscriber(&c, &sub("a", &["video.*"]), "s").unwrap();
        create_subscriber(&c, &sub("b", &["*"]), "s").unwrap();
        let n = ROWS_PER_INSERT * 2 + 7;
        let mut evs: Vec<NewEvent> = (0..n)
            .map(|i| {
                ev(
                    &format!("e{i:03}"),
                    if i % 3 == 0 { "audio.x" } else { "video.x" },
                )
            })
            .collect();
        evs.push(ev("e000", "video.x")); // a repeat, in another chunk
        let (out, touched) = ingest(&c, &evs, 1).unwrap();
        assert_eq!(touched, vec!["a".to_string(), "b".to_string()]);
        for (i, o) in out.iter().enumerate().take(n) {
            let want = if i % 3 == 0 { 1 } else { 2 };
            assert_eq!((o.deliveries, o.duplicate), (want, false), "{}", o.id);
        }
        assert_eq!((out[n].deliveries, out[n].duplicate), (0, true));
        let body: String = c
            .query_row("SELECT type FROM events WHERE id = 'e000'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(body, "audio.x", "the first occurrence is the one stored");

        let claims = claim(&c, &[("b".into(), n)], &[], 5, 1000).unwrap();
        let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
        assert_eq!(ids.len(), n);
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first");
        let in_flight: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM deliveries WHERE subscriber_id = 'b' AND status = 'in_flight'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(in_flight, n as i64);
        let rec = |k: usize| AttemptRecord {
            attempt: 1,
            at_ms: 10 + k as i64,
            lane: "origin",
            outcome: "delivered",
            status: Some(200),
            latency_ms: Some(k as u64),
            response_body: Some(format!("r{k}")),
            error: None,
        };
        // Runs of Sent broken by a retry and a deferral (which records no attempt).
        let outcomes: Vec<Outcome> = ids
            .iter()
            .enumerate()
            .map(|(k, &rowid)| Outcome {
                rowid,
                transition: match k {
                    3 => Transition::Retry {
                        at_ms: 99,
                        error: "status 500".into(),
                    },
                    4 => Transition::Defer { at_ms: 77 },
                    _ => Transition::Sent,
                },
                attempt: (k != 4).then(|| rec(k)),
            })
            .collect();
        apply(&c, &outcomes, &[], 20).unwrap();
        let counts: Vec<(String, i64)> = status_counts(&c).unwrap();
        let count = |s: &str| counts.iter().find(|(k, _)| k == s).map_or(0, |(_, n)| *n);
        assert_eq!(count("sent"), n as i64 - 2);
        assert_eq!(count("in_flight"), 0);
        let d3 = get_delivery(&c, ids[3]).unwrap();
        assert_eq!(
            (d3.status.as_str(), d3.next_attempt_at_ms),
            ("pending", Some(99))
        );
        let d4 = get_delivery(&c, ids[4]).unwrap();
        assert_eq!((d4.attempt_count, d4.next_attempt_at_ms), (0, Some(77)));
        // Every attempt recorded once, in outcome order, with its own values.
        let recorded: Vec<(i64, i64, String)> = c
            .prepare("SELECT delivery_id, latency_ms, response_body FROM attempts ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected: Vec<(i64, i64, String)> = ids
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != 4)
            .map(|(k, &id)| (id, k as i64, format!("r{k}")))
            .collect();
        assert_eq!(recorded, expected);
    }
}
