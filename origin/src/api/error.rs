//! The API's one error type and its one conversion to an HTTP response:
//! `{"error":{"code","message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fanout_core::wire::ErrorBody;

use crate::health::Problem;
use crate::ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// A portal token that is not (or no longer) valid.
    #[error("{0}")]
    PortalToken(String),
    /// A valid token that may not do this (a portal link outside its routes or fields).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    UnknownCustomer(String),
    #[error("{0}")]
    Malformed(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnknownSubscriber(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    InvalidUrl(String),
    #[error("{0}")]
    Timeout(String),
    /// Every connection slot is taken (the server's reserve answers `/healthz` only).
    #[error("{0}")]
    Busy(String),
    /// Too many calls of a rate-limited route (`POST /v1/filters/test`); ask again after.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_ms: i64,
    },
    #[error("method not allowed")]
    MethodNotAllowed,
    /// `/healthz`'s answer when the daemon cannot do its work: every reason, with its code.
    #[error("{}", unhealthy_message(.0))]
    Unhealthy(Vec<Problem>),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl ApiError {
    /// A JSON body that failed to parse: syntax errors are `malformed_json`, well-formed JSON
    /// of the wrong shape is `invalid_request`.
    pub fn from_json(e: &serde_json::Error) -> ApiError {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::Malformed(format!("malformed JSON: {e}"))
            }
            Category::Data => ApiError::Invalid(format!("invalid request: {e}")),
        }
    }

    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized | ApiError::PortalToken(_) => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::UnknownCustomer(_) => (StatusCode::NOT_FOUND, "unknown_customer"),
            ApiError::Malformed(_) => (StatusCode::BAD_REQUEST, "malformed_json"),
            ApiError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            ApiError::UnknownSubscriber(_) => (StatusCode::NOT_FOUND, "unknown_subscriber"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::InvalidUrl(_) => (StatusCode::BAD_REQUEST, "invalid_url"),
            ApiError::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Unhealthy(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Ledger(LedgerError::NotFound(_)) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Ledger(LedgerError::Conflict(_)) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Ledger(LedgerError::Invalid(_)) => {
                (StatusCode::BAD_REQUEST, "invalid_request")
            }
            ApiError::Ledger(LedgerError::TooSoon { .. }) => {
                (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
            }
            ApiError::Ledger(LedgerError::Unavailable(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            ApiError::Ledger(LedgerError::Driver(e)) if e.is_unreachable() => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            ApiError::Ledger(LedgerError::Driver(e)) if e.is_refused() => {
                (StatusCode::UNPROCESSABLE_ENTITY, "ledger_refused")
            }
            ApiError::Ledger(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Unhealthy(problems) = &self {
            // The usual error, with the status and every reason beside it (no Retry-After:
            // a probe asks again on its own schedule).
            let body = serde_json::json!({
                "status": "unavailable",
                "error": { "code": code, "message": self.to_string() },
                "problems": problems,
            });
            return (status, Json(body)).into_response();
        }
        let message = match &self {
            ApiError::Ledger(
                LedgerError::NotFound(m)
                | LedgerError::Conflict(m)
                | LedgerError::Invalid(m)
                | LedgerError::TooSoon { message: m, .. },
            ) => m.clone(),
            ApiError::Ledger(LedgerError::Unavailable(why)) => {
                format!("the ledger cannot write ({why}); nothing of this request was kept, retry later")
            }
            ApiError::Ledger(LedgerError::Driver(e)) if e.is_unreachable() => {
                format!("the ledger cannot be reached ({e}); nothing of this request was kept, retry later")
            }
            ApiError::Ledger(LedgerError::Driver(e)) if e.is_refused() => {
                format!("the ledger refuses this request ({e}); nothing of it was kept, and the same request would be refused again")
            }
            ApiError::Ledger(e) => {
                tracing::error!(error = %e, "ledger failure while serving a request");
                "internal error".to_string()
            }
            other => other.to_string(),
        };
        let retry_after_secs = match &self {
            ApiError::Ledger(LedgerError::TooSoon { retry_after_ms, .. })
            | ApiError::RateLimited { retry_after_ms, .. } => {
                Some(retry_after_ms.saturating_add(999).div_euclid(1000).max(1))
            }
            _ => None,
        };
        let mut response = (status, Json(ErrorBody::new(code, message))).into_response();
        if let Some(secs) = retry_after_secs {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

/// The reasons of an [`ApiError::Unhealthy`] in one line.
fn unhealthy_message(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rate-limited call: 429 `rate_limited`, and `Retry-After` in whole seconds, rounded up.
    #[test]
    fn rate_limited_answers_429_with_retry_after() {
        for (ms, secs) in [(1, "1"), (500, "1"), (1000, "1"), (1001, "2")] {
            let r = ApiError::RateLimited {
                message: "too many".into(),
                retry_after_ms: ms,
            }
            .into_response();
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                r.headers()
                    .get(axum::http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
                Some(secs),
                "{ms} ms"
            );
        }
    }
}
