//! The subscribers' contract: the [`Subscribers`] operations the API calls on either backend,
//! and the figures it reads about them. No connection here; the SQL both backends run alike.

use std::collections::BTreeMap;
use std::future::Future;

use fanout_core::limiter::LimiterState;

use super::error::LedgerError;
use crate::keyring::NewSecret;
use crate::model::{Status, Subscriber};

/// What an id keeps of a removed endpoint besides its deliveries, forgotten when the id is
/// created again once none of its deliveries are kept (retention removed them): the new
/// endpoint, maybe another customer's, starts with an empty chart (`series`), sequence 1
/// (`sequences`, and the ordered keys' last numbers, `ordering_keys`) and no last error
/// (`last_errors`). One statement each, its id as the only parameter (`$1`: PostgreSQL's, and
/// SQLite's first), run in the transaction that creates the endpoint, after it found no
/// delivery kept. An endpoint brought back while its deliveries are kept (its own owner's)
/// keeps all of it: its numbers go on from its history's.
pub const FORGET_REMOVED: &[&str] = &[
    "DELETE FROM sequences WHERE subscriber_id = $1",
    "DELETE FROM ordering_keys WHERE subscriber_id = $1",
    "DELETE FROM series WHERE subscriber_id = $1",
    "DELETE FROM last_errors WHERE subscriber_id = $1",
];

/// One subscriber's figures as the ledger holds them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriberCounts {
    pub pending: i64,
    pub in_flight: i64,
    pub sent: i64,
    pub dead: i64,
    /// The most recent failed or rejected attempt: when, and what went wrong.
    pub last_error: Option<(i64, String)>,
    /// The limiter state as last stored by the dispatcher.
    pub limiter: LimiterState,
    /// Why the stored limiter state does not decode, if it does not (the dispatcher starts
    /// the subscriber from an empty bucket; `limiter` shows that bucket).
    pub limiter_error: Option<String>,
}

impl SubscriberCounts {
    /// The figures of a subscriber created at `created_ms`, without what an earlier
    /// subscriber under its id left: its kept `sent` and `dead` deliveries (counted by
    /// [`earlier_sql`]) and its last error. A new `fanout listen` session starts at zero.
    pub fn since_creation(&mut self, created_ms: i64, earlier_sent: i64, earlier_dead: i64) {
        self.sent = (self.sent - earlier_sent).max(0);
        self.dead = (self.dead - earlier_dead).max(0);
        if self
            .last_error
            .as_ref()
            .is_some_and(|(at, _)| *at < created_ms)
        {
            self.last_error = None;
        }
    }
}

/// How many of subscriber `sub`'s deliveries in `status` come before the
/// first one created since `since` (its creation): an earlier subscriber's under the same id
/// (delivery ids are in creation order). `sub` and `since` are SQL expressions (placeholders,
/// or columns of an outer query). By the (subscriber, status, id) indexes this is a probe for
/// an id never reused, and reads no more than the earlier subscriber's rows otherwise.
pub fn earlier_sql(status: Status, sub: &str, since: &str) -> String {
    let status = status.as_str();
    format!(
        "SELECT COUNT(*) FROM deliveries WHERE subscriber_id = {sub} AND status = '{status}' \
         AND id < COALESCE((SELECT id FROM deliveries WHERE subscriber_id = {sub} \
         AND status = '{status}' AND created_ms >= {since} ORDER BY id LIMIT 1), \
         9223372036854775807)"
    )
}

/// The API's operations on subscribers. Operations that take a `scope` (a portal token's
/// customer; `None`: the operator) act only on what it sees (`scope.rs`), checked in the
/// transaction that acts.
pub trait Subscribers {
    /// One live subscriber as stored (with its secrets), if `scope` sees it.
    fn subscriber(
        &self,
        id: String,
        scope: Option<String>,
    ) -> impl Future<Output = Result<Subscriber, LedgerError>> + Send;

    /// Create a subscriber with its first secret (and signing key); returns it as stored. A
    /// customer it names must exist (`Invalid` otherwise).
    fn create_subscriber(
        &self,
        s: Subscriber,
        secret: NewSecret,
    ) -> impl Future<Output = Result<Subscriber, LedgerError>> + Send;

    /// One subscriber (`only`) or every live one, those `scope` sees, with their figures when
    /// `with_stats`. `only` outside the scope: none.
    #[allow(clippy::type_complexity)]
    fn subscribers(
        &self,
        only: Option<String>,
        with_stats: bool,
        scope: Option<String>,
    ) -> impl Future<
        Output = Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError>,
    > + Send;

    /// Change a live subscriber `scope` sees, in one transaction: `change` gets it as stored
    /// and returns the next definition and whether its disabled state was set (or refuses with
    /// its own error, changing nothing). A customer the next definition names must exist
    /// (`Invalid` otherwise). A signing key the change gave a generation of its secrets that
    /// had none (`keyring::ensure_signing_key`) is stored with it; nothing else of the secrets
    /// changes.
    fn update_subscriber<E, F>(
        &self,
        id: String,
        scope: Option<String>,
        change: F,
    ) -> impl Future<Output = Result<Result<Subscriber, E>, LedgerError>> + Send
    where
        E: Send + 'static,
        F: FnOnce(Subscriber) -> Result<(Subscriber, bool), E> + Send + 'static;

    /// Remove a subscriber; returns how many of its deliveries went dead.
    fn delete_subscriber(
        &self,
        id: String,
        now_ms: i64,
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// Add `secret` (with its signing key) as the current generation of a live subscriber
    /// `scope` sees; the others keep signing until `now + grace_ms`.
    fn rotate_secret(
        &self,
        id: String,
        secret: NewSecret,
        now_ms: i64,
        grace_ms: i64,
        scope: Option<String>,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_creation_table() {
        // (kept sent, dead, last error at; earlier sent, dead) → (sent, dead, last error kept)
        let cases = [
            ((5, 2, Some(150)), (0, 0), (5, 2, true)),
            ((5, 2, Some(50)), (3, 2), (2, 0, false)),
            ((5, 2, Some(100)), (5, 2), (0, 0, true)),
            // Never below zero, should the two reads disagree.
            ((1, 0, None), (4, 1), (0, 0, false)),
        ];
        for ((sent, dead, at), (earlier_sent, earlier_dead), expected) in cases {
            let mut n = SubscriberCounts {
                sent,
                dead,
                last_error: at.map(|at| (at, "boom".to_string())),
                ..Default::default()
            };
            n.since_creation(100, earlier_sent, earlier_dead);
            assert_eq!((n.sent, n.dead, n.last_error.is_some()), expected);
        }
    }
}
