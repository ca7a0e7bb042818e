//! The PostgreSQL ledger: several daemons share one database. Same tables as the SQLite ledger,
//! plus the owner of each lease; the same operations, as async methods over a connection pool
//! (`deadpool-postgres` over `tokio-postgres`).
//!
//! How several daemons share the work without exceeding a subscriber's rate:
//! - A claim runs in one transaction: it locks the claimed subscribers' rows (`FOR UPDATE`, in id
//!   order), counts their in-flight deliveries from live leases, lets the shared core limiter
//!   (the stored bucket, pause and breaker of that row) reserve how many may go, picks and leases
//!   that many due deliveries to this daemon until an expiry in one statement (`FOR UPDATE SKIP
//!   LOCKED`), gives back what it did not find and stores the limiter back. Two daemons claiming
//!   for one subscriber take turns on its row, so their grants add up to what one limiter
//!   allows. A dispatcher turn (results, limiters, claim) is one transaction of six round
//!   trips, whatever its size: statements are prepared once per connection and sent
//!   several at a time where the next does not need the previous answer.
//! - Leases carry their owner (the daemon's id) and expiry. A lease that expired is claimable by
//!   anyone; a result is recorded only while its delivery is still in flight and leased to the
//!   daemon recording it, so a daemon that comes back after its work was taken over records
//!   nothing for it.
//! - The live daemons split the subscribers (`model::Share`, from the `daemons` table each
//!   dispatcher writes every second): each claims for its own, so their turns do not queue on
//!   each other's subscriber locks. The locks above still decide; the split only spares the wait.
//! - Ingest notifies the other daemons (`NOTIFY fanout_due`) of the subscribers that got work,
//!   on commit; they `LISTEN` instead of polling hard.
//!
//! Invariants: what the SQLite ledger keeps (a delivery exists at most once per
//! `(subscriber_id, event_id)`; deliveries, attempts and events are deleted only by
//! `retention.rs`, finished deliveries past their window, never anything pending or in flight;
//! per-subscriber counts are kept by triggers, never counted from the deliveries), and: a delivery
//! is `in_flight` exactly when it has a lease owner and expiry (a CHECK); this module never
//! waits for a delivery row lock while holding a subscriber row lock it took after it (subscriber
//! rows first, in id order; delivery rows are skipped when locked), so claims never deadlock.
//!
//! Files by subject: `subscribers.rs`, `deliveries.rs`, `customers.rs`, `retention.rs`,
//! `series.rs` (the charts' buckets), `stats.rs` (the contract's traits), `ingest.rs` (with `group.rs`, its group commit), `leases.rs` (claims and results),
//! `health.rs`, `dispatch.rs` (`DispatchLedger`: turns, lease renewal, the share), `rows.rs`
//! (rows read into the contract's types), `shared.rs` (the shared limiter's
//! arithmetic, pure), `schema.rs`; the server's own machinery: `ledger.rs` (the handle and its
//! pool), `error.rs` (the driver's errors into the contract's), `listen.rs` (`LISTEN`/`NOTIFY`
//! between daemons), `clock.rs` (one clock for every daemon), `statistics.rs`, `vacuum.rs`.
//! The URL grammar and TLS are `crate::pg`'s, shared with the outbox. Nothing here is SQLite's,
//! and nothing outside this folder (but the copy command, `crate::pg` and the outbox) names
//! `tokio_postgres`, nothing else `deadpool`.
//!
//! # PostgreSQL ledger: driver, and what differs from SQLite
//!
//! Driver: `tokio-postgres` with the `deadpool-postgres` pool. `tokio-postgres` is the async
//! PostgreSQL client most Rust services use (maintained with `rust-postgres`, by the same author
//! since 2013), speaks the protocol directly (no C library), supports `LISTEN/NOTIFY` as a stream
//! of messages on a connection and binds arrays natively (`unnest($1::text[])`), which is how
//! every batch goes in. `deadpool-postgres` is a small, widely used pool over it with a statement
//! cache per connection. `sqlx` was the alternative: heavier (macros, an offline query cache or a
//! database at compile time for checked queries, its own pool and runtime glue) for no gain here —
//! the SQL is hand-written, tested against a real server, and half of it is `unnest` over arrays,
//! which `sqlx`'s checked macros do not help with. TLS is rustls (the provider reqwest already
//! uses) behind tokio-postgres' `MakeTlsConnect` (`crate::pg::tls`, a small adapter over
//! `tokio-rustls` rather than one more crate): the URL's `sslmode` as libpq names it, `require`
//! (encrypted, unchecked) or `verify-full` (chain and host name, against the system's roots
//! from `rustls-native-certs` or `sslrootcert=PATH`); `disable`/`prefer` stay plain.
//!
//! What differs from SQLite, by design:
//! - Leases are short (15 s) and renewed every 5 s by a live daemon, instead of lasting longer than
//!   any send (120 s): a dead daemon's work is taken over within seconds. A daemon's name in its
//!   leases is `host:port`; a daemon restarted in the same place releases its previous run's
//!   leases at start-up; other daemons' leases are theirs until they expire. A daemon renews
//!   every lease it owns, so a turn whose commit reached the server but whose answer the
//!   connection lost (a server restarting, found by the fault soak) would leave leases renewed
//!   for as long as the daemon lives and their deliveries never sent: after a failed turn the
//!   dispatcher's next recorded turn is followed by `release_strays`, which returns this
//!   daemon's leases other than the deliveries it has out.
//! - Ingest and replays announce new work with `NOTIFY fanout_due` (subscriber ids), subscriber
//!   changes with `NOTIFY fanout_changed`; every daemon `LISTEN`s and hands them to its
//!   dispatcher (the 2 s rescan covers a lost notification of due work). A daemon listens before
//!   its dispatcher reads the subscribers, and whenever it listens again (a lost connection: a
//!   restarted server, a proxy's idle timeout) its dispatcher reads the customers and every
//!   subscriber again (`Control::Reload`): a subscriber created meanwhile through another daemon,
//!   and owned by this one, would otherwise never be claimed for. A listening connection sends
//!   nothing of its own, so one dropped silently on the way would look alive and hear nothing: after
//!   5 s of quiet the daemon asks it `SELECT 1` and listens anew when no answer comes within 5 s;
//!   every connection has TCP keepalives (30 s idle, `ledger.rs`, `parse_url`).
//! - One clock for every daemon, the server's (`clock.rs`). Lease expiries, due times
//!   (ingest, retries, deferrals), the shared limiter's stamps, portal tokens' expiry are written
//!   by one daemon and compared by another; on their hosts' clocks a daemon 60 s ahead released the
//!   others' live leases as expired (their results then counted for nothing, the webhooks went
//!   twice) and one 60 s behind found the others' new work due only a minute later. Each daemon
//!   measures the server's clock against its host's before it serves, then every second (`SELECT`
//!   of `clock_timestamp()`, corrected for the round trip as NTP does: right within half of it;
//!   a new offset is taken only when it moved beyond that), and `time::now_ms` — the daemon's only
//!   clock — is the host's plus that offset. So the pure core and the state machine still take
//!   `now` as an argument and SQL compares the times it is given, and every time in the ledger is
//!   the server's. Moving the comparisons into SQL (`now()`) instead would have left the times the
//!   shared core computes in Rust (the limiter's refill and pauses, backoff due times, the
//!   dispatcher's own view) on the host's clock, and split one decision across two clocks. An
//!   offset over a second is logged as a warning naming which clock is off (the HTTP servers the
//!   daemon calls are the third clock that tells: `clock.rs`), exported as
//!   `fanout_clock_offset_seconds` and shown by `fanout status` (read from `/metrics`).
//!   Signatures (`webhook-timestamp`, calls to the edge) carry the host's clock, not the
//!   server's: their receivers compare them with their own wall clocks. So do the logs.
//! - The dispatcher's own limiter is only an upper bound: each claim asks the shared one again and
//!   the dispatcher gives back what it was refused.
//! - Daemons split the subscribers (migration 4, `model::Share`): every second each dispatcher
//!   writes that it is alive in `daemons` (the server's clock) and reads the daemons seen within
//!   5 s; rendezvous hashing over their names gives every subscriber one owner, the same in every
//!   daemon, and a daemon asks to claim only for its own (`dispatch/state/`). A turn locks its
//!   subscribers' rows from its first statement to its commit, so without owners every daemon's
//!   turns waited on every other's (the turns serialised, each smaller than one daemon's). The
//!   owner is a matter of speed, not safety: the row locks and the shared limiter still decide,
//!   so two daemons that disagree for a second only wait for each other. A daemon that stops
//!   leaves at once (`DELETE` of its row); one killed or cut off ages out in 5 s and its
//!   subscribers go to the others then, its leases when they expire. The liveness is the
//!   dispatcher loop's own: a daemon whose dispatcher is stuck stops writing and loses its
//!   subscribers.
//! - The shared limiter is the one that decides; a daemon's own copy only proposes. A daemon's
//!   breaker (its run of failures, its opening) comes from the results it records and is folded
//!   into the shared row; whether a probe is out is the shared limiter's alone: a daemon can end
//!   a probe (its result came back) but never start one (`merge_limiter`). Folded in as "a probe
//!   already out", a daemon's own reservation of the probe made the claim refuse every probe,
//!   and the subscriber stalled for good. A claim the
//!   shared limiter refuses (its rate, a Retry-After pause, the breaker — another daemon may have
//!   spent the tokens or heard the 429) comes back with the time it allows the next send
//!   (`Claim::not_before_ms`), and the dispatcher asks for that subscriber again only then,
//!   however much new work is announced meanwhile. A full in-flight cap is no wait: a result
//!   frees a slot. (Without it every announcement, one per ingest, cost each daemon a turn that
//!   leased nothing.)
//! - The hot path's cost is round trips and index entries, not rows: a dispatcher turn (results
//!   and their attempts, limiters, the next claim) is one transaction of six round trips
//!   whatever its size (statements prepared once per connection, sent several at a time where the
//!   next needs no answer from the previous; a claim picks, locks, leases and reads its deliveries
//!   in one `UPDATE … RETURNING`; results and attempts are one statement). `deliveries` keeps only
//!   the indexes a path needs, since every lease and result writes an entry in each (details and
//!   numbers: BENCHMARKS.md, "PostgreSQL ledger").
//! - A turn's plans do not depend on statistics the queue has outgrown. The claim and the due
//!   probe must read `deliveries_due`, in due order; the API's `deliveries_pending_by_sub` has the
//!   same predicate and prefix, and with statistics from a much smaller table PostgreSQL chose it
//!   and sorted each subscriber's whole backlog on every turn. A daemon runs `ANALYZE deliveries`
//!   when twice the counted rows (and 10,000) have changed since the last one, woken at once by its
//!   own ingest (`PgLedger::refresh_statistics`, one daemon at a time, never waiting for
//!   autovacuum's lock). In-flight rows are too short-lived for any statistics, so the statements
//!   that read them are written so that no plan can read the leases once per lease. A test plans a
//!   turn's statements with the server's own settings after a queue outgrew its statistics.
//! - Customers on PostgreSQL (migration 3, `customers.rs`) are SQLite's: the same
//!   table, subscribers naming their customer, the same portal tokens and checks. What several
//!   daemons add: the portal signing key is one row made by the first daemon that starts and read
//!   by every other, so a link works on any daemon; a customer change is announced with
//!   `NOTIFY fanout_customers` and every dispatcher reads the weights and caps again
//!   (`PgLedger::dispatch_customers`), so the weighted share holds whichever daemon was asked.
//!   Each daemon shares only its own in-flight budget, between the subscribers it owns; with the
//!   liveness it writes every second what it has in flight per customer (migration 5,
//!   `daemons.in_flight`) and reads the others' (`Event::Elsewhere`), and `fair.rs` counts them
//!   as in flight: a daemon that owns only a heavy customer's endpoints gives it its whole budget
//!   and the others give the light customers more of theirs, so the weights hold across the
//!   daemons; a customer's `max_in_flight` is the customer's, not each daemon's. The others'
//!   counts are up to a second old, so a cap is approximate by what changed within that second
//!   (at the start of a burst each daemon may fill it on its own); the subscribers' own limits
//!   stay exact (the shared limiter).
//!   A customer row is locked `FOR SHARE` by whatever makes a subscriber name it and `FOR UPDATE`
//!   by its removal, which counts live subscribers only after taking that lock: a customer is
//!   never removed while a live subscriber names it. Lock order stays subscribers, then
//!   customers, then deliveries. `fanout ledger copy` brings customers, ownership and the portal
//!   key over, so links issued before the move keep working.
//! - A pool or connection failure is 503 `unavailable`, as a SQLite ledger that cannot write;
//!   so is a server whose disk is full or failing, told by its SQLSTATE (`53100`, `58030`) as
//!   SQLite's by its result code: ingest refuses the batch whole and accepts again once there is
//!   room, a dispatcher turn is handed back and retried. Both note it in the daemon's
//!   `WriteState` (the atomics `/healthz` reads), and a probe every second while it lasts
//!   (`PgLedger::probe_room`: 64 KiB into `events`, rolled back) clears it, as SQLite's writer
//!   probe does.
//! - Counts (migration 2): SQLite's `delivery_counts` is one row per (subscriber, status) updated
//!   in place by row triggers — free with one writer. On PostgreSQL that row would be a lock every
//!   daemon's ingest, claims and results for a subscriber queue on (and a deadlock risk between
//!   statements touching several subscribers in different orders), so the triggers append instead:
//!   one statement-level trigger per INSERT, UPDATE and DELETE on deliveries reads its transition
//!   tables and appends one `(subscriber, status, ±n)` row per group whose count changed (a lease
//!   renewal appends nothing). Every daemon runs a fold every second (`pg_try_advisory_xact_lock`,
//!   so one at a time): in one transaction it deletes the rows and inserts their sums, so a reader
//!   sees the same totals before and after and sums a handful of rows per subscriber. Each
//!   subscriber's last error is appended the same way (a trigger on attempts) and folded to the
//!   latest.
//! - Retention: the same task and step sizes as on SQLite (`crate::retention`, through
//!   the contract's `Retention`); each step is one transaction that first takes a transaction-scoped advisory
//!   lock and gives up its pass when another daemon holds it, so one daemon purges at a time and a
//!   daemon that dies mid-pass leaves nothing held. Deliveries to purge are taken oldest first by
//!   the partial indexes `deliveries_sent_age` / `deliveries_dead_age` with `FOR UPDATE SKIP
//!   LOCKED`, events no delivery refers to are swept in `(received_ms, id)` order from a stored
//!   mark (the daemons' receive times are on one clock, the server's, see above). Space: PostgreSQL
//!   does not shrink a table on delete; deleted rows, and every version an update leaves
//!   behind, become dead tuples whose space is reused once a vacuum has marked it free.
//!   Autovacuum alone let the files grow in the fault soak while the kept rows were level (it
//!   looks once a minute, waits for a fifth of a table, and a crash recovery resets its counts),
//!   so each daemon vacuums the churned tables itself once a tenth of one is dead (`vacuum.rs`:
//!   `VACUUM (SKIP_LOCKED)`, which blocks no read or write and skips a table another session is
//!   vacuuming); under steady traffic the tables level off at one window's worth plus that
//!   slack, as SQLite's free list does. Nothing runs `VACUUM FULL` (it would lock the tables against every daemon); to give space back
//!   after a one-off spike, an operator runs it (or `pg_repack`) in a quiet hour.
//! - Lists page by id with an index behind each (migration 2), and few indexes: every delivery is
//!   written three times and no update is HOT, so each version enters every index whose predicate
//!   it meets. Per status within a subscriber in id order: partial indexes for pending, sent and dead
//!   (`deliveries_*_by_sub`); in flight by the lease index (bounded by the in-flight caps). A list
//!   by status alone reads one range per subscriber that has deliveries in that status (the kept
//!   counts say which), merged; by subscriber alone one range per status. A time range becomes
//!   ids through the events (written once, indexed by receive time; a delivery is created with
//!   its event's receive time). Ids follow creation within one daemon; across daemons (whose clocks
//!   agree within their offsets' measuring error, a few milliseconds) a delivery created at nearly
//!   the same instant may fall on the other side of a time bound (times are checked too, so a list never shows one outside its range).
//!   `tests/plans.rs` takes every statement the hot paths run from the server's
//!   statement log and checks its generic plan: no full scan of deliveries, attempts or events,
//!   no unbounded sort of deliveries.
//! - `fanout backup` is SQLite's `VACUUM INTO`; on a PostgreSQL URL it refuses and names
//!   `pg_dump`, PostgreSQL's consistent online copy, rather than re-implement it.

mod clock;
mod customers;
mod deliveries;
mod dispatch;
mod error;
mod group;
mod growth;
mod health;
mod ingest;
mod leases;
mod ledger;
pub(super) mod listen;
mod ordered;
mod retention;
mod rows;
mod schema;
mod series;
mod shared;
mod statistics;
mod stats;
mod subscribers;
mod vacuum;

// The door: the handle (`PgLedger::open`); the contract's implementations come with it. Nothing
// else is public: the store and the copy reach the rest (`pub(in crate::ledger)`), and the
// PostgreSQL-only tests live inside (`tests/`).
pub use ledger::PgLedger;

pub(super) use ledger::Rounds;

/// The shared limiter's arithmetic, for the dispatcher's simulation of several daemons.
#[cfg(test)]
pub(crate) use shared::{grant_shared, merge_limiter, shared_wait};

#[cfg(test)]
mod tests;
