//! The PostgreSQL-only tests: what several daemons sharing one server do that the parity suite
//! (`origin/tests/ledger_parity.rs`, every backend through the store) cannot show — leases and
//! their owners (`claims.rs`), how it writes (`writes.rs`), its statements' plans (`plans.rs`).
//! They live inside the backend so that they drive its own methods while the backend exports
//! only its door (tidy: `DOORS`). Each test starts a throwaway server with the integration
//! tests' helper, included here rather than copied.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod claims;
mod fixtures;
mod plans;
mod writes;

#[allow(dead_code, unreachable_pub)]
#[path = "../../../../tests/common/pg.rs"]
mod pg;
