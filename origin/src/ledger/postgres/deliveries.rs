//! [`Deliveries`] on PostgreSQL: ingest, lists, one delivery, replays and test events for the
//! API, each a transaction of its own (`ops.rs` and `customers.rs` hold the statements).

use super::ledger::PgLedger;
use crate::ledger::deliveries::{
    Deliveries, DeliveryFilter, DeliveryView, Ingested, NewEvent, ReplayStep,
};
use crate::ledger::error::LedgerError;
use crate::ledger::scope;

impl Deliveries for PgLedger {
    async fn ingest(
        &self,
        events: Vec<NewEvent>,
        now_ms: i64,
    ) -> Result<(Vec<Ingested>, Vec<String>), LedgerError> {
        self.ingest(&events, now_ms).await
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
