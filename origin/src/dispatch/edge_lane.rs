//! The edge lane's client: one `POST {edge}/v1/deliveries` per batch, signed with the edge key
//! using the Standard Webhooks headers over the exact request body.

use std::time::Duration;

use fanout_core::sign::{self, Secret};
use fanout_core::wire::{BatchResponse, DeliveryBatch, DeliveryResult};

use crate::time::now_ms;

/// Why a whole batch came back unsent: the batch stays pending and is retried.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("edge unreachable: {0}")]
    Unreachable(String),
    /// `body` (its first 512 bytes) is kept for classification, never displayed: it is not
    /// for the logs.
    #[error("edge answered {status}")]
    Status { status: u16, body: String },
    #[error("edge answered something that is not a batch response: {0}")]
    BadResponse(String),
}

#[derive(Debug, Clone)]
pub struct EdgeClient {
    http: reqwest::Client,
    endpoint: String,
    key: Secret,
}

impl EdgeClient {
    pub fn new(base_url: &str, key: Secret) -> Result<EdgeClient, reqwest::Error> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("fanout-origin/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(EdgeClient {
            http,
            endpoint: format!("{}/v1/deliveries", base_url.trim_end_matches('/')),
            key,
        })
    }

    /// Send one batch; on success, the edge's per-delivery results.
    pub async fn send(
        &self,
        batch: &DeliveryBatch,
        call_id: &str,
    ) -> Result<Vec<DeliveryResult>, EdgeError> {
        let body = serde_json::to_vec(batch).map_err(|e| EdgeError::BadResponse(e.to_string()))?;
        let signed = sign::sign_headers(
            std::slice::from_ref(&self.key),
            call_id,
            now_ms().div_euclid(1000),
            &body,
        );
        // The edge sends everything it grants at once; give it the subscriber's timeout and
        // some room.
        let timeout = Duration::from_millis(batch.subscriber.timeout_ms + 15_000);
        let resp = self
            .http
            .post(&self.endpoint)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(sign::HEADER_ID, signed.id)
            .header(sign::HEADER_TIMESTAMP, signed.timestamp)
            .header(sign::HEADER_SIGNATURE, signed.signature)
            .body(body)
            .send()
            .await
            .map_err(|e| EdgeError::Unreachable(crate::redact::http_error(e)))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| EdgeError::Unreachable(crate::redact::http_error(e)))?;
        if status != 200 && status != 202 {
            let body = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
            return Err(EdgeError::Status { status, body });
        }
        let parsed: BatchResponse =
            serde_json::from_slice(&bytes).map_err(|e| EdgeError::BadResponse(e.to_string()))?;
        Ok(parsed.results)
    }
}
