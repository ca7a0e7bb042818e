//! `fanout`: a thin CLI over the `fanout_origin` library.

use anyhow::Context as _;
use clap::Parser as _;
use fanout_origin::cli::{run_client, Cli, Command};
use fanout_origin::config::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FANOUT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
                eprintln!("fanout: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
