//! The admin console: one static page, its script and its style sheet, embedded in the binary
//! (no build step). The page signs in with the API token and calls the JSON API like any
//! other client; nothing here reads the ledger. Every response carries a strict CSP (no
//! inline script or style, same-origin only) and refuses to be framed.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("index.html");
const CONSOLE_JS: &str = include_str!("console.js");
const CONSOLE_CSS: &str = include_str!("console.css");

/// The console's Content-Security-Policy: scripts, styles and API calls from this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; form-action 'none'; base-uri 'none'; \
     frame-ancestors 'none'";

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
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
