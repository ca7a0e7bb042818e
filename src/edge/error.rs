//! The Worker's errors and their single conversion to a JSON HTTP response.

use worker::Response;

use crate::wire::{BatchError, ErrorBody};

/// When to call again after a 503 `object_unavailable` (the origin keeps the batch pending and
/// retries it with its own backoff; no attempt is spent).
const OBJECT_RETRY_AFTER_SECS: &str = "1";

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("signature check failed: {0}")]
    Unauthorized(String),
    #[error("method not allowed; use {0}")]
    MethodNotAllowed(&'static str),
    #[error("no such route")]
    NotFound,
    #[error("{0}")]
    TooLarge(String),
    #[error("content-type must be application/json")]
    UnsupportedMediaType,
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("edge misconfigured: {0}")]
    Misconfigured(String),
    #[error("the subscriber's Durable Object is unavailable (overloaded, reset or unreachable); retry: {0}")]
    ObjectUnavailable(worker::Error),
    #[error("internal error: {0}")]
    Runtime(#[from] worker::Error),
    #[error("edge misconfigured: {0}")]
    Limits(#[from] crate::edge_limits::LimitError),
}

impl EdgeError {
    fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            EdgeError::Unauthorized(_) => (401, "unauthorized"),
            EdgeError::MethodNotAllowed(_) => (405, "method_not_allowed"),
            EdgeError::NotFound => (404, "not_found"),
            EdgeError::TooLarge(_) => (413, "too_large"),
            EdgeError::UnsupportedMediaType => (415, "unsupported_media_type"),
            EdgeError::Batch(BatchError::TooLarge(_)) => (413, "too_large"),
            EdgeError::Batch(b) => (400, b.code()),
            EdgeError::Misconfigured(_) | EdgeError::Limits(_) => (500, "misconfigured"),
            EdgeError::ObjectUnavailable(_) => (503, "object_unavailable"),
            EdgeError::Runtime(_) => (500, "internal"),
        }
    }

    pub fn into_response(self) -> worker::Result<Response> {
        let (status, code) = self.status_and_code();
        if status >= 500 {
            worker::console_error!("{{\"error\":\"{code}\"}}");
        }
        let mut resp =
            Response::from_json(&ErrorBody::new(code, self.to_string()))?.with_status(status);
        if let EdgeError::MethodNotAllowed(allow) = self {
            resp.headers_mut().set("allow", allow)?;
        }
        if status == 503 {
            resp.headers_mut()
                .set("retry-after", OBJECT_RETRY_AFTER_SECS)?;
        }
        Ok(resp)
    }
}
