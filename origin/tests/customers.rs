//! Customers and portal tokens against the real daemon over real sockets: CRUD, a subscriber's
//! customer, and what a portal token for customer A may and may not see or do — B's ids (and
//! the operator's own subscribers) answer 404 and nothing of B changes; other routes answer 403;
//! a changed, expired or orphaned token answers 401.
//! Runs on SQLite, and on PostgreSQL with `FANOUT_TEST_LEDGER=postgres` (scripts/test.sh runs it
//! both ways).
// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use fanout_core::sign::{self, Secret};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

/// The same API, with another bearer token.
fn as_token(api: &Api, token: &str) -> Api {
    let mut a = Api::new(api.base.clone());
    a.token = token.to_string();
    a
}

async fn portal(api: &Api, customer: &str, ttl: Option<u64>) -> (String, Value) {
    let body = match ttl {
        Some(t) => json!({ "ttl_secs": t }),
        None => json!({}),
    };
    let (status, link) = api
        .post(&format!("/v1/customers/{customer}/portal"), body)
        .await;
    assert_eq!(status, 201, "{link}");
    (link["token"].as_str().unwrap().to_string(), link)
}

fn ids(list: &Value, key: &str) -> Vec<String> {
    let mut v: Vec<String> = list[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn customers_crud_and_subscriber_ownership() {
    let d = Daemon::start().await;
    let api = &d.api;
    let (s, body) = api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(
        (body["weight"].clone(), body["max_in_flight"].clone()),
        (json!(1), Value::Null)
    );
    let (s, body) = api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!((s, body["error"]["code"].clone()), (409, json!("conflict")));
    for bad in [
        json!({ "id": "x", "weight": 0 }),
        json!({ "id": "x", "weight": 1001 }),
        json!({ "id": "x", "max_in_flight": 0 }),
        json!({ "weight": 2 }),
        json!({ "id": "x", "colour": "red" }),
    ] {
        let (s, body) = api.post("/v1/customers", bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {body}");
    }
    let (s, body) = api
        .raw(
            "PATCH",
            "/v1/customers/acme",
            Some(json!({ "weight": 4, "max_in_flight": 20 }).to_string()),
            true,
        )
        .await;
    assert_eq!(
        (s, body["weight"].clone(), body["max_in_flight"].clone()),
        (200, json!(4), json!(20)),
        "{body}"
    );
    // A subscriber names an existing customer, or is refused saying so.
    let sub = Subscriber::ok().await;
    let mut spec = sub_spec("hook", &sub.url, &["*"]);
    spec["customer"] = json!("nobody");
    let (s, body) = api.post("/v1/subscribers", spec.clone()).await;
    assert_eq!(s, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("customer nobody does not exist"),
        "{body}"
    );
    spec["customer"] = json!("acme");
    api.subscriber(spec).await;
    let (_, body) = api.get("/v1/subscribers/hook").await;
    assert_eq!(body["customer"], "acme");
    let (_, body) = api.get("/v1/customers/acme").await;
    assert_eq!(body["subscribers"], 1);
    let (_, list) = api.get("/v1/customers").await;
    assert_eq!(ids(&list, "customers"), vec!["acme"]);
    // A customer with endpoints is not removed; detached, it is.
    let (s, body) = api.raw("DELETE", "/v1/customers/acme", None, true).await;
    assert_eq!((s, body["error"]["code"].clone()), (409, json!("conflict")));
    let (s, body) = api
        .raw(
            "PATCH",
            "/v1/subscribers/hook",
            Some(json!({ "customer": null }).to_string()),
            true,
        )
        .await;
    assert_eq!((s, body["customer"].clone()), (200, Value::Null), "{body}");
    let (s, _) = api.raw("DELETE", "/v1/customers/acme", None, true).await;
    assert_eq!(s, 200);
    let (s, body) = api.get("/v1/customers/acme").await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (404, json!("unknown_customer"))
    );
    let (s, _) = api.post("/v1/customers/acme/portal", json!({})).await;
    assert_eq!(s, 404);
    d.stop().await;
}

/// Everything about B as the daemon shows it to the admin, to see that nothing changed.
async fn snapshot_b(api: &Api) -> Vec<Value> {
    let mut out = vec![api.get("/v1/subscribers/b1").await.1];
    for dlv in api.deliveries("subscriber=b1").await {
        out.push(
            api.get(&format!("/v1/deliveries/{}", dlv["id"].as_str().unwrap()))
                .await
                .1,
        );
    }
    out
}

#[tokio::test]
async fn a_portal_token_sees_and_changes_only_its_own_customer() {
    let d = Daemon::start().await;
    let api = &d.api;
    // Every endpoint refuses for good (404: dead at once), with a body the customer can read.
    let a_sub = Subscriber::start(|_, _| Answer::status(404).body("no route for a")).await;
    let b_sub = Subscriber::start(|_, _| Answer::status(404).body("no route for b")).await;
    let own = Subscriber::start(|_, _| Answer::status(404)).await;
    for c in ["acme", "globex"] {
        assert_eq!(api.post("/v1/customers", json!({ "id": c })).await.0, 201);
    }
    let spec = |id: &str, url: &str, customer: Option<&str>| {
        let mut s = sub_spec(id, url, &["order.*"]);
        if let Some(c) = customer {
            s["customer"] = json!(c);
        }
        s
    };
    api.subscriber(spec("a1", &a_sub.url, Some("acme"))).await;
    api.subscriber(spec("b1", &b_sub.url, Some("globex"))).await;
    api.subscriber(spec("op", &own.url, None)).await;
    api.events(json!([
        { "id": "e1", "type": "order.created" },
        { "id": "e2", "type": "order.paid" }
    ]))
    .await;
    wait_for("six dead deliveries", LONG, || async {
        api.count("status=dead").await == 6
    })
    .await;
    let b_deliveries = api.deliveries("subscriber=b1").await;
    let op_deliveries = api.deliveries("subscriber=op").await;
    let before = snapshot_b(api).await;

    let (token, link) = portal(api, "acme", None).await;
    let url = link["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/portal#token=fpt_", api.base)),
        "{url}"
    );
    assert!(!url.contains(TOKEN) && !token.contains(TOKEN));
    let a = as_token(api, &token);

    // Reads: only acme's.
    let (s, list) = a.get("/v1/subscribers?stats=true").await;
    assert_eq!(
        (s, ids(&list, "subscribers")),
        (200, vec!["a1".to_string()])
    );
    let (s, list) = a.get("/v1/deliveries").await;
    assert_eq!(s, 200);
    let seen: Vec<&str> = list["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["subscriber_id"].as_str().unwrap())
        .collect();
    assert_eq!(seen, vec!["a1", "a1"]);
    let (_, list) = a.get("/v1/deliveries?type=order.paid").await;
    assert_eq!(list["deliveries"].as_array().unwrap().len(), 1);
    let (_, list) = a.get("/v1/deliveries?subscriber=b1").await;
    assert_eq!(list["deliveries"].as_array().unwrap().len(), 0);
    let a_dlv = list_first(&a, "subscriber=a1").await;
    let (s, one) = a.get(&format!("/v1/deliveries/{a_dlv}")).await;
    assert_eq!(s, 200);
    assert_eq!(one["attempts"][0]["response_body"], "no route for a");

    // B's (and the operator's own) ids, edited in by hand: 404, like ids that do not exist.
    let mut foreign: Vec<String> = b_deliveries
        .iter()
        .chain(&op_deliveries)
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    foreign.push("dlv_999999".into());
    for id in &foreign {
        assert_eq!(a.get(&format!("/v1/deliveries/{id}")).await.0, 404, "{id}");
        let (s, _) = a
            .post(&format!("/v1/deliveries/{id}/replay"), json!({}))
            .await;
        assert_eq!(s, 404, "replay {id}");
    }
    for sub in ["b1", "op", "nobody"] {
        assert_eq!(a.get(&format!("/v1/subscribers/{sub}")).await.0, 404);
        let (s, _) = a
            .raw(
                "PATCH",
                &format!("/v1/subscribers/{sub}"),
                Some(json!({ "disabled": true }).to_string()),
                true,
            )
            .await;
        assert_eq!(s, 404, "patch {sub}");
        let (s, _) = a
            .post(&format!("/v1/subscribers/{sub}/rotate-secret"), json!({}))
            .await;
        assert_eq!(s, 404, "rotate {sub}");
        // The stored secrets and test events are the operator's (the portal's routes:
        // docs/src/customers.md).
        let (s, _) = a.get(&format!("/v1/subscribers/{sub}/secret")).await;
        assert_eq!(s, 403, "secret {sub}");
        let (s, _) = a
            .post(&format!("/v1/subscribers/{sub}/test"), json!({}))
            .await;
        assert_eq!(s, 403, "test {sub}");
        let (s, _) = a.post("/v1/replay", json!({ "subscriber": sub })).await;
        assert_eq!(s, 404, "bulk replay {sub}");
    }
    // Routes outside the portal's: 403, whatever the ids.
    let forbidden: &[(&str, &str, Option<Value>)] = &[
        (
            "POST",
            "/v1/events",
            Some(json!({ "id": "x", "type": "order.x" })),
        ),
        (
            "POST",
            "/v1/subscribers",
            Some(spec("a2", &a_sub.url, Some("acme"))),
        ),
        ("DELETE", "/v1/subscribers/a1", None),
        ("GET", "/v1/customers", None),
        ("GET", "/v1/customers/acme", None),
        (
            "PATCH",
            "/v1/customers/acme",
            Some(json!({ "weight": 1000 })),
        ),
        ("DELETE", "/v1/customers/globex", None),
        ("POST", "/v1/customers/acme/portal", Some(json!({}))),
        ("POST", "/v1/customers/globex/portal", Some(json!({}))),
    ];
    for (m, path, body) in forbidden {
        let (s, body) = a
            .raw(m, path, body.as_ref().map(Value::to_string), true)
            .await;
        assert_eq!(
            (s, body["error"]["code"].clone()),
            (403, json!("forbidden")),
            "{m} {path}"
        );
    }
    // Its own endpoint: pause and resume only.
    for field in [
        json!({ "url": "http://127.0.0.1:9/x" }),
        json!({ "rate_per_sec": 1000 }),
        json!({ "customer": "globex" }),
        json!({ "disabled": true, "max_in_flight": 1 }),
    ] {
        let (s, _) = a
            .raw("PATCH", "/v1/subscribers/a1", Some(field.to_string()), true)
            .await;
        assert_eq!(s, 403, "{field}");
    }
    let (s, body) = a
        .raw(
            "PATCH",
            "/v1/subscribers/a1",
            Some(json!({ "disabled": true }).to_string()),
            true,
        )
        .await;
    assert_eq!(
        (s, body["disabled"].clone(), body["disabled_reason"].clone()),
        (200, json!(true), json!("disabled by the customer"))
    );
    let (s, body) = a
        .raw(
            "PATCH",
            "/v1/subscribers/a1",
            Some(json!({ "disabled": false }).to_string()),
            true,
        )
        .await;
    assert_eq!((s, body["disabled"].clone()), (200, json!(false)));
    let (s, body) = a.post("/v1/subscribers/a1/rotate-secret", json!({})).await;
    assert_eq!(s, 200);
    assert!(body["secret"].as_str().unwrap().starts_with("whsec_"));

    // Bulk replay: a count first, then only acme's go back in the queue.
    let (s, body) = a.post("/v1/replay", json!({ "dry_run": true })).await;
    assert_eq!((s, body["count"].clone()), (200, json!(2)), "{body}");
    let (s, body) = a
        .post(
            "/v1/replay",
            json!({ "type": "order.paid", "dry_run": true }),
        )
        .await;
    assert_eq!((s, body["count"].clone()), (200, json!(1)), "{body}");
    let received = a_sub.count();
    let (s, body) = a.post("/v1/replay", json!({})).await;
    assert_eq!((s, body["replayed"].clone()), (202, json!(2)), "{body}");
    wait_for("acme's endpoint receives both again", LONG, || async {
        a_sub.count() >= received + 2
    })
    .await;
    // A test event (the operator's), to acme's endpoint alone.
    let (s, body) = api.post("/v1/subscribers/a1/test", json!({})).await;
    assert_eq!(s, 202, "{body}");
    wait_for("the test event arrives", LONG, || async {
        a_sub
            .received()
            .iter()
            .any(|r| String::from_utf8_lossy(&r.body).contains("fanout.test"))
    })
    .await;
    assert!(!b_sub
        .received()
        .iter()
        .any(|r| String::from_utf8_lossy(&r.body).contains("fanout.test")));

    // Nothing of B changed (a replay or a change that reached B would show in its views now:
    // a replay makes a delivery pending before it answers), and B's endpoint got nothing more.
    assert_eq!(snapshot_b(api).await, before);
    // A marker: the operator's test event to B, due after anything the portal token did. Once
    // it has arrived, anything of B's made due earlier would have arrived before it.
    let (s, body) = api.post("/v1/subscribers/b1/test", json!({})).await;
    assert_eq!(s, 202, "{body}");
    wait_for("the marker arrives at B", LONG, || async {
        b_sub
            .received()
            .iter()
            .any(|r| String::from_utf8_lossy(&r.body).contains("fanout.test"))
    })
    .await;
    assert_eq!(
        b_sub.count(),
        3,
        "B's endpoint got its two and the marker, nothing more"
    );
    d.stop().await;
}

/// A call with `api`'s token, answering the status, the `Cache-Control` header and the body.
async fn with_cache_control(
    api: &Api,
    method: &str,
    path: &str,
    body: Value,
) -> (u16, Option<String>, Value) {
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .request(method.parse().unwrap(), format!("{}{path}", api.base))
        .bearer_auth(&api.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let cache = resp
        .headers()
        .get("cache-control")
        .map(|v| v.to_str().unwrap().to_string());
    (status, cache, resp.json().await.unwrap())
}

/// Does `secret` verify the Standard Webhooks signature of the request `r`?
fn signed_by(r: &Received, secret: &str) -> bool {
    sign::verify(
        &[Secret::parse(secret).unwrap()],
        r.header("webhook-id"),
        r.header("webhook-timestamp"),
        r.header("webhook-signature"),
        &r.body,
        fanout_origin::time::now_ms() / 1000,
    )
    .is_ok()
}

/// `GET /v1/subscribers/{id}/secret` shows the real signing secrets to the admin; a portal
/// token gets 403 (the portal's routes: docs/src/customers.md) and sees a new secret once, in
/// the answer to its own rotation; during a rotation both sign, the old one until the end of
/// its grace period.
/// Never cacheable.
#[tokio::test]
async fn signing_secrets_are_shown_to_the_admin_and_once_to_the_rotating_customer() {
    let d = Daemon::start().await;
    let api = &d.api;
    let a_sub = Subscriber::ok().await;
    let b_sub = Subscriber::ok().await;
    for c in ["acme", "globex"] {
        assert_eq!(api.post("/v1/customers", json!({ "id": c })).await.0, 201);
    }
    for (id, url, customer) in [("a1", &a_sub.url, "acme"), ("b1", &b_sub.url, "globex")] {
        let mut spec = sub_spec(id, url, &["order.*"]);
        spec["customer"] = json!(customer);
        let (s, cache, body) = with_cache_control(api, "POST", "/v1/subscribers", spec).await;
        assert_eq!(s, 201, "{body}");
        assert_eq!(
            cache.as_deref(),
            Some("no-store"),
            "the answer carries the secret"
        );
    }
    api.events(json!({ "id": "e1", "type": "order.created" }))
        .await;
    wait_for("both endpoints receive e1", LONG, || async {
        a_sub.count() == 1 && b_sub.count() == 1
    })
    .await;

    let (s, cache, admin_view) =
        with_cache_control(api, "GET", "/v1/subscribers/a1/secret", Value::Null).await;
    assert_eq!(
        (s, cache.as_deref()),
        (200, Some("no-store")),
        "{admin_view}"
    );
    let shown = admin_view["secrets"].as_array().unwrap();
    assert_eq!(shown.len(), 1, "{admin_view}");
    assert_eq!(shown[0]["expires_at_ms"], Value::Null);
    let current = shown[0]["secret"].as_str().unwrap().to_string();
    assert!(
        signed_by(&a_sub.received()[0], &current),
        "the shown secret signs a1's deliveries"
    );
    let (_, b_view) = api.get("/v1/subscribers/b1/secret").await;
    let b_secret = b_view["secrets"][0]["secret"].as_str().unwrap().to_string();
    assert!(signed_by(&b_sub.received()[0], &b_secret));
    assert!(!signed_by(&b_sub.received()[0], &current));

    // A portal token: 403 for any endpoint's stored secrets, its own included.
    let (token, _) = portal(api, "acme", None).await;
    let a = as_token(api, &token);
    for any in ["a1", "b1", "nobody"] {
        let (s, body) = a.get(&format!("/v1/subscribers/{any}/secret")).await;
        assert_eq!(
            (s, body["error"]["code"].clone()),
            (403, json!("forbidden")),
            "{any}: {body}"
        );
        assert!(!body.to_string().contains("whsec_"), "{body}");
    }

    // A rotation (by the customer): the new one first, the old one until its grace ends.
    let (s, cache, rotated) =
        with_cache_control(&a, "POST", "/v1/subscribers/a1/rotate-secret", json!({})).await;
    assert_eq!((s, cache.as_deref()), (200, Some("no-store")), "{rotated}");
    let new = rotated["secret"].as_str().unwrap();
    let (s, during) = api.get("/v1/subscribers/a1/secret").await;
    assert_eq!(s, 200);
    // Each generation shows its Ed25519 public key: the rotation's answer named the new one.
    let old_key = during["secrets"][1]["public_key"].clone();
    assert!(
        old_key.as_str().is_some_and(|k| k.starts_with("whpk_")),
        "{during}"
    );
    assert_ne!(old_key, rotated["public_key"]);
    assert_eq!(
        during,
        json!({ "secrets": [
            { "secret": new, "expires_at_ms": null, "public_key": rotated["public_key"] },
            { "secret": current, "expires_at_ms": rotated["previous_secrets_expire_at_ms"],
              "public_key": old_key },
        ] })
    );
    api.events(json!({ "id": "e2", "type": "order.created" }))
        .await;
    wait_for("a1 receives e2", LONG, || async { a_sub.count() == 2 }).await;
    let e2 = &a_sub.received()[1];
    assert!(signed_by(e2, new) && signed_by(e2, &current));
    // B's secret did not change.
    assert_eq!(api.get("/v1/subscribers/b1/secret").await.1, b_view);
    // `fanout subscriber secret a1`: one line per secret, newest first.
    let base = api.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(["subscriber", "secret", "a1", "--server", &base])
            .env("FANOUT_API_TOKEN", TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!(
            "{new}\tcurrent\n{current}\tuntil {}\n",
            fanout_origin::time::format_rfc3339(
                rotated["previous_secrets_expire_at_ms"].as_i64().unwrap()
            )
        )
    );
    d.stop().await;
}

async fn list_first(api: &Api, query: &str) -> String {
    api.deliveries(query).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn changed_expired_and_orphaned_tokens_are_refused() {
    let d = Daemon::start().await;
    let api = &d.api;
    assert_eq!(
        api.post("/v1/customers", json!({ "id": "acme" })).await.0,
        201
    );
    let (token, _) = portal(api, "acme", None).await;
    assert_eq!(as_token(api, &token).get("/v1/subscribers").await.0, 200);
    // One character changed, anywhere.
    for i in [4, token.len() / 2, token.len() - 1] {
        let mut b = token.clone().into_bytes();
        b[i] = if b[i] == b'x' { b'y' } else { b'x' };
        let changed = String::from_utf8(b).unwrap();
        let (s, body) = as_token(api, &changed).get("/v1/subscribers").await;
        assert_eq!(
            (s, body["error"]["code"].clone()),
            (401, json!("unauthorized")),
            "at {i}"
        );
    }
    // Out-of-range lifetimes are refused; a short one expires.
    for ttl in [0, 7 * 24 * 3600 + 1] {
        let (s, _) = api
            .post("/v1/customers/acme/portal", json!({ "ttl_secs": ttl }))
            .await;
        assert_eq!(s, 400, "ttl {ttl}");
    }
    let (short, link) = portal(api, "acme", Some(1)).await;
    assert!(link["expires_at_ms"].as_i64().unwrap() > 0);
    assert_eq!(as_token(api, &short).get("/v1/subscribers").await.0, 200);
    // Asked until it is refused, which must not be before the link said it expires.
    let expires = link["expires_at_ms"].as_i64().unwrap();
    wait_for("the short link to expire", LONG, || async {
        as_token(api, &short).get("/v1/subscribers").await.0 != 200
    })
    .await;
    assert!(
        fanout_origin::time::now_ms() >= expires,
        "refused before it expired"
    );
    let (s, body) = as_token(api, &short).get("/v1/subscribers").await;
    assert_eq!(s, 401);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("expired"));
    // The customer removed: its links stop, and stay stopped if the id comes back.
    assert_eq!(
        api.raw("DELETE", "/v1/customers/acme", None, true).await.0,
        200
    );
    assert_eq!(as_token(api, &token).get("/v1/subscribers").await.0, 401);
    assert_eq!(
        api.post("/v1/customers", json!({ "id": "acme" })).await.0,
        201
    );
    assert_eq!(as_token(api, &token).get("/v1/subscribers").await.0, 401);
    d.stop().await;
}

/// The signing key is kept in the ledger: a link outlives a restart of the daemon.
#[tokio::test]
async fn a_link_outlives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // The ledger the suite runs on: a SQLite file, or a throwaway PostgreSQL database.
    let server = (backend() == Backend::Postgres).then(pg::PgServer::start);
    let db = match &server {
        Some(server) => std::path::PathBuf::from(server.database("fanout").await),
        None => dir.path().join("fanout.db"),
    };
    let mut first = Binary::start(&db, &[]).await;
    assert_eq!(
        first
            .api
            .post("/v1/customers", json!({ "id": "acme" }))
            .await
            .0,
        201
    );
    let (token, _) = portal(&first.api, "acme", None).await;
    first.kill9();
    let second = Binary::start(&db, &[]).await;
    assert_eq!(
        as_token(&second.api, &token).get("/v1/subscribers").await.0,
        200
    );
}

/// Portal links start with `--public-url`, whatever `Host` (or `X-Forwarded-Proto`) the call
/// that asks for one carries: a caller cannot have links point at a host of its choosing.
#[tokio::test]
async fn portal_links_take_their_host_from_public_url_not_the_request() {
    let d = Daemon::start_with(|s| fanout_origin::config::Settings {
        public_url: Some("https://hooks.example.com/".into()),
        ..s
    })
    .await;
    let (s, body) = d.api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!(s, 201, "{body}");
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}/v1/customers/acme/portal", d.api.base))
        .bearer_auth(&d.api.token)
        .header("host", "evil.example")
        .header("x-forwarded-proto", "http")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let link: Value = resp.json().await.unwrap();
    let url = link["url"].as_str().unwrap();
    assert!(
        url.starts_with("https://hooks.example.com/portal#token=fpt_"),
        "{url}"
    );
    d.stop().await;
}

/// `fanout customer add|list|show|portal|remove` against a running daemon.
#[tokio::test]
async fn customer_commands() {
    let d = Daemon::start().await;
    let (ok, out, err) = d
        .api
        .fanout(&[
            "customer",
            "add",
            "acme",
            "--weight",
            "4",
            "--max-in-flight",
            "20",
            "--json",
        ])
        .await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["id"].clone(), v["weight"].clone()),
        (json!("acme"), json!(4))
    );
    let (ok, _, err) = d.api.fanout(&["customer", "add", "acme"]).await;
    assert!(!ok && err.contains("409"), "{err}");
    let (ok, out, _) = d.api.fanout(&["customer", "list"]).await;
    assert!(ok);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row, ["acme", "4", "20", "0"]);
    let (ok, out, _) = d.api.fanout(&["customer", "show", "acme", "--json"]).await;
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["max_in_flight"],
        20
    );
    let (ok, out, err) = d
        .api
        .fanout(&["customer", "portal", "acme", "--ttl-secs", "60"])
        .await;
    assert!(ok, "{err}");
    let url = out.trim();
    let token = url.split("#token=").nth(1).unwrap();
    assert!(
        url.starts_with(&format!("{}/portal#token=fpt_", d.api.base)),
        "{url}"
    );
    assert_eq!(as_token(&d.api, token).get("/v1/subscribers").await.0, 200);
    let (ok, _, err) = d.api.fanout(&["customer", "remove", "acme"]).await;
    assert!(ok, "{err}");
    assert_eq!(as_token(&d.api, token).get("/v1/subscribers").await.0, 401);
    let (ok, _, err) = d.api.fanout(&["customer", "show", "acme"]).await;
    assert!(!ok && err.contains("404"), "{err}");
    d.stop().await;
}

/// Under contention (a small global in-flight budget, slow endpoints, deep backlogs for both),
/// a weight-4 customer is served four times as much as a weight-1 customer; with equal weights,
/// as much. Printed side by side; the split is taken over the first deliveries received, while
/// both customers still have plenty queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_share_under_contention() {
    let mut ratios = Vec::new();
    for (heavy_weight, expected) in [(4u32, 4.0f64), (1, 1.0)] {
        let d = Daemon::start_with(|s| fanout_origin::config::Settings {
            max_total_in_flight: Some(10),
            ..s
        })
        .await;
        let api = &d.api;
        for (id, w) in [("big", heavy_weight), ("small", 1)] {
            let (s, body) = api
                .post("/v1/customers", json!({ "id": id, "weight": w }))
                .await;
            assert_eq!(s, 201, "{body}");
        }
        let mut subs = Vec::new();
        for customer in ["big", "small"] {
            for k in 0..5 {
                let sub =
                    Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_millis(50)))
                        .await;
                let mut spec = sub_spec(
                    &format!("{customer}_{k}"),
                    &sub.url,
                    &[&format!("{customer}.*")],
                );
                spec["customer"] = json!(customer);
                api.subscriber(spec).await;
                subs.push((customer, sub));
            }
        }
        // Both backlogs in one request: neither customer starts ahead.
        let events: Vec<Value> = (0..120)
            .flat_map(|i| {
                ["big", "small"].map(
                    |customer| json!({ "id": format!("{customer}-{i}"), "type": format!("{customer}.tick") }),
                )
            })
            .collect();
        api.events(Value::Array(events)).await;
        let total = 200;
        wait_for("200 deliveries received", LONG, || async {
            subs.iter().map(|(_, s)| s.count()).sum::<usize>() >= total
        })
        .await;
        let mut arrivals: Vec<(std::time::Instant, &str)> = subs
            .iter()
            .flat_map(|(c, s)| s.received().into_iter().map(move |r| (r.at, *c)))
            .collect();
        arrivals.sort_by_key(|(at, _)| *at);
        let first = &arrivals[..total];
        let big = first.iter().filter(|(_, c)| *c == "big").count();
        let small = total - big;
        let ratio = big as f64 / small.max(1) as f64;
        ratios.push((heavy_weight, big, small, ratio, expected));
        d.stop().await;
    }
    for (w, big, small, ratio, expected) in &ratios {
        println!(
            "weights {w}:1 -> first 200 deliveries: big {big}, small {small}, ratio {ratio:.2} (expected {expected})"
        );
    }
    for (w, big, small, ratio, expected) in ratios {
        assert!(small > 0, "the small customer got nothing");
        assert!(
            (ratio / expected - 1.0).abs() < 0.25,
            "weights {w}:1: big {big}, small {small}, ratio {ratio:.2}, expected about {expected}"
        );
    }
}
