//! Token bucket arithmetic: capacity `burst`, refill `rate_per_sec`, refilled lazily from the
//! stored time. Used by the edge's Durable Object and by the origin lane's SQLite bucket.

use serde::{Deserialize, Serialize};

/// Slack for floating-point refill: a token that is 0.999_999_9 of the way there counts.
const EPSILON: f64 = 1e-6;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: u32,
}

impl Rate {
    /// How many tokens the bucket may hold while `in_flight` sends are still open: `burst` less
    /// those sends, never below zero.
    pub fn room(&self, in_flight: u32) -> f64 {
        (f64::from(self.burst) - f64::from(in_flight)).max(0.0)
    }
}

/// The stored state: tokens as of `updated_ms` (unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    pub tokens: f64,
    pub updated_ms: i64,
}

impl Bucket {
    /// A new subscriber starts with a full burst.
    pub fn full(rate: Rate, now_ms: i64) -> Bucket {
        Bucket {
            tokens: f64::from(rate.burst),
            updated_ms: now_ms,
        }
    }

    /// Add what accrued since `updated_ms`, capped at `room` (at most `burst`), and move
    /// `updated_ms` to now. A clock that steps backwards adds nothing and keeps the later time.
    ///
    /// `room` is `burst` less the sends still in flight (see [`Rate::room`]): a send counts
    /// against the subscriber's burst until its answer is back, because the subscriber may
    /// register it at any instant in between. The caller refills whenever the number in flight
    /// changes, so the cap that held over each stretch of time is the one applied to it.
    pub fn refill(&mut self, rate: Rate, room: f64, now_ms: i64) {
        if now_ms > self.updated_ms {
            let elapsed = (now_ms - self.updated_ms) as f64;
            self.tokens += elapsed * rate.per_sec / 1000.0;
            self.updated_ms = now_ms;
        }
        self.tokens = self.tokens.min(room.min(f64::from(rate.burst))).max(0.0);
    }

    /// Refill (within `room`), then take up to `want` whole tokens; returns how many were taken.
    /// The refill is kept even when nothing could be taken, so a busy subscriber still accrues
    /// tokens.
    pub fn take(&mut self, rate: Rate, room: f64, now_ms: i64, want: u32) -> u32 {
        self.refill(rate, room, now_ms);
        let whole = (self.tokens + EPSILON).floor().max(0.0);
        let granted = f64::from(want).min(whole);
        self.tokens = (self.tokens - granted).max(0.0);
        granted as u32
    }

    /// Milliseconds from `updated_ms` until the bucket holds `k` tokens (k ≥ 1), assuming tokens
    /// are spent as they arrive. The k-th waiter waits longer than the first.
    pub fn wait_ms(&self, rate: Rate, k: u32) -> u64 {
        let missing = f64::from(k) - self.tokens;
        if missing <= EPSILON {
            return 0;
        }
        (missing * 1000.0 / rate.per_sec).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Rate = Rate {
        per_sec: 10.0,
        burst: 20,
    };

    #[test]
    fn take_table() {
        // (start tokens, start ms, now ms, want) -> (granted, tokens after)
        let cases: &[(f64, i64, i64, u32, u32, f64)] = &[
            (20.0, 0, 0, 5, 5, 15.0),
            (20.0, 0, 0, 25, 20, 0.0),
            (0.0, 0, 100, 5, 1, 0.0),      // 100 ms at 10/s = 1 token
            (0.0, 0, 99, 5, 0, 0.99),      // not quite one token: nothing, refill kept
            (0.0, 0, 10_000, 50, 20, 0.0), // capped at burst
            (5.0, 1000, 500, 3, 3, 2.0),   // clock went backwards: no refill
            (0.5, 0, 50, 1, 1, 0.0),
        ];
        for &(tokens, updated_ms, now, want, granted, after) in cases {
            let mut b = Bucket { tokens, updated_ms };
            assert_eq!(
                b.take(R, R.room(0), now, want),
                granted,
                "case {tokens} {updated_ms} {now} {want}"
            );
            assert!(
                (b.tokens - after).abs() < 1e-9,
                "tokens after: {} vs {after}",
                b.tokens
            );
            assert_eq!(b.updated_ms, now.max(updated_ms));
        }
    }

    #[test]
    fn denied_request_still_stores_refill() {
        // The seed's bug: a denial that does not store the refill stalls a busy subscriber.
        let mut b = Bucket {
            tokens: 0.0,
            updated_ms: 0,
        };
        for now in (10..100).step_by(10) {
            assert_eq!(b.take(R, R.room(0), now, 1), 0);
        }
        assert_eq!(
            b.take(R, R.room(0), 100, 1),
            1,
            "tokens accrued across denials"
        );
    }

    #[test]
    fn wait_grows_with_position() {
        let b = Bucket {
            tokens: 0.25,
            updated_ms: 0,
        };
        let waits: Vec<u64> = (1..=5).map(|k| b.wait_ms(R, k)).collect();
        assert_eq!(waits, vec![75, 175, 275, 375, 475]);
        let full = Bucket::full(R, 0);
        assert_eq!(full.wait_ms(R, 20), 0);
        assert_eq!(full.wait_ms(R, 21), 100);
    }

    #[test]
    fn waiting_the_advertised_time_yields_the_token() {
        let mut b = Bucket {
            tokens: 0.0,
            updated_ms: 0,
        };
        for k in 1..=30u32 {
            let w = b.wait_ms(R, 1);
            let now = b.updated_ms + w as i64;
            assert_eq!(
                b.take(R, R.room(0), now, 1),
                1,
                "token {k} after waiting {w} ms"
            );
        }
        // Over any window the sustained rate holds: 30 tokens took 3 s.
        assert_eq!(b.updated_ms, 3000);
    }

    #[test]
    fn fractional_rates() {
        let slow = Rate {
            per_sec: 0.5,
            burst: 1,
        };
        let mut b = Bucket {
            tokens: 0.0,
            updated_ms: 0,
        };
        assert_eq!(b.wait_ms(slow, 1), 2000);
        assert_eq!(b.take(slow, slow.room(0), 1999, 1), 0);
        assert_eq!(b.take(slow, slow.room(0), 2000, 1), 1);
    }

    #[test]
    fn open_sends_hold_the_room_down() {
        // (tokens, in flight, elapsed ms) -> tokens after the refill
        let cases: &[(f64, u32, i64, f64)] = &[
            (0.0, 20, 500, 0.0),  // the whole burst is out: nothing accrues
            (0.0, 15, 1000, 5.0), // room for 5, 10 accrued
            (3.0, 15, 100, 4.0),  // under the room: plain refill
            (18.0, 5, 0, 15.0),   // more than the room (burst lowered): cut to it
            (0.0, 30, 1000, 0.0), // more in flight than the burst: no room, never negative
            (0.0, 0, 10_000, 20.0),
        ];
        for &(tokens, in_flight, elapsed, after) in cases {
            let mut b = Bucket {
                tokens,
                updated_ms: 0,
            };
            b.refill(R, R.room(in_flight), elapsed);
            assert!(
                (b.tokens - after).abs() < 1e-9,
                "case {tokens} {in_flight} {elapsed}: {} vs {after}",
                b.tokens
            );
        }
    }
}
