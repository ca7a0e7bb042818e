//! `/v1/customers`: the operator's customers (admin token only): create, list, read, change
//! (a typed PATCH: `null` removes the cap) and remove. Portal links are `super::portal_links`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::body::{parse_json, present, read_body, MAX_ADMIN_BYTES};
use super::error::ApiError;
use super::extract::PathId;
use super::state::AppState;
use crate::customer::{
    validate_max_in_flight, validate_weight, Customer, CustomerList, CustomerView, DEFAULT_WEIGHT,
};
use crate::dispatch::Control;
use crate::ledger::{Customers as _, LedgerError};
use crate::model::validate_id;
use crate::time::{now_ms, random_bytes};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/customers", post(create).get(list))
        .route("/v1/customers/{id}", get(read).patch(update).delete(remove))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomerInput {
    id: Option<String>,
    weight: Option<u32>,
    /// `null` in a PATCH removes the cap.
    #[serde(default, deserialize_with = "present")]
    max_in_flight: Option<Option<u32>>,
}

pub(super) fn unknown(e: LedgerError, id: &str) -> ApiError {
    match e {
        LedgerError::NotFound(_) => ApiError::UnknownCustomer(format!("no customer {id}")),
        other => ApiError::Ledger(other),
    }
}

pub(super) fn nonce() -> Result<String, ApiError> {
    let bytes = random_bytes::<16>()
        .map_err(|e| ApiError::Ledger(LedgerError::Invalid(format!("no randomness: {e}"))))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new customer from a creation request (pure).
fn customer_from(input: CustomerInput, nonce: String, now: i64) -> Result<Customer, ApiError> {
    let id = input
        .id
        .ok_or_else(|| ApiError::Invalid("id is missing".into()))?;
    validate_id("id", &id).map_err(ApiError::Invalid)?;
    let weight = input.weight.unwrap_or(DEFAULT_WEIGHT);
    validate_weight(weight).map_err(ApiError::Invalid)?;
    let max_in_flight = input.max_in_flight.flatten();
    validate_max_in_flight(max_in_flight).map_err(ApiError::Invalid)?;
    Ok(Customer {
        id,
        weight,
        max_in_flight,
        portal_nonce: nonce,
        created_ms: now,
        updated_ms: now,
    })
}

/// Apply a PATCH (pure).
fn patched(mut c: Customer, input: CustomerInput, now: i64) -> Result<Customer, ApiError> {
    if input.id.as_ref().is_some_and(|id| *id != c.id) {
        return Err(ApiError::Invalid("id cannot be changed".into()));
    }
    if let Some(w) = input.weight {
        validate_weight(w).map_err(ApiError::Invalid)?;
        c.weight = w;
    }
    if let Some(m) = input.max_in_flight {
        validate_max_in_flight(m).map_err(ApiError::Invalid)?;
        c.max_in_flight = m;
    }
    c.updated_ms = now;
    Ok(c)
}

async fn view(state: &AppState, id: String) -> Result<CustomerView, LedgerError> {
    let found = state.ledger.customers(Some(id.clone())).await?;
    found
        .first()
        .map(|(cu, n)| CustomerView::of(cu, *n))
        .ok_or_else(|| LedgerError::NotFound(format!("customer {id}")))
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, MAX_ADMIN_BYTES).await?;
    let input: CustomerInput = parse_json(&bytes)?;
    let cu = customer_from(input, nonce()?, now_ms())?;
    state.ledger.create_customer(cu.clone()).await?;
    state.tell(Control::Customers);
    Ok((StatusCode::CREATED, Json(CustomerView::of(&cu, 0))))
}

async fn list(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let views = state
        .ledger
        .customers(None)
        .await?
        .iter()
        .map(|(cu, n)| CustomerView::of(cu, *n))
        .collect();
    Ok(Json(CustomerList { customers: views }))
}

async fn read(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    let v = view(&state, id.clone())
        .await
        .map_err(|e| unknown(e, &id))?;
    Ok(Json(v))
}

async fn update(
    State(state): State<AppState>,
    PathId(id): PathId,
    headers: HeaderMap,
    body: Body,
) -> Result<impl IntoResponse, ApiError> {
    let bytes = read_body(&state.cfg, &headers, body, MAX_ADMIN_BYTES).await?;
    let input: CustomerInput = parse_json(&bytes)?;
    let now = now_ms();
    let result = state
        .ledger
        .update_customer(id.clone(), move |current| patched(current, input, now))
        .await
        .map_err(|e| unknown(e, &id))?;
    result?;
    state.tell(Control::Customers);
    let v = view(&state, id.clone())
        .await
        .map_err(|e| unknown(e, &id))?;
    Ok(Json(v))
}

/// Remove a customer. One that still owns live subscribers is refused with 409 `conflict`
/// (remove them, or move them with `PATCH /v1/subscribers/{id} {"customer": …}`, first).
/// Every portal link issued for it stops working.
async fn remove(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<impl IntoResponse, ApiError> {
    state
        .ledger
        .delete_customer(id.clone())
        .await
        .map_err(|e| unknown(e, &id))?;
    state.tell(Control::Customers);
    Ok(Json(json!({ "id": id, "deleted": true })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, input, the weight and cap, or the error code)
    type Case = (
        &'static str,
        CustomerInput,
        Result<(u32, Option<u32>), &'static str>,
    );

    #[test]
    fn customer_input_table() {
        let input =
            |id: Option<&str>, weight: Option<u32>, cap: Option<Option<u32>>| CustomerInput {
                id: id.map(Into::into),
                weight,
                max_in_flight: cap,
            };
        let cases: Vec<Case> = vec![
            ("defaults", input(Some("acme"), None, None), Ok((1, None))),
            (
                "weighted",
                input(Some("acme"), Some(4), Some(Some(10))),
                Ok((4, Some(10))),
            ),
            (
                "null cap",
                input(Some("acme"), None, Some(None)),
                Ok((1, None)),
            ),
            ("no id", input(None, None, None), Err("invalid_request")),
            (
                "bad id",
                input(Some("a b"), None, None),
                Err("invalid_request"),
            ),
            (
                "zero weight",
                input(Some("acme"), Some(0), None),
                Err("invalid_request"),
            ),
            (
                "huge weight",
                input(Some("acme"), Some(1001), None),
                Err("invalid_request"),
            ),
            (
                "zero cap",
                input(Some("acme"), None, Some(Some(0))),
                Err("invalid_request"),
            ),
        ];
        for (name, i, expected) in cases {
            let got = customer_from(i, "n".into(), 1)
                .map(|c| (c.weight, c.max_in_flight))
                .map_err(|e| e.status_and_code().1);
            assert_eq!(got, expected, "{name}");
        }
        let c = customer_from(input(Some("acme"), Some(2), Some(Some(5))), "n".into(), 1).unwrap();
        let p = patched(c.clone(), input(None, None, Some(None)), 2).unwrap();
        assert_eq!((p.weight, p.max_in_flight, p.updated_ms), (2, None, 2));
        let p = patched(c.clone(), input(None, Some(7), None), 3).unwrap();
        assert_eq!((p.weight, p.max_in_flight), (7, Some(5)));
        assert!(patched(c.clone(), input(Some("other"), None, None), 3).is_err());
        assert!(patched(c, input(None, Some(0), None), 3).is_err());
    }
}
