//! The dispatcher's state machine: every per-subscriber figure (limiter, in-flight sends, due
//! work, health) and every decision, with no I/O. It takes [`Event`]s — a tick, results, an
//! edge call that failed, a turn the ledger recorded or handed back, control messages — and
//! returns [`Effect`]s as data: record this turn, launch these sends, raise these alerts. The
//! executor (`super::Dispatcher`) carries effects out and feeds their answers back as events.
//!
//! Time and jitter are arguments: tests move the clock instead of sleeping.
//!
//! Invariants (each a table test below):
//! - Every leased delivery is counted in flight exactly once, from its claim to its first
//!   result, against its subscriber's `max_in_flight` and the global cap — also when the
//!   subscriber is edited, removed or re-created meanwhile (a removed subscriber is remembered
//!   until its last send is back) and when a result arrives late or twice.
//! - A turn the ledger could not record comes back whole and is retried first; its results are
//!   never dropped, and the limiter tokens it reserved are released exactly.
//! - At most one turn is being recorded at a time.
//! - A daemon that shares its ledger asks to claim only for the subscribers it owns
//!   ([`Share`]), and wakes for no other's due work.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use fanout_core::breaker::{BreakerConfig, BreakerState};
use fanout_core::limiter::{LimiterState, Reservation};
use fanout_core::retry::{next_step, Class, Next};
use fanout_core::wire::{DeferReason, DeliveryResult};

use super::fair;
use super::plan::{attempt_of, attempt_record, edge_retry_ms, transition_for, RetryRules};
use crate::alert::rules::{after_attempt, AfterAttempt, Alert, Seen};
use crate::alert::{AlertRules, Notice};
use crate::ledger::{Recorded, Turn, TurnError};
use crate::model::{
    delivery_public_id, AttemptRecord, Claimed, Health, HealthWrite, InFlight, Lane, Limits,
    Outcome, Share, StoredSecret, Subscriber, Transition,
};

/// How long a lease lasts: longer than any send can take (the longest edge call: the edge's
/// 240 s send window, one more 60 s subscriber timeout and the margin, see
/// `edge_lane::call_timeout`), so a live send never loses its lease.
pub const LEASE_MS: i64 = 330_000;
/// After a claim found nothing due, look again after this long.
const EMPTY_CLAIM_RETRY_MS: i64 = 100;
/// After the ledger failed to record a turn, wait this long (doubling per failure, up to
/// [`LEDGER_RETRY_MAX_MS`]) before trying again.
const LEDGER_RETRY_MS: i64 = 100;
const LEDGER_RETRY_MAX_MS: i64 = 5_000;
/// The edge keeps this many sends of one call open at once (its `MAX_OPEN_SENDS` default).
pub const EDGE_OPEN_SENDS: usize = 6;
/// A subscriber's grant is spread over at most this many edge calls at once (beyond what the
/// `--edge-batch` cap needs): enough that a small `max_in_flight` is not throttled by one
/// call's open sends, few enough that a large grant still goes in large batches (each call
/// costs the edge a signature check and a Durable Object round trip).
pub const EDGE_CALLS_AT_ONCE: usize = 4;

/// The dispatcher's settings that its decisions depend on.
#[derive(Debug, Clone)]
pub struct Settings {
    pub rules: RetryRules,
    pub breaker: BreakerConfig,
    /// An edge is configured (lane `auto` means the edge).
    pub edge: bool,
    /// Most deliveries per edge call.
    pub edge_batch: usize,
    /// Most deliveries in flight across all subscribers.
    pub max_total_in_flight: usize,
    pub alert_rules: AlertRules,
}

/// What a send needs to know about its subscriber, as of the claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub id: Arc<str>,
    pub url: Arc<str>,
    pub limits: Limits,
    /// The lane actually used (`Edge` or `Origin`).
    pub lane: Lane,
    pub legacy_signature: bool,
    pub secrets: Vec<StoredSecret>,
    /// Its customer, whose weight sets its group's share (`super::fair`).
    pub customer: Option<Arc<str>>,
}

/// A delivery out for sending, minus its body: what its result is recorded against.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub rowid: i64,
    pub event_id: String,
    pub event_type: String,
    pub attempt: u32,
    /// Measured by the origin lane around the whole send.
    pub latency_ms: Option<u64>,
}

impl Meta {
    pub fn of(d: &Claimed) -> Meta {
        Meta {
            rowid: d.rowid,
            event_id: d.event_id.clone(),
            event_type: d.event_type.clone(),
            attempt: d.attempt,
            latency_ms: None,
        }
    }
}

/// Why an edge call brought back no results, as the state needs to know it.
#[derive(Debug, Clone, PartialEq)]
pub enum EdgeFailure {
    /// Unreachable, overloaded, unauthorized, a 5xx, 408, 429, an answer that does not parse:
    /// the batch waits and is sent again, no attempt spent.
    Transient { error: String },
    /// The edge refuses the subscriber's endpoint: every delivery goes dead at once.
    EndpointRefused { error: String },
    /// A 4xx (other than 401, 408, 429) that sending the same batch again cannot change.
    Refused { status: u16, error: String },
}

/// What the state is told.
#[derive(Debug)]
pub enum Event {
    /// Look at the queue: lease what may be sent now and record what is unrecorded.
    Tick,
    /// Record what is unrecorded now, claiming nothing (shutdown, before a rescan).
    Flush,
    /// Every live subscriber, as stored: at start, and again when announcements may have been
    /// missed (a subscriber known here and not in the set was removed meanwhile).
    Loaded(Vec<(Subscriber, LimiterState)>),
    /// A subscriber was created, edited, re-enabled, rotated (`Some`) or removed (`None`).
    Changed {
        id: String,
        found: Option<(Subscriber, LimiterState)>,
    },
    /// Every customer's `(id, weight, max_in_flight)` (at start, and after any change).
    Customers(Vec<(String, u32, Option<u32>)>),
    /// These subscribers have work due now (new events, replays, expired leases).
    Due(Vec<String>),
    /// When each subscriber's earliest pending delivery is due, from the ledger (a rescan).
    DueWork(Vec<(String, i64)>),
    /// The daemons sharing the ledger now: this one claims only for the subscribers it owns
    /// (`None`: it is alone and owns them all). Those it gains are looked at at once.
    Share(Option<Share>),
    /// What the other daemons sharing the ledger have in flight, per customer (`None`: the
    /// subscribers with no customer), as each last wrote it: the weighted share and the
    /// customers' caps count it with this daemon's own.
    Elsewhere(InFlight),
    /// Results of one launch's deliveries.
    Results {
        sub: Arc<str>,
        lane: &'static str,
        items: Vec<(Meta, DeliveryResult)>,
        at_ms: i64,
    },
    /// An edge call that brought back no results.
    EdgeFailed {
        sub: Arc<str>,
        items: Vec<Meta>,
        failure: EdgeFailure,
    },
    /// Deliveries the daemon itself could not send (no usable secret, an encoding the edge
    /// cannot take): each counts as a failed attempt, so it goes dead after the attempt limit.
    Unsendable {
        sub: Arc<str>,
        lane: &'static str,
        items: Vec<Meta>,
        error: String,
    },
    /// The ledger recorded the turn.
    Recorded(Recorded),
    /// The ledger could not record the turn: it comes back whole.
    NotRecorded(TurnError),
}

/// What the executor must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Record this turn (one transaction) and answer with `Recorded` or `NotRecorded`.
    Record(Turn),
    /// Send these leased deliveries by `target.lane`; edge calls carry at most `per_call`
    /// deliveries each, and all of them go at once.
    Launch {
        target: Arc<Target>,
        deliveries: Vec<Claimed>,
        per_call: usize,
    },
    /// Tell the operator.
    Raise(Vec<Notice>),
    /// The stalled subscribers changed (the watchdog, [`State::stalled`]): log those that
    /// began (once each), count them, and show the whole set.
    Stalls(StallReport),
}

/// How long a subscriber may be ready to send (due work, nothing out, no in-flight cap, its
/// own limiter allowing, no wait it stated still running) and send nothing, before the
/// watchdog reports it stalled.
pub const STALL_MARGIN_MS: i64 = 10_000;
/// The watchdog looks at least this often while the dispatcher runs (every tick, and the
/// executor ticks every second or two at the least); a longer gap means the dispatcher itself
/// was held (a slow or failing ledger, a frozen process), not a subscriber: readiness counts
/// afresh.
const WATCH_GAP_MS: i64 = 5_000;

/// A subscriber the watchdog found stalled, with what the dispatcher believes of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stall {
    pub subscriber: Arc<str>,
    /// Since when it has been ready to send (due work, nothing out, its limiter allowing, no
    /// wait it stated still running) and sent nothing.
    pub since_ms: i64,
    /// The wait it holds now (a refusal since), if any.
    pub not_before_ms: Option<i64>,
    pub next_due_ms: Option<i64>,
    pub paused_until_ms: Option<i64>,
    pub breaker: BreakerState,
}

/// The stalled set after a change: all of it, and which stalls began and ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StallReport {
    pub all: Vec<Stall>,
    pub began: Vec<Arc<str>>,
    pub ended: Vec<Arc<str>>,
}

/// What the state keeps about one subscriber.
#[derive(Debug, Clone)]
struct Sub {
    target: Arc<Target>,
    limiter: LimiterState,
    limiter_dirty: bool,
    /// Its deliveries out now (each also in `State::out`).
    in_flight: u32,
    /// When its earliest pending delivery is due, if it has any.
    next_due: Option<i64>,
    /// Nothing is sent before this (rate, pause, breaker, edge trouble).
    not_before: i64,
    edge_failures: u32,
    health: Health,
    /// Removed from the ledger: nothing more is claimed for it; it is forgotten once its last
    /// send is back, and a re-created subscriber of the same id takes its place and its slots.
    removed: bool,
    /// This daemon claims for it ([`owned`] under the share last told): kept here, not hashed
    /// again on every pass of the loop.
    mine: bool,
    /// The tokens taken for the turn being recorded.
    reserved: Option<Reservation>,
    /// The watchdog's view: since when it has been ready to send and sent nothing (`None`
    /// while it sends, has nothing due, is held by an in-flight cap or waits as it said).
    ready_since: Option<i64>,
    /// `not_before` holds a wait the edge's breaker stated (a `breaker_open` deferral).
    edge_breaker_wait: bool,
    /// Held this turn by an in-flight cap (its own, its customer's, the daemon's; on
    /// PostgreSQL, every daemon's sends counted): a result frees a slot, nothing stalls.
    capped: bool,
}

impl Sub {
    fn new(target: Arc<Target>, limiter: LimiterState, health: Health, mine: bool) -> Sub {
        Sub {
            target,
            limiter,
            limiter_dirty: false,
            in_flight: 0,
            next_due: Some(0),
            not_before: 0,
            edge_failures: 0,
            health,
            removed: false,
            mine,
            reserved: None,
            ready_since: None,
            edge_breaker_wait: false,
            capped: false,
        }
    }

    fn due_at(&mut self, at_ms: i64) {
        self.next_due = Some(self.next_due.map_or(at_ms, |d| d.min(at_ms)));
    }
}

/// Whether a daemon under `share` claims for `id`: alone (`None`), for every subscriber.
fn owned(share: Option<&Share>, id: &str) -> bool {
    share.is_none_or(|s| s.owns(id))
}

/// The dispatcher's whole state.
#[derive(Debug)]
pub struct State {
    cfg: Settings,
    subs: HashMap<Arc<str>, Sub>,
    /// Live subscribers, by id: the round-robin order.
    order: Vec<Arc<str>>,
    rr: usize,
    /// Every delivery out, by row id, with its subscriber.
    out: HashMap<i64, Arc<str>>,
    /// Each customer's weight and in-flight cap.
    customers: HashMap<String, (u32, Option<u32>)>,
    /// Deliveries that were in an edge call refused as a whole, by row id, with the most
    /// deliveries their next call may hold (half the refused call): each is sent again in ever
    /// smaller calls until the one the edge refuses is alone. Cleared by the delivery's next
    /// result.
    suspects: HashMap<i64, usize>,
    /// Results processed but not yet written (they go with the next turn).
    unrecorded: Vec<Outcome>,
    /// The earliest retry among the unrecorded results, per subscriber (a rescan of the ledger
    /// cannot see them yet).
    unrecorded_due: HashMap<Arc<str>, i64>,
    health: Vec<HealthWrite>,
    dead: BTreeSet<String>,
    notices: Vec<Notice>,
    /// A turn is being recorded.
    recording: bool,
    /// The ledger failed this many turns in a row; nothing is recorded before `ledger_retry_at`.
    ledger_failures: u32,
    ledger_retry_at: i64,
    /// Which subscribers this daemon claims for, when it shares the ledger.
    share: Option<Share>,
    /// In flight at the other daemons, per customer (`Event::Elsewhere`).
    elsewhere: HashMap<Option<Arc<str>>, usize>,
    /// The subscribers last reported stalled.
    stalls_reported: BTreeSet<Arc<str>>,
    /// When the watchdog last looked.
    watched_at: i64,
}

impl State {
    pub fn new(cfg: Settings) -> State {
        State {
            cfg,
            subs: HashMap::new(),
            order: Vec::new(),
            rr: 0,
            out: HashMap::new(),
            customers: HashMap::new(),
            suspects: HashMap::new(),
            unrecorded: Vec::new(),
            unrecorded_due: HashMap::new(),
            health: Vec::new(),
            dead: BTreeSet::new(),
            notices: Vec::new(),
            recording: false,
            ledger_failures: 0,
            ledger_retry_at: 0,
            share: None,
            elsewhere: HashMap::new(),
            stalls_reported: BTreeSet::new(),
            watched_at: 0,
        }
    }

    /// This daemon's deliveries in flight per customer (`None`: subscribers with no customer),
    /// those with any: what the other daemons sharing the ledger are told.
    pub fn in_flight_by_customer(&self) -> InFlight {
        let mut out: InFlight = self
            .in_flight_per_customer(HashMap::new())
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(c, n)| (c.as_deref().map(str::to_string), n))
            .collect();
        out.sort();
        out
    }

    /// `counted` plus this daemon's deliveries in flight, per customer.
    fn in_flight_per_customer(
        &self,
        mut counted: HashMap<Option<Arc<str>>, usize>,
    ) -> HashMap<Option<Arc<str>>, usize> {
        for st in self.subs.values() {
            *counted.entry(st.target.customer.clone()).or_default() += st.in_flight as usize;
        }
        counted
    }

    /// The daemons sharing the ledger as last told (`None`: alone).
    pub fn share(&self) -> Option<&Share> {
        self.share.as_ref()
    }

    /// Whether this daemon claims for `id` (every subscriber when it is alone).
    pub fn owns(&self, id: &str) -> bool {
        owned(self.share.as_ref(), id)
    }

    /// Deliveries out now, across all subscribers.
    pub fn in_flight(&self) -> usize {
        self.out.len()
    }

    /// Deliveries out now for one subscriber (0 when unknown).
    pub fn in_flight_of(&self, id: &str) -> u32 {
        self.subs.get(id).map_or(0, |s| s.in_flight)
    }

    /// The limiter the state holds for a subscriber.
    pub fn limiter_of(&self, id: &str) -> Option<LimiterState> {
        self.subs.get(id).map(|s| s.limiter)
    }

    /// Results, health changes or alerts are waiting to be recorded.
    pub fn has_unrecorded(&self) -> bool {
        !self.unrecorded.is_empty()
            || !self.health.is_empty()
            || !self.dead.is_empty()
            || !self.notices.is_empty()
            || self.subs.values().any(|s| s.limiter_dirty)
    }

    /// Take in one event at `now` (`jitter` draws a number in [0, 1) for backoff).
    pub fn handle(
        &mut self,
        event: Event,
        now: i64,
        jitter: &mut dyn FnMut() -> f64,
    ) -> Vec<Effect> {
        match event {
            Event::Tick => self.turn(now, true),
            Event::Flush => self.turn(now, false),
            Event::Loaded(subs) => {
                let stored: HashSet<String> = subs.iter().map(|(s, _)| s.id.clone()).collect();
                let gone: Vec<Arc<str>> = self
                    .order
                    .iter()
                    .filter(|id| !stored.contains(id.as_ref()))
                    .cloned()
                    .collect();
                for id in gone {
                    self.remove(&id);
                }
                for (s, limiter) in subs {
                    self.upsert(s, limiter, now);
                }
                Vec::new()
            }
            Event::Changed { id, found } => {
                match found {
                    Some((s, limiter)) => self.upsert(s, limiter, now),
                    None => self.remove(&id),
                }
                Vec::new()
            }
            Event::Share(share) => {
                if share != self.share {
                    for (id, st) in self.subs.iter_mut() {
                        let mine = owned(share.as_ref(), id);
                        if mine && !st.mine {
                            // Another daemon claimed for it until now: whatever it left is due.
                            st.due_at(now);
                        }
                        st.mine = mine;
                    }
                    self.share = share;
                }
                Vec::new()
            }
            Event::Elsewhere(all) => {
                self.elsewhere.clear();
                for (customer, n) in all {
                    *self.elsewhere.entry(customer.map(Arc::from)).or_default() += n;
                }
                Vec::new()
            }
            Event::Customers(all) => {
                self.customers = all.into_iter().map(|(id, w, cap)| (id, (w, cap))).collect();
                Vec::new()
            }
            Event::Due(ids) => {
                for id in ids {
                    if let Some(st) = self.subs.get_mut(id.as_str()) {
                        st.due_at(now);
                    }
                }
                Vec::new()
            }
            Event::DueWork(due) => {
                let mut by_id: HashMap<&str, i64> =
                    due.iter().map(|(id, at)| (id.as_str(), *at)).collect();
                for (id, st) in self.subs.iter_mut() {
                    let stored = by_id.remove(id.as_ref());
                    let unrecorded = self.unrecorded_due.get(id).copied();
                    st.next_due = match (stored, unrecorded) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Vec::new()
            }
            Event::Results {
                sub,
                lane,
                items,
                at_ms,
            } => {
                self.on_results(&sub, lane, items, at_ms, now, jitter);
                Vec::new()
            }
            Event::EdgeFailed {
                sub,
                items,
                failure,
            } => {
                self.on_edge_failed(&sub, items, failure, now, jitter);
                Vec::new()
            }
            Event::Unsendable {
                sub,
                lane,
                items,
                error,
            } => {
                self.on_unsendable(&sub, lane, items, &error, now, jitter);
                Vec::new()
            }
            Event::Recorded(recorded) => self.on_recorded(recorded, now),
            Event::NotRecorded(failed) => {
                self.on_not_recorded(failed, now);
                Vec::new()
            }
        }
    }

    /// When the executor must next tick on its own (a result or a control message wakes it
    /// sooner).
    pub fn next_wake(&self, now: i64, latest: i64) -> i64 {
        let mut wake = latest;
        if self.ledger_retry_at > now {
            return wake.min(self.ledger_retry_at);
        }
        if !self.unrecorded.is_empty()
            || !self.health.is_empty()
            || !self.dead.is_empty()
            || !self.notices.is_empty()
        {
            // Results are written at once; a limiter alone waits for the next turn.
            return now;
        }
        if self.out.len() >= self.cfg.max_total_in_flight {
            // Only a result can free a slot, and a result wakes the loop.
            return wake;
        }
        for st in self.subs.values() {
            if st.removed
                || st.in_flight >= st.target.limits.max_in_flight
                || st.health.disabled.is_some()
                || !st.mine
                // Held by an in-flight cap while sends are out here: a result wakes the loop.
                || (st.capped && !self.out.is_empty())
            {
                continue;
            }
            if let Some(due) = st.next_due {
                wake = wake.min(due.max(st.not_before));
            }
        }
        wake.max(now)
    }

    fn upsert(&mut self, s: Subscriber, stored: LimiterState, now: i64) {
        let target = Arc::new(Target {
            id: Arc::from(s.id.as_str()),
            url: Arc::from(s.url.as_str()),
            limits: s.limits,
            lane: s.lane.effective(self.cfg.edge),
            legacy_signature: s.legacy_signature,
            secrets: s.secrets,
            customer: s.customer.as_deref().map(Arc::from),
        });
        match self.subs.get_mut(target.id.as_ref()) {
            Some(st) => {
                // The state's limiter is the newest (the stored one is what it last wrote):
                // an edit, or a removal and re-creation while sends are out, never grants a
                // fresh burst.
                if st.health.disabled.is_some() && s.health.disabled.is_none() {
                    // Re-enabled: the breaker starts afresh (the ledger reset it too).
                    st.limiter.breaker = stored.breaker;
                    st.limiter_dirty = true;
                }
                if st.removed {
                    st.removed = false;
                    self.order.push(target.id.clone());
                    self.order.sort();
                }
                st.target = target;
                st.health = s.health;
                st.not_before = 0;
                st.due_at(now);
            }
            None => {
                let id = target.id.clone();
                let mine = self.owns(&id);
                self.subs
                    .insert(id.clone(), Sub::new(target, stored, s.health, mine));
                self.order.push(id);
                self.order.sort();
            }
        }
    }

    fn remove(&mut self, id: &str) {
        self.order.retain(|o| o.as_ref() != id);
        let Some(st) = self.subs.get_mut(id) else {
            return;
        };
        if st.in_flight == 0 && st.reserved.is_none() {
            self.subs.remove(id);
        } else {
            st.removed = true;
            st.next_due = None;
        }
    }

    /// One turn: lease what may be sent now (when `claim`), and record what is unrecorded.
    fn turn(&mut self, now: i64, claim: bool) -> Vec<Effect> {
        if self.recording || now < self.ledger_retry_at {
            return Vec::new();
        }
        // Watched before this turn's reservations: a subscriber ready now is asked for now,
        // and one whose claim is refused again and again stays ready since its first.
        let watched = self.watch(now);
        let mut claims: Vec<(String, usize)> = Vec::new();
        if claim {
            claims = self.reserve(now);
        }
        let limiters: Vec<(String, LimiterState)> = self
            .subs
            .values_mut()
            .filter(|s| s.limiter_dirty)
            .map(|s| {
                s.limiter_dirty = false;
                (s.target.id.to_string(), s.limiter)
            })
            .collect();
        let turn = Turn {
            now_ms: now,
            outcomes: std::mem::take(&mut self.unrecorded),
            limiters,
            health: std::mem::take(&mut self.health),
            dead: std::mem::take(&mut self.dead).into_iter().collect(),
            dead_threshold: self.cfg.alert_rules.dead_threshold,
            notices: std::mem::take(&mut self.notices),
            claims,
            lease_until_ms: now + LEASE_MS,
        };
        let mut effects = Vec::new();
        if !turn.is_empty() {
            self.recording = true;
            effects.push(Effect::Record(turn));
        }
        effects.extend(watched);
        effects
    }

    /// The watchdog: a subscriber is ready to send when it has due work, nothing out, no
    /// in-flight cap holding it, no wait it stated still running (its rate, a pause, its
    /// breaker, the edge's or the shared limiter's answer) and its own limiter would grant a
    /// send now. Ready for longer than [`STALL_MARGIN_MS`] without sending, it is stalled: a
    /// wait never kept, or a refusal renewed for ever, which no decision should leave. (A
    /// wait stated and kept is no stall, however long.) Not watched while a turn is being
    /// recorded or the ledger fails (then the ledger holds everyone, and says so itself).
    /// Reports the stalled set when it changes.
    fn watch(&mut self, now: i64) -> Option<Effect> {
        if self.recording || now < self.ledger_retry_at {
            return None;
        }
        let budget_full = self.out.len() >= self.cfg.max_total_in_flight;
        let breaker = self.cfg.breaker;
        // Held by the ledger (failing turns, or a gap between looks): not the subscribers'.
        let held = now - self.watched_at > WATCH_GAP_MS || self.ledger_failures > 0;
        self.watched_at = now;
        for st in self.subs.values_mut() {
            if held {
                st.ready_since = None;
            }
            let waiting = st.mine
                && !st.removed
                && st.health.disabled.is_none()
                && st.next_due.is_some_and(|d| d <= now)
                && st.in_flight == 0
                && !st.capped
                && !budget_full;
            if !waiting {
                st.ready_since = None;
                continue;
            }
            if st.ready_since.is_none() && st.not_before <= now {
                let mut copy = st.limiter;
                let limits = st.target.limits.core(breaker);
                if copy.reserve(limits, 0, now, 1).granted() > 0 {
                    st.ready_since = Some(now);
                }
            }
        }
        let stalled = self.stalled(now);
        let ids: BTreeSet<Arc<str>> = stalled.iter().map(|s| s.subscriber.clone()).collect();
        if ids == self.stalls_reported {
            return None;
        }
        let began = ids.difference(&self.stalls_reported).cloned().collect();
        let ended = self.stalls_reported.difference(&ids).cloned().collect();
        self.stalls_reported = ids;
        Some(Effect::Stalls(StallReport {
            all: stalled,
            began,
            ended,
        }))
    }

    /// The subscribers stalled as of `now` (see [`State::watch`]), by id.
    pub fn stalled(&self, now: i64) -> Vec<Stall> {
        let mut out: Vec<Stall> = self
            .subs
            .values()
            .filter_map(|st| {
                let since = st.ready_since?;
                (now > since + STALL_MARGIN_MS).then(|| Stall {
                    subscriber: st.target.id.clone(),
                    since_ms: since,
                    not_before_ms: (st.not_before > now).then_some(st.not_before),
                    next_due_ms: st.next_due,
                    paused_until_ms: st.limiter.paused_until_ms.filter(|&p| p > now),
                    breaker: st.limiter.breaker.view(self.cfg.breaker, now).state,
                })
            })
            .collect();
        out.sort_by(|a, b| a.subscriber.cmp(&b.subscriber));
        out
    }

    /// Decide, fairly, how many deliveries each subscriber with due work may be sent now, and
    /// reserve that many from its limiter.
    fn reserve(&mut self, now: i64) -> Vec<(String, usize)> {
        let n = self.order.len();
        let breaker = self.cfg.breaker;
        // What each subscriber with due work may be sent, by its own limiter.
        let mut candidates: Vec<(Arc<str>, Reservation)> = Vec::new();
        for k in 0..n {
            let id = self.order[(self.rr + k) % n].clone();
            let Some(st) = self.subs.get_mut(&id) else {
                continue;
            };
            if !st.mine
                || st.next_due.is_none_or(|d| d > now)
                || st.not_before > now
                || st.health.disabled.is_some()
                || st.removed
            {
                continue;
            }
            let limits = st.target.limits.core(breaker);
            let want = limits.max_in_flight as usize;
            let r = st.limiter.reserve(limits, st.in_flight, now, want);
            st.capped = false;
            if r.granted() > 0 {
                st.limiter_dirty = true;
                candidates.push((id, r));
            } else if r.wait_ms().is_none() || limits.rate.room(st.in_flight) < 1.0 {
                // Its own in-flight cap, or a burst its open sends fill (no token accrues
                // while they are out): only a result frees a slot, and a result wakes the
                // loop. (A wait for the next token here woke the loop every millisecond
                // while a send of a burst-1 subscriber was out.)
                st.capped = true;
            } else if let Some(wait) = r.wait_ms() {
                st.not_before = now + wait.max(1) as i64;
            }
        }
        // Share the global in-flight budget: weighted between customers, round-robin within;
        // give back what is over it.
        let budget = self.cfg.max_total_in_flight.saturating_sub(self.out.len());
        let shares = self.fair_shares(&candidates, budget);
        self.rr = self.rr.wrapping_add(1);
        let mut asks = Vec::new();
        for ((id, mut r), k) in candidates.into_iter().zip(shares) {
            let Some(st) = self.subs.get_mut(&id) else {
                continue;
            };
            let limits = st.target.limits.core(breaker);
            let over = r.granted() - k;
            st.limiter.release(limits, &mut r, over);
            if k == 0 {
                // Its customer's cap, or the daemon's: others' results free a slot.
                st.capped = true;
                st.limiter.commit(limits, r, 0);
                continue;
            }
            st.reserved = Some(r);
            asks.push((id.to_string(), k));
        }
        asks
    }

    /// Each candidate's share of `budget`: weighted between customers, round-robin between a
    /// customer's subscribers (`fair::fair_share`); subscribers with no customer are one group
    /// of weight 1. A group's in flight counts every send of its subscribers still out, here
    /// and at the other daemons sharing the ledger.
    fn fair_shares(&self, candidates: &[(Arc<str>, Reservation)], budget: usize) -> Vec<usize> {
        let key = |id: &Arc<str>| self.subs.get(id).and_then(|st| st.target.customer.clone());
        let in_flight = self.in_flight_per_customer(self.elsewhere.clone());
        let mut index: HashMap<Option<Arc<str>>, usize> = HashMap::new();
        let mut groups: Vec<fair::Group> = Vec::new();
        let mut place: Vec<(usize, usize)> = Vec::with_capacity(candidates.len());
        for (id, r) in candidates {
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
            groups[g].wants.push(r.granted());
        }
        let grants = fair::fair_share(&groups, budget, self.rr);
        place.into_iter().map(|(g, s)| grants[g][s]).collect()
    }

    fn on_recorded(&mut self, recorded: Recorded, now: i64) -> Vec<Effect> {
        self.recording = false;
        self.ledger_failures = 0;
        self.unrecorded_due.clear();
        let mut effects = Vec::new();
        if !recorded.notices.is_empty() {
            effects.push(Effect::Raise(recorded.notices));
        }
        let breaker = self.cfg.breaker;
        for claim in recorded.claims {
            let Some(st) = self.subs.get_mut(claim.subscriber_id.as_str()) else {
                continue;
            };
            let got = claim.claimed.len();
            if let Some(r) = st.reserved.take() {
                // Commit what was leased; the rest of the reservation goes back exactly.
                st.limiter.commit(st.target.limits.core(breaker), r, got);
                st.limiter_dirty = true;
            }
            st.next_due = match claim.next_due_ms {
                // Nothing leased and no wait stated: look again shortly. (With a wait, the
                // work stays due and the wait holds it: the watchdog sees both.)
                Some(d) if got == 0 && d <= now && claim.not_before_ms.is_none() => {
                    Some(now + EMPTY_CLAIM_RETRY_MS)
                }
                other => other,
            };
            if let Some(at) = claim.not_before_ms {
                // The shared limiter has less than this daemon's copy: wait for it, whatever
                // new work is announced meanwhile (each announcement would otherwise ask
                // again, and get nothing, once per ingest).
                st.not_before = st.not_before.max(at);
            } else if got == 0 && claim.next_due_ms.is_some_and(|d| d <= now) {
                // Due work, no wait, nothing leased: the in-flight cap across every daemon
                // (or rows another transaction holds) — a result frees it.
                st.capped = true;
            }
            if got == 0 {
                continue;
            }
            let id = st.target.id.clone();
            st.in_flight += got as u32;
            for d in &claim.claimed {
                self.out.insert(d.rowid, id.clone());
            }
            let edge_batch = self.cfg.edge_batch.max(1);
            if st.target.lane != Lane::Edge || self.suspects.is_empty() {
                effects.push(Effect::Launch {
                    target: st.target.clone(),
                    deliveries: claim.claimed,
                    per_call: edge_per_call(got, edge_batch),
                });
                continue;
            }
            // Suspects of a refused call go in calls of their own size, the rest as usual.
            let mut by_size: std::collections::BTreeMap<usize, Vec<Claimed>> =
                std::collections::BTreeMap::new();
            let mut rest = Vec::new();
            for d in claim.claimed {
                match self.suspects.get(&d.rowid) {
                    Some(&size) => by_size.entry(size).or_default().push(d),
                    None => rest.push(d),
                }
            }
            if !rest.is_empty() {
                let n = rest.len();
                effects.push(Effect::Launch {
                    target: st.target.clone(),
                    deliveries: rest,
                    per_call: edge_per_call(n, edge_batch),
                });
            }
            for (size, deliveries) in by_size {
                effects.push(Effect::Launch {
                    target: st.target.clone(),
                    deliveries,
                    per_call: size,
                });
            }
        }
        // A reservation the answer did not mention (cannot happen with a well-behaved ledger)
        // goes back whole.
        self.release_reservations();
        self.forget_removed();
        effects.extend(self.watch(now));
        effects
    }

    fn on_not_recorded(&mut self, failed: TurnError, now: i64) {
        self.recording = false;
        let turn = failed.turn;
        // The turn's writes go back ahead of anything newer, to be retried first.
        let mut outcomes = turn.outcomes;
        outcomes.append(&mut self.unrecorded);
        self.unrecorded = outcomes;
        let mut health = turn.health;
        health.append(&mut self.health);
        self.health = health;
        self.dead.extend(turn.dead);
        let mut notices = turn.notices;
        notices.append(&mut self.notices);
        self.notices = notices;
        for (id, _) in turn.limiters {
            if let Some(st) = self.subs.get_mut(id.as_str()) {
                st.limiter_dirty = true;
            }
        }
        self.release_reservations();
        self.forget_removed();
        self.ledger_failures = self.ledger_failures.saturating_add(1);
        let wait = (LEDGER_RETRY_MS << self.ledger_failures.min(8).saturating_sub(1))
            .min(LEDGER_RETRY_MAX_MS);
        self.ledger_retry_at = now + wait;
    }

    fn release_reservations(&mut self) {
        let breaker = self.cfg.breaker;
        for st in self.subs.values_mut() {
            if let Some(r) = st.reserved.take() {
                st.limiter.commit(st.target.limits.core(breaker), r, 0);
                st.limiter_dirty = true;
            }
        }
    }

    fn forget_removed(&mut self) {
        self.subs
            .retain(|_, s| !(s.removed && s.in_flight == 0 && s.reserved.is_none()));
    }

    /// A delivery's send is over at `at_ms` (answered, failed, handed back): free its slot,
    /// exactly once, after bringing its limiter up to then under the room that held while the
    /// send was open (`LimiterState::settle`). `false` when it was not out (a second or stale
    /// result), which is then ignored.
    fn returned(&mut self, rowid: i64, at_ms: i64) -> bool {
        let Some(sub) = self.out.remove(&rowid) else {
            return false;
        };
        if let Some(st) = self.subs.get_mut(&sub) {
            st.limiter
                .settle(st.target.limits.core(self.cfg.breaker), st.in_flight, at_ms);
            st.limiter_dirty = true;
            st.in_flight = st.in_flight.saturating_sub(1);
            if st.removed && st.in_flight == 0 && st.reserved.is_none() {
                self.subs.remove(&sub);
            }
        }
        true
    }

    fn push_outcome(&mut self, sub: &Arc<str>, outcome: Outcome) {
        match &outcome.transition {
            Transition::Retry { at_ms, .. } | Transition::Defer { at_ms } => {
                let due = self.unrecorded_due.entry(sub.clone()).or_insert(*at_ms);
                *due = (*due).min(*at_ms);
                if let Some(st) = self.subs.get_mut(sub) {
                    st.due_at(*at_ms);
                }
            }
            Transition::Dead { .. } => {
                if self.subs.get(sub).is_some_and(|s| !s.removed) {
                    self.dead.insert(sub.to_string());
                }
            }
            Transition::Sent => {}
        }
        self.unrecorded.push(outcome);
    }

    fn on_results(
        &mut self,
        sub: &Arc<str>,
        lane: &'static str,
        items: Vec<(Meta, DeliveryResult)>,
        at_ms: i64,
        now: i64,
        jitter: &mut dyn FnMut() -> f64,
    ) {
        let rules = self.cfg.rules;
        let alert_rules = self.cfg.alert_rules;
        let breaker = self.cfg.breaker;
        if lane == "edge" {
            if let Some(st) = self.subs.get_mut(sub) {
                st.edge_failures = 0;
            }
        }
        for (meta, result) in items {
            if !self.returned(meta.rowid, at_ms) {
                continue;
            }
            self.suspects.remove(&meta.rowid);
            let transition = transition_for(&result, meta.attempt, rules, at_ms, jitter());
            if let Some(st) = self.subs.get_mut(sub).filter(|s| !s.removed) {
                if let Some(a) = attempt_of(&result) {
                    let limits = st.target.limits.core(breaker);
                    let before = st.limiter.breaker;
                    st.limiter.record(limits, &a, at_ms);
                    st.limiter_dirty = true;
                    if st.limiter.breaker != before {
                        // The wait stated while the breaker was open or its probe out (until
                        // the probe is presumed lost) is over: a probe that came back closes
                        // the breaker, re-opens it or ends in a pause, and the next turn's
                        // reservation states the new wait. Kept, the backlog sat a whole
                        // cool-down behind a closed breaker.
                        st.not_before = 0;
                    }
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
                    let after = after_attempt(&st.health, &seen, &alert_rules);
                    note_health(&mut self.health, &mut self.notices, st, after, at_ms);
                }
                match &result {
                    DeliveryResult::Deferred {
                        retry_after_ms,
                        reason: reason @ (DeferReason::Paused | DeferReason::BreakerOpen),
                        ..
                    } => {
                        st.not_before = st.not_before.max(now + *retry_after_ms as i64);
                        st.edge_breaker_wait |= *reason == DeferReason::BreakerOpen;
                    }
                    DeliveryResult::Delivered { .. } if st.edge_breaker_wait => {
                        // The edge's breaker said wait (its probe out, until presumed lost);
                        // a delivery since shows it closed: the wait is over.
                        st.edge_breaker_wait = false;
                        st.not_before = 0;
                    }
                    _ => {}
                }
                // A `rate` deferral keeps the token our pacing took for it: the origin stays a
                // token behind the edge instead of ahead of it, so it never churns calls the
                // edge can only defer.
            }
            let attempt = attempt_record(&result, meta.attempt, lane, at_ms, meta.latency_ms);
            self.push_outcome(
                sub,
                Outcome {
                    rowid: meta.rowid,
                    transition,
                    attempt,
                },
            );
        }
    }

    fn on_edge_failed(
        &mut self,
        sub: &Arc<str>,
        items: Vec<Meta>,
        failure: EdgeFailure,
        now: i64,
        jitter: &mut dyn FnMut() -> f64,
    ) {
        let items: Vec<Meta> = items
            .into_iter()
            .filter(|m| self.returned(m.rowid, now))
            .collect();
        if items.is_empty() {
            return;
        }
        match failure {
            EdgeFailure::Transient { .. } => {
                let mut wait = edge_retry_ms(0);
                if let Some(st) = self.subs.get_mut(sub) {
                    wait = edge_retry_ms(st.edge_failures);
                    st.edge_failures = st.edge_failures.saturating_add(1);
                    st.not_before = st.not_before.max(now + wait as i64);
                }
                for meta in items {
                    self.push_outcome(
                        sub,
                        Outcome {
                            rowid: meta.rowid,
                            transition: Transition::Defer {
                                at_ms: now + wait as i64,
                            },
                            attempt: None,
                        },
                    );
                }
            }
            EdgeFailure::EndpointRefused { error } => {
                for meta in items {
                    self.suspects.remove(&meta.rowid);
                    self.push_outcome(
                        sub,
                        Outcome {
                            rowid: meta.rowid,
                            transition: Transition::Dead {
                                reason: format!("refused_url (by the edge): {error}"),
                            },
                            attempt: None,
                        },
                    );
                }
            }
            EdgeFailure::Refused { status, error } if items.len() > 1 => {
                // Sending the same batch again cannot help: send it again split, at once.
                let half = items.len().div_ceil(2);
                let _ = (status, error);
                for meta in items {
                    let size = self.suspects.entry(meta.rowid).or_insert(half);
                    *size = (*size).min(half);
                    self.push_outcome(
                        sub,
                        Outcome {
                            rowid: meta.rowid,
                            transition: Transition::Defer { at_ms: now },
                            attempt: None,
                        },
                    );
                }
            }
            EdgeFailure::Refused { status, error } => {
                // One delivery the edge refuses on its own: an attempt that failed.
                let text = format!("edge refused the delivery: status {status}: {error}");
                self.fail_attempts(sub, "edge", items, &text, Some(status), now, jitter);
            }
        }
    }

    fn on_unsendable(
        &mut self,
        sub: &Arc<str>,
        lane: &'static str,
        items: Vec<Meta>,
        error: &str,
        now: i64,
        jitter: &mut dyn FnMut() -> f64,
    ) {
        let items: Vec<Meta> = items
            .into_iter()
            .filter(|m| self.returned(m.rowid, now))
            .collect();
        let text = format!("not sent: {error}");
        self.fail_attempts(sub, lane, items, &text, None, now, jitter);
    }

    /// Count a failed attempt for each delivery, by the retry schedule: retried with backoff,
    /// dead after the attempt limit. The subscriber's limiter and health are not touched (the
    /// failure is not the subscriber's).
    #[allow(clippy::too_many_arguments)]
    fn fail_attempts(
        &mut self,
        sub: &Arc<str>,
        lane: &'static str,
        items: Vec<Meta>,
        error: &str,
        status: Option<u16>,
        now: i64,
        jitter: &mut dyn FnMut() -> f64,
    ) {
        let rules = self.cfg.rules;
        for meta in items {
            self.suspects.remove(&meta.rowid);
            let class = Class::Retryable {
                retry_after_ms: None,
            };
            let transition =
                match next_step(&class, meta.attempt, rules.max_attempts, now, jitter()) {
                    Next::RetryAt { at_ms } => Transition::Retry {
                        at_ms: now + rules.scale(at_ms - now),
                        error: error.to_string(),
                    },
                    Next::Dead { reason } => Transition::Dead {
                        reason: format!("{reason}; last: {error}"),
                    },
                    Next::Sent => Transition::Sent,
                };
            if let Transition::Dead { reason } = &transition {
                self.notices.push(Notice {
                    subscriber: sub.to_string(),
                    at_ms: now,
                    alert: Alert::DeliveryNotSent {
                        delivery: delivery_public_id(meta.rowid),
                        event_id: meta.event_id.clone(),
                        reason: reason.clone(),
                    },
                });
            }
            let attempt = AttemptRecord {
                attempt: meta.attempt,
                at_ms: now,
                lane,
                outcome: "failed",
                status,
                latency_ms: None,
                response_body: None,
                error: Some(error.to_string()),
            };
            self.push_outcome(
                sub,
                Outcome {
                    rowid: meta.rowid,
                    transition,
                    attempt: Some(attempt),
                },
            );
        }
    }
}

/// Deliveries per edge call for a grant of `n`: a share of [`EDGE_CALLS_AT_ONCE`] calls, at
/// least [`EDGE_OPEN_SENDS`] (what one call keeps open at once), never more than `cap`.
pub fn edge_per_call(n: usize, cap: usize) -> usize {
    let spread = n.div_ceil(EDGE_CALLS_AT_ONCE).max(EDGE_OPEN_SENDS);
    spread.min(cap).max(1)
}

/// Take in what one attempt did to a subscriber's health: queue the ledger writes and alerts.
fn note_health(
    writes: &mut Vec<HealthWrite>,
    notices: &mut Vec<Notice>,
    st: &mut Sub,
    after: AfterAttempt,
    at_ms: i64,
) {
    if after.health.failing_since_ms != st.health.failing_since_ms {
        writes.push(HealthWrite::FailingSince {
            subscriber: st.target.id.to_string(),
            since_ms: after.health.failing_since_ms,
        });
    }
    if let (None, Some(d)) = (&st.health.disabled, &after.health.disabled) {
        writes.push(HealthWrite::Disable {
            subscriber: st.target.id.to_string(),
            disabled: d.clone(),
        });
    }
    notices.extend(after.alerts.into_iter().map(|alert| Notice {
        subscriber: st.target.id.to_string(),
        at_ms,
        alert,
    }));
    st.health = after.health;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Claim;
    use fanout_core::wire::TransportError;

    /// The scenario's ledger: how many deliveries each subscriber has pending, handed out with
    /// fresh row ids when a turn claims them. (What the state is told, not a stand-in for
    /// SQLite: the ledger's own behaviour is tested against SQLite in `ledger`.)
    #[derive(Debug, Default)]
    struct Queue {
        pending: HashMap<String, usize>,
        next_rowid: i64,
    }

    impl Queue {
        fn with(subs: &[(&str, usize)]) -> Queue {
            Queue {
                pending: subs.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
                next_rowid: 1,
            }
        }

        fn answer(&mut self, turn: &Turn) -> Recorded {
            let mut claims = Vec::new();
            for (sub, n) in &turn.claims {
                let left = self.pending.entry(sub.clone()).or_default();
                let k = (*n).min(*left);
                *left -= k;
                let claimed = (0..k)
                    .map(|_| {
                        self.next_rowid += 1;
                        Claimed {
                            rowid: self.next_rowid,
                            event_id: format!("e{}", self.next_rowid),
                            event_type: "t".into(),
                            body: "{}".into(),
                            attempt: 1,
                        }
                    })
                    .collect();
                claims.push(Claim {
                    subscriber_id: sub.clone(),
                    claimed,
                    next_due_ms: (*left > 0).then_some(0),
                    not_before_ms: None,
                });
            }
            Recorded {
                claims,
                notices: turn.notices.clone(),
            }
        }
    }

    fn settings(max_total: usize) -> Settings {
        Settings {
            rules: RetryRules {
                max_attempts: 3,
                backoff_scale: 1.0,
            },
            breaker: BreakerConfig::default(),
            edge: false,
            edge_batch: 100,
            max_total_in_flight: max_total,
            alert_rules: AlertRules::default(),
        }
    }

    fn subscriber(id: &str, max_in_flight: u32) -> Subscriber {
        let mut s = crate::ledger::test_subscriber(id, &["*"]);
        s.limits.max_in_flight = max_in_flight;
        s.limits.burst = 1000;
        s.limits.rate_per_sec = 1000.0;
        s
    }

    fn on(state: &mut State, event: Event, now: i64) -> Vec<Effect> {
        state.handle(event, now, &mut || 0.0)
    }

    /// Tick and record the turn as the queue answers it; the launched deliveries by subscriber.
    fn tick(state: &mut State, q: &mut Queue, now: i64) -> Vec<(String, Vec<Meta>)> {
        let mut launched = Vec::new();
        for effect in on(state, Event::Tick, now) {
            let Effect::Record(turn) = effect else {
                panic!("a tick only records: {effect:?}");
            };
            for e in on(state, Event::Recorded(q.answer(&turn)), now) {
                if let Effect::Launch {
                    target, deliveries, ..
                } = e
                {
                    launched.push((
                        target.id.to_string(),
                        deliveries.iter().map(Meta::of).collect(),
                    ));
                }
            }
        }
        launched
    }

    fn delivered(sub: &str, metas: &[Meta], at: i64) -> Event {
        Event::Results {
            sub: Arc::from(sub),
            lane: "origin",
            items: metas
                .iter()
                .map(|m| {
                    (
                        m.clone(),
                        DeliveryResult::Delivered {
                            id: format!("dlv_{}", m.rowid),
                            status: 200,
                            latency_ms: 1,
                        },
                    )
                })
                .collect(),
            at_ms: at,
        }
    }

    /// A subscriber's 500.
    fn status_500() -> DeliveryResult {
        DeliveryResult::Failed {
            id: "d".into(),
            status: Some(500),
            retry_after_ms: None,
            response_body: None,
            error: None,
            latency_ms: Some(1),
        }
    }

    fn count(launched: &[(String, Vec<Meta>)], sub: &str) -> usize {
        launched
            .iter()
            .filter(|(s, _)| s == sub)
            .map(|(_, m)| m.len())
            .sum()
    }

    /// The watchdog, by script: a subscriber whose claims the ledger refuses again and again
    /// (short waits, for ever) is reported once, 10 s after it was first ready, and cleared
    /// by its next send; a wait stated and kept (a breaker's cool-down) and a dispatcher held
    /// by its ledger are not stalls.
    #[test]
    fn the_watchdog_reports_readiness_never_acted_on() {
        let stalls = |effects: &[Effect]| -> Option<(Vec<String>, Vec<String>)> {
            effects.iter().find_map(|e| match e {
                Effect::Stalls(r) => Some((
                    r.began.iter().map(|s| s.to_string()).collect(),
                    r.ended.iter().map(|s| s.to_string()).collect(),
                )),
                _ => None,
            })
        };
        let refused = |at: i64| Recorded {
            claims: vec![Claim {
                subscriber_id: "a".into(),
                claimed: vec![],
                next_due_ms: Some(0),
                not_before_ms: Some(at),
            }],
            notices: vec![],
        };
        let mut state = State::new(settings(100));
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
            0,
        );
        // Refused every 500 ms: ready since 0, reported at the first look past 10 s.
        let mut reported = None;
        for k in 0..30 {
            let now = k * 500;
            let mut effects = on(&mut state, Event::Tick, now);
            effects.extend(on(&mut state, Event::Recorded(refused(now + 500)), now));
            if let Some(r) = stalls(&effects) {
                reported = Some((now, r));
                break;
            }
        }
        assert_eq!(
            reported,
            Some((10_500, (vec!["a".to_string()], vec![]))),
            "reported once, 10 s after it was ready"
        );
        assert_eq!(state.stalled(10_500)[0].since_ms, 0);
        // Its next claim goes through: the send clears it.
        let mut q = Queue::with(&[("a", 3)]);
        let effects = on(&mut state, Event::Tick, 11_000);
        let [Effect::Record(turn), ..] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        let effects = on(&mut state, Event::Recorded(q.answer(turn)), 11_000);
        assert_eq!(stalls(&effects), Some((vec![], vec!["a".to_string()])));

        // A breaker open for a 30 s cool-down (a wait stated and kept), then a ledger that
        // fails for 20 s: nothing is reported.
        let mut state = State::new(Settings {
            breaker: BreakerConfig {
                threshold: 5,
                cooldown_ms: 30_000,
            },
            ..settings(100)
        });
        let mut q = Queue::with(&[("b", 100)]);
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("b", 8), LimiterState::default())]),
            0,
        );
        let out = tick(&mut state, &mut q, 0);
        let items: Vec<(Meta, DeliveryResult)> =
            out[0].1.iter().map(|m| (m.clone(), status_500())).collect();
        let mut seen = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let results = Event::Results {
                sub: Arc::from("b"),
                lane: "origin",
                items: vec![item],
                at_ms: 10 + i as i64,
            };
            on(&mut state, results, 10 + i as i64);
        }
        for now in (100..30_000).step_by(1_000) {
            let effects = on(&mut state, Event::Tick, now);
            seen.extend(stalls(&effects));
            for e in effects {
                if let Effect::Record(turn) = e {
                    seen.extend(stalls(&on(
                        &mut state,
                        Event::Recorded(q.answer(&turn)),
                        now,
                    )));
                }
            }
        }
        let breaker = state.limiter_of("b").map(|l| l.breaker);
        assert_eq!(
            breaker.and_then(|b| b.open_until_ms),
            Some(30_017),
            "{breaker:?}"
        );
        for now in (30_000..50_000).step_by(1_000) {
            let effects = on(&mut state, Event::Tick, now);
            seen.extend(stalls(&effects));
            for e in effects {
                if let Effect::Record(turn) = e {
                    let failed = TurnError {
                        turn,
                        error: crate::ledger::LedgerError::Closed,
                    };
                    seen.extend(stalls(&on(&mut state, Event::NotRecorded(failed), now)));
                }
            }
        }
        let effects = on(&mut state, Event::Tick, 50_000);
        seen.extend(stalls(&effects));
        assert_eq!(seen, vec![], "no stall reported");
    }

    /// On PostgreSQL the daemons share one limiter, which may hold less than a daemon's own
    /// copy (another daemon spent it). A claim that comes back empty because the shared
    /// limiter says wait is not asked again before then, however much new work is announced
    /// meanwhile: each announcement (one per ingest) used to cost a whole turn that got nothing.
    #[test]
    fn a_claim_the_shared_limiter_refused_waits_for_it() {
        let mut state = State::new(settings(1000));
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 10), LimiterState::default())]),
            0,
        );
        // What a tick asks for; a turn that asks nothing (a limiter to store) is recorded.
        let asks = |state: &mut State, now: i64| -> Vec<(String, usize)> {
            let asked = match on(state, Event::Tick, now).as_slice() {
                [Effect::Record(turn)] => turn.asks(),
                [] => return Vec::new(),
                other => panic!("{other:?}"),
            };
            if asked.is_empty() {
                on(state, Event::Recorded(Recorded::default()), now);
            }
            asked
        };
        assert_eq!(asks(&mut state, 10), vec![("a".to_string(), 10)]);
        let refused = Recorded {
            claims: vec![Claim {
                subscriber_id: "a".into(),
                claimed: vec![],
                next_due_ms: Some(5),
                not_before_ms: Some(510),
            }],
            notices: vec![],
        };
        assert!(on(&mut state, Event::Recorded(refused), 10).is_empty());
        for now in [20, 200, 509] {
            on(&mut state, Event::Due(vec!["a".into()]), now);
            assert_eq!(asks(&mut state, now), vec![], "asked again at {now}");
            assert_eq!(state.next_wake(now, 10_000), 510);
        }
        assert_eq!(asks(&mut state, 510), vec![("a".to_string(), 10)]);
    }

    /// Two daemons sharing a ledger each ask to claim only for the subscribers they own —
    /// together every subscriber, none twice — and wake for no other's work; when one
    /// leaves, the other looks at its subscribers at once.
    #[test]
    fn daemons_sharing_a_ledger_claim_each_for_its_own_subscribers() {
        let ids: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        let mut q = Queue::with(&ids.iter().map(|s| (s.as_str(), 5)).collect::<Vec<_>>());
        let members = vec!["a:1".to_string(), "b:1".to_string()];
        let mut daemons: Vec<State> = Vec::new();
        for me in &members {
            let mut st = State::new(settings(1000));
            let loaded = ids
                .iter()
                .map(|s| (subscriber(s, 100), LimiterState::default()));
            on(&mut st, Event::Loaded(loaded.collect()), 0);
            on(
                &mut st,
                Event::Share(Some(Share::new(me, members.clone()))),
                0,
            );
            daemons.push(st);
        }
        let mut asked: Vec<BTreeSet<String>> = Vec::new();
        for st in &mut daemons {
            let launched = tick(st, &mut q, 10);
            // Nothing of the other's is due for it: it sleeps until its next timer.
            assert_eq!(st.next_wake(10, 1_000), 1_000);
            asked.push(
                launched
                    .into_iter()
                    .map(|(s, m)| {
                        assert_eq!(m.len(), 5, "{s}: all its pending");
                        s
                    })
                    .collect(),
            );
        }
        assert!(asked[0].is_disjoint(&asked[1]), "{asked:?}");
        assert_eq!(asked[0].len() + asked[1].len(), ids.len(), "{asked:?}");
        assert!(!asked[0].is_empty() && !asked[1].is_empty(), "{asked:?}");
        // b leaves (stopped, or aged out): a takes its subscribers' new work at once.
        for s in &asked[1] {
            q.pending.insert(s.clone(), 3);
        }
        let a = &mut daemons[0];
        on(
            a,
            Event::Share(Some(Share::new("a:1", vec!["a:1".into()]))),
            20,
        );
        assert_eq!(a.next_wake(20, 1_000), 20);
        let taken: BTreeSet<String> = tick(a, &mut q, 20).into_iter().map(|(s, _)| s).collect();
        assert_eq!(taken, asked[1]);
        // Alone on its ledger (no share), a daemon owns everything.
        assert!(ids.iter().all(|s| State::new(settings(1)).owns(s)));
    }

    /// What happens to the subscriber while its sends are out.
    #[derive(Debug, Clone, Copy)]
    enum Change {
        Edit {
            max_in_flight: u32,
        },
        Delete,
        DeleteAndRecreate,
        /// Its results arrive twice.
        DuplicateResults,
    }

    /// In-flight accounting stays exact whatever happens to a subscriber while its sends are
    /// out: no cap is exceeded (the subscriber's, or the global one shared with `b`), and once
    /// every result is back no slot is held.
    #[test]
    fn in_flight_stays_exact_while_sends_are_out() {
        // (change, a's sends out when the change comes, then the most a may launch before its
        // results are back; a and b share the 2 slots left under the global cap of 10)
        let cases: &[(Change, usize, usize)] = &[
            (Change::Edit { max_in_flight: 3 }, 8, 0),
            (Change::Edit { max_in_flight: 12 }, 8, 4),
            (Change::Delete, 8, 0),
            (Change::DeleteAndRecreate, 8, 0),
            (Change::DuplicateResults, 8, 0),
        ];
        for &(change, first, a_more) in cases {
            let mut state = State::new(settings(10));
            let mut q = Queue::with(&[("a", 100), ("b", 100)]);
            let limiter = LimiterState::default();
            on(
                &mut state,
                Event::Loaded(vec![(subscriber("a", 8), limiter)]),
                0,
            );
            let out = tick(&mut state, &mut q, 0);
            assert_eq!(count(&out, "a"), first, "{change:?}: first launch");
            let a_out = out[0].1.clone();
            on(
                &mut state,
                Event::Changed {
                    id: "b".into(),
                    found: Some((subscriber("b", 8), limiter)),
                },
                1,
            );
            match change {
                Change::Edit { max_in_flight } => {
                    let found = Some((subscriber("a", max_in_flight), limiter));
                    on(
                        &mut state,
                        Event::Changed {
                            id: "a".into(),
                            found,
                        },
                        1,
                    );
                }
                Change::Delete | Change::DeleteAndRecreate => {
                    on(
                        &mut state,
                        Event::Changed {
                            id: "a".into(),
                            found: None,
                        },
                        1,
                    );
                    if matches!(change, Change::DeleteAndRecreate) {
                        let found = Some((subscriber("a", 8), LimiterState::default()));
                        on(
                            &mut state,
                            Event::Changed {
                                id: "a".into(),
                                found,
                            },
                            2,
                        );
                    }
                }
                Change::DuplicateResults => {}
            }
            let more = tick(&mut state, &mut q, 3);
            assert!(
                count(&more, "a") <= a_more,
                "{change:?}: a while its sends are out"
            );
            assert_eq!(
                count(&more, "a") + count(&more, "b"),
                2,
                "{change:?}: the global cap's last slots"
            );
            assert!(state.in_flight() <= 10, "{change:?}: global cap");
            // The results come back late (and, in one case, twice).
            on(&mut state, delivered("a", &a_out, 50), 50);
            if matches!(change, Change::DuplicateResults) {
                on(&mut state, delivered("a", &a_out, 51), 51);
            }
            let more_a: Vec<Meta> = more
                .iter()
                .filter(|(s, _)| s == "a")
                .flat_map(|(_, m)| m.clone())
                .collect();
            let b_metas: Vec<Meta> = more
                .iter()
                .filter(|(s, _)| s == "b")
                .flat_map(|(_, m)| m.clone())
                .collect();
            assert_eq!(
                state.in_flight(),
                more_a.len() + b_metas.len(),
                "{change:?}: exactly what is still out"
            );
            on(&mut state, delivered("a", &more_a, 60), 60);
            on(&mut state, delivered("b", &b_metas, 60), 60);
            assert_eq!(state.in_flight(), 0, "{change:?}: no slot leaks");
            assert_eq!(state.in_flight_of("a"), 0, "{change:?}");
            // Whatever still exists can be sent its full share again.
            let again = tick(&mut state, &mut q, 100);
            let a_cap = match change {
                Change::Edit { max_in_flight } => max_in_flight as usize,
                Change::Delete => 0,
                _ => 8,
            };
            assert!(count(&again, "a") <= a_cap, "{change:?}: a afterwards");
            assert_eq!(
                count(&again, "a") + count(&again, "b"),
                (a_cap + 8).min(10),
                "{change:?}: every slot usable afterwards"
            );
        }
    }

    /// Announcements missed while a daemon was not listening (its LISTEN connection lost, or
    /// not yet open when it loaded) are made up by loading every subscriber again: one created
    /// meanwhile is served, one removed meanwhile is not claimed for any more (its sends still
    /// out count until they come back), one unchanged keeps its sends in flight.
    #[test]
    fn loading_every_subscriber_again_makes_up_for_missed_announcements() {
        let mut state = State::new(settings(100));
        let mut q = Queue::with(&[("a", 100), ("b", 100), ("c", 100)]);
        let l = LimiterState::default();
        let loaded =
            |ids: &[&str]| Event::Loaded(ids.iter().map(|id| (subscriber(id, 4), l)).collect());
        on(&mut state, loaded(&["a", "b"]), 0);
        let out = tick(&mut state, &mut q, 0);
        let counts = |out: &[(String, Vec<Meta>)]| ["a", "b", "c"].map(|s| count(out, s));
        assert_eq!(counts(&out), [4, 4, 0]);
        // b removed and c created through another daemon; neither heard.
        on(&mut state, loaded(&["a", "c"]), 1);
        assert_eq!(state.in_flight(), 8, "b's sends still out are counted");
        let more = tick(&mut state, &mut q, 2);
        assert_eq!(counts(&more), [0, 0, 4], "a is full, b is gone, c is new");
        let b_out = out.iter().find(|(s, _)| s == "b").map(|(_, m)| m.clone());
        on(&mut state, delivered("b", &b_out.unwrap_or_default(), 3), 3);
        assert_eq!(state.in_flight(), 8);
        assert_eq!(state.in_flight_of("b"), 0);
        let later = tick(&mut state, &mut q, 4);
        assert_eq!(
            counts(&later),
            [0, 0, 0],
            "nothing for b, even with its slots free"
        );
    }

    /// Daemons sharing a ledger tell each other what they have in flight per customer: the
    /// weighted share and a customer's cap count the others' with this daemon's own, so the
    /// weights hold across the daemons (a daemon that owns only the heavy customer's endpoints
    /// gives it all its budget; the other gives the light one more) and the cap is the
    /// customer's, not each daemon's.
    #[test]
    fn the_weighted_share_and_caps_count_what_other_daemons_have_in_flight() {
        let owned = |id: &str, customer: &str| {
            let mut s = subscriber(id, 32);
            s.customer = Some(customer.into());
            (s, LimiterState::default())
        };
        // (in flight elsewhere, big's grant, small's grant); budget 10, weights 4:1, small's
        // customer capped at 8.
        type Elsewhere = &'static [(Option<&'static str>, usize)];
        let cases: &[(Elsewhere, usize, usize)] = &[
            (&[], 8, 2),
            (&[(Some("big"), 10)], 6, 4),
            (&[(Some("big"), 40), (Some("small"), 4)], 6, 4),
            (&[(Some("big"), 40), (Some("small"), 7)], 9, 1),
            (&[(Some("small"), 8), (None, 30)], 10, 0),
        ];
        for &(elsewhere, big, small) in cases {
            let mut state = State::new(settings(10));
            let mut q = Queue::with(&[("b1", 100), ("s1", 100)]);
            on(
                &mut state,
                Event::Customers(vec![("big".into(), 4, None), ("small".into(), 1, Some(8))]),
                0,
            );
            on(
                &mut state,
                Event::Loaded(vec![owned("b1", "big"), owned("s1", "small")]),
                0,
            );
            let told = elsewhere
                .iter()
                .map(|(c, n)| (c.map(str::to_string), *n))
                .collect();
            on(&mut state, Event::Elsewhere(told), 0);
            let out = tick(&mut state, &mut q, 0);
            assert_eq!(
                (count(&out, "b1"), count(&out, "s1")),
                (big, small),
                "elsewhere {elsewhere:?}"
            );
            assert_eq!(
                state.in_flight_by_customer(),
                vec![
                    (Some("big".to_string()), big),
                    (Some("small".to_string()), small)
                ]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect::<Vec<_>>(),
                "what this daemon tells the others"
            );
        }
    }

    /// A turn the ledger could not record comes back whole: its results go first into the next
    /// turn (none lost, none twice), its health changes and alerts too, and the tokens its claims
    /// reserved are given back exactly.
    #[test]
    fn a_turn_not_recorded_is_retried_whole() {
        let mut state = State::new(settings(100));
        let mut q = Queue::with(&[("a", 3)]);
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
            0,
        );
        let out = tick(&mut state, &mut q, 0);
        let metas = out[0].1.clone();
        assert_eq!(metas.len(), 3);
        // Two results, one failing (a health change), then the turn that records them fails.
        on(&mut state, delivered("a", &metas[..1], 10), 10);
        on(
            &mut state,
            Event::Results {
                sub: Arc::from("a"),
                lane: "origin",
                items: vec![(metas[1].clone(), status_500())],
                at_ms: 10,
            },
            10,
        );
        q.pending.insert("a".into(), 5);
        on(&mut state, Event::Due(vec!["a".into()]), 10);
        let limiter_before = state.limiter_of("a");
        let effects = on(&mut state, Event::Tick, 20);
        let [Effect::Record(turn)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(turn.outcomes.len(), 2);
        assert_eq!(turn.health.len(), 1);
        assert_eq!(turn.claims, vec![("a".to_string(), 7)]);
        let first = turn.clone();
        on(
            &mut state,
            Event::NotRecorded(TurnError {
                turn: first.clone(),
                error: crate::ledger::LedgerError::Closed,
            }),
            20,
        );
        // The reserved tokens are back: the limiter is as before the tick, refilled to 20.
        let mut expected = limiter_before.unwrap_or_default();
        let _ = expected.plan(
            subscriber("a", 8).limits.core(BreakerConfig::default()),
            1,
            20,
            0,
        );
        assert_eq!(state.limiter_of("a"), Some(expected), "tokens given back");
        assert_eq!(state.in_flight(), 1, "nothing launched");
        // Nothing is retried before the ledger's retry time; then the same writes go first.
        assert!(on(&mut state, Event::Tick, 21).is_empty());
        on(&mut state, delivered("a", &metas[2..], 22), 22);
        let effects = on(&mut state, Event::Tick, 20 + LEDGER_RETRY_MS);
        let [Effect::Record(retried)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        let rowids: Vec<i64> = retried.outcomes.iter().map(|o| o.rowid).collect();
        assert_eq!(rowids, vec![metas[0].rowid, metas[1].rowid, metas[2].rowid]);
        assert_eq!(retried.outcomes[..2], first.outcomes[..]);
        assert_eq!(retried.health[..1], first.health[..]);
        assert_eq!(retried.claims, vec![("a".to_string(), 8)]);
        let launched = on(
            &mut state,
            Event::Recorded(q.answer(retried)),
            20 + LEDGER_RETRY_MS,
        );
        assert_eq!(launched.len(), 1);
        assert_eq!(state.in_flight(), 5);
        // Everything was recorded once: the next turn carries no result again.
        let effects = on(&mut state, Event::Tick, 21 + LEDGER_RETRY_MS);
        let [Effect::Record(next)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert!(
            next.outcomes.is_empty() && next.health.is_empty(),
            "{next:?}"
        );
    }

    fn unsendable(sub: &str, meta: &Meta) -> Event {
        Event::Unsendable {
            sub: Arc::from(sub),
            lane: "origin",
            items: vec![meta.clone()],
            error: "the subscriber has no usable signing secret".into(),
        }
    }

    /// A delivery the daemon itself cannot send counts attempts like a failed send and goes
    /// dead at the limit with the reason; the subscriber's limiter and health are untouched,
    /// and the dispatcher goes on sending the others.
    #[test]
    fn poison_goes_dead_after_the_attempt_limit() {
        let mut state = State::new(settings(100));
        let mut q = Queue::with(&[("a", 2)]);
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
            0,
        );
        let out = tick(&mut state, &mut q, 0);
        let (poison, good) = (out[0].1[0].clone(), out[0].1[1].clone());
        let limiter = state.limiter_of("a");
        // (attempt, expected transition)
        let cases: Vec<(u32, Transition)> = vec![
            (
                1,
                Transition::Retry {
                    at_ms: 1_000 + 1_000,
                    error: "not sent: the subscriber has no usable signing secret".into(),
                },
            ),
            (
                3,
                Transition::Dead {
                    reason: "gave up after 3 attempts; last: not sent: the subscriber has no usable signing secret".into(),
                },
            ),
        ];
        for (attempt, expected) in cases {
            let mut state = State::new(settings(100));
            let mut q = Queue::with(&[("a", 1)]);
            on(
                &mut state,
                Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
                0,
            );
            let out = tick(&mut state, &mut q, 0);
            let mut meta = out[0].1[0].clone();
            meta.attempt = attempt;
            on(&mut state, unsendable("a", &meta), 1_000);
            let effects = on(&mut state, Event::Tick, 1_000);
            let [Effect::Record(turn)] = effects.as_slice() else {
                panic!("{effects:?}");
            };
            assert_eq!(turn.outcomes.len(), 1);
            assert_eq!(turn.outcomes[0].transition, expected, "attempt {attempt}");
            let rec = turn.outcomes[0]
                .attempt
                .as_ref()
                .map(|a| (a.attempt, a.outcome));
            assert_eq!(
                rec,
                Some((attempt, "failed")),
                "attempt {attempt} is recorded"
            );
            assert!(turn.health.is_empty(), "not the subscriber's failure");
            let alerts: Vec<&str> = turn.notices.iter().map(|n| n.alert.kind()).collect();
            let dead = matches!(expected, Transition::Dead { .. });
            assert_eq!(
                alerts,
                if dead {
                    vec!["fanout.delivery.not_sent"]
                } else {
                    vec![]
                },
                "attempt {attempt}: an alert when it goes dead"
            );
            assert_eq!(state.in_flight(), 0);
        }
        // In the first state: the poison fails, the good one is delivered, both recorded.
        on(&mut state, unsendable("a", &poison), 5);
        on(&mut state, delivered("a", &[good], 5), 5);
        assert_eq!(
            state.limiter_of("a").map(|l| l.breaker),
            limiter.map(|l| l.breaker)
        );
        assert_eq!(state.in_flight(), 0);
    }

    fn edge_settings() -> Settings {
        Settings {
            edge: true,
            edge_batch: 8,
            ..settings(100)
        }
    }

    fn edge_failed(sub: &str, metas: &[Meta], failure: EdgeFailure) -> Event {
        Event::EdgeFailed {
            sub: Arc::from(sub),
            items: metas.to_vec(),
            failure,
        }
    }

    /// Launch a's due work on the edge lane and the call sizes asked for.
    fn edge_tick(state: &mut State, q: &mut Queue, now: i64) -> (Vec<Meta>, usize) {
        let mut metas = Vec::new();
        let mut per = 0;
        for effect in on(state, Event::Tick, now) {
            let Effect::Record(turn) = effect else {
                continue;
            };
            for e in on(state, Event::Recorded(q.answer(&turn)), now) {
                if let Effect::Launch {
                    deliveries,
                    per_call,
                    ..
                } = e
                {
                    metas.extend(deliveries.iter().map(Meta::of));
                    per = per_call;
                }
            }
        }
        (metas, per)
    }

    /// The edge's breaker defers with the wait until its probe is presumed lost; the probe's
    /// success (delivered in an earlier call, answered later) ends that wait: the backlog goes
    /// at once, not a cool-down later. (The origin's own breaker never opened here: it cannot
    /// tell.)
    #[test]
    fn an_edge_breaker_wait_ends_with_a_delivery() {
        let mut state = State::new(edge_settings());
        let mut q = Queue::with(&[("a", 10)]);
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 2), LimiterState::default())]),
            0,
        );
        let (metas, _) = edge_tick(&mut state, &mut q, 0);
        assert_eq!(metas.len(), 2);
        let deferred = Event::Results {
            sub: Arc::from("a"),
            lane: "edge",
            items: vec![(
                metas[1].clone(),
                DeliveryResult::Deferred {
                    id: "d".into(),
                    retry_after_ms: 30_000,
                    reason: DeferReason::BreakerOpen,
                },
            )],
            at_ms: 10,
        };
        on(&mut state, deferred, 10);
        on(&mut state, Event::Tick, 10);
        on(&mut state, Event::Recorded(Recorded::default()), 10);
        assert_eq!(
            state.next_wake(10, 100_000),
            30_010,
            "the edge's wait holds"
        );
        let mut probe = delivered("a", &metas[..1], 50);
        if let Event::Results { lane, .. } = &mut probe {
            *lane = "edge";
        }
        on(&mut state, probe, 50);
        on(&mut state, Event::Tick, 50);
        on(&mut state, Event::Recorded(Recorded::default()), 50);
        assert_eq!(state.next_wake(50, 100_000), 50, "the backlog goes at once");
        let (next, _) = edge_tick(&mut state, &mut q, 50);
        assert_eq!(next.len(), 2);
    }

    /// A batch the edge refuses with a 4xx that retrying cannot change is split until one
    /// delivery is refused alone; that one counts attempts and goes dead with the edge's error.
    /// A transient failure defers without spending an attempt. Every delivery put back has a
    /// due time.
    #[test]
    fn edge_refusals_split_then_count_attempts() {
        let mut state = State::new(edge_settings());
        let mut q = Queue::with(&[("a", 8)]);
        let mut sub = subscriber("a", 8);
        sub.lane = Lane::Edge;
        on(
            &mut state,
            Event::Loaded(vec![(sub, LimiterState::default())]),
            0,
        );
        let refused = || EdgeFailure::Refused {
            status: 413,
            error: "payload_too_large: too big".into(),
        };
        let (metas, per) = edge_tick(&mut state, &mut q, 0);
        assert_eq!((metas.len(), per), (8, 6));
        // The whole call refused: its deliveries go back due now, and are sent again in calls
        // half as big — however the answers of other calls are ordered — until alone.
        let claimed: Vec<Claimed> = metas
            .iter()
            .map(|m| Claimed {
                rowid: m.rowid,
                event_id: m.event_id.clone(),
                event_type: m.event_type.clone(),
                body: "{}".into(),
                attempt: m.attempt,
            })
            .collect();
        let relaunch = |state: &mut State, rows: &[Claimed], now: i64| -> Vec<(usize, usize)> {
            let effects = on(state, Event::Tick, now);
            let [Effect::Record(turn)] = effects.as_slice() else {
                panic!("{effects:?}");
            };
            let deferred: Vec<&Outcome> = turn
                .outcomes
                .iter()
                .filter(|o| matches!(o.transition, Transition::Defer { .. }))
                .collect();
            assert_eq!(deferred.len(), rows.len());
            assert!(deferred
                .iter()
                .all(|o| o.transition == Transition::Defer { at_ms: now } && o.attempt.is_none()));
            // Claimed again, with a newcomer that was never refused.
            let mut again = rows.to_vec();
            again.push(Claimed {
                rowid: 1_000 + now,
                ..rows[0].clone()
            });
            let recorded = Recorded {
                claims: vec![Claim {
                    subscriber_id: "a".into(),
                    claimed: again,
                    next_due_ms: None,
                    not_before_ms: None,
                }],
                notices: vec![],
            };
            on(state, Event::Recorded(recorded), now)
                .iter()
                .filter_map(|e| match e {
                    Effect::Launch {
                        deliveries,
                        per_call,
                        ..
                    } => Some((deliveries.len(), *per_call)),
                    _ => None,
                })
                .collect()
        };
        on(&mut state, edge_failed("a", &metas, refused()), 10);
        assert_eq!(
            relaunch(&mut state, &claimed, 10),
            vec![(1, 6), (8, 4)],
            "the newcomer as usual, the refused 8 in calls of 4"
        );
        // The half without the culprit is delivered (answered last, say); the other half is
        // refused again: calls of 2.
        let half: Vec<Meta> = metas[..4].to_vec();
        let newcomer = Meta {
            rowid: 1_010,
            ..metas[0].clone()
        };
        on(&mut state, delivered("a", &[newcomer], 25), 25);
        on(&mut state, edge_failed("a", &half, refused()), 30);
        on(&mut state, delivered("a", &metas[4..], 30), 30);
        assert_eq!(
            relaunch(&mut state, &claimed[..4], 30),
            vec![(1, 6), (4, 2)],
            "the refused 4 in calls of 2"
        );
        let metas = half;
        // One delivery refused alone: a failed attempt with the edge's status and error.
        on(&mut state, edge_failed("a", &metas[..1], refused()), 40);
        // A transient failure: deferred with a due time, no attempt.
        on(
            &mut state,
            edge_failed(
                "a",
                &metas[1..2],
                EdgeFailure::Transient {
                    error: "edge answered 503".into(),
                },
            ),
            40,
        );
        // The last attempt refused: dead with the edge's error.
        let mut last = metas[2].clone();
        last.attempt = 3;
        on(&mut state, edge_failed("a", &[last], refused()), 40);
        let effects = on(&mut state, Event::Tick, 40);
        let turn = effects
            .iter()
            .find_map(|e| match e {
                Effect::Record(t) => Some(t),
                _ => None,
            })
            .unwrap();
        let got: Vec<(Transition, Option<Option<u16>>)> = turn
            .outcomes
            .iter()
            .map(|o| (o.transition.clone(), o.attempt.as_ref().map(|a| a.status)))
            .collect();
        let error = "edge refused the delivery: status 413: payload_too_large: too big";
        assert_eq!(
            got,
            vec![
                (
                    Transition::Retry {
                        at_ms: 40 + 1_000,
                        error: error.into()
                    },
                    Some(Some(413))
                ),
                (Transition::Defer { at_ms: 40 + 500 }, None),
                (
                    Transition::Dead {
                        reason: format!("gave up after 3 attempts; last: {error}")
                    },
                    Some(Some(413))
                ),
            ]
        );
        assert_eq!(
            turn.dead,
            vec!["a".to_string()],
            "its dead count is checked"
        );
        // An endpoint the edge refuses: dead at once, every delivery.
        let ep = EdgeFailure::EndpointRefused {
            error: "private address".into(),
        };
        on(&mut state, edge_failed("a", &metas[3..], ep), 50);
        let late = Meta {
            rowid: 1_030,
            ..metas[0].clone()
        };
        on(&mut state, delivered("a", &[late], 50), 50);
        assert_eq!(state.in_flight(), 0);
    }

    #[test]
    fn edge_calls_per_grant_table() {
        // (granted, cap) -> per call
        let cases: &[(usize, usize, usize)] = &[
            (1, 100, 6),
            (16, 100, 6),
            (24, 100, 6),
            (25, 100, 7),
            (100, 100, 25),
            (500, 100, 100),
            (500, 20, 20),
            (16, 4, 4),
            (0, 100, 6),
            (10, 0, 1),
        ];
        for &(n, cap, expected) in cases {
            assert_eq!(edge_per_call(n, cap), expected, "{n} granted, cap {cap}");
        }
    }

    /// Backoff comes from the clock the test moves: a 500 at t is retried at t + 1 s (jitter
    /// 0), a timeout likewise, and the tick before that time sends nothing.
    #[test]
    fn retries_wait_for_the_clock() {
        let mut state = State::new(settings(100));
        let mut q = Queue::with(&[("a", 1)]);
        on(
            &mut state,
            Event::Loaded(vec![(subscriber("a", 8), LimiterState::default())]),
            0,
        );
        let out = tick(&mut state, &mut q, 0);
        let failed = DeliveryResult::Failed {
            id: "d".into(),
            status: None,
            retry_after_ms: None,
            response_body: None,
            error: Some(TransportError::Timeout),
            latency_ms: Some(1),
        };
        on(
            &mut state,
            Event::Results {
                sub: Arc::from("a"),
                lane: "origin",
                items: vec![(out[0].1[0].clone(), failed)],
                at_ms: 5_000,
            },
            5_000,
        );
        let effects = on(&mut state, Event::Tick, 5_000);
        let [Effect::Record(turn)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(
            turn.outcomes[0].transition,
            Transition::Retry {
                at_ms: 6_000,
                error: "timeout".into()
            }
        );
        on(&mut state, Event::Recorded(Recorded::default()), 5_000);
        assert_eq!(state.next_wake(5_001, 100_000), 6_000);
    }
}
