//! The HTTP server loop: accepts connections on the caller's listener and serves the API on
//! each, with the limits slow and idle clients need:
//! - A connection that has not sent a whole request head within `header_timeout` is closed
//!   (hyper's header read timeout for HTTP/1, which also covers an idle keep-alive connection
//!   waiting for its next request).
//! - A connection of either protocol with no request open for `header_timeout` is closed: told
//!   first (HTTP/2 `GOAWAY`, HTTP/1 no keep-alive), dropped if still there `header_timeout`
//!   later. An HTTP/2 connection that answers PINGs and never opens a stream would otherwise
//!   hold its slot for ever. A request is open from its head's arrival until its answer's
//!   body has been handed to the connection whole.
//! - A write that makes no progress for `write_timeout` (`--body-timeout`) resets its
//!   connection: a client that pipelines HTTP/1 requests and never reads the answers. A
//!   connection with an answer whose body has not moved for that long is closed too: an HTTP/2
//!   client that grants its stream no flow-control window (it answers PINGs, so the connection
//!   looks alive).
//! - At most `max_connections` are served at once. Past it, [`RESERVE_CONNECTIONS`] more are
//!   accepted that answer `/healthz` only (anything else `503 unavailable` with `Retry-After:
//!   1`), without keep-alive, and are closed after `header_timeout`: a health check is
//!   answered while every slot is taken. Past those too the daemon stops accepting until one
//!   closes (the kernel's backlog holds the rest).
//! - The body's deadline is the API's own (`ApiConfig::body_timeout`).
//!
//! It does not parse HTTP itself, route or authenticate: hyper and the axum router do.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::api::error::ApiError;

/// Defaults of `--header-timeout` and `--max-connections`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Connections accepted past `max_connections` that answer `/healthz` only.
pub const RESERVE_CONNECTIONS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    /// A write that makes no progress for this long closes its connection.
    pub write_timeout: Duration,
}

/// How long a graceful shutdown waits for open connections to finish their requests.
const DRAIN_FOR: Duration = Duration::from_secs(10);

/// Serve `router` on `listener` until `shutdown` resolves, then stop accepting and let open
/// connections finish their current request (for up to `DRAIN_FOR`).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let served_builder = builder(limits, true);
    // A reserve connection answers one HTTP/1 request (HTTP/2 ones until it is closed).
    let reserve_builder = builder(limits, false);
    // Semaphores count at most u32::MAX permits at once in `acquire_many` (the drain below).
    let max = limits.max_connections.clamp(1, u32::MAX as usize);
    let slots = Arc::new(Semaphore::new(max));
    let reserve = Arc::new(Semaphore::new(RESERVE_CONNECTIONS));
    let (stopping, stop) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        // The connection's slot, and whether it is one of the reserve's.
        let (slot, healthz_only) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => (p, false),
                Err(_) => break,
            },
            p = reserve.clone().acquire_owned() => match p {
                Ok(p) => (p, true),
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // A slot may have come free while this one waited for a connection.
        let (slot, healthz_only) = match healthz_only {
            true => match slots.clone().try_acquire_owned() {
                Ok(served) => (served, false),
                Err(_) => (slot, true),
            },
            false => (slot, false),
        };
        let _ = stream.set_nodelay(true);
        let (activity, watching) = watch::channel(Activity {
            open: 0,
            since: Instant::now(),
            answering: 0,
            moved: Instant::now(),
        });
        let answers = watching.clone();
        let service = Counted {
            inner: TowerToHyperService::new(router.clone()),
            activity: Arc::new(activity),
            healthz_only,
        };
        let io = TokioIo::new(Watched::new(stream, limits.write_timeout));
        let conn = if healthz_only {
            &reserve_builder
        } else {
            &served_builder
        }
        .serve_connection_with_upgrades(io, service)
        .into_owned();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let ending: Pin<Box<dyn Future<Output = ()> + Send>> = if healthz_only {
                Box::pin(tokio::time::sleep(limits.header_timeout))
            } else {
                Box::pin(idle_for(watching, limits.header_timeout))
            };
            let daemon_stops = tokio::select! {
                _ = conn.as_mut() => false,
                // Dropped at once: a graceful end would wait for that very answer.
                () = stalled_answer(answers, limits.write_timeout) => false,
                () = ending => {
                    // Idle, or a reserve connection's time is up: tell the client, and drop
                    // the connection if it is still there a header timeout later.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(limits.header_timeout, conn.as_mut()).await;
                    false
                }
                () = async { let _ = stop.wait_for(|s| *s).await; } => true,
            };
            if daemon_stops {
                // The daemon stops: let the current requests finish ([`DRAIN_FOR`] bounds it).
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    // Every connection holds a slot until it ends: all slots back, all connections ended.
    let drained = async {
        let _served = slots.acquire_many(max as u32).await;
        let _reserve = reserve.acquire_many(RESERVE_CONNECTIONS as u32).await;
    };
    if tokio::time::timeout(DRAIN_FOR, drained).await.is_err() {
        tracing::warn!("connections still open after {DRAIN_FOR:?}: closing them");
    }
}

/// hyper's settings for a served connection (`keep_alive`) or a reserve one.
fn builder(limits: ServerLimits, keep_alive: bool) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(keep_alive);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.header_timeout))
        .keep_alive_timeout(limits.header_timeout);
    builder
}

/// A connection's requests: how many are open, and since when that number is what it is.
#[derive(Debug, Clone, Copy)]
struct Activity {
    open: usize,
    since: Instant,
    /// Answers whose body is being sent, and when one of them last moved. (Nothing here is
    /// announced: the watchers read it on their ticks.)
    answering: usize,
    moved: Instant,
}

/// How often a connection's watchers look at its activity: a quarter of the time they watch
/// for, so a connection goes at most a quarter late.
fn tick(of: Duration) -> Duration {
    (of / 4).max(Duration::from_millis(50))
}

/// Resolves once the connection has had no request open for `idle` (or its service is gone).
async fn idle_for(activity: watch::Receiver<Activity>, idle: Duration) {
    loop {
        let now = *activity.borrow();
        if activity.has_changed().is_err() {
            return;
        }
        let due = now.since + idle;
        if now.open == 0 && Instant::now() >= due {
            return;
        }
        let next = Instant::now() + tick(idle);
        tokio::time::sleep_until(if now.open == 0 { due.min(next) } else { next }).await;
    }
}

/// Resolves once the connection has had an answer to send and moved none of its body for
/// `stall` (an HTTP/2 client that grants no flow-control window: it answers PINGs, so the
/// connection looks alive, and its stream never ends).
async fn stalled_answer(activity: watch::Receiver<Activity>, stall: Duration) {
    loop {
        let now = *activity.borrow();
        if activity.has_changed().is_err() {
            return;
        }
        let due = now.moved + stall;
        if now.answering > 0 && Instant::now() >= due {
            return;
        }
        tokio::time::sleep(tick(stall)).await;
    }
}

/// One open request: counted from its head's arrival until its answer's body is dropped
/// (sent whole, or the connection gone).
struct Open(Arc<watch::Sender<Activity>>);

impl Open {
    fn start(activity: Arc<watch::Sender<Activity>>) -> Open {
        note(&activity, |a| {
            a.open += 1;
            a.since = Instant::now();
        });
        Open(activity)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        note(&self.0, |a| {
            a.open = a.open.saturating_sub(1);
            a.since = Instant::now();
        });
    }
}

/// Change a connection's activity without waking anyone: the watchers look at it on their
/// own ticks ([`idle_for`], [`stalled_answer`]). (Announced, each request woke its
/// connection's task four times more, which cost single-event ingest about 7 %.)
fn note(activity: &watch::Sender<Activity>, change: impl FnOnce(&mut Activity)) {
    activity.send_if_modified(|a| {
        change(a);
        false
    });
}

/// The router as a connection's service: it counts the connection's open requests, and on a
/// reserve connection answers `/healthz` only.
#[derive(Clone)]
struct Counted {
    inner: TowerToHyperService<Router>,
    activity: Arc<watch::Sender<Activity>>,
    healthz_only: bool,
}

impl hyper::service::Service<axum::http::Request<Incoming>> for Counted {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: axum::http::Request<Incoming>) -> Self::Future {
        let open = Open::start(self.activity.clone());
        if self.healthz_only && req.uri().path() != "/healthz" {
            let busy = ApiError::Busy(
                "every connection slot is taken; this one answers /healthz only: retry".into(),
            )
            .into_response();
            return Box::pin(
                async move { Ok(busy.map(|body| Body::new(Counting::new(body, open)))) },
            );
        }
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Body::new(Counting::new(body, open))))
        })
    }
}

/// An answer's body that keeps its request open until it is dropped, and notes each time it
/// moves.
struct Counting {
    body: Body,
    open: Open,
}

impl Counting {
    fn new(body: Body, open: Open) -> Counting {
        note(&open.0, |a| {
            a.answering += 1;
            a.moved = Instant::now();
        });
        Counting { body, open }
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        note(&self.open.0, |a| {
            a.answering = a.answering.saturating_sub(1)
        });
    }
}

impl http_body::Body for Counting {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let me = self.get_mut();
        note(&me.open.0, |a| a.moved = Instant::now());
        Pin::new(&mut me.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket whose writes fail with `TimedOut` once they have made no progress for
/// `stall` (the kernel's buffers full: the client reads nothing); the socket is then reset
/// when it is dropped.
struct Watched {
    io: TcpStream,
    stall: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Watched {
    fn new(io: TcpStream, stall: Duration) -> Watched {
        Watched {
            io,
            stall,
            stalled: None,
        }
    }

    /// `polled`, or the timeout once writes have been pending for `stall`.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => {
                let stall = self.stall;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                match timer.as_mut().poll(cx) {
                    // Closed with a reset: a plain close would leave the unsent answer, and
                    // the socket, in the kernel for as long as it keeps retrying the client.
                    Poll::Ready(()) => {
                        let _ = self.io.set_zero_linger();
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client has read nothing of the answer for the write timeout",
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.io).poll_write(cx, buf);
        me.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.io).poll_write_vectored(cx, bufs);
        me.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.io).poll_flush(cx);
        me.progress(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.io).poll_shutdown(cx);
        me.progress(cx, polled)
    }
}
