//! Which live subscribers an ingested event goes to, for both backends' ingest: those whose
//! event-type patterns match its type and whose content filters (`crate::event_filter`), the
//! operator's `filter` and the customer's `customer_filter`, both match its body (an absent
//! one matches everything). No SQL and no connection here: each backend reads the subscriber
//! rows in its ingest transaction and hands them over as they are.
//!
//! A filter is matched as stored in the row the ingest transaction read, so a filter changed
//! by a PATCH that has been answered applies to every event ingested after it, on every daemon
//! sharing the ledger. Compiling is what a cache saves: compiled filters are kept by their
//! text, which is the key, so a changed filter is a new key and never served stale. An event's
//! body is read once (and only when a subscriber of its type has a filter), whatever the
//! number of subscribers, and only as far as their filters look (`event_filter::Projection`).
//!
//! Filters fail closed: a filter is a boundary between tenants (the operator routes one
//! customer's events to its endpoint by it), so a stored filter that no longer compiles, or a
//! body that does not parse (ingest refuses those: `crate::event_input`), sends nothing to a
//! filtered subscriber rather than everything.

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
    /// The filters an event must all match (empty: every event of its types); `None` when a
    /// stored one does not compile: no event goes to it.
    filters: Option<Vec<Arc<Filter>>>,
    /// Its ordering (`crate::ordering`) and, for `key`, the pointer.
    ordering: Ordering,
    ordering_key: Option<String>,
}

/// A subscriber row as ingest reads it (filters as their stored JSON text).
#[derive(Debug, Clone, Default)]
pub struct CandidateRow {
    pub id: String,
    /// The event-type patterns, a JSON array.
    pub event_types: String,
    /// The operator's filter.
    pub filter: Option<String>,
    /// The customer's own filter.
    pub customer_filter: Option<String>,
    pub ordering: String,
    pub ordering_key: Option<String>,
}

/// Compiled filters by text, shared by every ledger of the process (the key is the text).
static FILTERS: LazyLock<Mutex<FilterCache>> = LazyLock::new(Default::default);

/// The candidates from the rows ingest read ([`CandidateRow`]). Event types that do not decode
/// match nothing; a filter that no longer compiles (stored by a version with other rules)
/// lets nothing through, with a warning.
pub fn candidates(rows: Vec<CandidateRow>) -> Vec<Candidate> {
    let mut cache = FILTERS.lock().unwrap_or_else(|p| p.into_inner());
    rows.into_iter()
        .map(|row| {
            let mut compiled = |text: Option<String>, which: &str| match text {
                None => Some(None),
                Some(text) => match cache.get(&text) {
                    Ok(Some(f)) => Some(Some(f)),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(subscriber = %row.id, error = %e,
                            "its stored {which} does not compile: no event goes to it");
                        None
                    }
                },
            };
            let filters = match (
                compiled(row.filter.clone(), "filter"),
                compiled(row.customer_filter.clone(), "customer_filter"),
            ) {
                (Some(a), Some(b)) => Some(a.into_iter().chain(b).collect()),
                _ => None,
            };
            Candidate {
                patterns: serde_json::from_str(&row.event_types).unwrap_or_default(),
                filters,
                ordering: Ordering::parse(&row.ordering).unwrap_or_default(),
                ordering_key: row.ordering_key,
                id: row.id,
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
            for f in idx.iter().filter_map(|&i| self.subs[i].filters.as_ref()) {
                for f in f {
                    seen.get_or_insert_with(Projection::default)
                        .add(&f.projection());
                }
            }
            self.typed = Some((e.event_type.clone(), idx, seen));
        }
        let Some((_, idx, seen)) = &self.typed else {
            return &[];
        };
        let open = |c: &Candidate| c.filters.as_ref().is_some_and(|f| f.is_empty());
        let Some(seen) = seen else {
            if idx.iter().all(|&i| open(&self.subs[i])) {
                return idx;
            }
            self.picked.clear();
            self.picked
                .extend(idx.iter().filter(|&&i| open(&self.subs[i])));
            return &self.picked;
        };
        // Read once, only what the filters see. Ingest refused a body that does not parse
        // (`crate::event_input`); should one ever reach here, no filter lets it through.
        let body: Option<Value> = seen.parse(&e.body).ok();
        self.picked.clear();
        for &i in idx {
            let keep = match (&self.subs[i].filters, &body) {
                (None, _) => false,
                (Some(fs), _) if fs.is_empty() => true,
                (Some(fs), Some(b)) => fs.iter().all(|f| f.matches(b)),
                (Some(_), None) => false,
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

    /// Types first, then both filters (each must match); a stored filter that does not compile
    /// and a body that does not parse let nothing through to a filtered subscriber.
    #[test]
    fn types_then_both_filters_body_parsed_once() {
        let row = |id: &str, types: &str, filter: Option<&str>, own: Option<&str>| CandidateRow {
            id: id.to_string(),
            event_types: types.to_string(),
            filter: filter.map(str::to_string),
            customer_filter: own.map(str::to_string),
            ordering: "none".to_string(),
            ordering_key: None,
        };
        let subs = candidates(vec![
            row("all", r#"["*"]"#, None, None),
            row(
                "big",
                r#"["invoice.*"]"#,
                Some(r#"{"amount":{"$gt":100}}"#),
                None,
            ),
            row(
                "eur",
                r#"["invoice.paid"]"#,
                Some(r#"{"currency":"EUR"}"#),
                None,
            ),
            row(
                "stale",
                r#"["invoice.*"]"#,
                Some(r#"{"a":{"$regex":"x"}}"#),
                None,
            ),
            row(
                "stale-own",
                r#"["invoice.*"]"#,
                None,
                Some(r#"{"a":{"$regex":"x"}}"#),
            ),
            row("video", r#"["video.*"]"#, Some(r#"{"a":1}"#), None),
            // The operator's filter routes acme's invoices; the customer narrows them.
            row(
                "acme",
                r#"["invoice.*"]"#,
                Some(r#"{"customer":"acme"}"#),
                Some(r#"{"currency":"EUR"}"#),
            ),
            row(
                "own",
                r#"["invoice.*"]"#,
                None,
                Some(r#"{"amount":{"$lt":10}}"#),
            ),
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
                &["all", "big", "eur"],
            ),
            (
                "invoice.paid",
                r#"{"amount":5,"currency":"EUR","customer":"acme"}"#,
                &["all", "eur", "acme", "own"],
            ),
            (
                "invoice.paid",
                r#"{"amount":5,"currency":"USD","customer":"acme"}"#,
                &["all", "own"],
            ),
            (
                "invoice.paid",
                r#"{"amount":5,"currency":"EUR","customer":"globex"}"#,
                &["all", "eur", "own"],
            ),
            ("invoice.sent", r#"{"amount":500}"#, &["all", "big"]),
            // Not JSON (ingest refuses it): only the unfiltered subscriber.
            ("invoice.sent", r#"{"amount":5"#, &["all"]),
            ("order.new", r#"{"amount":500}"#, &["all"]),
            ("video.up", r#"{"a":2}"#, &["all"]),
            ("video.up", r#"{"a":1}"#, &["all", "video"]),
        ];
        for (ty, body, want) in cases {
            assert_eq!(names(s.select(&ev(ty, body))), *want, "{ty} {body}");
        }
        // Only unfiltered and stale candidates of a type: the stale ones get nothing.
        let plain = candidates(vec![
            row("all", r#"["*"]"#, None, None),
            row("stale", r#"["*"]"#, Some("{\"a\":"), None),
        ]);
        let mut s = Selector::new(&plain);
        assert_eq!(s.select(&ev("x", "{}")), [0]);
    }
}
