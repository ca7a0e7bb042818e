//! Tenants over time and the portal's powers, bounded (issue 22), against the real daemon over
//! real sockets: what a portal token may call (docs/src/customers.md's list), what it may not
//! undo of the operator's, revoking a customer's links, rotating a secret, and ids re-created
//! after their customer or subscriber was removed.
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

/// The portal's routes (docs/src/customers.md) and nothing else: the stored secrets and test
/// events answer 403 to a portal token (the admin keeps them); a customer pauses and resumes its own endpoint
/// but cannot re-enable one the operator disabled.
#[tokio::test]
async fn the_portal_has_designs_routes_and_cannot_undo_an_operators_disable() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let portal = customer_with_endpoint(api, "acme", "hook", &sink.url).await;

    let (s, body) = portal.get("/v1/subscribers/hook/secret").await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (403, json!("forbidden"))
    );
    let (s, body) = portal.post("/v1/subscribers/hook/test", json!({})).await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (403, json!("forbidden"))
    );
    let (s, _) = api.get("/v1/subscribers/hook/secret").await;
    assert_eq!(s, 200);
    let (s, body) = portal
        .post("/v1/subscribers/hook/rotate-secret", json!({}))
        .await;
    assert_eq!(s, 200, "{body}");

    // The customer's own pause, and its resume.
    let (s, body) = patch(&portal, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(true)), "{body}");
    let (s, body) = patch(
        &portal,
        "/v1/subscribers/hook",
        json!({ "disabled": false }),
    )
    .await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(false)), "{body}");

    // The operator's disable holds against the portal.
    let (s, _) = patch(api, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!(s, 200);
    let (s, body) = patch(
        &portal,
        "/v1/subscribers/hook",
        json!({ "disabled": false }),
    )
    .await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (403, json!("forbidden")),
        "{body}"
    );
    let (_, body) = api.get("/v1/subscribers/hook").await;
    assert_eq!(body["disabled"], true, "{body}");
    let (s, body) = patch(api, "/v1/subscribers/hook", json!({ "disabled": false })).await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(false)), "{body}");
    d.stop().await;
}

/// A leaked link is ended without removing the customer: `POST
/// /v1/customers/{id}/portal/revoke` (and `fanout customer revoke-links`) makes every link
/// issued so far answer 401; links issued afterwards work; another customer's links are not
/// touched; a portal token cannot revoke.
#[tokio::test]
async fn revoking_a_customers_links_ends_them_all_and_only_them() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let leaked = customer_with_endpoint(api, "acme", "hook", &sink.url).await;
    let also = as_token(api, &portal_token(api, "acme").await);
    let other = customer_with_endpoint(api, "globex", "other", &sink.url).await;
    for p in [&leaked, &also, &other] {
        assert_eq!(p.get("/v1/subscribers").await.0, 200);
    }
    let (s, body) = leaked
        .post("/v1/customers/acme/portal/revoke", json!({}))
        .await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (403, json!("forbidden"))
    );

    let (s, body) = api
        .post("/v1/customers/acme/portal/revoke", json!({}))
        .await;
    assert_eq!((s, body["id"].clone()), (200, json!("acme")), "{body}");
    for p in [&leaked, &also] {
        let (s, body) = p.get("/v1/subscribers").await;
        assert_eq!(
            (s, body["error"]["code"].clone()),
            (401, json!("unauthorized"))
        );
    }
    assert_eq!(
        other.get("/v1/subscribers").await.0,
        200,
        "globex untouched"
    );
    let fresh = as_token(api, &portal_token(api, "acme").await);
    let (s, body) = fresh.get("/v1/subscribers").await;
    assert_eq!(
        (s, body["subscribers"][0]["id"].clone()),
        (200, json!("hook"))
    );
    let (s, _) = api
        .post("/v1/customers/nobody/portal/revoke", json!({}))
        .await;
    assert_eq!(s, 404);

    // The same from the command line.
    let (ok, out, err) = api
        .fanout(&["customer", "revoke-links", "acme", "--json"])
        .await;
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["id"], "acme");
    assert_eq!(fresh.get("/v1/subscribers").await.0, 401);
    assert_eq!(other.get("/v1/subscribers").await.0, 200);
    let (ok, _, err) = api.fanout(&["customer", "revoke-links", "nobody"]).await;
    assert!(!ok && err.contains("404"), "{err}");
    d.stop().await;
}

/// `rotate-secret` is bounded: a second rotation within the minute answers 429 with
/// `Retry-After` (the portal's and the operator's alike), two secrets sign after a rotation
/// and never more, so the `webhook-signature` header stays two signatures long.
#[tokio::test]
async fn rotations_are_rate_limited_and_two_secrets_sign() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let portal = customer_with_endpoint(api, "acme", "hook", &sink.url).await;
    let (s, body) = portal
        .post("/v1/subscribers/hook/rotate-secret", json!({}))
        .await;
    assert_eq!(s, 200, "{body}");
    for who in [&portal, api] {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/subscribers/hook/rotate-secret", api.base))
            .bearer_auth(&who.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 429);
        let wait: u64 = resp.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&wait), "Retry-After {wait}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    }
    let (_, view) = api.get("/v1/subscribers/hook").await;
    assert_eq!(view["active_secrets"], 2, "{view}");
    api.events(json!({ "id": "e1", "type": "order.created" }))
        .await;
    wait_for(
        "hook receives e1",
        std::time::Duration::from_secs(30),
        || async { sink.count() == 1 },
    )
    .await;
    let signatures = sink.received()[0]
        .header("webhook-signature")
        .unwrap()
        .split(' ')
        .count();
    assert_eq!(signatures, 2);
    d.stop().await;
}

/// Deliveries belong to the customer and the endpoint that existed, not to an id string. A
/// customer removed and created again under its old id (a new tenant) sees, reads and replays
/// nothing of its predecessor's deliveries, nor charts them, and the old links do not work for it; the old
/// endpoint id cannot be taken over under it while those deliveries are kept; a removed
/// operator-owned endpoint's id cannot be taken over under a customer either. The same owner
/// may bring its own endpoint back, and an id whose deliveries are gone is free.
#[tokio::test]
async fn a_recreated_id_inherits_nothing_of_the_old_one() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let old_portal = customer_with_endpoint(api, "acme", "hook", &sink.url).await;
    api.subscriber(sub_spec("ops", &sink.url, &["*"])).await;
    api.events(events("old", 3, "order.created")).await;
    wait_for(
        "6 sent, acme's 3 charted",
        std::time::Duration::from_secs(60),
        || async { sink.count() == 6 && charted(&old_portal, "").await == 3 },
    )
    .await;
    let old = old_portal.deliveries("").await;
    assert_eq!(old.len(), 3);
    let old_id = old[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        old_portal.get(&format!("/v1/deliveries/{old_id}")).await.0,
        200
    );

    // The old tenant goes: its endpoint, then the customer.
    for path in [
        "/v1/subscribers/hook",
        "/v1/customers/acme",
        "/v1/subscribers/ops",
    ] {
        let (s, body) = api.raw("DELETE", path, None, true).await;
        assert_eq!(s, 200, "{path}: {body}");
    }
    // A new tenant under the old id.
    let (s, _) = api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!(s, 201);
    let (s, _) = old_portal.get("/v1/subscribers").await;
    assert_eq!(s, 401, "the old tenant's link");
    let new_portal = as_token(api, &portal_token(api, "acme").await);
    assert_eq!(new_portal.deliveries("").await, Vec::<Value>::new());
    assert_eq!(charted(&new_portal, "").await, 0, "the old tenant's chart");
    assert_eq!(
        new_portal.deliveries("subscriber=hook").await,
        Vec::<Value>::new()
    );
    let (s, _) = new_portal.get(&format!("/v1/deliveries/{old_id}")).await;
    assert_eq!(s, 404);
    let (s, _) = new_portal
        .post(&format!("/v1/deliveries/{old_id}/replay"), json!({}))
        .await;
    assert_eq!(s, 404);
    let (s, body) = new_portal
        .post("/v1/replay", json!({ "status": "sent", "dry_run": true }))
        .await;
    assert_eq!((s, body["count"].clone()), (200, json!(0)), "{body}");

    // The old endpoint's id, and the operator's removed one, under the new tenant: refused
    // while their deliveries are kept.
    for id in ["hook", "ops"] {
        let mut spec = sub_spec(id, &sink.url, &["*"]);
        spec["customer"] = json!("acme");
        let (s, body) = api.post("/v1/subscribers", spec).await;
        assert_eq!(
            (s, body["error"]["code"].clone()),
            (409, json!("conflict")),
            "{id}: {body}"
        );
    }
    // The operator keeps the history (and may bring its own endpoint back, with it).
    assert_eq!(api.deliveries("subscriber=hook").await.len(), 3);
    api.subscriber(sub_spec("ops", &sink.url, &["*"])).await;
    assert_eq!(api.deliveries("subscriber=ops").await.len(), 3);
    // An id with no deliveries kept is free for anyone.
    let mut spec = sub_spec("quiet", &sink.url, &["nothing.*"]);
    api.subscriber(spec.clone()).await;
    assert_eq!(
        api.raw("DELETE", "/v1/subscribers/quiet", None, true)
            .await
            .0,
        200
    );
    spec["customer"] = json!("acme");
    let (s, body) = api.post("/v1/subscribers", spec).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(new_portal.get("/v1/subscribers/quiet").await.0, 200);
    assert_eq!(new_portal.deliveries("").await, Vec::<Value>::new());
    d.stop().await;
}

/// The sum of a chart's `delivered` over the last hour (`GET /v1/series`), as `api` sees it.
async fn charted(api: &Api, query: &str) -> u64 {
    let (s, body) = api.get(&format!("/v1/series?window=1h&{query}")).await;
    assert_eq!(s, 200, "{body}");
    body["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["delivered"].as_u64().unwrap())
        .sum()
}

/// A removed endpoint whose deliveries retention removed, created again under its id for
/// another customer, is a new endpoint: its chart starts empty and its first webhook is
/// `webhook-sequence` 1 (the old one's counter and series rows are not inherited).
#[tokio::test]
async fn a_recreated_id_starts_with_an_empty_chart_and_sequence_1() {
    let d = Daemon::start_with(|s| fanout_origin::config::Settings {
        retain_sent: Some("1s".into()),
        ..s
    })
    .await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    customer_with_endpoint(api, "acme", "hook", &sink.url).await;
    api.events(events("old", 5, "order.created")).await;
    let long = std::time::Duration::from_secs(60);
    wait_for("5 sent and charted", long, || async {
        sink.count() == 5 && charted(api, "subscriber=hook").await == 5
    })
    .await;
    let (s, body) = api.raw("DELETE", "/v1/subscribers/hook", None, true).await;
    assert_eq!(s, 200, "{body}");
    wait_for("retention removed them", long, || async {
        api.count("subscriber=hook").await == 0
    })
    .await;

    let portal = customer_with_endpoint(api, "globex", "hook", &sink.url).await;
    assert_eq!(
        charted(api, "subscriber=hook").await,
        0,
        "the operator's view"
    );
    assert_eq!(
        charted(&portal, "subscriber=hook").await,
        0,
        "the new owner's"
    );
    assert_eq!(
        charted(&portal, "").await,
        0,
        "the new owner's combined chart"
    );
    api.events(events("new", 1, "order.created")).await;
    wait_for("the new endpoint's first webhook", long, || async {
        sink.count() == 6
    })
    .await;
    let first = sink.received().pop().unwrap();
    assert_eq!(first.header("webhook-id"), Some("new_00000"));
    assert_eq!(first.header("webhook-sequence"), Some("1"));
    d.stop().await;
}

/// The charts' 15-minute window, their cap (the one configured, not a sum of samples), and a
/// subscriber created again under its id while its deliveries are kept (the next `fanout
/// listen` session on the same port) starts with an empty chart.
#[tokio::test]
async fn charts_have_15_minutes_the_configured_cap_and_a_new_session_starts_empty() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let (s, body) = api
        .post(
            "/v1/customers",
            json!({ "id": "acme", "max_in_flight": 10 }),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    for (id, cap, customer) in [
        ("a1", 8, Some("acme")),
        ("a2", 8, Some("acme")),
        ("solo", 5, None),
    ] {
        let mut spec = sub_spec(id, &sink.url, &["*"]);
        spec["max_in_flight"] = json!(cap);
        spec["customer"] = json!(customer);
        api.subscriber(spec).await;
    }
    let view = |q: &'static str| async move {
        let (s, body) = api.get(&format!("/v1/series?{q}")).await;
        assert_eq!(s, 200, "{q}: {body}");
        body
    };
    let quarter = view("window=15m").await;
    assert_eq!(quarter["window"], "15m");
    assert_eq!(quarter["points"].as_array().unwrap().len(), 90);
    assert_eq!(
        quarter["in_flight_cap"], 15,
        "acme's 16 held to its 10, and solo's 5"
    );
    assert_eq!(view("window=15m&subscriber=a1").await["in_flight_cap"], 8);
    let portal = as_token(api, &portal_token(api, "acme").await);
    let (_, mine) = portal.get("/v1/series?window=15m").await;
    assert_eq!(mine["in_flight_cap"], 10, "{mine}");

    api.events(events("old", 3, "order.created")).await;
    let long = std::time::Duration::from_secs(60);
    wait_for("charted", long, || async {
        charted(api, "subscriber=solo").await == 3
    })
    .await;
    let (s, body) = api.raw("DELETE", "/v1/subscribers/solo", None, true).await;
    assert_eq!(s, 200, "{body}");
    api.subscriber(sub_spec("solo", &sink.url, &["*"])).await;
    assert_eq!(
        charted(api, "subscriber=solo").await,
        0,
        "the new session's chart"
    );
    assert_eq!(
        api.count("subscriber=solo").await,
        3,
        "its deliveries are kept"
    );
    d.stop().await;
}

/// `POST /v1/subscribers/{id}/test` never piles up: one test event at a time per endpoint (a
/// paused endpoint keeps one pending, not thousands) and one every 10 s; past that 429
/// `rate_limited` with `Retry-After`.
#[tokio::test]
async fn test_events_are_one_at_a_time_and_rate_limited() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    api.subscriber(sub_spec("hook", &sink.url, &["order.*"]))
        .await;
    let (s, _) = patch(api, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!(s, 200);
    let (s, body) = api.post("/v1/subscribers/hook/test", json!({})).await;
    assert_eq!(s, 202, "{body}");
    let http = reqwest::Client::new();
    for _ in 0..50 {
        let resp = http
            .post(format!("{}/v1/subscribers/hook/test", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 429);
        let wait: u64 = resp.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=10).contains(&wait), "Retry-After {wait}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    }
    assert_eq!(
        api.deliveries("subscriber=hook&status=pending").await.len(),
        1
    );

    // Resumed, the one test goes out; another within 10 s of it is still refused.
    let (s, _) = patch(api, "/v1/subscribers/hook", json!({ "disabled": false })).await;
    assert_eq!(s, 200);
    wait_for(
        "the test event arrives",
        std::time::Duration::from_secs(30),
        || async { sink.count() == 1 },
    )
    .await;
    wait_for(
        "the test delivery is sent",
        std::time::Duration::from_secs(30),
        || async { api.deliveries("subscriber=hook&status=sent").await.len() == 1 },
    )
    .await;
    let (s, body) = api.post("/v1/subscribers/hook/test", json!({})).await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (429, json!("rate_limited")),
        "{body}"
    );
    assert_eq!(sink.count(), 1);
    d.stop().await;
}

/// A bulk replay goes in small steps with a cap per call: past 10,000 deliveries looked at it
/// answers `more` and where to go on (`next`, passed back as `after`); replaying what is
/// already pending changes nothing.
#[tokio::test]
async fn bulk_replay_is_capped_per_call_and_pending_is_a_no_op() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let spec = sub_spec("hook", &sink.url, &["order.*"]);
    api.subscriber(spec.clone()).await;
    let (s, _) = patch(api, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!(s, 200);
    let total = 10_500;
    api.events(events("a", 10_000, "order.created")).await;
    api.events(events("b", total - 10_000, "order.created"))
        .await;
    // Removed, its deliveries go dead; brought back (the same owner) and paused, they wait.
    let (s, body) = api.raw("DELETE", "/v1/subscribers/hook", None, true).await;
    assert_eq!(
        (s, body["deliveries_dead"].clone()),
        (200, json!(total)),
        "{body}"
    );
    api.subscriber(spec).await;
    let (s, _) = patch(api, "/v1/subscribers/hook", json!({ "disabled": true })).await;
    assert_eq!(s, 200);

    let (s, body) = api
        .post("/v1/replay", json!({ "subscriber": "hook" }))
        .await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(
        (body["replayed"].clone(), body["more"].clone()),
        (json!(10_000), json!(true)),
        "{body}"
    );
    let next = body["next"].as_str().unwrap().to_string();
    let (s, body) = api
        .post("/v1/replay", json!({ "subscriber": "hook", "after": next }))
        .await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(
        (
            body["replayed"].clone(),
            body["more"].clone(),
            body["next"].clone()
        ),
        (json!(total - 10_000), json!(false), Value::Null),
        "{body}"
    );
    let (_, view) = api.get("/v1/subscribers/hook?stats=true").await;
    assert_eq!(view["stats"]["pending"], json!(total), "{view}");
    // Pending already: nothing to do, and nothing is done (no attempt budget or due time reset).
    let before = api
        .deliveries("subscriber=hook&status=pending&limit=1")
        .await;
    let (s, body) = api
        .post(
            "/v1/replay",
            json!({ "subscriber": "hook", "status": "pending" }),
        )
        .await;
    assert_eq!((s, body["replayed"].clone()), (202, json!(0)), "{body}");
    let (_, body) = api
        .post(
            "/v1/replay",
            json!({ "subscriber": "hook", "status": "pending", "dry_run": true }),
        )
        .await;
    assert_eq!(body["count"], 0, "{body}");
    assert_eq!(
        api.deliveries("subscriber=hook&status=pending&limit=1")
            .await,
        before
    );
    d.stop().await;
}

/// Every route of the API (the OpenAPI document's, which a unit test keeps equal to the
/// router's) called with a portal token: DESIGN.md's fourth-round list answers (what it says
/// depends on the call), everything else 403; and every subscriber field in a PATCH: only
/// `disabled`, `customer_filter`, `signature` and `batch` (issue 35).
#[tokio::test]
async fn every_route_and_field_answers_a_portal_token_as_design_lists() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let portal = customer_with_endpoint(api, "acme", "hook", &sink.url).await;
    api.events(json!({ "id": "e1", "type": "t" })).await;
    let delivery = api.deliveries("subscriber=hook").await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let allowed = [
        "GET /v1/subscribers",
        "GET /v1/subscribers/{id}",
        "PATCH /v1/subscribers/{id}",
        "POST /v1/subscribers/{id}/rotate-secret",
        "GET /v1/subscribers/{id}/held",
        "GET /v1/deliveries",
        "GET /v1/deliveries/{id}",
        "POST /v1/deliveries/{id}/replay",
        "POST /v1/replay",
        "GET /v1/series",
        "POST /v1/filters/test",
    ];
    let doc: Value = serde_json::from_str(include_str!("../src/api/openapi.json")).unwrap();
    let mut seen = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            if method == "parameters" {
                continue;
            }
            let route = format!("{} {path}", method.to_uppercase());
            let id = if path.starts_with("/v1/deliveries/") {
                delivery.as_str()
            } else if path.starts_with("/v1/customers/") {
                "acme"
            } else {
                "hook"
            };
            let body = match route.as_str() {
                "POST /v1/filters/test" => json!({ "filter": {}, "event": {} }),
                "POST /v1/replay" => json!({ "subscriber": "hook" }),
                _ => json!({}),
            };
            let (s, got) = portal
                .raw(
                    &method.to_uppercase(),
                    &path.replace("{id}", id),
                    Some(body.to_string()),
                    true,
                )
                .await;
            if allowed.contains(&route.as_str()) {
                // Allowed: the handler answers (what it says depends on the call).
                assert!(![401, 403].contains(&s) && s < 500, "{route}: {s} {got}");
                seen.push(route);
            } else {
                assert_eq!(
                    (s, got["error"]["code"].clone()),
                    (403, json!("forbidden")),
                    "{route}: {got}"
                );
            }
        }
    }
    seen.sort_unstable();
    let mut want = allowed.to_vec();
    want.sort_unstable();
    assert_eq!(seen, want, "every allowed route is in the document");

    // PATCH, field by field (each with a value the operator could set).
    let fields: &[(&str, Value, bool)] = &[
        ("disabled", json!(false), true),
        ("customer_filter", json!({ "a": 1 }), true),
        ("signature", json!("both"), true),
        ("batch", json!(null), true),
        ("filter", json!(null), false),
        ("filter", json!({ "a": 1 }), false),
        ("id", json!("hook"), false),
        ("url", json!(sink.url), false),
        ("event_types", json!(["*"]), false),
        ("rate_per_sec", json!(5), false),
        ("burst", json!(5), false),
        ("max_in_flight", json!(5), false),
        ("timeout_ms", json!(5000), false),
        ("lane", json!("origin"), false),
        ("legacy_signature", json!(false), false),
        ("customer", json!("acme"), false),
        ("payload", json!("full"), false),
        ("ordering", json!("none"), false),
        ("ordering_key", json!("/a"), false),
        ("propagate_trace", json!(false), false),
    ];
    for (field, value, ok) in fields {
        let (s, got) = patch(&portal, "/v1/subscribers/hook", json!({ *field: value })).await;
        let want = if *ok { 200 } else { 403 };
        assert_eq!(s, want, "{field}: {got}");
        let (s, got) = patch(api, "/v1/subscribers/hook", json!({ *field: value })).await;
        assert_ne!(s, 403, "the operator may set {field}: {got}");
    }
    d.stop().await;
}
