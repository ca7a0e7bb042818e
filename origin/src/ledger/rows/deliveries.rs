//! The `deliveries` and `attempts` rows: the columns `fanout ledger copy` carries (a
//! delivery's lease is not among them: the copy brings every delivery over unleased), and a
//! delivery and its attempts as the API shows them, read back from a row.

use std::sync::LazyLock;

use super::{added, col, Cells, Column, Kind, Reader, Table};
use crate::ledger::deliveries::{AttemptRecordView, DeliveryView};
use crate::ledger::error::LedgerError;
use crate::model::{delivery_public_id, AttemptOutcome, Lane, Status};

use Kind::{Int, Text};

/// `status` and `next_attempt_ms` are where [`DELIVERY_STATUS`] and [`DELIVERY_DUE`] say.
pub const DELIVERIES: Table = Table {
    name: "deliveries",
    columns: DELIVERY_COLUMNS,
    paged: true,
};

const DELIVERY_COLUMNS: &[Column] = &[
    col("id", Int),
    col("subscriber_id", Text),
    col("event_id", Text),
    col("status", Text),
    col("attempts", Int),
    col("next_attempt_ms", Int),
    col("last_error", Text),
    col("created_ms", Int),
    col("updated_ms", Int),
    // A ledger from before sequence numbers has none: the copy numbers them as the migration
    // that added them does.
    added("sequence", Int, "0"),
    added("ordering_key", Text, "NULL"),
    added("previous_sequence", Int, "NULL"),
];

/// Where [`DELIVERIES`] has a delivery's status and its due time.
pub const DELIVERY_STATUS: usize = 3;
pub const DELIVERY_DUE: usize = 5;

pub const ATTEMPTS: Table = Table {
    name: "attempts",
    columns: &[
        col("id", Int),
        col("delivery_id", Int),
        col("attempt", Int),
        col("at_ms", Int),
        col("lane", Text),
        col("outcome", Text),
        col("status", Int),
        col("latency_ms", Int),
        col("response_body", Text),
        col("error", Text),
    ],
    paged: true,
};

/// A delivery as the API shows it, from `deliveries d LEFT JOIN events e ON e.id = d.event_id`
/// (its event's type: empty once retention removed the event): what [`decode_delivery`] reads.
pub const DELIVERY_VIEW: &str =
    "d.id, d.subscriber_id, d.event_id, COALESCE(e.type, ''), d.status, \
     d.attempts, d.next_attempt_ms, d.last_error, d.created_ms, d.updated_ms, d.sequence, \
     d.ordering_key, d.previous_sequence";

/// A row of [`DELIVERY_VIEW`]'s columns, from its column `from`, back as the API's view (no
/// attempts).
pub fn decode_delivery(
    cells: &(impl Cells + ?Sized),
    from: usize,
) -> Result<DeliveryView, LedgerError> {
    let r = &mut Reader::new(cells, from);
    let id = delivery_public_id(r.int()?);
    let subscriber_id = r.text()?;
    let event_id = r.text()?;
    let event_type = r.text()?;
    let status = r.name(Status::parse)?;
    let attempt_count = r.int()?.clamp(0, i64::from(u32::MAX)) as u32;
    let next = r.int()?;
    let view = DeliveryView {
        id,
        subscriber_id,
        event_id,
        event_type,
        next_attempt_at_ms: (status == Status::Pending).then_some(next),
        status,
        attempt_count,
        last_error: r.opt_text()?,
        created_at_ms: r.int()?,
        updated_at_ms: r.int()?,
        sequence: r.int()?.max(0) as u64,
        ordering_key: None,
        previous_sequence: None,
        held: false,
        attempts: None,
    };
    Ok(view.ordered(r.opt_text()?, r.opt_int()?))
}

/// `attempt, at_ms, …`: a delivery's attempt as [`decode_attempt`] reads it (the
/// [`ATTEMPTS`] columns after its ids).
pub static ATTEMPT_VIEW: LazyLock<String> = LazyLock::new(|| names(&ATTEMPTS.columns[2..]));

fn names(columns: &[Column]) -> String {
    let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
    names.join(", ")
}

/// A row of [`ATTEMPT_VIEW`]'s columns back as the API's view of one attempt.
pub fn decode_attempt(cells: &(impl Cells + ?Sized)) -> Result<AttemptRecordView, LedgerError> {
    let r = &mut Reader::new(cells, 0);
    Ok(AttemptRecordView {
        attempt: r.int()?.clamp(0, i64::from(u32::MAX)) as u32,
        at_ms: r.int()?,
        lane: r.name(Lane::parse)?,
        outcome: r.name(AttemptOutcome::parse)?,
        status: r.opt_int()?.and_then(|s| u16::try_from(s).ok()),
        latency_ms: r.opt_int()?,
        response_body: r.opt_text()?,
        error: r.opt_text()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::rows::tests::Stored;
    use crate::ledger::rows::Value;

    fn row(status: &'static str, key: Option<&'static str>) -> Stored<'static> {
        Stored(vec![
            Value::Int(7),
            "s".into(),
            "e".into(),
            "t".into(),
            status.into(),
            Value::Int(2),
            Value::Int(500),
            Value::Null,
            Value::Int(1),
            Value::Int(3),
            Value::Int(4),
            key.into(),
            Value::from(key.map(|_| 3i64)),
        ])
    }

    #[test]
    fn a_delivery_reads_its_due_time_only_while_pending() {
        let pending = decode_delivery(&row("pending", None), 0).unwrap();
        assert_eq!(pending.id, "dlv_7");
        assert_eq!(pending.next_attempt_at_ms, Some(500));
        assert_eq!((pending.attempt_count, pending.sequence), (2, 4));
        let sent = decode_delivery(&row("sent", Some("k")), 0).unwrap();
        assert_eq!(sent.next_attempt_at_ms, None);
        assert_eq!(sent.ordering_key.as_deref(), Some("k"));
        assert_eq!(sent.previous_sequence, Some(3));
        assert!(matches!(
            decode_delivery(&row("lost", None), 0),
            Err(LedgerError::Schema(_))
        ));
    }

    #[test]
    fn an_attempts_view_is_the_attempts_columns_after_its_ids() {
        assert_eq!(
            *ATTEMPT_VIEW,
            "attempt, at_ms, lane, outcome, status, latency_ms, response_body, error"
        );
        let a = decode_attempt(&Stored(vec![
            Value::Int(1),
            Value::Int(9),
            "origin".into(),
            "failed".into(),
            Value::Int(70_000),
            Value::Null,
            Value::Null,
            "boom".into(),
        ]))
        .unwrap();
        // A status no HTTP answer has reads as none.
        assert_eq!(
            (a.attempt, a.status, a.error.as_deref()),
            (1, None, Some("boom"))
        );
    }
}
