//! `POST /v1/customers/{id}/portal`, which issues a link to that customer's portal (a signed
//! token in the URL's fragment), and `POST /v1/customers/{id}/portal/revoke`, which ends every
//! link issued so far. Admin token only. It does not serve the portal page (`crate::portal`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::body::{parse_json_or_default, read_body};
use super::customers::{nonce, unknown};
use super::error::ApiError;
use super::extract::PathId;
use super::state::AppState;
use crate::customer::PortalLink;
use crate::ledger::Customers as _;
use crate::portal::token;
use crate::time::now_ms;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/customers/{id}/portal", post(portal_link))
        .route("/v1/customers/{id}/portal/revoke", post(revoke_links))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalInput {
    ttl_secs: Option<u64>,
}

pub(super) async fn portal_link(
    State(state): State<AppState>,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, 4 * 1024).await?;
    let input: PortalInput = parse_json_or_default(&bytes)?;
    let ttl = token::ttl_secs(input.ttl_secs).map_err(ApiError::Invalid)?;
    let cu = state
        .ledger
        .customer(id.clone())
        .await
        .map_err(|e| unknown(e, &id))?;
    let expires_at_ms = now_ms() + (ttl as i64) * 1000;
    let t = token::sign(
        &state.cfg.portal_key,
        &token::Claims {
            customer: cu.id,
            nonce: cu.portal_nonce,
            expires_ms: expires_at_ms,
        },
    );
    // The token travels in the fragment: browsers never send it to a server. The host is the
    // configured one (`--public-url`), never the request's `Host`: a caller cannot make the
    // daemon hand out links to a host of its choosing.
    let url = format!("{}/portal#token={t}", state.cfg.public_url);
    Ok((
        StatusCode::CREATED,
        Json(PortalLink {
            url,
            token: t,
            expires_at_ms,
        }),
    ))
}

/// End every portal link issued for this customer so far (401 from then on); links issued
/// afterwards work.
pub(super) async fn revoke_links(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let now = now_ms();
    state
        .ledger
        .revoke_portal_links(id.clone(), nonce()?, now)
        .await
        .map_err(|e| unknown(e, &id))?;
    Ok(Json(json!({ "id": id, "links_revoked_at_ms": now })))
}
