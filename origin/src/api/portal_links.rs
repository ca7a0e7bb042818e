//! `POST /v1/customers/{id}/portal`, which issues a link to that customer's portal (a signed
//! token in the URL's fragment), and `POST /v1/customers/{id}/portal/revoke`, which ends every
//! link issued so far. Admin token only. It does not serve the portal page (`crate::portal`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
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

/// Where the portal page is, as the caller reached this daemon: its `Host`, and https when a
/// proxy in front says so (`X-Forwarded-Proto`).
fn portal_base(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        })
        .unwrap_or("localhost");
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    format!("{}://{host}", if https { "https" } else { "http" })
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
    // The token travels in the fragment: browsers never send it to a server.
    let url = format!("{}/portal#token={t}", portal_base(&headers));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portal_base_table() {
        let h = |pairs: &[(&'static str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, v.parse().unwrap());
            }
            m
        };
        assert_eq!(
            portal_base(&h(&[("host", "127.0.0.1:8080")])),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            portal_base(&h(&[
                ("host", "hooks.example.com"),
                ("x-forwarded-proto", "https")
            ])),
            "https://hooks.example.com"
        );
        assert_eq!(
            portal_base(&h(&[("host", "evil.com/x?")])),
            "http://localhost"
        );
        assert_eq!(portal_base(&h(&[])), "http://localhost");
    }
}
