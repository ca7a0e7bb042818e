//! The shared limiter's arithmetic for several daemons claiming for one subscriber: a daemon's
//! view folded into the shared row, what a claim may take, how long to wait for more. Pure:
//! no SQL, no clock (the claim in `ops.rs` and the dispatcher's simulation both use it).

use fanout_core::limiter::{LimiterState, Reservation};

/// A daemon's limiter for a subscriber folded into the shared one: the bucket stays the shared
/// one (only claims spend it, under the row lock); a Retry-After pause lasts until the later of
/// the two; the breaker's run of failures and its opening are the daemon's (they come from the
/// results it just recorded). Whether a probe is out is the shared limiter's: a daemon may end
/// one (its result came back: closed, re-opened, or a pushback) but never start one — only a
/// claim does, under the row lock. (A daemon's own reservation of a probe, folded in as a
/// probe already out, made the claim that followed refuse every probe: the subscriber stalled
/// for good with its breaker half-open.)
pub fn merge_limiter(shared: LimiterState, mine: LimiterState) -> LimiterState {
    let mut breaker = mine.breaker;
    if breaker.probe_started_ms.is_some() {
        breaker.probe_started_ms = shared.breaker.probe_started_ms;
    }
    LimiterState {
        bucket: shared.bucket,
        paused_until_ms: match (shared.paused_until_ms, mine.paused_until_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        },
        breaker,
    }
}

/// What a subscriber's shared limiter grants one claim of at most `most` deliveries, `busy`
/// being open at every daemon: reserved now, to be committed to what was found
/// (`LimiterState::commit`). Pure: the claim and the dispatcher's model of it both use it.
pub fn grant_shared(
    limiter: &mut LimiterState,
    limits: fanout_core::limiter::Limits,
    busy: u32,
    most: usize,
    now_ms: i64,
) -> Reservation {
    let most = most.min(limits.max_in_flight.saturating_sub(busy) as usize);
    limiter.reserve(limits, busy, now_ms, most)
}

/// When due work is left after a claim (`next_due_ms` at or before now): how long the shared
/// limiter, as the claim left it, says to wait for one more (rate, pause, breaker; asked of a
/// copy, nothing taken). A full in-flight cap is no wait: a result frees a slot. `busy` counts
/// the open sends, the claim's included. Pure, like [`grant_shared`].
pub fn shared_wait(
    limiter: &LimiterState,
    limits: fanout_core::limiter::Limits,
    busy: u32,
    next_due_ms: Option<i64>,
    now_ms: i64,
) -> Option<u64> {
    match next_due_ms {
        Some(due) if due <= now_ms => {
            let mut copy = *limiter;
            copy.reserve(limits, busy, now_ms, 1).wait_ms()
        }
        _ => None,
    }
}
