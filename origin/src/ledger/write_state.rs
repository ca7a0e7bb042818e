//! Whether the ledger can write, as its last failed write and its probes saw it: atomics that
//! `/healthz` and ingest read without asking the backend. Both backends note their failures
//! here; this file does not classify a driver's errors (each backend does, in its folder).

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::Arc;

use super::error::{LedgerError, Unavailable};

/// Whether the ledger can write, as its last failed write and its probes saw it. Read with
/// atomics only: asking never waits behind the writer.
#[derive(Debug, Default)]
pub struct WriteState {
    /// Unix ms of the first failure of the current run of them; 0 while writes succeed.
    failing_since_ms: AtomicI64,
    /// The [`Unavailable`] of the last failure: 1 full, 2 I/O.
    kind: AtomicU8,
    /// Syncs of the WAL that succeeded (each made every commit before it durable).
    pub(crate) syncs: Arc<std::sync::atomic::AtomicU64>,
}

impl WriteState {
    /// How many times the writer's WAL has been synced.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// `Some((why, since_ms))` while the ledger cannot write.
    pub fn failing(&self) -> Option<(Unavailable, i64)> {
        let since = self.failing_since_ms.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let why = match self.kind.load(Ordering::Acquire) {
            2 => Unavailable::Io,
            _ => Unavailable::Full,
        };
        Some((why, since))
    }

    pub(crate) fn failed(&self, why: Unavailable, now_ms: i64) {
        self.kind.store(
            match why {
                Unavailable::Full => 1,
                Unavailable::Io => 2,
            },
            Ordering::Release,
        );
        let _ = self.failing_since_ms.compare_exchange(
            0,
            now_ms.max(1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(crate) fn recovered(&self) {
        if self.failing_since_ms.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("the ledger can write again");
        }
    }

    /// Note what an operation's result says about the ledger's ability to write.
    pub(crate) fn observe<T>(&self, r: &Result<T, LedgerError>) {
        if let Err(e) = r {
            self.observe_error(e);
        }
    }

    /// Note what an operation's error says about the ledger's ability to write.
    pub(crate) fn observe_error(&self, e: &LedgerError) {
        if let LedgerError::Unavailable(why) = e {
            if self.failing().is_none() {
                tracing::error!(error = %why, "the ledger cannot write; ingest answers 503 until it can");
            }
            self.failed(*why, crate::time::now_ms());
        }
    }
}
