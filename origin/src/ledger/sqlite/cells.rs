//! rusqlite's side of the rows (`ledger/rows/`): a row's cells read by [`Cells`], the
//! [`Value`]s a statement binds, and a statement's rows decoded by a `rows` decoder.

use rusqlite::types::{ToSqlOutput, Value as Owned, ValueRef};
use rusqlite::{CachedStatement, Params, Row};

use crate::ledger::error::LedgerError;
use crate::ledger::rows::{Cells, Value};

impl Cells for Row<'_> {
    fn text(&self, i: usize) -> Result<Option<String>, LedgerError> {
        Ok(self.get(i)?)
    }

    fn int(&self, i: usize) -> Result<Option<i64>, LedgerError> {
        Ok(self.get(i)?)
    }

    fn real(&self, i: usize) -> Result<Option<f64>, LedgerError> {
        Ok(self.get(i)?)
    }

    fn flag(&self, i: usize) -> Result<Option<bool>, LedgerError> {
        Ok(self.get(i)?)
    }
}

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(Owned::Null),
            Value::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
            Value::Int(n) => ToSqlOutput::Owned(Owned::Integer(*n)),
            Value::Real(x) => ToSqlOutput::Owned(Owned::Real(*x)),
            Value::Flag(b) => ToSqlOutput::Owned(Owned::Integer(i64::from(*b))),
        })
    }
}

/// Every row `st` answers for `params`, each decoded by `decode`.
pub(super) fn decode_all<T>(
    st: &mut CachedStatement<'_>,
    params: impl Params,
    decode: impl Fn(&Row<'_>) -> Result<T, LedgerError>,
) -> Result<Vec<T>, LedgerError> {
    let mut rows = st.query(params)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(decode(r)?);
    }
    Ok(out)
}

/// The first row `st` answers for `params`, decoded by `decode`; `None` when there is none.
pub(super) fn decode_one<T>(
    st: &mut CachedStatement<'_>,
    params: impl Params,
    decode: impl FnOnce(&Row<'_>) -> Result<T, LedgerError>,
) -> Result<Option<T>, LedgerError> {
    let mut rows = st.query(params)?;
    rows.next()?.map(decode).transpose()
}

#[cfg(test)]
mod tests {
    use super::super::customers::{create_customer, get_customer};
    use super::super::health::set_disabled;
    use super::super::subscribers::{create_subscriber, get_subscriber, update_subscriber};
    use super::super::test_db;
    use crate::customer::Customer;
    use crate::ledger::rows::subscribers::tests::full_subscriber;
    use crate::model::{Disabled, Health, Lane, Payload};

    #[test]
    fn a_full_subscriber_and_customer_come_back_as_stored() {
        let c = test_db();
        let mut s = full_subscriber();
        create_subscriber(&c, &s, "whsec_x").unwrap();
        let got = get_subscriber(&c, &s.id).unwrap();
        assert_eq!(got.secrets.len(), 1);
        s.secrets = got.secrets.clone();
        assert_eq!(got, s);

        // Changed, every field of the definition at another value; then disabled.
        s.url = "https://example.org/h".into();
        s.event_types = vec!["*".into()];
        s.limits.burst = 9;
        s.lane = Lane::Origin;
        s.legacy_signature = false;
        s.customer = None;
        s.filter = None;
        s.payload = Payload::Full;
        s.ordering_key = Some("/k".into());
        s.propagate_trace = false;
        s.batch = None;
        s.updated_ms = 30;
        update_subscriber(&c, &s).unwrap();
        let disabled = Disabled {
            at_ms: 31,
            reason: "by hand".into(),
            by_operator: true,
        };
        set_disabled(&c, &s.id, Some(&disabled)).unwrap();
        c.execute("UPDATE subscribers SET failing_since_ms = 29", [])
            .unwrap();
        s.health = Health {
            disabled: Some(disabled),
            failing_since_ms: Some(29),
        };
        assert_eq!(get_subscriber(&c, &s.id).unwrap(), s);

        let cu = Customer {
            id: "acme".into(),
            weight: 7,
            max_in_flight: Some(40),
            portal_nonce: "n".into(),
            created_ms: 3,
            updated_ms: 4,
        };
        create_customer(&c, &cu).unwrap();
        assert_eq!(get_customer(&c, "acme").unwrap(), cu);
    }
}
