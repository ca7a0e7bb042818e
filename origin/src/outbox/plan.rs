//! What a batch of outbox rows becomes, and when to read the next one (pure).
//!
//! A row becomes one event when its payload is an event as `POST /v1/events` takes it
//! (`crate::event_input`, the one check); otherwise it becomes a rejection with the reason.
//! Rows whose payloads share an event id are one event (the ledger is idempotent by id anyway):
//! the first is ingested and every one of them leaves the outbox.

use std::collections::HashSet;
use std::time::Duration;

use crate::event_input::parse_event;
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

/// What a batch becomes: the events to ingest, the rows to move to `<table>_rejected` with
/// their error, and every row id that leaves the outbox once the ledger holds the events.
#[derive(Debug, Default, PartialEq)]
pub struct Batch {
    pub events: Vec<NewEvent>,
    pub rejected: Vec<(i64, String)>,
    pub ids: Vec<i64>,
}

/// Sort rows (oldest first, as read) into events and rejections.
pub fn plan(rows: &[Row], max_event_bytes: usize) -> Batch {
    let mut batch = Batch::default();
    let mut seen = HashSet::new();
    for row in rows {
        batch.ids.push(row.id);
        let Some(text) = &row.payload else {
            batch
                .rejected
                .push((row.id, "the payload is not text".into()));
            continue;
        };
        match parse_event(text, None, max_event_bytes) {
            Ok(event) => {
                if seen.insert(event.id.clone()) {
                    batch.events.push(event);
                }
            }
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

/// After a round that took `taken` rows of at most `batch` (or failed, the `failures`-th time in a
/// row), with `poll` the polling period.
pub fn next(taken: Option<usize>, batch: usize, failures: u32, poll: Duration) -> Next {
    match taken {
        Some(n) if n >= batch => Next::Now,
        Some(_) => Next::Wait(poll),
        None => {
            let backoff = Duration::from_millis(100) * 2u32.pow(failures.clamp(1, 7) - 1);
            Next::Wait(backoff.min(MAX_BACKOFF))
        }
    }
}

/// A table name safe to write into SQL unquoted: a lowercase letter or `_`, then lowercase
/// letters, digits or `_`.
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
        ];
        let b = plan(&rows, 1024);
        assert_eq!(b.ids, [3, 1, 7, 9, 10, 11]);
        let ids: Vec<&str> = b.events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2"]);
        assert_eq!(b.events[0].body, r#"{"id":"e1","type":"a"}"#);
        let rejected: Vec<(i64, &str)> = b.rejected.iter().map(|(i, e)| (*i, e.as_str())).collect();
        assert_eq!(
            rejected,
            [
                (1, "id is missing"),
                (7, "the payload is not text"),
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
            (Some(1000), 0, Next::Now),
            (Some(999), 0, Next::Wait(poll)),
            (Some(0), 0, Next::Wait(poll)),
            (None, 1, Next::Wait(ms(100))),
            (None, 2, Next::Wait(ms(200))),
            (None, 4, Next::Wait(ms(800))),
            (None, 7, Next::Wait(MAX_BACKOFF)),
            (None, 50, Next::Wait(MAX_BACKOFF)),
        ];
        for (taken, failures, expected) in cases {
            assert_eq!(
                next(taken, 1000, failures, poll),
                expected,
                "{taken:?} {failures}"
            );
        }
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
