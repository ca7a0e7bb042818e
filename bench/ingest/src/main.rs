//! The origin benchmark's producer: floods `POST {base}/v1/events` with unique events over
//! `connections` kept-alive HTTP/1.1 connections, back to back, for `seconds` (at most 60),
//! on one thread. `batch` 1 sends one event object per request; more sends a JSON array.
//!
//!   ingest <base-url> <api-token> <connections> <seconds> <batch> <id-prefix> [pad-bytes]
//!
//! Every event is `{"id":"<prefix>_<conn>_<n>","type":"video.trending","data":{…}}` with
//! `pad-bytes` (default 160) of text, so about 250 bytes. Prints one JSON line: events accepted
//! (202), deliveries the daemon said it created, requests, errors, elapsed seconds, events/s and
//! request latency percentiles. 127.0.0.1 only.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Default)]
struct Tally {
    events: u64,
    deliveries: u64,
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
}

/// Sum of the integers that follow `"deliveries":` in an answer.
fn deliveries_in(body: &[u8]) -> u64 {
    const KEY: &[u8] = b"\"deliveries\":";
    let mut sum = 0u64;
    let mut i = 0;
    while i + KEY.len() <= body.len() {
        if &body[i..i + KEY.len()] == KEY {
            i += KEY.len();
            let mut n = 0u64;
            while i < body.len() && body[i].is_ascii_digit() {
                n = n * 10 + u64::from(body[i] - b'0');
                i += 1;
            }
            sum += n;
        } else {
            i += 1;
        }
    }
    sum
}

fn body_for(prefix: &str, conn: usize, first: u64, batch: usize, pad: &str) -> String {
    let mut s = String::with_capacity(batch * (pad.len() + 120) + 2);
    if batch > 1 {
        s.push('[');
    }
    for k in 0..batch as u64 {
        if k > 0 {
            s.push(',');
        }
        let n = first + k;
        let _ = write!(
            s,
            r#"{{"id":"{prefix}_{conn}_{n}","type":"video.trending","data":{{"video":"v_{n}","views":{n},"text":"{pad}"}}}}"#
        );
    }
    if batch > 1 {
        s.push(']');
    }
    s
}

async fn connection(
    addr: (String, u16),
    uri: hyper::Uri,
    auth: String,
    conn: usize,
    batch: usize,
    prefix: String,
    pad: String,
    deadline: Instant,
) -> Result<Tally, BoxError> {
    let stream = TcpStream::connect((addr.0.as_str(), addr.1)).await?;
    stream.set_nodelay(true)?;
    let (mut send, driver) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(driver);
    let mut t = Tally::default();
    let mut seq = 0u64;
    while Instant::now() < deadline {
        let body = body_for(&prefix, conn, seq, batch, &pad);
        seq += batch as u64;
        let req = Request::post(uri.clone())
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .header("authorization", auth.as_str())
            .body(Full::new(Bytes::from(body)))?;
        let started = Instant::now();
        let result = async {
            let resp = send.send_request(req).await?;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, bytes))
        }
        .await;
        t.latencies_us
            .push(started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        t.requests += 1;
        match result {
            Ok((202, bytes)) => {
                t.events += batch as u64;
                t.deliveries += deliveries_in(&bytes);
            }
            Ok((status, bytes)) => {
                t.errors += 1;
                t.first_error.get_or_insert_with(|| {
                    format!(
                        "HTTP {status}: {}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                    )
                });
            }
            Err(e) => {
                t.errors += 1;
                t.first_error.get_or_insert_with(|| e.to_string());
                // The connection is gone: stop this worker rather than spin.
                break;
            }
        }
    }
    Ok(t)
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let usage = "usage: ingest <base-url> <api-token> <connections> <seconds> <batch> <id-prefix> [pad-bytes]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 6 {
        return Err(usage.into());
    }
    let base: hyper::Uri = args[0].parse()?;
    let host = base.host().ok_or("no host")?.to_string();
    if host != "127.0.0.1" && host != "localhost" {
        return Err("ingest only targets 127.0.0.1".into());
    }
    let port = base.port_u16().unwrap_or(80);
    let uri: hyper::Uri = format!("http://{host}:{port}/v1/events").parse()?;
    let auth = format!("Bearer {}", args[1]);
    let conns: usize = args[2].parse::<usize>()?.clamp(1, 256);
    let secs: f64 = args[3].parse::<f64>()?.clamp(0.1, 60.0);
    let batch: usize = args[4].parse::<usize>()?.clamp(1, 1000);
    let prefix = args[5].clone();
    let pad_bytes: usize = args.get(6).map_or(Ok(160), |s| s.parse())?;
    let pad = "x".repeat(pad_bytes.min(60_000));

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in 0..conns {
        tasks.push(tokio::spawn(connection(
            (host.clone(), port),
            uri.clone(),
            auth.clone(),
            c,
            batch,
            prefix.clone(),
            pad.clone(),
            deadline,
        )));
    }
    let mut all = Tally::default();
    for task in tasks {
        match task.await? {
            Ok(t) => {
                all.events += t.events;
                all.deliveries += t.deliveries;
                all.requests += t.requests;
                all.errors += t.errors;
                if all.first_error.is_none() {
                    all.first_error = t.first_error;
                }
                all.latencies_us.extend(t.latencies_us);
            }
            Err(e) => {
                all.errors += 1;
                all.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.latencies_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        if all.latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((all.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        f64::from(all.latencies_us[i]) / 1000.0
    };
    println!(
        "{{\"events\":{},\"deliveries\":{},\"requests\":{},\"errors\":{},\"first_error\":{},\"elapsed_s\":{:.3},\"events_per_s\":{:.0},\"p50_ms\":{:.2},\"p99_ms\":{:.2}}}",
        all.events,
        all.deliveries,
        all.requests,
        all.errors,
        all.first_error.as_deref().map_or("null".into(), json_str),
        elapsed,
        all.events as f64 / elapsed,
        pct(0.5),
        pct(0.99),
    );
    Ok(())
}
