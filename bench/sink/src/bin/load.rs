//! A simple concurrent HTTP/1.1 load client, to measure the sink's own capacity:
//! `load <url> <connections> <seconds>` POSTs a small JSON body over `connections` keep-alive
//! connections for `seconds` (bounded: at most 60) and prints `<requests> <seconds> <req/s>`.
//! 127.0.0.1 only.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url: hyper::Uri = args
        .next()
        .ok_or("usage: load <url> <connections> <seconds>")?
        .parse()?;
    let conns: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let secs: f64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0f64)
        .min(60.0);
    let host = url.host().ok_or("no host")?.to_string();
    if host != "127.0.0.1" && host != "localhost" {
        return Err("load only targets 127.0.0.1".into());
    }
    let port = url.port_u16().unwrap_or(80);
    let body = Bytes::from_static(br#"{"id":"evt_bench","type":"bench.sink","n":1}"#);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (host, url, body) = (host.clone(), url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            let (mut send, conn) = http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let req = Request::post(url.clone())
                    .header("host", "127.0.0.1")
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))?;
                let resp = send.send_request(req).await?;
                let ok = resp.status().is_success();
                let _ = resp.into_body().collect().await?;
                if ok {
                    n += 1;
                }
            }
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(n)
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await?.map_err(|e| e.to_string())?;
    }
    let el = start.elapsed().as_secs_f64();
    println!("{total} {el:.3} {:.0}", total as f64 / el);
    Ok(())
}
