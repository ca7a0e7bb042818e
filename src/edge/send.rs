//! One signed POST to a subscriber: Standard Webhooks headers, `redirect: manual`, and a timeout
//! enforced by racing the fetch with a delay and aborting it.

use std::pin::pin;
use std::time::Duration;

use futures_util::future::{select, Either};
use worker::{
    AbortController, Delay, Fetch, Headers, Method, Request, RequestInit, RequestRedirect,
};

use crate::retry::{parse_retry_after, result_for, Attempt};
use crate::sign::{self, Secret};
use crate::wire::{Delivery, DeliveryResult, TransportError, RESPONSE_BODY_LIMIT};

pub struct Outcome {
    pub attempt: Attempt,
    pub result: DeliveryResult,
}

fn now_ms() -> i64 {
    worker::Date::now().as_millis() as i64
}

/// Send one delivery. Never fails: every failure is an [`Outcome`].
pub async fn deliver(
    url: &str,
    secrets: &[Secret],
    legacy: bool,
    timeout_ms: u64,
    d: &Delivery,
) -> Outcome {
    let started = now_ms();
    let attempt = match request(url, secrets, legacy, d, started) {
        Ok(req) => exchange(req, timeout_ms, started).await,
        Err(_) => Err(TransportError::RefusedUrl),
    };
    let latency_ms = (now_ms() - started).max(0) as u64;
    let (attempt, body) = match attempt {
        Ok((a, body)) => (a, body),
        Err(e) => (Attempt::Transport(e), String::new()),
    };
    let result = result_for(&d.id, &attempt, latency_ms, Some(&body));
    Outcome { attempt, result }
}

fn request(
    url: &str,
    secrets: &[Secret],
    legacy: bool,
    d: &Delivery,
    now_ms: i64,
) -> worker::Result<Request> {
    let headers = Headers::new();
    let signed = sign::sign_headers(secrets, &d.event_id, now_ms / 1000, d.body.as_bytes());
    headers.set("content-type", "application/json")?;
    headers.set("user-agent", "Fanout/1 (+webhooks)")?;
    headers.set(sign::HEADER_ID, &signed.id)?;
    headers.set(sign::HEADER_TIMESTAMP, &signed.timestamp)?;
    headers.set(sign::HEADER_SIGNATURE, &signed.signature)?;
    if legacy {
        if let Some(first) = secrets.first() {
            headers.set(sign::HEADER_LEGACY, &first.sign_legacy(d.body.as_bytes()))?;
        }
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_redirect(RequestRedirect::Manual)
        .with_body(Some(worker::wasm_bindgen::JsValue::from_str(&d.body)));
    Request::new_with_init(url, &init)
}

async fn exchange(
    req: Request,
    timeout_ms: u64,
    started_ms: i64,
) -> Result<(Attempt, String), TransportError> {
    let controller = AbortController::default();
    let signal = controller.signal();
    let work = async move {
        let mut resp = Fetch::Request(req)
            .send_with_signal(&signal)
            .await
            .map_err(|_| TransportError::Connect)?;
        let status = resp.status_code();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .ok()
            .flatten()
            .and_then(|v| parse_retry_after(&v, now_ms()));
        let body = resp.bytes().await.unwrap_or_default();
        let cut = &body[..body.len().min(RESPONSE_BODY_LIMIT)];
        Ok((
            Attempt::Status {
                status,
                retry_after_ms: retry_after,
            },
            String::from_utf8_lossy(cut).into_owned(),
        ))
    };
    let elapsed = (now_ms() - started_ms).max(0) as u64;
    let timer = Delay::from(Duration::from_millis(timeout_ms.saturating_sub(elapsed)));
    let work = pin!(work);
    let timer = pin!(timer);
    match select(work, timer).await {
        Either::Left((result, _)) => result,
        Either::Right(((), _)) => {
            controller.abort();
            Err(TransportError::Timeout)
        }
    }
}
