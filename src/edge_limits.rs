//! The edge's platform limits as settings: wrangler `[vars]` (or `--var`), each with a default
//! that fits Workers Paid. Parsed here, purely, from a lookup the Worker hands in; the Worker
//! refuses to work (500 `misconfigured`) with a value this rejects, rather than guess.

use crate::wire::{MAX_BATCH, MAX_REQUEST_BYTES};

/// Cloudflare lets one invocation keep 6 outbound connections open; further fetches wait for
/// one to close, and the wait counts against their own timeouts.
pub const DEFAULT_MAX_OPEN_SENDS: u32 = 6;
/// Subrequests one invocation may make on Workers Paid (50 on the Free plan).
pub const DEFAULT_SUBREQUEST_LIMIT: u32 = 10_000;

/// A call's sends are all signed when it starts; the last of them must still reach the
/// subscriber within the Standard Webhooks tolerance (300 s) of that timestamp. Waves of
/// `max_open_sends` start at most this long after the first.
pub const CALL_SEND_WINDOW_MS: u64 = 240_000;

/// The variables, by name.
pub const VAR_MAX_OPEN_SENDS: &str = "MAX_OPEN_SENDS";
pub const VAR_SUBREQUEST_LIMIT: &str = "SUBREQUEST_LIMIT";
pub const VAR_MAX_DELIVERIES_PER_CALL: &str = "MAX_DELIVERIES_PER_CALL";
pub const VAR_MAX_REQUEST_BYTES: &str = "MAX_REQUEST_BYTES";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeLimits {
    /// Sends one call keeps open at once; the rest of its granted deliveries wait for a slot.
    pub max_open_sends: u32,
    /// Fetches one call may make: a call is granted at most this many sends, the rest deferred.
    pub subrequest_limit: u32,
    /// Deliveries in one `POST /v1/deliveries` (at most [`MAX_BATCH`]); more is 413.
    pub max_deliveries_per_call: usize,
    /// Bytes of one `POST /v1/deliveries` body (at most [`MAX_REQUEST_BYTES`]); more is 413.
    pub max_request_bytes: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            max_open_sends: DEFAULT_MAX_OPEN_SENDS,
            subrequest_limit: DEFAULT_SUBREQUEST_LIMIT,
            max_deliveries_per_call: MAX_BATCH,
            max_request_bytes: MAX_REQUEST_BYTES,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} = {value:?}: must be a whole number from {min} to {max}")]
pub struct LimitError {
    pub name: &'static str,
    pub value: String,
    pub min: u64,
    pub max: u64,
}

impl EdgeLimits {
    /// The most sends one call may be granted for a subscriber with this `timeout_ms`: never
    /// more fetches than the subrequest limit, and never more waves of `max_open_sends` than
    /// start within [`CALL_SEND_WINDOW_MS`] when every send takes its full timeout (so no
    /// signature is stale on arrival, and the call ends within about 300 s). The rest of the
    /// batch is deferred.
    pub fn max_sends_per_call(&self, timeout_ms: u64) -> u32 {
        let waves = (CALL_SEND_WINDOW_MS / timeout_ms.max(1)).max(1);
        let by_time = u64::from(self.max_open_sends).saturating_mul(waves);
        by_time.min(u64::from(self.subrequest_limit)) as u32
    }

    /// Read every limit through `var` (unset or empty: the default).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<EdgeLimits, LimitError> {
        let d = EdgeLimits::default();
        let get = |name: &'static str, default: u64, min: u64, max: u64| {
            let Some(text) = var(name).filter(|t| !t.trim().is_empty()) else {
                return Ok(default);
            };
            text.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or(LimitError {
                    name,
                    value: text,
                    min,
                    max,
                })
        };
        Ok(EdgeLimits {
            max_open_sends: get(VAR_MAX_OPEN_SENDS, d.max_open_sends.into(), 1, 1000)? as u32,
            subrequest_limit: get(
                VAR_SUBREQUEST_LIMIT,
                d.subrequest_limit.into(),
                1,
                u32::MAX.into(),
            )? as u32,
            max_deliveries_per_call: get(
                VAR_MAX_DELIVERIES_PER_CALL,
                d.max_deliveries_per_call as u64,
                1,
                MAX_BATCH as u64,
            )? as usize,
            max_request_bytes: get(
                VAR_MAX_REQUEST_BYTES,
                d.max_request_bytes as u64,
                1024,
                MAX_REQUEST_BYTES as u64,
            )? as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(vars: &[(&str, &str)], expected: Result<EdgeLimits, &str>) {
        let got = EdgeLimits::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        });
        match expected {
            Ok(limits) => assert_eq!(got, Ok(limits), "{vars:?}"),
            Err(message) => assert_eq!(got.unwrap_err().to_string(), message, "{vars:?}"),
        }
    }

    #[test]
    fn sends_per_call_table() {
        let d = EdgeLimits::default();
        let free = EdgeLimits {
            subrequest_limit: 50,
            ..d
        };
        let one = EdgeLimits {
            max_open_sends: 1,
            ..d
        };
        // (limits, timeout_ms, most sends per call)
        let rows: &[(EdgeLimits, u64, u32)] = &[
            (d, 100, 10_000),  // 2,400 waves of 6: the subrequest limit binds
            (d, 1_000, 1_440), // 240 waves of 6
            (d, 3_000, 480),   // 80 waves
            (d, 10_000, 144),  // 24 waves
            (d, 60_000, 24),   // 4 waves
            (d, 240_001, 6),   // at least one wave
            (free, 1_000, 50), // Free plan: 50 subrequests
            (free, 60_000, 24),
            (one, 60_000, 4),
        ];
        for &(limits, timeout_ms, expected) in rows {
            assert_eq!(
                limits.max_sends_per_call(timeout_ms),
                expected,
                "{limits:?} {timeout_ms}"
            );
        }
    }

    #[test]
    fn limits_table() {
        let d = EdgeLimits::default();
        assert_eq!(
            d,
            EdgeLimits {
                max_open_sends: 6,
                subrequest_limit: 10_000,
                max_deliveries_per_call: 500,
                max_request_bytes: 8 * 1024 * 1024,
            }
        );
        check(&[], Ok(d));
        check(&[("MAX_OPEN_SENDS", ""), ("SUBREQUEST_LIMIT", " ")], Ok(d));
        check(
            &[
                ("MAX_OPEN_SENDS", "2"),
                ("SUBREQUEST_LIMIT", " 50 "),
                ("MAX_DELIVERIES_PER_CALL", "100"),
                ("MAX_REQUEST_BYTES", "1048576"),
            ],
            Ok(EdgeLimits {
                max_open_sends: 2,
                subrequest_limit: 50,
                max_deliveries_per_call: 100,
                max_request_bytes: 1 << 20,
            }),
        );
        check(
            &[("MAX_OPEN_SENDS", "0")],
            Err("MAX_OPEN_SENDS = \"0\": must be a whole number from 1 to 1000"),
        );
        check(
            &[("MAX_OPEN_SENDS", "six")],
            Err("MAX_OPEN_SENDS = \"six\": must be a whole number from 1 to 1000"),
        );
        check(
            &[("SUBREQUEST_LIMIT", "-1")],
            Err("SUBREQUEST_LIMIT = \"-1\": must be a whole number from 1 to 4294967295"),
        );
        check(
            &[("MAX_DELIVERIES_PER_CALL", "501")],
            Err("MAX_DELIVERIES_PER_CALL = \"501\": must be a whole number from 1 to 500"),
        );
        check(
            &[("MAX_REQUEST_BYTES", "9000000")],
            Err("MAX_REQUEST_BYTES = \"9000000\": must be a whole number from 1024 to 8388608"),
        );
    }
}
