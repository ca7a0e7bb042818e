//! The PostgreSQL ledger's handle: a pool of connections to one database that several daemons
//! share, this daemon's name in the leases it takes, and whether its writes fail. Opens (and
//! migrates), probes for room, and runs the background rounds (`every`). What the operations
//! do is in the files beside this one.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use super::error::PgError;
use super::growth::Growth;
use super::schema;
use crate::ledger::error::LedgerError;
use crate::ledger::write_state::WriteState;
use crate::pg::{parse_url, tls};

/// Run `work` every `period` (and whenever `wake` is notified) until `stop` fires or is
/// dropped; a failed round is logged with `what` and the next one comes on time.
pub(super) fn every<F, Fut>(
    period: std::time::Duration,
    wake: Option<Arc<tokio::sync::Notify>>,
    stop: tokio::sync::oneshot::Receiver<()>,
    what: &'static str,
    mut work: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), LedgerError>> + Send,
{
    tokio::spawn(async move {
        tokio::pin!(stop);
        loop {
            // A notification while `work` ran is kept by `Notify` for the next wait.
            let woken = async {
                match &wake {
                    Some(w) => w.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(period) => {}
                _ = woken => {}
            }
            if let Err(e) = work().await {
                tracing::warn!(error = %e, "could not {what}");
            }
        }
    });
}

/// Connections per daemon: the dispatcher's turn, ingest and the API's reads at once.
const POOL_SIZE: usize = 16;

/// A handle to a PostgreSQL ledger, as one daemon (`owner`) sees it. Cheap to clone.
#[derive(Clone)]
pub struct PgLedger {
    pub(super) pool: Pool,
    pub(super) config: Arc<tokio_postgres::Config>,
    /// The TLS every connection uses (the URL's `sslmode`, `tls.rs`).
    pub(super) tls: tls::Tls,
    pub(super) owner: Arc<str>,
    /// The breaker settings the shared limiter is asked with (the daemon's).
    pub(super) breaker: fanout_core::breaker::BreakerConfig,
    /// What this daemon inserted since the planner's statistics were last refreshed.
    pub(super) growth: Arc<Growth>,
    /// Whether this daemon's writes fail for want of room or by I/O errors (`/healthz`).
    pub(super) writes: Arc<WriteState>,
    /// The ingests waiting for the next grouped transaction (`group.rs`).
    pub(super) ingests: Arc<super::group::IngestQueue>,
}

impl std::fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLedger")
            .field("owner", &self.owner)
            .finish()
    }
}

/// The background rounds of a daemon serving a shared ledger ([`PgLedger::start_rounds`]):
/// each ends when this drops.
#[derive(Debug)]
pub struct Rounds {
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl PgLedger {
    /// Connect to `url` and bring its schema up to date (refusing a newer one). `owner` names
    /// this daemon in the leases it takes; it must differ between daemons sharing the database.
    pub async fn open(url: &str, owner: &str) -> Result<PgLedger, LedgerError> {
        let (config, mode) = parse_url(url).map_err(PgError::Url)?;
        let tls =
            tls::Tls::from_params(&mode).map_err(|e| PgError::Url(crate::pg::UrlError::Tls(e)))?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Last in, first out: the connection just returned is the next one lent, so the few
        // that the dispatcher's turns and the API keep busy stay warm (their prepared
        // statements, plans and caches), and the rest of the pool waits for a burst.
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .build()
            .map_err(|e| LedgerError::from(PgError::Config(e.to_string())))?;
        let ledger = PgLedger {
            pool,
            config: Arc::new(config),
            tls,
            owner: Arc::from(owner),
            breaker: fanout_core::breaker::BreakerConfig::default(),
            growth: Arc::default(),
            writes: Arc::default(),
            ingests: Arc::default(),
        };
        let mut client = ledger.pool.get().await?;
        schema::migrate(&mut client).await?;
        drop(client);
        ledger.set_clock().await?;
        Ok(ledger)
    }

    /// Start this daemon's background rounds: one clock with the server (`clock.rs`), its
    /// leases renewed, the kept counts folded, the planner's statistics refreshed, the churned
    /// tables vacuumed, and probes
    /// for room while the ledger cannot write. They run until the answer drops.
    pub(in crate::ledger) fn start_rounds(&self) -> Rounds {
        let mut stops = Vec::new();
        let mut stop = || {
            let (tx, rx) = tokio::sync::oneshot::channel();
            stops.push(tx);
            rx
        };
        self.keep_clock(stop());
        self.keep_leases(stop());
        self.keep_counts_folded(stop());
        self.keep_statistics(stop());
        self.keep_vacuumed(stop());
        self.keep_probing_room(stop());
        Rounds { _stops: stops }
    }

    /// The breaker settings the dispatcher's claims use (the default otherwise).
    pub(in crate::ledger) fn with_breaker(
        mut self,
        breaker: fanout_core::breaker::BreakerConfig,
    ) -> PgLedger {
        self.breaker = breaker;
        self
    }

    /// Whether the ledger can write, as this daemon's ingest and dispatcher turns last found
    /// it (atomics: `/healthz` reads it without asking the server).
    pub(in crate::ledger) fn write_state(&self) -> Arc<WriteState> {
        self.writes.clone()
    }

    /// Whether the ledger has room for a little more: 64 KiB that do not compress, inserted
    /// into `events` in a transaction that is rolled back (the table ingest grows first).
    /// Fails with [`Unavailable::Full`](crate::ledger::Unavailable::Full) while the server cannot extend it; when it succeeds
    /// the ledger counts as writable again.
    pub(super) async fn probe_room(&self) -> Result<(), LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let probed = tx
            .execute(
                "INSERT INTO events (id, type, body, received_ms) \
                 SELECT 'fanout-probe-' || md5(random()::text), 'fanout.probe', \
                        string_agg(md5(random()::text), ''), 0 \
                 FROM generate_series(1, 2048)",
                &[],
            )
            .await;
        drop(tx); // rolled back
        probed?;
        self.writes.recovered();
        Ok(())
    }

    /// While the ledger cannot write, probe it every second ([`PgLedger::probe_room`]) so that
    /// it is reported writable again without waiting for the next producer, until `stop`
    /// fires or is dropped.
    pub(super) fn keep_probing_room(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        every(
            std::time::Duration::from_secs(1),
            None,
            stop,
            "probe the ledger for room",
            move || {
                let me = me.clone();
                async move {
                    match me.writes.failing() {
                        // Still full: nothing to log every second (ingest said so already).
                        Some(_) => match me.probe_room().await {
                            Err(LedgerError::Unavailable(_)) => Ok(()),
                            other => other,
                        },
                        None => Ok(()),
                    }
                }
            },
        );
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, LedgerError> {
        Ok(self.pool.get().await?)
    }
}
