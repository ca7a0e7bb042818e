//! Content filters' cost (issue 25): a 20-condition filter matched against a 2 KiB event body,
//! in µs per match, alone and with the body's read through the filter's projection (what
//! ingest pays once per event when a subscriber of its type has a filter), beside a whole-body
//! parse for scale, and the filter's compile (once per filter text: the ledger keeps compiled
//! filters). A benchmark prints; it never fails.
//!
//!   cargo run --release -p fanout-origin --example filter_bench

use std::hint::black_box;
use std::time::Instant;

use fanout_origin::event_filter::Filter;
use serde_json::{json, Value};

/// A 2 KiB invoice event.
fn body() -> String {
    let items: Vec<Value> = (0..12)
        .map(|i| json!({ "sku": format!("SKU-{i:04}"), "qty": i + 1, "price": 9.99 + f64::from(i), "tags": ["blue", "sale"] }))
        .collect();
    let mut e = json!({
        "id": "evt_01JMZ8K3ABCDEF", "type": "invoice.paid", "timestamp": "2026-12-04T19:00:00Z",
        "amount": 12_500, "currency": "EUR", "paid": true,
        "customer": { "id": "cus_42", "tier": "gold", "country": "CH", "name": "Zoë Ünal",
                      "email": "zoe@example.com", "address": { "city": "Zürich", "zip": "8001" } },
        "items": items, "metadata": { "source": "checkout", "campaign": "winter-2026" },
    });
    let len = e.to_string().len();
    e["note"] = json!("x".repeat(2048usize.saturating_sub(len + 10)));
    e.to_string()
}

/// 20 conditions of every kind, all holding for `body()` (a match evaluates each).
fn filter() -> Value {
    json!({
        "type": { "$startsWith": "invoice." },
        "amount": { "$gte": 1000, "$lt": 1_000_000 },
        "currency": { "$in": ["EUR", "USD", "CHF"] },
        "paid": true,
        "customer": {
            "tier": { "$nin": ["test", "internal"] },
            "country": { "$neq": "US" },
            "email": { "$endsWith": "@example.com" },
            "address": { "city": "Zürich" },
        },
        "items": { "sku": { "$startsWith": "SKU-0011" }, "qty": { "$gt": 11 } },
        "metadata": { "campaign": { "$exist": true } },
        "$or": [ { "customer": { "tier": "gold" } }, { "amount": { "$gt": 50_000 } } ],
        "$not": [ { "metadata": { "source": "import" } } ],
    })
}

fn per_iter_us(n: u32, mut f: impl FnMut() -> bool) -> f64 {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let t = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn main() {
    let text = body();
    let parsed: Value = serde_json::from_str(&text).unwrap_or_default();
    let f = Filter::compile(&filter()).unwrap_or_else(|e| panic!("the benchmark's filter: {e}"));
    assert!(
        f.matches(&parsed),
        "the benchmark's filter must match its body"
    );
    let n = 200_000;
    let matched = per_iter_us(n, || f.matches(&parsed));
    let seen = f.projection();
    let parse_and_match = per_iter_us(n / 4, || {
        let v: Value = seen.parse(&text).unwrap_or_default();
        f.matches(&v)
    });
    let parse = per_iter_us(n / 4, || serde_json::from_str::<Value>(&text).is_ok());
    let ftext = filter().to_string();
    let compile = per_iter_us(n / 4, || Filter::parse(&ftext).is_ok());
    println!("content filter, 20 conditions, body {} bytes:", text.len());
    println!(
        "  match (body parsed)        {matched:8.3} µs   target < 10 µs: {}",
        if matched < 10.0 { "met" } else { "NOT met" }
    );
    println!("  read body + match          {parse_and_match:8.3} µs   target < 10 µs: {} (what ingest does: only the fields filters see, once per event)", if parse_and_match < 10.0 { "met" } else { "NOT met" });
    println!("  whole-body parse, for scale {parse:7.3} µs");
    println!("  compile the filter's text  {compile:8.3} µs   (once per filter text: cached)");
}
