//! The PostgreSQL ledger: several daemons share one database. Same tables as the SQLite ledger,
//! plus the owner of each lease; the same operations, as async methods over a connection pool
//! (`deadpool-postgres` over `tokio-postgres`).
//!
//! How several daemons share the work without exceeding a subscriber's rate:
//! - A claim runs in one transaction: it locks the claimed subscribers' rows (`FOR UPDATE`, in id
//!   order), counts their in-flight deliveries from live leases, lets the shared core limiter
//!   (the stored bucket, pause and breaker of that row) reserve how many may go, picks and leases
//!   that many due deliveries to this daemon until an expiry in one statement (`FOR UPDATE SKIP
//!   LOCKED`), gives back what it did not find and stores the limiter back. Two daemons claiming
//!   for one subscriber take turns on its row, so their grants add up to what one limiter
//!   allows. A dispatcher turn (results, limiters, claim) is one transaction of six round
//!   trips, whatever its size: statements are prepared once per connection and sent
//!   several at a time where the next does not need the previous answer.
//! - Leases carry their owner (the daemon's id) and expiry. A lease that expired is claimable by
//!   anyone; a result is recorded only while its lease is still the one it was sent under (same
//!   owner, same expiry), so a daemon that comes back after its work was taken over records
//!   nothing for it.
//! - The live daemons split the subscribers (`model::Share`, from the `daemons` table each
//!   dispatcher writes every second): each claims for its own, so their turns do not queue on
//!   each other's subscriber locks. The locks above still decide; the split only spares the wait.
//! - Ingest notifies the other daemons (`NOTIFY fanout_due`) of the subscribers that got work,
//!   on commit; they `LISTEN` instead of polling hard.
//!
//! Invariants: what the SQLite ledger keeps (a delivery exists at most once per
//! `(subscriber_id, event_id)`; deliveries, attempts and events are deleted only by
//! `retention.rs`, finished deliveries past their window, never anything pending or in flight;
//! per-subscriber counts are kept by triggers, never counted from the deliveries), and: a delivery
//! is `in_flight` exactly when it has a lease owner and expiry (a CHECK); this module never
//! waits for a delivery row lock while holding a subscriber row lock it took after it (subscriber
//! rows first, in id order; delivery rows are skipped when locked), so claims never deadlock.

mod clock;
mod customers;
mod dispatch;
mod ops;
mod retention;
mod schema;
pub mod tls;

use std::str::FromStr;
use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

pub use dispatch::{grant_shared, merge_limiter, shared_wait, LEASE_MS, RENEW_EVERY_MS};
pub use ops::*;
pub use retention::{FOLD_EVERY, RETENTION_LOCK};
pub use schema::VERSION as SCHEMA_VERSION;

use super::{LedgerError, Unavailable, WriteState};

/// The channel on which ingest and replays announce new work: the payload is the subscriber
/// ids, one per line (empty: look at every subscriber).
pub const DUE_CHANNEL: &str = "fanout_due";
/// The channel on which a subscriber's change (created, edited, rotated, disabled, removed) is
/// announced: the payload is its id.
pub const CHANGED_CHANNEL: &str = "fanout_changed";
/// The channel on which a customer's change (created, edited, removed) is announced: every
/// daemon reads the customers' weights and caps again.
pub const CUSTOMERS_CHANNEL: &str = "fanout_customers";

/// What another daemon (or this one) announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announcement {
    /// These subscribers have new work due now.
    Due(Vec<String>),
    /// Every subscriber may have new work (too many to name).
    DueAll,
    /// This subscriber changed: read it again.
    Changed(String),
    /// A customer changed: read the customers again.
    Customers,
}

/// Errors of the PostgreSQL driver and pool (cheap to clone, like every `LedgerError`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PgError {
    #[error("{}", describe(.0))]
    Db(Arc<tokio_postgres::Error>),
    #[error("no connection to PostgreSQL: {}", with_causes(.0.as_ref()))]
    Pool(Arc<deadpool_postgres::PoolError>),
    #[error("{0}")]
    Config(String),
    #[error("TLS to PostgreSQL: {0}")]
    Tls(tls::TlsError),
}

impl PgError {
    /// PostgreSQL cannot be reached now (no pooled connection, or the connection itself
    /// failed rather than the server refusing a statement): the request may succeed later.
    pub fn is_unreachable(&self) -> bool {
        match self {
            PgError::Pool(_) => true,
            PgError::Db(e) => e.as_db_error().is_none() && e.is_closed(),
            PgError::Config(_) | PgError::Tls(_) => false,
        }
    }

    /// The server's SQLSTATE, when the server answered with an error.
    pub fn code(&self) -> Option<&tokio_postgres::error::SqlState> {
        match self {
            PgError::Db(e) => e.code(),
            _ => None,
        }
    }
}

/// Run `work` every `period` (and whenever `wake` is notified) until `stop` fires or is
/// dropped; a failed round is logged with `what` and the next one comes on time.
fn every<F, Fut>(
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

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
        None => format!("postgres: {}", with_causes(e)),
    }
}

/// `e` and each of its causes that its message does not already say: the driver's "error
/// performing TLS handshake" alone does not tell a wrong CA from a wrong host name.
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

impl From<tokio_postgres::Error> for LedgerError {
    /// A server that cannot write now is told by its SQLSTATE, as SQLite's by its result code:
    /// a full disk (`53100`, also what a table that cannot grow reports) or an I/O error
    /// (`58030`) is [`Unavailable`] (the API answers 503 `unavailable`, a dispatcher turn is
    /// retried whole), every other failure stays PostgreSQL's own.
    fn from(e: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        match e.code() {
            Some(c) if *c == SqlState::DISK_FULL => LedgerError::Unavailable(Unavailable::Full),
            Some(c) if *c == SqlState::IO_ERROR => LedgerError::Unavailable(Unavailable::Io),
            _ => LedgerError::Postgres(PgError::Db(Arc::new(e))),
        }
    }
}

impl From<deadpool_postgres::PoolError> for LedgerError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        LedgerError::Postgres(PgError::Pool(Arc::new(e)))
    }
}

/// Connections per daemon: the dispatcher's turn, ingest and the API's reads at once.
const POOL_SIZE: usize = 16;

/// A handle to a PostgreSQL ledger, as one daemon (`owner`) sees it. Cheap to clone.
#[derive(Clone)]
pub struct PgLedger {
    pool: Pool,
    config: Arc<tokio_postgres::Config>,
    /// The TLS every connection uses (the URL's `sslmode`, `tls.rs`).
    tls: tls::Tls,
    owner: Arc<str>,
    /// The breaker settings the shared limiter is asked with (the daemon's).
    breaker: fanout_core::breaker::BreakerConfig,
    /// What this daemon inserted since the planner's statistics were last refreshed.
    growth: Arc<dispatch::Growth>,
    /// Whether this daemon's writes fail for want of room or by I/O errors (`/healthz`).
    writes: Arc<WriteState>,
}

impl std::fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLedger")
            .field("owner", &self.owner)
            .finish()
    }
}

/// TCP keepalives on every connection unless the URL sets its own (`keepalives_idle`, …): the
/// first probe after 30 s without traffic, then every 10 s, the connection given up after 3
/// unanswered. Idle connections stay open through proxies and load balancers that drop idle
/// ones silently (after minutes, for most), and a server gone is noticed within a minute
/// instead of the system's default two hours.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;
/// A connection not made within this long fails (unless the URL sets `connect_timeout`): a
/// server behind a black hole costs a pool checkout or a new listener seconds, not the
/// system's two minutes.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `url` parsed, or why not (without repeating a password), with [`KEEPALIVE_IDLE`], the rest
/// and [`CONNECT_TIMEOUT`] where the URL leaves them to the defaults, and the TLS its
/// `sslmode` (and `sslrootcert`) ask for (`tls.rs`).
pub fn parse_url(url: &str) -> Result<(tokio_postgres::Config, tls::Mode), LedgerError> {
    let params = tls::TlsParams::split(url).map_err(|e| LedgerError::Postgres(PgError::Tls(e)))?;
    let mut config = tokio_postgres::Config::from_str(&params.url).map_err(|e| {
        LedgerError::Postgres(PgError::Config(format!(
            "not a PostgreSQL URL like postgres://user@host:5432/dbname: {e}"
        )))
    })?;
    // tokio-postgres' default idle time is two hours; the URL's own setting is kept.
    if config.get_keepalives_idle() == tokio_postgres::Config::new().get_keepalives_idle() {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    Ok((config, params.mode))
}

impl PgLedger {
    /// Connect to `url` and bring its schema up to date (refusing a newer one). `owner` names
    /// this daemon in the leases it takes; it must differ between daemons sharing the database.
    pub async fn open(url: &str, owner: &str) -> Result<PgLedger, LedgerError> {
        let (config, mode) = parse_url(url)?;
        let tls =
            tls::Tls::from_params(&mode).map_err(|e| LedgerError::Postgres(PgError::Tls(e)))?;
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
            .map_err(|e| LedgerError::Postgres(PgError::Config(e.to_string())))?;
        let ledger = PgLedger {
            pool,
            config: Arc::new(config),
            tls,
            owner: Arc::from(owner),
            breaker: fanout_core::breaker::BreakerConfig::default(),
            growth: Arc::default(),
            writes: Arc::default(),
        };
        let mut client = ledger.pool.get().await?;
        schema::migrate(&mut client).await?;
        drop(client);
        ledger.set_clock().await?;
        Ok(ledger)
    }

    /// The breaker settings the dispatcher's claims use (the default otherwise).
    pub fn with_breaker(mut self, breaker: fanout_core::breaker::BreakerConfig) -> PgLedger {
        self.breaker = breaker;
        self
    }

    /// This daemon's name in its leases.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether the ledger can write, as this daemon's ingest and dispatcher turns last found
    /// it (atomics: `/healthz` reads it without asking the server).
    pub fn write_state(&self) -> Arc<WriteState> {
        self.writes.clone()
    }

    /// Whether the ledger has room for a little more: 64 KiB that do not compress, inserted
    /// into `events` in a transaction that is rolled back (the table ingest grows first).
    /// Fails with [`Unavailable::Full`] while the server cannot extend it; when it succeeds
    /// the ledger counts as writable again.
    pub async fn probe_room(&self) -> Result<(), LedgerError> {
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
    pub fn keep_probing_room(&self, stop: tokio::sync::oneshot::Receiver<()>) {
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

    /// Listen for new work announced by any daemon (this one included). The listening
    /// connection is its own (not from the pool) and closes when the [`Listener`] drops.
    pub async fn listen(&self) -> Result<Listener, LedgerError> {
        let (client, mut conn) = self.config.connect(self.tls.clone()).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Polling the connection both drives the client's requests and yields notifications.
        let connection = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                        let heard = if n.channel() == CHANGED_CHANNEL {
                            Announcement::Changed(n.payload().to_string())
                        } else if n.channel() == CUSTOMERS_CHANNEL {
                            Announcement::Customers
                        } else if n.payload().is_empty() {
                            Announcement::DueAll
                        } else {
                            Announcement::Due(n.payload().lines().map(str::to_string).collect())
                        };
                        if tx.send(heard).is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %describe(&e), "the LISTEN connection failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        client
            .batch_execute(&format!(
                "LISTEN {DUE_CHANNEL}; LISTEN {CHANGED_CHANNEL}; LISTEN {CUSTOMERS_CHANNEL}"
            ))
            .await?;
        Ok(Listener {
            client,
            connection,
            rx,
        })
    }
}

/// Announcements of new work, from [`PgLedger::listen`]. Dropping it closes its connection.
#[derive(Debug)]
pub struct Listener {
    client: tokio_postgres::Client,
    connection: tokio::task::JoinHandle<()>,
    rx: tokio::sync::mpsc::UnboundedReceiver<Announcement>,
}

impl Listener {
    /// The next announcement; `None` once the connection has failed (listen again).
    pub async fn recv(&mut self) -> Option<Announcement> {
        self.rx.recv().await
    }

    /// Whether the server still answers on the listening connection within `timeout`. A
    /// connection that only listens sends nothing of its own: one dropped silently on the way
    /// (a proxy's or load balancer's idle timeout) would otherwise look alive, and hear nothing,
    /// for as long as the operating system takes to notice.
    pub async fn answers(&self, timeout: std::time::Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.client.simple_query("SELECT 1")).await,
            Ok(Ok(_))
        )
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Keepalives and the connect timeout: ours where the URL leaves the defaults, the URL's
    /// own where it sets them.
    #[test]
    fn urls_get_keepalives_and_a_connect_timeout_unless_they_set_their_own() {
        let s = Duration::from_secs;
        // (URL's query, keepalives on, idle, interval, retries, connect timeout)
        type Case = (&'static str, bool, Duration, Duration, u32, Duration);
        let cases: &[Case] = &[
            ("", true, s(30), s(10), 3, s(10)),
            ("?keepalives_idle=600", true, s(600), s(10), 3, s(10)),
            (
                "?keepalives_interval=2&keepalives_retries=9",
                true,
                s(30),
                s(2),
                9,
                s(10),
            ),
            ("?keepalives=0", false, s(30), s(10), 3, s(10)),
            ("?connect_timeout=3", true, s(30), s(10), 3, s(3)),
        ];
        for &(query, on, idle, interval, retries, connect) in cases {
            let (c, _) = parse_url(&format!("postgres://u@db:5432/fanout{query}")).unwrap();
            assert_eq!(
                (
                    c.get_keepalives(),
                    c.get_keepalives_idle(),
                    c.get_keepalives_interval(),
                    c.get_keepalives_retries(),
                    c.get_connect_timeout().copied()
                ),
                (on, idle, Some(interval), Some(retries), Some(connect)),
                "{query}"
            );
        }
    }
}
