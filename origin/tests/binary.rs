//! The real `fanout` binary: crash safety under `kill -9`, and the client commands.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_burst_loses_nothing_and_duplicates_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let subs = [Subscriber::ok().await, Subscriber::ok().await];
    let mut daemon = Binary::start(&db, &[]).await;
    for (i, s) in subs.iter().enumerate() {
        let mut spec = sub_spec(&format!("crash_{i}"), &s.url, &["video.*"]);
        spec["rate_per_sec"] = json!(400);
        spec["burst"] = json!(50);
        spec["max_in_flight"] = json!(16);
        daemon.api.subscriber(spec).await;
    }
    let n = 1000;
    for chunk in 0..10 {
        daemon
            .api
            .events(events(
                &format!("evt_crash_{chunk}"),
                n / 10,
                "video.trending",
            ))
            .await;
    }
    wait_for("deliveries under way", Duration::from_secs(20), || async {
        subs.iter().any(|s| s.count() > 100)
    })
    .await;
    daemon.kill9();
    let before: Vec<usize> = subs.iter().map(Subscriber::count).collect();
    assert!(
        before.iter().all(|&c| c < n),
        "killed mid-burst: {before:?}"
    );

    let daemon = Binary::start(&db, &[]).await;
    for s in &subs {
        wait_for(
            "every event delivered after restart",
            Duration::from_secs(60),
            || async { s.distinct_ids().0.len() == n },
        )
        .await;
    }
    wait_for("the ledger agrees", Duration::from_secs(20), || async {
        daemon.api.count("status=sent").await == 2 * n
    })
    .await;
    assert_eq!(daemon.api.count("status=dead").await, 0);
    for (i, s) in subs.iter().enumerate() {
        let (ids, dupes) = s.distinct_ids();
        assert_eq!(ids.len(), n);
        // At-least-once: a kill between a send and its record means that one is sent again.
        // Only work leased at the instant of the kill can repeat: at most max_in_flight.
        eprintln!(
            "subscriber {i}: {} distinct events, {dupes} duplicates (received before the kill: {})",
            ids.len(),
            before[i]
        );
        assert!(dupes <= 16, "subscriber {i}: {dupes} duplicates");
    }
}

// A test helper: a failed unwrap is a failed test.
#[allow(clippy::unwrap_used)]
fn cli(args: &[&str], api: &Api, stdin: Option<&str>) -> (bool, Value, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(args)
        .args(["--server", &api.base])
        .env("FANOUT_API_TOKEN", &api.token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stderr,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_commands_drive_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    // 404, not 410: a 410 would disable the subscriber (crate::alert) and keep the rest pending.
    let sink = Subscriber::start(|r, _| {
        if r.path == "/fails" {
            Answer::status(404)
        } else {
            Answer::status(200)
        }
    })
    .await;
    let daemon = Binary::start(&db, &["--max-attempts", "2", "--backoff-scale", "0.01"]).await;
    let api = daemon.api.clone();

    let ok_url = format!("{}/ok", sink.url);
    let fails_url = format!("{}/fails", sink.url);
    let (ok, added, err) = cli(
        &[
            "subscriber",
            "add",
            "cli_ok",
            &ok_url,
            "-t",
            "video.*",
            "--rate-per-sec",
            "50",
            "--lane",
            "origin",
            "--json",
        ],
        &api,
        None,
    );
    assert!(ok, "{err}");
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"));
    let (ok, _, err) = cli(
        &[
            "subscriber",
            "add",
            "cli_fails",
            &fails_url,
            "-t",
            "video.*",
        ],
        &api,
        None,
    );
    assert!(ok, "{err}");
    let (ok, list, _) = cli(&["subscriber", "list", "--json"], &api, None);
    assert!(ok);
    assert_eq!(list["subscribers"].as_array().unwrap().len(), 2);

    // One event per line on stdin.
    let lines = "{\"id\":\"c1\",\"type\":\"video.a\"}\n{\"id\":\"c2\",\"type\":\"video.b\"}\n";
    let (ok, sent, err) = cli(&["send", "--json"], &api, Some(lines));
    assert!(ok, "{err}");
    assert_eq!(
        sent,
        json!({ "events": 2, "duplicates": 0, "deliveries": 4 })
    );
    // A file holding a JSON array; one id repeats.
    let file = dir.path().join("events.json");
    std::fs::write(
        &file,
        r#"[{"id":"c2","type":"video.b"},{"id":"c3","type":"video.c"}]"#,
    )
    .unwrap();
    let (ok, sent, _) = cli(&["send", "--json", file.to_str().unwrap()], &api, None);
    assert!(ok);
    assert_eq!(
        sent,
        json!({ "events": 1, "duplicates": 1, "deliveries": 2 })
    );

    wait_for("3 sent, 3 dead", Duration::from_secs(20), || async {
        api.count("status=sent").await == 3 && api.count("status=dead").await == 3
    })
    .await;
    let (ok, dead, _) = cli(&["deliveries", "--status", "dead", "--json"], &api, None);
    assert!(ok);
    let dead = dead["deliveries"].as_array().unwrap().clone();
    assert_eq!(dead.len(), 3);
    assert!(dead.iter().all(|d| d["subscriber_id"] == "cli_fails"));

    sink.answer(|_, _| Answer::status(200));
    let first = dead[0]["id"].as_str().unwrap();
    let (ok, _, err) = cli(&["replay", first], &api, None);
    assert!(ok, "{err}");
    let (ok, bulk, _) = cli(
        &["replay", "--json", "--subscriber", "cli_fails"],
        &api,
        None,
    );
    assert!(ok);
    assert_eq!(bulk["replayed"], 2);
    wait_for("all 6 sent", Duration::from_secs(20), || async {
        api.count("status=sent").await == 6
    })
    .await;

    let (ok, removed, _) = cli(&["subscriber", "remove", "--json", "cli_fails"], &api, None);
    assert!(ok);
    assert_eq!(removed["deleted"], true);
    let (ok, _, err) = cli(&["subscriber", "remove", "cli_fails"], &api, None);
    assert!(!ok);
    assert!(err.contains("404"), "{err}");
}

#[test]
fn serve_refuses_a_bad_configuration_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fanout.toml");
    std::fs::write(
        &config,
        "api_token = \"from-the-file-0123456789\"\nmax_attempts = 0\n",
    )
    .unwrap();
    // (arguments, environment, what stderr says)
    type Row<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Row> = vec![
        (vec!["serve"], vec![], "API token is required"),
        (
            vec!["serve", "--edge-url", "http://127.0.0.1:1"],
            vec![("FANOUT_API_TOKEN", "t")],
            "needs --edge-key",
        ),
        (
            vec!["serve", "--listen", "here"],
            vec![("FANOUT_API_TOKEN", "t")],
            "is not an address",
        ),
        (
            vec!["serve", "--config", config.to_str().unwrap()],
            vec![],
            "--max-attempts must be 1 to 100",
        ),
        (
            vec!["serve", "--config", "/nonexistent/fanout.toml"],
            vec![],
            "cannot read config file",
        ),
    ];
    for (args, env, expected) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(&args)
            .env_remove("FANOUT_API_TOKEN")
            .envs(env)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `fanout backup` while the daemon serves under steady ingest: the copy holds every event
/// acknowledged before the backup began, its leases come back as pending, and a daemon started
/// on it delivers every delivery it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_while_serving_loses_nothing_and_returns_leases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    // A slow subscriber: deliveries stay leased for a while, so the snapshot holds some.
    let slow =
        Subscriber::start(|_, _| Answer::status(200).delay(Duration::from_millis(300))).await;
    let daemon = Binary::start(&db, &[]).await;
    let mut spec = sub_spec("slow", &slow.url, &["*"]);
    spec["max_in_flight"] = json!(8);
    daemon.api.subscriber(spec).await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let producer = {
        let api = daemon.api.clone();
        let acked = acked.clone();
        tokio::spawn(async move {
            let mut batch = 0;
            while !*stop_rx.borrow_and_update() {
                let body = events(&format!("evt_b{batch:04}"), 20, "t");
                let ids: Vec<String> = body
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["id"].as_str().unwrap().to_string())
                    .collect();
                api.events(body).await;
                acked.lock().unwrap().extend(ids);
                batch += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    wait_for("ingest under way", Duration::from_secs(20), || async {
        acked.lock().unwrap().len() >= 400 && slow.count() > 0
    })
    .await;
    let before: Vec<String> = acked.lock().unwrap().clone();
    let copy = dir.path().join("backup.db");
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["backup", "--db", db.to_str().unwrap(), "--to"])
        .arg(&copy)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let _ = stop_tx.send(true);
    producer.await.unwrap();
    drop(daemon);
    assert!(
        report["leases_released"].as_u64().unwrap() > 0,
        "the snapshot held leases: {report}"
    );
    let held = report["deliveries"].as_u64().unwrap() as usize;
    assert!(
        held >= before.len(),
        "{report} vs {} acknowledged",
        before.len()
    );
    {
        let c = rusqlite::Connection::open(&copy).unwrap();
        let mut st = c
            .prepare("SELECT COUNT(*) FROM deliveries WHERE event_id = ?1")
            .unwrap();
        for id in &before {
            let n: i64 = st.query_row([id], |r| r.get(0)).unwrap();
            assert_eq!(n, 1, "{id} was acknowledged before the backup began");
        }
        let in_flight: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM deliveries WHERE status = 'in_flight'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(in_flight, 0);
    }
    // Restore: a daemon on the copy sends everything the copy holds.
    let fast = Subscriber::ok().await;
    let restored = Binary::start(&copy, &[]).await;
    let (status, _) = restored
        .api
        .raw(
            "PATCH",
            "/v1/subscribers/slow",
            Some(json!({ "url": fast.url }).to_string()),
            true,
        )
        .await;
    assert_eq!(status, 200);
    wait_for(
        "every delivery of the copy sent",
        Duration::from_secs(60),
        || async { restored.api.count("status=sent").await == held },
    )
    .await;
    let delivered = fast.distinct_ids().0;
    for id in &before {
        assert!(
            delivered.contains(id) || slow.distinct_ids().0.contains(id),
            "{id} never delivered"
        );
    }
}

/// `fanout backup` on a PostgreSQL ledger refuses, names pg_dump, and writes nothing (it does
/// not take the URL for a file name).
#[test]
fn backup_of_a_postgres_ledger_points_to_pg_dump() {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("copy.db");
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args([
            "backup",
            "--db",
            "postgres://fanout@127.0.0.1:1/fanout",
            "--to",
        ])
        .arg(&to)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("pg_dump"), "{stderr}");
    assert!(!to.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// `--help` names the variables an option reads but never prints their values (tokens, keys,
/// database URLs with passwords), for `serve` and every other command that reads them.
#[test]
fn help_never_prints_what_the_environment_holds() {
    let secrets = [
        ("FANOUT_API_TOKEN", "tok-s3cret-1"),
        ("FANOUT_EDGE_KEY", "edge-s3cret-2"),
        ("FANOUT_ALERT_SECRET", "whsec_s3cret3"),
        ("FANOUT_ALERT_URL", "https://ops.example/hook/s3cret-4"),
        ("FANOUT_EDGE_URL", "https://edge.example/s3cret-5"),
        ("FANOUT_DB", "postgres://u:s3cret-6@db/fanout"),
        ("FANOUT_OUTBOX", "postgres://u@db/shop?password=s3cret-7"),
        (
            "FANOUT_EVENT_URL",
            "https://shop.example/e/{id}?token=s3cret-8",
        ),
    ];
    for args in [
        &["serve", "--help"][..],
        &["status", "--help"],
        &["subscriber", "add", "--help"],
        &["outbox", "init", "--help"],
        &["--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(args)
            .envs(secrets)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {help}");
        assert!(!help.contains("s3cret"), "{args:?} prints a value: {help}");
        if args[0] == "serve" {
            assert!(help.contains("FANOUT_API_TOKEN"), "{help}");
        }
    }
}
