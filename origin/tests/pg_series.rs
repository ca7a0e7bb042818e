//! The charts' series on a shared PostgreSQL ledger (a throwaway server, tests/common/pg.rs):
//! two daemons flushing the same buckets at once add up exactly (counts and the latency
//! histogram, so percentiles combine), gauges keep the highest sample, a portal's scope sees
//! its customer's rows only, and retention trims old buckets only.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::pg::PgServer;
use fanout_core::wire::DeliveryResult;
use fanout_origin::customer::Customer;
use fanout_origin::ledger::postgres::PgLedger;
use fanout_origin::ledger::series::SeriesLedger;
use fanout_origin::ledger::Retention as _;
use fanout_origin::ledger::{Customers, Subscribers};
use fanout_origin::model::{Lane, Limits, Subscriber};
use fanout_origin::series::buckets::{
    combine, flush_rows, percentile, Gauges, Tally, Window, COARSE_MS, FINE_MS,
};

fn sub(id: &str, customer: Option<&str>) -> Subscriber {
    let limits = Limits {
        rate_per_sec: 10.0,
        burst: 10,
        max_in_flight: 4,
        timeout_ms: 1000,
    };
    Subscriber {
        lane: Lane::Origin,
        customer: customer.map(Into::into),
        ..Subscriber::new(id, "https://example.com/h", &["*"], limits)
    }
}

/// A tally of `latencies`, each a delivered result.
fn tally(latencies: &[u64]) -> Tally {
    let mut t = Tally::default();
    for &ms in latencies {
        t.record(
            &DeliveryResult::Delivered {
                id: String::new(),
                status: 200,
                latency_ms: ms,
                failed: Vec::new(),
            },
            Some(ms),
        );
    }
    t
}

fn gauges(backlog: i64) -> Gauges {
    Gauges {
        backlog,
        cap: 4,
        ..Gauges::default()
    }
}

#[tokio::test]
async fn two_daemons_flushes_add_up_exactly_are_scoped_and_trimmed() {
    let server = PgServer::start();
    let url = server.database("series").await;
    let a = PgLedger::open(&url, "daemon-a").await.unwrap();
    let b = PgLedger::open(&url, "daemon-b").await.unwrap();
    Customers::create_customer(
        &a,
        Customer {
            id: "acme".into(),
            weight: 1,
            max_in_flight: None,
            portal_nonce: "n".into(),
            created_ms: 1,
            updated_ms: 1,
        },
    )
    .await
    .unwrap();
    Subscribers::create_subscriber(&a, sub("acme_orders", Some("acme")), "s".into())
        .await
        .unwrap();
    Subscribers::create_subscriber(&a, sub("ops", None), "s".into())
        .await
        .unwrap();

    let now = 100 * 86_400_000 + 7_000;
    let (from, _) = Window::Hour.range(now);
    let bucket = from + 30 * FINE_MS;
    let all: Vec<u64> = (0..400).map(|i| 1 + (i * 53 % 2_000)).collect();
    let (mine, theirs) = all.split_at(150);
    // Many flushes from each daemon at once, into the same rows.
    let mut flushes = tokio::task::JoinSet::new();
    for k in 0..10 {
        let (ledger, part) = if k % 2 == 0 { (&a, mine) } else { (&b, theirs) };
        let ledger = ledger.clone();
        let chunk: Vec<u64> = part.iter().skip(k / 2).step_by(5).copied().collect();
        let rows = flush_rows(
            bucket,
            vec![
                ("acme_orders".into(), tally(&chunk)),
                ("ops".into(), tally(&[5])),
            ],
            vec![
                ("acme_orders".into(), Some("acme".into()), gauges(k as i64)),
                ("ops".into(), None, gauges(1)),
            ],
        );
        flushes.spawn(async move { ledger.add_series(rows).await });
    }
    while let Some(r) = flushes.join_next().await {
        r.unwrap().unwrap();
    }
    let rows = a
        .read_series(
            FINE_MS,
            from,
            from + 3_600_000,
            Some("acme_orders".into()),
            None,
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].counts.delivered, 400);
    assert_eq!(
        rows[0].latency,
        tally(&all).latency,
        "the histograms add exactly"
    );
    assert_eq!(rows[0].gauges.backlog, 9, "the highest sample");
    let view = combine(Window::Hour, now, Some("acme_orders".into()), &rows);
    let p = &view.points[30];
    assert_eq!(p.p99_ms, percentile(&tally(&all).latency, 0.99));
    assert_eq!(p.p50_ms, percentile(&tally(&all).latency, 0.5));

    // A portal's scope: the total of acme's subscribers; the operator: of both. One row per
    // bucket each (the flushes wrote the totals), however many subscribers.
    let scoped = b
        .read_series(FINE_MS, from, from + 3_600_000, None, Some("acme".into()))
        .await
        .unwrap();
    assert_eq!(scoped.len(), 1);
    assert_eq!(
        (scoped[0].subscriber_id.as_str(), scoped[0].counts.delivered),
        ("*acme", 400)
    );
    assert_eq!(scoped[0].latency, tally(&all).latency);
    let every = b
        .read_series(FINE_MS, from, from + 3_600_000, None, None)
        .await
        .unwrap();
    assert_eq!(every.len(), 1);
    assert_eq!(every[0].counts.delivered, 410);
    assert_eq!(every[0].gauges.backlog, 10, "the highest sum: 9 + 1");
    // Another customer's portal reads nothing, nor another's subscriber.
    assert!(b
        .read_series(FINE_MS, from, from + 3_600_000, None, Some("globex".into()))
        .await
        .unwrap()
        .is_empty());
    assert!(b
        .read_series(
            FINE_MS,
            from,
            from + 3_600_000,
            Some("ops".into()),
            Some("acme".into())
        )
        .await
        .unwrap()
        .is_empty());
    let day = b
        .read_series(COARSE_MS, 0, i64::MAX, None, None)
        .await
        .unwrap();
    assert_eq!(day.iter().map(|r| r.counts.delivered).sum::<u64>(), 410);

    // Retention: fine rows before the cut-off go, the coarse ones and later ones stay.
    assert_eq!(a.purge_series(FINE_MS, bucket, 100).await.unwrap(), 0);
    assert_eq!(a.purge_series(FINE_MS, bucket + 1, 100).await.unwrap(), 4);
    assert!(a
        .read_series(FINE_MS, 0, i64::MAX, None, None)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        a.read_series(COARSE_MS, 0, i64::MAX, None, None)
            .await
            .unwrap()
            .len(),
        1
    );
}
