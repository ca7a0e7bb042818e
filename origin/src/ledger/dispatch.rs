//! The dispatcher's ledger, as typed operations: what any ledger backend (SQLite here, PostgreSQL
//! next) implements for the dispatcher. The dispatcher never sees SQL or a connection; it hands
//! over a [`Turn`] (everything one loop turn decided) and gets back the next claims.
//!
//! Contract shared by every operation:
//! - Each call is atomic: all of its writes are committed, durably, before it answers `Ok`, or
//!   none are.
//! - A delivery is leased (`in_flight`) only by [`DispatchLedger::record_turn`]'s claims, until
//!   `lease_until_ms`; a lease ends with an outcome, an expiry sweep, or a restart.
//! - Recording is idempotent per lease: an outcome applies only to a delivery still `in_flight`,
//!   and its attempt is recorded only then. A turn recorded twice (a retry after an answer that
//!   was lost) therefore counts each result once.

use std::future::Future;

use fanout_core::limiter::LimiterState;

use super::error::LedgerError;
use crate::alert::Notice;
use crate::model::{Claim, HealthWrite, InFlight, Outcome, Share, Subscriber};

/// Everything one dispatcher turn writes, and the deliveries it asks to lease next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    /// The turn's time: `updated_ms` of every row it touches, and the claims' "due by".
    pub now_ms: i64,
    /// Results of leased deliveries, in the order they arrived.
    pub outcomes: Vec<Outcome>,
    /// Limiter states to store, one per subscriber (the latest).
    pub limiters: Vec<(String, LimiterState)>,
    /// Subscriber health changes, in order (the last run-of-failures change per subscriber wins).
    pub health: Vec<HealthWrite>,
    /// Subscribers with deliveries newly dead in this turn: their dead count is checked against
    /// `dead_threshold` (the alert fires once per crossing).
    pub dead: Vec<String>,
    pub dead_threshold: u64,
    /// Alerts decided before this turn, raised only once it has committed.
    pub notices: Vec<Notice>,
    /// Lease up to this many due deliveries of each subscriber, oldest due first.
    pub claims: Vec<(String, usize)>,
    /// The claimed subscribers that batch (`fanout_core::batch`), with the deliveries one
    /// request takes: their claim is that many requests' worth, each group of this many (in
    /// the claim's order) one request against the limiter and the in-flight cap. A ledger whose
    /// caller keeps the only limiter (SQLite) may ignore it.
    pub batch_per: Vec<(String, usize)>,
    /// Of `batch_per`, the ordered subscribers (`crate::ordering`): each request is a run of
    /// one key in order — a due head and up to `per - 1` of its key's held deliveries after
    /// it, leased with it — so their claim takes that many requests' heads (`Claim::runs`).
    pub runs: Vec<String>,
    pub lease_until_ms: i64,
}

impl Turn {
    /// Nothing to write and nothing to ask.
    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
            && self.limiters.is_empty()
            && self.health.is_empty()
            && self.dead.is_empty()
            && self.notices.is_empty()
            && self.claims.iter().all(|(_, n)| *n == 0)
    }

    /// The claims that ask for something: `(subscriber, how many)` with a count above zero.
    pub fn asks(&self) -> Vec<(String, usize)> {
        self.claims
            .iter()
            .filter(|(_, n)| *n > 0)
            .cloned()
            .collect()
    }
}

/// A committed turn's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// One per asked subscriber that still exists, in the order asked.
    pub claims: Vec<Claim>,
    /// The turn's notices followed by the dead-count alerts it crossed: raise them now.
    pub notices: Vec<Notice>,
    /// Subscribers whose held deliveries this turn's outcomes made due now (an ordered key's
    /// head ended, `crate::ordering`): the dispatcher looks at them at once, not at a backoff.
    pub due: Vec<String>,
}

/// A turn that was not recorded: it comes back whole so the caller retries it (no result is
/// dropped). Nothing of it was written — unless the answer was lost after the write (on
/// PostgreSQL, a connection that failed after the commit reached the server): its results
/// written again are stale and ignored, and its leases are released by
/// [`DispatchLedger::release_strays`] after the next turn the caller records.
#[derive(Debug)]
pub struct TurnError {
    pub turn: Turn,
    pub error: LedgerError,
}

/// The ledger operations the dispatcher uses. Implemented by each backend (`sqlite/dispatch.rs`,
/// `postgres/dispatch.rs`) and forwarded by `store::Store`.
pub trait DispatchLedger: Clone + Send + Sync + 'static {
    /// Every live (not removed) subscriber with its stored limiter state, ordered by id.
    /// Reads only.
    fn dispatch_subscribers(
        &self,
    ) -> impl Future<Output = Result<Vec<(Subscriber, LimiterState)>, LedgerError>> + Send;

    /// One live subscriber with its limiter state; `None` when it does not exist or was
    /// removed. Reads only.
    fn dispatch_subscriber(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<(Subscriber, LimiterState)>, LedgerError>> + Send;

    /// Every customer's share settings: `(id, weight, max_in_flight)`, ordered by id. Reads
    /// only. (Added for weighted fairness; subscribers name their customer.)
    fn dispatch_customers(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, u32, Option<u32>)>, LedgerError>> + Send;

    /// Record a turn and lease its claims, in one transaction: apply the outcomes (idempotent
    /// per lease, see the module), store the limiters and health changes, check the dead
    /// counts, then lease up to the asked number of due (`next_attempt_ms <= now_ms`) pending
    /// deliveries per subscriber until `lease_until_ms`. On failure nothing is written and the
    /// turn is handed back.
    fn record_turn(&self, turn: Turn) -> impl Future<Output = Result<Recorded, TurnError>> + Send;

    /// Every live subscriber with pending work and when its earliest pending delivery is due.
    /// First re-arms the dead-count alert of subscribers whose dead count is back under
    /// `dead_threshold` (after a replay). One transaction.
    fn due_work(
        &self,
        dead_threshold: u64,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, LedgerError>> + Send;

    /// Leases that expired before `now_ms` go back to pending, due at `now_ms`. Returns the
    /// subscribers concerned. One transaction.
    fn release_expired_leases(
        &self,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<String>, LedgerError>> + Send;

    /// The leases this daemon holds other than `held` return to pending, due at `now_ms`
    /// (an ordered key's as when they expire: one head per key). Returns the subscribers
    /// concerned. For a turn that failed but may have been written ([`TurnError`]): its
    /// leases are nobody's sends.
    fn release_strays(
        &self,
        held: Vec<i64>,
        now_ms: i64,
    ) -> impl Future<Output = Result<Vec<String>, LedgerError>> + Send;

    /// At start-up (one daemon owns a SQLite ledger): every lease returns to pending, due at
    /// `now_ms`. Returns how many.
    fn release_all_leases(
        &self,
        now_ms: i64,
    ) -> impl Future<Output = Result<usize, LedgerError>> + Send;

    /// Write that this daemon's dispatcher is alive with `in_flight` out per customer, and read
    /// which daemons share the ledger now (this one among them) and what the others have in
    /// flight per customer, as each last wrote it. `None`: the ledger has one daemon, which
    /// owns every subscriber.
    fn share(
        &self,
        in_flight: &[(Option<String>, usize)],
    ) -> impl Future<Output = Result<Option<(Share, InFlight)>, LedgerError>> + Send;

    /// This daemon stops dispatching: the others take its subscribers at once, without
    /// waiting for it to age out of the share.
    fn leave(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;
}

/// What another daemon sharing the ledger (or this one) announced, for the dispatcher: only a
/// shared ledger announces anything (`postgres/listen.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announcement {
    /// These subscribers have new work due now.
    Due(Vec<String>),
    /// Every subscriber may have new work (too many to name).
    DueAll,
    /// This subscriber changed: read it again.
    Changed(String),
    /// A customer changed: read the customers again.
    Customers,
    /// Listening began again after a lost connection: whatever was announced meanwhile went
    /// unheard, so read everything again.
    Reload,
}
