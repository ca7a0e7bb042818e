//! The one log record per delivery outcome. Built from an allowlist of fields by construction:
//! it has no field that could hold a payload, a URL, a header, an address, a secret or a
//! response body.
//!
//! A call's records are written together, one JSON object per line ([`lines`]): the Worker
//! makes one `console.log` per call, not one per delivery, because each `console.log` has a
//! fixed cost on its way to the logs (about 1 ms of CPU under `wrangler dev`) that would
//! otherwise be paid a hundred times per batch (BENCHMARKS.md, "Where the time goes").

use serde::Serialize;

use crate::wire::{Delivery, DeliveryResult};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogRecord<'a> {
    pub delivery_id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub subscriber_id: &'a str,
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    pub attempt: u32,
}

impl<'a> LogRecord<'a> {
    pub fn new(subscriber_id: &'a str, delivery: &'a Delivery, result: &DeliveryResult) -> Self {
        let latency_ms = match result {
            DeliveryResult::Delivered { latency_ms, .. } => Some(*latency_ms),
            DeliveryResult::Failed { latency_ms, .. } => *latency_ms,
            _ => None,
        };
        LogRecord {
            delivery_id: &delivery.id,
            event_id: &delivery.event_id,
            event_type: &delivery.event_type,
            subscriber_id,
            outcome: result.outcome(),
            status: result.status(),
            latency_ms,
            attempt: delivery.attempt,
        }
    }

    pub fn to_json(&self) -> String {
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The records of one call, one JSON object per line, in the order of `deliveries` (each
/// delivery paired with its result; extra items on either side are ignored).
pub fn lines(subscriber_id: &str, deliveries: &[Delivery], results: &[DeliveryResult]) -> String {
    let mut out = String::with_capacity(deliveries.len() * 200);
    for (d, r) in deliveries.iter().zip(results) {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&LogRecord::new(subscriber_id, d, r).to_json());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowlisted_fields() {
        let d = Delivery {
            id: "dlv_1".into(),
            event_id: "evt_1".into(),
            event_type: "video.trending".into(),
            attempt: 2,
            body: "{\"email\":\"jane@example.com\"}".into(),
            sequence: Some(7),
            ordering_key: None,
            previous_sequence: None,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            batch: None,
        };
        let r = DeliveryResult::Failed {
            id: "dlv_1".into(),
            status: Some(500),
            retry_after_ms: None,
            response_body: Some("secret stack trace from 10.0.0.7".into()),
            error: None,
            latency_ms: Some(12),
        };
        let json = LogRecord::new("sub_a", &d, &r).to_json();
        assert_eq!(
            json,
            r#"{"delivery_id":"dlv_1","event_id":"evt_1","event_type":"video.trending","subscriber_id":"sub_a","outcome":"failed","status":500,"latency_ms":12,"attempt":2}"#
        );
    }

    #[test]
    fn one_line_per_outcome_in_delivery_order() {
        let d = |id: &str| Delivery {
            id: id.into(),
            event_id: format!("evt_{id}"),
            event_type: "user.signup".into(),
            attempt: 1,
            body: "{\"email\":\"jane@example.com\",\"note\":\"a\\nb\"}".into(),
            sequence: None,
            ordering_key: None,
            previous_sequence: None,
            traceparent: None,
            batch: None,
        };
        let deliveries = [d("a"), d("b"), d("c")];
        let results = [
            DeliveryResult::Delivered {
                id: "a".into(),
                status: 204,
                latency_ms: 3,
                failed: Vec::new(),
            },
            DeliveryResult::Rejected {
                id: "b".into(),
                status: Some(410),
                reason: "gone".into(),
                response_body: None,
            },
            DeliveryResult::Deferred {
                id: "c".into(),
                retry_after_ms: 100,
                reason: crate::wire::DeferReason::Rate,
            },
        ];
        let text = lines("sub_a", &deliveries, &results);
        let got: Vec<serde_json::Value> = text
            .split('\n')
            .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
            .collect();
        let outcomes: Vec<(&str, &str)> = got
            .iter()
            .map(|v| {
                (
                    v["delivery_id"].as_str().unwrap(),
                    v["outcome"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            outcomes,
            [("a", "delivered"), ("b", "rejected"), ("c", "deferred")]
        );
        assert!(!text.contains("jane"), "no payload in the records: {text}");
        assert_eq!(lines("sub_a", &[], &[]), "");
    }
}
