//! The daemon's own failures are capped like a subscriber's: deliveries it cannot sign (every
//! stored secret of their subscriber is unreadable, as a ledger written by another version
//! could leave it) count failed attempts and go dead with a clear error at the attempt limit,
//! while the dispatcher goes on delivering to everyone else, and the operator hears of each by a
//! signed `fanout.delivery.not_sent` alert.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{alert_secret, signed_alerts, wait_for, Daemon, Subscriber};
use fanout_origin::config::Settings;

#[tokio::test]
async fn deliveries_that_cannot_be_signed_go_dead_and_the_rest_flow() {
    let poisoned = Subscriber::ok().await;
    let healthy = Subscriber::ok().await;
    let op = Subscriber::ok().await;
    let op_url = format!("{}/alerts", op.url);
    // max 3 attempts, backoff scaled to 1%
    let d = Daemon::start_with(move |s| Settings {
        alert_url: Some(op_url),
        alert_secret: Some(alert_secret().encode()),
        ..s
    })
    .await;
    d.api
        .subscriber(common::sub_spec(
            "sub_poison",
            &format!("{}/h", poisoned.url),
            &["*"],
        ))
        .await;
    d.api
        .subscriber(common::sub_spec(
            "sub_ok",
            &format!("{}/h", healthy.url),
            &["*"],
        ))
        .await;
    // Every secret of sub_poison becomes unreadable in the ledger itself.
    let db = d.dir.path().join("fanout.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    let n = c
        .execute(
            "UPDATE subscriber_secrets SET secret = 'not a secret' WHERE subscriber_id = 'sub_poison'",
            [],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(c);
    // An edit makes the dispatcher read the subscriber again.
    let (status, body) = d
        .api
        .raw(
            "PATCH",
            "/v1/subscribers/sub_poison",
            Some(r#"{"timeout_ms":2000}"#.into()),
            true,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    d.api.events(common::events("p", 5, "t")).await;
    let api = d.api.clone();
    wait_for(
        "the poisoned deliveries dead, the others sent",
        Duration::from_secs(20),
        || {
            let api = api.clone();
            async move {
                api.count("subscriber=sub_poison&status=dead").await == 5
                    && api.count("subscriber=sub_ok&status=sent").await == 5
            }
        },
    )
    .await;
    assert_eq!(poisoned.count(), 0, "nothing unsigned ever left the daemon");
    assert_eq!(healthy.count(), 5);
    for dl in d.api.deliveries("subscriber=sub_poison&status=dead").await {
        assert_eq!(dl["attempt_count"], 3, "{dl}");
        let error = dl["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains("no usable signing secret") && error.contains("gave up after 3"),
            "{error}"
        );
    }
    // One signed alert per poisoned delivery, naming it, its event and why.
    let dead: Vec<String> = d
        .api
        .deliveries("subscriber=sub_poison&status=dead")
        .await
        .iter()
        .map(|dl| dl["id"].as_str().unwrap().to_string())
        .collect();
    let op_ = &op;
    wait_for(
        "five not_sent alerts",
        Duration::from_secs(20),
        || async move { signed_alerts(op_).len() >= 5 },
    )
    .await;
    let alerts = signed_alerts(&op);
    assert_eq!(alerts.len(), 5, "{alerts:?}");
    let mut named: Vec<String> = Vec::new();
    for a in &alerts {
        assert_eq!(a["type"], "fanout.delivery.not_sent", "{a}");
        assert_eq!(a["subscriber"], "sub_poison", "{a}");
        let details = &a["details"];
        assert!(
            details["event_id"].as_str().unwrap().starts_with("p_"),
            "{a}"
        );
        assert!(
            details["reason"]
                .as_str()
                .unwrap()
                .contains("no usable signing secret"),
            "{a}"
        );
        named.push(details["delivery"].as_str().unwrap().to_string());
    }
    named.sort();
    let mut dead = dead;
    dead.sort();
    assert_eq!(named, dead, "each dead delivery alerted once");
    // The dispatcher is still up and delivering.
    d.api.events(common::events("q", 3, "t")).await;
    let api = d.api.clone();
    wait_for("later events delivered", Duration::from_secs(10), || {
        let api = api.clone();
        async move { api.count("subscriber=sub_ok&status=sent").await == 8 }
    })
    .await;
    d.stop().await;
}
