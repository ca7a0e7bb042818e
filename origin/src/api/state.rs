//! What every handler shares: the daemon's settings for the API ([`ApiConfig`]) and the
//! handle on the ledger, the dispatcher, the metrics and the health ([`AppState`]). It does not
//! route, parse or answer anything.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::dispatch::Control;
use crate::health::Health;
use crate::ledger::store::Store;
use crate::metrics::Metrics;

#[derive(Debug)]
pub struct ApiConfig {
    pub api_token: String,
    pub allow_loopback: bool,
    pub max_event_bytes: usize,
    pub rotation_grace_ms: i64,
    /// How long finished deliveries are kept (shown by `GET /v1/retention`).
    pub retention: crate::retention::Retention,
    /// A request body must arrive within this long (408 otherwise).
    pub body_timeout: std::time::Duration,
    /// The HMAC key that signs portal tokens (`crate::portal::token`), kept in the ledger.
    pub portal_key: Vec<u8>,
    /// The portal's `frame-ancestors` source list (`'none'` unless configured).
    pub portal_frame_ancestors: String,
    /// The breakers' settings, for the views of their state.
    pub breaker: fanout_core::breaker::BreakerConfig,
    /// The ingest spans (`crate::trace`; off unless an OTLP endpoint is set).
    pub telemetry: crate::trace::Telemetry,
    /// `--max-total-in-flight`: the operator's charts draw it as the cap when it is lower.
    pub max_total_in_flight: usize,
    /// Where people reach the daemon (`--public-url`, or `config::default_public_url`), no
    /// trailing `/`: portal links start with it.
    pub public_url: String,
}

#[derive(Debug, Clone)]
pub struct AppState {
    pub(super) ledger: Store,
    pub(super) control: UnboundedSender<Control>,
    pub(super) cfg: Arc<ApiConfig>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Health,
    /// `POST /v1/filters/test`'s rate per caller and running slots.
    pub(super) filter_tests: Arc<super::test_limits::FilterTests>,
}

impl AppState {
    pub fn new(
        ledger: Store,
        control: UnboundedSender<Control>,
        cfg: ApiConfig,
        metrics: Arc<Metrics>,
        health: Health,
    ) -> Self {
        AppState {
            ledger,
            control,
            cfg: Arc::new(cfg),
            metrics,
            health,
            filter_tests: Default::default(),
        }
    }

    /// Tell the dispatcher what changed.
    pub(super) fn tell(&self, c: Control) {
        // The dispatcher is gone only during shutdown; its next start rescans the ledger.
        let _ = self.control.send(c);
    }
}
