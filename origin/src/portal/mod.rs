//! The customer portal: one static page, its script and its style sheet, embedded in the binary
//! (no build step), served at `/portal`, with the helpers it shares with the console
//! (`crate::pages`, `/common.js`). The operator's product gets a link from
//! `POST /v1/customers/{id}/portal`; the page reads its token from the URL fragment (never sent
//! to a server, so never in a log or a Referer), keeps it in memory and sessionStorage (no
//! cookie), and calls the same `/v1` routes as any client with it, scoped to its customer by
//! `crate::api::auth`. Nothing here reads the ledger.
//!
//! Unlike the console, the portal may be framed, by the origins the operator lists
//! (`--portal-frame-ancestors`); by nobody when none are listed.

pub mod token;

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::pages;

const INDEX_HTML: &str = include_str!("index.html");
const PORTAL_JS: &str = include_str!("portal.js");
const PORTAL_CSS: &str = include_str!("portal.css");

/// The `frame-ancestors` source list from the configured origins (pure): each must be an
/// `http(s)://host[:port]` origin (a `*.` host prefix allowed) with no path, or `'self'`. An
/// empty list is `'none'`.
pub fn frame_ancestors(origins: &[String]) -> Result<String, String> {
    let mut out = Vec::new();
    for o in origins.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        if o == "'self'" {
            out.push(o.to_string());
            continue;
        }
        let bad = || {
            format!(
                "--portal-frame-ancestors: {o:?} is not an origin like https://app.example.com \
                 (scheme and host, an optional port, no path)"
            )
        };
        let (scheme, rest) = o.split_once("://").ok_or_else(bad)?;
        if !matches!(scheme, "http" | "https") {
            return Err(bad());
        }
        let host_port = rest.strip_suffix('/').unwrap_or(rest);
        let host = host_port
            .rsplit_once(':')
            .filter(|(_, p)| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            .map_or(host_port, |(h, _)| h);
        let host = host.strip_prefix("*.").unwrap_or(host);
        let valid_host = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
        if !valid_host {
            return Err(bad());
        }
        out.push(format!("{scheme}://{host_port}"));
    }
    Ok(if out.is_empty() {
        "'none'".into()
    } else {
        out.join(" ")
    })
}

/// `/portal`, `/portal.js` and `/portal.css`, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>(ancestors: &str) -> Router<S> {
    let framable = ancestors != "'none'";
    let csp: Arc<HeaderValue> = Arc::new(
        HeaderValue::from_str(&pages::csp(ancestors))
            .unwrap_or_else(|_| HeaderValue::from_static("frame-ancestors 'none'")),
    );
    let serve = move |content_type: &'static str, body: &'static str| {
        let csp = csp.clone();
        get(move || async move { asset(content_type, body, &csp, framable) })
    };
    Router::new()
        .route("/portal", serve("text/html; charset=utf-8", INDEX_HTML))
        .route(
            "/portal.js",
            serve("text/javascript; charset=utf-8", PORTAL_JS),
        )
        .route("/portal.css", serve("text/css; charset=utf-8", PORTAL_CSS))
}

fn asset(
    content_type: &'static str,
    body: &'static str,
    csp: &HeaderValue,
    framable: bool,
) -> Response {
    pages::asset(content_type, body, csp.clone(), framable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_ancestors_table() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let cases: Vec<(Vec<String>, Result<&str, ()>)> = vec![
            (s(&[]), Ok("'none'")),
            (s(&[""]), Ok("'none'")),
            (
                s(&["https://app.example.com"]),
                Ok("https://app.example.com"),
            ),
            (
                s(&["https://app.example.com/", "http://localhost:3000"]),
                Ok("https://app.example.com http://localhost:3000"),
            ),
            (s(&["https://*.example.com"]), Ok("https://*.example.com")),
            (s(&["'self'"]), Ok("'self'")),
            (s(&["app.example.com"]), Err(())),
            (s(&["https://app.example.com/path"]), Err(())),
            (s(&["javascript://x"]), Err(())),
            (s(&["https://a.com; script-src *"]), Err(())),
            (s(&["*"]), Err(())),
            (s(&["'none'"]), Err(())),
        ];
        for (input, expected) in cases {
            let got = frame_ancestors(&input).map_err(|_| ());
            assert_eq!(got.as_deref().map_err(|_| ()), expected, "{input:?}");
        }
    }
}
