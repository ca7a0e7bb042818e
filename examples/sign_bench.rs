//! Signatures' cost (issue 25): µs per `webhook-signature` of a 1 KiB body with one HMAC
//! secret (`v1`), one Ed25519 key (`v1a`, the key parsed once, as the dispatcher's keyring
//! keeps it), both, and what parsing an Ed25519 key costs (paid once per subscriber load, not
//! per delivery). A benchmark prints; it never fails.
//!
//!   cargo run --release -p fanout-core --example sign_bench

// Fixed inputs: a failed expect is a bug in the benchmark itself.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::time::Instant;

use fanout_core::sign::{Keys, Scheme, Secret, SigningKey};

/// Median of `rounds` timings of `n` calls, in µs per call.
fn per_call(rounds: usize, n: u32, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[rounds / 2]
}

fn main() {
    let body = format!(
        "{{\"id\":\"evt_01JMZ8K3\",\"type\":\"video.trending\",\"pad\":\"{}\"}}",
        "x".repeat(960)
    );
    let secret = Secret::from_bytes(&[7u8; 32]).expect("32 bytes are a secret");
    let key = SigningKey::from_seed(&[9u8; 32]).expect("32 bytes are a seed");
    let text = key.encode();
    let keys = |scheme| Keys::for_scheme(scheme, vec![secret.clone()], vec![key.clone()], false);
    let (hmac, ed, both) = (
        keys(Scheme::Hmac),
        keys(Scheme::Ed25519),
        keys(Scheme::Both),
    );
    let n = 20_000;
    let sign = |k: &Keys| {
        per_call(7, n, || {
            black_box(k.signature_header(
                black_box("evt_01JMZ8K3"),
                1_764_870_000,
                body.as_bytes(),
            ));
        })
    };
    let (h, e, b) = (sign(&hmac), sign(&ed), sign(&both));
    let parse = per_call(7, n / 4, || {
        black_box(SigningKey::parse(black_box(&text)).ok());
    });
    println!(
        "webhook-signature of a {}-byte body, µs per signature (median of 7 rounds of {n}):",
        body.len()
    );
    println!("  v1  (HMAC-SHA256)          {h:>7.2} µs");
    println!(
        "  v1a (Ed25519, key parsed)  {e:>7.2} µs   ({:.1}× v1)",
        e / h
    );
    println!("  v1 + v1a (both)            {b:>7.2} µs");
    println!("  parsing a whsk_ key        {parse:>7.2} µs   (once per subscriber load, not per delivery)");
}
