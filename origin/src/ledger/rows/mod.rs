//! Rows once: for each kind of table both backends keep (subscribers and their secrets,
//! customers, events, deliveries, attempts, the counters beside them), the one place that names
//! its columns, turns a model value into the values its statements bind and a row back into
//! the value. Pure: it builds text and values and reads cells; it runs nothing.
//!
//! A backend reads a row through [`Cells`] (implemented once per driver, in its own folder) and
//! binds [`Value`]s (each driver's `ToSql` for them is in its folder too). A statement that is
//! the same on both backends is written here once, as a [`Statement`].
//!
//! Each [`Table`] also lists every column the copy (`ledger/copy/`) carries, with what a ledger
//! from before the column reads instead, so that `fanout ledger copy` moves a new column with
//! no code of its own.

use std::borrow::Cow;

use super::error::LedgerError;

pub mod customers;
pub mod deliveries;
pub mod subscribers;
pub mod tables;

/// What a stored column holds. An integer is 64 bits on SQLite and 32 or 64 on PostgreSQL
/// (each driver's [`Cells`] reads either); a flag is PostgreSQL's `BOOLEAN`, SQLite's 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Int,
    Real,
    Flag,
}

/// One stored column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    /// What a SQLite ledger from before this column reads instead (an SQL expression over its
    /// row, as the migration that added the column fills it in); empty: every ledger the copy
    /// takes (schema 2 on) has it.
    pub before: &'static str,
}

/// A column every ledger has.
pub const fn col(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        kind,
        before: "",
    }
}

/// A column a later migration added: an older ledger reads `before` instead.
pub const fn added(name: &'static str, kind: Kind, before: &'static str) -> Column {
    Column { name, kind, before }
}

/// A table as both backends keep it: the columns the copy carries, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    /// Read in pages of `rowid`s (a large table); `false`: read at once (a small one, or one
    /// SQLite keeps `WITHOUT ROWID`).
    pub paged: bool,
}

impl Table {
    /// The first `n` columns' names, comma-separated (what a `SELECT` or an `INSERT` names).
    pub fn names(&self, n: usize) -> String {
        let names: Vec<&str> = self.columns[..n].iter().map(|c| c.name).collect();
        names.join(", ")
    }

    /// `$from, $from+1, …` for `n` parameters.
    pub fn placeholders(from: usize, n: usize) -> String {
        let p: Vec<String> = (from..from + n).map(|i| format!("${i}")).collect();
        p.join(", ")
    }
}

/// A statement both backends run, written once with its parameters numbered `$N`: PostgreSQL
/// takes that text; SQLite takes it numbered `?N` (it would number each `$N` by where it is
/// first used, not by its number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    postgres: String,
    sqlite: String,
}

impl Statement {
    /// `text` uses `$` for its parameters only.
    pub fn new(text: String) -> Statement {
        Statement {
            sqlite: text.replace('$', "?"),
            postgres: text,
        }
    }

    pub fn postgres(&self) -> &str {
        &self.postgres
    }

    pub fn sqlite(&self) -> &str {
        &self.sqlite
    }
}

/// One value a statement binds, as the column stores it (each driver's `ToSql` converts it to
/// the parameter's declared type: an `Int` into a 32-bit column is checked, never cut).
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Text(Cow<'a, str>),
    Int(i64),
    Real(f64),
    Flag(bool),
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(t: &'a str) -> Self {
        Value::Text(Cow::Borrowed(t))
    }
}

impl From<String> for Value<'_> {
    fn from(t: String) -> Self {
        Value::Text(Cow::Owned(t))
    }
}

impl From<i64> for Value<'_> {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<u32> for Value<'_> {
    fn from(n: u32) -> Self {
        Value::Int(i64::from(n))
    }
}

impl From<f64> for Value<'_> {
    fn from(x: f64) -> Self {
        Value::Real(x)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Self {
        Value::Flag(b)
    }
}

impl<'a, T: Into<Value<'a>>> From<Option<T>> for Value<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// A row's cells by position, as a driver reads them (`None`: NULL). Implemented once per
/// driver, in its backend's folder.
pub trait Cells {
    fn text(&self, i: usize) -> Result<Option<String>, LedgerError>;
    fn int(&self, i: usize) -> Result<Option<i64>, LedgerError>;
    fn real(&self, i: usize) -> Result<Option<f64>, LedgerError>;
    fn flag(&self, i: usize) -> Result<Option<bool>, LedgerError>;
}

/// Reads a row's cells in their order, from a starting column: a decoder reads its table's
/// columns one after the other, as its column list names them, with no position written down.
pub struct Reader<'r, C: Cells + ?Sized> {
    cells: &'r C,
    next: usize,
}

impl<C: Cells + ?Sized> std::fmt::Debug for Reader<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reader at column {}", self.next)
    }
}

fn null(i: usize) -> LedgerError {
    LedgerError::Schema(format!("column {i} is NULL where a value is stored"))
}

impl<'r, C: Cells + ?Sized> Reader<'r, C> {
    pub fn new(cells: &'r C, from: usize) -> Self {
        Reader { cells, next: from }
    }

    /// The position of the next cell.
    pub fn position(&self) -> usize {
        self.next
    }

    fn take(&mut self) -> usize {
        self.next += 1;
        self.next - 1
    }

    pub fn opt_text(&mut self) -> Result<Option<String>, LedgerError> {
        let i = self.take();
        self.cells.text(i)
    }

    pub fn text(&mut self) -> Result<String, LedgerError> {
        let i = self.take();
        self.cells.text(i)?.ok_or_else(|| null(i))
    }

    pub fn opt_int(&mut self) -> Result<Option<i64>, LedgerError> {
        let i = self.take();
        self.cells.int(i)
    }

    pub fn int(&mut self) -> Result<i64, LedgerError> {
        let i = self.take();
        self.cells.int(i)?.ok_or_else(|| null(i))
    }

    pub fn real(&mut self) -> Result<f64, LedgerError> {
        let i = self.take();
        self.cells.real(i)?.ok_or_else(|| null(i))
    }

    pub fn flag(&mut self) -> Result<bool, LedgerError> {
        let i = self.take();
        self.cells.flag(i)?.ok_or_else(|| null(i))
    }

    /// A text column holding one of an enum's names.
    pub fn name<T>(&mut self, parse: fn(&str) -> Option<T>) -> Result<T, LedgerError> {
        let i = self.next;
        let text = self.text()?;
        parse(&text)
            .ok_or_else(|| LedgerError::Schema(format!("unknown value {text:?} in column {i}")))
    }
}

/// A stored count (a burst, a cap, a weight: at least 1) back as the model's.
pub fn count(n: i64) -> u32 {
    n.clamp(1, i64::from(u32::MAX)) as u32
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row as a list of the values stored, read as a driver would.
    pub(crate) struct Stored<'a>(pub Vec<Value<'a>>);

    fn wrong(i: usize) -> LedgerError {
        LedgerError::Schema(format!("column {i} holds another kind"))
    }

    impl Cells for Stored<'_> {
        fn text(&self, i: usize) -> Result<Option<String>, LedgerError> {
            match &self.0[i] {
                Value::Null => Ok(None),
                Value::Text(t) => Ok(Some(t.to_string())),
                _ => Err(wrong(i)),
            }
        }

        fn int(&self, i: usize) -> Result<Option<i64>, LedgerError> {
            match &self.0[i] {
                Value::Null => Ok(None),
                Value::Int(n) => Ok(Some(*n)),
                _ => Err(wrong(i)),
            }
        }

        fn real(&self, i: usize) -> Result<Option<f64>, LedgerError> {
            match &self.0[i] {
                Value::Null => Ok(None),
                Value::Real(x) => Ok(Some(*x)),
                _ => Err(wrong(i)),
            }
        }

        fn flag(&self, i: usize) -> Result<Option<bool>, LedgerError> {
            match &self.0[i] {
                Value::Null => Ok(None),
                Value::Flag(b) => Ok(Some(*b)),
                _ => Err(wrong(i)),
            }
        }
    }

    #[test]
    fn counts_stay_at_least_one_and_within_u32() {
        for (stored, want) in [(0, 1), (-5, 1), (1, 1), (7, 7), (i64::MAX, u32::MAX)] {
            assert_eq!(count(stored), want, "{stored}");
        }
    }

    #[test]
    fn placeholders_count_from_where_they_start() {
        assert_eq!(Table::placeholders(1, 3), "$1, $2, $3");
        assert_eq!(Table::placeholders(4, 1), "$4");
    }
}
