//! The one log record per delivery outcome. Built from an allowlist of fields by construction:
//! it has no field that could hold a payload, a URL, a header, an address, a secret or a
//! response body.

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
}
