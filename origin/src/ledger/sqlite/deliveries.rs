//! Deliveries on SQLite, as the API reads and replays them: lists by filter (`filter.rs`
//! writes the `WHERE`), one delivery with its attempts, replays one at a time or in steps;
//! [`Deliveries`] for the API. Ingest itself is `ingest.rs`.

use rusqlite::{params, Connection, OptionalExtension};

use super::cells::{decode_all, decode_one};
use super::customers::delivery_owner;
use super::ingest::ingest;
use super::leases::id_list;
use super::ledger::Ledger;
use super::ordered;
use super::subscribers::{get_subscriber, visible_subscriber};
use crate::ledger::deliveries::HELD_COUNT_MAX;
use crate::ledger::deliveries::{
    Deliveries, DeliveryFilter, DeliveryView, HeldKey, Ingested, NewEvent, ReplayStep,
};
use crate::ledger::error::{test_too_soon, LedgerError};
use crate::ledger::filter::{self, Arg, Dialect};
use crate::ledger::rows::deliveries::{
    decode_attempt, decode_delivery, ATTEMPT_VIEW, DELIVERY_VIEW,
};
use crate::ledger::rules;
use crate::ledger::scope;
use crate::model::{delivery_public_id, Status};
use crate::ordering::{header_value, HELD_MS};

/// A filter's arguments as SQLite values.
fn values(args: Vec<Arg>) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    args.into_iter()
        .map(|a| match a {
            Arg::Text(t) => Value::Text(t),
            Arg::Int(n) => Value::Integer(n),
        })
        .collect()
}

/// The `WHERE` clause of a delivery filter and its arguments (`filter.rs`).
fn filter_sql(f: &DeliveryFilter) -> (String, Vec<rusqlite::types::Value>) {
    let (clause, args) = filter::where_clause(f, Dialect::Sqlite);
    (clause, values(args))
}

/// Deliveries matching `f`, in id order, at most `f.limit`. A subscriber without a status is
/// read as one id-ordered range per status, merged: each range is an index's, so no list
/// reads more than `4 × limit` rows whatever the ledger holds. A customer's (a portal token's
/// scope) is read per subscriber it owns, so it reads no other customer's rows.
pub fn list_deliveries(
    c: &Connection,
    f: &DeliveryFilter,
) -> Result<Vec<DeliveryView>, LedgerError> {
    // One snapshot for every range: a delivery changing status between two of them (pending
    // to in flight and back) is in one of them, not in neither.
    let tx = c.unchecked_transaction()?;
    let rows = list_rows(&tx, f)?;
    tx.commit()?;
    Ok(rows.into_iter().map(|(_, d)| d).collect())
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
        "SELECT {DELIVERY_VIEW} FROM deliveries d LEFT JOIN events e ON e.id = d.event_id
         {filter} ORDER BY d.id LIMIT {}",
        f.limit
    );
    let mut st = c.prepare_cached(&sql)?;
    decode_all(&mut st, rusqlite::params_from_iter(args), |r| {
        Ok((r.get::<_, i64>(0)?, decode_delivery(r, 0)?))
    })
}

pub fn get_delivery(c: &Connection, rowid: i64) -> Result<DeliveryView, LedgerError> {
    let sql = format!(
        "SELECT {DELIVERY_VIEW} FROM deliveries d LEFT JOIN events e ON e.id = d.event_id
         WHERE d.id = ?1"
    );
    let mut d = decode_one(&mut c.prepare_cached(&sql)?, [rowid], |r| {
        decode_delivery(r, 0)
    })?
    .ok_or_else(|| LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid))))?;
    let sql = format!(
        "SELECT {} FROM attempts WHERE delivery_id = ?1 ORDER BY id",
        *ATTEMPT_VIEW
    );
    let attempts = decode_all(&mut c.prepare_cached(&sql)?, [rowid], |r| decode_attempt(r))?;
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
    let rejoins = rules::replay_one(
        rowid,
        row.as_ref().map(|(sub, status)| rules::ReplayRow {
            subscriber: sub,
            status: Status::parse(status),
            subscriber_live: get_subscriber(c, sub).is_ok(),
        }),
    )?;
    let sub = row.map(|(sub, _)| sub).unwrap_or_default();
    // A held delivery stays held; an ended one of an ordered key rejoins its key.
    c.execute(
        "UPDATE deliveries SET status = 'pending', attempts = 0, last_error = NULL, updated_ms = ?2,
             next_attempt_ms = CASE WHEN next_attempt_ms = ?3 AND status = 'pending' THEN ?3
                                    ELSE ?2 END
         WHERE id = ?1",
        params![rowid, now_ms, HELD_MS],
    )?;
    if rejoins {
        ordered::rejoin(c, &[rowid], now_ms)?;
    }
    Ok(sub)
}

/// The `WHERE` clause (and its arguments) of the deliveries a bulk replay takes (`filter.rs`).
fn replayable_sql(
    f: &DeliveryFilter,
) -> Result<(String, Vec<rusqlite::types::Value>), LedgerError> {
    let (clause, args) = filter::replayable(f, Dialect::Sqlite)?;
    Ok((clause, values(args)))
}

/// How many deliveries a bulk replay ([`replay_step`]s) would replay now (a dry run).
pub fn count_replayable(c: &Connection, f: &DeliveryFilter) -> Result<u64, LedgerError> {
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
    Ok(n.max(0) as u64)
}

/// One step of a bulk replay: the first `f.limit` deliveries matching the filter after
/// `f.after`, in id order (its status defaults to dead; in-flight ones and removed
/// subscribers' are skipped; pending ones are left as they are), put back in the queue.
pub fn replay_step(
    c: &Connection,
    f: &DeliveryFilter,
    now_ms: i64,
) -> Result<ReplayStep, LedgerError> {
    let parts = match customer_ranges(c, f)? {
        // A customer's: its subscribers' first ids, merged.
        Some(per_subscriber) => per_subscriber
            .iter()
            .map(|one| replayable_ids(c, one))
            .collect::<Result<_, _>>()?,
        None => vec![replayable_ids(c, f)?],
    };
    let ids = rules::replay_ids(parts, f.limit);
    // Replayed deliveries of ordered keys rejoin their keys (`ordered::rejoin`).
    let mut keyed: Vec<i64> = Vec::new();
    let subs: Vec<String> = c
        .prepare_cached(
            "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_ms = ?1,
                 last_error = NULL, updated_ms = ?1
             WHERE id IN (SELECT value FROM json_each(?2)) AND status IN ('sent', 'dead')
             RETURNING subscriber_id, id, ordering_key IS NOT NULL",
        )?
        .query_map(params![now_ms, id_list(ids.iter().copied())], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .map(|row: rusqlite::Result<(String, i64, bool)>| {
            let (sub, id, ordered) = row?;
            if ordered {
                keyed.push(id);
            }
            Ok::<_, rusqlite::Error>(sub)
        })
        .collect::<Result<_, _>>()?;
    ordered::rejoin(c, &keyed, now_ms)?;
    Ok(rules::replay_step(&ids, f.limit, subs))
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

/// Deliveries per status, for `/metrics`: from the counts the triggers keep, not a scan.
pub fn status_counts(c: &Connection) -> Result<Vec<(String, i64)>, LedgerError> {
    let mut st = c.prepare_cached("SELECT status, SUM(n) FROM delivery_counts GROUP BY status")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Store a test event and a delivery of it to `subscriber` alone (no other subscriber's
/// patterns are consulted). Returns the delivery's row id. `TooSoon` while its previous test
/// event is unfinished or younger than `MIN_TEST_INTERVAL_MS`.
pub fn ingest_test(
    c: &Connection,
    subscriber: &str,
    event: &NewEvent,
    now_ms: i64,
) -> Result<i64, LedgerError> {
    get_subscriber(c, subscriber)?;
    let previous: Option<(String, i64)> = c
        .prepare_cached(
            "SELECT d.status, e.received_ms
             FROM subscribers s
             JOIN deliveries d ON d.event_id = s.last_test_event AND d.subscriber_id = s.id
             JOIN events e ON e.id = d.event_id
             WHERE s.id = ?1",
        )?
        .query_row([subscriber], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let previous = previous.map(|(status, made)| (unfinished(&status), made));
    if let Some(wait) = crate::model::test_event_wait_ms(previous, now_ms) {
        return Err(test_too_soon(subscriber, wait));
    }
    c.prepare_cached("UPDATE subscribers SET last_test_event = ?2 WHERE id = ?1")?
        .execute(params![subscriber, event.id])?;
    c.prepare_cached("INSERT INTO events (id, type, body, received_ms) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![event.id, event.event_type, event.body, now_ms])?;
    let sequence = super::ingest::reserve_sequences(c, |_| subscriber, &[0])?;
    c.prepare_cached(
        "INSERT INTO deliveries (subscriber_id, event_id, status, next_attempt_ms, created_ms,
             updated_ms, sequence)
         VALUES (?1, ?2, 'pending', ?3, ?3, ?3, ?4)",
    )?
    .execute(params![subscriber, event.id, now_ms, sequence[0]])?;
    Ok(c.last_insert_rowid())
}

/// Whether a delivery in this stored status is still to be sent.
fn unfinished(status: &str) -> bool {
    matches!(
        crate::model::Status::parse(status),
        Some(crate::model::Status::Pending | crate::model::Status::InFlight)
    )
}

/// Ordered keys held back (`crate::ordering`, `ordered.rs`). The statement behind
/// [`held_keys`]: of subscriber `?1`'s keys in key order, those with a
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

impl Deliveries for Ledger {
    async fn ingest(
        &self,
        events: Vec<NewEvent>,
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        self.tx_shared(move |c| ingest(c, &events, now_ms)).await
    }

    async fn list_deliveries(
        &self,
        filter: DeliveryFilter,
    ) -> Result<Vec<DeliveryView>, LedgerError> {
        self.read(move |c| list_deliveries(c, &filter)).await
    }

    async fn get_delivery(
        &self,
        rowid: i64,
        scope: Option<String>,
    ) -> Result<DeliveryView, LedgerError> {
        self.read(move |c| {
            scope::delivery(
                scope.as_deref(),
                rowid,
                delivery_owner(c, rowid)?.as_deref(),
            )?;
            get_delivery(c, rowid)
        })
        .await
    }

    async fn replay_one(
        &self,
        rowid: i64,
        now_ms: i64,
        scope: Option<String>,
    ) -> Result<String, LedgerError> {
        self.tx(move |c| {
            scope::delivery(
                scope.as_deref(),
                rowid,
                delivery_owner(c, rowid)?.as_deref(),
            )?;
            replay_one(c, rowid, now_ms)
        })
        .await
    }

    async fn held_keys(
        &self,
        subscriber: String,
        limit: usize,
        scope: Option<String>,
    ) -> Result<Vec<HeldKey>, LedgerError> {
        self.read(move |c| {
            visible_subscriber(c, &subscriber, scope.as_deref())?;
            held_keys(c, &subscriber, limit)
        })
        .await
    }

    async fn replay_step(
        &self,
        filter: DeliveryFilter,
        now_ms: i64,
    ) -> Result<ReplayStep, LedgerError> {
        self.tx(move |c| {
            if let Some(s) = &filter.subscriber {
                visible_subscriber(c, s, filter.customer.as_deref())?;
            }
            replay_step(c, &filter, now_ms)
        })
        .await
    }

    async fn count_replayable(&self, filter: DeliveryFilter) -> Result<u64, LedgerError> {
        self.read(move |c| {
            if let Some(s) = &filter.subscriber {
                visible_subscriber(c, s, filter.customer.as_deref())?;
            }
            count_replayable(c, &filter)
        })
        .await
    }

    async fn ingest_test(
        &self,
        subscriber: String,
        event: NewEvent,
        now_ms: i64,
        scope: Option<String>,
    ) -> Result<i64, LedgerError> {
        self.tx(move |c| {
            visible_subscriber(c, &subscriber, scope.as_deref())?;
            ingest_test(c, &subscriber, &event, now_ms)
        })
        .await
    }
}
