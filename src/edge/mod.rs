//! The Cloudflare Worker: routing, the origin's signature, and the hand-off to the subscriber's
//! Durable Object. The only module that touches `worker::*`; all decisions live in the pure core.

mod error;
mod send;
mod subscriber;

use worker::{event, Context, Env, Headers, Method, Request, RequestInit, Response};

use crate::edge_limits::{EdgeLimits, LimitError};
use crate::sign::{self, Secret};
use crate::wire::DeliveryBatch;
use error::EdgeError;

/// The Durable Object namespace binding in `wrangler.toml`.
const DO_BINDING: &str = "SUBSCRIBER";
/// How the Worker tells the subscriber's object which signed call this is (its `webhook-id`
/// and `webhook-timestamp`), so that the object refuses the same call twice.
const CALL_ID_HEADER: &str = "x-fanout-call-id";
const CALL_TS_HEADER: &str = "x-fanout-call-timestamp";

/// A variable's text: a string var as it is, any other JSON var (`MAX_OPEN_SENDS = 6` in
/// wrangler.toml is a number) in its JSON form.
fn var_text(env: &Env, name: &str) -> Option<String> {
    env.var(name).map(|v| v.to_string()).ok().or_else(|| {
        env.object_var::<serde_json::Value>(name)
            .ok()
            .map(|v| match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            })
    })
}

/// The platform limits from the Worker's variables (docs/src/edge.md, "The edge's platform
/// limits").
fn env_limits(env: &Env) -> Result<EdgeLimits, LimitError> {
    EdgeLimits::from_vars(|name| var_text(env, name))
}

/// The signed call that was verified: its id and timestamp as the origin sent them.
struct SignedCall {
    id: String,
    timestamp: String,
}

impl SignedCall {
    /// The headers that tell the subscriber's object which call this is.
    fn headers(&self) -> worker::Result<Headers> {
        let headers = Headers::new();
        headers.set(CALL_ID_HEADER, &self.id)?;
        headers.set(CALL_TS_HEADER, &self.timestamp)?;
        Ok(headers)
    }
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> worker::Result<Response> {
    match route(req, &env).await {
        Ok(resp) => Ok(resp),
        Err(e) => e.into_response(),
    }
}

async fn route(mut req: Request, env: &Env) -> Result<Response, EdgeError> {
    let path = req.path();
    let method = req.method();
    match (path.as_str(), method) {
        ("/healthz", Method::Get | Method::Head) => Ok(Response::ok("ok")?),
        ("/healthz", _) => Err(EdgeError::MethodNotAllowed("GET")),
        ("/v1/deliveries", Method::Post) => deliveries(&mut req, env).await,
        ("/v1/deliveries", _) => Err(EdgeError::MethodNotAllowed("POST")),
        (p, m) if p.starts_with("/v1/subscribers/") => {
            if m != Method::Get {
                return Err(EdgeError::MethodNotAllowed("GET"));
            }
            let id = p.trim_start_matches("/v1/subscribers/");
            if id.is_empty() || id.contains('/') {
                return Err(EdgeError::NotFound);
            }
            // Signed over its method and path (no body is read), and accepted once: the
            // subscriber's object refuses its call id again, as for a batch.
            let call = authenticate(&req, env, &sign::bodiless_message("GET", p))?;
            let id = percent_decode(id);
            let stub = env
                .durable_object(DO_BINDING)?
                .id_from_name(&id)?
                .get_stub()?;
            let url = format!(
                "https://subscriber.internal/status?id={}",
                encode_component(&id)
            );
            let mut init = RequestInit::new();
            init.with_method(Method::Get).with_headers(call.headers()?);
            let inner = Request::new_with_init(&url, &init)?;
            stub.fetch_with_request(inner)
                .await
                .map_err(EdgeError::ObjectUnavailable)
        }
        _ => Err(EdgeError::NotFound),
    }
}

/// `POST /v1/deliveries`: size, signature, content type, then strict validation; one Durable
/// Object round trip for the whole batch.
async fn deliveries(req: &mut Request, env: &Env) -> Result<Response, EdgeError> {
    let limits = env_limits(env)?;
    let body = read_body(req, limits.max_request_bytes).await?;
    let call = authenticate(req, env, &body)?;
    let content_type = req.headers().get("content-type")?.unwrap_or_default();
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(EdgeError::UnsupportedMediaType);
    }
    let batch = DeliveryBatch::parse(&body, allow_loopback(env))?;
    if batch.deliveries.len() > limits.max_deliveries_per_call {
        return Err(EdgeError::TooLarge(format!(
            "{} deliveries in one call; this edge takes at most {} (MAX_DELIVERIES_PER_CALL)",
            batch.deliveries.len(),
            limits.max_deliveries_per_call
        )));
    }
    let stub = env
        .durable_object(DO_BINDING)?
        .id_from_name(&batch.subscriber.id)?
        .get_stub()?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(call.headers()?)
        // Validated above and forwarded as received: the object parses the same bytes.
        .with_body(Some(
            worker::js_sys::Uint8Array::from(body.as_slice()).into(),
        ));
    let inner = Request::new_with_init("https://subscriber.internal/deliver", &init)?;
    // The object may be overloaded, reset or unreachable: the stub's fetch throws. Nothing of
    // the batch is known to be sent; the origin keeps it pending (503, retryable).
    stub.fetch_with_request(inner)
        .await
        .map_err(EdgeError::ObjectUnavailable)
}

/// The request body, refused with 413 as soon as it passes `limit`: by its content-length
/// before anything is read, else while it streams (never buffered past the limit).
async fn read_body(req: &mut Request, limit: usize) -> Result<Vec<u8>, EdgeError> {
    let too_large = || EdgeError::TooLarge(format!("request body over {limit} bytes"));
    let declared = req
        .headers()
        .get("content-length")?
        .and_then(|v| v.trim().parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    match send::read_limited(req, limit).await {
        Ok(Some(body)) => Ok(body),
        Ok(None) => Err(too_large()),
        // The caller went away mid-body: nothing to act on.
        Err(_) => Err(EdgeError::Batch(crate::wire::BatchError::Invalid(
            "the request body broke off".into(),
        ))),
    }
}

/// Every call but `/healthz` is signed by the origin with `EDGE_SIGNING_KEY`.
fn authenticate(req: &Request, env: &Env, body: &[u8]) -> Result<SignedCall, EdgeError> {
    let key_text = env
        .secret("EDGE_SIGNING_KEY")
        .map(|s| s.to_string())
        .or_else(|_| env.var("EDGE_SIGNING_KEY").map(|v| v.to_string()))
        .map_err(|_| EdgeError::Misconfigured("EDGE_SIGNING_KEY is not set".into()))?;
    let key = Secret::parse(key_text.trim())
        .map_err(|e| EdgeError::Misconfigured(format!("EDGE_SIGNING_KEY: {e}")))?;
    let h = req.headers();
    let id = h.get(sign::HEADER_ID)?;
    let ts = h.get(sign::HEADER_TIMESTAMP)?;
    let sig = h.get(sign::HEADER_SIGNATURE)?;
    let now_secs = (worker::Date::now().as_millis() / 1000) as i64;
    sign::verify(
        &[key],
        id.as_deref(),
        ts.as_deref(),
        sig.as_deref(),
        body,
        now_secs,
    )
    .map_err(|e| EdgeError::Unauthorized(e.to_string()))?;
    // verify() refuses a missing id or timestamp.
    Ok(SignedCall {
        id: id.unwrap_or_default(),
        timestamp: ts.unwrap_or_default().trim().to_string(),
    })
}

fn allow_loopback(env: &Env) -> bool {
    env.var("ALLOW_LOOPBACK_HTTP")
        .map(|v| v.to_string().trim().eq_ignore_ascii_case("true"))
        .unwrap_or(false)
}

fn encode_component(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_string())
}
