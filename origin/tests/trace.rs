//! OpenTelemetry end to end (issue 26): the real `fanout` binary exporting to a real OTLP/HTTP
//! receiver in this test (it decodes the protobuf), real subscribers. A producer's
//! `traceparent` puts ingest and every attempt (a retry, a replay) in the producer's trace with
//! the HTTP semantic-convention attributes; a subscriber with `propagate_trace` receives
//! `traceparent` in that trace, another never does; no exported attribute holds a URL path, a
//! query, a body or a secret. Without an endpoint nothing is exported and the stored context
//! is what a `propagate_trace` subscriber receives.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use common::{free_port, sub_spec, wait_for, Answer, Binary, Subscriber, TOKEN};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use serde_json::json;

const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: Vec<(String, String)>,
}

impl Span {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A real OTLP/HTTP receiver: `POST /v1/traces`, protobuf.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    task: tokio::task::JoinHandle<()>,
}

async fn traces(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> &'static str {
    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut out = spans.lock().unwrap();
    for rs in req.resource_spans {
        for ss in rs.scope_spans {
            for s in ss.spans {
                let attributes = s
                    .attributes
                    .iter()
                    .map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(Any::StringValue(s)) => s.clone(),
                            Some(Any::IntValue(i)) => i.to_string(),
                            Some(Any::BoolValue(b)) => b.to_string(),
                            Some(Any::DoubleValue(d)) => d.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), v)
                    })
                    .collect();
                out.push(Span {
                    name: s.name,
                    kind: s.kind,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    attributes,
                });
            }
        }
    }
    ""
}

impl Receiver {
    async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(traces))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            endpoint,
            spans,
            task,
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The client spans (attempts) of one event to one subscriber.
    fn attempts(&self, event: &str, sub: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| {
                s.kind == 3
                    && s.attr("fanout.event.id") == Some(event)
                    && s.attr("fanout.subscriber.id") == Some(sub)
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `POST /v1/events` with a `traceparent` header.
async fn ingest(base: &str, event: serde_json::Value, traceparent: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{base}/v1/events"))
        .bearer_auth(TOKEN)
        .header("traceparent", traceparent)
        .json(&event)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn producer() -> String {
    format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01")
}

/// The trace id of a `traceparent` header value.
fn trace_of(tp: &str) -> &str {
    tp.split('-').nth(1).unwrap()
}

#[tokio::test]
async fn spans_join_the_producers_trace_and_only_propagating_subscribers_get_traceparent() {
    let receiver = Receiver::start().await;
    // `traced` fails its first attempt, then answers 200.
    let traced = Subscriber::start(|_, n| Answer::status(if n == 1 { 500 } else { 200 })).await;
    let plain = Subscriber::ok().await;
    let dir = tempfile::tempdir().unwrap();
    let d = Binary::start_env(
        free_port(),
        &dir.path().join("f.db"),
        &["--backoff-scale", "0.001"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_SERVICE_NAME", "fanout-test"),
        ],
    )
    .await;
    let mut spec = sub_spec(
        "traced",
        &format!("{}/hooks/private-path?token=sekrit", traced.url),
        &["*"],
    );
    spec["propagate_trace"] = json!(true);
    d.api.subscriber(spec).await;
    let (_, shown) = d.api.get("/v1/subscribers/traced").await;
    assert_eq!(shown["propagate_trace"], json!(true), "{shown}");
    d.api
        .subscriber(sub_spec("plain", &format!("{}/p", plain.url), &["*"]))
        .await;

    let event = json!({"id": "evt_t1", "type": "user.signup", "email": "jane@example.com"});
    assert_eq!(ingest(&d.api.base, event, &producer()).await, 202);
    wait_for("two attempts and one", Duration::from_secs(20), || async {
        traced.count() == 2 && plain.count() == 1
    })
    .await;
    for r in traced.received() {
        let tp = r
            .header("traceparent")
            .expect("a traceparent for propagate_trace");
        assert_eq!(trace_of(tp), PRODUCER_TRACE, "{tp}");
    }
    assert_eq!(plain.received()[0].header("traceparent"), None);

    wait_for("the attempt spans", Duration::from_secs(20), || async {
        receiver.attempts("evt_t1", "traced").len() == 2
            && receiver.attempts("evt_t1", "plain").len() == 1
    })
    .await;
    let mut attempts = receiver.attempts("evt_t1", "traced");
    attempts.sort_by_key(|s| s.attr("http.request.resend_count").is_some());
    let (first, retry) = (&attempts[0], &attempts[1]);
    for s in &attempts {
        assert_eq!(s.trace_id, PRODUCER_TRACE, "{s:?}");
        assert_eq!(s.name, "POST");
        assert_eq!(s.attr("http.request.method"), Some("POST"));
        assert_eq!(s.attr("server.address"), Some("127.0.0.1"));
        assert_eq!(s.attr("fanout.lane"), Some("origin"));
    }
    assert_eq!(first.attr("http.response.status_code"), Some("500"));
    assert_eq!(first.attr("http.request.resend_count"), None);
    assert_eq!(retry.attr("http.response.status_code"), Some("200"));
    assert_eq!(retry.attr("http.request.resend_count"), Some("1"));
    // What the subscriber received names the attempt that carried it.
    let got: Vec<String> = traced
        .received()
        .iter()
        .map(|r| {
            r.header("traceparent")
                .unwrap()
                .split('-')
                .nth(2)
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        got.contains(&first.span_id) && got.contains(&retry.span_id),
        "{got:?}"
    );
    // The attempts hang under the ingest span, which hangs under the producer's span.
    let ingest_span = receiver
        .spans()
        .into_iter()
        .find(|s| s.kind == 2 && s.trace_id == PRODUCER_TRACE)
        .expect("the ingest span");
    assert_eq!(ingest_span.parent, PRODUCER_SPAN);
    assert_eq!(ingest_span.attr("http.response.status_code"), Some("202"));
    assert_eq!(first.parent, ingest_span.span_id);

    // A replay, later, joins the same trace.
    let id = d.api.deliveries("subscriber=plain").await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = d
        .api
        .post(&format!("/v1/deliveries/{id}/replay"), json!({}))
        .await;
    assert!(status < 300, "{status} {body}");
    wait_for("the replay's span", Duration::from_secs(20), || async {
        receiver.attempts("evt_t1", "plain").len() == 2
    })
    .await;
    assert!(receiver
        .attempts("evt_t1", "plain")
        .iter()
        .all(|s| s.trace_id == PRODUCER_TRACE));
    assert_eq!(plain.count(), 2);
    assert!(plain
        .received()
        .iter()
        .all(|r| r.header("traceparent").is_none()));

    // An invalid traceparent is ignored: the event is taken, in a trace of its own.
    let event = json!({"id": "evt_t2", "type": "user.signup"});
    assert_eq!(ingest(&d.api.base, event, "00-garbage").await, 202);
    wait_for(
        "the second event's spans",
        Duration::from_secs(20),
        || async { receiver.attempts("evt_t2", "traced").len() == 1 },
    )
    .await;
    assert_ne!(
        receiver.attempts("evt_t2", "traced")[0].trace_id,
        PRODUCER_TRACE
    );

    // Nothing of a URL's path or query, a body, a header or a secret in any attribute.
    let allowed = [
        "http.request.method",
        "http.route",
        "http.response.status_code",
        "http.request.resend_count",
        "server.address",
        "server.port",
        "error.type",
        "fanout.event.id",
        "fanout.subscriber.id",
        "fanout.delivery.id",
        "fanout.lane",
        "fanout.outcome",
    ];
    let spans = receiver.spans();
    assert!(spans.len() >= 6, "{spans:?}");
    for s in &spans {
        for (k, v) in &s.attributes {
            assert!(allowed.contains(&k.as_str()), "attribute {k} in {s:?}");
            for secret in [
                "private-path",
                "sekrit",
                "jane@",
                "whsec_",
                TOKEN,
                "/hooks",
                "/p",
            ] {
                assert!(!v.contains(secret), "{k}={v} holds {secret:?}");
            }
        }
    }
}

/// With no endpoint the daemon exports nothing, and a `propagate_trace` subscriber receives
/// exactly the context stored with the event, hours later as at once.
#[tokio::test]
async fn without_an_endpoint_the_stored_context_is_propagated() {
    let traced = Subscriber::ok().await;
    let plain = Subscriber::ok().await;
    let dir = tempfile::tempdir().unwrap();
    let d = Binary::start(&dir.path().join("f.db"), &[]).await;
    let mut spec = sub_spec("traced", &traced.url, &["*"]);
    spec["propagate_trace"] = json!(true);
    d.api.subscriber(spec).await;
    d.api
        .subscriber(sub_spec("plain", &plain.url, &["*"]))
        .await;
    let event = json!({"id": "evt_o1", "type": "a"});
    assert_eq!(ingest(&d.api.base, event, &producer()).await, 202);
    wait_for("both webhooks", Duration::from_secs(20), || async {
        traced.count() == 1 && plain.count() == 1
    })
    .await;
    assert_eq!(
        traced.received()[0].header("traceparent"),
        Some(producer().as_str())
    );
    assert_eq!(plain.received()[0].header("traceparent"), None);
}

/// An outbox round that ingests is a consumer span of its own, and the attempts of its events
/// are its children: a producer that writes to its outbox can follow an event from the round
/// that took it to each webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_round_is_a_span_and_its_events_attempts_join_it() {
    let receiver = Receiver::start().await;
    let sink = Subscriber::ok().await;
    let dir = tempfile::tempdir().unwrap();
    let producer = dir.path().join("producer.db");
    let init = std::process::Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["outbox", "init", "--db", producer.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let d = Binary::start_env(
        free_port(),
        &dir.path().join("f.db"),
        &["--outbox", producer.to_str().unwrap()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
    .await;
    d.api.subscriber(sub_spec("s", &sink.url, &["*"])).await;
    let c = rusqlite::Connection::open(&producer).unwrap();
    c.execute(
        "INSERT INTO fanout_outbox (payload) VALUES (?1)",
        [json!({"id": "evt_ob", "type": "order.created"}).to_string()],
    )
    .unwrap();
    wait_for(
        "the outbox event's attempt span",
        Duration::from_secs(20),
        || async { receiver.attempts("evt_ob", "s").len() == 1 },
    )
    .await;
    let round = receiver
        .spans()
        .into_iter()
        .find(|s| s.name == "outbox ingest")
        .expect("the outbox round's span");
    assert_eq!(round.kind, 5, "a consumer span: {round:?}");
    assert_eq!(round.parent, "", "a trace of its own");
    assert_eq!(round.attr("fanout.outbox.events"), Some("1"));
    let attempt = &receiver.attempts("evt_ob", "s")[0];
    assert_eq!(attempt.trace_id, round.trace_id);
    assert_eq!(attempt.parent, round.span_id);
    assert_eq!(sink.count(), 1);
}
