//! The dispatcher's claims and results on PostgreSQL: the shared limiter asked under each
//! subscriber row's lock, due deliveries leased to this daemon, results recorded only under the
//! lease they were sent under, own leases released, work due. `dispatch.rs` strings them into
//! a turn; the statements here are prepared once per connection.

use std::collections::{BTreeMap, HashMap, HashSet};

use deadpool_postgres::Transaction;
use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::{LimiterState, Limits as CoreLimits, Reservation};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::ledger::PgLedger;
use super::shared::{grant_shared, shared_wait};
use crate::ledger::rules::{ended_key, requests, run_tail, written};
use crate::ledger::{Claimed, LedgerError, Outcome};
use crate::model::Limits;
use crate::model::{Order, Status};

use super::rows::*;

// ---------------------------------------------------------------------------------------------
// Claims and results

/// What one claim took for one subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct PgClaim {
    pub subscriber_id: String,
    /// Leased to this daemon until `lease_expires_ms`, oldest due first.
    pub claimed: Vec<Claimed>,
    /// The lease's expiry: a result is recorded only under this same lease.
    pub lease_expires_ms: i64,
    /// Deliveries in flight for this subscriber across every daemon, these included.
    pub in_flight: u32,
    /// Due work was left because the shared limiter said wait (its rate, a pause, the
    /// breaker; never the in-flight cap): how long, at least.
    pub wait_ms: Option<u64>,
    /// When its earliest remaining pending delivery is due, if it has one.
    pub next_due_ms: Option<i64>,
    /// A claim in runs: each request's deliveries, in `claimed`'s order (`Claim::runs`).
    pub runs: Vec<usize>,
}

/// What `apply` recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// Outcomes recorded.
    pub recorded: usize,
    /// Deliveries whose result was ignored: their lease had expired and been taken over (or
    /// the delivery was removed with its subscriber) — another daemon owns them now.
    pub stale: Vec<i64>,
    /// Subscribers whose held deliveries became due: an ordered key's head ended.
    pub released: Vec<String>,
}

// The hot path's statements, prepared once per connection (`prepare_cached`): a turn sends
// each as one Bind/Execute, several at once where the next does not need the previous answer.

/// The rows of subscribers to claim for, locked in id order.
pub(super) const CLAIM_LOCK: &str =
    "SELECT id, rate_per_sec, burst, max_in_flight, limiter FROM subscribers
     WHERE id = ANY($1) AND deleted_ms IS NULL AND disabled_ms IS NULL
     ORDER BY id FOR UPDATE";

/// Their expired leases, of any daemon, back to the queue due now (locked ones skipped) —
/// except the later deliveries of a run of one ordered key (`CLAIM_RUNS`): held again behind
/// its first, the key's head.
pub(super) const CLAIM_EXPIRE: &str =
    "UPDATE deliveries SET status = 'pending', lease_owner = NULL,
         lease_expires_ms = NULL, next_attempt_ms = CASE
             WHEN ordering_key IS NOT NULL AND batch_lead IS NOT NULL AND batch_lead <> id
             THEN 9223372036854775807 ELSE $2 END,
         updated_ms = $2
     WHERE id IN (SELECT id FROM deliveries
                  WHERE subscriber_id = ANY($1) AND status = 'in_flight'
                    AND lease_expires_ms <= $2
                  FOR UPDATE SKIP LOCKED)";

/// Their sends in flight, every daemon's: a delivery alone, or a batch's lead (its other
/// deliveries name it in `batch_lead` and are not counted).
pub(super) const CLAIM_COUNT: &str = "SELECT subscriber_id,
         COUNT(*) FILTER (WHERE batch_lead IS NULL OR batch_lead = id) FROM deliveries
     WHERE subscriber_id = ANY($1) AND status = 'in_flight' GROUP BY subscriber_id";

/// What every claim statement returns of a leased delivery (with its event), in the order
/// `lease_in` reads it.
macro_rules! claimed_columns {
    () => {
        "RETURNING d.id, d.subscriber_id, d.event_id, e.type, e.body, d.attempts,
             d.next_attempt_ms, d.sequence, e.received_ms, d.ordering_key, d.previous_sequence,
             e.traceparent, d.batch_lead"
    };
}

/// Up to `$2[k]` due deliveries of subscriber `$1[k]`, oldest due first, rows another
/// transaction holds skipped, leased to `$3` until `$4` — picked, locked, leased and read
/// (with their event) by one statement.
pub(super) const CLAIM_LEASE: &str = concat!(
    "UPDATE deliveries d SET status = 'in_flight', lease_owner = $3,
         lease_expires_ms = $4, updated_ms = $5, batch_lead = NULL
     FROM events e
     WHERE d.id = ANY(ARRAY(
               SELECT c.id FROM unnest($1::text[], $2::bigint[]) AS w(sub, n)
               CROSS JOIN LATERAL (
                   SELECT id FROM deliveries
                   WHERE subscriber_id = w.sub AND status = 'pending' AND next_attempt_ms <= $5
                   ORDER BY next_attempt_ms, id LIMIT w.n
                   FOR UPDATE SKIP LOCKED) c))
       AND e.id = d.event_id
     ",
    claimed_columns!()
);

/// [`CLAIM_LEASE`] for batching subscribers: up to `$2[k]` due deliveries of `$1[k]` in groups
/// of `$6[k]` (in the order they are leased and returned), each delivery naming its group's
/// first in `batch_lead` — one request each (`fanout_core::batch`, counted by [`CLAIM_COUNT`]).
pub(super) const CLAIM_LEASE_BATCHES: &str = concat!(
    "UPDATE deliveries d SET status = 'in_flight', lease_owner = $3,
         lease_expires_ms = $4, updated_ms = $5, batch_lead = g.lead
     FROM events e, (
         SELECT c.id, first_value(c.id) OVER (
                    PARTITION BY w.sub, (c.rn - 1) / w.per ORDER BY c.rn) AS lead
         FROM unnest($1::text[], $2::bigint[], $6::bigint[]) AS w(sub, n, per)
         CROSS JOIN LATERAL (
             SELECT q.id, row_number() OVER (ORDER BY q.next_attempt_ms, q.id) AS rn
             FROM (SELECT id, next_attempt_ms FROM deliveries
                   WHERE subscriber_id = w.sub AND status = 'pending' AND next_attempt_ms <= $5
                   ORDER BY next_attempt_ms, id LIMIT w.n
                   FOR UPDATE SKIP LOCKED) q) c) g
     WHERE d.id = g.id AND e.id = d.event_id
     ",
    claimed_columns!()
);

/// The runs of ordered batching subscribers' heads just leased: for each head `$1[k]` (of
/// subscriber `$2[k]`, key `$3[k]`), up to `$7[k]` of its key's held deliveries, lowest number
/// first, leased to `$4` until `$5` with the head as their `batch_lead` — one request each.
/// Waits for a held row another transaction holds (skipping it would break the run's order).
pub(super) const CLAIM_RUNS: &str = concat!(
    "UPDATE deliveries d SET status = 'in_flight', lease_owner = $4,
         lease_expires_ms = $5, updated_ms = $6, batch_lead = r.lead
     FROM events e, (
         SELECT m.id, w.lead
         FROM unnest($1::bigint[], $2::text[], $3::text[], $7::bigint[]) AS w(lead, sub, key, n)
         CROSS JOIN LATERAL (
             SELECT id FROM deliveries
             WHERE subscriber_id = w.sub AND ordering_key = w.key
               AND next_attempt_ms = 9223372036854775807
               AND ordering_key IS NOT NULL AND status IN ('pending', 'in_flight')
               AND status = 'pending'
             ORDER BY sequence LIMIT w.n
             FOR UPDATE) m) r
     WHERE d.id = r.id AND e.id = d.event_id
     ",
    claimed_columns!()
);

/// Shared limiter states back in their (locked) rows.
pub(super) const STORE_LIMITERS: &str = "UPDATE subscribers s SET limiter = u.l
     FROM unnest($1::text[], $2::text[]) AS u(id, l) WHERE s.id = u.id";

/// When each subscriber's earliest pending delivery is due: one index probe each (held
/// deliveries, due at `ordering::HELD_MS`, are not due).
pub(super) const CLAIM_NEXT_DUE: &str = "SELECT w.sub, n.due FROM unnest($1::text[]) AS w(sub)
     CROSS JOIN LATERAL (
         SELECT next_attempt_ms AS due FROM deliveries
         WHERE subscriber_id = w.sub AND status = 'pending'
           AND next_attempt_ms < 9223372036854775807
         ORDER BY next_attempt_ms LIMIT 1) n";

/// Results of deliveries still leased to `$8` (the owner decides: a result of a delivery
/// another daemon took over is stale), and the attempts (`$9..$17`, in order) of those
/// recorded; returns the ids recorded.
pub(super) const RECORD_OUTCOMES: &str = "WITH done AS (
         UPDATE deliveries d SET status = u.status, attempts = d.attempts + u.spent,
             next_attempt_ms = COALESCE(u.next, d.next_attempt_ms),
             last_error = CASE WHEN u.keep THEN d.last_error ELSE u.err END,
             lease_owner = NULL, lease_expires_ms = NULL, updated_ms = $7
         FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bigint[],
                     $5::text[], $6::bool[]) AS u(id, status, spent, next, err, keep)
         WHERE d.id = u.id AND d.status = 'in_flight' AND d.lease_owner = $8
         RETURNING d.id, d.subscriber_id, d.status, d.ordering_key),
     tried AS (
         INSERT INTO attempts (delivery_id, attempt, at_ms, lane, outcome, status, latency_ms,
             response_body, error)
         SELECT x.delivery, x.number, x.at, x.lane, x.outcome, x.status, x.latency, x.body,
             x.error
         FROM unnest($9::bigint[], $10::int[], $11::bigint[], $12::text[], $13::text[],
                     $14::int[], $15::bigint[], $16::text[], $17::text[])
             WITH ORDINALITY AS x(delivery, number, at, lane, outcome, status, latency, body,
                                  error, ord)
         WHERE x.delivery IN (SELECT id FROM done)
         ORDER BY x.ord)
     SELECT id, subscriber_id, status, ordering_key FROM done";

/// How a batching subscriber's claim is taken (`Turn::batch_per`, `Turn::runs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Per {
    /// Deliveries per request.
    pub n: usize,
    /// In runs of one ordered key (`CLAIM_RUNS`).
    pub runs: bool,
}

/// A claim's grants as its lease statements take them.
#[derive(Debug, Default)]
struct Grants<'a> {
    /// Subscribers that send one delivery per request, and how many each (`CLAIM_LEASE`).
    ids: Vec<&'a str>,
    counts: Vec<i64>,
    /// Batching subscribers, their deliveries and deliveries per request
    /// (`CLAIM_LEASE_BATCHES`; a subscriber in runs asks its heads there, one per request).
    batch_ids: Vec<&'a str>,
    batch_counts: Vec<i64>,
    batch_pers: Vec<i64>,
    /// Subscribers in runs, with the most deliveries each head's run adds (`CLAIM_RUNS`).
    runs: HashMap<&'a str, i64>,
}

fn split_grants<'a>(
    held: &'a [(String, CoreLimits, LimiterState, Reservation)],
    per: &HashMap<&str, Per>,
) -> Grants<'a> {
    let mut g = Grants::default();
    for (id, _, _, reservation) in held {
        let requests = reservation.granted();
        if requests == 0 {
            continue;
        }
        match per.get(id.as_str()) {
            Some(p) if p.runs => {
                g.batch_ids.push(id.as_str());
                g.batch_counts.push(requests as i64);
                g.batch_pers.push(1);
                g.runs.insert(id.as_str(), run_tail(p.n) as i64);
            }
            Some(p) => {
                g.batch_ids.push(id.as_str());
                g.batch_counts.push((requests * p.n.max(1)) as i64);
                g.batch_pers.push(p.n.max(1) as i64);
            }
            None => {
                g.ids.push(id.as_str());
                g.counts.push(requests as i64);
            }
        }
    }
    g
}

/// `Turn::batch_per` by subscriber, with `Turn::runs`.
pub(super) fn per_of<'a>(
    batch_per: &'a [(String, usize)],
    runs: &[String],
) -> HashMap<&'a str, Per> {
    batch_per
        .iter()
        .map(|(id, n)| {
            let per = Per {
                n: *n,
                runs: runs.contains(id),
            };
            (id.as_str(), per)
        })
        .collect()
}

/// The most asked of each subscriber (once each, in id order).
pub(super) fn wanted_of(wants: &[(String, usize)]) -> BTreeMap<&str, usize> {
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, most) in wants {
        let w = wanted.entry(id.as_str()).or_default();
        *w = (*w).max(*most);
    }
    wanted
}

/// A leased row: when it was due, the first delivery of its request (itself when alone),
/// the delivery.
struct Leased {
    due: i64,
    lead: i64,
    claimed: Claimed,
}

/// A subscriber's leased rows in the order the dispatcher takes them: request by request, the
/// requests oldest due first, each its first delivery and then the others by due time and
/// number (a run: its key's held deliveries by sequence). With `runs`, each request's size too
/// (`Claim::runs`).
fn in_requests(mut leased: Vec<Leased>, runs: bool) -> (Vec<Claimed>, Vec<usize>) {
    if leased.iter().all(|d| d.lead == d.claimed.rowid) {
        // One delivery a request (the common case): oldest due first.
        leased.sort_by_key(|d| (d.due, d.claimed.rowid));
        let sizes = if runs {
            vec![1; leased.len()]
        } else {
            Vec::new()
        };
        return (leased.into_iter().map(|d| d.claimed).collect(), sizes);
    }
    let lead_due: HashMap<i64, i64> = leased
        .iter()
        .filter(|d| d.lead == d.claimed.rowid)
        .map(|d| (d.lead, d.due))
        .collect();
    leased.sort_by_key(|d| {
        let first = lead_due.get(&d.lead).copied().unwrap_or(d.due);
        (
            first,
            d.lead,
            d.lead != d.claimed.rowid,
            d.due,
            d.claimed.sequence,
            d.claimed.rowid,
        )
    });
    let mut sizes: Vec<usize> = Vec::new();
    if runs {
        let mut last = None;
        for d in &leased {
            if last == Some(d.lead) {
                if let Some(n) = sizes.last_mut() {
                    *n += 1;
                }
            } else {
                sizes.push(1);
                last = Some(d.lead);
            }
        }
    }
    (leased.into_iter().map(|d| d.claimed).collect(), sizes)
}

pub(super) fn core_limits(row: &Row, breaker: BreakerConfig) -> Result<CoreLimits, LedgerError> {
    Ok(Limits {
        rate_per_sec: row.try_get("rate_per_sec")?,
        burst: row.try_get::<_, i32>("burst")?.max(1) as u32,
        max_in_flight: row.try_get::<_, i32>("max_in_flight")?.max(1) as u32,
        timeout_ms: 0,
    }
    .core(breaker))
}

impl PgLedger {
    /// Lease due deliveries for each `(subscriber, most)` — at most `most`, and only what the
    /// subscriber's shared limiter grants across every daemon — to `owner` until `lease_until`,
    /// inside the caller's transaction. Leases of any daemon that expired return to the queue
    /// first; disabled and removed subscribers get nothing (and are left out of the answer). Three round trips, whatever the number of subscribers and deliveries:
    /// the locks and counts, the lease, the limiters and what remains due.
    pub(super) async fn claim_in(
        tx: &Transaction<'_>,
        owner: &str,
        wants: &[(String, usize)],
        per: &HashMap<&str, Per>,
        breaker: BreakerConfig,
        now_ms: i64,
        lease_until: i64,
    ) -> Result<Vec<PgClaim>, LedgerError> {
        let wanted = wanted_of(wants);
        let ids: Vec<&str> = wanted.keys().copied().collect();
        // 1-3, pipelined (the server runs them in this order): the subscribers' rows, locked
        // in id order (one claimer per subscriber at a time); their expired leases (of any
        // daemon) back to the queue, due now — one being recorded right now (locked) is left
        // to that transaction; then what is in flight, from the live leases.
        let (lock, expire, count) = tokio::try_join!(
            tx.prepare_cached(CLAIM_LOCK),
            tx.prepare_cached(CLAIM_EXPIRE),
            tx.prepare_cached(CLAIM_COUNT),
        )?;
        let by_id: &[&(dyn ToSql + Sync)] = &[&ids];
        let expire_args: &[&(dyn ToSql + Sync)] = &[&ids, &now_ms];
        let (subs, _, counted) = tokio::try_join!(
            tx.query(&lock, by_id),
            tx.execute(&expire, expire_args),
            tx.query(&count, by_id),
        )?;
        let mut live = Vec::with_capacity(subs.len());
        for r in &subs {
            let id: String = r.try_get(0)?;
            let raw: Option<String> = r.try_get("limiter")?;
            let limiter = decode_limiter(&id, raw.as_deref(), now_ms);
            live.push((id, core_limits(r, breaker)?, limiter));
        }
        Self::lease_in(tx, owner, &wanted, per, live, &counted, now_ms, lease_until).await
    }

    /// The rest of a claim once the subscribers' rows are locked — `live`: the live ones in id
    /// order, with their limits and shared limiter as of now — and their sends in flight
    /// counted (`counted`: the rows of `CLAIM_COUNT`, run after their expired leases went back
    /// to the queue). Two round trips.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lease_in(
        tx: &Transaction<'_>,
        owner: &str,
        wanted: &BTreeMap<&str, usize>,
        per: &HashMap<&str, Per>,
        live: Vec<(String, CoreLimits, LimiterState)>,
        counted: &[Row],
        now_ms: i64,
        lease_until: i64,
    ) -> Result<Vec<PgClaim>, LedgerError> {
        let mut in_flight: HashMap<String, u32> = HashMap::new();
        for r in counted {
            in_flight.insert(r.try_get(0)?, r.try_get::<_, i64>(1)?.max(0) as u32);
        }
        // 4. The shared limiter of each decides how many may go now, of what was asked and
        // what the in-flight cap leaves: reserved here, committed below to what was found.
        let mut held = Vec::with_capacity(live.len());
        // A batching subscriber's grant is in requests, each `per` deliveries.
        for (id, l, mut limiter) in live {
            let busy = in_flight.get(&id).copied().unwrap_or(0);
            let most = wanted.get(id.as_str()).copied().unwrap_or(0);
            let most = per.get(id.as_str()).map_or(most, |p| requests(most, p.n));
            let reservation = grant_shared(&mut limiter, l, busy, most, now_ms);
            held.push((id, l, limiter, reservation));
        }
        let grants = split_grants(&held, per);
        // 5. Lease that many due deliveries of each to this daemon, oldest due first, rows
        // another transaction holds skipped: one statement picks, locks, leases and reads
        // them (and one more leases the runs of ordered batching subscribers' heads).
        let leased_rows = Self::lease_rows(tx, owner, &grants, lease_until, now_ms).await?;
        let mut claimed: HashMap<String, Vec<Leased>> = HashMap::new();
        for r in leased_rows {
            let rowid: i64 = r.try_get(0)?;
            claimed.entry(r.try_get(1)?).or_default().push(Leased {
                due: r.try_get(6)?,
                lead: r.try_get::<_, Option<i64>>(12)?.unwrap_or(rowid),
                claimed: Claimed {
                    rowid,
                    event_id: r.try_get(2)?,
                    event_type: r.try_get(3)?,
                    body: r.try_get(4)?,
                    attempt: (r.try_get::<_, i32>(5)?.max(0) as u32).saturating_add(1),
                    sequence: r.try_get::<_, i64>(7)?.max(0) as u64,
                    received_ms: r.try_get(8)?,
                    order: Order::of(r.try_get(9)?, r.try_get(10)?),
                    traceparent: r.try_get(11)?,
                },
            });
        }
        // 6. Keep what was leased of each reservation (one send per request: a delivery
        // alone, or a batch's first), give back the rest exactly.
        let mut store_ids: Vec<&str> = Vec::with_capacity(held.len());
        let mut store_states: Vec<String> = Vec::with_capacity(held.len());
        for (id, l, limiter, reservation) in &mut held {
            let sends = claimed.get(id.as_str()).map_or(0, |rows| {
                rows.iter().filter(|d| d.lead == d.claimed.rowid).count()
            });
            limiter.commit(*l, *reservation, sends);
            *in_flight.entry(id.clone()).or_default() += sends as u32;
            store_ids.push(id.as_str());
            store_states.push(encode_limiter(limiter));
        }
        // 7, 8, pipelined: the limiters back in their rows; what remains due, for the
        // dispatcher's next wake-up (one index probe per subscriber).
        let (store, next) = tokio::try_join!(
            tx.prepare_cached(STORE_LIMITERS),
            tx.prepare_cached(CLAIM_NEXT_DUE),
        )?;
        let store_args: &[&(dyn ToSql + Sync)] = &[&store_ids, &store_states];
        let next_args: &[&(dyn ToSql + Sync)] = &[&store_ids];
        let (_, next_rows) =
            tokio::try_join!(tx.execute(&store, store_args), tx.query(&next, next_args))?;
        let mut next_due: HashMap<String, i64> = HashMap::new();
        for r in next_rows {
            next_due.insert(r.try_get(0)?, r.try_get(1)?);
        }
        let mut out = Vec::with_capacity(held.len());
        for (id, l, limiter, _) in held {
            let next_due_ms = next_due.get(&id).copied();
            let busy = in_flight.get(&id).copied().unwrap_or(0);
            let wait_ms = shared_wait(&limiter, l, busy, next_due_ms, now_ms);
            let leased = claimed.remove(&id).unwrap_or_default();
            let in_runs = per.get(id.as_str()).is_some_and(|p| p.runs);
            let (leased, runs) = in_requests(leased, in_runs);
            out.push(PgClaim {
                claimed: leased,
                runs,
                lease_expires_ms: lease_until,
                in_flight: busy,
                wait_ms,
                next_due_ms,
                subscriber_id: id,
            });
        }
        Ok(out)
    }

    /// Lease each subscriber's grant (`Grants`): at most three statements, each picking,
    /// locking, leasing and reading — the last the runs of the heads the second leased.
    async fn lease_rows(
        tx: &Transaction<'_>,
        owner: &str,
        g: &Grants<'_>,
        lease_until: i64,
        now_ms: i64,
    ) -> Result<Vec<Row>, LedgerError> {
        let mut rows = Vec::new();
        if !g.ids.is_empty() {
            let lease = tx.prepare_cached(CLAIM_LEASE).await?;
            rows = tx
                .query(&lease, &[&g.ids, &g.counts, &owner, &lease_until, &now_ms])
                .await?;
        }
        if g.batch_ids.is_empty() {
            return Ok(rows);
        }
        let lease = tx.prepare_cached(CLAIM_LEASE_BATCHES).await?;
        let args: &[&(dyn ToSql + Sync)] = &[
            &g.batch_ids,
            &g.batch_counts,
            &owner,
            &lease_until,
            &now_ms,
            &g.batch_pers,
        ];
        let batched = tx.query(&lease, args).await?;
        let (mut leads, mut subs, mut keys, mut most) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in &batched {
            let sub: &str = r.try_get(1)?;
            let key: Option<&str> = r.try_get(9)?;
            if let (Some(&n), Some(key)) = (g.runs.get(sub), key) {
                if n > 0 {
                    leads.push(r.try_get::<_, i64>(0)?);
                    subs.push(sub.to_string());
                    keys.push(key.to_string());
                    most.push(n);
                }
            }
        }
        rows.extend(batched);
        if !leads.is_empty() {
            let runs = tx.prepare_cached(CLAIM_RUNS).await?;
            let args: &[&(dyn ToSql + Sync)] =
                &[&leads, &subs, &keys, &owner, &lease_until, &now_ms, &most];
            rows.extend(tx.query(&runs, args).await?);
        }
        Ok(rows)
    }

    /// Record results of deliveries leased to `owner` and the attempts of those recorded, in order: one statement whatever their number.
    pub(super) async fn record_outcomes(
        tx: &Transaction<'_>,
        owner: &str,
        outcomes: &[Outcome],
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if outcomes.is_empty() {
            return Ok(Applied::default());
        }
        let n = outcomes.len();
        let mut ids = Vec::with_capacity(n);
        let mut statuses: Vec<&str> = Vec::with_capacity(n);
        let mut spent: Vec<i32> = Vec::with_capacity(n);
        let mut next: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut errors: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut keep_error: Vec<bool> = Vec::with_capacity(n);
        // The attempts, of every outcome that made one (only those recorded are stored).
        let mut a_ids: Vec<i64> = Vec::with_capacity(n);
        let mut a_n: Vec<i32> = Vec::with_capacity(n);
        let mut a_at: Vec<i64> = Vec::with_capacity(n);
        let mut a_lane: Vec<&str> = Vec::with_capacity(n);
        let mut a_outcome: Vec<&str> = Vec::with_capacity(n);
        let mut a_status: Vec<Option<i32>> = Vec::with_capacity(n);
        let mut a_latency: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut a_body: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut a_error: Vec<Option<&str>> = Vec::with_capacity(n);
        for o in outcomes {
            ids.push(o.rowid);
            let w = written(o);
            let (err, keep) = w.last_error.columns();
            statuses.push(w.status.as_str());
            spent.push(w.spent);
            next.push(w.next_attempt_ms);
            errors.push(err);
            keep_error.push(keep);
            if let Some(a) = &o.attempt {
                a_ids.push(o.rowid);
                a_n.push(a.attempt.min(i32::MAX as u32) as i32);
                a_at.push(a.at_ms);
                a_lane.push(a.lane);
                a_outcome.push(a.outcome);
                a_status.push(a.status.map(i32::from));
                a_latency.push(a.latency_ms.map(|l| l.min(i64::MAX as u64) as i64));
                a_body.push(a.response_body.as_deref());
                a_error.push(a.error.as_deref());
            }
        }
        let st = tx.prepare_cached(RECORD_OUTCOMES).await?;
        let done = tx
            .query(
                &st,
                &[
                    &ids,
                    &statuses,
                    &spent,
                    &next,
                    &errors,
                    &keep_error,
                    &now_ms,
                    &owner,
                    &a_ids,
                    &a_n,
                    &a_at,
                    &a_lane,
                    &a_outcome,
                    &a_status,
                    &a_latency,
                    &a_body,
                    &a_error,
                ],
            )
            .await?;
        let mut recorded: HashSet<i64> = HashSet::with_capacity(done.len());
        let mut ended: Vec<(String, String)> = Vec::new();
        for r in &done {
            recorded.insert(r.try_get(0)?);
            let status = Status::parse(r.try_get(2)?);
            if let Some(key) = ended_key(status, r.try_get::<_, Option<String>>(3)?) {
                ended.push((r.try_get(1)?, key));
            }
        }
        Ok(Applied {
            recorded: recorded.len(),
            stale: ids
                .into_iter()
                .filter(|id| !recorded.contains(id))
                .collect(),
            released: super::ordered::release(tx, &ended, now_ms).await?,
        })
    }

    /// Return this daemon's own leases to the queue, due now (a daemon restarting under the
    /// same name: whatever it held died with its previous run). Returns how many.
    pub(super) async fn release_own_leases(&self, now_ms: i64) -> Result<u64, LedgerError> {
        Ok(self.release_own_but(&[], now_ms).await?.len() as u64)
    }

    /// Return this daemon's leases other than `held` to the queue, due now (an ordered run's
    /// members other than its first held, as when a run's lease expires): the leases of a
    /// turn that was written though its answer was lost. Returns their subscribers.
    pub(super) async fn release_strays(
        &self,
        held: &[i64],
        now_ms: i64,
    ) -> Result<Vec<String>, LedgerError> {
        let mut subs = self.release_own_but(held, now_ms).await?;
        subs.sort();
        subs.dedup();
        Ok(subs)
    }

    /// This daemon's leases but `held` back to the queue; the subscriber of each.
    ///
    /// Its one statement touches rows (and their trigger-kept counts) that other daemons'
    /// transactions may hold in another order; PostgreSQL then aborts one of them as a deadlock.
    /// At start-up that must not stop the daemon: such an abort is tried again, a few times.
    async fn release_own_but(&self, held: &[i64], now_ms: i64) -> Result<Vec<String>, LedgerError> {
        let c = self.client().await?;
        let mut aborted = 0;
        loop {
            let released = c
                .query(
                    "UPDATE deliveries SET status = 'pending', lease_owner = NULL,
                         lease_expires_ms = NULL, next_attempt_ms = CASE
                             WHEN ordering_key IS NOT NULL AND batch_lead IS NOT NULL
                                  AND batch_lead <> id
                             THEN 9223372036854775807 ELSE $2 END,
                         updated_ms = $2
                     WHERE status = 'in_flight' AND lease_owner = $1
                       AND NOT (id = ANY($3))
                     RETURNING subscriber_id",
                    &[&&*self.owner, &now_ms, &held],
                )
                .await;
            match released {
                Err(e) if aborted < RELEASE_TRIES && transaction_aborted(&e) => aborted += 1,
                other => {
                    return other?
                        .iter()
                        .map(|r| Ok(r.try_get(0)?))
                        .collect::<Result<_, LedgerError>>()
                }
            }
        }
    }

    /// Every live subscriber with pending work and when its earliest delivery is due; expired
    /// leases count as due at their expiry.
    pub(super) async fn due_summary(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT s.id, LEAST(
                     (SELECT MIN(d.next_attempt_ms) FROM deliveries d
                      WHERE d.subscriber_id = s.id AND d.status = 'pending'
                        AND d.next_attempt_ms < 9223372036854775807),
                     (SELECT MIN(d.lease_expires_ms) FROM deliveries d
                      WHERE d.subscriber_id = s.id AND d.status = 'in_flight'))
                 FROM subscribers s WHERE s.deleted_ms IS NULL ORDER BY s.id",
                &[],
            )
            .await?;
        let mut out = Vec::new();
        for r in rows {
            if let Some(due) = r.try_get::<_, Option<i64>>(1)? {
                out.push((r.try_get(0)?, due));
            }
        }
        Ok(out)
    }
}
