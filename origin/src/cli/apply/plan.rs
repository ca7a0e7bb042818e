//! What `fanout apply` does (pure): the plan is a function of what the file declares and what
//! the daemon has ([`plan`]), and its text for a person ([`Plan::render`]). Only the fields a
//! file names are compared; a field it omits stays as it is.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::yaml::{Desired, Item, Kind, READ_ONLY};

/// The daemon's customers or subscribers by id, each as the API's JSON object.
pub type Current = BTreeMap<String, Map<String, Value>>;

/// One field that changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub field: String,
    pub line: usize,
    pub old: Value,
    pub new: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `body` is the creation's JSON; `then` what a PATCH sets right after (what a creation
    /// may not say: a subscriber is created enabled, so `disabled: true` comes after).
    Create {
        kind: Kind,
        id: String,
        line: usize,
        body: Map<String, Value>,
        then: Map<String, Value>,
    },
    Change {
        kind: Kind,
        id: String,
        line: usize,
        changes: Vec<Change>,
    },
    Remove {
        kind: Kind,
        id: String,
    },
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// In the order they run: customers created or changed before the subscribers that may
    /// name them, subscribers removed before the customers that own them.
    pub actions: Vec<Action>,
    /// What `--prune` would remove, when it was not given.
    pub unpruned: Vec<(Kind, String)>,
}

/// Two JSON values the daemon treats as the same: numbers by value (`10` and `10.0`).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Fields whose value is a record of settings the daemon completes with its defaults (a
/// batch's `max_bytes`): a key the file's record omits keeps its current value, as a field
/// the file omits does. Every other value is compared whole (a filter without a condition
/// is another filter).
pub const RECORDS: &[&str] = &["batch"];

/// What the file's value of `field` asks for, given its current value.
fn wanted(field: &str, old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) if RECORDS.contains(&field) => {
            let mut merged = o.clone();
            merged.extend(n.iter().map(|(k, v)| (k.clone(), v.clone())));
            Value::Object(merged)
        }
        _ => new.clone(),
    }
}

fn diff(item: &Item, current: &Map<String, Value>) -> Vec<Change> {
    item.fields
        .iter()
        .filter(|f| !READ_ONLY.contains(&f.name.as_str()))
        .filter_map(|f| {
            let old = current.get(&f.name).cloned().unwrap_or(Value::Null);
            let new = wanted(&f.name, &old, &f.value);
            (!same(&old, &new)).then(|| Change {
                field: f.name.clone(),
                line: f.line,
                old,
                new,
            })
        })
        .collect()
}

fn create(item: &Item) -> Action {
    let mut body = Map::new();
    let mut then = Map::new();
    body.insert("id".into(), Value::String(item.id.clone()));
    for f in &item.fields {
        if item.kind == Kind::Subscriber && f.name == "disabled" && f.value == Value::Bool(true) {
            then.insert(f.name.clone(), f.value.clone());
        } else {
            body.insert(f.name.clone(), f.value.clone());
        }
    }
    Action::Create {
        kind: item.kind,
        id: item.id.clone(),
        line: item.line,
        body,
        then,
    }
}

fn upserts(items: &[Item], current: &Current) -> Vec<Action> {
    items
        .iter()
        .filter_map(|item| match current.get(&item.id) {
            None => Some(create(item)),
            Some(cur) => {
                let changes = diff(item, cur);
                (!changes.is_empty()).then(|| Action::Change {
                    kind: item.kind,
                    id: item.id.clone(),
                    line: item.line,
                    changes,
                })
            }
        })
        .collect()
}

fn unnamed(kind: Kind, items: &[Item], current: &Current) -> Vec<(Kind, String)> {
    current
        .keys()
        .filter(|id| !items.iter().any(|i| &i.id == *id))
        .map(|id| (kind, id.clone()))
        .collect()
}

/// The plan that makes the daemon's `customers` and `subscribers` what `desired` says; with
/// `prune`, those the file does not name are removed.
pub fn plan(desired: &Desired, customers: &Current, subscribers: &Current, prune: bool) -> Plan {
    let mut actions = upserts(&desired.customers, customers);
    actions.extend(upserts(&desired.subscribers, subscribers));
    let mut extra = unnamed(Kind::Subscriber, &desired.subscribers, subscribers);
    extra.extend(unnamed(Kind::Customer, &desired.customers, customers));
    if prune {
        actions.extend(
            extra
                .into_iter()
                .map(|(kind, id)| Action::Remove { kind, id }),
        );
        Plan {
            actions,
            unpruned: Vec::new(),
        }
    } else {
        Plan {
            actions,
            unpruned: extra,
        }
    }
}

impl Plan {
    /// The plan for a person: one line per action, a change's fields old → new, and what
    /// `--prune` would remove.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.actions.is_empty() {
            out.push_str("no changes\n");
        }
        for a in &self.actions {
            match a {
                Action::Create {
                    kind,
                    id,
                    body,
                    then,
                    ..
                } => {
                    let fields: Vec<String> = body
                        .iter()
                        .chain(then.iter())
                        .filter(|(k, _)| k.as_str() != "id")
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    out.push_str(&format!("create {} {id}", kind.noun()));
                    if !fields.is_empty() {
                        out.push_str(&format!(": {}", fields.join(", ")));
                    }
                    out.push('\n');
                }
                Action::Change {
                    kind, id, changes, ..
                } => {
                    out.push_str(&format!("change {} {id}\n", kind.noun()));
                    for c in changes {
                        out.push_str(&format!("    {}: {} → {}\n", c.field, c.old, c.new));
                    }
                }
                Action::Remove { kind, id } => {
                    out.push_str(&format!("remove {} {id}\n", kind.noun()));
                }
            }
        }
        for (kind, id) in &self.unpruned {
            out.push_str(&format!(
                "not in the file (--prune would remove it): {} {id}\n",
                kind.noun()
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::apply::yaml::desired;
    use serde_json::json;

    fn current(objects: Value) -> Current {
        objects
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let m = o.as_object().unwrap().clone();
                (m["id"].as_str().unwrap().to_string(), m)
            })
            .collect()
    }

    fn rendered(file: &str, customers: Value, subscribers: Value, prune: bool) -> String {
        let d = desired(file).unwrap();
        plan(&d, &current(customers), &current(subscribers), prune).render()
    }

    #[test]
    fn plans_by_table() {
        let file = "customers:\n  - id: acme\n    weight: 2\nsubscribers:\n  - id: s1\n    url: http://a/\n    rate_per_sec: 10\n    customer: acme\n";
        let with_records = format!("{file}    filter: {{a: 1}}\n    batch: {{max_events: 2}}\n");
        let s1 = json!({"id": "s1", "url": "http://a/", "rate_per_sec": 10.0, "burst": 5,
                        "customer": "acme", "created_at_ms": 1, "secret": null});
        let acme = json!({"id": "acme", "weight": 2, "max_in_flight": null, "subscribers": 1});
        let cases: Vec<(&str, Value, Value, bool, &str)> = vec![
            (
                "empty daemon: both created, customer first",
                json!([]),
                json!([]),
                false,
                "create customer acme: weight=2\ncreate subscriber s1: customer=\"acme\", rate_per_sec=10, url=\"http://a/\"\n",
            ),
            (
                "the same state: nothing (10 and 10.0 are the same; omitted fields kept)",
                json!([acme]),
                json!([s1]),
                false,
                "no changes\n",
            ),
            (
                "one field differs",
                json!([acme]),
                json!([{"id": "s1", "url": "http://b/", "rate_per_sec": 10, "customer": "acme"}]),
                false,
                "change subscriber s1\n    url: \"http://b/\" → \"http://a/\"\n",
            ),
            (
                "a field the daemon lacks reads as null",
                json!([{"id": "acme"}]),
                json!([s1]),
                false,
                "change customer acme\n    weight: null → 2\n",
            ),
            (
                "unnamed ones without --prune: only said",
                json!([acme, {"id": "old"}]),
                json!([s1, {"id": "s2"}]),
                false,
                "no changes\nnot in the file (--prune would remove it): subscriber s2\nnot in the file (--prune would remove it): customer old\n",
            ),
            (
                "with --prune: subscribers removed before customers",
                json!([acme, {"id": "old"}]),
                json!([s1, {"id": "s2"}]),
                true,
                "remove subscriber s2\nremove customer old\n",
            ),
        ];
        for (what, customers, subscribers, prune, want) in cases {
            assert_eq!(
                rendered(file, customers, subscribers, prune),
                want,
                "{what}"
            );
        }
        let (what, customers, subscribers, prune, want) = (

                "a record's omitted key keeps its value; a filter is compared whole",
                json!([acme]),
                json!([{"id": "s1", "url": "http://a/", "rate_per_sec": 10, "customer": "acme",
                        "filter": {"a": 1, "b": 2}, "batch": {"max_events": 1, "max_bytes": 9}}]),
                false,
                "change subscriber s1\n    filter: {\"a\":1,\"b\":2} → {\"a\":1}\n    batch: {\"max_bytes\":9,\"max_events\":1} → {\"max_bytes\":9,\"max_events\":2}\n",
            );
        assert_eq!(
            rendered(&with_records, customers, subscribers, prune),
            want,
            "{what}"
        );
    }

    #[test]
    fn a_disabled_subscriber_is_created_then_disabled() {
        let d =
            desired("subscribers:\n  - id: s\n    url: http://a/\n    disabled: true\n").unwrap();
        let p = plan(&d, &Current::new(), &Current::new(), false);
        let Action::Create {
            body, then, line, ..
        } = &p.actions[0]
        else {
            panic!("{p:?}")
        };
        assert_eq!(
            Value::Object(body.clone()),
            json!({"id": "s", "url": "http://a/"})
        );
        assert_eq!(Value::Object(then.clone()), json!({"disabled": true}));
        assert_eq!(*line, 2);
    }

    #[test]
    fn sameness() {
        let cases = [
            (json!(10), json!(10.0), true),
            (
                json!({"a": [1, {"b": 2}]}),
                json!({"a": [1.0, {"b": 2}]}),
                true,
            ),
            (json!({"a": 1}), json!({"a": 1, "b": null}), false),
            (json!([1, 2]), json!([2, 1]), false),
            (json!("1"), json!(1), false),
            (Value::Null, json!(false), false),
        ];
        for (a, b, want) in cases {
            assert_eq!(same(&a, &b), want, "{a} vs {b}");
        }
    }
}
