//! Fanout's origin daemon: the ledger that never loses an event (embedded SQLite, or
//! PostgreSQL shared by several daemons), the fair dispatcher
//! with its edge and origin lanes, and the HTTP API. [`run`] starts all of it on a listener the
//! caller binds (tests bind port 0) and stops when `shutdown` resolves.
//!
//! Layout: [`model`] (domain types, pure), [`ledger`] (its contract; SQLite and PostgreSQL as
//! siblings in `ledger::sqlite` and `ledger::postgres`), [`dispatch`] (scheduling:
//! `plan` is pure, the lanes do the I/O), [`api`] (axum), [`config`], [`cli`].

pub mod alert;
pub mod api;
pub mod charts;
pub mod cli;
pub mod config;
pub mod console;
pub mod customer;
pub mod dispatch;
pub mod duration;
pub mod event_filter;
pub mod event_input;
pub mod health;
pub mod ingest;
pub mod keyring;
pub mod ledger;
pub mod load;
pub mod metrics;
pub mod model;
pub mod ordering;
pub mod outbound;
pub mod outbox;
pub mod pages;
pub mod payload;
pub mod pg;
pub mod portal;
pub mod redact;
pub mod retention;
pub mod series;
pub mod server;
pub mod term;
pub mod time;
pub mod trace;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, LedgerLocation};
use crate::dispatch::edge_lane::EdgeClient;
use crate::dispatch::plan::RetryRules;
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::ledger::store::{Location, OpenOptions, Store};
use crate::ledger::{Announcement, Customers, DispatchLedger, LedgerError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    #[error("OpenTelemetry: {0}")]
    Telemetry(#[from] trace::TelemetryError),
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
    let at = match &cfg.db {
        LedgerLocation::Sqlite(path) => Location::Sqlite(path),
        LedgerLocation::Postgres(url) => Location::Postgres(url),
    };
    let (store, held) = Store::open(
        at,
        OpenOptions {
            max_bytes: cfg.max_db_bytes,
            breaker: cfg.breaker,
            daemon: daemon_name(listener.local_addr()?),
        },
    )
    .await?;
    // One portal key in the ledger, made on its first start (on a shared ledger, by the first
    // daemon): a link issued by one daemon works on every other, and after a restart.
    let portal_key = store
        .portal_key(portal_key_bytes()?.to_vec(), time::now_ms())
        .await?;
    let telemetry = trace::Telemetry::from_env()?;
    let failed = serve(
        cfg,
        listener,
        shutdown,
        store.clone(),
        portal_key,
        held.lock(),
        telemetry.clone(),
    )
    .await?;
    // The spans still queued leave before the daemon does.
    telemetry.shutdown().await;
    // Wait for the ledger to finish everything queued before this point.
    store.close().await?;
    // On SQLite the owner lock is a descriptor of the database file: closing it also drops the
    // POSIX locks SQLite's connections in this process hold on that file (the ledger's threads
    // close theirs when its last handle goes, which tasks may outlive). It is released only
    // now, once everything queued is committed: the binary exits next, and an in-process
    // restart (the tests) needs it back.
    drop(held);
    stopped(failed)
}

/// Fresh randomness for a portal key.
fn portal_key_bytes() -> Result<[u8; 32], RunError> {
    time::random_bytes::<32>().map_err(|e| {
        RunError::Io(std::io::Error::other(format!(
            "no randomness for the portal key: {e}"
        )))
    })
}

/// `run`'s answer once `serve` returned: an error when the dispatcher stopped on its own.
fn stopped(failed: Option<String>) -> Result<(), RunError> {
    match failed {
        Some(why) => Err(RunError::Dispatcher(why)),
        None => Ok(()),
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

/// What another daemon announced, as a message to the dispatcher.
fn heard(announced: Announcement) -> dispatch::Control {
    match announced {
        Announcement::Due(subs) => dispatch::Control::Due(subs),
        Announcement::DueAll => dispatch::Control::Rescan,
        Announcement::Changed(id) => dispatch::Control::Changed(id),
        Announcement::Customers => dispatch::Control::Customers,
        Announcement::Reload => dispatch::Control::Reload,
    }
}

/// The dispatcher's settings from the configuration, with its HTTP client and alerter.
fn dispatch_config(
    cfg: &Config,
    heartbeat: health::Heartbeat,
    telemetry: trace::Telemetry,
) -> Result<DispatchConfig, RunError> {
    let outbound = outbound::Outbound::new(cfg.allow_loopback)?;
    let edge = cfg
        .edge
        .as_ref()
        .map(|(url, key)| EdgeClient::new(url, key.clone(), outbound.clone()));
    Ok(DispatchConfig {
        rules: RetryRules {
            max_attempts: cfg.max_attempts,
            backoff_scale: cfg.backoff_scale,
        },
        allow_loopback: cfg.allow_loopback,
        event_url: cfg.event_url.clone(),
        edge,
        breaker: cfg.breaker,
        edge_batch: cfg.edge_batch,
        max_total_in_flight: cfg.max_total_in_flight,
        alert_rules: cfg.alert_rules,
        alerter: alert::Alerter::start(cfg.alert.clone(), outbound.clone()),
        outbound,
        heartbeat,
        telemetry,
    })
}

/// The API's settings from the configuration.
fn api_config(
    cfg: &Config,
    portal_key: Vec<u8>,
    telemetry: trace::Telemetry,
    local: std::net::SocketAddr,
) -> api::ApiConfig {
    api::ApiConfig {
        api_token: cfg.api_token.clone(),
        allow_loopback: cfg.allow_loopback,
        max_event_bytes: cfg.max_event_bytes,
        rotation_grace_ms: (cfg.rotation_grace_secs.min(i64::MAX as u64 / 1000) * 1000) as i64,
        retention: cfg.retention,
        body_timeout: cfg.body_timeout,
        portal_key,
        portal_frame_ancestors: cfg.portal_frame_ancestors.clone(),
        breaker: cfg.breaker,
        telemetry,
        max_total_in_flight: cfg.max_total_in_flight,
        public_url: cfg
            .public_url
            .clone()
            .unwrap_or_else(|| crate::config::default_public_url(local)),
    }
}

/// The outbox task, when `--outbox` is set (a failure of its own is logged and reported).
fn start_outbox(
    cfg: &Config,
    daemon: outbox::Daemon,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let outbox = cfg.outbox.clone()?;
    daemon
        .metrics
        .outbox
        .configured(outbox.at.redacted(), outbox.table.clone());
    let metrics = daemon.metrics.clone();
    Some(tokio::spawn(async move {
        // `run` ends only when told to; if it panics, the outbox says so until the daemon stops.
        if let Err(e) = tokio::spawn(outbox::run(outbox, daemon, stop)).await {
            tracing::error!(error = %e, "the outbox task failed");
            metrics
                .outbox
                .cannot_read(&format!("the outbox task failed: {e}"), time::now_ms());
        }
    }))
}

/// The line a daemon logs once it serves: where it listens and what it reads and exports.
fn log_serving(
    cfg: &Config,
    listener: &TcpListener,
    lock: Option<&str>,
    telemetry: &trace::Telemetry,
) -> Result<(), RunError> {
    tracing::info!(
        listen = %listener.local_addr()?,
        db = %cfg.db.redacted(),
        lock = lock.unwrap_or("(none: a shared PostgreSQL ledger)"),
        outbox = cfg.outbox.as_ref().map(|o| format!("{} ({})", o.at.redacted(), o.table)).unwrap_or_else(|| "(none)".into()),
        edge = cfg.edge.as_ref().map(|(u, _)| redact::url(u)).unwrap_or_else(|| "(none: origin lane only)".into()),
        otlp = if telemetry.is_on() { "exporting spans" } else { "(off)" },
        "fanout serving"
    );
    Ok(())
}

async fn serve(
    cfg: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    store: Store,
    portal_key: Vec<u8>,
    lock: Option<String>,
    telemetry: trace::Telemetry,
) -> Result<Option<String>, RunError> {
    let now = time::now_ms();
    let released = store.release_all_leases(now).await?;
    if released > 0 {
        tracing::warn!(
            released,
            "deliveries leased by a previous run returned to the queue"
        );
    }
    let metrics = Arc::new(metrics::Metrics::new(cfg.edge.is_some()));
    // The dispatcher's liveness (unix ms of its loop's last turn), for `/healthz`.
    let heartbeat = health::Heartbeat::default();
    let health = health::Health::new(store.write_state(), heartbeat.clone());
    let dispatcher = Dispatcher::new(
        store.clone(),
        dispatch_config(&cfg, heartbeat, telemetry.clone())?,
        metrics.clone(),
    );
    let (control_tx, control_rx) = tokio::sync::mpsc::unbounded_channel();
    // Listening (on a shared ledger) before the dispatcher reads the subscribers: nothing
    // announced in between goes unheard.
    store.announce_to(control_tx.clone(), heard).await;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let retention_task = tokio::spawn(retention::run(
        store.clone(),
        cfg.retention,
        metrics.clone(),
        stop_rx.clone(),
    ));
    let series_task = charts::Running::start(store.clone(), metrics.clone(), cfg.breaker);
    let outbox_task = start_outbox(
        &cfg,
        outbox::Daemon {
            store: store.clone(),
            control: control_tx.clone(),
            metrics: metrics.clone(),
            max_event_bytes: cfg.max_event_bytes,
            telemetry: telemetry.clone(),
        },
        stop_rx.clone(),
    );
    let mut dispatcher_task = tokio::spawn(dispatcher.run(control_rx, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));
    let state = api::AppState::new(
        store,
        control_tx,
        api_config(&cfg, portal_key, telemetry.clone(), listener.local_addr()?),
        metrics,
        health.clone(),
    );
    log_serving(&cfg, &listener, lock.as_deref(), &telemetry)?;
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
    series_task.stop().await;
    if let Some(task) = outbox_task {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "the outbox task failed");
        }
    }
    Ok(failed)
}
