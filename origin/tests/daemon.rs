//! The daemon end to end through its API: real SQLite files, real subscriber servers.

mod common;

use std::time::{Duration, Instant};

use common::*;
use fanout_core::sign::{self, Secret};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(20);

#[tokio::test]
async fn ingest_is_idempotent_and_fans_out_by_type() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    d.api
        .subscriber(sub_spec(
            "all_video",
            &format!("{}/a", sink.url),
            &["video.*"],
        ))
        .await;
    d.api
        .subscriber(sub_spec(
            "trending",
            &format!("{}/b", sink.url),
            &["video.trending"],
        ))
        .await;
    d.api
        .subscriber(sub_spec("audio", &format!("{}/c", sink.url), &["audio.*"]))
        .await;

    let raw = r#"[{ "id": "e1",  "type": "video.trending" },
        {"id":"e2","type":"video.uploaded"}, {"id":"e3","type":"billing.paid"},
        {"id":"e1","type":"video.trending"}]"#;
    let (status, body) = d
        .api
        .raw("POST", "/v1/events", Some(raw.into()), true)
        .await;
    assert_eq!(status, 202, "{body}");
    let got: Vec<(String, u64, bool)> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_string(),
                e["deliveries"].as_u64().unwrap(),
                e["duplicate"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("e1".into(), 2, false),
            ("e2".into(), 1, false),
            ("e3".into(), 0, false),
            ("e1".into(), 0, true)
        ]
    );
    // A single event object gets a single answer; re-sending changes nothing.
    let single = d
        .api
        .events(json!({ "id": "e2", "type": "video.uploaded" }))
        .await;
    assert_eq!(
        single,
        json!({ "id": "e2", "deliveries": 0, "duplicate": true })
    );

    wait_for("3 deliveries sent", LONG, || async {
        d.api.count("status=sent").await == 3
    })
    .await;
    let mut paths: Vec<(String, String)> = sink
        .received()
        .iter()
        .map(|r| (r.path.clone(), r.header("webhook-id").unwrap().to_string()))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        vec![
            ("/a".into(), "e1".into()),
            ("/a".into(), "e2".into()),
            ("/b".into(), "e1".into())
        ]
    );
    // The body is sent byte for byte as received.
    let e1 = sink
        .received()
        .into_iter()
        .find(|r| r.path == "/b")
        .unwrap();
    assert_eq!(
        &e1.body[..],
        br#"{ "id": "e1",  "type": "video.trending" }"#
    );
    assert_eq!(d.api.count("").await, 3);
    d.stop().await;
}

#[tokio::test]
async fn origin_lane_signs_with_standard_webhooks_and_rotation_keeps_the_old_secret() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    let mut spec = sub_spec("signed", &format!("{}/hook", sink.url), &["*"]);
    spec["legacy_signature"] = json!(true);
    let old = d.api.subscriber(spec).await;
    d.api
        .events(json!({ "id": "evt_sig_1", "type": "video.trending", "email": "a@b.c" }))
        .await;
    wait_for("first delivery", LONG, || async { sink.count() == 1 }).await;

    let (status, rotated) = d
        .api
        .post("/v1/subscribers/signed/rotate-secret", json!({}))
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    let (_, view) = d.api.get("/v1/subscribers/signed").await;
    assert_eq!(view["active_secrets"], 2);
    d.api
        .events(json!({ "id": "evt_sig_2", "type": "video.trending" }))
        .await;
    wait_for("second delivery", LONG, || async { sink.count() == 2 }).await;

    let now = fanout_origin::time::now_ms() / 1000;
    let old_s = Secret::parse(&old).unwrap();
    let new_s = Secret::parse(&new).unwrap();
    let check = |r: &Received, secrets: &[Secret]| {
        sign::verify(
            secrets,
            r.header("webhook-id"),
            r.header("webhook-timestamp"),
            r.header("webhook-signature"),
            &r.body,
            now,
        )
    };
    let got = sink.received();
    assert_eq!(got[0].header("webhook-id"), Some("evt_sig_1"));
    check(&got[0], std::slice::from_ref(&old_s)).unwrap();
    assert!(check(&got[0], std::slice::from_ref(&new_s)).is_err());
    // During the grace period both secrets sign: verifiers holding either accept.
    check(&got[1], std::slice::from_ref(&old_s)).unwrap();
    check(&got[1], std::slice::from_ref(&new_s)).unwrap();
    assert_eq!(
        got[1]
            .header("webhook-signature")
            .unwrap()
            .split(' ')
            .count(),
        2
    );
    assert_eq!(
        got[1].header("x-fanout-signature"),
        Some(new_s.sign_legacy(&got[1].body).as_str())
    );
    assert_eq!(got[0].header("content-type"), Some("application/json"));
    d.stop().await;
}

#[tokio::test]
async fn rotated_out_secret_stops_signing_after_the_grace_period() {
    let d = Daemon::start_with(|s| fanout_origin::config::Settings {
        rotation_grace_secs: Some(1),
        ..s
    })
    .await;
    let sink = Subscriber::ok().await;
    let old = d
        .api
        .subscriber(sub_spec("short_grace", &sink.url, &["*"]))
        .await;
    let (_, rotated) = d
        .api
        .post("/v1/subscribers/short_grace/rotate-secret", json!({}))
        .await;
    let new = rotated["secret"].as_str().unwrap().to_string();
    // Waits for the end of the grace period the daemon stated (not a guess of it).
    let grace_ends = rotated["previous_secrets_expire_at_ms"].as_i64().unwrap();
    wait_for("the grace period to end", LONG, || async {
        fanout_origin::time::now_ms() > grace_ends
    })
    .await;
    d.api
        .events(json!({ "id": "evt_after_grace", "type": "t" }))
        .await;
    wait_for("delivery", LONG, || async { sink.count() == 1 }).await;
    let r = &sink.received()[0];
    let now = fanout_origin::time::now_ms() / 1000;
    let verify = |s: &str| {
        sign::verify(
            &[Secret::parse(s).unwrap()],
            r.header("webhook-id"),
            r.header("webhook-timestamp"),
            r.header("webhook-signature"),
            &r.body,
            now,
        )
    };
    verify(&new).unwrap();
    assert!(verify(&old).is_err(), "the old secret has dropped");
    d.stop().await;
}

/// One subscriber per answer; every outcome lands where the retry rules (docs/src/webhooks.md) say.
#[tokio::test]
async fn classification_table() {
    let d = Daemon::start().await; // max 3 attempts, backoff scaled to 1%
    let redirect_target = Subscriber::ok().await;
    let cases: Vec<(&str, Answer, &str, u64)> = vec![
        ("ok_200", Answer::status(200), "sent", 1),
        ("ok_204", Answer::status(204), "sent", 1),
        ("gone_410", Answer::status(410), "dead", 1),
        ("missing_404", Answer::status(404), "dead", 1),
        ("error_500", Answer::status(500).body("boom"), "dead", 3),
        ("timeout_408", Answer::status(408), "dead", 3),
        ("bad_400", Answer::status(400), "dead", 3),
        (
            "redirect_302",
            Answer::status(302).header("location", &format!("{}/stolen", redirect_target.url)),
            "dead",
            3,
        ),
    ];
    let mut subs = Vec::new();
    for (id, answer, _, _) in &cases {
        let a = answer.clone();
        let sub = Subscriber::start(move |_, _| a.clone()).await;
        d.api.subscriber(sub_spec(id, &sub.url, &["*"])).await;
        subs.push(sub);
    }
    d.api
        .events(json!({ "id": "evt_class", "type": "t" }))
        .await;
    wait_for("every delivery finished", LONG, || async {
        d.api.count("status=sent").await + d.api.count("status=dead").await == cases.len()
    })
    .await;
    for ((id, answer, status, attempts), sub) in cases.iter().zip(&subs) {
        let list = d.api.deliveries(&format!("subscriber={id}")).await;
        assert_eq!(list.len(), 1);
        let (_, detail) = d
            .api
            .get(&format!(
                "/v1/deliveries/{}",
                list[0]["id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(detail["status"], *status, "{id}: {detail}");
        assert_eq!(detail["attempt_count"], *attempts, "{id}: {detail}");
        assert_eq!(sub.count() as u64, *attempts, "{id}");
        let recorded = detail["attempts"].as_array().unwrap();
        assert_eq!(
            recorded.len() as u64,
            *attempts,
            "{id}: every attempt recorded"
        );
        for a in recorded {
            assert_eq!(a["lane"], "origin");
            assert_eq!(a["status"], answer.status, "{id}");
            assert!(a["latency_ms"].is_number(), "{id}: {a}");
        }
    }
    let (_, boom) = d
        .api
        .get(&format!(
            "/v1/deliveries/{}",
            d.api.deliveries("subscriber=error_500").await[0]["id"]
                .as_str()
                .unwrap()
        ))
        .await;
    assert_eq!(boom["attempts"][0]["response_body"], "boom");
    assert_eq!(redirect_target.count(), 0, "a Location is never followed");
    d.stop().await;
}

#[tokio::test]
async fn timeouts_and_refused_connections_retry_then_die() {
    let d = Daemon::start().await;
    let hang = Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_secs(5))).await;
    let mut spec = sub_spec("hangs", &hang.url, &["*"]);
    spec["timeout_ms"] = json!(200);
    d.api.subscriber(spec).await;
    let closed = format!("http://127.0.0.1:{}/nobody", free_port());
    d.api.subscriber(sub_spec("closed", &closed, &["*"])).await;
    d.api.events(json!({ "id": "evt_t", "type": "t" })).await;
    wait_for("both dead", LONG, || async {
        d.api.count("status=dead").await == 2
    })
    .await;
    for (id, error) in [("hangs", "timeout"), ("closed", "connect")] {
        let list = d.api.deliveries(&format!("subscriber={id}")).await;
        let (_, detail) = d
            .api
            .get(&format!(
                "/v1/deliveries/{}",
                list[0]["id"].as_str().unwrap()
            ))
            .await;
        let attempts = detail["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 3, "{detail}");
        assert!(
            attempts
                .iter()
                .all(|a| a["error"] == error && a["status"].is_null()),
            "{detail}"
        );
    }
    d.stop().await;
}

#[tokio::test]
async fn retry_after_in_seconds_and_as_an_http_date_both_win() {
    let d = Daemon::start().await;
    let seconds = Subscriber::start(|_, n| {
        if n == 1 {
            Answer::status(503).header("retry-after", "1")
        } else {
            Answer::status(200)
        }
    })
    .await;
    let date = Subscriber::start(|_, n| {
        if n == 1 {
            let at = std::time::SystemTime::now() + Duration::from_secs(2);
            Answer::status(503).header("retry-after", &httpdate::fmt_http_date(at))
        } else {
            Answer::status(200)
        }
    })
    .await;
    d.api
        .subscriber(sub_spec("ra_seconds", &seconds.url, &["*"]))
        .await;
    d.api
        .subscriber(sub_spec("ra_date", &date.url, &["*"]))
        .await;
    d.api.events(json!({ "id": "evt_ra", "type": "t" })).await;
    wait_for("both retried", LONG, || async {
        seconds.count() == 2 && date.count() == 2
    })
    .await;
    let gap = |s: &Subscriber| {
        let r = s.received();
        r[1].at.duration_since(r[0].at)
    };
    // Backoff alone would be ~20 ms at this scale: the wait is the subscriber's.
    assert!(
        gap(&seconds) >= Duration::from_millis(950),
        "{:?}",
        gap(&seconds)
    );
    // An HTTP-date has whole seconds: "2 s from now" is at least 1 s away.
    assert!(
        gap(&date) >= Duration::from_millis(1000),
        "{:?}",
        gap(&date)
    );
    wait_for("both sent", LONG, || async {
        d.api.count("status=sent").await == 2
    })
    .await;
    d.stop().await;
}

#[tokio::test]
async fn a_429_pauses_the_whole_subscriber() {
    let d = Daemon::start().await;
    let sub = Subscriber::start(|_, n| {
        if n == 1 {
            Answer::status(429).header("retry-after", "1")
        } else {
            Answer::status(200)
        }
    })
    .await;
    let mut spec = sub_spec("pausing", &sub.url, &["*"]);
    spec["max_in_flight"] = json!(1);
    d.api.subscriber(spec).await;
    d.api.events(common::events("evt_pause", 5, "t")).await;
    wait_for("all 5 sent", LONG, || async {
        d.api.count("status=sent").await == 5
    })
    .await;
    let got = sub.received();
    assert_eq!(got.len(), 6);
    let pause = got[1].at.duration_since(got[0].at);
    assert!(
        pause >= Duration::from_millis(950),
        "nothing is sent to the subscriber during its pause: {pause:?}"
    );
    d.stop().await;
}

#[tokio::test]
async fn dead_after_the_attempt_limit_then_replay_delivers() {
    let d = Daemon::start().await;
    let sub = Subscriber::start(|_, _| Answer::status(500)).await;
    d.api.subscriber(sub_spec("flaky", &sub.url, &["*"])).await;
    d.api.events(common::events("evt_dead", 3, "t")).await;
    wait_for("3 dead", LONG, || async {
        d.api.count("status=dead").await == 3
    })
    .await;
    assert_eq!(sub.count(), 9, "3 attempts each");
    let dead = d.api.deliveries("status=dead").await;
    assert!(
        dead.iter()
            .all(|x| x["attempt_count"] == 3
                && x["last_error"].as_str().unwrap().contains("gave up")),
        "{dead:?}"
    );

    sub.answer(|_, _| Answer::status(200));
    let one = dead[0]["id"].as_str().unwrap();
    let (status, body) = d
        .api
        .post(&format!("/v1/deliveries/{one}/replay"), json!({}))
        .await;
    assert_eq!(status, 202, "{body}");
    wait_for("the replayed one is sent", LONG, || async {
        d.api.count("status=sent").await == 1
    })
    .await;
    let (status, body) = d
        .api
        .post(
            "/v1/replay",
            json!({ "subscriber": "flaky", "status": "dead" }),
        )
        .await;
    assert_eq!((status, body["replayed"].as_u64()), (202, Some(2)));
    wait_for("all sent", LONG, || async {
        d.api.count("status=sent").await == 3
    })
    .await;
    assert_eq!(sub.count(), 12);
    let (status, _) = d
        .api
        .post("/v1/replay", json!({ "subscriber": "nobody" }))
        .await;
    assert_eq!(status, 404);
    d.stop().await;
}

#[tokio::test]
async fn a_hanging_subscriber_does_not_delay_the_others() {
    let d = Daemon::start().await;
    let hang = Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_secs(30))).await;
    let fast = Subscriber::ok().await;
    let mut spec = sub_spec("hanging", &hang.url, &["*"]);
    spec["max_in_flight"] = json!(4);
    spec["timeout_ms"] = json!(30_000);
    d.api.subscriber(spec).await;
    d.api.subscriber(sub_spec("fast", &fast.url, &["*"])).await;
    let started = Instant::now();
    d.api.events(common::events("evt_fair", 200, "t")).await;
    wait_for("fast got all 200", Duration::from_secs(10), || async {
        fast.count() == 200
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the fast subscriber took {took:?}"
    );
    assert_eq!(
        hang.count(),
        4,
        "the hanging one holds only its own in-flight slots"
    );
    d.stop().await;
}

#[tokio::test]
async fn the_origin_lane_never_exceeds_a_subscribers_rate() {
    let d = Daemon::start().await;
    let sub = Subscriber::ok().await;
    let mut spec = sub_spec("limited", &sub.url, &["*"]);
    spec["rate_per_sec"] = json!(20);
    spec["burst"] = json!(5);
    d.api.subscriber(spec).await;
    let started = Instant::now();
    d.api.events(common::events("evt_rate", 30, "t")).await;
    wait_for("30 received", LONG, || async { sub.count() == 30 }).await;
    // burst 5, then 20/s: 25 more take about 1.25 s.
    assert!(
        started.elapsed() >= Duration::from_millis(1100),
        "{:?}",
        started.elapsed()
    );
    let times: Vec<Instant> = sub.received().iter().map(|r| r.at).collect();
    for i in 0..times.len() {
        for j in i..times.len() {
            let window = times[j].duration_since(times[i]).as_secs_f64();
            assert!(
                (j - i + 1) as f64 <= 5.0 + 20.0 * window + 1.0,
                "{} requests in {window} s",
                j - i + 1
            );
        }
    }
    d.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_json_error_and_changes_nothing() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    d.api
        .subscriber(sub_spec("existing", &sink.url, &["*"]))
        .await;
    let big = format!(
        r#"{{"id":"big","type":"t","pad":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    let ok_sub = |patch: Value| {
        let mut s = sub_spec("new_sub", &sink.url, &["*"]);
        for (k, v) in patch.as_object().unwrap() {
            s[k] = v.clone();
        }
        s.to_string()
    };
    // (name, method, path, body, with token, status, code)
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Option<String>,
        bool,
        u16,
        &'a str,
    );
    let cases: Vec<Row> = vec![
        (
            "no token",
            "POST",
            "/v1/events",
            Some(r#"{"id":"x","type":"t"}"#.into()),
            false,
            401,
            "unauthorized",
        ),
        (
            "malformed json",
            "POST",
            "/v1/events",
            Some(r#"{"id":"x","#.into()),
            true,
            400,
            "malformed_json",
        ),
        (
            "missing id",
            "POST",
            "/v1/events",
            Some(r#"{"type":"t"}"#.into()),
            true,
            400,
            "invalid_request",
        ),
        (
            "missing type",
            "POST",
            "/v1/events",
            Some(r#"{"id":"x"}"#.into()),
            true,
            400,
            "invalid_request",
        ),
        (
            "one bad event spoils the batch",
            "POST",
            "/v1/events",
            Some(r#"[{"id":"x","type":"t"},{"id":"y"}]"#.into()),
            true,
            400,
            "invalid_request",
        ),
        (
            "event over 64 KiB",
            "POST",
            "/v1/events",
            Some(big),
            true,
            413,
            "too_large",
        ),
        (
            "empty array",
            "POST",
            "/v1/events",
            Some("[]".into()),
            true,
            400,
            "invalid_request",
        ),
        (
            "unknown subscriber",
            "GET",
            "/v1/subscribers/nobody",
            None,
            true,
            404,
            "unknown_subscriber",
        ),
        (
            "patch unknown subscriber",
            "PATCH",
            "/v1/subscribers/nobody",
            Some(r#"{"rate_per_sec":1}"#.into()),
            true,
            404,
            "unknown_subscriber",
        ),
        (
            "rotate unknown subscriber",
            "POST",
            "/v1/subscribers/nobody/rotate-secret",
            None,
            true,
            404,
            "unknown_subscriber",
        ),
        (
            "invalid url",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "url": "not a url" }))),
            true,
            400,
            "invalid_url",
        ),
        (
            "private ip url",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "url": "https://10.0.0.7/hook" }))),
            true,
            400,
            "invalid_url",
        ),
        (
            "plain http beyond loopback",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "url": "http://partner.example/hook" }))),
            true,
            400,
            "invalid_url",
        ),
        (
            "zero rate",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "rate_per_sec": 0 }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "negative rate",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "rate_per_sec": -5 }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "negative burst",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "burst": -1 }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "unknown lane",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "lane": "sideways" }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "colour": "blue" }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "duplicate subscriber",
            "POST",
            "/v1/subscribers",
            Some(sub_spec("existing", &sink.url, &["*"]).to_string()),
            true,
            409,
            "conflict",
        ),
        (
            "rate so small its wait overflows",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "rate_per_sec": 1e-300 }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "rate too large to mean anything",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "rate_per_sec": 1e300 }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "burst over its bound",
            "POST",
            "/v1/subscribers",
            Some(ok_sub(json!({ "burst": 1_000_001 }))),
            true,
            400,
            "invalid_request",
        ),
        (
            "patch to a rate that overflows",
            "PATCH",
            "/v1/subscribers/existing",
            Some(r#"{"rate_per_sec":1e-300}"#.into()),
            true,
            400,
            "invalid_request",
        ),
        (
            "patch to zero rate",
            "PATCH",
            "/v1/subscribers/existing",
            Some(r#"{"rate_per_sec":0}"#.into()),
            true,
            400,
            "invalid_request",
        ),
        (
            "bad status filter",
            "GET",
            "/v1/deliveries?status=lost",
            None,
            true,
            400,
            "invalid_request",
        ),
        (
            "unknown delivery",
            "GET",
            "/v1/deliveries/dlv_999",
            None,
            true,
            404,
            "not_found",
        ),
        (
            "wrong method",
            "PUT",
            "/v1/events",
            None,
            true,
            405,
            "method_not_allowed",
        ),
        (
            "no such route",
            "GET",
            "/v2/nothing",
            None,
            true,
            404,
            "not_found",
        ),
    ];
    for (name, method, path, body, auth, status, code) in cases {
        let (got, json) = d.api.raw(method, path, body, auth).await;
        assert_eq!(got, status, "{name}: {json}");
        assert_eq!(json["error"]["code"], code, "{name}: {json}");
        assert!(json["error"]["message"].is_string(), "{name}: {json}");
        // A limit out of bounds names the bound.
        if name.contains("rate so") || name.contains("rate too") || name.contains("overflows") {
            assert!(
                json["error"]["message"].as_str().is_some_and(
                    |m| m.contains("rate_per_sec must be a number from 0.0001 to 1000000")
                ),
                "{name}: {json}"
            );
        }
        if name.contains("burst over") {
            assert!(
                json["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("burst must be from 1 to 1000000")),
                "{name}: {json}"
            );
        }
    }
    // Nothing changed.
    assert_eq!(d.api.count("").await, 0);
    let (_, subs) = d.api.get("/v1/subscribers").await;
    assert_eq!(subs["subscribers"].as_array().unwrap().len(), 1);
    assert_eq!(subs["subscribers"][0]["rate_per_sec"], 1000.0);
    assert_eq!(sink.count(), 0);
    d.stop().await;
}

#[tokio::test]
async fn subscriber_crud_health_and_metrics() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    let (status, health) = d.api.raw("GET", "/healthz", None, false).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let secret = d
        .api
        .subscriber(sub_spec("crud", &sink.url, &["video.*"]))
        .await;
    Secret::parse(&secret).unwrap();
    let (status, patched) = d
        .api
        .raw(
            "PATCH",
            "/v1/subscribers/crud",
            Some(r#"{"rate_per_sec":5,"event_types":["audio.*"]}"#.into()),
            true,
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(
        (
            patched["rate_per_sec"].as_f64(),
            patched["event_types"][0].as_str()
        ),
        (Some(5.0), Some("audio.*"))
    );
    assert!(
        patched.get("secret").is_none(),
        "secrets are shown only at creation and rotation"
    );
    d.api.events(json!({ "id": "m1", "type": "audio.x" })).await;
    wait_for("sent", LONG, || async {
        d.api.count("status=sent").await == 1
    })
    .await;
    let (status, text) = d.api.get("/metrics").await;
    assert_eq!(status, 200);
    let text = text.as_str().unwrap().to_string();
    assert!(
        text.contains("fanout_deliveries{status=\"sent\"} 1"),
        "{text}"
    );
    assert!(text.contains("fanout_pending 0"), "{text}");
    assert!(
        text.contains(
            "fanout_delivery_results_total{subscriber=\"crud\",lane=\"origin\",outcome=\"delivered\"} 1"
        ),
        "{text}"
    );
    let (status, _) = d
        .api
        .raw("DELETE", "/v1/subscribers/crud", None, true)
        .await;
    assert_eq!(status, 200);
    let (status, _) = d.api.get("/v1/subscribers/crud").await;
    assert_eq!(status, 404);
    let (_, ev) = d
        .api
        .post("/v1/events", json!({ "id": "m2", "type": "audio.x" }))
        .await;
    assert_eq!(ev["deliveries"], 0, "a removed subscriber matches nothing");
    d.stop().await;
}

#[tokio::test]
async fn restart_resumes_pending_work_from_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let sub = Subscriber::start(|_, _| Answer::status(503)).await;
    let d = Daemon::start_with(|s| fanout_origin::config::Settings {
        db: Some(db.clone()),
        max_attempts: Some(8),
        backoff_scale: Some(0.2),
        ..s
    })
    .await;
    d.api.subscriber(sub_spec("later", &sub.url, &["*"])).await;
    d.api.events(common::events("evt_restart", 10, "t")).await;
    wait_for("first attempts", LONG, || async { sub.count() >= 10 }).await;
    d.stop().await;
    sub.answer(|_, _| Answer::status(200));
    let d = Daemon::start_with(|s| fanout_origin::config::Settings {
        db: Some(db.clone()),
        ..s
    })
    .await;
    wait_for("all sent after restart", LONG, || async {
        d.api.count("status=sent").await == 10
    })
    .await;
    d.stop().await;
}

/// Retention in the running daemon: with `--retain-sent 1s`, sent deliveries, their attempts
/// and their events go once a second has passed, and `/v1/retention` and `/metrics` say so; a
/// held subscriber's pending deliveries and a dead one within its (default, 30d) window stay.
#[tokio::test]
async fn retention_removes_sent_deliveries_and_keeps_the_rest() {
    let d = Daemon::start_with(|s| fanout_origin::config::Settings {
        retain_sent: Some("1s".into()),
        max_attempts: Some(1),
        ..s
    })
    .await;
    let ok = Subscriber::ok().await;
    let gone = Subscriber::start(|_, _| Answer::status(404)).await;
    d.api
        .subscriber(sub_spec("fast", &ok.url, &["video.*"]))
        .await;
    d.api
        .subscriber(sub_spec("gone", &gone.url, &["audit.*"]))
        .await;
    d.api
        .subscriber(sub_spec("held", &ok.url, &["video.*"]))
        .await;
    let (status, _) = d
        .api
        .raw(
            "PATCH",
            "/v1/subscribers/held",
            Some(json!({ "disabled": true }).to_string()),
            true,
        )
        .await;
    assert_eq!(status, 200);
    d.api.events(events("evt_r", 20, "video.trending")).await;
    d.api.events(events("evt_a", 1, "audit.x")).await;
    wait_for("sent, then removed", LONG, || async {
        let (_, r) = d.api.get("/v1/retention").await;
        r["removed_sent"] == json!(20)
    })
    .await;
    let (_, r) = d.api.get("/v1/retention").await;
    assert_eq!(
        (
            &r["retain_sent"],
            &r["retain_dead"],
            &r["removed_dead"],
            &r["removed_attempts"],
            &r["oldest_sent_at_ms"]
        ),
        (
            &json!("1s"),
            &json!("30d"),
            &json!(0),
            &json!(20),
            &Value::Null
        ),
        "{r}"
    );
    // The disabled subscriber's 20 pending deliveries and the dead one (within its window) are
    // kept, and so is every event they refer to.
    assert_eq!(d.api.count("subscriber=fast").await, 0);
    let held = d.api.deliveries("subscriber=held&limit=100").await;
    assert_eq!(held.len(), 20);
    assert!(held
        .iter()
        .all(|x| x["event_type"] == "video.trending" && x["status"] == "pending"));
    assert_eq!(d.api.count("status=dead").await, 1);
    let (_, text) = d.api.raw("GET", "/metrics", None, false).await;
    let text = text.as_str().unwrap().to_string();
    for line in [
        r#"fanout_retention_removed_total{kind="sent"} 20"#,
        r#"fanout_retention_removed_total{kind="events"} 0"#,
        r#"fanout_subscriber_sent{subscriber="fast"} 0"#,
        r#"fanout_subscriber_dead{subscriber="gone"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
}
