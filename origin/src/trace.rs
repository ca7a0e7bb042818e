//! OpenTelemetry: the daemon's spans, exported over OTLP (http/protobuf) when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set. The only
//! module that names the `opentelemetry` crates (tidy).
//!
//! Spans:
//! - `POST /v1/events` (kind server), one per request, a child of the producer's `traceparent`
//!   when it sent a valid one (an invalid one is ignored, never a 400).
//! - every delivery attempt (kind client, named `POST`), a child of the trace context stored
//!   with its event: an attempt hours later or a replay joins the producer's trace. On the edge
//!   lane each delivery of a call gets its own span over the origin→edge call (the Worker makes
//!   the request; its status comes back in the call's answer), `fanout.lane = edge`.
//!
//! Attributes are the HTTP semantic conventions' `http.request.method`, `server.address` and
//! `server.port` (host and port only), `http.response.status_code`, `http.request.resend_count`
//! (attempts before this one, when there were some) and `error.type`, plus `fanout.event.id`,
//! `fanout.subscriber.id`, `fanout.delivery.id`, `fanout.lane` and `fanout.outcome`. Never a
//! URL path or query, a body, a header or a secret (the logs' rule): [`Attempt`] has no field
//! for one.
//!
//! What is stored with an event is a W3C `traceparent` (`fanout_core::traceparent`): the
//! ingest span's context while exporting (so the attempts hang under it), else the producer's
//! as received. Off, [`Telemetry`] is `None` inside: no SDK, no span, no allocation per event.
//! Spans leave through a batch processor on the daemon's tokio runtime, over the daemon's own
//! reqwest client (no blocking client, no second HTTP stack); the `OTEL_BSP_*` variables tune
//! it, `OTEL_EXPORTER_OTLP_HEADERS` and `…_TIMEOUT` are read by the exporter, and
//! `OTEL_SERVICE_NAME` names the service (default `fanout`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fanout_core::traceparent::TraceParent;
use fanout_core::wire::DeliveryResult;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// Why tracing could not start (the daemon does not start either: a collector configured and
/// silently not used would be worse).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: fanout exports http/protobuf only"
    )]
    Protocol(String),
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    #[error("the OTLP exporter's HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The daemon's tracing: off (the default), or a tracer exporting over OTLP. Cheap to clone.
#[derive(Clone, Default)]
pub struct Telemetry(Option<Arc<On>>);

struct On {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Telemetry(on)"
        } else {
            "Telemetry(off)"
        })
    }
}

/// Is an OTLP endpoint configured?
fn endpoint_set() -> bool {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
}

impl Telemetry {
    /// From the standard variables: off unless an endpoint is set (or with
    /// `OTEL_SDK_DISABLED=true`). Runs inside the tokio runtime (the batch processor is a task).
    pub fn from_env() -> Result<Telemetry, TelemetryError> {
        let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim() == "true");
        if disabled || !endpoint_set() {
            return Ok(Telemetry::default());
        }
        for k in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Ok(p) = std::env::var(k) {
                if p.trim() != "http/protobuf" {
                    return Err(TelemetryError::Protocol(p));
                }
            }
        }
        let client = Client(
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        );
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(client)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let name = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "fanout".into());
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(name)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("fanout");
        Ok(Telemetry(Some(Arc::new(On { provider, tracer }))))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The span of one `POST /v1/events`, and the `traceparent` to store with its events.
    pub fn ingest(&self, incoming: Option<TraceParent>) -> Ingest {
        let Some(on) = &self.0 else {
            return Ingest {
                span: None,
                stored: incoming.map(|t| t.format()),
            };
        };
        let span = on
            .tracer
            .span_builder("POST /v1/events")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.route", "/v1/events"),
            ])
            .start_with_context(&on.tracer, &parent(incoming.as_ref()));
        let stored = Some(traceparent_of(span.span_context()));
        Ingest {
            span: Some(span),
            stored,
        }
    }

    /// The span of one outbox round that ingests `events` events read from the producer's
    /// table (a consumer span, a trace of its own), and the `traceparent` to store with them so
    /// that their attempts join it. Off: nothing, and nothing stored.
    pub fn outbox(&self, events: usize) -> Ingest {
        let Some(on) = &self.0 else {
            return Ingest {
                span: None,
                stored: None,
            };
        };
        let span = on
            .tracer
            .span_builder("outbox ingest")
            .with_kind(SpanKind::Consumer)
            .with_attributes([KeyValue::new("fanout.outbox.events", events as i64)])
            .start(&on.tracer);
        let stored = Some(traceparent_of(span.span_context()));
        Ingest {
            span: Some(span),
            stored,
        }
    }

    /// The span of one delivery attempt, when exporting.
    pub fn attempt(&self, a: &Attempt<'_>) -> Option<AttemptSpan> {
        let on = self.0.as_ref()?;
        let stored = a.stored.and_then(TraceParent::parse);
        let mut attributes = vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("fanout.event.id", a.event_id.to_string()),
            KeyValue::new("fanout.subscriber.id", a.subscriber_id.to_string()),
            KeyValue::new("fanout.delivery.id", a.delivery_id.to_string()),
            KeyValue::new("fanout.lane", a.lane),
        ];
        if let Some(host) = a.host {
            attributes.push(KeyValue::new("server.address", host.to_string()));
        }
        if let Some(port) = a.port {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        if a.attempt > 1 {
            attributes.push(KeyValue::new(
                "http.request.resend_count",
                i64::from(a.attempt - 1),
            ));
        }
        let span = on
            .tracer
            .span_builder("POST")
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&on.tracer, &parent(stored.as_ref()));
        let traceparent = traceparent_of(span.span_context());
        Some(AttemptSpan { span, traceparent })
    }

    /// Export what is still queued, then stop (at the daemon's end).
    pub async fn shutdown(&self) {
        if let Some(on) = &self.0 {
            let provider = on.provider.clone();
            // The processor's shutdown waits for its task's last export: not on a runtime
            // worker.
            let done = tokio::task::spawn_blocking(move || {
                provider.shutdown_with_timeout(Duration::from_secs(5))
            })
            .await;
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "the last spans could not be exported");
            }
        }
    }
}

/// A context whose span is the given remote parent, or none (a new trace).
fn parent(tp: Option<&TraceParent>) -> Context {
    match tp {
        Some(t) => Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(t.trace_id),
            SpanId::from_bytes(t.parent_id),
            TraceFlags::new(t.flags),
            true,
            TraceState::default(),
        )),
        None => Context::new(),
    }
}

fn traceparent_of(cx: &SpanContext) -> String {
    TraceParent {
        trace_id: cx.trace_id().to_bytes(),
        parent_id: cx.span_id().to_bytes(),
        flags: cx.trace_flags().to_u8(),
    }
    .format()
}

/// One `POST /v1/events`: its span (when exporting) and the `traceparent` its events keep.
#[derive(Debug)]
pub struct Ingest {
    span: Option<opentelemetry_sdk::trace::Span>,
    stored: Option<String>,
}

impl Ingest {
    /// The `traceparent` to store with the request's events.
    pub fn stored(&self) -> Option<&str> {
        self.stored.as_deref()
    }

    /// End an outbox round's span: its events in the ledger, or not (`error`: the ledger's
    /// refusal, kind only).
    pub fn end_round(self, error: Option<&'static str>) {
        if let Some(mut span) = self.span {
            if let Some(kind) = error {
                span.set_status(Status::error(""));
                span.set_attribute(KeyValue::new("error.type", kind));
            }
            span.end();
        }
    }

    /// End the span with the request's answer.
    pub fn end(self, status: u16) {
        if let Some(mut span) = self.span {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 500 {
                span.set_status(Status::error(""));
                span.set_attribute(KeyValue::new("error.type", status.to_string()));
            }
            span.end();
        }
    }
}

/// What an attempt span says about its delivery: ids and the subscriber's host, nothing of its
/// URL's path or query, its body, headers or secrets.
#[derive(Debug)]
pub struct Attempt<'a> {
    pub event_id: &'a str,
    pub subscriber_id: &'a str,
    pub delivery_id: &'a str,
    pub host: Option<&'a str>,
    pub port: Option<u16>,
    /// 1-based; `http.request.resend_count` is this less one.
    pub attempt: u32,
    /// The `traceparent` stored with the event.
    pub stored: Option<&'a str>,
    /// `origin` or `edge`.
    pub lane: &'static str,
}

/// One attempt's span, open until its result.
#[derive(Debug)]
pub struct AttemptSpan {
    span: opentelemetry_sdk::trace::Span,
    traceparent: String,
}

impl AttemptSpan {
    /// The `traceparent` a subscriber with `propagate_trace` receives: this span as parent.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// End it for a delivery that was not sent (`why`: a fixed word).
    pub fn unsent(self, why: &'static str) {
        self.end(None, Some(why), "unsent");
    }

    /// End it with the attempt's result as the lanes report it.
    pub fn finish(self, r: &DeliveryResult) {
        let (status, error) = match r {
            DeliveryResult::Delivered { status, .. } => (Some(*status), None),
            DeliveryResult::Deferred { .. } => (None, None),
            DeliveryResult::Failed { status, error, .. } => (*status, error.map(|e| e.as_str())),
            DeliveryResult::Rejected { status, .. } => (*status, Some("rejected")),
        };
        self.end(status, error, r.outcome());
    }

    /// End it with the attempt's result: the subscriber's status if it answered, else why
    /// not (`error`, a fixed word such as `timeout`), and what the daemon made of it.
    fn end(mut self, status: Option<u16>, error: Option<&str>, outcome: &'static str) {
        if let Some(s) = status {
            self.span
                .set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        let failed = match (status, error) {
            (_, Some(e)) => Some(e.to_string()),
            (Some(s), None) if s >= 400 => Some(s.to_string()),
            _ => None,
        };
        if let Some(kind) = failed {
            self.span.set_attribute(KeyValue::new("error.type", kind));
            self.span.set_status(Status::error(""));
        }
        self.span
            .set_attribute(KeyValue::new("fanout.outcome", outcome));
        self.span.end();
    }
}

/// The exporter's HTTP client: the daemon's reqwest on its tokio runtime.
#[derive(Debug)]
struct Client(reqwest::Client);

#[async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let mut out = Response::builder().status(response.status().as_u16());
        for (k, v) in response.headers() {
            out = out.header(k, v);
        }
        let body = response.bytes().await?;
        Ok(out.body(body)?)
    }
}
