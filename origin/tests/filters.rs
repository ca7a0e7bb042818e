//! Content filters against the real daemon over real sockets: a filtered subscriber gets only
//! the events its filter matches while the others get all; a bad filter is a 400 naming where
//! it is wrong, on create and on PATCH; a PATCH applies to the events ingested after it (and
//! `null` removes the filter); `POST /v1/filters/test` answers for the admin token and a portal
//! token, which may also set its own endpoint's `customer_filter` but never the operator's
//! `filter` (an event goes only where both match); `fanout subscriber add --filter` and
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
        json!({ "customer_filter": { "amount": { "$lt": 5 } } }),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = patch(
        &portal,
        "/v1/subscribers/acme-hook",
        json!({ "customer_filter": { "amount": { "$lt": "5" } } }),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("customer_filter/amount/$lt: expected a number"));
    let (s, body) = patch(
        &portal,
        "/v1/subscribers/big",
        json!({ "customer_filter": {} }),
    )
    .await;
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

/// The portal narrows what its endpoint receives, never widens it (issue 35): the operator
/// routes each customer's invoices to its endpoint with `filter`; a portal token that tries to
/// clear or replace it is refused (403) and the other customer's invoices never reach it; its
/// own `customer_filter` narrows further, and removing that gives back exactly the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_token_narrows_its_endpoint_never_widens_it() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sinks = [Subscriber::ok().await, Subscriber::ok().await];
    let mut tokens = Vec::new();
    for (customer, sink) in ["acme", "globex"].into_iter().zip(&sinks) {
        let (s, body) = api.post("/v1/customers", json!({ "id": customer })).await;
        assert_eq!(s, 201, "{body}");
        let mut spec = sub_spec(&format!("{customer}-hook"), &sink.url, &["invoice.*"]);
        spec["customer"] = json!(customer);
        spec["filter"] = json!({ "customer": customer });
        api.subscriber(spec).await;
        let (s, link) = api
            .post(&format!("/v1/customers/{customer}/portal"), json!({}))
            .await;
        assert_eq!(s, 201, "{link}");
        tokens.push(link["token"].as_str().unwrap().to_string());
    }
    let mut portal = Api::new(api.base.clone());
    portal.token = tokens[0].clone();
    let invoice = |id: &str, customer: &str, amount: u64| json!({ "id": id, "type": "invoice.paid", "customer": customer, "amount": amount });

    // The attack: clear or replace the operator's filter. Refused, and nothing changes.
    for body in [
        json!({ "filter": null }),
        json!({ "filter": {} }),
        json!({ "filter": { "customer": "globex" } }),
        json!({ "filter": null, "disabled": false }),
    ] {
        let (s, got) = patch(&portal, "/v1/subscribers/acme-hook", body.clone()).await;
        assert_eq!(
            (s, got["error"]["code"].clone()),
            (403, json!("forbidden")),
            "{body}: {got}"
        );
    }
    let (_, shown) = portal.get("/v1/subscribers/acme-hook").await;
    assert_eq!(
        (&shown["filter"], &shown["customer_filter"]),
        (&json!({ "customer": "acme" }), &Value::Null),
        "{shown}"
    );
    api.events(json!([
        invoice("i1", "acme", 5),
        invoice("i2", "globex", 5)
    ]))
    .await;
    assert_eq!(delivered_ids(api, "acme-hook").await, set(&["i1"]));
    assert_eq!(delivered_ids(api, "globex-hook").await, set(&["i2"]));

    // The customer's own filter narrows: both must match.
    let (s, got) = patch(
        &portal,
        "/v1/subscribers/acme-hook",
        json!({ "customer_filter": { "amount": { "$gte": 100 } } }),
    )
    .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(
        (&got["filter"], &got["customer_filter"]),
        (
            &json!({ "customer": "acme" }),
            &json!({ "amount": { "$gte": 100 } })
        ),
        "{got}"
    );
    // An operator's change of its filter leaves the customer's.
    let (s, got) = patch(
        api,
        "/v1/subscribers/acme-hook",
        json!({ "filter": { "customer": { "$in": ["acme"] } } }),
    )
    .await;
    assert_eq!(
        (s, &got["customer_filter"]),
        (200, &json!({ "amount": { "$gte": 100 } })),
        "{got}"
    );
    api.events(json!([
        invoice("i3", "acme", 5),
        invoice("i4", "acme", 500),
        invoice("i5", "globex", 500)
    ]))
    .await;
    assert_eq!(delivered_ids(api, "acme-hook").await, set(&["i1", "i4"]));

    // Removing its own filter gives back the operator's, not everything.
    let (s, got) = patch(
        &portal,
        "/v1/subscribers/acme-hook",
        json!({ "customer_filter": null }),
    )
    .await;
    assert_eq!((s, &got["customer_filter"]), (200, &Value::Null), "{got}");
    api.events(json!([
        invoice("i6", "acme", 1),
        invoice("i7", "globex", 1)
    ]))
    .await;
    assert_eq!(
        delivered_ids(api, "acme-hook").await,
        set(&["i1", "i4", "i6"])
    );
    assert_eq!(
        delivered_ids(api, "globex-hook").await,
        set(&["i2", "i5", "i7"])
    );
    // And what arrives over the wire is the same: no other customer's invoice.
    wait_for("the webhooks", LONG, || async {
        sinks[0].count() >= 3 && sinks[1].count() >= 3
    })
    .await;
    let got = |sink: &Subscriber| -> BTreeSet<String> {
        sink.received()
            .iter()
            .map(|r| r.header("webhook-id").unwrap().to_string())
            .collect()
    };
    assert_eq!(got(&sinks[0]), set(&["i1", "i4", "i6"]));
    assert_eq!(got(&sinks[1]), set(&["i2", "i5", "i7"]));
    d.stop().await;
}

/// `POST /v1/filters/test` cannot stall the daemon (issue 35): the costliest tests a caller can
/// send (every clause scanning the largest event) run off the request threads, so `/healthz`
/// answers within 100 ms while they run; past its cap a test answers 400 naming it; each caller
/// has its own rate (429 beyond it); an event ingest would refuse is refused here too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_tests_are_bounded_and_never_hold_up_healthz() {
    let d = Daemon::start_with(|mut s| {
        s.max_event_bytes = Some(256 << 10);
        s
    })
    .await;
    let api = &d.api;
    // The costliest filter the limits allow against the largest event: 45 clauses (16 KB of
    // filter), 15 of them an `$in` of 256 values, each scanning an array of ~130,000 numbers.
    let list: Vec<u32> = (1..=256).collect();
    let clauses: Vec<Value> = (0..45)
        .map(|i| json!({ "t": { "$in": if i < 15 { list.clone() } else { vec![1] } } }))
        .collect();
    let event = format!(r#"{{"t":[{}0]}}"#, "0,".repeat((256 << 10) / 2 - 16));
    let worst = format!(
        r#"{{"filter":{},"event":{event}}}"#,
        json!({ "$or": clauses })
    );
    let running: Vec<_> = (0..10)
        .map(|_| {
            let (api, body) = (api.clone(), worst.clone());
            tokio::spawn(async move { api.raw("POST", "/v1/filters/test", Some(body), true).await })
        })
        .collect();
    let (mut probes, mut slowest) = (0, Duration::ZERO);
    while !running.iter().all(|t| t.is_finished()) {
        let t0 = std::time::Instant::now();
        let (s, _) = api.raw("GET", "/healthz", None, false).await;
        slowest = slowest.max(t0.elapsed());
        assert_eq!(s, 200);
        assert!(
            slowest < Duration::from_millis(100),
            "/healthz took {slowest:?} while filter tests ran"
        );
        probes += 1;
    }
    assert!(probes >= 3, "the tests ran for {probes} probes only");
    assert!(
        slowest < Duration::from_millis(100),
        "/healthz took {slowest:?} while filter tests ran"
    );
    for t in running {
        let (s, got) = t.await.unwrap();
        assert_eq!(s, 400, "{got}");
        let msg = got["error"]["message"].as_str().unwrap();
        assert!(msg.contains("takes more than 2000000 steps"), "{msg}");
    }

    // Each caller its own rate: a burst, then 429; the operator's spent burst leaves a portal
    // customer's whole.
    let (s, body) = api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!(s, 201, "{body}");
    let (s, link) = api.post("/v1/customers/acme/portal", json!({})).await;
    assert_eq!(s, 201, "{link}");
    let mut portal = Api::new(api.base.clone());
    portal.token = link["token"].as_str().unwrap().to_string();
    let mut answers = Vec::new();
    for caller in [api, &portal, api] {
        let mut got = Vec::new();
        for _ in 0..40 {
            let (s, body) = caller
                .post(
                    "/v1/filters/test",
                    json!({ "filter": { "a": 1 }, "event": { "a": 1 } }),
                )
                .await;
            assert!(
                s == 200 || body["error"]["code"] == "rate_limited",
                "{body}"
            );
            got.push(s);
            if s == 429 {
                break;
            }
        }
        answers.push(got);
    }
    // (10 a burst, then 2 a second: a slow machine earns a few back meanwhile.) The
    // operator's burst went to the ten costly tests above, so it starts with what it earned
    // back while they ran (none, on a fast machine); the portal customer's is whole.
    assert_eq!(answers[0].last(), Some(&429), "{answers:?}");
    assert!(
        answers[1].len() >= 10 && answers[1].last() == Some(&429),
        "{answers:?}"
    );
    assert!(
        answers[2].len() <= 2,
        "the operator's bucket is still spent: {answers:?}"
    );
    d.stop().await;
}

/// One parser decides (issue 35): an event the filters and ordering keys could not read is
/// refused at ingest with 400 naming why, in a batch too, and never reaches a filtered (or
/// any) subscriber; the filter test route refuses it the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_the_filters_cannot_read_are_refused_at_ingest() {
    let d = Daemon::start().await;
    let api = &d.api;
    let sink = Subscriber::ok().await;
    let mut spec = sub_spec("acme-hook", &sink.url, &["invoice.*"]);
    spec["filter"] = json!({ "customer": "acme" });
    api.subscriber(spec).await;
    let mut spec = sub_spec("ordered", &sink.url, &["invoice.*"]);
    spec["ordering"] = json!("key");
    spec["ordering_key"] = json!("/customer");
    api.subscriber(spec).await;
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let cases: &[(String, &str)] = &[
        (
            r#"{"id":"s1","type":"invoice.paid","customer":"\ud800"}"#.into(),
            "unexpected end of hex escape",
        ),
        (
            r#"{"id":"s2","type":"invoice.paid","customer":"acme","n":1e400}"#.into(),
            "number out of range",
        ),
        (
            format!(r#"{{"id":"s3","type":"invoice.paid","customer":"acme","d":{deep}}}"#),
            "nested deeper than 64 levels",
        ),
        (
            r#"{"id":"s4","type":"invoice.paid","customer":"globex","customer":"acme"}"#.into(),
            r#"the key "customer" appears twice"#,
        ),
    ];
    for (body, why) in cases {
        for (text, at) in [(body.clone(), ""), (format!("[{body}]"), "event 0: ")] {
            let (s, got) = api
                .raw("POST", "/v1/events", Some(text.clone()), true)
                .await;
            let msg = got["error"]["message"].as_str().unwrap_or_default();
            assert_eq!(s, 400, "{text:.60}: {got}");
            assert!(
                msg.starts_with(&format!("{at}the event cannot be read as JSON values"))
                    && msg.contains(why),
                "{text:.60}: {msg}"
            );
        }
        let test = format!(r#"{{"filter":{{"customer":"acme"}},"event":{body}}}"#);
        let (s, got) = api.raw("POST", "/v1/filters/test", Some(test), true).await;
        assert_eq!(s, 400, "{got}");
        assert!(
            got["error"]["message"].as_str().unwrap().contains(why),
            "{got}"
        );
    }
    assert!(
        api.deliveries("limit=1000").await.is_empty(),
        "nothing was ingested"
    );
    d.stop().await;
}
