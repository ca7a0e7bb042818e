//! The stall watchdog: a subscriber ready to send (due work, nothing out, no in-flight cap,
//! no wait it stated, its limiter allowing) that is sent nothing for [`STALL_MARGIN_MS`] is
//! reported, once, until it sends again. It does NOT change what is claimed or when: it only
//! reports (a stall is a dispatcher bug, never a wait stated and kept).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::State;
use crate::dispatch::vocab::{Effect, Stall, StallReport};

/// How long a subscriber may be ready to send (due work, nothing out, no in-flight cap, its
/// own limiter allowing, no wait it stated still running) and send nothing, before the
/// watchdog reports it stalled.
pub const STALL_MARGIN_MS: i64 = 10_000;
/// The watchdog looks at least this often while the dispatcher runs (every tick, and the
/// executor ticks every second or two at the least); a longer gap means the dispatcher itself
/// was held (a slow or failing ledger, a frozen process), not a subscriber: readiness counts
/// afresh.
const WATCH_GAP_MS: i64 = 5_000;

impl State {
    /// The watchdog: a subscriber is ready to send when it has due work, nothing out, no
    /// in-flight cap holding it, no wait it stated still running (its rate, a pause, its
    /// breaker, the edge's or the shared limiter's answer) and its own limiter would grant a
    /// send now. Ready for longer than [`STALL_MARGIN_MS`] without sending, it is stalled: a
    /// wait never kept, or a refusal renewed for ever, which no decision should leave. (A
    /// wait stated and kept is no stall, however long.) Not watched while a turn is being
    /// recorded or the ledger fails (then the ledger holds everyone, and says so itself).
    /// Reports the stalled set when it changes.
    pub(super) fn watch(&mut self, now: i64) -> Option<Effect> {
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

    /// The subscribers stalled as of `now` (see `State::watch`), by id.
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
}
