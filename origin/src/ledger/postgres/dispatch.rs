//! The dispatcher's typed ledger operations ([`DispatchLedger`]) on PostgreSQL, for one daemon
//! among several.
//!
//! What differs from SQLite, and why:
//! - The limiter a turn carries is this daemon's view. It is folded into the subscriber's shared
//!   row ([`merge_limiter`]) under the row's lock; the bucket in that row is spent only by
//!   claims, which ask the shared limiter again (so the daemon's own reservation is an upper
//!   bound, and what it is refused it gives back when fewer deliveries come than it asked).
//! - Outcomes count only for deliveries this daemon still holds (`lease_owner`): a daemon that
//!   comes back after its leases expired and were taken over records nothing for them.
//! - Leases are short ([`LEASE_MS`]) and renewed while the daemon lives ([`RENEW_EVERY_MS`]),
//!   instead of lasting as long as the longest send could: a daemon that dies has its work
//!   taken over within seconds, not minutes.
//! - At start-up a daemon releases only its own leases (those of its previous run, under the
//!   same name); other daemons' leases are theirs until they expire.

use fanout_core::limiter::{LimiterState, Reservation};
use tokio_postgres::types::ToSql;

use crate::ledger::LedgerError;
use crate::ledger::{DispatchLedger, Recorded, Turn, TurnError};
use std::collections::HashMap;

use super::ops::{
    core_limits, wanted_of, CLAIM_COUNT, CLAIM_EXPIRE, RECORD_OUTCOMES, STORE_LIMITERS,
};
use super::{decode_limiter, encode_limiter, PgLedger};
use crate::model::{Claim, HealthWrite, InFlight, Outcome, Share, Subscriber};

/// How long a lease lasts without renewal: the longest a dead daemon's work waits.
pub const LEASE_MS: i64 = 15_000;
/// A live daemon renews its leases this often (a third of their length: two renewals may
/// fail before one lapses).
pub const RENEW_EVERY_MS: i64 = 5_000;

/// A daemon's limiter for a subscriber folded into the shared one: the bucket stays the shared
/// one (only claims spend it, under the row lock); a Retry-After pause lasts until the later of
/// the two; the breaker's run of failures and its opening are the daemon's (they come from the
/// results it just recorded). Whether a probe is out is the shared limiter's: a daemon may end
/// one (its result came back: closed, re-opened, or a pushback) but never start one — only a
/// claim does, under the row lock. (A daemon's own reservation of a probe, folded in as a
/// probe already out, made the claim that followed refuse every probe: the subscriber stalled
/// for good with its breaker half-open.)
pub fn merge_limiter(shared: LimiterState, mine: LimiterState) -> LimiterState {
    let mut breaker = mine.breaker;
    if breaker.probe_started_ms.is_some() {
        breaker.probe_started_ms = shared.breaker.probe_started_ms;
    }
    LimiterState {
        bucket: shared.bucket,
        paused_until_ms: match (shared.paused_until_ms, mine.paused_until_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        },
        breaker,
    }
}

/// What a subscriber's shared limiter grants one claim of at most `most` deliveries, `busy`
/// being open at every daemon: reserved now, to be committed to what was found
/// (`LimiterState::commit`). Pure: the claim and the dispatcher's model of it both use it.
pub fn grant_shared(
    limiter: &mut LimiterState,
    limits: fanout_core::limiter::Limits,
    busy: u32,
    most: usize,
    now_ms: i64,
) -> Reservation {
    let most = most.min(limits.max_in_flight.saturating_sub(busy) as usize);
    limiter.reserve(limits, busy, now_ms, most)
}

/// When due work is left after a claim (`next_due_ms` at or before now): how long the shared
/// limiter, as the claim left it, says to wait for one more (rate, pause, breaker; asked of a
/// copy, nothing taken). A full in-flight cap is no wait: a result frees a slot. `busy` counts
/// the open sends, the claim's included. Pure, like [`grant_shared`].
pub fn shared_wait(
    limiter: &LimiterState,
    limits: fanout_core::limiter::Limits,
    busy: u32,
    next_due_ms: Option<i64>,
    now_ms: i64,
) -> Option<u64> {
    match next_due_ms {
        Some(due) if due <= now_ms => {
            let mut copy = *limiter;
            copy.reserve(limits, busy, now_ms, 1).wait_ms()
        }
        _ => None,
    }
}

/// The rows of the subscribers a turn names (`$1`) and of those whose sends it ends
/// (deliveries of `$2` still leased to `$3`), locked in id order as every transaction here
/// takes them.
const TURN_LOCK: &str = "SELECT id, rate_per_sec, burst, max_in_flight, limiter,
         deleted_ms IS NULL AND disabled_ms IS NULL AS live
     FROM subscribers s
     WHERE id = ANY($1)
        OR id IN (SELECT subscriber_id FROM deliveries
                  WHERE id = ANY($2) AND status = 'in_flight' AND lease_owner = $3)
     ORDER BY id FOR UPDATE OF s";

/// Sends open (every daemon's) for each subscriber whose sends the turn ends, just before
/// they end: the subscribers first (by the ended ids), then one count of each one's leases.
/// Written so, not as a semi-join of the leased rows with themselves: in-flight rows are too
/// short-lived for the planner's statistics to see (it estimates one), and a join it planned
/// as a nested loop read every leased row once per leased row (113 ms for 500). (Joined to
/// `unnest` of the ids instead, it was planned as a loop over the ids per leased row.)
const TURN_OPEN: &str = "SELECT e.subscriber_id,
         (SELECT COUNT(*) FROM deliveries o
          WHERE o.subscriber_id = e.subscriber_id AND o.status = 'in_flight')
     FROM (SELECT DISTINCT subscriber_id FROM deliveries
           WHERE id = ANY($1) AND status = 'in_flight' AND lease_owner = $2) e";

impl PgLedger {
    /// One turn in one transaction, in few round trips: `BEGIN`; the subscribers' locks and
    /// open counts; their limiters, the results with their attempts, and the claim's expired
    /// leases and in-flight counts; the lease; the claim's limiters and what remains due;
    /// `COMMIT`. (A turn that changes a subscriber's health claims after it, by
    /// [`PgLedger::claim_in`]: one round trip more.)
    async fn record_turn_pg(&self, turn: &Turn) -> Result<Recorded, LedgerError> {
        let now = turn.now_ms;
        let owner: &str = &self.owner;
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let rowids: Vec<i64> = turn.outcomes.iter().map(|o| o.rowid).collect();
        // Every subscriber row this turn will lock, locked at once in id order: whatever it
        // locks later (health, dead counts, the claim) it already holds, so two daemons' turns
        // never lock the same rows in different orders.
        let mut ids: Vec<&str> = turn.limiters.iter().map(|(id, _)| id.as_str()).collect();
        ids.extend(turn.claims.iter().map(|(id, _)| id.as_str()));
        ids.extend(turn.dead.iter().map(String::as_str));
        ids.extend(turn.health.iter().map(|h| match h {
            HealthWrite::FailingSince { subscriber, .. }
            | HealthWrite::Disable { subscriber, .. } => subscriber.as_str(),
        }));
        ids.sort_unstable();
        ids.dedup();
        let asks = turn.asks();
        let wanted = wanted_of(&asks);
        // The claim reads its subscribers' rows from this turn's locks (as this turn leaves
        // them) unless a health change (which may disable one) comes in between.
        let direct = turn.health.is_empty() && !wanted.is_empty();
        let mut claim_rows = Vec::new();
        let mut store_ids: Vec<String> = Vec::new();
        let mut store_states: Vec<String> = Vec::new();
        if !ids.is_empty() || !rowids.is_empty() {
            let (lock, open) =
                tokio::try_join!(tx.prepare_cached(TURN_LOCK), tx.prepare_cached(TURN_OPEN))?;
            let lock_args: &[&(dyn ToSql + Sync)] = &[&ids, &rowids, &owner];
            let open_args: &[&(dyn ToSql + Sync)] = &[&rowids, &owner];
            let (rows, open_rows) =
                tokio::try_join!(tx.query(&lock, lock_args), tx.query(&open, open_args))?;
            // The subscribers whose sends this turn ends (those this daemon still holds),
            // with the sends open just before, these included.
            let mut ended: HashMap<String, u32> = HashMap::new();
            for r in open_rows {
                ended.insert(r.try_get(0)?, r.try_get::<_, i64>(1)?.max(0) as u32);
            }
            for r in rows {
                let id: String = r.try_get("id")?;
                let limits = core_limits(&r, self.breaker)?;
                let raw: Option<String> = r.try_get("limiter")?;
                let mut shared = decode_limiter(&id, raw.as_deref(), now);
                let mine = turn.limiters.iter().rev().find(|(s, _)| *s == id);
                let open = ended.get(&id).copied();
                if let Some(open) = open {
                    // The bucket catches up to now under the room that held while they were
                    // open (the core's pacing on arrival times), before they stop counting.
                    shared.settle(limits, open, now);
                }
                // The latest of this turn's states for the subscriber.
                if let Some((_, mine)) = mine {
                    shared = merge_limiter(shared, *mine);
                }
                if mine.is_some() || open.is_some() {
                    store_states.push(encode_limiter(&shared));
                    store_ids.push(id.clone());
                }
                if direct && r.try_get::<_, bool>("live")? && wanted.contains_key(id.as_str()) {
                    claim_rows.push((id, limits, shared));
                }
            }
        }
        // Pipelined, in this order: the limiters, the results, then (for the claim) the
        // expired leases back to the queue and what is in flight.
        let outcomes: Vec<(&Outcome, Option<i64>)> =
            turn.outcomes.iter().map(|o| (o, None)).collect();
        let (store, _, expire, count) = tokio::try_join!(
            tx.prepare_cached(STORE_LIMITERS),
            tx.prepare_cached(RECORD_OUTCOMES), // cached, so the results go out second
            tx.prepare_cached(CLAIM_EXPIRE),
            tx.prepare_cached(CLAIM_COUNT),
        )?;
        let claim_ids: Vec<&str> = wanted.keys().copied().collect();
        let store_args: &[&(dyn ToSql + Sync)] = &[&store_ids, &store_states];
        let expire_args: &[&(dyn ToSql + Sync)] = &[&claim_ids, &now];
        let count_args: &[&(dyn ToSql + Sync)] = &[&claim_ids];
        let store_limiters = async {
            if store_ids.is_empty() {
                Ok(0)
            } else {
                tx.execute(&store, store_args).await
            }
        };
        let record = Self::record_outcomes(&tx, owner, &outcomes, now);
        let expired = async {
            if direct {
                tx.execute(&expire, expire_args).await
            } else {
                Ok(0)
            }
        };
        let counted = async {
            if direct {
                tx.query(&count, count_args).await
            } else {
                Ok(Vec::new())
            }
        };
        let (stored, applied, expired, counted) =
            tokio::join!(store_limiters, record, expired, counted);
        stored?;
        let applied = applied?;
        expired?;
        let counted = counted?;
        if !applied.stale.is_empty() {
            tracing::warn!(
                stale = applied.stale.len(),
                "results for deliveries another daemon took over were not recorded"
            );
        }
        if !turn.health.is_empty() {
            Self::apply_health_in(&tx, &turn.health).await?;
        }
        let mut notices = turn.notices.clone();
        if !turn.dead.is_empty() {
            notices.extend(
                Self::check_dead_counts_in(&tx, &turn.dead, turn.dead_threshold, now).await?,
            );
        }
        let lease_until = turn.lease_until_ms.min(now.saturating_add(LEASE_MS));
        let mut claims = if asks.is_empty() {
            Vec::new()
        } else if direct {
            Self::lease_in(&tx, owner, &wanted, claim_rows, &counted, now, lease_until).await?
        } else {
            Self::claim_in(&tx, owner, &asks, self.breaker, now, lease_until).await?
        };
        tx.commit().await?;
        // In the order asked.
        let mut ordered = Vec::with_capacity(claims.len());
        for (id, _) in &asks {
            if let Some(k) = claims.iter().position(|c| &c.subscriber_id == id) {
                let c = claims.swap_remove(k);
                ordered.push(Claim {
                    subscriber_id: c.subscriber_id,
                    claimed: c.claimed,
                    next_due_ms: c.next_due_ms,
                    not_before_ms: c
                        .wait_ms
                        .map(|w| now.saturating_add(i64::try_from(w).unwrap_or(i64::MAX))),
                });
            }
        }
        Ok(Recorded {
            claims: ordered,
            notices,
        })
    }

    /// Push this daemon's leases out to `now_ms + LEASE_MS` (it is alive, its sends are still
    /// out). Returns how many.
    pub async fn renew_leases(&self, now_ms: i64) -> Result<u64, LedgerError> {
        let until = now_ms.saturating_add(LEASE_MS);
        let c = self.client().await?;
        Ok(c.execute(
            "UPDATE deliveries SET lease_expires_ms = $2
             WHERE status = 'in_flight' AND lease_owner = $1 AND lease_expires_ms < $2",
            &[&&*self.owner, &until],
        )
        .await?)
    }

    /// Renew this daemon's leases every [`RENEW_EVERY_MS`] until `stop` is dropped.
    pub fn keep_leases(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        super::every(
            std::time::Duration::from_millis(RENEW_EVERY_MS as u64),
            None,
            stop,
            "renew this daemon's leases",
            move || {
                let me = me.clone();
                async move { me.renew_leases(crate::time::now_ms()).await.map(drop) }
            },
        );
    }

    /// Leases of any daemon that expired before `now_ms` back to pending, due at `now_ms`
    /// (one being recorded right now is left to that transaction). Returns the subscribers.
    pub async fn release_expired_leases(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        let c = self.client().await?;
        let mut subs: Vec<String> = c
            .query(
                "UPDATE deliveries SET status = 'pending', lease_owner = NULL,
                     lease_expires_ms = NULL, next_attempt_ms = $1, updated_ms = $1
                 WHERE id IN (SELECT id FROM deliveries
                              WHERE status = 'in_flight' AND lease_expires_ms < $1
                              FOR UPDATE SKIP LOCKED)
                 RETURNING subscriber_id",
                &[&now_ms],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        subs.sort();
        subs.dedup();
        Ok(subs)
    }
}

/// The advisory lock of a statistics refresh, shared by every daemon ("fanout" + 3).
const STATISTICS_LOCK: i64 = 0x6661_6e6f_7574 + 3;
/// How often a daemon looks whether `deliveries` has outgrown its planner statistics (and
/// at once when its own ingest has, [`Growth`]).
pub const STATISTICS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Changes to `deliveries` below this many never call for a refresh (autovacuum's analyze
/// follows in its own time; a misplanned turn over fewer pending rows costs little).
const STATISTICS_MIN_CHANGES: i64 = 10_000;

/// Whether `changed` rows since the statistics counted `counted` call for a refresh: the
/// table may have tripled (each refresh of a growing table samples it again, so not at every
/// doubling while a backlog is ingested).
fn outgrown(changed: i64, counted: i64) -> bool {
    changed >= STATISTICS_MIN_CHANGES.max(counted.saturating_mul(2))
}

/// The deliveries this daemon inserted since the statistics were last refreshed, against the
/// row count they were taken with: the server's own count of changes is published about once
/// a second, and a queue that grew tenfold within it would be read with the old plans until
/// then.
#[derive(Debug, Default)]
pub struct Growth {
    inserted: std::sync::atomic::AtomicI64,
    counted: std::sync::atomic::AtomicI64,
    wake: std::sync::Arc<tokio::sync::Notify>,
}

impl Growth {
    /// `n` deliveries inserted: wakes the refresh when they outnumber what the statistics
    /// counted.
    pub fn inserted(&self, n: i64) {
        use std::sync::atomic::Ordering::Relaxed;
        let total = self.inserted.fetch_add(n, Relaxed) + n;
        if outgrown(total, self.counted.load(Relaxed)) {
            self.wake.notify_one();
        }
    }
}

impl PgLedger {
    /// `ANALYZE deliveries` when at least twice as many rows have changed since its
    /// statistics were taken as they counted (and 10,000): returns whether it did.
    ///
    /// Why: the claim and the due probe read `deliveries_due` in due order, and
    /// `deliveries_pending_by_sub` (the API's lists) has the same predicate and subscriber
    /// prefix. With statistics from a table much smaller than the queue (a new ledger, a
    /// backlog that grew within a minute), PostgreSQL estimates one pending row per
    /// subscriber and may read the list index and sort every pending row of the subscriber,
    /// on every turn: measured at 10,000 pending each, 8 ms per subscriber per turn, two
    /// thirds of the server's time per delivery. Autovacuum's analyze comes only after its
    /// naptime (a minute by default) and a 10 % change; this refresh follows the queue
    /// within a second (at once for what this daemon ingested) and, once the table is large,
    /// rarely (only when it has turned over twice). It never waits for a lock: if autovacuum is working on
    /// the table, it leaves it for later.
    pub async fn refresh_statistics(&self) -> Result<bool, LedgerError> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let locked: bool = tx
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&STATISTICS_LOCK])
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(false);
        }
        const COUNTS: &str = "SELECT GREATEST(c.reltuples, 0)::BIGINT,
                 COALESCE(s.n_mod_since_analyze, 0)
             FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
             WHERE c.oid = 'deliveries'::regclass";
        let row = tx.query_one(COUNTS, &[]).await?;
        let (counted, published): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        self.growth.counted.store(counted, Relaxed);
        let mine = self.growth.inserted.load(Relaxed);
        let changed = published.max(mine);
        if !outgrown(changed, counted) {
            return Ok(false);
        }
        tx.batch_execute("SET LOCAL lock_timeout = '100ms'").await?;
        match tx.batch_execute("ANALYZE deliveries").await {
            Ok(()) => {}
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                return Ok(false)
            }
            Err(e) => return Err(e.into()),
        }
        let counted: i64 = tx.query_one(COUNTS, &[]).await?.try_get(0)?;
        tx.commit().await?;
        self.growth.counted.store(counted, Relaxed);
        self.growth.inserted.fetch_sub(mine, Relaxed);
        tracing::debug!(
            counted,
            changed,
            "refreshed the planner's statistics of deliveries"
        );
        Ok(true)
    }

    /// Refresh the statistics of `deliveries` when due ([`PgLedger::refresh_statistics`]),
    /// looking every [`STATISTICS_EVERY`], and at once when this daemon's ingest outgrew
    /// them, until `stop` fires or is dropped.
    pub fn keep_statistics(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        super::every(
            STATISTICS_EVERY,
            Some(self.growth.wake.clone()),
            stop,
            "refresh the planner's statistics of deliveries",
            move || {
                let me = me.clone();
                async move { me.refresh_statistics().await.map(drop) }
            },
        );
    }
}

impl DispatchLedger for PgLedger {
    /// The customers' weights and caps as stored (shared by every daemon; a change is
    /// announced on `CUSTOMERS_CHANNEL`, so each daemon reads them again).
    async fn dispatch_customers(&self) -> Result<Vec<(String, u32, Option<u32>)>, LedgerError> {
        Ok(self
            .list_customers()
            .await?
            .into_iter()
            .map(|c| (c.id, c.weight, c.max_in_flight))
            .collect())
    }

    async fn dispatch_subscribers(&self) -> Result<Vec<(Subscriber, LimiterState)>, LedgerError> {
        let subs = self.list_subscribers().await?;
        let now = crate::time::now_ms();
        let mut out = Vec::with_capacity(subs.len());
        for s in subs {
            let limiter = self.load_limiter(&s.id, now).await?;
            out.push((s, limiter));
        }
        Ok(out)
    }

    async fn dispatch_subscriber(
        &self,
        id: &str,
    ) -> Result<Option<(Subscriber, LimiterState)>, LedgerError> {
        match self.get_subscriber(id).await {
            Ok(s) => {
                let limiter = self.load_limiter(id, crate::time::now_ms()).await?;
                Ok(Some((s, limiter)))
            }
            Err(LedgerError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn record_turn(&self, turn: Turn) -> Result<Recorded, TurnError> {
        match self.record_turn_pg(&turn).await {
            Ok(recorded) => Ok(recorded),
            Err(error) => {
                self.writes.observe_error(&error);
                Err(TurnError { turn, error })
            }
        }
    }

    async fn due_work(&self, dead_threshold: u64) -> Result<Vec<(String, i64)>, LedgerError> {
        self.rearm_dead_alerts(dead_threshold).await?;
        self.due_summary().await
    }

    async fn release_expired_leases(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        PgLedger::release_expired_leases(self, now_ms).await
    }

    async fn release_all_leases(&self, now_ms: i64) -> Result<usize, LedgerError> {
        Ok(self.release_own_leases(now_ms).await? as usize)
    }

    async fn share(
        &self,
        in_flight: &[(Option<String>, usize)],
    ) -> Result<Option<(Share, InFlight)>, LedgerError> {
        // Strings and numbers: serialising cannot fail.
        let mine = serde_json::to_string(in_flight).unwrap_or_else(|_| "[]".into());
        let c = self.client().await?;
        let st = c.prepare_cached(SHARE).await?;
        let rows = c
            .query(
                &st,
                &[&&*self.owner, &MEMBER_TTL_MS, &MEMBER_FORGET_MS, &mine],
            )
            .await?;
        let mut members = Vec::with_capacity(rows.len());
        let mut elsewhere = InFlight::new();
        for r in rows {
            let name: String = r.try_get(0)?;
            if name != *self.owner {
                let theirs: String = r.try_get(1)?;
                // A row another daemon wrote is its own business: one that does not parse
                // (written by some other version) counts as nothing in flight.
                let theirs: InFlight = serde_json::from_str(&theirs).unwrap_or_default();
                elsewhere.extend(theirs);
            }
            members.push(name);
        }
        Ok(Some((Share::new(&self.owner, members), elsewhere)))
    }

    async fn leave(&self) -> Result<(), LedgerError> {
        let c = self.client().await?;
        c.execute("DELETE FROM daemons WHERE name = $1", &[&&*self.owner])
            .await?;
        Ok(())
    }
}

/// A daemon that has not written that its dispatcher is alive for this long is out of the
/// share, and the others take its subscribers. The dispatcher writes every
/// `dispatch::SHARE_EVERY_MS` (a second): five of them, so one slow turn does not drop it.
pub const MEMBER_TTL_MS: i64 = 5_000;
/// Rows of daemons gone this long are deleted.
const MEMBER_FORGET_MS: i64 = 7 * 86_400_000;

/// This daemon (`$1`) is alive now (the server's clock: daemons on several hosts agree on
/// it); the daemons seen within `$2` ms, this one's earlier row among them (the statement
/// sees the table as it was before its own write); rows older than `$3` ms deleted.
const SHARE: &str =
    "WITH t AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now),
     me AS (INSERT INTO daemons (name, seen_ms, in_flight) SELECT $1, now, $4 FROM t
            ON CONFLICT (name) DO UPDATE
            SET seen_ms = EXCLUDED.seen_ms, in_flight = EXCLUDED.in_flight),
     gone AS (DELETE FROM daemons WHERE name <> $1 AND seen_ms < (SELECT now FROM t) - $3)
 SELECT name, in_flight FROM daemons, t WHERE seen_ms >= t.now - $2";

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_core::breaker::Breaker;
    use fanout_core::bucket::Bucket;

    #[test]
    fn merging_a_daemons_limiter_into_the_shared_one() {
        let bucket = |tokens| {
            Some(Bucket {
                tokens,
                updated_ms: 5,
            })
        };
        let open = Breaker {
            consecutive_failures: 20,
            open_until_ms: Some(99),
            probe_started_ms: None,
        };
        let state = |tokens, paused, breaker| LimiterState {
            bucket: bucket(tokens),
            paused_until_ms: paused,
            breaker,
        };
        let closed = Breaker::default();
        let probing = |at| Breaker {
            probe_started_ms: Some(at),
            ..open
        };
        let reopened = Breaker {
            consecutive_failures: 21,
            open_until_ms: Some(30_150),
            probe_started_ms: None,
        };
        let cases = [
            // (shared, mine, merged)
            (
                state(3.0, None, closed),
                state(40.0, None, closed),
                state(3.0, None, closed),
            ),
            (
                state(3.0, Some(10), closed),
                state(40.0, None, open),
                state(3.0, Some(10), open),
            ),
            (
                state(3.0, Some(10), open),
                state(0.0, Some(20), closed),
                state(3.0, Some(20), closed),
            ),
            (
                state(3.0, Some(30), closed),
                state(0.0, Some(20), closed),
                state(3.0, Some(30), closed),
            ),
            // The daemon reserved a probe: none is out until the shared limiter grants it.
            (
                state(3.0, None, open),
                state(3.0, None, probing(100)),
                state(3.0, None, open),
            ),
            // A probe the shared limiter granted stays out while the daemon's copy has it.
            (
                state(3.0, None, probing(100)),
                state(3.0, None, probing(101)),
                state(3.0, None, probing(100)),
            ),
            // Its result ends it: a success closes, a failure re-opens, a pushback ends it.
            (
                state(3.0, None, probing(100)),
                state(3.0, None, closed),
                state(3.0, None, closed),
            ),
            (
                state(3.0, None, probing(100)),
                state(3.0, None, reopened),
                state(3.0, None, reopened),
            ),
            (
                state(3.0, None, probing(100)),
                state(3.0, Some(700), open),
                state(3.0, Some(700), open),
            ),
        ];
        for (shared, mine, merged) in cases {
            assert_eq!(merge_limiter(shared, mine), merged, "{shared:?} + {mine:?}");
        }
    }
}
