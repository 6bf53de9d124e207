//! Several hosts in one URL, as libpq and MariaDB Connector/J take them:
//! `postgres://user@h1:5432,h2:5433/db?target_session_attrs=read-write`. sqlx parses one
//! host only, so the URL is split here into one single-host URL per host, and connecting
//! tries them in order. An IPv6 address is written in brackets (`[::1]:5432`), alone or
//! in the list; the brackets are the URL's, and [`unbracket`] takes them off the host
//! sqlx connects to.

use std::future::Future;
use std::time::Duration;

use sqlx::Pool;
use tracing::warn;

use crate::backend::redact;
use crate::error::Error;

/// The query parameter libpq names for "keep only a primary".
const SESSION_ATTRS: &str = "target_session_attrs";

/// One host of a URL, and the URL that names it alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    /// The host as the URL wrote it (`h1:5432`, `[::1]:5432`, `h2`), for messages.
    pub host: String,
    /// The URL with this host only and without `target_session_attrs`: what sqlx sees.
    pub url: String,
}

/// A URL split into its hosts, in the order to try them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hosts {
    /// At least one host.
    pub hosts: Vec<Host>,
    /// `target_session_attrs=read-write`: only a server that takes writes will do.
    pub read_write: bool,
}

fn invalid(url: &str, reason: impl Into<String>) -> Error {
    Error::InvalidUrl { url: redact(url), reason: reason.into() }
}

impl Hosts {
    /// Splits `url`. A URL without `://` (`sqlite:file.db`, `sqlite::memory:`) and any
    /// `sqlite://` URL is one host, unchanged; so is a single-host URL, less its
    /// `target_session_attrs`.
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let single = |url: &str| Hosts {
            hosts: vec![Host { host: String::new(), url: url.to_owned() }],
            read_write: false,
        };
        let Some((scheme, rest)) = url.split_once("://") else { return Ok(single(url)) };
        if scheme.eq_ignore_ascii_case("sqlite") {
            return Ok(single(url));
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        // A password may hold a raw ',' or '@': the host list is after the last '@'.
        let (userinfo, list) = match authority.rsplit_once('@') {
            Some((userinfo, list)) => (Some(userinfo), list),
            None => (None, authority),
        };
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        let mut read_write = false;
        let mut kept = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((SESSION_ATTRS, value)) => {
                    read_write = match value {
                        "any" => false,
                        "read-write" => true,
                        other => {
                            return Err(invalid(
                                url,
                                format!("target_session_attrs={other}: rowbus takes `any` or `read-write`"),
                            ));
                        }
                    }
                }
                _ => kept.push(pair),
            }
        }
        let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
        let names: Vec<&str> = list.split(',').collect();
        if names.len() > 1 && names.iter().any(|h| h.is_empty()) {
            return Err(invalid(url, "an empty host in the host list: write hosts as h1:port,h2:port"));
        }
        for name in &names {
            check_host(url, name)?;
        }
        let hosts = names
            .into_iter()
            .map(|host| {
                let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
                Host { host: host.to_owned(), url: format!("{scheme}://{user}{host}{path}{query}") }
            })
            .collect();
        Ok(Hosts { hosts, read_write })
    }

    /// The first of `connect(host's URL)` that succeeds, trying the hosts in order. With
    /// one host its error is returned as is; with several, [`Error::NoHost`] names each
    /// host and why it failed.
    pub(crate) async fn first<T, F, Fut>(&self, url: &str, mut connect: F) -> Result<T, Error>
    where
        F: FnMut(&str) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        if let [only] = self.hosts.as_slice() {
            return connect(&only.url).await;
        }
        let mut failures = Vec::new();
        for host in &self.hosts {
            match connect(&host.url).await {
                Ok(found) => return Ok(found),
                Err(e) => failures.push(format!("{}: {e}", host.host)),
            }
        }
        Err(Error::NoHost { url: redact(url), tried: failures.join("; ") })
    }
}

/// Refuses a host that names an IPv6 address other than as `[address]` or
/// `[address]:port`.
fn check_host(url: &str, host: &str) -> Result<(), Error> {
    let bad =
        |why: &str| invalid(url, format!("`{host}`: {why}; write an IPv6 address in brackets: [::1]:5432"));
    let Some(rest) = host.strip_prefix('[') else {
        return match host.matches(':').count() > 1 || host.contains(']') {
            true => Err(bad("an IPv6 address without brackets")),
            false => Ok(()),
        };
    };
    let Some((address, after)) = rest.split_once(']') else { return Err(bad("no closing bracket")) };
    if address.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(bad("not an IPv6 address between the brackets"));
    }
    match after.strip_prefix(':') {
        None if after.is_empty() => Ok(()),
        Some(port) if port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(bad("after the brackets only a port may follow")),
    }
}

/// The host to connect to as sqlx's options hold it: an IPv6 address without the
/// brackets its URL wrote it in (sqlx keeps them, and then looks `[::1]` up as a name,
/// which fails), any other host as it is.
pub(crate) fn unbracket(host: &str) -> Option<&str> {
    host.strip_prefix('[')?.strip_suffix(']')
}

/// [`Hosts::parse`] then [`Hosts::first`]: connects to the first host of `url` that
/// `connect` accepts, passing it the host's URL and whether the URL asks for a server that
/// takes writes.
pub(crate) async fn connect_first<T, F, Fut>(url: &str, mut connect: F) -> Result<T, Error>
where
    F: FnMut(String, bool) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let hosts = Hosts::parse(url)?;
    let read_write = hosts.read_write;
    hosts.first(url, |host| connect(host.to_owned(), read_write)).await
}

/// How often a pool on a several-host URL checks the host it opens connections to.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Keeps `pool`, opened on one host of a several-host URL, opening its connections on a
/// host that answers (and, with `read-write`, takes writes). sqlx pools take one set of
/// connect options: without this a pool whose primary died would try that host until it
/// came back, while the standby promoted in its place took writes. Every
/// [`FOLLOW_EVERY`] `healthy` checks one pooled connection; when it fails, `pick` goes
/// through the host list again and the pool's new connections go to the host it found
/// (the old host's connections fail their check before they are handed out, and go).
/// Ends when the pool is closed; until then the task holds the pool.
pub(crate) fn follow<DB, H, HF, P, PF>(pool: Pool<DB>, healthy: H, pick: P)
where
    DB: sqlx::Database,
    H: Fn(Pool<DB>) -> HF + Send + 'static,
    HF: Future<Output = bool> + Send,
    P: Fn() -> PF + Send + 'static,
    PF: Future<Output = Result<<DB::Connection as sqlx::Connection>::Options, Error>> + Send,
{
    tokio::spawn(async move {
        let closed = pool.close_event();
        let mut closed = std::pin::pin!(closed);
        loop {
            tokio::select! {
                () = &mut closed => return,
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
            let check = tokio::time::timeout(FOLLOW_EVERY * 2, healthy(pool.clone()));
            if check.await.unwrap_or(false) {
                continue;
            }
            match pick().await {
                Ok(options) => pool.set_connect_options(options),
                Err(error) => warn!(%error, "no host of the pool's URL answers; trying again"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(url: &str) -> Vec<String> {
        Hosts::parse(url).unwrap().hosts.into_iter().map(|h| h.url).collect()
    }

    #[test]
    fn splits_hosts_keeping_user_database_and_parameters() {
        let hosts = Hosts::parse(
            "postgres://u:p@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write&application_name=x",
        )
        .unwrap();
        assert!(hosts.read_write);
        let got: Vec<_> = hosts.hosts.iter().map(|h| (h.host.as_str(), h.url.as_str())).collect();
        assert_eq!(
            got,
            [
                ("h1:5432", "postgres://u:p@h1:5432/db?sslmode=disable&application_name=x"),
                ("h2:5433", "postgres://u:p@h2:5433/db?sslmode=disable&application_name=x"),
            ]
        );
    }

    #[test]
    fn ipv6_hosts_and_default_ports() {
        assert_eq!(
            urls("mysql://root@[::1]:3311,h2,[fe80::1]/test"),
            ["mysql://root@[::1]:3311/test", "mysql://root@h2/test", "mysql://root@[fe80::1]/test"]
        );
    }

    #[test]
    fn ipv6_literals_alone_and_in_a_list() {
        assert_eq!(urls("postgres://postgres@[::1]:5432/test"), ["postgres://postgres@[::1]:5432/test"]);
        assert_eq!(urls("mysql://root@[::1]:3306/test"), ["mysql://root@[::1]:3306/test"]);
        let hosts = Hosts::parse("postgres://postgres@[::1]:5432,127.0.0.1:5432/test").unwrap();
        let got: Vec<_> = hosts.hosts.iter().map(|h| (h.host.as_str(), h.url.as_str())).collect();
        assert_eq!(
            got,
            [
                ("[::1]:5432", "postgres://postgres@[::1]:5432/test"),
                ("127.0.0.1:5432", "postgres://postgres@127.0.0.1:5432/test"),
            ]
        );
        assert_eq!(
            urls("postgres://[2001:db8::2]:5433,[::ffff:127.0.0.1]/db?sslmode=disable"),
            [
                "postgres://[2001:db8::2]:5433/db?sslmode=disable",
                "postgres://[::ffff:127.0.0.1]/db?sslmode=disable"
            ]
        );
    }

    #[test]
    fn malformed_ipv6_hosts_are_refused() {
        for (url, why) in [
            ("postgres://u@::1:5432/db", "without brackets"),
            ("postgres://u@h1,::1/db", "without brackets"),
            ("postgres://u@[::1:5432/db", "no closing bracket"),
            ("postgres://u@[::1]:5432,[zz]/db", "not an IPv6 address"),
            ("mysql://u@[::1]x/db", "only a port"),
            ("mysql://u@[::1]:port/db", "only a port"),
            ("mysql://u@h1]/db", "without brackets"),
        ] {
            let e = Hosts::parse(url).unwrap_err();
            assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e}");
            assert!(e.to_string().contains(why) && e.to_string().contains("[::1]:5432"), "{url}: {e}");
        }
    }

    #[test]
    fn unbracket_takes_the_brackets_off_ipv6_hosts_only() {
        assert_eq!(unbracket("[::1]"), Some("::1"));
        assert_eq!(unbracket("[fe80::1]"), Some("fe80::1"));
        assert_eq!(unbracket("127.0.0.1"), None);
        assert_eq!(unbracket("db.example"), None);
    }

    #[test]
    fn passwords_with_special_characters_are_kept() {
        assert_eq!(
            urls("postgres://u:p%40s,s@w@h1,h2:5433/db"),
            ["postgres://u:p%40s,s@w@h1/db", "postgres://u:p%40s,s@w@h2:5433/db"]
        );
    }

    #[test]
    fn a_single_host_is_unchanged_and_sqlite_untouched() {
        for url in [
            "postgres://postgres@127.0.0.1:5432/test",
            "mariadb://root@localhost/test?ssl-mode=disabled",
            "postgres:///test",
            "sqlite://a,b.sqlite?mode=rwc",
            "sqlite::memory:",
            "sqlite:x.db",
        ] {
            let hosts = Hosts::parse(url).unwrap();
            assert_eq!(urls(url), [url]);
            assert!(!hosts.read_write);
        }
    }

    #[test]
    fn session_attrs_is_dropped_and_only_known_values_taken() {
        assert_eq!(urls("postgres://h1/db?target_session_attrs=any"), ["postgres://h1/db"]);
        assert!(Hosts::parse("postgres://h1/db?target_session_attrs=read-write").unwrap().read_write);
        let e = Hosts::parse("postgres://h1/db?target_session_attrs=standby").unwrap_err();
        assert!(e.to_string().contains("target_session_attrs=standby"), "{e}");
    }

    #[test]
    fn an_empty_host_is_refused() {
        for url in ["postgres://u@h1,,h2/db", "postgres://u@h1,/db", "mysql://,h2/db"] {
            let e = Hosts::parse(url).unwrap_err();
            assert!(e.to_string().contains("empty host"), "{url}: {e}");
        }
    }

    #[tokio::test]
    async fn first_tries_in_order_and_names_every_failure() {
        let hosts = Hosts::parse("postgres://u@a,b,c/db").unwrap();
        let mut tried = Vec::new();
        let got = hosts
            .first("postgres://u@a,b,c/db", |url| {
                tried.push(url.to_owned());
                let ok = url.contains("@b/");
                async move { if ok { Ok("b") } else { Err(Error::ListenerClosed) } }
            })
            .await
            .unwrap();
        assert_eq!(got, "b");
        assert_eq!(tried, ["postgres://u@a/db", "postgres://u@b/db"]);
        let e = hosts
            .first("postgres://u@a,b,c/db", |_| async { Err::<(), _>(Error::ListenerClosed) })
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("a: ") && text.contains("; b: ") && text.contains("; c: "), "{text}");
    }
}
