//! What the PostgreSQL-only tests (`claims.rs`, `writes.rs`, `plans.rs`) share: a subscriber,
//! events, a result, and several daemons' handles on one fresh database.

use crate::ledger::postgres::PgLedger;
use crate::ledger::{
    AttemptRecord, DispatchLedger, NewEvent, Outcome, Recorded, Subscribers, Transition, Turn,
};
use crate::model::{Claim, Lane, Limits, Subscriber};
use fanout_core::breaker::BreakerConfig;
use fanout_core::retry::Attempt;

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

pub fn sent(rowid: i64, at_ms: i64) -> Outcome {
    Outcome {
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
    }
}

/// One dispatcher turn, as the daemon runs it (`DispatchLedger::record_turn`).
pub async fn turn(l: &PgLedger, turn: Turn) -> Recorded {
    l.record_turn(turn).await.map_err(|e| e.error).unwrap()
}

/// A turn that only claims: `wants` leased to `l`'s daemon until `now + lease_ms`.
pub async fn claim(l: &PgLedger, wants: &[(&str, usize)], now: i64, lease_ms: i64) -> Vec<Claim> {
    let claims = wants.iter().map(|(s, n)| (s.to_string(), *n)).collect();
    let t = Turn {
        now_ms: now,
        claims,
        lease_until_ms: now + lease_ms,
        ..Turn::default()
    };
    turn(l, t).await.claims
}

/// A turn that only records `outcomes`, the daemon's copy of each subscriber's limiter having
/// taken `answers` (`(subscriber, attempt, at_ms)`) as the dispatcher's does.
pub async fn record(
    l: &PgLedger,
    outcomes: Vec<Outcome>,
    answers: &[(&str, Attempt, i64)],
    now: i64,
) {
    let mut limiters = Vec::new();
    for (id, attempt, at) in answers {
        let (s, mut limiter) = l.dispatch_subscriber(id).await.unwrap().unwrap();
        limiter.record(s.limits.core(BREAKER), attempt, *at);
        limiters.push((id.to_string(), limiter));
    }
    let t = Turn {
        now_ms: now,
        outcomes,
        limiters,
        ..Turn::default()
    };
    turn(l, t).await;
}

/// Requests of `subscriber` leased (to any daemon) until after `now`: its in-flight count (a
/// batch counts once, by its lead).
pub async fn in_flight(server: &PgServer, db: &str, subscriber: &str, now: i64) -> i64 {
    server
        .connect(db)
        .await
        .query_one(
            "SELECT count(DISTINCT coalesce(batch_lead, id)) FROM deliveries
             WHERE subscriber_id = $1 AND status = 'in_flight' AND lease_expires_ms > $2",
            &[&subscriber, &now],
        )
        .await
        .unwrap()
        .get(0)
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
