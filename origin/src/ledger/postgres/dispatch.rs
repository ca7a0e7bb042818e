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

use fanout_core::limiter::LimiterState;
use tokio_postgres::types::ToSql;

use std::collections::{BTreeMap, HashMap};

use super::leases::{
    core_limits, per_of, wanted_of, PgClaim, CLAIM_COUNT, CLAIM_EXPIRE, RECORD_OUTCOMES,
    STORE_LIMITERS,
};
use super::ledger::{every, PgLedger};
use super::rows::{decode_limiter, encode_limiter};
use super::shared::merge_limiter;
use crate::ledger::dispatch::{DispatchLedger, Recorded, Turn, TurnError};
use crate::ledger::error::LedgerError;
use crate::model::{Claim, HealthWrite, InFlight, Share, Subscriber};

/// How long a lease lasts without renewal: the longest a dead daemon's work waits.
pub(super) const LEASE_MS: i64 = 15_000;
/// A live daemon renews its leases this often (a third of their length: two renewals may
/// fail before one lapses).
pub const RENEW_EVERY_MS: i64 = 5_000;

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
         (SELECT COUNT(*) FILTER (WHERE o.batch_lead IS NULL OR o.batch_lead = o.id)
          FROM deliveries o
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
        let ids = turn_subscribers(turn);
        let asks = turn.asks();
        let wanted = wanted_of(&asks);
        // The claim reads its subscribers' rows from this turn's locks (as this turn leaves
        // them) unless a health change (which may disable one) comes in between.
        let direct = turn.health.is_empty() && !wanted.is_empty();
        let locked = if !ids.is_empty() || !rowids.is_empty() {
            self.lock_turn(&tx, turn, &ids, &rowids, &wanted, direct)
                .await?
        } else {
            Locked::default()
        };
        let Locked {
            claim_rows,
            store_ids,
            store_states,
        } = locked;
        // Pipelined, in this order: the limiters, the results, then (for the claim) the
        // expired leases back to the queue and what is in flight.
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
        let record = Self::record_outcomes(&tx, owner, &turn.outcomes, now);
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
        let claims = if asks.is_empty() {
            Vec::new()
        } else if direct {
            let per = per_of(&turn.batch_per, &turn.runs);
            Self::lease_in(
                &tx,
                owner,
                &wanted,
                &per,
                claim_rows,
                &counted,
                now,
                lease_until,
            )
            .await?
        } else {
            let per = per_of(&turn.batch_per, &turn.runs);
            Self::claim_in(&tx, owner, &asks, &per, self.breaker, now, lease_until).await?
        };
        tx.commit().await?;
        Ok(Recorded {
            claims: in_order(&asks, claims, now),
            notices,
            due: applied.released,
        })
    }

    /// The first statements of a turn: every subscriber row it names (`ids`) or whose sends it
    /// ends (`rowids`, still leased to this daemon) locked in id order, with the sends open
    /// just before; each row's shared limiter settled and folded with this daemon's, to be
    /// stored, and (`direct`) the rows the claim will lease from.
    async fn lock_turn(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        turn: &Turn,
        ids: &[&str],
        rowids: &[i64],
        wanted: &BTreeMap<&str, usize>,
        direct: bool,
    ) -> Result<Locked, LedgerError> {
        let now = turn.now_ms;
        let owner: &str = &self.owner;
        let Locked {
            mut claim_rows,
            mut store_ids,
            mut store_states,
        } = Locked::default();
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
        Ok(Locked {
            claim_rows,
            store_ids,
            store_states,
        })
    }

    /// Push this daemon's leases out to `now_ms + LEASE_MS` (it is alive, its sends are still
    /// out). Returns how many. Every lease it owns: one a turn wrote though its answer was lost
    /// is renewed too, until the dispatcher returns it (`release_strays`).
    pub(super) async fn renew_leases(&self, now_ms: i64) -> Result<u64, LedgerError> {
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
    pub(super) fn keep_leases(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        every(
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
    pub(super) async fn release_expired_leases(
        &self,
        now_ms: i64,
    ) -> Result<Vec<String>, LedgerError> {
        let c = self.client().await?;
        let mut subs: Vec<String> = c
            .query(
                "UPDATE deliveries SET status = 'pending', lease_owner = NULL,
                     lease_expires_ms = NULL, next_attempt_ms = CASE
                         WHEN ordering_key IS NOT NULL AND batch_lead IS NOT NULL
                              AND batch_lead <> id
                         THEN 9223372036854775807 ELSE $1 END,
                     updated_ms = $1
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

/// What a turn's locks found: the rows its claim leases from, and the limiters to store.
#[derive(Default)]
struct Locked {
    claim_rows: Vec<(String, fanout_core::limiter::Limits, LimiterState)>,
    store_ids: Vec<String>,
    store_states: Vec<String>,
}

/// Every subscriber row a turn will lock, in id order, each once: locked at once, whatever the
/// turn locks later (health, dead counts, the claim) it already holds, so two daemons' turns
/// never lock the same rows in different orders.
fn turn_subscribers(turn: &Turn) -> Vec<&str> {
    let mut ids: Vec<&str> = turn.limiters.iter().map(|(id, _)| id.as_str()).collect();
    ids.extend(turn.claims.iter().map(|(id, _)| id.as_str()));
    ids.extend(turn.dead.iter().map(String::as_str));
    ids.extend(turn.health.iter().map(|h| match h {
        HealthWrite::FailingSince { subscriber, .. } | HealthWrite::Disable { subscriber, .. } => {
            subscriber.as_str()
        }
    }));
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The claims in the order asked, each with when its limiter lets the next one go.
fn in_order(asks: &[(String, usize)], mut claims: Vec<PgClaim>, now: i64) -> Vec<Claim> {
    let mut ordered = Vec::with_capacity(claims.len());
    for (id, _) in asks {
        if let Some(k) = claims.iter().position(|c| &c.subscriber_id == id) {
            let c = claims.swap_remove(k);
            ordered.push(Claim {
                subscriber_id: c.subscriber_id,
                claimed: c.claimed,
                next_due_ms: c.next_due_ms,
                runs: c.runs,
                not_before_ms: c
                    .wait_ms
                    .map(|w| now.saturating_add(i64::try_from(w).unwrap_or(i64::MAX))),
            });
        }
    }
    ordered
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
        self.bury_removed().await?;
        self.rearm_dead_alerts(dead_threshold).await?;
        self.due_summary().await
    }

    async fn release_expired_leases(&self, now_ms: i64) -> Result<Vec<String>, LedgerError> {
        PgLedger::release_expired_leases(self, now_ms).await
    }

    async fn release_all_leases(&self, now_ms: i64) -> Result<usize, LedgerError> {
        Ok(self.release_own_leases(now_ms).await? as usize)
    }

    async fn release_strays(
        &self,
        held: Vec<i64>,
        now_ms: i64,
    ) -> Result<Vec<String>, LedgerError> {
        PgLedger::release_strays(self, &held, now_ms).await
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
