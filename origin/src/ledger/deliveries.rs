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
}

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<AttemptRecordView>>,
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
