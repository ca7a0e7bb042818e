//! `GET /openapi.json`: the hand-written OpenAPI 3.1 document of this API, embedded at build
//! time. `tests/openapi.test.mjs` runs schemathesis against the live daemon with it, so a route
//! or a response shape that drifts from the document fails the suite.

use axum::http::header;
use axum::response::IntoResponse;

pub const DOCUMENT: &str = include_str!("openapi.json");

pub async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every `$ref` in `v` points at something in `root`.
    fn check_refs(root: &Value, v: &Value, at: &str) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{at}: {r}"));
                    assert!(root.pointer(pointer).is_some(), "{at}: dangling {r}");
                }
                for (k, child) in m {
                    check_refs(root, child, &format!("{at}/{k}"));
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    check_refs(root, child, &format!("{at}/{i}"));
                }
            }
            _ => {}
        }
    }

    #[test]
    fn document_is_consistent() {
        let doc: Value = serde_json::from_str(DOCUMENT).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        check_refs(&doc, &doc, "");
        let paths = doc["paths"].as_object().unwrap();
        let mut ops = Vec::new();
        for (path, item) in paths {
            for (method, op) in item.as_object().unwrap() {
                if method == "parameters" {
                    continue;
                }
                let public = op
                    .get("security")
                    .is_some_and(|s| s == &Value::Array(vec![]));
                let responses = op["responses"].as_object().unwrap();
                assert_eq!(
                    responses.contains_key("401"),
                    !public,
                    "{method} {path}: 401 documented exactly when the bearer token is required"
                );
                ops.push(format!("{} {path}", method.to_uppercase()));
            }
        }
        ops.sort();
        // The router's routes (api::router, console::routes, portal::routes and pages::routes);
        // keep both lists in step.
        let mut expected = vec![
            "GET /",
            "GET /common.js",
            "GET /charts.js",
            "GET /vendor/uPlot.iife.min.js",
            "GET /vendor/uPlot.min.css",
            "GET /vendor/uPlot.LICENSE.txt",
            "GET /v1/series",
            "GET /console.css",
            "GET /console.js",
            "GET /healthz",
            "GET /metrics",
            "GET /openapi.json",
            "POST /v1/events",
            "GET /v1/subscribers",
            "POST /v1/subscribers",
            "GET /v1/subscribers/{id}",
            "PATCH /v1/subscribers/{id}",
            "DELETE /v1/subscribers/{id}",
            "POST /v1/subscribers/{id}/rotate-secret",
            "GET /v1/subscribers/{id}/secret",
            "GET /v1/subscribers/{id}/held",
            "GET /v1/deliveries",
            "GET /v1/deliveries/{id}",
            "POST /v1/deliveries/{id}/replay",
            "POST /v1/replay",
            "GET /v1/retention",
            "GET /v1/outbox",
            "POST /v1/subscribers/{id}/test",
            "POST /v1/filters/test",
            "GET /v1/customers",
            "POST /v1/customers",
            "GET /v1/customers/{id}",
            "PATCH /v1/customers/{id}",
            "DELETE /v1/customers/{id}",
            "POST /v1/customers/{id}/portal",
            "POST /v1/customers/{id}/portal/revoke",
            "GET /portal",
            "GET /portal.js",
            "GET /portal.css",
        ];
        expected.sort_unstable();
        assert_eq!(ops, expected);
    }
}
