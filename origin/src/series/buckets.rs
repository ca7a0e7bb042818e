//! The arithmetic of the charts' series (pure): time buckets of two sizes, the fixed
//! log-scale latency histogram whose percentiles combine exactly (across daemons, subscribers
//! and into coarser buckets, by adding counts), the rows the ledger keeps, and the dense view
//! `GET /v1/series` answers with.
//!
//! A row is one subscriber's bucket: results counted by outcome, attempt latencies in
//! [`HIST_LEN`] buckets, and gauges sampled when the daemon flushed (backlog, the age of the
//! oldest open delivery, in flight, its cap, paused, breaker open). Rows of one subscriber and
//! bucket written by several flushes or daemons [`SeriesRow::absorb`] each other: counts add,
//! gauges keep the highest sample. Rows of several subscribers [`combine`]: counts and the
//! backlog, in flight, cap, paused and open breakers add; the oldest age is the oldest.

use fanout_core::wire::DeliveryResult;
use serde::Serialize;

/// The fine buckets (the last 15 minutes and hour) and how often the daemon flushes its
/// tallies.
pub const FINE_MS: i64 = 10_000;
/// The coarse buckets (the last day).
pub const COARSE_MS: i64 = 300_000;
/// Latency buckets: bucket `i < HIST_LEN - 1` holds latencies up to `2^(i/4)` ms (and above the
/// previous bound); the last holds everything above `2^16` ms (65.5 s).
pub const HIST_LEN: usize = 66;
/// Fine rows are kept this long, coarse ones [`KEEP_COARSE_MS`] (retention's plan).
pub const KEEP_FINE_MS: i64 = 2 * 3_600_000;
pub const KEEP_COARSE_MS: i64 = 2 * 86_400_000;

/// The three windows the charts show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Quarter,
    Hour,
    Day,
}

impl Window {
    /// `15m`, `1h` or `1d` (the default is the hour).
    pub fn parse(s: Option<&str>) -> Result<Window, String> {
        match s {
            Some("15m") => Ok(Window::Quarter),
            None | Some("") | Some("1h") => Ok(Window::Hour),
            Some("1d") => Ok(Window::Day),
            Some(other) => Err(format!("window must be 15m, 1h or 1d, not {other:?}")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Window::Quarter => "15m",
            Window::Hour => "1h",
            Window::Day => "1d",
        }
    }

    /// The bucket size the window is drawn with.
    pub fn resolution_ms(self) -> i64 {
        match self {
            Window::Quarter | Window::Hour => FINE_MS,
            Window::Day => COARSE_MS,
        }
    }

    /// The buckets shown at `now_ms`: `[from, to)`, the last one the one before the bucket
    /// still filling.
    pub fn range(self, now_ms: i64) -> (i64, i64) {
        let res = self.resolution_ms();
        let to = bucket_start(now_ms, res);
        let span = match self {
            Window::Quarter => 900_000,
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
        };
        (to - span, to)
    }
}

/// The start of the bucket of size `res` holding `t_ms`.
pub fn bucket_start(t_ms: i64, res: i64) -> i64 {
    t_ms.div_euclid(res) * res
}

/// The latency bucket of `ms`: the first whose bound `2^(i/4)` holds it.
pub fn latency_index(ms: u64) -> usize {
    if ms <= 1 {
        return 0;
    }
    let i = (4.0 * (ms as f64).log2()).ceil() as usize;
    i.min(HIST_LEN - 1)
}

/// The upper bound of latency bucket `i`, in ms (the last bucket's lower bound times `2^(1/4)`).
pub fn latency_bound(i: usize) -> f64 {
    2f64.powf(i as f64 / 4.0)
}

/// The `p`-quantile (0 < p ≤ 1) of a latency histogram: the bound of the bucket holding the
/// `⌈p·n⌉`-th latency; `None` for an empty one.
pub fn percentile(hist: &[u64], p: f64) -> Option<f64> {
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((p * n as f64).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (i, &c) in hist.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(latency_bound(i));
        }
    }
    None
}

/// Add `b` into `a` bucket by bucket (either may be shorter: missing buckets count 0).
pub fn add_hist(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Results counted by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub delivered: u64,
    pub failed: u64,
    pub deferred: u64,
    pub rejected: u64,
}

impl Counts {
    pub fn count(&mut self, r: &DeliveryResult) {
        match r {
            DeliveryResult::Delivered { .. } => self.delivered += 1,
            DeliveryResult::Failed { .. } => self.failed += 1,
            DeliveryResult::Deferred { .. } => self.deferred += 1,
            DeliveryResult::Rejected { .. } => self.rejected += 1,
        }
    }

    pub fn add(&mut self, o: &Counts) {
        self.delivered += o.delivered;
        self.failed += o.failed;
        self.deferred += o.deferred;
        self.rejected += o.rejected;
    }

    pub fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// One subscriber's tally between two flushes: results and attempt latencies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub counts: Counts,
    pub latency: Vec<u64>,
}

impl Tally {
    /// Count one result, its latency (if it has one) in the histogram.
    pub fn record(&mut self, r: &DeliveryResult, latency_ms: Option<u64>) {
        self.counts.count(r);
        if let Some(ms) = latency_ms {
            if self.latency.is_empty() {
                self.latency = vec![0; HIST_LEN];
            }
            self.latency[latency_index(ms)] += 1;
        }
    }

    pub fn absorb(&mut self, o: &Tally) {
        self.counts.add(&o.counts);
        add_hist(&mut self.latency, &o.latency);
    }
}

/// The gauges sampled at a flush.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Gauges {
    /// Deliveries pending (not yet claimed).
    pub backlog: i64,
    /// The age of the oldest pending or in-flight delivery, in ms (0: none).
    pub oldest_age_ms: i64,
    pub in_flight: i64,
    /// The in-flight cap (`max_in_flight`).
    pub cap: i64,
    /// 1 when paused by a `Retry-After` (in a combined point: how many subscribers were).
    pub paused: i64,
    /// 1 when the breaker is not closed (in a combined point: how many).
    pub breaker_open: i64,
}

impl Gauges {
    fn max(&mut self, o: &Gauges) {
        self.backlog = self.backlog.max(o.backlog);
        self.oldest_age_ms = self.oldest_age_ms.max(o.oldest_age_ms);
        self.in_flight = self.in_flight.max(o.in_flight);
        self.cap = self.cap.max(o.cap);
        self.paused = self.paused.max(o.paused);
        self.breaker_open = self.breaker_open.max(o.breaker_open);
    }

    fn sum(&mut self, o: &Gauges) {
        self.backlog += o.backlog;
        self.oldest_age_ms = self.oldest_age_ms.max(o.oldest_age_ms);
        self.in_flight += o.in_flight;
        self.cap += o.cap;
        self.paused += o.paused;
        self.breaker_open += o.breaker_open;
    }

    /// Nothing to chart: no backlog, nothing in flight, not paused, breaker closed.
    pub fn idle(&self) -> bool {
        self.backlog == 0 && self.in_flight == 0 && self.paused == 0 && self.breaker_open == 0
    }
}

/// One subscriber's bucket as the ledger keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesRow {
    pub resolution_ms: i64,
    pub bucket_ms: i64,
    pub subscriber_id: String,
    pub counts: Counts,
    /// [`HIST_LEN`] counts, or empty for none.
    pub latency: Vec<u64>,
    pub gauges: Gauges,
}

impl SeriesRow {
    /// Fold another flush's row of the same subscriber and bucket into this one.
    pub fn absorb(&mut self, o: &SeriesRow) {
        self.counts.add(&o.counts);
        add_hist(&mut self.latency, &o.latency);
        self.gauges.max(&o.gauges);
    }
}

/// The key of the rows that sum every subscriber of a scope, written beside the subscribers'
/// own by each flush ([`flush_rows`]): `*` for every subscriber (the operator's combined
/// chart), `*` and the customer's id for one customer's (its portal's). No subscriber id holds
/// a `*` (`fanout_core::wire::validate_id`), so no key is a subscriber's. A combined chart
/// then reads one row per bucket, whatever the number of subscribers.
pub fn total_key(customer: Option<&str>) -> String {
    match customer {
        None => "*".into(),
        Some(c) => format!("*{c}"),
    }
}

/// The rows one flush writes: for each subscriber with a tally or gauges worth charting, its
/// fine bucket `bucket_ms` and the coarse bucket holding it, and the same two of the totals
/// of every subscriber ([`total_key`]`(None)`) and of each customer owning one of them
/// (`gauges` name each sampled subscriber's customer; a tally of a subscriber not sampled,
/// removed meanwhile, counts in the total of all only). A total's gauges are the sum of the
/// subscribers' at this flush; flushes into one bucket keep the highest sum. Rows go in key
/// order, then resolution: the same order in every daemon.
pub fn flush_rows(
    bucket_ms: i64,
    tallies: Vec<(String, Tally)>,
    gauges: Vec<(String, Option<String>, Gauges)>,
) -> Vec<SeriesRow> {
    use std::collections::BTreeMap;
    let mut by_sub: BTreeMap<String, (Tally, Gauges)> = Default::default();
    for (id, t) in tallies {
        by_sub.entry(id).or_default().0.absorb(&t);
    }
    let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
    for (id, owner, g) in &gauges {
        if let Some(o) = owner {
            owners.insert(id, o);
        }
        if !g.idle() || by_sub.contains_key(id) {
            by_sub.entry(id.clone()).or_default().1 = *g;
        }
    }
    let mut totals: BTreeMap<String, (Tally, Gauges)> = BTreeMap::new();
    for (id, (t, g)) in &by_sub {
        let owner = owners.get(id.as_str()).copied();
        for key in std::iter::once(total_key(None)).chain(owner.map(|o| total_key(Some(o)))) {
            let total = totals.entry(key).or_default();
            total.0.absorb(t);
            total.1.sum(g);
        }
    }
    by_sub.extend(totals);
    let mut rows = Vec::with_capacity(by_sub.len() * 2);
    for (id, (t, g)) in by_sub {
        for res in [FINE_MS, COARSE_MS] {
            rows.push(SeriesRow {
                resolution_ms: res,
                bucket_ms: bucket_start(bucket_ms, res),
                subscriber_id: id.clone(),
                counts: t.counts,
                latency: t.latency.clone(),
                gauges: g,
            });
        }
    }
    rows
}

/// One point of a chart: a bucket's results, percentiles and gauges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// The bucket's start, unix ms.
    pub t_ms: i64,
    #[serde(flatten)]
    pub counts: Counts,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    #[serde(flatten)]
    pub gauges: Gauges,
}

/// `GET /v1/series`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesView {
    pub window: &'static str,
    pub bucket_ms: i64,
    pub from_ms: i64,
    pub to_ms: i64,
    /// The subscriber charted; absent: every subscriber the caller sees, combined.
    pub subscriber: Option<String>,
    pub points: Vec<SeriesPoint>,
}

/// Combine `rows` (any subscribers, the window's resolution) into one point per bucket of
/// `window` at `now_ms`, every bucket present (an empty one is zeros).
pub fn combine(
    window: Window,
    now_ms: i64,
    subscriber: Option<String>,
    rows: &[SeriesRow],
) -> SeriesView {
    let res = window.resolution_ms();
    let (from, to) = window.range(now_ms);
    let n = ((to - from) / res) as usize;
    let mut acc: Vec<(Counts, Vec<u64>, Gauges)> = vec![Default::default(); n];
    for r in rows {
        if r.resolution_ms != res || r.bucket_ms < from || r.bucket_ms >= to {
            continue;
        }
        let slot = &mut acc[((r.bucket_ms - from) / res) as usize];
        slot.0.add(&r.counts);
        add_hist(&mut slot.1, &r.latency);
        slot.2.sum(&r.gauges);
    }
    let points = acc
        .into_iter()
        .enumerate()
        .map(|(i, (counts, hist, gauges))| SeriesPoint {
            t_ms: from + i as i64 * res,
            counts,
            p50_ms: percentile(&hist, 0.5),
            p99_ms: percentile(&hist, 0.99),
            gauges,
        })
        .collect();
    SeriesView {
        window: window.as_str(),
        bucket_ms: res,
        from_ms: from,
        to_ms: to,
        subscriber,
        points,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_windows() {
        // (t, res, start)
        let cases = [
            (0, FINE_MS, 0),
            (9_999, FINE_MS, 0),
            (10_000, FINE_MS, 10_000),
            (-1, FINE_MS, -10_000),
            (299_999, COARSE_MS, 0),
            (300_001, COARSE_MS, 300_000),
        ];
        for (t, res, start) in cases {
            assert_eq!(bucket_start(t, res), start, "{t} {res}");
        }
        let now = 10 * 86_400_000 + 12_345;
        assert_eq!(
            Window::Hour.range(now),
            (
                10 * 86_400_000 + 10_000 - 3_600_000,
                10 * 86_400_000 + 10_000
            )
        );
        assert_eq!(Window::Day.range(now), (9 * 86_400_000, 10 * 86_400_000));
        assert_eq!(Window::parse(Some("1d")), Ok(Window::Day));
        assert_eq!(Window::parse(Some("15m")), Ok(Window::Quarter));
        assert_eq!(
            Window::Quarter.range(now),
            (10 * 86_400_000 + 10_000 - 900_000, 10 * 86_400_000 + 10_000)
        );
        assert_eq!(Window::Quarter.resolution_ms(), FINE_MS);
        assert_eq!(Window::parse(None), Ok(Window::Hour));
        assert!(Window::parse(Some("1w")).is_err());
    }

    #[test]
    fn latency_buckets_table() {
        // (latency, bucket, its bound)
        let cases: [(u64, usize, f64); 7] = [
            (0, 0, 1.0),
            (1, 0, 1.0),
            (2, 4, 2.0),
            (3, 7, 2f64.powf(1.75)),
            (100, 27, 2f64.powf(6.75)),
            (65_536, 64, 65_536.0),
            (10_000_000, 65, 2f64.powf(16.25)),
        ];
        for (ms, i, bound) in cases {
            assert_eq!(latency_index(ms), i, "{ms}");
            assert!((latency_bound(i) - bound).abs() < 1e-9, "{ms}");
            assert!(ms as f64 <= latency_bound(i) || i == HIST_LEN - 1, "{ms}");
        }
    }

    fn hist(latencies: &[u64]) -> Vec<u64> {
        let mut t = Tally::default();
        for &ms in latencies {
            t.record(
                &DeliveryResult::Rejected {
                    id: String::new(),
                    status: None,
                    reason: String::new(),
                    response_body: None,
                },
                Some(ms),
            );
        }
        t.latency
    }

    #[test]
    fn percentiles_table() {
        // (latencies, p, quantile)
        let cases: Vec<(Vec<u64>, f64, Option<f64>)> = vec![
            (vec![], 0.5, None),
            (vec![100], 0.5, Some(latency_bound(27))),
            (vec![1, 1, 1, 100], 0.5, Some(1.0)),
            (vec![1, 1, 1, 100], 0.99, Some(latency_bound(27))),
            (
                (1..=100).collect(),
                0.5,
                Some(latency_bound(latency_index(50))),
            ),
            (
                (1..=100).collect(),
                0.99,
                Some(latency_bound(latency_index(99))),
            ),
        ];
        for (l, p, q) in cases {
            assert_eq!(percentile(&hist(&l), p), q, "{l:?} {p}");
        }
    }

    /// Two daemons' halves of a bucket give the same percentiles as one daemon that saw all.
    #[test]
    fn histograms_combine_exactly() {
        let all: Vec<u64> = (0..500).map(|i| (i * 37 % 900) as u64).collect();
        let (a, b) = all.split_at(123);
        let mut merged = hist(a);
        add_hist(&mut merged, &hist(b));
        assert_eq!(merged, hist(&all));
        for p in [0.5, 0.9, 0.99] {
            assert_eq!(percentile(&merged, p), percentile(&hist(&all), p));
        }
    }

    fn row(res: i64, bucket: i64, sub: &str, delivered: u64, g: Gauges) -> SeriesRow {
        SeriesRow {
            resolution_ms: res,
            bucket_ms: bucket,
            subscriber_id: sub.into(),
            counts: Counts {
                delivered,
                ..Counts::default()
            },
            latency: hist(&vec![10; delivered as usize]),
            gauges: g,
        }
    }

    #[test]
    fn rows_absorb_and_combine() {
        let g = |backlog, age, in_flight| Gauges {
            backlog,
            oldest_age_ms: age,
            in_flight,
            cap: 8,
            paused: 0,
            breaker_open: 0,
        };
        // One subscriber's bucket from two flushes: counts add, gauges keep the highest.
        let mut a = row(FINE_MS, 0, "a", 2, g(5, 100, 1));
        a.absorb(&row(FINE_MS, 0, "a", 3, g(2, 300, 4)));
        assert_eq!(a.counts.delivered, 5);
        assert_eq!(a.latency[latency_index(10)], 5);
        assert_eq!(a.gauges, g(5, 300, 4));
        // Two subscribers in one point: backlog, in flight and cap add; the oldest age is the
        // oldest; a bucket without rows is zeros.
        let now = 3_600_000 * 5 + 1;
        let (from, _) = Window::Hour.range(now);
        let rows = [
            row(FINE_MS, from, "a", 2, g(5, 100, 1)),
            row(FINE_MS, from, "b", 3, g(2, 300, 4)),
            row(COARSE_MS, from, "b", 99, g(9, 9, 9)),
            row(FINE_MS, from - FINE_MS, "b", 99, g(9, 9, 9)),
        ];
        let v = combine(Window::Hour, now, None, &rows);
        assert_eq!(v.points.len(), 360);
        assert_eq!(v.points[0].t_ms, from);
        assert_eq!(v.points[0].counts.delivered, 5);
        assert_eq!(
            v.points[0].gauges,
            Gauges {
                cap: 16,
                ..g(7, 300, 5)
            }
        );
        assert_eq!(v.points[0].p50_ms, Some(latency_bound(latency_index(10))));
        assert_eq!(v.points[1].counts, Counts::default());
        assert_eq!(v.points[1].p99_ms, None);
    }

    #[test]
    fn a_flush_writes_fine_and_coarse_rows_for_what_is_worth_charting() {
        let busy = Gauges {
            backlog: 3,
            cap: 4,
            ..Gauges::default()
        };
        let idle = Gauges {
            cap: 4,
            ..Gauges::default()
        };
        let mut t = Tally::default();
        t.counts.failed = 2;
        let acme = Some("acme".to_string());
        let rows = flush_rows(
            310_000,
            vec![("a".into(), t.clone()), ("gone".into(), t.clone())],
            vec![
                ("a".into(), acme.clone(), idle),
                ("b".into(), acme.clone(), busy),
                ("c".into(), acme, idle),
            ],
        );
        let got: Vec<(i64, i64, &str, u64, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.resolution_ms,
                    r.bucket_ms,
                    r.subscriber_id.as_str(),
                    r.counts.failed,
                    r.gauges.backlog,
                )
            })
            .collect();
        // The totals: of every subscriber (`*`, the removed one's tally too) and of acme's
        // (`*acme`, not the removed one: its owner is not known), then each subscriber's.
        assert_eq!(
            got,
            [
                (FINE_MS, 310_000, "*", 4, 3),
                (COARSE_MS, 300_000, "*", 4, 3),
                (FINE_MS, 310_000, "*acme", 2, 3),
                (COARSE_MS, 300_000, "*acme", 2, 3),
                (FINE_MS, 310_000, "a", 2, 0),
                (COARSE_MS, 300_000, "a", 2, 0),
                (FINE_MS, 310_000, "b", 0, 3),
                (COARSE_MS, 300_000, "b", 0, 3),
                (FINE_MS, 310_000, "gone", 2, 0),
                (COARSE_MS, 300_000, "gone", 2, 0),
            ]
        );
        // A total's cap is the sum of the charted subscribers' (the idle `c` is not charted).
        assert_eq!(rows[0].gauges.cap, 8);
        assert_eq!(rows[4].gauges.cap, 4);
    }
}
