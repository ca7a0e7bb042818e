//! What the console's and the portal's pages share: their common script (`common.js`: the
//! element builder, the API call, messages, time formatting, status badges), served once at
//! `/common.js`, the charts (`charts.js` over the vendored uPlot, `vendor/`, pinned, MIT), and the headers every page asset carries. It holds no page of its own and
//! reads no ledger. The pages' Content-Security-Policy is written here once: the console's
//! may never be framed, the portal's by the origins the operator lists.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const COMMON_JS: &str = include_str!("common.js");
const CHARTS_JS: &str = include_str!("charts.js");
/// uPlot 1.6.32 (MIT), vendored from its npm package's `dist/` unchanged: the charts' library.
const UPLOT_JS: &str = include_str!("vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("vendor/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("vendor/uPlot.LICENSE");

/// The pages' Content-Security-Policy when nobody may frame them: scripts, styles and API
/// calls from this origin only, no inline script or style.
pub const UNFRAMED_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; form-action 'none'; base-uri 'none'; \
     frame-ancestors 'none'";

/// The pages' Content-Security-Policy, framed by `ancestors` (a CSP source list).
pub fn csp(ancestors: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; form-action 'none'; base-uri 'none'; frame-ancestors {ancestors}"
    )
}

/// `/common.js`, `/charts.js` and the vendored uPlot (`/vendor/…`, with its license), for any
/// router state, with the unframed CSP (a script's own CSP governs nothing; the pages that
/// load it keep theirs).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let shared = |content_type: &'static str, body: &'static str| {
        get(move || async move {
            asset(
                content_type,
                body,
                HeaderValue::from_static(UNFRAMED_CSP),
                false,
            )
        })
    };
    const JS: &str = "text/javascript; charset=utf-8";
    Router::new()
        .route("/common.js", shared(JS, COMMON_JS))
        .route("/charts.js", shared(JS, CHARTS_JS))
        .route("/vendor/uPlot.iife.min.js", shared(JS, UPLOT_JS))
        .route(
            "/vendor/uPlot.min.css",
            shared("text/css; charset=utf-8", UPLOT_CSS),
        )
        .route(
            "/vendor/uPlot.LICENSE.txt",
            shared("text/plain; charset=utf-8", UPLOT_LICENSE),
        )
}

/// A static page asset with its type, its CSP, and the headers every page asset carries:
/// no sniffing, no referrer, no cache, and no framing unless `framable`.
pub fn asset(
    content_type: &'static str,
    body: &'static str,
    csp: HeaderValue,
    framable: bool,
) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, csp);
    if !framable {
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_policy_framed_or_not() {
        assert_eq!(csp("'none'"), UNFRAMED_CSP);
        assert!(csp("https://app.example.com").ends_with("frame-ancestors https://app.example.com"));
        assert!(!UNFRAMED_CSP.contains("unsafe-inline"));
    }
}
