//! The dispatcher: leases due deliveries from the ledger, fairly across subscribers and within
//! each one's limiter (rate, in-flight cap, pause, breaker), sends them by the subscriber's
//! lane, and records every result. A retry is a re-enqueue with a due time, never a sleep.
//!
//! Two halves. [`state`] decides everything (a pure state machine: [`vocab::Event`]s in,
//! [`vocab::Effect`]s out, time and jitter as arguments): what to claim, what a result means,
//! which lane, when to sweep leases, re-read the queue or refresh the share, when to wake.
//! [`executor`] only executes: it carries effects out against the ledger, the lanes
//! (`launch`, [`origin_lane`], [`edge_lane`]) and the alerter, feeds every answer back as an
//! event, and sleeps until the state's deadline. It does NOT count in-flight sends, touch a
//! limiter, keep a timer or choose what is sent.
//!
//! Pure (no clock, randomness, I/O or async): `vocab`, `state/`, `plan`, `fair`.

pub mod edge_lane;
pub mod executor;
pub mod fair;
mod launch;
pub mod origin_lane;
pub mod plan;
#[cfg(test)]
mod simulation;
pub mod state;
pub mod vocab;

pub use executor::{Clock, DispatchConfig, Dispatcher};
pub use state::{LEASE_MS, SHARE_EVERY_MS};
pub use vocab::Control;
