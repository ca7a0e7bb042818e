//! Domain types of the ledger and their pure validation: subscribers, lanes, delivery states,
//! event-type patterns. Nothing here touches SQLite or the network.

use fanout_core::batch::BatchSpec;
use serde::{Deserialize, Serialize};

pub use crate::ordering::Ordering;
pub use crate::payload::Payload;
pub use fanout_core::sign::Scheme;

/// Ids are validated by the shared core, so the edge accepts every id the origin does.
pub use fanout_core::wire::{validate_event_id, validate_id, validate_visible, MAX_ID_LEN};
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_RATE_PER_SEC: f64 = 100.0;
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 16;

/// Which lane delivers a subscriber's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    Edge,
    Origin,
    /// The edge when an edge URL is configured, the origin otherwise.
    #[default]
    Auto,
}

impl Lane {
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Edge => "edge",
            Lane::Origin => "origin",
            Lane::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Lane> {
        match s {
            "edge" => Some(Lane::Edge),
            "origin" => Some(Lane::Origin),
            "auto" => Some(Lane::Auto),
            _ => None,
        }
    }

    /// The lane actually used. `edge` without a configured edge falls back to the origin lane
    /// (the daemon warns about it at start-up): an event is never stranded.
    pub fn effective(self, edge_configured: bool) -> Lane {
        match self {
            Lane::Edge | Lane::Auto if edge_configured => Lane::Edge,
            _ => Lane::Origin,
        }
    }
}

/// What one attempt came to, as the attempts table records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Delivered,
    Deferred,
    Failed,
    Rejected,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::Deferred => "deferred",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<AttemptOutcome> {
        match s {
            "delivered" => Some(AttemptOutcome::Delivered),
            "deferred" => Some(AttemptOutcome::Deferred),
            "failed" => Some(AttemptOutcome::Failed),
            "rejected" => Some(AttemptOutcome::Rejected),
            _ => None,
        }
    }
}

/// A delivery's state, mirrored by the ledger's `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for `next_attempt_ms`.
    Pending,
    /// Leased by the dispatcher until `lease_expires_ms`.
    InFlight,
    Sent,
    Dead,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::InFlight => "in_flight",
            Status::Sent => "sent",
            Status::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "pending" => Some(Status::Pending),
            "in_flight" => Some(Status::InFlight),
            "sent" => Some(Status::Sent),
            "dead" => Some(Status::Dead),
            _ => None,
        }
    }

    pub const ALL: [Status; 4] = [
        Status::Pending,
        Status::InFlight,
        Status::Sent,
        Status::Dead,
    ];
}

/// Does an event type match a subscriber's pattern? Exact, `prefix.*` (any type under the
/// prefix, not the prefix itself), or `*` (everything).
pub fn type_matches(pattern: &str, event_type: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') => {
            event_type.len() > prefix.len() && event_type.starts_with(prefix)
        }
        _ => pattern == event_type,
    }
}

pub fn any_type_matches(patterns: &[String], event_type: &str) -> bool {
    patterns.iter().any(|p| type_matches(p, event_type))
}

/// Why a subscriber definition is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSubscriber {
    #[error("{0}")]
    Field(String),
    #[error("url refused: {0}")]
    Url(#[from] fanout_core::endpoint::EndpointError),
}

pub fn validate_pattern(p: &str) -> Result<(), String> {
    let valid = p == "*"
        || (validate_visible("pattern", p).is_ok()
            && match p.find('*') {
                None => true,
                Some(i) => i == p.len() - 1 && p.len() >= 3 && p[..i].ends_with('.'),
            });
    if valid {
        Ok(())
    } else {
        Err(format!(
            "event type pattern {p:?} must be an exact type, a prefix like \"video.*\", or \"*\""
        ))
    }
}

/// A subscriber's limits, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub timeout_ms: u64,
}

impl Limits {
    /// The bounds are the shared core's ([`fanout_core::limits`]), the same the edge checks.
    pub fn validate(&self) -> Result<(), String> {
        fanout_core::limits::check(
            self.rate_per_sec,
            self.burst,
            self.max_in_flight,
            self.timeout_ms,
        )
        .map_err(|e| e.to_string())
    }

    /// The default burst for a rate: one second's worth, at least 1.
    pub fn default_burst(rate_per_sec: f64) -> u32 {
        if rate_per_sec.is_finite() && rate_per_sec > 1.0 {
            rate_per_sec.ceil().min(f64::from(u32::MAX)) as u32
        } else {
            1
        }
    }

    pub fn core(
        &self,
        breaker: fanout_core::breaker::BreakerConfig,
    ) -> fanout_core::limiter::Limits {
        fanout_core::limiter::Limits {
            rate: fanout_core::bucket::Rate {
                per_sec: self.rate_per_sec,
                burst: self.burst,
            },
            max_in_flight: self.max_in_flight,
            breaker,
        }
    }
}

/// A subscriber as the ledger stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscriber {
    pub id: String,
    pub url: String,
    pub event_types: Vec<String>,
    pub limits: Limits,
    pub lane: Lane,
    pub legacy_signature: bool,
    pub secrets: Vec<StoredSecret>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub health: Health,
    /// The customer that owns this endpoint (`crate::customer`); `None`: the operator's own.
    pub customer: Option<String>,
    /// The operator's content filter (`crate::event_filter`), as given and checked: only
    /// events it matches are delivered. `None`: every event of its types. A portal token
    /// cannot set or clear it (`api::auth`).
    pub filter: Option<serde_json::Value>,
    /// The customer's own content filter, set through the portal (or by the operator): it
    /// narrows what `filter` lets through, never widens it. An event is delivered only when
    /// both match (`None` matches everything).
    pub customer_filter: Option<serde_json::Value>,
    /// Its webhooks' body: the event's, or a thin notice (`crate::payload`).
    pub payload: Payload,
    /// One delivery at a time per subscriber or per key (`crate::ordering`), and for `key`
    /// the JSON Pointer into the event that names it.
    pub ordering: Ordering,
    pub ordering_key: Option<String>,
    /// Its webhooks carry `traceparent` (`crate::trace`).
    pub propagate_trace: bool,
    /// Which signatures its webhooks carry: `v1` (HMAC), `v1a` (Ed25519) or both.
    pub signature: Scheme,
    /// Several events per request (`fanout_core::batch`); `None`: one event per request.
    pub batch: Option<BatchSpec>,
}

/// Why and since when a subscriber gets nothing sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub at_ms: i64,
    pub reason: String,
    /// Disabled by an operator (the admin token): only an operator re-enables it, not the
    /// customer's portal. `false` for the daemon's own (a 410, a long run of failures) and the
    /// customer's pause.
    pub by_operator: bool,
}

/// What the alert rules (`crate::alert::rules`) keep about a subscriber, in the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The first failed attempt of the current unbroken run of failures; `None` after a success.
    pub failing_since_ms: Option<i64>,
    /// `Some` while disabled: no dispatch; its deliveries wait, pending, for a re-enable.
    pub disabled: Option<Disabled>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredSecret {
    pub secret: String,
    pub created_ms: i64,
    /// When this (rotated-out) secret stops signing; `None` while it is the current one.
    pub expires_ms: Option<i64>,
    /// The Ed25519 signing key (`whsk_`) of the same generation (`crate::keyring`): `None` in
    /// a generation made before the scheme existed, until a switch to it gives the current
    /// one a key.
    pub signing_key: Option<String>,
}

impl Subscriber {
    /// A subscriber with these and every other field at its default: the `auto` lane, no
    /// secrets yet, created at 0, enabled, nobody's, unfiltered, full payloads, unordered, no
    /// `traceparent`, HMAC signatures, one event per request. (Fixtures start here, so that a
    /// new field is written in the places that store or read it, not in every test.)
    pub fn new(id: &str, url: &str, event_types: &[&str], limits: Limits) -> Subscriber {
        Subscriber {
            id: id.into(),
            url: url.into(),
            event_types: event_types.iter().map(|t| t.to_string()).collect(),
            limits,
            lane: Lane::default(),
            legacy_signature: false,
            secrets: Vec::new(),
            created_ms: 0,
            updated_ms: 0,
            health: Health::default(),
            customer: None,
            filter: None,
            customer_filter: None,
            payload: Payload::default(),
            ordering: Ordering::default(),
            ordering_key: None,
            propagate_trace: false,
            signature: Scheme::default(),
            batch: None,
        }
    }

    /// The secrets that sign at `now_ms`, newest first.
    pub fn active_secrets(&self, now_ms: i64) -> Vec<String> {
        active_secrets(&self.secrets, now_ms)
    }
}

pub fn active_secrets(secrets: &[StoredSecret], now_ms: i64) -> Vec<String> {
    live_secrets(secrets, now_ms)
        .into_iter()
        .map(|s| s.secret.clone())
        .collect()
}

/// Most signing secrets active at once: the current one and the one it replaced, which keeps
/// signing through the rotation's grace period while the subscriber switches over.
pub const MAX_ACTIVE_SECRETS: usize = 2;

/// The least time between two rotations of one subscriber's secret.
pub const MIN_ROTATION_INTERVAL_MS: i64 = 60_000;

/// How long a rotation has to wait (pure): `None` when it may happen at `now_ms`. Given when
/// the current secret was made and whether it came from a rotation (the first secret, made
/// with the subscriber, may be rotated at once).
pub fn rotation_wait_ms(current_created_ms: i64, rotated_before: bool, now_ms: i64) -> Option<i64> {
    let next = current_created_ms.saturating_add(MIN_ROTATION_INTERVAL_MS);
    (rotated_before && next > now_ms).then(|| next - now_ms)
}

/// The least time between two test events (`POST /v1/subscribers/{id}/test`) to one
/// subscriber.
pub const MIN_TEST_INTERVAL_MS: i64 = 10_000;

/// How long a test event to a subscriber has to wait (pure): `None` when it may be sent at
/// `now_ms`. Given its previous test event, if it is still kept: whether that one is still
/// unfinished (pending or in flight: one test at a time, so a paused or failing endpoint never
/// piles them up) and when it was made (at most one per [`MIN_TEST_INTERVAL_MS`]).
pub fn test_event_wait_ms(previous: Option<(bool, i64)>, now_ms: i64) -> Option<i64> {
    let (unfinished, made_ms) = previous?;
    let next = made_ms.saturating_add(MIN_TEST_INTERVAL_MS);
    if unfinished {
        Some((next - now_ms).max(MIN_TEST_INTERVAL_MS))
    } else {
        (next > now_ms).then(|| next - now_ms)
    }
}

/// The stored secrets that sign at `now_ms`, newest first, at most [`MAX_ACTIVE_SECRETS`]
/// (a ledger rotated many times before the cap keeps only the newest two signing).
fn live_secrets(secrets: &[StoredSecret], now_ms: i64) -> Vec<&StoredSecret> {
    let mut live: Vec<&StoredSecret> = secrets
        .iter()
        .filter(|s| s.expires_ms.is_none_or(|e| e > now_ms))
        .collect();
    live.sort_by_key(|s| std::cmp::Reverse(s.created_ms));
    live.truncate(MAX_ACTIVE_SECRETS);
    live
}

/// The `whpk_` public key of a stored `whsk_` signing key (`None` if it does not parse).
pub fn public_key_of(signing_key: &str) -> Option<String> {
    fanout_core::sign::SigningKey::parse(signing_key)
        .ok()
        .map(|k| k.public_key().encode())
}

/// The public key a subscriber's receivers verify `v1a` with: its current generation's, or
/// none when that generation has no signing key (a subscriber from before the scheme that has
/// not switched to it).
pub fn current_public_key(secrets: &[StoredSecret]) -> Option<String> {
    secrets
        .iter()
        .filter(|s| s.expires_ms.is_none())
        .max_by_key(|s| s.created_ms)
        .and_then(|s| s.signing_key.as_deref())
        .and_then(public_key_of)
}

/// `GET /v1/subscribers/{id}/secret`: the secrets that sign at `now_ms`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretsView {
    pub secrets: Vec<SecretView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretView {
    pub secret: String,
    /// When a rotated-out secret stops signing; `None` for the current one.
    pub expires_at_ms: Option<i64>,
    /// The `whpk_` public key of the same generation's Ed25519 key, if it has one.
    #[serde(default)]
    pub public_key: Option<String>,
}

impl SecretsView {
    pub fn of(s: &Subscriber, now_ms: i64) -> Self {
        SecretsView {
            secrets: live_secrets(&s.secrets, now_ms)
                .into_iter()
                .map(|x| SecretView {
                    secret: x.secret.clone(),
                    expires_at_ms: x.expires_ms,
                    public_key: x.signing_key.as_deref().and_then(public_key_of),
                })
                .collect(),
        }
    }
}

/// The API's view of a subscriber (its secret only in the answer to its creation; the active
/// ones from `GET /v1/subscribers/{id}/secret`, [`SecretsView`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscriberView {
    pub id: String,
    pub url: String,
    pub event_types: Vec<String>,
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub timeout_ms: u64,
    pub lane: Lane,
    pub legacy_signature: bool,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// How many secrets sign right now (2 during a rotation's grace period).
    pub active_secrets: usize,
    /// Disabled subscribers are sent nothing; their deliveries stay pending until a
    /// `PATCH {"disabled": false}`.
    pub disabled: bool,
    pub disabled_reason: Option<String>,
    pub disabled_at_ms: Option<i64>,
    /// Start of the current unbroken run of failed attempts, if the last attempt failed.
    pub failing_since_ms: Option<i64>,
    /// The customer that owns this endpoint, if any.
    pub customer: Option<String>,
    /// The operator's content filter, if any (`crate::event_filter`).
    #[serde(default)]
    pub filter: Option<serde_json::Value>,
    /// The customer's own content filter, if any: an event must match both.
    #[serde(default)]
    pub customer_filter: Option<serde_json::Value>,
    /// `full` (the event's body) or `thin` (`{"id","type","timestamp"}` and `url`).
    #[serde(default)]
    pub payload: Payload,
    /// `none`, `subscriber` or `key` (`crate::ordering`), with `ordering_key` for `key`.
    #[serde(default)]
    pub ordering: Ordering,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// Its webhooks carry the event's W3C `traceparent`.
    #[serde(default)]
    pub propagate_trace: bool,
    /// `hmac` (`v1`), `ed25519` (`v1a`) or `both`.
    #[serde(default)]
    pub signature: Scheme,
    /// The `whpk_` Ed25519 public key that verifies its `v1a` signatures (the current one);
    /// `null` while it has none (a subscriber from before the scheme, still on `hmac`).
    #[serde(default)]
    pub public_key: Option<String>,
    /// `{"max_events","max_bytes","max_wait_ms"}`, or `null`: one event per request.
    #[serde(default)]
    pub batch: Option<BatchSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl SubscriberView {
    pub fn of(s: &Subscriber, now_ms: i64, secret: Option<String>) -> Self {
        SubscriberView {
            id: s.id.clone(),
            url: s.url.clone(),
            event_types: s.event_types.clone(),
            rate_per_sec: s.limits.rate_per_sec,
            burst: s.limits.burst,
            max_in_flight: s.limits.max_in_flight,
            timeout_ms: s.limits.timeout_ms,
            lane: s.lane,
            legacy_signature: s.legacy_signature,
            created_at_ms: s.created_ms,
            updated_at_ms: s.updated_ms,
            active_secrets: s.active_secrets(now_ms).len(),
            disabled: s.health.disabled.is_some(),
            disabled_reason: s.health.disabled.as_ref().map(|d| d.reason.clone()),
            disabled_at_ms: s.health.disabled.as_ref().map(|d| d.at_ms),
            failing_since_ms: s.health.failing_since_ms,
            customer: s.customer.clone(),
            filter: s.filter.clone(),
            customer_filter: s.customer_filter.clone(),
            payload: s.payload,
            ordering: s.ordering,
            ordering_key: s.ordering_key.clone(),
            propagate_trace: s.propagate_trace,
            signature: s.signature,
            public_key: current_public_key(&s.secrets),
            batch: s.batch,
            secret,
        }
    }
}

/// A delivery's public id is `dlv_<rowid>`.
pub fn delivery_public_id(rowid: i64) -> String {
    format!("dlv_{rowid}")
}

pub fn parse_delivery_id(s: &str) -> Option<i64> {
    s.strip_prefix("dlv_")?
        .parse()
        .ok()
        .filter(|n: &i64| *n > 0)
}

// ---------------------------------------------------------------------------------------------
// Dispatching: what the dispatcher leases, decides and records (the ledger stores these; it
// does not define them).

/// A delivery leased to the dispatcher, with what it needs to send it.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub rowid: i64,
    pub event_id: String,
    pub event_type: String,
    pub body: String,
    /// The number of the attempt about to be made (1-based).
    pub attempt: u32,
    /// Its `webhook-sequence` (`ledger::sequence`), stored at ingest.
    pub sequence: u64,
    /// When the ledger received its event (a thin body's `timestamp`).
    pub received_ms: i64,
    /// Its place in an ordered key (`crate::ordering`), `None` when unordered.
    pub order: Option<Order>,
    /// Its event's stored `traceparent` (`crate::trace`), if it arrived with one.
    pub traceparent: Option<String>,
}

/// An ordered delivery's key as stored (`crate::ordering::key_of`) and the sequence of the
/// key's previous delivery (`webhook-previous-sequence`; `None` for the key's first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub key: String,
    pub previous: Option<u64>,
}

impl Order {
    /// From the stored columns: a key (NULL: unordered) and the previous sequence.
    pub fn of(key: Option<String>, previous: Option<i64>) -> Option<Order> {
        key.map(|key| Order {
            key,
            previous: previous.map(|p| p.max(0) as u64),
        })
    }

    /// The headers it adds to a webhook: `webhook-ordering-key` (for `key` ordering) and
    /// `webhook-previous-sequence` (when the key had a delivery before).
    pub fn headers(&self) -> (Option<String>, Option<u64>) {
        (crate::ordering::header_value(&self.key), self.previous)
    }
}

/// What one subscriber's claim leased.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub subscriber_id: String,
    pub claimed: Vec<Claimed>,
    /// When the subscriber's earliest remaining pending delivery is due, if it has one.
    pub next_due_ms: Option<i64>,
    /// Due work was left because the ledger's own limiter said wait (PostgreSQL: the limiter
    /// every daemon shares, which may have less than this daemon's copy): nothing of it is
    /// asked for again before this time. `None` when the caller's limiter decides alone.
    pub not_before_ms: Option<i64>,
    /// A claim in runs (`Turn::runs`): each request's deliveries, in `claimed`'s order (a head,
    /// then its key's held deliveries after it). Empty otherwise.
    pub runs: Vec<usize>,
}

/// Deliveries in flight per customer (`None`: subscribers with no customer), as the daemons
/// sharing a ledger tell each other (`DispatchLedger::share`).
pub type InFlight = Vec<(Option<String>, usize)>;

/// Which daemon claims for which subscriber when several share one ledger (`me` among the
/// live `members`, as the ledger lists them): rendezvous hashing, the highest score of
/// `(member, subscriber)` wins. Every daemon computes the same owner from the same list, and
/// a daemon joining or leaving moves only the subscribers it gains or loses.
///
/// Ownership makes daemons fast, not safe: a claim still takes the subscriber's row lock and
/// its shared limiter, so two daemons that disagree for a moment (one has not yet read a
/// change of members) only wait for each other's turns, as every daemon did before owners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    me: String,
    /// Sorted, without repeats, `me` included.
    members: Vec<String>,
}

impl Share {
    pub fn new(me: &str, mut members: Vec<String>) -> Share {
        members.push(me.to_string());
        members.sort_unstable();
        members.dedup();
        Share {
            me: me.to_string(),
            members,
        }
    }

    /// The daemons sharing the ledger, this one included, by name.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The member that claims for `subscriber`.
    pub fn owner(&self, subscriber: &str) -> &str {
        self.members
            .iter()
            .max_by_key(|m| (share_score(m, subscriber), m.as_str()))
            .map_or(self.me.as_str(), String::as_str)
    }

    /// Whether this daemon claims for `subscriber`.
    pub fn owns(&self, subscriber: &str) -> bool {
        self.owner(subscriber) == self.me
    }
}

/// A member's score for a subscriber: FNV-1a over both names (a 0xff byte, which no UTF-8
/// text holds, between them), mixed by SplitMix64's finaliser. Fixed arithmetic: every
/// daemon, whatever its build or platform, computes the same number.
fn share_score(member: &str, subscriber: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = member.bytes().chain([0xff]).chain(subscriber.bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// What happens to a leased delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    Sent,
    /// Retry at `at_ms`; the attempt counts.
    Retry {
        at_ms: i64,
        error: String,
    },
    Dead {
        reason: String,
    },
    /// Back to pending at `at_ms` without spending an attempt (edge deferral, edge down).
    Defer {
        at_ms: i64,
    },
}

/// One attempt as the ledger records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    pub at_ms: i64,
    pub lane: &'static str,
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub latency_ms: Option<u64>,
    pub response_body: Option<String>,
    pub error: Option<String>,
}

/// A leased delivery's result: its transition and, when something was attempted, the record.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub rowid: i64,
    pub transition: Transition,
    pub attempt: Option<AttemptRecord>,
}

/// A change to a subscriber's health decided by the dispatcher.
#[derive(Debug, Clone, PartialEq)]
pub enum HealthWrite {
    FailingSince {
        subscriber: String,
        since_ms: Option<i64>,
    },
    Disable {
        subscriber: String,
        disabled: Disabled,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_subscribers_once_and_move_few_when_members_change() {
        let subs: Vec<String> = (0..300).map(|i| format!("sub_{i}")).collect();
        let names = |n: usize| (0..n).map(|k| format!("host-{k}:8080")).collect::<Vec<_>>();
        let owners = |n: usize| {
            let all = names(n);
            let shares: Vec<Share> = all.iter().map(|me| Share::new(me, all.clone())).collect();
            subs.iter()
                .map(|s| {
                    // Exactly one member owns each subscriber, and all agree which.
                    let owning: Vec<&Share> = shares.iter().filter(|sh| sh.owns(s)).collect();
                    assert_eq!(owning.len(), 1, "{s} among {n}");
                    assert!(shares.iter().all(|sh| sh.owner(s) == owning[0].me));
                    owning[0].me.clone()
                })
                .collect::<Vec<String>>()
        };
        // (members, fewest and most subscribers a member may own of 300)
        let cases: &[(usize, usize, usize)] =
            &[(1, 300, 300), (2, 120, 180), (3, 70, 130), (5, 35, 85)];
        let mut before: Option<(usize, Vec<String>)> = None;
        for &(n, fewest, most) in cases {
            let now = owners(n);
            for m in names(n) {
                let k = now.iter().filter(|o| **o == m).count();
                assert!(
                    (fewest..=most).contains(&k),
                    "{m} owns {k} of 300 among {n}"
                );
            }
            // Growing the members moves only what the newcomers take.
            if let Some((was, before)) = &before {
                let old = names(*was);
                for (b, a) in before.iter().zip(&now) {
                    assert!(
                        a == b || !old.contains(a),
                        "{b} -> {a} when {was} became {n}"
                    );
                }
            }
            before = Some((n, now));
        }
        // `me` always counts, even when the list read does not hold it yet; order and repeats
        // do not matter.
        let a = Share::new("b", vec!["a".into()]);
        let b = Share::new("b", vec!["b".into(), "a".into(), "a".into()]);
        assert_eq!(a, b);
        assert_eq!(a.members(), ["a", "b"]);
        // Alone, a daemon owns everything.
        assert!(subs.iter().all(|s| Share::new("solo", Vec::new()).owns(s)));
    }

    #[test]
    fn type_matching_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("video.trending", "video.trending", true),
            ("video.trending", "video.trending.eu", false),
            ("video.*", "video.trending", true),
            ("video.*", "video.trending.eu", true),
            ("video.*", "video", false),
            ("video.*", "video.", false),
            ("video.*", "videos.new", false),
            ("video.*", "audio.trending", false),
            ("*", "anything.at.all", true),
            ("video", "video.trending", false),
            ("video*", "video.trending", false), // not a valid pattern; never a prefix
        ];
        for &(pattern, ty, expected) in cases {
            assert_eq!(type_matches(pattern, ty), expected, "{pattern} vs {ty}");
        }
    }

    #[test]
    fn pattern_validation_table() {
        let cases: &[(&str, bool)] = &[
            ("video.trending", true),
            ("video.*", true),
            ("a.b.*", true),
            ("*", true),
            ("", false),
            (".*", false),
            ("video*", false),
            ("video.*.x", false),
            ("vid eo", false),
            ("**", false),
            ("vid\u{202E}eo.*", false),
            ("vid\u{200B}eo", false),
            ("vidéo.*", false),
        ];
        for &(p, ok) in cases {
            assert_eq!(validate_pattern(p).is_ok(), ok, "{p:?}");
        }
    }

    #[test]
    fn limits_validation_table() {
        let ok = Limits {
            rate_per_sec: 10.0,
            burst: 20,
            max_in_flight: 8,
            timeout_ms: 10_000,
        };
        let cases: Vec<(Limits, bool)> = vec![
            (ok, true),
            (
                Limits {
                    rate_per_sec: 0.0,
                    ..ok
                },
                false,
            ),
            (
                Limits {
                    rate_per_sec: -1.0,
                    ..ok
                },
                false,
            ),
            (
                Limits {
                    rate_per_sec: f64::NAN,
                    ..ok
                },
                false,
            ),
            (
                Limits {
                    rate_per_sec: f64::INFINITY,
                    ..ok
                },
                false,
            ),
            (
                Limits {
                    rate_per_sec: 0.01,
                    ..ok
                },
                true,
            ),
            (Limits { burst: 0, ..ok }, false),
            (
                Limits {
                    max_in_flight: 0,
                    ..ok
                },
                false,
            ),
            (
                Limits {
                    timeout_ms: 99,
                    ..ok
                },
                false,
            ),
            (
                Limits {
                    timeout_ms: 60_001,
                    ..ok
                },
                false,
            ),
        ];
        for (limits, valid) in cases {
            assert_eq!(limits.validate().is_ok(), valid, "{limits:?}");
        }
        assert_eq!(Limits::default_burst(10.0), 10);
        assert_eq!(Limits::default_burst(0.5), 1);
        assert_eq!(Limits::default_burst(2.5), 3);
    }

    #[test]
    fn lanes_and_ids() {
        assert_eq!(Lane::Auto.effective(true), Lane::Edge);
        assert_eq!(Lane::Auto.effective(false), Lane::Origin);
        assert_eq!(Lane::Edge.effective(false), Lane::Origin);
        assert_eq!(Lane::Origin.effective(true), Lane::Origin);
        assert_eq!(parse_delivery_id("dlv_42"), Some(42));
        assert_eq!(parse_delivery_id("dlv_0"), None);
        assert_eq!(parse_delivery_id("42"), None);
        assert_eq!(parse_delivery_id("dlv_x"), None);
    }

    #[test]
    fn rotation_keeps_old_secret_until_it_expires() {
        let secrets = vec![
            StoredSecret {
                secret: "old".into(),
                created_ms: 1,
                expires_ms: Some(100),
                signing_key: None,
            },
            StoredSecret {
                secret: "new".into(),
                created_ms: 50,
                expires_ms: None,
                signing_key: None,
            },
        ];
        let cases: &[(i64, &[&str])] = &[
            (60, &["new", "old"]),
            (99, &["new", "old"]),
            (100, &["new"]),
        ];
        for &(now, expected) in cases {
            assert_eq!(active_secrets(&secrets, now), expected, "at {now}");
            // What GET /v1/subscribers/{id}/secret shows: the same, the old one with its end.
            let shown: Vec<(&str, Option<i64>)> = live_secrets(&secrets, now)
                .iter()
                .map(|s| (s.secret.as_str(), s.expires_ms))
                .collect();
            let ends: Vec<(&str, Option<i64>)> = expected
                .iter()
                .map(|&e| (e, (e == "old").then_some(100)))
                .collect();
            assert_eq!(shown, ends, "view at {now}");
        }
    }
}

/// A subscriber the dispatcher's watchdog finds stalled: ready to send (due work, nothing out,
/// no in-flight cap, its own limiter allowing, no wait it stated still running) and nothing
/// sent for longer than a margin. What the API, `/metrics`,
/// `fanout status` and the console show (the daemon that owns the subscriber knows it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallView {
    /// Since when it has been ready to send (due work, nothing out, its limiter allowing, no
    /// wait it stated still running) and sent nothing (unix ms).
    pub since_ms: i64,
    /// The wait it holds now (a refusal since), if any.
    pub not_before_ms: Option<i64>,
    /// When its earliest pending delivery is due, as the dispatcher believes.
    pub next_due_ms: Option<i64>,
    pub paused_until_ms: Option<i64>,
    pub breaker: fanout_core::breaker::BreakerState,
}
