//! The operators' surface: `/metrics` after real deliveries (the exposition parsed and checked),
//! `fanout status` and the `--json` outputs of the real binary, and `fanout load` against a URL
//! and against a stand-in edge that checks every call's signature.
// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use fanout_core::sign::{self, Secret};
use fanout_core::wire::{DeliveryBatch, DeliveryResult};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

/// Run the real `fanout` with `args` (off the async runtime); (success, stdout, stderr).
async fn fanout(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
            .args(&args)
            .env_remove("FANOUT_EDGE_KEY")
            .envs(env)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// A client command against `api`: its stdout parsed as JSON when `json`.
async fn client(api: &Api, args: &[&str]) -> (String, String) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--server", &api.base]);
    let (ok, stdout, stderr) = fanout(&all, &[("FANOUT_API_TOKEN", &api.token)]).await;
    assert!(ok, "fanout {args:?} failed: {stderr}");
    (stdout, stderr)
}

fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

// ---------------------------------------------------------------------------------------------
// A strict reader of the Prometheus text format (0.0.4)

#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: bool,
    samples: usize,
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A sample's name, labels and value.
type Sample = (String, Vec<(String, String)>, f64);

/// `name{k="v",…} value` → (name, labels, value), or why not.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !valid_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=').ok_or("label without =")?;
            let key = &rest[..eq];
            if !valid_name(key) || key.contains(':') {
                return Err(format!("bad label name {key:?}"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value not quoted")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        c => return Err(format!("bad escape \\{c}")),
                    },
                    (_, '\n') => return Err("newline in label value".into()),
                    (_, c) => value.push(c),
                }
            };
            labels.push((key.to_string(), value));
            rest = &rest[end + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value_text = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    Ok((name.to_string(), labels, value))
}

/// Check every rule of the exposition this daemon relies on; return each series' value,
/// keyed `name{k="v",…}` exactly as written.
fn check_exposition(text: &str) -> HashMap<String, f64> {
    assert!(
        text.ends_with('\n'),
        "the exposition must end with a newline"
    );
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut series: HashMap<String, f64> = HashMap::new();
    // Histogram buckets by (family, labels without le): (le, count) in order of appearance.
    let mut buckets: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let at = format!("line {}: {line}", i + 1);
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (word, name, tail) = (parts.next(), parts.next(), parts.next());
            let name = name.unwrap_or_else(|| panic!("{at}: comment without a name"));
            assert!(valid_name(name), "{at}");
            let f = families.entry(name.to_string()).or_default();
            assert_eq!(f.samples, 0, "{at}: HELP/TYPE after the family's samples");
            match word {
                Some("HELP") => {
                    assert!(!f.help, "{at}: second HELP");
                    assert!(tail.is_some_and(|t| !t.is_empty()), "{at}: empty HELP");
                    f.help = true;
                }
                Some("TYPE") => {
                    assert!(f.kind.is_empty(), "{at}: second TYPE");
                    let kind = tail.unwrap_or_default();
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "{at}: unknown type"
                    );
                    f.kind = kind.to_string();
                }
                other => panic!("{at}: unexpected comment {other:?}"),
            }
            current = Some(name.to_string());
            continue;
        }
        assert!(!line.is_empty() && !line.starts_with('#'), "{at}");
        let (name, labels, value) = parse_sample(line).unwrap_or_else(|e| panic!("{at}: {e}"));
        let family = current
            .clone()
            .unwrap_or_else(|| panic!("{at}: sample before any TYPE"));
        let f = families.get_mut(&family).unwrap();
        assert!(
            f.help && !f.kind.is_empty(),
            "{at}: HELP and TYPE come first"
        );
        f.samples += 1;
        match f.kind.as_str() {
            "histogram" => {
                let suffix = name
                    .strip_prefix(&family)
                    .unwrap_or_else(|| panic!("{at}: not of family {family}"));
                assert!(
                    ["_bucket", "_sum", "_count"].contains(&suffix),
                    "{at}: {suffix}"
                );
                let others: Vec<String> = labels
                    .iter()
                    .filter(|(k, _)| k != "le")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let key = (family.clone(), others.join(","));
                if suffix == "_bucket" {
                    let le = labels
                        .iter()
                        .find(|(k, _)| k == "le")
                        .unwrap_or_else(|| panic!("{at}: bucket without le"));
                    let le = if le.1 == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.1.parse().unwrap()
                    };
                    buckets.entry(key).or_default().push((le, value));
                }
            }
            kind => {
                assert_eq!(name, family, "{at}: a sample of another family");
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{at}: counters end in _total");
                    assert!(value >= 0.0, "{at}");
                }
            }
        }
        let previous = series.insert(line.rsplit_once(' ').unwrap().0.to_string(), value);
        assert!(previous.is_none(), "{at}: the same series twice");
    }
    for (name, f) in &families {
        assert!(f.help && !f.kind.is_empty(), "{name}: HELP and TYPE");
    }
    for ((family, labels), b) in &buckets {
        let les: Vec<f64> = b.iter().map(|(le, _)| *le).collect();
        assert!(
            les.windows(2).all(|w| w[0] < w[1]),
            "{family}{{{labels}}}: le order"
        );
        assert_eq!(les.last(), Some(&f64::INFINITY), "{family}: +Inf bucket");
        assert!(
            b.windows(2).all(|w| w[0].1 <= w[1].1),
            "{family}{{{labels}}}: buckets are cumulative: {b:?}"
        );
        let count_key = format!(
            "{family}_count{{{}}}",
            labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').unwrap();
                    format!("{k}=\"{v}\"")
                })
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            series.get(&count_key),
            Some(&b.last().unwrap().1),
            "{count_key} equals the +Inf bucket"
        );
    }
    series
}

#[test]
fn the_exposition_checker_refuses_what_prometheus_would() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"q\\\"\"} 1\n";
    assert_eq!(check_exposition(good)[r#"a_total{x="q\""}"#], 1.0);
    for bad in [
        "a_total 1\n",                                                // no TYPE
        "# TYPE a_total counter\na_total 1\n",                        // no HELP
        "# HELP a A.\n# TYPE a counter\na 1\n",                      // counter without _total
        "# HELP a A.\n# TYPE a gauge\na{x=1} 1\n",                   // unquoted label
        "# HELP a A.\n# TYPE a gauge\na 1\na 2\n",                   // duplicate series
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 0\n",
    ] {
        let refused = std::panic::catch_unwind(|| check_exposition(bad)).is_err();
        assert!(refused, "accepted: {bad}");
    }
}

// ---------------------------------------------------------------------------------------------
// /metrics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exposition_is_valid_and_true_after_real_deliveries() {
    let d = Daemon::start().await;
    let ok = Subscriber::ok().await;
    // A 404 is dead at once without disabling the subscriber (a 410 would disable it too, and
    // then how many of its deliveries went dead would depend on what was claimed meanwhile).
    let missing = Subscriber::start(|_, _| Answer::status(404)).await;
    let off = Subscriber::ok().await;
    let busy = Subscriber::start(|_, _| Answer::status(503)).await;
    let partner = Subscriber::start(|_, _| Answer::status(429).header("retry-after", "120")).await;
    for (id, s) in [
        ("m_ok", &ok),
        ("m_missing", &missing),
        ("m_busy", &busy),
        ("m_partner", &partner),
        ("m_off", &off),
    ] {
        d.api.subscriber(sub_spec(id, &s.url, &["video.*"])).await;
    }
    // Disabled by hand before any event: its deliveries wait, pending, and nothing is sent.
    let (status, body) = d
        .api
        .raw(
            "PATCH",
            "/v1/subscribers/m_off",
            Some(json!({ "disabled": true }).to_string()),
            true,
        )
        .await;
    assert_eq!((status, &body["disabled"]), (200, &json!(true)), "{body}");
    d.api.events(events("evt_m", 5, "video.trending")).await;
    wait_for("every delivery settled", LONG, || async {
        d.api.count("subscriber=m_ok&status=sent").await == 5
            && d.api.count("subscriber=m_missing&status=dead").await == 5
            && d.api.count("subscriber=m_off&status=pending").await == 5
            && d.api.count("subscriber=m_busy&status=dead").await == 5
            && d.api.count("subscriber=m_partner&status=pending").await == 5
    })
    .await;
    let (status, text) = d.api.raw("GET", "/metrics", None, false).await;
    assert_eq!(status, 200);
    let text = text.as_str().unwrap().to_string();
    let m = check_exposition(&text);
    let get = |key: &str| {
        *m.get(key)
            .unwrap_or_else(|| panic!("{key} missing from\n{text}"))
    };
    let results = |sub: &str, outcome: &str| {
        get(&format!(
            "fanout_delivery_results_total{{subscriber=\"{sub}\",lane=\"origin\",outcome=\"{outcome}\"}}"
        ))
    };
    // Three attempts each (the tests' max_attempts) for the 503s.
    assert_eq!(results("m_ok", "delivered"), 5.0);
    assert_eq!(results("m_missing", "rejected"), 5.0);
    assert_eq!(results("m_busy", "failed"), 15.0);
    let partner_attempts = results("m_partner", "failed");
    assert!(
        (1.0..=5.0).contains(&partner_attempts),
        "{partner_attempts}"
    );
    let attempts = 5.0 + 5.0 + 15.0 + partner_attempts;
    assert_eq!(
        get("fanout_attempt_latency_seconds_count{lane=\"origin\"}"),
        attempts
    );
    assert_eq!(
        get("fanout_attempt_latency_seconds_bucket{lane=\"origin\",le=\"+Inf\"}"),
        attempts
    );
    assert_eq!(
        get("fanout_attempt_latency_seconds_count{lane=\"edge\"}"),
        0.0
    );
    assert_eq!(get("fanout_edge_deferrals_total{reason=\"rate\"}"), 0.0);
    assert_eq!(get("fanout_events_ingested_total"), 5.0);
    for (sub, pending, sent, dead, paused, disabled) in [
        ("m_ok", 0.0, 5.0, 0.0, 0.0, 0.0),
        ("m_missing", 0.0, 0.0, 5.0, 0.0, 0.0),
        ("m_busy", 0.0, 0.0, 5.0, 0.0, 0.0),
        ("m_partner", 5.0, 0.0, 0.0, 1.0, 0.0),
        ("m_off", 5.0, 0.0, 0.0, 0.0, 1.0),
    ] {
        let g = |name: &str| get(&format!("{name}{{subscriber=\"{sub}\"}}"));
        assert_eq!(
            (
                g("fanout_subscriber_pending"),
                g("fanout_subscriber_in_flight"),
                g("fanout_subscriber_sent"),
                g("fanout_subscriber_dead"),
                g("fanout_subscriber_paused"),
                g("fanout_subscriber_breaker_open"),
                g("fanout_subscriber_disabled"),
            ),
            (pending, 0.0, sent, dead, paused, 0.0, disabled),
            "{sub}"
        );
    }
    assert_eq!(off.count(), 0, "nothing is sent to a disabled subscriber");
    assert!(
        !m.keys().any(|k| k.contains("subscriber=\"m_off\",lane")),
        "no attempt for m_off"
    );
    assert_eq!(get("fanout_pending"), 10.0);
    assert_eq!(get("fanout_deliveries{status=\"dead\"}"), 10.0);
    assert_eq!(
        get("fanout_oldest_pending_age_seconds{subscriber=\"m_ok\"}"),
        0.0
    );
    // The partner's deliveries wait out its Retry-After: their age only grows.
    let age = get("fanout_oldest_pending_age_seconds{subscriber=\"m_partner\"}");
    assert!(age > 0.0, "{age}");
    wait_for("the oldest pending delivery ages", LONG, || async {
        let (_, t) = d.api.raw("GET", "/metrics", None, false).await;
        let m = check_exposition(t.as_str().unwrap());
        m["fanout_oldest_pending_age_seconds{subscriber=\"m_partner\"}"] > age
    })
    .await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------------
// fanout status, --json, progress

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_table_json_outputs_and_clean_stderr() {
    let dir = tempfile::tempdir().unwrap();
    // A 404 is dead at once and leaves the subscriber enabled; a 410 disables it too.
    let sink = Subscriber::start(|r, _| match r.path.as_str() {
        "/missing" => Answer::status(404),
        "/off" => Answer::status(410),
        _ => Answer::status(200),
    })
    .await;
    let daemon = Binary::start(&dir.path().join("fanout.db"), &[]).await;
    let api = daemon.api.clone();
    api.subscriber(sub_spec("st_ok", &format!("{}/ok", sink.url), &["video.*"]))
        .await;
    // Fewer failures than the breaker's threshold (20), so its state stays `ok`.
    api.subscriber(sub_spec(
        "st_missing",
        &format!("{}/missing", sink.url),
        &["audio.*"],
    ))
    .await;
    api.subscriber(sub_spec(
        "st_off",
        &format!("{}/off", sink.url),
        &["text.*"],
    ))
    .await;

    // More than one request's worth of events from a file: the progress bar advances per
    // chunk but, stderr not being a terminal, nothing is drawn.
    let (n, missing) = (1200, 5);
    let file = dir.path().join("events.ndjson");
    let lines: Vec<String> = (0..n + missing)
        .map(|i| {
            let ty = if i < n { "video.x" } else { "audio.x" };
            json!({ "id": format!("st_{i}"), "type": ty }).to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (out, err) = client(&api, &["send", "--json", file.to_str().unwrap()]).await;
    assert_eq!(
        parse_json(&out),
        json!({ "events": n + missing, "duplicates": 0, "deliveries": n + missing })
    );
    assert_eq!(err, "", "nothing on stderr when it is not a terminal");

    wait_for("all sent or dead", LONG, || async {
        api.count("status=sent").await == n && api.count("status=dead").await == missing
    })
    .await;
    // One event for st_off: its 410 disables it.
    api.events(events("st_text", 1, "text.x")).await;
    wait_for("st_off disabled by its 410", LONG, || async {
        let (_, v) = api.get("/v1/subscribers/st_off").await;
        v["disabled"] == true
    })
    .await;

    let (out, _) = client(&api, &["status", "--json"]).await;
    let status = parse_json(&out);
    let subs = status["subscribers"].as_array().unwrap();
    let by_id = |id: &str| subs.iter().find(|s| s["id"] == id).unwrap().clone();
    let (okv, missingv, offv) = (by_id("st_ok"), by_id("st_missing"), by_id("st_off"));
    assert_eq!(
        (&okv["disabled"], &missingv["disabled"]),
        (&json!(false), &json!(false))
    );
    assert_eq!(
        (&offv["disabled"], &offv["disabled_reason"]),
        (&json!(true), &json!("the endpoint answered 410 Gone")),
        "{offv}"
    );
    assert!(offv["disabled_at_ms"].is_i64(), "{offv}");
    assert_eq!(offv["stats"]["dead"].as_i64(), Some(1), "{offv}");
    assert_eq!(
        (okv["stats"]["sent"].as_i64(), okv["stats"]["dead"].as_i64()),
        (Some(n as i64), Some(0))
    );
    assert_eq!(missingv["stats"]["dead"].as_i64(), Some(missing as i64));
    assert!(missingv["stats"]["last_error"].is_string(), "{missingv}");

    let (table, err) = client(&api, &["status"]).await;
    assert_eq!(err, "");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("SUBSCRIBER"), "{table}");
    let missing_row = lines.iter().find(|l| l.starts_with("st_missing")).unwrap();
    let cells: Vec<&str> = missing_row.split_whitespace().collect();
    // id, lane, rate, burst, pending, in flight, sent, dead, state …
    assert_eq!(
        &cells[..9],
        &[
            "st_missing",
            "origin",
            "1000",
            "1000",
            "0",
            "0",
            "0",
            "5",
            "ok"
        ],
        "{table}"
    );
    assert!(missing_row.contains("404"), "the last error: {table}");
    let off_row = lines.iter().find(|l| l.starts_with("st_off")).unwrap();
    let cells: Vec<&str> = off_row.split_whitespace().collect();
    assert_eq!(
        &cells[..11],
        &[
            "st_off",
            "origin",
            "1000",
            "1000",
            "0",
            "0",
            "0",
            "1",
            "disabled:",
            "the",
            "endpoint"
        ],
        "{table}"
    );
    assert!(
        off_row.contains("disabled: the endpoint answered 410 Gone"),
        "{table}"
    );

    let (out, _) = client(&api, &["subscriber", "list", "--json"]).await;
    assert_eq!(parse_json(&out)["subscribers"].as_array().unwrap().len(), 3);
    let (table, _) = client(&api, &["subscriber", "list"]).await;
    assert!(table.starts_with("ID "), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");

    let (out, _) = client(
        &api,
        &["deliveries", "--status", "dead", "--limit", "3", "--json"],
    )
    .await;
    let listed = parse_json(&out);
    let dead = listed["deliveries"].as_array().unwrap();
    assert_eq!(dead.len(), 3);
    assert!(listed["next"].is_string());
    let (table, _) = client(&api, &["deliveries", "--status", "dead", "--limit", "3"]).await;
    assert_eq!(
        table.lines().count(),
        5,
        "header, 3 rows, the next page: {table}"
    );
    let first = dead[0]["id"].as_str().unwrap();
    let (detail, _) = client(&api, &["deliveries", "--id", first]).await;
    assert!(detail.contains("rejected"), "{detail}");
    let (out, _) = client(&api, &["deliveries", "--id", first, "--json"]).await;
    assert_eq!(parse_json(&out)["attempts"].as_array().unwrap().len(), 1);

    let (out, err) = client(&api, &["replay", "--json", "--subscriber", "st_missing"]).await;
    assert_eq!(parse_json(&out)["replayed"], missing);
    assert_eq!(err, "", "the spinner is not drawn either");
}

// ---------------------------------------------------------------------------------------------
// fanout load

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_against_a_url_counts_2xx_and_429() {
    let target = Subscriber::start(|_, n| Answer::status(if n <= 30 { 200 } else { 429 })).await;
    let (ok, out, err) = fanout(
        &[
            "load",
            "--url",
            &format!("{}/flood", target.url),
            "--workers",
            "4",
            "--duration",
            "1s",
            "--json",
        ],
        &[],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(err, "");
    let r = parse_json(&out);
    assert_eq!(r["mode"], "url");
    assert_eq!(r["accepted"], 30, "{r}");
    let requests = r["requests"].as_u64().unwrap();
    assert_eq!(r["throttled"].as_u64(), Some(requests - 30), "{r}");
    assert_eq!(
        (r["failed"].as_u64(), r["errors"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(r["statuses"]["200"], 30);
    assert_eq!(target.count() as u64, requests);
    assert!(r["elapsed_secs"].as_f64().unwrap() >= 1.0, "{r}");

    let (ok, out, err) = fanout(
        &[
            "load",
            "--url",
            &target.url,
            "--workers",
            "1",
            "--duration",
            "200ms",
        ],
        &[],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("throttled"), "{out}");
    assert!(out.contains("(429)"), "{out}");

    let (ok, _, err) = fanout(&["load", "--url", &target.url, "--duration", "2h"], &[]).await;
    assert!(!ok && err.contains("--duration"), "{err}");
}

/// A stand-in for the edge: refuses a bad signature with 401, checks the subscriber it is
/// given, and lets `burst` deliveries through in all before deferring every other one.
async fn stand_in_edge(key: Secret, burst: u64) -> (Subscriber, Arc<AtomicU64>) {
    let granted = Arc::new(AtomicU64::new(0));
    let g = granted.clone();
    let edge = Subscriber::start(move |r, _| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let verified = sign::verify(
            std::slice::from_ref(&key),
            r.header("webhook-id"),
            r.header("webhook-timestamp"),
            r.header("webhook-signature"),
            &r.body,
            now,
        );
        if verified.is_err() || r.path != "/v1/deliveries" {
            return Answer::status(401)
                .body(r#"{"error":{"code":"unauthorized","message":"signature"}}"#);
        }
        let batch: DeliveryBatch = serde_json::from_slice(&r.body).unwrap();
        assert!(batch.subscriber.id.starts_with("load_"));
        assert_eq!(
            (batch.subscriber.rate_per_sec, batch.subscriber.burst),
            (10.0, 20)
        );
        assert_eq!(batch.subscriber.url, "http://127.0.0.1:9/sink");
        let results: Vec<DeliveryResult> = batch
            .deliveries
            .iter()
            .map(|d| {
                if g.fetch_add(1, SeqCst) < burst {
                    DeliveryResult::Delivered {
                        id: d.id.clone(),
                        status: 200,
                        latency_ms: 1,
                        failed: Vec::new(),
                    }
                } else {
                    DeliveryResult::Deferred {
                        id: d.id.clone(),
                        retry_after_ms: 100,
                        reason: fanout_core::wire::DeferReason::Rate,
                    }
                }
            })
            .collect();
        Answer::status(202).body(&json!({ "results": results }).to_string())
    })
    .await;
    (edge, granted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_against_the_edge_signs_every_call_and_counts_deferrals() {
    let key = Secret::from_bytes(&[42; 32]).unwrap();
    let (edge, _) = stand_in_edge(key.clone(), 20).await;
    let (ok, out, err) = fanout(
        &[
            "load",
            "--edge-url",
            &edge.url,
            "--sink",
            "http://127.0.0.1:9/sink",
            "--rate",
            "10",
            "--burst",
            "20",
            "--workers",
            "4",
            "--batch",
            "3",
            "--duration",
            "1s",
            "--json",
        ],
        &[("FANOUT_EDGE_KEY", &key.encode())],
    )
    .await;
    assert!(ok, "{err}");
    let r = parse_json(&out);
    assert_eq!(r["mode"], "edge");
    assert_eq!(
        (r["accepted"].as_u64(), r["errors"].as_u64()),
        (Some(20), Some(0)),
        "{r}"
    );
    let throttled = r["throttled"].as_u64().unwrap();
    assert!(throttled > 0, "{r}");
    assert_eq!(r["deferred_by_reason"]["rate"].as_u64(), Some(throttled));
    assert_eq!(r["requests"].as_u64().unwrap() * 3, 20 + throttled, "{r}");
    assert_eq!(edge.count() as u64, r["requests"].as_u64().unwrap());
    let ceiling = r["ceiling"].as_f64().unwrap();
    let elapsed = r["elapsed_secs"].as_f64().unwrap();
    assert!((ceiling - (20.0 + 10.0 * elapsed)).abs() < 0.01, "{r}");

    // The wrong key: every call is refused, the run says so and fails.
    let wrong = Secret::from_bytes(&[7; 32]).unwrap().encode();
    let (ok, out, err) = fanout(
        &[
            "load",
            "--edge-url",
            &edge.url,
            "--edge-key",
            &wrong,
            "--sink",
            "http://127.0.0.1:9/sink",
            "--duration",
            "200ms",
        ],
        &[],
    )
    .await;
    assert!(!ok, "{out}");
    assert!(err.contains("edge answered 401"), "{err}");
    assert!(out.contains("first error"), "{out}");
}
