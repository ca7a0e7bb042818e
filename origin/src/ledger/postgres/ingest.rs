//! Ingest on PostgreSQL: events stored and fanned out to the live subscribers whose patterns
//! and content filters match (`ledger::fanout`), by arrays (`unnest`) in a few statements,
//! announced to every daemon on commit.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokio_postgres::types::ToSql;

use super::ledger::PgLedger;
use super::listen::{notify_payload, DUE_CHANNEL};
use crate::ledger::fanout::{candidates, Selector};
use crate::ledger::{Ingested, LedgerError, NewEvent};

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
        let insert_args: &[&(dyn ToSql + Sync)] = &[&ids, &types, &bodies, &now_ms];
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
        let mut created: HashMap<String, u32> = HashMap::new();
        let mut touched: BTreeMap<String, ()> = BTreeMap::new();
        if !pair_subs.is_empty() {
            let insert = tx.prepare_cached(INGEST_DELIVERIES).await?;
            let rows = tx
                .query(&insert, &[&pair_subs, &pair_events, &now_ms])
                .await?;
            for r in rows {
                let sub: String = r.try_get(0)?;
                let event: String = r.try_get(1)?;
                *created.entry(event).or_default() += 1;
                touched.insert(sub, ());
            }
        }
        let touched: Vec<String> = touched.into_keys().collect();
        if !touched.is_empty() {
            let notify = tx.prepare_cached(NOTIFY).await?;
            tx.execute(&notify, &[&DUE_CHANNEL, &notify_payload(&touched)])
                .await?;
        }
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

/// Ingest's statements (prepared once per connection).
pub(super) const INGEST_SUBSCRIBERS: &str =
    "SELECT id, event_types, filter FROM subscribers WHERE deleted_ms IS NULL ORDER BY id";
pub(super) const INGEST_EVENTS: &str = "INSERT INTO events (id, type, body, received_ms)
     SELECT id, type, body, $4 FROM unnest($1::text[], $2::text[], $3::text[])
         WITH ORDINALITY AS u(id, type, body, n) ORDER BY n
     ON CONFLICT (id) DO NOTHING RETURNING id";
pub(super) const INGEST_DELIVERIES: &str =
    "INSERT INTO deliveries (subscriber_id, event_id, status,
         next_attempt_ms, created_ms, updated_ms)
     SELECT s, e, 'pending', $3, $3, $3
     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(s, e, n) ORDER BY n
     ON CONFLICT (event_id, subscriber_id) DO NOTHING
     RETURNING subscriber_id, event_id";
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, $2)";
