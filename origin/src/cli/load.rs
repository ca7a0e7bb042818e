//! `fanout load`: flood a URL, or the edge for one subscriber, for a bounded time, and report
//! what was accepted and throttled (the work itself is `crate::load`).

use clap::Args;

use super::client::ClientError;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["url", "edge_url"])))]
pub struct LoadArgs {
    /// Flood this URL: 2xx counts as accepted, 429 as throttled [default: none; this or
    /// --edge-url]
    #[arg(long)]
    pub url: Option<String>,
    /// Flood the edge's POST /v1/deliveries for one subscriber (needs --edge-key)
    /// [default: none; this or --url]
    #[arg(long, requires = "edge_key")]
    pub edge_url: Option<String>,
    /// The edge's EDGE_SIGNING_KEY (whsec_…) [default: none]
    #[arg(long, env = "FANOUT_EDGE_KEY", hide_env_values = true)]
    pub edge_key: Option<String>,
    /// Where the edge delivers; without it a local sink is started on 127.0.0.1 (which only
    /// a local edge can reach) [default: a local sink]
    #[arg(long)]
    pub sink: Option<String>,
    /// The load subscriber's id [default: a fresh load_<hex>, so its bucket starts full]
    #[arg(long)]
    pub subscriber: Option<String>,
    /// The subscriber's rate, per second
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// The subscriber's burst
    #[arg(long, default_value_t = 20)]
    pub burst: u32,
    /// The subscriber's in-flight cap
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: u32,
    /// Deliveries per edge call
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Concurrent workers, each making one call at a time
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// How long to flood: 10s, 500ms, 2m (at most 1h)
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse_flag)]
    pub duration: std::time::Duration,
    /// HTTP method for --url
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// Request body for --url (sent as application/json)
    #[arg(long, default_value = "{}")]
    pub body: String,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

pub(super) async fn load(a: LoadArgs) -> Result<(), ClientError> {
    use crate::load::{self, LoadPlan, Target};
    let input = ClientError::Input;
    let mut sink_count = None;
    let target = match (&a.url, &a.edge_url) {
        (Some(url), _) => {
            url::Url::parse(url).map_err(|e| input(format!("--url {url:?}: {e}")))?;
            Target::Url {
                url: url.clone(),
                method: reqwest::Method::from_bytes(a.method.to_uppercase().as_bytes())
                    .map_err(|_| input(format!("--method {:?} is not an HTTP method", a.method)))?,
                body: a.body.clone(),
            }
        }
        (None, Some(edge)) => {
            let parsed =
                url::Url::parse(edge).map_err(|e| input(format!("--edge-url {edge:?}: {e}")))?;
            let key = a.edge_key.as_deref().unwrap_or_default();
            let key = fanout_core::sign::Secret::parse(key)
                .map_err(|e| input(format!("--edge-key: {e}")))?;
            let sink = match &a.sink {
                Some(s) => s.clone(),
                None => {
                    let local =
                        matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
                    if !local {
                        return Err(input(
                            "a deployed edge cannot reach a local sink: pass --sink https://…"
                                .into(),
                        ));
                    }
                    let (url, count) = load::start_sink().await.map_err(input)?;
                    sink_count = Some(count);
                    url
                }
            };
            Target::Edge {
                base_url: edge.clone(),
                client: crate::dispatch::edge_lane::EdgeClient::new(
                    edge,
                    key,
                    crate::outbound::Outbound::new(false)
                        .map_err(|e| input(format!("cannot build the HTTP client: {e}")))?,
                ),
                subscriber: fanout_core::wire::SubscriberSpec {
                    id: a.subscriber.clone().unwrap_or_else(|| load::run_id("load")),
                    url: sink,
                    secrets: vec![load::new_secret().map_err(input)?],
                    rate_per_sec: a.rate,
                    burst: a.burst,
                    max_in_flight: a.max_in_flight,
                    timeout_ms: 10_000,
                    legacy_signature: false,
                    signature: Default::default(),
                    signing_keys: Vec::new(),
                    breaker: None,
                },
                batch: a.batch,
            }
        }
        (None, None) => return Err(input("give --url or --edge-url".into())),
    };
    let plan = LoadPlan {
        target,
        workers: a.workers,
        duration: a.duration,
    };
    plan.validate().map_err(input)?;
    let total_ms = a.duration.as_millis() as u64;
    let progress = crate::term::bar(total_ms, "ms");
    let bar = progress.clone();
    let report = load::run(plan, sink_count, move |elapsed, accepted, throttled| {
        bar.set_position((elapsed.as_millis() as u64).min(total_ms));
        bar.set_message(format!("accepted {accepted}, throttled {throttled}"));
    })
    .await
    .map_err(input)?;
    progress.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", load::human(&report));
    }
    if report.requests > 0 && report.errors == report.requests {
        return Err(input(format!(
            "every call failed: {}",
            report.first_error.as_deref().unwrap_or("unknown error")
        )));
    }
    Ok(())
}
