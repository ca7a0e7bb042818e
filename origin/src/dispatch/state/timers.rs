//! The state's clockwork and its answers to the API: when the leases are swept, the queue is
//! re-read and the share refreshed (deadlines the executor sleeps until, see
//! `State::deadline`), what each control message asks of the ledger, and how long a stopping
//! dispatcher waits for its sends. It does NOT read a clock: every deadline is computed from
//! the `now` it is given.

use super::State;
use crate::dispatch::vocab::{Control, Effect, Read};

/// Expired leases are looked for this often.
pub const SWEEP_EVERY_MS: i64 = 5_000;
/// The dispatcher re-reads the queue at least this often, whatever it believes.
pub const RESCAN_EVERY_MS: i64 = 2_000;
/// The dispatcher writes that it is alive, and reads which daemons share the ledger, this
/// often (`DispatchLedger::share`).
pub const SHARE_EVERY_MS: i64 = 1_000;
/// At shutdown, results of sends in flight are waited for this long.
pub const DRAIN_MS: i64 = 5_000;
/// At shutdown, a turn the ledger hands back is tried this many times, this far apart.
pub const SHUTDOWN_FLUSHES: u32 = 3;
pub const SHUTDOWN_FLUSH_EVERY_MS: i64 = 200;

/// When each periodic task is next due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Timers {
    sweep_at: i64,
    rescan_at: i64,
    share_at: i64,
}

impl Timers {
    pub(super) fn earliest(&self) -> i64 {
        self.sweep_at.min(self.rescan_at).min(self.share_at)
    }
}

/// At start: the customers, then every subscriber.
pub(super) fn start() -> Vec<Effect> {
    vec![
        Effect::Read(Read::Customers),
        Effect::Read(Read::Subscribers),
    ]
}

impl State {
    /// The periodic work due at `now`: the first time, the share and a rescan (the sweep waits
    /// its period); then each task whose deadline has come, in the order sweep, rescan, share.
    pub(super) fn on_timers(&mut self, now: i64) -> Vec<Effect> {
        let Some(t) = self.timers.as_mut() else {
            self.timers = Some(Timers {
                sweep_at: now + SWEEP_EVERY_MS,
                rescan_at: now + RESCAN_EVERY_MS,
                share_at: now + SHARE_EVERY_MS,
            });
            let mut effects = vec![self.share_effect()];
            effects.extend(self.rescan(now));
            return effects;
        };
        let mut effects = Vec::new();
        if now >= t.sweep_at {
            t.sweep_at = now + SWEEP_EVERY_MS;
            effects.push(Effect::SweepLeases { now_ms: now });
        }
        let rescan = now >= t.rescan_at;
        if rescan {
            t.rescan_at = now + RESCAN_EVERY_MS;
        }
        let share = now >= t.share_at;
        if share {
            t.share_at = now + SHARE_EVERY_MS;
        }
        if rescan {
            effects.extend(self.rescan(now));
        }
        if share {
            effects.push(self.share_effect());
        }
        effects
    }

    fn share_effect(&self) -> Effect {
        Effect::Share {
            in_flight: self.in_flight_by_customer(),
        }
    }

    /// Re-read the queue: record first, so the ledger's view includes every result processed
    /// so far.
    fn rescan(&mut self, now: i64) -> Vec<Effect> {
        let mut effects = self.turn(now, false);
        effects.push(Effect::Read(Read::DueWork {
            dead_threshold: self.cfg.alert_rules.dead_threshold,
        }));
        effects
    }

    /// What a message from the API asks for.
    pub(super) fn on_control(&mut self, control: Control, now: i64) -> Vec<Effect> {
        match control {
            Control::Due(ids) => {
                self.on_due(&ids, now);
                Vec::new()
            }
            Control::Replayed(ids) => {
                // The rescan re-arms the dead-count alerts a replay brought back under the
                // threshold; the replayed work is due once it is read.
                self.due_after_rescan.extend(ids);
                self.rescan(now)
            }
            Control::Changed(id) => vec![Effect::Read(Read::Subscriber(id))],
            Control::Rescan => self.rescan(now),
            Control::Customers => vec![Effect::Read(Read::Customers)],
            Control::Reload => {
                let mut effects = start();
                effects.extend(self.rescan(now));
                effects
            }
        }
    }

    /// Stop: claims end here (the other daemons take this one's subscribers now), and the
    /// sends in flight are waited for until [`State::draining`] says so no more.
    pub(super) fn on_stop(&mut self, now: i64) -> Vec<Effect> {
        self.drain_until = Some(now + DRAIN_MS);
        vec![Effect::Leave]
    }

    /// Stopping with sends still in flight: wait for their results until the returned time.
    /// `None` once they are all back or the wait is over (the rest is released at the next
    /// start).
    pub fn draining(&self, now: i64) -> Option<i64> {
        let until = self.drain_until?;
        (self.in_flight() > 0 && now < until).then_some(until)
    }
}
