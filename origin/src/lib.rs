//! Fanout's origin daemon: the SQLite ledger that never loses an event, the fair dispatcher
//! with its edge and origin lanes, and the HTTP API. [`run`] starts all of it on a listener the
//! caller binds (tests bind port 0) and stops when `shutdown` resolves.
//!
//! Layout: [`model`] (domain types, pure), [`ledger`] (SQLite), [`dispatch`] (scheduling:
//! `plan` is pure, the lanes do the I/O), [`api`] (axum), [`config`], [`cli`].

pub mod alert;
pub mod api;
pub mod cli;
pub mod config;
pub mod console;
pub mod customer;
pub mod dispatch;
pub mod health;
pub mod ledger;
pub mod load;
pub mod metrics;
pub mod model;
pub mod outbound;
pub mod portal;
pub mod redact;
pub mod retention;
pub mod server;
pub mod term;
pub mod time;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::dispatch::edge_lane::EdgeClient;
use crate::dispatch::plan::RetryRules;
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::ledger::{DispatchLedger, Ledger, LedgerError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    /// The dispatcher ended while the daemon was serving: the daemon stops rather than accept
    /// events it would never send.
    #[error("the dispatcher stopped: {0}")]
    Dispatcher(String),
}

/// Start the ledger, the dispatcher and the API on `listener`; return after `shutdown`
/// resolves and in-flight work has been recorded (or left leased for the next start).
///
/// The dispatcher is supervised: if it fails to start, returns or panics while the daemon
/// serves, the error is logged, `/healthz` turns 503, the server stops and `run` returns
/// [`RunError::Dispatcher`] (the binary exits non-zero, for its service manager to restart).
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let owner = ledger::owner::OwnerLock::acquire(&cfg.db, time::now_ms())?;
    let ledger = Ledger::open_with(
        &cfg.db,
        ledger::LedgerOptions {
            max_bytes: cfg.max_db_bytes,
        },
    )?;
    let now = time::now_ms();
    let released = ledger.release_all_leases(now).await?;
    if released > 0 {
        tracing::warn!(
            released,
            "deliveries leased by a previous run returned to the queue"
        );
    }
    let fresh_key = time::random_bytes::<32>().map_err(|e| {
        RunError::Io(std::io::Error::other(format!(
            "no randomness for the portal key: {e}"
        )))
    })?;
    let portal_key = ledger
        .tx(move |c| ledger::portal_key(c, &fresh_key, now))
        .await?;
    let metrics = Arc::new(metrics::Metrics::new(cfg.edge.is_some()));
    let outbound = outbound::Outbound::new(cfg.allow_loopback)?;
    let edge = cfg
        .edge
        .as_ref()
        .map(|(url, key)| EdgeClient::new(url, key.clone(), outbound.clone()));
    // The dispatcher's liveness (unix ms of its loop's last turn), for `/healthz`.
    let heartbeat = dispatch::Heartbeat::default();
    let health = health::Health::new(ledger.write_state(), heartbeat.clone());
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
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let retention_task = tokio::spawn(retention::run(
        ledger.clone(),
        cfg.retention,
        metrics.clone(),
        stop_rx.clone(),
    ));
    let mut dispatcher_task = tokio::spawn(dispatcher.run(control_rx, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));
    let state = api::AppState::new(
        ledger.clone(),
        control_tx,
        api::ApiConfig {
            api_token: cfg.api_token.clone(),
            allow_loopback: cfg.allow_loopback,
            max_event_bytes: cfg.max_event_bytes,
            rotation_grace_ms: (cfg.rotation_grace_secs.min(i64::MAX as u64 / 1000) * 1000) as i64,
            retention: cfg.retention,
            body_timeout: cfg.body_timeout,
            portal_key,
            portal_frame_ancestors: cfg.portal_frame_ancestors.clone(),
        },
        metrics,
        health.clone(),
    );
    tracing::info!(
        listen = %listener.local_addr()?,
        db = %cfg.db.display(),
        lock = %owner.path().display(),
        edge = cfg.edge.as_ref().map(|(u, _)| redact::url(u)).unwrap_or_else(|| "(none: origin lane only)".into()),
        "fanout serving"
    );
    // The server stops on `shutdown` or when the dispatcher ends, whichever comes first.
    let (dispatcher_gone_tx, dispatcher_gone_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(server::serve(
        listener,
        api::router(state),
        cfg.server_limits,
        async move {
            tokio::select! {
                () = shutdown => {}
                _ = dispatcher_gone_rx => {}
            }
        },
    ));
    let failed = tokio::select! {
        ended = &mut dispatcher_task => {
            // The dispatcher ended on its own while the daemon serves.
            health.dispatcher_ended();
            let why = match ended {
                Ok(Ok(())) => "its loop ended".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(e) if e.is_panic() => "it panicked".to_string(),
                Err(e) => e.to_string(),
            };
            tracing::error!(error = %why, "the dispatcher stopped; the daemon stops too rather than accept events it would not send");
            let _ = dispatcher_gone_tx.send(());
            Some(why)
        }
        served = &mut server => {
            if let Err(e) = served {
                tracing::error!(error = %e, "the HTTP server task failed");
            }
            None
        }
    };
    let _ = stop_tx.send(true);
    if failed.is_some() {
        let _ = server.await;
    } else {
        match dispatcher_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the dispatcher failed while stopping"),
            Err(e) => tracing::error!(error = %e, "the dispatcher task failed"),
        }
    }
    if let Err(e) = retention_task.await {
        tracing::error!(error = %e, "the retention task failed");
    }
    // Wait for the ledger to finish everything queued before this point.
    ledger.call(|_| Ok(())).await?;
    drop(owner);
    match failed {
        Some(why) => Err(RunError::Dispatcher(why)),
        None => Ok(()),
    }
}
