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

/// A PostgreSQL URL for logs, messages and `GET /v1/outbox`: whole, but every password in it
/// replaced by `***`: the user's (`postgres://u:pw@…`) and any query parameter whose name,
/// percent-decoded and in any case, holds `password` (`?password=`, `?pass%77ord=`,
/// `?sslpassword=`), as the driver would read it. Text that is not a URL names nothing.
pub fn database_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "postgres://…".into();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                if k.to_ascii_lowercase().contains("password") {
                    (k.into_owned(), "***".to_string())
                } else {
                    (k.into_owned(), v.into_owned())
                }
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
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

    #[test]
    fn database_url_table() {
        for (given, want) in [
            (
                "postgres://fanout:s3cret@db:5432/fanout",
                "postgres://fanout:***@db:5432/fanout",
            ),
            (
                "postgres://fanout@db/fanout?password=s3cret",
                "postgres://fanout@db/fanout?password=***",
            ),
            (
                "postgres://fanout@db/fanout?sslmode=require&PassWord=s3cret&application_name=x",
                "postgres://fanout@db/fanout?sslmode=require&PassWord=***&application_name=x",
            ),
            (
                "postgres://fanout@db/fanout?pass%77ord=s3cret",
                "postgres://fanout@db/fanout?password=***",
            ),
            (
                "postgresql://u:p@db/f?sslpassword=k&password=s3cret",
                "postgresql://u:***@db/f?sslpassword=***&password=***",
            ),
            ("host=db password=s3cret", "postgres://…"),
            ("postgres://fanout@db/fanout", "postgres://fanout@db/fanout"),
        ] {
            let got = database_url(given);
            assert_eq!(got, want, "{given}");
            assert!(!got.contains("s3cret"), "{got}");
        }
    }
}
