//! Fanout's origin daemon: the ledger that never loses an event (embedded SQLite, or
//! PostgreSQL shared by several daemons), the fair dispatcher
//! with its edge and origin lanes, and the HTTP API. [`run`] starts all of it on a listener the
//! caller binds (tests bind port 0) and stops when `shutdown` resolves.
//!
//! Layout: [`model`] (domain types, pure), [`ledger`] (SQLite; PostgreSQL in `ledger::pg`), [`dispatch`] (scheduling:
//! `plan` is pure, the lanes do the I/O), [`api`] (axum), [`config`], [`cli`].

pub mod alert;
pub mod api;
pub mod cli;
pub mod config;
pub mod console;
pub mod dispatch;
pub mod ledger;
pub mod load;
pub mod metrics;
pub mod model;
pub mod outbound;
pub mod term;
pub mod time;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, LedgerLocation};
use crate::dispatch::edge_lane::EdgeClient;
use crate::dispatch::plan::RetryRules;
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::ledger::pg::{Announcement, PgLedger};
use crate::ledger::store::Store;
use crate::ledger::{DispatchLedger, Ledger, LedgerError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Start the ledger, the dispatcher and the API on `listener`; return after `shutdown`
/// resolves and in-flight work has been recorded (or left leased for the next start).
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    match cfg.db.clone() {
        LedgerLocation::Sqlite(path) => {
            let ledger = Ledger::open(&path)?;
            let store = Store::Sqlite(ledger.clone());
            serve(cfg, listener, shutdown, ledger.clone(), store, None).await?;
            // Wait for the ledger to finish everything queued before this point.
            ledger.call(|_| Ok(())).await?;
            Ok(())
        }
        LedgerLocation::Postgres(url) => {
            let name = daemon_name(listener.local_addr()?);
            let pg = PgLedger::open(&url, &name).await?;
            tracing::info!(daemon = %name, "sharing a PostgreSQL ledger");
            let store = Store::Postgres(pg.clone());
            let (_renewing, stop_renewing) = tokio::sync::oneshot::channel();
            pg.keep_leases(stop_renewing);
            serve(cfg, listener, shutdown, pg.clone(), store, Some(pg)).await
        }
    }
}

/// This daemon's name in the leases it takes on a shared ledger: host and port, so a daemon
/// restarted in the same place recognises (and releases) the leases of its previous run.
fn daemon_name(listen: std::net::SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", listen.port())
}

/// Hand the dispatcher what other daemons announce (new events, replays), listening again
/// after a lost connection; the dispatcher's periodic rescan covers any gap.
fn forward_announcements(
    pg: PgLedger,
    control: tokio::sync::mpsc::UnboundedSender<dispatch::Control>,
) {
    tokio::spawn(async move {
        loop {
            match pg.listen().await {
                Ok(mut heard) => {
                    while let Some(announced) = heard.recv().await {
                        let msg = match announced {
                            Announcement::Due(subs) => dispatch::Control::Due(subs),
                            Announcement::DueAll => dispatch::Control::Rescan,
                            Announcement::Changed(id) => dispatch::Control::Changed(id),
                        };
                        if control.send(msg).is_err() {
                            return;
                        }
                    }
                    tracing::warn!("lost the PostgreSQL LISTEN connection: listening again");
                }
                Err(e) => tracing::warn!(error = %e, "cannot LISTEN for new work"),
            }
            if control.is_closed() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
}

async fn serve<L: DispatchLedger>(
    cfg: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ledger: L,
    store: Store,
    announcements: Option<PgLedger>,
) -> Result<(), RunError> {
    let now = time::now_ms();
    let released = ledger.release_all_leases(now).await?;
    if released > 0 {
        tracing::warn!(
            released,
            "deliveries leased by a previous run returned to the queue"
        );
    }
    let metrics = Arc::new(metrics::Metrics::new(cfg.edge.is_some()));
    let outbound = outbound::Outbound::new(cfg.allow_loopback)?;
    let edge = cfg
        .edge
        .as_ref()
        .map(|(url, key)| EdgeClient::new(url, key.clone(), outbound.clone()));
    // The dispatcher's liveness (unix ms of its loop's last turn), for `/healthz`.
    let heartbeat = dispatch::Heartbeat::default();
    let dispatcher = Dispatcher::new(
        ledger.clone(),
        DispatchConfig {
            rules: RetryRules {
                max_attempts: cfg.max_attempts,
                backoff_scale: cfg.backoff_scale,
            },
            allow_loopback: cfg.allow_loopback,
            edge,
            breaker: fanout_core::breaker::BreakerConfig::default(),
            edge_batch: cfg.edge_batch,
            max_total_in_flight: cfg.max_total_in_flight,
            alert_rules: cfg.alert_rules,
            alerter: alert::Alerter::start(cfg.alert.clone(), outbound.clone()),
            outbound,
            heartbeat: heartbeat.clone(),
        },
        metrics.clone(),
    );
    let (control_tx, control_rx) = tokio::sync::mpsc::unbounded_channel();
    if let Some(pg) = announcements {
        forward_announcements(pg, control_tx.clone());
    }
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let dispatcher_task = tokio::spawn(dispatcher.run(control_rx, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));
    let state = api::AppState::new(
        store,
        control_tx,
        api::ApiConfig {
            api_token: cfg.api_token.clone(),
            allow_loopback: cfg.allow_loopback,
            max_event_bytes: cfg.max_event_bytes,
            rotation_grace_ms: (cfg.rotation_grace_secs.min(i64::MAX as u64 / 1000) * 1000) as i64,
        },
        metrics,
    );
    tracing::info!(
        listen = %listener.local_addr()?,
        db = %cfg.db.redacted(),
        edge = cfg.edge.as_ref().map(|(u, _)| u.as_str()).unwrap_or("(none: origin lane only)"),
        "fanout serving"
    );
    let served = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
        .await;
    if let Err(e) = dispatcher_task.await {
        tracing::error!(error = %e, "the dispatcher task failed");
    }
    served?;
    Ok(())
}
