//! The limiter state the dispatcher stores on each subscriber row on SQLite, as JSON: read
//! (telling a state that does not decode), loaded for the dispatcher, stored back.

use fanout_core::limiter::LimiterState;
use rusqlite::{params, Connection, OptionalExtension};

use crate::ledger::error::LedgerError;

/// A subscriber's limiter as stored by the dispatcher.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredLimiter {
    /// Nothing stored yet: a new subscriber, which starts with a full burst.
    Never,
    Decoded(LimiterState),
    /// A state that does not decode (written by another version, or damaged): why.
    Undecodable(String),
}

pub fn read_limiter(c: &Connection, id: &str) -> Result<StoredLimiter, LedgerError> {
    let raw: Option<Option<String>> = c
        .prepare_cached("SELECT limiter FROM subscribers WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(match raw.flatten() {
        None => StoredLimiter::Never,
        Some(text) => match serde_json::from_str::<LimiterState>(&text) {
            Ok(state) => StoredLimiter::Decoded(state),
            Err(e) => StoredLimiter::Undecodable(e.to_string()),
        },
    })
}

/// The limiter the dispatcher starts a subscriber from. A stored state that does not decode
/// is logged (WARN, naming the subscriber) and replaced by an EMPTY bucket as of `now_ms`,
/// never a full one: trusting nothing, the subscriber gets only what accrues from now.
pub fn load_limiter(c: &Connection, id: &str, now_ms: i64) -> Result<LimiterState, LedgerError> {
    Ok(match read_limiter(c, id)? {
        StoredLimiter::Never => LimiterState::default(),
        StoredLimiter::Decoded(state) => state,
        StoredLimiter::Undecodable(why) => {
            tracing::warn!(
                subscriber = %id,
                error = %why,
                "the stored limiter state does not decode (written by another version?); \
                 the subscriber starts from an empty bucket"
            );
            LimiterState::empty(now_ms)
        }
    })
}

pub fn store_limiters(
    c: &Connection,
    states: &[(String, LimiterState)],
) -> Result<(), LedgerError> {
    let mut st = c.prepare_cached("UPDATE subscribers SET limiter = ?2 WHERE id = ?1")?;
    for (id, state) in states {
        let json = serde_json::to_string(state).unwrap_or_default();
        st.execute(params![id, json])?;
    }
    Ok(())
}
