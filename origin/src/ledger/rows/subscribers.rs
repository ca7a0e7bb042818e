//! The `subscribers` and `subscriber_secrets` rows: their columns, a [`Subscriber`] as the
//! values its create and update bind, and a row back as a [`Subscriber`] (its secrets apart).
//!
//! A new subscriber field is one [`COLUMNS`] entry here (in the definition's part if the API
//! sets it), one line in [`definition`] and one in [`decode`], and a migration per backend.

use std::sync::LazyLock;

use super::{added, col, count, Cells, Column, Kind, Reader, Statement, Table, Value};
use crate::ledger::error::LedgerError;
use crate::model::{
    Disabled, Health, Lane, Limits, Ordering, Payload, Scheme, StoredSecret, Subscriber,
};

use Kind::{Flag, Int, Real, Text};

/// The table's columns: first the definition (what creating or changing a subscriber writes,
/// [`DEFINED`] of them, in [`definition`]'s order), then its times and health (read back by
/// [`decode`]: [`READ`] columns in all), then what only the dispatcher, the alerts and the
/// copy touch.
pub const COLUMNS: &[Column] = &[
    col("id", Text),
    col("url", Text),
    col("event_types", Text),
    col("rate_per_sec", Real),
    col("burst", Int),
    col("max_in_flight", Int),
    col("timeout_ms", Int),
    col("lane", Text),
    col("legacy_signature", Flag),
    added("customer", Text, "NULL"),
    added("filter", Text, "NULL"),
    added("payload", Text, "'full'"),
    added("ordering", Text, "'none'"),
    added("ordering_key", Text, "NULL"),
    added("propagate_trace", Flag, "0"),
    added("signature", Text, "'hmac'"),
    added("batch", Text, "NULL"),
    added("customer_filter", Text, "NULL"),
    // The time of the change: `created_ms` and `updated_ms` on create, `updated_ms` on update.
    col("created_ms", Int),
    col("updated_ms", Int),
    col("disabled_ms", Int),
    col("disabled_reason", Text),
    // Before schema 6 who disabled a subscriber is told by the reason the API wrote, as that
    // migration does.
    added(
        "disabled_by_operator",
        Flag,
        "COALESCE(disabled_ms IS NOT NULL AND disabled_reason = 'disabled by an operator', 0)",
    ),
    col("failing_since_ms", Int),
    col("deleted_ms", Int),
    col("dead_alerted_ms", Int),
    col("limiter", Text),
    added("last_test_event", Text, "NULL"),
];

/// How many leading columns a subscriber's definition is.
pub const DEFINED: usize = 18;

/// How many leading columns [`decode`] reads.
pub const READ: usize = 24;

pub const TABLE: Table = Table {
    name: "subscribers",
    columns: COLUMNS,
    paged: true,
};

/// `id, url, …`: the columns [`decode`] reads, for a `SELECT`.
pub static SELECT: LazyLock<String> = LazyLock::new(|| TABLE.names(READ));

/// Insert a new subscriber: [`definition`] with its creation time (`created_ms` and
/// `updated_ms` both).
pub static INSERT: LazyLock<Statement> = LazyLock::new(|| {
    let t = DEFINED + 1;
    Statement::new(format!(
        "INSERT INTO subscribers ({}, created_ms, updated_ms) VALUES ({}, ${t}, ${t})",
        TABLE.names(DEFINED),
        Table::placeholders(1, DEFINED),
    ))
});

/// Store a live subscriber's changed definition ([`definition`] with the time of the change):
/// its health, limiter and secrets are kept.
pub static UPDATE: LazyLock<Statement> = LazyLock::new(|| {
    let sets: Vec<String> = COLUMNS[1..DEFINED]
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} = ${}", c.name, i + 2))
        .collect();
    Statement::new(format!(
        "UPDATE subscribers SET {}, updated_ms = ${} WHERE id = $1 AND deleted_ms IS NULL",
        sets.join(", "),
        DEFINED + 1
    ))
});

/// What [`INSERT`] and [`UPDATE`] bind: the definition, in [`COLUMNS`]' order, then `at_ms`.
pub fn definition(s: &Subscriber, at_ms: i64) -> [Value<'_>; DEFINED + 1] {
    [
        s.id.as_str().into(),
        s.url.as_str().into(),
        serde_json::to_string(&s.event_types)
            .unwrap_or_else(|_| "[]".into())
            .into(),
        s.limits.rate_per_sec.into(),
        s.limits.burst.into(),
        s.limits.max_in_flight.into(),
        Value::Int(s.limits.timeout_ms.min(i64::MAX as u64) as i64),
        s.lane.as_str().into(),
        s.legacy_signature.into(),
        s.customer.as_deref().into(),
        filter_column(&s.filter).into(),
        s.payload.as_str().into(),
        s.ordering.as_str().into(),
        s.ordering_key.as_deref().into(),
        s.propagate_trace.into(),
        s.signature.as_str().into(),
        batch_column(s).into(),
        filter_column(&s.customer_filter).into(),
        at_ms.into(),
    ]
}

/// A subscriber's content filter (the operator's `filter` or the `customer_filter`) as both
/// backends store it: its JSON text, or NULL for none.
fn filter_column(filter: &Option<serde_json::Value>) -> Option<String> {
    filter.as_ref().map(|f| f.to_string())
}

/// A stored filter column back as JSON. Only the API writes it, from a checked value, so it
/// decodes; a text that does not is shown as the string it is rather than hidden.
fn filter_from_column(text: Option<String>) -> Option<serde_json::Value> {
    text.map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t)))
}

/// A subscriber's `batch` as its column holds it: JSON, or NULL for one event per request.
fn batch_column(s: &Subscriber) -> Option<String> {
    s.batch.map(|b| serde_json::json!(b).to_string())
}

/// A stored `batch` column back. Only the API writes it, from checked settings; a text that
/// does not decode is read as no batching (one event per request), the safe default.
fn batch_from_column(text: Option<String>) -> Option<fanout_core::batch::BatchSpec> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

/// A row of [`SELECT`]'s columns, from its column `from`, back as a subscriber (no secrets).
pub fn decode(cells: &(impl Cells + ?Sized), from: usize) -> Result<Subscriber, LedgerError> {
    let r = &mut Reader::new(cells, from);
    let id = r.text()?;
    let url = r.text()?;
    let types = r.text()?;
    let event_types = serde_json::from_str(&types)
        .map_err(|e| LedgerError::Schema(format!("stored event types do not decode: {e}")))?;
    let limits = Limits {
        rate_per_sec: r.real()?,
        burst: count(r.int()?),
        max_in_flight: count(r.int()?),
        timeout_ms: r.int()?.max(0) as u64,
    };
    let mut s = Subscriber {
        id,
        url,
        event_types,
        limits,
        lane: r.name(Lane::parse)?,
        legacy_signature: r.flag()?,
        customer: r.opt_text()?,
        filter: filter_from_column(r.opt_text()?),
        payload: r.name(Payload::parse)?,
        ordering: r.name(Ordering::parse)?,
        ordering_key: r.opt_text()?,
        propagate_trace: r.flag()?,
        signature: r.name(Scheme::parse)?,
        batch: batch_from_column(r.opt_text()?),
        customer_filter: filter_from_column(r.opt_text()?),
        created_ms: r.int()?,
        updated_ms: r.int()?,
        secrets: Vec::new(),
        health: Health::default(),
    };
    let disabled_ms = r.opt_int()?;
    let reason = r.opt_text()?;
    let by_operator = r.flag()?;
    s.health = Health {
        disabled: disabled_ms.map(|at_ms| Disabled {
            at_ms,
            reason: reason.unwrap_or_default(),
            by_operator,
        }),
        failing_since_ms: r.opt_int()?,
    };
    debug_assert_eq!(r.position(), from + READ);
    Ok(s)
}

/// The secrets' columns: the subscriber's, then one generation's (what [`decode_secret`]
/// reads, from its column 1).
pub const SECRET_COLUMNS: &[Column] = &[
    col("subscriber_id", Text),
    col("secret", Text),
    col("created_ms", Int),
    col("expires_ms", Int),
    added("signing_key", Text, "NULL"),
];

pub const SECRETS: Table = Table {
    name: "subscriber_secrets",
    columns: SECRET_COLUMNS,
    paged: true,
};

/// `subscriber_id, secret, …`: the secrets' columns for a `SELECT`.
pub static SELECT_SECRETS: LazyLock<String> = LazyLock::new(|| SECRETS.names(SECRET_COLUMNS.len()));

/// One generation of secrets, from a row of [`SELECT_SECRETS`]' columns.
pub fn decode_secret(cells: &(impl Cells + ?Sized)) -> Result<StoredSecret, LedgerError> {
    let r = &mut Reader::new(cells, 1);
    Ok(StoredSecret {
        secret: r.text()?,
        created_ms: r.int()?,
        expires_ms: r.opt_int()?,
        signing_key: r.opt_text()?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ledger::rows::tests::Stored;
    use fanout_core::batch::BatchSpec;

    /// A subscriber with every field away from its default.
    pub(crate) fn full_subscriber() -> Subscriber {
        Subscriber {
            id: "full".into(),
            url: "https://example.com/{type}".into(),
            event_types: vec!["video.*".into(), "invoice.paid".into()],
            limits: Limits {
                rate_per_sec: 2.5,
                burst: 7,
                max_in_flight: 3,
                timeout_ms: 4_500,
            },
            lane: Lane::Edge,
            legacy_signature: true,
            secrets: Vec::new(),
            created_ms: 11,
            updated_ms: 11,
            health: Health::default(),
            customer: Some("acme".into()),
            filter: Some(serde_json::json!({ "region": "eu" })),
            customer_filter: Some(serde_json::json!({ "amount": { "$gt": 5 } })),
            payload: Payload::Thin,
            ordering: Ordering::Key,
            ordering_key: Some("/video_id".into()),
            propagate_trace: true,
            signature: Scheme::Both,
            batch: Some(BatchSpec {
                max_events: 10,
                max_bytes: 65_536,
                max_wait_ms: 200,
            }),
        }
    }

    #[test]
    fn a_definition_reads_back_as_written() {
        let s = full_subscriber();
        // As a row holds it: the definition, both times, then the health columns.
        let mut row: Vec<Value<'_>> = definition(&s, s.created_ms).into();
        row.push(s.updated_ms.into());
        row.extend([Value::Int(20), "paused".into(), true.into(), Value::Int(15)]);
        assert_eq!(row.len(), READ);
        let mut want = s.clone();
        want.health = Health {
            disabled: Some(Disabled {
                at_ms: 20,
                reason: "paused".into(),
                by_operator: true,
            }),
            failing_since_ms: Some(15),
        };
        assert_eq!(decode(&Stored(row), 0).unwrap(), want);
    }

    #[test]
    fn an_unknown_name_or_a_null_is_an_error_not_a_default() {
        let s = full_subscriber();
        let row = |at: usize, v: Value<'static>| {
            let mut row: Vec<Value<'_>> = definition(&s, 1).into();
            row.extend([
                Value::Int(1),
                Value::Null,
                Value::Null,
                false.into(),
                Value::Null,
            ]);
            row[at] = v;
            Stored(row)
        };
        let lane = COLUMNS.iter().position(|c| c.name == "lane").unwrap();
        assert!(matches!(
            decode(&row(lane, "sideways".into()), 0),
            Err(LedgerError::Schema(_))
        ));
        assert!(matches!(
            decode(&row(0, Value::Null), 0),
            Err(LedgerError::Schema(_))
        ));
        assert!(decode(&row(lane, "edge".into()), 0).is_ok());
    }

    #[test]
    fn statements_name_the_definition_in_order() {
        let (insert, update) = (INSERT.postgres(), UPDATE.postgres());
        assert!(insert.starts_with("INSERT INTO subscribers (id, url, event_types,"));
        assert!(insert.ends_with(
            "customer_filter, created_ms, updated_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
             $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $19)"
        ));
        assert!(update.starts_with("UPDATE subscribers SET url = $2, event_types = $3,"));
        assert!(update.ends_with(
            "customer_filter = $18, updated_ms = $19 WHERE id = $1 AND deleted_ms IS NULL"
        ));
        // SQLite numbers a `$N` by its first use: there, `?N`.
        assert!(UPDATE
            .sqlite()
            .starts_with("UPDATE subscribers SET url = ?2, event_types = ?3,"));
        assert_eq!(COLUMNS[DEFINED].name, "created_ms");
        assert_eq!(COLUMNS[READ - 1].name, "failing_since_ms");
    }
}
