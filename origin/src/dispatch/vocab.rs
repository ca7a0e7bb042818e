//! The dispatcher's vocabulary: what the executor tells the state ([`Event`]), what the state
//! decides ([`Effect`]), what the API tells the dispatcher ([`Control`]), and the data they
//! carry (a send's [`Target`], a delivery out as [`Meta`], a send's [`Attempted`] result).
//! The lane travels as [`Lane`], never as a string; a stored row gets its text from
//! `Lane::as_str` where it is written.
//!
//! Pure data and constructors: nothing here decides, reads a clock or does I/O.

use std::sync::Arc;

use fanout_core::batch::BatchSpec;
use fanout_core::breaker::BreakerState;
use fanout_core::limiter::LimiterState;
use fanout_core::retry::{result_for, Attempt};
use fanout_core::wire::DeliveryResult;

use super::plan::attempt_of;
use crate::alert::Notice;
use crate::keyring::Keyring;
pub use crate::ledger::{Recorded, Turn, TurnError};
pub use crate::model::Lane;
use crate::model::{Claimed, InFlight, Limits, Payload, Scheme, Share, Subscriber};

/// Messages to the dispatcher from the API (the executor hands each to the state as
/// [`Event::Control`]).
#[derive(Debug, Clone, PartialEq)]
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

/// What a send needs to know about its subscriber, as of the claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub id: Arc<str>,
    pub url: Arc<str>,
    pub limits: Limits,
    /// The lane actually used (`Edge` or `Origin`), chosen once by the state.
    pub lane: Lane,
    pub legacy_signature: bool,
    /// Its secrets and signing keys, parsed once when it was loaded (`crate::keyring`).
    pub keyring: Keyring,
    /// Which of them sign: `v1`, `v1a` or both.
    pub signature: Scheme,
    /// Its customer, whose weight sets its group's share (`super::fair`).
    pub customer: Option<Arc<str>>,
    /// Its webhooks' body: the event's or a thin one (`crate::payload`).
    pub payload: Payload,
    /// Ordered (`crate::ordering`): a delivery that ends releases its key's next one, so a
    /// result asks for a claim at once, recorded in the same turn (no wait for a wake-up).
    pub ordered: bool,
    /// Its webhooks carry `traceparent` (`crate::trace`).
    pub propagate_trace: bool,
    /// Several events per request (`fanout_core::batch`); `None`: one per request.
    pub batch: Option<BatchSpec>,
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

/// One delivery's send as its lane made it: the result as the edge's wire speaks it (what
/// metrics, logs and the attempts table show) and the attempt it was (what the limiter, the
/// breaker and the alerts count; `None` when nothing was sent: a deferral).
#[derive(Debug, Clone, PartialEq)]
pub struct Attempted {
    pub result: DeliveryResult,
    pub attempt: Option<Attempt>,
}

impl Attempted {
    /// An attempt the daemon made itself (the origin lane): kept as made, with its result.
    pub fn made(
        delivery_id: &str,
        attempt: Attempt,
        latency_ms: u64,
        body: Option<&str>,
    ) -> Attempted {
        Attempted {
            result: result_for(delivery_id, &attempt, latency_ms, body),
            attempt: Some(attempt),
        }
    }

    /// A result another party reports (the edge): the attempt it stands for.
    pub fn reported(result: DeliveryResult) -> Attempted {
        Attempted {
            attempt: attempt_of(&result),
            result,
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
    /// The executor starts: the state asks for the customers and every subscriber.
    Start,
    /// The executor woke (a deadline, a message, a result): the periodic work that is due
    /// (the lease sweep, the rescan, the share), the first time all of it but the sweep.
    Timers,
    /// Look at the queue: lease what may be sent now and record what is unrecorded.
    Tick,
    /// Record what is unrecorded now, claiming nothing (shutdown, before a rescan).
    Flush,
    /// The executor stops: leave the share, then drain what is in flight for a while.
    Stop,
    /// A message from the API.
    Control(Control),
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
    /// Results of one launch's deliveries, sent by `lane`, back at `at_ms`.
    Results {
        sub: Arc<str>,
        lane: Lane,
        items: Vec<(Meta, Attempted)>,
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
        lane: Lane,
        items: Vec<Meta>,
        error: String,
    },
    /// The ledger recorded the turn.
    Recorded(Recorded),
    /// The ledger could not record the turn: it comes back whole.
    NotRecorded(TurnError),
}

/// A read of the ledger the state asks for, and the event that answers it.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// `dispatch_customers`: answered by [`Event::Customers`].
    Customers,
    /// `dispatch_subscribers`: answered by [`Event::Loaded`].
    Subscribers,
    /// `dispatch_subscriber`: answered by [`Event::Changed`].
    Subscriber(String),
    /// `due_work` (re-arming dead-count alerts under `dead_threshold`): answered by
    /// [`Event::DueWork`].
    DueWork { dead_threshold: u64 },
}

/// What the executor must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Record this turn (one transaction) and answer with `Recorded` or `NotRecorded`.
    Record(Turn),
    /// Send these leased deliveries by `target.lane`, each of `sends` one request: a
    /// delivery's own webhook, or a batching subscriber's (`target.batch`) request carrying
    /// several (`fanout_core::batch`). Edge calls carry at most `per_call` requests each, and
    /// all of them go at once.
    Launch {
        target: Arc<Target>,
        sends: Vec<Vec<Claimed>>,
        per_call: usize,
        /// When the state leased them: a send that would start long after is not made
        /// (`launch::LATE_START_MS`).
        at_ms: i64,
    },
    /// Tell the operator.
    Raise(Vec<Notice>),
    /// The stalled subscribers changed (the watchdog, `State::stalled`): log those that
    /// began (once each), count them, and show the whole set.
    Stalls(StallReport),
    /// Read the ledger and answer with the event [`Read`] names.
    Read(Read),
    /// Return leases that expired before `now_ms` to the queue
    /// (`DispatchLedger::release_expired_leases`); answer with [`Event::Due`] of the
    /// subscribers concerned.
    SweepLeases { now_ms: i64 },
    /// A turn failed and may have been written all the same (on PostgreSQL a commit whose
    /// answer the connection lost): leases this daemon holds in the ledger other than `held`
    /// (every delivery it has out or has a result for) go back to the queue, due at `now_ms`
    /// (`DispatchLedger::release_strays`); answer with [`Event::Due`] of the subscribers
    /// concerned. Without it, such a lease is renewed for as long as the daemon lives and its
    /// delivery is never sent.
    ReleaseStrays { held: Vec<i64>, now_ms: i64 },
    /// Write that this dispatcher is alive with `in_flight` out per customer and read who
    /// shares the ledger (`DispatchLedger::share`); answer with [`Event::Share`], then
    /// [`Event::Elsewhere`]. On failure the last share stays.
    Share { in_flight: InFlight },
    /// Stop claiming: the other daemons take this one's subscribers now
    /// (`DispatchLedger::leave`). No answer.
    Leave,
    /// This subscriber asks for the edge lane and no edge is configured: it uses the origin
    /// lane (tell the operator).
    NoEdge { subscriber: Arc<str> },
}

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
