//! The values of an `$in` or `$nin` list as a set (pure): membership costs a hash of the value
//! at hand, not one comparison per listed value. Two values are the same member exactly when
//! the filter's equality (`super::equal`) says they are equal: numbers by value (an integer and
//! an integral float are one number, `1 == 1.0`), arrays element by element, objects key by key
//! whatever their order.

use std::collections::HashSet;
use std::fmt::Write as _;

use serde_json::{Number, Value};

use super::{integer, Meter, Spent};

/// A number as a set member: an exact integer (which an integral float is, within `i128`), or
/// another float by its bits (`-0.0` is the integer 0; JSON has no NaN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum NumKey {
    Int(i128),
    Float(u64),
}

fn num_key(n: &Number) -> NumKey {
    if let Some(i) = integer(n) {
        return NumKey::Int(i);
    }
    const TWO_127: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    let f = n.as_f64().unwrap_or(0.0);
    if f.trunc() == f && (-TWO_127..TWO_127).contains(&f) {
        // Integral and within i128: the cast is exact.
        NumKey::Int(f as i128)
    } else {
        NumKey::Float(f.to_bits())
    }
}

/// The values of one list.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ValueSet {
    null: bool,
    bools: [bool; 2],
    numbers: HashSet<NumKey>,
    strings: HashSet<String>,
    /// Arrays and objects by their canonical text ([`canonical`]).
    containers: HashSet<String>,
}

impl ValueSet {
    pub(super) fn of(values: &[Value]) -> ValueSet {
        let mut s = ValueSet::default();
        // Building costs the list's size, bounded by the filter's own limits.
        let unmetered = Meter::unlimited();
        for v in values {
            match v {
                Value::Null => s.null = true,
                Value::Bool(b) => s.bools[usize::from(*b)] = true,
                Value::Number(n) => {
                    s.numbers.insert(num_key(n));
                }
                Value::String(t) => {
                    s.strings.insert(t.clone());
                }
                Value::Array(_) | Value::Object(_) => {
                    let mut text = String::new();
                    if canonical(v, &mut text, &unmetered).is_ok() {
                        s.containers.insert(text);
                    }
                }
            }
        }
        s
    }

    /// Is `v` one of the values? An array or object costs a step per node of it.
    pub(super) fn contains(&self, v: &Value, m: &Meter) -> Result<bool, Spent> {
        Ok(match v {
            Value::Null => self.null,
            Value::Bool(b) => self.bools[usize::from(*b)],
            Value::Number(n) => self.numbers.contains(&num_key(n)),
            Value::String(t) => self.strings.contains(t.as_str()),
            Value::Array(_) | Value::Object(_) => {
                if self.containers.is_empty() {
                    return Ok(false);
                }
                let mut text = String::new();
                canonical(v, &mut text, m)?;
                self.containers.contains(&text)
            }
        })
    }
}

/// A value's canonical text: equal values (by the filter's equality) have the same text, and
/// different ones different texts (strings are written as JSON strings, so nothing else looks
/// like one; object keys are sorted).
fn canonical(v: &Value, out: &mut String, m: &Meter) -> Result<(), Spent> {
    m.step(1)?;
    match v {
        Value::Null => out.push('n'),
        Value::Bool(b) => out.push(if *b { 't' } else { 'f' }),
        Value::Number(n) => match num_key(n) {
            NumKey::Int(i) => {
                let _ = write!(out, "i{i}");
            }
            NumKey::Float(bits) => {
                let _ = write!(out, "f{bits}");
            }
        },
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                canonical(item, out, m)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (k, key) in keys.into_iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out, m)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Membership is the filter's equality, value against every listed value.
    #[test]
    fn membership_is_equality() {
        let list = [
            json!(1),
            json!(2.5),
            json!(-0.0),
            json!(18446744073709551615u64),
            json!(1e20),
            json!("a"),
            json!(null),
            json!(false),
            json!([1, {"b": 2, "a": [1.0]}]),
            json!({"x": "y", "z": 1}),
            json!({"s": "\"i1\""}),
        ];
        let probes = [
            json!(1),
            json!(1.0),
            json!(1.5),
            json!(2.5),
            json!(0),
            json!(0.0),
            json!(18446744073709551615u64),
            json!(18446744073709551614u64),
            json!(18446744073709551615.0),
            json!(100000000000000000000u128 as f64),
            json!("a"),
            json!("A"),
            json!(null),
            json!(false),
            json!(true),
            json!([1, {"a": [1], "b": 2}]),
            json!([1, {"a": [1], "b": 3}]),
            json!([{"a": [1], "b": 2}, 1]),
            json!({"z": 1, "x": "y"}),
            json!({"z": 1}),
            json!({"s": "\"i1\""}),
            json!({"s": 1}),
            json!([]),
            json!({}),
        ];
        let set = ValueSet::of(&list);
        let m = Meter::unlimited();
        for p in &probes {
            let want = list.iter().any(|x| super::super::equal(p, x, &m).unwrap());
            assert_eq!(set.contains(p, &m), Ok(want), "{p}");
        }
    }
}
