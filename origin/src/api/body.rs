//! Reading a request body: its size limit, its arrival deadline, and JSON into a type with
//! the API's errors. It does not know any route.

use axum::body::Body;
use axum::http::{header, HeaderMap};
use serde::Deserialize;

use super::error::ApiError;
use super::state::ApiConfig;

/// Largest request body of any kind (a batch of events).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Largest body of an administrative call (a subscriber, a customer, a replay filter).
pub const MAX_ADMIN_BYTES: usize = 64 * 1024;

/// The body, at most `limit` bytes, arrived within the configured time.
pub async fn read_body(
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

/// A JSON body as `T`: a syntax error is `malformed_json`, the wrong shape `invalid_request`.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::from_json(&e))
}

/// Like [`parse_json`], but an empty (or all-whitespace) body is `T::default()`.
pub fn parse_json_or_default<T: serde::de::DeserializeOwned + Default>(
    bytes: &[u8],
) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        Ok(T::default())
    } else {
        parse_json(bytes)
    }
}

/// For a field where `null` means "clear": `Some(value)` when present, `null` included
/// (`Some(None)`); with `#[serde(default)]`, an absent field is `None`.
pub fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}
