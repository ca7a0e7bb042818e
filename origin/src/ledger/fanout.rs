//! Which live subscribers an ingested event goes to, for both backends' ingest: those whose
//! event-type patterns match its type and whose content filter (`crate::event_filter`), if
//! any, matches its body. No SQL and no connection here: each backend reads the subscriber
//! rows in its ingest transaction and hands them over as they are.
//!
//! A filter is matched as stored in the row the ingest transaction read, so a filter changed
//! by a PATCH that has been answered applies to every event ingested after it, on every daemon
//! sharing the ledger. Compiling is what a cache saves: compiled filters are kept by their
//! text, which is the key, so a changed filter is a new key and never served stale. An event's
//! body is read once (and only when a subscriber of its type has a filter), whatever the
//! number of subscribers, and only as far as their filters look (`event_filter::Projection`).

use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;

use super::deliveries::NewEvent;
use crate::event_filter::{Filter, FilterCache, Projection};
use crate::model::any_type_matches;
use crate::ordering::Ordering;

/// A live subscriber as ingest sees it.
#[derive(Debug)]
pub struct Candidate {
    pub id: String,
    patterns: Vec<String>,
    filter: Option<Arc<Filter>>,
    /// Its ordering (`crate::ordering`) and, for `key`, the pointer.
    ordering: Ordering,
    ordering_key: Option<String>,
}

/// A subscriber row as ingest reads it: id, event types (JSON), filter (JSON text), ordering
/// and ordering key.
pub type CandidateRow = (String, String, Option<String>, String, Option<String>);

/// Compiled filters by text, shared by every ledger of the process (the key is the text).
static FILTERS: LazyLock<Mutex<FilterCache>> = LazyLock::new(Default::default);

/// The candidates from the rows ingest read ([`CandidateRow`]).
/// Event types that do not decode match nothing; a filter that no longer compiles (stored by a
/// version with other rules) lets every event through, with a warning, rather than lose one.
pub fn candidates(rows: Vec<CandidateRow>) -> Vec<Candidate> {
    let mut cache = FILTERS.lock().unwrap_or_else(|p| p.into_inner());
    rows.into_iter()
        .map(|(id, types, filter, ordering, ordering_key)| {
            let filter = filter.and_then(|text| match cache.get(&text) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(subscriber = %id, error = %e,
                        "a stored filter does not compile: every event of its types goes to it");
                    None
                }
            });
            Candidate {
                patterns: serde_json::from_str(&types).unwrap_or_default(),
                id,
                filter,
                ordering: Ordering::parse(&ordering).unwrap_or_default(),
                ordering_key,
            }
        })
        .collect()
}

/// Push the ordering key (`crate::ordering::key_of`) of event `e`'s delivery to each of `to`
/// (indexes into `subs`), in order, onto `out`: `None` for an unordered subscriber. The body is
/// parsed once, and only when one of them orders by a key.
pub fn ordering_keys(
    subs: &[Candidate],
    e: &NewEvent,
    to: &[usize],
    out: &mut Vec<Option<String>>,
) {
    if to.iter().all(|&i| subs[i].ordering == Ordering::None) {
        out.resize(out.len() + to.len(), None);
        return;
    }
    let body: Option<Value> = to
        .iter()
        .any(|&i| subs[i].ordering == Ordering::Key)
        .then(|| serde_json::from_str(&e.body).ok())
        .flatten();
    out.extend(to.iter().map(|&i| {
        let s = &subs[i];
        crate::ordering::key_of(s.ordering, s.ordering_key.as_deref(), body.as_ref())
    }));
}

/// Chooses each event's subscribers among the candidates.
#[derive(Debug)]
pub struct Selector<'s> {
    subs: &'s [Candidate],
    /// The candidates of the last event type seen (a batch is usually of one type), and what
    /// of a body their filters see (`None`: none has a filter).
    typed: Option<(String, Vec<usize>, Option<Projection>)>,
    picked: Vec<usize>,
}

impl<'s> Selector<'s> {
    pub fn new(subs: &'s [Candidate]) -> Self {
        Selector {
            subs,
            typed: None,
            picked: Vec::new(),
        }
    }

    /// The subscribers (indexes into the candidates) event `e` goes to, in candidate order.
    pub fn select(&mut self, e: &NewEvent) -> &[usize] {
        if self.typed.as_ref().is_none_or(|(t, ..)| *t != e.event_type) {
            let idx: Vec<usize> = (0..self.subs.len())
                .filter(|&i| any_type_matches(&self.subs[i].patterns, &e.event_type))
                .collect();
            let mut seen: Option<Projection> = None;
            for f in idx.iter().filter_map(|&i| self.subs[i].filter.as_ref()) {
                seen.get_or_insert_with(Projection::default)
                    .add(&f.projection());
            }
            self.typed = Some((e.event_type.clone(), idx, seen));
        }
        let Some((_, idx, seen)) = &self.typed else {
            return &[];
        };
        let Some(seen) = seen else {
            return idx;
        };
        // Read once, only what the filters see. Ingest took the body as a JSON object: it
        // parses. Should it ever not, nothing is held back.
        let body: Option<Value> = seen.parse(&e.body).ok();
        self.picked.clear();
        for &i in idx {
            let keep = match (&self.subs[i].filter, &body) {
                (Some(f), Some(b)) => f.matches(b),
                _ => true,
            };
            if keep {
                self.picked.push(i);
            }
        }
        &self.picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_then_filters_body_parsed_once() {
        let row = |id: &str, types: &str, filter: Option<&str>| {
            (
                id.to_string(),
                types.to_string(),
                filter.map(str::to_string),
                "none".to_string(),
                None,
            )
        };
        let subs = candidates(vec![
            row("all", r#"["*"]"#, None),
            row("big", r#"["invoice.*"]"#, Some(r#"{"amount":{"$gt":100}}"#)),
            row("eur", r#"["invoice.paid"]"#, Some(r#"{"currency":"EUR"}"#)),
            row("stale", r#"["invoice.*"]"#, Some(r#"{"a":{"$regex":"x"}}"#)),
            row("video", r#"["video.*"]"#, Some(r#"{"a":1}"#)),
        ]);
        let ev = |ty: &str, body: &str| NewEvent {
            id: "e".into(),
            event_type: ty.into(),
            body: body.into(),
            traceparent: None,
        };
        let mut s = Selector::new(&subs);
        let names =
            |idx: &[usize]| -> Vec<String> { idx.iter().map(|&i| subs[i].id.clone()).collect() };
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "invoice.paid",
                r#"{"amount":500,"currency":"EUR"}"#,
                &["all", "big", "eur", "stale"],
            ),
            (
                "invoice.paid",
                r#"{"amount":5,"currency":"EUR"}"#,
                &["all", "eur", "stale"],
            ),
            (
                "invoice.paid",
                r#"{"amount":5,"currency":"USD"}"#,
                &["all", "stale"],
            ),
            (
                "invoice.sent",
                r#"{"amount":500}"#,
                &["all", "big", "stale"],
            ),
            ("order.new", r#"{"amount":500}"#, &["all"]),
            ("video.up", r#"{"a":2}"#, &["all"]),
            ("video.up", r#"{"a":1}"#, &["all", "video"]),
        ];
        for (ty, body, want) in cases {
            assert_eq!(names(s.select(&ev(ty, body))), *want, "{ty} {body}");
        }
    }
}
