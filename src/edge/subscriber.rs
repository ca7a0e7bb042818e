//! The subscriber's Durable Object: one per subscriber id, so its limiter is global and exact.
//! It grants a whole batch with one read-refill-write (no `.await` in between), sends what was
//! granted concurrently, and folds each outcome back into the stored state.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use worker::{durable_object, DurableObject, Env, Method, Request, Response, State};

use super::send;
use crate::breaker::BreakerConfig;
use crate::bucket::Rate;
use crate::limiter::{LimiterState, Limits};
use crate::logrec;
use crate::sign::Secret;
use crate::wire::{BatchResponse, DeliveryBatch, DeliveryResult, ErrorBody};

/// What the object stores: the limiter, and the limits it last saw (for the status view).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Stored {
    limiter: LimiterState,
    rate_per_sec: Option<f64>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
}

impl Stored {
    fn limits(&self) -> Option<Limits> {
        Some(Limits {
            rate: Rate {
                per_sec: self.rate_per_sec?,
                burst: self.burst?,
            },
            max_in_flight: self.max_in_flight?,
            breaker: BreakerConfig::default(),
        })
    }
}

#[durable_object]
#[allow(missing_debug_implementations)] // `State` has no Debug; the object is never printed.
pub struct SubscriberDO {
    state: State,
    // Shared with the callback that folds each outcome in as it arrives (see `deliver`).
    stored: Rc<RefCell<Stored>>,
    in_flight: Rc<Cell<u32>>,
}

fn now_ms() -> i64 {
    worker::Date::now().as_millis() as i64
}

impl SubscriberDO {
    fn load(state: &State) -> worker::Result<Stored> {
        let sql = state.storage().sql();
        sql.exec(
            "CREATE TABLE IF NOT EXISTS limiter (id INTEGER PRIMARY KEY CHECK (id = 1), state TEXT NOT NULL)",
            None,
        )?;
        #[derive(Deserialize)]
        struct Row {
            state: String,
        }
        let rows: Vec<Row> = sql
            .exec("SELECT state FROM limiter WHERE id = 1", None)?
            .to_array()?;
        Ok(rows
            .first()
            .and_then(|r| serde_json::from_str(&r.state).ok())
            .unwrap_or_default())
    }

    /// Write the current state. Synchronous: storage writes are coalesced by the runtime and
    /// the output gate holds the response until they are durable.
    fn save(&self) -> worker::Result<()> {
        let json = serde_json::to_string(&*self.stored.borrow())
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.state.storage().sql().exec(
            "INSERT INTO limiter (id, state) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET state = excluded.state",
            vec![json.into()],
        )?;
        Ok(())
    }

    async fn deliver(&self, mut req: Request) -> worker::Result<Response> {
        let batch: DeliveryBatch = match req.json().await {
            Ok(b) => b,
            Err(e) => {
                return Ok(Response::from_json(&ErrorBody::new(
                    "invalid_request",
                    format!("malformed batch: {e}"),
                ))?
                .with_status(400))
            }
        };
        let sub = &batch.subscriber;
        let secrets: Vec<Secret> = sub
            .secrets
            .iter()
            .filter_map(|s| Secret::parse(s).ok())
            .collect();
        let limits = Limits {
            rate: Rate {
                per_sec: sub.rate_per_sec,
                burst: sub.burst,
            },
            max_in_flight: sub.max_in_flight,
            breaker: BreakerConfig::default(),
        };

        // Read, refill, grant and write back with no `.await` in between.
        let plan = {
            let mut stored = self.stored.borrow_mut();
            stored.rate_per_sec = Some(sub.rate_per_sec);
            stored.burst = Some(sub.burst);
            stored.max_in_flight = Some(sub.max_in_flight);
            let plan = stored.limiter.plan(
                limits,
                self.in_flight.get(),
                now_ms(),
                batch.deliveries.len(),
            );
            self.in_flight.set(self.in_flight.get() + plan.send as u32);
            plan
        };
        self.save()?;

        let (to_send, to_defer) = batch.deliveries.split_at(plan.send);
        let target = send::Target {
            url: &sub.url,
            secrets: &secrets,
            legacy: sub.legacy_signature,
            timeout_ms: sub.timeout_ms,
        };
        let (stored, in_flight) = (Rc::clone(&self.stored), Rc::clone(&self.in_flight));
        let mut results = send::deliver_all(&target, to_send, move |attempt| {
            // Fold each outcome in as soon as it is known, so concurrent calls see it.
            let (now, open) = (now_ms(), in_flight.get());
            let mut stored = stored.borrow_mut();
            stored.limiter.settle(limits, open, now);
            stored.limiter.record(limits, attempt, now);
            in_flight.set(open.saturating_sub(1));
        })
        .await;
        self.save()?;
        results.extend(
            to_defer
                .iter()
                .zip(plan.deferred)
                .map(|(d, (reason, wait))| DeliveryResult::Deferred {
                    id: d.id.clone(),
                    retry_after_ms: wait,
                    reason,
                }),
        );
        // One console.log per call, one JSON record per line (see logrec).
        worker::console_log!("{}", logrec::lines(&sub.id, &batch.deliveries, &results));
        let body = BatchResponse { results };
        Ok(Response::from_json(&body)?.with_status(body.http_status()))
    }

    fn status(&self, req: &Request) -> worker::Result<Response> {
        let id = req
            .url()?
            .query_pairs()
            .find(|(k, _)| k == "id")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        let stored = self.stored.borrow();
        let Some(limits) = stored.limits() else {
            let body = ErrorBody::new(
                "unknown_subscriber",
                "no deliveries have been seen for this subscriber",
            );
            return Ok(Response::from_json(&body)?.with_status(404));
        };
        let view = stored
            .limiter
            .status(&id, limits, self.in_flight.get(), now_ms());
        Response::from_json(&view)
    }
}

impl DurableObject for SubscriberDO {
    fn new(state: State, _env: Env) -> Self {
        let stored = match Self::load(&state) {
            Ok(s) => s,
            Err(e) => {
                worker::console_error!("{{\"error\":\"limiter_load\",\"detail\":\"{e}\"}}");
                Stored::default()
            }
        };
        Self {
            state,
            stored: Rc::new(RefCell::new(stored)),
            in_flight: Rc::new(Cell::new(0)),
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        match (req.path().as_str(), req.method()) {
            ("/deliver", Method::Post) => self.deliver(req).await,
            ("/status", Method::Get) => self.status(&req),
            _ => Response::error("not found", 404),
        }
    }
}
