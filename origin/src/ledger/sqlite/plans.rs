//! The query-plan test: every statement the ledger's hot paths run (ingest, claims, results,
//! leases, due lookups, lists by status, subscriber, event and time, replay ranges, stats,
//! retention) is recorded while they run on a small ledger, then `EXPLAIN QUERY PLAN` of each
//! must show no full scan of deliveries, attempts or events and no sort of their rows: every
//! one is a keyed lookup or an index range, so its cost does not grow with the ledger. The one
//! sort allowed is of a single event's deliveries read by their key (`bounded_sort`: at most
//! one per subscriber).

use std::sync::{Arc, Mutex};

use fanout_core::breaker::BreakerConfig;
use rusqlite::trace::{TraceEvent, TraceEventCodes};
use rusqlite::Connection;

use super::*;
use crate::ledger::{test_events, test_subscriber, DeliveryFilter, Finished};
use crate::model::Status;
use crate::model::{AttemptRecord, Outcome, Transition};

/// Run the ledger's operations on `c`, each kind of call once or more.
fn exercise(c: &Connection) {
    create_subscriber(c, &test_subscriber("a", &["*"]), "s").unwrap();
    create_subscriber(c, &test_subscriber("b", &["*"]), "s").unwrap();
    ingest(c, &test_events(12), 100).unwrap();
    let claims = claim(c, &[("a".into(), 6), ("b".into(), 2)], &[], 200, 10_000).unwrap();
    let ids: Vec<i64> = claims[0].claimed.iter().map(|d| d.rowid).collect();
    let attempt = |outcome| {
        Some(AttemptRecord {
            attempt: 1,
            at_ms: 300,
            lane: "origin",
            outcome,
            status: Some(500),
            latency_ms: Some(2),
            response_body: None,
            error: Some("boom".into()),
        })
    };
    let outcomes = vec![
        Outcome {
            rowid: ids[0],
            transition: Transition::Sent,
            attempt: attempt("delivered"),
        },
        Outcome {
            rowid: ids[1],
            transition: Transition::Retry {
                at_ms: 900,
                error: "boom".into(),
            },
            attempt: attempt("failed"),
        },
        Outcome {
            rowid: ids[2],
            transition: Transition::Dead {
                reason: "gone".into(),
            },
            attempt: attempt("rejected"),
        },
        Outcome {
            rowid: ids[3],
            transition: Transition::Defer { at_ms: 800 },
            attempt: None,
        },
    ];
    apply(c, &outcomes, &[], 300).unwrap();
    // The dead-count rule after a turn (a threshold of 1: the dead one crosses it) and its
    // re-arming at each due-work read.
    check_dead_counts(c, &["a".into()], 1, 300).unwrap();
    rearm_dead_alerts(c, 100).unwrap();
    release_expired_leases(c, 20_000).unwrap();
    release_all_leases(c, 20_000).unwrap();
    due_summary(c).unwrap();
    let statuses = [None].into_iter().chain(Status::ALL.into_iter().map(Some));
    for status in statuses {
        for subscriber in [None, Some("a".to_string())] {
            for event in [None, Some("e1".to_string())] {
                for (since_ms, until_ms) in [
                    (None, None),
                    (Some(50), None),
                    (None, Some(150)),
                    (Some(50), Some(150)),
                ] {
                    for after in [None, Some(ids[0])] {
                        let f = DeliveryFilter {
                            status,
                            subscriber: subscriber.clone(),
                            event: event.clone(),
                            since_ms,
                            until_ms,
                            after,
                            limit: 100,
                            ..Default::default()
                        };
                        list_deliveries(c, &f).unwrap();
                        // The portal's scope and the type filter on top of each.
                        let scoped = DeliveryFilter {
                            event_type: Some("t".into()),
                            customer: Some("acme".into()),
                            ..f
                        };
                        list_deliveries(c, &scoped).unwrap();
                    }
                }
            }
        }
    }
    get_delivery(c, ids[0]).unwrap();
    replay_one(c, ids[2], 400).unwrap();
    for (status, subscriber, since_ms, until_ms) in [
        (None, None, None, None),
        (
            Some(Status::Sent),
            Some("a".to_string()),
            Some(50),
            Some(150),
        ),
        (Some(Status::Pending), None, Some(50), None),
    ] {
        let f = DeliveryFilter {
            status,
            subscriber,
            since_ms,
            until_ms,
            limit: 500,
            ..Default::default()
        };
        replay_step(c, &f, 500).unwrap();
    }
    status_counts(c).unwrap();
    subscriber_stats(c, BreakerConfig::default(), 600).unwrap();
    let mut counts = status::subscriber_counts(c, &["a".into(), "b".into()], 600).unwrap();
    status::since_creation(c, &list_subscribers(c).unwrap(), &mut counts).unwrap();
    dead_count_capped(c, "a", 100).unwrap();
    retention::report(c).unwrap();
    retention::purge_finished(c, Finished::Sent, 10_000, 100).unwrap();
    retention::purge_finished(c, Finished::Dead, 10_000, 100).unwrap();
    retention::sweep_events(c, 10_000, 100).unwrap();
    delete_subscriber(c, "b", 700).unwrap();
}

/// `EXPLAIN QUERY PLAN` of `sql`, every parameter bound to NULL (the plan does not depend on
/// the values: the daemon never runs ANALYZE), one detail line per step.
fn plan_of(c: &Connection, sql: &str) -> Vec<String> {
    let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    for i in 1..=st.parameter_count() {
        st.raw_bind_parameter(i, rusqlite::types::Null).unwrap();
    }
    let mut rows = st.raw_query();
    let mut out = Vec::new();
    while let Some(r) = rows.next().unwrap() {
        out.push(r.get::<_, String>(3).unwrap());
    }
    out
}

/// A step that reads a whole big table (or an index over all of it), or sorts rows.
fn is_scan(step: &str) -> bool {
    let big = ["deliveries", "d", "attempts", "a", "events", "e"];
    let scanned = step
        .strip_prefix("SCAN ")
        .and_then(|rest| rest.split_whitespace().next())
        .is_some_and(|t| big.contains(&t));
    scanned || step.contains("TEMP B-TREE FOR ORDER BY")
}

#[test]
fn no_hot_query_scans_the_ledger() {
    let mut c = test_db();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    c.trace_v2(
        TraceEventCodes::SQLITE_TRACE_PROFILE,
        Some(move |e: TraceEvent<'_>| {
            if let TraceEvent::Profile(st, _) = e {
                log.lock().unwrap().push(st.sql().into_owned());
            }
        }),
    )
    .unwrap();
    exercise(&c);
    c.trace_v2(TraceEventCodes::empty(), None::<fn(TraceEvent<'_>)>)
        .unwrap();
    let mut statements = seen.lock().unwrap().clone();
    statements.sort();
    statements.dedup();
    let statements: Vec<String> = statements
        .into_iter()
        .filter(|s| {
            s.trim_start().to_ascii_uppercase().starts_with("SELECT")
                || ["UPDATE", "DELETE", "INSERT", "WITH"]
                    .iter()
                    .any(|k| s.trim_start().to_ascii_uppercase().starts_with(k))
        })
        .collect();
    assert!(
        statements.len() > 30,
        "too few statements recorded: {statements:#?}"
    );
    let mut bad = Vec::new();
    for sql in &statements {
        let plan = plan_of(&c, sql);
        let big = ["deliveries", "attempts", "events"].iter().any(|t| {
            sql.split(|ch: char| !ch.is_alphanumeric() && ch != '_')
                .any(|w| w == *t)
        });
        if big && plan.iter().any(|s| is_scan(s) && !bounded_sort(s, &plan)) {
            bad.push(format!("{sql}\n  {}", plan.join("\n  ")));
        }
    }
    if std::env::var_os("FANOUT_PRINT_PLANS").is_some() {
        for sql in &statements {
            eprintln!("{sql}\n  {}\n", plan_of(&c, sql).join("\n  "));
        }
    }
    assert!(
        bad.is_empty(),
        "full scans or sorts:\n\n{}",
        bad.join("\n\n")
    );
}

/// A sort of one event's deliveries, read by their `(event_id, subscriber_id)` key: at most
/// one row per subscriber, however large the ledger grows (lists by event, in id order).
fn bounded_sort(step: &str, plan: &[String]) -> bool {
    step.contains("TEMP B-TREE FOR ORDER BY")
        && plan
            .iter()
            .any(|s| s.starts_with("SEARCH d USING INDEX deliveries_event_subscriber (event_id=?"))
}

#[test]
fn bounded_sort_table() {
    let one_event = "SEARCH d USING INDEX deliveries_event_subscriber (event_id=?)".to_string();
    let by_status = "SEARCH d USING INDEX deliveries_status (status=?)".to_string();
    let sort = "USE TEMP B-TREE FOR ORDER BY";
    assert!(bounded_sort(sort, std::slice::from_ref(&one_event)));
    assert!(!bounded_sort(sort, std::slice::from_ref(&by_status)));
    assert!(!bounded_sort("SCAN d", &[one_event]));
}

#[test]
fn scan_detection_table() {
    for (step, scan) in [
        ("SCAN d", true),
        ("SCAN deliveries USING INDEX deliveries_status", true),
        ("SCAN attempts", true),
        ("USE TEMP B-TREE FOR ORDER BY", true),
        ("SEARCH d USING INTEGER PRIMARY KEY (rowid>?)", false),
        (
            "SEARCH d USING INDEX deliveries_status (status=? AND rowid>?)",
            false,
        ),
        ("SCAN json_each VIRTUAL TABLE INDEX 0:", false),
        ("SCAN subscribers", false),
    ] {
        assert_eq!(is_scan(step), scan, "{step}");
    }
}

/// The counts the triggers keep equal a count of the rows after every kind of change the
/// ledger makes (ingest, claims, each result, lease releases, replays, a removed subscriber,
/// retention), and `last_errors` holds each subscriber's latest failed attempt.
#[test]
fn counts_kept_by_triggers_match_the_rows() {
    let c = test_db();
    exercise(&c);
    let rows = |sql: &str| -> Vec<(String, String, i64)> {
        c.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let kept = rows(
        "SELECT subscriber_id, status, n FROM delivery_counts WHERE n <> 0
         ORDER BY subscriber_id, status",
    );
    let counted = rows(
        "SELECT subscriber_id, status, COUNT(*) FROM deliveries
         GROUP BY subscriber_id, status ORDER BY subscriber_id, status",
    );
    assert_eq!(kept, counted);
    assert!(counted.len() >= 2, "{counted:?}");
    let last: Vec<(String, i64)> = c
        .prepare("SELECT subscriber_id, at_ms FROM last_errors ORDER BY subscriber_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(last, vec![("a".to_string(), 300)]);
}
