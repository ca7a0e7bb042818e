//! Endpoint policy: `https://` only, never an IP literal in a private, loopback, link-local or
//! otherwise non-public range, any port but 0. With `allow_loopback` (local development and tests) also
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
    #[error("the endpoint's port must be 1 to 65535 (port 0 reaches nothing)")]
    Port,
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
    if url.port() == Some(0) {
        return Err(EndpointError::Port);
    }
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
/// unspecified, "this network", shared (CGNAT), benchmarking, multicast, broadcast, reserved,
/// their IPv6 equivalents, and every IPv6 form that embeds or tunnels an IPv4 address
/// (IPv4-compatible, -mapped and -translated, NAT64, 6to4, Teredo). Both lanes call this: the
/// edge on IP literals, the origin also on every address a host name resolves to.
pub fn is_forbidden_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0 // "this network", 0.0.0.0/8
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT), 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments, 192.0.0.0/24
        || (a == 198 && (b == 18 || b == 19)) // benchmarking, 198.18.0.0/15
        || a >= 240 // reserved, 240.0.0.0/4 (and the broadcast address)
}

/// IPv6 is refused whenever it is private or special on its own, and whenever it embeds or
/// tunnels an IPv4 address: those forms reach IPv4 hosts (possibly private ones) by routes the
/// IPv4 checks above never see, and no webhook endpoint needs them.
fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    // ::a.b.c.d (IPv4-compatible; includes :: and ::1) and ::ffff:a.b.c.d (IPv4-mapped)
    let compatible_or_mapped = seg[..5] == [0; 5] && (seg[5] == 0 || seg[5] == 0xffff);
    // ::ffff:0:a.b.c.d (IPv4-translated, RFC 2765)
    let translated = seg[..4] == [0; 4] && seg[4] == 0xffff && seg[5] == 0;
    // 64:ff9b::/96 (well-known NAT64 prefix), 64:ff9b:1::/48 (local-use NAT64) and the rest of
    // 64:ff9b::/32 that RFC 8215 keeps for translation
    let nat64 = seg[0] == 0x64 && seg[1] == 0xff9b;
    let six_to_four = seg[0] == 0x2002; // 2002::/16
    let teredo = seg[0] == 0x2001 && seg[1] == 0; // 2001::/32
    let embeds_v4 = compatible_or_mapped || translated || nat64 || six_to_four || teredo;
    embeds_v4
        || ip.is_loopback()
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

    /// Port 0 reaches nothing (on some stacks it means "any port"): refused on both lanes,
    /// whatever the scheme. Every other port is allowed (docs/src/edge.md).
    #[test]
    fn port_zero_is_refused_and_every_other_port_allowed() {
        use EndpointError::*;
        check("https://partner.example:0/hooks", false, Err(Port));
        check("https://93.184.216.34:0/h", false, Err(Port));
        check("http://127.0.0.1:0/h", true, Err(Port));
        check("http://localhost:0/h", true, Err(Port));
        check("https://partner.example:1/hooks", false, Ok(()));
        check("https://partner.example:8443/hooks", false, Ok(()));
        check("https://partner.example:65535/hooks", false, Ok(()));
        check("https://partner.example:443/hooks", false, Ok(()));
        check(
            "https://partner.example:65536/hooks",
            false,
            Err(Invalid("invalid port number".into())),
        );
    }

    /// Every address form the policy names, refused or not, judged by the one function both
    /// lanes call (the edge on IP literals, the origin on resolved addresses).
    #[test]
    fn forbidden_ip_table() {
        let rows: &[(&str, bool)] = &[
            // public IPv4 and IPv6: allowed
            ("93.184.216.34", false),
            ("1.1.1.1", false),
            ("100.63.255.255", false),
            ("100.128.0.0", false),
            ("198.17.255.255", false),
            ("198.20.0.0", false),
            ("223.255.255.255", false),
            ("2606:4700::1", false),
            ("2001:4860:4860::8888", false), // 2001:4860::/32 is not Teredo
            ("2003::1", false),
            // IPv4 ranges
            ("0.0.0.0", true),
            ("0.1.2.3", true), // 0.0.0.0/8
            ("10.0.0.1", true),
            ("100.64.0.1", true), // 100.64.0.0/10
            ("100.127.255.255", true),
            ("127.0.0.1", true),
            ("169.254.169.254", true),
            ("172.16.0.1", true),
            ("192.0.0.8", true),
            ("192.168.1.1", true),
            ("198.18.0.1", true), // 198.18.0.0/15
            ("198.19.255.255", true),
            ("224.0.0.1", true), // multicast
            ("239.255.255.250", true),
            ("240.0.0.1", true),
            ("255.255.255.255", true), // broadcast
            // IPv6 ranges
            ("::", true),
            ("::1", true),
            ("fe80::1", true),
            ("fd00::1", true),
            ("fec0::1", true),
            ("ff02::1", true), // multicast
            // IPv4 embedded in IPv6: refused whatever the IPv4 address
            ("::93.184.216.34", true), // IPv4-compatible
            ("::10.0.0.1", true),
            ("::ffff:93.184.216.34", true), // IPv4-mapped
            ("::ffff:10.1.2.3", true),
            ("::ffff:0:93.184.216.34", true), // IPv4-translated
            ("::ffff:0:127.0.0.1", true),
            ("64:ff9b::5db8:d822", true),   // NAT64 of 93.184.216.34
            ("64:ff9b::a9fe:a9fe", true),   // NAT64 of 169.254.169.254
            ("64:ff9b:1::5db8:d822", true), // local-use NAT64 64:ff9b:1::/48
            ("64:ff9b:1:ffff::1", true),
            ("64:ff9b:2::1", true),      // the rest of 64:ff9b::/32
            ("2002:5db8:d822::1", true), // 6to4 of 93.184.216.34
            ("2002:7f00:1::1", true),    // 6to4 of 127.0.0.1
            ("2001::1", true),           // Teredo 2001::/32
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", true),
        ];
        for &(text, forbidden) in rows {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(is_forbidden_ip(ip), forbidden, "{text}");
            // The URL check agrees for the literal form.
            let url = match ip {
                IpAddr::V4(_) => format!("https://{text}/h"),
                IpAddr::V6(_) => format!("https://[{text}]/h"),
            };
            let expected = if forbidden {
                Err(EndpointError::PrivateAddress)
            } else {
                Ok(())
            };
            check(&url, false, expected);
        }
    }
}
