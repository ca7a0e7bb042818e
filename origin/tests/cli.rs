//! The CLI reads in one voice: the real `fanout` binary against a daemon over a real socket.
//! Every command that prints data prints for a person by default and the API's JSON with
//! `--json`; `subscriber show` and `subscriber update` cover every field; times are RFC 3339
//! UTC; an error names the command that was run and the one to run next; an Ed25519
//! subscriber's secret comes with its public key.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};

/// `fanout ARGS… --json`, which must succeed and print one JSON value.
async fn fanout_json(api: &Api, args: &[&str]) -> Value {
    let mut with = args.to_vec();
    with.push("--json");
    let (ok, out, err) = api.fanout(&with).await;
    assert!(ok, "fanout {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("fanout {with:?}: {e}: {out}"))
}

/// The value of `key` in a `key   value` listing.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .filter(|rest| rest.starts_with(' '))
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
}

/// An RFC 3339 UTC time with milliseconds, as the CLI prints them.
fn is_rfc3339(s: &str) -> bool {
    s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.as_bytes()[4] == b'-'
}

#[tokio::test]
async fn subscriber_show_and_update_cover_every_field() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    let api = &d.api;
    fanout_json(api, &["customer", "add", "acme"]).await;
    fanout_json(
        api,
        &["subscriber", "add", "s1", &sink.url, "-t", "video.*"],
    )
    .await;

    let (ok, shown, err) = api.fanout(&["subscriber", "show", "s1"]).await;
    assert!(ok, "{err}");
    assert_eq!(field(&shown, "rate_per_sec"), "100");
    assert_eq!(field(&shown, "customer"), "none");
    assert!(is_rfc3339(field(&shown, "created_at")), "{shown}");

    let changed = fanout_json(
        api,
        &[
            "subscriber",
            "update",
            "s1",
            "--rate-per-sec",
            "2.5",
            "--burst",
            "7",
            "--max-in-flight",
            "3",
            "--timeout-ms",
            "2500",
            "--customer",
            "acme",
            "--ordering",
            "key",
            "--ordering-key",
            "/video_id",
            "--batch-max-events",
            "5",
            "--signature",
            "ed25519",
            "--customer-filter",
            r#"{"region": "eu"}"#,
            "-t",
            "video.*",
            "-t",
            "audio.*",
        ],
    )
    .await;
    let (_, stored) = api.get("/v1/subscribers/s1").await;
    assert_eq!(
        changed, stored,
        "update prints the subscriber as the API has it"
    );
    for (key, expected) in [
        ("rate_per_sec", json!(2.5)),
        ("burst", json!(7)),
        ("max_in_flight", json!(3)),
        ("timeout_ms", json!(2500)),
        ("customer", json!("acme")),
        ("ordering", json!("key")),
        ("ordering_key", json!("/video_id")),
        ("signature", json!("ed25519")),
        ("customer_filter", json!({ "region": "eu" })),
        ("event_types", json!(["video.*", "audio.*"])),
    ] {
        assert_eq!(stored[key], expected, "{key}: {stored}");
    }
    assert_eq!(stored["batch"]["max_events"], 5, "{stored}");

    // Only what is given changes; the human form shows it.
    let (ok, shown, err) = api
        .fanout(&["subscriber", "update", "s1", "--no-batch", "--no-customer"])
        .await;
    assert!(ok, "{err}");
    assert_eq!(field(&shown, "batch"), "none");
    assert_eq!(field(&shown, "customer"), "none");
    assert_eq!(field(&shown, "burst"), "7");
    let public_key = field(&shown, "public_key").to_string();
    assert!(public_key.starts_with("whpk_"), "{shown}");

    // An Ed25519 subscriber's secret comes with the public key a receiver verifies with.
    let (ok, lines, err) = api.fanout(&["subscriber", "secret", "s1"]).await;
    assert!(ok, "{err}");
    let first: Vec<&str> = lines.lines().next().unwrap().split('\t').collect();
    assert!(first[0].starts_with("whsec_"), "{lines}");
    assert_eq!(first[1..], ["current", public_key.as_str()], "{lines}");

    let (ok, _, err) = api.fanout(&["subscriber", "update", "s1"]).await;
    assert!(!ok && err.contains("nothing to change"), "{err}");
    d.stop().await;
}

#[tokio::test]
async fn every_printing_command_takes_json_and_prints_people_a_line() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    let api = &d.api;
    fanout_json(api, &["subscriber", "add", "s1", &sink.url]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, r#"[{"id":"e1","type":"t"},{"id":"e2","type":"t"}]"#).unwrap();
    let file = file.to_str().unwrap();

    let (ok, line, err) = api.fanout(&["send", file]).await;
    assert!(ok, "{err}");
    assert_eq!(
        line,
        "sent 2 new events (0 already known), 2 deliveries created\n"
    );
    assert_eq!(
        fanout_json(api, &["send", file]).await,
        json!({ "events": 0, "duplicates": 2, "deliveries": 0 })
    );
    wait_for("both sent", std::time::Duration::from_secs(10), || async {
        api.count("status=sent").await == 2
    })
    .await;

    let page = fanout_json(api, &["deliveries", "--limit", "1"]).await;
    let first = page["deliveries"][0]["id"].as_str().unwrap().to_string();
    let next = page["next"].as_str().unwrap().to_string();
    let second = fanout_json(api, &["deliveries", "--limit", "1", "--after", &next]).await;
    assert_ne!(second["deliveries"][0]["id"], first.as_str(), "{second}");
    let (ok, table, _) = api.fanout(&["deliveries", "--limit", "1"]).await;
    assert!(ok && table.contains(&format!("--after {next}")), "{table}");

    // One delivery's times are RFC 3339, never epoch milliseconds.
    let (ok, detail, err) = api.fanout(&["deliveries", "--id", &first]).await;
    assert!(ok, "{err}");
    assert!(is_rfc3339(field(&detail, "created_at")), "{detail}");
    let attempt = detail.lines().last().unwrap();
    let at = attempt.split_whitespace().nth(1).unwrap();
    assert!(is_rfc3339(at), "{detail}");

    let (ok, line, err) = api.fanout(&["replay", &first]).await;
    assert!(ok, "{err}");
    assert_eq!(line, format!("delivery {first} is pending again\n"));
    let other = second["deliveries"][0]["id"].as_str().unwrap();
    let one = fanout_json(api, &["replay", other]).await;
    assert_eq!(
        (one["id"].as_str(), one["status"].as_str()),
        (Some(other), Some("pending"))
    );
    let bulk = fanout_json(api, &["replay", "--status", "dead"]).await;
    assert_eq!(bulk["replayed"], 0);

    fanout_json(api, &["customer", "add", "acme"]).await;
    let shown = fanout_json(api, &["customer", "show", "acme"]).await;
    assert_eq!(shown["weight"], 1);
    let (ok, shown, _) = api
        .fanout(&["customer", "update", "acme", "--weight", "3"])
        .await;
    assert!(ok && field(&shown, "weight") == "3", "{shown}");
    assert!(is_rfc3339(field(&shown, "updated_at")), "{shown}");
    let revoked = fanout_json(api, &["customer", "revoke-links", "acme"]).await;
    assert!(revoked["links_revoked_at_ms"].is_i64(), "{revoked}");
    let (ok, line, _) = api.fanout(&["customer", "remove", "acme"]).await;
    assert!(ok, "{line}");
    assert_eq!(
        line,
        "removed customer acme; its portal links no longer work\n"
    );

    let removed = fanout_json(api, &["subscriber", "remove", "s1"]).await;
    assert_eq!(
        (removed["id"].clone(), removed["deleted"].clone()),
        (json!("s1"), json!(true))
    );
    d.stop().await;
}

/// A refusal names the command that was run and the command that helps, not an API route.
#[tokio::test]
async fn errors_name_the_command_run_and_the_one_to_run() {
    let d = Daemon::start().await;
    let api = &d.api;
    let (ok, _, err) = api
        .fanout(&[
            "subscriber",
            "add",
            "s1",
            "http://127.0.0.1:9/",
            "--customer",
            "nobody",
        ])
        .await;
    assert!(!ok);
    assert!(err.starts_with("fanout subscriber add: "), "{err}");
    assert!(err.contains("`fanout customer add nobody`"), "{err}");

    let (ok, _, err) = api.fanout(&["subscriber", "show", "ghost"]).await;
    assert!(!ok);
    assert!(err.starts_with("fanout subscriber show: "), "{err}");
    assert!(
        err.contains("404") && err.contains("`fanout subscriber list`"),
        "{err}"
    );

    let (ok, _, err) = api.fanout(&["customer", "show", "ghost"]).await;
    assert!(!ok && err.contains("`fanout customer list`"), "{err}");

    let out = tokio::task::spawn_blocking({
        let base = api.base.clone();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
                .args(["status", "--server", &base])
                .env("FANOUT_API_TOKEN", "wrong")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("fanout status: "), "{err}");
    assert!(err.contains("--api-token or FANOUT_API_TOKEN"), "{err}");
    d.stop().await;
}
