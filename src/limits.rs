//! The bounds on a subscriber's limits, checked here once: by the edge's request validation
//! (`wire::SubscriberSpec::validate`) and by the origin's API (`Limits::validate`).
//!
//! Why bounds and not just "positive": a rate of 1e-300/s makes the wait for a token overflow
//! every integer the limiter computes with, and 1e300/s means nothing a subscriber can take; NaN
//! and infinity are not rates. Inside the bounds every wait the bucket computes
//! ([`crate::bucket::Bucket::wait_ms`]: at most `MAX_BURST` tokens at `MIN_RATE_PER_SEC`) is
//! far below `u64::MAX` milliseconds.

/// The slowest rate: one request every 10,000 s (about 2.8 hours).
pub const MIN_RATE_PER_SEC: f64 = 0.0001;
/// The fastest rate: a million requests a second.
pub const MAX_RATE_PER_SEC: f64 = 1_000_000.0;
/// Bounds on a subscriber's configured request timeout.
pub const MIN_TIMEOUT_MS: u64 = 100;
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// The largest burst and the most requests in flight.
pub const MAX_BURST: u32 = 1_000_000;
pub const MAX_IN_FLIGHT: u32 = 1_000_000;

/// The most events one batched webhook carries (`crate::batch`).
pub const BATCH_MAX_EVENTS: u32 = 1000;
/// The most bytes of body one batched webhook carries.
pub const BATCH_MAX_BYTES: u32 = 1024 * 1024;

/// A limit out of its bounds: which field, and a message that names the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {message}")]
pub struct LimitError {
    pub field: &'static str,
    pub message: String,
}

/// Check a subscriber's limits against the bounds.
pub fn check(
    rate_per_sec: f64,
    burst: u32,
    max_in_flight: u32,
    timeout_ms: u64,
) -> Result<(), LimitError> {
    let bad = |field, message: String| Err(LimitError { field, message });
    // `contains` is false for NaN, so NaN and both infinities are refused here too.
    if !(MIN_RATE_PER_SEC..=MAX_RATE_PER_SEC).contains(&rate_per_sec) {
        return bad(
            "rate_per_sec",
            format!(
                "must be a number from {MIN_RATE_PER_SEC} to {MAX_RATE_PER_SEC} (requests per \
                 second), not {rate_per_sec}"
            ),
        );
    }
    if !(1..=MAX_BURST).contains(&burst) {
        return bad(
            "burst",
            format!("must be from 1 to {MAX_BURST}, not {burst}"),
        );
    }
    if !(1..=MAX_IN_FLIGHT).contains(&max_in_flight) {
        return bad(
            "max_in_flight",
            format!("must be from 1 to {MAX_IN_FLIGHT}, not {max_in_flight}"),
        );
    }
    if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        return bad(
            "timeout_ms",
            format!("must be from {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS}, not {timeout_ms}"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{Bucket, Rate};

    /// (rate_per_sec, burst, max_in_flight, timeout_ms)
    type Input = (f64, u32, u32, u64);
    /// The field refused and words its message holds; `None`: accepted.
    type Refusal = Option<(&'static str, &'static str)>;

    #[test]
    fn bounds_table() {
        let ok = (10.0, 20, 8, 10_000);
        let cases: &[(Input, Refusal)] = &[
            (ok, None),
            ((MIN_RATE_PER_SEC, 1, 1, MIN_TIMEOUT_MS), None),
            (
                (MAX_RATE_PER_SEC, MAX_BURST, MAX_IN_FLIGHT, MAX_TIMEOUT_MS),
                None,
            ),
            (
                (1e-300, 20, 8, 10_000),
                Some(("rate_per_sec", "from 0.0001")),
            ),
            ((1e300, 20, 8, 10_000), Some(("rate_per_sec", "to 1000000"))),
            ((0.0, 20, 8, 10_000), Some(("rate_per_sec", "not 0"))),
            ((-1.0, 20, 8, 10_000), Some(("rate_per_sec", "not -1"))),
            ((f64::NAN, 20, 8, 10_000), Some(("rate_per_sec", "not NaN"))),
            (
                (f64::INFINITY, 20, 8, 10_000),
                Some(("rate_per_sec", "not inf")),
            ),
            ((10.0, 0, 8, 10_000), Some(("burst", "from 1 to 1000000"))),
            (
                (10.0, MAX_BURST + 1, 8, 10_000),
                Some(("burst", "not 1000001")),
            ),
            (
                (10.0, 20, 0, 10_000),
                Some(("max_in_flight", "from 1 to 1000000")),
            ),
            (
                (10.0, 20, u32::MAX, 10_000),
                Some(("max_in_flight", "not 4294967295")),
            ),
            ((10.0, 20, 8, 99), Some(("timeout_ms", "from 100 to 60000"))),
            ((10.0, 20, 8, 60_001), Some(("timeout_ms", "not 60001"))),
        ];
        for &((rate, burst, in_flight, timeout), want) in cases {
            let got = check(rate, burst, in_flight, timeout);
            match (got, want) {
                (Ok(()), None) => {}
                (Err(e), Some((field, words))) => {
                    assert_eq!(e.field, field, "{rate} {burst} {in_flight} {timeout}");
                    assert!(e.to_string().contains(words), "{e} lacks {words:?}");
                }
                (got, want) => {
                    panic!("{rate} {burst} {in_flight} {timeout}: {got:?}, want {want:?}")
                }
            }
        }
    }

    /// At the slowest rate, the wait for the last token of the largest burst still fits.
    #[test]
    fn the_longest_wait_inside_the_bounds_is_finite() {
        let rate = Rate {
            per_sec: MIN_RATE_PER_SEC,
            burst: MAX_BURST,
        };
        let empty = Bucket {
            tokens: 0.0,
            updated_ms: 0,
        };
        let wait = empty.wait_ms(rate, MAX_BURST);
        assert_eq!(wait, 10_000_000_000_000);
        assert!(wait < i64::MAX as u64 / 1000);
    }
}
