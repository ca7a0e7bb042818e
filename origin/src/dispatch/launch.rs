//! Launching sends: the executor's hands for [`Effect::Launch`](super::vocab::Effect). A
//! launch signs with the subscriber's active secrets and sends by the lane the state chose
//! (`target.lane`): each delivery its own task on the origin lane, encoded calls cut by size
//! on the edge lane. Every send reports back to the state over the executor's channel, once,
//! even if its task panics ([`Unreported`]).
//!
//! It does NOT choose the lane, the deliveries or the call size (the state did), and does not
//! judge results.

use std::sync::Arc;

use fanout_core::batch;
use fanout_core::endpoint::check_url;
use fanout_core::wire::{BatchMembers, DeferReason, Delivery, DeliveryResult, SubscriberSpec};
use tokio::sync::mpsc;

use super::edge_lane::{self, edge_failure, pair_results, EdgeClient};
use super::executor::{Clock, Dispatcher};
use super::origin_lane;
use super::vocab::{Attempted, Event, Lane, Meta, Target};
use crate::ledger::DispatchLedger;
use crate::model::{delivery_public_id, Claimed, Order};
use crate::outbound::Signer;
use crate::payload::{thin_body, EventUrl, Payload};
use crate::trace::{self, AttemptSpan};

/// A send on the origin lane that would start more than this long after the state leased its
/// delivery (`at_ms`) is not made: it is handed back deferred, due at once, no attempt spent.
/// Its token was taken at the lease, by the subscriber's rate then; sent late, it would arrive
/// with the sends paced after it — a daemon frozen (SIGSTOP, a stalled host) past its leases
/// and woken sent its old launches beside the daemon that took its work over, over a strict
/// partner's rate (the fault soak, seed 11). Normally a send starts within milliseconds.
pub const LATE_START_MS: i64 = 2_000;

/// Whether a send decided at `at_ms` is too late to start at `now_ms` ([`LATE_START_MS`]).
pub fn too_late(at_ms: i64, now_ms: i64) -> bool {
    now_ms.saturating_sub(at_ms) > LATE_START_MS
}

/// The result of a send not made because it would start too late: deferred, due at once.
fn late(delivery_id: &str) -> Attempted {
    Attempted {
        result: DeliveryResult::Deferred {
            id: delivery_id.to_string(),
            retry_after_ms: 0,
            reason: DeferReason::Rate,
        },
        attempt: None,
    }
}

impl<L: DispatchLedger> Dispatcher<L> {
    /// Start sending leased deliveries by the lane the state chose: each of `sends` one
    /// request, a single delivery's webhook or, for a batching subscriber (`target.batch`,
    /// `fanout_core::batch`), one request carrying the listed deliveries in order.
    pub(super) fn launch(
        &self,
        target: Arc<Target>,
        sends: Vec<Vec<Claimed>>,
        per_call: usize,
        at_ms: i64,
    ) {
        let batched = target.batch.is_some();
        let now = (self.clock)();
        let keys = target
            .keyring
            .keys(target.signature, target.legacy_signature, now);
        let lane = target.lane;
        let unsendable = |error: &str| {
            let _ = self.done_tx.send(Event::Unsendable {
                sub: target.id.clone(),
                lane,
                items: sends.iter().flatten().map(Meta::of).collect(),
                error: error.into(),
            });
        };
        if keys.is_empty() {
            // Nothing can sign these: the daemon's own failure, counted like a send's.
            unsendable("the subscriber has no usable signing secret");
            return;
        }
        match lane {
            Lane::Edge => {
                let Some(edge) = &self.cfg.edge else {
                    // The state chooses the edge only when one is configured.
                    unsendable("no edge is configured");
                    return;
                };
                let (secrets, signing_keys) = target.keyring.wire(target.signature, now);
                let spec = subscriber_spec(&target, secrets, signing_keys, self.cfg.breaker);
                let url = self.span_url(&target);
                let units = sends
                    .into_iter()
                    .map(|s| {
                        self.form(&target, s, batched, url.as_ref(), "edge")
                            .edge_unit()
                    })
                    .collect();
                self.send_edge_units(edge, &target, spec, units, per_call);
            }
            Lane::Origin | Lane::Auto => {
                let signer = Signer::new(keys);
                // Parsed and checked once for the whole launch; each send reuses the parse.
                let url = Arc::new(check_url(&target.url, self.cfg.allow_loopback).ok());
                for s in sends {
                    let formed = self.form(&target, s, batched, (*url).as_ref(), "origin");
                    self.send_origin(&target, &signer, &url, formed, at_ms);
                }
            }
        }
    }

    /// One request on the origin lane, in a task of its own: sent unless it would start too
    /// late, its result handed to each of its deliveries (a batch's: the events its 2xx named
    /// as `failed` failed).
    fn send_origin(
        &self,
        target: &Arc<Target>,
        signer: &Signer,
        url: &Arc<Option<url::Url>>,
        f: Formed,
        at_ms: i64,
    ) {
        let out = self.cfg.outbound.clone();
        let done = self.done_tx.clone();
        let target = target.clone();
        let signer = signer.clone();
        let url = url.clone();
        let clock = self.clock.clone();
        tokio::spawn(async move {
            let mut unreported = Unreported::new(&done, &target.id, Lane::Origin, f.metas.clone());
            let started = std::time::Instant::now();
            let send = origin_lane::Outgoing {
                delivery_id: &f.id,
                event_id: &f.webhook_id,
                url: (*url).as_ref(),
                signer: &signer,
                timeout_ms: target.limits.timeout_ms,
                sequence: f.sequences.first().copied().unwrap_or(0),
                order: f.order.clone(),
                traceparent: f.traceparent.as_deref(),
                sequences: f.sequences_header(),
            };
            let late_now = too_late(at_ms, clock());
            let results = if !f.batched {
                vec![if late_now {
                    late(&f.id)
                } else {
                    origin_lane::deliver(&out, &send, f.body).await
                }]
            } else {
                let (sent, answer) = if late_now {
                    (late(&f.id), String::new())
                } else {
                    origin_lane::deliver_batch(&out, &send, f.body).await
                };
                let failed = match &sent.result {
                    DeliveryResult::Delivered { .. } => batch::failed_of(&answer, &f.event_ids),
                    _ => Vec::new(),
                };
                let metas: Vec<&Meta> = f.metas.iter().collect();
                each_event(&sent, &metas, &failed)
            };
            end_spans(f.spans, Some(&results));
            let latency_ms = Some(started.elapsed().as_millis() as u64);
            let items = unreported.take();
            if !items.is_empty() {
                let _ = done.send(Event::Results {
                    sub: target.id.clone(),
                    lane: Lane::Origin,
                    items: items
                        .into_iter()
                        .map(|m| Meta { latency_ms, ..m })
                        .zip(results)
                        .collect(),
                    at_ms: clock(),
                });
            }
        });
    }

    /// The subscriber's URL for its attempt spans' `server.address`: parsed only when exporting.
    fn span_url(&self, target: &Target) -> Option<url::Url> {
        self.cfg
            .telemetry
            .is_on()
            .then(|| url::Url::parse(&target.url).ok())
            .flatten()
    }

    /// Encode each send once, cut the calls by encoded length, and send them all at once. A
    /// send's result is its deliveries' (a batch's, handed to each of its events).
    fn send_edge_units(
        &self,
        edge: &EdgeClient,
        target: &Arc<Target>,
        spec: SubscriberSpec,
        units: Vec<EdgeUnit>,
        per_call: usize,
    ) {
        let spec_json = match edge_lane::encode_spec(&spec) {
            Ok(j) => j,
            Err(e) => {
                let _ = self.done_tx.send(Event::Unsendable {
                    sub: target.id.clone(),
                    lane: Lane::Edge,
                    items: units.into_iter().flat_map(|u| u.metas).collect(),
                    error: format!("the edge call cannot be encoded: {e}"),
                });
                return;
            }
        };
        let mut sends: Vec<Option<EdgeUnit>> = Vec::with_capacity(units.len());
        let mut parts = Vec::with_capacity(units.len());
        let mut unsendable: Vec<(Vec<Meta>, String)> = Vec::new();
        for u in units {
            match edge_lane::encode_delivery(&u.delivery) {
                Ok(json) => {
                    parts.push(json);
                    sends.push(Some(u));
                }
                Err(e) => {
                    end_spans(u.spans, None);
                    unsendable.push((u.metas, format!("the delivery cannot be encoded: {e}")))
                }
            }
        }
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        let (calls, too_big) = edge_lane::split_calls(
            &sizes,
            edge_lane::fixed_len(&spec_json),
            per_call,
            edge_lane::EDGE_MAX_BYTES,
        );
        for i in too_big {
            if let Some(u) = sends[i].take() {
                end_spans(u.spans, None);
                unsendable.push((
                    u.metas,
                    format!(
                        "the delivery encodes to {} bytes, more than an edge call may carry ({} bytes)",
                        sizes[i],
                        edge_lane::EDGE_MAX_BYTES
                    ),
                ));
            }
        }
        for (items, error) in unsendable {
            let _ = self.done_tx.send(Event::Unsendable {
                sub: target.id.clone(),
                lane: Lane::Edge,
                items,
                error,
            });
        }
        let spec_json: Arc<[u8]> = spec_json.into();
        for call in calls {
            let refs: Vec<&[u8]> = call.iter().map(|&i| parts[i].as_slice()).collect();
            let body = edge_lane::batch_body(&spec_json, &refs);
            let units: Vec<EdgeUnit> = call.iter().filter_map(|&i| sends[i].take()).collect();
            let edge = edge.clone();
            let done = self.done_tx.clone();
            let sub = target.id.clone();
            let timeout_ms = target.limits.timeout_ms;
            let clock: Clock = self.clock.clone();
            tokio::spawn(async move {
                let mut shapes = Vec::with_capacity(units.len());
                let mut items = Vec::new();
                let mut spans = Vec::new();
                for u in units {
                    shapes.push((
                        u.delivery.id,
                        u.delivery.batch.map(|b| b.events),
                        u.metas.len(),
                    ));
                    items.extend(u.metas);
                    spans.extend(u.spans);
                }
                let mut unreported = Unreported::new(&done, &sub, Lane::Edge, items);
                let call_id = call_id(clock());
                let wait = edge_lane::call_timeout(shapes.len(), timeout_ms);
                let result = edge.send(body, &call_id, wait).await;
                let items = unreported.take();
                let ids: Vec<String> = shapes.iter().map(|(id, _, _)| id.clone()).collect();
                let result = result.map(|r| each_send(&shapes, &items, pair_results(&ids, r)));
                end_spans(spans, result.as_deref().ok());
                let event = match result {
                    Ok(results) => Event::Results {
                        sub,
                        lane: Lane::Edge,
                        items: items.into_iter().zip(results).collect(),
                        at_ms: clock(),
                    },
                    Err(error) => Event::EdgeFailed {
                        sub,
                        items,
                        failure: edge_failure(&error),
                    },
                };
                let _ = done.send(event);
            });
        }
    }

    /// One request: its body, `webhook-id`, its events' sequences, and each event's attempt
    /// span. Not `batched`, it is its one delivery's webhook (its body, its event's id).
    fn form(
        &self,
        target: &Target,
        batch: Vec<Claimed>,
        batched: bool,
        span_url: Option<&url::Url>,
        lane: &'static str,
    ) -> Formed {
        let n = batch.len();
        let mut f = Formed {
            id: batch
                .first()
                .map(|d| delivery_public_id(d.rowid))
                .unwrap_or_default(),
            event_type: batch
                .first()
                .map(|d| d.event_type.clone())
                .unwrap_or_default(),
            attempt: batch.iter().map(|d| d.attempt).max().unwrap_or(1),
            metas: Vec::with_capacity(n),
            event_ids: Vec::with_capacity(n),
            sequences: Vec::with_capacity(n),
            spans: Vec::with_capacity(n),
            traceparent: None,
            order: None,
            webhook_id: String::new(),
            body: String::new(),
            batched,
        };
        // An ordered request is a run of one key in order: its key's headers are its first's
        // (`webhook-previous-sequence` the sequence before the run).
        f.order = batch
            .first()
            .and_then(|d| d.order.as_ref().map(Order::headers));
        let mut elements = Vec::with_capacity(n);
        for mut d in batch {
            f.metas.push(Meta::of(&d));
            let id = delivery_public_id(d.rowid);
            let (span, traceparent) = traced(&self.cfg.telemetry, target, span_url, &d, &id, lane);
            f.spans.push(span);
            if f.traceparent.is_none() {
                f.traceparent = traceparent;
            }
            elements.push(body_of(target.payload, &mut d, self.cfg.event_url.as_ref()));
            if d.sequence > 0 {
                f.sequences.push(d.sequence);
            }
            f.event_ids.push(d.event_id);
        }
        if f.sequences.len() != f.event_ids.len() {
            // Events from before sequence numbers: no sequence header at all.
            f.sequences.clear();
        }
        if batched {
            f.webhook_id = batch::webhook_id(&f.event_ids);
            f.body = batch::body(&elements);
        } else {
            f.webhook_id = f.event_ids.first().cloned().unwrap_or_default();
            f.body = elements.pop().unwrap_or_default();
        }
        f
    }
}

/// A send on the edge lane: one wire delivery (a single event's, or a batch's) and the leased
/// deliveries its result stands for, in order, with their attempt spans.
struct EdgeUnit {
    delivery: Delivery,
    metas: Vec<Meta>,
    spans: Vec<Option<AttemptSpan>>,
}

/// One request, formed (`Dispatcher::form`): a batch's, or one delivery's.
struct Formed {
    /// Its first delivery's public id: what the edge reports the request under.
    id: String,
    event_type: String,
    attempt: u32,
    metas: Vec<Meta>,
    event_ids: Vec<String>,
    /// Each event's `webhook-sequence`, or none at all.
    sequences: Vec<u64>,
    spans: Vec<Option<AttemptSpan>>,
    traceparent: Option<String>,
    /// Its key's headers (`webhook-ordering-key`, `webhook-previous-sequence`), ordered.
    order: Option<(Option<String>, Option<u64>)>,
    webhook_id: String,
    body: String,
    /// A batch's request (a JSON array, `webhook-sequences`, its members' results split), not
    /// one delivery's webhook.
    batched: bool,
}

impl Formed {
    fn sequences_header(&self) -> Option<String> {
        (self.batched && !self.sequences.is_empty())
            .then(|| batch::sequences_header(&self.sequences))
    }

    fn edge_unit(self) -> EdgeUnit {
        let sequence = self.sequences.first().copied();
        let (ordering_key, previous_sequence) = self.order.unwrap_or((None, None));
        EdgeUnit {
            delivery: Delivery {
                id: self.id,
                event_id: self.webhook_id,
                event_type: self.event_type,
                attempt: self.attempt,
                body: self.body,
                sequence,
                ordering_key,
                previous_sequence,
                traceparent: self.traceparent,
                batch: self.batched.then_some(BatchMembers {
                    events: self.event_ids,
                    sequences: self.sequences,
                }),
            },
            metas: self.metas,
            spans: self.spans,
        }
    }
}

/// The results of one edge call's sends (`shapes`: each send's id, its batch's events, and
/// how many of `items` it stands for), one per delivery of `items`: a batch's handed to each
/// of its events, the events its 2xx named as `failed` failed.
fn each_send(
    shapes: &[(String, Option<Vec<String>>, usize)],
    items: &[Meta],
    sent: Vec<Attempted>,
) -> Vec<Attempted> {
    let mut members = items.iter();
    let mut out = Vec::with_capacity(items.len());
    for ((_, events, n), sent) in shapes.iter().zip(sent) {
        let metas: Vec<&Meta> = members.by_ref().take(*n).collect();
        let Some(events) = events else {
            out.push(sent);
            continue;
        };
        let failed: Vec<usize> = match &sent.result {
            DeliveryResult::Delivered { failed, .. } => events
                .iter()
                .enumerate()
                .filter(|(_, e)| failed.contains(e))
                .map(|(i, _)| i)
                .collect(),
            _ => Vec::new(),
        };
        out.extend(each_event(&sent, &metas, &failed));
    }
    out
}

/// Each event's result from its request's (`fanout_core::batch::member_results`): the attempt
/// the request was goes with the first event only, so the limiter, the breaker and the alerts
/// count one request once.
fn each_event(sent: &Attempted, metas: &[&Meta], failed: &[usize]) -> Vec<Attempted> {
    let ids: Vec<String> = metas.iter().map(|m| delivery_public_id(m.rowid)).collect();
    batch::member_results(&sent.result, &ids, failed)
        .into_iter()
        .enumerate()
        .map(|(i, result)| Attempted {
            result,
            attempt: if i == 0 { sent.attempt.clone() } else { None },
        })
        .collect()
}

/// The edge's view of a subscriber, with the secrets and keys that sign now.
fn subscriber_spec(
    target: &Target,
    secrets: Vec<String>,
    signing_keys: Vec<String>,
    breaker: fanout_core::breaker::BreakerConfig,
) -> SubscriberSpec {
    SubscriberSpec {
        id: target.id.to_string(),
        url: target.url.to_string(),
        secrets,
        signature: target.signature,
        signing_keys,
        rate_per_sec: target.limits.rate_per_sec,
        burst: target.limits.burst,
        max_in_flight: target.limits.max_in_flight,
        timeout_ms: target.limits.timeout_ms,
        legacy_signature: target.legacy_signature,
        breaker: Some(breaker),
    }
}

/// A delivery's attempt span (when exporting) and the `traceparent` its webhook carries: none
/// unless its subscriber has `propagate_trace`; then the attempt's span as parent when
/// exporting, else the context stored with the event.
fn traced(
    telemetry: &trace::Telemetry,
    target: &Target,
    url: Option<&url::Url>,
    d: &Claimed,
    delivery_id: &str,
    lane: &'static str,
) -> (Option<AttemptSpan>, Option<String>) {
    let span = telemetry.attempt(&trace::Attempt {
        event_id: &d.event_id,
        subscriber_id: &target.id,
        delivery_id,
        host: url.and_then(|u| u.host_str()),
        port: url.and_then(|u| u.port_or_known_default()),
        attempt: d.attempt,
        stored: d.traceparent.as_deref(),
        lane,
    });
    let traceparent = target.propagate_trace.then(|| {
        span.as_ref()
            .map(|s| s.traceparent().to_string())
            .or_else(|| d.traceparent.clone())
    });
    (span, traceparent.flatten())
}

/// End attempt spans with each delivery's result, or as unsent when there is none (the call
/// failed, or the delivery could not be put in one).
fn end_spans(spans: Vec<Option<AttemptSpan>>, results: Option<&[Attempted]>) {
    for (i, span) in spans.into_iter().enumerate() {
        match (span, results.and_then(|r| r.get(i))) {
            (Some(span), Some(r)) => span.finish(&r.result),
            (Some(span), None) => span.unsent("unsent"),
            (None, _) => {}
        }
    }
}

/// The body a delivery's webhook carries, whichever lane sends it: its event's stored body
/// (taken out of `d`), or the thin one (`crate::payload`).
fn body_of(payload: Payload, d: &mut Claimed, event_url: Option<&EventUrl>) -> String {
    match payload {
        Payload::Full => std::mem::take(&mut d.body),
        Payload::Thin => thin_body(&d.event_id, &d.event_type, d.received_ms, event_url),
    }
}

/// The deliveries a send task has not reported yet. Should the task end without reporting them
/// (a panic unwinding it), dropping this reports them as unsendable: their in-flight slots come
/// back and each counts a failed attempt (dead at the attempt limit, like a poison event), so a
/// panic never leaks a slot or strands a delivery until its lease expires.
struct Unreported {
    done: mpsc::UnboundedSender<Event>,
    sub: Arc<str>,
    lane: Lane,
    items: Vec<Meta>,
}

impl Unreported {
    fn new(
        done: &mpsc::UnboundedSender<Event>,
        sub: &Arc<str>,
        lane: Lane,
        items: Vec<Meta>,
    ) -> Unreported {
        Unreported {
            done: done.clone(),
            sub: sub.clone(),
            lane,
            items,
        }
    }

    /// The deliveries, now to be reported by the task itself.
    fn take(&mut self) -> Vec<Meta> {
        std::mem::take(&mut self.items)
    }
}

impl Drop for Unreported {
    fn drop(&mut self) {
        if self.items.is_empty() {
            return;
        }
        tracing::error!(
            subscriber = %self.sub,
            lane = self.lane.as_str(),
            deliveries = self.items.len(),
            "a send task ended without reporting its deliveries (it panicked); each counts a failed attempt"
        );
        let items = self.take();
        let _ = self.done.send(Event::Unsendable {
            sub: self.sub.clone(),
            lane: self.lane,
            items,
            error: "the daemon failed while sending this delivery (an internal error, in its log)"
                .into(),
        });
    }
}

/// A fresh id for each edge call (the edge refuses an id it has seen within 300 s as a replay):
/// random, and unique within this process even if the system's random source fails.
fn call_id(now_ms: i64) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let random = getrandom::u64().unwrap_or_default();
    format!("call_{random:016x}_{now_ms:x}_{n:x}")
}

#[cfg(test)]
mod tests {
    /// A send task that panics still reports its deliveries (as unsendable, so their slots
    /// come back); one that reports them itself sends nothing more.
    #[tokio::test]
    async fn a_panicking_send_task_still_reports_its_deliveries() {
        use super::{Event, Lane, Meta, Unreported};
        let (done, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sub: std::sync::Arc<str> = "s".into();
        let meta = |rowid| Meta {
            rowid,
            event_id: format!("e{rowid}"),
            event_type: "t".into(),
            attempt: 1,
            latency_ms: None,
        };
        let (d, s, m) = (done.clone(), sub.clone(), vec![meta(1), meta(2)]);
        let task = tokio::spawn(async move {
            let _unreported = Unreported::new(&d, &s, Lane::Edge, m);
            if s.len() == 1 {
                panic!("a bug in a send task");
            }
        });
        assert!(task.await.unwrap_err().is_panic());
        match rx.try_recv() {
            Ok(Event::Unsendable {
                sub, lane, items, ..
            }) => {
                assert_eq!((&*sub, lane), ("s", Lane::Edge));
                assert_eq!(items.iter().map(|m| m.rowid).collect::<Vec<_>>(), [1, 2]);
            }
            other => panic!("expected the deliveries reported unsendable, got {other:?}"),
        }
        let (d, s) = (done.clone(), sub.clone());
        tokio::spawn(async move {
            let mut unreported = Unreported::new(&d, &s, Lane::Origin, vec![meta(3)]);
            assert_eq!(unreported.take().len(), 1);
        })
        .await
        .unwrap();
        assert!(rx.try_recv().is_err(), "reported once, by the task");
    }
}
