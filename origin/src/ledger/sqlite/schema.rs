//! Versioned schema migrations. `PRAGMA user_version` holds how many have been applied; each
//! runs in its own transaction, so a crash mid-migration leaves the previous version intact.

use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::ledger::error::LedgerError;

/// One step of the schema: SQL, or code where the step has to report its progress.
enum Migration {
    Sql(&'static str),
    Code(fn(&rusqlite::Transaction<'_>) -> Result<(), LedgerError>),
}

use Migration::{Code, Sql};

/// Migration `i` takes the schema from version `i` to `i + 1`. Append only; never edit one
/// that has shipped.
const MIGRATIONS: &[Migration] = &[
    // 1: the ledger.
    Sql(r#"
    CREATE TABLE subscribers (
        id               TEXT PRIMARY KEY,
        url              TEXT NOT NULL,
        event_types      TEXT NOT NULL,            -- JSON array of patterns
        rate_per_sec     REAL NOT NULL CHECK (rate_per_sec > 0),
        burst            INTEGER NOT NULL CHECK (burst >= 1),
        max_in_flight    INTEGER NOT NULL CHECK (max_in_flight >= 1),
        timeout_ms       INTEGER NOT NULL,
        lane             TEXT NOT NULL CHECK (lane IN ('edge', 'origin', 'auto')),
        legacy_signature INTEGER NOT NULL DEFAULT 0,
        limiter          TEXT,                     -- JSON of fanout_core::limiter::LimiterState
        created_ms       INTEGER NOT NULL,
        updated_ms       INTEGER NOT NULL,
        deleted_ms       INTEGER                   -- soft delete: history stays readable
    );
    CREATE TABLE subscriber_secrets (
        subscriber_id TEXT NOT NULL REFERENCES subscribers(id),
        secret        TEXT NOT NULL,
        created_ms    INTEGER NOT NULL,
        expires_ms    INTEGER                      -- NULL: the current secret
    );
    CREATE INDEX subscriber_secrets_by_subscriber ON subscriber_secrets(subscriber_id);
    CREATE TABLE events (
        id          TEXT NOT NULL UNIQUE,
        type        TEXT NOT NULL,
        body        TEXT NOT NULL,                 -- the exact bytes received
        received_ms INTEGER NOT NULL
    );
    CREATE TABLE deliveries (
        id               INTEGER PRIMARY KEY,      -- public id: dlv_<id>
        subscriber_id    TEXT NOT NULL,
        event_id         TEXT NOT NULL,
        status           TEXT NOT NULL CHECK (status IN ('pending', 'in_flight', 'sent', 'dead')),
        attempts         INTEGER NOT NULL DEFAULT 0,
        next_attempt_ms  INTEGER NOT NULL,
        lease_expires_ms INTEGER,
        last_error       TEXT,
        created_ms       INTEGER NOT NULL,
        updated_ms       INTEGER NOT NULL,
        UNIQUE (subscriber_id, event_id)
    );
    CREATE INDEX deliveries_due ON deliveries(subscriber_id, next_attempt_ms) WHERE status = 'pending';
    CREATE INDEX deliveries_leased ON deliveries(lease_expires_ms) WHERE status = 'in_flight';
    CREATE INDEX deliveries_by_status ON deliveries(status, created_ms);
    CREATE TABLE attempts (
        id            INTEGER PRIMARY KEY,
        delivery_id   INTEGER NOT NULL,
        attempt       INTEGER NOT NULL,
        at_ms         INTEGER NOT NULL,
        lane          TEXT NOT NULL,
        outcome       TEXT NOT NULL,
        status        INTEGER,
        latency_ms    INTEGER,
        response_body TEXT,                        -- at most RESPONSE_BODY_LIMIT bytes
        error         TEXT
    );
    CREATE INDEX attempts_by_delivery ON attempts(delivery_id);
    "#),
    // 2: subscriber health for alerts (crate::alert): disabled subscribers, the start of the
    // current run of failures, and whether the dead-count crossing was reported; an index to
    // count a subscriber's dead deliveries (up to the threshold) without reading the others.
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN disabled_ms INTEGER;        -- NULL: enabled
    ALTER TABLE subscribers ADD COLUMN disabled_reason TEXT;
    ALTER TABLE subscribers ADD COLUMN failing_since_ms INTEGER;   -- NULL: the last attempt succeeded
    ALTER TABLE subscribers ADD COLUMN dead_alerted_ms INTEGER;    -- NULL: armed
    CREATE INDEX deliveries_dead ON deliveries(subscriber_id) WHERE status = 'dead';
    "#),
    // Customers (issue 12; planned as migration 5, renumbered to follow what landed): the
    // customers that own subscribers, their weight in the dispatcher's share and their own
    // in-flight cap; `portal_nonce` is part of every portal token and is checked on each call,
    // so a deleted (or re-created) customer's links stop working. `portal_key` holds the one
    // HMAC key, generated on first start, that signs portal tokens (shared by every daemon on
    // this ledger).
    Sql(r#"
    CREATE TABLE customers (
        id            TEXT PRIMARY KEY,
        weight        INTEGER NOT NULL DEFAULT 1 CHECK (weight >= 1),
        max_in_flight INTEGER CHECK (max_in_flight IS NULL OR max_in_flight >= 1),
        portal_nonce  TEXT NOT NULL,
        created_ms    INTEGER NOT NULL,
        updated_ms    INTEGER NOT NULL
    );
    ALTER TABLE subscribers ADD COLUMN customer TEXT;              -- NULL: no customer
    CREATE INDEX subscribers_by_customer ON subscribers(customer) WHERE customer IS NOT NULL;
    CREATE TABLE portal_key (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        key        BLOB NOT NULL,
        created_ms INTEGER NOT NULL
    );
    "#),
    // 4: costs that do not grow with the ledger, and retention (ledger/retention.rs; issue 10,
    // planned as migration 4).
    // `delivery_counts` holds the deliveries per (subscriber, status), kept by triggers so that
    // every statement that inserts, deletes or re-statuses a delivery keeps it exact, whatever
    // code path runs it; `/metrics`, `?stats=true` and `fanout status` read it instead of
    // counting. `last_errors` holds each subscriber's most recent failed or rejected attempt
    // (a trigger on attempts). The indexes serve the API's lists paged by id (status,
    // subscriber, subscriber and status, event, time) and retention (sent and dead by age);
    // `deliveries_status` replaces `deliveries_by_status` (its rowid suffix keeps id order),
    // `deliveries_subscriber_status` serves what `deliveries_dead` did.
    // `retention` holds what retention removed, in total, where its sweep of unreferenced
    // events has reached (a rowid), and when it last ran.
    Sql(r#"
    DROP INDEX deliveries_by_status;
    DROP INDEX deliveries_dead;
    CREATE INDEX deliveries_status ON deliveries(status);
    CREATE INDEX deliveries_subscriber_status ON deliveries(subscriber_id, status);
    CREATE INDEX deliveries_event ON deliveries(event_id);
    CREATE INDEX deliveries_created ON deliveries(created_ms);
    CREATE INDEX deliveries_sent_age ON deliveries(updated_ms) WHERE status = 'sent';
    CREATE INDEX deliveries_dead_age ON deliveries(updated_ms) WHERE status = 'dead';

    CREATE TABLE delivery_counts (
        subscriber_id TEXT NOT NULL,
        status        TEXT NOT NULL,
        n             INTEGER,
        PRIMARY KEY (subscriber_id, status)
    ) WITHOUT ROWID;
    INSERT INTO delivery_counts (subscriber_id, status, n)
        SELECT subscriber_id, status, COUNT(*) FROM deliveries GROUP BY subscriber_id, status;
    CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries BEGIN
        INSERT OR IGNORE INTO delivery_counts (subscriber_id, status, n)
            VALUES (NEW.subscriber_id, NEW.status, 0);
        UPDATE delivery_counts SET n = n + 1
            WHERE subscriber_id = NEW.subscriber_id AND status = NEW.status;
    END;
    CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries BEGIN
        UPDATE delivery_counts SET n = n - 1
            WHERE subscriber_id = OLD.subscriber_id AND status = OLD.status;
    END;
    CREATE TRIGGER delivery_counts_update AFTER UPDATE OF status, subscriber_id ON deliveries
        WHEN OLD.status IS NOT NEW.status OR OLD.subscriber_id IS NOT NEW.subscriber_id
    BEGIN
        UPDATE delivery_counts SET n = n - 1
            WHERE subscriber_id = OLD.subscriber_id AND status = OLD.status;
        INSERT OR IGNORE INTO delivery_counts (subscriber_id, status, n)
            VALUES (NEW.subscriber_id, NEW.status, 0);
        UPDATE delivery_counts SET n = n + 1
            WHERE subscriber_id = NEW.subscriber_id AND status = NEW.status;
    END;

    CREATE TABLE last_errors (
        subscriber_id TEXT PRIMARY KEY,
        at_ms         INTEGER,
        status        INTEGER,
        error         TEXT
    ) WITHOUT ROWID;
    INSERT INTO last_errors (subscriber_id, at_ms, status, error)
        SELECT subscriber_id, at_ms, status, error FROM (
            SELECT d.subscriber_id, a.at_ms, a.status, a.error,
                   ROW_NUMBER() OVER (PARTITION BY d.subscriber_id ORDER BY a.at_ms DESC, a.id DESC) AS k
            FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
            WHERE a.outcome IN ('failed', 'rejected'))
        WHERE k = 1;
    CREATE TRIGGER last_errors_insert AFTER INSERT ON attempts
        WHEN NEW.outcome IN ('failed', 'rejected')
    BEGIN
        INSERT OR REPLACE INTO last_errors (subscriber_id, at_ms, status, error)
            SELECT d.subscriber_id, NEW.at_ms, NEW.status, NEW.error
            FROM deliveries d WHERE d.id = NEW.delivery_id
              AND NOT EXISTS (SELECT 1 FROM last_errors l
                              WHERE l.subscriber_id = d.subscriber_id AND l.at_ms > NEW.at_ms);
    END;

    CREATE TABLE retention (
        key   TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO retention (key, value) VALUES ('removed_sent', 0), ('removed_dead', 0),
        ('removed_attempts', 0), ('removed_events', 0), ('events_swept_to', 0), ('last_run_ms', 0);
    "#),
    // 5: the deliveries keyed event first (issue 8, single events): see `rekey_deliveries`.
    Code(rekey_deliveries),
    // 6: who disabled a subscriber (issue 22): one an operator disabled is re-enabled by an
    // operator only, never through the customer's portal. Those disabled before this column
    // existed are told apart by the reason the API wrote for them, once, here.
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN disabled_by_operator INTEGER NOT NULL DEFAULT 0;
    UPDATE subscribers SET disabled_by_operator = 1
        WHERE disabled_ms IS NOT NULL AND disabled_reason = 'disabled by an operator';
    "#),
    // 7: a removed customer's history is the operator's (issue 22): removed subscribers stop
    // naming a customer that is gone, or that was created again after they were removed (the
    // customer that owned them then is gone), so a customer re-created under an old id sees
    // nothing of its predecessor's deliveries. `ledger::delete_customer` keeps it so.
    Sql(r#"
    UPDATE subscribers SET customer = NULL
        WHERE deleted_ms IS NOT NULL AND customer IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM customers c
                          WHERE c.id = subscribers.customer AND c.created_ms <= subscribers.deleted_ms);
    "#),
    // 8: each subscriber's latest test event (`POST /v1/subscribers/{id}/test`, issue 22): one
    // at a time, one every `model::MIN_TEST_INTERVAL_MS`, found by its key, never counted.
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN last_test_event TEXT;
    "#),
    // 9: a subscriber's content filter (issue 25, `crate::event_filter`): its JSON text, NULL
    // for none.
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN filter TEXT;
    "#),
    // 10: sequence numbers and thin payloads (issue 24): each delivery's `webhook-sequence`,
    // fixed at ingest (`ledger::sequence`); existing deliveries numbered per subscriber in id
    // order. `sequences` holds each subscriber's last number. No index on the column yet:
    // nothing looks a delivery up by its number (ordered delivery will add the one it needs).
    // A subscriber's `payload`: `full` or `thin`.
    Sql(r#"
    ALTER TABLE deliveries ADD COLUMN sequence INTEGER NOT NULL DEFAULT 0;
    UPDATE deliveries SET sequence = n.k
        FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY subscriber_id ORDER BY id) AS k
              FROM deliveries) AS n
        WHERE deliveries.id = n.id;
    CREATE TABLE sequences (
        subscriber_id TEXT PRIMARY KEY,
        last          INTEGER NOT NULL CHECK (last >= 0)
    ) WITHOUT ROWID;
    INSERT INTO sequences (subscriber_id, last)
        SELECT subscriber_id, MAX(sequence) FROM deliveries GROUP BY subscriber_id;
    ALTER TABLE subscribers ADD COLUMN payload TEXT NOT NULL DEFAULT 'full'
        CHECK (payload IN ('full', 'thin'));
    "#),
    // 11: ordered delivery (issue 24, `crate::ordering`): a subscriber's `ordering` and
    // `ordering_key` (a JSON Pointer); each delivery's key (NULL: unordered) and the sequence
    // of its key's previous delivery; `ordering_keys` holds each key's last sequence (and is
    // the row that serialises a key's ingest and release on PostgreSQL). A held delivery is
    // `pending` due at `ordering::HELD_MS`; `deliveries_ordered` finds a key's head and its
    // next held delivery by one probe each, and holds no unordered delivery.
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none'
        CHECK (ordering IN ('none', 'subscriber', 'key'));
    ALTER TABLE subscribers ADD COLUMN ordering_key TEXT;
    ALTER TABLE deliveries ADD COLUMN ordering_key TEXT;
    ALTER TABLE deliveries ADD COLUMN previous_sequence INTEGER;
    CREATE TABLE ordering_keys (
        subscriber_id TEXT NOT NULL,
        key           TEXT NOT NULL,
        last          INTEGER NOT NULL,
        PRIMARY KEY (subscriber_id, key)
    ) WITHOUT ROWID;
    CREATE INDEX deliveries_ordered ON deliveries(subscriber_id, ordering_key, next_attempt_ms, sequence)
        WHERE ordering_key IS NOT NULL AND status IN ('pending', 'in_flight');
    "#),
    // OpenTelemetry (issue 26, `crate::trace`): the W3C `traceparent` an event arrived with
    // (NULL: none), so its attempts and replays join the producer's trace; whether a
    // subscriber's webhooks carry one.
    Sql(r#"
    ALTER TABLE events ADD COLUMN traceparent TEXT;
    ALTER TABLE subscribers ADD COLUMN propagate_trace INTEGER NOT NULL DEFAULT 0;
    "#),
    // Ed25519 signatures (issue 25, `crate::keyring`): a subscriber's `signature` scheme, and
    // each generation of its secrets' Ed25519 signing key (`whsk_`; NULL in generations made
    // before, until a switch to the scheme gives the current one a key).
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN signature TEXT NOT NULL DEFAULT 'hmac'
        CHECK (signature IN ('hmac', 'ed25519', 'both'));
    ALTER TABLE subscriber_secrets ADD COLUMN signing_key TEXT;
    "#),
    // 11: the charts' series (issue 26, `crate::series`): one row per (bucket size, bucket,
    // subscriber), added to by each flush; `latency` is the JSON array of the fixed log-scale
    // histogram's counts. Trimmed by retention (`retention.rs`).
    Sql(r#"
    CREATE TABLE series (
        resolution_ms  INTEGER NOT NULL,
        bucket_ms      INTEGER NOT NULL,
        subscriber_id  TEXT NOT NULL,
        delivered      INTEGER NOT NULL,
        failed         INTEGER NOT NULL,
        deferred       INTEGER NOT NULL,
        rejected       INTEGER NOT NULL,
        latency        TEXT NOT NULL,
        backlog        INTEGER NOT NULL,
        oldest_age_ms  INTEGER NOT NULL,
        in_flight      INTEGER NOT NULL,
        cap            INTEGER NOT NULL,
        paused         INTEGER NOT NULL,
        breaker_open   INTEGER NOT NULL,
        PRIMARY KEY (resolution_ms, bucket_ms, subscriber_id)
    ) WITHOUT ROWID;
    "#),
    // 12: batched webhooks (issue 25, `fanout_core::batch`): a subscriber's `batch` settings
    // (JSON; NULL: one event per request).
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN batch TEXT;
    "#),
    // 13: the customer's own content filter (issue 35, `crate::event_filter`): its JSON text,
    // NULL for none. An event goes to a subscriber only when it matches both this and
    // `filter`, which stays the operator's: every filter stored before is the operator's.
    Sql(r#"
    ALTER TABLE subscribers ADD COLUMN customer_filter TEXT;
    "#),
];

/// Rows copied by one statement when a migration rebuilds a table; its progress is logged
/// between them.
const REBUILD_CHUNK: i64 = if cfg!(test) { 3 } else { 200_000 };

/// How often a long migration logs how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Migration 5. A delivery's uniqueness was `UNIQUE (subscriber_id, event_id)`, a constraint
/// of the table, beside an index on `event_id` for lists by event. An ingested event then
/// wrote one entry per subscriber into a different leaf of the first (keyed subscriber first,
/// its entries land in each subscriber's range) and one into the second: with five
/// subscribers, six B-tree leaves that no other event of the commit shares, each written to
/// the WAL again at every commit (single events: 24 page writes per event). Keyed
/// `(event_id, subscriber_id)`, an event's deliveries sit side by side in one leaf, and the
/// same index serves lists by event (an event has at most one delivery per subscriber: its
/// list is sorted in memory, bounded by the number of subscribers, not by the ledger), so the
/// event index goes. The count triggers become one upsert each instead of an insert and an
/// update.
///
/// SQLite cannot drop a table's constraint, so the table is rebuilt by SQLite's documented
/// procedure (create, copy, drop, rename, then its indexes and triggers again); its
/// uniqueness is now a named index, which a later migration can change without a rebuild.
/// Rows keep their ids. The copy goes by id ranges and logs its progress; it needs free disk
/// about the size of the deliveries table, and runs in the migration's one transaction (a
/// failure leaves version 4 intact).
fn rekey_deliveries(tx: &rusqlite::Transaction<'_>) -> Result<(), LedgerError> {
    let total: i64 = tx.query_row("SELECT COALESCE(SUM(n), 0) FROM delivery_counts", [], |r| {
        r.get(0)
    })?;
    let started = Instant::now();
    if total > REBUILD_CHUNK {
        tracing::info!(
            deliveries = total,
            "migrating the ledger to schema 5: rebuilding the deliveries table, keyed by event"
        );
    }
    tx.execute_batch(
        "DROP TRIGGER last_errors_insert;
         CREATE TABLE deliveries_rekeyed (
            id               INTEGER PRIMARY KEY,
            subscriber_id    TEXT NOT NULL,
            event_id         TEXT NOT NULL,
            status           TEXT NOT NULL CHECK (status IN ('pending', 'in_flight', 'sent', 'dead')),
            attempts         INTEGER NOT NULL DEFAULT 0,
            next_attempt_ms  INTEGER NOT NULL,
            lease_expires_ms INTEGER,
            last_error       TEXT,
            created_ms       INTEGER NOT NULL,
            updated_ms       INTEGER NOT NULL
         );",
    )?;
    let mut copy = tx.prepare(
        "INSERT INTO deliveries_rekeyed
         SELECT id, subscriber_id, event_id, status, attempts, next_attempt_ms,
                lease_expires_ms, last_error, created_ms, updated_ms
         FROM deliveries WHERE id > ?1 ORDER BY id LIMIT ?2",
    )?;
    let mut after = i64::MIN;
    let mut copied = 0i64;
    let mut logged = started;
    loop {
        let n = copy.execute(rusqlite::params![after, REBUILD_CHUNK])?;
        if n == 0 {
            break;
        }
        copied += n as i64;
        after = tx.query_row("SELECT MAX(id) FROM deliveries_rekeyed", [], |r| r.get(0))?;
        if logged.elapsed() >= PROGRESS_EVERY {
            logged = Instant::now();
            tracing::info!(
                copied,
                deliveries = total,
                seconds = started.elapsed().as_secs(),
                "migrating the ledger to schema 5: copying deliveries"
            );
        }
    }
    drop(copy);
    tx.execute_batch(
        r#"
        DROP TABLE deliveries;
        ALTER TABLE deliveries_rekeyed RENAME TO deliveries;
        CREATE UNIQUE INDEX deliveries_event_subscriber ON deliveries(event_id, subscriber_id);
        CREATE INDEX deliveries_due ON deliveries(subscriber_id, next_attempt_ms) WHERE status = 'pending';
        CREATE INDEX deliveries_leased ON deliveries(lease_expires_ms) WHERE status = 'in_flight';
        CREATE INDEX deliveries_status ON deliveries(status);
        CREATE INDEX deliveries_subscriber_status ON deliveries(subscriber_id, status);
        CREATE INDEX deliveries_created ON deliveries(created_ms);
        CREATE INDEX deliveries_sent_age ON deliveries(updated_ms) WHERE status = 'sent';
        CREATE INDEX deliveries_dead_age ON deliveries(updated_ms) WHERE status = 'dead';

        CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries BEGIN
            INSERT INTO delivery_counts (subscriber_id, status, n)
                VALUES (NEW.subscriber_id, NEW.status, 1)
                ON CONFLICT (subscriber_id, status) DO UPDATE SET n = n + 1;
        END;
        CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries BEGIN
            UPDATE delivery_counts SET n = n - 1
                WHERE subscriber_id = OLD.subscriber_id AND status = OLD.status;
        END;
        CREATE TRIGGER delivery_counts_update AFTER UPDATE OF status, subscriber_id ON deliveries
            WHEN OLD.status IS NOT NEW.status OR OLD.subscriber_id IS NOT NEW.subscriber_id
        BEGIN
            UPDATE delivery_counts SET n = n - 1
                WHERE subscriber_id = OLD.subscriber_id AND status = OLD.status;
            INSERT INTO delivery_counts (subscriber_id, status, n)
                VALUES (NEW.subscriber_id, NEW.status, 1)
                ON CONFLICT (subscriber_id, status) DO UPDATE SET n = n + 1;
        END;
        CREATE TRIGGER last_errors_insert AFTER INSERT ON attempts
            WHEN NEW.outcome IN ('failed', 'rejected')
        BEGIN
            INSERT OR REPLACE INTO last_errors (subscriber_id, at_ms, status, error)
                SELECT d.subscriber_id, NEW.at_ms, NEW.status, NEW.error
                FROM deliveries d WHERE d.id = NEW.delivery_id
                  AND NOT EXISTS (SELECT 1 FROM last_errors l
                                  WHERE l.subscriber_id = d.subscriber_id AND l.at_ms > NEW.at_ms);
        END;
        "#,
    )?;
    if total > REBUILD_CHUNK {
        tracing::info!(
            copied,
            seconds = started.elapsed().as_secs(),
            "migrated the ledger to schema 5"
        );
    }
    Ok(())
}

pub const VERSION: i64 = MIGRATIONS.len() as i64;

pub fn migrate(conn: &mut Connection) -> Result<i64, LedgerError> {
    migrate_to(conn, VERSION)
}

/// Apply the migrations up to version `target`.
fn migrate_to(conn: &mut Connection, target: i64) -> Result<i64, LedgerError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current > VERSION {
        return Err(LedgerError::Schema(format!(
            "the database has schema version {current}, newer than this fanout ({VERSION})"
        )));
    }
    let steps = MIGRATIONS.iter().enumerate().take(target as usize);
    for (i, step) in steps.skip(current as usize) {
        let tx = conn.transaction()?;
        match step {
            Sql(sql) => tx.execute_batch(sql)?,
            Code(run) => run(&tx)?,
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(target.max(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_from_empty_and_is_idempotent() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), VERSION);
        assert_eq!(migrate(&mut conn).unwrap(), VERSION);
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, VERSION);
        conn.pragma_update(None, "user_version", VERSION + 1)
            .unwrap();
        assert!(matches!(migrate(&mut conn), Err(LedgerError::Schema(_))));
    }

    /// The sequence-number migration numbers each subscriber's existing deliveries 1..N in id
    /// order and seeds its counter with N; subscribers keep a full payload.
    #[test]
    fn the_sequence_migration_numbers_existing_deliveries() {
        let at = MIGRATIONS
            .iter()
            .position(|m| matches!(m, Sql(sql) if sql.contains("CREATE TABLE sequences")))
            .unwrap() as i64;
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_to(&mut c, at).unwrap(), at);
        c.execute_batch(
            "INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                 timeout_ms, lane, created_ms, updated_ms) VALUES
                 ('a', 'u', '[]', 1, 1, 1, 1, 'origin', 1, 1);
             INSERT INTO deliveries (id, subscriber_id, event_id, status, next_attempt_ms,
                 created_ms, updated_ms) VALUES
                 (3, 'a', 'e1', 'sent', 0, 0, 0), (4, 'b', 'e1', 'dead', 0, 0, 0),
                 (7, 'a', 'e2', 'pending', 0, 0, 0), (9, 'a', 'e3', 'pending', 0, 0, 0),
                 (12, 'b', 'e3', 'sent', 0, 0, 0);",
        )
        .unwrap();
        migrate_to(&mut c, at + 1).unwrap();
        let numbered: Vec<(i64, i64)> = c
            .prepare("SELECT id, sequence FROM deliveries ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(numbered, [(3, 1), (4, 1), (7, 2), (9, 3), (12, 2)]);
        let counters: Vec<(String, i64)> = c
            .prepare("SELECT subscriber_id, last FROM sequences ORDER BY subscriber_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(counters, [("a".to_string(), 3), ("b".to_string(), 2)]);
        let payload: String = c
            .query_row("SELECT payload FROM subscribers", [], |r| r.get(0))
            .unwrap();
        assert_eq!(payload, "full");
    }

    /// Migration 13 (issue 35): a filter stored before is the operator's `filter`; the
    /// customer's own starts empty.
    #[test]
    fn migration_13_keeps_filters_as_the_operators() {
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_to(&mut c, 12).unwrap(), 12);
        c.execute_batch(
            r#"INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                 timeout_ms, lane, created_ms, updated_ms, filter) VALUES
                 ('acme', 'u', '["*"]', 1, 1, 1, 1, 'origin', 1, 1, '{"customer":"acme"}'),
                 ('plain', 'u', '["*"]', 1, 1, 1, 1, 'origin', 1, 1, NULL);"#,
        )
        .unwrap();
        migrate(&mut c).unwrap();
        let acme = super::super::get_subscriber(&c, "acme").unwrap();
        assert_eq!(
            (acme.filter, acme.customer_filter),
            (Some(serde_json::json!({"customer": "acme"})), None)
        );
        let plain = super::super::get_subscriber(&c, "plain").unwrap();
        assert_eq!((plain.filter, plain.customer_filter), (None, None));
    }

    /// Migration 7: a removed subscriber stops naming a customer that is gone, or that was
    /// created again after it was removed; live ones and those of a customer still the same
    /// keep theirs.
    #[test]
    fn migration_7_gives_a_removed_customers_history_to_the_operator() {
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_to(&mut c, 6).unwrap(), 6);
        c.execute_batch(
            "INSERT INTO customers (id, weight, portal_nonce, created_ms, updated_ms)
                 VALUES ('kept', 1, 'n', 1, 1), ('again', 1, 'n', 50, 50);
             INSERT INTO subscribers (id, url, event_types, rate_per_sec, burst, max_in_flight,
                 timeout_ms, lane, created_ms, updated_ms, deleted_ms, customer) VALUES
                 ('live', 'u', '[]', 1, 1, 1, 1, 'origin', 1, 1, NULL, 'kept'),
                 ('removed_kept', 'u', '[]', 1, 1, 1, 1, 'origin', 1, 1, 10, 'kept'),
                 ('removed_gone', 'u', '[]', 1, 1, 1, 1, 'origin', 1, 1, 10, 'gone'),
                 ('removed_before_again', 'u', '[]', 1, 1, 1, 1, 'origin', 1, 1, 10, 'again'),
                 ('operator', 'u', '[]', 1, 1, 1, 1, 'origin', 1, 1, 10, NULL);",
        )
        .unwrap();
        migrate(&mut c).unwrap();
        let owners: Vec<(String, Option<String>)> = c
            .prepare("SELECT id, customer FROM subscribers ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            owners,
            vec![
                ("live".into(), some("kept")),
                ("operator".into(), None),
                ("removed_before_again".into(), None),
                ("removed_gone".into(), None),
                ("removed_kept".into(), some("kept")),
            ]
        );
    }

    type Row = (
        i64,
        String,
        String,
        String,
        i64,
        i64,
        Option<i64>,
        Option<String>,
        i64,
        i64,
    );

    fn rows(c: &Connection) -> Vec<Row> {
        let mut st = c.prepare("SELECT * FROM deliveries ORDER BY id").unwrap();
        st.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    type Counts = Vec<(String, String, i64)>;

    /// The counts the triggers keep, and the rows counted.
    fn counts(c: &Connection) -> (Counts, Counts) {
        let q = |sql: &str| -> Counts {
            let mut st = c.prepare(sql).unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        (
            q("SELECT subscriber_id, status, n FROM delivery_counts WHERE n <> 0 ORDER BY 1, 2"),
            q("SELECT subscriber_id, status, COUNT(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2"),
        )
    }

    /// Migration 5 rebuilds a version-4 ledger's deliveries (more rows than one copy step
    /// takes, ids with gaps, every status): the same rows under the same ids, counts that
    /// still follow every change, one delivery per event and subscriber, the latest error
    /// still kept, and the event index replaced by the event-first key.
    #[test]
    fn migration_5_rekeys_the_deliveries_and_keeps_every_row() {
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_to(&mut c, 4).unwrap(), 4);
        let statuses = ["pending", "in_flight", "sent", "dead"];
        for i in 0..11i64 {
            c.execute(
                "INSERT INTO deliveries (id, subscriber_id, event_id, status, attempts,
                     next_attempt_ms, lease_expires_ms, last_error, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                rusqlite::params![
                    i * i + 5,
                    format!("s{}", i % 3),
                    format!("e{}", i / 3),
                    statuses[i as usize % 4],
                    i,
                    100 + i,
                    (i % 4 == 1).then_some(900 + i),
                    (i % 2 == 0).then(|| format!("err {i}")),
                    i,
                    i + 1,
                ],
            )
            .unwrap();
        }
        let before = rows(&c);
        let counted = counts(&c);
        assert_eq!(counted.0, counted.1);
        assert_eq!(migrate(&mut c).unwrap(), VERSION);
        assert_eq!(rows(&c), before, "same rows, same ids");
        assert_eq!(counts(&c), counted, "counts unchanged");

        let indexes: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'deliveries' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            indexes.contains(&"deliveries_event_subscriber".to_string()),
            "{indexes:?}"
        );
        assert!(
            !indexes
                .iter()
                .any(|n| n == "deliveries_event" || n.starts_with("sqlite_autoindex")),
            "{indexes:?}"
        );

        // One delivery per (event, subscriber); new rows and status changes keep the counts
        // (deletes: retention, in the plans test).
        let insert = "INSERT OR IGNORE INTO deliveries (subscriber_id, event_id, status, next_attempt_ms, created_ms, updated_ms) VALUES (?1, ?2, 'pending', 0, 0, 0)";
        assert_eq!(c.execute(insert, ["s0", "e0"]).unwrap(), 0, "a duplicate");
        assert_eq!(c.execute(insert, ["s9", "e0"]).unwrap(), 1);
        assert_eq!(c.execute(insert, ["s0", "e9"]).unwrap(), 1);
        c.execute(
            "UPDATE deliveries SET status = 'sent' WHERE status = 'pending'",
            [],
        )
        .unwrap();
        let (kept, recount) = counts(&c);
        assert_eq!(kept, recount);
        assert!(kept.contains(&("s9".into(), "sent".into(), 1)), "{kept:?}");

        // The latest failed attempt of a subscriber is still kept.
        let id: i64 = c
            .query_row(
                "SELECT id FROM deliveries WHERE subscriber_id = 's9'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        c.execute(
            "INSERT INTO attempts (delivery_id, attempt, at_ms, lane, outcome, status, error)
             VALUES (?1, 1, 77, 'origin', 'failed', 500, 'boom')",
            [id],
        )
        .unwrap();
        let last: (i64, String) = c
            .query_row(
                "SELECT at_ms, error FROM last_errors WHERE subscriber_id = 's9'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(last, (77, "boom".to_string()));
    }
}
