//! A producer's outbox in PostgreSQL: its DDL (the table, `<table>_rejected`, and the trigger
//! that `NOTIFY`s channel `<table>` on every insert), and the reads and writes of one round.
//!
//! A round is one transaction of the producer's database on this daemon's own connection:
//! `BEGIN`, the oldest rows `FOR UPDATE SKIP LOCKED` (rows another daemon holds are skipped,
//! rows not yet committed are not seen, whatever their id), then — only after the ledger has
//! committed their events — the rejections inserted, the rows deleted, `COMMIT`. If the ledger
//! fails, `ROLLBACK`: the rows stay. A crash in between loses the connection, the server rolls
//! back, and the next round reads the rows again (ingest is idempotent by event id).
//! Connections use the ledger's URL grammar and TLS (`ledger::postgres::{parse_url, tls}`).

use std::sync::Arc;

use tokio_postgres::{Client, Statement};

use super::plan::Row;
use super::OutboxError;
use crate::ledger::postgres::{parse_url, tls};

/// The DDL for `table`: idempotent (`init` may run again).
pub fn ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    id bigserial PRIMARY KEY,
    payload json NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {table}_rejected (
    id bigint PRIMARY KEY,
    payload text NOT NULL,
    created_at timestamptz NOT NULL,
    rejected_at timestamptz NOT NULL DEFAULT now(),
    error text NOT NULL
);
CREATE OR REPLACE FUNCTION {table}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{table}', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {table}_notify ON {table};
CREATE TRIGGER {table}_notify AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {table}_notify();
"
    )
}

/// A connection with the round's statements prepared.
struct Conn {
    client: Client,
    take: Statement,
    reject: Statement,
    delete: Statement,
}

/// The outbox in one PostgreSQL database, read by this daemon.
pub struct PgOutbox {
    config: tokio_postgres::Config,
    tls: tls::Tls,
    table: String,
    conn: Option<Conn>,
}

impl std::fmt::Debug for PgOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutbox")
            .field("table", &self.table)
            .finish()
    }
}

impl PgOutbox {
    pub fn new(url: &str, table: &str) -> Result<PgOutbox, OutboxError> {
        let (config, mode) = parse_url(url).map_err(|e| OutboxError::Config(e.to_string()))?;
        let tls = tls::Tls::from_params(&mode).map_err(|e| OutboxError::Config(e.to_string()))?;
        Ok(PgOutbox {
            config,
            tls,
            table: table.to_string(),
            conn: None,
        })
    }

    /// A new connection of its own (its driver task ends when the client drops).
    async fn connect(&self) -> Result<Client, OutboxError> {
        let (client, conn) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(source)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "an outbox connection ended");
            }
        });
        Ok(client)
    }

    async fn conn(&mut self) -> Result<&Conn, OutboxError> {
        if self.conn.is_none() {
            let client = self.connect().await?;
            let t = &self.table;
            let take = client
                .prepare(&format!(
                    "SELECT id, payload::text, extract(epoch FROM now() - created_at)::float8 \
                     FROM {t} ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
                ))
                .await
                .map_err(source)?;
            let reject = client
                .prepare(&format!(
                    "INSERT INTO {t}_rejected (id, payload, created_at, error) \
                     SELECT id, payload::text, created_at, $2 FROM {t} WHERE id = $1 \
                     ON CONFLICT (id) DO NOTHING"
                ))
                .await
                .map_err(source)?;
            let delete = client
                .prepare(&format!("DELETE FROM {t} WHERE id = ANY($1)"))
                .await
                .map_err(source)?;
            self.conn = Some(Conn {
                client,
                take,
                reject,
                delete,
            });
        }
        self.conn
            .as_ref()
            .ok_or_else(|| OutboxError::Source("no connection".into()))
    }

    /// `BEGIN` and the oldest `batch` rows no other transaction holds, locked until
    /// [`finish`](Self::finish) or [`abandon`](Self::abandon).
    pub async fn take(&mut self, batch: usize) -> Result<Vec<Row>, OutboxError> {
        let result = async {
            let c = self.conn().await?;
            c.client.batch_execute("BEGIN").await.map_err(source)?;
            let rows = c
                .client
                .query(&c.take, &[&(batch as i64)])
                .await
                .map_err(source)?;
            rows.iter()
                .map(|r| {
                    Ok(Row {
                        id: r.try_get(0).map_err(source)?,
                        payload: r.try_get(1).map_err(source)?,
                        age_secs: r
                            .try_get::<_, Option<f64>>(2)
                            .map_err(source)?
                            .unwrap_or(0.0),
                    })
                })
                .collect()
        }
        .await;
        self.drop_on_error(result)
    }

    /// Move `rejected` to `<table>_rejected`, delete `ids`, `COMMIT`.
    pub async fn finish(
        &mut self,
        rejected: &[(i64, String)],
        ids: &[i64],
    ) -> Result<(), OutboxError> {
        let result = async {
            let c = self.conn().await?;
            for (id, error) in rejected {
                c.client
                    .execute(&c.reject, &[id, error])
                    .await
                    .map_err(source)?;
            }
            c.client.execute(&c.delete, &[&ids]).await.map_err(source)?;
            c.client.batch_execute("COMMIT").await.map_err(source)
        }
        .await;
        self.drop_on_error(result)
    }

    /// `ROLLBACK`: the rows taken stay, unlocked.
    pub async fn abandon(&mut self) {
        if let Some(c) = &self.conn {
            if c.client.batch_execute("ROLLBACK").await.is_err() {
                self.conn = None;
            }
        }
    }

    /// After a failure the connection is dropped (the server rolls back whatever it held) and
    /// the next round connects again.
    fn drop_on_error<T>(&mut self, r: Result<T, OutboxError>) -> Result<T, OutboxError> {
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    /// `LISTEN` on the trigger's channel on a connection of its own, waking `wake` at every
    /// notification; after a lost connection, listen again (and wake once: rows may have come
    /// meanwhile). Ends when `stop` turns true.
    pub fn listen(
        &self,
        wake: Arc<tokio::sync::Notify>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let config = self.config.clone();
        let tls = self.tls.clone();
        let table = self.table.clone();
        tokio::spawn(async move {
            loop {
                let listened = async {
                    let (client, mut conn) = config.connect(tls.clone()).await?;
                    let driver = async {
                        loop {
                            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                                Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => {
                                    wake.notify_one()
                                }
                                Some(Ok(_)) => {}
                                Some(Err(e)) => return Err(e),
                                None => return Ok(()),
                            }
                        }
                    };
                    let listen = async {
                        client.batch_execute(&format!("LISTEN {table}")).await?;
                        // Rows inserted before the LISTEN took effect are read now.
                        wake.notify_one();
                        std::future::pending::<Result<(), tokio_postgres::Error>>().await
                    };
                    tokio::select! {
                        r = driver => r,
                        r = listen => r,
                    }
                };
                tokio::select! {
                    r = listened => {
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "the outbox LISTEN connection failed; polling until it is back");
                        }
                    }
                    _ = stop.wait_for(|s| *s) => return,
                }
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
    }

    /// Create the tables and the trigger (idempotent).
    pub async fn init(&self) -> Result<(), OutboxError> {
        let client = self.connect().await?;
        client
            .batch_execute(&format!("BEGIN; {} COMMIT;", ddl(&self.table)))
            .await
            .map_err(source)
    }
}

/// A driver error, as the outbox reports it.
fn source(e: tokio_postgres::Error) -> OutboxError {
    OutboxError::Source(match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    })
}
