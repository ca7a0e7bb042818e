//! The executor: carries out the state's effects and feeds every answer back as an event. It
//! reads the clock, talks to the ledger through the typed [`DispatchLedger`] operations,
//! launches sends (`super::launch`), raises alerts, logs and counts; it sleeps until the
//! state's deadline or until a message or a result arrives.
//!
//! It does NOT decide: it keeps no timer of its own, counts no in-flight send, touches no
//! limiter, chooses no lane and no delivery. One task owns the state; sends run as their own
//! tasks and report back over a channel, so a subscriber that hangs holds only its own slots.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fanout_core::breaker::BreakerConfig;
use tokio::sync::mpsc;

use super::edge_lane::EdgeClient;
use super::plan::RetryRules;
use super::state::{Settings, State, SHUTDOWN_FLUSHES, SHUTDOWN_FLUSH_EVERY_MS};
use super::vocab::{Control, Effect, Event, Meta, Read, StallReport};
use crate::alert::{AlertRules, Alerter};
use crate::health::Heartbeat;
use crate::ledger::{DispatchLedger, LedgerError};
use crate::metrics::Metrics;
use crate::model::delivery_public_id;
use crate::model::{Share, StallView};
use crate::outbound::Outbound;
use crate::time::{jitter, now_ms};
use fanout_core::logrec::LogRecord;
use fanout_core::wire::{Delivery, DeliveryResult};

#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub rules: RetryRules,
    pub allow_loopback: bool,
    /// `--event-url`: where a thin webhook says its event can be fetched.
    pub event_url: Option<crate::payload::EventUrl>,
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
    /// The attempt spans (`crate::trace`; off unless an OTLP endpoint is set).
    pub telemetry: crate::trace::Telemetry,
}

/// The clock the executor reads (unix ms on the ledger's clock): [`now_ms`], or in tests one
/// that follows tokio's paused time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The executor.
pub struct Dispatcher<L: DispatchLedger> {
    ledger: L,
    pub(super) clock: Clock,
    pub(super) cfg: DispatchConfig,
    metrics: Arc<Metrics>,
    state: State,
    pub(super) done_tx: mpsc::UnboundedSender<Event>,
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
            event_url: cfg.event_url.clone(),
            alert_rules: cfg.alert_rules,
        });
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Dispatcher {
            ledger,
            clock: Arc::new(now_ms),
            cfg,
            metrics,
            state,
            done_tx,
            done_rx,
        }
    }

    /// The same dispatcher reading `clock` instead of [`now_ms`].
    pub fn with_clock(mut self, clock: Clock) -> Dispatcher<L> {
        self.clock = clock;
        self
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    /// Hand one event to the state and carry out every effect, feeding the answers back,
    /// until none is left. Every effect is carried out; the first read that failed is
    /// returned (the others are logged).
    async fn step(&mut self, event: Event) -> Result<(), LedgerError> {
        let mut queue: VecDeque<Effect> = self.state.handle(event, self.now(), &mut jitter).into();
        let mut failed = Ok(());
        while let Some(effect) = queue.pop_front() {
            for answer in self.execute(effect, &mut failed).await {
                let now = self.now();
                queue.extend(self.state.handle(answer, now, &mut jitter));
            }
        }
        failed
    }

    /// Carry out one effect; its answers, as events.
    async fn execute(
        &mut self,
        effect: Effect,
        failed: &mut Result<(), LedgerError>,
    ) -> Vec<Event> {
        match effect {
            Effect::Record(turn) => match self.ledger.record_turn(turn).await {
                Ok(recorded) => vec![Event::Recorded(recorded)],
                Err(e) => {
                    tracing::error!(error = %e.error, "could not record the dispatcher's turn; it will be retried");
                    vec![Event::NotRecorded(e)]
                }
            },
            Effect::Launch {
                target,
                sends,
                per_call,
                at_ms,
            } => {
                self.launch(target, sends, per_call, at_ms);
                Vec::new()
            }
            Effect::Raise(notices) => {
                for n in notices {
                    self.cfg.alerter.raise(n);
                }
                Vec::new()
            }
            Effect::Stalls(report) => {
                self.stalls(report);
                Vec::new()
            }
            Effect::Read(read) => match self.read(read).await {
                Ok(answer) => vec![answer],
                Err(e) => {
                    if failed.is_ok() {
                        *failed = Err(e);
                    } else {
                        tracing::error!(error = %e, "dispatcher could not read the ledger");
                    }
                    Vec::new()
                }
            },
            Effect::SweepLeases { now_ms } => requeued(
                self.ledger.release_expired_leases(now_ms).await,
                "expired leases returned to the queue",
                "lease sweep failed",
            ),
            Effect::ReleaseStrays { held, now_ms } => requeued(
                self.ledger.release_strays(held, now_ms).await,
                "leases of a turn written though its answer was lost returned to the queue",
                "could not return the leases of a turn whose answer was lost; they come back when this daemon stops",
            ),
            Effect::Share { in_flight } => self.share(&in_flight).await,
            Effect::Leave => {
                if let Err(e) = self.ledger.leave().await {
                    tracing::warn!(error = %e, "could not leave the ledger's share: the other daemons take this one's subscribers once it ages out");
                }
                Vec::new()
            }
            Effect::NoEdge { subscriber } => {
                tracing::warn!(subscriber = %subscriber, "lane is edge but no edge is configured: using the origin lane");
                Vec::new()
            }
        }
    }

    async fn read(&self, read: Read) -> Result<Event, LedgerError> {
        Ok(match read {
            Read::Customers => Event::Customers(self.ledger.dispatch_customers().await?),
            Read::Subscribers => Event::Loaded(self.ledger.dispatch_subscribers().await?),
            Read::Subscriber(id) => {
                let found = self.ledger.dispatch_subscriber(&id).await?;
                Event::Changed { id, found }
            }
            Read::DueWork { dead_threshold } => {
                Event::DueWork(self.ledger.due_work(dead_threshold).await?)
            }
        })
    }

    /// Write that this dispatcher is alive and read who shares the ledger now. On failure the
    /// last share stays (this daemon ages out of the others' lists meanwhile, and both may
    /// claim for the same subscribers: slower, never wrong).
    async fn share(&self, in_flight: &[(Option<String>, usize)]) -> Vec<Event> {
        match self.ledger.share(in_flight).await {
            Ok(shared) => {
                let (share, elsewhere) = shared.unzip();
                if share.as_ref() != self.state.share() {
                    tracing::info!(daemons = ?share.as_ref().map(Share::members), "the daemons sharing the ledger changed: each claims for its own subscribers");
                }
                let n = share.as_ref().map_or(1, |s| s.members().len());
                self.metrics.daemons.store(n as u64, Ordering::Relaxed);
                vec![
                    Event::Share(share),
                    Event::Elsewhere(elsewhere.unwrap_or_default()),
                ]
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read which daemons share the ledger");
                Vec::new()
            }
        }
    }

    /// The watchdog's report: each stall logged once when it begins (and when it ends), the
    /// set published for `/metrics`, the API and the console.
    fn stalls(&self, report: StallReport) {
        let all: BTreeMap<String, StallView> = report
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
            match &event {
                Event::Results {
                    sub, lane, items, ..
                } => {
                    for (meta, sent) in items {
                        self.metrics
                            .record(sub, *lane, &sent.result, meta.latency_ms);
                        log_outcome(sub, meta, &sent.result);
                    }
                }
                Event::EdgeFailed {
                    sub,
                    items,
                    failure,
                } => {
                    self.metrics
                        .edge_call_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(subscriber = %sub, deliveries = items.len(), failure = ?failure, "edge call failed");
                }
                Event::Unsendable {
                    sub, items, error, ..
                } => {
                    tracing::error!(subscriber = %sub, deliveries = items.len(), error = %error, "deliveries could not be sent by the daemon; each counts as a failed attempt");
                }
                _ => {}
            }
            // Results ask for no read.
            let _ = self.step(event).await;
        }
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
        self.step(Event::Start).await?;
        if let Err(e) = self.step(Event::Timers).await {
            tracing::error!(error = %e, "dispatcher cannot read the queue");
        }
        tokio::pin!(shutdown);
        loop {
            self.cfg.heartbeat.beat(self.now());
            let _ = self.step(Event::Tick).await;
            let now = self.now();
            let wake = self.state.deadline(now);
            let sleep = tokio::time::sleep(Duration::from_millis((wake - now).max(0) as u64));
            let result = tokio::select! {
                _ = &mut shutdown => break,
                Some(c) = control.recv() => {
                    let mut r = self.step(Event::Control(c)).await;
                    while let Ok(c) = control.try_recv() {
                        r = r.and(self.step(Event::Control(c)).await);
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
            if let Err(e) = self.step(Event::Timers).await {
                tracing::error!(error = %e, "rescan failed");
            }
        }
        self.stop().await;
        Ok(())
    }

    /// Leave the share, record what is still in flight while the state allows, and try the
    /// last turn a few times; the rest is released at the next start.
    async fn stop(&mut self) {
        let _ = self.step(Event::Stop).await;
        while let Some(until) = self.state.draining(self.now()) {
            let wait = Duration::from_millis((until - self.now()).max(0) as u64);
            tokio::select! {
                Some(d) = self.done_rx.recv() => {
                    let batch = self.take_done(d);
                    self.done(batch).await;
                }
                _ = tokio::time::sleep(wait) => break,
            }
        }
        for _ in 0..SHUTDOWN_FLUSHES {
            let _ = self.step(Event::Flush).await;
            if !self.state.has_unrecorded() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(SHUTDOWN_FLUSH_EVERY_MS as u64)).await;
        }
        tracing::error!("could not record every result at shutdown; their deliveries are sent again after the restart");
    }
}

/// A result in the debug log, as the edge logs one (`LogRecord`: no payload, URL or secret).
fn log_outcome(sub: &str, meta: &Meta, result: &DeliveryResult) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let d = Delivery {
            id: delivery_public_id(meta.rowid),
            event_id: meta.event_id.clone(),
            event_type: meta.event_type.clone(),
            attempt: meta.attempt,
            body: String::new(),
            sequence: None,
            ordering_key: None,
            previous_sequence: None,
            traceparent: None,
            batch: None,
        };
        tracing::debug!(target: "fanout::delivery", "{}", LogRecord::new(sub, &d, result).to_json());
    }
}

/// Leases returned to the queue: their subscribers are due now (`returned` logged when there
/// were any, `failed` with the error).
fn requeued(
    released: Result<Vec<String>, LedgerError>,
    returned: &str,
    failed: &str,
) -> Vec<Event> {
    match released {
        Ok(subs) if !subs.is_empty() => {
            tracing::warn!(?subs, "{returned}");
            vec![Event::Due(subs)]
        }
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::error!(error = %e, "{failed}");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::sync::mpsc;

    use super::*;
    use crate::ledger::sqlite::{create_subscriber, ingest, subscriber_stats, Ledger};
    use crate::ledger::NewEvent;

    /// A clock that follows tokio's (paused) time from `start_ms`.
    fn paused_clock(start_ms: i64) -> Clock {
        let origin = tokio::time::Instant::now();
        Arc::new(move || start_ms + origin.elapsed().as_millis() as i64)
    }

    fn config(max_attempts: u32) -> DispatchConfig {
        DispatchConfig {
            rules: RetryRules {
                max_attempts,
                backoff_scale: 1.0,
            },
            allow_loopback: false,
            event_url: None,
            edge: None,
            breaker: BreakerConfig::default(),
            edge_batch: 100,
            max_total_in_flight: 100,
            alert_rules: AlertRules::default(),
            alerter: Alerter::log_only(),
            outbound: Outbound::new(false).expect("an HTTP client"),
            heartbeat: Heartbeat::default(),
            telemetry: Default::default(),
        }
    }

    /// On tokio's paused clock, against a real SQLite ledger: a delivery the daemon cannot
    /// sign (its subscriber's only secret does not parse) is attempted, retried on the
    /// backoff the state decided (2 s, 4 s … 256 s: minutes), and dead after the attempt
    /// limit — with no real wait: the executor slept only until the state's deadlines, and
    /// the ledger was asked at the state's times. (While the ledger's thread works, the idle
    /// runtime advances the paused clock to the next timer, so more paused time passes than
    /// the backoffs alone: the bounds say no less than them, and no real wait.)
    #[tokio::test(start_paused = true)]
    async fn the_executor_keeps_the_states_deadlines_on_paused_time() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ledger = Ledger::open(&dir.path().join("ledger.db")).expect("a ledger");
        let start_ms = now_ms();
        let clock = paused_clock(start_ms);
        ledger
            .call(move |c| {
                let mut s = crate::ledger::test_subscriber("s", &["*"]);
                s.created_ms = start_ms;
                create_subscriber(c, &s, "not a signing secret")?;
                let event = NewEvent {
                    id: "evt_1".into(),
                    event_type: "t".into(),
                    body: "{}".into(),
                    traceparent: None,
                };
                ingest(c, &[event], start_ms)?;
                Ok(())
            })
            .await
            .expect("a subscriber and an event");
        let max_attempts = 8;
        let dispatcher = Dispatcher::new(
            ledger.clone(),
            config(max_attempts),
            Arc::new(Metrics::new(false)),
        )
        .with_clock(clock.clone());
        let (_control, control_rx) = mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(dispatcher.run(control_rx, async move {
            let _ = stopped.await;
        }));
        let real = Instant::now();
        let dead = loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = clock();
            let stats = ledger
                .read(move |c| subscriber_stats(c, BreakerConfig::default(), now))
                .await
                .expect("stats");
            let s = stats.iter().find(|s| s.id == "s").expect("the subscriber");
            if s.dead == 1 {
                break now - start_ms;
            }
            assert!(
                now - start_ms < 6 * 3_600_000,
                "not dead after six hours of paused time: {stats:?}"
            );
        };
        // Seven backoffs of at least 2^k / 2 s (k = 1..7) went by on the paused clock.
        let least_ms: i64 = (1..max_attempts as i32)
            .map(|k| 1_000 * 2i64.pow(k as u32) / 2)
            .sum();
        assert!(
            dead >= least_ms,
            "dead after {dead} ms, sooner than the backoff allows ({least_ms} ms)"
        );
        assert!(
            real.elapsed() < Duration::from_secs(60),
            "minutes of retries took {:?} of real time",
            real.elapsed()
        );
        let _ = stop.send(());
        task.await
            .expect("the dispatcher's task")
            .expect("the dispatcher ran");
    }

    /// A send on the origin lane that would start more than `LATE_START_MS` after the state
    /// leased its delivery is not made (a daemon frozen past its leases, woken, would send its
    /// old launches beside the daemon that took them over, over the subscriber's rate: the
    /// fault soak, seed 11): it comes back deferred, due at once, no attempt spent. One on
    /// time is sent.
    #[tokio::test]
    async fn a_send_that_would_start_too_late_is_handed_back_unsent() {
        use crate::dispatch::launch::LATE_START_MS;
        use crate::dispatch::vocab::{Lane, Target};
        use crate::keyring::Keyring;
        use crate::model::{Claimed, Scheme, StoredSecret};
        use fanout_core::wire::DeliveryResult;
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().fallback(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                "ok"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}/h", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ledger = Ledger::open(&dir.path().join("ledger.db")).expect("a ledger");
        let mut cfg = config(3);
        cfg.allow_loopback = true;
        cfg.outbound = Outbound::new(true).expect("an HTTP client");
        let now = now_ms();
        let mut d = Dispatcher::new(ledger, cfg, Arc::new(Metrics::new(false)))
            .with_clock(Arc::new(move || now));
        let s = crate::ledger::test_subscriber("s", &["*"]);
        let target = Arc::new(Target {
            id: Arc::from("s"),
            url: Arc::from(url.as_str()),
            limits: s.limits,
            lane: Lane::Origin,
            legacy_signature: false,
            keyring: Keyring::of(&[StoredSecret {
                secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
                created_ms: 0,
                expires_ms: None,
                signing_key: None,
            }]),
            signature: Scheme::Hmac,
            customer: None,
            payload: Default::default(),
            ordered: false,
            propagate_trace: false,
            batch: None,
        });
        let claimed = |rowid| Claimed {
            rowid,
            event_id: format!("evt_{rowid}"),
            event_type: "t".into(),
            body: "{}".into(),
            attempt: 1,
            sequence: 1,
            received_ms: now,
            order: None,
            traceparent: None,
        };
        let mut result_of = async |at_ms| {
            d.launch(target.clone(), vec![vec![claimed(at_ms)]], 1, at_ms);
            match d.done_rx.recv().await {
                Some(Event::Results { mut items, .. }) => items.pop().expect("one result").1,
                other => panic!("expected the send's result, got {other:?}"),
            }
        };
        let late = result_of(now - LATE_START_MS - 1).await;
        assert!(
            matches!(
                late.result,
                DeliveryResult::Deferred {
                    retry_after_ms: 0,
                    ..
                }
            ),
            "{late:?}"
        );
        assert_eq!(late.attempt, None, "no attempt spent");
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing sent"
        );
        let on_time = result_of(now - LATE_START_MS).await;
        assert!(
            matches!(
                on_time.result,
                DeliveryResult::Delivered { status: 200, .. }
            ),
            "{on_time:?}"
        );
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
