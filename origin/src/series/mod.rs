//! The charts' series: what the console and the portal draw over the last hour and day.
//!
//! The dispatcher counts each result into an in-memory [`acc::Accumulator`] (one short lock,
//! no ledger write, no clock); the flush task (`crate::charts`) takes it every
//! [`buckets::FINE_MS`], with the gauges `/metrics` reads (kept counts and keyed lookups, never
//! a scan of the deliveries), as a few rows per active subscriber: its fine bucket and the
//! coarse bucket holding it, each added to what is already there (the ledger's
//! `add_series`), and the same for the totals of every subscriber and of each customer's
//! (`buckets::total_key`), which a combined chart reads: one row per bucket, whatever the
//! number of subscribers. So the series survive a restart, add up across daemons sharing a
//! PostgreSQL ledger, cost the same whatever the ledger holds, and are trimmed by retention
//! (`crate::retention`). The arithmetic is [`buckets`] (pure). This module names nothing of
//! the daemon's above it: the ledger stores its rows, the flush task feeds it.

pub mod acc;
pub mod buckets;
