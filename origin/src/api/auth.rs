//! Who is calling, and what they may do: the one place the API decides it.
//!
//! [`authenticate`] turns the bearer token into a [`Principal`]: the admin token is
//! [`Principal::Admin`]; a portal token (`crate::portal::token`) whose signature, expiry and
//! customer nonce check out is [`Principal::Portal`]. It then asks [`Principal::may_call`] about
//! the route (403 when not allowed) and hands the principal to the handler, which passes
//! [`Principal::scope`] to the ledger's operations: those check it in the transaction that acts
//! (`crate::ledger::store`), so a portal token's calls about another customer's (or no
//! customer's) subscribers and deliveries answer 404, exactly as for ids that do not exist.

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;
use crate::ledger::{self, Customers as _};
use crate::portal::token;
use crate::time::now_ms;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The API token: every route, everything.
    Admin,
    /// A portal link's token: its customer's subscribers and deliveries, a few routes.
    Portal { customer: String },
}

/// The routes a portal token may call (the manual's list: docs/src/customers.md, "What a
/// portal token may do"). Everything else answers 403: creating and removing endpoints, the
/// stored secrets (`GET …/secret`; the portal sees a new secret once, in the rotation's answer),
/// test events (`POST …/test`), ingest, customers and their links, retention and the outbox
/// are the operator's.
const PORTAL_ROUTES: &[(Method, &str)] = &[
    (Method::GET, "/v1/subscribers"),
    (Method::GET, "/v1/subscribers/{id}"),
    (Method::PATCH, "/v1/subscribers/{id}"),
    (Method::POST, "/v1/subscribers/{id}/rotate-secret"),
    (Method::GET, "/v1/subscribers/{id}/held"),
    (Method::GET, "/v1/deliveries"),
    (Method::GET, "/v1/deliveries/{id}"),
    (Method::POST, "/v1/deliveries/{id}/replay"),
    (Method::POST, "/v1/replay"),
    (Method::POST, "/v1/filters/test"),
    (Method::GET, "/v1/series"),
];

/// The subscriber fields a portal token may change (the manual: docs/src/customers.md): pause
/// and resume, its own filter (which narrows the operator's `filter`, never widens it: that one
/// is the operator's), the signature scheme its receiver verifies, and batching.
const PORTAL_PATCHABLE: &[&str] = &["disabled", "customer_filter", "signature", "batch"];

impl Principal {
    /// May this principal call `method` on the route `route` (the router's pattern)?
    pub fn may_call(&self, method: &Method, route: &str) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Portal { .. } => PORTAL_ROUTES
                .iter()
                .any(|(m, r)| m == method && *r == route),
        }
    }

    /// The customer every read and change is limited to (`None`: no limit): the `scope` the
    /// ledger's operations take (`crate::ledger::store`), which act only on what it sees
    /// (`crate::customer::sees`).
    pub fn scope(&self) -> Option<String> {
        match self {
            Principal::Admin => None,
            Principal::Portal { customer } => Some(customer.clone()),
        }
    }

    /// May this principal change these subscriber fields (the names a PATCH body sets)?
    pub fn may_patch(&self, fields: &[&str]) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            Principal::Portal { .. } => match fields.iter().find(|f| !PORTAL_PATCHABLE.contains(f))
            {
                Some(f) => Err(ApiError::Forbidden(format!(
                    "a portal link may only pause and resume an endpoint (\"disabled\"), set \
                     its own filter (\"customer_filter\"), its signature scheme \
                     (\"signature\") and its batching (\"batch\"), not change {f:?}"
                ))),
                None => Ok(()),
            },
        }
    }

    /// Who changed a subscriber, for its `disabled_reason`.
    pub fn actor(&self) -> &'static str {
        match self {
            Principal::Admin => "an operator",
            Principal::Portal { .. } => "the customer",
        }
    }

    /// Is this the operator (the admin token)?
    pub fn is_operator(&self) -> bool {
        matches!(self, Principal::Admin)
    }
}

/// Whether `given` is `expected`, in time that depends on neither (their lengths included):
/// the SHA-256 digests of both are compared with `subtle`, so an early exit can tell a caller
/// nothing about the token's length or its first differing byte.
pub fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    Sha256::digest(given)
        .ct_eq(&Sha256::digest(expected))
        .into()
}

/// The token of an `Authorization: Bearer <token>` header: the scheme is case-insensitive
/// (RFC 9110, 11.1) and followed by one or more spaces; `None` for any other scheme or an
/// empty token.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim_start().split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

async fn principal_of(state: &AppState, bearer: &str) -> Result<Principal, ApiError> {
    if token_matches(bearer.as_bytes(), state.cfg.api_token.as_bytes()) {
        return Ok(Principal::Admin);
    }
    if !bearer.starts_with(token::PREFIX) {
        return Err(ApiError::Unauthorized);
    }
    let claims = token::verify(&state.cfg.portal_key, bearer, now_ms())
        .map_err(|e| ApiError::PortalToken(e.to_string()))?;
    let current = match state.ledger.customer(claims.customer.clone()).await {
        Ok(cu) => Some(cu.portal_nonce),
        Err(ledger::LedgerError::NotFound(_)) => None,
        Err(e) => return Err(e.into()),
    };
    match current {
        Some(nonce) if token_matches(nonce.as_bytes(), claims.nonce.as_bytes()) => {
            Ok(Principal::Portal {
                customer: claims.customer,
            })
        }
        _ => Err(ApiError::PortalToken(
            "the portal link's customer no longer exists".into(),
        )),
    }
}

/// The `/v1` middleware: authenticate, authorize the route, hand the principal on.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(str::to_string);
    let Some(bearer) = bearer else {
        return ApiError::Unauthorized.into_response();
    };
    let principal = match principal_of(&state, &bearer).await {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    if !principal.may_call(req.method(), &route) {
        return ApiError::Forbidden(format!(
            "a portal link cannot call {} {route}",
            req.method()
        ))
        .into_response();
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(token_matches(b"secret-token", b"secret-token"));
        assert!(!token_matches(b"secret-tokem", b"secret-token"));
        assert!(!token_matches(b"secret", b"secret-token"));
        assert!(!token_matches(b"", b"secret-token"));
        assert!(!token_matches(b"secret-token-and-more", b"secret-token"));
        assert!(token_matches(b"", b""));
    }

    #[test]
    fn bearer_table() {
        let rows: &[(&str, Option<&str>)] = &[
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER abc", Some("abc")),
            ("Bearer   abc  ", Some("abc")),
            ("Bearer", None),
            ("Bearer ", None),
            ("Bearerabc", None),
            ("Basic abc", None),
            ("abc", None),
        ];
        for (header, token) in rows {
            assert_eq!(bearer_token(header), *token, "{header:?}");
        }
    }

    #[test]
    fn route_table() {
        let portal = Principal::Portal {
            customer: "acme".into(),
        };
        let cases: &[(Method, &str, bool)] = &[
            (Method::GET, "/v1/subscribers", true),
            (Method::POST, "/v1/subscribers", false),
            (Method::GET, "/v1/subscribers/{id}", true),
            (Method::PATCH, "/v1/subscribers/{id}", true),
            (Method::DELETE, "/v1/subscribers/{id}", false),
            (Method::POST, "/v1/subscribers/{id}/rotate-secret", true),
            (Method::GET, "/v1/subscribers/{id}/secret", false),
            (Method::POST, "/v1/subscribers/{id}/test", false),
            (Method::GET, "/v1/deliveries", true),
            (Method::GET, "/v1/deliveries/{id}", true),
            (Method::POST, "/v1/deliveries/{id}/replay", true),
            (Method::POST, "/v1/replay", true),
            (Method::POST, "/v1/filters/test", true),
            (Method::GET, "/v1/subscribers/{id}/held", true),
            (Method::GET, "/v1/series", true),
            (Method::GET, "/v1/retention", false),
            (Method::GET, "/v1/outbox", false),
            (Method::POST, "/v1/events", false),
            (Method::GET, "/v1/customers", false),
            (Method::POST, "/v1/customers", false),
            (Method::GET, "/v1/customers/{id}", false),
            (Method::PATCH, "/v1/customers/{id}", false),
            (Method::DELETE, "/v1/customers/{id}", false),
            (Method::POST, "/v1/customers/{id}/portal", false),
            (Method::POST, "/v1/customers/{id}/portal/revoke", false),
            (Method::GET, "", false),
        ];
        for (m, route, ok) in cases {
            assert_eq!(portal.may_call(m, route), *ok, "portal {m} {route}");
            assert!(Principal::Admin.may_call(m, route), "admin {m} {route}");
        }
    }

    #[test]
    fn scope_table() {
        let portal = Principal::Portal {
            customer: "acme".into(),
        };
        assert_eq!(portal.scope().as_deref(), Some("acme"));
        assert_eq!(Principal::Admin.scope(), None);
        assert!(portal
            .may_patch(&["disabled", "customer_filter", "signature", "batch"])
            .is_ok());
        assert!(portal.may_patch(&[]).is_ok());
        // The operator's filter is the operator's: a portal token neither sets nor clears it.
        for f in [
            "filter",
            "url",
            "rate_per_sec",
            "customer",
            "event_types",
            "secret",
            "payload",
            "ordering",
            "ordering_key",
            "propagate_trace",
            "lane",
            "legacy_signature",
            "max_in_flight",
            "burst",
            "timeout_ms",
            "id",
        ] {
            assert!(
                matches!(
                    portal.may_patch(&["disabled", f]),
                    Err(ApiError::Forbidden(_))
                ),
                "{f}"
            );
            assert!(Principal::Admin.may_patch(&[f]).is_ok());
        }
    }
}
