//! What the state knows of the subscribers, the customers and the daemons sharing the
//! ledger: subscribers loaded, changed or removed, work announced due or read from the queue,
//! the share and the other daemons' sends. It does NOT claim, send or record (`claims`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use fanout_core::limiter::LimiterState;

use super::{owned, State, Sub};
use crate::dispatch::vocab::{Effect, Lane, Target};
use crate::keyring::Keyring;
use crate::model::{InFlight, Share, Subscriber};

impl State {
    /// Every live subscriber as stored: those known here and not among them were removed.
    pub(super) fn on_loaded(
        &mut self,
        subs: Vec<(Subscriber, LimiterState)>,
        now: i64,
    ) -> Vec<Effect> {
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
        let mut effects = Vec::new();
        for (s, limiter) in subs {
            effects.extend(self.upsert(s, limiter, now));
        }
        effects
    }

    pub(super) fn on_share(&mut self, share: Option<Share>, now: i64) {
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
    }

    pub(super) fn on_elsewhere(&mut self, all: InFlight) {
        self.elsewhere.clear();
        for (customer, n) in all {
            *self.elsewhere.entry(customer.map(Arc::from)).or_default() += n;
        }
    }

    pub(super) fn on_due(&mut self, ids: &[String], now: i64) {
        for id in ids {
            if let Some(st) = self.subs.get_mut(id.as_str()) {
                st.due_at(now);
            }
        }
    }

    /// The queue as read: each subscriber's earliest due work, with what is not recorded yet;
    /// then the work a replay made due.
    pub(super) fn on_due_work(&mut self, due: Vec<(String, i64)>, now: i64) {
        let mut by_id: HashMap<&str, i64> = due.iter().map(|(id, at)| (id.as_str(), *at)).collect();
        for (id, st) in self.subs.iter_mut() {
            let stored = by_id.remove(id.as_ref());
            let unrecorded = self.unrecorded_due.get(id).copied();
            st.next_due = match (stored, unrecorded) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let replayed = std::mem::take(&mut self.due_after_rescan);
        self.on_due(&replayed, now);
    }

    /// A subscriber created or changed: its target anew, its limiter and slots kept.
    pub(super) fn upsert(&mut self, s: Subscriber, stored: LimiterState, now: i64) -> Vec<Effect> {
        let no_edge = s.lane == Lane::Edge && !self.cfg.edge;
        let target = Arc::new(Target {
            id: Arc::from(s.id.as_str()),
            url: Arc::from(s.url.as_str()),
            limits: s.limits,
            lane: s.lane.effective(self.cfg.edge),
            legacy_signature: s.legacy_signature,
            keyring: Keyring::of(&s.secrets),
            signature: s.signature,
            customer: s.customer.as_deref().map(Arc::from),
            payload: s.payload,
            ordered: s.ordering != crate::ordering::Ordering::None,
            propagate_trace: s.propagate_trace,
            batch: s.batch,
        });
        let warn = no_edge.then(|| target.id.clone());
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
                if st.target.batch != target.batch {
                    st.batch_per = 0;
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
        match warn {
            Some(subscriber) => vec![Effect::NoEdge { subscriber }],
            None => Vec::new(),
        }
    }

    pub(super) fn remove(&mut self, id: &str) {
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
}
