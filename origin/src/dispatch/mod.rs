//! The dispatcher: leases due deliveries from the ledger, fairly across subscribers and within
//! each one's limiter (rate, in-flight cap, pause, breaker), sends them by the subscriber's
//! lane, and records every result. A retry is a re-enqueue with a due time, never a sleep.
//!
//! Two halves: [`state`] decides (a pure state machine: events in, effects out, time and jitter
//! as arguments) and [`Dispatcher`] executes (this module: it reads the clock, talks to the
//! ledger through the typed [`DispatchLedger`] operations, launches sends, raises alerts, and
//! feeds every answer back to the state as an event). The executor makes no decision of its
//! own: it does NOT count in-flight sends, touch a limiter, or choose what is sent.
//!
//! One task owns the state; sends run as their own tasks and report back over a channel, so a
//! subscriber that hangs holds only its own in-flight slots.

pub mod edge_lane;
pub mod fair;
pub mod origin_lane;
pub mod plan;
#[cfg(test)]
mod simulation;
pub mod state;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fanout_core::breaker::BreakerConfig;
use fanout_core::endpoint::check_url;
use fanout_core::logrec::LogRecord;
use fanout_core::sign::Secret;
use fanout_core::wire::{DeferReason, Delivery, DeliveryResult, SubscriberSpec};
use tokio::sync::mpsc;

use crate::alert::{AlertRules, Alerter};
use crate::ledger::{DispatchLedger, LedgerError};
use crate::metrics::Metrics;
use crate::model::{active_secrets, delivery_public_id, Claimed, Lane, Share, StallView};
use crate::outbound::{Outbound, Signer};
use crate::time::{jitter, now_ms};
use edge_lane::{edge_failure, EdgeClient};
use plan::RetryRules;
pub use state::LEASE_MS;
use state::{Effect, Event, Meta, Settings, StallReport, State, Target};

/// Expired leases are looked for this often.
const SWEEP_EVERY_MS: i64 = 5_000;
/// The dispatcher re-reads the queue at least this often, whatever it believes.
const RESCAN_EVERY_MS: i64 = 2_000;
/// The dispatcher writes that it is alive, and reads which daemons share the ledger, this
/// often (`DispatchLedger::share`).
pub const SHARE_EVERY_MS: i64 = 1_000;
/// At shutdown, results of sends in flight are awaited this long.
const DRAIN_MS: u64 = 5_000;

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
    /// Announcements may have been missed (another daemon's changes while this one was not
    /// listening): re-read the customers, every subscriber and the queue.
    Reload,
}

/// The executor's liveness, for `/healthz`: the time (unix ms) its loop last began a turn, 0
/// before the first. A running dispatcher beats at least every couple of seconds
/// (`RESCAN_EVERY_MS`) plus the time of one ledger write; a dispatcher stuck behind the ledger
/// or stopped does not. Cheap to clone; every clone reads the same beat.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat(Arc<AtomicI64>);

impl Heartbeat {
    pub fn beat(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::Relaxed);
    }

    /// The last beat (unix ms), 0 if none yet.
    pub fn last_ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
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
    /// The daemon's one outbound client.
    pub outbound: Outbound,
    /// Beaten by the executor's loop.
    pub heartbeat: Heartbeat,
}

/// The executor.
pub struct Dispatcher<L: DispatchLedger> {
    ledger: L,
    cfg: DispatchConfig,
    metrics: Arc<Metrics>,
    state: State,
    done_tx: mpsc::UnboundedSender<Event>,
    done_rx: mpsc::UnboundedReceiver<Event>,
}

impl<L: DispatchLedger> std::fmt::Debug for Dispatcher<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("in_flight", &self.state.in_flight())
            .finish()
    }
}

impl<L: DispatchLedger> Dispatcher<L> {
    pub fn new(ledger: L, cfg: DispatchConfig, metrics: Arc<Metrics>) -> Dispatcher<L> {
        let state = State::new(Settings {
            rules: cfg.rules,
            breaker: cfg.breaker,
            edge: cfg.edge.is_some(),
            edge_batch: cfg.edge_batch,
            max_total_in_flight: cfg.max_total_in_flight,
            alert_rules: cfg.alert_rules,
        });
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Dispatcher {
            ledger,
            cfg,
            metrics,
            state,
            done_tx,
            done_rx,
        }
    }

    /// Hand one event to the state and carry out every effect, feeding the ledger's answers
    /// back, until none is left.
    async fn step(&mut self, event: Event) {
        let mut queue: std::collections::VecDeque<Effect> =
            self.state.handle(event, now_ms(), &mut jitter).into();
        while let Some(effect) = queue.pop_front() {
            match effect {
                Effect::Record(turn) => {
                    let answer = match self.ledger.record_turn(turn).await {
                        Ok(recorded) => Event::Recorded(recorded),
                        Err(failed) => {
                            tracing::error!(error = %failed.error, "could not record the dispatcher's turn; it will be retried");
                            Event::NotRecorded(failed)
                        }
                    };
                    queue.extend(self.state.handle(answer, now_ms(), &mut jitter));
                }
                Effect::Launch {
                    target,
                    deliveries,
                    per_call,
                } => self.launch(target, deliveries, per_call),
                Effect::Raise(notices) => {
                    for n in notices {
                        self.cfg.alerter.raise(n);
                    }
                }
                Effect::Stalls(report) => self.stalls(report),
            }
        }
    }

    /// The watchdog's report: each stall logged once when it begins (and when it ends), the
    /// set published for `/metrics`, the API and the console.
    fn stalls(&self, report: StallReport) {
        let all: std::collections::BTreeMap<String, StallView> = report
            .all
            .iter()
            .map(|s| {
                let view = StallView {
                    since_ms: s.since_ms,
                    not_before_ms: s.not_before_ms,
                    next_due_ms: s.next_due_ms,
                    paused_until_ms: s.paused_until_ms,
                    breaker: s.breaker,
                };
                (s.subscriber.to_string(), view)
            })
            .collect();
        for id in &report.began {
            if let Some(v) = all.get(id.as_ref()) {
                tracing::error!(subscriber = %id, since_ms = v.since_ms, not_before_ms = ?v.not_before_ms, next_due_ms = ?v.next_due_ms,
                    paused_until_ms = ?v.paused_until_ms, breaker = v.breaker.as_str(),
                    "subscriber stalled: ready to send (due work, its limiter allowing, no wait stated) and nothing sent for 10 s (a dispatcher bug; please report it)");
            }
        }
        for id in &report.ended {
            tracing::warn!(subscriber = %id, "subscriber no longer stalled");
        }
        self.metrics.stalls(all, report.began.len());
    }

    /// Report results to the metrics and the debug log, then to the state.
    async fn done(&mut self, batch: Vec<Event>) {
        for event in batch {
            if let Event::Results {
                sub, lane, items, ..
            } = &event
            {
                for (meta, result) in items {
                    self.metrics.record(
                        sub,
                        Lane::parse(lane).unwrap_or(Lane::Origin),
                        result,
                        meta.latency_ms,
                    );
                    log_outcome(sub, meta, result);
                }
            }
            if let Event::EdgeFailed {
                sub,
                items,
                failure,
            } = &event
            {
                self.metrics
                    .edge_call_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(subscriber = %sub, deliveries = items.len(), failure = ?failure, "edge call failed");
            }
            if let Event::Unsendable {
                sub, items, error, ..
            } = &event
            {
                tracing::error!(subscriber = %sub, deliveries = items.len(), error = %error, "deliveries could not be sent by the daemon; each counts as a failed attempt");
            }
            self.step(event).await;
        }
    }

    /// Write that this dispatcher is alive and take in who shares the ledger now. On failure
    /// the last share stays (this daemon ages out of the others' lists meanwhile, and both
    /// may claim for the same subscribers: slower, never wrong).
    async fn reshare(&mut self) {
        let mine = self.state.in_flight_by_customer();
        match self.ledger.share(&mine).await {
            Ok(shared) => {
                let (share, elsewhere) = shared.unzip();
                if share.as_ref() != self.state.share() {
                    tracing::info!(daemons = ?share.as_ref().map(Share::members), "the daemons sharing the ledger changed: each claims for its own subscribers");
                }
                let n = share.as_ref().map_or(1, |s| s.members().len());
                self.metrics.daemons.store(n as u64, Ordering::Relaxed);
                self.step(Event::Share(share)).await;
                self.step(Event::Elsewhere(elsewhere.unwrap_or_default()))
                    .await;
            }
            Err(e) => tracing::warn!(error = %e, "could not read which daemons share the ledger"),
        }
    }

    async fn rescan(&mut self) -> Result<(), LedgerError> {
        // Record first, so the ledger's view includes every result processed so far.
        self.step(Event::Flush).await;
        let due = self
            .ledger
            .due_work(self.cfg.alert_rules.dead_threshold)
            .await?;
        self.step(Event::DueWork(due)).await;
        Ok(())
    }

    /// Read the customers and every subscriber as stored.
    async fn load(&mut self) -> Result<(), LedgerError> {
        let customers = self.ledger.dispatch_customers().await?;
        self.step(Event::Customers(customers)).await;
        let subs = self.ledger.dispatch_subscribers().await?;
        for (s, _) in &subs {
            if s.lane == Lane::Edge && self.cfg.edge.is_none() {
                tracing::warn!(subscriber = %s.id, "lane is edge but no edge is configured: using the origin lane");
            }
        }
        self.step(Event::Loaded(subs)).await;
        Ok(())
    }

    async fn on_control(&mut self, c: Control) -> Result<(), LedgerError> {
        match c {
            Control::Due(ids) => self.step(Event::Due(ids)).await,
            Control::Replayed(ids) => {
                // Re-arms the dead-count alerts a replay brought back under the threshold.
                self.rescan().await?;
                self.step(Event::Due(ids)).await;
            }
            Control::Changed(id) => {
                let found = self.ledger.dispatch_subscriber(&id).await?;
                if let Some((s, _)) = &found {
                    if s.lane == Lane::Edge && self.cfg.edge.is_none() {
                        tracing::warn!(subscriber = %s.id, "lane is edge but no edge is configured: using the origin lane");
                    }
                }
                self.step(Event::Changed { id, found }).await;
            }
            Control::Rescan => self.rescan().await?,
            Control::Customers => {
                let all = self.ledger.dispatch_customers().await?;
                self.step(Event::Customers(all)).await;
            }
            Control::Reload => {
                self.load().await?;
                self.rescan().await?;
            }
        }
        Ok(())
    }

    fn take_done(&mut self, first: Event) -> Vec<Event> {
        let mut batch = vec![first];
        while batch.len() < 4096 {
            match self.done_rx.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        batch
    }

    /// Run until `shutdown`, then wait (a little) for sends in flight to be recorded. Fails if
    /// it cannot read the subscribers at start: a dispatcher that cannot start must not look
    /// running (`run` in lib.rs stops the daemon).
    pub async fn run(
        mut self,
        mut control: mpsc::UnboundedReceiver<Control>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), LedgerError> {
        self.load().await?;
        self.reshare().await;
        if let Err(e) = self.rescan().await {
            tracing::error!(error = %e, "dispatcher cannot read the queue");
        }
        tokio::pin!(shutdown);
        let mut sweep_at = now_ms() + SWEEP_EVERY_MS;
        let mut rescan_at = now_ms() + RESCAN_EVERY_MS;
        let mut share_at = now_ms() + SHARE_EVERY_MS;
        loop {
            self.cfg.heartbeat.beat(now_ms());
            self.step(Event::Tick).await;
            let now = now_ms();
            let wake = self
                .state
                .next_wake(now, sweep_at.min(rescan_at).min(share_at));
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
                Some(d) = self.done_rx.recv() => {
                    let batch = self.take_done(d);
                    self.done(batch).await;
                    Ok(())
                }
                _ = sleep => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(error = %e, "dispatcher could not read the ledger");
            }
            let now = now_ms();
            if now >= sweep_at {
                sweep_at = now + SWEEP_EVERY_MS;
                match self.ledger.release_expired_leases(now).await {
                    Ok(subs) if !subs.is_empty() => {
                        tracing::warn!(?subs, "expired leases returned to the queue");
                        self.step(Event::Due(subs)).await;
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
            if now >= share_at {
                share_at = now + SHARE_EVERY_MS;
                self.reshare().await;
            }
        }
        // Claims stop here: the other daemons take this one's subscribers now.
        if let Err(e) = self.ledger.leave().await {
            tracing::warn!(error = %e, "could not leave the ledger's share: the other daemons take this one's subscribers once it ages out");
        }
        // Record what is still in flight, for a few seconds; the rest is released at the next
        // start.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(DRAIN_MS);
        while self.state.in_flight() > 0 {
            tokio::select! {
                Some(d) = self.done_rx.recv() => {
                    let batch = self.take_done(d);
                    self.done(batch).await;
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        // A turn the ledger hands back is tried again, a few times.
        for _ in 0..3 {
            self.step(Event::Flush).await;
            if !self.state.has_unrecorded() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::error!("could not record every result at shutdown; their deliveries are sent again after the restart");
        Ok(())
    }

    /// Start sending leased deliveries by the subscriber's lane.
    fn launch(&self, target: Arc<Target>, claimed: Vec<Claimed>, per_call: usize) {
        let now = now_ms();
        let active = active_secrets(&target.secrets, now);
        let secrets: Vec<Secret> = active
            .iter()
            .filter_map(|s| Secret::parse(s).ok())
            .collect();
        let lane: &'static str = match (&target.lane, &self.cfg.edge) {
            (Lane::Edge, Some(_)) => "edge",
            _ => "origin",
        };
        if secrets.is_empty() {
            // Nothing can sign these: the daemon's own failure, counted like a send's.
            let _ = self.done_tx.send(Event::Unsendable {
                sub: target.id.clone(),
                lane,
                items: claimed.iter().map(Meta::of).collect(),
                error: "the subscriber has no usable signing secret".into(),
            });
            return;
        }
        match (&target.lane, &self.cfg.edge) {
            (Lane::Edge, Some(edge)) => {
                let spec = SubscriberSpec {
                    id: target.id.to_string(),
                    url: target.url.to_string(),
                    secrets: active,
                    rate_per_sec: target.limits.rate_per_sec,
                    burst: target.limits.burst,
                    max_in_flight: target.limits.max_in_flight,
                    timeout_ms: target.limits.timeout_ms,
                    legacy_signature: target.legacy_signature,
                };
                self.launch_edge(edge, &target, spec, claimed, per_call);
            }
            _ => {
                let signer = Signer::new(secrets, target.legacy_signature);
                // Parsed and checked once for the whole launch; each send reuses the parse.
                let url = Arc::new(check_url(&target.url, self.cfg.allow_loopback).ok());
                for d in claimed {
                    let out = self.cfg.outbound.clone();
                    let done = self.done_tx.clone();
                    let target = target.clone();
                    let signer = signer.clone();
                    let url = url.clone();
                    tokio::spawn(async move {
                        let mut unreported =
                            Unreported::new(&done, &target.id, "origin", vec![Meta::of(&d)]);
                        let id = delivery_public_id(d.rowid);
                        let started = std::time::Instant::now();
                        let send = origin_lane::Outgoing {
                            delivery_id: &id,
                            event_id: &d.event_id,
                            url: (*url).as_ref(),
                            signer: &signer,
                            timeout_ms: target.limits.timeout_ms,
                        };
                        let result = origin_lane::deliver(&out, &send, d.body).await;
                        let latency_ms = Some(started.elapsed().as_millis() as u64);
                        if let Some(meta) = unreported.take().pop() {
                            let _ = done.send(Event::Results {
                                sub: target.id.clone(),
                                lane: "origin",
                                items: vec![(Meta { latency_ms, ..meta }, result)],
                                at_ms: now_ms(),
                            });
                        }
                    });
                }
            }
        }
    }

    /// Encode each delivery once, cut the calls by encoded length, and send them all at once.
    fn launch_edge(
        &self,
        edge: &EdgeClient,
        target: &Arc<Target>,
        spec: SubscriberSpec,
        claimed: Vec<Claimed>,
        per_call: usize,
    ) {
        let mut metas = Vec::with_capacity(claimed.len());
        let mut parts = Vec::with_capacity(claimed.len());
        let mut unsendable: Vec<(Meta, String)> = Vec::new();
        let spec_json = match edge_lane::encode_spec(&spec) {
            Ok(j) => j,
            Err(e) => {
                let _ = self.done_tx.send(Event::Unsendable {
                    sub: target.id.clone(),
                    lane: "edge",
                    items: claimed.iter().map(Meta::of).collect(),
                    error: format!("the edge call cannot be encoded: {e}"),
                });
                return;
            }
        };
        for d in claimed {
            let meta = Meta::of(&d);
            let delivery = Delivery {
                id: delivery_public_id(d.rowid),
                event_id: d.event_id,
                event_type: d.event_type,
                attempt: d.attempt,
                body: d.body,
            };
            match edge_lane::encode_delivery(&delivery) {
                Ok(json) => {
                    metas.push(meta);
                    parts.push(json);
                }
                Err(e) => unsendable.push((meta, format!("the delivery cannot be encoded: {e}"))),
            }
        }
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        let (calls, too_big) = edge_lane::split_calls(
            &sizes,
            edge_lane::fixed_len(&spec_json),
            per_call,
            edge_lane::EDGE_MAX_BYTES,
        );
        for i in too_big {
            unsendable.push((
                metas[i].clone(),
                format!(
                    "the delivery encodes to {} bytes, more than an edge call may carry ({} bytes)",
                    sizes[i],
                    edge_lane::EDGE_MAX_BYTES
                ),
            ));
        }
        for (meta, error) in unsendable {
            let _ = self.done_tx.send(Event::Unsendable {
                sub: target.id.clone(),
                lane: "edge",
                items: vec![meta],
                error,
            });
        }
        let spec_json: Arc<[u8]> = spec_json.into();
        for call in calls {
            let refs: Vec<&[u8]> = call.iter().map(|&i| parts[i].as_slice()).collect();
            let body = edge_lane::batch_body(&spec_json, &refs);
            let items: Vec<Meta> = call.iter().map(|&i| metas[i].clone()).collect();
            let edge = edge.clone();
            let done = self.done_tx.clone();
            let sub = target.id.clone();
            let timeout_ms = target.limits.timeout_ms;
            tokio::spawn(async move {
                let mut unreported = Unreported::new(&done, &sub, "edge", items);
                let call_id = call_id(now_ms());
                let wait = edge_lane::call_timeout(unreported.items.len(), timeout_ms);
                let result = edge.send(body, &call_id, wait).await;
                let items = unreported.take();
                let event = match result {
                    Ok(results) => {
                        let ids: Vec<String> =
                            items.iter().map(|m| delivery_public_id(m.rowid)).collect();
                        Event::Results {
                            sub,
                            lane: "edge",
                            items: items.into_iter().zip(pair_results(&ids, results)).collect(),
                            at_ms: now_ms(),
                        }
                    }
                    Err(error) => Event::EdgeFailed {
                        sub,
                        items,
                        failure: edge_failure(&error),
                    },
                };
                let _ = done.send(event);
            });
        }
    }
}

/// The deliveries a send task has not reported yet. Should the task end without reporting them
/// (a panic unwinding it), dropping this reports them as unsendable: their in-flight slots come
/// back and each counts a failed attempt (dead at the attempt limit, like a poison event), so a
/// panic never leaks a slot or strands a delivery until its lease expires.
struct Unreported {
    done: mpsc::UnboundedSender<Event>,
    sub: Arc<str>,
    lane: &'static str,
    items: Vec<Meta>,
}

impl Unreported {
    fn new(
        done: &mpsc::UnboundedSender<Event>,
        sub: &Arc<str>,
        lane: &'static str,
        items: Vec<Meta>,
    ) -> Unreported {
        Unreported {
            done: done.clone(),
            sub: sub.clone(),
            lane,
            items,
        }
    }

    /// The deliveries, now to be reported by the task itself.
    fn take(&mut self) -> Vec<Meta> {
        std::mem::take(&mut self.items)
    }
}

impl Drop for Unreported {
    fn drop(&mut self) {
        if self.items.is_empty() {
            return;
        }
        tracing::error!(
            subscriber = %self.sub,
            lane = self.lane,
            deliveries = self.items.len(),
            "a send task ended without reporting its deliveries (it panicked); each counts a failed attempt"
        );
        let items = self.take();
        let _ = self.done.send(Event::Unsendable {
            sub: self.sub.clone(),
            lane: self.lane,
            items,
            error: "the daemon failed while sending this delivery (an internal error, in its log)"
                .into(),
        });
    }
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

/// A fresh id for each edge call (the edge refuses an id it has seen within 300 s as a replay):
/// random, and unique within this process even if the system's random source fails.
fn call_id(now_ms: i64) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let random = getrandom::u64().unwrap_or_default();
    format!("call_{random:016x}_{now_ms:x}_{n:x}")
}

#[cfg(test)]
mod tests {
    /// A send task that panics still reports its deliveries (as unsendable, so their slots
    /// come back); one that reports them itself sends nothing more.
    #[tokio::test]
    async fn a_panicking_send_task_still_reports_its_deliveries() {
        use super::{Event, Meta, Unreported};
        let (done, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sub: std::sync::Arc<str> = "s".into();
        let meta = |rowid| Meta {
            rowid,
            event_id: format!("e{rowid}"),
            event_type: "t".into(),
            attempt: 1,
            latency_ms: None,
        };
        let (d, s, m) = (done.clone(), sub.clone(), vec![meta(1), meta(2)]);
        let task = tokio::spawn(async move {
            let _unreported = Unreported::new(&d, &s, "edge", m);
            if s.len() == 1 {
                panic!("a bug in a send task");
            }
        });
        assert!(task.await.unwrap_err().is_panic());
        match rx.try_recv() {
            Ok(Event::Unsendable {
                sub, lane, items, ..
            }) => {
                assert_eq!((&*sub, lane), ("s", "edge"));
                assert_eq!(items.iter().map(|m| m.rowid).collect::<Vec<_>>(), [1, 2]);
            }
            other => panic!("expected the deliveries reported unsendable, got {other:?}"),
        }
        let (d, s) = (done.clone(), sub.clone());
        tokio::spawn(async move {
            let mut unreported = Unreported::new(&d, &s, "origin", vec![meta(3)]);
            assert_eq!(unreported.take().len(), 1);
        })
        .await
        .unwrap();
        assert!(rx.try_recv().is_err(), "reported once, by the task");
    }

    use super::*;

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
}
