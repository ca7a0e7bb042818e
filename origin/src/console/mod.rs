//! The admin console: one static page, its script and its style sheet, embedded in the binary
//! (no build step), with the helpers it shares with the portal (`crate::pages`, `/common.js`).
//! The page signs in with the API token and calls the JSON API like any
//! other client; nothing here reads the ledger. Every response carries a strict CSP (no
//! inline script or style, same-origin only) and refuses to be framed.

use axum::http::HeaderValue;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::pages;

const INDEX_HTML: &str = include_str!("index.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");

/// `/`, `/console.js` and `/console.css`, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", CONSOLE_JS) }),
        )
        .route(
            "/console.css",
            get(|| async { asset("text/css; charset=utf-8", CONSOLE_CSS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    pages::asset(
        content_type,
        body,
        HeaderValue::from_static(pages::UNFRAMED_CSP),
        false,
    )
}
