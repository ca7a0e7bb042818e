//! The rows PostgreSQL answers with, read into the contract's types, and the values its
//! statements take: shared by the files beside this one. No statement runs here.

use fanout_core::bucket::Bucket;
use fanout_core::limiter::LimiterState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::ledger::LedgerError;
use crate::model::{Disabled, Health, Lane, Limits, Payload, Scheme, Subscriber};

pub(super) type Param = Box<dyn ToSql + Sync + Send>;

pub(super) fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

pub(super) fn unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

/// PostgreSQL aborted the statement's transaction to break a deadlock or a serialization
/// conflict with another one: the same statement may succeed when tried again.
pub(super) fn transaction_aborted(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(e.code(), Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED
        || *c == SqlState::T_R_SERIALIZATION_FAILURE)
}

/// How many times a statement PostgreSQL aborted as a deadlock is tried again at start-up.
pub(super) const RELEASE_TRIES: u32 = 5;

// ---------------------------------------------------------------------------------------------
// Subscribers

pub(super) const SUBSCRIBER_COLUMNS: &str =
    "id, url, event_types, rate_per_sec, burst, max_in_flight, \
     timeout_ms, lane, legacy_signature, created_ms, updated_ms, disabled_ms, disabled_reason, \
     failing_since_ms, customer, disabled_by_operator, filter, payload, ordering, ordering_key,
     propagate_trace, signature, batch, customer_filter";

/// A text column holding one of an enum's names.
pub(super) fn enum_column<T>(
    r: &Row,
    i: usize,
    parse: fn(&str) -> Option<T>,
) -> Result<T, LedgerError> {
    let text: String = r.try_get(i)?;
    parse(&text).ok_or_else(|| LedgerError::Schema(format!("unknown value {text:?} in column {i}")))
}

pub(super) fn subscriber_from_row(r: &Row) -> Result<Subscriber, LedgerError> {
    let types: String = r.try_get(2)?;
    let lane: String = r.try_get(7)?;
    let disabled_ms: Option<i64> = r.try_get(11)?;
    let disabled_reason: Option<String> = r.try_get(12)?;
    let by_operator: bool = r.try_get(15)?;
    Ok(Subscriber {
        id: r.try_get(0)?,
        url: r.try_get(1)?,
        event_types: serde_json::from_str(&types)
            .map_err(|e| LedgerError::Invalid(format!("stored event types do not decode: {e}")))?,
        limits: Limits {
            rate_per_sec: r.try_get(3)?,
            burst: r.try_get::<_, i32>(4)?.max(1) as u32,
            max_in_flight: r.try_get::<_, i32>(5)?.max(1) as u32,
            timeout_ms: r.try_get::<_, i64>(6)?.max(0) as u64,
        },
        lane: Lane::parse(&lane)
            .ok_or_else(|| LedgerError::Invalid(format!("stored lane {lane:?} is unknown")))?,
        legacy_signature: r.try_get(8)?,
        secrets: Vec::new(),
        created_ms: r.try_get(9)?,
        updated_ms: r.try_get(10)?,
        health: Health {
            disabled: disabled_ms.map(|at_ms| Disabled {
                at_ms,
                reason: disabled_reason.unwrap_or_default(),
                by_operator,
            }),
            failing_since_ms: r.try_get(13)?,
        },
        customer: r.try_get(14)?,
        filter: crate::ledger::subscribers::filter_from_column(r.try_get(16)?),
        payload: enum_column(r, 17, Payload::parse)?,
        ordering: enum_column(r, 18, crate::ordering::Ordering::parse)?,
        ordering_key: r.try_get(19)?,
        propagate_trace: r.try_get(20)?,
        signature: enum_column(r, 21, Scheme::parse)?,
        batch: crate::ledger::subscribers::batch_from_column(r.try_get(22)?),
        customer_filter: crate::ledger::subscribers::filter_from_column(r.try_get(23)?),
    })
}

pub(super) fn event_types_json(s: &Subscriber) -> String {
    serde_json::to_string(&s.event_types).unwrap_or_else(|_| "[]".into())
}

/// The stored limiter, or — when it does not decode (another version wrote it) — an empty
/// bucket, never a full one, with a warning an operator sees.
pub(super) fn decode_limiter(id: &str, raw: Option<&str>, now_ms: i64) -> LimiterState {
    match raw.map(serde_json::from_str::<LimiterState>) {
        None => LimiterState::default(),
        Some(Ok(state)) => state,
        Some(Err(e)) => {
            tracing::error!(subscriber = id, error = %e,
                "the stored limiter state does not decode: starting from an empty bucket");
            LimiterState {
                bucket: Some(Bucket {
                    tokens: 0.0,
                    updated_ms: now_ms,
                }),
                ..LimiterState::default()
            }
        }
    }
}

pub(super) fn encode_limiter(state: &LimiterState) -> String {
    serde_json::to_string(state).unwrap_or_default()
}
