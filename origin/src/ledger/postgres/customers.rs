//! The PostgreSQL ledger's customer operations (as `ledger/customers.rs` on SQLite): customers,
//! which subscriber belongs to whom, the portal signing key, a test event for one subscriber;
//! and the operations the API runs limited to one customer (a portal token's scope, see
//! `crate::customer::sees`), each checked inside the transaction that acts.
//!
//! Locks, in the order every transaction of this ledger takes them (no deadlock): subscriber
//! rows first, then customer rows, then delivery rows.
//! - A scoped change locks its subscriber's row (`FOR UPDATE`) before it checks the owner and
//!   acts, so a subscriber moved to another customer meanwhile is never acted on for the old one.
//! - Whatever makes a subscriber name a customer locks that customer's row `FOR SHARE`; removing
//!   a customer locks it `FOR UPDATE` and only then counts its live subscribers, so a customer
//!   is never removed while a live subscriber names it.
//!
//! Invariants (as SQLite's): nothing here deletes a delivery, an event or a subscriber; a
//! customer goes only when no live subscriber names it.

use deadpool_postgres::{GenericClient, Transaction};

use super::ledger::PgLedger;
use super::listen::{notify_payload, CUSTOMERS_CHANNEL, DUE_CHANNEL};
use super::rows::bind;
use crate::customer::Customer;
use crate::ledger::customers::{Customers, FORGET_TOTALS};
use crate::ledger::deliveries::NewEvent;
use crate::ledger::error::LedgerError;
use crate::ledger::rows::customers as rows;
use crate::ledger::rules;
use crate::ledger::scope;
use crate::model::{delivery_public_id, Subscriber};
use crate::series::buckets::total_key;

fn int(n: u32) -> i32 {
    n.min(i32::MAX as u32) as i32
}

fn no_customer(id: &str) -> LedgerError {
    LedgerError::NotFound(format!("customer {id}"))
}

/// Tell every daemon (on commit) to read the customers' weights and caps again.
async fn announce_customers(c: &impl GenericClient) -> Result<(), LedgerError> {
    c.execute("SELECT pg_notify($1, '')", &[&CUSTOMERS_CHANNEL])
        .await?;
    Ok(())
}

/// A subscriber about to name `customer`: the customer must exist, and stays until this
/// transaction ends (its row held `FOR SHARE`). `Invalid` when it does not exist.
pub(super) async fn hold_customer(
    tx: &Transaction<'_>,
    customer: Option<&str>,
) -> Result<(), LedgerError> {
    let Some(id) = customer else {
        return Ok(());
    };
    let found = tx
        .query_opt("SELECT 1 FROM customers WHERE id = $1 FOR SHARE", &[&id])
        .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(LedgerError::Invalid(format!(
            "customer {id} does not exist: create it first (`fanout customer add {id}`, or POST /v1/customers)"
        ))),
    }
}

/// Lock subscriber `id`'s row until the transaction ends and answer its owner: `None` when no
/// subscriber ever had that id (`live`: or it was removed).
async fn hold_subscriber(
    tx: &Transaction<'_>,
    id: &str,
    live: bool,
) -> Result<Option<Option<String>>, LedgerError> {
    let sql = if live {
        "SELECT customer FROM subscribers WHERE id = $1 AND deleted_ms IS NULL FOR UPDATE"
    } else {
        "SELECT customer FROM subscribers WHERE id = $1 FOR UPDATE"
    };
    Ok(tx
        .query_opt(sql, &[&id])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?)
}

/// The live subscriber `id`, locked until the transaction ends, if `scope` sees it; `NotFound`
/// otherwise, exactly as for an id that does not exist.
async fn hold_visible_subscriber(
    tx: &Transaction<'_>,
    id: &str,
    scope: Option<&str>,
) -> Result<(), LedgerError> {
    match hold_subscriber(tx, id, true).await? {
        Some(owner) => scope::subscriber(scope, id, owner.as_deref()),
        None => Err(scope::unseen_subscriber(id)),
    }
}

/// Delivery `rowid`'s subscriber, locked until the transaction ends, if `scope` sees it
/// (removed subscribers' included: their deliveries stay readable); `NotFound` otherwise.
async fn hold_visible_delivery(
    tx: &Transaction<'_>,
    rowid: i64,
    scope: Option<&str>,
) -> Result<(), LedgerError> {
    let not_found = || scope::unseen_delivery(rowid);
    let sub: String = tx
        .query_opt(
            "SELECT subscriber_id FROM deliveries WHERE id = $1",
            &[&rowid],
        )
        .await?
        .ok_or_else(not_found)?
        .try_get(0)?;
    let owner = hold_subscriber(tx, &sub, false).await?.flatten();
    scope::delivery(scope, rowid, owner.as_deref())
}

impl PgLedger {
    // -----------------------------------------------------------------------------------------
    // Customers

    pub(super) async fn create_customer(&self, cu: &Customer) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(rows::INSERT.postgres(), &bind(&rows::values(cu)))
            .await?;
        if n == 0 {
            return Err(LedgerError::Conflict(format!(
                "customer {} already exists",
                cu.id
            )));
        }
        tx.execute(FORGET_TOTALS, &[&total_key(Some(&cu.id))])
            .await?;
        announce_customers(&tx).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn get_customer(&self, id: &str) -> Result<Customer, LedgerError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!("SELECT {} FROM customers WHERE id = $1", *rows::SELECT),
                &[&id],
            )
            .await?
            .ok_or_else(|| no_customer(id))?;
        rows::decode(&row, 0)
    }

    /// Customers (`only` one, or all, by id) with how many live subscribers each owns, in one
    /// statement.
    pub(super) async fn customers_with_counts(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<(Customer, u32)>, LedgerError> {
        let c = self.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {}, (SELECT COUNT(*) FROM subscribers s
                                 WHERE s.customer = c.id AND s.deleted_ms IS NULL)
                     FROM customers c WHERE $1::text IS NULL OR c.id = $1 ORDER BY c.id",
                    *rows::SELECT
                ),
                &[&only],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let n: i64 = r.try_get(6)?;
                Ok((rows::decode(r, 0)?, n.clamp(0, u32::MAX as i64) as u32))
            })
            .collect()
    }

    pub(super) async fn list_customers(&self) -> Result<Vec<Customer>, LedgerError> {
        let c = self.client().await?;
        c.query(
            &format!("SELECT {} FROM customers ORDER BY id", *rows::SELECT),
            &[],
        )
        .await?
        .iter()
        .map(|r| rows::decode(r, 0))
        .collect()
    }

    /// Change a customer: `change` gets it as stored (its row locked) and returns the next one
    /// (weight, cap and time are stored), or refuses with its own error, changing nothing.
    pub(super) async fn update_customer<E, F>(
        &self,
        id: &str,
        change: F,
    ) -> Result<Result<Customer, E>, LedgerError>
    where
        F: FnOnce(Customer) -> Result<Customer, E>,
    {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let row = tx
            .query_opt(
                &format!(
                    "SELECT {} FROM customers WHERE id = $1 FOR UPDATE",
                    *rows::SELECT
                ),
                &[&id],
            )
            .await?
            .ok_or_else(|| no_customer(id))?;
        let next = match change(rows::decode(&row, 0)?) {
            Ok(next) => next,
            Err(e) => return Ok(Err(e)),
        };
        tx.execute(
            "UPDATE customers SET weight = $2, max_in_flight = $3, updated_ms = $4 WHERE id = $1",
            &[
                &id,
                &int(next.weight),
                &next.max_in_flight.map(int),
                &next.updated_ms,
            ],
        )
        .await?;
        announce_customers(&tx).await?;
        tx.commit().await?;
        Ok(Ok(next))
    }

    /// Remove a customer that owns no live subscriber (one with endpoints is refused with a
    /// conflict: remove or move them first). Its portal links stop working with it.
    pub(super) async fn delete_customer(&self, id: &str) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // The row first: a subscriber naming it meanwhile waits for this, or this for it.
        tx.query_opt("SELECT 1 FROM customers WHERE id = $1 FOR UPDATE", &[&id])
            .await?
            .ok_or_else(|| no_customer(id))?;
        let live: i64 = tx
            .query_one(
                "SELECT COUNT(*) FROM subscribers WHERE customer = $1 AND deleted_ms IS NULL",
                &[&id],
            )
            .await?
            .try_get(0)?;
        rules::customer_removable(id, live)?;
        // Its removed endpoints' history passes to the operator (as on SQLite): a customer
        // created later under the same id sees nothing of it.
        tx.execute(
            "UPDATE subscribers SET customer = NULL WHERE customer = $1 AND deleted_ms IS NOT NULL",
            &[&id],
        )
        .await?;
        tx.execute("DELETE FROM customers WHERE id = $1", &[&id])
            .await?;
        announce_customers(&tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// End every portal link issued for customer `id` so far: a new nonce, which the links
    /// issued before do not carry. Every daemon checks the nonce on each call.
    pub(super) async fn revoke_portal_links(
        &self,
        id: &str,
        nonce: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE customers SET portal_nonce = $2, updated_ms = $3 WHERE id = $1",
                &[&id, &nonce, &now_ms],
            )
            .await?;
        if n == 0 {
            return Err(no_customer(id));
        }
        Ok(())
    }

    /// The key that signs portal tokens: the stored one, or `fresh` stored now if there is none
    /// (the first daemon to start on this ledger makes it; every other one reads it).
    pub(super) async fn portal_key(
        &self,
        fresh: &[u8],
        now_ms: i64,
    ) -> Result<Vec<u8>, LedgerError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO portal_key (id, key, created_ms) VALUES (1, $1, $2)
             ON CONFLICT (id) DO NOTHING",
            &[&fresh, &now_ms],
        )
        .await?;
        Ok(c.query_one("SELECT key FROM portal_key WHERE id = 1", &[])
            .await?
            .try_get(0)?)
    }

    // -----------------------------------------------------------------------------------------
    // Scoped to one customer (`scope`: a portal token's customer; `None`: the operator)

    /// The customer owning a delivery's subscriber. `NotFound` when there is no such delivery.
    pub(super) async fn delivery_owner(&self, rowid: i64) -> Result<Option<String>, LedgerError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                "SELECT s.customer FROM deliveries d
                 LEFT JOIN subscribers s ON s.id = d.subscriber_id WHERE d.id = $1",
                &[&rowid],
            )
            .await?
            .ok_or_else(|| {
                LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid)))
            })?;
        Ok(row.try_get(0)?)
    }

    /// Change a live subscriber `scope` sees, in one transaction under its row's lock:
    /// `change` gets it as stored and returns the next definition and whether its disabled
    /// state was set (or refuses with its own error, changing nothing). A customer the next
    /// definition names must exist.
    pub(super) async fn change_subscriber<E, F>(
        &self,
        id: &str,
        scope: Option<&str>,
        change: F,
    ) -> Result<Result<Subscriber, E>, LedgerError>
    where
        F: FnOnce(Subscriber) -> Result<(Subscriber, bool), E>,
    {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        hold_visible_subscriber(&tx, id, scope).await?;
        let current = Self::get_subscriber_on(&tx, id).await?;
        let (next, toggled) = match change(current) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        Self::update_subscriber_in(&tx, &next).await?;
        if toggled {
            Self::set_disabled_in(
                &tx,
                &next.id,
                next.health.disabled.as_ref(),
                next.updated_ms,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(Ok(next))
    }

    /// [`PgLedger::rotate_secret`] of a live subscriber `scope` sees (`NotFound` otherwise).
    pub(super) async fn rotate_secret_scoped(
        &self,
        id: &str,
        secret: &crate::keyring::NewSecret,
        now_ms: i64,
        grace_ms: i64,
        scope: Option<&str>,
    ) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        hold_visible_subscriber(&tx, id, scope).await?;
        Self::rotate_secret_in(&tx, id, secret, now_ms, grace_ms).await?;
        tx.commit().await?;
        Ok(())
    }

    /// [`PgLedger::replay_one`] of a delivery `scope` sees (`NotFound` otherwise).
    pub(super) async fn replay_one_scoped(
        &self,
        rowid: i64,
        now_ms: i64,
        scope: Option<&str>,
    ) -> Result<String, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        hold_visible_delivery(&tx, rowid, scope).await?;
        let sub = Self::replay_one_in(&tx, rowid, now_ms).await?;
        tx.commit().await?;
        Ok(sub)
    }

    /// Store a test event and a delivery of it to the live subscriber `subscriber` alone (no
    /// other subscriber's patterns are consulted), if `scope` sees it; announce the work.
    /// Returns the delivery's row id.
    pub(super) async fn ingest_test(
        &self,
        subscriber: &str,
        event: &NewEvent,
        now_ms: i64,
        scope: Option<&str>,
    ) -> Result<i64, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        hold_visible_subscriber(&tx, subscriber, scope).await?;
        // Under the subscriber row's lock: tests to one subscriber take turns.
        let previous = tx
            .query_opt(
                "SELECT d.status IN ('pending', 'in_flight'), e.received_ms
                 FROM subscribers s
                 JOIN deliveries d ON d.event_id = s.last_test_event AND d.subscriber_id = s.id
                 JOIN events e ON e.id = d.event_id
                 WHERE s.id = $1",
                &[&subscriber],
            )
            .await?
            .map(|r| Ok::<_, LedgerError>((r.try_get::<_, bool>(0)?, r.try_get::<_, i64>(1)?)))
            .transpose()?;
        if let Some(wait) = crate::model::test_event_wait_ms(previous, now_ms) {
            return Err(crate::ledger::error::test_too_soon(subscriber, wait));
        }
        tx.execute(
            "UPDATE subscribers SET last_test_event = $2 WHERE id = $1",
            &[&subscriber, &event.id],
        )
        .await?;
        tx.execute(
            "INSERT INTO events (id, type, body, received_ms) VALUES ($1, $2, $3, $4)",
            &[&event.id, &event.event_type, &event.body, &now_ms],
        )
        .await?;
        let sequence: i64 = tx
            .query_one(super::ingest::RESERVE_ONE, &[&subscriber])
            .await?
            .try_get(0)?;
        let rowid: i64 = tx
            .query_one(
                "INSERT INTO deliveries (subscriber_id, event_id, status, next_attempt_ms,
                     created_ms, updated_ms, sequence)
                 VALUES ($1, $2, 'pending', $3, $3, $3, $4) RETURNING id",
                &[&subscriber, &event.id, &now_ms, &sequence],
            )
            .await?
            .try_get(0)?;
        tx.execute(
            "SELECT pg_notify($1, $2)",
            &[&DUE_CHANNEL, &notify_payload(&[subscriber.to_string()])],
        )
        .await?;
        tx.commit().await?;
        Ok(rowid)
    }
}

impl Customers for PgLedger {
    async fn create_customer(&self, cu: Customer) -> Result<(), LedgerError> {
        self.create_customer(&cu).await
    }

    async fn customer(&self, id: String) -> Result<Customer, LedgerError> {
        self.get_customer(&id).await
    }

    async fn customers(&self, only: Option<String>) -> Result<Vec<(Customer, u32)>, LedgerError> {
        let found = self.customers_with_counts(only.as_deref()).await?;
        match only {
            Some(id) if found.is_empty() => Err(no_customer(&id)),
            _ => Ok(found),
        }
    }

    async fn update_customer<E, F>(
        &self,
        id: String,
        change: F,
    ) -> Result<Result<Customer, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Customer) -> Result<Customer, E> + Send + 'static,
    {
        self.update_customer(&id, change).await
    }

    async fn delete_customer(&self, id: String) -> Result<(), LedgerError> {
        self.delete_customer(&id).await
    }

    async fn revoke_portal_links(
        &self,
        id: String,
        nonce: String,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.revoke_portal_links(&id, &nonce, now_ms).await
    }

    async fn portal_key(&self, fresh: Vec<u8>, now_ms: i64) -> Result<Vec<u8>, LedgerError> {
        self.portal_key(&fresh, now_ms).await
    }
}
