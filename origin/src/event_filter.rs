//! Content filters (pure): a subscriber's `"filter"`, a JSON object compiled once into a
//! [`Filter`] and matched against each event body at fan-out. An event its filter refuses gets
//! no delivery for that subscriber. No I/O, no clock, no randomness.
//!
//! # The language
//!
//! A filter is a JSON object. Each key is a condition; an object matches when all its
//! conditions do (an empty object matches every event).
//!
//! - A plain key (`"amount"`) is a field of the value at hand: its condition applies to that
//!   field. A condition that is an object is again a filter object, applied to the field (so
//!   `{"data": {"user": {"tier": "gold"}}}` reaches `data.user.tier`); any other value (a
//!   string, number, boolean, `null` or array) means `{"$eq": value}`. An object is never a
//!   literal: compare whole objects with `$eq`.
//! - `$eq`, `$neq`: equality to any JSON value (deep; numbers by value, `1 == 1.0`).
//! - `$gt`, `$gte`, `$lt`, `$lte`: a number; they match only numbers.
//! - `$in`, `$nin`: a list of JSON values: equal to one of them, to none of them.
//! - `$exist`: `true` when the field is present (even `null`), `false` when it is missing.
//! - `$startsWith`, `$endsWith`: a string; they match only strings.
//! - `$or`, `$and`, `$not`: a non-empty list of filter objects applied to the same value: any
//!   of them matches, all of them match, none of them matches.
//!
//! Any other key starting with `$` is refused.
//!
//! # Missing fields, arrays, numbers
//!
//! As in MongoDB, a path yields every value it reaches, and a condition holds when one of them
//! satisfies it:
//!
//! - A missing field (or a path through something that is not an object) yields nothing: it
//!   satisfies no `$eq` (not even `null`), no comparison, no `$in`, no string test, and
//!   `$exist: true`; it satisfies `$exist: false`, `$neq` and `$nin`.
//! - A field that is an array satisfies a comparison when the array itself does (`$eq` an equal
//!   array) or when one of its elements does: `{"tags": "hot"}` matches `"tags": ["new", "hot"]`.
//!   A key below an array reaches into each of its objects: `{"items": {"sku": "A1"}}` matches
//!   when any item's `sku` is `"A1"`. One level only: an array inside an array is a value.
//! - `$neq` and `$nin` are the negation of `$eq` and `$in` over everything the path yields: no
//!   element equal, not just one that differs (`{"tags": {"$neq": "hot"}}` refuses
//!   `["new", "hot"]`).
//! - Numbers compare by value whatever their JSON form: integers (signed or unsigned, 64 bits)
//!   exactly against each other, and an integer against a float exactly as well (no rounding
//!   of large integers to `f64`).
//! - Strings compare by their code points, exactly: no case folding, no Unicode normalisation.
//!
//! # Limits
//!
//! [`MAX_DEPTH`] nested objects or lists, [`MAX_CLAUSES`] conditions, [`MAX_LIST`] values in
//! one `$in`/`$nin`, [`MAX_FILTER_BYTES`] of JSON. A refused filter's [`FilterError`] names the
//! place, as a path from `filter` with JSON Pointer escapes: `filter/amount/$gt: expected a
//! number`.
//!
//! # Cost
//!
//! Matching costs steps: a value a condition visits, a node of a deep comparison or of a value
//! looked up in an `$in`/`$nin` list (a set: one lookup, not one comparison per listed value).
//! A match is at most [`MAX_CLAUSES`] conditions times the body's values; [`Filter::matches_within`]
//! stops after a given number of steps ([`TooCostly`]), which is how `POST /v1/filters/test`
//! bounds what one call may cost.

use std::cell::Cell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Number, Value};

mod projection;
mod set;
pub(crate) use projection::Key;
pub use projection::Projection;
use set::ValueSet;

/// Most levels of nested objects and lists in a filter (its own object is level 1).
pub const MAX_DEPTH: usize = 8;
/// Most conditions (keys, plain or `$`) in one filter.
pub const MAX_CLAUSES: usize = 100;
/// Most values in one `$in` or `$nin` list.
pub const MAX_LIST: usize = 256;
/// Most bytes of a filter written as compact JSON.
pub const MAX_FILTER_BYTES: usize = 16 * 1024;

/// Why a filter is refused, and where: `path` from `filter`, e.g. `filter/amount/$gt`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FilterError {
    pub path: String,
    pub message: String,
}

/// A match that would take more than the steps it was given ([`Filter::matches_within`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("matching this filter against this event takes more than {0} steps")]
pub struct TooCostly(pub u64);

/// The steps a match has left.
#[derive(Debug)]
struct Meter(Cell<u64>);

/// A match ran out of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spent;

impl Meter {
    fn new(steps: u64) -> Meter {
        Meter(Cell::new(steps))
    }

    fn unlimited() -> Meter {
        Meter::new(u64::MAX)
    }

    /// Take `n` steps, or fail when fewer are left.
    fn step(&self, n: u64) -> Result<(), Spent> {
        let left = self.0.get();
        if left < n {
            return Err(Spent);
        }
        self.0.set(left - n);
        Ok(())
    }
}

/// A compiled filter.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    root: Node,
}

/// A filter object: all its conditions.
#[derive(Debug, Clone, PartialEq)]
struct Node(Vec<Cond>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Gt,
    Gte,
    Lt,
    Lte,
}

#[derive(Debug, Clone, PartialEq)]
enum Cond {
    Field(String, Node),
    Eq(Value),
    Neq(Value),
    Cmp(Cmp, Number),
    In(ValueSet),
    Nin(ValueSet),
    Exist(bool),
    StartsWith(String),
    EndsWith(String),
    Or(Vec<Node>),
    And(Vec<Node>),
    Not(Vec<Node>),
}

impl Filter {
    /// Compile a filter as the API receives it.
    pub fn compile(v: &Value) -> Result<Filter, FilterError> {
        let bytes = serde_json::to_string(v).map(|s| s.len()).unwrap_or(0);
        if bytes > MAX_FILTER_BYTES {
            return Err(err(
                "filter",
                format!("{bytes} bytes; the limit is {MAX_FILTER_BYTES}"),
            ));
        }
        let mut c = Compiler { clauses: 0 };
        let root = match v {
            Value::Object(m) => c.node(m, "filter", 1)?,
            _ => return Err(err("filter", "expected an object".into())),
        };
        Ok(Filter { root })
    }

    /// Compile a filter from its stored text.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| err("filter", format!("not JSON: {e}")))?;
        Filter::compile(&v)
    }

    /// Does this event body match? (Ingest's match: as many steps as it takes, bounded by
    /// the filter's and the body's sizes.)
    pub fn matches(&self, event: &Value) -> bool {
        self.root
            .holds(&[event], &Meter::unlimited())
            .unwrap_or(false)
    }

    /// Does this event body match, within `steps` steps (see the module's "Cost")?
    pub fn matches_within(&self, event: &Value, steps: u64) -> Result<bool, TooCostly> {
        self.root
            .holds(&[event], &Meter::new(steps))
            .map_err(|Spent| TooCostly(steps))
    }

    /// What of an event body this filter can see: a body read through it (or through a wider
    /// projection) matches as the whole body does.
    pub fn projection(&self) -> Projection {
        Projection::of(&self.root)
    }
}

fn err(path: &str, message: String) -> FilterError {
    FilterError {
        path: path.to_string(),
        message,
    }
}

/// `path/key`, the key escaped as in a JSON Pointer (`~` → `~0`, `/` → `~1`).
fn child(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

struct Compiler {
    clauses: usize,
}

impl Compiler {
    fn node(
        &mut self,
        m: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Node, FilterError> {
        if depth > MAX_DEPTH {
            return Err(err(path, format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let mut conds = Vec::with_capacity(m.len());
        for (k, v) in m {
            let at = child(path, k);
            self.clauses += 1;
            if self.clauses > MAX_CLAUSES {
                return Err(err(&at, format!("more than {MAX_CLAUSES} conditions")));
            }
            conds.push(self.cond(k, v, &at, depth)?);
        }
        Ok(Node(conds))
    }

    fn cond(&mut self, k: &str, v: &Value, at: &str, depth: usize) -> Result<Cond, FilterError> {
        let number = || match v {
            Value::Number(n) => Ok(n.clone()),
            _ => Err(err(at, "expected a number".into())),
        };
        let string = || match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(err(at, "expected a string".into())),
        };
        Ok(match k {
            "$eq" => Cond::Eq(literal(v, at, depth)?),
            "$neq" => Cond::Neq(literal(v, at, depth)?),
            "$gt" => Cond::Cmp(Cmp::Gt, number()?),
            "$gte" => Cond::Cmp(Cmp::Gte, number()?),
            "$lt" => Cond::Cmp(Cmp::Lt, number()?),
            "$lte" => Cond::Cmp(Cmp::Lte, number()?),
            "$in" => Cond::In(ValueSet::of(&list(v, at, depth)?)),
            "$nin" => Cond::Nin(ValueSet::of(&list(v, at, depth)?)),
            "$exist" => match v {
                Value::Bool(b) => Cond::Exist(*b),
                _ => return Err(err(at, "expected true or false".into())),
            },
            "$startsWith" => Cond::StartsWith(string()?),
            "$endsWith" => Cond::EndsWith(string()?),
            "$or" => Cond::Or(self.nodes(v, at, depth)?),
            "$and" => Cond::And(self.nodes(v, at, depth)?),
            "$not" => Cond::Not(self.nodes(v, at, depth)?),
            _ if k.starts_with('$') => {
                return Err(err(
                    at,
                    format!(
                        "unknown operator {k:?} (known: $eq $neq $gt $gte $lt $lte $in $nin \
                         $exist $startsWith $endsWith $or $and $not)"
                    ),
                ))
            }
            _ => Cond::Field(
                k.to_string(),
                match v {
                    Value::Object(m) => self.node(m, at, depth + 1)?,
                    other => Node(vec![Cond::Eq(literal(other, at, depth)?)]),
                },
            ),
        })
    }

    /// The filter objects of `$or`, `$and`, `$not`.
    fn nodes(&mut self, v: &Value, at: &str, depth: usize) -> Result<Vec<Node>, FilterError> {
        let items = match v {
            Value::Array(a) if !a.is_empty() => a,
            _ => {
                return Err(err(
                    at,
                    "expected a non-empty list of filter objects".into(),
                ))
            }
        };
        if depth + 1 > MAX_DEPTH {
            return Err(err(at, format!("nested deeper than {MAX_DEPTH} levels")));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let here = format!("{at}/{i}");
                match item {
                    Value::Object(m) => self.node(m, &here, depth + 2),
                    _ => Err(err(&here, "expected a filter object".into())),
                }
            })
            .collect()
    }
}

/// A literal value (of `$eq`, `$neq`, `$in`, `$nin`, or a plain key), within the depth limit.
fn literal(v: &Value, at: &str, depth: usize) -> Result<Value, FilterError> {
    if depth + value_depth(v) > MAX_DEPTH {
        return Err(err(at, format!("nested deeper than {MAX_DEPTH} levels")));
    }
    Ok(v.clone())
}

fn list(v: &Value, at: &str, depth: usize) -> Result<Vec<Value>, FilterError> {
    match v {
        Value::Array(a) if a.len() > MAX_LIST => Err(err(
            at,
            format!("{} values; the limit is {MAX_LIST}", a.len()),
        )),
        Value::Array(a) => {
            literal(v, at, depth)?;
            Ok(a.clone())
        }
        _ => Err(err(at, "expected a list".into())),
    }
}

/// Levels of arrays and objects in a value (a scalar: 0).
fn value_depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(value_depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

impl Node {
    /// Do the values a path yields (none: missing) satisfy every condition?
    fn holds(&self, at: &[&Value], m: &Meter) -> Result<bool, Spent> {
        for c in &self.0 {
            if !c.holds(at, m)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Cond {
    fn holds(&self, at: &[&Value], m: &Meter) -> Result<bool, Spent> {
        Ok(match self {
            Cond::Field(k, node) => {
                let mut below: Vec<&Value> = Vec::new();
                for v in at {
                    m.step(1)?;
                    match v {
                        Value::Object(o) => below.extend(o.get(k)),
                        Value::Array(items) => {
                            m.step(items.len() as u64)?;
                            below.extend(items.iter().filter_map(|i| i.as_object()?.get(k)))
                        }
                        _ => {}
                    }
                }
                node.holds(&below, m)?
            }
            Cond::Eq(x) => any(at, m, |v| equal(v, x, m))?,
            Cond::Neq(x) => !any(at, m, |v| equal(v, x, m))?,
            Cond::Cmp(op, x) => any(at, m, |v| {
                Ok(match v {
                    Value::Number(n) => {
                        let o = cmp_numbers(n, x);
                        match op {
                            Cmp::Gt => o == Ordering::Greater,
                            Cmp::Gte => o != Ordering::Less,
                            Cmp::Lt => o == Ordering::Less,
                            Cmp::Lte => o != Ordering::Greater,
                        }
                    }
                    _ => false,
                })
            })?,
            Cond::In(xs) => any(at, m, |v| xs.contains(v, m))?,
            Cond::Nin(xs) => !any(at, m, |v| xs.contains(v, m))?,
            Cond::Exist(b) => at.is_empty() != *b,
            Cond::StartsWith(s) => any(at, m, |v| {
                Ok(v.as_str().is_some_and(|t| t.starts_with(s.as_str())))
            })?,
            Cond::EndsWith(s) => any(at, m, |v| {
                Ok(v.as_str().is_some_and(|t| t.ends_with(s.as_str())))
            })?,
            Cond::Or(ns) => {
                for n in ns {
                    if n.holds(at, m)? {
                        return Ok(true);
                    }
                }
                false
            }
            Cond::And(ns) => {
                for n in ns {
                    if !n.holds(at, m)? {
                        return Ok(false);
                    }
                }
                true
            }
            Cond::Not(ns) => {
                for n in ns {
                    if n.holds(at, m)? {
                        return Ok(false);
                    }
                }
                true
            }
        })
    }
}

/// Does `test` hold for one of the values, or for an element of one that is an array? A step
/// per value tested.
fn any(
    at: &[&Value],
    m: &Meter,
    test: impl Fn(&Value) -> Result<bool, Spent>,
) -> Result<bool, Spent> {
    for v in at {
        m.step(1)?;
        if test(v)? {
            return Ok(true);
        }
        if let Value::Array(items) = v {
            for item in items {
                m.step(1)?;
                if test(item)? {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// Deep equality, numbers by value; a step per pair of nodes compared.
fn equal(a: &Value, b: &Value, m: &Meter) -> Result<bool, Spent> {
    m.step(1)?;
    Ok(match (a, b) {
        (Value::Number(x), Value::Number(y)) => cmp_numbers(x, y) == Ordering::Equal,
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (p, q) in x.iter().zip(y) {
                if !equal(p, q, m)? {
                    return Ok(false);
                }
            }
            true
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (k, p) in x {
                match y.get(k) {
                    Some(q) if equal(p, q, m)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        _ => a == b,
    })
}

/// A JSON number as an exact integer, when it is one.
fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// Compare two numbers by value: integers exactly, an integer and a float exactly, two floats
/// as floats. (JSON has no NaN; one would compare equal to everything and harm nothing.)
fn cmp_numbers(a: &Number, b: &Number) -> Ordering {
    match (integer(a), integer(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(x), None) => cmp_int_float(x, b.as_f64().unwrap_or(0.0)),
        (None, Some(y)) => cmp_int_float(y, a.as_f64().unwrap_or(0.0)).reverse(),
        (None, None) => {
            let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
    }
}

/// An integer against a float, exactly (no rounding of the integer to `f64`).
fn cmp_int_float(i: i128, f: f64) -> Ordering {
    const TWO_127: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if f.is_nan() {
        return Ordering::Equal;
    }
    if f >= TWO_127 {
        return Ordering::Less;
    }
    if f < -TWO_127 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    // `t` is integral and within i128: the cast is exact.
    match i.cmp(&(t as i128)) {
        Ordering::Equal if f > t => Ordering::Less,
        Ordering::Equal if f < t => Ordering::Greater,
        o => o,
    }
}

/// Compiled filters by their stored text: the text read with a subscriber's row is the key, so
/// a filter changed since is a different key and never served stale. A text that no longer
/// compiles (stored by a version with other rules) is kept as `None`: the ledger lets every
/// event through rather than lose one. Cleared whole when it outgrows [`FilterCache::MAX`].
#[derive(Debug, Default)]
pub struct FilterCache {
    compiled: HashMap<String, Option<Arc<Filter>>>,
}

impl FilterCache {
    /// Most filters kept.
    pub const MAX: usize = 4096;

    /// The compiled filter of a stored text, compiled on first sight; `Err` once for a text
    /// that does not compile (then `Ok(None)` from the cache).
    pub fn get(&mut self, text: &str) -> Result<Option<Arc<Filter>>, FilterError> {
        if let Some(f) = self.compiled.get(text) {
            return Ok(f.clone());
        }
        if self.compiled.len() >= Self::MAX {
            self.compiled.clear();
        }
        let compiled = Filter::parse(text);
        let kept = compiled.as_ref().ok().map(|f| Arc::new(f.clone()));
        self.compiled.insert(text.to_string(), kept.clone());
        compiled.map(|_| kept)
    }
}

#[cfg(test)]
mod tests;
