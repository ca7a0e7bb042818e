//! Sending what the Durable Object granted: one signed POST per delivery (Standard Webhooks
//! headers, `redirect: manual`), all of a batch at once. They start together, so one timer and
//! one abort signal per batch enforce every delivery's timeout: when the timer fires, whatever
//! is still open is aborted and reported as a timeout.

use std::pin::pin;
use std::time::Duration;

use futures_util::future::{select, Either};
use futures_util::stream::{FuturesUnordered, StreamExt};
use worker::{
    AbortController, AbortSignal, Delay, Fetch, Headers, Method, Request, RequestInit,
    RequestRedirect,
};

use crate::retry::{parse_retry_after, result_for, Attempt};
use crate::sign::{self, Secret};
use crate::wire::{Delivery, DeliveryResult, TransportError, RESPONSE_BODY_LIMIT};

/// Where and how a batch is sent.
pub struct Target<'a> {
    pub url: &'a str,
    pub secrets: &'a [Secret],
    pub legacy: bool,
    pub timeout_ms: u64,
}

pub struct Outcome {
    pub attempt: Attempt,
    pub result: DeliveryResult,
}

fn now_ms() -> i64 {
    worker::js_sys::Date::now() as i64
}

/// Send every delivery concurrently; `on_done` sees each outcome as soon as it is known (the
/// caller folds it into the limiter). Returns the outcomes in the order of `deliveries`.
/// Never fails: every failure is an [`Outcome`].
pub async fn deliver_all(
    target: &Target<'_>,
    deliveries: &[Delivery],
    mut on_done: impl FnMut(&Outcome),
) -> Vec<Outcome> {
    let started = now_ms();
    let controller = AbortController::default();
    let signal = controller.signal();
    let mut slots: Vec<Option<Outcome>> = deliveries.iter().map(|_| None).collect();
    let mut pending: FuturesUnordered<_> = deliveries
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let signal = &signal;
            async move {
                let attempt = match request(target, d, started) {
                    Ok(req) => exchange(req, signal).await,
                    Err(_) => Err(TransportError::RefusedUrl),
                };
                (i, attempt)
            }
        })
        .collect();
    let mut timer = pin!(Delay::from(Duration::from_millis(target.timeout_ms)));
    loop {
        match select(pending.next(), timer.as_mut()).await {
            Either::Left((Some((i, attempt)), _)) => {
                let outcome = finish(&deliveries[i], attempt, started);
                on_done(&outcome);
                slots[i] = Some(outcome);
            }
            Either::Left((None, _)) => break,
            Either::Right(((), _)) => {
                controller.abort();
                break;
            }
        }
    }
    drop(pending);
    slots
        .into_iter()
        .zip(deliveries)
        .map(|(slot, d)| {
            slot.unwrap_or_else(|| {
                let outcome = finish(d, Err(TransportError::Timeout), started);
                on_done(&outcome);
                outcome
            })
        })
        .collect()
}

fn finish(
    d: &Delivery,
    attempt: Result<(Attempt, String), TransportError>,
    started: i64,
) -> Outcome {
    let latency_ms = (now_ms() - started).max(0) as u64;
    let (attempt, body) = match attempt {
        Ok((a, body)) => (a, body),
        Err(e) => (Attempt::Transport(e), String::new()),
    };
    let result = result_for(&d.id, &attempt, latency_ms, Some(&body));
    Outcome { attempt, result }
}

fn request(target: &Target<'_>, d: &Delivery, now_ms: i64) -> worker::Result<Request> {
    let headers = Headers::new();
    let body = d.body.as_bytes();
    let signed = sign::sign_headers(target.secrets, &d.event_id, now_ms / 1000, body);
    headers.set("content-type", "application/json")?;
    headers.set("user-agent", "Fanout/1 (+webhooks)")?;
    headers.set(sign::HEADER_ID, &signed.id)?;
    headers.set(sign::HEADER_TIMESTAMP, &signed.timestamp)?;
    headers.set(sign::HEADER_SIGNATURE, &signed.signature)?;
    if target.legacy {
        if let Some(first) = target.secrets.first() {
            headers.set(sign::HEADER_LEGACY, &first.sign_legacy(body))?;
        }
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_redirect(RequestRedirect::Manual)
        .with_body(Some(worker::wasm_bindgen::JsValue::from_str(&d.body)));
    Request::new_with_init(target.url, &init)
}

/// One exchange; the response body is read whole (so the connection can be reused) and cut to
/// [`RESPONSE_BODY_LIMIT`].
async fn exchange(req: Request, signal: &AbortSignal) -> Result<(Attempt, String), TransportError> {
    let mut resp = Fetch::Request(req)
        .send_with_signal(signal)
        .await
        .map_err(|_| TransportError::Connect)?;
    let status = resp.status_code();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .ok()
        .flatten()
        .and_then(|v| parse_retry_after(&v, now_ms()));
    let attempt = Attempt::Status {
        status,
        retry_after_ms: retry_after,
    };
    let body = resp.bytes().await.unwrap_or_default();
    let cut = &body[..body.len().min(RESPONSE_BODY_LIMIT)];
    Ok((attempt, String::from_utf8_lossy(cut).into_owned()))
}
