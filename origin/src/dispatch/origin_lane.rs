//! The origin lane: one signed POST per delivery from the daemon itself, through the daemon's
//! one outbound client (`crate::outbound`: no redirects, the guarded resolver, one signing
//! path), with the subscriber's timeout. It hands back the [`Attempted`] it made (the attempt
//! as made and its result), and does NOT decide what a result means (`super::state`).

use std::time::{Duration, Instant};

use fanout_core::retry::{parse_retry_after, Attempt};
use fanout_core::sign;
use fanout_core::wire::{TransportError, RESPONSE_BODY_LIMIT};

use super::vocab::Attempted;
use crate::outbound::{Outbound, Signer, Trust};
use crate::time::now_ms;

/// What one delivery needs to be sent.
#[derive(Debug, Clone)]
pub struct Outgoing<'a> {
    pub delivery_id: &'a str,
    pub event_id: &'a str,
    /// The subscriber's URL as `fanout_core::endpoint::check_url` accepted it (checked once
    /// per launch, not per delivery), or `None` when it refused it.
    pub url: Option<&'a url::Url>,
    pub signer: &'a Signer,
    pub timeout_ms: u64,
    /// Its `webhook-sequence` (0: none stored, no header).
    pub sequence: u64,
    /// An ordered delivery's `webhook-ordering-key` and `webhook-previous-sequence`
    /// (`model::Order::headers`).
    pub order: Option<(Option<String>, Option<u64>)>,
    /// Its `traceparent` header (`crate::trace`): only for a subscriber with `propagate_trace`.
    pub traceparent: Option<&'a str>,
    /// A batched webhook's `webhook-sequences` (`fanout_core::batch`).
    pub sequences: Option<String>,
}

/// Send one delivery: the attempt made, with its result as the edge would report it.
pub async fn deliver(out: &Outbound, s: &Outgoing<'_>, body: String) -> Attempted {
    deliver_reading(out, s, body, RESPONSE_BODY_LIMIT).await.0
}

/// Send one batched webhook: the attempt made, and up to `fanout_core::batch::ANSWER_LIMIT`
/// bytes of its answer's body (where a 2xx names the events that failed).
pub async fn deliver_batch(out: &Outbound, s: &Outgoing<'_>, body: String) -> (Attempted, String) {
    deliver_reading(out, s, body, fanout_core::batch::ANSWER_LIMIT).await
}

async fn deliver_reading(
    out: &Outbound,
    s: &Outgoing<'_>,
    body: String,
    limit: usize,
) -> (Attempted, String) {
    let Some(url) = s.url.cloned() else {
        let refused = Attempted::made(
            s.delivery_id,
            Attempt::Transport(TransportError::RefusedUrl),
            0,
            None,
        );
        return (refused, String::new());
    };
    let started = Instant::now();
    let mut extra: Vec<(&'static str, String)> = (s.sequence > 0)
        .then(|| (sign::HEADER_SEQUENCE, s.sequence.to_string()))
        .into_iter()
        .chain(s.traceparent.map(|t| ("traceparent", t.to_string())))
        .collect();
    if let Some((key, previous)) = &s.order {
        extra.extend(key.clone().map(|k| (sign::HEADER_ORDERING_KEY, k)));
        extra.extend(previous.map(|p| (sign::HEADER_PREVIOUS_SEQUENCE, p.to_string())));
    }
    if let Some(sequences) = &s.sequences {
        extra.push((fanout_core::batch::HEADER_SEQUENCES, sequences.clone()));
    }
    let sent = out
        .post_signed(
            Trust::Subscriber,
            url,
            s.signer,
            s.event_id,
            body,
            &extra,
            Duration::from_millis(s.timeout_ms),
        )
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let latency = started.elapsed().as_millis() as u64;
            let failed = Attempted::made(s.delivery_id, Attempt::Transport(e.kind), latency, None);
            return (failed, String::new());
        }
    };
    let status = resp.status().as_u16();
    let retry_after_ms = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, now_ms()));
    let body = read_prefix(resp, limit).await;
    let latency = started.elapsed().as_millis() as u64;
    let made = Attempted::made(
        s.delivery_id,
        Attempt::Status {
            status,
            retry_after_ms,
        },
        latency,
        Some(&body),
    );
    (made, body)
}

/// The first `limit` bytes of a response body (lossy UTF-8); a body that fails mid-way keeps
/// what arrived.
async fn read_prefix(mut resp: reqwest::Response, limit: usize) -> String {
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < limit {
        match resp.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    buf.truncate(limit);
    String::from_utf8_lossy(&buf).into_owned()
}
