//! The rows PostgreSQL answers with, read into the contract's types, and the values its
//! statements take: shared by the files beside this one; tokio_postgres's side of
//! `ledger/rows/` (a row's [`Cells`], the [`Value`]s a statement binds). No statement runs here.

use fanout_core::bucket::Bucket;
use fanout_core::limiter::LimiterState;
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::Row;

use crate::ledger::rows::{Cells, Value};
use crate::ledger::LedgerError;

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

impl Cells for Row {
    fn text(&self, i: usize) -> Result<Option<String>, LedgerError> {
        Ok(self.try_get(i)?)
    }

    /// A 64-bit column, or a 32- or 16-bit one widened.
    fn int(&self, i: usize) -> Result<Option<i64>, LedgerError> {
        let ty = self.columns().get(i).map(|c| c.type_());
        Ok(match ty {
            Some(&Type::INT4) => self.try_get::<_, Option<i32>>(i)?.map(i64::from),
            Some(&Type::INT2) => self.try_get::<_, Option<i16>>(i)?.map(i64::from),
            _ => self.try_get(i)?,
        })
    }

    fn real(&self, i: usize) -> Result<Option<f64>, LedgerError> {
        Ok(self.try_get(i)?)
    }

    fn flag(&self, i: usize) -> Result<Option<bool>, LedgerError> {
        Ok(self.try_get(i)?)
    }
}

/// A value as the parameter's declared type: an integer into a 32- or 16-bit column is
/// checked (out of range is an error, never cut); otherwise each as its own type is.
impl ToSql for Value<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Text(t) => t.as_ref().to_sql_checked(ty, out),
            Value::Int(n) => match *ty {
                Type::INT4 => i32::try_from(*n)?.to_sql_checked(ty, out),
                Type::INT2 => i16::try_from(*n)?.to_sql_checked(ty, out),
                _ => n.to_sql_checked(ty, out),
            },
            Value::Real(x) => x.to_sql_checked(ty, out),
            Value::Flag(b) => b.to_sql_checked(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// `values` as a statement's parameters.
pub(super) fn bind<'v>(values: &'v [Value<'_>]) -> Vec<&'v (dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}
