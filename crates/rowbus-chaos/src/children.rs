//! The consumer processes of a broker scenario: children of this very binary
//! (`rowbus-chaos consumer`), SIGKILLed and restarted at will. A child stops by itself
//! when its stdin closes, so none outlives the driver.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::BoxError;
use super::time::now_us;

/// How to start consumer number `proc`.
#[derive(Debug, Clone)]
pub(crate) struct Spawner {
    pub url: String,
    pub prefix: String,
    pub run_id: i64,
    pub workers: usize,
    pub lease: Duration,
    pub transactional: bool,
    pub dir: PathBuf,
    /// The longest a child lives, whatever happens.
    pub max_life: Duration,
}

/// The journal of one incarnation of one consumer.
pub(crate) fn journal_path(dir: &Path, proc: i64, incarnation: i64) -> PathBuf {
    dir.join(format!("consumer-{proc}-{incarnation}.journal"))
}

/// Parses a journal's file name back into (proc, incarnation).
pub(crate) fn parse_journal_name(name: &str) -> Option<(i64, i64)> {
    let rest = name.strip_prefix("consumer-")?.strip_suffix(".journal")?;
    let (proc, incarnation) = rest.split_once('-')?;
    Some((proc.parse().ok()?, incarnation.parse().ok()?))
}

impl Spawner {
    fn spawn(&self, proc: i64, incarnation: i64) -> Result<Child, BoxError> {
        let log = std::fs::File::create(self.dir.join(format!("consumer-{proc}-{incarnation}.log")))?;
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg("consumer")
            .args(["--prefix", &self.prefix])
            .args(["--run-id", &self.run_id.to_string()])
            .args(["--proc", &proc.to_string()])
            .args(["--incarnation", &incarnation.to_string()])
            .args(["--workers", &self.workers.to_string()])
            .args(["--lease-ms", &self.lease.as_millis().to_string()])
            .args(["--max-secs", &self.max_life.as_secs().max(1).to_string()])
            .arg("--journal")
            .arg(journal_path(&self.dir, proc, incarnation))
            // Several hosts (a Galera cluster's nodes): consumer i starts on the i-th.
            .env("DATABASE_URL", super::galera::rotate_hosts(&self.url, usize::try_from(proc).unwrap_or(0)))
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if self.transactional {
            command.arg("--transactional");
        }
        Ok(command.spawn()?)
    }
}

/// One consumer process and how often it was started.
#[derive(Debug)]
struct Running {
    proc: i64,
    incarnation: i64,
    child: Child,
}

/// The consumer processes of a run.
#[derive(Debug)]
pub(crate) struct Consumers {
    spawner: Spawner,
    running: Vec<Running>,
    /// (proc, incarnation, when) of every SIGKILL.
    pub killed: Vec<(i64, i64, i64)>,
    /// (proc, incarnation, exit status) of every child that exited by itself mid-run.
    pub crashed: Vec<(i64, i64, String)>,
}

impl Consumers {
    pub(crate) fn start(spawner: Spawner, count: usize) -> Result<Self, BoxError> {
        let mut running = Vec::with_capacity(count);
        for proc in 0..count as i64 {
            running.push(Running { proc, incarnation: 1, child: spawner.spawn(proc, 1)? });
        }
        Ok(Consumers { spawner, running, killed: Vec::new(), crashed: Vec::new() })
    }

    /// (proc, incarnation) of consumer `index` now.
    pub(crate) fn current(&self, index: usize) -> (i64, i64) {
        let r = &self.running[index];
        (r.proc, r.incarnation)
    }

    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    /// SIGKILLs consumer `index` and starts its next incarnation at once.
    pub(crate) async fn sigkill_and_restart(&mut self, index: usize) -> Result<(), BoxError> {
        let r = &mut self.running[index];
        let at = now_us();
        r.child.kill().await?;
        self.killed.push((r.proc, r.incarnation, at));
        r.incarnation += 1;
        r.child = self.spawner.spawn(r.proc, r.incarnation)?;
        Ok(())
    }

    /// Restarts any consumer that exited by itself (a crash: recorded).
    pub(crate) fn restart_exited(&mut self) -> Result<(), BoxError> {
        for r in &mut self.running {
            if let Some(status) = r.child.try_wait()? {
                self.crashed.push((r.proc, r.incarnation, status.to_string()));
                r.incarnation += 1;
                r.child = self.spawner.spawn(r.proc, r.incarnation)?;
            }
        }
        Ok(())
    }

    /// Closes every child's stdin (a graceful shutdown) and waits for them; SIGKILLs what
    /// is still running after `deadline`. A child that exits non-zero counts as crashed.
    pub(crate) async fn stop(&mut self, deadline: Duration) -> Result<(), BoxError> {
        for r in &mut self.running {
            drop(r.child.stdin.take());
        }
        for r in &mut self.running {
            match tokio::time::timeout(deadline, r.child.wait()).await {
                Ok(status) => {
                    let status = status?;
                    if !status.success() {
                        self.crashed.push((r.proc, r.incarnation, status.to_string()));
                    }
                }
                Err(_) => {
                    r.child.kill().await?;
                    self.crashed.push((r.proc, r.incarnation, "did not stop within its deadline".into()));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_names() {
        let path = journal_path(Path::new("/tmp/x"), 1, 12);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_journal_name(name), Some((1, 12)));
        assert_eq!(parse_journal_name("consumer-1-12.log"), None);
    }
}
