//! Ingest on PostgreSQL: events stored and fanned out to the live subscribers whose patterns
//! and content filters match (`ledger::fanout`), by arrays (`unnest`) in a few statements,
//! announced to every daemon on commit.

use std::collections::{HashMap, HashSet};

use tokio_postgres::types::ToSql;

use super::ledger::PgLedger;
use super::listen::{notify_payload, DUE_CHANNEL};
use crate::ledger::fanout::{candidates, Selector};
use crate::ledger::{sequence, Ingested, LedgerError, NewEvent};

impl PgLedger {
    /// Store events and fan each out to every live subscriber whose patterns and filter match;
    /// announce the subscribers that got work to every listening daemon (on commit). Returns
    /// the per-event outcome and those subscribers. A server without room is noted for `/healthz`.
    pub async fn ingest(
        &self,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        let r = self.ingest_events(events, now_ms).await;
        self.writes.observe(&r);
        r
    }

    pub(super) async fn ingest_events(
        &self,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        let bodies: Vec<&str> = events.iter().map(|e| e.body.as_str()).collect();
        // The live subscribers and the events' insert, pipelined (one round trip). WITH
        // ORDINALITY keeps the call's order, so a repeated id stores its first occurrence.
        let (list, insert) = tokio::try_join!(
            tx.prepare_cached(INGEST_SUBSCRIBERS),
            tx.prepare_cached(INGEST_EVENTS),
        )?;
        let traceparents: Vec<Option<&str>> =
            events.iter().map(|e| e.traceparent.as_deref()).collect();
        let insert_args: &[&(dyn ToSql + Sync)] = &[&ids, &types, &bodies, &now_ms, &traceparents];
        let (sub_rows, fresh_rows) =
            tokio::try_join!(tx.query(&list, &[]), tx.query(&insert, insert_args))?;
        let subs = candidates(
            sub_rows
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
                .collect::<Result<_, LedgerError>>()?,
        );
        let fresh: HashSet<String> = fresh_rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let mut fresh_left = fresh;
        let mut pair_subs: Vec<&str> = Vec::new();
        let mut pair_events: Vec<&str> = Vec::new();
        let mut is_new = Vec::with_capacity(events.len());
        let mut selector = Selector::new(&subs);
        for e in events {
            let new = fresh_left.remove(&e.id);
            is_new.push(new);
            if !new {
                continue;
            }
            for &i in selector.select(e) {
                pair_subs.push(&subs[i].id);
                pair_events.push(&e.id);
            }
        }
        // The subscribers with new work, in id order: those the reservation moves the
        // counters of (`ledger::sequence`), locking their rows in that order until the commit.
        let counts = sequence::tally(&pair_subs);
        let touched: Vec<String> = counts.iter().map(|(s, _)| s.to_string()).collect();
        let created = if pair_subs.is_empty() {
            HashMap::new()
        } else {
            insert_deliveries(&tx, &pair_subs, &pair_events, &counts, &touched, now_ms).await?
        };
        tx.commit().await?;
        self.growth
            .inserted(created.values().map(|n| i64::from(*n)).sum());
        let mut seen: HashSet<&str> = HashSet::new();
        let out = events
            .iter()
            .zip(is_new)
            .map(|(e, new)| {
                let first = seen.insert(&e.id);
                Ingested {
                    id: e.id.clone(),
                    deliveries: if new && first {
                        created.get(&e.id).copied().unwrap_or(0)
                    } else {
                        0
                    },
                    duplicate: !new,
                }
            })
            .collect();
        Ok((out, touched))
    }
}

/// Insert a fan-out's deliveries (`subs[k]` × `events[k]`, in order) with their sequence
/// numbers (`counts`: each subscriber's, in id order) and announce `touched`, pipelined: the
/// counters' rows are locked from here to the caller's commit. Returns the deliveries created
/// per event: all of them (the events are new); one that was not would leave its number
/// unused, so that is an error and the caller keeps nothing (no commit).
async fn insert_deliveries(
    tx: &deadpool_postgres::Transaction<'_>,
    subs: &[&str],
    events: &[&str],
    counts: &[(&str, i64)],
    touched: &[String],
    now_ms: i64,
) -> Result<HashMap<String, u32>, LedgerError> {
    let count_subs: Vec<&str> = counts.iter().map(|(s, _)| *s).collect();
    let count_ns: Vec<i64> = counts.iter().map(|(_, n)| *n).collect();
    let back = sequence::from_end(subs);
    let (insert, notify) = tokio::try_join!(
        tx.prepare_cached(INGEST_DELIVERIES),
        tx.prepare_cached(NOTIFY),
    )?;
    let payload = notify_payload(touched);
    let insert_args: &[&(dyn ToSql + Sync)] =
        &[&subs, &events, &now_ms, &count_subs, &count_ns, &back];
    let notify_args: &[&(dyn ToSql + Sync)] = &[&DUE_CHANNEL, &payload];
    let (rows, _) = tokio::try_join!(
        tx.query(&insert, insert_args),
        tx.execute(&notify, notify_args),
    )?;
    if rows.len() != subs.len() {
        return Err(LedgerError::Invalid(format!(
            "{} of {} deliveries created; sequence numbers must not skip",
            rows.len(),
            subs.len()
        )));
    }
    let mut created: HashMap<String, u32> = HashMap::new();
    for r in rows {
        *created.entry(r.try_get(0)?).or_default() += 1;
    }
    Ok(created)
}

/// Ingest's statements (prepared once per connection).
pub(super) const INGEST_SUBSCRIBERS: &str =
    "SELECT id, event_types, filter FROM subscribers WHERE deleted_ms IS NULL ORDER BY id";
pub(super) const INGEST_EVENTS: &str =
    "INSERT INTO events (id, type, body, received_ms, traceparent)
     SELECT id, type, body, $4, tp FROM unnest($1::text[], $2::text[], $3::text[], $5::text[])
         WITH ORDINALITY AS u(id, type, body, tp, n) ORDER BY n
     ON CONFLICT (id) DO NOTHING RETURNING id";
/// The deliveries (`$1` subscribers, `$2` events, in fan-out order) with their sequence
/// numbers: the counters of `$4` (subscribers in id order, each once) move by `$5` (their
/// counts), locking their rows in that order, and each delivery takes its counter's new value
/// less `$6` (how many of its subscriber's deliveries follow it in the call).
pub(super) const INGEST_DELIVERIES: &str = "WITH reserved AS (
         INSERT INTO sequences (subscriber_id, last)
         SELECT s, c FROM unnest($4::text[], $5::bigint[]) WITH ORDINALITY AS t(s, c, k)
         ORDER BY k
         ON CONFLICT (subscriber_id) DO UPDATE SET last = sequences.last + EXCLUDED.last
         RETURNING subscriber_id, last)
     INSERT INTO deliveries (subscriber_id, event_id, status,
         next_attempt_ms, created_ms, updated_ms, sequence)
     SELECT u.s, u.e, 'pending', $3, $3, $3, r.last - u.back
     FROM unnest($1::text[], $2::text[], $6::bigint[]) WITH ORDINALITY AS u(s, e, back, n)
     JOIN reserved r ON r.subscriber_id = u.s
     ORDER BY u.n
     ON CONFLICT (event_id, subscriber_id) DO NOTHING
     RETURNING event_id";
/// One sequence number for one subscriber (`$1`): a test event's.
pub(super) const RESERVE_ONE: &str = "INSERT INTO sequences (subscriber_id, last) VALUES ($1, 1)
     ON CONFLICT (subscriber_id) DO UPDATE SET last = sequences.last + 1
     RETURNING last";
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, $2)";
