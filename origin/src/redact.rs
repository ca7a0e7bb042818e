//! What of a URL or an HTTP client error may reach the logs: `scheme://host:port` and the
//! kind of failure, never a path, a query, credentials or a body (paths and queries carry
//! tokens: alert and webhook URLs often embed one).

/// `scheme://host:port` of a URL.
pub fn url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => match (u.host_str(), u.port_or_known_default()) {
            (Some(h), Some(p)) => format!("{}://{h}:{p}", u.scheme()),
            (Some(h), None) => format!("{}://{h}", u.scheme()),
            _ => format!("{}:", u.scheme()),
        },
        Err(_) => "(an unparsable URL)".into(),
    }
}

/// A PostgreSQL URL for logs, messages and `/healthz`: whole, but its password replaced by
/// `***` (the ledger's `--db` and the producer's `--outbox` name their database this way).
pub fn database_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "postgres://…".into(),
    }
}

/// An HTTP client error without its URL, with its causes (`error sending request: client
/// error (Connect): tcp connect error: Connection refused`).
pub fn http_error(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_table() {
        for (given, want) in [
            (
                "https://ops.example/hooks/T0K3N?key=abc",
                "https://ops.example:443",
            ),
            ("http://127.0.0.1:9/secret/path", "http://127.0.0.1:9"),
            (
                "https://user:pw@partner.example:8443/x#frag",
                "https://partner.example:8443",
            ),
            ("not a url /with/path", "(an unparsable URL)"),
        ] {
            assert_eq!(url(given), want, "{given}");
        }
    }
}
