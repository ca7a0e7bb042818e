//! Deliveries on PostgreSQL as the API reads and replays them: lists by filter (`filter.rs`
//! writes the `WHERE`), one delivery with its attempts, replays one at a time or in steps, and
//! [`Deliveries`] for the API.

use deadpool_postgres::Transaction;

use super::ledger::PgLedger;
use super::listen::{notify_payload, DUE_CHANNEL};
use crate::ledger::filter::{self, Arg, Dialect};
use crate::ledger::rules;
use crate::ledger::{DeliveryFilter, DeliveryView, Ingested, LedgerError, NewEvent};
use crate::model::{delivery_public_id, Status};

use super::rows::*;
use crate::ledger::deliveries::{Deliveries, HeldKey, ReplayStep};
use crate::ledger::rows::deliveries::{
    decode_attempt, decode_delivery, ATTEMPT_VIEW, DELIVERY_VIEW,
};
use crate::ledger::scope;

impl PgLedger {
    /// Deliveries matching `f`, in id order, at most `f.limit`, as
    /// `ledger::list_deliveries`: each is one id range of one index (a status within a
    /// subscriber, an event, or the primary key; in-flight ones by the lease index, bounded by
    /// the in-flight caps). A subscriber without a status is read as one range per status, and
    /// a status without a subscriber as one range per subscriber that has deliveries in it
    /// (`delivery_counts`), merged: no list reads more than a few ranges of `limit` rows.
    pub(super) async fn list_deliveries(
        &self,
        f: &DeliveryFilter,
    ) -> Result<Vec<DeliveryView>, LedgerError> {
        let mut client = self.client().await?;
        // One snapshot for every range: a delivery changing status between two of them
        // (pending to in flight and back) is in one of them, not in neither.
        let c = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        // A customer's list is its subscribers' lists merged (as on SQLite): its cost follows
        // the customer's own deliveries, not the ledger's.
        let parts = match customer_ranges(&c, f).await? {
            Some(per_subscriber) => per_subscriber,
            None => vec![f.clone()],
        };
        let mut all = Vec::new();
        for part in &parts {
            if part.subscriber.is_some() && part.status.is_none() && part.event.is_none() {
                for status in Status::ALL {
                    let one = DeliveryFilter {
                        status: Some(status),
                        ..part.clone()
                    };
                    all.extend(list_range(&c, &one).await?);
                }
            } else {
                all.extend(list_range(&c, part).await?);
            }
        }
        c.commit().await?;
        all.sort_by_key(|(rowid, _)| *rowid);
        all.truncate(f.limit);
        Ok(all.into_iter().map(|(_, d)| d).collect())
    }

    pub(super) async fn get_delivery(&self, rowid: i64) -> Result<DeliveryView, LedgerError> {
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!(
                    "SELECT {DELIVERY_VIEW} FROM deliveries d
                     LEFT JOIN events e ON e.id = d.event_id WHERE d.id = $1"
                ),
                &[&rowid],
            )
            .await?
            .ok_or_else(|| {
                LedgerError::NotFound(format!("delivery {}", delivery_public_id(rowid)))
            })?;
        let mut d = decode_delivery(&row, 0)?;
        let attempts = c
            .query(
                &format!(
                    "SELECT {} FROM attempts WHERE delivery_id = $1 ORDER BY id",
                    *ATTEMPT_VIEW
                ),
                &[&rowid],
            )
            .await?
            .iter()
            .map(decode_attempt)
            .collect::<Result<Vec<_>, LedgerError>>()?;
        d.attempts = Some(attempts);
        Ok(d)
    }

    /// [`PgLedger::replay_one`] inside the caller's transaction.
    pub(super) async fn replay_one_in(
        tx: &Transaction<'_>,
        rowid: i64,
        now_ms: i64,
    ) -> Result<String, LedgerError> {
        let row = tx
            .query_opt(
                "SELECT d.subscriber_id, d.status, s.deleted_ms IS NULL AND s.id IS NOT NULL
                 FROM deliveries d LEFT JOIN subscribers s ON s.id = d.subscriber_id
                 WHERE d.id = $1 FOR UPDATE OF d",
                &[&rowid],
            )
            .await?;
        let read = row
            .as_ref()
            .map(|r| -> Result<_, LedgerError> {
                Ok(rules::ReplayRow {
                    subscriber: r.try_get(0)?,
                    status: Status::parse(r.try_get(1)?),
                    subscriber_live: r.try_get::<_, Option<bool>>(2)?.unwrap_or(false),
                })
            })
            .transpose()?;
        let rejoins = rules::replay_one(rowid, read)?;
        let sub = read.map_or_else(String::new, |r| r.subscriber.to_string());
        // A held delivery stays held; an ended one of an ordered key rejoins its key.
        tx.execute(
            "UPDATE deliveries SET status = 'pending', attempts = 0, last_error = NULL,
                 updated_ms = $2,
                 next_attempt_ms = CASE WHEN next_attempt_ms = $3 AND status = 'pending'
                                        THEN $3 ELSE $2 END
             WHERE id = $1",
            &[&rowid, &now_ms, &crate::ordering::HELD_MS],
        )
        .await?;
        if rejoins {
            super::ordered::rejoin(tx, &[rowid], now_ms).await?;
        }
        tx.execute(
            "SELECT pg_notify($1, $2)",
            &[&DUE_CHANNEL, &notify_payload(std::slice::from_ref(&sub))],
        )
        .await?;
        Ok(sub)
    }

    /// One step of a bulk replay (as SQLite's `ledger::replay_step`): the first `f.limit`
    /// deliveries matching the filter after `f.after`, in id order (status defaults to dead;
    /// in-flight ones and removed subscribers' are skipped; pending ones are left as they
    /// are), put back in the queue, in one short transaction; the work is announced.
    pub(super) async fn replay_step(
        &self,
        f: &DeliveryFilter,
        now_ms: i64,
    ) -> Result<crate::ledger::ReplayStep, LedgerError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // A customer's: its subscribers' first ids, merged.
        let parts = match customer_ranges(&tx, f).await? {
            Some(per_subscriber) => per_subscriber,
            None => vec![f.clone()],
        };
        let mut ids: Vec<Vec<i64>> = Vec::new();
        for part in &parts {
            let (filter, params) = replayable_sql(part)?;
            let rows = tx
                .query(
                    &format!(
                        "SELECT d.id FROM deliveries d {filter} ORDER BY d.id LIMIT {}",
                        f.limit
                    ),
                    &refs(&params),
                )
                .await?;
            ids.push(
                rows.iter()
                    .map(|r| r.try_get(0))
                    .collect::<Result<_, _>>()?,
            );
        }
        let ids = rules::replay_ids(ids, f.limit);
        // Rows another transaction holds (a claim, a result) are skipped, never waited for.
        let rows = tx
            .query(
                "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_ms = $1,
                     last_error = NULL, updated_ms = $1
                 WHERE id IN (SELECT id FROM deliveries WHERE id = ANY($2)
                              AND status IN ('sent', 'dead') FOR UPDATE SKIP LOCKED)
                 RETURNING subscriber_id, id, ordering_key IS NOT NULL",
                &[&now_ms, &ids],
            )
            .await?;
        // Replayed deliveries of ordered keys rejoin their keys (`ordered::rejoin`).
        let mut keyed: Vec<i64> = Vec::new();
        for r in &rows {
            if r.try_get::<_, bool>(2)? {
                keyed.push(r.try_get(1)?);
            }
        }
        super::ordered::rejoin(&tx, &keyed, now_ms).await?;
        let subs: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let step = rules::replay_step(&ids, f.limit, subs);
        if !step.subscribers.is_empty() {
            tx.execute(
                "SELECT pg_notify($1, $2)",
                &[&DUE_CHANNEL, &notify_payload(&step.subscribers)],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(step)
    }

    /// How many deliveries a bulk replay with this filter would replay now (`dry_run`).
    pub(super) async fn count_replayable(&self, f: &DeliveryFilter) -> Result<u64, LedgerError> {
        let c = self.client().await?;
        let parts = match customer_ranges(&c, f).await? {
            Some(per_subscriber) => per_subscriber,
            None => vec![f.clone()],
        };
        let mut total = 0u64;
        for part in &parts {
            let (filter, params) = replayable_sql(part)?;
            let n: i64 = c
                .query_one(
                    &format!("SELECT COUNT(*) FROM deliveries d {filter}"),
                    &refs(&params),
                )
                .await?
                .try_get(0)?;
            total += n.max(0) as u64;
        }
        Ok(total)
    }
}

/// `WHERE …` for what a bulk replay with this filter replays (`filter.rs`).
pub(super) fn replayable_sql(f: &DeliveryFilter) -> Result<(String, Vec<Param>), LedgerError> {
    let (clause, args) = filter::replayable(f, Dialect::Postgres)?;
    Ok((clause, params(args)))
}

/// A filter's arguments as PostgreSQL parameters.
pub(super) fn params(args: Vec<Arg>) -> Vec<Param> {
    args.into_iter()
        .map(|a| -> Param {
            match a {
                Arg::Text(t) => Box::new(t),
                Arg::Int(n) => Box::new(n),
            }
        })
        .collect()
}

/// A filter scoped to a customer without a subscriber or an event, as one filter per
/// subscriber the customer owns or owned (`subscribers_by_customer`); `None` for any other.
pub(super) async fn customer_ranges(
    c: &impl deadpool_postgres::GenericClient,
    f: &DeliveryFilter,
) -> Result<Option<Vec<DeliveryFilter>>, LedgerError> {
    let (Some(customer), None, None) = (&f.customer, &f.subscriber, &f.event) else {
        return Ok(None);
    };
    let subs: Vec<String> = c
        .query(
            "SELECT id FROM subscribers WHERE customer = $1 ORDER BY id",
            &[customer],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    Ok(Some(
        subs.into_iter()
            .map(|s| DeliveryFilter {
                subscriber: Some(s),
                ..f.clone()
            })
            .collect(),
    ))
}

/// Deliveries matching `f` in id order (see `list_deliveries`), with their rowids. A status
/// other than in flight without a subscriber or an event is read per subscriber: the
/// subscribers that have deliveries in that status (from the kept counts), each one id range
/// of its status's index, `limit` at most, merged.
pub(super) async fn list_range(
    c: &impl deadpool_postgres::GenericClient,
    f: &DeliveryFilter,
) -> Result<Vec<(i64, DeliveryView)>, LedgerError> {
    let per_subscriber = f.subscriber.is_none()
        && f.event.is_none()
        && matches!(
            f.status,
            Some(Status::Pending) | Some(Status::Sent) | Some(Status::Dead)
        );
    let (filter, params) = filter_sql(f);
    let sql = if per_subscriber {
        let status = f.status.map_or("", |s| s.as_str());
        format!(
            "SELECT {DELIVERY_VIEW} FROM
                 (SELECT subscriber_id FROM delivery_counts WHERE status = '{status}'
                  GROUP BY subscriber_id HAVING SUM(n) > 0) s
             CROSS JOIN LATERAL (SELECT * FROM deliveries d
                 {filter} AND d.subscriber_id = s.subscriber_id ORDER BY d.id LIMIT {limit}) d
             LEFT JOIN events e ON e.id = d.event_id ORDER BY d.id LIMIT {limit}",
            limit = f.limit
        )
    } else {
        format!(
            "SELECT {DELIVERY_VIEW} FROM deliveries d LEFT JOIN events e ON e.id = d.event_id
             {filter} ORDER BY d.id LIMIT {}",
            f.limit
        )
    };
    c.query(&sql, &refs(&params))
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, decode_delivery(r, 0)?)))
        .collect()
}

/// `WHERE …` for a delivery filter and its parameters (`filter.rs`).
pub(super) fn filter_sql(f: &DeliveryFilter) -> (String, Vec<Param>) {
    let (clause, args) = filter::where_clause(f, Dialect::Postgres);
    (clause, params(args))
}

impl Deliveries for PgLedger {
    async fn ingest(
        &self,
        events: Vec<NewEvent>,
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        self.ingest(events, now_ms).await
    }

    async fn list_deliveries(
        &self,
        filter: DeliveryFilter,
    ) -> Result<Vec<DeliveryView>, LedgerError> {
        self.list_deliveries(&filter).await
    }

    async fn get_delivery(
        &self,
        rowid: i64,
        scope: Option<String>,
    ) -> Result<DeliveryView, LedgerError> {
        let owner = self.delivery_owner(rowid).await?;
        scope::delivery(scope.as_deref(), rowid, owner.as_deref())?;
        self.get_delivery(rowid).await
    }

    async fn replay_one(
        &self,
        rowid: i64,
        now_ms: i64,
        scope: Option<String>,
    ) -> Result<String, LedgerError> {
        self.replay_one_scoped(rowid, now_ms, scope.as_deref())
            .await
    }

    async fn held_keys(
        &self,
        subscriber: String,
        limit: usize,
        scope: Option<String>,
    ) -> Result<Vec<HeldKey>, LedgerError> {
        scope::visible(scope.as_deref(), self.get_subscriber(&subscriber).await?)?;
        PgLedger::held_keys(self, &subscriber, limit).await
    }

    async fn replay_step(
        &self,
        filter: DeliveryFilter,
        now_ms: i64,
    ) -> Result<ReplayStep, LedgerError> {
        if let Some(s) = &filter.subscriber {
            scope::visible(filter.customer.as_deref(), self.get_subscriber(s).await?)?;
        }
        self.replay_step(&filter, now_ms).await
    }

    async fn count_replayable(&self, filter: DeliveryFilter) -> Result<u64, LedgerError> {
        if let Some(s) = &filter.subscriber {
            scope::visible(filter.customer.as_deref(), self.get_subscriber(s).await?)?;
        }
        self.count_replayable(&filter).await
    }

    async fn ingest_test(
        &self,
        subscriber: String,
        event: NewEvent,
        now_ms: i64,
        scope: Option<String>,
    ) -> Result<i64, LedgerError> {
        self.ingest_test(&subscriber, &event, now_ms, scope.as_deref())
            .await
    }
}
