//! The API's answers as types, written by the handlers and read back by the CLI (`crate::cli`):
//! one type both ways, so a renamed field fails to compile instead of printing `-`.

use serde::{Deserialize, Serialize};

pub use super::stats::{SubscriberStats, ViewWithStats};
pub use super::subscriber_input::{SubscriberInput, SubscriberPatch};
pub use crate::ledger::{AttemptRecordView, DeliveryView, Ingested};
pub use crate::model::SubscriberView;

/// `GET /v1/subscribers` (with `?stats=true`, each carries its `stats`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscriberList {
    pub subscribers: Vec<ViewWithStats>,
}

/// `DELETE /v1/subscribers/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    pub id: String,
    pub deleted: bool,
    /// Its unfinished deliveries, now dead.
    pub deliveries_dead: u64,
}

/// `POST /v1/subscribers/{id}/rotate-secret`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rotated {
    pub id: String,
    pub secret: String,
    /// The new generation's Ed25519 public key (`whpk_`), which verifies its `v1a`
    /// signatures.
    #[serde(default)]
    pub public_key: Option<String>,
    pub previous_secrets_expire_at_ms: i64,
}

/// `POST /v1/events` with an array (one event answers a bare [`Ingested`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IngestedBatch {
    pub events: Vec<Ingested>,
}

/// `GET /v1/deliveries`: a page, and the cursor of the next one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryList {
    pub deliveries: Vec<DeliveryView>,
    pub next: Option<String>,
}

/// `POST /v1/deliveries/{id}/replay`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayedOne {
    pub id: String,
    pub status: crate::model::Status,
}

/// `POST /v1/replay`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Replayed {
    pub replayed: u64,
    /// More may match past what this call looked at (`REPLAY_PER_CALL`): call again with
    /// `after` set to `next`.
    pub more: bool,
    /// The last delivery this call looked at, when `more`.
    pub next: Option<String>,
}
