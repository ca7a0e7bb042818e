//! Group commit for ingest. Every ingest moves its subscribers' sequence counters
//! (`sequences`, `ingest.rs`) and keeps their rows locked until it commits, so two ingests
//! that reach one subscriber commit one after the other, the second waiting out the first's WAL
//! flush before it can even start its own. Left to themselves, concurrent ingests of one daemon
//! (a producer's parallel connections, the outbox) would queue on those locks one flush each.
//! Instead they queue here: at most [`RUNNERS`] transactions run at once (two: while one holds
//! the counters, the next does its first round trips and then waits for them on the server),
//! the ingests that arrive meanwhile wait, and the next transaction carries all of them (up to
//! [`GROUP_EVENTS`] events), so they share one round of locks and one flush, as PostgreSQL's
//! own group commit let them share a flush before the counters existed.
//!
//! A grouped transaction is the calls' events in arrival order, so an event id repeated across
//! calls is stored from the first call and is a duplicate for the later ones, as if they had
//! come one after the other. When a grouped transaction fails, each call is tried again alone,
//! so one call's failure is its own. A caller that gives up (its request dropped) does not stop
//! the transaction it is part of: the runner is a task of its own.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::ledger::PgLedger;
use crate::ledger::{Ingested, LedgerError, NewEvent};

/// An ingest's answer: each event's outcome and the subscribers that got work.
pub(super) type Outcome = Result<(Vec<Ingested>, Vec<String>), LedgerError>;

/// Ingest transactions of one daemon at once.
const RUNNERS: usize = 2;

/// Most events one grouped transaction carries; a larger call runs alone.
const GROUP_EVENTS: usize = 4_000;

/// One call waiting for its transaction.
struct Waiter {
    events: Vec<NewEvent>,
    now_ms: i64,
    reply: oneshot::Sender<Outcome>,
}

/// The ingests waiting for the next transaction, and how many runners are taking them.
#[derive(Default)]
pub(super) struct IngestQueue {
    state: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
    running: usize,
}

impl IngestQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Nothing panics while holding it; were it poisoned, the queue is still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a call; true when fewer than [`RUNNERS`] runners are taking calls, so the caller
    /// must start one.
    fn push(&self, w: Waiter) -> bool {
        let mut q = self.lock();
        q.waiting.push_back(w);
        let start = q.running < RUNNERS;
        if start {
            q.running += 1;
        }
        start
    }

    /// The next group: the oldest call and those after it while the group stays within
    /// [`GROUP_EVENTS`]; empty (and the runner stops) when none waits.
    fn take(&self) -> Vec<Waiter> {
        let mut q = self.lock();
        let mut group = Vec::new();
        let mut events = 0;
        while let Some(next) = q.waiting.front() {
            if !group.is_empty() && events + next.events.len() > GROUP_EVENTS {
                break;
            }
            events += next.events.len();
            group.extend(q.waiting.pop_front());
        }
        if group.is_empty() {
            q.running = q.running.saturating_sub(1);
        }
        group
    }
}

impl PgLedger {
    /// Store events and fan each out to every live subscriber whose patterns and filter match,
    /// in a transaction shared with the ingests that wait meanwhile (the module doc); announce
    /// the subscribers that got work to every listening daemon (on commit). Returns the
    /// per-event outcome and those subscribers. A server without room is noted for `/healthz`.
    pub async fn ingest(&self, events: Vec<NewEvent>, now_ms: i64) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let waiter = Waiter {
            events,
            now_ms,
            reply,
        };
        if self.ingests.push(waiter) {
            let runner = self.clone();
            tokio::spawn(async move { runner.run_ingests().await });
        }
        // The runner answers every call it takes; no answer means it is gone with the runtime.
        answer.await.unwrap_or(Err(LedgerError::Closed))
    }

    async fn run_ingests(&self) {
        loop {
            let group = self.ingests.take();
            if group.is_empty() {
                return;
            }
            self.ingest_group(group).await;
        }
    }

    async fn ingest_group(&self, group: Vec<Waiter>) {
        let now_ms = group.iter().map(|w| w.now_ms).max().unwrap_or_default();
        let mut all = Vec::new();
        let mut calls = Vec::with_capacity(group.len());
        for w in group {
            calls.push((w.events.len(), w.now_ms, w.reply));
            all.extend(w.events);
        }
        if calls.len() == 1 {
            let r = self.ingest_observed(&all, now_ms).await;
            if let Some((_, _, reply)) = calls.pop() {
                let _ = reply.send(r);
            }
            return;
        }
        match self.ingest_observed(&all, now_ms).await {
            Ok((outcomes, touched)) => {
                let mut outcomes = outcomes.into_iter();
                for (len, _, reply) in calls {
                    let mine = outcomes.by_ref().take(len).collect();
                    let _ = reply.send(Ok((mine, touched.clone())));
                }
            }
            Err(_) => {
                let mut rest = all;
                for (len, now_ms, reply) in calls {
                    let tail = rest.split_off(len);
                    let mine = std::mem::replace(&mut rest, tail);
                    let _ = reply.send(self.ingest_observed(&mine, now_ms).await);
                }
            }
        }
    }

    /// One transaction of ingest; a server without room is noted for `/healthz`.
    async fn ingest_observed(&self, events: &[NewEvent], now_ms: i64) -> Outcome {
        let r = self.ingest_events(events, now_ms).await;
        self.writes.observe(&r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(n: usize) -> (Waiter, oneshot::Receiver<Outcome>) {
        let (reply, rx) = oneshot::channel();
        let events = crate::ledger::test_events(n);
        (
            Waiter {
                events,
                now_ms: 0,
                reply,
            },
            rx,
        )
    }

    #[test]
    fn calls_start_runners_up_to_the_limit_and_an_empty_take_stops_one() {
        let q = IngestQueue::default();
        let mut rx = Vec::new();
        let mut started = Vec::new();
        for _ in 0..RUNNERS + 2 {
            let (w, r) = waiter(1);
            started.push(q.push(w));
            rx.push(r);
        }
        let mut expected = vec![true; RUNNERS];
        expected.extend([false, false]);
        assert_eq!(
            started, expected,
            "the first calls start runners, the rest wait"
        );
        assert_eq!(
            q.take().len(),
            RUNNERS + 2,
            "one take groups every waiting call"
        );
        for _ in 0..RUNNERS {
            assert!(q.take().is_empty());
        }
        let (c, _rc) = waiter(1);
        assert!(q.push(c), "the runners stopped when they found none");
    }

    #[test]
    fn a_group_stays_within_its_events_but_takes_a_large_call_alone() {
        let q = IngestQueue::default();
        let mut rx = Vec::new();
        for n in [GROUP_EVENTS - 10, 10, 1, GROUP_EVENTS + 5, 3] {
            let (w, r) = waiter(n);
            q.push(w);
            rx.push(r);
        }
        let sizes = |g: Vec<Waiter>| g.iter().map(|w| w.events.len()).collect::<Vec<_>>();
        assert_eq!(sizes(q.take()), vec![GROUP_EVENTS - 10, 10]);
        assert_eq!(sizes(q.take()), vec![1]);
        assert_eq!(sizes(q.take()), vec![GROUP_EVENTS + 5]);
        assert_eq!(sizes(q.take()), vec![3]);
        assert!(q.take().is_empty());
    }
}
