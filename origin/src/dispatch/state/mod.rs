//! The dispatcher's state machine: every per-subscriber figure (limiter, in-flight sends, due
//! work, health), every decision and every deadline, with no I/O. It takes [`Event`]s — a
//! tick, results, an edge call that failed, a turn the ledger recorded or handed back, the
//! ledger's answers to reads, control messages — and returns [`Effect`]s as data: record this
//! turn, launch these sends, read this, sweep the leases, refresh the share, raise these
//! alerts. The executor (`super::executor`) carries effects out, feeds their answers back as
//! events, and sleeps until [`State::deadline`].
//!
//! It does NOT read a clock, draw randomness, do I/O or wait on anything: time and jitter are
//! arguments, so tests move the clock instead of sleeping (`tables`, `super::simulation`).
//!
//! Split by concern: `subs` (what is known of subscribers, customers and the share),
//! `claims` (turns: reserving, fair shares, leasing, recording), `results` (what a send's
//! result does), `watch` (the stall watchdog), `timers` (periodic work, control messages,
//! shutdown).
//!
//! Invariants (each a table in `tables`):
//! - Every send (a leased delivery, or a batching subscriber's batch of them: one request) is
//!   counted in flight exactly once, from its claim to its first result, against its
//!   subscriber's `max_in_flight` and the global cap — also when the
//!   subscriber is edited, removed or re-created meanwhile (a removed subscriber is remembered
//!   until its last send is back) and when a result arrives late or twice.
//! - The global in-flight budget is shared weighted between customers, round-robin within.
//! - A turn the ledger could not record comes back whole and is retried first; its results are
//!   never dropped, and the limiter tokens it reserved are released exactly.
//! - At most one turn is being recorded at a time.
//! - A breaker that opened holds its subscriber until its cool-down; a `Retry-After` pause is
//!   kept, never shortened.
//! - A daemon that shares its ledger asks to claim only for the subscribers it owns
//!   ([`Share`]), and wakes for no other's due work.
//! - Leases are swept, the queue re-read and the share refreshed on the state's deadlines.
//! - The watchdog reports a subscriber ready to send and not sent to for 10 s, once.

mod claims;
mod results;
mod subs;
mod timers;
mod watch;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::{LimiterState, Reservation};

use super::plan::RetryRules;
use super::vocab::{Effect, Event, Target};
use crate::alert::{AlertRules, Notice};
use crate::model::{Health, HealthWrite, InFlight, Outcome, Share};

pub use claims::edge_per_call;
pub use timers::{
    DRAIN_MS, RESCAN_EVERY_MS, SHARE_EVERY_MS, SHUTDOWN_FLUSHES, SHUTDOWN_FLUSH_EVERY_MS,
    SWEEP_EVERY_MS,
};
pub use watch::STALL_MARGIN_MS;

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
    /// Most sends in flight across all subscribers (a batch is one).
    pub max_total_in_flight: usize,
    /// `--event-url`: a thin body's `url` (its length counts toward a batch's bytes).
    pub event_url: Option<crate::payload::EventUrl>,
    pub alert_rules: AlertRules,
}

/// What the state keeps about one subscriber.
#[derive(Debug, Clone)]
pub(super) struct Sub {
    target: Arc<Target>,
    limiter: LimiterState,
    limiter_dirty: bool,
    /// Its sends out now (each also in `State::out`; a batch is one, its other deliveries in
    /// `State::members`).
    in_flight: u32,
    /// A batching subscriber's deliveries per request, as last found to fit its `max_bytes`
    /// (0: `max_events`): what a claim asks per request.
    batch_per: usize,
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
    /// A batching subscriber's deliveries per request now (`None`: one event per request).
    pub(super) fn per_request(&self) -> Option<usize> {
        let most = self.target.batch?.max_events.max(1) as usize;
        Some(match self.batch_per {
            0 => most,
            n => n.min(most),
        })
    }

    pub(super) fn new(
        target: Arc<Target>,
        limiter: LimiterState,
        health: Health,
        mine: bool,
    ) -> Sub {
        Sub {
            target,
            limiter,
            limiter_dirty: false,
            in_flight: 0,
            batch_per: 0,
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

    pub(super) fn due_at(&mut self, at_ms: i64) {
        self.next_due = Some(self.next_due.map_or(at_ms, |d| d.min(at_ms)));
    }
}

/// Whether a daemon under `share` claims for `id`: alone (`None`), for every subscriber.
pub(super) fn owned(share: Option<&Share>, id: &str) -> bool {
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
    /// Every send out, by the row id of its (first) delivery, with its subscriber: one slot each.
    out: HashMap<i64, Arc<str>>,
    /// The other deliveries of each batch out, by row id, with their subscriber: no slot.
    members: HashMap<i64, Arc<str>>,
    /// The deliveries of ordered batches out: their results keep one head per key.
    runs: results::Runs,
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
    /// A turn failed since the last one recorded: it may have been written all the same
    /// (`Effect::ReleaseStrays` after the next recorded turn).
    strays: bool,
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
    /// The periodic work's deadlines (`None` until the first [`Event::Timers`]).
    timers: Option<timers::Timers>,
    /// Subscribers whose work is due once the rescan under way is read (a replay).
    due_after_rescan: Vec<String>,
    /// Stopping: results of sends in flight are waited for until then.
    drain_until: Option<i64>,
}

impl State {
    pub fn new(cfg: Settings) -> State {
        State {
            cfg,
            subs: HashMap::new(),
            order: Vec::new(),
            rr: 0,
            out: HashMap::new(),
            members: HashMap::new(),
            runs: results::Runs::default(),
            customers: HashMap::new(),
            suspects: HashMap::new(),
            unrecorded: Vec::new(),
            unrecorded_due: HashMap::new(),
            health: Vec::new(),
            dead: BTreeSet::new(),
            notices: Vec::new(),
            recording: false,
            strays: false,
            ledger_failures: 0,
            ledger_retry_at: 0,
            share: None,
            elsewhere: HashMap::new(),
            stalls_reported: BTreeSet::new(),
            watched_at: 0,
            timers: None,
            due_after_rescan: Vec::new(),
            drain_until: None,
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

    /// Sends out now, across all subscribers (a batch is one).
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
            Event::Start => timers::start(),
            Event::Timers => self.on_timers(now),
            Event::Tick => self.turn(now, true),
            Event::Flush => self.turn(now, false),
            Event::Stop => self.on_stop(now),
            Event::Control(c) => self.on_control(c, now),
            Event::Loaded(subs) => self.on_loaded(subs, now),
            Event::Changed { id, found } => match found {
                Some((s, limiter)) => self.upsert(s, limiter, now),
                None => {
                    self.remove(&id);
                    Vec::new()
                }
            },
            Event::Share(share) => {
                self.on_share(share, now);
                Vec::new()
            }
            Event::Elsewhere(all) => {
                self.on_elsewhere(all);
                Vec::new()
            }
            Event::Customers(all) => {
                self.customers = all.into_iter().map(|(id, w, cap)| (id, (w, cap))).collect();
                Vec::new()
            }
            Event::Due(ids) => {
                self.on_due(&ids, now);
                Vec::new()
            }
            Event::DueWork(due) => {
                self.on_due_work(due, now);
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

    /// When the executor must next tick on its own for the subscribers' work, at the latest
    /// `latest` (a result or a control message wakes it sooner).
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

    /// When the executor must next wake on its own: for the subscribers' work or the periodic
    /// work, whichever comes first.
    pub fn deadline(&self, now: i64) -> i64 {
        let latest = self
            .timers
            .as_ref()
            .map_or(now + SHARE_EVERY_MS, |t| t.earliest());
        self.next_wake(now, latest)
    }
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod edge_tests;
#[cfg(test)]
mod tables;
#[cfg(test)]
mod tests;
