//! What the PostgreSQL-only tests (`claims.rs`, `writes.rs`, `plans.rs`) share: a subscriber,
//! events, a result, and several daemons' handles on one fresh database.

use crate::ledger::postgres::leases::LeasedOutcome;
use crate::ledger::postgres::PgLedger;
use crate::ledger::{AttemptRecord, NewEvent, Outcome, Subscribers, Transition};
use crate::model::{Lane, Limits, Subscriber};
use fanout_core::breaker::BreakerConfig;

use super::pg::PgServer;

pub const BREAKER: BreakerConfig = BreakerConfig {
    threshold: 20,
    cooldown_ms: 30_000,
};

pub const LEASE: i64 = 60_000;

pub fn sub(id: &str, types: &[&str], rate: f64, burst: u32, max_in_flight: u32) -> Subscriber {
    Subscriber {
        lane: Lane::Origin,
        ..Subscriber::new(
            id,
            "https://example.com/h",
            types,
            Limits {
                rate_per_sec: rate,
                burst,
                max_in_flight,
                timeout_ms: 1000,
            },
        )
    }
}

pub fn ev(id: &str, ty: &str) -> NewEvent {
    NewEvent {
        id: id.into(),
        event_type: ty.into(),
        body: format!("{{\"id\":\"{id}\"}}"),
        traceparent: None,
    }
}

pub fn evs(prefix: &str, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| ev(&format!("{prefix}{i:05}"), "t"))
        .collect()
}

pub fn sent(rowid: i64, lease: Option<i64>, at_ms: i64) -> LeasedOutcome {
    LeasedOutcome {
        outcome: Outcome {
            rowid,
            transition: Transition::Sent,
            attempt: Some(AttemptRecord {
                attempt: 1,
                at_ms,
                lane: "origin",
                outcome: "delivered",
                status: Some(200),
                latency_ms: Some(1),
                response_body: None,
                error: None,
            }),
        },
        lease_expires_ms: lease,
    }
}

/// A fresh database on `server` and `n` daemons' handles on it.
pub async fn ledgers(server: &PgServer, db: &str, n: usize) -> Vec<PgLedger> {
    let url = server.database(db).await;
    let mut out = Vec::new();
    for k in 0..n {
        out.push(PgLedger::open(&url, &format!("daemon-{k}")).await.unwrap());
    }
    out
}

/// Create `s` with secret `s`, through the contract.
pub async fn add(l: &PgLedger, s: Subscriber) {
    Subscribers::create_subscriber(l, s, "s".into())
        .await
        .unwrap();
}
