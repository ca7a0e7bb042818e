//! A producer's outbox in PostgreSQL: its DDL (the table, `<table>_rejected`, and the trigger
//! that `NOTIFY`s channel `<table>` on every insert), and the reads and writes of one round.
//!
//! One daemon reads an outbox at a time, so that its rows go into the ledger in the outbox's
//! order (two readers' scans would interleave): the reader holds a session advisory lock
//! ([`lock_key`]) on its round connection; another daemon stays on standby, trying for the
//! lock every second at most. When the reader stops, its connection ends and the server
//! releases the lock: a crash at once, a host that vanished within the keepalive settings the
//! reader's session sets (`tcp_keepalives_*`, about 8 s).
//!
//! A round is one transaction of the producer's database on the reader's connection: `BEGIN`,
//! the oldest rows by id `FOR UPDATE NOWAIT` (rows not yet committed are not seen, whatever
//! their id; a row some other session holds locked fails the round rather than be skipped
//! out of order), then — only after the ledger has committed their events — the rejections
//! inserted, the rows deleted, `COMMIT`. If the ledger fails, `ROLLBACK`: the rows stay. A
//! crash in between loses the connection, the server rolls back, and the next round reads the
//! rows again (ingest is idempotent by event id).
//! Connections use the ledger's URL grammar and TLS (`crate::pg`).

use std::sync::Arc;

use tokio_postgres::{Client, Statement};

use super::plan::Row;
use super::OutboxError;
use crate::pg::{parse_url, tls};

/// The DDL for `table`: idempotent (`init` may run again). `<table>_rejected` keeps every
/// rejection, also of a row whose id an earlier rejected row had (its `id` is not unique; an
/// older table's primary key is dropped by running `init` again).
pub fn ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
    id bigserial PRIMARY KEY,
    payload json NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS \"{table}_rejected\" (
    id bigint NOT NULL,
    payload text NOT NULL,
    created_at timestamptz NOT NULL,
    rejected_at timestamptz NOT NULL DEFAULT now(),
    error text NOT NULL
);
ALTER TABLE \"{table}_rejected\" DROP CONSTRAINT IF EXISTS \"{table}_rejected_pkey\";
CREATE INDEX IF NOT EXISTS \"{table}_rejected_id\" ON \"{table}_rejected\" (id);
CREATE OR REPLACE FUNCTION \"{table}_notify\"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{table}', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS \"{table}_notify\" ON \"{table}\";
CREATE TRIGGER \"{table}_notify\" AFTER INSERT ON \"{table}\"
    FOR EACH STATEMENT EXECUTE FUNCTION \"{table}_notify\"();
"
    )
}

/// A connection with the round's statements prepared.
struct Conn {
    client: Client,
    take: Statement,
    reject: Statement,
    delete: Statement,
    /// This connection holds the outbox's lock: this daemon is its reader.
    reader: bool,
}

/// The advisory lock (of the producer's database) its reader holds: the first 8 bytes of the
/// SHA-256 of `fanout outbox <table>`, so that two outboxes of one database have two readers.
pub fn lock_key(table: &str) -> i64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("fanout outbox {table}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The reader's session: the server notices a reader that vanished (and frees the lock) after
/// 5 s of silence and 3 unanswered probes a second apart. Only for TCP; ignored on a socket.
const READER_SESSION: &str =
    "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = 3";

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

    async fn conn(&mut self) -> Result<&mut Conn, OutboxError> {
        if self.conn.is_none() {
            let client = self.connect().await?;
            let t = &self.table;
            let take = client
                .prepare(&format!(
                    "SELECT id, payload::text, extract(epoch FROM now() - created_at)::float8 \
                     FROM \"{t}\" ORDER BY id LIMIT $1 FOR UPDATE NOWAIT"
                ))
                .await
                .map_err(source)?;
            let reject = client
                .prepare(&format!(
                    "INSERT INTO \"{t}_rejected\" (id, payload, created_at, error) \
                     SELECT id, payload::text, created_at, $2 FROM \"{t}\" WHERE id = $1"
                ))
                .await
                .map_err(source)?;
            let delete = client
                .prepare(&format!("DELETE FROM \"{t}\" WHERE id = ANY($1)"))
                .await
                .map_err(source)?;
            client.batch_execute(READER_SESSION).await.map_err(source)?;
            self.conn = Some(Conn {
                client,
                take,
                reject,
                delete,
                reader: false,
            });
        }
        self.conn
            .as_mut()
            .ok_or_else(|| OutboxError::Source("no connection".into()))
    }

    /// `BEGIN` and the oldest `batch` rows, locked until [`finish`](Self::finish) or
    /// [`abandon`](Self::abandon); `None` when another daemon is the outbox's reader.
    pub async fn take(&mut self, batch: usize) -> Result<Option<Vec<Row>>, OutboxError> {
        let key = lock_key(&self.table);
        let result = async {
            let c = self.conn().await?;
            if !c.reader {
                let row = c
                    .client
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
                    .await
                    .map_err(source)?;
                c.reader = row.try_get(0).map_err(source)?;
                if !c.reader {
                    return Ok(None);
                }
            }
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
                .collect::<Result<Vec<Row>, OutboxError>>()
                .map(Some)
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
                        client.batch_execute(&format!("LISTEN \"{table}\"")).await?;
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
