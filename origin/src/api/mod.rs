//! The HTTP API: producers' `POST /v1/events`, subscriber administration, deliveries,
//! replay, health and metrics. Handlers parse and validate (pure), then apply one ledger
//! operation, then tell the dispatcher what changed.

pub mod auth;
mod customers;
pub(crate) mod error;
mod extract;
mod openapi;
mod stats;
pub mod views;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fanout_core::endpoint::check_url;
use fanout_core::sign::Secret;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use tokio::sync::mpsc::UnboundedSender;

pub use error::ApiError;

use auth::Principal;
use extract::PathId;

use crate::dispatch::Control;
use crate::health::Health;
use crate::ledger::store::Store;
use crate::ledger::{self, DeliveryFilter, NewEvent};
use crate::ledger::{Deliveries as _, Observe as _, Retention as _, Subscribers as _};
use crate::metrics::Metrics;
use crate::model::{
    parse_delivery_id, validate_event_id, validate_id, validate_pattern, validate_visible,
    Disabled, Lane, Limits, SecretsView, Status, Subscriber, SubscriberView, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_RATE_PER_SEC, DEFAULT_TIMEOUT_MS,
};
use crate::time::{now_ms, parse_time, random_bytes};

/// Largest request body of any kind (a batch of events).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Most events in one `POST /v1/events`.
pub const MAX_EVENTS_PER_REQUEST: usize = 10_000;
const MAX_URL_LEN: usize = 2048;

#[derive(Debug)]
pub struct ApiConfig {
    pub api_token: String,
    pub allow_loopback: bool,
    pub max_event_bytes: usize,
    pub rotation_grace_ms: i64,
    /// How long finished deliveries are kept (shown by `GET /v1/retention`).
    pub retention: crate::retention::Retention,
    /// A request body must arrive within this long (408 otherwise).
    pub body_timeout: std::time::Duration,
    /// The HMAC key that signs portal tokens (`crate::portal::token`), kept in the ledger.
    pub portal_key: Vec<u8>,
    /// The portal's `frame-ancestors` source list (`'none'` unless configured).
    pub portal_frame_ancestors: String,
    /// The breakers' settings, for the views of their state.
    pub breaker: fanout_core::breaker::BreakerConfig,
}

#[derive(Debug, Clone)]
pub struct AppState {
    ledger: Store,
    control: UnboundedSender<Control>,
    cfg: Arc<ApiConfig>,
    metrics: Arc<Metrics>,
    health: Health,
}

impl AppState {
    pub fn new(
        ledger: Store,
        control: UnboundedSender<Control>,
        cfg: ApiConfig,
        metrics: Arc<Metrics>,
        health: Health,
    ) -> Self {
        AppState {
            ledger,
            control,
            cfg: Arc::new(cfg),
            metrics,
            health,
        }
    }

    fn tell(&self, c: Control) {
        // The dispatcher is gone only during shutdown; its next start rescans the ledger.
        let _ = self.control.send(c);
    }
}

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/events", post(post_events))
        .route(
            "/v1/subscribers",
            post(create_subscriber).get(list_subscribers),
        )
        .route(
            "/v1/subscribers/{id}",
            get(get_subscriber)
                .patch(patch_subscriber)
                .delete(delete_subscriber),
        )
        .route("/v1/subscribers/{id}/rotate-secret", post(rotate_secret))
        .route("/v1/subscribers/{id}/secret", get(get_secrets))
        .route("/v1/subscribers/{id}/test", post(send_test))
        .route("/v1/deliveries", get(list_deliveries))
        .route("/v1/deliveries/{id}", get(get_delivery))
        .route("/v1/deliveries/{id}/replay", post(replay_one))
        .route("/v1/replay", post(replay_bulk))
        .route("/v1/retention", get(retention))
        .merge(customers::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::document))
        .merge(crate::console::routes())
        .merge(crate::portal::routes(&state.cfg.portal_frame_ancestors))
        .merge(v1)
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

async fn read_body(
    cfg: &ApiConfig,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<bytes::Bytes, ApiError> {
    let too_large = || ApiError::TooLarge(format!("the request body is over {limit} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    match tokio::time::timeout(cfg.body_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(read) => read.map_err(|_| too_large()),
        Err(_) => Err(ApiError::Timeout(format!(
            "the request body did not arrive within {} ms",
            cfg.body_timeout.as_millis()
        ))),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::from_json(&e))
}

// ---------------------------------------------------------------------------------------------
// Events

#[derive(Deserialize)]
struct EventHead {
    id: Option<serde_json::Value>,
    #[serde(rename = "type")]
    event_type: Option<serde_json::Value>,
}

/// Parse one event: an object with a string `id` and `type`, kept byte for byte.
fn parse_event(
    raw: &RawValue,
    index: Option<usize>,
    max_bytes: usize,
) -> Result<NewEvent, ApiError> {
    let at = index.map_or(String::new(), |i| format!("event {i}: "));
    let text = raw.get();
    if text.len() > max_bytes {
        return Err(ApiError::TooLarge(format!(
            "{at}the event is {} bytes; the limit is {max_bytes}",
            text.len()
        )));
    }
    let head: EventHead = serde_json::from_str(text)
        .map_err(|_| ApiError::Invalid(format!("{at}an event must be a JSON object")))?;
    let id = match head.id {
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return Err(ApiError::Invalid(format!("{at}id must be a string"))),
        None => return Err(ApiError::Invalid(format!("{at}id is missing"))),
    };
    validate_event_id("id", &id).map_err(|e| ApiError::Invalid(format!("{at}{e}")))?;
    let event_type = match head.event_type {
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return Err(ApiError::Invalid(format!("{at}type must be a string"))),
        None => return Err(ApiError::Invalid(format!("{at}type is missing"))),
    };
    validate_visible("type", &event_type).map_err(|e| ApiError::Invalid(format!("{at}{e}")))?;
    if event_type.contains('*') {
        return Err(ApiError::Invalid(format!("{at}type must not contain '*'")));
    }
    Ok(NewEvent {
        id,
        event_type,
        body: text.to_string(),
    })
}

/// Parse a `POST /v1/events` body: one event or an array of them. `true` when it was an array.
pub fn parse_events(
    body: &[u8],
    max_event_bytes: usize,
) -> Result<(Vec<NewEvent>, bool), ApiError> {
    let raw: &RawValue = serde_json::from_slice(body).map_err(|e| ApiError::from_json(&e))?;
    let text = raw.get();
    if text.starts_with('[') {
        let items: Vec<&RawValue> =
            serde_json::from_str(text).map_err(|e| ApiError::from_json(&e))?;
        if items.is_empty() {
            return Err(ApiError::Invalid("the array holds no event".into()));
        }
        if items.len() > MAX_EVENTS_PER_REQUEST {
            return Err(ApiError::TooLarge(format!(
                "{} events in one request; the limit is {MAX_EVENTS_PER_REQUEST}",
                items.len()
            )));
        }
        let events = items
            .iter()
            .enumerate()
            .map(|(i, r)| parse_event(r, Some(i), max_event_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((events, true))
    } else {
        Ok((vec![parse_event(raw, None, max_event_bytes)?], false))
    }
}

async fn post_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let limit = MAX_REQUEST_BYTES.max(state.cfg.max_event_bytes);
    let bytes = read_body(&state.cfg, &headers, body, limit).await?;
    let (events, is_array) = parse_events(&bytes, state.cfg.max_event_bytes)?;
    let now = now_ms();
    let (results, touched) = state.ledger.ingest(events, now).await?;
    let dups = results.iter().filter(|r| r.duplicate).count() as u64;
    state.metrics.events_ingested.fetch_add(
        results.len() as u64 - dups,
        std::sync::atomic::Ordering::Relaxed,
    );
    state
        .metrics
        .events_duplicate
        .fetch_add(dups, std::sync::atomic::Ordering::Relaxed);
    if !touched.is_empty() {
        state.tell(Control::Due(touched));
    }
    let body = if is_array {
        serde_json::to_value(views::IngestedBatch { events: results })
    } else {
        serde_json::to_value(&results[0])
    }
    .unwrap_or_default();
    Ok((StatusCode::ACCEPTED, Json(body)))
}

// ---------------------------------------------------------------------------------------------
// Subscribers

/// The body of `POST /v1/subscribers` and `PATCH /v1/subscribers/{id}` (the CLI writes it
/// with the same type).
#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<Lane>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy_signature: Option<bool>,
    /// Optional on creation: a `whsec_` secret to use instead of a generated one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// PATCH only: `false` re-enables a disabled subscriber, `true` disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// The owning customer; in a PATCH, `null` detaches the subscriber from its customer.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub customer: Option<Option<String>>,
}

/// `Some(value)` for a field that is present, `null` included (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

impl SubscriberInput {
    /// The names of the fields this input sets.
    fn fields(&self) -> Vec<&'static str> {
        let set: [(&'static str, bool); 12] = [
            ("id", self.id.is_some()),
            ("url", self.url.is_some()),
            ("event_types", self.event_types.is_some()),
            ("rate_per_sec", self.rate_per_sec.is_some()),
            ("burst", self.burst.is_some()),
            ("max_in_flight", self.max_in_flight.is_some()),
            ("timeout_ms", self.timeout_ms.is_some()),
            ("lane", self.lane.is_some()),
            ("legacy_signature", self.legacy_signature.is_some()),
            ("secret", self.secret.is_some()),
            ("disabled", self.disabled.is_some()),
            ("customer", self.customer.is_some()),
        ];
        set.into_iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f)
            .collect()
    }
}

fn validate_customer_ref(customer: &Option<Option<String>>) -> Result<(), ApiError> {
    if let Some(Some(c)) = customer {
        validate_id("customer", c).map_err(ApiError::Invalid)?;
    }
    Ok(())
}

fn new_secret() -> Result<String, ApiError> {
    let bytes = random_bytes::<32>().map_err(|e| {
        ApiError::Ledger(ledger::LedgerError::Invalid(format!("no randomness: {e}")))
    })?;
    Secret::from_bytes(&bytes)
        .map(|s| s.encode())
        .map_err(|e| ApiError::Invalid(e.to_string()))
}

fn validate_url(url: &str, allow_loopback: bool) -> Result<(), ApiError> {
    if url.len() > MAX_URL_LEN {
        return Err(ApiError::InvalidUrl(format!(
            "url is longer than {MAX_URL_LEN} characters"
        )));
    }
    check_url(url, allow_loopback)
        .map(|_| ())
        .map_err(|e| ApiError::InvalidUrl(format!("url refused: {e}")))
}

fn validate_types(types: &[String]) -> Result<(), ApiError> {
    if types.is_empty() {
        return Err(ApiError::Invalid(
            "event_types must hold at least one pattern".into(),
        ));
    }
    for t in types {
        validate_pattern(t).map_err(ApiError::Invalid)?;
    }
    Ok(())
}

/// Build a subscriber from a creation request (pure).
fn subscriber_from(
    input: SubscriberInput,
    allow_loopback: bool,
    now: i64,
) -> Result<(Subscriber, Option<String>), ApiError> {
    let id = input
        .id
        .ok_or_else(|| ApiError::Invalid("id is missing".into()))?;
    validate_id("id", &id).map_err(ApiError::Invalid)?;
    let url = input
        .url
        .ok_or_else(|| ApiError::Invalid("url is missing".into()))?;
    validate_url(&url, allow_loopback)?;
    let event_types = input
        .event_types
        .ok_or_else(|| ApiError::Invalid("event_types is missing".into()))?;
    validate_types(&event_types)?;
    let rate_per_sec = input.rate_per_sec.unwrap_or(DEFAULT_RATE_PER_SEC);
    let limits = Limits {
        rate_per_sec,
        burst: input
            .burst
            .unwrap_or_else(|| Limits::default_burst(rate_per_sec)),
        max_in_flight: input.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT),
        timeout_ms: input.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
    };
    limits.validate().map_err(ApiError::Invalid)?;
    if let Some(s) = &input.secret {
        Secret::parse(s).map_err(|e| ApiError::Invalid(format!("secret: {e}")))?;
    }
    if input.disabled == Some(true) {
        return Err(ApiError::Invalid(
            "a subscriber is created enabled; PATCH {\"disabled\": true} disables it".into(),
        ));
    }
    validate_customer_ref(&input.customer)?;
    Ok((
        Subscriber {
            id,
            url,
            event_types,
            limits,
            lane: input.lane.unwrap_or_default(),
            legacy_signature: input.legacy_signature.unwrap_or(false),
            secrets: Vec::new(),
            created_ms: now,
            updated_ms: now,
            health: Default::default(),
            customer: input.customer.flatten(),
        },
        input.secret,
    ))
}

/// Apply a PATCH to a subscriber (pure).
fn patched(
    mut s: Subscriber,
    input: SubscriberInput,
    allow_loopback: bool,
    now: i64,
    who: &Principal,
) -> Result<Subscriber, ApiError> {
    if input.id.as_ref().is_some_and(|id| *id != s.id) {
        return Err(ApiError::Invalid("id cannot be changed".into()));
    }
    if input.secret.is_some() {
        return Err(ApiError::Invalid(
            "use rotate-secret to change the secret".into(),
        ));
    }
    if let Some(url) = input.url {
        validate_url(&url, allow_loopback)?;
        s.url = url;
    }
    if let Some(types) = input.event_types {
        validate_types(&types)?;
        s.event_types = types;
    }
    if let Some(r) = input.rate_per_sec {
        s.limits.rate_per_sec = r;
    }
    if let Some(b) = input.burst {
        s.limits.burst = b;
    }
    if let Some(m) = input.max_in_flight {
        s.limits.max_in_flight = m;
    }
    if let Some(t) = input.timeout_ms {
        s.limits.timeout_ms = t;
    }
    s.limits.validate().map_err(ApiError::Invalid)?;
    if let Some(l) = input.lane {
        s.lane = l;
    }
    if let Some(l) = input.legacy_signature {
        s.legacy_signature = l;
    }
    validate_customer_ref(&input.customer)?;
    if let Some(c) = input.customer {
        s.customer = c;
    }
    match (input.disabled, &s.health.disabled) {
        // What an operator disabled only an operator re-enables.
        (Some(false), Some(d)) if d.by_operator && !who.is_operator() => {
            return Err(ApiError::Forbidden(
                "this endpoint was disabled by the operator: only the operator can re-enable it"
                    .into(),
            ))
        }
        // Re-enabled: a fresh start (no run of failures; the dispatcher closes the breaker).
        (Some(false), Some(_)) => s.health = Default::default(),
        (Some(true), None) => {
            s.health.disabled = Some(Disabled {
                at_ms: now,
                reason: format!("disabled by {}", who.actor()),
                by_operator: who.is_operator(),
            })
        }
        _ => {}
    }
    s.updated_ms = now;
    Ok(s)
}

fn unknown_subscriber(e: ledger::LedgerError, id: &str) -> ApiError {
    match e {
        ledger::LedgerError::NotFound(_) => {
            ApiError::UnknownSubscriber(format!("no subscriber {id}"))
        }
        other => ApiError::Ledger(other),
    }
}

async fn create_subscriber(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, 64 * 1024).await?;
    let input: SubscriberInput = parse_json(&bytes)?;
    let now = now_ms();
    let (sub, given) = subscriber_from(input, state.cfg.allow_loopback, now)?;
    let secret = match given {
        Some(s) => s,
        None => new_secret()?,
    };
    let created = state.ledger.create_subscriber(sub, secret.clone()).await?;
    state.tell(Control::Changed(created.id.clone()));
    Ok((
        StatusCode::CREATED,
        NO_STORE,
        Json(SubscriberView::of(&created, now, Some(secret))),
    ))
}

/// On every response that carries a secret: no cache keeps it.
const NO_STORE: [(header::HeaderName, &str); 1] = [(header::CACHE_CONTROL, "no-store")];

/// Subscribers (one, or every live one), with their figures when `with_stats`.
async fn subscribers_with_stats(
    state: &AppState,
    who: &Principal,
    only: Option<String>,
    with_stats: bool,
) -> Result<Vec<stats::ViewWithStats>, ledger::LedgerError> {
    let scope = who.scope();
    let (subs, counts) = state.ledger.subscribers(only, with_stats, scope).await?;
    let stalled = if with_stats {
        state.metrics.stalled()
    } else {
        Default::default()
    };
    Ok(stats::views(
        &subs,
        counts.as_ref(),
        &stalled,
        state.cfg.breaker,
        now_ms(),
    ))
}

async fn list_subscribers(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let views = subscribers_with_stats(&state, &who, None, stats::wants_stats(&q)?).await?;
    Ok(Json(views::SubscriberList { subscribers: views }))
}

async fn get_subscriber(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let with_stats = stats::wants_stats(&q)?;
    let mut views = subscribers_with_stats(&state, &who, Some(id.clone()), with_stats)
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    views
        .pop()
        .map(Json)
        .ok_or_else(|| ApiError::UnknownSubscriber(format!("no subscriber {id}")))
}

async fn patch_subscriber(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, 64 * 1024).await?;
    let input: SubscriberInput = parse_json(&bytes)?;
    who.may_patch(&input.fields())?;
    let allow_loopback = state.cfg.allow_loopback;
    let now = now_ms();
    let scope = who.scope();
    let sub = state
        .ledger
        .update_subscriber(id.clone(), scope, move |current| {
            let toggled = input.disabled.is_some();
            patched(current, input, allow_loopback, now, &who).map(|next| (next, toggled))
        })
        .await
        .map_err(|e| unknown_subscriber(e, &id))??;
    state.tell(Control::Changed(id));
    Ok(Json(SubscriberView::of(&sub, now, None)))
}

async fn delete_subscriber(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    let dead = state
        .ledger
        .delete_subscriber(id.clone(), now)
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    state.tell(Control::Changed(id.clone()));
    Ok(Json(views::Deleted {
        id,
        deleted: true,
        deliveries_dead: dead as u64,
    }))
}

async fn rotate_secret(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    let secret = new_secret()?;
    let grace = state.cfg.rotation_grace_ms;
    let scope = who.scope();
    state
        .ledger
        .rotate_secret(id.clone(), secret.clone(), now, grace, scope)
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    state.tell(Control::Changed(id.clone()));
    Ok((
        NO_STORE,
        Json(views::Rotated {
            id,
            secret,
            previous_secrets_expire_at_ms: now + grace,
        }),
    ))
}

/// `GET /v1/subscribers/{id}/secret`: the secrets that sign its deliveries now, newest first,
/// a rotated-out one with the end of its grace period.
async fn get_secrets(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    let scope = who.scope();
    let sub = state
        .ledger
        .subscriber(id.clone(), scope)
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    Ok((NO_STORE, Json(SecretsView::of(&sub, now))))
}

/// The event type of a test event (`POST /v1/subscribers/{id}/test`).
pub const TEST_EVENT_TYPE: &str = "fanout.test";

/// A test event for one subscriber (pure): a fresh id from `random`, the type
/// [`TEST_EVENT_TYPE`], and who it is for.
fn test_event(subscriber: &str, now: i64, random: [u8; 8]) -> NewEvent {
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let id = format!("evt_test_{now}_{suffix}");
    let body = json!({
        "id": id,
        "type": TEST_EVENT_TYPE,
        "data": { "subscriber": subscriber, "sent_at_ms": now },
    })
    .to_string();
    NewEvent {
        id,
        event_type: TEST_EVENT_TYPE.into(),
        body,
    }
}

/// `POST /v1/subscribers/{id}/test`: one `fanout.test` event delivered to this subscriber
/// alone, through the usual queue (signed, rate-limited, retried, visible in its deliveries).
async fn send_test(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    let random = random_bytes::<8>().map_err(|e| {
        ApiError::Ledger(ledger::LedgerError::Invalid(format!("no randomness: {e}")))
    })?;
    let event = test_event(&id, now, random);
    let event_id = event.id.clone();
    let scope = who.scope();
    let rowid = state
        .ledger
        .ingest_test(id.clone(), event, now, scope)
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    state.tell(Control::Due(vec![id]));
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "event_id": event_id,
            "delivery_id": crate::model::delivery_public_id(rowid),
        })),
    ))
}

// ---------------------------------------------------------------------------------------------
// Deliveries and replay

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryQuery {
    status: Option<String>,
    subscriber: Option<String>,
    event: Option<String>,
    /// Only events of this type.
    #[serde(rename = "type")]
    event_type: Option<String>,
    since: Option<serde_json::Value>,
    until: Option<serde_json::Value>,
    after: Option<String>,
    limit: Option<usize>,
    /// `POST /v1/replay` only: count what would be replayed, change nothing.
    dry_run: Option<bool>,
}

fn time_arg(name: &str, v: Option<serde_json::Value>) -> Result<Option<i64>, ApiError> {
    let bad = || {
        ApiError::Invalid(format!(
            "{name} must be unix milliseconds or an RFC 3339 time"
        ))
    };
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n.as_i64().map(Some).ok_or_else(bad),
        Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => parse_time(&s).map(Some).ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// Turn query or body arguments into a ledger filter (pure).
fn filter_from(q: DeliveryQuery) -> Result<DeliveryFilter, ApiError> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(Status::parse(s).ok_or_else(|| {
            ApiError::Invalid(format!(
                "status must be pending, in_flight, sent or dead, not {s:?}"
            ))
        })?),
    };
    let after = match q.after.as_deref() {
        None | Some("") => None,
        Some(a) => Some(
            parse_delivery_id(a)
                .ok_or_else(|| ApiError::Invalid("after must be a delivery id".into()))?,
        ),
    };
    Ok(DeliveryFilter {
        status,
        subscriber: q.subscriber.filter(|s| !s.is_empty()),
        event: q.event.filter(|s| !s.is_empty()),
        event_type: q.event_type.filter(|s| !s.is_empty()),
        customer: None,
        since_ms: time_arg("since", q.since)?,
        until_ms: time_arg("until", q.until)?,
        after,
        limit: q.limit.unwrap_or(1000).clamp(1, 10_000),
    })
}

async fn list_deliveries(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let mut query = DeliveryQuery::default();
    for (k, v) in q {
        match k.as_str() {
            "status" => query.status = Some(v),
            "subscriber" => query.subscriber = Some(v),
            "event" => query.event = Some(v),
            "type" => query.event_type = Some(v),
            "since" => query.since = Some(serde_json::Value::String(v)),
            "until" => query.until = Some(serde_json::Value::String(v)),
            "after" => query.after = Some(v),
            "limit" => {
                query.limit = Some(
                    v.parse()
                        .map_err(|_| ApiError::Invalid("limit must be a number".into()))?,
                )
            }
            other => {
                return Err(ApiError::Invalid(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    let mut filter = filter_from(query)?;
    filter.customer = who.scope();
    let limit = filter.limit;
    let rows = state.ledger.list_deliveries(filter).await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|d| d.id.clone()))
        .flatten();
    Ok(Json(views::DeliveryList {
        deliveries: rows,
        next,
    }))
}

fn delivery_id(id: &str) -> Result<i64, ApiError> {
    parse_delivery_id(id).ok_or_else(|| ApiError::NotFound(format!("no delivery {id}")))
}

async fn get_delivery(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let rowid = delivery_id(&id)?;
    let scope = who.scope();
    Ok(Json(state.ledger.get_delivery(rowid, scope).await?))
}

async fn replay_one(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let rowid = delivery_id(&id)?;
    let now = now_ms();
    let scope = who.scope();
    let sub = state.ledger.replay_one(rowid, now, scope).await?;
    state.tell(Control::Replayed(vec![sub]));
    Ok((
        StatusCode::ACCEPTED,
        Json(views::ReplayedOne {
            id,
            status: Status::Pending,
        }),
    ))
}

async fn replay_bulk(
    State(state): State<AppState>,
    who: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, 64 * 1024).await?;
    let q: DeliveryQuery = if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        DeliveryQuery::default()
    } else {
        parse_json(&bytes)?
    };
    let dry_run = q.dry_run.unwrap_or(false);
    let mut filter = filter_from(q)?;
    filter.customer = who.scope();
    let now = now_ms();
    let unknown = |e| match e {
        ledger::LedgerError::NotFound(m) => ApiError::UnknownSubscriber(m),
        other => ApiError::Ledger(other),
    };
    if dry_run && filter.status == Some(Status::Pending) {
        return Ok(Json(json!({ "count": 0 })).into_response());
    }
    if dry_run {
        let n = state
            .ledger
            .count_replayable(filter)
            .await
            .map_err(unknown)?;
        return Ok(Json(json!({ "count": n })).into_response());
    }
    // What is pending already is in the queue: replaying it changes nothing.
    if filter.status == Some(Status::Pending) {
        return Ok((
            StatusCode::ACCEPTED,
            Json(views::Replayed {
                replayed: 0,
                more: false,
                next: None,
            }),
        )
            .into_response());
    }
    // In steps, each a short transaction, with a pause between them (as retention), and no
    // more than REPLAY_PER_CALL deliveries looked at per call: the answer says where to go on.
    let mut replayed = 0u64;
    let mut looked_at = 0usize;
    let mut step = filter.clone();
    let more = loop {
        step.limit = REPLAY_STEP.min(REPLAY_PER_CALL - looked_at);
        let done = state
            .ledger
            .replay_step(step.clone(), now)
            .await
            .map_err(unknown)?;
        replayed += done.replayed;
        looked_at += step.limit;
        if !done.subscribers.is_empty() {
            state.tell(Control::Replayed(done.subscribers));
        }
        step.after = done.last.or(step.after);
        if done.done {
            break false;
        }
        if looked_at >= REPLAY_PER_CALL {
            break true;
        }
        tokio::time::sleep(REPLAY_PAUSE).await;
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(views::Replayed {
            replayed,
            more,
            next: more
                .then(|| step.after.map(crate::model::delivery_public_id))
                .flatten(),
        }),
    )
        .into_response())
}

/// Deliveries one step of a bulk replay looks at: one short writer transaction.
const REPLAY_STEP: usize = 500;
/// Deliveries one `POST /v1/replay` looks at, at most; `more` and `next` say where to go on.
pub const REPLAY_PER_CALL: usize = 10_000;
/// The pause between two steps, which lets ingest and the dispatcher write in between.
const REPLAY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

// ---------------------------------------------------------------------------------------------
// Health and metrics

/// 200 when the dispatcher turns and the ledger can write; 503 with the reasons otherwise.
/// Reads atomics only on SQLite: it answers at once even while the writer is busy (on
/// PostgreSQL it also asks the server).
async fn healthz(State(state): State<AppState>) -> Response {
    let mut problems = crate::health::verdict(state.health.snapshot(), now_ms());
    if let Store::Postgres(_) = &state.ledger {
        // A shared PostgreSQL ledger: healthy only while it answers.
        if let Err(e) = state.ledger.ping().await {
            problems.push(crate::health::Problem {
                code: "ledger_unavailable",
                message: format!("the PostgreSQL ledger does not answer: {e}"),
            });
        }
    }
    if problems.is_empty() {
        return Json(json!({ "status": "ok" })).into_response();
    }
    let message = problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "status": "unavailable",
            "error": { "code": "unavailable", "message": message },
            "problems": problems,
        })),
    )
        .into_response()
}

/// What retention has removed and the oldest finished deliveries it kept: keyed lookups only.
async fn retention(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let report = state.ledger.retention_report().await?;
    Ok(Json(crate::retention::RetentionView::of(
        &state.cfg.retention,
        report,
        &state.metrics.retention,
    )))
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let text = crate::metrics::scrape(&state.ledger, &state.metrics, state.cfg.breaker).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/healthz` reads atomics only: it answers at once while the writer is held, and says
    /// 503 with the reason before the dispatcher's first turn.
    #[tokio::test]
    async fn healthz_never_waits_behind_the_writer_and_tells_why() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = ledger::sqlite::Ledger::open(&dir.path().join("l.db")).unwrap();
        let health = Health::new(ledger.write_state(), crate::dispatch::Heartbeat::default());
        let state = AppState::new(
            Store::Sqlite(ledger.clone()),
            tokio::sync::mpsc::unbounded_channel().0,
            ApiConfig {
                api_token: "t".repeat(16),
                allow_loopback: false,
                max_event_bytes: 1024,
                rotation_grace_ms: 0,
                retention: Default::default(),
                body_timeout: std::time::Duration::from_secs(1),
                portal_key: vec![7; 32],
                breaker: Default::default(),
                portal_frame_ancestors: "'none'".into(),
            },
            Arc::new(Metrics::new(false)),
            health.clone(),
        );
        let ask = |state: AppState| async move {
            let r =
                tokio::time::timeout(std::time::Duration::from_millis(500), healthz(State(state)))
                    .await
                    .expect("healthz waited");
            let status = r.status().as_u16();
            let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            )
        };
        let (status, body) = ask(state.clone()).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["problems"][0]["code"], "dispatcher_not_running");
        health.heartbeat().beat(now_ms());
        let held = tokio::spawn({
            let ledger = ledger.clone();
            async move {
                ledger
                    .call(|_| {
                        std::thread::sleep(std::time::Duration::from_secs(2));
                        Ok(())
                    })
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (status, body) = ask(state).await;
        assert_eq!(status, 200, "{body}");
        held.await.unwrap().unwrap();
    }

    fn check(body: &str, expected: Result<Vec<(&str, &str)>, &str>) {
        let got = parse_events(body.as_bytes(), 64)
            .map(|(evs, _)| evs.into_iter().map(|e| (e.id, e.body)).collect::<Vec<_>>());
        match (got, expected) {
            (Ok(evs), Ok(exp)) => {
                let exp: Vec<(String, String)> = exp
                    .into_iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect();
                assert_eq!(evs, exp, "{body}");
            }
            (Err(e), Err(code)) => assert_eq!(e.status_and_code().1, code, "{body}: {e}"),
            (got, exp) => panic!("{body}: got {got:?}, expected {exp:?}"),
        }
    }

    #[test]
    fn event_parsing_table() {
        check(
            r#"{"id":"e1","type":"a.b"}"#,
            Ok(vec![("e1", r#"{"id":"e1","type":"a.b"}"#)]),
        );
        check(
            " {\"type\":\"a\", \"id\":\"e1\"} \n",
            Ok(vec![("e1", "{\"type\":\"a\", \"id\":\"e1\"}")]),
        );
        check(
            r#"[{"id":"e1","type":"a"},{"id":"e2","type":"a","x":[1]}]"#,
            Ok(vec![
                ("e1", r#"{"id":"e1","type":"a"}"#),
                ("e2", r#"{"id":"e2","type":"a","x":[1]}"#),
            ]),
        );
        check(r#"{"id":"e1""#, Err("malformed_json"));
        check("", Err("malformed_json"));
        check(r#"{"type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"e1"}"#, Err("invalid_request"));
        check(r#"{"id":7,"type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"","type":"a"}"#, Err("invalid_request"));
        // An event id is sent as the webhook-id header: visible ASCII only.
        check(r#"{"id":"évènement","type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"a b","type":"a"}"#, Err("invalid_request"));
        check(r#"{"id":"e1","type":"a*"}"#, Err("invalid_request"));
        check(r#"[]"#, Err("invalid_request"));
        check(r#"["x"]"#, Err("invalid_request"));
        check(r#"42"#, Err("invalid_request"));
        check(
            &format!(r#"{{"id":"e1","type":"a","pad":"{}"}}"#, "x".repeat(64)),
            Err("too_large"),
        );
        check(
            &format!(
                r#"[{{"id":"e1","type":"a"}},{{"id":"e2","type":"a","pad":"{}"}}]"#,
                "x".repeat(64)
            ),
            Err("too_large"),
        );
    }

    #[test]
    fn subscriber_input_table() {
        let base = || SubscriberInput {
            id: Some("s".into()),
            url: Some("https://example.com/h".into()),
            event_types: Some(vec!["video.*".into()]),
            rate_per_sec: Some(10.0),
            ..Default::default()
        };
        let cases: Vec<(&str, SubscriberInput, Result<(), &str>)> = vec![
            ("ok", base(), Ok(())),
            (
                "no id",
                SubscriberInput { id: None, ..base() },
                Err("invalid_request"),
            ),
            (
                "no url",
                SubscriberInput {
                    url: None,
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "http refused",
                SubscriberInput {
                    url: Some("http://example.com/h".into()),
                    ..base()
                },
                Err("invalid_url"),
            ),
            (
                "private ip",
                SubscriberInput {
                    url: Some("https://10.1.2.3/h".into()),
                    ..base()
                },
                Err("invalid_url"),
            ),
            (
                "not a url",
                SubscriberInput {
                    url: Some("nope".into()),
                    ..base()
                },
                Err("invalid_url"),
            ),
            (
                "zero rate",
                SubscriberInput {
                    rate_per_sec: Some(0.0),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "negative rate",
                SubscriberInput {
                    rate_per_sec: Some(-3.0),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "zero burst",
                SubscriberInput {
                    burst: Some(0),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "zero in flight",
                SubscriberInput {
                    max_in_flight: Some(0),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "no types",
                SubscriberInput {
                    event_types: Some(vec![]),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "bad pattern",
                SubscriberInput {
                    event_types: Some(vec!["vid*".into()]),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "bad secret",
                SubscriberInput {
                    secret: Some("hunter2".into()),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "created disabled",
                SubscriberInput {
                    disabled: Some(true),
                    ..base()
                },
                Err("invalid_request"),
            ),
            (
                "created enabled, said so",
                SubscriberInput {
                    disabled: Some(false),
                    ..base()
                },
                Ok(()),
            ),
        ];
        for (name, input, expected) in cases {
            let got = subscriber_from(input, false, 0)
                .map(|_| ())
                .map_err(|e| e.status_and_code().1);
            assert_eq!(got, expected, "{name}");
        }
        let (s, _) = subscriber_from(base(), false, 0).unwrap();
        assert_eq!(
            (s.limits.burst, s.limits.max_in_flight, s.lane),
            (10, DEFAULT_MAX_IN_FLIGHT, Lane::Auto)
        );
        let p = patched(
            s.clone(),
            SubscriberInput {
                rate_per_sec: Some(-1.0),
                ..Default::default()
            },
            false,
            1,
            &Principal::Admin,
        );
        assert!(p.is_err());
        // Disable, then re-enable: a fresh start.
        let toggle = |d: bool| SubscriberInput {
            disabled: Some(d),
            ..Default::default()
        };
        let off = patched(s.clone(), toggle(true), false, 5, &Principal::Admin).unwrap();
        let d = off.health.disabled.clone().unwrap();
        assert_eq!((d.at_ms, d.reason.as_str()), (5, "disabled by an operator"));
        let again = patched(off.clone(), toggle(true), false, 9, &Principal::Admin).unwrap();
        assert_eq!(again.health.disabled.map(|d| d.at_ms), Some(5));
        assert!(d.by_operator);
        // The customer pauses and resumes its own endpoint, but does not re-enable one the
        // operator disabled.
        let customer = Principal::Portal {
            customer: "acme".into(),
        };
        let paused = patched(s.clone(), toggle(true), false, 5, &customer).unwrap();
        assert!(!paused.health.disabled.as_ref().unwrap().by_operator);
        let resumed = patched(paused, toggle(false), false, 6, &customer).unwrap();
        assert_eq!(resumed.health.disabled, None);
        assert!(matches!(
            patched(off.clone(), toggle(false), false, 6, &customer),
            Err(ApiError::Forbidden(_))
        ));
        let mut failing = off;
        failing.health.failing_since_ms = Some(2);
        let on = patched(failing, toggle(false), false, 6, &Principal::Admin).unwrap();
        assert_eq!(on.health, Default::default());
        let mut enabled_failing = s;
        enabled_failing.health.failing_since_ms = Some(2);
        let still = patched(enabled_failing, toggle(false), false, 6, &Principal::Admin).unwrap();
        assert_eq!(still.health.failing_since_ms, Some(2));
    }

    #[test]
    fn test_events_are_valid_events_of_their_type() {
        let e = test_event("sub_a", 1_700, [0xab; 8]);
        assert_eq!(e.id, "evt_test_1700_abababababababab");
        validate_event_id("id", &e.id).unwrap();
        let (parsed, _) = parse_events(e.body.as_bytes(), 64 * 1024).unwrap();
        assert_eq!(
            (parsed[0].id.as_str(), parsed[0].event_type.as_str()),
            (e.id.as_str(), TEST_EVENT_TYPE)
        );
        let body: serde_json::Value = serde_json::from_str(&e.body).unwrap();
        assert_eq!(body["data"]["subscriber"], "sub_a");
        assert_ne!(test_event("sub_a", 1_700, [1; 8]).id, e.id);
    }

    #[test]
    fn filter_table() {
        let q = |status: Option<&str>, since: Option<&str>| DeliveryQuery {
            status: status.map(Into::into),
            since: since.map(|s| serde_json::Value::String(s.into())),
            ..Default::default()
        };
        assert_eq!(
            filter_from(q(Some("dead"), None)).unwrap().status,
            Some(Status::Dead)
        );
        assert!(filter_from(q(Some("lost"), None)).is_err());
        assert_eq!(
            filter_from(q(None, Some("1970-01-01T00:00:01Z")))
                .unwrap()
                .since_ms,
            Some(1000)
        );
        assert_eq!(
            filter_from(q(None, Some("1500"))).unwrap().since_ms,
            Some(1500)
        );
        assert!(filter_from(q(None, Some("soon"))).is_err());
        assert_eq!(filter_from(q(None, None)).unwrap().limit, 1000);
    }
}
