//! The ledger's customer operations: customers, which subscriber belongs to whom, the portal
//! signing key, and a test event for one subscriber.

use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use super::cells::{decode_all, decode_one};
use super::ledger::Ledger;
use crate::customer::Customer;
use crate::ledger::customers::{Customers, FORGET_TOTALS};
use crate::ledger::error::LedgerError;
use crate::ledger::rows::customers as rows;
use crate::ledger::rules;
use crate::series::buckets::total_key;

pub fn create_customer(c: &Connection, cu: &Customer) -> Result<(), LedgerError> {
    let n = c
        .prepare_cached(rows::INSERT.sqlite())?
        .execute(params_from_iter(rows::values(cu)))?;
    if n == 0 {
        return Err(LedgerError::Conflict(format!(
            "customer {} already exists",
            cu.id
        )));
    }
    c.prepare_cached(FORGET_TOTALS)?
        .execute([total_key(Some(&cu.id))])?;
    Ok(())
}

pub fn get_customer(c: &Connection, id: &str) -> Result<Customer, LedgerError> {
    let sql = format!("SELECT {} FROM customers WHERE id = ?1", *rows::SELECT);
    decode_one(&mut c.prepare_cached(&sql)?, [id], |r| rows::decode(r, 0))?
        .ok_or_else(|| LedgerError::NotFound(format!("customer {id}")))
}

pub fn list_customers(c: &Connection) -> Result<Vec<Customer>, LedgerError> {
    let sql = format!("SELECT {} FROM customers ORDER BY id", *rows::SELECT);
    decode_all(&mut c.prepare_cached(&sql)?, [], |r| rows::decode(r, 0))
}

/// Live subscribers per customer.
pub fn customer_subscriber_counts(
    c: &Connection,
) -> Result<std::collections::HashMap<String, u32>, LedgerError> {
    let mut st = c.prepare_cached(
        "SELECT customer, COUNT(*) FROM subscribers
         WHERE customer IS NOT NULL AND deleted_ms IS NULL GROUP BY customer",
    )?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A subscriber may only name a customer that exists: `Invalid` otherwise, saying which.
pub fn check_customer_exists(c: &Connection, customer: Option<&str>) -> Result<(), LedgerError> {
    match customer {
        Some(id) => get_customer(c, id).map(|_| ()).map_err(|e| match e {
            LedgerError::NotFound(_) => LedgerError::Invalid(format!(
                "customer {id} does not exist: create it first (`fanout customer add {id}`, or POST /v1/customers)"
            )),
            other => other,
        }),
        None => Ok(()),
    }
}

/// Store a changed weight and cap.
pub fn update_customer(c: &Connection, cu: &Customer) -> Result<(), LedgerError> {
    let n = c
        .prepare_cached(
            "UPDATE customers SET weight = ?2, max_in_flight = ?3, updated_ms = ?4 WHERE id = ?1",
        )?
        .execute(params![cu.id, cu.weight, cu.max_in_flight, cu.updated_ms])?;
    if n == 0 {
        return Err(LedgerError::NotFound(format!("customer {}", cu.id)));
    }
    Ok(())
}

/// Remove a customer that owns no live subscriber (a customer with endpoints is refused with a
/// conflict: remove or move them first, so no endpoint is left owned by nobody by accident).
/// Its portal links stop working with it, and its removed endpoints' history passes to the
/// operator.
pub fn delete_customer(c: &Connection, id: &str) -> Result<(), LedgerError> {
    get_customer(c, id)?;
    let live: i64 = c
        .prepare_cached(
            "SELECT COUNT(*) FROM subscribers WHERE customer = ?1 AND deleted_ms IS NULL",
        )?
        .query_row([id], |r| r.get(0))?;
    rules::customer_removable(id, live)?;
    detach_removed_subscribers(c, id)?;
    c.execute("DELETE FROM customers WHERE id = ?1", [id])?;
    Ok(())
}

/// The history of a customer being removed passes to the operator: its removed subscribers
/// (their deliveries and attempts) stop naming it, so a customer created later under the same
/// id sees nothing of them (and cannot take their ids over while their deliveries are kept).
fn detach_removed_subscribers(c: &Connection, id: &str) -> Result<(), LedgerError> {
    c.prepare_cached(
        "UPDATE subscribers SET customer = NULL WHERE customer = ?1 AND deleted_ms IS NOT NULL",
    )?
    .execute([id])?;
    Ok(())
}

/// End every portal link issued for customer `id` so far: a new nonce, which the links issued
/// before do not carry (links issued after it work).
pub fn revoke_portal_links(
    c: &Connection,
    id: &str,
    nonce: &str,
    now_ms: i64,
) -> Result<(), LedgerError> {
    let n = c
        .prepare_cached("UPDATE customers SET portal_nonce = ?2, updated_ms = ?3 WHERE id = ?1")?
        .execute(params![id, nonce, now_ms])?;
    if n == 0 {
        return Err(LedgerError::NotFound(format!("customer {id}")));
    }
    Ok(())
}

/// The customer of a subscriber, removed ones included (their deliveries stay readable).
/// `NotFound` when no subscriber ever had that id.
#[cfg(test)]
pub fn subscriber_owner(c: &Connection, subscriber: &str) -> Result<Option<String>, LedgerError> {
    c.prepare_cached("SELECT customer FROM subscribers WHERE id = ?1")?
        .query_row([subscriber], |r| r.get(0))
        .optional()?
        .ok_or_else(|| LedgerError::NotFound(format!("subscriber {subscriber}")))
}

/// The customer owning a delivery's subscriber. `NotFound` when there is no such delivery.
pub fn delivery_owner(c: &Connection, rowid: i64) -> Result<Option<String>, LedgerError> {
    let row: Option<Option<String>> = c
        .prepare_cached(
            "SELECT s.customer FROM deliveries d LEFT JOIN subscribers s ON s.id = d.subscriber_id
             WHERE d.id = ?1",
        )?
        .query_row([rowid], |r| r.get(0))
        .optional()?;
    row.ok_or_else(|| {
        LedgerError::NotFound(format!(
            "delivery {}",
            crate::model::delivery_public_id(rowid)
        ))
    })
}

/// The key that signs portal tokens: the stored one, or `fresh` stored now if there is none
/// (the first start of a ledger).
pub fn portal_key(c: &Connection, fresh: &[u8], now_ms: i64) -> Result<Vec<u8>, LedgerError> {
    c.execute(
        "INSERT OR IGNORE INTO portal_key (id, key, created_ms) VALUES (1, ?1, ?2)",
        params![fresh, now_ms],
    )?;
    Ok(c.query_row("SELECT key FROM portal_key WHERE id = 1", [], |r| r.get(0))?)
}

impl Customers for Ledger {
    async fn create_customer(&self, cu: Customer) -> Result<(), LedgerError> {
        self.tx(move |c| create_customer(c, &cu)).await
    }

    async fn customer(&self, id: String) -> Result<Customer, LedgerError> {
        self.read(move |c| get_customer(c, &id)).await
    }

    async fn customers(&self, only: Option<String>) -> Result<Vec<(Customer, u32)>, LedgerError> {
        self.read(move |c| {
            let counts = customer_subscriber_counts(c)?;
            let customers = match &only {
                Some(id) => vec![get_customer(c, id)?],
                None => list_customers(c)?,
            };
            Ok(customers
                .into_iter()
                .map(|cu| {
                    let n = counts.get(&cu.id).copied().unwrap_or(0);
                    (cu, n)
                })
                .collect::<Vec<_>>())
        })
        .await
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
        self.tx(move |c| {
            let current = get_customer(c, &id)?;
            let next = match change(current) {
                Ok(next) => next,
                Err(e) => return Ok(Err(e)),
            };
            update_customer(c, &next)?;
            Ok(Ok(next))
        })
        .await
    }

    async fn delete_customer(&self, id: String) -> Result<(), LedgerError> {
        self.tx(move |c| delete_customer(c, &id)).await
    }

    async fn revoke_portal_links(
        &self,
        id: String,
        nonce: String,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.tx(move |c| revoke_portal_links(c, &id, &nonce, now_ms))
            .await
    }

    async fn portal_key(&self, fresh: Vec<u8>, now_ms: i64) -> Result<Vec<u8>, LedgerError> {
        self.tx(move |c| portal_key(c, &fresh, now_ms)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sqlite::{create_subscriber, delete_subscriber, test_db};
    use crate::ledger::test_subscriber;

    fn customer(id: &str) -> Customer {
        Customer {
            id: id.into(),
            weight: 1,
            max_in_flight: None,
            portal_nonce: format!("n-{id}"),
            created_ms: 1,
            updated_ms: 1,
        }
    }

    #[test]
    fn customers_own_subscribers_and_go_only_when_empty() {
        let c = test_db();
        create_customer(&c, &customer("acme")).unwrap();
        assert!(matches!(
            create_customer(&c, &customer("acme")),
            Err(LedgerError::Conflict(_))
        ));
        let mut s = test_subscriber("hook", &["*"]);
        s.customer = Some("acme".into());
        create_subscriber(&c, &s, "s").unwrap();
        assert_eq!(subscriber_owner(&c, "hook").unwrap(), Some("acme".into()));
        assert_eq!(customer_subscriber_counts(&c).unwrap()["acme"], 1);
        assert!(matches!(
            delete_customer(&c, "acme"),
            Err(LedgerError::Conflict(_))
        ));
        crate::ledger::sqlite::ingest(&c, &crate::ledger::test_events(1), 2).unwrap();
        delete_subscriber(&c, "hook", 2).unwrap();
        // The removed endpoint keeps its owner and its deliveries: another customer cannot
        // take its id over.
        let mut other = test_subscriber("hook", &["*"]);
        other.customer = Some("globex".into());
        assert!(matches!(
            create_subscriber(&c, &other, "s"),
            Err(LedgerError::Conflict(_))
        ));
        delete_customer(&c, "acme").unwrap();
        // Its history is the operator's now: a new customer under the same id sees none of it.
        assert_eq!(subscriber_owner(&c, "hook").unwrap(), None);
        assert!(matches!(
            get_customer(&c, "acme"),
            Err(LedgerError::NotFound(_))
        ));
        assert!(matches!(
            subscriber_owner(&c, "nobody"),
            Err(LedgerError::NotFound(_))
        ));
    }
}
