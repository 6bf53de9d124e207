//! `rowbus consume --exec CMD`: one message's command, run as `sh -c CMD` in a process
//! group of its own, and what its end came to.
//!
//! The attempt ends when the command (the shell) exits, not when the last process holding
//! its stderr closes it. What it left running in its group is then stopped (SIGTERM, and
//! SIGKILL after --grace) before the message is settled; a command asked to stop (a
//! cancel, a timeout) gets SIGTERM, its whole group SIGKILL after --grace, and the attempt
//! ends once none of the group is left. So an attempt is over, all of it, before the
//! message can run again.

use std::io::Write as _;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowbus::{Db, Delivery};
use tokio::io::AsyncWriteExt as _;

use crate::consume::Shared;
use crate::group::{Group, Rest, Signal};
use crate::queue_cmd;

/// What running the command on a message came to.
pub(crate) enum Ran {
    /// Exit status 0.
    Ok,
    /// Anything else, and why.
    Failed(String),
    /// Killed by a signal while the consumer was stopping: not the message's fault.
    Stopped,
    /// Exit status [`SNOOZE_STATUS`]: not now, later.
    Snoozed,
    /// Exit status 127 or 126: the shell found no command to run, or could not run it.
    /// Not the message's fault: why, in a sentence.
    CannotRun(String),
}

/// The shell's exit status for a command it did not find (127) and one it found but
/// could not run (126, not executable), as POSIX sets them.
const NOT_FOUND: i32 = 127;
const NOT_EXECUTABLE: i32 = 126;

/// The exit status by which an --exec command snoozes its message: EX_TEMPFAIL of
/// sysexits.h, "try again later".
pub(crate) const SNOOZE_STATUS: i32 = 75;

/// How long the rest of a command's stderr is waited for once its group is gone: a process
/// that left the group (`setsid`) may hold it open; the output still passes through.
const STDERR_LINGER: Duration = Duration::from_millis(200);

/// The W3C trace context the message's publisher wrote into its headers, as the
/// environment variables OpenTelemetry's SDKs read it from (`TRACEPARENT`, `TRACESTATE`):
/// the command's spans then join the publisher's trace, as children of its publish span.
fn trace_context<DB: Db>(d: &Delivery<DB>) -> Vec<(&'static str, String)> {
    [("TRACEPARENT", rowbus::telemetry::TRACEPARENT), ("TRACESTATE", rowbus::telemetry::TRACESTATE)]
        .into_iter()
        .filter_map(|(variable, header)| Some((variable, d.header(header)?.to_owned())))
        .collect()
}

/// Runs `sh -c CMD` with the payload on stdin, extending the message's lease while it
/// runs; returns once the command has exited and nothing of its process group is left.
pub(crate) async fn execute<DB: Db>(shared: &Shared, d: &Delivery<DB>) -> Ran {
    let command = shared.exec.as_deref().unwrap_or_default();
    let mut spawned = tokio::process::Command::new("sh");
    spawned
        .arg("-c")
        .arg(command)
        .env("ROWBUS_TABLE", d.queue().table().channel())
        .env("ROWBUS_GROUP", d.group())
        .env("ROWBUS_ID", d.id().to_string())
        .env("ROWBUS_ATTEMPT", d.attempt().to_string())
        .envs(trace_context(d))
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A group of its own: a Ctrl-C at the terminal reaches rowbus only, which lets the
    // command finish within the shutdown timeout; and what it forks can be found again.
    #[cfg(unix)]
    spawned.process_group(0);
    let mut child = match spawned.spawn() {
        Ok(child) => child,
        Err(e) => return Ran::Failed(format!("cannot run `sh -c {command}`: {e}")),
    };
    let Some(pid) = child.id() else {
        return Ran::Failed(format!("`sh -c {command}` exited before it could be watched"));
    };
    let mut group = Group::new(pid, shared.reaper.as_ref());
    let tail = Tail::default();
    let stderr = child.stderr.take().map(|stderr| tokio::spawn(stderr_tail(stderr, tail.clone())));
    let payload = d.payload().to_vec();
    let stdin = child.stdin.take();
    // A command that does not read its stdin is fine: the broken pipe is ignored. Apart,
    // so that a command that exits without reading never holds the attempt.
    let feed = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            let _ = stdin.write_all(&payload).await;
        }
    });
    let lease = shared.lease.unwrap_or(Duration::MAX);
    let mut every = tokio::time::interval((lease / 3).max(Duration::from_millis(10)));
    every.tick().await;
    let mut told = false;
    let status = loop {
        let kill_due = group.kill_due(shared.grace);
        tokio::select! {
            status = child.wait() => break status,
            reason = d.cancelled(), if !told => {
                // Asked to stop: SIGTERM to the group now, SIGKILL after the grace period.
                told = true;
                eprintln!("rowbus: message {}: {}; sending SIGTERM to `{command}`", d.id(), stopped(reason));
                group.signal(Signal::Term);
            }
            () = sleep_until(kill_due) => {
                eprintln!(
                    "rowbus: message {}: `{command}` did not stop within the grace period ({}); sending SIGKILL \
                     to its process group",
                    d.id(),
                    queue_cmd::human(shared.grace)
                );
                group.signal(Signal::Kill);
            }
            _ = every.tick(), if shared.lease.is_some() => {
                if let Err(e) = d.extend_lease(lease).await {
                    eprintln!("rowbus: warning: {}", crate::one_line(&e));
                }
            }
        }
    };
    feed.abort();
    let status = match status {
        Ok(status) => status,
        // Its group is killed as the guard goes.
        Err(e) => return Ran::Failed(format!("waiting for `{command}` failed: {e}")),
    };
    let left = group.left();
    if left > 0 {
        let rest = group.stop_rest(shared.grace).await;
        eprintln!("rowbus: message {}: {}", d.id(), left_behind(command, &status, left, rest, shared.grace));
    }
    let tail = match stderr {
        Some(mut task) => match tokio::time::timeout(STDERR_LINGER, &mut task).await {
            Ok(_) => tail.text(),
            Err(_) => {
                // Held open by a process outside the group: read on by itself.
                drop(task);
                tail.text()
            }
        },
        None => String::new(),
    };
    match status {
        status if status.success() => Ran::Ok,
        status if status.code() == Some(SNOOZE_STATUS) => Ran::Snoozed,
        status if signalled(&status) && shared.stopping.load(Ordering::Acquire) => Ran::Stopped,
        status if matches!(status.code(), Some(NOT_FOUND | NOT_EXECUTABLE)) => {
            let what = match status.code() {
                Some(NOT_FOUND) => "command not found",
                _ => "command not executable",
            };
            let said = if tail.is_empty() { String::new() } else { format!(": {tail}") };
            let code = status.code().unwrap_or_default();
            Ran::CannotRun(format!("--exec `{command}` cannot run ({what}, exit status {code}{said})"))
        }
        status if tail.is_empty() => Ran::Failed(format!("`{command}` {}", describe(&status))),
        status => Ran::Failed(format!("`{command}` {}; its stderr ended: {tail}", describe(&status))),
    }
}

/// Sleeps until `due`, or for ever.
async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// The line that says what a command left running in its process group, and what
/// stopping it came to.
fn left_behind(command: &str, status: &ExitStatus, left: usize, rest: Rest, grace: Duration) -> String {
    let processes = if left == 1 { "1 process" } else { &format!("{left} processes") };
    let what = format!("`{command}` {} and left {processes} running in its process group", describe(status));
    match rest {
        Rest::None | Rest::Stopped(Signal::Term) => format!("{what}: stopped with SIGTERM"),
        Rest::Stopped(Signal::Kill) => {
            format!(
                "{what}: killed with SIGKILL, not having stopped within {} of SIGTERM",
                queue_cmd::human(grace)
            )
        }
        Rest::Stuck(n) => format!("{what}: {n} still there after SIGKILL, given up on"),
    }
}

/// The last [`STDERR_TAIL`] bytes of a command's stderr, shared with its reader.
#[derive(Clone, Default)]
struct Tail(Arc<Mutex<std::collections::VecDeque<u8>>>);

impl Tail {
    /// Adds `bytes`, keeping the last [`STDERR_TAIL`].
    fn add(&self, bytes: &[u8]) {
        let mut tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tail.extend(bytes);
        let excess = tail.len().saturating_sub(STDERR_TAIL);
        tail.drain(..excess);
    }

    /// What it holds, as text, trimmed.
    fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: Vec<u8> = tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes).trim().to_owned()
    }
}

/// How much of a failed command's stderr its message's last error keeps: enough to act on.
const STDERR_TAIL: usize = 2048;

/// Passes a command's stderr through to ours as it comes, keeping its last
/// [`STDERR_TAIL`] bytes in `tail`, which a failure records.
async fn stderr_tail(mut stderr: tokio::process::ChildStderr, tail: Tail) {
    use tokio::io::AsyncReadExt as _;
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = stderr.read(&mut chunk).await {
        // Our stderr is a terminal or a pipe a line at a time: writing it in place is fine.
        let _ = std::io::stderr().lock().write_all(&chunk[..n]);
        tail.add(&chunk[..n]);
    }
}

/// Why a running message's handler was told to stop, for its stderr line.
fn stopped(reason: rowbus::control::StopReason) -> String {
    match reason {
        rowbus::control::StopReason::TimedOut(after) => {
            format!("timed out after {}", queue_cmd::human(after))
        }
        _ => "cancelled".to_owned(),
    }
}

/// How a command ended: `exited with status 3`, `was killed by signal 9`.
fn describe(status: &ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => format!("ended with {status}"),
    }
}

/// Whether the process was ended by a signal.
fn signalled(status: &ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        status.signal().is_some()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}
