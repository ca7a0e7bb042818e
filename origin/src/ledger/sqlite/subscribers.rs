//! Subscribers on SQLite: their rows and secrets, created, changed, removed and rotated, and
//! the limiter state the dispatcher stores on them; [`Subscribers`] for the API. Functions over
//! a connection (the caller chooses the transaction), statements prepared once and cached.
//! Deliveries are in `deliveries.rs`, ingest in `ingest.rs`.

use std::collections::BTreeMap;

use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use super::cells::{decode_all, decode_one};
use super::customers::check_customer_exists;
use super::health::set_disabled;
use super::ledger::Ledger;
use super::status::{since_creation, subscriber_counts};
use crate::keyring::NewSecret;
use crate::ledger::error::{rotation_too_soon, LedgerError};
use crate::ledger::rows::subscribers as rows;
use crate::ledger::rules::{self, IdUse, StoredId};
use crate::ledger::scope;
use crate::ledger::subscribers::{SubscriberCounts, Subscribers, FORGET_REMOVED};
use crate::model::{rotation_wait_ms, StoredSecret, Subscriber};

fn load_secrets(c: &Connection, id: &str) -> Result<Vec<StoredSecret>, LedgerError> {
    let mut st = c.prepare_cached(&format!(
        "SELECT {} FROM subscriber_secrets
         WHERE subscriber_id = ?1 ORDER BY created_ms DESC, rowid DESC",
        *rows::SELECT_SECRETS
    ))?;
    decode_all(&mut st, [id], |r| rows::decode_secret(r))
}

pub fn get_subscriber(c: &Connection, id: &str) -> Result<Subscriber, LedgerError> {
    let sql = format!(
        "SELECT {} FROM subscribers WHERE id = ?1 AND deleted_ms IS NULL",
        *rows::SELECT
    );
    let mut sub = decode_one(&mut c.prepare_cached(&sql)?, [id], |r| rows::decode(r, 0))?
        .ok_or_else(|| LedgerError::NotFound(format!("subscriber {id}")))?;
    sub.secrets = load_secrets(c, id)?;
    Ok(sub)
}

pub fn list_subscribers(c: &Connection) -> Result<Vec<Subscriber>, LedgerError> {
    let sql = format!(
        "SELECT {} FROM subscribers WHERE deleted_ms IS NULL ORDER BY id",
        *rows::SELECT
    );
    let mut subs = decode_all(&mut c.prepare_cached(&sql)?, [], |r| rows::decode(r, 0))?;
    for s in &mut subs {
        s.secrets = load_secrets(c, &s.id)?;
    }
    Ok(subs)
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
    c.prepare_cached(rows::INSERT.sqlite())?
        .execute(params_from_iter(rows::definition(s, s.created_ms)))?;
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
        .prepare_cached(rows::UPDATE.sqlite())?
        .execute(params_from_iter(rows::definition(s, s.updated_ms)))?;
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
                let mut counts = subscriber_counts(&snapshot, &ids, crate::time::now_ms())?;
                since_creation(&snapshot, &subs, &mut counts)?;
                Some(counts)
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
