//! `fanout customer add|list|show|remove|revoke-links|portal`, and the customers table (pure).

use clap::Subcommand;
use serde_json::{json, Value};

use super::client::{encode, print, view, Client, ClientArgs, ClientError};

// ---------------------------------------------------------------------------------------------
// `fanout customer …`

#[derive(Debug, Subcommand)]
pub enum CustomerCommand {
    /// Add a customer; prints a line about it, or the daemon's JSON with --json
    Add {
        id: String,
        /// Its share of the dispatcher under contention, relative to other customers [default: 1]
        #[arg(long)]
        weight: Option<u32>,
        /// Most deliveries in flight across all its endpoints
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
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a customer that owns no subscriber; its portal links stop working
    Remove {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// End every portal link issued for the customer so far (a leaked link); new links work
    RevokeLinks {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a link to the customer's portal (the URL carries a token: treat it as a secret)
    Portal {
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

pub(super) async fn run_customer(command: CustomerCommand) -> Result<(), ClientError> {
    use crate::customer::{CustomerList, CustomerView, PortalLink};
    use reqwest::Method;
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
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::POST,
                    "/v1/customers",
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            if json {
                print(&v);
            } else {
                print!("{}", added_line(&view::<CustomerView>(v)?));
            }
        }
        CustomerCommand::List { json, client } => {
            let v = Client::new(&client)?
                .call::<Value>(Method::GET, "/v1/customers", None)
                .await?;
            if json {
                print(&v);
            } else {
                print!("{}", customers_table(&view::<CustomerList>(v)?.customers));
            }
        }
        CustomerCommand::Show { id, client } => {
            let v = Client::new(&client)?
                .call::<Value>(Method::GET, &format!("/v1/customers/{}", encode(&id)), None)
                .await?;
            let c: CustomerView = view(v.clone())?;
            print(&serde_json::to_value(c).unwrap_or(v));
        }
        CustomerCommand::Remove { id, client } => {
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::DELETE,
                    &format!("/v1/customers/{}", encode(&id)),
                    None,
                )
                .await?;
            print(&v);
        }
        CustomerCommand::RevokeLinks { id, client } => {
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::POST,
                    &format!("/v1/customers/{}/portal/revoke", encode(&id)),
                    None,
                )
                .await?;
            print(&v);
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
            let v = Client::new(&client)?
                .call::<Value>(
                    Method::POST,
                    &format!("/v1/customers/{}/portal", encode(&id)),
                    Some(body.to_string().into_bytes()),
                )
                .await?;
            let link: PortalLink = view(v)?;
            if json {
                print(&serde_json::to_value(&link).unwrap_or_default());
            } else {
                println!("{}", link.url);
            }
        }
    }
    Ok(())
}

/// What `fanout customer add` tells a person (pure).
pub fn added_line(c: &crate::customer::CustomerView) -> String {
    let cap = c
        .max_in_flight
        .map_or("no in-flight cap of its own".to_string(), |m| {
            format!("at most {m} in flight")
        });
    format!("added customer {} (weight {}, {cap})\n", c.id, c.weight)
}

/// Customers as a table: id, weight, in-flight cap, subscribers.
pub fn customers_table(customers: &[crate::customer::CustomerView]) -> String {
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
