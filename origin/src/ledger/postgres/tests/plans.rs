//! The PostgreSQL ledger's query plans and upkeep, against a throwaway server
//! (tests/common/pg.rs): every hot statement reads by an index, a queue that outgrows its
//! statistics is analyzed, churned tables are vacuumed.

use super::fixtures::{add, claim, ev, evs, ledgers, sent, sub, turn, BREAKER, LEASE};
use super::pg::PgServer;
use crate::ledger::postgres::PgLedger;
use crate::ledger::Retention as _;
use crate::ledger::{
    Deliveries, DeliveryFilter, DispatchLedger, Outcome, Subscribers, Transition, Turn,
};
use crate::model::Status;
use fanout_core::retry::Attempt;

/// The query-plan test on PostgreSQL (SQLite's is `ledger/plans.rs`): every statement the hot
/// paths run (ingest, claims, results, leases, due lookups, lists by status, subscriber,
/// event, type and time, replays, counts and stats, dead counts, retention and its report,
/// the fold) is taken from the server's own statement log while two daemons run them on a
/// small ledger, then planned generically with sequential scans priced out: none may scan
/// deliveries, attempts or events whole, and none may sort deliveries it read without a bound
/// (a list's order comes from its indexes, so its cost does not grow with the ledger).
#[tokio::test]
async fn every_statement_of_the_hot_paths_uses_an_index_on_postgres() {
    let server = PgServer::start();
    let url = server.database("plans").await;
    // Migrations are not a hot path: they run before the log is turned on.
    PgLedger::open(&url, "migrate").await.unwrap();
    server
        .connect("plans")
        .await
        .batch_execute("ALTER DATABASE plans SET log_statement = 'all'")
        .await
        .unwrap();
    let l = [
        PgLedger::open(&url, "d0").await.unwrap(),
        PgLedger::open(&url, "d1").await.unwrap(),
    ];
    for id in ["a", "b"] {
        add(&l[0], sub(id, &["t"], 1e6, 1_000_000, 1_000)).await;
    }
    l[0].ingest(evs("e", 20), 0).await.unwrap();
    l[1].ingest(vec![ev("lonely", "other")], 0).await.unwrap();
    let claimed = claim(&l[0], &[("a", 8), ("b", 4)], 1, LEASE).await;
    let ids: Vec<i64> = claimed[0].claimed.iter().map(|d| d.rowid).collect();
    let lease_until = 1 + LEASE;
    record_and_release(&l, &ids, lease_until).await;
    read_and_purge(&l, &ids).await;

    let statements: Vec<String> = logged_statements(&server.log())
        .into_iter()
        .filter(|s| {
            ["deliveries", "attempts", "events"]
                .iter()
                .any(|t| names(s, t))
        })
        .collect();
    assert!(
        statements.len() >= 20,
        "the log holds the hot statements: {statements:#?}"
    );
    let c = server.connect("plans").await;
    let bad = bad_plans(&c, &statements, true, plan_problems).await;
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
    the_checker_refuses_and_passes();
}

/// Results of every kind with the shared limiter's feedback, lease renewal and release, the
/// due summary and the dead-count alert, for the plan test's statement log.
async fn record_and_release(l: &[PgLedger; 2], ids: &[i64], lease_until: i64) {
    let mut retry = sent(ids[1], 2);
    retry.transition = Transition::Retry {
        at_ms: 5,
        error: "status 500".into(),
    };
    if let Some(a) = retry.attempt.as_mut() {
        a.outcome = "failed";
    }
    let mut dead = sent(ids[2], 2);
    dead.transition = Transition::Dead {
        reason: "410".into(),
    };
    let defer = Outcome {
        rowid: ids[3],
        transition: Transition::Defer { at_ms: 9 },
        attempt: None,
    };
    // One turn as the dispatcher writes it: results of every kind, the daemon's limiter (its
    // copy took the 200), the dead-count check, and a claim.
    let (s, mut limiter) = l[0].dispatch_subscriber("a").await.unwrap().unwrap();
    let ok = Attempt::Status {
        status: 200,
        retry_after_ms: None,
    };
    limiter.record(s.limits.core(BREAKER), &ok, 2);
    let t = Turn {
        now_ms: 2,
        outcomes: vec![sent(ids[0], 2), retry, dead, defer],
        limiters: vec![("a".into(), limiter)],
        dead: vec!["a".into()],
        dead_threshold: 1,
        claims: vec![("a".into(), 1)],
        lease_until_ms: 2 + LEASE,
        ..Turn::default()
    };
    turn(&l[0], t).await;
    l[0].renew_leases(3).await.unwrap();
    l[1].release_expired_leases(lease_until + 1).await.unwrap();
    l[1].release_own_leases(4).await.unwrap();
    l[0].due_summary().await.unwrap();
    l[0].rearm_dead_alerts(5).await.unwrap();
}

/// Every list filter, a replay of one and of many, counts, stats, a retention pass and its
/// report, the fold and a removal, for the plan test's statement log.
async fn read_and_purge(l: &[PgLedger; 2], ids: &[i64]) {
    use crate::ledger::store::Store;
    let filters = [
        DeliveryFilter::default(),
        DeliveryFilter {
            status: Some(Status::Dead),
            ..Default::default()
        },
        DeliveryFilter {
            subscriber: Some("a".into()),
            ..Default::default()
        },
        DeliveryFilter {
            subscriber: Some("a".into()),
            status: Some(Status::Pending),
            after: Some(ids[0]),
            ..Default::default()
        },
        DeliveryFilter {
            event: Some("e00003".into()),
            ..Default::default()
        },
        DeliveryFilter {
            event_type: Some("t".into()),
            ..Default::default()
        },
        DeliveryFilter {
            since_ms: Some(0),
            until_ms: Some(10),
            ..Default::default()
        },
        DeliveryFilter {
            status: Some(Status::Pending),
            since_ms: Some(0),
            ..Default::default()
        },
        DeliveryFilter {
            status: Some(Status::InFlight),
            ..Default::default()
        },
        DeliveryFilter {
            status: Some(Status::Sent),
            subscriber: Some("a".into()),
            ..Default::default()
        },
    ];
    for f in &filters {
        let f = DeliveryFilter {
            limit: 100,
            ..f.clone()
        };
        Deliveries::list_deliveries(&l[1], f.clone()).await.unwrap();
    }
    Deliveries::get_delivery(&l[1], ids[0], None).await.unwrap();
    Deliveries::replay_one(&l[1], ids[2], 6, None)
        .await
        .unwrap();
    l[1].replay_step(
        &DeliveryFilter {
            subscriber: Some("b".into()),
            status: Some(Status::Dead),
            limit: 500,
            ..Default::default()
        },
        7,
    )
    .await
    .unwrap();
    l[1].status_counts().await.unwrap();
    l[1].subscriber_stats(BREAKER, 8).await.unwrap();
    l[1].subscriber_counts(&["a".to_string(), "b".to_string()], 8)
        .await
        .unwrap();
    let store = Store::Postgres(l[1].clone());
    crate::retention::pass(
        &store,
        &crate::retention::Retention {
            sent_ms: Some(1),
            dead_ms: Some(1),
        },
        1_000,
        &Default::default(),
        2,
    )
    .await
    .unwrap();
    store.retention_report().await.unwrap();
    l[1].fold_counts().await.unwrap();
    Subscribers::delete_subscriber(&l[0], "b".into(), 9)
        .await
        .unwrap();
}

/// The plan checker itself, on plans it must refuse and one it must pass.
fn the_checker_refuses_and_passes() {
    let refused = [
        "Seq Scan on deliveries d  (cost=0.00..1.00 rows=1 width=8)",
        "Aggregate  (cost=1.00..1.00 rows=1 width=8)\n  ->  Index Only Scan using deliveries_pkey on deliveries  (cost=0.00..1.00 rows=1 width=8)",
        "Limit  (cost=1.00..1.00 rows=1 width=8)\n  ->  Sort  (cost=1.00..1.00 rows=1 width=8)\n        Sort Key: d.id\n        ->  Bitmap Heap Scan on deliveries d  (cost=0.00..1.00 rows=1 width=8)\n              Recheck Cond: (subscriber_id = $1)\n              ->  Bitmap Index Scan on deliveries_dead_by_sub  (cost=0.00..1.00 rows=1 width=0)\n                    Index Cond: (subscriber_id = $1)",
    ];
    for plan in refused {
        assert!(!plan_problems(plan).is_empty(), "{plan}");
    }
    let merged = "Limit  (cost=1.00..1.00 rows=1 width=8)\n  ->  Sort  (cost=1.00..1.00 rows=1 width=8)\n        ->  Nested Loop  (cost=1.00..1.00 rows=1 width=8)\n              ->  Limit  (cost=0.00..1.00 rows=1 width=8)\n                    ->  Index Scan using deliveries_dead_by_sub on deliveries d  (cost=0.00..1.00 rows=1 width=8)\n                          Index Cond: ((subscriber_id = s.subscriber_id) AND (id > $1))";
    assert_eq!(plan_problems(merged), Vec::<String>::new());
}

/// A queue that outgrows its planner statistics (a new ledger, a backlog grown within a
/// minute) has them refreshed by the daemon, once per doubling; and a turn's statements are
/// then planned, with the server's own settings, to read pending deliveries by the due index
/// (never sorting a subscriber's backlog) and each subscriber's leases once (in-flight rows
/// are too short-lived for any statistics — here, as usual, none were in flight when they
/// were taken: the plan must not depend on them).
#[tokio::test]
async fn a_queue_that_outgrows_its_statistics_is_analyzed_and_turns_read_it_by_index() {
    let server = PgServer::start();
    let url = server.database("stats").await;
    let l = PgLedger::open(&url, "d0").await.unwrap();
    for id in ["a", "b"] {
        add(&l, sub(id, &["t"], 1e6, 1_000_000, 1_000)).await;
    }
    assert!(
        !l.refresh_statistics().await.unwrap(),
        "nothing has changed"
    );
    for chunk in evs("e", 6_000).chunks(500) {
        l.ingest(chunk.to_vec(), 0).await.unwrap();
    }
    let c = server.connect("stats").await;
    // The server's activity counters take a moment to publish (bounded: 10 s).
    for k in 0.. {
        let changed: i64 = c
            .query_one(
                "SELECT COALESCE(n_mod_since_analyze, 0) FROM pg_stat_user_tables
                 WHERE relname = 'deliveries'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if changed >= 12_000 {
            break;
        }
        assert!(k < 200, "the server never counted the changes ({changed})");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        l.refresh_statistics().await.unwrap(),
        "12,000 rows inserted"
    );
    let analyzed: bool = c
        .query_one(
            "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'deliveries'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(analyzed);
    assert!(
        !l.refresh_statistics().await.unwrap(),
        "just refreshed: nothing to do"
    );

    c.batch_execute("ALTER DATABASE stats SET log_statement = 'all'")
        .await
        .unwrap();
    // A daemon connecting now: its statements go to the log.
    let d = PgLedger::open(&url, "d1").await.unwrap();
    let claims = vec![("a".to_string(), 100), ("b".to_string(), 100)];
    let leased = d
        .record_turn(Turn {
            now_ms: 10,
            claims: claims.clone(),
            lease_until_ms: 10 + LEASE,
            ..Turn::default()
        })
        .await
        .map_err(|e| e.error)
        .unwrap();
    let outcomes: Vec<Outcome> = leased
        .claims
        .iter()
        .flat_map(|c| c.claimed.iter())
        .map(|x| sent(x.rowid, 11))
        .collect();
    assert_eq!(outcomes.len(), 200);
    d.record_turn(Turn {
        now_ms: 11,
        outcomes,
        claims,
        lease_until_ms: 11 + LEASE,
        ..Turn::default()
    })
    .await
    .map_err(|e| e.error)
    .unwrap();
    let statements: Vec<String> = logged_statements(&server.log())
        .into_iter()
        .filter(|s| names(s, "deliveries"))
        .collect();
    assert!(
        statements.len() >= 5,
        "the log holds the turn's statements: {statements:#?}"
    );
    let bad = bad_plans(&c, &statements, false, turn_plan_problems).await;
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
}

/// The churned tables are vacuumed by the daemon once a share of them is dead, so the space of
/// rewritten and removed rows is reused instead of the files growing (issue 27: with the
/// server's defaults a crash recovery resets the counts autovacuum waits on, and it looks once
/// a minute). Rewriting every delivery six times with the daemon's vacuum between the
/// rewrites keeps `deliveries` near one generation's size; a table with few dead rows is left.
#[tokio::test]
async fn churned_tables_are_vacuumed_and_their_space_reused() {
    let server = PgServer::start();
    let l = ledgers(&server, "vacuum", 1).await.remove(0);
    add(&l, sub("v", &["*"], 10.0, 20, 8)).await;
    l.ingest(evs("v", 3_000), 0).await.unwrap();
    let c = server.connect("vacuum").await;
    let stat = |col: &'static str| {
        let c = &c;
        async move {
            let q = format!("SELECT {col} FROM pg_stat_user_tables WHERE relname = 'deliveries'");
            c.query_one(&q, &[]).await.unwrap().get::<_, i64>(0)
        }
    };
    let size = || async {
        c.query_one("SELECT pg_relation_size('deliveries')", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // Rewrite every delivery (each version is a dead tuple) and wait for the server to
    // publish the count the daemon reads.
    let churn = || async {
        let before = stat("n_dead_tup").await;
        c.batch_execute(
            "UPDATE deliveries SET updated_ms = updated_ms + 1; SELECT pg_stat_force_next_flush()",
        )
        .await
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stat("n_dead_tup").await < before + 3_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "dead tuples never counted"
            );
            c.batch_execute("SELECT pg_stat_force_next_flush()")
                .await
                .unwrap();
        }
    };
    let one_generation = size().await;
    // Below the threshold nothing is vacuumed.
    c.batch_execute("UPDATE deliveries SET updated_ms = updated_ms + 1 WHERE id % 10 = 0")
        .await
        .unwrap();
    assert_eq!(l.vacuum_churned().await.unwrap(), Vec::<String>::new());
    for _ in 0..6 {
        churn().await;
        assert!(
            l.vacuum_churned()
                .await
                .unwrap()
                .contains(&"deliveries".to_string()),
            "3,000 dead of 3,000 live: vacuumed"
        );
    }
    // Measured: 1.9 times one generation; without the daemon's vacuum, 4.1 times.
    let after = size().await;
    assert!(
        after <= one_generation * 5 / 2,
        "six rewrites vacuumed between them: {after} bytes, one generation {one_generation}"
    );
    assert!(stat("vacuum_count").await >= 6);
}

/// Every statement in a PostgreSQL server log written with `log_statement = 'all'`, as sent
/// (extended protocol `execute …:` and simple `statement:` entries; an entry runs on until the
/// next line that starts with a timestamp).
fn logged_statements(log: &str) -> Vec<String> {
    let starts_entry = |line: &str| {
        let b = line.as_bytes();
        b.len() > 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
    };
    let mut entries: Vec<String> = Vec::new();
    for line in log.lines() {
        if starts_entry(line) || entries.is_empty() {
            entries.push(line.to_string());
        } else if let Some(last) = entries.last_mut() {
            last.push('\n');
            last.push_str(line);
        }
    }
    let mut out = Vec::new();
    for e in entries {
        let sql = if let Some(i) = e.find("LOG:  execute ") {
            let rest = &e[i + "LOG:  execute ".len()..];
            rest.find(": ").map(|j| &rest[j + 2..])
        } else {
            e.find("LOG:  statement: ")
                .map(|i| &e[i + "LOG:  statement: ".len()..])
        };
        if let Some(sql) = sql {
            let sql = sql.trim().to_string();
            if !out.contains(&sql) {
                out.push(sql);
            }
        }
    }
    out
}

/// Whether `sql` names `table` as a word.
fn names(sql: &str, table: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    sql.match_indices(table).any(|(i, _)| {
        !word(sql[..i].chars().next_back()) && !word(sql[i + table.len()..].chars().next())
    })
}

/// The plan of `sql` as PostgreSQL would run it with any arguments (a generic plan). With
/// `priced_out`, sequential scans and sorts are priced out: one shows up only where no index
/// can serve (a tiny test table would otherwise be read whole and sorted, cheaper there than
/// anything); else the server's own settings plan it.
async fn planned(
    c: &tokio_postgres::Client,
    sql: &str,
    priced_out: bool,
) -> Result<String, String> {
    let params = (1..=99)
        .filter(|k| sql.contains(&format!("${k}")))
        .max()
        .unwrap_or(0);
    let settings = if priced_out {
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off;"
    } else {
        ""
    };
    c.batch_execute(&format!(
        "DEALLOCATE ALL; BEGIN; {settings} SET LOCAL plan_cache_mode = force_generic_plan"
    ))
    .await
    .map_err(|e| e.to_string())?;
    let plan = async {
        c.batch_execute(&format!("PREPARE hot AS {sql}")).await?;
        let args = vec!["NULL"; params].join(", ");
        let explain = if params == 0 {
            "EXPLAIN EXECUTE hot".to_string()
        } else {
            format!("EXPLAIN EXECUTE hot({args})")
        };
        let mut lines = Vec::new();
        for m in c.simple_query(&explain).await? {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                lines.push(r.get(0).unwrap_or_default().to_string());
            }
        }
        Ok::<_, tokio_postgres::Error>(lines.join("\n"))
    }
    .await;
    c.batch_execute("ROLLBACK")
        .await
        .map_err(|e| e.to_string())?;
    plan.map_err(|e| format!("{e:?}"))
}

/// Each statement planned (see [`planned`]) and its plan checked by `problems`: the statements
/// that have any, or cannot be planned, each with why and its plan.
async fn bad_plans(
    c: &tokio_postgres::Client,
    statements: &[String],
    priced_out: bool,
    problems: fn(&str) -> Vec<String>,
) -> Vec<String> {
    let mut bad = Vec::new();
    for sql in statements {
        match planned(c, sql, priced_out).await {
            Ok(plan) => {
                let found = problems(&plan);
                if !found.is_empty() {
                    bad.push(format!("{sql}\n{}\n{plan}", found.join("\n")));
                }
            }
            Err(e) => bad.push(format!("{sql}\ncannot plan: {e}")),
        }
    }
    bad
}

/// Whether a scan's index condition picks rows by key (a delivery id or ids, an event): a few
/// rows, whatever else is filtered.
fn limited_by_cond(detail: &str) -> bool {
    detail.lines().any(|l| {
        (l.starts_with("Index Cond:") || l.starts_with("Recheck Cond:"))
            && ["(id = ", "id = ANY", "event_id = "]
                .iter()
                .any(|k| l.contains(k))
    })
}

/// What is wrong with `plan` (EXPLAIN's text), if anything: a read of deliveries, attempts or
/// events that is not bounded — a sequential scan, an index scan with no index condition and
/// no Limit above it, deliveries read by a range and filtered by subscriber or status (the
/// index that holds them in order is missing) — or a Sort of deliveries read with no Limit
/// between them. Reads by
/// the lease index (bounded by the in-flight caps) and by event (one per subscriber at most)
/// are bounded.
fn plan_problems(plan: &str) -> Vec<String> {
    // (depth, node, its detail lines): the root at 0, every other node where its "->" stands.
    let mut nodes: Vec<(usize, String, String)> = Vec::new();
    for l in plan.lines() {
        match l.find("->") {
            Some(i) => nodes.push((i, l[i + 2..].trim().to_string(), String::new())),
            None if !l.starts_with(' ') => nodes.push((0, l.trim().to_string(), String::new())),
            None => {
                if let Some(last) = nodes.last_mut() {
                    last.2.push_str(l.trim());
                    last.2.push('\n');
                }
            }
        }
    }
    let small = |node: &str| {
        [
            "deliveries_leased",
            "deliveries_by_event",
            "deliveries_event_id_subscriber_id_key",
        ]
        .iter()
        .any(|i| node.contains(&format!("{i} ")))
    };
    let tables = [" on deliveries", " on attempts", " on events"];
    let mut problems = Vec::new();
    // The nodes from the root down to the current one: (depth, is a Limit, is a Sort).
    let mut path: Vec<(usize, bool, bool)> = Vec::new();
    for (k, (depth, node, detail)) in nodes.iter().enumerate() {
        while path.last().is_some_and(|(d, _, _)| d >= depth) {
            path.pop();
        }
        let on_table = tables.iter().any(|t| node.contains(t));
        let bitmap_child = nodes
            .get(k + 1)
            .filter(|(d, n, _)| d > depth && n.starts_with("Bitmap Index Scan"));
        let bounded = small(node) || bitmap_child.is_some_and(|(_, n, _)| small(n));
        let limited = path.iter().any(|(_, limit, _)| *limit);
        if on_table && node.starts_with("Seq Scan") {
            problems.push(format!("reads a whole table: {node}"));
        }
        let conditioned = detail.contains("Index Cond") || bitmap_child.is_some();
        if on_table && node.contains("Index") && !conditioned && !bounded && !limited {
            problems.push(format!("reads a whole index: {node}"));
        }
        // Rows of deliveries read by one index and thrown away for their subscriber or
        // status: the index that has them in order is missing.
        // (A partial index by status shows its own predicate as a filter in a generic plan;
        // and with sorts priced out an in-flight list walks the key instead of sorting the
        // few leased rows it would read by the lease index, bounded by the in-flight caps.)
        let by_key = node.contains("deliveries_pkey");
        let filtered = detail.lines().any(|l| {
            l.starts_with("Filter:")
                && ((l.contains("subscriber_id") && !l.contains("'in_flight'"))
                    || (by_key && l.contains("status") && !l.contains("'in_flight'")))
        });
        if node.contains(" on deliveries ") && filtered && !bounded && !limited_by_cond(detail) {
            problems.push(format!("filters rows an index should select: {node}"));
        }
        // A Sort above this read of deliveries, with no Limit between them.
        if node.contains(" on deliveries") && !bounded {
            let mut below_limit = false;
            for (_, limit, sort) in path.iter().rev() {
                if *sort && !below_limit {
                    problems.push(format!("sorts an unbounded read: {node}"));
                    break;
                }
                below_limit |= *limit;
            }
        }
        path.push((*depth, node.starts_with("Limit"), node.starts_with("Sort")));
    }
    problems
}

/// What is wrong with the plan of a statement of a turn (EXPLAIN's text, the server's own
/// settings): a read of the API's pending list index (a turn reads pending deliveries in due
/// order, `deliveries_due`; the list index would make it sort a subscriber's whole backlog),
/// or a read of the leases with no index condition below a nested loop (once per outer row).
fn turn_plan_problems(plan: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut loops: Vec<usize> = Vec::new(); // depths of the nested loops above
    let lines: Vec<&str> = plan.lines().collect();
    for (k, l) in lines.iter().enumerate() {
        let depth = match l.find("->") {
            Some(d) => d,
            None if !l.starts_with(' ') => 0,
            None => continue, // a detail line of the node above
        };
        while loops.last().is_some_and(|d| *d >= depth) {
            loops.pop();
        }
        if l.contains("using deliveries_pending_by_sub") {
            problems.push(format!("reads the pending list index: {}", l.trim()));
        }
        if l.contains("deliveries_leased") && !loops.is_empty() {
            let detail = lines[k + 1..]
                .iter()
                .take_while(|d| !d.contains("->"))
                .any(|d| d.contains("Index Cond"));
            if !detail {
                problems.push(format!(
                    "reads every lease once per outer row: {}",
                    l.trim()
                ));
            }
        }
        if l.contains("Nested Loop") {
            loops.push(depth);
        }
    }
    problems
}
