//! The benchmark's sink: answers every request `200 ok` as fast as it can, on 127.0.0.1 only,
//! HTTP/1.1 with keep-alive, on one thread (the machine has 2 cores; workerd needs the rest).
//! `GET /__count` answers how many other requests it has seen, so the benchmark can check that
//! "delivered" really arrived.
//!
//!   sink [port]     prints `listening <port>` on stdout once ready; exits when stdin closes.

use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

async fn handle(
    req: Request<Incoming>,
    count: Arc<AtomicU64>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/__count" {
        let n = count.load(Ordering::Relaxed);
        return Ok(Response::new(Full::new(Bytes::from(n.to_string()))));
    }
    // Read the body (a real subscriber would) before answering.
    let _ = req.into_body().collect().await;
    count.fetch_add(1, Ordering::Relaxed);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let port = listener.local_addr()?.port();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {port}")?;
        out.flush()?;
    }
    // Exit when the parent closes our stdin (never outlive the benchmark).
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        std::process::exit(0);
    });
    let count = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let count = count.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(req, count.clone()));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
