//! PostgreSQL's announcements between the daemons sharing a ledger: ingest, replays and changes
//! `NOTIFY` on commit; every daemon `LISTEN`s on a connection of its own and hands what it
//! hears to its dispatcher, listening again after a lost connection or one that stopped
//! answering. What the dispatcher does with it is not decided here: the caller maps each
//! [`Announcement`] to its own message.

use super::error::describe;
use super::ledger::PgLedger;
use crate::ledger::dispatch::Announcement;
use crate::ledger::error::LedgerError;

/// The channel on which ingest and replays announce new work: the payload is the subscriber
/// ids, one per line (empty: look at every subscriber).
pub const DUE_CHANNEL: &str = "fanout_due";
/// The channel on which a subscriber's change (created, edited, rotated, disabled, removed) is
/// announced: the payload is its id.
pub const CHANGED_CHANNEL: &str = "fanout_changed";
/// The channel on which a customer's change (created, edited, removed) is announced: every
/// daemon reads the customers' weights and caps again.
pub const CUSTOMERS_CHANNEL: &str = "fanout_customers";

/// A NOTIFY payload must stay under 8000 bytes: the subscriber ids one per line, or nothing
/// at all (meaning "look at every subscriber") when they do not fit.
pub fn notify_payload(subs: &[String]) -> String {
    let joined = subs.join("\n");
    if joined.len() < 7_000 {
        joined
    } else {
        String::new()
    }
}

impl PgLedger {
    /// Listen for new work announced by any daemon (this one included). The listening
    /// connection is its own (not from the pool) and closes when the [`Listener`] drops.
    pub(super) async fn listen(&self) -> Result<Listener, LedgerError> {
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
pub(super) struct Listener {
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

/// A listening connection quiet this long is asked whether it still answers, and given up
/// when it does not within [`LISTEN_PING_TIMEOUT`].
const LISTEN_PING_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const LISTEN_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Hand `to` what other daemons announce (new events, replays, changed subscribers and
/// customers), each mapped by `map`, listening again after a lost connection, or one that
/// stopped answering (dropped silently on the way: it would otherwise look alive and hear
/// nothing). The first listener is opened before this returns, so a caller that reads the
/// subscribers after it misses nothing; whenever listening begins later, [`Announcement::Reload`]
/// is sent, since whatever was announced meanwhile went unheard. Ends once `to` is closed.
pub async fn forward<T: Send + 'static>(
    pg: PgLedger,
    to: tokio::sync::mpsc::UnboundedSender<T>,
    map: fn(Announcement) -> T,
) {
    let heard = pg
        .listen()
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "cannot LISTEN for new work"))
        .ok();
    tokio::spawn(relay(pg, heard, to, map));
}

async fn relay<T>(
    pg: PgLedger,
    mut heard: Option<Listener>,
    to: tokio::sync::mpsc::UnboundedSender<T>,
    map: fn(Announcement) -> T,
) {
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
                if to.send(map(announced)).is_err() {
                    return;
                }
            }
        }
        if to.is_closed() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        match pg.listen().await {
            Ok(listener) => {
                if to.send(map(Announcement::Reload)).is_err() {
                    return;
                }
                heard = Some(listener);
            }
            Err(e) => tracing::warn!(error = %e, "cannot LISTEN for new work"),
        }
    }
}
