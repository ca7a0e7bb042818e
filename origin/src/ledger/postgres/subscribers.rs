//! [`Subscribers`] on PostgreSQL: the API's subscriber operations, each a transaction of its
//! own under the subscriber row's lock where it changes one (`ops.rs` holds the statements).

use std::collections::BTreeMap;

use super::ledger::PgLedger;
use crate::ledger::error::LedgerError;
use crate::ledger::scope;
use crate::ledger::subscribers::{SubscriberCounts, Subscribers};
use crate::model::Subscriber;

impl Subscribers for PgLedger {
    async fn subscriber(
        &self,
        id: String,
        scope: Option<String>,
    ) -> Result<Subscriber, LedgerError> {
        let s = self.get_subscriber(&id).await?;
        scope::visible(scope.as_deref(), s)
    }

    async fn create_subscriber(
        &self,
        s: Subscriber,
        secret: String,
    ) -> Result<Subscriber, LedgerError> {
        self.create_subscriber(&s, &secret).await?;
        self.get_subscriber(&s.id).await
    }

    async fn subscribers(
        &self,
        only: Option<String>,
        with_stats: bool,
        scope: Option<String>,
    ) -> Result<(Vec<Subscriber>, Option<BTreeMap<String, SubscriberCounts>>), LedgerError> {
        let mut subs = match &only {
            Some(id) => vec![self.get_subscriber(id).await?],
            None => self.list_subscribers().await?,
        };
        scope::retain(scope.as_deref(), &mut subs);
        let counts = if with_stats {
            let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
            Some(self.subscriber_counts(&ids, crate::time::now_ms()).await?)
        } else {
            None
        };
        Ok((subs, counts))
    }

    async fn update_subscriber<E, F>(
        &self,
        id: String,
        scope: Option<String>,
        change: F,
    ) -> Result<Result<Subscriber, E>, LedgerError>
    where
        E: Send + 'static,
        F: FnOnce(Subscriber) -> Result<(Subscriber, bool), E> + Send + 'static,
    {
        self.change_subscriber(&id, scope.as_deref(), change).await
    }

    async fn delete_subscriber(&self, id: String, now_ms: i64) -> Result<u64, LedgerError> {
        self.delete_subscriber(&id, now_ms).await
    }

    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        now_ms: i64,
        grace_ms: i64,
        scope: Option<String>,
    ) -> Result<(), LedgerError> {
        self.rotate_secret_scoped(&id, &secret, now_ms, grace_ms, scope.as_deref())
            .await
    }
}
