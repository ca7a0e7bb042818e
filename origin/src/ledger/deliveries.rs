//! The deliveries' contract: the rows ingest, lists and replays speak, and the [`Deliveries`]
//! operations the API calls on either backend. No SQL and no connection here.

use std::future::Future;

use serde::{Deserialize, Serialize};

use super::error::LedgerError;
use crate::model::{AttemptOutcome, Lane, Status};

/// One event as received: its id, type and exact bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub id: String,
    pub event_type: String,
    pub body: String,
    /// The W3C `traceparent` it arrived with (`fanout_core::traceparent`, version 00), kept so
    /// that its attempts and replays join the producer's trace (`crate::trace`).
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ingested {
    pub id: String,
    /// Deliveries this call created for the event (0 for a duplicate).
    pub deliveries: u32,
    pub duplicate: bool,
    /// A duplicate whose body is not the stored one: its id was reused for another event
    /// (nothing of it is kept; an outbox moves its row to `<table>_rejected`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub different_body: bool,
}

/// Why an outbox moves a row whose event id the ledger holds with another body.
pub const ID_REUSED: &str = "id reused with a different body";

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryFilter {
    pub status: Option<Status>,
    pub subscriber: Option<String>,
    pub event: Option<String>,
    /// Only events of this type.
    pub event_type: Option<String>,
    /// Only deliveries to this customer's subscribers (a portal token's scope).
    pub customer: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Only deliveries with a larger rowid (pagination cursor).
    pub after: Option<i64>,
    pub limit: usize,
}

/// A delivery as the API shows it (and the CLI reads it back: one type both ways).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryView {
    pub id: String,
    pub subscriber_id: String,
    pub event_id: String,
    pub event_type: String,
    pub status: Status,
    pub attempt_count: u32,
    pub next_attempt_at_ms: Option<i64>,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Its `webhook-sequence`: its subscriber's count of deliveries, fixed at ingest.
    #[serde(default)]
    pub sequence: u64,
    /// An ordered delivery's `webhook-ordering-key` (ordering by key) and
    /// `webhook-previous-sequence` (`crate::ordering`); `held`: waiting behind its key's head
    /// (pending, with no due time of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<AttemptRecordView>>,
}

impl DeliveryView {
    /// Its ordering fields from the stored key, previous sequence and due time.
    pub fn ordered(mut self, key: Option<String>, previous: Option<i64>) -> Self {
        if let Some(order) = crate::model::Order::of(key, previous) {
            (self.ordering_key, self.previous_sequence) = order.headers();
        }
        if self.next_attempt_at_ms == Some(crate::ordering::HELD_MS) {
            self.next_attempt_at_ms = None;
            self.held = true;
        }
        self
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecordView {
    pub attempt: u32,
    pub at_ms: i64,
    pub lane: Lane,
    pub outcome: AttemptOutcome,
    pub status: Option<u16>,
    pub latency_ms: Option<i64>,
    pub response_body: Option<String>,
    pub error: Option<String>,
}

/// An ordered key of a subscriber that holds deliveries back (`GET /v1/subscribers/{id}/held`):
/// its head (the one delivery of the key outstanding: why the others wait, in its status,
/// attempts and last error), how many wait behind it and since when, and which goes next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldKey {
    /// `webhook-ordering-key` (`None` for ordering by subscriber).
    pub ordering_key: Option<String>,
    /// `None` only for a moment, between a head's end and the release of the next.
    pub head: Option<DeliveryView>,
    /// Deliveries held behind the head, counted up to [`HELD_COUNT_MAX`].
    pub held: u64,
    /// When the next to go was held (its creation, or its replay).
    pub held_since_ms: i64,
    /// The delivery that goes once the head ends.
    pub next: String,
}

/// How far [`HeldKey::held`] counts (the count is a read of the index, bounded).
pub const HELD_COUNT_MAX: i64 = 10_000;

/// What one step of a bulk replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayStep {
    /// Deliveries put back in the queue.
    pub replayed: u64,
    /// Their subscribers, each once.
    pub subscribers: Vec<String>,
    /// The last delivery id the step looked at: the next step starts after it.
    pub last: Option<i64>,
    /// Nothing matches past it.
    pub done: bool,
}

/// The API's operations on events and deliveries. Operations that take a `scope` (a portal
/// token's customer; `None`: the operator) act only on what it sees (`scope.rs`), checked in
/// the transaction that acts.
pub trait Deliveries {
    /// Store events and fan them out; the per-event outcome and the subscribers with new work.
    fn ingest(
        &self,
        events: Vec<NewEvent>,
        now_ms: i64,
    ) -> impl Future<Output = Result<(Vec<Ingested>, Vec<String>), LedgerError>> + Send;

    /// Deliveries matching the filter (its `customer` is the caller's scope).
    fn list_deliveries(
        &self,
        filter: DeliveryFilter,
    ) -> impl Future<Output = Result<Vec<DeliveryView>, LedgerError>> + Send;

    /// One delivery with its attempts, if `scope` sees it.
    fn get_delivery(
        &self,
        rowid: i64,
        scope: Option<String>,
    ) -> impl Future<Output = Result<DeliveryView, LedgerError>> + Send;

    /// Replay one delivery `scope` sees; returns its subscriber.
    fn replay_one(
        &self,
        rowid: i64,
        now_ms: i64,
        scope: Option<String>,
    ) -> impl Future<Output = Result<String, LedgerError>> + Send;

    /// One step of a bulk replay: the first `filter.limit` deliveries matching it after
    /// `filter.after` (its `customer` is the caller's scope), each transaction short (the
    /// caller steps on, as retention does); a filter naming a subscriber that does not exist,
    /// or that the scope does not see, is `NotFound`.
    fn replay_step(
        &self,
        filter: DeliveryFilter,
        now_ms: i64,
    ) -> impl Future<Output = Result<ReplayStep, LedgerError>> + Send;

    /// How many deliveries a bulk replay would replay now, changing nothing.
    fn count_replayable(
        &self,
        filter: DeliveryFilter,
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// The first `limit` ordered keys of `subscriber` (in key order) that hold deliveries
    /// back, if `scope` sees the subscriber.
    fn held_keys(
        &self,
        subscriber: String,
        limit: usize,
        scope: Option<String>,
    ) -> impl Future<Output = Result<Vec<HeldKey>, LedgerError>> + Send;

    /// Store a test event and a delivery of it to live subscriber `subscriber` alone, if
    /// `scope` sees it. Returns the delivery's row id.
    fn ingest_test(
        &self,
        subscriber: String,
        event: NewEvent,
        now_ms: i64,
        scope: Option<String>,
    ) -> impl Future<Output = Result<i64, LedgerError>> + Send;
}
