//! The daemon's own failures are capped like a subscriber's: deliveries it cannot sign (every
//! stored secret of their subscriber is unreadable, as a ledger written by another version
//! could leave it) count failed attempts and go dead with a clear error at the attempt limit,
//! while the dispatcher goes on delivering to everyone else.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{wait_for, Daemon, Subscriber};

#[tokio::test]
async fn deliveries_that_cannot_be_signed_go_dead_and_the_rest_flow() {
    let poisoned = Subscriber::ok().await;
    let healthy = Subscriber::ok().await;
    let d = Daemon::start().await; // max 3 attempts, backoff scaled to 1%
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
