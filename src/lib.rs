//! Fanout's shared core and its Cloudflare Worker.
//!
//! Everything outside [`edge`] is pure: no I/O, no clock, no randomness. Time (`now_ms`, unix
//! milliseconds) and jitter are passed in, so the same code runs natively in the origin daemon
//! and as wasm in the Worker, and is tested with plain table-driven unit tests.

pub mod batch;
pub mod breaker;
pub mod bucket;
pub mod edge_limits;
pub mod endpoint;
pub mod limiter;
pub mod limits;
pub mod logrec;
pub mod retry;
pub mod sign;
pub mod traceparent;
pub mod wire;

#[cfg(target_arch = "wasm32")]
mod edge;
