//! Customers: the operator's customers, each owning some subscribers (their endpoints). A
//! customer has a `weight` (its share of the dispatcher under contention, `crate::dispatch::fair`)
//! and an optional cap on its deliveries in flight across all its endpoints. Pure types and
//! validation; nothing here touches SQLite or the network.

use serde::{Deserialize, Serialize};

pub const DEFAULT_WEIGHT: u32 = 1;
/// A weight above this would let one customer's share round every other one's to nothing.
pub const MAX_WEIGHT: u32 = 1000;
pub const MAX_CUSTOMER_IN_FLIGHT: u32 = 1_000_000;

/// A customer as the ledger stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer {
    pub id: String,
    pub weight: u32,
    pub max_in_flight: Option<u32>,
    /// Part of every portal token issued for this customer; a new customer (even under a
    /// removed one's id) gets a new one, so older links stop working.
    pub portal_nonce: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// The API's view of a customer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomerView {
    pub id: String,
    pub weight: u32,
    pub max_in_flight: Option<u32>,
    /// Live subscribers owned by this customer.
    pub subscribers: u32,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl CustomerView {
    pub fn of(c: &Customer, subscribers: u32) -> Self {
        CustomerView {
            id: c.id.clone(),
            weight: c.weight,
            max_in_flight: c.max_in_flight,
            subscribers,
            created_at_ms: c.created_ms,
            updated_at_ms: c.updated_ms,
        }
    }
}

/// `POST /v1/customers/{id}/portal`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortalLink {
    /// The portal page with the token in its fragment.
    pub url: String,
    pub token: String,
    pub expires_at_ms: i64,
}

/// `GET /v1/customers`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomerList {
    pub customers: Vec<CustomerView>,
}

pub fn validate_weight(w: u32) -> Result<(), String> {
    if (1..=MAX_WEIGHT).contains(&w) {
        Ok(())
    } else {
        Err(format!("weight must be 1 to {MAX_WEIGHT}, not {w}"))
    }
}

pub fn validate_max_in_flight(m: Option<u32>) -> Result<(), String> {
    match m {
        Some(m) if !(1..=MAX_CUSTOMER_IN_FLIGHT).contains(&m) => Err(format!(
            "max_in_flight must be 1 to {MAX_CUSTOMER_IN_FLIGHT} (or null: no cap), not {m}"
        )),
        _ => Ok(()),
    }
}

/// Does a caller limited to `scope` (a portal token's customer; `None`: the operator, no limit)
/// see a subscriber owned by `owner`, or its deliveries? The one rule every ledger's scoped
/// operation and the API apply: a customer sees its own and nothing else (not the operator's
/// own subscribers either).
pub fn sees(scope: Option<&str>, owner: Option<&str>) -> bool {
    match scope {
        None => true,
        Some(customer) => owner == Some(customer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_table() {
        let cases: &[(Option<&str>, Option<&str>, bool)] = &[
            (None, None, true),
            (None, Some("acme"), true),
            (Some("acme"), Some("acme"), true),
            (Some("acme"), Some("globex"), false),
            (Some("acme"), None, false),
        ];
        for &(scope, owner, seen) in cases {
            assert_eq!(sees(scope, owner), seen, "{scope:?} sees {owner:?}");
        }
    }

    #[test]
    fn bounds_table() {
        let cases: &[(u32, bool)] = &[
            (0, false),
            (1, true),
            (4, true),
            (1000, true),
            (1001, false),
        ];
        for &(w, ok) in cases {
            assert_eq!(validate_weight(w).is_ok(), ok, "weight {w}");
        }
        let caps: &[(Option<u32>, bool)] = &[
            (None, true),
            (Some(0), false),
            (Some(1), true),
            (Some(MAX_CUSTOMER_IN_FLIGHT), true),
            (Some(MAX_CUSTOMER_IN_FLIGHT + 1), false),
        ];
        for &(m, ok) in caps {
            assert_eq!(validate_max_in_flight(m).is_ok(), ok, "max_in_flight {m:?}");
        }
    }
}
