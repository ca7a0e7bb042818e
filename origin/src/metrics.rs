//! In-process counters for `/metrics` (the ledger supplies the gauges).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const LANES: [&str; 2] = ["origin", "edge"];
const OUTCOMES: [&str; 4] = ["delivered", "deferred", "failed", "rejected"];

#[derive(Debug, Default)]
pub struct Metrics {
    results: [[AtomicU64; 4]; 2],
    pub events_ingested: AtomicU64,
    pub events_duplicate: AtomicU64,
    pub edge_calls: AtomicU64,
    pub edge_call_failures: AtomicU64,
}

impl Metrics {
    pub fn result(&self, lane: &str, outcome: &str) {
        let l = LANES.iter().position(|x| *x == lane);
        let o = OUTCOMES.iter().position(|x| *x == outcome);
        if let (Some(l), Some(o)) = (l, o) {
            self.results[l][o].fetch_add(1, Relaxed);
        }
    }

    /// Prometheus text exposition, with the ledger's per-status counts.
    pub fn render(&self, status_counts: &[(String, i64)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP fanout_deliveries Deliveries in the ledger by status.\n");
        out.push_str("# TYPE fanout_deliveries gauge\n");
        for status in crate::model::Status::ALL {
            let n = status_counts
                .iter()
                .find(|(s, _)| s == status.as_str())
                .map_or(0, |(_, n)| *n);
            let _ = writeln!(
                out,
                "fanout_deliveries{{status=\"{}\"}} {n}",
                status.as_str()
            );
        }
        let pending = status_counts
            .iter()
            .filter(|(s, _)| s == "pending" || s == "in_flight")
            .map(|(_, n)| *n)
            .sum::<i64>();
        out.push_str(
            "# HELP fanout_pending Deliveries not yet sent or dead (pending or in flight).\n",
        );
        out.push_str("# TYPE fanout_pending gauge\n");
        let _ = writeln!(out, "fanout_pending {pending}");
        out.push_str(
            "# HELP fanout_delivery_results_total Delivery results by lane and outcome.\n",
        );
        out.push_str("# TYPE fanout_delivery_results_total counter\n");
        for (l, lane) in LANES.iter().enumerate() {
            for (o, outcome) in OUTCOMES.iter().enumerate() {
                let n = self.results[l][o].load(Relaxed);
                let _ = writeln!(
                    out,
                    "fanout_delivery_results_total{{lane=\"{lane}\",outcome=\"{outcome}\"}} {n}"
                );
            }
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
                "fanout_edge_calls_total",
                "Calls to the edge.",
                &self.edge_calls,
            ),
            (
                "fanout_edge_call_failures_total",
                "Edge calls that failed as a whole (batch kept pending).",
                &self.edge_call_failures,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Relaxed)
            );
        }
        out
    }
}
