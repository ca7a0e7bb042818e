//! The client side of the daemon's API: where it is and its token ([`ClientArgs`]), one
//! call decoded into the view type the API writes ([`Client::call`]), and the error every
//! client command reports ([`ClientError`]). It knows no command.

use clap::Args;
use serde_json::Value;

use crate::config::DEFAULT_LISTEN;

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Base URL of the daemon's API [default: http://<--daemon-listen>]
    #[arg(long, env = "FANOUT_SERVER")]
    pub server: Option<String>,
    /// The daemon's address: what its `fanout serve --listen` was given, where this command
    /// reaches its API when --server is not given (not an address of this command's own;
    /// `--listen` is still taken) [default: 127.0.0.1:8080]
    #[arg(
        long = "daemon-listen",
        alias = "listen",
        value_name = "HOST:PORT",
        env = "FANOUT_LISTEN"
    )]
    pub listen: Option<String>,
    /// Bearer token of the daemon's API (required; prefer the environment: `ps` shows
    /// arguments) [default: none]
    #[arg(long, env = "FANOUT_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
}

/// A client command failed; the message is for the operator, who ran a command, not an API
/// route: it says what to run next where the failure tells (`main` puts the command in front).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the daemon at {0}: {1}; is `fanout serve` running there? (--server or \
         --daemon-listen say where it is)"
    )]
    Unreachable(String, String),
    /// The daemon refused the call: its status, its error `code` (`invalid_url`, …; empty
    /// when the answer was not the API's error shape) and message.
    #[error(
        "the daemon refused it ({status}{}): {message}{}",
        code_part(code),
        next_step(code)
    )]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("backup: {0}")]
    Backup(#[from] crate::ledger::sqlite::backup::BackupError),
}

fn code_part(code: &str) -> String {
    if code.is_empty() {
        String::new()
    } else {
        format!(" {code}")
    }
}

/// The command that helps after an API error, by its code (pure).
fn next_step(code: &str) -> &'static str {
    match code {
        "unauthorized" => "; give the daemon's API token with --api-token or FANOUT_API_TOKEN",
        "unknown_subscriber" => "; `fanout subscriber list` shows the subscribers",
        "unknown_customer" => "; `fanout customer list` shows the customers",
        "rate_limited" => "; try again in a moment",
        _ => "",
    }
}

pub(super) struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    pub(super) fn new(args: &ClientArgs) -> Result<Client, ClientError> {
        let base = match &args.server {
            Some(s) => s.trim_end_matches('/').to_string(),
            None => format!(
                "http://{}",
                args.listen.as_deref().unwrap_or(DEFAULT_LISTEN)
            ),
        };
        let token = args
            .api_token
            .clone()
            .ok_or_else(|| ClientError::Input("set --api-token or FANOUT_API_TOKEN".into()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ClientError::Input(e.to_string()))?;
        Ok(Client { base, token, http })
    }

    /// A text answer to a GET (`/metrics`), or `None` when there is none.
    pub(super) async fn text(&self, path: &str) -> Option<String> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    /// One API call, its answer decoded into the view type the API writes.
    pub(super) async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| ClientError::Unreachable(self.base.clone(), e.to_string()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Unreachable(self.base.clone(), e.to_string()))?;
        if status >= 400 {
            let (code, message) = serde_json::from_slice::<fanout_core::wire::ErrorBody>(&bytes)
                .map(|e| (e.error.code, e.error.message))
                .unwrap_or_else(|_| (String::new(), String::from_utf8_lossy(&bytes).into_owned()));
            return Err(ClientError::Api {
                status,
                code,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            ClientError::Unreachable(
                self.base.clone(),
                format!("the answer to {path} is not what this version expects: {e}"),
            )
        })
    }
}

pub(super) fn query(pairs: &[(&str, &Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

pub(super) fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub(super) fn print<T: serde::Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Decode a daemon answer into its API view type.
pub(super) fn view<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ClientError> {
    serde_json::from_value(v)
        .map_err(|e| ClientError::Input(format!("unexpected answer from the daemon: {e}")))
}
