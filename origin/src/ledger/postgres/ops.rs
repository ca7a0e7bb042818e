//! The ledger's operations on PostgreSQL, one method each, every one a transaction of its own
//! (or a single statement). Same results as the SQLite functions of the same names
//! (`ledger/queries.rs`, `health.rs`, `stats.rs`, `status.rs`); what differs is said where it
//! does. Rows go in and out by arrays (`unnest`), never one statement per row.

use std::collections::{BTreeMap, HashMap, HashSet};

use deadpool_postgres::Transaction;
use fanout_core::breaker::{Breaker, BreakerConfig};
use fanout_core::bucket::Bucket;
use fanout_core::limiter::{LimiterState, Limits as CoreLimits};
use fanout_core::retry::Attempt;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::ledger::PgLedger;
use super::listen::{notify_payload, CHANGED_CHANNEL, DUE_CHANNEL};
use super::shared::{grant_shared, shared_wait};
use crate::alert::rules::after_dead_count;
use crate::alert::Notice;
use crate::ledger::filter::{self, Arg, Dialect};
use crate::ledger::subscribers::SubscriberCounts;
use crate::ledger::{AttemptRecordView, HealthWrite};
use crate::ledger::{
    Claimed, DeliveryFilter, DeliveryView, Ingested, LedgerError, NewEvent, Outcome,
    SubscriberStats, Transition,
};
use crate::model::{
    any_type_matches, delivery_public_id, AttemptOutcome, Disabled, Health, Lane, Limits, Status,
    StoredSecret, Subscriber,
};

type Param = Box<dyn ToSql + Sync + Send>;

fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

fn unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

// ---------------------------------------------------------------------------------------------
// Subscribers

const SUBSCRIBER_COLUMNS: &str = "id, url, event_types, rate_per_sec, burst, max_in_flight, \
     timeout_ms, lane, legacy_signature, created_ms, updated_ms, disabled_ms, disabled_reason, \
     failing_since_ms, customer, disabled_by_operator";

/// A text column holding one of an enum's names.
fn enum_column<T>(r: &Row, i: usize, parse: fn(&str) -> Option<T>) -> Result<T, LedgerError> {
    let text: String = r.try_get(i)?;
    parse(&text).ok_or_else(|| LedgerError::Schema(format!("unknown value {text:?} in column {i}")))
}

fn subscriber_from_row(r: &Row) -> Result<Subscriber, LedgerError> {
    let types: String = r.try_get(2)?;
    let lane: String = r.try_get(7)?;
    let disabled_ms: Option<i64> = r.try_get(11)?;
    let disabled_reason: Option<String> = r.try_get(12)?;
    let by_operator: bool = r.try_get(15)?;
    Ok(Subscriber {
        id: r.try_get(0)?,
        url: r.try_get(1)?,
        event_types: serde_json::from_str(&types)
            .map_err(|e| LedgerError::Invalid(format!("stored event types do not decode: {e}")))?,
        limits: Limits {
            rate_per_sec: r.try_get(3)?,
            burst: r.try_get::<_, i32>(4)?.max(1) as u32,
            max_in_flight: r.try_get::<_, i32>(5)?.max(1) as u32,
            timeout_ms: r.try_get::<_, i64>(6)?.max(0) as u64,
        },
        lane: Lane::parse(&lane)
            .ok_or_else(|| LedgerError::Invalid(format!("stored lane {lane:?} is unknown")))?,
        legacy_signature: r.try_get(8)?,
        secrets: Vec::new(),
        created_ms: r.try_get(9)?,
        updated_ms: r.try_get(10)?,
        health: Health {
            disabled: disabled_ms.map(|at_ms| Disabled {
                at_ms,
                reason: disabled_reason.unwrap_or_default(),
                by_operator,
            }),
            failing_since_ms: r.try_get(13)?,
        },
        customer: r.try_get(14)?,
    })
}

fn event_types_json(s: &Subscriber) -> String {
    serde_json::to_string(&s.event_types).unwrap_or_else(|_| "[]".into())
}

/// The stored limiter, or — when it does not decode (another version wrote it) — an empty
/// bucket, never a full one, with a warning an operator sees.
pub(super) fn decode_limiter(id: &str, raw: Option<&str>, now_ms: i64) -> LimiterState {
    match raw.map(serde_json::from_str::<LimiterState>) {
        None => LimiterState::default(),
        Some(Ok(state)) => state,
        Some(Err(e)) => {
            tracing::error!(subscriber = id, error = %e,
                "the stored limiter state does not decode: starting from an empty bucket");
            LimiterState {
                bucket: Some(Bucket {
                    tokens: 0.0,
                    updated_ms: now_ms,
                }),
                ..LimiterState::default()
            }
        }
    }
}

pub(super) fn encode_limiter(state: &LimiterState) -> String {
    serde_json::to_string(state).unwrap_or_default()
}

impl PgLedger {
    async fn secrets_of(
        c: &impl deadpool_postgres::GenericClient,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<StoredSecret>>, LedgerError> {
        let rows = c
            .query(
                "SELECT subscriber_id, secret, created_ms, expires_ms FROM subscriber_secrets
                 WHERE subscriber_id = ANY($1) ORDER BY created_ms DESC, id DESC",
                &[&ids],
            )
            .await?;
        let mut out: HashMap<String, Vec<StoredSecret>> = HashMap::new();
        for r in rows {
            out.entry(r.try_get(0)?).or_default().push(StoredSecret {
                secret: r.try_get(1)?,
                created_ms: r.try_get(2)?,
                expires_ms: r.try_get(3)?,
            });
        }
        Ok(out)
    }

    pub(super) async fn get_subscriber_on(
        c: &impl deadpool_postgres::GenericClient,
        id: &str,
    ) -> Result<Subscriber, LedgerError> {
        let row = c
            .query_opt(
                &format!(
                    "SELECT {SUBSCRIBER_COLUMNS} FROM subscribers
                     WHERE id = $1 AND deleted_ms IS NULL"
                ),
                &[&id],
            )
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("subscriber {id}")))?;
        let mut s = subscriber_from_row(&row)?;
        s.secrets = Self::secrets_of(c, &[s.id.clone()])
            .await?
            .remove(&s.id)
            .unwrap_or_default();
        Ok(s)
    }

    pub async fn get_subscriber(&self, id: &str) -> Result<Subscriber, LedgerError> {
        Self::get_subscriber_on(&self.client().await?, id).await
    }

    pub async fn list_subscribers(&self) -> Result<Vec<Subscriber>, LedgerError> {
        let c = self.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {SUBSCRIBER_COLUMNS} FROM subscribers WHERE deleted_ms IS NULL
                     ORDER BY id"
                ),
                &[],
            )
            .await?;
        let mut subs = rows
            .iter()
            .map(subscriber_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
        let mut secrets = Self::secrets_of(&c, &ids).await?;
        for s in &mut subs {
            s.secrets = secrets.remove(&s.id).unwrap_or_default();
        }
        Ok(subs)
    }

    /// Insert a new subscriber (or bring back a removed one under the same id) with its first
    /// secret.
    pub async fn create_subscriber(&self, s: &Subscriber, secret: &str) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let existing = tx
            .query_opt(
                "SELECT deleted_ms, customer FROM subscribers WHERE id = $1 FOR UPDATE",
                &[&s.id],
            )
            .await?;
        let conflict = || LedgerError::Conflict(format!("subscriber {} already exists", s.id));
        let existing: Option<(Option<i64>, Option<String>)> = existing
            .map(|r| Ok::<_, LedgerError>((r.try_get(0)?, r.try_get(1)?)))
            .transpose()?;
        match existing {
            Some((None, _)) => return Err(conflict()),
            // A removed endpoint's deliveries stay under its id: another owner taking the id
            // over would see and replay them. Refused until retention has removed them.
            Some((Some(_), owner)) if owner != s.customer => {
                let kept: i64 = tx
                    .query_one(
                        "SELECT COALESCE(SUM(n), 0)::BIGINT FROM delivery_counts
                         WHERE subscriber_id = $1",
                        &[&s.id],
                    )
                    .await?
                    .try_get(0)?;
                if kept > 0 {
                    return Err(crate::ledger::error::id_still_holds_history(&s.id));
                }
                tx.execute(
                    "DELETE FROM subscriber_secrets WHERE subscriber_id = $1",
                    &[&s.id],
                )
                .await?;
                tx.execute("DELETE FROM subscribers WHERE id = $1", &[&s.id])
                    .await?;
            }
            Some((Some(_), _)) => {
                tx.execute(
                    "DELETE FROM subscriber_secrets WHERE subscriber_id = $1",
                    &[&s.id],
                )
                .await?;
                tx.execute("DELETE FROM subscribers WHERE id = $1", &[&s.id])
                    .await?;
            }
            None => {}
        }
        super::customers::hold_customer(&tx, s.customer.as_deref()).await?;
        let inserted = tx
            .execute(
                "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                     timeout_ms, lane, legacy_signature, created_ms, updated_ms, customer)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11)",
                &[
                    &s.id,
                    &s.url,
                    &event_types_json(s),
                    &s.limits.rate_per_sec,
                    &(s.limits.burst.min(i32::MAX as u32) as i32),
                    &(s.limits.max_in_flight.min(i32::MAX as u32) as i32),
                    &(s.limits.timeout_ms.min(i64::MAX as u64) as i64),
                    &s.lane.as_str(),
                    &s.legacy_signature,
                    &s.created_ms,
                    &s.customer,
                ],
            )
            .await;
        match inserted {
            Err(e) if unique_violation(&e) => return Err(conflict()),
            other => other?,
        };
        tx.execute(
            "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms) VALUES ($1, $2, $3)",
            &[&s.id, &secret, &s.created_ms],
        )
        .await?;
        announce_change(&tx, &s.id).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Store a changed definition (not its secrets; its customer must exist): the limiter is
    /// kept, so a change never grants a fresh burst.
    pub async fn update_subscriber(&self, s: &Subscriber) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        Self::update_subscriber_in(&tx, s).await?;
        tx.commit().await?;
        Ok(())
    }

    /// [`PgLedger::update_subscriber`] inside the caller's transaction.
    pub(super) async fn update_subscriber_in(
        tx: &Transaction<'_>,
        s: &Subscriber,
    ) -> Result<(), LedgerError> {
        let n = tx
            .execute(
                "UPDATE subscribers SET url = $2, event_types = $3, rate_per_sec = $4, burst = $5,
                     max_in_flight = $6, timeout_ms = $7, lane = $8, legacy_signature = $9,
                     updated_ms = $10, customer = $11
                 WHERE id = $1 AND deleted_ms IS NULL",
                &[
                    &s.id,
                    &s.url,
                    &event_types_json(s),
                    &s.limits.rate_per_sec,
                    &(s.limits.burst.min(i32::MAX as u32) as i32),
                    &(s.limits.max_in_flight.min(i32::MAX as u32) as i32),
                    &(s.limits.timeout_ms.min(i64::MAX as u64) as i64),
                    &s.lane.as_str(),
                    &s.legacy_signature,
                    &s.updated_ms,
                    &s.customer,
                ],
            )
            .await?;
        if n == 0 {
            return Err(LedgerError::NotFound(format!("subscriber {}", s.id)));
        }
        // After the subscriber's row (locked by the update): subscriber rows first.
        super::customers::hold_customer(tx, s.customer.as_deref()).await?;
        announce_change(tx, &s.id).await?;
        Ok(())
    }

    /// Remove a subscriber: it matches no new event, and its unfinished deliveries go dead
    /// (replayable if it comes back). Returns how many went dead.
    pub async fn delete_subscriber(&self, id: &str, now_ms: i64) -> Result<u64, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "UPDATE subscribers SET deleted_ms = $2, updated_ms = $2
                 WHERE id = $1 AND deleted_ms IS NULL",
                &[&id, &now_ms],
            )
            .await?;
        if n == 0 {
            return Err(LedgerError::NotFound(format!("subscriber {id}")));
        }
        let dead = tx
            .execute(
                "UPDATE deliveries SET status = 'dead', last_error = 'subscriber removed',
                     updated_ms = $2, lease_owner = NULL, lease_expires_ms = NULL
                 WHERE subscriber_id = $1 AND status IN ('pending', 'in_flight')",
                &[&id, &now_ms],
            )
            .await?;
        announce_change(&tx, id).await?;
        tx.commit().await?;
        Ok(dead)
    }

    /// Add `secret` as the current secret; every other active one keeps signing until
    /// `now + grace_ms`.
    pub async fn rotate_secret(
        &self,
        id: &str,
        secret: &str,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        Self::rotate_secret_in(&tx, id, secret, now_ms, grace_ms).await?;
        tx.commit().await?;
        Ok(())
    }

    /// [`PgLedger::rotate_secret`] inside the caller's transaction.
    pub(super) async fn rotate_secret_in(
        tx: &Transaction<'_>,
        id: &str,
        secret: &str,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<(), LedgerError> {
        let live = tx
            .execute(
                "UPDATE subscribers SET updated_ms = $2 WHERE id = $1 AND deleted_ms IS NULL",
                &[&id, &now_ms],
            )
            .await?;
        if live == 0 {
            return Err(LedgerError::NotFound(format!("subscriber {id}")));
        }
        // Under the subscriber row's lock (the UPDATE above): rotations of one subscriber
        // take turns, each sees the one before.
        let row = tx
            .query_one(
                "SELECT (SELECT MAX(created_ms) FROM subscriber_secrets
                         WHERE subscriber_id = $1 AND expires_ms IS NULL),
                        EXISTS (SELECT 1 FROM subscriber_secrets
                                WHERE subscriber_id = $1 AND expires_ms IS NOT NULL)",
                &[&id],
            )
            .await?;
        let current_ms: Option<i64> = row.try_get(0)?;
        let rotated_before: bool = row.try_get(1)?;
        if let Some(wait) =
            current_ms.and_then(|t| crate::model::rotation_wait_ms(t, rotated_before, now_ms))
        {
            return Err(crate::ledger::error::rotation_too_soon(id, wait));
        }
        // The secrets rotated out before are older than the current one: they stop now.
        tx.execute(
            "DELETE FROM subscriber_secrets WHERE subscriber_id = $1 AND expires_ms IS NOT NULL",
            &[&id],
        )
        .await?;
        let until = now_ms.saturating_add(grace_ms);
        tx.execute(
            "UPDATE subscriber_secrets SET expires_ms = $2
             WHERE subscriber_id = $1 AND expires_ms IS NULL",
            &[&id, &until],
        )
        .await?;
        tx.execute(
            "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms) VALUES ($1, $2, $3)",
            &[&id, &secret, &now_ms],
        )
        .await?;
        announce_change(tx, id).await?;
        Ok(())
    }

    /// Disable (`Some`) or re-enable (`None`) a subscriber; re-enabling clears its failure run
    /// and resets its breaker in the shared limiter. Returns whether anything changed.
    pub async fn set_disabled(
        &self,
        id: &str,
        disabled: Option<&Disabled>,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let changed = Self::set_disabled_in(&tx, id, disabled, now_ms).await?;
        tx.commit().await?;
        Ok(changed)
    }

    /// [`PgLedger::set_disabled`] inside the caller's transaction.
    pub(super) async fn set_disabled_in(
        tx: &Transaction<'_>,
        id: &str,
        disabled: Option<&Disabled>,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let changed = match disabled {
            Some(d) => tx
                .query_opt(
                    "UPDATE subscribers SET disabled_ms = $2, disabled_reason = $3,
                         disabled_by_operator = $4
                     WHERE id = $1 AND deleted_ms IS NULL AND disabled_ms IS NULL RETURNING limiter",
                    &[&id, &d.at_ms, &d.reason, &d.by_operator],
                )
                .await?
                .map(|_| None),
            None => tx
                .query_opt(
                    "UPDATE subscribers SET disabled_ms = NULL, disabled_reason = NULL,
                         disabled_by_operator = FALSE, failing_since_ms = NULL
                     WHERE id = $1 AND deleted_ms IS NULL AND disabled_ms IS NOT NULL
                     RETURNING limiter",
                    &[&id],
                )
                .await?
                .map(|r| r.try_get::<_, Option<String>>(0))
                .transpose()?
                .map(Some),
        };
        let Some(reenabled) = changed else {
            return Ok(false);
        };
        if let Some(raw) = reenabled {
            let mut limiter = decode_limiter(id, raw.as_deref(), now_ms);
            limiter.breaker = Breaker::default();
            tx.execute(
                "UPDATE subscribers SET limiter = $2 WHERE id = $1",
                &[&id, &encode_limiter(&limiter)],
            )
            .await?;
        }
        announce_change(tx, id).await?;
        Ok(true)
    }

    /// The shared limiter state as last stored (an undecodable one reads as an empty bucket).
    pub async fn load_limiter(&self, id: &str, now_ms: i64) -> Result<LimiterState, LedgerError> {
        let c = self.client().await?;
        let raw: Option<String> = c
            .query_opt("SELECT limiter FROM subscribers WHERE id = $1", &[&id])
            .await?
            .map(|r| r.try_get(0))
            .transpose()?
            .flatten();
        Ok(decode_limiter(id, raw.as_deref(), now_ms))
    }

    // -----------------------------------------------------------------------------------------
    // Events

    /// Store events and fan each out to every live subscriber whose patterns match; announce
    /// the subscribers that got work to every listening daemon (on commit). Returns the
    /// per-event outcome and those subscribers. A server without room is noted for `/healthz`.
    pub async fn ingest(
        &self,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        let r = self.ingest_events(events, now_ms).await;
        self.writes.observe(&r);
        r
    }

    async fn ingest_events(
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
        let subs: Vec<(String, Vec<String>)> = sub_rows
            .iter()
            .map(|r| {
                let types: String = r.try_get(1)?;
                Ok((
                    r.try_get(0)?,
                    serde_json::from_str(&types).unwrap_or_default(),
                ))
            })
            .collect::<Result<_, LedgerError>>()?;
        let fresh: HashSet<String> = fresh_rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let mut fresh_left = fresh;
        let mut pair_subs: Vec<&str> = Vec::new();
        let mut pair_events: Vec<&str> = Vec::new();
        let mut is_new = Vec::with_capacity(events.len());
        let mut matched: Option<(&str, Vec<usize>)> = None;
        for e in events {
            let new = fresh_left.remove(&e.id);
            is_new.push(new);
            if !new {
                continue;
            }
            if matched.as_ref().is_none_or(|(t, _)| *t != e.event_type) {
                let idx = subs
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, patterns))| any_type_matches(patterns, &e.event_type))
                    .map(|(i, _)| i)
                    .collect();
                matched = Some((e.event_type.as_str(), idx));
            }
            for &i in matched.as_ref().map_or(&[][..], |(_, m)| m.as_slice()) {
                pair_subs.push(&subs[i].0);
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
const INGEST_SUBSCRIBERS: &str =
    "SELECT id, event_types FROM subscribers WHERE deleted_ms IS NULL ORDER BY id";
const INGEST_EVENTS: &str = "INSERT INTO events (id, type, body, received_ms)
     SELECT id, type, body, $4 FROM unnest($1::text[], $2::text[], $3::text[])
         WITH ORDINALITY AS u(id, type, body, n) ORDER BY n
     ON CONFLICT (id) DO NOTHING RETURNING id";
const INGEST_DELIVERIES: &str = "INSERT INTO deliveries (subscriber_id, event_id, status,
         next_attempt_ms, created_ms, updated_ms)
     SELECT s, e, 'pending', $3, $3, $3
     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(s, e, n) ORDER BY n
     ON CONFLICT (event_id, subscriber_id) DO NOTHING
     RETURNING subscriber_id, event_id";
const NOTIFY: &str = "SELECT pg_notify($1, $2)";

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
}

/// A result to record, with the lease it was sent under when the caller knows it (without it,
/// only the owner is checked: a result of this daemon's is recorded while this daemon holds
/// the delivery).
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedOutcome {
    pub outcome: Outcome,
    pub lease_expires_ms: Option<i64>,
}

/// An attempt's answer as the shared limiter takes it (breaker, Retry-After pause).
#[derive(Debug, Clone, PartialEq)]
pub struct Feedback {
    pub subscriber_id: String,
    pub attempt: Attempt,
    pub at_ms: i64,
}

/// What `apply` recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// Outcomes recorded.
    pub recorded: usize,
    /// Deliveries whose result was ignored: their lease had expired and been taken over (or
    /// the delivery was removed with its subscriber) — another daemon owns them now.
    pub stale: Vec<i64>,
}

// The hot path's statements, prepared once per connection (`prepare_cached`): a turn sends
// each as one Bind/Execute, several at once where the next does not need the previous answer.

/// The rows of subscribers to claim for, locked in id order.
const CLAIM_LOCK: &str = "SELECT id, rate_per_sec, burst, max_in_flight, limiter FROM subscribers
     WHERE id = ANY($1) AND deleted_ms IS NULL AND disabled_ms IS NULL
     ORDER BY id FOR UPDATE";

/// Their expired leases, of any daemon, back to the queue due now (locked ones skipped).
pub(super) const CLAIM_EXPIRE: &str =
    "UPDATE deliveries SET status = 'pending', lease_owner = NULL,
         lease_expires_ms = NULL, next_attempt_ms = $2, updated_ms = $2
     WHERE id IN (SELECT id FROM deliveries
                  WHERE subscriber_id = ANY($1) AND status = 'in_flight'
                    AND lease_expires_ms <= $2
                  FOR UPDATE SKIP LOCKED)";

/// Their deliveries in flight, every daemon's.
pub(super) const CLAIM_COUNT: &str = "SELECT subscriber_id, COUNT(*) FROM deliveries
     WHERE subscriber_id = ANY($1) AND status = 'in_flight' GROUP BY subscriber_id";

/// Up to `$2[k]` due deliveries of subscriber `$1[k]`, oldest due first, rows another
/// transaction holds skipped, leased to `$3` until `$4` — picked, locked, leased and read
/// (with their event) by one statement.
const CLAIM_LEASE: &str = "UPDATE deliveries d SET status = 'in_flight', lease_owner = $3,
         lease_expires_ms = $4, updated_ms = $5
     FROM events e
     WHERE d.id = ANY(ARRAY(
               SELECT c.id FROM unnest($1::text[], $2::bigint[]) AS w(sub, n)
               CROSS JOIN LATERAL (
                   SELECT id FROM deliveries
                   WHERE subscriber_id = w.sub AND status = 'pending' AND next_attempt_ms <= $5
                   ORDER BY next_attempt_ms, id LIMIT w.n
                   FOR UPDATE SKIP LOCKED) c))
       AND e.id = d.event_id
     RETURNING d.id, d.subscriber_id, d.event_id, e.type, e.body, d.attempts, d.next_attempt_ms";

/// Shared limiter states back in their (locked) rows.
pub(super) const STORE_LIMITERS: &str = "UPDATE subscribers s SET limiter = u.l
     FROM unnest($1::text[], $2::text[]) AS u(id, l) WHERE s.id = u.id";

/// When each subscriber's earliest pending delivery is due: one index probe each.
const CLAIM_NEXT_DUE: &str = "SELECT w.sub, n.due FROM unnest($1::text[]) AS w(sub)
     CROSS JOIN LATERAL (
         SELECT next_attempt_ms AS due FROM deliveries
         WHERE subscriber_id = w.sub AND status = 'pending'
         ORDER BY next_attempt_ms LIMIT 1) n";

/// Results of deliveries still leased to `$9` (under lease `$2[k]` when not null), and the
/// attempts (`$10..$18`, in order) of those recorded; returns the ids recorded.
pub(super) const RECORD_OUTCOMES: &str = "WITH done AS (
         UPDATE deliveries d SET status = u.status, attempts = d.attempts + u.spent,
             next_attempt_ms = COALESCE(u.next, d.next_attempt_ms),
             last_error = CASE WHEN u.keep THEN d.last_error ELSE u.err END,
             lease_owner = NULL, lease_expires_ms = NULL, updated_ms = $8
         FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::int[], $5::bigint[],
                     $6::text[], $7::bool[]) AS u(id, lease, status, spent, next, err, keep)
         WHERE d.id = u.id AND d.status = 'in_flight' AND d.lease_owner = $9
           AND (u.lease IS NULL OR d.lease_expires_ms = u.lease)
         RETURNING d.id),
     tried AS (
         INSERT INTO attempts (delivery_id, attempt, at_ms, lane, outcome, status, latency_ms,
             response_body, error)
         SELECT x.delivery, x.number, x.at, x.lane, x.outcome, x.status, x.latency, x.body,
             x.error
         FROM unnest($10::bigint[], $11::int[], $12::bigint[], $13::text[], $14::text[],
                     $15::int[], $16::bigint[], $17::text[], $18::text[])
             WITH ORDINALITY AS x(delivery, number, at, lane, outcome, status, latency, body,
                                  error, ord)
         WHERE x.delivery IN (SELECT id FROM done)
         ORDER BY x.ord)
     SELECT id FROM done";

/// The most asked of each subscriber (once each, in id order).
pub(super) fn wanted_of(wants: &[(String, usize)]) -> BTreeMap<&str, usize> {
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, most) in wants {
        let w = wanted.entry(id.as_str()).or_default();
        *w = (*w).max(*most);
    }
    wanted
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
    /// subscriber's shared limiter grants across every daemon — to this daemon until
    /// `now + lease_ms`. Leases of any daemon that expired return to the queue first.
    /// Disabled and removed subscribers get nothing (and are left out of the answer).
    pub async fn claim(
        &self,
        wants: &[(String, usize)],
        breaker: BreakerConfig,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Vec<PgClaim>, LedgerError> {
        let lease_until = now_ms.saturating_add(lease_ms);
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let out = Self::claim_in(&tx, &self.owner, wants, breaker, now_ms, lease_until).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// [`PgLedger::claim`] inside the caller's transaction, leasing to `owner` until
    /// `lease_until`. Three round trips, whatever the number of subscribers and deliveries:
    /// the locks and counts, the lease, the limiters and what remains due.
    pub(super) async fn claim_in(
        tx: &Transaction<'_>,
        owner: &str,
        wants: &[(String, usize)],
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
        Self::lease_in(tx, owner, &wanted, live, &counted, now_ms, lease_until).await
    }

    /// The rest of a claim once the subscribers' rows are locked — `live`: the live ones in id
    /// order, with their limits and shared limiter as of now — and their sends in flight
    /// counted (`counted`: the rows of `CLAIM_COUNT`, run after their expired leases went back
    /// to the queue). Two round trips.
    pub(super) async fn lease_in(
        tx: &Transaction<'_>,
        owner: &str,
        wanted: &BTreeMap<&str, usize>,
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
        let mut grant_ids: Vec<&str> = Vec::with_capacity(live.len());
        let mut grants: Vec<i64> = Vec::with_capacity(live.len());
        for (id, l, mut limiter) in live {
            let busy = in_flight.get(&id).copied().unwrap_or(0);
            let most = wanted.get(id.as_str()).copied().unwrap_or(0);
            let reservation = grant_shared(&mut limiter, l, busy, most, now_ms);
            held.push((id, l, limiter, reservation));
        }
        for (id, _, _, reservation) in &held {
            if reservation.granted() > 0 {
                grant_ids.push(id.as_str());
                grants.push(reservation.granted() as i64);
            }
        }
        // 5. Lease that many due deliveries of each to this daemon, oldest due first, rows
        // another transaction holds skipped: one statement picks, locks, leases and reads
        // them.
        let mut claimed: HashMap<String, Vec<(i64, i64, Claimed)>> = HashMap::new();
        if !grant_ids.is_empty() {
            let lease = tx.prepare_cached(CLAIM_LEASE).await?;
            for r in tx
                .query(
                    &lease,
                    &[&grant_ids, &grants, &owner, &lease_until, &now_ms],
                )
                .await?
            {
                let rowid: i64 = r.try_get(0)?;
                let due: i64 = r.try_get(6)?;
                claimed.entry(r.try_get(1)?).or_default().push((
                    due,
                    rowid,
                    Claimed {
                        rowid,
                        event_id: r.try_get(2)?,
                        event_type: r.try_get(3)?,
                        body: r.try_get(4)?,
                        attempt: (r.try_get::<_, i32>(5)?.max(0) as u32).saturating_add(1),
                    },
                ));
            }
        }
        // 6. Keep what was leased of each reservation, give back the rest exactly.
        let mut store_ids: Vec<&str> = Vec::with_capacity(held.len());
        let mut store_states: Vec<String> = Vec::with_capacity(held.len());
        for (id, l, limiter, reservation) in &mut held {
            let n = claimed.get(id.as_str()).map_or(0, Vec::len);
            limiter.commit(*l, *reservation, n);
            *in_flight.entry(id.clone()).or_default() += n as u32;
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
            let mut leased = claimed.remove(&id).unwrap_or_default();
            leased.sort_by_key(|(due, rowid, _)| (*due, *rowid));
            out.push(PgClaim {
                claimed: leased.into_iter().map(|(_, _, d)| d).collect(),
                lease_expires_ms: lease_until,
                in_flight: busy,
                wait_ms,
                next_due_ms,
                subscriber_id: id,
            });
        }
        Ok(out)
    }

    /// Record results and fold their answers into the shared limiters, in one transaction.
    /// A result counts only while its delivery is still leased to this daemon (under the same
    /// lease, when given); otherwise it is stale (reported, not recorded). Feedback is folded in either
    /// way: the subscriber did answer so.
    pub async fn apply(
        &self,
        outcomes: &[LeasedOutcome],
        feedback: &[Feedback],
        breaker: BreakerConfig,
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let out = Self::apply_in(&tx, &self.owner, outcomes, feedback, breaker, now_ms).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// [`PgLedger::apply`] inside the caller's transaction, for `owner`'s leases.
    pub(super) async fn apply_in(
        tx: &Transaction<'_>,
        owner: &str,
        outcomes: &[LeasedOutcome],
        feedback: &[Feedback],
        breaker: BreakerConfig,
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        // Subscriber rows first, in id order (the claim's order): no deadlock with a claim.
        if !feedback.is_empty() {
            let mut ids: Vec<&str> = feedback.iter().map(|f| f.subscriber_id.as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            let rows = tx
                .query(
                    "SELECT id, rate_per_sec, burst, max_in_flight, limiter FROM subscribers
                     WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                    &[&ids],
                )
                .await?;
            let mut store_ids: Vec<String> = Vec::new();
            let mut store_states: Vec<String> = Vec::new();
            for r in &rows {
                let id: String = r.try_get(0)?;
                let l = core_limits(r, breaker)?;
                let raw: Option<String> = r.try_get("limiter")?;
                let mut limiter = decode_limiter(&id, raw.as_deref(), now_ms);
                for f in feedback.iter().filter(|f| f.subscriber_id == id) {
                    limiter.record(l, &f.attempt, f.at_ms);
                }
                store_states.push(encode_limiter(&limiter));
                store_ids.push(id);
            }
            let store = tx.prepare_cached(STORE_LIMITERS).await?;
            tx.execute(&store, &[&store_ids, &store_states]).await?;
        }
        let outcomes: Vec<(&Outcome, Option<i64>)> = outcomes
            .iter()
            .map(|lo| (&lo.outcome, lo.lease_expires_ms))
            .collect();
        Self::record_outcomes(tx, owner, &outcomes, now_ms).await
    }

    /// Record results of deliveries leased to `owner` (under the given lease, when there is
    /// one) and the attempts of those recorded, in order: one statement whatever their number.
    pub(super) async fn record_outcomes(
        tx: &Transaction<'_>,
        owner: &str,
        outcomes: &[(&Outcome, Option<i64>)],
        now_ms: i64,
    ) -> Result<Applied, LedgerError> {
        if outcomes.is_empty() {
            return Ok(Applied::default());
        }
        let n = outcomes.len();
        let mut ids = Vec::with_capacity(n);
        let mut leases = Vec::with_capacity(n);
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
        for (o, lease) in outcomes {
            ids.push(o.rowid);
            leases.push(*lease);
            let (status, s, at, err, keep) = match &o.transition {
                Transition::Sent => ("sent", 1, None, None, false),
                Transition::Retry { at_ms, error } => {
                    ("pending", 1, Some(*at_ms), Some(error.as_str()), false)
                }
                Transition::Dead { reason } => (
                    "dead",
                    i32::from(o.attempt.is_some()),
                    None,
                    Some(reason.as_str()),
                    false,
                ),
                Transition::Defer { at_ms } => ("pending", 0, Some(*at_ms), None, true),
            };
            statuses.push(status);
            spent.push(s);
            next.push(at);
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
        let recorded: HashSet<i64> = tx
            .query(
                &st,
                &[
                    &ids,
                    &leases,
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
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        Ok(Applied {
            recorded: recorded.len(),
            stale: ids
                .into_iter()
                .filter(|id| !recorded.contains(id))
                .collect(),
        })
    }

    /// Return this daemon's own leases to the queue, due now (a daemon restarting under the
    /// same name: whatever it held died with its previous run). Returns how many.
    pub async fn release_own_leases(&self, now_ms: i64) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        Ok(c.execute(
            "UPDATE deliveries SET status = 'pending', lease_owner = NULL, lease_expires_ms = NULL,
                 next_attempt_ms = $2, updated_ms = $2
             WHERE status = 'in_flight' AND lease_owner = $1",
            &[&&*self.owner, &now_ms],
        )
        .await?)
    }

    /// Every live subscriber with pending work and when its earliest delivery is due; expired
    /// leases count as due at their expiry.
    pub async fn due_summary(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT s.id, LEAST(
                     (SELECT MIN(d.next_attempt_ms) FROM deliveries d
                      WHERE d.subscriber_id = s.id AND d.status = 'pending'),
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

    // -----------------------------------------------------------------------------------------
    // Reading and replaying deliveries

    /// Deliveries matching `f`, in id order, at most `f.limit`, as
    /// `ledger::list_deliveries`: each is one id range of one index (a status within a
    /// subscriber, an event, or the primary key; in-flight ones by the lease index, bounded by
    /// the in-flight caps). A subscriber without a status is read as one range per status, and
    /// a status without a subscriber as one range per subscriber that has deliveries in it
    /// (`delivery_counts`), merged: no list reads more than a few ranges of `limit` rows.
    pub async fn list_deliveries(
        &self,
        f: &DeliveryFilter,
    ) -> Result<Vec<DeliveryView>, LedgerError> {
        let c = self.client().await?;
        // A customer's list is its subscribers' lists merged (as on SQLite): its cost follows
        // the customer's own deliveries, not the ledger's.
        let parts = match customer_ranges(&c, f).await? {
            Some(per_subscriber) => per_subscriber,
            None => vec![f.clone()],
        };
        let mut all = Vec::new();
        for part in &parts {
            if part.subscriber.is_some() && part.status.is_none() && part.event.is_none() {
                for status in Status::ALL {
                    let one = DeliveryFilter {
                        status: Some(status),
                        ..part.clone()
                    };
                    all.extend(list_range(&c, &one).await?);
                }
            } else {
                all.extend(list_range(&c, part).await?);
            }
        }
        all.sort_by_key(|(rowid, _)| *rowid);
        all.truncate(f.limit);
        Ok(all.into_iter().map(|(_, d)| d).collect())
    }

    pub async fn get_delivery(&self, rowid: i64) -> Result<DeliveryView, LedgerError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM deliveries d
                     LEFT JOIN events e ON e.id = d.event_id WHERE d.id = $1"
                ),
                &[&rowid],
            )
            .await?
            .ok_or_else(|| {
                LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid)))
            })?;
        let mut d = delivery_from_row(&row)?;
        let attempts = c
            .query(
                "SELECT attempt, at_ms, lane, outcome, status, latency_ms, response_body, error
                 FROM attempts WHERE delivery_id = $1 ORDER BY id",
                &[&rowid],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(AttemptRecordView {
                    attempt: r.try_get::<_, i32>(0)?.max(0) as u32,
                    at_ms: r.try_get(1)?,
                    lane: enum_column(r, 2, Lane::parse)?,
                    outcome: enum_column(r, 3, AttemptOutcome::parse)?,
                    status: r
                        .try_get::<_, Option<i32>>(4)?
                        .and_then(|s| u16::try_from(s).ok()),
                    latency_ms: r.try_get(5)?,
                    response_body: r.try_get(6)?,
                    error: r.try_get(7)?,
                })
            })
            .collect::<Result<Vec<_>, LedgerError>>()?;
        d.attempts = Some(attempts);
        Ok(d)
    }

    /// Put one delivery back in the queue, due now, with a fresh attempt budget. One in
    /// flight cannot be replayed. Returns its subscriber.
    pub async fn replay_one(&self, rowid: i64, now_ms: i64) -> Result<String, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let sub = Self::replay_one_in(&tx, rowid, now_ms).await?;
        tx.commit().await?;
        Ok(sub)
    }

    /// [`PgLedger::replay_one`] inside the caller's transaction.
    pub(super) async fn replay_one_in(
        tx: &Transaction<'_>,
        rowid: i64,
        now_ms: i64,
    ) -> Result<String, LedgerError> {
        let row = tx
            .query_opt(
                "SELECT d.subscriber_id, d.status, s.deleted_ms IS NULL AND s.id IS NOT NULL
                 FROM deliveries d LEFT JOIN subscribers s ON s.id = d.subscriber_id
                 WHERE d.id = $1 FOR UPDATE OF d",
                &[&rowid],
            )
            .await?
            .ok_or_else(|| {
                LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid)))
            })?;
        let sub: String = row.try_get(0)?;
        let status: String = row.try_get(1)?;
        let live: bool = row.try_get::<_, Option<bool>>(2)?.unwrap_or(false);
        if status == Status::InFlight.as_str() {
            return Err(LedgerError::Conflict(format!(
                "delivery {} is in flight",
                delivery_public_id(rowid)
            )));
        }
        if !live {
            return Err(LedgerError::Conflict(format!(
                "subscriber {sub} has been removed"
            )));
        }
        tx.execute(
            "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_ms = $2,
                 last_error = NULL, updated_ms = $2
             WHERE id = $1",
            &[&rowid, &now_ms],
        )
        .await?;
        tx.execute(
            "SELECT pg_notify($1, $2)",
            &[&DUE_CHANNEL, &notify_payload(std::slice::from_ref(&sub))],
        )
        .await?;
        Ok(sub)
    }

    /// One step of a bulk replay (as SQLite's `ledger::replay_step`): the first `f.limit`
    /// deliveries matching the filter after `f.after`, in id order (status defaults to dead;
    /// in-flight ones and removed subscribers' are skipped; pending ones are left as they
    /// are), put back in the queue, in one short transaction; the work is announced.
    pub async fn replay_step(
        &self,
        f: &DeliveryFilter,
        now_ms: i64,
    ) -> Result<crate::ledger::ReplayStep, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // A customer's: its subscribers' first ids, merged.
        let parts = match customer_ranges(&tx, f).await? {
            Some(per_subscriber) => per_subscriber,
            None => vec![f.clone()],
        };
        let mut ids: Vec<i64> = Vec::new();
        for part in &parts {
            let (filter, params) = replayable_sql(part)?;
            for r in tx
                .query(
                    &format!(
                        "SELECT d.id FROM deliveries d {filter} ORDER BY d.id LIMIT {}",
                        f.limit
                    ),
                    &refs(&params),
                )
                .await?
            {
                ids.push(r.try_get(0)?);
            }
        }
        ids.sort_unstable();
        ids.truncate(f.limit);
        // Rows another transaction holds (a claim, a result) are skipped, never waited for.
        let rows = tx
            .query(
                "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_ms = $1,
                     last_error = NULL, updated_ms = $1
                 WHERE id IN (SELECT id FROM deliveries WHERE id = ANY($2)
                              AND status IN ('sent', 'dead') FOR UPDATE SKIP LOCKED)
                 RETURNING subscriber_id",
                &[&now_ms, &ids],
            )
            .await?;
        let replayed = rows.len() as u64;
        let mut subs: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        subs.sort();
        subs.dedup();
        if !subs.is_empty() {
            tx.execute(
                "SELECT pg_notify($1, $2)",
                &[&DUE_CHANNEL, &notify_payload(&subs)],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(crate::ledger::ReplayStep {
            replayed,
            subscribers: subs,
            last: ids.last().copied(),
            done: ids.len() < f.limit,
        })
    }

    /// How many deliveries a bulk replay with this filter would replay now (`dry_run`).
    pub async fn count_replayable(&self, f: &DeliveryFilter) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        let parts = match customer_ranges(&c, f).await? {
            Some(per_subscriber) => per_subscriber,
            None => vec![f.clone()],
        };
        let mut total = 0u64;
        for part in &parts {
            let (filter, params) = replayable_sql(part)?;
            let n: i64 = c
                .query_one(
                    &format!("SELECT COUNT(*) FROM deliveries d {filter}"),
                    &refs(&params),
                )
                .await?
                .try_get(0)?;
            total += n.max(0) as u64;
        }
        Ok(total)
    }

    /// Answers when the database does.
    pub async fn ping(&self) -> Result<(), LedgerError> {
        self.client().await?.query_one("SELECT 1", &[]).await?;
        Ok(())
    }

    /// Deliveries per status, for `/metrics`: the sums of the counts the triggers keep
    /// (`delivery_counts`), not a count over the deliveries.
    pub async fn status_counts(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        let c = self.client().await?;
        status_counts_on(&c).await
    }

    /// Per-subscriber figures for `/metrics`, as `ledger::subscriber_stats`.
    pub async fn subscriber_stats(
        &self,
        breaker: BreakerConfig,
        now_ms: i64,
    ) -> Result<Vec<SubscriberStats>, LedgerError> {
        let subs = self.list_subscribers().await?;
        let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
        let c = self.client().await?;
        let mut counts = kept_counts(&c, &ids).await?;
        let mut oldest_at = oldest_open(&c, &ids).await?;
        let limiters = self.limiters(&c, now_ms).await?;
        Ok(subs
            .into_iter()
            .map(|s| {
                let by_status = counts.remove(&s.id).unwrap_or_default();
                let oldest = oldest_at.remove(&s.id);
                let limiter = limiters.get(&s.id).copied().unwrap_or_default();
                SubscriberStats::of(s, &by_status, oldest, &limiter, breaker, now_ms)
            })
            .collect())
    }

    async fn limiters(
        &self,
        c: &deadpool_postgres::Object,
        now_ms: i64,
    ) -> Result<HashMap<String, LimiterState>, LedgerError> {
        let mut out = HashMap::new();
        for r in c.query("SELECT id, limiter FROM subscribers", &[]).await? {
            let id: String = r.try_get(0)?;
            let raw: Option<String> = r.try_get(1)?;
            out.insert(id.clone(), decode_limiter(&id, raw.as_deref(), now_ms));
        }
        Ok(out)
    }

    /// Figures for each of `ids`, as `ledger::status::subscriber_counts`.
    pub async fn subscriber_counts(
        &self,
        ids: &[String],
        now_ms: i64,
    ) -> Result<BTreeMap<String, SubscriberCounts>, LedgerError> {
        let c = self.client().await?;
        let mut out: BTreeMap<String, SubscriberCounts> = ids
            .iter()
            .map(|id| (id.clone(), SubscriberCounts::default()))
            .collect();
        for (sub, by_status) in kept_counts(&c, ids).await? {
            if let Some(s) = out.get_mut(&sub) {
                for (status, n) in by_status {
                    match Status::parse(&status) {
                        Some(Status::Pending) => s.pending = n,
                        Some(Status::InFlight) => s.in_flight = n,
                        Some(Status::Sent) => s.sent = n,
                        Some(Status::Dead) => s.dead = n,
                        None => {}
                    }
                }
            }
        }
        // The latest of each subscriber's error rows (folded to one every second).
        for r in c
            .query(
                "SELECT DISTINCT ON (subscriber_id) subscriber_id, at_ms, status, error
                 FROM last_errors WHERE subscriber_id = ANY($1)
                 ORDER BY subscriber_id, at_ms DESC, id DESC",
                &[&ids],
            )
            .await?
        {
            let sub: String = r.try_get(0)?;
            let at: i64 = r.try_get(1)?;
            let status: Option<i32> = r.try_get(2)?;
            let error: Option<String> = r.try_get(3)?;
            if let Some(s) = out.get_mut(&sub) {
                s.last_error = Some((at, describe_failure(status, error)));
            }
        }
        for r in c
            .query(
                "SELECT id, limiter FROM subscribers WHERE id = ANY($1)",
                &[&ids],
            )
            .await?
        {
            let id: String = r.try_get(0)?;
            let raw: Option<String> = r.try_get(1)?;
            if let Some(s) = out.get_mut(&id) {
                s.limiter = decode_limiter(&id, raw.as_deref(), now_ms);
            }
        }
        Ok(out)
    }

    // -----------------------------------------------------------------------------------------
    // Health and alerts (as `ledger/health.rs`)

    pub async fn apply_health(&self, writes: &[HealthWrite]) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        Self::apply_health_in(&tx, writes).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn apply_health_in(
        tx: &Transaction<'_>,
        writes: &[HealthWrite],
    ) -> Result<(), LedgerError> {
        let mut latest = HashSet::new();
        for w in writes.iter().rev() {
            match w {
                HealthWrite::FailingSince {
                    subscriber,
                    since_ms,
                } => {
                    if !latest.insert(subscriber.as_str()) {
                        continue;
                    }
                    tx.execute(
                        "UPDATE subscribers SET failing_since_ms = $2 WHERE id = $1",
                        &[subscriber, since_ms],
                    )
                    .await?
                }
                HealthWrite::Disable {
                    subscriber,
                    disabled,
                } => {
                    announce_change(tx, subscriber).await?;
                    tx.execute(
                        "UPDATE subscribers SET disabled_ms = $2, disabled_reason = $3
                         WHERE id = $1 AND disabled_ms IS NULL",
                        &[subscriber, &disabled.at_ms, &disabled.reason],
                    )
                    .await?
                }
            };
        }
        Ok(())
    }

    /// A subscriber's dead deliveries, counted up to `cap`.
    pub async fn dead_count_capped(&self, subscriber: &str, cap: u64) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        dead_count_on(&c, subscriber, cap).await
    }

    /// Alert once when a subscriber's dead count reaches `threshold` (the mark is shared by
    /// every daemon: the row is locked while it is checked).
    pub async fn check_dead_counts(
        &self,
        subs: &[String],
        threshold: u64,
        now_ms: i64,
    ) -> Result<Vec<Notice>, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let out = Self::check_dead_counts_in(&tx, subs, threshold, now_ms).await?;
        tx.commit().await?;
        Ok(out)
    }

    pub(super) async fn check_dead_counts_in(
        tx: &Transaction<'_>,
        subs: &[String],
        threshold: u64,
        now_ms: i64,
    ) -> Result<Vec<Notice>, LedgerError> {
        let mut sorted: Vec<&String> = subs.iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut out = Vec::new();
        for sub in sorted {
            let Some(row) = tx
                .query_opt(
                    "SELECT dead_alerted_ms FROM subscribers
                     WHERE id = $1 AND deleted_ms IS NULL FOR UPDATE",
                    &[sub],
                )
                .await?
            else {
                continue;
            };
            let alerted_ms: Option<i64> = row.try_get(0)?;
            let dead = dead_count_on(tx, sub, threshold).await?;
            let (alerted, alert) = after_dead_count(alerted_ms.is_some(), dead, threshold);
            if alerted != alerted_ms.is_some() {
                tx.execute(
                    "UPDATE subscribers SET dead_alerted_ms = $2 WHERE id = $1",
                    &[sub, &alerted.then_some(now_ms)],
                )
                .await?;
            }
            if let Some(alert) = alert {
                out.push(Notice {
                    subscriber: sub.clone(),
                    at_ms: now_ms,
                    alert,
                });
            }
        }
        Ok(out)
    }

    /// Re-arm the dead-count alert of subscribers back under the threshold.
    pub async fn rearm_dead_alerts(&self, threshold: u64) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        let alerted: Vec<String> = c
            .query(
                "SELECT id FROM subscribers WHERE dead_alerted_ms IS NOT NULL",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let mut n = 0;
        for sub in alerted {
            if dead_count_on(&c, &sub, threshold).await? < threshold.max(1) {
                n += c
                    .execute(
                        "UPDATE subscribers SET dead_alerted_ms = NULL WHERE id = $1",
                        &[&sub],
                    )
                    .await?;
            }
        }
        Ok(n)
    }
}

/// Tell every daemon (on commit) that a subscriber's definition or state changed.
async fn announce_change(
    c: &impl deadpool_postgres::GenericClient,
    id: &str,
) -> Result<(), LedgerError> {
    c.execute("SELECT pg_notify($1, $2)", &[&CHANGED_CHANNEL, &id])
        .await?;
    Ok(())
}

async fn dead_count_on(
    c: &impl deadpool_postgres::GenericClient,
    subscriber: &str,
    cap: u64,
) -> Result<u64, LedgerError> {
    let cap = cap.min(i64::MAX as u64) as i64;
    let n: i64 = c
        .query_one(
            "SELECT COUNT(*) FROM (SELECT 1 FROM deliveries
             WHERE subscriber_id = $1 AND status = 'dead' LIMIT $2) t",
            &[&subscriber, &cap],
        )
        .await?
        .try_get(0)?;
    Ok(n.max(0) as u64)
}

/// Deliveries per status, from the counts the triggers keep.
pub(super) async fn status_counts_on(
    c: &impl deadpool_postgres::GenericClient,
) -> Result<Vec<(String, i64)>, LedgerError> {
    c.query(
        "SELECT status, SUM(n)::BIGINT FROM delivery_counts GROUP BY status
         HAVING SUM(n) <> 0 ORDER BY status",
        &[],
    )
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect()
}

/// `ids`' deliveries per status, from the counts the triggers keep (a few rows per subscriber
/// and status between two folds), by the `(subscriber_id, status)` index.
async fn kept_counts(
    c: &impl deadpool_postgres::GenericClient,
    ids: &[String],
) -> Result<HashMap<String, HashMap<String, i64>>, LedgerError> {
    let mut out: HashMap<String, HashMap<String, i64>> = HashMap::new();
    for r in c
        .query(
            "SELECT subscriber_id, status, SUM(n)::BIGINT FROM delivery_counts
             WHERE subscriber_id = ANY($1) GROUP BY subscriber_id, status HAVING SUM(n) <> 0",
            &[&ids],
        )
        .await?
    {
        let (sub, status, n): (String, String, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        out.entry(sub).or_default().insert(status, n);
    }
    Ok(out)
}

/// When each of `ids`' oldest open (pending or in flight) delivery was created: the first
/// pending one in id order (`deliveries_pending_by_sub`) and the oldest in flight (bounded by
/// the in-flight cap, `deliveries_leased`) — index probes, whatever the ledger holds.
async fn oldest_open(
    c: &impl deadpool_postgres::GenericClient,
    ids: &[String],
) -> Result<HashMap<String, i64>, LedgerError> {
    let mut out = HashMap::new();
    for r in c
        .query(
            "SELECT s.id, LEAST(
                 (SELECT created_ms FROM deliveries
                  WHERE subscriber_id = s.id AND status = 'pending' ORDER BY id LIMIT 1),
                 (SELECT MIN(created_ms) FROM deliveries
                  WHERE subscriber_id = s.id AND status = 'in_flight'))
             FROM unnest($1::text[]) AS s(id)",
            &[&ids],
        )
        .await?
    {
        if let Some(t) = r.try_get::<_, Option<i64>>(1)? {
            out.insert(r.try_get(0)?, t);
        }
    }
    Ok(out)
}

/// A failed attempt in a few words, as `ledger::status` says it.
fn describe_failure(status: Option<i32>, error: Option<String>) -> String {
    match (error, status) {
        (Some(e), Some(s)) => format!("{s}: {e}"),
        (Some(e), None) => e,
        (None, Some(s)) => format!("HTTP {s}"),
        (None, None) => "failed".to_string(),
    }
}

const DELIVERY_COLUMNS: &str =
    "d.id, d.subscriber_id, d.event_id, COALESCE(e.type, ''), d.status, \
     d.attempts, d.next_attempt_ms, d.last_error, d.created_ms, d.updated_ms";

fn delivery_from_row(r: &Row) -> Result<DeliveryView, LedgerError> {
    let status = enum_column(r, 4, Status::parse)?;
    let next: i64 = r.try_get(6)?;
    Ok(DeliveryView {
        id: delivery_public_id(r.try_get(0)?),
        subscriber_id: r.try_get(1)?,
        event_id: r.try_get(2)?,
        event_type: r.try_get(3)?,
        next_attempt_at_ms: (status == Status::Pending).then_some(next),
        status,
        attempt_count: r.try_get::<_, i32>(5)?.max(0) as u32,
        last_error: r.try_get(7)?,
        created_at_ms: r.try_get(8)?,
        updated_at_ms: r.try_get(9)?,
        attempts: None,
    })
}

/// `WHERE …` for what a bulk replay with this filter replays (`filter.rs`).
fn replayable_sql(f: &DeliveryFilter) -> Result<(String, Vec<Param>), LedgerError> {
    let (clause, args) = filter::replayable(f, Dialect::Postgres)?;
    Ok((clause, params(args)))
}

/// A filter's arguments as PostgreSQL parameters.
fn params(args: Vec<Arg>) -> Vec<Param> {
    args.into_iter()
        .map(|a| -> Param {
            match a {
                Arg::Text(t) => Box::new(t),
                Arg::Int(n) => Box::new(n),
            }
        })
        .collect()
}

/// A filter scoped to a customer without a subscriber or an event, as one filter per
/// subscriber the customer owns or owned (`subscribers_by_customer`); `None` for any other.
async fn customer_ranges(
    c: &impl deadpool_postgres::GenericClient,
    f: &DeliveryFilter,
) -> Result<Option<Vec<DeliveryFilter>>, LedgerError> {
    let (Some(customer), None, None) = (&f.customer, &f.subscriber, &f.event) else {
        return Ok(None);
    };
    let subs: Vec<String> = c
        .query(
            "SELECT id FROM subscribers WHERE customer = $1 ORDER BY id",
            &[customer],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
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

/// Deliveries matching `f` in id order (see `list_deliveries`), with their rowids. A status
/// other than in flight without a subscriber or an event is read per subscriber: the
/// subscribers that have deliveries in that status (from the kept counts), each one id range
/// of its status's index, `limit` at most, merged.
async fn list_range(
    c: &impl deadpool_postgres::GenericClient,
    f: &DeliveryFilter,
) -> Result<Vec<(i64, DeliveryView)>, LedgerError> {
    let per_subscriber = f.subscriber.is_none()
        && f.event.is_none()
        && matches!(
            f.status,
            Some(Status::Pending) | Some(Status::Sent) | Some(Status::Dead)
        );
    let (filter, params) = filter_sql(f);
    let sql = if per_subscriber {
        let status = f.status.map_or("", |s| s.as_str());
        format!(
            "SELECT {DELIVERY_COLUMNS} FROM
                 (SELECT subscriber_id FROM delivery_counts WHERE status = '{status}'
                  GROUP BY subscriber_id HAVING SUM(n) > 0) s
             CROSS JOIN LATERAL (SELECT * FROM deliveries d
                 {filter} AND d.subscriber_id = s.subscriber_id ORDER BY d.id LIMIT {limit}) d
             LEFT JOIN events e ON e.id = d.event_id ORDER BY d.id LIMIT {limit}",
            limit = f.limit
        )
    } else {
        format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d LEFT JOIN events e ON e.id = d.event_id
             {filter} ORDER BY d.id LIMIT {}",
            f.limit
        )
    };
    c.query(&sql, &refs(&params))
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, delivery_from_row(r)?)))
        .collect()
}

/// `WHERE …` for a delivery filter and its parameters (`filter.rs`).
fn filter_sql(f: &DeliveryFilter) -> (String, Vec<Param>) {
    let (clause, args) = filter::where_clause(f, Dialect::Postgres);
    (clause, params(args))
}
