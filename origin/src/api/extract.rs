//! Extractors whose rejections are the API's JSON errors (axum's own answer in plain text).

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

use super::error::ApiError;

/// The `{id}` of a route. A malformed one (percent-encoded bytes that are not UTF-8) is an
/// `invalid_request`, not axum's plain-text 400.
#[derive(Debug)]
pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(id)| PathId(id))
            .map_err(|e| ApiError::Invalid(e.body_text()))
    }
}
