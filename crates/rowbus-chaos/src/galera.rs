//! `--galera-faults`: the URL lists the nodes of the Galera cluster of scripts/galera.sh
//! (`mysql://root@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/test`). Consumer `i`
//! starts on node `i` (the URL's host list turned so that its node comes first and the
//! others are where its pools go when that node dies), and every `--crash-every` one node
//! in turn is SIGKILLed and started again through the script, which waits until it has
//! rejoined and synced.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::BoxError;

/// The cluster's nodes, as scripts/galera.sh numbers them, in the URL's order.
#[derive(Debug)]
pub(crate) struct Galera {
    nodes: Vec<u16>,
    next: usize,
}

/// The host list of a `scheme://[userinfo@]h1,h2,.../rest` URL: (before the list, the
/// hosts, after the list).
fn split(url: &str) -> Option<(&str, Vec<&str>, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let start = rest[..end].rfind('@').map_or(0, |at| at + 1);
    let prefix = &url[..scheme.len() + 3 + start];
    Some((prefix, rest[start..end].split(',').collect(), &rest[end..]))
}

/// `url` with its host list turned left by `by` (consumer `by` starts on its own node).
pub(crate) fn rotate_hosts(url: &str, by: usize) -> String {
    let Some((prefix, mut hosts, tail)) = split(url) else { return url.to_owned() };
    let n = hosts.len();
    hosts.rotate_left(by % n);
    format!("{prefix}{}{tail}", hosts.join(","))
}

/// `url` with `user:password` as its user information.
pub(crate) fn with_user(url: &str, user: &str, password: &str) -> Result<String, BoxError> {
    let (prefix, hosts, tail) = split(url).ok_or("a URL of the form mysql://h1,h2/db")?;
    let scheme = prefix.split_once("://").map_or("mysql", |(s, _)| s);
    Ok(format!("{scheme}://{user}:{password}@{}{tail}", hosts.join(",")))
}

/// Whether `url` lists several hosts.
pub(crate) fn several_hosts(url: &str) -> bool {
    split(url).is_some_and(|(_, hosts, _)| hosts.len() > 1)
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/galera.sh")
}

async fn galera(args: &[&str]) -> Result<(), BoxError> {
    let out = Command::new(script()).args(args).stdin(Stdio::null()).output().await?;
    if !out.status.success() {
        return Err(format!(
            "scripts/galera.sh {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

impl Galera {
    /// The cluster `url` names (each host one of scripts/galera.sh's ports, 3311-3313),
    /// brought up (the script does nothing when all nodes run).
    pub(crate) async fn new(url: &str) -> Result<Self, BoxError> {
        let (_, hosts, _) = split(url).ok_or("--galera-faults needs a mysql:// URL")?;
        let mut nodes = Vec::new();
        for host in hosts {
            let port: u16 = host.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(0);
            if !(3311..=3313).contains(&port) {
                return Err(format!(
                    "--galera-faults: {host} is not a node of scripts/galera.sh (127.0.0.1:3311-3313)"
                )
                .into());
            }
            nodes.push(port - 3310);
        }
        if nodes.len() < 2 {
            return Err("--galera-faults needs the URL to list the cluster's nodes: mysql://root@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/test".into());
        }
        galera(&["up"]).await?;
        Ok(Galera { nodes, next: 0 })
    }

    /// SIGKILLs the next node in turn, leaves it down for a second, starts it again and
    /// waits until it has rejoined. Returns the node.
    pub(crate) async fn crash_next(&mut self) -> Result<u16, BoxError> {
        let node = self.nodes[self.next % self.nodes.len()];
        self.next += 1;
        let n = node.to_string();
        galera(&["kill", &n]).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        galera(&["start", &n]).await?;
        Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_turn_and_users_change_in_a_several_host_url() {
        let url = "mysql://root@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/test?x=1";
        assert_eq!(
            rotate_hosts(url, 1),
            "mysql://root@127.0.0.1:3312,127.0.0.1:3313,127.0.0.1:3311/test?x=1"
        );
        assert_eq!(rotate_hosts(url, 3), url);
        assert_eq!(
            with_user(url, "u", "p").unwrap(),
            "mysql://u:p@127.0.0.1:3311,127.0.0.1:3312,127.0.0.1:3313/test?x=1"
        );
        assert_eq!(with_user("mysql://h1,h2/db", "u", "p").unwrap(), "mysql://u:p@h1,h2/db");
        assert!(several_hosts(url));
        assert!(!several_hosts("mysql://root@127.0.0.1:3306/test"));
    }
}
