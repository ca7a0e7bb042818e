//! The `customers` rows: their columns, a [`Customer`] as the values its insert binds, and a
//! row back as a [`Customer`].

use std::sync::LazyLock;

use super::{col, count, Cells, Column, Kind, Reader, Statement, Table, Value};
use crate::customer::Customer;
use crate::ledger::error::LedgerError;

use Kind::{Int, Text};

pub const COLUMNS: &[Column] = &[
    col("id", Text),
    col("weight", Int),
    col("max_in_flight", Int),
    col("portal_nonce", Text),
    col("created_ms", Int),
    col("updated_ms", Int),
];

pub const TABLE: Table = Table {
    name: "customers",
    columns: COLUMNS,
    paged: true,
};

/// `id, weight, …`: the columns [`decode`] reads, for a `SELECT`.
pub static SELECT: LazyLock<String> = LazyLock::new(|| TABLE.names(COLUMNS.len()));

/// Insert a new customer, binding [`values`]: nothing (no row changed) when the id is taken.
pub static INSERT: LazyLock<Statement> = LazyLock::new(|| {
    Statement::new(format!(
        "INSERT INTO customers ({}) VALUES ({}) ON CONFLICT (id) DO NOTHING",
        *SELECT,
        Table::placeholders(1, COLUMNS.len())
    ))
});

/// A customer as [`INSERT`] binds it, in [`COLUMNS`]' order.
pub fn values(c: &Customer) -> [Value<'_>; 6] {
    [
        c.id.as_str().into(),
        c.weight.into(),
        c.max_in_flight.into(),
        c.portal_nonce.as_str().into(),
        c.created_ms.into(),
        c.updated_ms.into(),
    ]
}

/// A row of [`SELECT`]'s columns, from its column `from`, back as a customer.
pub fn decode(cells: &(impl Cells + ?Sized), from: usize) -> Result<Customer, LedgerError> {
    let r = &mut Reader::new(cells, from);
    Ok(Customer {
        id: r.text()?,
        weight: count(r.int()?),
        max_in_flight: r.opt_int()?.map(count),
        portal_nonce: r.text()?,
        created_ms: r.int()?,
        updated_ms: r.int()?,
    })
}
