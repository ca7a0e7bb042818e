//! [`Observe`] on PostgreSQL: whether the server answers, and what `/metrics` reads (`ops.rs`
//! and `retention.rs` hold the statements).

use fanout_core::breaker::BreakerConfig;

use super::ledger::PgLedger;
use crate::ledger::error::LedgerError;
use crate::ledger::stats::{MetricsSnapshot, Observe};

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
