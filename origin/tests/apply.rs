//! Configuration as code against the real binary and a real daemon: `fanout apply -f FILE`
//! prints its plan, `--dry-run` changes nothing, a second apply says "no changes", a changed
//! field is shown old → new, `--prune` removes what the file does not name, a secret in the
//! file and a value the daemon refuses name the file's line, and `fanout export` from one
//! daemon applied to a fresh one exports the same.
//! Runs on SQLite, and on PostgreSQL with `FANOUT_TEST_LEDGER=postgres`.
// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};

/// `fanout ARGS --server BASE`: exit success, stdout, stderr.
async fn fanout(base: &str, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(args)
        .args(["--server", base])
        .env("FANOUT_API_TOKEN", TOKEN)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

async fn apply(base: &str, file: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec!["apply", "-f", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    fanout(base, &args).await
}

async fn ids(api: &Api, kind: &str) -> Vec<String> {
    let (s, v) = api.get(&format!("/v1/{kind}")).await;
    assert_eq!(s, 200, "{v}");
    let mut ids: Vec<String> = v[kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

const FILE: &str = "\
# Fanout's configuration
customers:
  - id: acme
    weight: 3
subscribers:
  - id: s1
    url: http://127.0.0.1:9/hook
    event_types: [video.*]
    customer: acme
    rate_per_sec: 5
    filter: {amount: {$gt: 100}}
    ordering: key
    ordering_key: /video_id
    batch: {max_events: 10, max_wait_ms: 50}
    signature: both
    lane: origin
  - id: s2
    url: http://127.0.0.1:9/other
    event_types: ['*']
    disabled: true
event_types: []
";

#[tokio::test]
async fn plan_dry_run_apply_again_change_and_prune() {
    let d = Daemon::start().await;
    let base = d.api.base.clone();
    let file = d.dir.path().join("fanout.yaml");
    std::fs::write(&file, FILE).unwrap();

    let (ok, out, err) = apply(&base, &file, &["--dry-run"]).await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("create customer acme: weight=3\ncreate subscriber s1: "),
        "{out}"
    );
    assert!(out.contains("create subscriber s2: "), "{out}");
    assert!(!out.contains("whsec_"), "{out}");
    assert!(
        ids(&d.api, "subscribers").await.is_empty(),
        "a dry run changes nothing"
    );
    assert!(ids(&d.api, "customers").await.is_empty());

    let (ok, out, err) = apply(&base, &file, &[]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("secret of subscriber s1 (shown once): whsec_"),
        "{out}"
    );
    assert!(
        out.contains("secret of subscriber s2 (shown once): whsec_"),
        "{out}"
    );
    let s1 = d.api.get("/v1/subscribers/s1").await.1;
    assert_eq!(
        [
            &s1["customer"],
            &s1["rate_per_sec"],
            &s1["filter"],
            &s1["ordering_key"]
        ],
        [
            &json!("acme"),
            &json!(5.0),
            &json!({"amount": {"$gt": 100}}),
            &json!("/video_id")
        ]
    );
    assert_eq!(
        (&s1["signature"], &s1["lane"]),
        (&json!("both"), &json!("origin"))
    );
    assert_eq!(s1["batch"]["max_events"], json!(10));
    assert_eq!(
        d.api.get("/v1/subscribers/s2").await.1["disabled"],
        json!(true)
    );
    assert_eq!(d.api.get("/v1/customers/acme").await.1["weight"], json!(3));

    let (ok, out, err) = apply(&base, &file, &[]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "no changes\n", "a second apply of the same file");

    std::fs::write(&file, FILE.replace("rate_per_sec: 5", "rate_per_sec: 7")).unwrap();
    let (ok, out, err) = apply(&base, &file, &[]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "change subscriber s1\n    rate_per_sec: 5.0 → 7\napplied 1 change(s)\n"
    );
    assert_eq!(
        d.api.get("/v1/subscribers/s1").await.1["rate_per_sec"],
        json!(7.0)
    );

    // One the file does not name: said, kept; removed with --prune.
    d.api
        .subscriber(sub_spec("s3", "http://127.0.0.1:9/x", &["*"]))
        .await;
    let (ok, out, err) = apply(&base, &file, &[]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "no changes\nnot in the file (--prune would remove it): subscriber s3\n"
    );
    assert_eq!(ids(&d.api, "subscribers").await, ["s1", "s2", "s3"]);
    let (ok, out, err) = apply(&base, &file, &["--prune"]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "remove subscriber s3\napplied 1 change(s)\n");
    assert_eq!(ids(&d.api, "subscribers").await, ["s1", "s2"]);
    d.stop().await;
}

#[tokio::test]
async fn errors_name_the_file_line_and_field() {
    let d = Daemon::start().await;
    let base = d.api.base.clone();
    let file = d.dir.path().join("f.yaml");
    let name = file.display().to_string();
    let cases: &[(&str, &str)] = &[
        (
            "subscribers:\n  - id: s\n    url: http://127.0.0.1:9/\n    secret: whsec_abc\n",
            ":4: field `secret`: secrets never live in the file",
        ),
        ("customers:\n  - id: a\nwebhooks: []\n", ":3: unknown top-level key `webhooks`"),
        ("subscribers:\n  - url: http://127.0.0.1:9/\n", ":2: a subscriber without an `id`"),
        ("customers: [\n", ":2: "),
        (
            "customers:\n  - id: a\nevent_types:\n  - name: video.created\n",
            ":3: `event_types`: this daemon has no event-type catalog",
        ),
        (
            "customers:\n  - id: ok\nsubscribers:\n  - id: bad\n    url: http://127.0.0.1:9/\n    event_types: ['*']\n    rate_per_sec: -1\n",
            ":4: subscriber `bad`: the daemon refused it (400 invalid_request)",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&file, text).unwrap();
        let (ok, _, err) = apply(&base, &file, &[]).await;
        assert!(!ok, "{text}");
        assert!(err.contains(&format!("{name}{want}")), "{text}\n{err}");
    }
    // Refused before acting: nothing of those files exists (but `ok`, created before `bad`).
    assert_eq!(ids(&d.api, "customers").await, ["ok"]);
    assert!(ids(&d.api, "subscribers").await.is_empty());

    // A change the daemon refuses names the field's line.
    let good = "subscribers:\n  - id: s\n    url: http://127.0.0.1:9/\n    event_types: ['*']\n    burst: 5\n";
    std::fs::write(&file, good).unwrap();
    let secrets = d.dir.path().join("secrets");
    let (ok, out, err) = apply(&base, &file, &["--secrets-out", secrets.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    assert!(!out.contains("whsec_"), "{out}");
    let written = std::fs::read_to_string(&secrets).unwrap();
    assert!(written.starts_with("\"s\": whsec_"), "{written}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&secrets).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    std::fs::write(&file, good.replace("burst: 5", "burst: 0")).unwrap();
    let (ok, _, err) = apply(&base, &file, &[]).await;
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "{name}:5: subscriber `s` field `burst`: the daemon refused it"
        )),
        "{err}"
    );
    // --secrets-out never overwrites.
    std::fs::write(&file, good.replace("id: s", "id: t")).unwrap();
    let (ok, _, err) = apply(&base, &file, &["--secrets-out", secrets.to_str().unwrap()]).await;
    assert!(!ok && err.contains("--secrets-out"), "{err}");
    assert_eq!(std::fs::read_to_string(&secrets).unwrap(), written);
    assert_eq!(ids(&d.api, "subscribers").await, ["s"]);
    d.stop().await;
}

#[tokio::test]
async fn export_then_apply_on_an_empty_daemon_reproduces_it() {
    let one = Daemon::start().await;
    let file = one.dir.path().join("fanout.yaml");
    std::fs::write(&file, FILE).unwrap();
    let (ok, _, err) = apply(&one.api.base, &file, &[]).await;
    assert!(ok, "{err}");
    // Some state the file did not say: a customer without a cap, a plain subscriber.
    let (s, v) = one
        .api
        .post("/v1/customers", json!({"id": "zeta", "max_in_flight": 4}))
        .await;
    assert_eq!(s, 201, "{v}");
    let mut spec = sub_spec("s3", "http://127.0.0.1:9/x", &["a", "b.*"]);
    spec["customer"] = json!("zeta");
    one.api.subscriber(spec).await;

    let (ok, exported, err) = fanout(&one.api.base, &["export"]).await;
    assert!(ok, "{err}");
    assert!(!exported.contains("whsec_") && !exported.contains("created_at_ms"));
    let two = Daemon::start().await;
    let copy = two.dir.path().join("exported.yaml");
    std::fs::write(&copy, &exported).unwrap();
    let (ok, _, err) = apply(&two.api.base, &copy, &[]).await;
    assert!(ok, "{err}");
    let (ok, again, err) = fanout(&two.api.base, &["export"]).await;
    assert!(ok, "{err}");
    assert_eq!(again, exported);
    assert_eq!(apply(&two.api.base, &copy, &[]).await.1, "no changes\n");
    let s2: Value = two.api.get("/v1/subscribers/s2").await.1;
    assert_eq!(s2["disabled"], json!(true));
    one.stop().await;
    two.stop().await;
}
