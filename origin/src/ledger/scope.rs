//! The one customer-scope rule, as both backends apply it inside the transaction that acts: a
//! caller limited to a customer (a portal token) sees that customer's subscribers and their
//! deliveries, nothing else; anything else is `NotFound`, exactly as for an id that does not
//! exist. The rule itself is `crate::customer::sees`; this file only words the refusals.
//! Pure: no I/O.

use super::error::LedgerError;
use crate::customer::sees;
use crate::model::{delivery_public_id, Subscriber};

/// `Ok` when `scope` sees subscriber `id` (owned by `owner`); `NotFound` otherwise.
pub fn subscriber(scope: Option<&str>, id: &str, owner: Option<&str>) -> Result<(), LedgerError> {
    if sees(scope, owner) {
        Ok(())
    } else {
        Err(unseen_subscriber(id))
    }
}

/// Subscriber `s` when `scope` sees it; `NotFound` otherwise.
pub fn visible(scope: Option<&str>, s: Subscriber) -> Result<Subscriber, LedgerError> {
    subscriber(scope, &s.id, s.customer.as_deref())?;
    Ok(s)
}

/// Only the subscribers `scope` sees.
pub fn retain(scope: Option<&str>, subs: &mut Vec<Subscriber>) {
    subs.retain(|s| sees(scope, s.customer.as_deref()));
}

/// `Ok` when `scope` sees delivery `rowid`, whose subscriber is owned by `owner`; `NotFound`
/// otherwise.
pub fn delivery(scope: Option<&str>, rowid: i64, owner: Option<&str>) -> Result<(), LedgerError> {
    if sees(scope, owner) {
        Ok(())
    } else {
        Err(unseen_delivery(rowid))
    }
}

/// `NotFound` for a subscriber outside the caller's scope, as for one that does not exist.
pub fn unseen_subscriber(id: &str) -> LedgerError {
    LedgerError::NotFound(format!("subscriber {id}"))
}

/// `NotFound` for a delivery outside the caller's scope, as for one that does not exist.
pub fn unseen_delivery(rowid: i64) -> LedgerError {
    LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator sees everything; a customer only its own, never the operator's.
    #[test]
    fn a_customer_sees_only_its_own() {
        let cases = [
            (None, Some("a"), true),
            (None, None, true),
            (Some("a"), Some("a"), true),
            (Some("a"), Some("b"), false),
            (Some("a"), None, false),
        ];
        for (scope, owner, seen) in cases {
            assert_eq!(
                subscriber(scope, "s", owner).is_ok(),
                seen,
                "{scope:?} {owner:?}"
            );
            assert_eq!(
                delivery(scope, 7, owner).is_ok(),
                seen,
                "{scope:?} {owner:?}"
            );
        }
    }
}
