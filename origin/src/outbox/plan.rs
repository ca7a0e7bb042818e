//! What a batch of outbox rows becomes, and when to read the next one (pure).
//!
//! A row becomes one event when its payload is an event as `POST /v1/events` takes it
//! (`crate::event_input`, the one check); otherwise it becomes a rejection with the reason.
//! Rows whose payloads share an event id and body are one event (the ledger is idempotent by
//! id anyway): the first is ingested and every one of them leaves the outbox. A row reusing an
//! id with another body is rejected ([`ID_REUSED`]), here within a batch, and by the round when
//! the ledger holds the id with another body.

use std::collections::HashMap;
use std::time::Duration;

use crate::event_input::parse_event;
pub use crate::ledger::deliveries::ID_REUSED;
use crate::ledger::NewEvent;

/// Rows taken in one round, at most.
pub const DEFAULT_BATCH: usize = 1000;
/// The longest wait before a failed round is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest table name accepted (PostgreSQL's identifiers are 63 bytes; `_rejected` and
/// `_notify` are appended).
pub const MAX_TABLE_NAME: usize = 50;

/// One row as read from the outbox: its key, its payload as text (`None`: the column held
/// something that is not text), and the age of its `created_at` in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: i64,
    pub payload: Option<String>,
    pub age_secs: f64,
}

/// What a batch becomes: the events to ingest (and the row each came from), the rows to move to
/// `<table>_rejected` with their error, and every row id that leaves the outbox once the
/// ledger holds the events.
#[derive(Debug, Default, PartialEq)]
pub struct Batch {
    pub events: Vec<NewEvent>,
    pub event_rows: Vec<i64>,
    pub rejected: Vec<(i64, String)>,
    pub ids: Vec<i64>,
}

/// Sort rows (oldest first, as read) into events and rejections.
pub fn plan(rows: &[Row], max_event_bytes: usize) -> Batch {
    let mut batch = Batch::default();
    // Each id taken in this batch, and the index of its event.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for row in rows {
        batch.ids.push(row.id);
        let Some(text) = &row.payload else {
            batch
                .rejected
                .push((row.id, "the payload is not text".into()));
            continue;
        };
        match parse_event(text, None, max_event_bytes) {
            Ok(event) => match seen.get(&event.id) {
                Some(&k) if batch.events[k].body != event.body => {
                    batch.rejected.push((row.id, ID_REUSED.into()))
                }
                Some(_) => {}
                None => {
                    seen.insert(event.id.clone(), batch.events.len());
                    batch.events.push(event);
                    batch.event_rows.push(row.id);
                }
            },
            Err(e) => batch.rejected.push((row.id, e.to_string())),
        }
    }
    batch
}

/// When the next round starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// At once: the last round took a full batch, more are likely waiting.
    Now,
    /// After this long, or sooner when woken (a PostgreSQL `NOTIFY`).
    Wait(Duration),
}

/// What a round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// It read the outbox and took this many rows.
    Took(usize),
    /// Another daemon reads the outbox (holds its lock): nothing was read.
    Standby,
    /// It failed, the `n`-th time in a row.
    Failed(u32),
}

/// How soon a daemon on standby tries again to become the outbox's reader, at most: the reader
/// that stopped is taken over within this (plus the time the server takes to see it gone).
pub const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// After a round that did `done` (of at most `batch` rows), with `poll` the polling period.
pub fn next(done: Done, batch: usize, poll: Duration) -> Next {
    match done {
        Done::Took(n) if n >= batch => Next::Now,
        Done::Took(_) => Next::Wait(poll),
        Done::Standby => Next::Wait(poll.min(STANDBY_RETRY)),
        Done::Failed(failures) => {
            let backoff = Duration::from_millis(100) * 2u32.pow(failures.clamp(1, 7) - 1);
            Next::Wait(backoff.min(MAX_BACKOFF))
        }
    }
}

/// A table name safe to write into SQL between double quotes (every statement quotes it, so a
/// reserved word such as `select` is a name like any other): a lowercase letter or `_`, then
/// lowercase letters, digits or `_`.
pub fn check_table(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if !first_ok
        || name.len() > MAX_TABLE_NAME
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!(
            "the outbox table {name:?} must be 1 to {MAX_TABLE_NAME} characters of a-z, 0-9 \
             and _, not starting with a digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, payload: Option<&str>) -> Row {
        Row {
            id,
            payload: payload.map(str::to_string),
            age_secs: 0.0,
        }
    }

    #[test]
    fn plan_table() {
        let rows = [
            row(3, Some(r#"{"id":"e1","type":"a"}"#)),
            row(1, Some(r#"{"type":"a"}"#)),
            row(7, None),
            row(9, Some(r#"{"id":"e1","type":"a","again":true}"#)),
            row(10, Some(r#"{"id":"e2","type":"b"}"#)),
            row(11, Some("[1]")),
            row(12, Some(r#"{"id":"e1","type":"a"}"#)),
        ];
        let b = plan(&rows, 1024);
        assert_eq!(b.ids, [3, 1, 7, 9, 10, 11, 12]);
        let ids: Vec<&str> = b.events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2"]);
        assert_eq!(b.event_rows, [3, 10]);
        assert_eq!(b.events[0].body, r#"{"id":"e1","type":"a"}"#);
        let rejected: Vec<(i64, &str)> = b.rejected.iter().map(|(i, e)| (*i, e.as_str())).collect();
        assert_eq!(
            rejected,
            [
                (1, "id is missing"),
                (7, "the payload is not text"),
                (9, "id reused with a different body"),
                (11, "an event must be a JSON object")
            ]
        );
        assert_eq!(plan(&[], 1024), Batch::default());
        let big = format!(r#"{{"id":"e","type":"a","p":"{}"}}"#, "x".repeat(2000));
        assert!(plan(&[row(1, Some(&big))], 1024).rejected[0]
            .1
            .contains("limit is 1024"));
    }

    #[test]
    fn next_table() {
        let poll = Duration::from_secs(1);
        let ms = Duration::from_millis;
        let cases = [
            (Done::Took(1000), Next::Now),
            (Done::Took(999), Next::Wait(poll)),
            (Done::Took(0), Next::Wait(poll)),
            (Done::Standby, Next::Wait(STANDBY_RETRY)),
            (Done::Failed(1), Next::Wait(ms(100))),
            (Done::Failed(2), Next::Wait(ms(200))),
            (Done::Failed(4), Next::Wait(ms(800))),
            (Done::Failed(7), Next::Wait(MAX_BACKOFF)),
            (Done::Failed(50), Next::Wait(MAX_BACKOFF)),
        ];
        for (done, expected) in cases {
            assert_eq!(next(done, 1000, poll), expected, "{done:?}");
        }
        // A standby polls no slower than it takes over, a fast poll stays fast.
        assert_eq!(
            next(Done::Standby, 1000, Duration::from_secs(3600)),
            Next::Wait(STANDBY_RETRY)
        );
        assert_eq!(next(Done::Standby, 1000, ms(20)), Next::Wait(ms(20)));
    }

    #[test]
    fn table_names() {
        for ok in ["fanout_outbox", "_o", "o2"] {
            assert_eq!(check_table(ok), Ok(()), "{ok}");
        }
        for bad in ["", "2o", "Outbox", "o-x", "o;drop", "o x", &"o".repeat(51)] {
            assert!(check_table(bad).is_err(), "{bad}");
        }
    }
}
