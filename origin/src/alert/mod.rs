//! Operational alerts: a warning in the log and, when `--alert-url` is set, a signed event to
//! the operator's endpoint. `rules` decides (pure); this module only tells.
//!
//! An alert is a notification, not the truth: the state it reports (a disabled subscriber,
//! the dead count, the breaker) is in the ledger before the alert is raised. Sending is best
//! effort and never blocks dispatch: `raise` hands the alert to a sender task over a bounded
//! channel (dropping it, with a log line, if that is full) and the task retries a few times.
//!
//! The event is signed like a webhook (Standard Webhooks headers, `fanout_core::sign`) with
//! `--alert-secret`; its `webhook-id` is the alert's id, the same on every retry:
//!
//! ```json
//! { "id": "alrt_…", "type": "fanout.subscriber.breaker_opened", "subscriber": "sub_partner",
//!   "at": "2026-11-30T04:45:53.250Z", "at_ms": 1796013953250, "details": { … } }
//! ```

pub mod rules;

use std::sync::Arc;
use std::time::Duration;

use fanout_core::sign::Secret;
use tokio::sync::{mpsc, Semaphore};

use crate::outbound::{Outbound, SendError, Signer, Trust};
use crate::time::format_rfc3339;
pub use rules::{Alert, AlertRules};

/// Waits before each retry of an alert that could not be sent.
const RETRY_DELAYS_MS: [u64; 3] = [1_000, 5_000, 30_000];
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Alerts waiting for the sender; beyond this they are dropped (and logged).
const QUEUE: usize = 1024;
/// Alerts being sent at once.
const CONCURRENT_SENDS: usize = 8;

/// Where alerts go: the operator's URL and the `whsec_` secret that signs them.
#[derive(Debug, Clone)]
pub struct AlertTarget {
    pub url: String,
    pub secret: Secret,
}

/// One alert about one subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub subscriber: String,
    pub at_ms: i64,
    pub alert: Alert,
}

impl Notice {
    /// The JSON body sent to the operator.
    pub fn body(&self, id: &str) -> String {
        serde_json::json!({
            "id": id,
            "type": self.alert.kind(),
            "subscriber": self.subscriber,
            "at": format_rfc3339(self.at_ms),
            "at_ms": self.at_ms,
            "details": self.alert.details(),
        })
        .to_string()
    }
}

/// Raises alerts. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Alerter {
    tx: Option<mpsc::Sender<Notice>>,
}

impl Alerter {
    /// Log only (no `--alert-url`).
    pub fn log_only() -> Alerter {
        Alerter { tx: None }
    }

    /// Start the sender task (on the current Tokio runtime) when there is a target; alerts go
    /// out through the daemon's one outbound client.
    pub fn start(target: Option<AlertTarget>, out: Outbound) -> Alerter {
        let Some(target) = target else {
            return Alerter::log_only();
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(sender(rx, out, Arc::new(target)));
        Alerter { tx: Some(tx) }
    }

    /// Log a warning and queue the alert for the operator's endpoint. Never waits.
    pub fn raise(&self, notice: Notice) {
        tracing::warn!(
            subscriber = %notice.subscriber,
            alert = notice.alert.kind(),
            details = %notice.alert.details(),
            "subscriber alert"
        );
        if let Some(tx) = &self.tx {
            if let Err(e) = tx.try_send(notice) {
                tracing::warn!(error = %e, "alert not sent: the alert queue is full");
            }
        }
    }
}

async fn sender(mut rx: mpsc::Receiver<Notice>, http: Outbound, target: Arc<AlertTarget>) {
    let slots = Arc::new(Semaphore::new(CONCURRENT_SENDS));
    while let Some(notice) = rx.recv().await {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (http, target) = (http.clone(), target.clone());
        tokio::spawn(async move {
            send_with_retries(&http, &target, &notice).await;
            drop(permit);
        });
    }
}

async fn send_with_retries(http: &Outbound, target: &AlertTarget, notice: &Notice) {
    let id = format!("alrt_{:016x}", getrandom::u64().unwrap_or_default());
    let body = notice.body(&id);
    let mut last: Option<AlertSendError> = None;
    for attempt in 0..=RETRY_DELAYS_MS.len() {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(RETRY_DELAYS_MS[attempt - 1])).await;
        }
        match send_once(http, target, &id, &body).await {
            Ok(()) => {
                tracing::info!(subscriber = %notice.subscriber, alert = notice.alert.kind(), id, "alert sent");
                return;
            }
            Err(e) => last = Some(e),
        }
    }
    tracing::warn!(
        subscriber = %notice.subscriber,
        alert = notice.alert.kind(),
        id,
        error = %last.map(|e| e.to_string()).unwrap_or_default(),
        "alert not delivered to the operator endpoint; gave up after {} attempts",
        RETRY_DELAYS_MS.len() + 1
    );
}

/// Why an alert was not taken by the operator's endpoint.
#[derive(Debug, thiserror::Error)]
enum AlertSendError {
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("status {0}")]
    Status(u16),
}

async fn send_once(
    http: &Outbound,
    target: &AlertTarget,
    id: &str,
    body: &str,
) -> Result<(), AlertSendError> {
    let signer = Signer::key(target.secret.clone());
    let resp = http
        .post_signed(
            Trust::Operator,
            target.url.as_str(),
            &signer,
            id,
            body.as_bytes(),
            &[],
            SEND_TIMEOUT,
        )
        .await?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(AlertSendError::Status(resp.status().as_u16()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_names_the_event() {
        let n = Notice {
            subscriber: "sub_a".into(),
            at_ms: 1_796_013_953_250,
            alert: Alert::DeadThreshold {
                dead: 100,
                threshold: 100,
            },
        };
        let v: serde_json::Value = serde_json::from_str(&n.body("alrt_1")).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({
                "id": "alrt_1",
                "type": "fanout.subscriber.dead_threshold",
                "subscriber": "sub_a",
                "at": "2026-11-30T04:45:53.250Z",
                "at_ms": 1_796_013_953_250_i64,
                "details": { "dead": 100, "threshold": 100 },
            })
        );
    }
}
