//! The edge lane: one `POST {edge}/v1/deliveries` per call, signed with the edge key using the
//! Standard Webhooks headers over the exact request body. Deliveries are encoded once; calls
//! are cut by their encoded length, never over the edge's request limit. A call hands back
//! each delivery's [`Attempted`] (the edge's result and the attempt it stands for), or the
//! [`EdgeFailure`] of the whole call. It does NOT decide what is sent, retried or waited for
//! (`super::state`).

use std::collections::HashMap;
use std::time::Duration;

use fanout_core::sign::Secret;
use fanout_core::wire::{
    BatchResponse, DeferReason, Delivery, DeliveryBatch, DeliveryResult, ErrorBody, SubscriberSpec,
    MAX_BATCH, MAX_REQUEST_BYTES,
};

use super::vocab::{Attempted, EdgeFailure};
use crate::outbound::{Outbound, SendError, Signer, Trust};

/// Why a whole call came back without results.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("edge unreachable: {0}")]
    Unreachable(#[from] SendError),
    /// Shown with the edge's error code (a fixed word such as `object_unavailable`), never its
    /// message.
    #[error("edge answered {status}{}", error.as_ref().map(|b| format!(" ({})", b.error.code)).unwrap_or_default())]
    Status {
        status: u16,
        /// The edge's JSON error, when it sent one.
        error: Option<ErrorBody>,
    },
    #[error("edge answered something that is not a batch response")]
    BadResponse(#[source] serde_json::Error),
    #[error("the batch could not be encoded")]
    Encode(#[source] serde_json::Error),
}

/// What an edge error means for the batch (pure).
pub fn edge_failure(e: &EdgeError) -> EdgeFailure {
    match e {
        EdgeError::Status { status, error } => {
            let code = error.as_ref().map(|b| b.error.code.as_str());
            match (*status, code) {
                (400, Some("endpoint_refused")) => EdgeFailure::EndpointRefused {
                    error: error
                        .as_ref()
                        .map(|b| b.error.message.clone())
                        .unwrap_or_default(),
                },
                (401 | 408 | 429, _) => EdgeFailure::Transient {
                    error: e.to_string(),
                },
                (s @ 400..=499, _) => EdgeFailure::Refused {
                    status: s,
                    error: match error {
                        Some(b) => format!("{}: {}", b.error.code, b.error.message),
                        None => "no error body".into(),
                    },
                },
                _ => EdgeFailure::Transient {
                    error: e.to_string(),
                },
            }
        }
        EdgeError::Unreachable(_) | EdgeError::BadResponse(_) | EdgeError::Encode(_) => {
            EdgeFailure::Transient {
                error: e.to_string(),
            }
        }
    }
}

/// The edge's address, the key that signs calls to it, and the daemon's outbound client.
#[derive(Debug, Clone)]
pub struct EdgeClient {
    endpoint: String,
    signer: Signer,
    out: Outbound,
}

/// Room for the edge's own work and the network on top of the sends themselves.
const CALL_MARGIN_MS: u64 = 15_000;

/// How long the origin waits for one edge call of `n` deliveries to a subscriber with
/// `timeout_ms`: the edge keeps at most `MAX_OPEN_SENDS` sends open (6 by default), so the call
/// takes up to `ceil(n / 6)` rounds of `timeout_ms`, and it grants no more rounds than fit in
/// `CALL_SEND_WINDOW_MS`; then one more timeout (a send started at the end of the window) and
/// a margin. An edge whose `MAX_OPEN_SENDS` is set below 6 can take longer; such a call is
/// then deferred (no attempt spent) and its deliveries may arrive twice.
pub fn call_timeout(n: usize, timeout_ms: u64) -> Duration {
    let open = u64::from(fanout_core::edge_limits::DEFAULT_MAX_OPEN_SENDS);
    let rounds = (n as u64).div_ceil(open).max(1);
    let window = rounds
        .saturating_mul(timeout_ms)
        .min(fanout_core::edge_limits::CALL_SEND_WINDOW_MS);
    Duration::from_millis(window + timeout_ms + CALL_MARGIN_MS)
}

impl EdgeClient {
    pub fn new(base_url: &str, key: Secret, out: Outbound) -> EdgeClient {
        EdgeClient {
            endpoint: format!("{}/v1/deliveries", base_url.trim_end_matches('/')),
            signer: Signer::key(key),
            out,
        }
    }

    /// Send one batch (encoding it first).
    pub async fn send_batch(
        &self,
        batch: &DeliveryBatch,
        call_id: &str,
    ) -> Result<Vec<DeliveryResult>, EdgeError> {
        let body = serde_json::to_vec(batch).map_err(EdgeError::Encode)?;
        let wait = call_timeout(batch.deliveries.len(), batch.subscriber.timeout_ms);
        self.send(body, call_id, wait).await
    }

    /// Send one encoded call ([`batch_body`]), waiting at most `timeout` ([`call_timeout`]); on
    /// success, the edge's per-delivery results.
    pub async fn send(
        &self,
        body: Vec<u8>,
        call_id: &str,
        timeout: Duration,
    ) -> Result<Vec<DeliveryResult>, EdgeError> {
        let resp = self
            .out
            .post_signed(
                Trust::Operator,
                self.endpoint.as_str(),
                &self.signer,
                call_id,
                body,
                &[],
                timeout,
            )
            .await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(SendError::from)?;
        if status != 200 && status != 202 {
            let error = serde_json::from_slice::<ErrorBody>(&bytes).ok();
            return Err(EdgeError::Status { status, error });
        }
        let parsed: BatchResponse =
            serde_json::from_slice(&bytes).map_err(EdgeError::BadResponse)?;
        Ok(parsed.results)
    }
}

/// One delivery as the edge call carries it.
pub fn encode_delivery(d: &Delivery) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(d)
}

const BODY_HEAD: &[u8] = b"{\"subscriber\":";
const BODY_MIDDLE: &[u8] = b",\"deliveries\":[";
const BODY_TAIL: &[u8] = b"]}";

/// The bytes of a call's body around its deliveries.
pub fn fixed_len(spec_json: &[u8]) -> usize {
    BODY_HEAD.len() + spec_json.len() + BODY_MIDDLE.len() + BODY_TAIL.len()
}

/// A `DeliveryBatch` body from encoded parts: `{"subscriber":…,"deliveries":[…]}`.
pub fn batch_body(spec_json: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let len = fixed_len(spec_json) + parts.iter().map(|p| p.len() + 1).sum::<usize>();
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(BODY_HEAD);
    body.extend_from_slice(spec_json);
    body.extend_from_slice(BODY_MIDDLE);
    for (k, p) in parts.iter().enumerate() {
        if k > 0 {
            body.push(b',');
        }
        body.extend_from_slice(p);
    }
    body.extend_from_slice(BODY_TAIL);
    body
}

/// The spec of a call, encoded.
pub fn encode_spec(spec: &SubscriberSpec) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(spec)
}

/// Cut deliveries of encoded sizes `sizes` into calls, in order: at most `per_call` (and
/// [`MAX_BATCH`]) each, and a body (`fixed` bytes plus the deliveries and their commas) of at
/// most `max_bytes` (the edge's [`MAX_REQUEST_BYTES`]). Returns the calls as index lists, and
/// the deliveries too large for any call.
pub fn split_calls(
    sizes: &[usize],
    fixed: usize,
    per_call: usize,
    max_bytes: usize,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let per_call = per_call.clamp(1, MAX_BATCH);
    let mut calls: Vec<Vec<usize>> = Vec::new();
    let mut too_big = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut bytes = fixed;
    for (i, &size) in sizes.iter().enumerate() {
        if fixed + size > max_bytes {
            too_big.push(i);
            continue;
        }
        let extra = size + usize::from(!cur.is_empty());
        if !cur.is_empty() && (cur.len() >= per_call || bytes + extra > max_bytes) {
            calls.push(std::mem::take(&mut cur));
            bytes = fixed;
        }
        bytes += size + usize::from(!cur.is_empty());
        cur.push(i);
    }
    if !cur.is_empty() {
        calls.push(cur);
    }
    (calls, too_big)
}

/// The edge's request limit.
pub const EDGE_MAX_BYTES: usize = MAX_REQUEST_BYTES;

/// The edge's results as the attempts they stand for, in the order of `ids`; a delivery the
/// edge did not answer for is deferred briefly (it will be sent again, never lost).
pub fn pair_results(ids: &[String], results: Vec<DeliveryResult>) -> Vec<Attempted> {
    let mut by_id: HashMap<String, DeliveryResult> = results
        .into_iter()
        .map(|r| (r.id().to_string(), r))
        .collect();
    ids.iter()
        .map(|id| {
            let result = by_id
                .remove(id)
                .unwrap_or_else(|| DeliveryResult::Deferred {
                    id: id.clone(),
                    retry_after_ms: fanout_core::limiter::IN_FLIGHT_RETRY_MS,
                    reason: DeferReason::InFlight,
                });
            Attempted::reported(result)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_timeout_table() {
        // (deliveries, subscriber timeout ms) -> seconds the origin waits for the call
        let cases: &[(usize, u64, u64)] = &[
            (1, 1_000, 17),     // one round, one more timeout, the margin
            (6, 10_000, 35),    // six fit in one round
            (100, 1_000, 33),   // 17 rounds of 1 s
            (100, 3_000, 69),   // 17 rounds of 3 s
            (500, 60_000, 315), // capped at the edge's 240 s send window
            (0, 10_000, 35),
        ];
        for &(n, timeout_ms, secs) in cases {
            assert_eq!(
                call_timeout(n, timeout_ms),
                Duration::from_secs(secs),
                "{n} x {timeout_ms}"
            );
        }
    }

    #[test]
    fn a_lease_outlasts_the_longest_edge_call() {
        let longest = call_timeout(
            fanout_core::wire::MAX_BATCH,
            fanout_core::wire::MAX_TIMEOUT_MS,
        );
        assert!(
            longest.as_millis() < crate::dispatch::LEASE_MS as u128,
            "{longest:?}"
        );
    }

    #[test]
    fn split_table() {
        // (sizes, fixed, per_call, max_bytes) -> (calls, too big)
        type Case = (
            &'static [usize],
            usize,
            usize,
            usize,
            &'static [&'static [usize]],
            &'static [usize],
        );
        let cases: &[Case] = &[
            (
                &[10, 10, 10, 10, 10],
                20,
                2,
                1000,
                &[&[0, 1], &[2, 3], &[4]],
                &[],
            ),
            (&[10, 10, 10, 10], 20, 10, 1000, &[&[0, 1, 2, 3]], &[]),
            (&[], 20, 10, 1000, &[], &[]),
            // 20 + 10 + 1 + 10 = 41 fits 41; a third would not.
            (&[10, 10, 10], 20, 10, 41, &[&[0, 1], &[2]], &[]),
            (&[10, 10, 10], 20, 10, 40, &[&[0], &[1], &[2]], &[]),
            // One delivery that cannot fit any call is set apart; the others go on.
            (&[10, 500, 10], 20, 10, 100, &[&[0, 2]], &[1]),
            (&[81], 20, 10, 100, &[], &[0]),
            (&[80], 20, 10, 100, &[&[0]], &[]),
        ];
        for &(sizes, fixed, per_call, max, calls, too_big) in cases {
            let (got_calls, got_big) = split_calls(sizes, fixed, per_call, max);
            let want: Vec<Vec<usize>> = calls.iter().map(|c| c.to_vec()).collect();
            assert_eq!(
                (got_calls, got_big),
                (want, too_big.to_vec()),
                "{sizes:?} {fixed} {per_call} {max}"
            );
        }
        // Never more than MAX_BATCH per call.
        let many = vec![1usize; MAX_BATCH + 3];
        let (calls, _) = split_calls(&many, 10, usize::MAX, usize::MAX);
        assert_eq!(
            calls.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![MAX_BATCH, 3]
        );
    }

    /// The body cut by `split_calls` is exactly as long as it computed, and parses as a batch.
    #[test]
    fn encoded_body_is_a_batch_of_the_computed_length() {
        let spec = SubscriberSpec {
            id: "sub_a".into(),
            url: "https://example.com/h".into(),
            secrets: vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
            rate_per_sec: 10.0,
            burst: 20,
            max_in_flight: 8,
            timeout_ms: 1000,
            legacy_signature: false,
            signature: Default::default(),
            signing_keys: Vec::new(),
            breaker: None,
        };
        let ds: Vec<Delivery> = (1..=3)
            .map(|i| Delivery {
                id: format!("dlv_{i}"),
                event_id: format!("e{i}"),
                event_type: "t".into(),
                attempt: 1,
                body: format!("{{\"n\":{i},\"s\":\"\\\"quoted\\\" ü\"}}"),
                sequence: (i > 1).then_some(i as u64),
                ordering_key: None,
                previous_sequence: None,
                traceparent: None,
                batch: None,
            })
            .collect();
        let spec_json = encode_spec(&spec).unwrap();
        let parts: Vec<Vec<u8>> = ds.iter().map(|d| encode_delivery(d).unwrap()).collect();
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        let total = fixed_len(&spec_json) + sizes.iter().sum::<usize>() + sizes.len() - 1;
        let (calls, big) = split_calls(&sizes, fixed_len(&spec_json), 10, total);
        assert_eq!((calls.len(), big.len()), (1, 0));
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let body = batch_body(&spec_json, &refs);
        assert_eq!(body.len(), total);
        let back: fanout_core::wire::DeliveryBatch = serde_json::from_slice(&body).unwrap();
        assert_eq!((back.subscriber, back.deliveries), (spec, ds));
        // One byte less and it takes two calls.
        let (calls, _) = split_calls(&sizes, fixed_len(&spec_json), 10, total - 1);
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn edge_failures_table() {
        let body = |code: &str| Some(ErrorBody::new(code, "m"));
        let status = |status, error| EdgeError::Status { status, error };
        let cases: Vec<(EdgeError, &str)> = vec![
            (status(400, body("endpoint_refused")), "endpoint"),
            (status(400, body("invalid_request")), "refused"),
            (status(413, None), "refused"),
            (status(422, body("x")), "refused"),
            (status(401, body("unauthorized")), "transient"),
            (status(408, None), "transient"),
            (status(429, None), "transient"),
            (status(500, None), "transient"),
            (status(503, body("overloaded")), "transient"),
            (
                EdgeError::BadResponse(serde_json::from_str::<u8>("x").unwrap_err()),
                "transient",
            ),
        ];
        for (err, expected) in cases {
            let got = match edge_failure(&err) {
                EdgeFailure::Transient { .. } => "transient",
                EdgeFailure::EndpointRefused { .. } => "endpoint",
                EdgeFailure::Refused { .. } => "refused",
            };
            assert_eq!(got, expected, "{err:?}");
        }
    }

    #[test]
    fn results_pair_up_and_missing_ones_are_deferred() {
        let ids = vec![
            "dlv_1".to_string(),
            "dlv_2".to_string(),
            "dlv_3".to_string(),
        ];
        let results = vec![
            DeliveryResult::Delivered {
                id: "dlv_3".into(),
                status: 200,
                latency_ms: 1,
                failed: Vec::new(),
            },
            DeliveryResult::Rejected {
                id: "dlv_1".into(),
                status: Some(410),
                reason: "gone".into(),
                response_body: None,
            },
            DeliveryResult::Delivered {
                id: "dlv_99".into(),
                status: 200,
                latency_ms: 1,
                failed: Vec::new(),
            },
        ];
        let paired = pair_results(&ids, results);
        let got: Vec<(&str, &str, bool)> = paired
            .iter()
            .map(|a| (a.result.id(), a.result.outcome(), a.attempt.is_some()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("dlv_1", "rejected", true),
                ("dlv_2", "deferred", false),
                ("dlv_3", "delivered", true)
            ]
        );
        let owned = pair_results(&ids, vec![]);
        assert!(owned.iter().all(|a| a.result.outcome() == "deferred"));
    }
}
