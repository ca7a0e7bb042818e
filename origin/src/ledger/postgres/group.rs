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

use crate::ledger::{Ingested, LedgerError, NewEvent};

/// An ingest's answer: each event's outcome and the subscribers that got work.
pub(super) type Outcome = Result<(Vec<Ingested>, Vec<String>), LedgerError>;

/// Ingest transactions of one daemon at once.
const RUNNERS: usize = 2;

/// Most events one grouped transaction carries; a larger call runs alone.
const GROUP_EVENTS: usize = 4_000;

/// One call waiting for its transaction.
pub(super) struct Waiter {
    pub(super) events: Vec<NewEvent>,
    pub(super) now_ms: i64,
    pub(super) reply: oneshot::Sender<Outcome>,
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
    pub(super) fn push(&self, w: Waiter) -> bool {
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
    pub(super) fn take(&self) -> Vec<Waiter> {
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
