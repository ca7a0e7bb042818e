//! Versioned schema migrations. `PRAGMA user_version` holds how many have been applied; each
//! runs in its own transaction, so a crash mid-migration leaves the previous version intact.

use rusqlite::Connection;

use super::LedgerError;

/// Migration `i` takes the schema from version `i` to `i + 1`. Append only; never edit one
/// that has shipped.
const MIGRATIONS: &[&str] = &[
    // 1: the ledger.
    r#"
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
    "#,
    // 2: subscriber health for alerts (crate::alert): disabled subscribers, the start of the
    // current run of failures, and whether the dead-count crossing was reported; an index to
    // count a subscriber's dead deliveries (up to the threshold) without reading the others.
    r#"
    ALTER TABLE subscribers ADD COLUMN disabled_ms INTEGER;        -- NULL: enabled
    ALTER TABLE subscribers ADD COLUMN disabled_reason TEXT;
    ALTER TABLE subscribers ADD COLUMN failing_since_ms INTEGER;   -- NULL: the last attempt succeeded
    ALTER TABLE subscribers ADD COLUMN dead_alerted_ms INTEGER;    -- NULL: armed
    CREATE INDEX deliveries_dead ON deliveries(subscriber_id) WHERE status = 'dead';
    "#,
    // Customers (issue 12; planned as migration 5, renumbered to follow what landed): the
    // customers that own subscribers, their weight in the dispatcher's share and their own
    // in-flight cap; `portal_nonce` is part of every portal token and is checked on each call,
    // so a deleted (or re-created) customer's links stop working. `portal_key` holds the one
    // HMAC key, generated on first start, that signs portal tokens (shared by every daemon on
    // this ledger).
    r#"
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
    "#,
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
    r#"
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
    "#,
];

pub const VERSION: i64 = MIGRATIONS.len() as i64;

pub fn migrate(conn: &mut Connection) -> Result<i64, LedgerError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current > VERSION {
        return Err(LedgerError::Schema(format!(
            "the database has schema version {current}, newer than this fanout ({VERSION})"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(VERSION)
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
}
