//! The configuration file of `fanout apply` and `fanout export` (pure): YAML read into a tree
//! that keeps each key's line ([`parse`]), the document's shape checked into [`Desired`] (its
//! `customers`, `subscribers` and `event_types`, each item's fields as the API's JSON, each
//! with its line), and the same format written back from the API's JSON ([`write`]).
//! No I/O: the caller reads the file and names it.

use serde_json::{Map, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};
use yaml_rust2::Yaml;

/// The fields the daemon sets and the file never does: never diffed, never exported, refused
/// in a file.
pub const READ_ONLY: &[&str] = &[
    "created_at_ms",
    "updated_at_ms",
    "active_secrets",
    "disabled_reason",
    "disabled_at_ms",
    "failing_since_ms",
    "public_key",
    "stats",
    "subscribers",
];

/// A field holds a secret when its name says so (`secret`, `secrets`, `signing_secret`, a
/// `token`): such a field is refused in a file and never exported.
pub fn is_secret(field: &str) -> bool {
    field.contains("secret") || field.contains("token")
}

/// What is wrong with the file, at which line (1-based; 0 for the whole file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct FileError {
    pub line: usize,
    pub message: String,
}

fn err(line: usize, message: impl Into<String>) -> FileError {
    FileError {
        line,
        message: message.into(),
    }
}

/// A YAML value with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub line: usize,
    pub value: Tree,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Tree {
    Scalar(Value),
    List(Vec<Node>),
    /// Keys in the file's order, each with its line.
    Map(Vec<(String, usize, Node)>),
}

impl Node {
    /// The value as the API's JSON.
    pub fn json(&self) -> Value {
        match &self.value {
            Tree::Scalar(v) => v.clone(),
            Tree::List(items) => Value::Array(items.iter().map(Node::json).collect()),
            Tree::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, _, v)| (k.clone(), v.json()))
                    .collect(),
            ),
        }
    }
}

/// Deeper nesting is refused (no item of the API's nests this deep; the tree's own code
/// recurses).
const MAX_DEPTH: usize = 64;

/// Builds [`Node`]s from the parser's events; the first problem it meets is kept.
#[derive(Default)]
struct Builder {
    /// The open lists and mappings, each mapping with its key read and waiting for its value.
    stack: Vec<(Node, Option<(String, usize)>)>,
    root: Option<Node>,
    /// Lists and mappings open below [`MAX_DEPTH`], not built.
    too_deep: usize,
    problem: Option<FileError>,
}

impl Builder {
    fn push_value(&mut self, node: Node) {
        let Some((parent, pending)) = self.stack.last_mut() else {
            self.root = Some(node);
            return;
        };
        match &mut parent.value {
            Tree::List(items) => items.push(node),
            Tree::Map(entries) => match pending.take() {
                Some((key, line)) => {
                    if entries.iter().any(|(k, _, _)| *k == key) {
                        self.problem
                            .get_or_insert(err(line, format!("`{key}` is given twice")));
                    }
                    entries.push((key, line, node));
                }
                None => match node.value {
                    Tree::Scalar(Value::String(key)) => *pending = Some((key, node.line)),
                    Tree::Scalar(other) => *pending = Some((other.to_string(), node.line)),
                    _ => {
                        self.problem
                            .get_or_insert(err(node.line, "a key must be a plain name"));
                    }
                },
            },
            Tree::Scalar(_) => {}
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        if self.too_deep > 0 || (self.stack.len() >= MAX_DEPTH && is_start(&ev)) {
            self.skip(&ev, line);
            return;
        }
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                if anchor != 0 || tag.is_some() {
                    self.problem
                        .get_or_insert(err(line, "anchors and tags are not supported"));
                }
                let value = match style {
                    TScalarStyle::Plain => scalar(&text),
                    _ => Value::String(text),
                };
                self.push_value(Node {
                    line,
                    value: Tree::Scalar(value),
                });
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if anchor != 0 {
                    self.problem
                        .get_or_insert(err(line, "anchors and aliases are not supported"));
                }
                let value = match ev {
                    Event::SequenceStart(..) => Tree::List(Vec::new()),
                    _ => Tree::Map(Vec::new()),
                };
                self.stack.push((Node { line, value }, None));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, _)) = self.stack.pop() {
                    self.push_value(node);
                }
            }
            Event::Alias(_) => {
                self.problem
                    .get_or_insert(err(line, "anchors and aliases are not supported"));
            }
            Event::DocumentStart => {
                if self.root.is_some() {
                    self.problem
                        .get_or_insert(err(line, "the file holds more than one document"));
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

fn is_start(ev: &Event) -> bool {
    matches!(ev, Event::SequenceStart(..) | Event::MappingStart(..))
}

impl Builder {
    /// An event below [`MAX_DEPTH`]: counted, not built.
    fn skip(&mut self, ev: &Event, line: usize) {
        self.problem
            .get_or_insert(err(line, format!("nested deeper than {MAX_DEPTH} levels")));
        match ev {
            Event::SequenceStart(..) | Event::MappingStart(..) => self.too_deep += 1,
            Event::SequenceEnd | Event::MappingEnd => self.too_deep -= 1,
            _ => {}
        }
    }
}

/// A plain scalar as YAML 1.2's core schema reads it: null, a boolean, a number or a string.
fn scalar(text: &str) -> Value {
    match Yaml::from_str(text) {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Integer(i) => Value::from(i),
        Yaml::Real(r) => r
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.to_string()), Value::Number),
        _ => Value::String(text.to_string()),
    }
}

/// The file's text as a tree (an empty file is an empty mapping).
pub fn parse(text: &str) -> Result<Node, FileError> {
    let mut builder = Builder::default();
    Parser::new_from_str(text)
        .load(&mut builder, true)
        .map_err(|e| err(e.marker().line(), e.info().to_string()))?;
    if let Some(p) = builder.problem {
        return Err(p);
    }
    Ok(builder.root.unwrap_or(Node {
        line: 1,
        value: Tree::Map(Vec::new()),
    }))
}

/// Customers or subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Customer,
    Subscriber,
}

impl Kind {
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Customer => "customer",
            Kind::Subscriber => "subscriber",
        }
    }
    /// The top-level key of its list, also its path under `/v1/`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Customer => "customers",
            Kind::Subscriber => "subscribers",
        }
    }
}

/// One field of an item: its API name, its line and its value as the API's JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub line: usize,
    pub value: Value,
}

/// One customer or subscriber the file declares.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub kind: Kind,
    pub id: String,
    pub line: usize,
    /// Every field but `id`, in the file's order.
    pub fields: Vec<Field>,
}

/// What the file declares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Desired {
    pub customers: Vec<Item>,
    pub subscribers: Vec<Item>,
}

/// The file's text checked into what it declares. A non-empty `event_types` is refused: this
/// daemon has no event-type catalog.
pub fn desired(text: &str) -> Result<Desired, FileError> {
    let root = parse(text)?;
    let Tree::Map(entries) = root.value else {
        return Err(err(
            root.line,
            "the file must be a mapping with `customers`, `subscribers` and `event_types`",
        ));
    };
    let mut out = Desired::default();
    for (key, line, node) in entries {
        match key.as_str() {
            "customers" => out.customers = items(Kind::Customer, &node)?,
            "subscribers" => out.subscribers = items(Kind::Subscriber, &node)?,
            "event_types" => match &node.value {
                Tree::Scalar(Value::Null) => {}
                Tree::List(l) if l.is_empty() => {}
                _ => {
                    return Err(err(
                        line,
                        "`event_types`: this daemon has no event-type catalog; remove the \
                         list (nothing was changed)",
                    ))
                }
            },
            other => {
                return Err(err(
                    line,
                    format!(
                        "unknown top-level key `{other}` (expected customers, subscribers, \
                         event_types)"
                    ),
                ))
            }
        }
    }
    Ok(out)
}

fn items(kind: Kind, node: &Node) -> Result<Vec<Item>, FileError> {
    let list = match &node.value {
        Tree::Scalar(Value::Null) => return Ok(Vec::new()),
        Tree::List(l) => l,
        _ => {
            return Err(err(
                node.line,
                format!("`{}` must be a list", kind.plural()),
            ))
        }
    };
    let mut out: Vec<Item> = Vec::new();
    for n in list {
        let it = item(kind, n)?;
        if let Some(first) = out.iter().find(|o| o.id == it.id) {
            return Err(err(
                it.line,
                format!(
                    "{} `{}` is declared twice (also at line {})",
                    kind.noun(),
                    it.id,
                    first.line
                ),
            ));
        }
        out.push(it);
    }
    Ok(out)
}

fn item(kind: Kind, node: &Node) -> Result<Item, FileError> {
    let Tree::Map(entries) = &node.value else {
        return Err(err(
            node.line,
            format!("each of `{}` must be a mapping with an `id`", kind.plural()),
        ));
    };
    let mut id = None;
    let mut fields = Vec::new();
    for (name, line, value) in entries {
        if name == "id" {
            match value.json() {
                Value::String(s) if !s.is_empty() => id = Some(s),
                _ => return Err(err(*line, "field `id`: must be a non-empty string")),
            }
        } else if READ_ONLY.contains(&name.as_str()) {
            return Err(err(
                *line,
                format!("field `{name}`: set by the daemon, not by the file; remove it"),
            ));
        } else if is_secret(name) {
            return Err(err(
                *line,
                format!(
                    "field `{name}`: secrets never live in the file; a created subscriber's \
                     secret is printed once (or written to --secrets-out)"
                ),
            ));
        } else {
            fields.push(Field {
                name: name.clone(),
                line: *line,
                value: value.json(),
            });
        }
    }
    let id = id.ok_or_else(|| err(node.line, format!("a {} without an `id`", kind.noun())))?;
    Ok(Item {
        kind,
        id,
        line: node.line,
        fields,
    })
}

/// The API's objects as an item's fields: without its id, read-only and secret fields.
pub fn exported_fields(object: &Map<String, Value>) -> Vec<(String, Value)> {
    object
        .iter()
        .filter(|(k, _)| k.as_str() != "id" && !READ_ONLY.contains(&k.as_str()) && !is_secret(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The file's format for these customers and subscribers (the API's objects, sorted by the
/// caller): each item a block mapping, each value JSON (which YAML reads as the same value).
pub fn write(customers: &[Map<String, Value>], subscribers: &[Map<String, Value>]) -> String {
    let mut out = String::new();
    for (key, list) in [("customers", customers), ("subscribers", subscribers)] {
        if list.is_empty() {
            out.push_str(&format!("{key}: []\n"));
            continue;
        }
        out.push_str(&format!("{key}:\n"));
        for object in list {
            let id = object.get("id").cloned().unwrap_or(Value::Null);
            out.push_str(&format!("  - id: {id}\n"));
            for (k, v) in exported_fields(object) {
                out.push_str(&format!("    {}: {v}\n", yaml_key(&k)));
            }
        }
    }
    out.push_str("event_types: []\n");
    out
}

fn yaml_key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_of_items_and_fields() {
        let text = "# the config\ncustomers:\n  - id: acme\n    weight: 3\nsubscribers:\n  - id: s1\n    url: \"http://x/\"\n    rate_per_sec: 2.5\n    filter: {amount: {$gt: 100}}\n    batch: null\n    event_types: [a.*, 'b']\n";
        let d = desired(text).unwrap();
        assert_eq!(d.customers[0].id, "acme");
        assert_eq!(d.customers[0].line, 3);
        assert_eq!(d.customers[0].fields[0].line, 4);
        assert_eq!(d.customers[0].fields[0].value, json!(3));
        let s = &d.subscribers[0];
        assert_eq!((s.id.as_str(), s.line), ("s1", 6));
        let got: Vec<(&str, usize, Value)> = s
            .fields
            .iter()
            .map(|f| (f.name.as_str(), f.line, f.value.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("url", 7, json!("http://x/")),
                ("rate_per_sec", 8, json!(2.5)),
                ("filter", 9, json!({"amount": {"$gt": 100}})),
                ("batch", 10, Value::Null),
                ("event_types", 11, json!(["a.*", "b"])),
            ]
        );
    }

    #[test]
    fn refusals_name_the_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("subscribers:\n  - id: s\n    url: [\n", 4, ""),
            (
                "customers: []\nwebhooks: []\n",
                2,
                "unknown top-level key `webhooks`",
            ),
            ("subscribers:\n  - url: http://x/\n", 2, "without an `id`"),
            (
                "subscribers:\n  - id: s\n    secret: whsec_x\n",
                3,
                "`secret`",
            ),
            (
                "subscribers:\n  - id: s\n    created_at_ms: 1\n",
                3,
                "set by the daemon",
            ),
            ("event_types:\n  - name: a\n", 1, "no event-type catalog"),
            (
                "customers:\n  - id: a\n  - id: a\n",
                3,
                "declared twice (also at line 2)",
            ),
            (
                "customers:\n  - id: a\n    weight: 1\n    weight: 2\n",
                4,
                "given twice",
            ),
            ("customers:\n  - &x {id: a}\n", 2, "anchors"),
            ("- a\n", 1, "must be a mapping"),
            ("customers: 3\n", 1, "must be a list"),
            (
                "customers:\n  - id: 007\n",
                2,
                "field `id`: must be a non-empty string",
            ),
            (
                &format!("customers: {}\n", "[".repeat(200) + &"]".repeat(200)),
                1,
                "nested deeper than 64",
            ),
        ];
        for (text, line, words) in cases {
            let e = desired(text).unwrap_err();
            assert_eq!(e.line, *line, "{text:?}: {e}");
            assert!(e.message.contains(words), "{text:?}: {e}");
        }
        assert_eq!(desired("").unwrap(), Desired::default());
        assert_eq!(desired("event_types: []\n").unwrap(), Desired::default());
    }

    #[test]
    fn written_files_read_back_as_the_same_objects() {
        let sub = json!({
            "id": "s:1", "url": "http://x/?a=1#b", "event_types": ["*"], "rate_per_sec": 10.0,
            "filter": {"$or": [{"a": "yes"}, {"b": null}]}, "batch": null, "secret": "whsec_x",
            "created_at_ms": 5, "public_key": "whpk_x", "note": "line\nbreak: 'q' \"d\"",
        });
        let cust = json!({"id": "007", "weight": 2, "max_in_flight": null, "subscribers": 1});
        let text = write(
            &[cust.as_object().unwrap().clone()],
            &[sub.as_object().unwrap().clone()],
        );
        let d = desired(&text).unwrap();
        assert_eq!(d.customers[0].id, "007");
        let back: Map<String, Value> = d.subscribers[0]
            .fields
            .iter()
            .map(|f| (f.name.clone(), f.value.clone()))
            .collect();
        let want: Map<String, Value> = exported_fields(sub.as_object().unwrap())
            .into_iter()
            .collect();
        assert_eq!(back, want);
        assert!(!text.contains("whsec_") && !text.contains("created_at_ms"));
        assert!(write(&[], &[]).contains("customers: []"));
    }
}
