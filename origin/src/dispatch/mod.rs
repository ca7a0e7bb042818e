//! The dispatcher: leases due deliveries from the ledger, fairly across subscribers and within
//! each one's limiter (rate, in-flight cap, pause, breaker), sends them by the subscriber's
//! lane, and records every result. A retry is a re-enqueue with a due time, never a sleep.
//!
//! One task owns all dispatch state; sends run as their own tasks and report back over a
//! channel, so a subscriber that hangs holds only its own in-flight slots.

pub mod edge_lane;
pub mod fair;
pub mod origin_lane;
pub mod plan;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;
use fanout_core::logrec::LogRecord;
use fanout_core::sign::Secret;
use fanout_core::wire::{DeferReason, Delivery, DeliveryBatch, DeliveryResult, SubscriberSpec};
use tokio::sync::mpsc;

use crate::alert::rules::{after_attempt, Seen};
use crate::alert::{AlertRules, Alerter, Notice};
use crate::ledger::{self, Claimed, HealthWrite, Ledger, LedgerError, Outcome, Transition};
use crate::metrics::Metrics;
use crate::model::{active_secrets, delivery_public_id, Health, Lane, StoredSecret, Subscriber};
use crate::time::{jitter, now_ms};
use edge_lane::{EdgeClient, EdgeError};
use plan::{attempt_of, attempt_record, edge_retry_ms, grant, transition_for, Grant, RetryRules};

/// How long a lease lasts: longer than any send can take (the longest subscriber timeout plus
/// the edge's margin), so a live send never loses its lease.
pub const LEASE_MS: i64 = 120_000;
/// Expired leases are looked for this often.
const SWEEP_EVERY_MS: i64 = 5_000;
/// The dispatcher re-reads the queue at least this often, whatever it believes.
const RESCAN_EVERY_MS: i64 = 2_000;
/// After a claim found nothing due, look again after this long.
const EMPTY_CLAIM_RETRY_MS: i64 = 100;
/// Largest edge batch by body bytes (the edge takes up to 8 MiB).
const EDGE_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Messages to the dispatcher from the API.
#[derive(Debug, Clone)]
pub enum Control {
    /// These subscribers have new work due now.
    Due(Vec<String>),
    /// Dead deliveries of these subscribers were replayed: their work is due now, and a dead
    /// count back under the alert threshold re-arms its alert.
    Replayed(Vec<String>),
    /// A subscriber was created, changed, rotated or removed.
    Changed(String),
    /// Re-read the whole queue (after a bulk replay).
    Rescan,
    /// A customer was created, changed or removed: re-read their weights and caps.
    Customers,
}

#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub rules: RetryRules,
    pub allow_loopback: bool,
    pub edge: Option<EdgeClient>,
    pub breaker: BreakerConfig,
    /// Deliveries per edge call.
    pub edge_batch: usize,
    /// Most deliveries in flight across all subscribers.
    pub max_total_in_flight: usize,
    /// When to alert and when to disable a subscriber.
    pub alert_rules: AlertRules,
    pub alerter: Alerter,
}

/// What the dispatcher keeps about one subscriber.
#[derive(Debug)]
struct SubState {
    id: Arc<str>,
    url: Arc<str>,
    limits: crate::model::Limits,
    lane: Lane,
    legacy_signature: bool,
    secrets: Vec<StoredSecret>,
    limiter: LimiterState,
    limiter_dirty: bool,
    in_flight: u32,
    /// When its earliest pending delivery is due, if it has any.
    next_due: Option<i64>,
    /// Nothing is sent before this (rate, pause, breaker, edge trouble).
    not_before: i64,
    edge_failures: u32,
    /// Failing since, and disabled (nothing is claimed for a disabled subscriber).
    health: Health,
    /// Its customer, whose weight sets its group's share (`fair`).
    customer: Option<Arc<str>>,
}

/// Health changes and alerts decided from results, recorded with the next tick's transaction;
/// the alerts are raised once that has committed.
#[derive(Debug, Default)]
struct HealthBatch {
    writes: Vec<HealthWrite>,
    /// Subscribers with deliveries newly dead: their dead count is checked.
    dead: BTreeSet<String>,
    notices: Vec<Notice>,
}

impl HealthBatch {
    fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.dead.is_empty() && self.notices.is_empty()
    }

    /// Put back what a failed transaction did not record, ahead of anything newer.
    fn restore(&mut self, mut older: HealthBatch) {
        older.writes.append(&mut self.writes);
        older.dead.append(&mut self.dead);
        older.notices.append(&mut self.notices);
        *self = older;
    }
}

/// Record a batch's health changes and check the dead counts, in the caller's transaction;
/// returns every alert to raise once it commits.
fn record_health(
    c: &rusqlite::Connection,
    batch: &HealthBatch,
    dead_threshold: u64,
    now: i64,
) -> Result<Vec<Notice>, LedgerError> {
    let mut notices = batch.notices.clone();
    if !batch.writes.is_empty() {
        ledger::apply_health(c, &batch.writes)?;
    }
    if !batch.dead.is_empty() {
        let dead: Vec<String> = batch.dead.iter().cloned().collect();
        notices.extend(ledger::check_dead_counts(c, &dead, dead_threshold, now)?);
    }
    Ok(notices)
}

/// A leased delivery, minus its body.
#[derive(Debug, Clone)]
struct Meta {
    rowid: i64,
    event_id: String,
    event_type: String,
    attempt: u32,
    /// Measured by the origin lane around the whole send.
    latency_ms: Option<u64>,
}

#[derive(Debug)]
enum Done {
    Results {
        sub: Arc<str>,
        lane: &'static str,
        items: Vec<(Meta, DeliveryResult)>,
        at_ms: i64,
    },
    EdgeFailed {
        sub: Arc<str>,
        items: Vec<Meta>,
        error: EdgeError,
    },
}

pub struct Dispatcher {
    ledger: Ledger,
    cfg: DispatchConfig,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    subs: HashMap<Arc<str>, SubState>,
    order: Vec<Arc<str>>,
    rr: usize,
    total_in_flight: usize,
    /// Each customer's weight and in-flight cap.
    customers: HashMap<String, (u32, Option<u32>)>,
    /// Results processed but not yet written: they go in the next tick's transaction, with its
    /// claims (one commit per loop turn).
    unrecorded: Vec<Outcome>,
    /// Health changes and alerts not yet written, likewise.
    health: HealthBatch,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("subscribers", &self.subs.len())
            .field("in_flight", &self.total_in_flight)
            .finish()
    }
}

/// What to do with a batch the edge refused as a whole: `Some(reason)` when retrying cannot
/// help (the edge refuses the subscriber's endpoint), `None` to keep it pending and retry.
pub fn edge_refusal_is_permanent(err: &EdgeError) -> Option<String> {
    match err {
        EdgeError::Status { status: 400, body } if body.contains("endpoint_refused") => {
            Some("refused_url (by the edge)".into())
        }
        _ => None,
    }
}

impl Dispatcher {
    pub fn new(
        ledger: Ledger,
        cfg: DispatchConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Dispatcher, reqwest::Error> {
        let http = origin_lane::client(cfg.allow_loopback)?;
        Ok(Dispatcher {
            ledger,
            cfg,
            http,
            metrics,
            subs: HashMap::new(),
            order: Vec::new(),
            rr: 0,
            total_in_flight: 0,
            customers: HashMap::new(),
            unrecorded: Vec::new(),
            health: HealthBatch::default(),
        })
    }

    fn upsert(&mut self, s: Subscriber, limiter: LimiterState) {
        let lane = s.lane.effective(self.cfg.edge.is_some());
        let id: Arc<str> = Arc::from(s.id.as_str());
        match self.subs.get_mut(&id) {
            Some(st) => {
                st.url = Arc::from(s.url.as_str());
                st.limits = s.limits;
                st.lane = lane;
                st.legacy_signature = s.legacy_signature;
                st.secrets = s.secrets;
                st.limiter = limiter;
                if st.health.disabled.is_some() && s.health.disabled.is_none() {
                    // Re-enabled: start afresh, whatever limiter state this task last wrote.
                    st.limiter.breaker = Default::default();
                    st.limiter_dirty = true;
                }
                st.health = s.health;
                st.customer = s.customer.as_deref().map(Arc::from);
                st.not_before = 0;
                st.next_due = Some(st.next_due.map_or(0, |d| d.min(now_ms())));
            }
            None => {
                self.subs.insert(
                    id.clone(),
                    SubState {
                        id: id.clone(),
                        url: Arc::from(s.url.as_str()),
                        limits: s.limits,
                        lane,
                        legacy_signature: s.legacy_signature,
                        secrets: s.secrets,
                        limiter,
                        limiter_dirty: false,
                        in_flight: 0,
                        next_due: Some(0),
                        not_before: 0,
                        edge_failures: 0,
                        customer: s.customer.as_deref().map(Arc::from),
                        health: s.health,
                    },
                );
                self.order.push(id);
                self.order.sort();
            }
        }
    }

    async fn load_customers(&mut self) -> Result<(), LedgerError> {
        let all = self.ledger.call(|c| ledger::list_customers(c)).await?;
        self.customers = all
            .into_iter()
            .map(|c| (c.id, (c.weight, c.max_in_flight)))
            .collect();
        Ok(())
    }

    /// Each candidate's share of `budget`: weighted between customers, round-robin between a
    /// customer's subscribers (`fair::fair_share`); subscribers with no customer are one group
    /// of weight 1.
    fn fair_shares(&self, candidates: &[(Arc<str>, usize)], budget: usize) -> Vec<usize> {
        let key = |id: &Arc<str>| self.subs.get(id).and_then(|st| st.customer.clone());
        let mut in_flight: HashMap<Option<Arc<str>>, usize> = HashMap::new();
        for st in self.subs.values() {
            *in_flight.entry(st.customer.clone()).or_default() += st.in_flight as usize;
        }
        let mut index: HashMap<Option<Arc<str>>, usize> = HashMap::new();
        let mut groups: Vec<fair::Group> = Vec::new();
        let mut place: Vec<(usize, usize)> = Vec::with_capacity(candidates.len());
        for (id, want) in candidates {
            let k = key(id);
            let g = *index.entry(k.clone()).or_insert_with(|| {
                let (weight, cap) = k
                    .as_deref()
                    .and_then(|c| self.customers.get(c).copied())
                    .unwrap_or((1, None));
                groups.push(fair::Group {
                    weight,
                    in_flight: in_flight.get(&k).copied().unwrap_or(0),
                    cap: cap.map(|c| c as usize),
                    wants: Vec::new(),
                });
                groups.len() - 1
            });
            place.push((g, groups[g].wants.len()));
            groups[g].wants.push(*want);
        }
        let grants = fair::fair_share(&groups, budget, self.rr);
        place.into_iter().map(|(g, s)| grants[g][s]).collect()
    }

    async fn load_all(&mut self) -> Result<(), LedgerError> {
        self.load_customers().await?;
        let subs = self
            .ledger
            .call(|c| {
                let mut out = Vec::new();
                for s in ledger::list_subscribers(c)? {
                    let limiter = ledger::load_limiter(c, &s.id)?;
                    out.push((s, limiter));
                }
                Ok(out)
            })
            .await?;
        for (s, limiter) in subs {
            if s.lane == Lane::Edge && self.cfg.edge.is_none() {
                tracing::warn!(subscriber = %s.id, "lane is edge but no edge is configured: using the origin lane");
            }
            self.upsert(s, limiter);
        }
        self.rescan().await
    }

    /// Re-read when each subscriber's work is due (recording unrecorded results first, so
    /// their retries are seen).
    async fn rescan(&mut self) -> Result<(), LedgerError> {
        self.flush().await?;
        let threshold = self.cfg.alert_rules.dead_threshold;
        let due = self
            .ledger
            .call(move |c| {
                // A replay may have brought a dead count back under the alert threshold.
                ledger::rearm_dead_alerts(c, threshold)?;
                ledger::due_summary(c)
            })
            .await?;
        for st in self.subs.values_mut() {
            st.next_due = None;
        }
        for (id, at) in due {
            if let Some(st) = self.subs.get_mut(id.as_str()) {
                st.next_due = Some(at);
            }
        }
        Ok(())
    }

    fn mark_due(&mut self, ids: Vec<String>) {
        let now = now_ms();
        for id in ids {
            if let Some(st) = self.subs.get_mut(id.as_str()) {
                st.next_due = Some(st.next_due.map_or(now, |d| d.min(now)));
            }
        }
    }

    async fn on_control(&mut self, c: Control) -> Result<(), LedgerError> {
        match c {
            Control::Replayed(ids) => {
                let threshold = self.cfg.alert_rules.dead_threshold;
                self.ledger
                    .call(move |c| ledger::rearm_dead_alerts(c, threshold))
                    .await?;
                self.mark_due(ids);
            }
            Control::Due(ids) => self.mark_due(ids),
            Control::Changed(id) => {
                let lookup = id.clone();
                let found = self
                    .ledger
                    .call(move |c| match ledger::get_subscriber(c, &lookup) {
                        Ok(s) => {
                            let limiter = ledger::load_limiter(c, &lookup)?;
                            Ok(Some((s, limiter)))
                        }
                        Err(LedgerError::NotFound(_)) => Ok(None),
                        Err(e) => Err(e),
                    })
                    .await?;
                match found {
                    Some((s, limiter)) => self.upsert(s, limiter),
                    None => {
                        if let Some(st) = self.subs.remove(id.as_str()) {
                            self.total_in_flight =
                                self.total_in_flight.saturating_sub(st.in_flight as usize);
                        }
                        self.order.retain(|o| o.as_ref() != id.as_str());
                    }
                }
            }
            Control::Rescan => self.rescan().await?,
            Control::Customers => self.load_customers().await?,
        }
        Ok(())
    }

    fn dirty_limiters(&mut self) -> Vec<(String, LimiterState)> {
        self.subs
            .values_mut()
            .filter(|s| s.limiter_dirty)
            .map(|s| {
                s.limiter_dirty = false;
                (s.id.to_string(), s.limiter)
            })
            .collect()
    }

    /// Record the results processed so far, lease what may be sent now, fairly, and start
    /// sending it: one transaction.
    async fn tick(&mut self, done: &mpsc::UnboundedSender<Done>) -> Result<(), LedgerError> {
        let now = now_ms();
        let n = self.order.len();
        // What each subscriber with due work may be sent, by its own limiter.
        let mut candidates: Vec<(Arc<str>, usize)> = Vec::new();
        for k in 0..n {
            let id = &self.order[(self.rr + k) % n];
            let Some(st) = self.subs.get_mut(id) else {
                continue;
            };
            if st.next_due.is_none_or(|d| d > now)
                || st.not_before > now
                || st.health.disabled.is_some()
            {
                continue;
            }
            let most = match st.lane {
                Lane::Edge => self.cfg.edge_batch.saturating_mul(4),
                _ => st.limits.max_in_flight as usize,
            };
            let limits = st.limits.core(self.cfg.breaker);
            match grant(&st.limiter, limits, st.in_flight, now, most) {
                Grant::Send(k) => candidates.push((id.clone(), k)),
                Grant::Wait(ms) => st.not_before = now + ms as i64,
                Grant::Full => {}
            }
        }
        // Share the global in-flight budget: weighted between customers, round-robin within.
        let budget = self
            .cfg
            .max_total_in_flight
            .saturating_sub(self.total_in_flight);
        let shares = self.fair_shares(&candidates, budget);
        self.rr = self.rr.wrapping_add(1);
        let mut asks: Vec<(String, usize)> = Vec::new();
        let mut before: HashMap<Arc<str>, LimiterState> = HashMap::new();
        for ((id, _), k) in candidates.into_iter().zip(shares) {
            if k == 0 {
                continue;
            }
            if let Some(st) = self.subs.get_mut(&id) {
                before.insert(id.clone(), st.limiter);
                let limits = st.limits.core(self.cfg.breaker);
                st.limiter.plan(limits, st.in_flight, now, k);
                st.limiter_dirty = true;
                asks.push((id.to_string(), k));
            }
        }
        let outcomes = std::mem::take(&mut self.unrecorded);
        if asks.is_empty() && outcomes.is_empty() && self.health.is_empty() {
            return Ok(());
        }
        let limiters = self.dirty_limiters();
        let wanted: HashMap<String, usize> = asks.iter().cloned().collect();
        let health = Arc::new(std::mem::take(&mut self.health));
        let recording = health.clone();
        let threshold = self.cfg.alert_rules.dead_threshold;
        let written = self
            .ledger
            .tx(move |c| {
                if !outcomes.is_empty() {
                    ledger::apply(c, &outcomes, &[], now)?;
                }
                let notices = record_health(c, &recording, threshold, now)?;
                let claims = ledger::claim(c, &asks, &limiters, now, now + LEASE_MS)?;
                Ok((claims, notices))
            })
            .await;
        let claims = match written {
            Ok((claims, notices)) => {
                self.raise(notices);
                claims
            }
            Err(e) => {
                self.health
                    .restore(Arc::try_unwrap(health).unwrap_or_default());
                return Err(e);
            }
        };
        for claim in claims {
            let Some(st) = self.subs.get_mut(claim.subscriber_id.as_str()) else {
                continue;
            };
            let asked = wanted.get(&claim.subscriber_id).copied().unwrap_or(0);
            let got = claim.claimed.len();
            if got == 0 {
                if let Some(b) = before.get(claim.subscriber_id.as_str()) {
                    st.limiter = *b;
                }
            } else if got < asked {
                // Give back the tokens taken for deliveries that were not there.
                let burst = f64::from(st.limits.burst);
                if let Some(b) = st.limiter.bucket.as_mut() {
                    b.tokens = (b.tokens + (asked - got) as f64).min(burst);
                }
            }
            st.limiter_dirty = true;
            st.next_due = match claim.next_due_ms {
                Some(d) if got == 0 && d <= now => Some(now + EMPTY_CLAIM_RETRY_MS),
                other => other,
            };
            if got > 0 {
                st.in_flight += got as u32;
                self.total_in_flight += got;
                launch(st, claim.claimed, &self.cfg, &self.http, done, now);
            }
        }
        Ok(())
    }

    /// Take in a batch of results: update the subscribers' state now, queue the ledger writes
    /// for the next tick.
    fn on_done(&mut self, batch: Vec<Done>) {
        let now = now_ms();
        let rules = self.cfg.rules;
        let rules_alert = self.cfg.alert_rules;
        let mut outcomes: Vec<Outcome> = std::mem::take(&mut self.unrecorded);
        for d in batch {
            match d {
                Done::Results {
                    sub,
                    lane,
                    items,
                    at_ms,
                } => {
                    let mut st = self.subs.get_mut(&sub);
                    for (meta, result) in items {
                        self.metrics.record(&sub, lane, &result, meta.latency_ms);
                        log_outcome(&sub, &meta, &result);
                        self.total_in_flight = self.total_in_flight.saturating_sub(1);
                        let transition =
                            transition_for(&result, meta.attempt, rules, at_ms, jitter());
                        if let Some(st) = st.as_deref_mut() {
                            st.limiter.settle(
                                st.limits.core(self.cfg.breaker),
                                st.in_flight,
                                at_ms,
                            );
                            st.limiter_dirty = true;
                            st.in_flight = st.in_flight.saturating_sub(1);
                            if lane == "edge" {
                                st.edge_failures = 0;
                            }
                            if let Some(a) = attempt_of(&result) {
                                let before = st.limiter.breaker;
                                st.limiter
                                    .record(st.limits.core(self.cfg.breaker), &a, at_ms);
                                st.limiter_dirty = true;
                                let seen = Seen {
                                    at_ms,
                                    attempt: &a,
                                    breaker_before: &before,
                                    breaker_after: &st.limiter.breaker,
                                    error: match &transition {
                                        Transition::Retry { error, .. } => Some(error.as_str()),
                                        Transition::Dead { reason } => Some(reason.as_str()),
                                        _ => None,
                                    },
                                };
                                let after = after_attempt(&st.health, &seen, &rules_alert);
                                note_health(&mut self.health, st, after, at_ms);
                            }
                            if let DeliveryResult::Deferred {
                                retry_after_ms,
                                reason: DeferReason::Paused | DeferReason::BreakerOpen,
                                ..
                            } = &result
                            {
                                st.not_before = st.not_before.max(now + *retry_after_ms as i64);
                            }
                            // A `rate` deferral keeps the token our pacing took for it: the
                            // origin stays a token behind the edge instead of ahead of it, so
                            // it never churns calls the edge can only defer.
                            if let Transition::Retry { at_ms, .. } | Transition::Defer { at_ms } =
                                &transition
                            {
                                st.next_due = Some(st.next_due.map_or(*at_ms, |d| d.min(*at_ms)));
                            }
                        }
                        if matches!(transition, Transition::Dead { .. }) {
                            self.health.dead.insert(sub.to_string());
                        }
                        outcomes.push(Outcome {
                            rowid: meta.rowid,
                            attempt: attempt_record(
                                &result,
                                meta.attempt,
                                lane,
                                at_ms,
                                meta.latency_ms,
                            ),
                            transition,
                        });
                    }
                }
                Done::EdgeFailed { sub, items, error } => {
                    self.metrics
                        .edge_call_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(subscriber = %sub, deliveries = items.len(), error = %error, "edge call failed; the batch stays pending");
                    let permanent = edge_refusal_is_permanent(&error);
                    let mut wait = edge_retry_ms(0);
                    self.total_in_flight = self.total_in_flight.saturating_sub(items.len());
                    if let Some(st) = self.subs.get_mut(&sub) {
                        wait = edge_retry_ms(st.edge_failures);
                        st.edge_failures = st.edge_failures.saturating_add(1);
                        let limits = st.limits.core(self.cfg.breaker);
                        for _ in 0..items.len() {
                            st.limiter.settle(limits, st.in_flight, now);
                            st.in_flight = st.in_flight.saturating_sub(1);
                        }
                        st.limiter_dirty = true;
                        st.not_before = st.not_before.max(now + wait as i64);
                        st.next_due = Some(st.next_due.map_or(now, |d| d.min(now)));
                    }
                    if permanent.is_some() && !items.is_empty() {
                        self.health.dead.insert(sub.to_string());
                    }
                    for meta in items {
                        let transition = match &permanent {
                            Some(reason) => Transition::Dead {
                                reason: reason.clone(),
                            },
                            None => Transition::Defer {
                                at_ms: now + wait as i64,
                            },
                        };
                        outcomes.push(Outcome {
                            rowid: meta.rowid,
                            transition,
                            attempt: None,
                        });
                    }
                }
            }
        }
        self.unrecorded = outcomes;
    }

    /// Write what is unrecorded, without claiming anything.
    async fn flush(&mut self) -> Result<(), LedgerError> {
        let outcomes = std::mem::take(&mut self.unrecorded);
        let limiters = self.dirty_limiters();
        if outcomes.is_empty() && limiters.is_empty() && self.health.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let health = Arc::new(std::mem::take(&mut self.health));
        let recording = health.clone();
        let threshold = self.cfg.alert_rules.dead_threshold;
        let written = self
            .ledger
            .tx(move |c| {
                ledger::apply(c, &outcomes, &limiters, now)?;
                record_health(c, &recording, threshold, now)
            })
            .await;
        match written {
            Ok(notices) => {
                self.raise(notices);
                Ok(())
            }
            Err(e) => {
                self.health
                    .restore(Arc::try_unwrap(health).unwrap_or_default());
                Err(e)
            }
        }
    }

    /// Tell the operator (log, and the alert endpoint when configured). Never waits.
    fn raise(&self, notices: Vec<Notice>) {
        for n in notices {
            self.cfg.alerter.raise(n);
        }
    }

    /// When the loop must next look at the queue on its own.
    fn next_wake(&self, now: i64) -> i64 {
        let mut wake = now + RESCAN_EVERY_MS;
        if self.total_in_flight >= self.cfg.max_total_in_flight {
            // Only a result can free a slot, and a result wakes the loop.
            return wake;
        }
        for st in self.subs.values() {
            if st.in_flight >= st.limits.max_in_flight || st.health.disabled.is_some() {
                continue;
            }
            if let Some(due) = st.next_due {
                wake = wake.min(due.max(st.not_before));
            }
        }
        wake.max(now + 1)
    }

    /// Run until `shutdown`, then wait (a little) for sends in flight to be recorded.
    pub async fn run(
        mut self,
        mut control: mpsc::UnboundedReceiver<Control>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        if let Err(e) = self.load_all().await {
            tracing::error!(error = %e, "dispatcher cannot read the ledger");
        }
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        tokio::pin!(shutdown);
        let mut sweep_at = now_ms() + SWEEP_EVERY_MS;
        let mut rescan_at = now_ms() + RESCAN_EVERY_MS;
        loop {
            if let Err(e) = self.tick(&done_tx).await {
                tracing::error!(error = %e, "dispatch tick failed");
            }
            let now = now_ms();
            let wake = self.next_wake(now).min(sweep_at).min(rescan_at);
            let sleep = tokio::time::sleep(Duration::from_millis((wake - now).max(0) as u64));
            let result = tokio::select! {
                _ = &mut shutdown => break,
                Some(c) = control.recv() => {
                    let mut r = self.on_control(c).await;
                    while let Ok(c) = control.try_recv() {
                        r = r.and(self.on_control(c).await);
                    }
                    r
                }
                Some(d) = done_rx.recv() => {
                    let mut batch = vec![d];
                    while batch.len() < 4096 {
                        match done_rx.try_recv() {
                            Ok(d) => batch.push(d),
                            Err(_) => break,
                        }
                    }
                    self.on_done(batch);
                    Ok(())
                }
                _ = sleep => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(error = %e, "dispatcher could not update the ledger");
            }
            let now = now_ms();
            if now >= sweep_at {
                sweep_at = now + SWEEP_EVERY_MS;
                match self
                    .ledger
                    .tx(move |c| ledger::release_expired_leases(c, now))
                    .await
                {
                    Ok(subs) if !subs.is_empty() => {
                        tracing::warn!(?subs, "expired leases returned to the queue");
                        let _ = self.on_control(Control::Due(subs)).await;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "lease sweep failed"),
                }
            }
            if now >= rescan_at {
                rescan_at = now + RESCAN_EVERY_MS;
                if let Err(e) = self.rescan().await {
                    tracing::error!(error = %e, "rescan failed");
                }
            }
        }
        // Record what is still in flight, for a few seconds; the rest is released at the next
        // start.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.total_in_flight > 0 {
            tokio::select! {
                Some(d) = done_rx.recv() => {
                    let mut batch = vec![d];
                    while let Ok(d) = done_rx.try_recv() {
                        batch.push(d);
                    }
                    self.on_done(batch);
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        if let Err(e) = self.flush().await {
            tracing::error!(error = %e, "could not record results at shutdown");
        }
    }
}

/// Take in what one attempt did to a subscriber's health: queue the ledger writes and alerts.
fn note_health(
    batch: &mut HealthBatch,
    st: &mut SubState,
    after: crate::alert::rules::AfterAttempt,
    at_ms: i64,
) {
    if after.health.failing_since_ms != st.health.failing_since_ms {
        batch.writes.push(HealthWrite::FailingSince {
            subscriber: st.id.to_string(),
            since_ms: after.health.failing_since_ms,
        });
    }
    if let (None, Some(d)) = (&st.health.disabled, &after.health.disabled) {
        batch.writes.push(HealthWrite::Disable {
            subscriber: st.id.to_string(),
            disabled: d.clone(),
        });
    }
    batch
        .notices
        .extend(after.alerts.into_iter().map(|alert| Notice {
            subscriber: st.id.to_string(),
            at_ms,
            alert,
        }));
    st.health = after.health;
}

fn log_outcome(sub: &str, meta: &Meta, result: &DeliveryResult) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let d = Delivery {
            id: delivery_public_id(meta.rowid),
            event_id: meta.event_id.clone(),
            event_type: meta.event_type.clone(),
            attempt: meta.attempt,
            body: String::new(),
        };
        tracing::debug!(target: "fanout::delivery", "{}", LogRecord::new(sub, &d, result).to_json());
    }
}

fn parsed_secrets(stored: &[StoredSecret], now: i64) -> (Vec<String>, Vec<Secret>) {
    let active = active_secrets(stored, now);
    let parsed = active
        .iter()
        .filter_map(|s| Secret::parse(s).ok())
        .collect();
    (active, parsed)
}

/// Start sending leased deliveries by the subscriber's lane.
fn launch(
    st: &SubState,
    claimed: Vec<Claimed>,
    cfg: &DispatchConfig,
    http: &reqwest::Client,
    done: &mpsc::UnboundedSender<Done>,
    now: i64,
) {
    let (active, secrets) = parsed_secrets(&st.secrets, now);
    match (&st.lane, &cfg.edge) {
        (Lane::Edge, Some(edge)) => {
            let spec = SubscriberSpec {
                id: st.id.to_string(),
                url: st.url.to_string(),
                secrets: active,
                rate_per_sec: st.limits.rate_per_sec,
                burst: st.limits.burst,
                max_in_flight: st.limits.max_in_flight,
                timeout_ms: st.limits.timeout_ms,
                legacy_signature: st.legacy_signature,
            };
            for chunk in edge_batches(claimed, cfg.edge_batch.max(1)) {
                let edge = edge.clone();
                let spec = spec.clone();
                let done = done.clone();
                let sub = st.id.clone();
                tokio::spawn(async move {
                    let metas: Vec<Meta> = chunk.iter().map(meta_of).collect();
                    let batch = DeliveryBatch {
                        subscriber: spec,
                        deliveries: chunk
                            .into_iter()
                            .map(|d| Delivery {
                                id: delivery_public_id(d.rowid),
                                event_id: d.event_id,
                                event_type: d.event_type,
                                attempt: d.attempt,
                                body: d.body,
                            })
                            .collect(),
                    };
                    let call_id = format!("call_{:016x}", getrandom::u64().unwrap_or_default());
                    let msg = match edge.send(&batch, &call_id).await {
                        Ok(results) => {
                            let ids: Vec<String> =
                                metas.iter().map(|m| delivery_public_id(m.rowid)).collect();
                            Done::Results {
                                sub,
                                lane: "edge",
                                items: metas.into_iter().zip(pair_results(&ids, results)).collect(),
                                at_ms: now_ms(),
                            }
                        }
                        Err(error) => Done::EdgeFailed {
                            sub,
                            items: metas,
                            error,
                        },
                    };
                    let _ = done.send(msg);
                });
            }
        }
        _ => {
            let secrets = Arc::new(secrets);
            for d in claimed {
                let http = http.clone();
                let done = done.clone();
                let sub = st.id.clone();
                let url = st.url.clone();
                let secrets = secrets.clone();
                let legacy = st.legacy_signature;
                let timeout_ms = st.limits.timeout_ms;
                let allow_loopback = cfg.allow_loopback;
                tokio::spawn(async move {
                    let mut meta = meta_of(&d);
                    let id = delivery_public_id(d.rowid);
                    let started = std::time::Instant::now();
                    let send = origin_lane::Outgoing {
                        delivery_id: &id,
                        event_id: &d.event_id,
                        url: &url,
                        secrets: &secrets,
                        legacy_signature: legacy,
                        timeout_ms,
                    };
                    let result = origin_lane::deliver(&http, &send, d.body, allow_loopback).await;
                    meta.latency_ms = Some(started.elapsed().as_millis() as u64);
                    let _ = done.send(Done::Results {
                        sub,
                        lane: "origin",
                        items: vec![(meta, result)],
                        at_ms: now_ms(),
                    });
                });
            }
        }
    }
}

fn meta_of(d: &Claimed) -> Meta {
    Meta {
        rowid: d.rowid,
        event_id: d.event_id.clone(),
        event_type: d.event_type.clone(),
        attempt: d.attempt,
        latency_ms: None,
    }
}

/// Split leased deliveries into edge calls of at most `size` deliveries and about
/// [`EDGE_BATCH_BYTES`] of bodies each.
fn edge_batches(claimed: Vec<Claimed>, size: usize) -> Vec<Vec<Claimed>> {
    let mut out: Vec<Vec<Claimed>> = Vec::new();
    let mut cur: Vec<Claimed> = Vec::new();
    let mut bytes = 0usize;
    for d in claimed {
        if !cur.is_empty() && (cur.len() >= size || bytes + d.body.len() > EDGE_BATCH_BYTES) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += d.body.len();
        cur.push(d);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The edge's results in the order of `ids`; a delivery the edge did not answer for is
/// deferred briefly (it will be sent again, never lost).
pub fn pair_results(ids: &[String], results: Vec<DeliveryResult>) -> Vec<DeliveryResult> {
    let mut by_id: HashMap<String, DeliveryResult> = results
        .into_iter()
        .map(|r| (r.id().to_string(), r))
        .collect();
    ids.iter()
        .map(|id| {
            by_id
                .remove(id)
                .unwrap_or_else(|| DeliveryResult::Deferred {
                    id: id.clone(),
                    retry_after_ms: fanout_core::limiter::IN_FLIGHT_RETRY_MS,
                    reason: DeferReason::InFlight,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(rowid: i64, body_len: usize) -> Claimed {
        Claimed {
            rowid,
            event_id: format!("e{rowid}"),
            event_type: "t".into(),
            body: "x".repeat(body_len),
            attempt: 1,
        }
    }

    #[test]
    fn edge_batching_table() {
        let cases: &[(usize, usize, usize, &[usize])] = &[
            (5, 10, 2, &[2, 2, 1]),
            (4, 10, 4, &[4]),
            (0, 10, 4, &[]),
            (3, EDGE_BATCH_BYTES / 2 + 1, 100, &[1, 1, 1]),
            (4, EDGE_BATCH_BYTES / 2, 100, &[2, 2]),
        ];
        for &(n, body, size, expected) in cases {
            let ds = (1..=n as i64).map(|i| claimed(i, body)).collect();
            let sizes: Vec<usize> = edge_batches(ds, size).iter().map(|b| b.len()).collect();
            assert_eq!(sizes, expected, "{n} x {body} B in batches of {size}");
        }
    }

    #[test]
    fn results_pair_up_and_missing_ones_are_deferred() {
        let ids = vec![
            "dlv_1".to_string(),
            "dlv_2".to_string(),
            "dlv_3".to_string(),
        ];
        let results = vec![
            DeliveryResult::Delivered {
                id: "dlv_3".into(),
                status: 200,
                latency_ms: 1,
            },
            DeliveryResult::Rejected {
                id: "dlv_1".into(),
                status: Some(410),
                reason: "gone".into(),
                response_body: None,
            },
            DeliveryResult::Delivered {
                id: "dlv_99".into(),
                status: 200,
                latency_ms: 1,
            },
        ];
        let paired = pair_results(&ids, results);
        let got: Vec<(&str, &str)> = paired.iter().map(|r| (r.id(), r.outcome())).collect();
        assert_eq!(
            got,
            vec![
                ("dlv_1", "rejected"),
                ("dlv_2", "deferred"),
                ("dlv_3", "delivered")
            ]
        );
        let owned = pair_results(&ids, vec![]);
        assert!(owned.iter().all(|r| r.outcome() == "deferred"));
    }

    #[test]
    fn edge_refusals() {
        let cases: Vec<(EdgeError, bool)> = vec![
            (
                EdgeError::Status {
                    status: 400,
                    body: r#"{"error":{"code":"endpoint_refused","message":"x"}}"#.into(),
                },
                true,
            ),
            (
                EdgeError::Status {
                    status: 400,
                    body: r#"{"error":{"code":"invalid_request","message":"x"}}"#.into(),
                },
                false,
            ),
            (
                EdgeError::Status {
                    status: 401,
                    body: String::new(),
                },
                false,
            ),
            (
                EdgeError::Status {
                    status: 503,
                    body: String::new(),
                },
                false,
            ),
            (EdgeError::Unreachable("connection refused".into()), false),
        ];
        for (err, permanent) in cases {
            assert_eq!(
                edge_refusal_is_permanent(&err).is_some(),
                permanent,
                "{err}"
            );
        }
    }
}
