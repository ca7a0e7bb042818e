//! The API's customer operations on either ledger: customers with their weights and caps, how
//! many live subscribers each owns, and the nonce a portal token is checked against.

use super::Store;
use crate::customer::Customer;
use crate::ledger::LedgerError;

impl Store {
    /// Store a new customer; `Conflict` when the id is taken.
    pub async fn create_customer(&self, cu: Customer) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => l.tx(move |c| crate::ledger::create_customer(c, &cu)).await,
            Store::Postgres(p) => p.create_customer(&cu).await,
        }
    }

    /// One customer as stored (`NotFound` when there is none).
    pub async fn customer(&self, id: String) -> Result<Customer, LedgerError> {
        match self {
            Store::Sqlite(l) => l.read(move |c| crate::ledger::get_customer(c, &id)).await,
            Store::Postgres(p) => p.get_customer(&id).await,
        }
    }

    /// Customers (`only` one — `NotFound` when it does not exist — or all, by id) with how
    /// many live subscribers each owns.
    pub async fn customers(
        &self,
        only: Option<String>,
    ) -> Result<Vec<(Customer, u32)>, LedgerError> {
        let found = match self {
            Store::Sqlite(l) => {
                let only = only.clone();
                l.read(move |c| {
                    let counts = crate::ledger::customer_subscriber_counts(c)?;
                    let customers = match &only {
                        Some(id) => vec![crate::ledger::get_customer(c, id)?],
                        None => crate::ledger::list_customers(c)?,
                    };
                    Ok(customers
                        .into_iter()
                        .map(|cu| {
                            let n = counts.get(&cu.id).copied().unwrap_or(0);
                            (cu, n)
                        })
                        .collect::<Vec<_>>())
                })
                .await?
            }
            Store::Postgres(p) => p.customers_with_counts(only.as_deref()).await?,
        };
        match only {
            Some(id) if found.is_empty() => Err(LedgerError::NotFound(format!("customer {id}"))),
            _ => Ok(found),
        }
    }

    /// Change a customer in one transaction: `change` gets it as stored and returns the next
    /// one (or refuses with its own error, changing nothing).
    pub async fn update_customer<E, F>(
        &self,
        id: String,
        change: F,
    ) -> Result<Result<Customer, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Customer) -> Result<Customer, E> + Send + 'static,
    {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| {
                    let current = crate::ledger::get_customer(c, &id)?;
                    let next = match change(current) {
                        Ok(next) => next,
                        Err(e) => return Ok(Err(e)),
                    };
                    crate::ledger::update_customer(c, &next)?;
                    Ok(Ok(next))
                })
                .await
            }
            Store::Postgres(p) => p.update_customer(&id, change).await,
        }
    }

    /// Remove a customer that owns no live subscriber (`Conflict` otherwise); its portal
    /// links stop working.
    pub async fn delete_customer(&self, id: String) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => l.tx(move |c| crate::ledger::delete_customer(c, &id)).await,
            Store::Postgres(p) => p.delete_customer(&id).await,
        }
    }

    /// End every portal link issued for customer `id` so far (`NotFound` when there is no such
    /// customer): `nonce` replaces the one those links carry.
    pub async fn revoke_portal_links(
        &self,
        id: String,
        nonce: String,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(l) => {
                l.tx(move |c| crate::ledger::revoke_portal_links(c, &id, &nonce, now_ms))
                    .await
            }
            Store::Postgres(p) => p.revoke_portal_links(&id, &nonce, now_ms).await,
        }
    }
}
