//! `fanout apply -f FILE [--dry-run] [--prune] [--secrets-out FILE]` and `fanout export`:
//! configuration as code. Reads the file (`apply/yaml.rs`), reads the daemon's customers and
//! subscribers, prints the plan (`apply/plan.rs`), then carries it out through the API; a
//! refusal names the file's line. Export writes the daemon's state in the same format.

mod plan;
mod yaml;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use reqwest::Method;
use serde_json::{Map, Value};

use super::client::{encode, Client, ClientArgs, ClientError};
use plan::{Action, Current, Plan};
use yaml::Kind;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The YAML file: top-level `customers`, `subscribers` and `event_types` lists whose items
    /// use the API's field names
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Print the plan and stop
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the customers and subscribers the file does not name
    #[arg(long)]
    pub prune: bool,
    /// Write created subscribers' secrets to this new file (mode 0600) instead of printing
    /// them; an existing file is not overwritten [default: none, printed]
    #[arg(long)]
    pub secrets_out: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `file:line: message`.
fn at(file: &Path, line: usize, message: impl std::fmt::Display) -> ClientError {
    ClientError::Input(format!("{}:{line}: {message}", file.display()))
}

/// The daemon's customers and subscribers by id, as the API's objects.
async fn current(client: &Client) -> Result<(Current, Current), ClientError> {
    let mut out = Vec::new();
    for kind in [Kind::Customer, Kind::Subscriber] {
        let list: Value = client
            .call(Method::GET, &format!("/v1/{}", kind.plural()), None)
            .await?;
        let by_id: Current = list
            .get(kind.plural())
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| {
                let m = o.as_object()?.clone();
                Some((m.get("id")?.as_str()?.to_string(), m))
            })
            .collect();
        out.push(by_id);
    }
    let subscribers = out.pop().unwrap_or_default();
    let customers = out.pop().unwrap_or_default();
    Ok((customers, subscribers))
}

pub(super) async fn apply(a: ApplyArgs) -> Result<(), ClientError> {
    let text = std::fs::read_to_string(&a.file)
        .map_err(|e| ClientError::Input(format!("{}: {e}", a.file.display())))?;
    let desired = yaml::desired(&text).map_err(|e| at(&a.file, e.line, e.message))?;
    let client = Client::new(&a.client)?;
    let (customers, subscribers) = current(&client).await?;
    let plan = plan::plan(&desired, &customers, &subscribers, a.prune);
    print!("{}", plan.render());
    if a.dry_run || plan.actions.is_empty() {
        return Ok(());
    }
    let creates = plan.actions.iter().any(|x| {
        matches!(
            x,
            Action::Create {
                kind: Kind::Subscriber,
                ..
            }
        )
    });
    let mut secrets = match (&a.secrets_out, creates) {
        (Some(p), true) => Some(secrets_file(p)?),
        _ => None,
    };
    carry_out(&client, &a.file, &plan, &mut secrets).await?;
    println!("applied {} change(s)", plan.actions.len());
    Ok(())
}

/// A new file for secrets, readable by its owner only; an existing one is refused.
fn secrets_file(path: &Path) -> Result<std::fs::File, ClientError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
        .map_err(|e| ClientError::Input(format!("--secrets-out {}: {e}", path.display())))
}

/// The daemon refused an action: the item's line, and the field's when it was the only one.
fn refused(
    file: &Path,
    (kind, id, field): (Kind, &str, Option<&str>),
    line: usize,
    e: ClientError,
) -> ClientError {
    let field = field.map(|f| format!(" field `{f}`")).unwrap_or_default();
    match e {
        ClientError::Api {
            status,
            code,
            message,
        } => at(
            file,
            line,
            format!(
                "{} `{id}`{field}: the daemon refused it ({status} {code}): {message}",
                kind.noun()
            ),
        ),
        other => other,
    }
}

async fn send(
    client: &Client,
    method: Method,
    kind: Kind,
    id: &str,
    body: Option<&Map<String, Value>>,
) -> Result<Value, ClientError> {
    let path = match method {
        Method::POST => format!("/v1/{}", kind.plural()),
        _ => format!("/v1/{}/{}", kind.plural(), encode(id)),
    };
    let body = body.map(|b| Value::Object(b.clone()).to_string().into_bytes());
    client.call(method, &path, body).await
}

async fn carry_out(
    client: &Client,
    file: &Path,
    plan: &Plan,
    secrets: &mut Option<std::fs::File>,
) -> Result<(), ClientError> {
    for action in &plan.actions {
        match action {
            Action::Create {
                kind,
                id,
                line,
                body,
                then,
            } => {
                let made = send(client, Method::POST, *kind, id, Some(body))
                    .await
                    .map_err(|e| refused(file, (*kind, id, None), *line, e))?;
                if let Some(secret) = made.get("secret").and_then(Value::as_str) {
                    keep_secret(secrets, id, secret)?;
                }
                if !then.is_empty() {
                    send(client, Method::PATCH, *kind, id, Some(then))
                        .await
                        .map_err(|e| refused(file, (*kind, id, None), *line, e))?;
                }
            }
            Action::Change {
                kind,
                id,
                line,
                changes,
            } => {
                let body: Map<String, Value> = changes
                    .iter()
                    .map(|c| (c.field.clone(), c.new.clone()))
                    .collect();
                let (line, field) = match changes.as_slice() {
                    [one] => (one.line, Some(one.field.as_str())),
                    _ => (*line, None),
                };
                send(client, Method::PATCH, *kind, id, Some(&body))
                    .await
                    .map_err(|e| refused(file, (*kind, id, field), line, e))?;
            }
            Action::Remove { kind, id } => {
                send(client, Method::DELETE, *kind, id, None)
                    .await
                    .map_err(|e| ClientError::Input(format!("remove {} {id}: {e}", kind.noun())))?;
            }
        }
    }
    Ok(())
}

/// A created subscriber's secret: to the secrets file, or printed (once: the daemon never
/// shows it again in a listing).
fn keep_secret(
    secrets: &mut Option<std::fs::File>,
    id: &str,
    secret: &str,
) -> Result<(), ClientError> {
    match secrets {
        Some(f) => writeln!(f, "{}: {}", Value::String(id.into()), secret)
            .map_err(|e| ClientError::Input(format!("--secrets-out: {e}"))),
        None => {
            println!("secret of subscriber {id} (shown once): {secret}");
            Ok(())
        }
    }
}

pub(super) async fn export(a: ExportArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let (customers, subscribers) = current(&client).await?;
    let c: Vec<Map<String, Value>> = customers.into_values().collect();
    let s: Vec<Map<String, Value>> = subscribers.into_values().collect();
    print!("{}", yaml::write(&c, &s));
    Ok(())
}
