//! The daemon's own routes: `/healthz` (is it working), `/metrics` (Prometheus text),
//! `GET /v1/retention` (what retention removed and kept) and `GET /v1/outbox` (what the
//! producer's outbox task did). They read; they change nothing.

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::state::AppState;
use crate::ledger::{Observe as _, Retention as _};
use crate::time::now_ms;

/// How long `/healthz` waits for a shared ledger to answer before it says that it does not: a
/// server that stalls (its disk, a lock, a network that drops packets) keeps its connections
/// open and silent, and a probe must not hang with it.
const LEDGER_ANSWERS_WITHIN: Duration = Duration::from_secs(1);

/// 200 when the dispatcher turns and the ledger can write; 503 with the reasons otherwise.
/// Reads atomics only on a local ledger: it answers at once even while the writer is busy (a
/// shared ledger is also asked to answer, for at most [`LEDGER_ANSWERS_WITHIN`]).
pub(super) async fn healthz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let now = now_ms();
    let mut problems = crate::health::verdict(state.health.snapshot(), now);
    problems.extend(state.metrics.outbox.problem(now));
    if state.ledger.is_shared() {
        // A shared ledger: healthy only while it answers, and soon.
        let message = match tokio::time::timeout(LEDGER_ANSWERS_WITHIN, state.ledger.ping()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("the shared ledger does not answer: {e}")),
            Err(_) => Some(format!(
                "the shared ledger did not answer within {} ms",
                LEDGER_ANSWERS_WITHIN.as_millis()
            )),
        };
        if let Some(message) = message {
            problems.push(crate::health::Problem {
                code: "ledger_unavailable",
                message,
            });
        }
    }
    if problems.is_empty() {
        Ok(Json(json!({ "status": "ok" })))
    } else {
        Err(ApiError::Unhealthy(problems))
    }
}

/// What retention has removed and the oldest finished deliveries it kept: keyed lookups only.
pub(super) async fn retention(
    State(state): State<AppState>,
) -> Result<impl IntoResponse, ApiError> {
    let report = state.ledger.retention_report().await?;
    Ok(Json(crate::retention::RetentionView::of(
        &state.cfg.retention,
        report,
        &state.metrics.retention,
    )))
}

/// `GET /v1/outbox`: what the outbox task did (counters the task keeps; nothing is read).
pub(super) async fn outbox(State(state): State<AppState>) -> Json<crate::metrics::OutboxView> {
    Json(state.metrics.outbox.view())
}

pub(super) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let text = crate::metrics::scrape(&state.ledger, &state.metrics, state.cfg.breaker).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::state::ApiConfig;
    use crate::health::Health;
    use crate::ledger::store::Store;
    use crate::metrics::Metrics;

    /// `/healthz` reads atomics only: it answers at once while the writer is held, and says
    /// 503 with the reason before the dispatcher's first turn.
    #[tokio::test]
    async fn healthz_never_waits_behind_the_writer_and_tells_why() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Store::scratch(dir.path());
        let health = Health::new(ledger.write_state(), crate::health::Heartbeat::default());
        let state = AppState::new(
            ledger.clone(),
            tokio::sync::mpsc::unbounded_channel().0,
            ApiConfig {
                api_token: "t".repeat(16),
                allow_loopback: false,
                max_event_bytes: 1024,
                rotation_grace_ms: 0,
                retention: Default::default(),
                body_timeout: std::time::Duration::from_secs(1),
                portal_key: vec![7; 32],
                breaker: Default::default(),
                portal_frame_ancestors: "'none'".into(),
                telemetry: Default::default(),
                max_total_in_flight: 1,
                public_url: "http://127.0.0.1:1".into(),
            },
            Arc::new(Metrics::new(false)),
            health.clone(),
        );
        let ask = |state: AppState| async move {
            let r =
                tokio::time::timeout(std::time::Duration::from_millis(500), healthz(State(state)))
                    .await
                    .expect("healthz waited")
                    .into_response();
            let status = r.status().as_u16();
            let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            )
        };
        let (status, body) = ask(state.clone()).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["problems"][0]["code"], "dispatcher_not_running");
        health.heartbeat().beat(now_ms());
        let held = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.hold_writer(std::time::Duration::from_secs(2)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (status, body) = ask(state).await;
        assert_eq!(status, 200, "{body}");
        held.await.unwrap().unwrap();
    }
}
