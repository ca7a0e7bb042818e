//! Reading only what filters look at (pure): a [`Projection`] is the part of an event body a
//! set of filters can see, and [`Projection::parse`] reads a body into a [`Value`] holding that
//! part alone. Fields no filter names are skipped without being copied (a large payload beside
//! the few fields a filter tests costs a scan, not a copy); a value a filter compares is kept
//! whole. Matching the projected body gives the same answer as matching the whole body, for
//! every filter the projection was made from (checked by the fuzz test).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::{Cond, Node};

/// What of a value filters can see: all of it, or some of its fields (of it, or of the objects
/// in it when it is an array), each with its own projection. A field present with an empty
/// projection is kept for its presence (`$exist`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Projection {
    all: bool,
    fields: BTreeMap<String, Projection>,
}

impl Projection {
    /// Widen this projection to see also what `other` sees.
    pub fn add(&mut self, other: &Projection) {
        self.all |= other.all;
        if self.all {
            self.fields.clear();
            return;
        }
        for (k, p) in &other.fields {
            self.fields.entry(k.clone()).or_default().add(p);
        }
    }

    /// Read a JSON text, keeping what this projection sees.
    pub fn parse(&self, text: &str) -> Result<Value, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        let v = self.deserialize(&mut de)?;
        de.end()?;
        Ok(v)
    }

    /// What a filter object sees of the value it is applied to.
    pub(super) fn of(node: &Node) -> Projection {
        let mut p = Projection::default();
        for c in &node.0 {
            match c {
                Cond::Field(k, child) => p
                    .fields
                    .entry(k.clone())
                    .or_default()
                    .add(&Projection::of(child)),
                Cond::Exist(_) => {}
                Cond::Or(ns) | Cond::And(ns) | Cond::Not(ns) => {
                    for n in ns {
                        p.add(&Projection::of(n));
                    }
                }
                Cond::Eq(_)
                | Cond::Neq(_)
                | Cond::Cmp(..)
                | Cond::In(_)
                | Cond::Nin(_)
                | Cond::StartsWith(_)
                | Cond::EndsWith(_) => p.all = true,
            }
        }
        if p.all {
            p.fields.clear();
        }
        p
    }
}

impl<'de> DeserializeSeed<'de> for &Projection {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.all {
            Value::deserialize(d)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for &Projection {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(Key)? {
            match self.fields.get(k.as_ref()) {
                Some(p) => {
                    let v = map.next_value_seed(p)?;
                    out.insert(k.into_owned(), v);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// An object's key, borrowed from the text when it has no escapes (decoded otherwise, which
/// refuses a lone surrogate as a value's string does). The one key reader of the projection and
/// of `event_input`'s walk.
pub(crate) struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(Key)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}
