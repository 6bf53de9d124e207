//! The hosts the dashboard answers for. A page on another site cannot read the dashboard's
//! answers across origins, but it can point a name of its own at this machine (DNS
//! rebinding): the browser then sends the dashboard requests from the page's own origin
//! and lets it read the answers. Those requests name the page's host in `Host`, so every
//! request is refused unless it names a host the dashboard serves:
//!
//! - `localhost`, `127.0.0.1` and `[::1]`;
//! - the address it listens on, as printed (`0.0.0.0` or `[::]` too), and the address of
//!   this machine a connection reached (which covers each of its addresses when it
//!   listens on all of them);
//! - the names and addresses given with `--allow-host`;
//!
//! with no port or the listening port, or for an `--allow-host NAME:PORT` that port. IP
//! literals compare as addresses, names without regard to case. A request naming no host
//! (HTTP/1.0 without `Host`) is refused too; one whose request line names a host
//! (`GET http://HOST/...`) must name a served one there as well.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::uri::Authority;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use tokio::net::TcpListener;

use crate::cli_error::CliError;

/// The address of this machine a connection reached (`None` if the system would not
/// tell), kept with each of its requests.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reached(Option<IpAddr>);

impl Connected<IncomingStream<'_, TcpListener>> for Reached {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Reached(stream.io().local_addr().ok().map(|a| a.ip().to_canonical()))
    }
}

/// A host as a request or `--allow-host` names it: an IP address or a name, lowercase.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Name {
    Ip(IpAddr),
    Dns(String),
}

impl Name {
    /// The host part of an authority: `[v6]`, dotted IPv4 or a name.
    fn of(host: &str) -> Name {
        if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            if let Ok(ip) = Ipv6Addr::from_str(v6) {
                return Name::Ip(IpAddr::V6(ip).to_canonical());
            }
        } else if let Ok(ip) = Ipv4Addr::from_str(host) {
            return Name::Ip(IpAddr::V4(ip));
        }
        Name::Dns(host.to_ascii_lowercase())
    }
}

/// The host and port `authority` names, if it is a host (`[v6]`, dotted IPv4 or a name)
/// with an optional decimal port and nothing else: no user info, no empty or other port.
fn split(authority: &[u8]) -> Option<(Name, Option<u16>)> {
    let authority = Authority::try_from(authority).ok()?;
    let (host, port) = (authority.host(), authority.port_u16());
    let whole = match port {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    };
    (authority.as_str() == whole).then(|| (Name::of(host), port))
}

/// A host served: its name and the port a request may name with it (`None`: no port or
/// the listening one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Allowed {
    name: Name,
    port: Option<u16>,
}

impl Allowed {
    /// An `--allow-host` value: a name (letters, digits, `-`, `.`, `_`), an IPv4 address or
    /// an IPv6 one in brackets, with a port or not.
    pub(crate) fn given(value: &str) -> Result<Allowed, CliError> {
        let bad = || {
            CliError::Message(format!(
                "--allow-host {value:?} is not a host name or IP address (an IPv6 one in brackets), with an optional :PORT"
            ))
        };
        let (name, port) = split(value.as_bytes()).ok_or_else(bad)?;
        let fits = match &name {
            Name::Ip(_) => true,
            Name::Dns(dns) => {
                !dns.is_empty()
                    && dns.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            }
        };
        if !fits || port == Some(0) {
            return Err(bad());
        }
        Ok(Allowed { name, port })
    }
}

/// The hosts served, with the listening port.
#[derive(Clone, Debug)]
pub(crate) struct Hosts(Arc<[Allowed]>, u16);

impl Hosts {
    /// The localhost names, `listen`'s address and `given`, on `listen`'s port.
    pub(crate) fn new(listen: SocketAddr, given: Vec<Allowed>) -> Hosts {
        let mut hosts: Vec<Allowed> = [
            Name::Dns("localhost".to_owned()),
            Name::Ip(Ipv4Addr::LOCALHOST.into()),
            Name::Ip(Ipv6Addr::LOCALHOST.into()),
            Name::Ip(listen.ip().to_canonical()),
        ]
        .into_iter()
        .map(|name| Allowed { name, port: None })
        .collect();
        hosts.extend(given);
        Hosts(hosts.into(), listen.port())
    }

    /// Whether `authority` (a `Host` header's value, or a request line's authority) names
    /// a host served, for a connection that reached `reached`.
    fn serves(&self, authority: &[u8], reached: Option<IpAddr>) -> bool {
        let Some((name, port)) = split(authority) else { return false };
        let ours = |allowed: Option<u16>| match allowed {
            Some(p) => port == Some(p),
            None => port.is_none() || port == Some(self.1),
        };
        reached.is_some_and(|ip| name == Name::Ip(ip) && ours(None))
            || self.0.iter().any(|a| a.name == name && ours(a.port))
    }

    /// Why a request naming `authorities` (its request line's and its `Host` headers'),
    /// on a connection that reached `reached`, is refused, if it is.
    fn refuse<'a>(
        &self,
        mut authorities: impl Iterator<Item = &'a [u8]>,
        reached: Option<IpAddr>,
    ) -> Option<&'static str> {
        let Some(first) = authorities.next() else {
            return Some("a request must name this dashboard's host in a Host header\n");
        };
        if std::iter::once(first).chain(authorities).all(|a| self.serves(a, reached)) {
            None
        } else {
            Some(
                "this dashboard serves localhost, its own address and the names given with --allow-host, not the host this request names\n",
            )
        }
    }
}

/// Middleware over every route: lets through only a request naming a host served.
pub(crate) async fn require(State(hosts): State<Hosts>, request: Request, next: Next) -> Response {
    let reached = request.extensions().get::<ConnectInfo<Reached>>().and_then(|c| c.0.0);
    let authorities = request
        .uri()
        .authority()
        .map(|a| a.as_str().as_bytes())
        .into_iter()
        .chain(request.headers().get_all(header::HOST).iter().map(|v| v.as_bytes()));
    match hosts.refuse(authorities, reached) {
        Some(why) => (StatusCode::FORBIDDEN, why).into_response(),
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listen: &str, given: &[&str]) -> Hosts {
        let given = given.iter().map(|g| Allowed::given(g).unwrap()).collect();
        Hosts::new(listen.parse().unwrap(), given)
    }

    /// The localhost names and the listening address pass, with the listening port or
    /// none; other names, ports and malformed values do not.
    #[test]
    fn serves_localhost_and_its_address() {
        let hosts = hosts("127.0.0.1:7474", &[]);
        for ok in ["localhost", "LOCALHOST:7474", "127.0.0.1:7474", "[::1]:7474", "[0:0::1]", "127.0.0.1"] {
            assert!(hosts.serves(ok.as_bytes(), None), "{ok} refused");
        }
        for no in [
            "attacker.example:7474",
            "localhost:7475",
            "localhost.attacker.example",
            "127.0.0.2:7474",
            "localhost:7474@attacker.example",
            "",
            "localhost:x",
        ] {
            assert!(!hosts.serves(no.as_bytes(), None), "{no} served");
        }
        assert!(hosts.refuse([].into_iter(), None).is_some(), "no Host served");
        let two = [&b"localhost:7474"[..], b"attacker.example:7474"];
        assert!(hosts.refuse(two.into_iter(), None).is_some(), "one of two Hosts foreign");
    }

    /// On every address, the one a connection reached is served, and `0.0.0.0` as printed;
    /// `--allow-host` names pass on the listening port, or on their own port when given.
    #[test]
    fn serves_the_address_reached_and_the_names_given() {
        let hosts = hosts("0.0.0.0:7474", &["Dash.example", "proxy.example:8443", "[fd00::2]"]);
        let reached = Some("192.0.2.2".parse().unwrap());
        assert!(hosts.serves(b"192.0.2.2:7474", reached));
        assert!(!hosts.serves(b"192.0.2.2:7474", None));
        assert!(!hosts.serves(b"192.0.2.3:7474", reached));
        assert!(hosts.serves(b"0.0.0.0:7474", None));
        assert!(hosts.serves(b"dash.EXAMPLE:7474", None));
        assert!(hosts.serves(b"dash.example", None));
        assert!(hosts.serves(b"[fd00::2]:7474", None));
        assert!(hosts.serves(b"proxy.example:8443", None));
        assert!(!hosts.serves(b"proxy.example:7474", None));
        assert!(!hosts.serves(b"proxy.example", None));
        // An IPv4 client on a dual-stack socket reaches an IPv4-mapped address.
        let hosts = super::tests::hosts("[::]:7474", &[]);
        let mapped = Some(IpAddr::V6("::ffff:192.0.2.2".parse().unwrap()).to_canonical());
        assert!(hosts.serves(b"192.0.2.2:7474", mapped));
    }

    /// `--allow-host` takes a host, with a port or not, and nothing else.
    #[test]
    fn given_hosts_are_checked() {
        for bad in ["", "two words", "a/b", "user@host", "host:port", "http://host", "host:", "host:0", "*"] {
            assert!(Allowed::given(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["dash.example", "dash-1.example:8443", "10.0.0.5", "[::1]:7474", "my_host"] {
            assert!(Allowed::given(good).is_ok(), "{good:?} refused");
        }
    }
}
