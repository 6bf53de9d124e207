//! The process group of an `--exec` command: signalled as a whole, watched until none of
//! its processes is left, and handed to a reaper that stops it should `rowbus consume`
//! itself die without doing so (SIGKILL, a crash).
//!
//! A command runs as `sh -c CMD` in a group of its own, so that what it forks (`job &`,
//! a script's children) can be found again: the group's id is the shell's pid. Its exit
//! ends the attempt; what it left running in its group is stopped then (SIGTERM, SIGKILL
//! after the grace period) before the message is settled, so that no attempt outlives
//! the next one. A process that leaves the group on purpose (`setsid`) is not ours to stop.

use std::io::Write as _;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often a group is looked at while its processes are waited for.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// How long processes sent SIGKILL are waited for before they are given up on: SIGKILL
/// cannot be caught, only a process stuck in the kernel (a dead NFS mount) outlasts it.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// A signal, by the name `kill -l` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGTERM: asked to stop.
    Term,
    /// SIGKILL: stopped.
    Kill,
}

/// Sends `signal` to every process of group `pgid`; false when none is left.
#[cfg(unix)]
#[allow(unsafe_code)]
fn signal_group(pgid: u32, signal: Option<Signal>) -> bool {
    let number = match signal {
        None => 0,
        Some(Signal::Term) => libc::SIGTERM,
        Some(Signal::Kill) => libc::SIGKILL,
    };
    let Ok(pgid) = libc::pid_t::try_from(pgid) else { return false };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) takes two integers and reads no memory of ours; a negative pid
    // names the process group.
    let sent = unsafe { libc::kill(-pgid, number) } == 0;
    sent || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(not(unix))]
fn signal_group(_pgid: u32, _signal: Option<Signal>) -> bool {
    false
}

/// The live (not zombie) processes of group `pgid`. On Linux read from /proc: a process
/// that exited after its parent did waits as a zombie until whatever adopted it reaps it,
/// which in a container may be never. Elsewhere, whether the group has any process at all.
fn members(pgid: u32) -> usize {
    #[cfg(target_os = "linux")]
    if let Ok(dir) = std::fs::read_dir("/proc") {
        let mut live = 0;
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // `pid (comm) state ppid pgrp ...`: comm may hold spaces and parentheses.
            let Some(after) = stat.rfind(')').map(|at| &stat[at + 1..]) else { continue };
            let mut fields = after.split_whitespace();
            let state = fields.next();
            let pgrp = fields.nth(1).and_then(|p| p.parse::<u32>().ok());
            if pgrp == Some(pgid) && !matches!(state, Some("Z" | "X" | "x")) {
                live += 1;
            }
        }
        return live;
    }
    usize::from(signal_group(pgid, None))
}

/// A command's process group while it may have processes: signalled as a whole, and
/// killed when dropped (a handler aborted at the shutdown deadline) unless seen empty.
pub(crate) struct Group<'r> {
    /// The group's id: the command's pid.
    pgid: u32,
    /// Told of the group while it lives.
    reaper: Option<&'r Reaper>,
    /// When SIGTERM went to the group.
    termed: Option<Instant>,
    /// When SIGKILL went to the group.
    killed: Option<Instant>,
    /// Whether the group was seen empty: never signalled again (its id may be reused).
    gone: bool,
}

/// What stopping the processes a command left behind came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rest {
    /// None was left.
    None,
    /// Some were left and are gone now; by the last signal they were sent.
    Stopped(Signal),
    /// Some outlasted SIGKILL and [`KILL_WAIT`]: given up on.
    Stuck(usize),
}

impl<'r> Group<'r> {
    /// The group of the command whose pid is `pgid`, told to `reaper`.
    pub(crate) fn new(pgid: u32, reaper: Option<&'r Reaper>) -> Self {
        if let Some(reaper) = reaper {
            reaper.tell('+', pgid);
        }
        Group { pgid, reaper, termed: None, killed: None, gone: false }
    }

    /// Sends `signal` to the group (once each).
    pub(crate) fn signal(&mut self, signal: Signal) {
        if self.gone {
            return;
        }
        match signal {
            Signal::Term if self.termed.is_none() => self.termed = Some(Instant::now()),
            Signal::Kill if self.killed.is_none() => self.killed = Some(Instant::now()),
            _ => return,
        }
        signal_group(self.pgid, Some(signal));
    }

    /// When SIGKILL is due: `grace` after SIGTERM (`None` before SIGTERM or after SIGKILL).
    pub(crate) fn kill_due(&self, grace: Duration) -> Option<Instant> {
        match (self.termed, self.killed) {
            (Some(termed), None) => Some(termed + grace),
            _ => None,
        }
    }

    /// Once the command has exited: how many of its group's processes are left (none:
    /// the group is never signalled again, as its id may be reused).
    pub(crate) fn left(&mut self) -> usize {
        let left = if self.gone { 0 } else { members(self.pgid) };
        if left == 0 {
            self.empty();
        }
        left
    }

    /// Once the command has exited: stops what it left in its group (SIGTERM unless sent
    /// already, SIGKILL `grace` after it) and waits until none is left, at most
    /// [`KILL_WAIT`] after SIGKILL.
    pub(crate) async fn stop_rest(&mut self, grace: Duration) -> Rest {
        if self.left() == 0 {
            return Rest::None;
        }
        self.signal(Signal::Term);
        loop {
            tokio::time::sleep(LOOK_EVERY).await;
            let left = members(self.pgid);
            if left == 0 {
                self.empty();
                return Rest::Stopped(if self.killed.is_some() { Signal::Kill } else { Signal::Term });
            }
            if self.kill_due(grace).is_some_and(|due| Instant::now() >= due) {
                self.signal(Signal::Kill);
            }
            if self.killed.is_some_and(|at| at.elapsed() >= KILL_WAIT) {
                return Rest::Stuck(left);
            }
        }
    }

    /// The group was seen empty.
    fn empty(&mut self) {
        if self.gone {
            return;
        }
        self.gone = true;
        if let Some(reaper) = self.reaper {
            reaper.tell('-', self.pgid);
        }
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if !self.gone {
            signal_group(self.pgid, Some(Signal::Kill));
            self.gone = true;
            if let Some(reaper) = self.reaper {
                reaper.tell('-', self.pgid);
            }
        }
    }
}

/// The reaper's script: reads `+PGID` and `-PGID` lines (a group to watch, a group gone);
/// at the end of its input, which comes when `rowbus consume` exits however it exits,
/// sends SIGTERM to every group still listed, then SIGKILL after `$1` seconds.
const REAPER: &str = r#"trap '' INT HUP
live=' '
while IFS= read -r line; do
  case $line in
    +*) live="$live${line#+} " ;;
    -*) g=${line#-}; case $live in *" $g "*) live="${live%%" $g "*} ${live#*" $g "}" ;; esac ;;
  esac
done
case $live in *[0-9]*) ;; *) exit 0 ;; esac
for g in $live; do kill -TERM "-$g" 2>/dev/null; done
sleep "$1"
for g in $live; do kill -KILL "-$g" 2>/dev/null; done
"#;

/// A process of its own that stops the commands' process groups should `rowbus consume`
/// die without doing so: it learns of each group through a pipe, and the pipe's end (the
/// kernel closes it with the process, even on SIGKILL) tells it to stop what is left. A
/// parent-death signal would reach the command's shell only, not what it forked.
pub(crate) struct Reaper {
    /// Its stdin, and the process (never waited for: it outlives us by design).
    pipe: Mutex<Option<(ChildStdin, Child)>>,
}

impl Reaper {
    /// Starts the reaper; the groups it stops at our death get `grace` between SIGTERM and
    /// SIGKILL. `None`, said once on stderr, when it cannot start.
    pub(crate) fn start(grace: Duration) -> Option<Reaper> {
        let mut command = Command::new("sh");
        command
            .args(["-c", REAPER, "rowbus-reaper", &format!("{:.3}", grace.as_secs_f64())])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Out of our process group: a Ctrl-C at the terminal is ours to handle, not its.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        match command.spawn() {
            Ok(mut child) => {
                let stdin = child.stdin.take()?;
                Some(Reaper { pipe: Mutex::new(Some((stdin, child))) })
            }
            Err(e) => {
                eprintln!(
                    "rowbus: warning: cannot start the process that stops --exec commands should rowbus die: {e}"
                );
                None
            }
        }
    }

    /// Sends `+PGID` or `-PGID`; a reaper gone (killed by someone) is said once.
    fn tell(&self, op: char, pgid: u32) {
        let mut pipe = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        let Some((stdin, _)) = pipe.as_mut() else { return };
        if let Err(e) = writeln!(stdin, "{op}{pgid}") {
            eprintln!(
                "rowbus: warning: the process that stops --exec commands should rowbus die is gone ({e}); \
                 commands running when rowbus is killed may outlive it"
            );
            *pipe = None;
        }
    }
}
