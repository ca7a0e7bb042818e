//! Subscribers on SQLite: their rows and secrets, created, changed, removed and rotated, and
//! the limiter state the dispatcher stores on them; [`Subscribers`] for the API. Functions over
//! a connection (the caller chooses the transaction), statements prepared once and cached.
//! Deliveries are in `deliveries.rs`, ingest in `ingest.rs`.

use std::collections::BTreeMap;

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::customers::check_customer_exists;
use super::health::set_disabled;
use super::ledger::Ledger;
use super::status::subscriber_counts;
use crate::keyring::NewSecret;
use crate::ledger::error::{rotation_too_soon, LedgerError};
use crate::ledger::rules::{self, IdUse, StoredId};
use crate::ledger::scope;
use crate::ledger::subscribers::{SubscriberCounts, Subscribers};
use crate::model::{
    rotation_wait_ms, Disabled, Health, Lane, Limits, Ordering, Payload, Scheme, StoredSecret,
    Subscriber,
};

const SUBSCRIBER_COLUMNS: &str = "id, url, event_types, rate_per_sec, burst, max_in_flight, \
     timeout_ms, lane, legacy_signature, created_ms, updated_ms, disabled_ms, disabled_reason, \
     failing_since_ms, customer, disabled_by_operator, filter, payload, ordering, ordering_key,
     propagate_trace, signature, batch, customer_filter";

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
        filter: filter_from_column(r.get(16)?),
        payload: Payload::parse(&r.get::<_, String>(17)?).unwrap_or_default(),
        ordering: Ordering::parse(&r.get::<_, String>(18)?).unwrap_or_default(),
        ordering_key: r.get(19)?,
        propagate_trace: r.get(20)?,
        signature: Scheme::parse(&r.get::<_, String>(21)?).unwrap_or_default(),
        batch: batch_from_column(r.get(22)?),
        customer_filter: filter_from_column(r.get(23)?),
    })
}

fn load_secrets(c: &Connection, id: &str) -> Result<Vec<StoredSecret>, LedgerError> {
    let mut st = c.prepare_cached(
        "SELECT secret, created_ms, expires_ms, signing_key FROM subscriber_secrets
         WHERE subscriber_id = ?1 ORDER BY created_ms DESC, rowid DESC",
    )?;
    let rows = st.query_map([id], |r| {
        Ok(StoredSecret {
            secret: r.get(0)?,
            created_ms: r.get(1)?,
            expires_ms: r.get(2)?,
            signing_key: r.get(3)?,
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
/// ?9 legacy_signature, ?10 the time of the change, ?11 customer, ?12 filter (JSON or NULL),
/// ?13 payload, ?14 ordering, ?15 ordering_key, ?16 propagate_trace, ?17 signature, ?18 batch
/// (JSON or NULL), ?19 customer_filter (JSON or NULL).
fn definition_params<'a>(
    s: &'a Subscriber,
    event_types_json: &'a str,
    at_ms: i64,
) -> impl rusqlite::Params + 'a {
    // More than the 16 a tuple binds: boxed, in this order.
    let params: Vec<Box<dyn rusqlite::ToSql + 'a>> = vec![
        Box::new(s.id.as_str()),
        Box::new(s.url.as_str()),
        Box::new(event_types_json),
        Box::new(s.limits.rate_per_sec),
        Box::new(s.limits.burst),
        Box::new(s.limits.max_in_flight),
        Box::new(s.limits.timeout_ms as i64),
        Box::new(s.lane.as_str()),
        Box::new(s.legacy_signature),
        Box::new(at_ms),
        Box::new(s.customer.as_deref()),
        Box::new(filter_column(&s.filter)),
        Box::new(s.payload.as_str()),
        Box::new(s.ordering.as_str()),
        Box::new(s.ordering_key.as_deref()),
        Box::new(s.propagate_trace),
        Box::new(s.signature.as_str()),
        Box::new(batch_column(s)),
        Box::new(filter_column(&s.customer_filter)),
    ];
    rusqlite::params_from_iter(params)
}

use crate::ledger::subscribers::{
    batch_column, batch_from_column, filter_column, filter_from_column, FORGET_REMOVED,
};

fn event_types_json(s: &Subscriber) -> String {
    serde_json::to_string(&s.event_types).unwrap_or_else(|_| "[]".into())
}

/// Insert a new subscriber (or bring back a removed one under the same id) with its first
/// secret (and signing key).
pub fn create_subscriber(
    c: &Connection,
    s: &Subscriber,
    secret: impl Into<NewSecret>,
) -> Result<(), LedgerError> {
    let secret = secret.into();
    let existing: Option<(Option<i64>, Option<String>)> = c
        .prepare_cached("SELECT deleted_ms, customer FROM subscribers WHERE id = ?1")?
        .query_row([&s.id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let stored = match &existing {
        None => StoredId::Free,
        Some((None, _)) => StoredId::Live,
        Some((Some(_), owner)) => StoredId::Removed {
            owner: owner.as_deref(),
            kept: has_deliveries(c, &s.id)?,
        },
    };
    if let IdUse::Replace { forget } = rules::subscriber_id(&s.id, stored, s.customer.as_deref())? {
        c.execute(
            "DELETE FROM subscriber_secrets WHERE subscriber_id = ?1",
            [&s.id],
        )?;
        c.execute("DELETE FROM subscribers WHERE id = ?1", [&s.id])?;
        if forget {
            for forget in FORGET_REMOVED {
                c.prepare_cached(forget)?.execute([&s.id])?;
            }
        }
    }
    c.prepare_cached(
        "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
             timeout_ms, lane, legacy_signature, created_ms, updated_ms, customer, filter,
             payload, ordering, ordering_key, propagate_trace, signature, batch, customer_filter)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
             ?18, ?19)",
    )?
    .execute(definition_params(s, &event_types_json(s), s.created_ms))?;
    insert_secret(c, &s.id, &secret, s.created_ms)?;
    Ok(())
}

/// Whether any delivery is kept under subscriber id `id` (from the kept counts).
fn has_deliveries(c: &Connection, id: &str) -> Result<bool, LedgerError> {
    let n: i64 = c
        .prepare_cached("SELECT COALESCE(SUM(n), 0) FROM delivery_counts WHERE subscriber_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    Ok(n > 0)
}

/// Store a changed subscriber definition (not its secrets). The limiter state is kept: a
/// change never grants a fresh burst, and a pause still holds.
pub fn update_subscriber(c: &Connection, s: &Subscriber) -> Result<(), LedgerError> {
    let n = c
        .prepare_cached(
            "UPDATE subscribers SET url = ?2, event_types = ?3, rate_per_sec = ?4, burst = ?5,
                 max_in_flight = ?6, timeout_ms = ?7, lane = ?8, legacy_signature = ?9,
                 updated_ms = ?10, customer = ?11, filter = ?12, payload = ?13, ordering = ?14,
                 ordering_key = ?15, propagate_trace = ?16, signature = ?17, batch = ?18,
                 customer_filter = ?19
             WHERE id = ?1 AND deleted_ms IS NULL",
        )?
        .execute(definition_params(s, &event_types_json(s), s.updated_ms))?;
    if n == 0 {
        return Err(LedgerError::NotFound(format!("subscriber {}", s.id)));
    }
    // A generation given its first signing key by the change (a switch to Ed25519).
    for g in &s.secrets {
        if let Some(key) = &g.signing_key {
            c.prepare_cached(
                "UPDATE subscriber_secrets SET signing_key = ?3
                 WHERE subscriber_id = ?1 AND secret = ?2 AND signing_key IS NULL",
            )?
            .execute(params![s.id, g.secret, key])?;
        }
    }
    Ok(())
}

/// One generation of a subscriber's secrets: the HMAC secret and its signing key.
fn insert_secret(
    c: &Connection,
    id: &str,
    secret: &NewSecret,
    now_ms: i64,
) -> Result<(), LedgerError> {
    c.prepare_cached(
        "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms, signing_key)
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![id, secret.secret, now_ms, secret.signing_key])?;
    Ok(())
}

/// Remove a subscriber: it matches no new event, and its unfinished deliveries go dead
/// (replayable if it comes back). Returns how many deliveries went dead.
pub fn delete_subscriber(c: &Connection, id: &str, now_ms: i64) -> Result<u64, LedgerError> {
    let n = c.execute(
        "UPDATE subscribers SET deleted_ms = ?2, updated_ms = ?2 WHERE id = ?1 AND deleted_ms IS NULL",
        params![id, now_ms],
    )?;
    if n == 0 {
        return Err(LedgerError::NotFound(format!("subscriber {id}")));
    }
    let dead = c.execute(
        "UPDATE deliveries SET status = 'dead', last_error = 'subscriber removed', updated_ms = ?2,
             lease_expires_ms = NULL
         WHERE subscriber_id = ?1 AND status IN ('pending', 'in_flight')",
        params![id, now_ms],
    )?;
    Ok(dead as u64)
}

/// Add `secret` as the current secret; the one it replaces keeps signing until
/// `now + grace_ms`, and any older one stops now (at most `MAX_ACTIVE_SECRETS` sign). A
/// rotation within `MIN_ROTATION_INTERVAL_MS` of the previous one is `TooSoon`.
pub fn rotate_secret(
    c: &Connection,
    id: &str,
    secret: impl Into<NewSecret>,
    now_ms: i64,
    grace_ms: i64,
) -> Result<(), LedgerError> {
    let secret = secret.into();
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
    insert_secret(c, id, &secret, now_ms)?;
    c.execute(
        "UPDATE subscribers SET updated_ms = ?2 WHERE id = ?1",
        params![id, now_ms],
    )?;
    Ok(())
}

/// On SQLite, inside the caller's transaction: the live subscriber `id` if `scope` sees it.
pub(super) fn visible_subscriber(
    c: &Connection,
    id: &str,
    scope: Option<&str>,
) -> Result<Subscriber, LedgerError> {
    scope::visible(scope, get_subscriber(c, id)?)
}

impl Subscribers for Ledger {
    async fn subscriber(
        &self,
        id: String,
        scope: Option<String>,
    ) -> Result<Subscriber, LedgerError> {
        let s = self.read(move |c| get_subscriber(c, &id)).await?;
        scope::visible(scope.as_deref(), s)
    }

    async fn create_subscriber(
        &self,
        s: Subscriber,
        secret: NewSecret,
    ) -> Result<Subscriber, LedgerError> {
        self.tx(move |c| {
            check_customer_exists(c, s.customer.as_deref())?;
            create_subscriber(c, &s, secret)?;
            get_subscriber(c, &s.id)
        })
        .await
    }

    async fn subscribers(
        &self,
        only: Option<String>,
        with_stats: bool,
        scope: Option<String>,
    ) -> Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError> {
        self.read(move |c| {
            let snapshot = c.transaction()?;
            let mut subs = match &only {
                Some(id) => vec![get_subscriber(&snapshot, id)?],
                None => list_subscribers(&snapshot)?,
            };
            scope::retain(scope.as_deref(), &mut subs);
            let counts = if with_stats {
                let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
                Some(subscriber_counts(&snapshot, &ids, crate::time::now_ms())?)
            } else {
                None
            };
            Ok((subs, counts))
        })
        .await
    }

    async fn update_subscriber<E, F>(
        &self,
        id: String,
        scope: Option<String>,
        change: F,
    ) -> Result<Result<Subscriber, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Subscriber) -> Result<(Subscriber, bool), E> + Send + 'static,
    {
        self.tx(move |c| {
            let current = visible_subscriber(c, &id, scope.as_deref())?;
            let (next, toggled) = match change(current) {
                Ok(n) => n,
                Err(e) => return Ok(Err(e)),
            };
            check_customer_exists(c, next.customer.as_deref())?;
            update_subscriber(c, &next)?;
            if toggled {
                set_disabled(c, &next.id, next.health.disabled.as_ref())?;
            }
            Ok(Ok(next))
        })
        .await
    }

    async fn delete_subscriber(&self, id: String, now_ms: i64) -> Result<u64, LedgerError> {
        self.tx(move |c| delete_subscriber(c, &id, now_ms)).await
    }

    async fn rotate_secret(
        &self,
        id: String,
        secret: NewSecret,
        now_ms: i64,
        grace_ms: i64,
        scope: Option<String>,
    ) -> Result<(), LedgerError> {
        self.tx(move |c| {
            visible_subscriber(c, &id, scope.as_deref())?;
            rotate_secret(c, &id, secret, now_ms, grace_ms)
        })
        .await
    }
}
