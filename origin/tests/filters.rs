//! Content filters against the real daemon over real sockets: a filtered subscriber gets only
//! the events its filter matches while the others get all; a bad filter is a 400 naming where
//! it is wrong, on create and on PATCH; a PATCH applies to the events ingested after it (and
//! `null` removes the filter); `POST /v1/filters/test` answers for the admin token and a portal
//! token, which may also set its own endpoint's filter; `fanout subscriber add --filter` and
//! `fanout subscriber filter` set and remove one.
//! Runs on SQLite, and on PostgreSQL with `FANOUT_TEST_LEDGER=postgres` (scripts/test.sh runs it
//! both ways).
// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

fn ev(id: &str, amount: Value, currency: &str) -> Value {
    json!({ "id": id, "type": "invoice.paid", "amount": amount, "currency": currency,
            "customer": { "tier": "gold", "name": "Zoë" } })
}

/// The event ids the ledger holds deliveries of for `sub`.
async fn delivered_ids(api: &Api, sub: &str) -> BTreeSet<String> {
    api.deliveries(&format!("subscriber={sub}&limit=1000"))
        .await
        .iter()
        .map(|d| d["event_id"].as_str().unwrap().to_string())
        .collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

async fn patch(api: &Api, path: &str, body: Value) -> (u16, Value) {
    api.raw("PATCH", path, Some(body.to_string()), true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_choose_deliveries_refuse_bad_filters_and_apply_from_their_change() {
    let d = Daemon::start().await;
    let api = &d.api;
    let all = Subscriber::ok().await;
    let big = Subscriber::ok().await;
    api.subscriber(sub_spec("all", &all.url, &["invoice.*"]))
        .await;
    let mut spec = sub_spec("big", &big.url, &["invoice.*"]);
    spec["filter"] = json!({ "amount": { "$gte": 100 }, "currency": { "$in": ["EUR", "USD"] } });
    api.subscriber(spec.clone()).await;
    let (s, shown) = api.get("/v1/subscribers/big").await;
    assert_eq!((s, &shown["filter"]), (200, &spec["filter"]), "{shown}");
    let (_, plain) = api.get("/v1/subscribers/all").await;
    assert_eq!(plain["filter"], Value::Null, "{plain}");

    // Ingest says how many deliveries each event made: the filter chose.
    let batch = json!([
        ev("e1", json!(250), "EUR"),
        ev("e2", json!(99.5), "EUR"),
        ev("e3", json!(100.0), "USD"),
        ev("e4", json!(5000), "GBP"),
        ev("e5", json!("lots"), "EUR"),
    ]);
    let answer = api.events(batch).await;
    let made: Vec<u64> = answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["deliveries"].as_u64().unwrap())
        .collect();
    assert_eq!(made, [2, 1, 2, 1, 1], "{answer}");
    assert_eq!(delivered_ids(api, "big").await, set(&["e1", "e3"]));
    assert_eq!(delivered_ids(api, "all").await.len(), 5);
    // And those are what arrive.
    wait_for("the webhooks", LONG, || async {
        all.count() >= 5 && big.count() >= 2
    })
    .await;
    let got: BTreeSet<String> = big
        .received()
        .iter()
        .map(|r| r.header("webhook-id").unwrap().to_string())
        .collect();
    assert_eq!(got, set(&["e1", "e3"]));

    // Bad filters: 400 naming the place, on create and on PATCH; nothing changes.
    let too_deep = (0..9).fold(json!(1), |v, _| json!({ "a": v }));
    let bad: &[(Value, &str)] = &[
        (
            json!({ "amount": { "$gt": "100" } }),
            "filter/amount/$gt: expected a number",
        ),
        (
            json!({ "amount": { "$regex": "x" } }),
            "filter/amount/$regex: unknown operator",
        ),
        (
            json!({ "$or": [] }),
            "filter/$or: expected a non-empty list",
        ),
        (
            json!({ "tags": { "$in": "hot" } }),
            "filter/tags/$in: expected a list",
        ),
        (
            too_deep,
            "filter/a/a/a/a/a/a/a/a: nested deeper than 8 levels",
        ),
        (json!([1]), "filter: expected an object"),
    ];
    for (filter, want) in bad {
        let mut spec = sub_spec("bad", &all.url, &["*"]);
        spec["filter"] = filter.clone();
        let (s, body) = api.post("/v1/subscribers", spec).await;
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(s, 400, "{filter}: {body}");
        assert!(msg.starts_with(want), "{filter}: {msg}");
        let (s, body) = patch(api, "/v1/subscribers/big", json!({ "filter": filter })).await;
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(s, 400, "{filter}: {body}");
        assert!(msg.starts_with(want), "{filter}: {msg}");
    }
    let (_, still) = api.get("/v1/subscribers/big").await;
    assert_eq!(still["filter"], spec["filter"]);

    // A PATCH applies to the events ingested after its answer.
    let (s, body) = patch(
        api,
        "/v1/subscribers/big",
        json!({ "filter": { "currency": "GBP" } }),
    )
    .await;
    assert_eq!(
        (s, &body["filter"]),
        (200, &json!({ "currency": "GBP" })),
        "{body}"
    );
    api.events(json!([
        ev("e6", json!(250), "EUR"),
        ev("e7", json!(1), "GBP")
    ]))
    .await;
    assert_eq!(delivered_ids(api, "big").await, set(&["e1", "e3", "e7"]));
    // `null` removes it: every event of its types again.
    let (s, body) = patch(api, "/v1/subscribers/big", json!({ "filter": null })).await;
    assert_eq!((s, &body["filter"]), (200, &Value::Null), "{body}");
    api.events(json!([ev("e8", json!(1), "JPY")])).await;
    assert_eq!(
        delivered_ids(api, "big").await,
        set(&["e1", "e3", "e7", "e8"])
    );
    assert_eq!(delivered_ids(api, "all").await.len(), 8);

    // POST /v1/filters/test, admin token.
    let test = |filter: Value, event: Value| json!({ "filter": filter, "event": event });
    let cases: &[(Value, u16, Value)] = &[
        (
            test(json!({ "amount": { "$gt": 5 } }), ev("x", json!(6), "EUR")),
            200,
            json!({ "matches": true }),
        ),
        (
            test(
                json!({ "customer": { "name": { "$startsWith": "Zo" } } }),
                ev("x", json!(1), "EUR"),
            ),
            200,
            json!({ "matches": true }),
        ),
        (
            test(
                json!({ "currency": { "$nin": ["EUR"] } }),
                ev("x", json!(1), "EUR"),
            ),
            200,
            json!({ "matches": false }),
        ),
    ];
    for (body, status, want) in cases {
        let (s, got) = api.post("/v1/filters/test", body.clone()).await;
        assert_eq!((s, &got), (*status, want), "{body}");
    }
    let (s, got) = api
        .post(
            "/v1/filters/test",
            test(json!({ "a": { "$gt": [] } }), json!({})),
        )
        .await;
    assert_eq!(s, 400, "{got}");
    assert!(got["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("filter/a/$gt: expected a number"));
    let (s, got) = api.post("/v1/filters/test", json!({ "filter": {} })).await;
    assert_eq!(s, 400, "{got}");
    let (s, _) = api
        .raw(
            "POST",
            "/v1/filters/test",
            Some(test(json!({}), json!({})).to_string()),
            false,
        )
        .await;
    assert_eq!(s, 401);

    // A portal token: the test route, and its own endpoint's filter.
    let (s, body) = api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!(s, 201, "{body}");
    let mut spec = sub_spec("acme-hook", &all.url, &["invoice.*"]);
    spec["customer"] = json!("acme");
    api.subscriber(spec).await;
    let (s, link) = api.post("/v1/customers/acme/portal", json!({})).await;
    assert_eq!(s, 201, "{link}");
    let mut portal = Api::new(api.base.clone());
    portal.token = link["token"].as_str().unwrap().to_string();
    let (s, got) = portal
        .post(
            "/v1/filters/test",
            test(json!({ "amount": { "$lt": 5 } }), ev("x", json!(6), "EUR")),
        )
        .await;
    assert_eq!((s, got), (200, json!({ "matches": false })));
    let (s, body) = patch(
        &portal,
        "/v1/subscribers/acme-hook",
        json!({ "filter": { "amount": { "$lt": 5 } } }),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = patch(
        &portal,
        "/v1/subscribers/acme-hook",
        json!({ "filter": { "amount": { "$lt": "5" } } }),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    let (s, body) = patch(&portal, "/v1/subscribers/big", json!({ "filter": {} })).await;
    assert_eq!(s, 404, "{body}");
    api.events(json!([
        ev("e9", json!(6), "EUR"),
        ev("e10", json!(4), "EUR")
    ]))
    .await;
    assert_eq!(delivered_ids(api, "acme-hook").await, set(&["e10"]));

    // The CLI: `subscriber add --filter` and `subscriber filter` (null removes it).
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(args)
            .args(["--server", &api.base])
            .env("FANOUT_API_TOKEN", &api.token)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = all.url.clone();
    let (ok, err) = tokio::task::block_in_place(|| {
        cli(&[
            "subscriber",
            "add",
            "cli_sub",
            &url,
            "-t",
            "invoice.*",
            "--filter",
            r#"{"currency":"EUR"}"#,
        ])
    });
    assert!(ok, "{err}");
    let (_, got) = api.get("/v1/subscribers/cli_sub").await;
    assert_eq!(got["filter"], json!({ "currency": "EUR" }));
    let (ok, err) = tokio::task::block_in_place(|| {
        cli(&[
            "subscriber",
            "filter",
            "cli_sub",
            r#"{"amount":{"$gt":"x"}}"#,
        ])
    });
    assert!(
        !ok && err.contains("filter/amount/$gt: expected a number"),
        "{err}"
    );
    let (ok, err) =
        tokio::task::block_in_place(|| cli(&["subscriber", "filter", "cli_sub", "null"]));
    assert!(ok, "{err}");
    let (_, got) = api.get("/v1/subscribers/cli_sub").await;
    assert_eq!(got["filter"], Value::Null);

    d.stop().await;
}
