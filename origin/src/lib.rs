//! Fanout's origin daemon: the ledger that never loses an event (embedded SQLite, or
//! PostgreSQL shared by several daemons), the fair dispatcher
//! with its edge and origin lanes, and the HTTP API. [`run`] starts all of it on a listener the
//! caller binds (tests bind port 0) and stops when `shutdown` resolves.
//!
//! Layout: [`model`] (domain types, pure), [`ledger`] (SQLite; PostgreSQL in `ledger::postgres`), [`dispatch`] (scheduling:
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

use crate::config::{Config, LedgerLocation};
use crate::dispatch::edge_lane::EdgeClient;
use crate::dispatch::plan::RetryRules;
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::ledger::postgres::{Announcement, Listener, PgLedger};
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
    match cfg.db.clone() {
        LedgerLocation::Sqlite(path) => {
            let owner = ledger::owner::OwnerLock::acquire(
                &path,
                time::now_ms(),
                ledger::owner::Taker::Serve,
            )?;
            let ledger = Ledger::open_with(
                &path,
                ledger::LedgerOptions {
                    max_bytes: cfg.max_db_bytes,
                },
            )?;
            let fresh_key = portal_key_bytes()?;
            let now = time::now_ms();
            let portal_key = ledger
                .tx(move |c| ledger::portal_key(c, &fresh_key, now))
                .await?;
            let store = Store::Sqlite(ledger.clone());
            let lock = owner.path().display().to_string();
            let served = Served {
                portal_key,
                writes: ledger.write_state(),
                lock: Some(lock),
            };
            let failed =
                serve(cfg, listener, shutdown, ledger.clone(), store, None, served).await?;
            // Wait for the ledger to finish everything queued before this point.
            ledger.call(|_| Ok(())).await?;
            // The lock is a descriptor of the database file: closing it also drops the POSIX
            // locks SQLite's connections in this process hold on that file (the ledger's
            // threads close theirs when its last handle goes, which tasks may outlive). It is
            // released only now, once everything queued is committed: the binary exits next,
            // and an in-process restart (the tests) needs it back.
            drop(owner);
            stopped(failed)
        }
        LedgerLocation::Postgres(url) => {
            let name = daemon_name(listener.local_addr()?);
            let pg = PgLedger::open(&url, &name).await?.with_breaker(cfg.breaker);
            tracing::info!(daemon = %name, "sharing a PostgreSQL ledger");
            let store = Store::Postgres(pg.clone());
            let (_clocking, stop_clocking) = tokio::sync::oneshot::channel();
            pg.keep_clock(stop_clocking);
            let (_renewing, stop_renewing) = tokio::sync::oneshot::channel();
            pg.keep_leases(stop_renewing);
            let (_folding, stop_folding) = tokio::sync::oneshot::channel();
            pg.keep_counts_folded(stop_folding);
            let (_analyzing, stop_analyzing) = tokio::sync::oneshot::channel();
            pg.keep_statistics(stop_analyzing);
            let (_probing, stop_probing) = tokio::sync::oneshot::channel();
            pg.keep_probing_room(stop_probing);
            // One portal key in the ledger, made by the first daemon: a link issued by one
            // daemon works on every other, and after a restart.
            let portal_key = pg.portal_key(&portal_key_bytes()?, time::now_ms()).await?;
            let served = Served {
                portal_key,
                writes: pg.write_state(),
                lock: None,
            };
            let failed =
                serve(cfg, listener, shutdown, pg.clone(), store, Some(pg), served).await?;
            stopped(failed)
        }
    }
}

/// Fresh randomness for a portal key.
fn portal_key_bytes() -> Result<[u8; 32], RunError> {
    time::random_bytes::<32>().map_err(|e| {
        RunError::Io(std::io::Error::other(format!(
            "no randomness for the portal key: {e}"
        )))
    })
}

/// What the ledger's kind gives `serve`: the portal key, whether the ledger can write, the
/// owner lock's path (SQLite).
struct Served {
    portal_key: Vec<u8>,
    writes: Arc<ledger::WriteState>,
    lock: Option<String>,
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

/// A listening connection quiet this long is asked whether it still answers, and given up
/// when it does not within [`LISTEN_PING_TIMEOUT`].
const LISTEN_PING_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const LISTEN_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Hand the dispatcher what other daemons announce (new events, replays, changed subscribers
/// and customers), listening again after a lost connection, or one that stopped answering
/// (dropped silently on the way: it would otherwise look alive and hear nothing). `heard` is
/// the first listener, opened before the dispatcher read the subscribers; whenever listening
/// begins later the dispatcher reads everything again, since whatever was announced meanwhile
/// went unheard.
fn forward_announcements(
    pg: PgLedger,
    mut heard: Option<Listener>,
    control: tokio::sync::mpsc::UnboundedSender<dispatch::Control>,
) {
    tokio::spawn(async move {
        loop {
            if let Some(mut listener) = heard.take() {
                loop {
                    let announced = tokio::select! {
                        a = listener.recv() => a,
                        () = tokio::time::sleep(LISTEN_PING_EVERY) => {
                            if listener.answers(LISTEN_PING_TIMEOUT).await {
                                continue;
                            }
                            tracing::warn!("the PostgreSQL LISTEN connection stopped answering: listening again");
                            break;
                        }
                    };
                    let Some(announced) = announced else {
                        tracing::warn!("lost the PostgreSQL LISTEN connection: listening again");
                        break;
                    };
                    let msg = match announced {
                        Announcement::Due(subs) => dispatch::Control::Due(subs),
                        Announcement::DueAll => dispatch::Control::Rescan,
                        Announcement::Changed(id) => dispatch::Control::Changed(id),
                        Announcement::Customers => dispatch::Control::Customers,
                    };
                    if control.send(msg).is_err() {
                        return;
                    }
                }
            }
            if control.is_closed() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            match pg.listen().await {
                Ok(listener) => {
                    if control.send(dispatch::Control::Reload).is_err() {
                        return;
                    }
                    heard = Some(listener);
                }
                Err(e) => tracing::warn!(error = %e, "cannot LISTEN for new work"),
            }
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
    served: Served,
) -> Result<Option<String>, RunError> {
    let now = time::now_ms();
    let released = ledger.release_all_leases(now).await?;
    if released > 0 {
        tracing::warn!(
            released,
            "deliveries leased by a previous run returned to the queue"
        );
    }
    let portal_key = served.portal_key;
    let metrics = Arc::new(metrics::Metrics::new(cfg.edge.is_some()));
    let outbound = outbound::Outbound::new(cfg.allow_loopback)?;
    let edge = cfg
        .edge
        .as_ref()
        .map(|(url, key)| EdgeClient::new(url, key.clone(), outbound.clone()));
    // The dispatcher's liveness (unix ms of its loop's last turn), for `/healthz`.
    let heartbeat = dispatch::Heartbeat::default();
    let health = health::Health::new(served.writes, heartbeat.clone());
    let dispatcher = Dispatcher::new(
        ledger.clone(),
        DispatchConfig {
            rules: RetryRules {
                max_attempts: cfg.max_attempts,
                backoff_scale: cfg.backoff_scale,
            },
            allow_loopback: cfg.allow_loopback,
            edge,
            breaker: cfg.breaker,
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
        // Listening before the dispatcher reads the subscribers: nothing announced in between
        // goes unheard.
        let heard = pg
            .listen()
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "cannot LISTEN for new work"))
            .ok();
        forward_announcements(pg, heard, control_tx.clone());
    }
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let retention_task = tokio::spawn(retention::run(
        store.clone(),
        cfg.retention,
        metrics.clone(),
        stop_rx.clone(),
    ));
    let mut dispatcher_task = tokio::spawn(dispatcher.run(control_rx, async move {
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
            retention: cfg.retention,
            body_timeout: cfg.body_timeout,
            portal_key,
            portal_frame_ancestors: cfg.portal_frame_ancestors.clone(),
            breaker: cfg.breaker,
        },
        metrics,
        health.clone(),
    );
    tracing::info!(
        listen = %listener.local_addr()?,
        db = %cfg.db.redacted(),
        lock = served.lock.as_deref().unwrap_or("(none: a shared PostgreSQL ledger)"),
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
    Ok(failed)
}
