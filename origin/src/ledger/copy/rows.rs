//! `fanout ledger copy`'s tables, each decoded from the SQLite snapshot by rusqlite's
//! [`Cells`] and encoded into the PostgreSQL copy's transaction, by the table's column list in
//! `ledger/rows/` (so a column added there is copied with no code here): by pages of rowids,
//! one `unnest` per column per page. A column an older ledger lacks reads as its `before`.

use std::collections::HashSet;

use deadpool_postgres::Transaction;
use rusqlite::Connection;
use tokio_postgres::types::ToSql;

use crate::ledger::error::LedgerError;
use crate::ledger::rows::{Cells, Kind, Table};

/// Rows read from SQLite and written to PostgreSQL at a time.
const CHUNK: i64 = 5_000;

/// What was copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    pub customers: u64,
    pub subscribers: u64,
    pub secrets: u64,
    pub events: u64,
    pub deliveries: u64,
    /// Deliveries that were in flight and come over pending.
    pub requeued: u64,
    pub attempts: u64,
}

/// One column of a page of rows, as PostgreSQL takes it in an array.
#[derive(Debug)]
pub(super) enum Cut {
    Text(Vec<Option<String>>),
    Int(Vec<Option<i64>>),
    Real(Vec<Option<f64>>),
    Flag(Vec<Option<bool>>),
}

impl Cut {
    fn of(kind: Kind) -> Cut {
        match kind {
            Kind::Text => Cut::Text(Vec::new()),
            Kind::Int => Cut::Int(Vec::new()),
            Kind::Real => Cut::Real(Vec::new()),
            Kind::Flag => Cut::Flag(Vec::new()),
        }
    }

    fn push(&mut self, r: &impl Cells, i: usize) -> Result<(), LedgerError> {
        match self {
            Cut::Text(v) => v.push(r.text(i)?),
            Cut::Int(v) => v.push(r.int(i)?),
            Cut::Real(v) => v.push(r.real(i)?),
            Cut::Flag(v) => v.push(r.flag(i)?),
        }
        Ok(())
    }

    /// The array type its parameter is cast to (PostgreSQL assigns a `bigint` to an `INTEGER`
    /// column, checked).
    fn array_type(&self) -> &'static str {
        match self {
            Cut::Text(_) => "text[]",
            Cut::Int(_) => "bigint[]",
            Cut::Real(_) => "float8[]",
            Cut::Flag(_) => "boolean[]",
        }
    }

    fn param(&self) -> &(dyn ToSql + Sync) {
        match self {
            Cut::Text(v) => v,
            Cut::Int(v) => v,
            Cut::Real(v) => v,
            Cut::Flag(v) => v,
        }
    }
}

/// Copy `table` from the source into the target whole; `adjust` sees each page (by column, in
/// the table's order) before it is written. Returns how many rows; none when the source is
/// from before the table.
pub(super) async fn copy_table(
    src: &Connection,
    tx: &Transaction<'_>,
    table: &Table,
    mut adjust: impl FnMut(&mut [Cut]),
    progress: &mut impl FnMut(&str),
) -> Result<u64, LedgerError> {
    let has: HashSet<String> = src
        .prepare("SELECT name FROM pragma_table_info(?1)")?
        .query_map([table.name], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if has.is_empty() {
        return Ok(0);
    }
    let mut reads = Vec::new();
    for c in table.columns {
        if has.contains(c.name) {
            reads.push(c.name);
        } else if !c.before.is_empty() {
            reads.push(c.before);
        } else {
            return Err(LedgerError::Schema(format!(
                "the SQLite ledger's {} has no {}",
                table.name, c.name
            )));
        }
    }
    let reads = reads.join(", ");
    let select = if table.paged {
        format!(
            "SELECT rowid, {reads} FROM {} WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
            table.name
        )
    } else {
        format!("SELECT 0, {reads} FROM {}", table.name)
    };
    let casts: Vec<String> = table
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("${}::{}", i + 1, Cut::of(c.kind).array_type()))
        .collect();
    let insert = format!(
        "INSERT INTO {} ({}) SELECT * FROM unnest({})",
        table.name,
        table.names(table.columns.len()),
        casts.join(", ")
    );
    let total: i64 = src.query_row(&format!("SELECT COUNT(*) FROM {}", table.name), [], |r| {
        r.get(0)
    })?;
    let mut done = 0u64;
    let mut after = 0i64;
    loop {
        let mut cuts: Vec<Cut> = table.columns.iter().map(|c| Cut::of(c.kind)).collect();
        let mut st = src.prepare_cached(&select)?;
        let mut rows = if table.paged {
            st.query([after, CHUNK])?
        } else {
            st.query([])?
        };
        let mut n = 0u64;
        while let Some(r) = rows.next()? {
            after = r.get(0)?;
            for (i, cut) in cuts.iter_mut().enumerate() {
                cut.push(r, i + 1)?;
            }
            n += 1;
        }
        if n == 0 {
            break;
        }
        adjust(&mut cuts);
        let params: Vec<&(dyn ToSql + Sync)> = cuts.iter().map(Cut::param).collect();
        tx.execute(&insert, &params).await?;
        done += n;
        if table.paged {
            progress(&format!("{}: {done}/{total}", table.name));
        } else {
            break;
        }
    }
    Ok(done)
}

/// A page of deliveries: those in flight come over pending, due `now_ms` (their lease died
/// with the daemon). Returns how many.
pub(super) fn requeue(cuts: &mut [Cut], status: usize, due: usize, now_ms: i64) -> u64 {
    let mut requeued = 0;
    let Ok([Cut::Text(statuses), Cut::Int(dues)]) = cuts.get_disjoint_mut([status, due]) else {
        return 0;
    };
    for (s, d) in statuses.iter_mut().zip(dues.iter_mut()) {
        if s.as_deref() == Some("in_flight") {
            *s = Some("pending".into());
            *d = Some(now_ms);
            requeued += 1;
        }
    }
    requeued
}

/// Whether the source's `table` has `column` (it may be from an older schema).
pub(super) fn has_column(src: &Connection, table: &str, column: &str) -> Result<bool, LedgerError> {
    Ok(src.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
        [table, column],
        |r| r.get(0),
    )?)
}
