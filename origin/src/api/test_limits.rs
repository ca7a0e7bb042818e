//! What bounds `POST /v1/filters/test` (`filters.rs`) beyond one call's own cap: each caller's
//! rate (a token bucket per caller, `fanout_core::bucket`) and the slots tests run in, whoever
//! called. Kept here, below both `state.rs` (which holds them) and `filters.rs` (which uses
//! them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fanout_core::bucket::{Bucket, Rate};
use tokio::sync::Semaphore;

/// Tests one caller may start: a burst, then a steady rate.
pub const TEST_RATE: Rate = Rate {
    per_sec: 2.0,
    burst: 10,
};

/// Tests running at once, whoever called.
pub const RUNNING_AT_ONCE: usize = 2;

/// Callers' buckets kept before the full ones (those that have waited out their rate) are let
/// go.
const MAX_CALLERS: usize = 10_000;

/// The tests' rate per caller and their running slots.
#[derive(Debug)]
pub struct FilterTests {
    buckets: Mutex<HashMap<String, Bucket>>,
    /// The slots a test takes while it runs.
    pub running: Arc<Semaphore>,
}

impl Default for FilterTests {
    fn default() -> Self {
        FilterTests {
            buckets: Mutex::default(),
            running: Arc::new(Semaphore::new(RUNNING_AT_ONCE)),
        }
    }
}

impl FilterTests {
    /// Take one test from `caller`'s bucket at `now_ms`; `Err` with the milliseconds until
    /// one is back.
    pub fn admit(&self, caller: String, now_ms: i64) -> Result<(), i64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        admit(&mut buckets, caller, now_ms)
    }
}

/// Take one token of `key`'s bucket (a new caller starts full); `Err` with the milliseconds
/// until one is back when it is empty (pure). Beyond [`MAX_CALLERS`] buckets, those full again
/// are dropped (a full bucket is what a new caller gets).
fn admit(buckets: &mut HashMap<String, Bucket>, key: String, now_ms: i64) -> Result<(), i64> {
    let room = f64::from(TEST_RATE.burst);
    if buckets.len() >= MAX_CALLERS && !buckets.contains_key(&key) {
        buckets.retain(|_, b| {
            b.refill(TEST_RATE, room, now_ms);
            b.tokens < room
        });
        if buckets.len() >= MAX_CALLERS {
            // Every caller busy: all start again from a full bucket (callers are the operator
            // and the customers it made, not something a caller can multiply).
            buckets.clear();
        }
    }
    let b = buckets
        .entry(key)
        .or_insert_with(|| Bucket::full(TEST_RATE, now_ms));
    if b.take(TEST_RATE, room, now_ms, 1) == 1 {
        return Ok(());
    }
    let missing = (1.0 - b.tokens).max(0.0);
    Err((missing * 1000.0 / TEST_RATE.per_sec).ceil() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's burst, then its rate; each caller its own bucket; the wait named.
    #[test]
    fn rate_per_caller_table() {
        let mut buckets = HashMap::new();
        let burst = TEST_RATE.burst as usize;
        for _ in 0..burst {
            assert_eq!(admit(&mut buckets, "a".into(), 0), Ok(()));
        }
        assert_eq!(admit(&mut buckets, "a".into(), 0), Err(500));
        assert_eq!(admit(&mut buckets, "a".into(), 250), Err(250));
        assert_eq!(admit(&mut buckets, "b".into(), 250), Ok(()));
        assert_eq!(admit(&mut buckets, "a".into(), 500), Ok(()));
        assert_eq!(admit(&mut buckets, "a".into(), 500), Err(500));
        // Full buckets are let go when there are too many; the busy one is kept.
        for i in 0..MAX_CALLERS {
            let _ = admit(&mut buckets, format!("c{i}"), 100_000);
        }
        assert_eq!(admit(&mut buckets, "a".into(), 100_000), Ok(()));
        assert!(buckets.len() <= MAX_CALLERS);
    }
}
