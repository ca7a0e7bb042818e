//! Customers on a PostgreSQL ledger shared by several daemons, against throwaway PostgreSQL
//! servers the tests start themselves (tests/common/pg.rs): a portal link works on every
//! daemon; a customer is never removed while a live subscriber names it, whichever of the two
//! transactions comes first; `fanout ledger copy` brings customers, ownership, the portal key and
//! content filters over; weights set through one daemon hold on every daemon. (The customer API itself runs on PostgreSQL in tests/customers.rs with
//! `FANOUT_TEST_LEDGER=postgres`.)

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::pg::PgServer;
use common::*;
use fanout_origin::customer::Customer;
use fanout_origin::ledger::postgres::PgLedger;
use fanout_origin::ledger::{Customers, LedgerError, Subscribers};
use fanout_origin::model::{Lane, Limits, Subscriber as Definition};
use serde_json::json;

fn customer(id: &str) -> Customer {
    Customer {
        id: id.into(),
        weight: 1,
        max_in_flight: None,
        portal_nonce: format!("nonce-{id}"),
        created_ms: 1,
        updated_ms: 1,
    }
}

fn owned(id: &str, customer: &str) -> Definition {
    let limits = Limits {
        rate_per_sec: 10.0,
        burst: 10,
        max_in_flight: 4,
        timeout_ms: 1000,
    };
    Definition {
        lane: Lane::Origin,
        created_ms: 1,
        updated_ms: 1,
        customer: Some(customer.into()),
        ..Definition::new(id, "https://example.com/h", &["*"], limits)
    }
}

/// Wait until `n` sessions of the server wait on a lock (another transaction holds the row).
async fn waiting_on_a_lock(watcher: &tokio_postgres::Client, n: i64) {
    wait_for(
        "a transaction waiting on a row lock",
        Duration::from_secs(10),
        || async {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            waiting == n
        },
    )
    .await;
}

/// Another daemon's transaction, caught between its statements with raw SQL (each doing what
/// the ledger's own operation does first), and the ledger's operation run against it: the
/// removal of a customer waits for a subscriber being created under it and then refuses; the
/// creation of a subscriber under a customer being removed waits for it and then refuses.
#[tokio::test]
async fn a_customer_is_never_removed_while_a_live_subscriber_names_it() {
    let server = PgServer::start();
    let url = server.database("c").await;
    let ledger = PgLedger::open(&url, "daemon-a").await.unwrap();
    let watcher = server.connect("c").await;
    Customers::create_customer(&ledger, customer("acme"))
        .await
        .unwrap();
    Customers::create_customer(&ledger, customer("globex"))
        .await
        .unwrap();

    // 1. A subscriber is being created under acme (not committed yet) when acme is removed.
    let mut other = server.connect("c").await;
    let creating = other.transaction().await.unwrap();
    creating
        .execute("SELECT 1 FROM customers WHERE id = 'acme' FOR SHARE", &[])
        .await
        .unwrap();
    creating
        .execute(
            "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                 timeout_ms, lane, created_ms, updated_ms, customer)
             VALUES ('hook', 'https://example.com/h', '[\"*\"]', 1, 1, 1, 1000, 'origin', 1, 1,
                     'acme')",
            &[],
        )
        .await
        .unwrap();
    let removing = tokio::spawn({
        let ledger = ledger.clone();
        async move { Customers::delete_customer(&ledger, "acme".into()).await }
    });
    waiting_on_a_lock(&watcher, 1).await;
    creating.commit().await.unwrap();
    let removed = removing.await.unwrap();
    assert!(
        matches!(removed, Err(LedgerError::Conflict(_))),
        "{removed:?}"
    );
    assert_eq!(
        Customers::customer(&ledger, "acme".into())
            .await
            .unwrap()
            .id,
        "acme"
    );

    // 2. Globex is being removed (not committed yet) when a subscriber is created under it.
    let removing = other.transaction().await.unwrap();
    removing
        .execute("DELETE FROM customers WHERE id = 'globex'", &[])
        .await
        .unwrap();
    let creating = tokio::spawn({
        let ledger = ledger.clone();
        async move { Subscribers::create_subscriber(&ledger, owned("g1", "globex"), "s".into()).await }
    });
    waiting_on_a_lock(&watcher, 1).await;
    removing.commit().await.unwrap();
    let created = creating.await.unwrap();
    assert!(
        matches!(created, Err(LedgerError::Invalid(_))),
        "{created:?}"
    );
    assert!(matches!(
        Subscribers::subscriber(&ledger, "g1".into(), None).await,
        Err(LedgerError::NotFound(_))
    ));
    let names_a_missing_customer: i64 = watcher
        .query_one(
            "SELECT COUNT(*) FROM subscribers s WHERE s.deleted_ms IS NULL
             AND s.customer IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM customers c WHERE c.id = s.customer)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(names_a_missing_customer, 0);
}

/// The portal key is one row of the shared ledger: a link issued by one daemon works on
/// another (and on a daemon started later), a customer removed through one is refused by all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_works_on_every_daemon() {
    let server = PgServer::start();
    let url = server.database("shared").await;
    let db = Path::new(&url);
    let a = Binary::start(db, &[]).await;
    let b = Binary::start(db, &[]).await;
    let (s, body) = a.api.post("/v1/customers", json!({ "id": "acme" })).await;
    assert_eq!(s, 201, "{body}");
    let (s, body) = b.api.get("/v1/customers/acme").await;
    assert_eq!(s, 200, "{body}");
    let (s, link) = a.api.post("/v1/customers/acme/portal", json!({})).await;
    assert_eq!(s, 201, "{link}");
    let token = link["token"].as_str().unwrap().to_string();
    let later = Binary::start(db, &[]).await;
    for d in [&a, &b, &later] {
        let mut portal = Api::new(d.api.base.clone());
        portal.token = token.clone();
        let (s, body) = portal.get("/v1/subscribers").await;
        assert_eq!(
            s, 200,
            "{} refused a link issued by another daemon: {body}",
            d.api.base
        );
    }
    let (s, _) = b.api.raw("DELETE", "/v1/customers/acme", None, true).await;
    assert_eq!(s, 200);
    for d in [&a, &b, &later] {
        let mut portal = Api::new(d.api.base.clone());
        portal.token = token.clone();
        assert_eq!(portal.get("/v1/subscribers").await.0, 401, "{}", d.api.base);
    }
}

/// `fanout ledger copy` brings a SQLite ledger's customers over, with which subscriber each
/// owns and the portal key: a link issued on SQLite works on the PostgreSQL daemon after the
/// move, and still sees only its own customer's endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_copy_brings_customers_and_links_over() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fanout.db");
    let sink = Subscriber::ok().await;
    let mut before = Binary::start(&file, &[]).await;
    for (id, weight) in [("acme", 4), ("globex", 1)] {
        let (s, body) = before
            .api
            .post("/v1/customers", json!({ "id": id, "weight": weight }))
            .await;
        assert_eq!(s, 201, "{body}");
    }
    for (id, owner) in [("a1", Some("acme")), ("b1", Some("globex")), ("op", None)] {
        let mut spec = sub_spec(id, &sink.url, &["order.*"]);
        if let Some(c) = owner {
            spec["customer"] = json!(c);
        }
        if id == "a1" {
            spec["filter"] = json!({ "n": { "$gt": 1 } });
        }
        before.api.subscriber(spec).await;
    }
    let (s, link) = before
        .api
        .post("/v1/customers/acme/portal", json!({}))
        .await;
    assert_eq!(s, 201, "{link}");
    let token = link["token"].as_str().unwrap().to_string();
    before.kill9();

    let server = PgServer::start();
    let url = server.database("moved").await;
    let out = tokio::task::spawn_blocking({
        let (file, url) = (file.clone(), url.clone());
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
                .args(["ledger", "copy", "--from"])
                .arg(&file)
                .args(["--to", &url])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("customers: 2"), "{stderr}");

    let after = Binary::start(Path::new(&url), &[]).await;
    let (s, list) = after.api.get("/v1/customers").await;
    assert_eq!(s, 200, "{list}");
    let got: Vec<(String, u64, u64)> = list["customers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["weight"].as_u64().unwrap(),
                c["subscribers"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![("acme".to_string(), 4, 1), ("globex".to_string(), 1, 1)]
    );
    let mut portal = Api::new(after.api.base.clone());
    portal.token = token;
    let (s, list) = portal.get("/v1/subscribers").await;
    assert_eq!(s, 200, "the link issued before the move: {list}");
    let seen: Vec<&str> = list["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(seen, ["a1"]);
    assert_eq!(portal.get("/v1/subscribers/b1").await.0, 404);
    // Its content filter came over, and chooses there.
    assert_eq!(
        list["subscribers"][0]["filter"],
        json!({ "n": { "$gt": 1 } })
    );
    let made = after
        .api
        .events(json!([{ "id": "e1", "type": "order.x", "n": 1 }, { "id": "e2", "type": "order.x", "n": 2 }]))
        .await;
    assert_eq!(made["events"][0]["deliveries"], 2, "{made}");
    assert_eq!(made["events"][1]["deliveries"], 3, "{made}");
}

/// Two daemons dispatch from one ledger; the customers and their weights are set through one of
/// them after both started. The other hears of it (`NOTIFY fanout_customers`), and each tells
/// the other what it has in flight per customer: together, under contention, a weight-4
/// customer is served about four times as much as a weight-1 customer, even when the daemons
/// split the endpoints unevenly. Here one daemon owns three of the heavy customer's endpoints
/// and nothing else, the other two of the heavy one's and the light one's three: the first
/// can only give its whole budget to the heavy customer, so the second gives the light one
/// more of its own (sharing only its own, it gave 8:2, and the heavy customer got 9 times as
/// much).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_set_through_one_daemon_hold_across_daemons() {
    let server = PgServer::start();
    let url = server.database("weights").await;
    let db = Path::new(&url);
    let extra = ["--max-total-in-flight", "10"];
    let a = Binary::start(db, &extra).await;
    let b = Binary::start(db, &extra).await;
    a.sees_daemons(2).await;
    b.sees_daemons(2).await;
    let pg = server.connect("weights").await;
    let names: Vec<String> = pg
        .query("SELECT name FROM daemons ORDER BY name", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let share = fanout_origin::model::Share::new(&names[0], names.clone());
    // Endpoint names for `customer`, `want[i]` of them owned by daemon `names[i]`.
    let endpoints = |customer: &str, want: [usize; 2]| -> Vec<String> {
        let mut left = want;
        let mut ids = Vec::new();
        for k in 0.. {
            let id = format!("{customer}_{k}");
            let i = usize::from(share.owner(&id) != names[0]);
            if left[i] > 0 {
                left[i] -= 1;
                ids.push(id);
            }
            if left == [0, 0] {
                break;
            }
        }
        ids
    };
    for (id, weight) in [("big", 4), ("small", 1)] {
        let (s, body) = a
            .api
            .post("/v1/customers", json!({ "id": id, "weight": weight }))
            .await;
        assert_eq!(s, 201, "{body}");
    }
    let mut subs = Vec::new();
    for (customer, want) in [("big", [3, 2]), ("small", [0, 3])] {
        for id in endpoints(customer, want) {
            let sub =
                Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_millis(100)))
                    .await;
            let mut spec = sub_spec(&id, &sub.url, &[&format!("{customer}.*")]);
            spec["customer"] = json!(customer);
            a.api.subscriber(spec).await;
            subs.push((customer, sub));
        }
    }
    // Both backlogs in one request: neither customer starts ahead. About 200 deliveries a
    // second (20 in flight, 100 ms each): neither runs out within the 6 s measured.
    let events: Vec<serde_json::Value> = (0..1_500)
        .flat_map(|i| {
            ["big", "small"].map(
                |customer| json!({ "id": format!("{customer}-{i}"), "type": format!("{customer}.tick") }),
            )
        })
        .collect();
    a.api.events(serde_json::Value::Array(events)).await;
    // The daemons tell each other every second: the split is read after the first 2.5 s.
    let arrivals = || {
        let mut all: Vec<(std::time::Instant, &str)> = subs
            .iter()
            .flat_map(|(c, s)| s.received().into_iter().map(move |r| (r.at, *c)))
            .collect();
        all.sort_by_key(|(at, _)| *at);
        all
    };
    wait_for("the first delivery", Duration::from_secs(30), || async {
        !arrivals().is_empty()
    })
    .await;
    let first = arrivals()[0].0;
    let (from, to) = (Duration::from_millis(2_500), Duration::from_millis(5_500));
    wait_for("5.5 s of deliveries", Duration::from_secs(60), || async {
        arrivals().last().is_some_and(|(at, _)| *at - first >= to)
    })
    .await;
    let window: Vec<&str> = arrivals()
        .into_iter()
        .filter(|(at, _)| (from..to).contains(&(*at - first)))
        .map(|(_, c)| c)
        .collect();
    let big = window.iter().filter(|c| **c == "big").count();
    let small = window.len() - big;
    let ratio = big as f64 / small.max(1) as f64;
    println!(
        "two daemons, weights 4:1, endpoints big 3+2 / small 0+3 -> deliveries from 2.5 s to 5.5 s: big {big}, small {small}, ratio {ratio:.2}"
    );
    assert!(small > 0 && big + small > 300, "big {big}, small {small}");
    assert!(
        (ratio / 4.0 - 1.0).abs() < 0.25,
        "big {big}, small {small}, ratio {ratio:.2}, expected about 4"
    );
}

/// A daemon on PostgreSQL serves customers (they were refused with 501 `not_supported` before
/// migration 3); with PostgreSQL gone, ingest answers 503 `unavailable`. (The customers'
/// operations themselves: `ledger_parity.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_are_served_on_postgres_and_a_lost_server_is_unavailable() {
    let mut server = PgServer::start();
    let url = server.database("c").await;
    let daemon = common::Daemon::start_with(|mut s| {
        s.db = Some(url.clone().into());
        s
    })
    .await;
    let api = &daemon.api;
    let acme = serde_json::json!({ "id": "acme", "weight": 3 });
    let (s, body) = api.post("/v1/customers", acme).await;
    assert_eq!((s, body["weight"].clone()), (201, 3.into()), "{body}");
    let spec = serde_json::json!({ "id": "s1", "url": "http://127.0.0.1:9/h", "event_types": ["*"], "rate_per_sec": 0.001, "customer": "acme" });
    let (s, body) = api.post("/v1/subscribers", spec).await;
    assert_eq!(
        (s, body["customer"].clone()),
        (201, "acme".into()),
        "{body}"
    );
    let (s, body) = api.get("/v1/customers/acme").await;
    assert_eq!((s, body["subscribers"].clone()), (200, 1.into()), "{body}");

    server.stop();
    let (s, body) = api
        .post(
            "/v1/events",
            serde_json::json!([{ "id": "e1", "type": "t", "data": {} }]),
        )
        .await;
    assert_eq!(
        (s, body["error"]["code"].clone()),
        (503, "unavailable".into()),
        "{body}"
    );
}
