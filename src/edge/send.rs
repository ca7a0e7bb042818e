//! Sending what the Durable Object granted: one signed POST per delivery (Standard Webhooks
//! headers, `redirect: manual`), at most `max_open` at once, each with its own timeout counted
//! from the start of its own send.
//!
//! The signing, the classification and the limiter stay in Rust; the fetches themselves run in
//! `send.js` (a wasm-bindgen snippet), handed the whole batch in one call and reporting each
//! delivery back once as it settles. Each delivery therefore crosses the wasm boundary once,
//! not once per header, request object, promise and body copy.

use std::cell::RefCell;
use std::rc::Rc;

use serde::Serialize;
use wasm_bindgen::prelude::{wasm_bindgen, Closure};
use worker::js_sys;
use worker::wasm_bindgen_futures::JsFuture;

use crate::batch;
use crate::retry::{parse_retry_after, result_for, Attempt};
use crate::sign::{self, Keys};
use crate::wire::{Delivery, DeliveryResult, TransportError, RESPONSE_BODY_LIMIT};

#[wasm_bindgen(module = "/src/edge/send.js")]
extern "C" {
    #[wasm_bindgen(js_name = sendBatch)]
    fn send_batch(
        url: &str,
        batch_json: &str,
        timeout_ms: f64,
        body_limit: u32,
        max_open: u32,
        on_done: &Closure<dyn FnMut(u32, i32, Option<String>, Option<String>, f64)>,
    ) -> js_sys::Promise;

    #[wasm_bindgen(js_name = readLimited)]
    fn read_limited_js(request: &worker::wasm_bindgen::JsValue, limit: f64) -> js_sys::Promise;
}

/// The body of `request`, or `None` as soon as more than `limit` bytes arrived (what is left
/// is cancelled, never buffered). `Err` when the body broke off.
pub async fn read_limited(
    request: &worker::Request,
    limit: usize,
) -> worker::Result<Option<Vec<u8>>> {
    let value = JsFuture::from(read_limited_js(request.inner(), limit as f64)).await?;
    if value.is_null() {
        return Ok(None);
    }
    Ok(Some(js_sys::Uint8Array::new(&value).to_vec()))
}

/// `send.js`'s codes for an exchange that produced no HTTP status.
const CONNECT_ERROR: i32 = 0;
const TIMEOUT: i32 = -1;
const BAD_REQUEST: i32 = -2;

/// Where and how a batch is sent.
pub struct Target<'a> {
    pub url: &'a str,
    /// The subscriber's keys as its scheme uses them (`v1`, `v1a`, the legacy header).
    pub keys: &'a Keys,
    pub timeout_ms: u64,
    /// Sends kept open at once (`MAX_OPEN_SENDS`).
    pub max_open: u32,
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// What `send.js` is handed for each delivery: every header it carries, as one JSON object
/// (the runtime takes a record of headers more cheaply than a list of pairs), and its body.
#[derive(Serialize)]
struct JsItem<'a> {
    headers: JsHeaders<'a>,
    body: &'a str,
    /// A batched webhook: read this much of a 2xx answer (its `failed` list).
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<u32>,
}

/// The headers of one delivery: those every delivery of the batch shares, then its own.
struct JsHeaders<'a> {
    common: &'a [(&'static str, &'a str)],
    own: Vec<(&'static str, String)>,
}

impl Serialize for JsHeaders<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.common.len() + self.own.len()))?;
        for (name, value) in self.common {
            map.serialize_entry(name, value)?;
        }
        for (name, value) in &self.own {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

fn js_batch<'a>(
    target: &Target<'_>,
    deliveries: &'a [Delivery],
    common: &'a [(&'static str, &'a str)],
    now_secs: i64,
) -> Vec<JsItem<'a>> {
    deliveries
        .iter()
        .map(|d| {
            let body = d.body.as_bytes();
            let signed = sign::sign_headers(target.keys, &d.event_id, now_secs, body);
            let mut own = vec![
                (sign::HEADER_ID, signed.id),
                (sign::HEADER_SIGNATURE, signed.signature),
            ];
            if let Some(legacy) = target.keys.legacy_header(body) {
                own.push((sign::HEADER_LEGACY, legacy));
            }
            if let Some(sequence) = d.sequence {
                own.push((sign::HEADER_SEQUENCE, sequence.to_string()));
            }
            if let Some(key) = &d.ordering_key {
                own.push((sign::HEADER_ORDERING_KEY, key.clone()));
            }
            if let Some(previous) = d.previous_sequence {
                own.push((sign::HEADER_PREVIOUS_SEQUENCE, previous.to_string()));
            }
            if let Some(tp) = &d.traceparent {
                own.push(("traceparent", tp.clone()));
            }
            if let Some(b) = d.batch.as_ref().filter(|b| !b.sequences.is_empty()) {
                own.push((
                    batch::HEADER_SEQUENCES,
                    batch::sequences_header(&b.sequences),
                ));
            }
            JsItem {
                headers: JsHeaders { common, own },
                body: &d.body,
                answer: d.batch.as_ref().map(|_| batch::ANSWER_LIMIT as u32),
            }
        })
        .collect()
}

/// What one settled exchange left behind until the batch is done.
struct Settled {
    attempt: Attempt,
    body: String,
    latency_ms: u64,
}

/// Send every delivery, `target.max_open` at a time; `on_done` sees each attempt as soon as it is known (the
/// caller folds it into the limiter). Returns the results in the order of `deliveries`.
/// Never fails: every failure is a result.
pub async fn deliver_all(
    target: &Target<'_>,
    deliveries: &[Delivery],
    on_done: impl FnMut(&Attempt) + 'static,
) -> Vec<DeliveryResult> {
    if deliveries.is_empty() {
        return Vec::new(); // everything was deferred: nothing to hand to send.js
    }
    let started = now_ms();
    let timestamp = (started / 1000).to_string();
    let slots: Rc<RefCell<Vec<Option<Settled>>>> =
        Rc::new(RefCell::new(deliveries.iter().map(|_| None).collect()));
    let common = [
        ("content-type", "application/json"),
        ("user-agent", "Fanout/1 (+webhooks)"),
        (sign::HEADER_TIMESTAMP, timestamp.as_str()),
    ];
    // Serialising strings and string pairs cannot fail.
    let json = serde_json::to_string(&js_batch(target, deliveries, &common, started / 1000))
        .unwrap_or_default();

    let on_done = Rc::new(RefCell::new(on_done));
    let (filled, report) = (Rc::clone(&slots), Rc::clone(&on_done));
    let callback = Closure::<dyn FnMut(u32, i32, Option<String>, Option<String>, f64)>::new(
        move |index: u32,
              status: i32,
              retry_after: Option<String>,
              body: Option<String>,
              latency: f64| {
            let attempt = match status {
                CONNECT_ERROR => Attempt::Transport(TransportError::Connect),
                TIMEOUT => Attempt::Transport(TransportError::Timeout),
                BAD_REQUEST => Attempt::Transport(TransportError::RefusedUrl),
                status => Attempt::Status {
                    status: u16::try_from(status).unwrap_or(0),
                    retry_after_ms: retry_after.and_then(|v| parse_retry_after(&v, now_ms())),
                },
            };
            // Each delivery is reported once: a second report (or an unknown index) must not
            // free an in-flight slot twice.
            let mut slots = filled.borrow_mut();
            let Some(slot @ None) = slots.get_mut(index as usize) else {
                return;
            };
            (report.borrow_mut())(&attempt);
            *slot = Some(Settled {
                attempt,
                body: body.unwrap_or_default(),
                latency_ms: latency.max(0.0) as u64,
            });
        },
    );
    let promise = send_batch(
        target.url,
        &json,
        target.timeout_ms as f64,
        RESPONSE_BODY_LIMIT as u32,
        target.max_open,
        &callback,
    );
    // send.js never rejects and settles every item before it resolves; should it break that
    // promise anyway, what it did not report counts as a timeout below.
    let _ = JsFuture::from(promise).await;
    drop(callback);

    let settled = std::mem::take(&mut *slots.borrow_mut());
    settled
        .into_iter()
        .zip(deliveries)
        .map(|(slot, d)| {
            let s = slot.unwrap_or_else(|| {
                let attempt = Attempt::Transport(TransportError::Timeout);
                (on_done.borrow_mut())(&attempt);
                Settled {
                    attempt,
                    body: String::new(),
                    latency_ms: (now_ms() - started).max(0) as u64,
                }
            });
            let mut result = result_for(&d.id, &s.attempt, s.latency_ms, Some(&s.body));
            if let (Some(b), DeliveryResult::Delivered { failed, .. }) = (&d.batch, &mut result) {
                // The events its 2xx named as failed: the origin retries those alone.
                *failed = batch::failed_of(&s.body, &b.events)
                    .into_iter()
                    .map(|i| b.events[i].clone())
                    .collect();
            }
            result
        })
        .collect()
}
