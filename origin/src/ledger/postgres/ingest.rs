//! Ingest on PostgreSQL: events stored and fanned out to the live subscribers whose patterns
//! and content filters match (`ledger::fanout`), by arrays (`unnest`) in a few statements,
//! announced to every daemon on commit.
//!
//! The sequence counters (`sequences`) are the one thing concurrent ingests wait for: the
//! statement that inserts the deliveries moves them, and their rows stay locked until the
//! commit. So that statement and the `COMMIT` go to the server together (pipelined, in
//! order): the locks are held for the server's own work and its WAL flush, never across a round
//! trip to this daemon, which on a busy machine costs more than both. That needs a transaction
//! begun by hand ([`Open`]); `group.rs` lets the calls that wait meanwhile share the next one.

use std::collections::{HashMap, HashSet};

use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use super::group::{Outcome, Waiter};
use super::ledger::PgLedger;
use super::listen::{notify_payload, DUE_CHANNEL};
use crate::ledger::fanout::{candidates, ordering_keys, CandidateRow, Selector};
use crate::ledger::{sequence, Ingested, LedgerError, NewEvent};

impl PgLedger {
    /// Store events and fan each out to every live subscriber whose patterns and filter match,
    /// in a transaction shared with the ingests that wait meanwhile (the module doc); announce
    /// the subscribers that got work to every listening daemon (on commit). Returns the
    /// per-event outcome and those subscribers. A server without room is noted for `/healthz`.
    pub(super) async fn ingest(&self, events: Vec<NewEvent>, now_ms: i64) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let waiter = Waiter {
            events,
            now_ms,
            reply,
        };
        if self.ingests.push(waiter) {
            let runner = self.clone();
            tokio::spawn(async move { runner.run_ingests().await });
        }
        // The runner answers every call it takes; no answer means it is gone with the runtime.
        answer.await.unwrap_or(Err(LedgerError::Closed))
    }

    async fn run_ingests(&self) {
        loop {
            let group = self.ingests.take();
            if group.is_empty() {
                return;
            }
            self.ingest_group(group).await;
        }
    }

    async fn ingest_group(&self, group: Vec<Waiter>) {
        let now_ms = group.iter().map(|w| w.now_ms).max().unwrap_or_default();
        let mut all = Vec::new();
        let mut calls = Vec::with_capacity(group.len());
        for w in group {
            calls.push((w.events.len(), w.now_ms, w.reply));
            all.extend(w.events);
        }
        if calls.len() == 1 {
            let r = self.ingest_observed(&all, now_ms).await;
            if let Some((_, _, reply)) = calls.pop() {
                let _ = reply.send(r);
            }
            return;
        }
        match self.ingest_observed(&all, now_ms).await {
            Ok((outcomes, touched)) => {
                let mut outcomes = outcomes.into_iter();
                for (len, _, reply) in calls {
                    let mine = outcomes.by_ref().take(len).collect();
                    let _ = reply.send(Ok((mine, touched.clone())));
                }
            }
            Err(_) => {
                let mut rest = all;
                for (len, now_ms, reply) in calls {
                    let tail = rest.split_off(len);
                    let mine = std::mem::replace(&mut rest, tail);
                    let _ = reply.send(self.ingest_observed(&mine, now_ms).await);
                }
            }
        }
    }

    /// One transaction of ingest; a server without room is noted for `/healthz`.
    async fn ingest_observed(&self, events: &[NewEvent], now_ms: i64) -> Outcome {
        let r = self.ingest_events(events, now_ms).await;
        self.writes.observe(&r);
        r
    }
}

impl PgLedger {
    /// One transaction of ingest (`group.rs` decides which calls share it): the events stored
    /// and fanned out, each delivery numbered.
    pub(super) async fn ingest_events(
        &self,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        let open = Open::begin(self.client().await?).await?;
        match self.ingest_within(open.client(), events, now_ms).await {
            Ok(done) => {
                open.release();
                Ok(done)
            }
            Err(e) => {
                open.rollback().await;
                Err(e)
            }
        }
    }

    /// The statements of [`Self::ingest_events`] in the open transaction `tx`, the last of
    /// them its `COMMIT`.
    async fn ingest_within(
        &self,
        tx: &deadpool_postgres::ClientWrapper,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
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
                .map(|r| {
                    Ok(CandidateRow {
                        id: r.try_get(0)?,
                        event_types: r.try_get(1)?,
                        filter: r.try_get(2)?,
                        customer_filter: r.try_get(3)?,
                        ordering: r.try_get(4)?,
                        ordering_key: r.try_get(5)?,
                    })
                })
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
        let mut keys: Vec<Option<String>> = Vec::new();
        let mut selector = Selector::new(&subs);
        for e in events {
            let new = fresh_left.remove(&e.id);
            is_new.push(new);
            if !new {
                continue;
            }
            let to = selector.select(e);
            ordering_keys(&subs, e, to, &mut keys);
            for &i in to {
                pair_subs.push(&subs[i].id);
                pair_events.push(&e.id);
            }
        }
        let different = different_bodies(tx, events, &is_new).await?;
        // The subscribers with new work, in id order: those the reservation moves the
        // counters of (`ledger::sequence`), locking their rows in that order until the commit.
        let counts = sequence::tally(&pair_subs);
        let touched: Vec<String> = counts.iter().map(|(s, _)| s.to_string()).collect();
        // Ordered deliveries are linked to their keys (`ordered.rs`, held behind a key's head)
        // before the commit; without any, the commit goes with the deliveries' insert.
        let ordered: Vec<(&str, &str, String)> = (pair_subs.iter().zip(&pair_events).zip(keys))
            .filter_map(|((s, e), k)| Some((*s, *e, k?)))
            .collect();
        let created = if pair_subs.is_empty() {
            tx.batch_execute("COMMIT").await?;
            HashMap::new()
        } else {
            let deliveries = Fanned {
                subs: &pair_subs,
                events: &pair_events,
                counts: &counts,
                touched: &touched,
            };
            let commit = ordered.is_empty();
            let created = insert_deliveries(tx, deliveries, now_ms, commit).await?;
            if !commit {
                super::ordered::link(tx, &ordered).await?;
                tx.batch_execute("COMMIT").await?;
            }
            created
        };
        self.growth
            .inserted(created.values().map(|n| i64::from(*n)).sum());
        let mut seen: HashSet<&str> = HashSet::new();
        let out = events
            .iter()
            .zip(is_new)
            .zip(different)
            .map(|((e, new), different_body)| {
                let first = seen.insert(&e.id);
                Ingested {
                    id: e.id.clone(),
                    deliveries: if new && first {
                        created.get(&e.id).copied().unwrap_or(0)
                    } else {
                        0
                    },
                    duplicate: !new,
                    different_body,
                }
            })
            .collect();
        Ok((out, touched))
    }
}

/// For each event, whether it is not new (`is_new[k]` false) and its id is stored with another
/// body (by an earlier call, or earlier in this one: the statement sees this transaction's
/// insert). One round trip, only when some event is not new.
async fn different_bodies(
    tx: &deadpool_postgres::ClientWrapper,
    events: &[NewEvent],
    is_new: &[bool],
) -> Result<Vec<bool>, LedgerError> {
    let mut out = vec![false; events.len()];
    let at: Vec<usize> = (0..events.len()).filter(|&k| !is_new[k]).collect();
    if at.is_empty() {
        return Ok(out);
    }
    let ids: Vec<&str> = at.iter().map(|&k| events[k].id.as_str()).collect();
    let bodies: Vec<&str> = at.iter().map(|&k| events[k].body.as_str()).collect();
    let rows = tx
        .query(
            "SELECT u.n FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(id, body, n)
             JOIN events e ON e.id = u.id WHERE e.body <> u.body",
            &[&ids, &bodies],
        )
        .await?;
    for r in rows {
        let n: i64 = r.try_get(0)?;
        if let Some(&k) = usize::try_from(n - 1).ok().and_then(|i| at.get(i)) {
            out[k] = true;
        }
    }
    Ok(out)
}

/// A fan-out's deliveries: `subs[k]` × `events[k]`, in order; `counts`, each subscriber's, in
/// id order; `touched`, those subscribers, to announce.
struct Fanned<'a> {
    subs: &'a [&'a str],
    events: &'a [&'a str],
    counts: &'a [(&'a str, i64)],
    touched: &'a [String],
}

/// Insert a fan-out's deliveries with their sequence numbers, announce the subscribers and,
/// when `commit`, commit, pipelined: the counters' rows are locked from the insert to the
/// commit, one round trip.
/// Returns the deliveries created per event: all of them (the events are new, so no delivery
/// of theirs can exist; one that did would fail the insert, and the commit with it, rather
/// than leave its number unused).
async fn insert_deliveries(
    tx: &deadpool_postgres::ClientWrapper,
    fanned: Fanned<'_>,
    now_ms: i64,
    commit: bool,
) -> Result<HashMap<String, u32>, LedgerError> {
    let Fanned {
        subs,
        events,
        counts,
        touched,
    } = fanned;
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
    // In this order: a failed insert turns the COMMIT into a rollback.
    let rows = if commit {
        let (rows, _, ()) = tokio::try_join!(
            biased;
            tx.query(&insert, insert_args),
            tx.execute(&notify, notify_args),
            tx.batch_execute("COMMIT"),
        )?;
        rows
    } else {
        let (rows, _) = tokio::try_join!(
            biased;
            tx.query(&insert, insert_args),
            tx.execute(&notify, notify_args),
        )?;
        rows
    };
    let mut created: HashMap<String, u32> = HashMap::new();
    for r in rows {
        *created.entry(r.try_get(0)?).or_default() += 1;
    }
    Ok(created)
}

/// Ingest's statements (prepared once per connection).
pub(super) const INGEST_SUBSCRIBERS: &str =
    "SELECT id, event_types, filter, customer_filter, ordering, ordering_key FROM subscribers
     WHERE deleted_ms IS NULL ORDER BY id";
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
     RETURNING event_id";
/// One sequence number for one subscriber (`$1`): a test event's.
pub(super) const RESERVE_ONE: &str = "INSERT INTO sequences (subscriber_id, last) VALUES ($1, 1)
     ON CONFLICT (subscriber_id) DO UPDATE SET last = sequences.last + 1
     RETURNING last";
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// A transaction begun by hand on a pooled connection (tokio-postgres' own cannot pipeline its
/// `COMMIT` behind other statements). Released to the pool once it has ended; rolled back on an
/// error; dropped unended (its caller cancelled), it takes its connection out of the pool and
/// closes it, so the server ends the transaction and no other caller inherits it.
struct Open {
    client: Option<deadpool_postgres::Object>,
}

impl Open {
    async fn begin(client: deadpool_postgres::Object) -> Result<Open, LedgerError> {
        client.batch_execute("BEGIN").await?;
        Ok(Open {
            client: Some(client),
        })
    }

    fn client(&self) -> &deadpool_postgres::ClientWrapper {
        // `Some` from `begin` until `release` or `rollback` consume it.
        self.client.as_deref().unwrap_or_else(|| unreachable!())
    }

    /// The transaction has ended (committed): the connection goes back to the pool.
    fn release(mut self) {
        drop(self.client.take());
    }

    /// Roll back (a no-op with a warning if a pipelined `COMMIT` already ended it as one); a
    /// connection that cannot even do that is closed.
    async fn rollback(mut self) {
        if let Some(c) = self.client.take() {
            if c.batch_execute("ROLLBACK").await.is_err() {
                drop(deadpool_postgres::Object::take(c));
            }
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            drop(deadpool_postgres::Object::take(c));
        }
    }
}
