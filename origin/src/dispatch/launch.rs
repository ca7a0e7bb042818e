//! Launching sends: the executor's hands for [`Effect::Launch`](super::vocab::Effect). A
//! launch signs with the subscriber's active secrets and sends by the lane the state chose
//! (`target.lane`): each delivery its own task on the origin lane, encoded calls cut by size
//! on the edge lane. Every send reports back to the state over the executor's channel, once,
//! even if its task panics ([`Unreported`]).
//!
//! It does NOT choose the lane, the deliveries or the call size (the state did), and does not
//! judge results.

use std::sync::Arc;

use fanout_core::endpoint::check_url;
use fanout_core::wire::{Delivery, SubscriberSpec};
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

impl<L: DispatchLedger> Dispatcher<L> {
    /// Start sending leased deliveries by the lane the state chose.
    pub(super) fn launch(&self, target: Arc<Target>, claimed: Vec<Claimed>, per_call: usize) {
        let now = (self.clock)();
        let keys = target
            .keyring
            .keys(target.signature, target.legacy_signature, now);
        let lane = target.lane;
        let unsendable = |error: &str| {
            let _ = self.done_tx.send(Event::Unsendable {
                sub: target.id.clone(),
                lane,
                items: claimed.iter().map(Meta::of).collect(),
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
                let spec = SubscriberSpec {
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
                };
                self.launch_edge(edge, &target, spec, claimed, per_call);
            }
            Lane::Origin | Lane::Auto => {
                let signer = Signer::new(keys);
                // Parsed and checked once for the whole launch; each send reuses the parse.
                let url = Arc::new(check_url(&target.url, self.cfg.allow_loopback).ok());
                for mut d in claimed {
                    let out = self.cfg.outbound.clone();
                    let done = self.done_tx.clone();
                    let target = target.clone();
                    let signer = signer.clone();
                    let url = url.clone();
                    let clock = self.clock.clone();
                    let telemetry = self.cfg.telemetry.clone();
                    let body = body_of(target.payload, &mut d, self.cfg.event_url.as_ref());
                    tokio::spawn(async move {
                        let mut unreported =
                            Unreported::new(&done, &target.id, Lane::Origin, vec![Meta::of(&d)]);
                        let id = delivery_public_id(d.rowid);
                        let started = std::time::Instant::now();
                        let (span, traceparent) =
                            traced(&telemetry, &target, (*url).as_ref(), &d, &id, "origin");
                        let send = origin_lane::Outgoing {
                            delivery_id: &id,
                            event_id: &d.event_id,
                            url: (*url).as_ref(),
                            signer: &signer,
                            timeout_ms: target.limits.timeout_ms,
                            sequence: d.sequence,
                            order: d.order.as_ref().map(Order::headers),
                            traceparent: traceparent.as_deref(),
                        };
                        let result = origin_lane::deliver(&out, &send, body).await;
                        if let Some(span) = span {
                            span.finish(&result.result);
                        }
                        let latency_ms = Some(started.elapsed().as_millis() as u64);
                        if let Some(meta) = unreported.take().pop() {
                            let _ = done.send(Event::Results {
                                sub: target.id.clone(),
                                lane: Lane::Origin,
                                items: vec![(Meta { latency_ms, ..meta }, result)],
                                at_ms: clock(),
                            });
                        }
                    });
                }
            }
        }
    }

    /// The subscriber's URL for its attempt spans' `server.address`: parsed only when exporting.
    fn span_url(&self, target: &Target) -> Option<url::Url> {
        self.cfg
            .telemetry
            .is_on()
            .then(|| url::Url::parse(&target.url).ok())
            .flatten()
    }

    /// Encode each delivery once, cut the calls by encoded length, and send them all at once.
    fn launch_edge(
        &self,
        edge: &EdgeClient,
        target: &Arc<Target>,
        spec: SubscriberSpec,
        claimed: Vec<Claimed>,
        per_call: usize,
    ) {
        let mut metas = Vec::with_capacity(claimed.len());
        let mut parts = Vec::with_capacity(claimed.len());
        let mut spans: Vec<Option<AttemptSpan>> = Vec::with_capacity(claimed.len());
        let (telemetry, url) = (&self.cfg.telemetry, self.span_url(target));
        let mut unsendable: Vec<(Meta, String)> = Vec::new();
        let spec_json = match edge_lane::encode_spec(&spec) {
            Ok(j) => j,
            Err(e) => {
                let _ = self.done_tx.send(Event::Unsendable {
                    sub: target.id.clone(),
                    lane: Lane::Edge,
                    items: claimed.iter().map(Meta::of).collect(),
                    error: format!("the edge call cannot be encoded: {e}"),
                });
                return;
            }
        };
        for mut d in claimed {
            let meta = Meta::of(&d);
            let body = body_of(target.payload, &mut d, self.cfg.event_url.as_ref());
            let (ordering_key, previous_sequence) =
                d.order.as_ref().map_or((None, None), Order::headers);
            let id = delivery_public_id(d.rowid);
            let (span, traceparent) = traced(telemetry, target, url.as_ref(), &d, &id, "edge");
            let delivery = Delivery {
                id,
                event_id: d.event_id,
                event_type: d.event_type,
                attempt: d.attempt,
                body,
                sequence: (d.sequence > 0).then_some(d.sequence),
                ordering_key,
                previous_sequence,
                traceparent,
            };
            match edge_lane::encode_delivery(&delivery) {
                Ok(json) => {
                    metas.push(meta);
                    parts.push(json);
                    spans.push(span);
                }
                Err(e) => {
                    end_spans(vec![span], None);
                    unsendable.push((meta, format!("the delivery cannot be encoded: {e}")))
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
            end_spans(vec![spans[i].take()], None);
            unsendable.push((
                metas[i].clone(),
                format!(
                    "the delivery encodes to {} bytes, more than an edge call may carry ({} bytes)",
                    sizes[i],
                    edge_lane::EDGE_MAX_BYTES
                ),
            ));
        }
        for (meta, error) in unsendable {
            let _ = self.done_tx.send(Event::Unsendable {
                sub: target.id.clone(),
                lane: Lane::Edge,
                items: vec![meta],
                error,
            });
        }
        let spec_json: Arc<[u8]> = spec_json.into();
        for call in calls {
            let refs: Vec<&[u8]> = call.iter().map(|&i| parts[i].as_slice()).collect();
            let body = edge_lane::batch_body(&spec_json, &refs);
            let items: Vec<Meta> = call.iter().map(|&i| metas[i].clone()).collect();
            let call_spans: Vec<Option<AttemptSpan>> =
                call.iter().map(|&i| spans[i].take()).collect();
            let edge = edge.clone();
            let done = self.done_tx.clone();
            let sub = target.id.clone();
            let timeout_ms = target.limits.timeout_ms;
            let clock: Clock = self.clock.clone();
            tokio::spawn(async move {
                let mut unreported = Unreported::new(&done, &sub, Lane::Edge, items);
                let call_id = call_id(clock());
                let wait = edge_lane::call_timeout(unreported.items.len(), timeout_ms);
                let result = edge.send(body, &call_id, wait).await;
                let items = unreported.take();
                let ids: Vec<String> = items.iter().map(|m| delivery_public_id(m.rowid)).collect();
                let result = result.map(|r| pair_results(&ids, r));
                end_spans(call_spans, result.as_deref().ok());
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
