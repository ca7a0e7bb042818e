//! Batched webhooks: one signed request carrying several events (`"batch"` on a subscriber).
//! The one definition of a batch's bounds, its body, its `webhook-id`, and how its answer is
//! read per event — the origin forms and sends batches on its lane and hands them to the edge
//! as one delivery each; the edge reads the answer's `failed` list with [`failed_of`].
//!
//! A batch is one request: it takes one token of the subscriber's rate and one slot of its
//! in-flight cap. Its body is `{"events":[…]}`, each element byte for byte the body that event
//! alone would have carried (the event's, or a thin one). Its answer decides per event: a 2xx
//! marks them all sent unless its JSON body is `{"failed":["evt_…",…]}`, and then only those
//! named (among the batch's own events) are retried; any other answer is each event's own
//! failed attempt.
//!
//! Pure: no I/O, no clock.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::wire::{DeliveryResult, TransportError};

/// Bounds on `max_events`, `max_bytes` (kept with the other bounds) and `max_wait_ms`.
pub use crate::limits::{BATCH_MAX_BYTES as MAX_BYTES, BATCH_MAX_EVENTS as MAX_EVENTS};
pub const MAX_WAIT_MS: u32 = 10_000;
/// The smallest `max_bytes`: room for the envelope and one small event.
pub const MIN_BYTES: u32 = 64;
/// How much of a 2xx answer to a batch is read for its `failed` list: the ids of a full batch
/// (1,000 ids of up to 255 bytes, quoted and separated) fit. A longer answer is not read
/// further and names nothing (every event of the batch counts as sent, as with any 2xx).
pub const ANSWER_LIMIT: usize = 512 * 1024;
/// The header listing each element's `webhook-sequence`, in the batch's order (comma-separated);
/// `webhook-sequence` itself is the first element's.
pub const HEADER_SEQUENCES: &str = "webhook-sequences";

/// A subscriber's batching: at most `max_events` events or `max_bytes` bytes of body per
/// request, whichever comes first, and no event waits more than `max_wait_ms` for its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    pub max_events: u32,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u32,
    #[serde(default)]
    pub max_wait_ms: u32,
}

fn default_max_bytes() -> u32 {
    MAX_BYTES
}

/// A bound a batch setting is outside of: which field, and the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("batch.{field} {message}")]
pub struct SpecError {
    pub field: &'static str,
    pub message: String,
}

impl BatchSpec {
    /// Check the bounds: `max_events` 1–1000, `max_bytes` 64 B–1 MiB, `max_wait_ms` 0–10,000.
    pub fn check(&self) -> Result<(), SpecError> {
        let bad = |field, message: String| Err(SpecError { field, message });
        if !(1..=MAX_EVENTS).contains(&self.max_events) {
            return bad(
                "max_events",
                format!("must be 1 to {MAX_EVENTS}, not {}", self.max_events),
            );
        }
        if !(MIN_BYTES..=MAX_BYTES).contains(&self.max_bytes) {
            return bad(
                "max_bytes",
                format!(
                    "must be {MIN_BYTES} to {MAX_BYTES} (1 MiB), not {}",
                    self.max_bytes
                ),
            );
        }
        if self.max_wait_ms > MAX_WAIT_MS {
            return bad(
                "max_wait_ms",
                format!("must be 0 to {MAX_WAIT_MS}, not {}", self.max_wait_ms),
            );
        }
        Ok(())
    }

    /// Cut `sizes` (each event's body length, in the order they go) into consecutive batches:
    /// each takes events while it has fewer than `max_events` and its body stays within
    /// `max_bytes` (an event larger than `max_bytes` alone goes alone). Returns each batch's
    /// number of events.
    pub fn cut(&self, sizes: &[usize]) -> Vec<usize> {
        let most = self.max_events.max(1) as usize;
        let room = self.max_bytes as usize;
        let mut out = Vec::new();
        let (mut n, mut bytes) = (0usize, ENVELOPE);
        for &size in sizes {
            let more = size + usize::from(n > 0);
            if n > 0 && (n == most || bytes + more > room) {
                out.push(n);
                (n, bytes) = (0, ENVELOPE);
            }
            bytes += size + usize::from(n > 0);
            n += 1;
        }
        if n > 0 {
            out.push(n);
        }
        out
    }
}

/// `{"events":[` and `]}`.
const ENVELOPE: usize = 13;

/// A batch's body: `{"events":[e1,e2,…]}`, each element the exact bytes given (each a JSON
/// value: an event's stored body, or a thin one).
pub fn body<S: AsRef<str>>(elements: &[S]) -> String {
    let len = elements.iter().map(|e| e.as_ref().len() + 1).sum::<usize>() + ENVELOPE;
    let mut out = String::with_capacity(len);
    out.push_str("{\"events\":[");
    for (i, e) in elements.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(e.as_ref());
    }
    out.push_str("]}");
    out
}

/// A batch's own `webhook-id`: `msg_batch_` and a digest of its events' ids in order, so the
/// same events sent together again carry the same id (a receiver may dedupe on it; each
/// element still has its own event `id`).
pub fn webhook_id<S: AsRef<str>>(event_ids: &[S]) -> String {
    let mut h = Sha256::new();
    for id in event_ids {
        h.update(id.as_ref().as_bytes());
        h.update([0u8]);
    }
    let digest = h.finalize();
    let mut out = String::from("msg_batch_");
    for b in &digest[..12] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The `webhook-sequences` header's value: each element's sequence, comma-separated.
pub fn sequences_header(sequences: &[u64]) -> String {
    let parts: Vec<String> = sequences.iter().map(u64::to_string).collect();
    parts.join(",")
}

/// The events a 2xx answer to a batch names as failed: the ids in its JSON body's `failed`
/// array that belong to the batch (`members`, its events' ids), each once, in the batch's
/// order. Anything else — no body, not JSON, no `failed`, not an array, ids not in the
/// batch — names nothing.
pub fn failed_of<S: AsRef<str>>(answer: &str, members: &[S]) -> Vec<usize> {
    #[derive(Deserialize)]
    struct Answer {
        failed: Vec<serde_json::Value>,
    }
    let Ok(a) = serde_json::from_str::<Answer>(answer) else {
        return Vec::new();
    };
    let named: std::collections::HashSet<&str> =
        a.failed.iter().filter_map(|v| v.as_str()).collect();
    members
        .iter()
        .enumerate()
        .filter(|(_, m)| named.contains(m.as_ref()))
        .map(|(i, _)| i)
        .collect()
}

/// Each event's result from its batch's (`request`, whatever its id): a 2xx marks every event
/// delivered except those at the `failed` indexes, each a failed attempt of its own
/// ([`TransportError::NamedFailed`], retried as any); any other answer (a failure, a refusal,
/// a deferral) is every event's. `member_ids` are the events' delivery ids, in the batch's
/// order.
pub fn member_results(
    request: &DeliveryResult,
    member_ids: &[String],
    failed: &[usize],
) -> Vec<DeliveryResult> {
    member_ids
        .iter()
        .enumerate()
        .map(|(i, id)| match request {
            DeliveryResult::Delivered { latency_ms, .. } if failed.contains(&i) => {
                DeliveryResult::Failed {
                    id: id.clone(),
                    status: None,
                    retry_after_ms: None,
                    response_body: None,
                    error: Some(TransportError::NamedFailed),
                    latency_ms: Some(*latency_ms),
                }
            }
            other => {
                let mut r = other.clone();
                r.set_id(id);
                if let DeliveryResult::Delivered { failed, .. } = &mut r {
                    failed.clear();
                }
                r
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_events: u32, max_bytes: u32) -> BatchSpec {
        BatchSpec {
            max_events,
            max_bytes,
            max_wait_ms: 0,
        }
    }

    #[test]
    fn bounds_table() {
        let cases: &[(u32, u32, u32, Option<&str>)] = &[
            (1, MAX_BYTES, 0, None),
            (1000, MIN_BYTES, 10_000, None),
            (
                0,
                MAX_BYTES,
                0,
                Some("batch.max_events must be 1 to 1000, not 0"),
            ),
            (
                1001,
                MAX_BYTES,
                0,
                Some("batch.max_events must be 1 to 1000, not 1001"),
            ),
            (
                10,
                MAX_BYTES + 1,
                0,
                Some("batch.max_bytes must be 64 to 1048576 (1 MiB), not 1048577"),
            ),
            (
                10,
                63,
                0,
                Some("batch.max_bytes must be 64 to 1048576 (1 MiB), not 63"),
            ),
            (
                10,
                1024,
                10_001,
                Some("batch.max_wait_ms must be 0 to 10000, not 10001"),
            ),
        ];
        for &(e, b, w, want) in cases {
            let s = BatchSpec {
                max_events: e,
                max_bytes: b,
                max_wait_ms: w,
            };
            assert_eq!(
                s.check().err().map(|e| e.to_string()).as_deref(),
                want,
                "{s:?}"
            );
        }
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let s: BatchSpec = serde_json::from_str(r#"{"max_events":5}"#).unwrap();
        assert_eq!(
            s,
            BatchSpec {
                max_events: 5,
                max_bytes: MAX_BYTES,
                max_wait_ms: 0
            }
        );
        assert!(serde_json::from_str::<BatchSpec>(r#"{"max_events":5,"size":1}"#).is_err());
        assert!(serde_json::from_str::<BatchSpec>(r#"{"max_bytes":5}"#).is_err());
        assert!(serde_json::from_str::<BatchSpec>(r#"{"max_events":-1}"#).is_err());
    }

    #[test]
    fn cut_table() {
        // (max_events, max_bytes, sizes, batches)
        let cases: &[(u32, u32, &[usize], &[usize])] = &[
            (3, MAX_BYTES, &[], &[]),
            (3, MAX_BYTES, &[10; 7], &[3, 3, 1]),
            (1, MAX_BYTES, &[10; 3], &[1, 1, 1]),
            // 13 + 20 + 1 + 20 = 54 fits 64; a third would make 75.
            (10, 64, &[20, 20, 20, 20], &[2, 2]),
            // Exactly at the limit: 13 + 51 = 64 fits; one more byte and its comma do not.
            (10, 64, &[51, 1], &[1, 1]),
            (10, 64, &[50], &[1]),
            // Larger than max_bytes alone: goes alone, the rest around it still batched.
            (10, 64, &[10, 500, 10, 10], &[1, 1, 2]),
        ];
        for &(e, b, sizes, want) in cases {
            assert_eq!(spec(e, b).cut(sizes), want, "{e} {b} {sizes:?}");
        }
    }

    #[test]
    fn a_cut_batch_never_exceeds_its_bytes_unless_one_event_does() {
        let s = spec(1000, 200);
        let sizes: Vec<usize> = (0..500).map(|i| 1 + (i * 37 % 180)).collect();
        let mut at = 0;
        for n in s.cut(&sizes) {
            let elements: Vec<String> = sizes[at..at + n].iter().map(|&k| "x".repeat(k)).collect();
            let len = body(&elements).len();
            assert!(n == 1 || len <= 200, "{n} events make {len} bytes");
            at += n;
        }
        assert_eq!(at, sizes.len());
    }

    #[test]
    fn body_is_the_elements_byte_for_byte() {
        assert_eq!(body::<&str>(&[]), r#"{"events":[]}"#);
        let b = body(&[r#"{"id":"e1", "x": 1.50}"#, r#"{"id":"é"}"#]);
        assert_eq!(b, r#"{"events":[{"id":"e1", "x": 1.50},{"id":"é"}]}"#);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["events"][1]["id"], "é");
    }

    #[test]
    fn webhook_id_is_stable_per_set_and_order() {
        let a = webhook_id(&["e1", "e2"]);
        assert_eq!(a, webhook_id(&["e1", "e2"]));
        assert_ne!(a, webhook_id(&["e2", "e1"]));
        assert_ne!(webhook_id(&["e1e", "2"]), webhook_id(&["e1", "e2"]));
        assert!(a.starts_with("msg_batch_") && a.len() == 10 + 24, "{a}");
    }

    #[test]
    fn failed_table() {
        let members = ["e1", "e2", "e3"];
        let cases: &[(&str, &[usize])] = &[
            ("", &[]),
            ("ok", &[]),
            ("{}", &[]),
            (r#"{"failed":"e1"}"#, &[]),
            (r#"{"failed":[]}"#, &[]),
            (r#"{"failed":["e3","e1"]}"#, &[0, 2]),
            (r#"{"failed":["e2","e2",7,null,"e9"]}"#, &[1]),
            (r#"{"received":3,"failed":["e1"]}"#, &[0]),
            (r#"[{"failed":["e1"]}]"#, &[]),
        ];
        for &(answer, want) in cases {
            assert_eq!(failed_of(answer, &members), want, "{answer}");
        }
    }

    #[test]
    fn member_results_table() {
        let ids: Vec<String> = ["d1", "d2", "d3"].map(String::from).to_vec();
        let ok = DeliveryResult::Delivered {
            id: "lead".into(),
            status: 200,
            latency_ms: 7,
            failed: vec!["e2".into()],
        };
        let got = member_results(&ok, &ids, &[1]);
        assert_eq!(
            got.iter()
                .map(|r| (r.id(), r.outcome()))
                .collect::<Vec<_>>(),
            [("d1", "delivered"), ("d2", "failed"), ("d3", "delivered")]
        );
        assert!(
            matches!(&got[0], DeliveryResult::Delivered { failed, status: 200, .. } if failed.is_empty())
        );
        assert!(matches!(
            &got[1],
            DeliveryResult::Failed {
                error: Some(TransportError::NamedFailed),
                latency_ms: Some(7),
                status: None,
                ..
            }
        ));
        let down = DeliveryResult::Failed {
            id: "lead".into(),
            status: Some(503),
            retry_after_ms: Some(2000),
            response_body: Some("busy".into()),
            error: None,
            latency_ms: Some(3),
        };
        // Not a 2xx: every event's own failed attempt, `failed` indexes or not.
        let got = member_results(&down, &ids, &[1]);
        for (r, id) in got.iter().zip(&ids) {
            let mut want = down.clone();
            want.set_id(id);
            assert_eq!(r, &want);
        }
        let deferred = DeliveryResult::Deferred {
            id: "lead".into(),
            retry_after_ms: 40,
            reason: crate::wire::DeferReason::Rate,
        };
        assert!(member_results(&deferred, &ids, &[])
            .iter()
            .all(|r| r.outcome() == "deferred"));
    }

    #[test]
    fn a_named_failure_is_retried_like_a_failed_attempt() {
        use crate::retry::{classify, Attempt, Class};
        assert_eq!(
            classify(&Attempt::Transport(TransportError::NamedFailed)),
            Class::Retryable {
                retry_after_ms: None
            }
        );
    }

    #[test]
    fn sequences_header_lists_them() {
        assert_eq!(sequences_header(&[4, 5, 9]), "4,5,9");
        assert_eq!(sequences_header(&[1]), "1");
    }
}
