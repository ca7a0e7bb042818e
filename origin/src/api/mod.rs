//! The HTTP API: producers' `POST /v1/events`, subscriber administration, deliveries,
//! replay, customers and their portal links, content filters' test, the charts' series, health and metrics. This file only routes: each
//! resource is one file whose handlers parse and validate (pure), apply one ledger operation,
//! then tell the dispatcher what changed. Errors become responses in one place (`error`).
//! The API names no ledger backend: it speaks to the ledger's contract only.

pub mod auth;
mod body;
mod customers;
mod deliveries;
pub(crate) mod error;
mod events;
mod extract;
mod filters;
mod health;
mod openapi;
mod portal_links;
mod series;
mod state;
mod stats;
pub(crate) mod subscriber_input;
mod subscribers;
mod test_limits;
pub mod views;

use axum::routing::{get, post};
use axum::Router;

pub use error::ApiError;
pub use state::{ApiConfig, AppState};

/// Every route: the pages and probes without a token, `/v1` behind [`auth::authenticate`].
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/events", post(events::post_events))
        .merge(subscriber_routes())
        .merge(delivery_routes())
        .route("/v1/retention", get(health::retention))
        .route("/v1/outbox", get(health::outbox))
        .route("/v1/series", get(series::series))
        .route("/v1/filters/test", post(filters::test_filter))
        .merge(customers::routes())
        .merge(portal_links::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(openapi::document))
        .merge(crate::pages::routes())
        .merge(crate::console::routes())
        .merge(crate::portal::routes(&state.cfg.portal_frame_ancestors))
        .merge(v1)
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

fn subscriber_routes() -> Router<AppState> {
    use subscribers::*;
    Router::new()
        .route(
            "/v1/subscribers",
            post(create_subscriber).get(list_subscribers),
        )
        .route(
            "/v1/subscribers/{id}",
            get(get_subscriber)
                .patch(patch_subscriber)
                .delete(delete_subscriber),
        )
        .route("/v1/subscribers/{id}/rotate-secret", post(rotate_secret))
        .route("/v1/subscribers/{id}/secret", get(get_secrets))
        .route("/v1/subscribers/{id}/test", post(send_test))
        .route("/v1/subscribers/{id}/held", get(get_held))
}

fn delivery_routes() -> Router<AppState> {
    use deliveries::*;
    Router::new()
        .route("/v1/deliveries", get(list_deliveries))
        .route("/v1/deliveries/{id}", get(get_delivery))
        .route("/v1/deliveries/{id}/replay", post(replay_one))
        .route("/v1/replay", post(replay_bulk))
}
