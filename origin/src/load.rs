//! `fanout load`: N workers flood a target for a bounded time and count what was accepted and
//! what was throttled.
//!
//! Two targets: any URL (`2xx` accepted, `429` throttled), or the edge itself — signed
//! `POST /v1/deliveries` calls for one fresh subscriber pointed at a sink, where `delivered` is
//! accepted and `deferred` is throttled. Against the edge the delivered count shows the
//! subscriber's limiter at work: it cannot exceed `burst + rate × elapsed`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fanout_core::sign::Secret;
use fanout_core::wire::{Delivery, DeliveryBatch, DeliveryResult, SubscriberSpec};
use serde::Serialize;
use tokio::time::Instant;

use crate::dispatch::edge_lane::EdgeClient;
use crate::time::random_bytes;

/// Longest run accepted.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Most workers accepted.
pub const MAX_WORKERS: usize = 1000;
/// A call still out when the time is up gets this long to finish before it is abandoned.
const GRACE: Duration = Duration::from_secs(5);
/// Timeout of one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// A worker whose call failed outright waits this long before the next one.
const ERROR_PAUSE: Duration = Duration::from_millis(20);

/// What to flood.
#[derive(Debug, Clone)]
pub enum Target {
    /// Any URL: a `2xx` is accepted, a `429` throttled, anything else failed.
    Url {
        url: String,
        method: reqwest::Method,
        body: String,
    },
    /// The edge's `POST /v1/deliveries` through the edge lane's own client (signed with the
    /// edge key), `batch` deliveries per call, all for `subscriber`.
    Edge {
        base_url: String,
        client: EdgeClient,
        subscriber: SubscriberSpec,
        batch: usize,
    },
}

#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub target: Target,
    pub workers: usize,
    pub duration: Duration,
}

impl LoadPlan {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return Err(format!("--workers must be 1 to {MAX_WORKERS}"));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return Err(format!(
                "--duration must be above 0 and at most {}s",
                MAX_DURATION.as_secs()
            ));
        }
        if let Target::Edge {
            subscriber, batch, ..
        } = &self.target
        {
            if !(1..=fanout_core::wire::MAX_BATCH).contains(batch) {
                return Err(format!(
                    "--batch must be 1 to {}",
                    fanout_core::wire::MAX_BATCH
                ));
            }
            // The edge checks the same; saying it here is clearer than a 400 per call.
            subscriber
                .validate(true)
                .map_err(|e| format!("the load subscriber: {e}"))?;
        }
        Ok(())
    }
}

/// What a run drove: deliveries through an edge, or requests to a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadMode {
    Edge,
    Url,
}

/// What a run measured. `accepted`/`throttled` are deliveries against the edge, requests
/// against a URL.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    /// `edge` or `url`.
    pub mode: LoadMode,
    pub target: String,
    pub workers: usize,
    pub duration_secs: f64,
    /// From the first call to the last answer.
    pub elapsed_secs: f64,
    /// HTTP calls made.
    pub requests: u64,
    pub accepted: u64,
    pub throttled: u64,
    /// Answered but neither accepted nor throttled (another status; `failed`/`rejected`).
    pub failed: u64,
    /// Calls with no usable answer (connection error, timeout, an error status from the edge).
    pub errors: u64,
    pub accepted_per_sec: f64,
    /// Against a URL: every status seen.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub statuses: BTreeMap<u16, u64>,
    /// Against the edge: deferrals by reason.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub deferred_by_reason: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Against the edge: the most its limiter may let through, `burst + rate × elapsed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<f64>,
    /// Requests the sink received, when `fanout load` ran its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink_received: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

#[derive(Debug, Default)]
struct Tally {
    requests: AtomicU64,
    accepted: AtomicU64,
    throttled: AtomicU64,
    failed: AtomicU64,
    errors: AtomicU64,
    statuses: Mutex<BTreeMap<u16, u64>>,
    reasons: Mutex<BTreeMap<String, u64>>,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, e: String) {
        self.errors.fetch_add(1, Relaxed);
        if let Ok(mut f) = self.first_error.lock() {
            f.get_or_insert(e);
        }
    }

    fn bump<K: Ord>(map: &Mutex<BTreeMap<K, u64>>, key: K) {
        if let Ok(mut m) = map.lock() {
            *m.entry(key).or_default() += 1;
        }
    }
}

fn copy_of<K: Ord + Clone>(map: &Mutex<BTreeMap<K, u64>>) -> BTreeMap<K, u64> {
    map.lock().map(|m| m.clone()).unwrap_or_default()
}

/// A fresh id for this run: `{prefix}_{16 hex}`.
pub fn run_id(prefix: &str) -> String {
    let n = random_bytes::<8>().map(u64::from_le_bytes).unwrap_or(0);
    format!("{prefix}_{n:016x}")
}

/// A fresh `whsec_` secret for the load subscriber (the sink does not check it).
pub fn new_secret() -> Result<String, String> {
    let bytes = random_bytes::<32>().map_err(|e| format!("no randomness: {e}"))?;
    Secret::from_bytes(&bytes)
        .map(|s| s.encode())
        .map_err(|e| e.to_string())
}

/// Run the plan; `on_tick` sees the tally's (accepted, throttled) about five times a second.
pub async fn run(
    plan: LoadPlan,
    sink_count: Option<Arc<AtomicU64>>,
    on_tick: impl Fn(Duration, u64, u64) + Send + 'static,
) -> Result<LoadReport, String> {
    plan.validate()?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(plan.workers)
        .tcp_nodelay(true)
        .timeout(CALL_TIMEOUT)
        .user_agent(concat!("fanout-load/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let deadline = started + plan.duration;
    let target = Arc::new(plan.target.clone());
    let seq = Arc::new(AtomicU64::new(0));
    let run = run_id("load");
    let mut workers = Vec::with_capacity(plan.workers);
    for _ in 0..plan.workers {
        let (http, tally, target, seq, run) = (
            http.clone(),
            tally.clone(),
            target.clone(),
            seq.clone(),
            run.clone(),
        );
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let errors_before = tally.errors.load(Relaxed);
                let call = one_call(&http, &target, &tally, &seq, &run);
                if tokio::time::timeout_at(deadline + GRACE, call)
                    .await
                    .is_err()
                {
                    tally.error("abandoned when the time was up".into());
                }
                if tally.errors.load(Relaxed) > errors_before {
                    // A target that refuses at once must not turn the loop into a busy spin.
                    tokio::time::sleep_until(deadline.min(Instant::now() + ERROR_PAUSE)).await;
                }
            }
        }));
    }
    let ticker = {
        let tally = tally.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            loop {
                every.tick().await;
                on_tick(
                    started.elapsed(),
                    tally.accepted.load(Relaxed),
                    tally.throttled.load(Relaxed),
                );
            }
        })
    };
    for w in workers {
        let _ = w.await;
    }
    ticker.abort();
    let elapsed = started.elapsed().as_secs_f64();
    let accepted = tally.accepted.load(Relaxed);
    let (mode, target_text, subscriber, rate, burst) = match &plan.target {
        Target::Url { url, .. } => (LoadMode::Url, url.clone(), None, None, None),
        Target::Edge {
            base_url,
            subscriber,
            ..
        } => (
            LoadMode::Edge,
            base_url.clone(),
            Some(subscriber.id.clone()),
            Some(subscriber.rate_per_sec),
            Some(subscriber.burst),
        ),
    };
    Ok(LoadReport {
        mode,
        target: target_text,
        workers: plan.workers,
        duration_secs: plan.duration.as_secs_f64(),
        elapsed_secs: round3(elapsed),
        requests: tally.requests.load(Relaxed),
        accepted,
        throttled: tally.throttled.load(Relaxed),
        failed: tally.failed.load(Relaxed),
        errors: tally.errors.load(Relaxed),
        accepted_per_sec: round3(accepted as f64 / elapsed.max(1e-3)),
        statuses: copy_of(&tally.statuses),
        deferred_by_reason: copy_of(&tally.reasons),
        subscriber,
        rate_per_sec: rate,
        burst,
        ceiling: rate
            .zip(burst)
            .map(|(r, b)| round3(f64::from(b) + r * elapsed)),
        sink_received: sink_count.map(|c| c.load(Relaxed)),
        first_error: tally.first_error.lock().ok().and_then(|f| f.clone()),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

async fn one_call(
    http: &reqwest::Client,
    target: &Target,
    tally: &Tally,
    seq: &AtomicU64,
    run: &str,
) {
    tally.requests.fetch_add(1, Relaxed);
    match target {
        Target::Url { url, method, body } => {
            let mut req = http.request(method.clone(), url);
            if !body.is_empty() {
                req = req
                    .header("content-type", "application/json")
                    .body(body.clone());
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    // Read the body so the connection can be reused.
                    let _ = resp.bytes().await;
                    Tally::bump(&tally.statuses, status);
                    match status {
                        200..=299 => tally.accepted.fetch_add(1, Relaxed),
                        429 => tally.throttled.fetch_add(1, Relaxed),
                        _ => tally.failed.fetch_add(1, Relaxed),
                    };
                }
                Err(e) => tally.error(e.to_string()),
            }
        }
        Target::Edge {
            client,
            subscriber,
            batch,
            ..
        } => {
            let deliveries: Vec<Delivery> = (0..*batch)
                .map(|_| {
                    let n = seq.fetch_add(1, Relaxed);
                    let event_id = format!("evt_{run}_{n}");
                    Delivery {
                        id: format!("dlv_{run}_{n}"),
                        body: format!(r#"{{"id":"{event_id}","type":"load.test","n":{n}}}"#),
                        event_id,
                        event_type: "load.test".into(),
                        attempt: 1,
                        sequence: Some(n + 1),
                        ordering_key: None,
                        previous_sequence: None,
                        traceparent: None,
                        batch: None,
                    }
                })
                .collect();
            let call = DeliveryBatch {
                subscriber: subscriber.clone(),
                deliveries,
            };
            match client.send_batch(&call, &run_id("call")).await {
                Ok(results) => {
                    for r in results {
                        match r {
                            DeliveryResult::Delivered { .. } => {
                                tally.accepted.fetch_add(1, Relaxed);
                            }
                            DeliveryResult::Deferred { reason, .. } => {
                                tally.throttled.fetch_add(1, Relaxed);
                                Tally::bump(&tally.reasons, reason.as_str().to_string());
                            }
                            DeliveryResult::Failed { .. } | DeliveryResult::Rejected { .. } => {
                                tally.failed.fetch_add(1, Relaxed);
                            }
                        }
                    }
                }
                Err(e) => tally.error(e.to_string()),
            }
        }
    }
}

/// A local sink on 127.0.0.1:0 that answers 200 to everything and counts what it received.
/// Returns its URL and the count; it stops with the runtime.
pub async fn start_sink() -> Result<(String, Arc<AtomicU64>), String> {
    let count = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot start the local sink: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot start the local sink: {e}"))?;
    let counter = count.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Relaxed);
            "ok"
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/"), count))
}

/// The report for a person.
pub fn human(r: &LoadReport) -> String {
    use crate::term::human_number as num;
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<14}{v}\n"));
    if r.mode == LoadMode::Edge {
        let reasons: Vec<String> = r
            .deferred_by_reason
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        line("edge", r.target.clone());
        line(
            "subscriber",
            format!(
                "{} (rate {}/s, burst {})",
                r.subscriber.as_deref().unwrap_or("?"),
                num(r.rate_per_sec.unwrap_or(0.0)),
                r.burst.unwrap_or(0)
            ),
        );
        line("calls", format!("{} by {} workers", r.requests, r.workers));
        line("delivered", format!("{} (accepted)", r.accepted));
        line(
            "deferred",
            format!("{} (throttled: {})", r.throttled, reasons.join(", ")),
        );
    } else {
        line("url", r.target.clone());
        line(
            "requests",
            format!("{} by {} workers", r.requests, r.workers),
        );
        line("accepted", format!("{} (2xx)", r.accepted));
        line("throttled", format!("{} (429)", r.throttled));
        let statuses: Vec<String> = r
            .statuses
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        line("statuses", statuses.join(", "));
    }
    line("failed", r.failed.to_string());
    line("errors", r.errors.to_string());
    line("elapsed", format!("{:.2}s", r.elapsed_secs));
    let rate = format!("{:.2}/s", r.accepted_per_sec);
    match r.ceiling {
        Some(c) => line(
            "accepted rate",
            format!(
                "{rate} (the limiter's ceiling: burst + rate x elapsed = {c:.0}, {:.2}/s)",
                c / r.elapsed_secs.max(1e-3)
            ),
        ),
        None => line("accepted rate", rate),
    }
    if let Some(n) = r.sink_received {
        line("sink received", n.to_string());
    }
    if let Some(e) = &r.first_error {
        line("first error", crate::term::clip(e, 200));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SubscriberSpec {
        SubscriberSpec {
            id: "load_x".into(),
            url: "http://127.0.0.1:9/".into(),
            secrets: vec![new_secret().unwrap()],
            rate_per_sec: 10.0,
            burst: 20,
            max_in_flight: 64,
            timeout_ms: 10_000,
            legacy_signature: false,
            signature: Default::default(),
            signing_keys: Vec::new(),
            breaker: None,
        }
    }

    #[test]
    fn plan_validation_table() {
        let edge = |batch, workers, secs| LoadPlan {
            target: Target::Edge {
                base_url: "http://127.0.0.1:8787".into(),
                client: EdgeClient::new(
                    "http://127.0.0.1:8787",
                    Secret::from_bytes(&[7; 32]).unwrap(),
                    crate::outbound::Outbound::new(true).unwrap(),
                ),
                subscriber: spec(),
                batch,
            },
            workers,
            duration: Duration::from_secs(secs),
        };
        let cases: Vec<(LoadPlan, bool)> = vec![
            (edge(1, 8, 10), true),
            (edge(0, 8, 10), false),
            (edge(501, 8, 10), false),
            (edge(1, 0, 10), false),
            (edge(1, 8, 0), false),
            (edge(1, 8, 7200), false),
        ];
        for (i, (plan, ok)) in cases.into_iter().enumerate() {
            assert_eq!(plan.validate().is_ok(), ok, "case {i}");
        }
    }

    #[test]
    fn human_report_names_the_ceiling() {
        let r = LoadReport {
            mode: LoadMode::Edge,
            target: "http://127.0.0.1:8787".into(),
            workers: 8,
            duration_secs: 10.0,
            elapsed_secs: 10.0,
            requests: 900,
            accepted: 118,
            throttled: 782,
            failed: 0,
            errors: 0,
            accepted_per_sec: 11.8,
            statuses: BTreeMap::new(),
            deferred_by_reason: BTreeMap::from([("rate".to_string(), 782)]),
            subscriber: Some("load_x".into()),
            rate_per_sec: Some(10.0),
            burst: Some(20),
            ceiling: Some(120.0),
            sink_received: Some(118),
            first_error: None,
        };
        let text = human(&r);
        assert!(text.contains("delivered     118 (accepted)"), "{text}");
        assert!(text.contains("(throttled: rate 782)"), "{text}");
        assert!(
            text.contains("burst + rate x elapsed = 120, 12.00/s"),
            "{text}"
        );
    }
}
