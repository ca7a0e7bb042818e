//! The producer's outbox, end to end: the real `fanout` binary reading a producer's real
//! SQLite file or a throwaway real PostgreSQL, into a real SQLite ledger, delivering to a real
//! subscriber. `fanout outbox schema|init`; committed rows delivered and the outbox emptied; a
//! rolled-back transaction producing nothing; an invalid row moved to `<table>_rejected` while
//! the rows behind it flow; two daemons on one PostgreSQL outbox taking each row once; kill -9
//! while producers commit; a ledger that cannot write keeping the rows; `/healthz` naming an
//! outbox it cannot read; the metrics.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::pg::PgServer;
use common::{sub_spec, wait_for, Binary, Subscriber};
use serde_json::json;

fn fanout(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn init(db: &str) {
    let (ok, _, err) = fanout(&["outbox", "init", "--db", db]);
    assert!(ok, "outbox init {db}: {err}");
}

fn event(id: &str) -> String {
    json!({ "id": id, "type": "order.created", "total": 12 }).to_string()
}

/// A producer's SQLite file with a business table beside the outbox.
fn sqlite_producer(path: &Path) -> rusqlite::Connection {
    init(path.to_str().unwrap());
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)",
    )
    .unwrap();
    c
}

/// One producer transaction: the business rows and their outbox rows, committed or not.
fn sqlite_commit(c: &mut rusqlite::Connection, payloads: &[String], commit: bool) {
    let tx = c.transaction().unwrap();
    for p in payloads {
        tx.execute("INSERT INTO orders (id) VALUES (?1)", [p])
            .unwrap();
        tx.execute("INSERT INTO fanout_outbox (payload) VALUES (?1)", [p])
            .unwrap();
    }
    if commit {
        tx.commit().unwrap();
    } else {
        tx.rollback().unwrap();
    }
}

fn sqlite_count(path: &Path, sql: &str) -> i64 {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

async fn pg_producer(server: &PgServer) -> (String, tokio_postgres::Client) {
    let url = server.database("shop").await;
    init(&url);
    let c = server.connect("shop").await;
    c.batch_execute("CREATE TABLE orders (id text PRIMARY KEY)")
        .await
        .unwrap();
    (url, c)
}

async fn pg_commit(c: &mut tokio_postgres::Client, payloads: &[String], commit: bool) {
    let tx = c.transaction().await.unwrap();
    for p in payloads {
        tx.execute("INSERT INTO orders (id) VALUES ($1)", &[p])
            .await
            .unwrap();
        tx.execute(
            "INSERT INTO fanout_outbox (payload) VALUES ($1::text::json)",
            &[p],
        )
        .await
        .unwrap();
    }
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
}

async fn pg_count(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// The ledger's events and deliveries (each event delivered to the one subscriber once).
fn ledger_counts(ledger: &Path) -> (i64, i64) {
    (
        sqlite_count(ledger, "SELECT count(*) FROM events"),
        sqlite_count(ledger, "SELECT count(*) FROM deliveries"),
    )
}

async fn subscribe(b: &Binary) -> Subscriber {
    let sub = Subscriber::ok().await;
    b.api
        .subscriber(sub_spec("shop", &sub.url, &["order.*"]))
        .await;
    sub
}

#[test]
fn schema_prints_the_ddl_of_each_kind_and_refuses_a_bad_table() {
    let (ok, sqlite, _) = fanout(&["outbox", "schema", "--db", "/tmp/shop.db"]);
    assert!(ok);
    assert!(
        sqlite.contains("CREATE TABLE IF NOT EXISTS \"fanout_outbox\" ("),
        "{sqlite}"
    );
    assert!(sqlite.contains("AUTOINCREMENT"), "{sqlite}");
    assert!(sqlite.contains("fanout_outbox_rejected"), "{sqlite}");
    let (ok, pg, _) = fanout(&[
        "outbox",
        "schema",
        "--db",
        "postgres://shop@127.0.0.1:5432/shop",
        "--table",
        "events_out",
    ]);
    assert!(ok);
    assert!(
        pg.contains("CREATE TABLE IF NOT EXISTS \"events_out\" ("),
        "{pg}"
    );
    assert!(pg.contains("payload json NOT NULL"), "{pg}");
    assert!(pg.contains("pg_notify('events_out'"), "{pg}");
    assert!(pg.contains("events_out_rejected"), "{pg}");
    let (ok, _, err) = fanout(&["outbox", "schema", "--db", "x.db", "--table", "x; drop"]);
    assert!(!ok);
    assert!(err.contains("must be 1 to 50 characters"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_is_idempotent_on_both_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.db");
    let db = file.to_str().unwrap();
    init(db);
    init(db);
    for t in ["fanout_outbox", "fanout_outbox_rejected"] {
        let n = sqlite_count(
            &file,
            &format!("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '{t}'"),
        );
        assert_eq!(n, 1, "{t}");
    }
    let server = PgServer::start();
    let url = server.database("shop").await;
    init(&url);
    init(&url);
    let c = server.connect("shop").await;
    let tables = pg_count(
        &c,
        "SELECT count(*) FROM pg_tables WHERE tablename IN ('fanout_outbox', 'fanout_outbox_rejected')",
    )
    .await;
    assert_eq!(tables, 2);
    let triggers = pg_count(
        &c,
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'fanout_outbox_notify'",
    )
    .await;
    assert_eq!(triggers, 1);

    // A reserved word is a table name like any other (every statement quotes it), and a
    // database that cannot be created says so.
    let (ok, _, err) = fanout(&["outbox", "init", "--db", db, "--table", "select"]);
    assert!(ok, "{err}");
    let n = sqlite_count(&file, "SELECT count(*) FROM \"select_rejected\"");
    assert_eq!(n, 0);
    let (ok, _, err) = fanout(&["outbox", "init", "--db", &url, "--table", "select"]);
    assert!(ok, "{err}");
    assert_eq!(pg_count(&c, "SELECT count(*) FROM \"select\"").await, 0);
    let nowhere = dir.path().join("missing").join("shop.db");
    let (ok, _, err) = fanout(&["outbox", "init", "--db", nowhere.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("the outbox cannot be created"), "{err}");
}

/// `--table select`: rows flow through an outbox named by a reserved word, on both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_named_by_a_reserved_word_flows() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    let (ok, _, err) = fanout(&[
        "outbox",
        "init",
        "--db",
        shop.to_str().unwrap(),
        "--table",
        "select",
    ]);
    assert!(ok, "{err}");
    let server = PgServer::start();
    let url = server.database("shop").await;
    let (ok, _, err) = fanout(&["outbox", "init", "--db", &url, "--table", "select"]);
    assert!(ok, "{err}");
    let one = Binary::start(
        &dir.path().join("one.db"),
        &[
            "--outbox",
            shop.to_str().unwrap(),
            "--outbox-table",
            "select",
        ],
    )
    .await;
    let two = Binary::start(
        &dir.path().join("two.db"),
        &["--outbox", &url, "--outbox-table", "select"],
    )
    .await;
    let (s1, s2) = (subscribe(&one).await, subscribe(&two).await);
    let c = server.connect("shop").await;
    c.execute(
        "INSERT INTO \"select\" (payload) VALUES ($1::text::json)",
        &[&event("p1")],
    )
    .await
    .unwrap();
    rusqlite::Connection::open(&shop)
        .unwrap()
        .execute(
            "INSERT INTO \"select\" (payload) VALUES (?1)",
            [event("s1")],
        )
        .unwrap();
    wait_for("both delivered", Duration::from_secs(20), || async {
        s1.distinct_ids().0.contains("s1") && s2.distinct_ids().0.contains("p1")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_outbox_committed_rows_flow_rolled_back_ones_never_and_invalid_ones_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    let ledger = dir.path().join("fanout.db");
    let mut producer = sqlite_producer(&shop);
    let daemon = Binary::start(&ledger, &["--outbox", shop.to_str().unwrap()]).await;
    let sub = subscribe(&daemon).await;

    sqlite_commit(&mut producer, &[event("e1"), event("e2")], true);
    sqlite_commit(&mut producer, &[event("gone")], false);
    // Not events: no type, not JSON, a non-text payload. The rows behind them flow.
    sqlite_commit(&mut producer, &[json!({"id": "bad"}).to_string()], true);
    sqlite_commit(&mut producer, &["not json".to_string()], true);
    producer
        .execute("INSERT INTO fanout_outbox (payload) VALUES (42)", [])
        .unwrap();
    sqlite_commit(&mut producer, &[event("e3")], true);

    wait_for(
        "three events delivered",
        Duration::from_secs(20),
        || async { sub.distinct_ids().0.len() == 3 },
    )
    .await;
    let (ids, _) = sub.distinct_ids();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["e1", "e2", "e3"]);
    wait_for("the outbox empty", Duration::from_secs(10), || async {
        sqlite_count(&shop, "SELECT count(*) FROM fanout_outbox") == 0
    })
    .await;
    assert_eq!(ledger_counts(&ledger), (3, 3));
    let c = rusqlite::Connection::open(&shop).unwrap();
    let rejected: Vec<(String, String)> = c
        .prepare("SELECT payload, error FROM fanout_outbox_rejected ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rejected.len(), 3, "{rejected:?}");
    assert_eq!(rejected[0].1, "type is missing");
    assert_eq!(
        rejected[1],
        ("not json".into(), "an event must be a JSON object".into())
    );
    assert_eq!(rejected[2].1, "an event must be a JSON object");

    // Operators see it: /metrics, GET /v1/outbox.
    assert_eq!(
        daemon
            .metric(r#"fanout_outbox_rows_read_total{table="fanout_outbox"}"#)
            .await,
        6.0
    );
    assert_eq!(
        daemon
            .metric(r#"fanout_outbox_rows_rejected_total{table="fanout_outbox"}"#)
            .await,
        3.0
    );
    assert_eq!(
        daemon
            .metric(r#"fanout_outbox_up{table="fanout_outbox"}"#)
            .await,
        1.0
    );
    let (status, view) = daemon.api.get("/v1/outbox").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["table"], "fanout_outbox", "{view}");
    assert_eq!(view["outbox"], shop.to_str().unwrap(), "{view}");
    assert_eq!(view["rows_rejected"], 3, "{view}");
    let status = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["status", "--server", &daemon.api.base])
        .env("FANOUT_API_TOKEN", common::TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    let line = format!(
        "outbox fanout_outbox in {}: 6 rows read, 3 rejected, 0 rounds failed; oldest row 0.0s old",
        shop.display()
    );
    assert!(text.contains(&line), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_rows_flow_by_notify_and_two_daemons_take_each_row_once() {
    let server = PgServer::start();
    let (url, mut producer) = pg_producer(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let (l1, l2) = (dir.path().join("one.db"), dir.path().join("two.db"));
    // Polling once an hour: only NOTIFY wakes them.
    let args = ["--outbox", url.as_str(), "--outbox-poll", "1h"];
    let one = Binary::start(&l1, &args).await;
    let two = Binary::start(&l2, &args).await;
    let sub1 = subscribe(&one).await;
    let sub2 = subscribe(&two).await;

    // A lower id committed after a higher one is not skipped: rows are never read by "id above
    // the last seen".
    let mut late = server.connect("shop").await;
    let late_tx = late.transaction().await.unwrap();
    late_tx
        .execute(
            "INSERT INTO fanout_outbox (payload) VALUES ($1::text::json)",
            &[&event("late")],
        )
        .await
        .unwrap();
    pg_commit(&mut producer, &[event("early")], true).await;
    wait_for(
        "the higher id delivered",
        Duration::from_secs(10),
        || async {
            sub1.distinct_ids().0.contains("early") || sub2.distinct_ids().0.contains("early")
        },
    )
    .await;
    late_tx.commit().await.unwrap();
    wait_for(
        "the lower id delivered",
        Duration::from_secs(10),
        || async {
            sub1.distinct_ids().0.contains("late") || sub2.distinct_ids().0.contains("late")
        },
    )
    .await;
    pg_commit(&mut producer, &[event("gone")], false).await;
    pg_commit(
        &mut producer,
        &[json!({"id": 7, "type": "order.x"}).to_string()],
        true,
    )
    .await;
    let mut expected = vec!["early".to_string(), "late".to_string()];
    for round in 0..20 {
        let batch: Vec<String> = (0..10).map(|i| format!("e{round:02}_{i}")).collect();
        let payloads: Vec<String> = batch.iter().map(|id| event(id)).collect();
        pg_commit(&mut producer, &payloads, true).await;
        expected.extend(batch);
    }
    wait_for("every event delivered", Duration::from_secs(20), || async {
        sub1.distinct_ids().0.len() + sub2.distinct_ids().0.len() >= expected.len()
    })
    .await;
    wait_for("the outbox empty", Duration::from_secs(10), || async {
        pg_count(&producer, "SELECT count(*) FROM fanout_outbox").await == 0
    })
    .await;
    // Each row went into one of the two ledgers, never both.
    let (e1, _) = ledger_counts(&l1);
    let (e2, _) = ledger_counts(&l2);
    assert_eq!(e1 + e2, expected.len() as i64, "{e1} + {e2}");
    let (mut got, _) = sub1.distinct_ids();
    let (other, _) = sub2.distinct_ids();
    assert!(got.is_disjoint(&other));
    got.extend(other);
    expected.sort();
    assert_eq!(got.into_iter().collect::<Vec<_>>(), expected);
    let error: String = producer
        .query_one("SELECT error FROM fanout_outbox_rejected", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(error, "id must be a string");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_cannot_write_leaves_the_rows_in_the_outbox_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    let ledger = dir.path().join("fanout.db");
    let mut producer = sqlite_producer(&shop);
    let outbox = ["--outbox", shop.to_str().unwrap()];
    let mut daemon = Binary::start(
        &ledger,
        &[&outbox[..], &["--max-db-size", "512KiB"]].concat(),
    )
    .await;
    let pad = "x".repeat(2000);
    let payloads: Vec<String> = (0..400)
        .map(|i| {
            json!({ "id": format!("big_{i:03}"), "type": "order.created", "pad": pad }).to_string()
        })
        .collect();
    sqlite_commit(&mut producer, &payloads, true);
    wait_for(
        "a round refused by the full ledger",
        Duration::from_secs(20),
        || async {
            daemon
                .metric(r#"fanout_outbox_rounds_failed_total{table="fanout_outbox"}"#)
                .await
                >= 2.0
        },
    )
    .await;
    assert_eq!(
        sqlite_count(&shop, "SELECT count(*) FROM fanout_outbox"),
        400
    );
    assert_eq!(
        sqlite_count(&shop, "SELECT count(*) FROM fanout_outbox_rejected"),
        0
    );
    // The outbox itself reads fine: /healthz blames the ledger, not the outbox.
    let (status, health) = daemon.api.raw("GET", "/healthz", None, false).await;
    assert_eq!(status, 503, "{health}");
    assert!(
        !health.to_string().contains("outbox_unavailable"),
        "{health}"
    );
    daemon.terminate();

    // Room again: every row flows, once.
    let daemon = Binary::start(
        &ledger,
        &[&outbox[..], &["--max-db-size", "64MiB"]].concat(),
    )
    .await;
    wait_for("the outbox empty", Duration::from_secs(20), || async {
        sqlite_count(&shop, "SELECT count(*) FROM fanout_outbox") == 0
    })
    .await;
    assert_eq!(sqlite_count(&ledger, "SELECT count(*) FROM events"), 400);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_names_an_outbox_it_cannot_read_until_it_can_again() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    let ledger = dir.path().join("fanout.db");
    let producer = sqlite_producer(&shop);
    let daemon = Binary::start(&ledger, &["--outbox", shop.to_str().unwrap()]).await;
    producer
        .execute_batch("ALTER TABLE fanout_outbox RENAME TO fanout_outbox_away")
        .unwrap();
    let health = || async { daemon.api.raw("GET", "/healthz", None, false).await };
    wait_for("/healthz 503", Duration::from_secs(10), || async {
        health().await.0 == 503
    })
    .await;
    let (_, body) = health().await;
    let problem = &body["problems"][0];
    assert_eq!(problem["code"], "outbox_unavailable", "{body}");
    let message = problem["message"].as_str().unwrap();
    assert!(message.contains("fanout_outbox"), "{message}");
    // `/healthz` answers anyone: the table, never where the outbox is nor the driver's error.
    assert!(!message.contains(shop.to_str().unwrap()), "{message}");
    assert!(!message.contains("no such table"), "{message}");
    assert_eq!(
        daemon
            .metric(r#"fanout_outbox_up{table="fanout_outbox"}"#)
            .await,
        0.0
    );
    let (_, view) = daemon.api.get("/v1/outbox").await;
    assert!(
        view["error"].as_str().unwrap().contains("no such table"),
        "{view}"
    );

    producer
        .execute_batch("ALTER TABLE fanout_outbox_away RENAME TO fanout_outbox")
        .unwrap();
    wait_for("/healthz 200 again", Duration::from_secs(10), || async {
        health().await.0 == 200
    })
    .await;
}

/// The outbox of the kill -9 test.
#[derive(Clone)]
enum Shop {
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

/// One producer committing transactions of 4 events (with their business rows) until `stop`;
/// the ids it committed.
async fn produce(
    shop: Shop,
    p: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    let mut committed = Vec::new();
    let mut pg = match &shop {
        Shop::Postgres(url) => {
            let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            Some(c)
        }
        Shop::Sqlite(_) => None,
    };
    let mut tx = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let ids: Vec<String> = (0..4).map(|i| format!("p{p}_{tx:05}_{i}")).collect();
        let payloads: Vec<String> = ids.iter().map(|id| event(id)).collect();
        match (&shop, pg.as_mut()) {
            (Shop::Postgres(_), Some(c)) => pg_commit(c, &payloads, true).await,
            (Shop::Sqlite(path), _) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    let mut c = rusqlite::Connection::open(&path).unwrap();
                    c.busy_timeout(Duration::from_secs(10)).unwrap();
                    sqlite_commit(&mut c, &payloads, true);
                })
                .await
                .unwrap();
            }
            _ => unreachable!(),
        }
        committed.extend(ids);
        tx += 1;
        // A producer's pace, not a wait for anything.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    committed
}

/// kill -9 three times while four producers commit: every committed event in the ledger once,
/// delivered, the outbox empty.
async fn survives_kill_9(
    shop: Shop,
    outbox: &str,
    remaining: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = i64> + Send>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("fanout.db");
    let sub = Subscriber::ok().await;
    let port = common::free_port();
    let args = ["--outbox", outbox];
    let mut daemon = Binary::start_at(port, &ledger, &args).await;
    daemon
        .api
        .subscriber(sub_spec("shop", &sub.url, &["order.*"]))
        .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..4)
        .map(|p| tokio::spawn(produce(shop.clone(), p, stop.clone())))
        .collect();
    for kill in 1..=3 {
        let target = sqlite_count(&ledger, "SELECT count(*) FROM events") + 300;
        wait_for(
            &format!("progress before kill {kill}"),
            Duration::from_secs(20),
            || async { sqlite_count(&ledger, "SELECT count(*) FROM events") >= target },
        )
        .await;
        daemon.kill9();
        daemon = Binary::start_at(port, &ledger, &args).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut committed = Vec::new();
    for p in producers {
        committed.extend(p.await.unwrap());
    }
    committed.sort();
    wait_for("the outbox empty", Duration::from_secs(20), || async {
        remaining().await == 0
    })
    .await;
    let c = rusqlite::Connection::open(&ledger).unwrap();
    let stored: Vec<String> = c
        .prepare("SELECT id FROM events ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stored.len(), committed.len());
    assert!(
        stored == committed,
        "the ledger's events differ from those committed"
    );
    assert_eq!(
        sqlite_count(&ledger, "SELECT count(*) FROM deliveries"),
        committed.len() as i64
    );
    wait_for("every event delivered", Duration::from_secs(20), || async {
        sub.distinct_ids().0.len() == committed.len()
    })
    .await;
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_four_producers_commit_to_a_sqlite_outbox_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    drop(sqlite_producer(&shop));
    let path = shop.clone();
    survives_kill_9(
        Shop::Sqlite(shop.clone()),
        shop.to_str().unwrap(),
        move || {
            let path = path.clone();
            Box::pin(async move { sqlite_count(&path, "SELECT count(*) FROM fanout_outbox") })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_four_producers_commit_to_a_postgres_outbox_loses_and_doubles_nothing() {
    let server = PgServer::start();
    let (url, producer) = pg_producer(&server).await;
    let producer = std::sync::Arc::new(producer);
    survives_kill_9(Shop::Postgres(url.clone()), &url, move || {
        let c = producer.clone();
        Box::pin(async move { pg_count(&c, "SELECT count(*) FROM fanout_outbox").await })
    })
    .await;
}

/// The daemon's ledger for the tests that run on either (`FANOUT_TEST_LEDGER`): a SQLite file
/// in `dir`, or a fresh PostgreSQL database; and a statement run on it (SQLite through a
/// connection of the test's own).
async fn either_ledger(dir: &Path) -> (std::path::PathBuf, Option<PgServer>) {
    match common::backend() {
        common::Backend::Sqlite => (dir.join("fanout.db"), None),
        common::Backend::Postgres => {
            let server = PgServer::start();
            let url = server.database("ledger").await;
            (std::path::PathBuf::from(url), Some(server))
        }
    }
}

/// Make the daemon's ledger refuse the event id `poison` as a database refuses data (a
/// constraint), the way it refused a key past the btree's limit before keys were bounded.
async fn refuse_poison(ledger: &Path, pg: &Option<PgServer>) {
    match pg {
        Some(server) => {
            let c = server.connect("ledger").await;
            c.batch_execute("ALTER TABLE events ADD CONSTRAINT poison CHECK (id <> 'poison')")
                .await
                .unwrap();
        }
        None => {
            let c = rusqlite::Connection::open(ledger).unwrap();
            c.busy_timeout(Duration::from_secs(10)).unwrap();
            c.execute_batch(
                "CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.id = 'poison'
                 BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
            )
            .unwrap();
        }
    }
}

/// One bad row never holds back the rows behind it, on either ledger: an event the ledger
/// refuses moves to `<table>_rejected` with the ledger's reason (and `POST /v1/events` answers
/// it 422, not a 500 a producer retries for ever); a row reusing an event id with another body
/// (in the same batch, or after the first was ingested) moves there as "id reused with a
/// different body", while the same body again is a plain duplicate; and `_rejected` keeps a
/// rejection whose row id it already holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_ledger_refuses_or_that_reuse_an_id_are_rejected_and_the_rest_flow() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    let (ledger, pg) = either_ledger(dir.path()).await;
    let mut producer = sqlite_producer(&shop);
    // A rejection already holding row id 2 (an outbox emptied and re-created, ids restarted).
    producer
        .execute(
            "INSERT INTO fanout_outbox_rejected (id, payload, created_at, error)
             VALUES (2, 'old', '2020-01-01', 'an old rejection')",
            [],
        )
        .unwrap();
    let daemon = Binary::start(
        &ledger,
        &["--outbox", shop.to_str().unwrap(), "--outbox-poll", "100ms"],
    )
    .await;
    let sub = subscribe(&daemon).await;
    refuse_poison(&ledger, &pg).await;
    let (status, answer) = daemon
        .api
        .post(
            "/v1/events",
            json!({"id": "poison", "type": "order.created"}),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "ledger_refused", "{answer}");

    // One batch: e1, the refused one (row 2), e2, e1 again with another body, e1 again alike
    // (outbox rows only: the business table would refuse a repeated order).
    let reused = json!({ "id": "e1", "type": "order.created", "total": 99 }).to_string();
    let tx = producer.transaction().unwrap();
    for p in [
        event("e1"),
        event("poison"),
        event("e2"),
        reused.clone(),
        event("e1"),
    ] {
        tx.execute("INSERT INTO fanout_outbox (payload) VALUES (?1)", [p])
            .unwrap();
    }
    tx.commit().unwrap();
    wait_for("e1 and e2 delivered", Duration::from_secs(20), || async {
        sub.distinct_ids().0.len() == 2
    })
    .await;
    // Later: e2 with another body (the ledger holds e2), then e3.
    let reused2 = json!({ "id": "e2", "type": "order.created", "total": 7 }).to_string();
    for p in [reused2.clone(), event("e3")] {
        producer
            .execute("INSERT INTO fanout_outbox (payload) VALUES (?1)", [p])
            .unwrap();
    }
    wait_for("e3 delivered", Duration::from_secs(20), || async {
        sub.distinct_ids().0.contains("e3")
    })
    .await;
    wait_for("the outbox empty", Duration::from_secs(10), || async {
        sqlite_count(&shop, "SELECT count(*) FROM fanout_outbox") == 0
    })
    .await;
    let (ids, dupes) = sub.distinct_ids();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["e1", "e2", "e3"]);
    assert_eq!(dupes, 0);
    let c = rusqlite::Connection::open(&shop).unwrap();
    let rejected: Vec<(i64, String, String)> = c
        .prepare("SELECT id, payload, error FROM fanout_outbox_rejected ORDER BY id, rejected_at")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rejected.len(), 4, "{rejected:?}");
    assert_eq!(rejected[0].2, "an old rejection");
    assert_eq!(
        (rejected[1].0, rejected[1].1.as_str()),
        (2, event("poison").as_str())
    );
    assert!(
        rejected[1].2.starts_with("the ledger refuses this event: "),
        "{rejected:?}"
    );
    assert_eq!(
        (
            rejected[2].0,
            rejected[2].1.as_str(),
            rejected[2].2.as_str()
        ),
        (4, reused.as_str(), "id reused with a different body")
    );
    assert_eq!(
        (
            rejected[3].0,
            rejected[3].1.as_str(),
            rejected[3].2.as_str()
        ),
        (6, reused2.as_str(), "id reused with a different body")
    );
}

/// An outbox whose TLS root certificate cannot be read (the task used to stop at once, logging
/// one line, while `/healthz` said 200 and `fanout_outbox_up` 1): the daemon serves on, tries
/// again with backoff, and `/healthz`, the metric, `GET /v1/outbox` and `fanout status` say it
/// cannot read. A password given as `?password=` shows nowhere: not in `/healthz` (which names
/// no location at all), not in `GET /v1/outbox`, not in the start-up log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_that_cannot_start_is_reported_and_retried_and_its_password_never_shown() {
    let server = PgServer::start();
    let url = server.database("shop").await;
    init(&url);
    let dir = tempfile::tempdir().unwrap();
    let outbox = format!(
        "{url}?password=hunter2&sslmode=verify-full&sslrootcert={}",
        dir.path().join("missing-ca.pem").display()
    );
    let port = common::free_port();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["serve", "--db"])
        .arg(dir.path().join("fanout.db"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--outbox",
            &outbox,
        ])
        .env("FANOUT_API_TOKEN", common::TOKEN)
        .env("FANOUT_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let api = common::Api::new(format!("http://127.0.0.1:{port}"));
    let health = || async { api.raw("GET", "/healthz", None, false).await };
    wait_for(
        "/healthz outbox_unavailable",
        Duration::from_secs(20),
        || async {
            // (Refused until the daemon listens.)
            let answer = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .get(format!("{}/healthz", api.base))
                .send()
                .await;
            match answer {
                Ok(r) => r
                    .text()
                    .await
                    .unwrap_or_default()
                    .contains("outbox_unavailable"),
                Err(_) => false,
            }
        },
    )
    .await;
    let (status, body) = health().await;
    assert_eq!(status, 503, "{body}");
    let text = body.to_string();
    for secret in ["hunter2", "postgres://", "127.0.0.1", "missing-ca.pem"] {
        assert!(!text.contains(secret), "/healthz shows {secret}: {text}");
    }
    let metric = |name: &'static str| {
        let api = api.clone();
        async move {
            let (_, body) = api.raw("GET", "/metrics", None, false).await;
            let text = body.as_str().unwrap_or_default().to_string();
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{{table=\"fanout_outbox\"}} ")))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(-1.0)
        }
    };
    assert_eq!(metric("fanout_outbox_up").await, 0.0);
    // Tried again, with backoff: more failed rounds come.
    wait_for("a few rounds tried", Duration::from_secs(20), || async {
        metric("fanout_outbox_rounds_failed_total").await >= 3.0
    })
    .await;
    let (status, view) = api.get("/v1/outbox").await;
    assert_eq!(status, 200, "{view}");
    let error = view["error"].as_str().unwrap();
    assert!(error.contains("sslrootcert"), "{view}");
    let at = view["outbox"].as_str().unwrap();
    assert!(
        at.contains("password=***") && !at.contains("hunter2"),
        "{at}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args(["status", "--server", &api.base])
        .env("FANOUT_API_TOKEN", common::TOKEN)
        .output()
        .unwrap();
    let status_text = String::from_utf8_lossy(&out.stdout);
    assert!(status_text.contains("CANNOT READ"), "{status_text}");
    assert!(!status_text.contains("hunter2"), "{status_text}");
    let _ = child.kill();
    let _ = child.wait();
    let logged = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(logged.contains("fanout serving"), "{logged}");
    assert!(!logged.contains("hunter2"), "{logged}");
}

/// The ledger's deliveries of subscriber `seq` in sequence order, as event ids.
async fn by_sequence(ledger: &tokio_postgres::Client) -> Vec<String> {
    ledger
        .query(
            "SELECT event_id FROM deliveries WHERE subscriber_id = 'seq' ORDER BY sequence",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Two daemons on one PostgreSQL ledger and one PostgreSQL outbox: one reads the outbox at a
/// time, so sequence numbers follow the outbox's order (their two scans used to interleave:
/// a later batch ingested first took the lower numbers). The other waits on standby, and takes
/// over within seconds when the reader is killed, still in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_one_outbox_keep_its_order_and_the_standby_takes_over() {
    let server = PgServer::start();
    let (shop, mut producer) = pg_producer(&server).await;
    let ledger_url = server.database("ledger").await;
    let ledger_db = std::path::PathBuf::from(&ledger_url);
    let args = ["--outbox", shop.as_str(), "--outbox-poll", "50ms"];
    let mut daemons = vec![
        Binary::start(&ledger_db, &args).await,
        Binary::start(&ledger_db, &args).await,
    ];
    let sink = Subscriber::ok().await;
    daemons[0]
        .api
        .subscriber(sub_spec("seq", &sink.url, &["order.*"]))
        .await;
    let ledger = server.connect("ledger").await;
    let id = |n: usize| format!("m-{n:05}");
    // Transactions of 1500 rows: more than a round takes, so two readers would split them.
    let mut n = 0;
    for _ in 0..4 {
        let payloads: Vec<String> = (n + 1..=n + 1500).map(|k| event(&id(k))).collect();
        pg_commit(&mut producer, &payloads, true).await;
        n += 1500;
    }
    wait_for("every row ingested", Duration::from_secs(60), || async {
        by_sequence(&ledger).await.len() == n
    })
    .await;
    let expected: Vec<String> = (1..=n).map(id).collect();
    assert!(
        by_sequence(&ledger).await == expected,
        "sequence numbers out of the outbox's order"
    );
    // One reader, one on standby.
    let mut readers = Vec::new();
    for d in &daemons {
        readers.push(
            d.metric(r#"fanout_outbox_reader{table="fanout_outbox"}"#)
                .await,
        );
    }
    readers.sort_by(f64::total_cmp);
    assert_eq!(readers, [0.0, 1.0]);
    let reader = if daemons[0]
        .metric(r#"fanout_outbox_reader{table="fanout_outbox"}"#)
        .await
        == 1.0
    {
        0
    } else {
        1
    };
    let (_, view) = daemons[1 - reader].api.get("/v1/outbox").await;
    assert_eq!(view["standby"], true, "{view}");

    // The reader killed: the standby takes over within seconds, in order.
    daemons[reader].kill9();
    let survivor = daemons.remove(1 - reader);
    let payloads: Vec<String> = (n + 1..=n + 500).map(|k| event(&id(k))).collect();
    pg_commit(&mut producer, &payloads, true).await;
    n += 500;
    wait_for("taken over", Duration::from_secs(15), || async {
        by_sequence(&ledger).await.len() == n
    })
    .await;
    let expected: Vec<String> = (1..=n).map(id).collect();
    assert!(
        by_sequence(&ledger).await == expected,
        "out of order after the takeover"
    );
    assert_eq!(
        survivor
            .metric(r#"fanout_outbox_reader{table="fanout_outbox"}"#)
            .await,
        1.0
    );
}

/// Two daemons (each with its own ledger) on one SQLite outbox: one reads it, the other waits
/// on standby (every row goes into one ledger, never both, and in the outbox's order), and the
/// standby takes over when the reader is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_one_sqlite_outbox_one_reads_and_the_other_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let shop = dir.path().join("shop.db");
    let mut producer = sqlite_producer(&shop);
    let ledgers = [dir.path().join("one.db"), dir.path().join("two.db")];
    let args = ["--outbox", shop.to_str().unwrap()];
    let mut daemons = vec![
        Binary::start(&ledgers[0], &args).await,
        Binary::start(&ledgers[1], &args).await,
    ];
    let sinks = [subscribe(&daemons[0]).await, subscribe(&daemons[1]).await];
    let reader_metric = r#"fanout_outbox_reader{table="fanout_outbox"}"#;
    let batch = |from: usize| -> Vec<String> {
        (from..from + 300)
            .map(|k| event(&format!("m-{k:05}")))
            .collect()
    };
    sqlite_commit(&mut producer, &batch(1), true);
    wait_for("300 delivered", Duration::from_secs(20), || async {
        sinks[0].distinct_ids().0.len() + sinks[1].distinct_ids().0.len() == 300
    })
    .await;
    let reader = if sinks[0].distinct_ids().0.len() == 300 {
        0
    } else {
        1
    };
    assert_eq!(sinks[1 - reader].count(), 0, "both daemons read the outbox");
    assert_eq!(daemons[reader].metric(reader_metric).await, 1.0);
    assert_eq!(daemons[1 - reader].metric(reader_metric).await, 0.0);
    let (_, view) = daemons[1 - reader].api.get("/v1/outbox").await;
    assert_eq!(view["standby"], true, "{view}");
    // In the outbox's order: the reader's ledger numbered them as the rows came.
    let order: Vec<String> = {
        let c = rusqlite::Connection::open(&ledgers[reader]).unwrap();
        let mut st = c
            .prepare("SELECT event_id FROM deliveries ORDER BY sequence")
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let expected: Vec<String> = (1..=300).map(|k| format!("m-{k:05}")).collect();
    assert!(order == expected, "out of the outbox's order");

    daemons[reader].kill9();
    sqlite_commit(&mut producer, &batch(301), true);
    let survivor = &sinks[1 - reader];
    wait_for(
        "the standby takes over",
        Duration::from_secs(15),
        || async { survivor.distinct_ids().0.len() == 300 },
    )
    .await;
    assert_eq!(daemons[1 - reader].metric(reader_metric).await, 1.0);
    drop(daemons);
}

/// `fanout outbox init` on an outbox made by an older version, whose `<table>_rejected` had the
/// row id as its primary key (a second rejection of one id was dropped): the key goes, the
/// rejections stay, and a second rejection of an id is kept. Both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_upgrades_an_older_rejected_table_keeping_its_rows() {
    let old_sqlite = "CREATE TABLE fanout_outbox_rejected (
        id INTEGER PRIMARY KEY, payload TEXT NOT NULL, created_at TEXT NOT NULL,
        rejected_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
        error TEXT NOT NULL);
        INSERT INTO fanout_outbox_rejected (id, payload, created_at, error)
        VALUES (1, 'x', '2020-01-01', 'old')";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shop.db");
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch(old_sqlite)
        .unwrap();
    init(file.to_str().unwrap());
    init(file.to_str().unwrap());
    let c = rusqlite::Connection::open(&file).unwrap();
    c.execute(
        "INSERT INTO fanout_outbox_rejected (id, payload, created_at, error)
         VALUES (1, 'y', '2020-01-02', 'again')",
        [],
    )
    .unwrap();
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM fanout_outbox_rejected WHERE id = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 2);

    let server = PgServer::start();
    let url = server.database("shop").await;
    let pg = server.connect("shop").await;
    pg.batch_execute(
        "CREATE TABLE fanout_outbox_rejected (id bigint PRIMARY KEY, payload text NOT NULL,
         created_at timestamptz NOT NULL, rejected_at timestamptz NOT NULL DEFAULT now(),
         error text NOT NULL);
         INSERT INTO fanout_outbox_rejected (id, payload, created_at, error)
         VALUES (1, 'x', now(), 'old')",
    )
    .await
    .unwrap();
    init(&url);
    init(&url);
    pg.execute(
        "INSERT INTO fanout_outbox_rejected (id, payload, created_at, error)
         VALUES (1, 'y', now(), 'again')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        pg_count(
            &pg,
            "SELECT count(*) FROM fanout_outbox_rejected WHERE id = 1"
        )
        .await,
        2
    );
}
