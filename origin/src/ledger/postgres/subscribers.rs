//! Subscribers on PostgreSQL: their rows and secrets, created, changed, removed and rotated,
//! their limiter state, and [`Subscribers`] for the API, each a transaction of its own under the
//! subscriber row's lock where it changes one. A change is announced to every daemon.

use std::collections::{BTreeMap, HashMap};

use deadpool_postgres::Transaction;
use fanout_core::breaker::Breaker;
use fanout_core::limiter::LimiterState;

use super::ledger::PgLedger;
use super::listen::CHANGED_CHANNEL;
use crate::keyring::NewSecret;
use crate::ledger::error::subscriber_exists;
use crate::ledger::rows::subscribers as rows;
use crate::ledger::rules::{self, IdUse, StoredId};
use crate::ledger::subscribers::{SubscriberCounts, FORGET_REMOVED};
use crate::ledger::LedgerError;
use crate::model::{Disabled, StoredSecret, Subscriber};

use super::rows::{bind, decode_limiter, encode_limiter, unique_violation};
use crate::ledger::scope;
use crate::ledger::subscribers::Subscribers;

impl PgLedger {
    pub(super) async fn secrets_of(
        c: &impl deadpool_postgres::GenericClient,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<StoredSecret>>, LedgerError> {
        let found = c
            .query(
                &format!(
                    "SELECT {} FROM subscriber_secrets
                     WHERE subscriber_id = ANY($1) ORDER BY created_ms DESC, id DESC",
                    *rows::SELECT_SECRETS
                ),
                &[&ids],
            )
            .await?;
        let mut out: HashMap<String, Vec<StoredSecret>> = HashMap::new();
        for r in found {
            out.entry(r.try_get(0)?)
                .or_default()
                .push(rows::decode_secret(&r)?);
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
                    "SELECT {} FROM subscribers WHERE id = $1 AND deleted_ms IS NULL",
                    *rows::SELECT
                ),
                &[&id],
            )
            .await?
            .ok_or_else(|| LedgerError::NotFound(format!("subscriber {id}")))?;
        let mut s = rows::decode(&row, 0)?;
        s.secrets = Self::secrets_of(c, &[s.id.clone()])
            .await?
            .remove(&s.id)
            .unwrap_or_default();
        Ok(s)
    }

    pub(super) async fn get_subscriber(&self, id: &str) -> Result<Subscriber, LedgerError> {
        Self::get_subscriber_on(&self.client().await?, id).await
    }

    pub(super) async fn list_subscribers(&self) -> Result<Vec<Subscriber>, LedgerError> {
        let c = self.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {} FROM subscribers WHERE deleted_ms IS NULL ORDER BY id",
                    *rows::SELECT
                ),
                &[],
            )
            .await?;
        let mut subs = rows
            .iter()
            .map(|r| rows::decode(r, 0))
            .collect::<Result<Vec<_>, _>>()?;
        let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
        let mut secrets = Self::secrets_of(&c, &ids).await?;
        for s in &mut subs {
            s.secrets = secrets.remove(&s.id).unwrap_or_default();
        }
        Ok(subs)
    }

    /// Insert a new subscriber (or bring back a removed one under the same id) with its first
    /// secret (and signing key).
    pub(super) async fn create_subscriber(
        &self,
        s: &Subscriber,
        secret: impl Into<NewSecret>,
    ) -> Result<(), LedgerError> {
        let secret = secret.into();
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let existing = tx
            .query_opt(
                "SELECT deleted_ms, customer FROM subscribers WHERE id = $1 FOR UPDATE",
                &[&s.id],
            )
            .await?;
        let existing: Option<(Option<i64>, Option<String>)> = existing
            .map(|r| Ok::<_, LedgerError>((r.try_get(0)?, r.try_get(1)?)))
            .transpose()?;
        let stored = match &existing {
            None => StoredId::Free,
            Some((None, _)) => StoredId::Live,
            // The removed row is locked (`FOR UPDATE`): another daemon creating the same id
            // waits here, then finds it live. Ingest never fans out to a removed endpoint, so
            // nothing adds a delivery (or a number) to the id meanwhile; a retention sweep
            // only removes them.
            Some((Some(_), owner)) => StoredId::Removed {
                owner: owner.as_deref(),
                kept: tx
                    .query_one(
                        "SELECT COALESCE(SUM(n), 0)::BIGINT FROM delivery_counts
                         WHERE subscriber_id = $1",
                        &[&s.id],
                    )
                    .await?
                    .try_get::<_, i64>(0)?
                    > 0,
            },
        };
        if let IdUse::Replace { forget } =
            rules::subscriber_id(&s.id, stored, s.customer.as_deref())?
        {
            tx.execute(
                "DELETE FROM subscriber_secrets WHERE subscriber_id = $1",
                &[&s.id],
            )
            .await?;
            tx.execute("DELETE FROM subscribers WHERE id = $1", &[&s.id])
                .await?;
            if forget {
                for forget in FORGET_REMOVED {
                    tx.execute(*forget, &[&s.id]).await?;
                }
            }
        }
        super::customers::hold_customer(&tx, s.customer.as_deref()).await?;
        let inserted = tx
            .execute(
                rows::INSERT.postgres(),
                &bind(&rows::definition(s, s.created_ms)),
            )
            .await;
        match inserted {
            Err(e) if unique_violation(&e) => return Err(subscriber_exists(&s.id)),
            other => other?,
        };
        insert_secret(&tx, &s.id, &secret, s.created_ms).await?;
        announce_change(&tx, &s.id).await?;
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
                rows::UPDATE.postgres(),
                &bind(&rows::definition(s, s.updated_ms)),
            )
            .await?;
        if n == 0 {
            return Err(LedgerError::NotFound(format!("subscriber {}", s.id)));
        }
        // A generation given its first signing key by the change (a switch to Ed25519).
        for g in &s.secrets {
            if let Some(key) = &g.signing_key {
                tx.execute(
                    "UPDATE subscriber_secrets SET signing_key = $3
                     WHERE subscriber_id = $1 AND secret = $2 AND signing_key IS NULL",
                    &[&s.id, &g.secret, key],
                )
                .await?;
            }
        }
        // After the subscriber's row (locked by the update): subscriber rows first.
        super::customers::hold_customer(tx, s.customer.as_deref()).await?;
        announce_change(tx, &s.id).await?;
        Ok(())
    }

    /// Remove a subscriber: it matches no new event, and its unfinished deliveries go dead
    /// (replayable if it comes back). Returns how many went dead.
    pub(super) async fn delete_subscriber(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
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

    /// Deliveries left pending or in flight for a subscriber removed in the last hour go dead,
    /// as its removal made the others: an ingest that read the subscriber as live before the
    /// removal committed, and inserted after the removal's own sweep, left them behind (the
    /// removal cannot see a delivery not yet committed, and an ingest's statement cannot see a
    /// removal committed while it waited for the counters' lock). Run with every rescan
    /// (`due_work`): nothing is left pending for good. Returns how many.
    pub(super) async fn bury_removed(&self) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        let st = c.prepare_cached(BURY_REMOVED).await?;
        Ok(c.execute(&st, &[]).await?)
    }

    /// [`PgLedger::rotate_secret`] inside the caller's transaction.
    pub(super) async fn rotate_secret_in(
        tx: &Transaction<'_>,
        id: &str,
        secret: &NewSecret,
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
        insert_secret(tx, id, secret, now_ms).await?;
        announce_change(tx, id).await?;
        Ok(())
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
    pub(super) async fn load_limiter(
        &self,
        id: &str,
        now_ms: i64,
    ) -> Result<LimiterState, LedgerError> {
        let c = self.client().await?;
        let raw: Option<String> = c
            .query_opt("SELECT limiter FROM subscribers WHERE id = $1", &[&id])
            .await?
            .map(|r| r.try_get(0))
            .transpose()?
            .flatten();
        Ok(decode_limiter(id, raw.as_deref(), now_ms))
    }
}

/// One generation of a subscriber's secrets: the HMAC secret and its signing key.
async fn insert_secret(
    tx: &Transaction<'_>,
    id: &str,
    secret: &NewSecret,
    now_ms: i64,
) -> Result<(), LedgerError> {
    tx.execute(
        "INSERT INTO subscriber_secrets (subscriber_id, secret, created_ms, signing_key)
         VALUES ($1, $2, $3, $4)",
        &[&id, &secret.secret, &now_ms, &secret.signing_key],
    )
    .await?;
    Ok(())
}

/// Tell every daemon (on commit) that a subscriber's definition or state changed.
pub(super) async fn announce_change(
    c: &impl deadpool_postgres::GenericClient,
    id: &str,
) -> Result<(), LedgerError> {
    c.execute("SELECT pg_notify($1, $2)", &[&CHANGED_CHANNEL, &id])
        .await?;
    Ok(())
}

impl Subscribers for PgLedger {
    async fn subscriber(
        &self,
        id: String,
        scope: Option<String>,
    ) -> Result<Subscriber, LedgerError> {
        let s = self.get_subscriber(&id).await?;
        scope::visible(scope.as_deref(), s)
    }

    async fn create_subscriber(
        &self,
        s: Subscriber,
        secret: NewSecret,
    ) -> Result<Subscriber, LedgerError> {
        self.create_subscriber(&s, secret).await?;
        self.get_subscriber(&s.id).await
    }

    async fn subscribers(
        &self,
        only: Option<String>,
        with_stats: bool,
        scope: Option<String>,
    ) -> Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError> {
        let mut subs = match &only {
            Some(id) => vec![self.get_subscriber(id).await?],
            None => self.list_subscribers().await?,
        };
        scope::retain(scope.as_deref(), &mut subs);
        let counts = if with_stats {
            let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
            let mut counts = self.subscriber_counts(&ids, crate::time::now_ms()).await?;
            self.since_creation(&subs, &mut counts).await?;
            Some(counts)
        } else {
            None
        };
        Ok((subs, counts))
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
        self.change_subscriber(&id, scope.as_deref(), change).await
    }

    async fn delete_subscriber(&self, id: String, now_ms: i64) -> Result<u64, LedgerError> {
        self.delete_subscriber(&id, now_ms).await
    }

    async fn rotate_secret(
        &self,
        id: String,
        secret: NewSecret,
        now_ms: i64,
        grace_ms: i64,
        scope: Option<String>,
    ) -> Result<(), LedgerError> {
        self.rotate_secret_scoped(&id, &secret, now_ms, grace_ms, scope.as_deref())
            .await
    }
}

/// [`PgLedger::bury_removed`]'s statement: the subscribers removed in the last hour (by the
/// server's clock, which every daemon keeps), then their pending and leased deliveries, by
/// index.
const BURY_REMOVED: &str =
    "UPDATE deliveries SET status = 'dead', last_error = 'subscriber removed',
         updated_ms = r.deleted_ms, lease_owner = NULL, lease_expires_ms = NULL
     FROM (SELECT id, deleted_ms FROM subscribers
           WHERE deleted_ms > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint - 3600000) r
     WHERE deliveries.subscriber_id = r.id AND deliveries.status IN ('pending', 'in_flight')";
