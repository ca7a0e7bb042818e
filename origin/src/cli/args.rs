//! Readers of the flag values the subscriber commands share (pure): a JSON argument, a lane,
//! an ordering, a signature scheme, a payload, each refused with the values it may take.

use crate::model::{Lane, Ordering, Payload, Scheme};

/// A JSON argument (a filter), checked by the daemon.
pub(super) fn parse_json_arg(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

pub(super) fn parse_lane(s: &str) -> Result<Lane, String> {
    Lane::parse(s).ok_or_else(|| format!("{s:?} is not a lane: edge, origin or auto"))
}

pub(super) fn parse_ordering(s: &str) -> Result<Ordering, String> {
    Ordering::parse(s).ok_or_else(|| format!("{s:?} is not an ordering: none, subscriber or key"))
}

pub(super) fn parse_signature(s: &str) -> Result<Scheme, String> {
    Scheme::parse(s)
        .ok_or_else(|| format!("{s:?} is not a signature scheme: hmac, ed25519 or both"))
}

pub(super) fn parse_payload(s: &str) -> Result<Payload, String> {
    Payload::parse(s).ok_or_else(|| format!("{s:?} is not a payload: full or thin"))
}
