//! The subscriber's Durable Object: one per subscriber id, so its limiter is global and exact.
//! It grants a whole batch with one read-refill-write (no `.await` in between), sends what was
//! granted concurrently, and folds each outcome back into the stored state.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use worker::{durable_object, DurableObject, Env, Method, Request, Response, State};

use super::{env_limits, send, CALL_ID_HEADER, CALL_TS_HEADER};
use crate::breaker::BreakerConfig;
use crate::bucket::Rate;
use crate::limiter::{LimiterState, Limits};
use crate::logrec;
use crate::sign::TOLERANCE_SECS;
use crate::wire::{BatchResponse, DeliveryBatch, DeliveryResult, ErrorBody};

/// What the object stores: the limiter, and the limits it last saw (for the status view).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Stored {
    limiter: LimiterState,
    rate_per_sec: Option<f64>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
    /// The breaker settings the last call carried (absent in state stored before the field,
    /// and from an origin older than it: the defaults).
    #[serde(default)]
    breaker: Option<BreakerConfig>,
}

impl Stored {
    /// State that could not be read: an empty bucket as of `now_ms`.
    fn empty(now_ms: i64) -> Stored {
        Stored {
            limiter: LimiterState::empty(now_ms),
            ..Stored::default()
        }
    }

    fn limits(&self) -> Option<Limits> {
        Some(Limits {
            rate: Rate {
                per_sec: self.rate_per_sec?,
                burst: self.burst?,
            },
            max_in_flight: self.max_in_flight?,
            breaker: self.breaker.unwrap_or_default(),
        })
    }
}

#[durable_object]
#[allow(missing_debug_implementations)] // `State` has no Debug; the object is never printed.
pub struct SubscriberDO {
    state: State,
    env: Env,
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
        // The origin's call ids (`webhook-id` of each signed call) until its signature expires.
        sql.exec(
            "CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, expires_ms INTEGER NOT NULL)",
            None,
        )?;
        sql.exec(
            "CREATE INDEX IF NOT EXISTS calls_expiry ON calls (expires_ms)",
            None,
        )?;
        #[derive(Deserialize)]
        struct Row {
            state: String,
        }
        let rows: Vec<Row> = sql
            .exec("SELECT state FROM limiter WHERE id = 1", None)?
            .to_array()?;
        let Some(row) = rows.first() else {
            return Ok(Stored::default()); // a new subscriber starts with its full burst
        };
        Ok(serde_json::from_str(&row.state).unwrap_or_else(|_| {
            // Written by another version: say so, and start from an empty bucket, never a
            // full one (a full one would send a whole burst the subscriber may not have room for).
            worker::console_error!("{{\"error\":\"limiter_undecodable\"}}");
            Stored::empty(now_ms())
        }))
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

    /// Remember this call's id until its signature can no longer be accepted; false when it was
    /// seen already (a replay of a captured call). Check and insert run with no `.await`.
    fn first_use(&self, req: &Request, now_ms: i64) -> worker::Result<bool> {
        let headers = req.headers();
        let id = headers.get(CALL_ID_HEADER)?.unwrap_or_default();
        let signed_at: i64 = headers
            .get(CALL_TS_HEADER)?
            .and_then(|t| t.parse().ok())
            .unwrap_or(now_ms / 1000);
        // A signature is accepted until TOLERANCE_SECS after its timestamp.
        let expires_ms = (signed_at + TOLERANCE_SECS) * 1000;
        let sql = self.state.storage().sql();
        sql.exec(
            "DELETE FROM calls WHERE expires_ms < ?",
            vec![now_ms.into()],
        )?;
        // A row comes back only when the id was new.
        let inserted: Vec<serde_json::Value> = sql
            .exec(
                "INSERT INTO calls (id, expires_ms) VALUES (?, ?) ON CONFLICT(id) DO NOTHING RETURNING id",
                vec![id.into(), expires_ms.into()],
            )?
            .to_array()?;
        Ok(!inserted.is_empty())
    }

    async fn deliver(&self, mut req: Request) -> worker::Result<Response> {
        let limits_cfg = match env_limits(&self.env) {
            Ok(l) => l,
            Err(e) => {
                return Ok(
                    Response::from_json(&ErrorBody::new("misconfigured", e.to_string()))?
                        .with_status(500),
                )
            }
        };
        // The Worker validated these bytes and forwards them as received. Read before the
        // replay check so that the check, the grant and both writes run with no `.await`
        // between them: one implicit storage transaction (one commit) instead of two.
        let body = req.bytes().await;
        if !self.first_use(&req, now_ms())? {
            return replayed();
        }
        // Parsed in one pass over the bytes (`Request::json` would build the whole batch as
        // JS objects first and read every field of every delivery back across the wasm
        // boundary).
        let parsed = body
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<DeliveryBatch>(&b).map_err(|e| e.to_string()));
        let batch = match parsed {
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
        let keys = sub.keys();
        let limits = Limits {
            rate: Rate {
                per_sec: sub.rate_per_sec,
                burst: sub.burst,
            },
            max_in_flight: sub.max_in_flight,
            breaker: sub.breaker_config(),
        };

        // A call makes at most this many fetches (subrequest limit, and the waves that fit in
        // the signature's lifetime): the cap counts like in-flight slots, the rest is deferred.
        let per_call = limits_cfg.max_sends_per_call(sub.timeout_ms);

        // Read, refill, grant and write back with no `.await` in between.
        let plan = {
            let mut stored = self.stored.borrow_mut();
            stored.rate_per_sec = Some(sub.rate_per_sec);
            stored.burst = Some(sub.burst);
            stored.max_in_flight = Some(sub.max_in_flight);
            stored.breaker = sub.breaker;
            let call_limits = Limits {
                max_in_flight: limits
                    .max_in_flight
                    .min(self.in_flight.get().saturating_add(per_call)),
                ..limits
            };
            let plan = stored.limiter.plan(
                call_limits,
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
            keys: &keys,
            timeout_ms: sub.timeout_ms,
            max_open: limits_cfg.max_open_sends,
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
        if !self.first_use(req, now_ms())? {
            return replayed();
        }
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

/// 401 `replayed`: a signed call (a batch or a status read) is accepted once.
fn replayed() -> worker::Result<Response> {
    Ok(Response::from_json(&ErrorBody::new(
        "replayed",
        "this call id was used already: a signed call is accepted once",
    ))?
    .with_status(401))
}

impl DurableObject for SubscriberDO {
    fn new(state: State, env: Env) -> Self {
        let stored = match Self::load(&state) {
            Ok(s) => s,
            Err(e) => {
                worker::console_error!("{{\"error\":\"limiter_load\",\"detail\":\"{e}\"}}");
                Stored::empty(now_ms())
            }
        };
        Self {
            state,
            env,
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
