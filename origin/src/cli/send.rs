//! `fanout send`: events from a file or stdin (one JSON value, an array, or one object per
//! line), posted 1000 per request.

use std::io::Read as _;
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::client::{print, Client, ClientArgs, ClientError};
use crate::api::views::IngestedBatch;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// File of events; stdin when absent or `-`
    pub file: Option<PathBuf>,
    /// Print the totals as JSON ({"events","duplicates","deliveries"}) instead of a line
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Events from a file's text: a JSON value (object or array), or one object per line.
pub fn events_from_text(text: &str) -> Result<Vec<Box<serde_json::value::RawValue>>, ClientError> {
    use serde_json::value::RawValue;
    if let Ok(raw) = serde_json::from_str::<Box<RawValue>>(text) {
        if raw.get().starts_with('[') {
            return serde_json::from_str::<Vec<Box<RawValue>>>(raw.get())
                .map_err(|e| ClientError::Input(format!("not a JSON array of events: {e}")));
        }
        return Ok(vec![raw]);
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Box<RawValue>>(l)
                .map_err(|e| ClientError::Input(format!("line {}: not JSON: {e}", i + 1)))
        })
        .collect()
}

/// `fanout send`: events from a file or stdin, 1000 per request; prints the totals.
pub(super) async fn send(a: SendArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let text = match a.file.as_deref() {
        Some(p) if p.as_os_str() != "-" => std::fs::read_to_string(p)
            .map_err(|e| ClientError::Input(format!("cannot read {}: {e}", p.display())))?,
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| ClientError::Input(format!("cannot read stdin: {e}")))?;
            s
        }
    };
    let events = events_from_text(&text)?;
    if events.is_empty() {
        return Err(ClientError::Input("no events to send".into()));
    }
    let (mut new, mut dup, mut deliveries) = (0u64, 0u64, 0u64);
    let progress = crate::term::bar(events.len() as u64, "events");
    for chunk in events.chunks(1000) {
        let body = serde_json::to_vec(chunk).map_err(|e| ClientError::Input(e.to_string()))?;
        let answer: IngestedBatch = client
            .call(reqwest::Method::POST, "/v1/events", Some(body))
            .await?;
        for e in answer.events {
            if e.duplicate {
                dup += 1;
            } else {
                new += 1;
            }
            deliveries += u64::from(e.deliveries);
        }
        progress.inc(chunk.len() as u64);
    }
    progress.finish_and_clear();
    if a.json {
        print(&json!({ "events": new, "duplicates": dup, "deliveries": deliveries }));
    } else {
        println!("sent {new} new events ({dup} already known), {deliveries} deliveries created");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_text_table() {
        let cases: &[(&str, Option<usize>)] = &[
            (r#"{"id":"a","type":"t"}"#, Some(1)),
            (r#"[{"id":"a","type":"t"},{"id":"b","type":"t"}]"#, Some(2)),
            (
                "{\"id\":\"a\",\"type\":\"t\"}\n\n{\"id\":\"b\",\"type\":\"t\"}\n",
                Some(2),
            ),
            ("{\"id\":\"a\"\nnope", None),
        ];
        for &(text, expected) in cases {
            assert_eq!(
                events_from_text(text).ok().map(|v| v.len()),
                expected,
                "{text:?}"
            );
        }
    }
}
