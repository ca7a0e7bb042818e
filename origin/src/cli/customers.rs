//! `fanout customer add|list|show|update|remove|revoke-links|portal`, and what each prints for
//! a person (pure).

use clap::Subcommand;
use serde_json::{json, Value};

use super::client::{encode, print, Client, ClientArgs, ClientError};
use crate::customer::{CustomerList, CustomerView, PortalLink};
use crate::time::format_rfc3339;

// ---------------------------------------------------------------------------------------------
// `fanout customer …`

#[derive(Debug, Subcommand)]
pub enum CustomerCommand {
    /// Add a customer; prints a line about it, or the daemon's JSON with --json
    Add {
        /// The customer's id (letters, digits, `_`, `-`, `.`)
        id: String,
        /// Its share of the dispatcher under contention, relative to other customers [default: 1]
        #[arg(long)]
        weight: Option<u32>,
        /// Most deliveries in flight across all its endpoints [default: no cap of its own]
        #[arg(long)]
        max_in_flight: Option<u32>,
        /// Print the daemon's JSON instead of a line for a person
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List customers
    List {
        /// Print the daemon's JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one customer
    Show {
        /// The customer's id
        id: String,
        /// Print the daemon's JSON instead of one line per field
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Change a customer's weight or in-flight cap: only the flags given change
    Update {
        /// The customer's id
        id: String,
        /// Its share of the dispatcher under contention [default: unchanged]
        #[arg(long)]
        weight: Option<u32>,
        /// Most deliveries in flight across all its endpoints [default: unchanged]
        #[arg(long, conflicts_with = "no_max_in_flight")]
        max_in_flight: Option<u32>,
        /// Remove its in-flight cap
        #[arg(long)]
        no_max_in_flight: bool,
        /// Print the daemon's JSON instead of one line per field
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a customer that owns no subscriber; its portal links stop working
    Remove {
        /// The customer's id
        id: String,
        /// Print the daemon's JSON instead of a line
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// End every portal link issued for the customer so far (a leaked link); new links work
    RevokeLinks {
        /// The customer's id
        id: String,
        /// Print the daemon's JSON instead of a line
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a link to the customer's portal (the URL carries a token: treat it as a secret)
    Portal {
        /// The customer's id
        id: String,
        /// How long the link works, in seconds [default: 3600]
        #[arg(long)]
        ttl_secs: Option<u64>,
        /// Print the daemon's JSON (url, token, expires_at_ms) instead of the URL
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `DELETE /v1/customers/{id}`'s answer.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct CustomerDeleted {
    id: String,
    deleted: bool,
}

/// `POST /v1/customers/{id}/portal/revoke`'s answer.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct LinksRevoked {
    id: String,
    links_revoked_at_ms: i64,
}

/// A customer for a person, or the daemon's JSON.
fn show(c: &CustomerView, json: bool) {
    if json {
        print(c);
    } else {
        print!("{}", customer_detail(c));
    }
}

pub(super) async fn run_customer(command: CustomerCommand) -> Result<(), ClientError> {
    use reqwest::Method;
    let path = |id: &str| format!("/v1/customers/{}", encode(id));
    match command {
        CustomerCommand::Add {
            id,
            weight,
            max_in_flight,
            json,
            client,
        } => {
            let mut body = json!({ "id": id });
            if let Some(w) = weight {
                body["weight"] = json!(w);
            }
            if let Some(m) = max_in_flight {
                body["max_in_flight"] = json!(m);
            }
            let c: CustomerView = Client::new(&client)?
                .call(
                    Method::POST,
                    "/v1/customers",
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            if json {
                print(&c);
            } else {
                print!("{}", added_line(&c));
            }
        }
        CustomerCommand::List { json, client } => {
            let list: CustomerList = Client::new(&client)?
                .call(Method::GET, "/v1/customers", None)
                .await?;
            if json {
                print(&list);
            } else {
                print!("{}", customers_table(&list.customers));
            }
        }
        CustomerCommand::Show { id, json, client } => {
            let c: CustomerView = Client::new(&client)?
                .call(Method::GET, &path(&id), None)
                .await?;
            show(&c, json);
        }
        CustomerCommand::Update {
            id,
            weight,
            max_in_flight,
            no_max_in_flight,
            json,
            client,
        } => {
            let body = update_body(weight, max_in_flight, no_max_in_flight)?;
            let c: CustomerView = Client::new(&client)?
                .call(
                    Method::PATCH,
                    &path(&id),
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            show(&c, json);
        }
        CustomerCommand::Remove { id, json, client } => {
            let d: CustomerDeleted = Client::new(&client)?
                .call(Method::DELETE, &path(&id), None)
                .await?;
            if json {
                print(&d);
            } else {
                println!("removed customer {}; its portal links no longer work", d.id);
            }
        }
        CustomerCommand::RevokeLinks { id, json, client } => {
            let r: LinksRevoked = Client::new(&client)?
                .call(Method::POST, &format!("{}/portal/revoke", path(&id)), None)
                .await?;
            if json {
                print(&r);
            } else {
                println!(
                    "every portal link of customer {} issued before {} no longer works",
                    r.id,
                    format_rfc3339(r.links_revoked_at_ms)
                );
            }
        }
        CustomerCommand::Portal {
            id,
            ttl_secs,
            json,
            client,
        } => {
            let body = match ttl_secs {
                Some(t) => json!({ "ttl_secs": t }),
                None => json!({}),
            };
            let link: PortalLink = Client::new(&client)?
                .call(
                    Method::POST,
                    &format!("{}/portal", path(&id)),
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            if json {
                print(&link);
            } else {
                println!("{}", link.url);
            }
        }
    }
    Ok(())
}

/// `fanout customer update`'s PATCH body (pure); one that changes nothing is refused.
fn update_body(
    weight: Option<u32>,
    max_in_flight: Option<u32>,
    no_max_in_flight: bool,
) -> Result<Value, ClientError> {
    let mut body = json!({});
    if let Some(w) = weight {
        body["weight"] = json!(w);
    }
    match (no_max_in_flight, max_in_flight) {
        (true, _) => body["max_in_flight"] = Value::Null,
        (false, Some(m)) => body["max_in_flight"] = json!(m),
        (false, None) => {}
    }
    if body.as_object().is_some_and(|o| o.is_empty()) {
        return Err(ClientError::Input(
            "nothing to change: give --weight, --max-in-flight or --no-max-in-flight".into(),
        ));
    }
    Ok(body)
}

/// `fanout customer show` for a person: one field a line, times in RFC 3339 UTC (pure).
pub fn customer_detail(c: &CustomerView) -> String {
    let cap = c
        .max_in_flight
        .map_or("none".to_string(), |m| m.to_string());
    [
        ("id", c.id.clone()),
        ("weight", c.weight.to_string()),
        ("max_in_flight", cap),
        ("subscribers", c.subscribers.to_string()),
        ("created_at", format_rfc3339(c.created_at_ms)),
        ("updated_at", format_rfc3339(c.updated_at_ms)),
    ]
    .into_iter()
    .map(|(k, v)| format!("{k:<15}{v}\n"))
    .collect()
}

/// What `fanout customer add` tells a person (pure).
pub fn added_line(c: &CustomerView) -> String {
    let cap = c
        .max_in_flight
        .map_or("no in-flight cap of its own".to_string(), |m| {
            format!("at most {m} in flight")
        });
    format!("added customer {} (weight {}, {cap})\n", c.id, c.weight)
}

/// Customers as a table: id, weight, in-flight cap, subscribers.
pub fn customers_table(customers: &[CustomerView]) -> String {
    let mut out = format!(
        "{:<24} {:>6} {:>13} {:>11}\n",
        "CUSTOMER", "WEIGHT", "MAX IN FLIGHT", "SUBSCRIBERS"
    );
    for c in customers {
        let cap = c.max_in_flight.map_or("-".to_string(), |m| m.to_string());
        out.push_str(&format!(
            "{:<24} {:>6} {:>13} {:>11}\n",
            c.id, c.weight, cap, c.subscribers
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_line_table() {
        let c = |weight, max_in_flight| crate::customer::CustomerView {
            id: "acme".into(),
            weight,
            max_in_flight,
            subscribers: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        let cases = [
            (
                c(4, Some(20)),
                "added customer acme (weight 4, at most 20 in flight)\n",
            ),
            (
                c(1, None),
                "added customer acme (weight 1, no in-flight cap of its own)\n",
            ),
        ];
        for (customer, expected) in cases {
            assert_eq!(added_line(&customer), expected);
        }
    }

    #[test]
    fn customer_detail_names_each_field_and_rfc3339_times() {
        let c = crate::customer::CustomerView {
            id: "acme".into(),
            weight: 2,
            max_in_flight: None,
            subscribers: 3,
            created_at_ms: 1_700_000_000_000,
            updated_at_ms: 1_700_000_000_250,
        };
        assert_eq!(
            customer_detail(&c),
            "id             acme\n\
             weight         2\n\
             max_in_flight  none\n\
             subscribers    3\n\
             created_at     2023-11-14T22:13:20.000Z\n\
             updated_at     2023-11-14T22:13:20.250Z\n"
        );
    }

    #[test]
    fn customers_table_lists_weight_cap_and_subscribers() {
        let c = |id: &str, weight, cap, subscribers| crate::customer::CustomerView {
            id: id.into(),
            weight,
            max_in_flight: cap,
            subscribers,
            created_at_ms: 0,
            updated_at_ms: 0,
        };
        let t = customers_table(&[c("acme", 4, Some(20), 3), c("globex", 1, None, 0)]);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[1], ["acme", "4", "20", "3"]);
        assert_eq!(lines[2], ["globex", "1", "-", "0"]);
    }
}
