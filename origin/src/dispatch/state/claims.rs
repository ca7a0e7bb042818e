//! Turns: what may be claimed now (each subscriber's limiter, then the global budget shared
//! fairly), the turn handed to the ledger, and what its answer leases and launches — or, when
//! the ledger hands the turn back, how it is kept whole for the retry. It does NOT judge
//! results (`results`) or watch for stalls (`watch`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fanout_core::limiter::{LimiterState, Reservation};

use super::{
    State, EDGE_CALLS_AT_ONCE, EDGE_OPEN_SENDS, EMPTY_CLAIM_RETRY_MS, LEASE_MS,
    LEDGER_RETRY_MAX_MS, LEDGER_RETRY_MS,
};
use crate::dispatch::fair;
use crate::dispatch::vocab::{Effect, Lane, Recorded, Target, Turn, TurnError};
use crate::model::{Claimed, Outcome, Transition};
use crate::ordering::HELD_MS;
use fanout_core::batch::BatchSpec;

impl State {
    /// One turn: lease what may be sent now (when `claim`), and record what is unrecorded.
    pub(super) fn turn(&mut self, now: i64, claim: bool) -> Vec<Effect> {
        if self.recording || now < self.ledger_retry_at {
            return Vec::new();
        }
        // Watched before this turn's reservations: a subscriber ready now is asked for now,
        // and one whose claim is refused again and again stays ready since its first.
        let watched = self.watch(now);
        let mut claims: Vec<(String, usize)> = Vec::new();
        let mut batch_per: Vec<(String, usize)> = Vec::new();
        let mut runs: Vec<String> = Vec::new();
        if claim {
            claims = self.reserve(now);
            for (id, n) in &mut claims {
                if let Some(st) = self.subs.get(id.as_str()) {
                    if let Some(per) = st.per_request() {
                        // Asked in requests: each takes up to `per` deliveries.
                        *n *= per;
                        batch_per.push((id.clone(), per));
                        if st.target.ordered {
                            runs.push(id.clone());
                        }
                    }
                }
            }
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
            batch_per,
            runs,
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
            if let (Some(b), Some(mut due)) = (st.target.batch, st.next_due) {
                // A batch waits for more events until its oldest has waited `max_wait_ms`.
                // Due "at 0" is a subscriber just loaded, its work unknown: it counts from now.
                if due <= 0 && b.max_wait_ms > 0 {
                    due = now;
                    st.next_due = Some(now);
                }
                let until = due.saturating_add(i64::from(b.max_wait_ms));
                if until > now {
                    st.not_before = until;
                    continue;
                }
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

    pub(super) fn on_recorded(&mut self, recorded: Recorded, now: i64) -> Vec<Effect> {
        self.recording = false;
        self.ledger_failures = 0;
        self.unrecorded_due.clear();
        let mut effects = Vec::new();
        if !recorded.notices.is_empty() {
            effects.push(Effect::Raise(recorded.notices));
        }
        let breaker = self.cfg.breaker;
        let released = recorded.due;
        for claim in recorded.claims {
            let Some(st) = self.subs.get_mut(claim.subscriber_id.as_str()) else {
                continue;
            };
            let got = claim.claimed.len();
            // A batching subscriber's claim is in requests: each group one.
            let requests = st
                .per_request()
                .map(|per| (per, groups(got, per, &claim.runs)));
            let sends = requests.as_ref().map_or(got, |(_, g)| g.len());
            if let Some(r) = st.reserved.take() {
                // Commit what was leased; the rest of the reservation goes back exactly.
                st.limiter.commit(st.target.limits.core(breaker), r, sends);
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
            let edge_batch = self.cfg.edge_batch.max(1);
            let target = st.target.clone();
            if let (Some((per, groups)), Some(spec)) = (requests, target.batch) {
                effects.push(self.launch_batched(target, spec, per, &groups, claim.claimed, now));
                continue;
            }
            let alone = |ds: Vec<Claimed>| -> Vec<Vec<Claimed>> {
                ds.into_iter().map(|d| vec![d]).collect()
            };
            if target.lane != Lane::Edge || self.suspects.is_empty() {
                let per_call = edge_per_call(got, edge_batch);
                effects.push(self.send_out(target, alone(claim.claimed), per_call, now));
                continue;
            }
            // Suspects of a refused call go in calls of their own size, the rest as usual.
            let mut by_size: BTreeMap<usize, Vec<Claimed>> = BTreeMap::new();
            let mut rest = Vec::new();
            for d in claim.claimed {
                match self.suspects.get(&d.rowid) {
                    Some(&size) => by_size.entry(size).or_default().push(d),
                    None => rest.push(d),
                }
            }
            if !rest.is_empty() {
                let per_call = edge_per_call(rest.len(), edge_batch);
                effects.push(self.send_out(target.clone(), alone(rest), per_call, now));
            }
            for (size, deliveries) in by_size {
                effects.push(self.send_out(target.clone(), alone(deliveries), size, now));
            }
        }
        // A reservation the answer did not mention (cannot happen with a well-behaved ledger)
        // goes back whole.
        self.release_reservations();
        self.forget_removed();
        // An ordered key's next delivery went due with its head's result: ask for it now.
        self.on_due(&released, now);
        if std::mem::take(&mut self.strays) {
            effects.push(Effect::ReleaseStrays {
                held: self.held(),
                now_ms: now,
            });
        }
        effects.extend(self.watch(now));
        effects
    }

    /// Every delivery this daemon holds a lease on that it knows of: out (a send's first
    /// delivery and a batch's others) or with a result not yet written.
    fn held(&self) -> Vec<i64> {
        let mut held: Vec<i64> = self
            .out
            .keys()
            .chain(self.members.keys())
            .copied()
            .collect();
        held.extend(self.unrecorded.iter().map(|o| o.rowid));
        held.sort_unstable();
        held.dedup();
        held
    }

    /// A batching subscriber's claim: cut into requests (`cut_batches`) and sent out
    /// (`send_out`); what did not fit goes back due now, no attempt spent — or, ordered, held
    /// behind its key's request (its run's first delivery is the key's head).
    fn launch_batched(
        &mut self,
        target: Arc<Target>,
        spec: BatchSpec,
        per: usize,
        groups: &[usize],
        claimed: Vec<Claimed>,
        now: i64,
    ) -> Effect {
        let id = target.id.clone();
        let edge_batch = self.cfg.edge_batch.max(1);
        let (batches, rest, fitted) = cut_batches(
            spec,
            per,
            groups,
            claimed,
            target.payload,
            self.cfg.event_url.as_ref(),
        );
        if let Some(st) = self.subs.get_mut(&id) {
            st.batch_per = fitted;
        }
        let back = if target.ordered { HELD_MS } else { now };
        for d in rest {
            self.push_outcome(
                &id,
                Outcome {
                    rowid: d.rowid,
                    transition: Transition::Defer { at_ms: back },
                    attempt: None,
                },
            );
        }
        let per_call = edge_per_call(batches.len(), edge_batch);
        self.send_out(target, batches, per_call, now)
    }

    /// Launch `sends` (each one request: a delivery alone, or a batch), each one slot in
    /// flight: its first delivery in `out`, the others in `members`. An ordered request's
    /// deliveries are noted in `runs`: its results keep one head per key (`push_outcome`).
    fn send_out(
        &mut self,
        target: Arc<Target>,
        sends: Vec<Vec<Claimed>>,
        per_call: usize,
        now: i64,
    ) -> Effect {
        let id = target.id.clone();
        if let Some(st) = self.subs.get_mut(&id) {
            st.in_flight += sends.len() as u32;
        }
        for send in &sends {
            let mut rows = send.iter();
            let Some(lead) = rows.next() else {
                continue;
            };
            self.out.insert(lead.rowid, id.clone());
            for d in rows {
                self.members.insert(d.rowid, id.clone());
            }
            if target.ordered && send.len() > 1 {
                self.runs.open(lead.rowid, send.iter().map(|d| d.rowid));
            }
        }
        Effect::Launch {
            target,
            sends,
            per_call,
            at_ms: now,
        }
    }

    pub(super) fn on_not_recorded(&mut self, failed: TurnError, now: i64) {
        self.recording = false;
        self.strays = true;
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

    pub(super) fn release_reservations(&mut self) {
        let breaker = self.cfg.breaker;
        for st in self.subs.values_mut() {
            if let Some(r) = st.reserved.take() {
                st.limiter.commit(st.target.limits.core(breaker), r, 0);
                st.limiter_dirty = true;
            }
        }
    }

    pub(super) fn forget_removed(&mut self) {
        self.subs
            .retain(|_, s| !(s.removed && s.in_flight == 0 && s.reserved.is_none()));
    }
}

/// The requests a batching subscriber's claim of `n` deliveries stands for, as their sizes in
/// the claim's order: the ledger's runs when it gave them (`Claim::runs`, an ordered
/// subscriber), else groups of `per` (the groups the ledger counted, `Turn::batch_per`).
pub fn groups(n: usize, per: usize, runs: &[usize]) -> Vec<usize> {
    if !runs.is_empty() && runs.iter().sum::<usize>() == n && runs.iter().all(|&r| r > 0) {
        return runs.to_vec();
    }
    let per = per.max(1);
    (0..n.div_ceil(per)).map(|k| per.min(n - k * per)).collect()
}

/// A batching subscriber's claim cut into requests: its `groups` (sizes, in the claim's order),
/// each sent as the longest run from its start that fits `max_bytes` (at least one delivery).
/// Returns the requests, the deliveries that did not fit (they go back), and the deliveries
/// per request to ask for next: what fitted when bytes bound, else `per` grown back toward
/// `max_events` once a group was full.
pub fn cut_batches(
    spec: BatchSpec,
    per: usize,
    groups: &[usize],
    claimed: Vec<Claimed>,
    payload: crate::payload::Payload,
    event_url: Option<&crate::payload::EventUrl>,
) -> (Vec<Vec<Claimed>>, Vec<Claimed>, usize) {
    let per = per.max(1);
    let most = spec.max_events.max(1) as usize;
    let mut batches = Vec::with_capacity(groups.len());
    let mut rest = Vec::new();
    let mut fitted: Option<usize> = None;
    let mut full = false;
    let mut it = claimed.into_iter();
    for &size in groups {
        let group: Vec<Claimed> = it.by_ref().take(size).collect();
        if group.is_empty() {
            break;
        }
        let sizes: Vec<usize> = group
            .iter()
            .map(|d| {
                crate::payload::body_len(
                    payload,
                    &d.body,
                    &d.event_id,
                    &d.event_type,
                    d.received_ms,
                    event_url,
                )
            })
            .collect();
        let fits = spec.cut(&sizes).first().copied().unwrap_or(group.len());
        if fits < group.len() {
            fitted = Some(fitted.map_or(fits, |f| f.min(fits)));
        } else if group.len() >= per {
            full = true;
        }
        let mut group = group;
        rest.extend(group.split_off(fits));
        batches.push(group);
    }
    // Rows past the groups (a ledger that leased more than it said) go back too.
    rest.extend(it);
    let next = match fitted {
        Some(f) => f.max(1),
        None if full => (per * 2).min(most),
        None => per,
    };
    (batches, rest, next)
}

/// Deliveries per edge call for a grant of `n`: a share of [`EDGE_CALLS_AT_ONCE`] calls, at
/// least [`EDGE_OPEN_SENDS`] (what one call keeps open at once), never more than `cap`.
pub fn edge_per_call(n: usize, cap: usize) -> usize {
    let spread = n.div_ceil(EDGE_CALLS_AT_ONCE).max(EDGE_OPEN_SENDS);
    spread.min(cap).max(1)
}
