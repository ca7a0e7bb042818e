//! `fanout`: a thin CLI over the `fanout_origin` library.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use fanout_origin::cli::{run_client, Cli, Command, LogFormat};
use fanout_origin::config::Config;

/// mimalloc instead of the system allocator: the daemon allocates and frees small buffers on
/// every request, send and turn, from several threads (BENCHMARKS.md, "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Crates whose debug and trace output can carry URLs, headers or bodies: capped at `info`
/// whatever `FANOUT_LOG` asks (their `info` and above name no request).
const QUIET_CRATES: &[&str] = &["hyper", "hyper_util", "h2", "reqwest", "rustls", "tower"];

fn init_logs(format: LogFormat) {
    let wanted = std::env::var("FANOUT_LOG").unwrap_or_else(|_| "info".into());
    let mut filter = tracing_subscriber::EnvFilter::try_new(&wanted)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    for name in QUIET_CRATES {
        if let Ok(d) = format!("{name}=info").parse() {
            filter = filter.add_directive(d);
        }
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // One JSON object per line, for log collectors.
        LogFormat::Json => logs.json().with_current_span(false).init(),
        // Colour only on a terminal: a file or a pipe gets plain text.
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_hiding_values();
    init_logs(cli.log_format);
    let invoked = cli.invoked;
    match cli.command {
        Command::Serve(args) => {
            let (cfg, warnings) = Config::from_settings(args.merged()?)?;
            for w in warnings {
                tracing::warn!("{w}");
            }
            let listener = tokio::net::TcpListener::bind(cfg.listen)
                .await
                .with_context(|| format!("cannot listen on {}", cfg.listen))?;
            fanout_origin::run(cfg, listener, shutdown_signal()).await?;
            Ok(())
        }
        other => {
            if let Err(e) = run_client(other).await {
                eprintln!("fanout {invoked}: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

async fn shutdown_signal() {
    fanout_origin::cli::stop_signal().await;
    tracing::info!("shutting down");
}
