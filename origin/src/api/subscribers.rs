//! `/v1/subscribers`: create, list, read, change, delete a subscriber, rotate its secret, read
//! its secrets, and send it a test event. Each handler parses (`super::subscriber_input`,
//! pure), applies one ledger operation within the caller's scope, then tells the dispatcher
//! what changed. It does not deliver anything.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use fanout_core::sign::Secret;
use serde_json::json;
use std::collections::HashMap;

use super::auth::Principal;
use super::body::{parse_json, read_body, MAX_ADMIN_BYTES};
use super::error::ApiError;
use super::extract::PathId;
use super::state::AppState;
use super::stats;
use super::subscriber_input::{patched, subscriber_from, SubscriberInput, SubscriberPatch};
use super::views;
use crate::dispatch::Control;
use crate::keyring::{new_signing_key, NewSecret};
use crate::ledger::{Deliveries as _, Subscribers as _};
use crate::ledger::{LedgerError, NewEvent};
use crate::model::{public_key_of, SecretsView, SubscriberView};
use crate::time::{now_ms, random_bytes};

fn random<const N: usize>() -> Result<[u8; N], ApiError> {
    random_bytes::<N>()
        .map_err(|e| ApiError::Ledger(LedgerError::Invalid(format!("no randomness: {e}"))))
}

/// A new generation of keys: the given or a random HMAC secret, and a random Ed25519 signing
/// key (made for every subscriber, so a later switch of scheme needs no new key).
fn new_secret(given: Option<String>) -> Result<NewSecret, ApiError> {
    let secret = match given {
        Some(s) => s,
        None => Secret::from_bytes(&random::<32>()?)
            .map(|s| s.encode())
            .map_err(|e| ApiError::Invalid(e.to_string()))?,
    };
    Ok(NewSecret {
        secret,
        signing_key: Some(new_signing_key(&random::<32>()?)),
    })
}

fn unknown_subscriber(e: LedgerError, id: &str) -> ApiError {
    match e {
        LedgerError::NotFound(_) => ApiError::UnknownSubscriber(format!("no subscriber {id}")),
        other => ApiError::Ledger(other),
    }
}

pub(super) async fn create_subscriber(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, MAX_ADMIN_BYTES).await?;
    let input: SubscriberInput = parse_json(&bytes)?;
    let now = now_ms();
    let (sub, given) = subscriber_from(input, state.cfg.allow_loopback, now)?;
    let secret = new_secret(given)?;
    let shown = secret.secret.clone();
    let created = state.ledger.create_subscriber(sub, secret).await?;
    state.tell(Control::Changed(created.id.clone()));
    Ok((
        StatusCode::CREATED,
        NO_STORE,
        Json(SubscriberView::of(&created, now, Some(shown))),
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
) -> Result<Vec<stats::ViewWithStats>, LedgerError> {
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

pub(super) async fn list_subscribers(
    State(state): State<AppState>,
    who: Principal,
    Query(q): Query<HashMap<String, String>>,
) -> Result<impl IntoResponse, ApiError> {
    let views = subscribers_with_stats(&state, &who, None, stats::wants_stats(&q)?).await?;
    Ok(Json(views::SubscriberList { subscribers: views }))
}

pub(super) async fn get_subscriber(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
    Query(q): Query<HashMap<String, String>>,
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

pub(super) async fn patch_subscriber(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, MAX_ADMIN_BYTES).await?;
    let input: SubscriberPatch = parse_json(&bytes)?;
    who.may_patch(&input.fields())?;
    let allow_loopback = state.cfg.allow_loopback;
    let now = now_ms();
    let scope = who.scope();
    // Drawn here, used only if the switch finds the current secret without a signing key.
    let seed = match input.signature {
        Some(scheme) if scheme.ed25519() => Some(random::<32>()?),
        _ => None,
    };
    let sub = state
        .ledger
        .update_subscriber(id.clone(), scope, move |current| {
            let toggled = input.disabled.is_some();
            patched(current, input, allow_loopback, now, &who, seed.as_ref())
                .map(|next| (next, toggled))
        })
        .await
        .map_err(|e| unknown_subscriber(e, &id))??;
    state.tell(Control::Changed(id));
    Ok(Json(SubscriberView::of(&sub, now, None)))
}

pub(super) async fn delete_subscriber(
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

pub(super) async fn rotate_secret(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    let secret = new_secret(None)?;
    let (shown, public_key) = (
        secret.secret.clone(),
        secret.signing_key.as_deref().and_then(public_key_of),
    );
    let grace = state.cfg.rotation_grace_ms;
    let scope = who.scope();
    state
        .ledger
        .rotate_secret(id.clone(), secret, now, grace, scope)
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    state.tell(Control::Changed(id.clone()));
    Ok((
        NO_STORE,
        Json(views::Rotated {
            id,
            secret: shown,
            public_key,
            previous_secrets_expire_at_ms: now + grace,
        }),
    ))
}

/// `GET /v1/subscribers/{id}/secret`: the secrets that sign its deliveries now, newest first,
/// a rotated-out one with the end of its grace period.
pub(super) async fn get_secrets(
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

/// How many held keys `GET /v1/subscribers/{id}/held` lists (the first, in key order).
const HELD_KEYS_LISTED: usize = 100;

/// `GET /v1/subscribers/{id}/held`: its ordered keys that hold deliveries back
/// (`crate::ordering`), each with its head (why), since when, how many wait and which goes
/// next; the first 100 in key order (`truncated` when there may be more).
pub(super) async fn get_held(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let keys = state
        .ledger
        .held_keys(id.clone(), HELD_KEYS_LISTED + 1, who.scope())
        .await
        .map_err(|e| unknown_subscriber(e, &id))?;
    let truncated = keys.len() > HELD_KEYS_LISTED;
    let keys: Vec<_> = keys.into_iter().take(HELD_KEYS_LISTED).collect();
    Ok(Json(json!({ "keys": keys, "truncated": truncated })))
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
        traceparent: None,
    }
}

/// `POST /v1/subscribers/{id}/test`: one `fanout.test` event delivered to this subscriber
/// alone, through the usual queue (signed, rate-limited, retried, visible in its deliveries).
pub(super) async fn send_test(
    State(state): State<AppState>,
    who: Principal,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    let random = random_bytes::<8>()
        .map_err(|e| ApiError::Ledger(LedgerError::Invalid(format!("no randomness: {e}"))))?;
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

#[cfg(test)]
mod tests {
    use super::super::events::parse_events;
    use super::*;
    use crate::model::validate_event_id;

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
}
