//! The customers' contract: the [`Customers`] operations the API calls on either backend
//! (customers with their weights and caps, how many live subscribers each owns, the nonce a
//! portal token is checked against, the portal's signing key). No SQL here.

use std::future::Future;

use super::error::LedgerError;
use crate::customer::Customer;

/// A new customer's combined chart starts empty: the totals a customer of the same id, removed
/// before, left in the charts' series (`crate::series::buckets::total_key`) are forgotten in the
/// transaction that creates it. The only parameter (`$1`: PostgreSQL's, and SQLite's first) is
/// the totals' key. (No flush writes that key once the old customer's endpoints are removed:
/// a total follows the owners of live endpoints only.)
pub const FORGET_TOTALS: &str = "DELETE FROM series WHERE subscriber_id = $1";

pub trait Customers {
    /// Store a new customer; `Conflict` when the id is taken.
    fn create_customer(&self, cu: Customer)
        -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// One customer as stored (`NotFound` when there is none).
    fn customer(&self, id: String) -> impl Future<Output = Result<Customer, LedgerError>> + Send;

    /// Customers (`only` one — `NotFound` when it does not exist — or all, by id) with how
    /// many live subscribers each owns.
    fn customers(
        &self,
        only: Option<String>,
    ) -> impl Future<Output = Result<Vec<(Customer, u32)>, LedgerError>> + Send;

    /// Change a customer in one transaction: `change` gets it as stored and returns the next
    /// one (or refuses with its own error, changing nothing).
    fn update_customer<E, F>(
        &self,
        id: String,
        change: F,
    ) -> impl Future<Output = Result<Result<Customer, E>, LedgerError>> + Send
    where
        E: Send + 'static,
        F: FnOnce(Customer) -> Result<Customer, E> + Send + 'static;

    /// Remove a customer that owns no live subscriber (`Conflict` otherwise); its portal
    /// links stop working.
    fn delete_customer(&self, id: String) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// End every portal link issued for customer `id` so far (`NotFound` when there is no such
    /// customer): `nonce` replaces the one those links carry.
    fn revoke_portal_links(
        &self,
        id: String,
        nonce: String,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The portal's signing key: the one stored, or `fresh`, stored now, when there is none
    /// yet (the first daemon makes it; every other one, and every restart, reads it).
    fn portal_key(
        &self,
        fresh: Vec<u8>,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<u8>, LedgerError>> + Send;
}
