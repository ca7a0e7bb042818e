//! Endpoint policy: `https://` only, never an IP literal in a private, loopback, link-local or
//! otherwise non-public range. With `allow_loopback` (local development and tests) also
//! `http://127.0.0.1:*` and `http://localhost:*`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use url::{Host, Url};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("not a valid absolute URL: {0}")]
    Invalid(String),
    #[error("only https:// endpoints are allowed")]
    Scheme,
    #[error("the endpoint must not carry credentials")]
    Credentials,
    #[error("the endpoint's address is private, loopback or link-local")]
    PrivateAddress,
}

/// Check an endpoint URL against the policy. Host names are not resolved here (the core does
/// no I/O); the origin re-checks resolved addresses with [`is_forbidden_ip`].
pub fn check_url(raw: &str, allow_loopback: bool) -> Result<Url, EndpointError> {
    let url = Url::parse(raw).map_err(|e| EndpointError::Invalid(e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(EndpointError::Credentials);
    }
    let host = url
        .host()
        .ok_or_else(|| EndpointError::Invalid("the URL has no host".into()))?;
    let loopback = match &host {
        Host::Domain(d) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        Host::Ipv4(ip) => ip.is_loopback(),
        Host::Ipv6(ip) => ip.is_loopback(),
    };
    let loopback_allowed = allow_loopback
        && loopback
        && matches!(
            &host,
            Host::Domain("localhost") | Host::Ipv4(_) | Host::Ipv6(_)
        );
    match url.scheme() {
        "https" => {}
        "http" if loopback_allowed => {}
        _ => return Err(EndpointError::Scheme),
    }
    if loopback_allowed {
        return Ok(url);
    }
    let forbidden = match host {
        Host::Domain(_) => loopback,
        Host::Ipv4(ip) => is_forbidden_ip(IpAddr::V4(ip)),
        Host::Ipv6(ip) => is_forbidden_ip(IpAddr::V6(ip)),
    };
    if forbidden {
        return Err(EndpointError::PrivateAddress);
    }
    Ok(url)
}

/// True for any address a webhook must never be sent to: private, loopback, link-local,
/// unspecified, shared (CGNAT), multicast, broadcast, reserved, and their IPv6 equivalents
/// (including IPv4-mapped and NAT64 forms).
pub fn is_forbidden_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || a >= 240 // reserved
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let seg = ip.segments();
    if seg[0] == 0x64 && seg[1] == 0xff9b {
        // NAT64: judge the embedded IPv4 address.
        let v4 = Ipv4Addr::new(
            (seg[6] >> 8) as u8,
            seg[6] as u8,
            (seg[7] >> 8) as u8,
            seg[7] as u8,
        );
        return forbidden_v4(v4);
    }
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, allow_loopback: bool, expected: Result<(), EndpointError>) {
        assert_eq!(
            check_url(url, allow_loopback).map(|_| ()),
            expected,
            "{url} loopback={allow_loopback}"
        );
    }

    #[test]
    fn policy_table() {
        use EndpointError::*;
        check("https://partner.example/hooks?x=1", false, Ok(()));
        check("https://93.184.216.34/h", false, Ok(()));
        check("http://partner.example/hooks", false, Err(Scheme));
        check("http://partner.example/hooks", true, Err(Scheme));
        check("ftp://partner.example/", false, Err(Scheme));
        check(
            "not a url",
            false,
            Err(Invalid("relative URL without a base".into())),
        );
        check("https://user:pw@partner.example/", false, Err(Credentials));
        check("https://10.0.0.5/h", false, Err(PrivateAddress));
        check("https://10.0.0.5/h", true, Err(PrivateAddress));
        check("https://172.16.3.4/h", false, Err(PrivateAddress));
        check("https://192.168.1.1/h", false, Err(PrivateAddress));
        check("https://169.254.169.254/latest", false, Err(PrivateAddress));
        check("https://127.0.0.1/h", false, Err(PrivateAddress));
        check("https://0x7f.1/h", false, Err(PrivateAddress)); // 127.0.0.1 in disguise
        check("https://2130706433/h", false, Err(PrivateAddress));
        check("https://0.0.0.0/h", false, Err(PrivateAddress));
        check("https://100.64.0.1/h", false, Err(PrivateAddress));
        check("https://[::1]/h", false, Err(PrivateAddress));
        check("https://[fe80::1]/h", false, Err(PrivateAddress));
        check("https://[fd00::1]/h", false, Err(PrivateAddress));
        check("https://[::ffff:10.1.2.3]/h", false, Err(PrivateAddress));
        check("https://[64:ff9b::a9fe:a9fe]/h", false, Err(PrivateAddress));
        check("https://[2606:4700::1]/h", false, Ok(()));
        check("https://localhost/h", false, Err(PrivateAddress));
        check("https://api.localhost/h", false, Err(PrivateAddress));
        check("http://127.0.0.1:9000/h", false, Err(Scheme));
        check("http://127.0.0.1:9000/h", true, Ok(()));
        check("http://localhost:9000/h", true, Ok(()));
        check("http://api.localhost:9000/h", true, Err(Scheme));
        check("http://10.0.0.1:9000/h", true, Err(Scheme));
    }
}
