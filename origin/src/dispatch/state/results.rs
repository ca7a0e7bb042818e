//! What a send's result does: its slot freed exactly once, the transition and attempt
//! recorded, the limiter, breaker, pause and health told of the attempt the lane made, an
//! edge call's failure turned into waits, splits or dead deliveries, and the daemon's own
//! failures counted as attempts. It does NOT claim or launch (`claims`).

use std::collections::HashMap;
use std::sync::Arc;

use fanout_core::retry::{next_step, Class, Next};
use fanout_core::wire::{DeferReason, DeliveryResult};

use super::{State, Sub};
use crate::alert::rules::{after_attempt, AfterAttempt, Alert, Seen};
use crate::alert::Notice;
use crate::dispatch::plan::{attempt_record, edge_retry_ms, transition_for};
use crate::dispatch::vocab::{Attempted, EdgeFailure, Lane, Meta};
use crate::model::{delivery_public_id, AttemptRecord, HealthWrite, Outcome, Transition};
use crate::ordering::HELD_MS;

impl State {
    /// A delivery's send is over at `at_ms` (answered, failed, handed back): free its slot,
    /// exactly once, after bringing its limiter up to then under the room that held while the
    /// send was open (`LimiterState::settle`). `false` when it was not out (a second or stale
    /// result), which is then ignored.
    pub(super) fn returned(&mut self, rowid: i64, at_ms: i64) -> bool {
        let Some(sub) = self.out.remove(&rowid) else {
            // Another delivery of a batch: its send's slot is its first delivery's.
            return self.members.remove(&rowid).is_some();
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

    pub(super) fn push_outcome(&mut self, sub: &Arc<str>, mut outcome: Outcome) {
        let waits = matches!(
            outcome.transition,
            Transition::Retry { .. } | Transition::Defer { .. }
        );
        if self.runs.holds(outcome.rowid, waits) {
            // A later delivery of an ordered request that waits: held behind the first that
            // does, its key's head (one head per key; released in order when it ends).
            match &mut outcome.transition {
                Transition::Retry { at_ms, .. } | Transition::Defer { at_ms } => *at_ms = HELD_MS,
                _ => {}
            }
        }
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

    pub(super) fn on_results(
        &mut self,
        sub: &Arc<str>,
        lane: Lane,
        items: Vec<(Meta, Attempted)>,
        at_ms: i64,
        now: i64,
        jitter: &mut dyn FnMut() -> f64,
    ) {
        let rules = self.cfg.rules;
        let alert_rules = self.cfg.alert_rules;
        let breaker = self.cfg.breaker;
        if lane == Lane::Edge {
            if let Some(st) = self.subs.get_mut(sub) {
                st.edge_failures = 0;
            }
        }
        for (meta, Attempted { result, attempt }) in items {
            if !self.returned(meta.rowid, at_ms) {
                continue;
            }
            self.suspects.remove(&meta.rowid);
            let transition = transition_for(&result, meta.attempt, rules, at_ms, jitter());
            if let Some(st) = self.subs.get_mut(sub).filter(|s| !s.removed) {
                if let Some(a) = &attempt {
                    let limits = st.target.limits.core(breaker);
                    let before = st.limiter.breaker;
                    st.limiter.record(limits, a, at_ms);
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
                        attempt: a,
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
                if st.target.ordered
                    && matches!(transition, Transition::Sent | Transition::Dead { .. })
                {
                    // Its key's next delivery is released by the turn that records this: the
                    // same turn claims it.
                    st.due_at(now);
                }
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

    pub(super) fn on_edge_failed(
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
        // A batching subscriber's call is split by the state's next cut, not by suspects: its
        // refused call is each event's failed attempt (backoff, dead at the limit).
        let batching = self.subs.get(sub).is_some_and(|s| s.target.batch.is_some());
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
            EdgeFailure::Refused { status, error } if items.len() > 1 && !batching => {
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
                self.fail_attempts(sub, Lane::Edge, items, &text, Some(status), now, jitter);
            }
        }
    }

    pub(super) fn on_unsendable(
        &mut self,
        sub: &Arc<str>,
        lane: Lane,
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
        lane: Lane,
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
                lane: lane.as_str(),
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

/// The deliveries of the ordered requests out (`State::launch_batched`), each with its
/// request's first: a request is a run of one key in order, and its results must leave the key
/// one head. Results arrive in the request's order; the first that waits (retried, deferred)
/// keeps its time and becomes the head, every later one that waits is held behind it.
#[derive(Debug, Default)]
pub(super) struct Runs {
    lead_of: HashMap<i64, i64>,
    /// By first delivery: the results still to come, and whether one already waits.
    open: HashMap<i64, (usize, bool)>,
}

impl Runs {
    pub(super) fn open(&mut self, lead: i64, rows: impl Iterator<Item = i64>) {
        let mut n = 0;
        for rowid in rows {
            self.lead_of.insert(rowid, lead);
            n += 1;
        }
        self.open.insert(lead, (n, false));
    }

    /// A result of `rowid` that `waits` or not: whether it is held (a run's later delivery
    /// waiting behind an earlier one that waits).
    pub(super) fn holds(&mut self, rowid: i64, waits: bool) -> bool {
        let Some(lead) = self.lead_of.remove(&rowid) else {
            return false;
        };
        let Some((left, headed)) = self.open.get_mut(&lead) else {
            return false;
        };
        let held = waits && *headed;
        *headed |= waits;
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.open.remove(&lead);
        }
        held
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lead_of.len()
    }
}
