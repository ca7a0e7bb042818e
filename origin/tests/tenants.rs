//! Tenants over time and the portal's powers, bounded (issue 22), against the real daemon over
//! real sockets: what a portal token may call (DESIGN.md's list), what it may not undo of the
//! operator's, revoking a customer's links, rotating a secret, and ids re-created after their
//! customer or subscriber was removed.
//! Runs on SQLite, and on PostgreSQL with `FANOUT_TEST_LEDGER=postgres` (scripts/test.sh runs it
//! both ways).
// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};

/// The same API, with another bearer token.
fn as_token(api: &Api, token: &str) -> Api {
    let mut a = Api::new(api.base.clone());
    a.token = token.to_string();
    a
}

async fn portal_token(api: &Api, customer: &str) -> String {
    let (status, link) = api
        .post(&format!("/v1/customers/{customer}/portal"), json!({}))
        .await;
    assert_eq!(status, 201, "{link}");
    link["token"].as_str().unwrap().to_string()
}

async fn patch(api: &Api, path: &str, body: Value) -> (u16, Value) {
    api.raw("PATCH", path, Some(body.to_string()), true).await
}

/// A customer `customer` with one endpoint `sub` at `url`; a portal token for it.
async fn customer_with_endpoint(api: &Api, customer: &str, sub: &str, url: &str) -> Api {
    let (s, body) = api.post("/v1/customers", json!({ "id": customer })).await;
    assert_eq!(s, 201, "{body}");
    let mut spec = sub_spec(sub, url, &["*"]);
    spec["customer"] = json!(customer);
    api.subscriber(spec).await;
    as_token(api, &portal_token(api, customer).await)
}

/// DESIGN.md's portal routes and nothing else: the stored secrets and test events answer 403
/// to a portal token (the admin keeps them); a customer pauses and resumes its own endpoint
/// but cannot re-enable one the operator disabled.
#[tokio::test]
async fn the_portal_has_designs_routes_and_cannot_undo_an_operators_disable() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let portal = customer_with_endpoint(api, "acme", "hook", &sink.url).await;

    let (s, body) = portal.get("/v1/subscribers/hook/secret").await;
    assert_eq!((s, body["error"]["code"].clone()), (403, json!("forbidden")));
    let (s, body) = portal.post("/v1/subscribers/hook/test", json!({})).await;
    assert_eq!((s, body["error"]["code"].clone()), (403, json!("forbidden")));
    let (s, _) = api.get("/v1/subscribers/hook/secret").await;
    assert_eq!(s, 200);
    let (s, body) = portal.post("/v1/subscribers/hook/rotate-secret", json!({})).await;
    assert_eq!(s, 200, "{body}");

    // The customer's own pause, and its resume.
    let (s, body) = patch(&portal, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(true)), "{body}");
    let (s, body) = patch(&portal, "/v1/subscribers/hook", json!({ "disabled": false })).await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(false)), "{body}");

    // The operator's disable holds against the portal.
    let (s, _) = patch(api, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!(s, 200);
    let (s, body) = patch(&portal, "/v1/subscribers/hook", json!({ "disabled": false })).await;
    assert_eq!((s, body["error"]["code"].clone()), (403, json!("forbidden")), "{body}");
    let (_, body) = api.get("/v1/subscribers/hook").await;
    assert_eq!(body["disabled"], true, "{body}");
    let (s, body) = patch(api, "/v1/subscribers/hook", json!({ "disabled": false })).await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(false)), "{body}");
    d.stop().await;
}
