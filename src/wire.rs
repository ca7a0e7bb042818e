//! Wire types shared by the Worker and the origin daemon. Every JSON shape that crosses the
//! origin ⇄ edge boundary derives serde here, and only here.

use serde::{Deserialize, Serialize};

use crate::breaker::BreakerConfig;
use crate::sign::{Keys, Scheme, Secret, SigningKey};

/// Largest accepted `POST /v1/deliveries` request body.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
/// Most deliveries in one edge call.
pub const MAX_BATCH: usize = 500;
/// Largest single delivery body.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// How much of a subscriber's response body is kept in a result or an attempt record.
pub const RESPONSE_BODY_LIMIT: usize = 4096;
/// Bounds on a subscriber's configured request timeout (kept with the other bounds).
pub use crate::limits::{MAX_TIMEOUT_MS, MIN_TIMEOUT_MS};
/// The longest id (subscriber, event, delivery) either side accepts, in bytes.
pub const MAX_ID_LEN: usize = 255;

/// A subscriber's or a customer's id names it in URLs, the console, the portal, `/metrics` and
/// logs, where a reader must see what it is: 1 to [`MAX_ID_LEN`] ASCII letters, digits and
/// `_ - . :` (no bidi control, zero-width or other invisible character, no look-alike letter,
/// no space, no markup). The origin takes no new subscriber or customer whose id is outside
/// this set.
pub fn validate_id(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("{what} must be 1 to {MAX_ID_LEN} characters"));
    }
    if !id.bytes().all(is_id_byte) {
        return Err(format!(
            "{what} may hold only ASCII letters, digits and '_', '-', '.', ':'"
        ));
    }
    Ok(())
}

fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':')
}

/// What the edge takes as a subscriber id: every id the origin ever took, including those of
/// subscribers created before [`validate_id`] narrowed the set (so they keep being delivered):
/// 1 to [`MAX_ID_LEN`] bytes, no '/', no whitespace, no control characters.
pub fn validate_wire_id(what: &str, id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("{what} must be 1 to {MAX_ID_LEN} characters"));
    }
    if id
        .chars()
        .any(|c| c.is_control() || c == '/' || c.is_whitespace())
    {
        return Err(format!(
            "{what} must not contain '/', whitespace or control characters"
        ));
    }
    Ok(())
}

/// An event id is the producer's, and is sent to subscribers as the `webhook-id` header, which
/// carries visible ASCII only: 1 to [`MAX_ID_LEN`] characters from `!`..=`~` but '/', and not
/// `.` or `..`.
pub fn validate_event_id(what: &str, id: &str) -> Result<(), String> {
    validate_visible(what, id)?;
    if id.contains('/') {
        return Err(format!("{what} must not contain '/'"));
    }
    // A thin webhook's `url` puts the id in a path, where `.` and `..` are dot segments that
    // every URL parser resolves away, percent-encoded or not (WHATWG reads `%2E%2E` as `..`).
    if id == "." || id == ".." {
        return Err(format!("{what} must not be '.' or '..'"));
    }
    Ok(())
}

/// An event type (and the patterns that match types) is shown beside ids: 1 to
/// [`MAX_ID_LEN`] visible ASCII characters (`!`..=`~`), no space.
pub fn validate_visible(what: &str, text: &str) -> Result<(), String> {
    if text.is_empty() || text.len() > MAX_ID_LEN {
        return Err(format!("{what} must be 1 to {MAX_ID_LEN} characters"));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{what} must be visible ASCII ('!' to '~', no space)"
        ));
    }
    Ok(())
}

/// A subscriber as the edge needs to know it, carried in every edge call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberSpec {
    pub id: String,
    pub url: String,
    /// Active `whsec_` secrets, newest first. Each one signs; verifiers accept any.
    pub secrets: Vec<String>,
    pub rate_per_sec: f64,
    pub burst: u32,
    pub max_in_flight: u32,
    pub timeout_ms: u64,
    /// Also send `X-Fanout-Signature: sha256=<hex>` (the legacy header).
    #[serde(default)]
    pub legacy_signature: bool,
    /// Which signatures `webhook-signature` carries: `hmac` (`v1`, absent on the wire, so a
    /// Worker older than the field still takes an HMAC subscriber's call), `ed25519` (`v1a`)
    /// or `both`.
    #[serde(default, skip_serializing_if = "is_hmac")]
    pub signature: Scheme,
    /// Active Ed25519 signing keys (`whsk_`), newest first, each adding a `v1a` signature:
    /// carried, like `secrets`, only inside the origin's signed call, and only when the
    /// scheme signs with them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signing_keys: Vec<String>,
    /// When its breaker opens and how long it holds (the origin's `--breaker-threshold` and
    /// `--breaker-cooldown`), so that its breaker means the same on both lanes. Optional on the
    /// wire like `signature`: absent (an origin older than the field), the edge uses the
    /// defaults, as the origin does when it is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerConfig>,
}

fn is_hmac(s: &Scheme) -> bool {
    *s == Scheme::Hmac
}

/// The longest `ordering_key` a delivery may carry (a header value).
pub const MAX_ORDERING_KEY_BYTES: usize = 4096;

/// One delivery of one event to one subscriber.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub attempt: u32,
    /// The exact bytes to send.
    pub body: String,
    /// The delivery's `webhook-sequence` (its subscriber's count of deliveries, from 1).
    /// Optional on the wire so that a Worker takes a call from an origin older than the field:
    /// deploy the Worker first, then the origin (an older Worker refuses the unknown field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// An ordered delivery's `webhook-ordering-key` (visible ASCII, as the origin encoded it)
    /// and `webhook-previous-sequence`; absent for unordered ones (and a key's first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_sequence: Option<u64>,
    /// The W3C `traceparent` the webhook carries (`crate::traceparent`): present only for a
    /// subscriber with `propagate_trace`. Optional on the wire like `sequence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// A batched webhook (`crate::batch`): `body` is the batch's, `event_id` its own
    /// `webhook-id`, and this names its events, whose ids a 2xx answer's `failed` list may
    /// name. Optional on the wire like `sequence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchMembers>,
}

/// The events one batched webhook carries, in its order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchMembers {
    pub events: Vec<String>,
    /// Each event's `webhook-sequence` (sent as `webhook-sequences`); empty when none is stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequences: Vec<u64>,
}

/// The body of `POST /v1/deliveries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryBatch {
    pub subscriber: SubscriberSpec,
    pub deliveries: Vec<Delivery>,
}

/// Why the edge handed a delivery back without sending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeferReason {
    Rate,
    InFlight,
    Paused,
    BreakerOpen,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::Rate => "rate",
            DeferReason::InFlight => "in_flight",
            DeferReason::Paused => "paused",
            DeferReason::BreakerOpen => "breaker_open",
        }
    }
}

/// Transport-level failure of one attempt (no HTTP status was received).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportError {
    Timeout,
    Connect,
    /// The host name does not exist (NXDOMAIN): permanent.
    Dns,
    Tls,
    /// The endpoint was refused by policy (scheme, private address): permanent.
    RefusedUrl,
    /// A 3xx answer: redirects are never followed.
    Redirect,
    /// A batched webhook's 2xx answer named this event in its `failed` list
    /// (`crate::batch`): retried like a failed attempt.
    NamedFailed,
}

impl TransportError {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportError::Timeout => "timeout",
            TransportError::Connect => "connect",
            TransportError::Dns => "dns",
            TransportError::Tls => "tls",
            TransportError::RefusedUrl => "refused_url",
            TransportError::Redirect => "redirect",
            TransportError::NamedFailed => "named_failed",
        }
    }
}

/// The edge's answer for one delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DeliveryResult {
    Delivered {
        id: String,
        status: u16,
        latency_ms: u64,
        /// A batched webhook's events its 2xx answer named as failed (`crate::batch::failed_of`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        failed: Vec<String>,
    },
    Deferred {
        id: String,
        retry_after_ms: u64,
        reason: DeferReason,
    },
    Failed {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response_body: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<TransportError>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        latency_ms: Option<u64>,
    },
    Rejected {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response_body: Option<String>,
    },
}

impl DeliveryResult {
    /// Give the result another delivery's id (a batch's result handed to each of its events).
    pub fn set_id(&mut self, to: &str) {
        match self {
            DeliveryResult::Delivered { id, .. }
            | DeliveryResult::Deferred { id, .. }
            | DeliveryResult::Failed { id, .. }
            | DeliveryResult::Rejected { id, .. } => *id = to.to_string(),
        }
    }

    pub fn id(&self) -> &str {
        match self {
            DeliveryResult::Delivered { id, .. }
            | DeliveryResult::Deferred { id, .. }
            | DeliveryResult::Failed { id, .. }
            | DeliveryResult::Rejected { id, .. } => id,
        }
    }

    pub fn outcome(&self) -> &'static str {
        match self {
            DeliveryResult::Delivered { .. } => "delivered",
            DeliveryResult::Deferred { .. } => "deferred",
            DeliveryResult::Failed { .. } => "failed",
            DeliveryResult::Rejected { .. } => "rejected",
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            DeliveryResult::Delivered { status, .. } => Some(*status),
            DeliveryResult::Failed { status, .. } | DeliveryResult::Rejected { status, .. } => {
                *status
            }
            DeliveryResult::Deferred { .. } => None,
        }
    }
}

/// The body of the edge's answer to `POST /v1/deliveries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResponse {
    pub results: Vec<DeliveryResult>,
}

impl BatchResponse {
    /// 202 when anything was deferred, 200 otherwise.
    pub fn http_status(&self) -> u16 {
        if self
            .results
            .iter()
            .any(|r| matches!(r, DeliveryResult::Deferred { .. }))
        {
            202
        } else {
            200
        }
    }
}

/// `{"error":{"code":"…","message":"…"}}`, the error shape of both HTTP APIs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}

/// Why a delivery batch was refused before anything was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("{0}")]
    Invalid(String),
    #[error("endpoint refused: {0}")]
    Endpoint(#[from] crate::endpoint::EndpointError),
    #[error("{0}")]
    TooLarge(String),
}

impl BatchError {
    /// The machine-readable code of the JSON error.
    pub fn code(&self) -> &'static str {
        match self {
            BatchError::Invalid(_) => "invalid_request",
            BatchError::Endpoint(_) => "endpoint_refused",
            BatchError::TooLarge(_) => "too_large",
        }
    }
}

impl DeliveryBatch {
    /// Parse and validate a request body; nothing is sent unless this succeeds.
    pub fn parse(body: &[u8], allow_loopback: bool) -> Result<Self, BatchError> {
        if body.len() > MAX_REQUEST_BYTES {
            return Err(BatchError::TooLarge(format!(
                "request body is {} bytes; the limit is {MAX_REQUEST_BYTES}",
                body.len()
            )));
        }
        let batch: DeliveryBatch = serde_json::from_slice(body)
            .map_err(|e| BatchError::Invalid(format!("malformed request: {e}")))?;
        batch.validate(allow_loopback)?;
        Ok(batch)
    }

    pub fn validate(&self, allow_loopback: bool) -> Result<(), BatchError> {
        self.subscriber.validate(allow_loopback)?;
        if self.deliveries.is_empty() {
            return Err(BatchError::Invalid("deliveries must not be empty".into()));
        }
        if self.deliveries.len() > MAX_BATCH {
            return Err(BatchError::TooLarge(format!(
                "{} deliveries in one call; the limit is {MAX_BATCH}",
                self.deliveries.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for d in &self.deliveries {
            if d.id.is_empty() || d.event_id.is_empty() || d.event_type.is_empty() {
                return Err(BatchError::Invalid(
                    "every delivery needs a non-empty id, event_id and type".into(),
                ));
            }
            if d.attempt == 0 {
                return Err(BatchError::Invalid(format!(
                    "delivery {}: attempt starts at 1",
                    d.id
                )));
            }
            if d.sequence == Some(0) {
                return Err(BatchError::Invalid(format!(
                    "delivery {}: sequence starts at 1",
                    d.id
                )));
            }
            if d.ordering_key.as_ref().is_some_and(|k| {
                k.len() > MAX_ORDERING_KEY_BYTES || !k.bytes().all(|b| (0x20..0x7f).contains(&b))
            }) {
                return Err(BatchError::Invalid(format!(
                    "delivery {}: ordering_key must be at most {MAX_ORDERING_KEY_BYTES} bytes of visible ASCII",
                    d.id
                )));
            }
            if let Some(tp) = &d.traceparent {
                if crate::traceparent::TraceParent::parse(tp).is_none() {
                    return Err(BatchError::Invalid(format!(
                        "delivery {}: traceparent is not a W3C trace context",
                        d.id
                    )));
                }
            }
            if let Some(b) = &d.batch {
                if b.events.is_empty() || b.events.len() > crate::limits::BATCH_MAX_EVENTS as usize
                {
                    return Err(BatchError::Invalid(format!(
                        "delivery {}: a batch carries 1 to {} events",
                        d.id,
                        crate::limits::BATCH_MAX_EVENTS
                    )));
                }
                if !b.sequences.is_empty() && b.sequences.len() != b.events.len() {
                    return Err(BatchError::Invalid(format!(
                        "delivery {}: a batch's sequences are one per event",
                        d.id
                    )));
                }
            }
            // A batch's body holds at most `max_bytes` (1 MiB), or one event alone.
            let limit = if d.batch.is_some() {
                crate::limits::BATCH_MAX_BYTES as usize
            } else {
                MAX_BODY_BYTES
            };
            if d.body.len() > limit {
                return Err(BatchError::TooLarge(format!(
                    "delivery {}: body is {} bytes; the limit is {limit}",
                    d.id,
                    d.body.len()
                )));
            }
            if !seen.insert(d.id.as_str()) {
                return Err(BatchError::Invalid(format!(
                    "delivery id {} appears twice",
                    d.id
                )));
            }
        }
        Ok(())
    }
}

impl SubscriberSpec {
    pub fn validate(&self, allow_loopback: bool) -> Result<(), BatchError> {
        validate_wire_id("subscriber.id", &self.id).map_err(BatchError::Invalid)?;
        crate::limits::check(
            self.rate_per_sec,
            self.burst,
            self.max_in_flight,
            self.timeout_ms,
        )
        .map_err(|e| BatchError::Invalid(format!("subscriber.{e}")))?;
        if self.secrets.is_empty() {
            return Err(BatchError::Invalid(
                "subscriber.secrets must hold at least one whsec_ secret".into(),
            ));
        }
        for s in &self.secrets {
            Secret::parse(s)
                .map_err(|e| BatchError::Invalid(format!("subscriber.secrets: {e}")))?;
        }
        for k in &self.signing_keys {
            SigningKey::parse(k)
                .map_err(|e| BatchError::Invalid(format!("subscriber.signing_keys: {e}")))?;
        }
        if self.signature.ed25519() && self.signing_keys.is_empty() {
            return Err(BatchError::Invalid(format!(
                "subscriber.signature {} needs at least one whsk_ key in subscriber.signing_keys",
                self.signature.as_str()
            )));
        }
        if let Some(b) = &self.breaker {
            b.check()
                .map_err(|e| BatchError::Invalid(format!("subscriber.breaker.{e}")))?;
        }
        crate::endpoint::check_url(&self.url, allow_loopback)?;
        Ok(())
    }

    /// Its breaker's settings: those the origin sent, or the defaults.
    pub fn breaker_config(&self) -> BreakerConfig {
        self.breaker.unwrap_or_default()
    }
}

impl SubscriberSpec {
    /// What signs this subscriber's webhooks (parsed once per call; [`SubscriberSpec::validate`]
    /// has checked every key).
    pub fn keys(&self) -> Keys {
        Keys::for_scheme(
            self.signature,
            self.secrets
                .iter()
                .filter_map(|s| Secret::parse(s).ok())
                .collect(),
            self.signing_keys
                .iter()
                .filter_map(|k| SigningKey::parse(k).ok())
                .collect(),
            self.legacy_signature,
        )
    }
}

/// A subscriber's limiter state as `GET /v1/subscribers/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriberStatus {
    pub id: String,
    /// Tokens available now (after refill).
    pub tokens: f64,
    pub rate_per_sec: f64,
    pub burst: u32,
    pub in_flight: u32,
    /// Unix ms until which the subscriber is paused by its own Retry-After, if in the future.
    pub paused_until_ms: Option<i64>,
    pub breaker: crate::breaker::BreakerView,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_table() {
        let long = "x".repeat(MAX_ID_LEN);
        let too_long = "x".repeat(MAX_ID_LEN + 1);
        // (id, a new subscriber or customer id, an id the edge takes, an event id)
        let rows: &[(&str, bool, bool, bool)] = &[
            ("sub_partner", true, true, true),
            ("Sub-1.v2:eu", true, true, true),
            ("evt_01JMZ8K3:v2~x", false, true, true),
            (&long, true, true, true),
            (&too_long, false, false, false),
            ("", false, false, false),
            ("a/b", false, false, false),
            // A dot segment in an `--event-url` path (`…/events/../body`) whatever its encoding.
            (".", true, true, false),
            ("..", true, true, false),
            ("...", true, true, true),
            ("a b", false, false, false),
            ("a\tb", false, false, false),
            ("a\u{7f}", false, false, false),
            ("a<b>", false, true, true),
            ("évènement", false, true, false),
            ("evt_日本", false, true, false),
            ("acme\u{202E}exe", false, true, false),
            ("ac\u{200B}me", false, true, false),
            ("\u{FEFF}acme", false, true, false),
        ];
        for &(id, ok, wire_ok, event_ok) in rows {
            assert_eq!(validate_id("id", id).is_ok(), ok, "validate_id({id:?})");
            assert_eq!(
                validate_wire_id("id", id).is_ok(),
                wire_ok,
                "validate_wire_id({id:?})"
            );
            assert_eq!(
                validate_event_id("id", id).is_ok(),
                event_ok,
                "validate_event_id({id:?})"
            );
        }
        assert_eq!(
            validate_event_id("id", "evt_日本").unwrap_err(),
            "id must be visible ASCII ('!' to '~', no space)"
        );
        assert_eq!(
            validate_id("id", "ac\u{200B}me").unwrap_err(),
            "id may hold only ASCII letters, digits and '_', '-', '.', ':'"
        );
    }

    fn batch_json(subscriber_id: &str) -> String {
        serde_json::json!({
            "subscriber": {
                "id": subscriber_id,
                "url": "https://partner.example/hooks",
                "secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
                "rate_per_sec": 10,
                "burst": 20,
                "max_in_flight": 8,
                "timeout_ms": 10000
            },
            "deliveries": [
                {"id": "dlv_1", "event_id": "evt_1", "type": "video.trending", "attempt": 1, "body": "{}"}
            ]
        })
        .to_string()
    }

    /// `sequence` is optional both ways: absent it stays absent (a call from an older origin
    /// parses; one to an older Worker carries no unknown field), present it must be 1 or more.
    #[test]
    fn sequence_on_the_wire_table() {
        let with = |seq: Option<serde_json::Value>| {
            let mut b: serde_json::Value = serde_json::from_str(&batch_json("s")).unwrap();
            if let Some(seq) = seq {
                b["deliveries"][0]["sequence"] = seq;
            }
            b.to_string()
        };
        type Row<'a> = (Option<serde_json::Value>, Result<Option<u64>, &'a str>);
        let rows: &[Row] = &[
            (None, Ok(None)),
            (Some(1.into()), Ok(Some(1))),
            (
                Some(9_007_199_254_740_991u64.into()),
                Ok(Some(9_007_199_254_740_991)),
            ),
            (Some(0.into()), Err("delivery dlv_1: sequence starts at 1")),
            (Some((-1).into()), Err("malformed")),
            (Some("7".into()), Err("malformed")),
        ];
        for (seq, expected) in rows {
            let got = DeliveryBatch::parse(with(seq.clone()).as_bytes(), false);
            match (got, expected) {
                (Ok(b), Ok(want)) => {
                    assert_eq!(b.deliveries[0].sequence, *want, "{seq:?}");
                    let again = serde_json::to_string(&b.deliveries[0]).unwrap();
                    assert_eq!(again.contains("sequence"), want.is_some(), "{again}");
                }
                (Err(BatchError::Invalid(msg)), Err(want)) => {
                    assert!(msg.contains(want), "{seq:?}: {msg}")
                }
                (got, want) => panic!("{seq:?}: got {got:?}, expected {want:?}"),
            }
        }
    }

    /// `subscriber.breaker` is optional both ways (absent: the defaults, and nothing on the
    /// wire for an older Worker to refuse), and when present within the origin's own bounds;
    /// the edge's breaker then opens and holds as the origin's does.
    #[test]
    fn breaker_on_the_wire_table() {
        let with = |b: Option<serde_json::Value>| {
            let mut v: serde_json::Value = serde_json::from_str(&batch_json("s")).unwrap();
            if let Some(b) = b {
                v["subscriber"]["breaker"] = b;
            }
            v.to_string()
        };
        let cfg = |threshold, cooldown_ms| BreakerConfig {
            threshold,
            cooldown_ms,
        };
        type Row<'a> = (Option<serde_json::Value>, Result<BreakerConfig, &'a str>);
        let rows: &[Row] = &[
            (None, Ok(BreakerConfig::default())),
            (
                Some(serde_json::json!({ "threshold": 3, "cooldown_ms": 5000 })),
                Ok(cfg(3, 5000)),
            ),
            (
                Some(serde_json::json!({ "threshold": 0, "cooldown_ms": 5000 })),
                Err("subscriber.breaker.threshold must be 1 to 1000, not 0"),
            ),
            (
                Some(serde_json::json!({ "threshold": 3, "cooldown_ms": 86_400_000 })),
                Err("subscriber.breaker.cooldown_ms must be 1000 to 3600000"),
            ),
            (
                Some(serde_json::json!({ "threshold": 3, "cooldown_ms": 5000, "x": 1 })),
                Err("malformed"),
            ),
            (
                Some(serde_json::json!({ "threshold": 3 })),
                Err("malformed"),
            ),
        ];
        for (b, expected) in rows {
            match (
                DeliveryBatch::parse(with(b.clone()).as_bytes(), false),
                expected,
            ) {
                (Ok(batch), Ok(want)) => {
                    assert_eq!(batch.subscriber.breaker_config(), *want, "{b:?}");
                    let again = serde_json::to_string(&batch.subscriber).unwrap();
                    assert_eq!(again.contains("breaker"), b.is_some(), "{again}");
                }
                (Err(BatchError::Invalid(msg)), Err(want)) => {
                    assert!(msg.contains(want), "{b:?}: {msg}")
                }
                (got, want) => panic!("{b:?}: got {got:?}, expected {want:?}"),
            }
        }
    }

    /// `traceparent` is optional both ways, and when present a valid W3C trace context.
    #[test]
    fn traceparent_on_the_wire_table() {
        let with = |tp: Option<&str>| {
            let mut b: serde_json::Value = serde_json::from_str(&batch_json("s")).unwrap();
            if let Some(tp) = tp {
                b["deliveries"][0]["traceparent"] = tp.into();
            }
            b.to_string()
        };
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        type Row<'a> = (Option<&'a str>, Result<Option<&'a str>, &'a str>);
        let rows: &[Row] = &[
            (None, Ok(None)),
            (Some(good), Ok(Some(good))),
            (
                Some("00-xyz"),
                Err("traceparent is not a W3C trace context"),
            ),
            (
                Some("a\r\nb"),
                Err("traceparent is not a W3C trace context"),
            ),
        ];
        for (tp, expected) in rows {
            match (DeliveryBatch::parse(with(*tp).as_bytes(), false), expected) {
                (Ok(b), Ok(want)) => {
                    assert_eq!(b.deliveries[0].traceparent.as_deref(), *want, "{tp:?}");
                    let again = serde_json::to_string(&b.deliveries[0]).unwrap();
                    assert_eq!(again.contains("traceparent"), want.is_some(), "{again}");
                }
                (Err(BatchError::Invalid(msg)), Err(want)) => {
                    assert!(msg.contains(want), "{tp:?}: {msg}")
                }
                (got, want) => panic!("{tp:?}: got {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn the_edge_takes_every_subscriber_id_the_origin_takes() {
        let long = "s".repeat(MAX_ID_LEN);
        assert!(DeliveryBatch::parse(batch_json(&long).as_bytes(), false).is_ok());
        let too_long = "s".repeat(MAX_ID_LEN + 1);
        match DeliveryBatch::parse(batch_json(&too_long).as_bytes(), false) {
            Err(BatchError::Invalid(msg)) => {
                assert_eq!(msg, "subscriber.id must be 1 to 255 characters")
            }
            other => panic!("expected invalid_request, got {other:?}"),
        }
        assert!(matches!(
            DeliveryBatch::parse(batch_json("sub/x").as_bytes(), false),
            Err(BatchError::Invalid(_))
        ));
    }

    /// `signature` and `signing_keys` are optional both ways (an HMAC subscriber's call is the
    /// same as before them); an Ed25519 scheme needs a key, and every key must parse.
    #[test]
    fn signature_scheme_on_the_wire_table() {
        let key = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
        let with = |scheme: Option<&str>, keys: &[&str]| {
            let mut b: serde_json::Value = serde_json::from_str(&batch_json("s")).unwrap();
            if let Some(s) = scheme {
                b["subscriber"]["signature"] = s.into();
            }
            if !keys.is_empty() {
                b["subscriber"]["signing_keys"] = keys.into();
            }
            b.to_string()
        };
        type Row<'a> = (
            Option<&'a str>,
            &'a [&'a str],
            Result<(usize, usize), &'a str>,
        );
        let rows: &[Row] = &[
            (None, &[], Ok((1, 0))),
            (Some("hmac"), &[key], Ok((1, 0))),
            (Some("ed25519"), &[key], Ok((0, 1))),
            (Some("both"), &[key, key], Ok((1, 2))),
            (Some("ed25519"), &[], Err("needs at least one whsk_ key")),
            (Some("both"), &["whsk_AAAA"], Err("subscriber.signing_keys")),
            (Some("rsa"), &[key], Err("malformed")),
        ];
        for (scheme, keys, expected) in rows {
            let got = DeliveryBatch::parse(with(*scheme, keys).as_bytes(), false);
            match (got, expected) {
                (Ok(b), Ok((v1, v1a))) => {
                    let k = b.subscriber.keys();
                    assert_eq!((k.v1.len(), k.v1a.len()), (*v1, *v1a), "{scheme:?}");
                    let again = serde_json::to_string(&b.subscriber).unwrap();
                    let hmac = b.subscriber.signature == Scheme::Hmac;
                    assert_eq!(!again.contains("\"signature\""), hmac, "{again}");
                }
                (Err(BatchError::Invalid(msg)), Err(want)) => {
                    assert!(msg.contains(want), "{scheme:?}: {msg}")
                }
                (got, want) => panic!("{scheme:?}: got {got:?}, expected {want:?}"),
            }
        }
    }
}
