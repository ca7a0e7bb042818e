//! What the console, `?stats=true` and `/metrics` read on PostgreSQL: deliveries per status
//! and per subscriber from the kept counts, the stored limiters, the last errors; and
//! [`Observe`] (whether the server answers, the `/metrics` snapshot). Nothing here writes.

use std::collections::{BTreeMap, HashMap};

use fanout_core::breaker::BreakerConfig;
use fanout_core::limiter::LimiterState;

use super::ledger::PgLedger;
use crate::ledger::subscribers::{earlier_sql, SubscriberCounts};
use crate::ledger::{LedgerError, SubscriberStats};
use crate::model::{Status, Subscriber};

use super::rows::*;
use crate::ledger::stats::{MetricsSnapshot, Observe};

impl PgLedger {
    /// Answers when the database does.
    pub(super) async fn ping(&self) -> Result<(), LedgerError> {
        self.client().await?.query_one("SELECT 1", &[]).await?;
        Ok(())
    }

    /// Deliveries per status, for `/metrics`: the sums of the counts the triggers keep
    /// (`delivery_counts`), not a count over the deliveries.
    pub(super) async fn status_counts(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        let c = self.client().await?;
        status_counts_on(&c).await
    }

    /// Per-subscriber figures for `/metrics`, as `ledger::subscriber_stats`.
    pub(super) async fn subscriber_stats(
        &self,
        breaker: BreakerConfig,
        now_ms: i64,
    ) -> Result<Vec<SubscriberStats>, LedgerError> {
        let subs = self.list_subscribers().await?;
        let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
        let c = self.client().await?;
        let mut counts = kept_counts(&c, &ids).await?;
        let mut oldest_at = oldest_open(&c, &ids).await?;
        let limiters = self.limiters(&c, now_ms).await?;
        Ok(subs
            .into_iter()
            .map(|s| {
                let by_status = counts.remove(&s.id).unwrap_or_default();
                let oldest = oldest_at.remove(&s.id);
                let limiter = limiters.get(&s.id).copied().unwrap_or_default();
                SubscriberStats::of(s, &by_status, oldest, &limiter, breaker, now_ms)
            })
            .collect())
    }

    /// Each of `subs`' figures from its creation on ([`SubscriberCounts::since_creation`]),
    /// one statement for all of them: what an earlier subscriber under its id left is left out.
    pub(super) async fn since_creation(
        &self,
        subs: &[Subscriber],
        counts: &mut BTreeMap<String, SubscriberCounts>,
    ) -> Result<(), LedgerError> {
        let created: HashMap<&str, i64> =
            subs.iter().map(|s| (s.id.as_str(), s.created_ms)).collect();
        let ids: Vec<&str> = created.keys().copied().collect();
        let since: Vec<i64> = ids.iter().map(|id| created[id]).collect();
        let sql = format!(
            "SELECT s.id, ({}), ({}) FROM unnest($1::text[], $2::bigint[]) AS s(id, created)",
            earlier_sql(Status::Sent, "s.id", "s.created"),
            earlier_sql(Status::Dead, "s.id", "s.created"),
        );
        let c = self.client().await?;
        for r in c.query(&sql, &[&ids, &since]).await? {
            let (id, sent, dead): (String, i64, i64) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            if let (Some(n), Some(at)) = (counts.get_mut(&id), created.get(id.as_str())) {
                n.since_creation(*at, sent, dead);
            }
        }
        Ok(())
    }

    pub(super) async fn limiters(
        &self,
        c: &deadpool_postgres::Object,
        now_ms: i64,
    ) -> Result<HashMap<String, LimiterState>, LedgerError> {
        let mut out = HashMap::new();
        for r in c.query("SELECT id, limiter FROM subscribers", &[]).await? {
            let id: String = r.try_get(0)?;
            let raw: Option<String> = r.try_get(1)?;
            out.insert(id.clone(), decode_limiter(&id, raw.as_deref(), now_ms));
        }
        Ok(out)
    }

    /// Figures for each of `ids`, as `ledger::status::subscriber_counts`.
    pub(super) async fn subscriber_counts(
        &self,
        ids: &[String],
        now_ms: i64,
    ) -> Result<BTreeMap<String, SubscriberCounts>, LedgerError> {
        let c = self.client().await?;
        let mut out: BTreeMap<String, SubscriberCounts> = ids
            .iter()
            .map(|id| (id.clone(), SubscriberCounts::default()))
            .collect();
        for (sub, by_status) in kept_counts(&c, ids).await? {
            if let Some(s) = out.get_mut(&sub) {
                for (status, n) in by_status {
                    match Status::parse(&status) {
                        Some(Status::Pending) => s.pending = n,
                        Some(Status::InFlight) => s.in_flight = n,
                        Some(Status::Sent) => s.sent = n,
                        Some(Status::Dead) => s.dead = n,
                        None => {}
                    }
                }
            }
        }
        // The latest of each subscriber's error rows (folded to one every second).
        for r in c
            .query(
                "SELECT DISTINCT ON (subscriber_id) subscriber_id, at_ms, status, error
                 FROM last_errors WHERE subscriber_id = ANY($1)
                 ORDER BY subscriber_id, at_ms DESC, id DESC",
                &[&ids],
            )
            .await?
        {
            let sub: String = r.try_get(0)?;
            let at: i64 = r.try_get(1)?;
            let status: Option<i32> = r.try_get(2)?;
            let error: Option<String> = r.try_get(3)?;
            if let Some(s) = out.get_mut(&sub) {
                s.last_error = Some((at, describe_failure(status, error)));
            }
        }
        for r in c
            .query(
                "SELECT id, limiter FROM subscribers WHERE id = ANY($1)",
                &[&ids],
            )
            .await?
        {
            let id: String = r.try_get(0)?;
            let raw: Option<String> = r.try_get(1)?;
            if let Some(s) = out.get_mut(&id) {
                s.limiter = decode_limiter(&id, raw.as_deref(), now_ms);
            }
        }
        Ok(out)
    }
}

/// Deliveries per status, from the counts the triggers keep.
pub(super) async fn status_counts_on(
    c: &impl deadpool_postgres::GenericClient,
) -> Result<Vec<(String, i64)>, LedgerError> {
    c.query(
        "SELECT status, SUM(n)::BIGINT FROM delivery_counts GROUP BY status
         HAVING SUM(n) <> 0 ORDER BY status",
        &[],
    )
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect()
}

/// `ids`' deliveries per status, from the counts the triggers keep (a few rows per subscriber
/// and status between two folds), by the `(subscriber_id, status)` index.
pub(super) async fn kept_counts(
    c: &impl deadpool_postgres::GenericClient,
    ids: &[String],
) -> Result<HashMap<String, HashMap<String, i64>>, LedgerError> {
    let mut out: HashMap<String, HashMap<String, i64>> = HashMap::new();
    for r in c
        .query(
            "SELECT subscriber_id, status, SUM(n)::BIGINT FROM delivery_counts
             WHERE subscriber_id = ANY($1) GROUP BY subscriber_id, status HAVING SUM(n) <> 0",
            &[&ids],
        )
        .await?
    {
        let (sub, status, n): (String, String, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        out.entry(sub).or_default().insert(status, n);
    }
    Ok(out)
}

/// When each of `ids`' oldest open (pending or in flight) delivery was created: the first
/// pending one in id order (`deliveries_pending_by_sub`) and the oldest in flight (bounded by
/// the in-flight cap, `deliveries_leased`) — index probes, whatever the ledger holds.
pub(super) async fn oldest_open(
    c: &impl deadpool_postgres::GenericClient,
    ids: &[String],
) -> Result<HashMap<String, i64>, LedgerError> {
    let mut out = HashMap::new();
    for r in c
        .query(
            "SELECT s.id, LEAST(
                 (SELECT created_ms FROM deliveries
                  WHERE subscriber_id = s.id AND status = 'pending' ORDER BY id LIMIT 1),
                 (SELECT MIN(created_ms) FROM deliveries
                  WHERE subscriber_id = s.id AND status = 'in_flight'))
             FROM unnest($1::text[]) AS s(id)",
            &[&ids],
        )
        .await?
    {
        if let Some(t) = r.try_get::<_, Option<i64>>(1)? {
            out.insert(r.try_get(0)?, t);
        }
    }
    Ok(out)
}

/// A failed attempt in a few words, as `ledger::status` says it.
pub(super) fn describe_failure(status: Option<i32>, error: Option<String>) -> String {
    match (error, status) {
        (Some(e), Some(s)) => format!("{s}: {e}"),
        (Some(e), None) => e,
        (None, Some(s)) => format!("HTTP {s}"),
        (None, None) => "failed".to_string(),
    }
}

impl Observe for PgLedger {
    async fn ping(&self) -> Result<(), LedgerError> {
        self.ping().await
    }

    async fn metrics_snapshot(
        &self,
        now_ms: i64,
        breaker: BreakerConfig,
    ) -> Result<MetricsSnapshot, LedgerError> {
        Ok((
            self.status_counts().await?,
            self.subscriber_stats(breaker, now_ms).await?,
            self.retention_report().await?,
        ))
    }
}
