//! The network a merchant's webhook goes out on is hostile: a URL an account registers may name
//! the service's own network (a database, a cloud's metadata address), directly or through a name
//! that resolves there, at the moment of delivery if not at registration (DNS rebinding), or by a
//! redirect; and a receiver may answer forever, or without end. So every delivery goes through a
//! [`Sender`] that:
//!
//! - resolves the host at every attempt, through a resolver that drops every address the service
//!   never connects to ([`Guard::permits`]: loopback, private, shared, link-local, unspecified,
//!   multicast and broadcast, IPv4-mapped forms too) unless it lies in an allowed network; a name
//!   left with no address reaches nothing. A literal address, which no resolver sees, is checked
//!   before the request;
//! - never follows a redirect (a `3xx` is the receiver's answer, and a failed attempt);
//! - goes through no proxy (a proxy would resolve the name itself);
//! - reads at most [`MAX_ANSWER`] of an answer, and gives every attempt a timeout.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use reqwest::Url;

use payments_wire::retry_after::parse_retry_after;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// The most of an answer read: the rest is never taken off the socket.
pub const MAX_ANSWER: usize = 64 * 1024;

/// The networks whose addresses the service may reach though they are internal
/// (`PAYMENTS_WEBHOOK_ALLOWED_NETWORKS`): in embedded mode loopback, so that a receiver on the
/// same machine can be tried; elsewhere none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedNetworks(Vec<IpNet>);

impl AllowedNetworks {
    /// What embedded mode allows: loopback, `127.0.0.0/8` and `::1/128`.
    pub fn loopback() -> AllowedNetworks {
        AllowedNetworks(vec![
            IpNet::V4(Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8).expect("a /8 is a prefix")),
            IpNet::V6(Ipv6Net::new(Ipv6Addr::LOCALHOST, 128).expect("a /128 is a prefix")),
        ])
    }

    /// Comma-separated CIDRs (`127.0.0.1/32,10.1.0.0/16`); empty allows nothing.
    pub fn parse(list: &str) -> Result<AllowedNetworks, String> {
        let parse =
            |cidr: &str| cidr.parse::<IpNet>().map_err(|_| format!("{cidr:?} is not a CIDR, such as 10.1.0.0/16"));
        let networks = list.split(',').map(str::trim).filter(|cidr| !cidr.is_empty()).map(parse);
        Ok(AllowedNetworks(networks.collect::<Result<_, _>>()?))
    }

    fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|network| network.contains(&ip))
    }
}

impl fmt::Display for AllowedNetworks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listed: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&listed.join(","))
    }
}

/// Which addresses the service connects to.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allowed: AllowedNetworks,
}

impl Guard {
    pub fn new(allowed: AllowedNetworks) -> Guard {
        Guard { allowed }
    }

    /// Whether the service may connect to `ip`: an address of the open internet, or one that lies
    /// in an allowed network. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is judged as the
    /// IPv4 address it is.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        !is_internal(ip) || self.allowed.contains(ip)
    }

    /// Whether `url` may be registered: one whose host is a literal address must be permitted
    /// (a name is judged at every attempt, by what it resolves to then).
    pub fn permits_url(&self, url: &Url) -> bool {
        literal_address(url).is_none_or(|ip| self.permits(ip))
    }
}

/// An address no webhook may reach unless its network is allowed.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => {
            let [a, b, ..] = ip.octets();
            ip.is_loopback()
                || ip.is_private()
                || ip.is_link_local()
                || ip.is_unspecified()
                || ip.is_multicast()
                || ip.is_broadcast()
                || a == 0
                // Shared address space (carrier-grade NAT), 100.64.0.0/10.
                || (a == 100 && (b & 0xc0) == 64)
        }
        IpAddr::V6(ip) => {
            let first = ip.segments()[0];
            ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_multicast()
                // Unique local, fc00::/7, and link-local, fe80::/10.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

/// The address `url`'s host is written as, if it is one (the URL parser has already written any
/// form of one, such as `0x7f.1`, as the address it is: `127.0.0.1`, or `[::1]`).
fn literal_address(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).unwrap_or(host).parse().ok()
}

/// Resolves through the system's resolver, then drops every address the guard does not permit.
struct GuardedResolver(Arc<Guard>);

/// A name that resolved to no address the service may reach.
#[derive(Debug, thiserror::Error)]
#[error("{0} resolves to no address the service may reach")]
struct NotAllowed(String);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let permitted: Vec<SocketAddr> = found.filter(|addr| guard.permits(addr.ip())).collect();
            if permitted.is_empty() {
                return Err(Box::new(NotAllowed(host)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(permitted.into_iter()) as Addrs)
        })
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempted {
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// Why the attempt failed without an answer, or with one that is not a success: `timeout`,
    /// `connection refused`, `address not allowed`, `redirect`, ...
    pub error: Option<String>,
    /// The first [`MAX_ANSWER`] bytes of its answer.
    pub body: Vec<u8>,
    pub duration: Duration,
    /// The receiver's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
}

impl Attempted {
    /// A `2xx`: the event is delivered.
    pub fn delivered(&self) -> bool {
        self.status.is_some_and(|status| (200..300).contains(&status))
    }
}

/// Sends webhooks as the module says. Cheap to clone.
#[derive(Clone)]
pub struct Sender {
    http: reqwest::Client,
    guard: Arc<Guard>,
}

impl Sender {
    /// A sender that gives every attempt `timeout`, and connects only where `guard` permits.
    pub fn new(guard: Guard, timeout: Duration) -> reqwest::Result<Sender> {
        let guard = Arc::new(guard);
        let http = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver(guard.clone())))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(timeout)
            .build()?;
        Ok(Sender { http, guard })
    }

    /// POSTs `body` to `url` with `headers`, and reads at most [`MAX_ANSWER`] of the answer.
    pub async fn post(&self, url: &Url, headers: &[(&str, String)], body: Vec<u8>) -> Attempted {
        let started = Instant::now();
        let failed = |error: &str| Attempted {
            status: None,
            error: Some(error.to_owned()),
            body: Vec::new(),
            duration: started.elapsed(),
            retry_after: None,
        };
        if !self.guard.permits_url(url) {
            return failed("address not allowed");
        }
        let mut request = self.http.post(url.clone()).header("content-type", "application/json").body(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(error) => return failed(&why(&error)),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| parse_retry_after(value, SystemTime::now()));
        let mut body = Vec::new();
        let mut error = None;
        while body.len() < MAX_ANSWER {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(MAX_ANSWER - body.len())]),
                Ok(None) => break,
                Err(read) => {
                    error = Some(why(&read));
                    break;
                }
            }
        }
        if status.is_redirection() {
            error = Some("redirect".into());
        } else if !status.is_success() && error.is_none() {
            error = Some(format!("answered {}", status.as_u16()));
        }
        Attempted { status: Some(status.as_u16()), error, body, duration: started.elapsed(), retry_after }
    }
}

/// Why a request got no answer, in the attempts log's words.
fn why(error: &reqwest::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if cause.downcast_ref::<NotAllowed>().is_some() {
            return "address not allowed".into();
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return "connection refused".into();
        }
        source = cause.source();
    }
    if error.is_timeout() {
        "timeout".into()
    } else if error.is_connect() {
        "connection failed".into()
    } else {
        format!("request failed: {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_and_the_open_internet_is_not() {
        let guard = Guard::default();
        for refused in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(!guard.permits(ip(refused)), "{refused}");
        }
        for open in
            ["93.184.216.34", "100.63.255.255", "100.128.0.1", "172.32.0.1", "2606:2800:220:1::1", "::ffff:8.8.8.8"]
        {
            assert!(guard.permits(ip(open)), "{open}");
        }
    }

    #[test]
    fn an_allowed_network_is_reached_and_nothing_beside_it() {
        let guard = Guard::new(AllowedNetworks::parse("127.0.0.1/32, 10.1.0.0/16").unwrap());
        assert!(
            guard.permits(ip("127.0.0.1")) && guard.permits(ip("::ffff:127.0.0.1")) && guard.permits(ip("10.1.9.9"))
        );
        assert!(!guard.permits(ip("127.0.0.2")) && !guard.permits(ip("10.2.0.1")) && !guard.permits(ip("::1")));
        let loopback = Guard::new(AllowedNetworks::loopback());
        assert!(loopback.permits(ip("127.0.0.2")) && loopback.permits(ip("::1")) && !loopback.permits(ip("10.0.0.1")));
        assert_eq!(AllowedNetworks::loopback().to_string(), "127.0.0.0/8,::1/128");
        assert_eq!(AllowedNetworks::parse(""), Ok(AllowedNetworks::default()));
        assert!(AllowedNetworks::parse("10.0.0.0").is_err());
    }

    #[test]
    fn a_url_whose_host_is_a_literal_address_is_judged_by_it_and_a_name_is_left_to_each_attempt() {
        let guard = Guard::new(AllowedNetworks::parse("127.0.0.1/32").unwrap());
        let url = |text: &str| Url::parse(text).unwrap();
        assert!(guard.permits_url(&url("http://127.0.0.1:8080/hook")));
        assert!(!guard.permits_url(&url("http://127.0.0.2:8080/hook")));
        assert!(!guard.permits_url(&url("http://[::1]/hook")));
        assert!(!guard.permits_url(&url("http://[::ffff:7f00:2]/hook")), "127.0.0.2, IPv4-mapped");
        assert!(!guard.permits_url(&url("http://0x7f.0.0.2/hook")), "127.0.0.2, written otherwise");
        assert!(guard.permits_url(&url("http://localhost:8080/hook")), "a name: judged when it is resolved");
    }
}
