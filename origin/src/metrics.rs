//! `/metrics` in the Prometheus text format (version 0.0.4).
//!
//! Counters and the latency histogram live here, in memory, and are bumped where results are
//! recorded (one call per result from the dispatcher, [`Metrics::record`]); they restart at zero
//! with the process, as Prometheus counters may. Gauges (backlog per subscriber, oldest pending,
//! paused, breaker, disabled, retention) are read from the ledger at scrape time
//! ([`crate::ledger::Observe::metrics_snapshot`]) from counts the
//! ledger's triggers keep and keyed lookups: a scrape costs the same whatever the ledger holds,
//! so the unauthenticated route cannot be used to load the daemon.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fanout_core::wire::{DeferReason, DeliveryResult};

use crate::ledger::{self, LedgerError, Observe, SubscriberStats};
use crate::model::{Lane, StallView};

/// The lanes results are counted by, in the order of `Metrics::latency`.
const LANES: [Lane; 2] = [Lane::Origin, Lane::Edge];
const REASONS: [DeferReason; 4] = [
    DeferReason::Rate,
    DeferReason::InFlight,
    DeferReason::Paused,
    DeferReason::BreakerOpen,
];
/// Upper bounds of the attempt latency buckets, in milliseconds (`+Inf` is implied).
pub const LATENCY_BUCKETS_MS: [u64; 13] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
];

/// Attempt latencies of one lane: per-bucket counts (not cumulative), their sum and count.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_MS.len()],
    sum_ms: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn observe(&self, ms: u64) {
        if let Some(i) = LATENCY_BUCKETS_MS.iter().position(|&b| ms <= b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.sum_ms.fetch_add(ms, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }
}

/// (subscriber, lane, outcome).
type ResultKey = (Arc<str>, &'static str, &'static str);

/// The daemon's counters, shared (behind an `Arc`) by the dispatcher and the API.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Results by (subscriber, lane, outcome).
    results: Mutex<BTreeMap<ResultKey, u64>>,
    /// The charts' tallies since the last flush (`crate::series`).
    pub series: crate::series::acc::Accumulator,
    latency: [Histogram; 2],
    edge_deferrals: [AtomicU64; 4],
    edge_configured: bool,
    pub events_ingested: AtomicU64,
    pub events_duplicate: AtomicU64,
    pub edge_call_failures: AtomicU64,
    /// The daemons sharing the ledger as the dispatcher last read them (0 before it has; 1 on
    /// SQLite).
    pub daemons: AtomicU64,
    /// What the retention task measured (its steps' writer time).
    pub retention: RetentionStats,
    /// What the outbox task (`crate::outbox`) did, when there is one.
    pub outbox: OutboxStats,
    /// The subscribers the dispatcher's watchdog finds stalled now, by id.
    stalls: Mutex<BTreeMap<String, StallView>>,
    /// Stalls that began (each counted once).
    stalls_total: AtomicU64,
}

/// What the retention task (`crate::retention`) measured since the daemon started. It lives
/// here, with the other counters, so the task depends on the metrics and not the reverse.
#[derive(Debug, Default)]
pub struct RetentionStats {
    /// The longest time one step held the writer, in microseconds.
    pub longest_step_us: AtomicU64,
    pub steps: AtomicU64,
}

impl RetentionStats {
    pub(crate) fn observe(&self, took: Duration) {
        self.steps.fetch_add(1, Relaxed);
        self.longest_step_us
            .fetch_max(took.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }
}

/// What the outbox task measured since the daemon started, read by `/metrics`, `/healthz` and
/// `GET /v1/outbox` with atomics (the last error's text behind a lock held only to copy it).
#[derive(Debug, Default)]
pub struct OutboxStats {
    /// The outbox's redacted location and table; unset when the daemon has no outbox.
    name: std::sync::OnceLock<(String, String)>,
    pub rows_read: AtomicU64,
    pub rows_rejected: AtomicU64,
    pub rounds_failed: AtomicU64,
    /// The age of the oldest row the last round saw, in ms (0: the outbox was empty).
    pub oldest_age_ms: AtomicI64,
    /// Since when (unix ms) the outbox cannot be read; 0 while it can.
    failing_since_ms: AtomicI64,
    last_error: Mutex<String>,
    /// Another daemon reads this outbox (it holds the outbox's lock): this one waits to take
    /// over.
    standby: std::sync::atomic::AtomicBool,
}

/// `GET /v1/outbox`, and `fanout status`'s outbox line.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutboxView {
    /// The outbox's location (a path, or a URL without its password); absent without one.
    pub outbox: Option<String>,
    pub table: Option<String>,
    pub rows_read: u64,
    pub rows_rejected: u64,
    pub rounds_failed: u64,
    pub oldest_age_seconds: f64,
    /// Why the outbox cannot be read now, if it cannot.
    pub error: Option<String>,
    /// Another daemon reads the outbox now; this one takes over when that one stops.
    #[serde(default)]
    pub standby: bool,
}

impl OutboxStats {
    /// The daemon reads this outbox (set once, at start-up).
    pub fn configured(&self, location: String, table: String) {
        let _ = self.name.set((location, table));
    }

    pub(crate) fn cannot_read(&self, why: &str, now_ms: i64) {
        let _ = self
            .failing_since_ms
            .compare_exchange(0, now_ms.max(1), Relaxed, Relaxed);
        if let Ok(mut e) = self.last_error.lock() {
            *e = why.to_string();
        }
    }

    /// A round read the outbox (`standby`: it found another daemon reading it). Returns
    /// whether it could not before.
    pub(crate) fn reading_again(&self, standby: bool) -> bool {
        self.standby.store(standby, Relaxed);
        self.failing_since_ms.swap(0, Relaxed) > 0
    }

    /// `/healthz`'s problem while the outbox cannot be read: its table and for how long, never
    /// where it is nor the error (`/healthz` answers anyone; `GET /v1/outbox` says why).
    pub fn problem(&self, now_ms: i64) -> Option<crate::health::Problem> {
        let since = self.failing_since_ms.load(Relaxed);
        let (_, table) = self.name.get()?;
        (since > 0).then(|| crate::health::Problem {
            code: "outbox_unavailable",
            message: format!(
                "the outbox {table} cannot be read since {} ms ago (GET /v1/outbox says why)",
                (now_ms - since).max(0),
            ),
        })
    }

    pub fn view(&self) -> OutboxView {
        let name = self.name.get();
        let failing = self.failing_since_ms.load(Relaxed) > 0;
        OutboxView {
            outbox: name.map(|n| n.0.clone()),
            table: name.map(|n| n.1.clone()),
            rows_read: self.rows_read.load(Relaxed),
            rows_rejected: self.rows_rejected.load(Relaxed),
            rounds_failed: self.rounds_failed.load(Relaxed),
            oldest_age_seconds: self.oldest_age_ms.load(Relaxed) as f64 / 1000.0,
            error: failing.then(|| {
                self.last_error
                    .lock()
                    .map(|e| e.clone())
                    .unwrap_or_default()
            }),
            standby: !failing && self.standby.load(Relaxed),
        }
    }

    fn render(&self, out: &mut Exposition) {
        let Some((_, table)) = self.name.get() else {
            return;
        };
        let v = self.view();
        let reading = v.error.is_none() && !v.standby;
        let families: [(&str, &str, &str, f64); 6] = [
            ("fanout_outbox_rows_read_total", "counter", "Outbox rows taken into the ledger (events) or moved to <table>_rejected.", v.rows_read as f64),
            ("fanout_outbox_rows_rejected_total", "counter", "Outbox rows that were not valid events, moved to <table>_rejected.", v.rows_rejected as f64),
            ("fanout_outbox_rounds_failed_total", "counter", "Outbox rounds that failed (the outbox unreadable, or the ledger unable to write); their rows stayed.", v.rounds_failed as f64),
            ("fanout_outbox_oldest_age_seconds", "gauge", "Age of the oldest row the last outbox round saw (0: empty).", v.oldest_age_seconds),
            ("fanout_outbox_up", "gauge", "1 while the outbox can be read.", f64::from(u8::from(v.error.is_none()))),
            ("fanout_outbox_reader", "gauge", "1 while this daemon is the one reading the outbox (0: another daemon is, or it cannot be read).", f64::from(u8::from(reading))),
        ];
        for (name, kind, help, value) in families {
            out.family(name, kind, help);
            out.sample(name, &[("table", table)], value);
        }
    }
}

/// What the ledger says at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Deliveries per status, all subscribers (removed ones included).
    pub status_counts: Vec<(String, i64)>,
    pub subscribers: Vec<SubscriberStats>,
    /// What retention removed and the oldest finished deliveries kept.
    pub retention: ledger::retention::RetentionReport,
    pub now_ms: i64,
}

/// Read the gauges from one consistent snapshot of the ledger (its reader connection, so a
/// scrape never holds up the dispatcher's writes) and render everything.
pub async fn scrape(
    ledger: &(impl Observe + Sync),
    metrics: &Metrics,
    breaker: fanout_core::breaker::BreakerConfig,
) -> Result<String, LedgerError> {
    let now_ms = crate::time::now_ms();
    let (status_counts, subscribers, retention) = ledger.metrics_snapshot(now_ms, breaker).await?;
    let snap = Snapshot {
        status_counts,
        subscribers,
        retention,
        now_ms,
    };
    Ok(metrics.render(&snap))
}

impl Metrics {
    pub fn new(edge_configured: bool) -> Metrics {
        Metrics {
            edge_configured,
            ..Metrics::default()
        }
    }

    /// The dispatcher's watchdog changed its set of stalled subscribers: `all` now, of which
    /// `began` are new.
    pub fn stalls(&self, all: BTreeMap<String, StallView>, began: usize) {
        self.stalls_total.fetch_add(began as u64, Relaxed);
        if let Ok(mut s) = self.stalls.lock() {
            *s = all;
        }
    }

    /// The subscribers stalled now, by id.
    pub fn stalled(&self) -> BTreeMap<String, StallView> {
        self.stalls.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Whether the daemon has an edge (so `auto` subscribers use it).
    pub fn edge_configured(&self) -> bool {
        self.edge_configured
    }

    /// Count one delivery result of `subscriber` by `lane`. `measured_latency_ms` stands in
    /// when the result carries none (the origin lane measures around the whole send).
    pub fn record(
        &self,
        subscriber: &Arc<str>,
        lane: Lane,
        result: &DeliveryResult,
        measured_latency_ms: Option<u64>,
    ) {
        // A result is the edge's or the origin's (`auto` is resolved before a send).
        let edge = lane == Lane::Edge;
        let label = if edge { Lane::Edge } else { Lane::Origin }.as_str();
        if let Ok(mut r) = self.results.lock() {
            *r.entry((subscriber.clone(), label, result.outcome()))
                .or_default() += 1;
        }
        let latency = match result {
            DeliveryResult::Deferred { reason, .. } => {
                if edge {
                    if let Some(i) = REASONS.iter().position(|r| r == reason) {
                        self.edge_deferrals[i].fetch_add(1, Relaxed);
                    }
                }
                None
            }
            DeliveryResult::Delivered { latency_ms, .. } => Some(*latency_ms),
            DeliveryResult::Failed { latency_ms, .. } => *latency_ms,
            DeliveryResult::Rejected { .. } => None,
        };
        let latency = latency.or(measured_latency_ms);
        if let Some(ms) = latency {
            let i = usize::from(edge);
            self.latency[i].observe(ms);
        }
        self.series.record(subscriber, result, latency);
    }

    /// The whole exposition.
    pub fn render(&self, snap: &Snapshot) -> String {
        let mut out = Exposition::default();
        self.render_counters(&mut out);
        render_gauges(&mut out, snap);
        self.render_stalls(&mut out, snap);
        self.render_retention(&mut out, snap);
        self.outbox.render(&mut out);
        out.text
    }

    fn render_counters(&self, out: &mut Exposition) {
        out.family(
            "fanout_delivery_results_total",
            "counter",
            "Delivery results (attempts and edge deferrals) by subscriber, lane and outcome \
             (delivered, deferred, failed, rejected).",
        );
        let results = self.results.lock().map(|r| r.clone()).unwrap_or_default();
        for ((sub, lane, outcome), n) in &results {
            out.sample(
                "fanout_delivery_results_total",
                &[("subscriber", sub), ("lane", lane), ("outcome", outcome)],
                *n as f64,
            );
        }
        out.family(
            "fanout_edge_deferrals_total",
            "counter",
            "Deliveries the edge handed back unsent, by reason (no attempt spent).",
        );
        for (i, r) in REASONS.iter().enumerate() {
            out.sample(
                "fanout_edge_deferrals_total",
                &[("reason", r.as_str())],
                self.edge_deferrals[i].load(Relaxed) as f64,
            );
        }
        out.family(
            "fanout_attempt_latency_seconds",
            "histogram",
            "Latency of delivery attempts, by lane (the edge's measure for the edge lane).",
        );
        for (i, lane) in LANES.iter().enumerate() {
            let lane = lane.as_str();
            let h = &self.latency[i];
            let mut cumulative = 0u64;
            for (b, le) in LATENCY_BUCKETS_MS.iter().enumerate() {
                cumulative += h.buckets[b].load(Relaxed);
                let le = format!("{}", *le as f64 / 1000.0);
                out.sample(
                    "fanout_attempt_latency_seconds_bucket",
                    &[("lane", lane), ("le", &le)],
                    cumulative as f64,
                );
            }
            let count = h.count.load(Relaxed);
            out.sample(
                "fanout_attempt_latency_seconds_bucket",
                &[("lane", lane), ("le", "+Inf")],
                count as f64,
            );
            out.sample(
                "fanout_attempt_latency_seconds_sum",
                &[("lane", lane)],
                h.sum_ms.load(Relaxed) as f64 / 1000.0,
            );
            out.sample(
                "fanout_attempt_latency_seconds_count",
                &[("lane", lane)],
                count as f64,
            );
        }
        for (name, help, v) in [
            (
                "fanout_events_ingested_total",
                "Events accepted (new).",
                &self.events_ingested,
            ),
            (
                "fanout_events_duplicate_total",
                "Events received again (no new deliveries).",
                &self.events_duplicate,
            ),
            (
                "fanout_edge_call_failures_total",
                "Edge calls that failed as a whole (the batch stays pending).",
                &self.edge_call_failures,
            ),
        ] {
            out.family(name, "counter", help);
            out.sample(name, &[], v.load(Relaxed) as f64);
        }
        out.family(
            "fanout_daemons",
            "gauge",
            "Daemons sharing the ledger (they split its subscribers' claims), as this one last \
             read them: 1 on SQLite.",
        );
        out.sample("fanout_daemons", &[], self.daemons.load(Relaxed) as f64);
        out.family(
            "fanout_clock_offset_seconds",
            "gauge",
            "How far the PostgreSQL server's clock is ahead of this host's (negative: behind), as \
             last measured; the daemon uses the server's for the shared ledger and the host's to \
             sign. Over 1 s either way is logged as a warning naming the clock that is off. 0 on \
             SQLite.",
        );
        out.sample(
            "fanout_clock_offset_seconds",
            &[],
            crate::time::offset_ms() as f64 / 1000.0,
        );
        if let Some(peers) = crate::time::peer_offset_ms() {
            out.family(
                "fanout_peer_clock_offset_seconds",
                "gauge",
                "How far the clocks of the HTTP servers the daemon calls (the Date of their last \
                 answers, median; whole seconds) are ahead of this host's: the clocks receivers \
                 check webhook-timestamp with. Absent until one answered.",
            );
            out.sample(
                "fanout_peer_clock_offset_seconds",
                &[],
                peers as f64 / 1000.0,
            );
        }
    }
}

impl Metrics {
    fn render_stalls(&self, out: &mut Exposition, snap: &Snapshot) {
        out.family(
            "fanout_dispatcher_stalls_total",
            "counter",
            "Subscribers the dispatcher's watchdog found stalled (ready to send, its limiter \
             allowing and no wait stated, and nothing sent for 10 s), each stall counted once.",
        );
        out.sample(
            "fanout_dispatcher_stalls_total",
            &[],
            self.stalls_total.load(Relaxed) as f64,
        );
        out.family(
            "fanout_subscriber_stalled",
            "gauge",
            "1 while the dispatcher's watchdog finds the subscriber stalled (this daemon's \
             subscribers only).",
        );
        let stalled = self.stalled();
        for s in &snap.subscribers {
            let v = f64::from(u8::from(stalled.contains_key(&s.id)));
            out.sample("fanout_subscriber_stalled", &[("subscriber", &s.id)], v);
        }
    }

    fn render_retention(&self, out: &mut Exposition, snap: &Snapshot) {
        let r = &snap.retention;
        out.family(
            "fanout_retention_removed_total",
            "counter",
            "Rows retention removed from the ledger (all time): sent and dead deliveries, their \
             attempts, and events no delivery referred to.",
        );
        for (kind, n) in [
            ("sent", r.removed_sent),
            ("dead", r.removed_dead),
            ("attempts", r.removed_attempts),
            ("events", r.removed_events),
        ] {
            out.sample(
                "fanout_retention_removed_total",
                &[("kind", kind)],
                n as f64,
            );
        }
        out.family(
            "fanout_retention_oldest_kept_age_seconds",
            "gauge",
            "Age of the oldest finished delivery kept, by status (since it was sent or went \
             dead; 0 when none).",
        );
        for (status, at) in [("sent", r.oldest_sent_at_ms), ("dead", r.oldest_dead_at_ms)] {
            out.sample(
                "fanout_retention_oldest_kept_age_seconds",
                &[("status", status)],
                at.map_or(0.0, |t| (snap.now_ms - t).max(0) as f64 / 1000.0),
            );
        }
        out.family(
            "fanout_retention_last_run_timestamp_seconds",
            "gauge",
            "The time (its cut-offs' now) of the last retention pass that completed (unix seconds; 0 \
             before the first).",
        );
        out.sample(
            "fanout_retention_last_run_timestamp_seconds",
            &[],
            r.last_run_at_ms.map_or(0.0, |t| t as f64 / 1000.0),
        );
        out.family(
            "fanout_retention_longest_step_seconds",
            "gauge",
            "The longest one retention step held the ledger's writer since the daemon started.",
        );
        out.sample(
            "fanout_retention_longest_step_seconds",
            &[],
            self.retention.longest_step_us.load(Relaxed) as f64 / 1_000_000.0,
        );
    }
}

fn render_gauges(out: &mut Exposition, snap: &Snapshot) {
    out.family(
        "fanout_deliveries",
        "gauge",
        "Deliveries in the ledger by status.",
    );
    for status in crate::model::Status::ALL {
        let n = snap
            .status_counts
            .iter()
            .find(|(s, _)| s == status.as_str())
            .map_or(0, |(_, n)| *n);
        out.sample(
            "fanout_deliveries",
            &[("status", status.as_str())],
            n as f64,
        );
    }
    let pending = snap
        .status_counts
        .iter()
        .filter(|(s, _)| s == "pending" || s == "in_flight")
        .map(|(_, n)| *n)
        .sum::<i64>();
    out.family(
        "fanout_pending",
        "gauge",
        "Deliveries not yet sent or dead (pending or in flight).",
    );
    out.sample("fanout_pending", &[], pending as f64);
    type Gauge = fn(&SubscriberStats, i64) -> f64;
    let per_subscriber: [(&str, &str, Gauge); 8] = [
        (
            "fanout_subscriber_pending",
            "Deliveries waiting to be sent, by subscriber.",
            |s, _| s.pending as f64,
        ),
        (
            "fanout_subscriber_in_flight",
            "Deliveries being sent right now, by subscriber.",
            |s, _| s.in_flight as f64,
        ),
        (
            "fanout_subscriber_sent",
            "Deliveries sent, by subscriber.",
            |s, _| s.sent as f64,
        ),
        (
            "fanout_subscriber_dead",
            "Dead deliveries (awaiting replay), by subscriber.",
            |s, _| s.dead as f64,
        ),
        (
            "fanout_oldest_pending_age_seconds",
            "Age of the oldest delivery not yet sent or dead, by subscriber (0 when none).",
            |s, now| {
                s.oldest_pending_at_ms
                    .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0)
            },
        ),
        (
            "fanout_subscriber_paused",
            "1 while a 429 or 503 with Retry-After pauses the subscriber (origin's limiter).",
            |s, _| f64::from(u8::from(s.paused_until_ms.is_some())),
        ),
        (
            "fanout_subscriber_breaker_open",
            "1 while the subscriber's breaker is open or half-open (origin's limiter).",
            |s, _| f64::from(u8::from(s.breaker != "closed")),
        ),
        (
            "fanout_subscriber_disabled",
            "1 while the subscriber is disabled (a 410, --disable-after or by hand): its deliveries wait.",
            |s, _| f64::from(u8::from(s.disabled)),
        ),
    ];
    for (name, help, value) in per_subscriber {
        out.family(name, "gauge", help);
        for s in &snap.subscribers {
            out.sample(name, &[("subscriber", &s.id)], value(s, snap.now_ms));
        }
    }
}

/// Writes the text format: `# HELP`/`# TYPE` once per family, then its samples.
#[derive(Debug, Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format requires.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(ms: u64) -> DeliveryResult {
        DeliveryResult::Delivered {
            id: "d".into(),
            status: 200,
            latency_ms: ms,
            failed: Vec::new(),
        }
    }

    #[test]
    fn counts_results_deferrals_and_latency() {
        let m = Metrics::new(true);
        let a: Arc<str> = Arc::from("a\"b");
        m.record(&a, Lane::Edge, &delivered(3), None);
        m.record(&a, Lane::Edge, &delivered(700), None);
        m.record(
            &a,
            Lane::Edge,
            &DeliveryResult::Deferred {
                id: "d".into(),
                retry_after_ms: 100,
                reason: DeferReason::Rate,
            },
            None,
        );
        m.record(
            &a,
            Lane::Origin,
            &DeliveryResult::Rejected {
                id: "d".into(),
                status: Some(410),
                reason: "gone".into(),
                response_body: None,
            },
            Some(12),
        );
        let text = m.render(&Snapshot::default());
        for line in [
            r#"fanout_delivery_results_total{subscriber="a\"b",lane="edge",outcome="delivered"} 2"#,
            r#"fanout_delivery_results_total{subscriber="a\"b",lane="edge",outcome="deferred"} 1"#,
            r#"fanout_delivery_results_total{subscriber="a\"b",lane="origin",outcome="rejected"} 1"#,
            r#"fanout_edge_deferrals_total{reason="rate"} 1"#,
            r#"fanout_edge_deferrals_total{reason="paused"} 0"#,
            r#"fanout_attempt_latency_seconds_bucket{lane="edge",le="0.005"} 1"#,
            r#"fanout_attempt_latency_seconds_bucket{lane="edge",le="0.5"} 1"#,
            r#"fanout_attempt_latency_seconds_bucket{lane="edge",le="1"} 2"#,
            r#"fanout_attempt_latency_seconds_bucket{lane="edge",le="+Inf"} 2"#,
            r#"fanout_attempt_latency_seconds_sum{lane="edge"} 0.703"#,
            r#"fanout_attempt_latency_seconds_count{lane="origin"} 1"#,
            r#"fanout_attempt_latency_seconds_bucket{lane="origin",le="0.01"} 0"#,
            r#"fanout_attempt_latency_seconds_bucket{lane="origin",le="0.025"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn gauges_come_from_the_snapshot() {
        let sub = SubscriberStats {
            id: "p".into(),
            lane: crate::model::Lane::Edge,
            rate_per_sec: 10.0,
            burst: 20,
            max_in_flight: 8,
            pending: 5,
            in_flight: 2,
            sent: 40,
            dead: 1,
            oldest_pending_at_ms: Some(1_000),
            paused_until_ms: Some(9_000),
            breaker: "open".into(),
            consecutive_failures: 20,
            disabled: true,
            customer: None,
        };
        let snap = Snapshot {
            status_counts: vec![("pending".into(), 5), ("in_flight".into(), 2)],
            subscribers: vec![sub],
            retention: ledger::retention::RetentionReport {
                removed_sent: 12,
                removed_events: 3,
                oldest_dead_at_ms: Some(500),
                last_run_at_ms: Some(4_000),
                ..Default::default()
            },
            now_ms: 4_500,
        };
        let text = Metrics::new(false).render(&snap);
        for line in [
            r#"fanout_deliveries{status="pending"} 5"#,
            r#"fanout_deliveries{status="sent"} 0"#,
            "fanout_pending 7",
            r#"fanout_subscriber_pending{subscriber="p"} 5"#,
            r#"fanout_subscriber_in_flight{subscriber="p"} 2"#,
            r#"fanout_subscriber_dead{subscriber="p"} 1"#,
            r#"fanout_oldest_pending_age_seconds{subscriber="p"} 3.5"#,
            r#"fanout_subscriber_paused{subscriber="p"} 1"#,
            r#"fanout_subscriber_breaker_open{subscriber="p"} 1"#,
            r#"fanout_subscriber_disabled{subscriber="p"} 1"#,
            r#"fanout_retention_removed_total{kind="sent"} 12"#,
            r#"fanout_retention_removed_total{kind="events"} 3"#,
            r#"fanout_retention_removed_total{kind="dead"} 0"#,
            r#"fanout_retention_oldest_kept_age_seconds{status="dead"} 4"#,
            r#"fanout_retention_oldest_kept_age_seconds{status="sent"} 0"#,
            "fanout_retention_last_run_timestamp_seconds 4",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[test]
    fn label_escaping() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }
}
