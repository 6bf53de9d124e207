//! The task that keeps a push path open: opens its source, passes on what it reports,
//! and opens it again, with capped backoff, when it is lost.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

/// A commit the push path saw that may have written the notify table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pushed {
    /// The notify table's rows it wrote, as (channel, id), where the source can tell.
    pub rows: Vec<(String, u64)>,
    /// Whether it may have written rows the source cannot name (a statement-based binary
    /// log, a changed file, a source that was away): poll to find out.
    pub unknown: bool,
}

impl Pushed {
    /// A commit of unknown rows.
    pub fn unknown() -> Self {
        Pushed { rows: Vec::new(), unknown: true }
    }

    /// Adds `other`'s rows and doubt to these.
    pub fn merge(&mut self, other: Pushed) {
        self.rows.extend(other.rows);
        self.unknown |= other.unknown;
    }
}

/// Where a push path stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushState {
    /// Opening for the first time.
    Starting,
    /// Open: commits are pushed as they happen.
    Live,
    /// The server does not allow it (a setting, a privilege): why. It is not tried again
    /// on this connection.
    Refused(String),
    /// Lost, or not opened yet for a reason that may pass: why. Opened again with backoff.
    Lost(String),
}

/// Why a source did not open.
#[derive(Debug)]
pub enum Refusal {
    /// For good on this connection (a setting or a privilege is missing): why.
    Refused(String),
    /// For now (the connection failed): why. Tried again. (The file watch fails only for
    /// good.)
    #[cfg_attr(not(feature = "binlog"), allow(dead_code))]
    Failed(String),
}

/// What reports commits: the binary log, a watch on files.
pub trait Source: Sized + Send + 'static {
    /// What it is opened on.
    type Target: Send + Sync + 'static;
    /// Opens it; from here on every commit is reported.
    fn open(target: &Self::Target) -> impl Future<Output = Result<Self, Refusal>> + Send;
    /// The next commit that may have written the notify table. An error loses the source.
    fn next(&mut self) -> impl Future<Output = Result<Pushed, String>> + Send;
}

/// A running push path, as a listener's session holds it; its task ends when it is
/// dropped.
#[derive(Debug)]
pub struct PushHandle {
    /// What it reads, in words ("the binary log").
    pub via: &'static str,
    pushed: mpsc::UnboundedReceiver<Pushed>,
    state: watch::Receiver<PushState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PushHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PushHandle {
    /// Waits for the next change of state or the next reported commit (a state first);
    /// a commit comes with every other one reported meanwhile.
    pub async fn next(&mut self) -> PushEvent {
        tokio::select! {
            biased;
            changed = self.state.changed() => {
                PushEvent::State(changed.ok().map(|()| self.state.borrow_and_update().clone()))
            }
            pushed = self.pushed.recv() => PushEvent::Pushed(pushed.map(|mut pushed| {
                while let Ok(more) = self.pushed.try_recv() {
                    pushed.merge(more);
                }
                pushed
            })),
        }
    }
}

/// What [`PushHandle::next`] returns.
#[derive(Debug, PartialEq, Eq)]
pub enum PushEvent {
    /// Its new state; `None` once its task has ended.
    State(Option<PushState>),
    /// A reported commit; `None` once its task has ended and everything was read.
    Pushed(Option<Pushed>),
}

/// Starts `S` on `target` in a task of its own: opened again after a loss, first after
/// `retry_min`, the wait doubling up to `retry_max`. Each time it opens (the first time
/// too) it reports a commit of unknown rows, so that the session polls once for what was
/// committed while it was not open.
pub fn spawn<S: Source>(
    via: &'static str,
    target: S::Target,
    retry_min: Duration,
    retry_max: Duration,
) -> PushHandle {
    let (pushed_tx, pushed) = mpsc::unbounded_channel();
    let (state_tx, state) = watch::channel(PushState::Starting);
    let task = tokio::spawn(async move {
        let mut delay = retry_min;
        loop {
            match S::open(&target).await {
                Ok(mut source) => {
                    delay = retry_min;
                    state_tx.send_replace(PushState::Live);
                    if pushed_tx.send(Pushed::unknown()).is_err() {
                        return;
                    }
                    let error = loop {
                        match source.next().await {
                            Ok(pushed) => {
                                if pushed_tx.send(pushed).is_err() {
                                    return;
                                }
                            }
                            Err(error) => break error,
                        }
                    };
                    state_tx.send_replace(PushState::Lost(error));
                }
                Err(Refusal::Refused(reason)) => {
                    state_tx.send_replace(PushState::Refused(reason));
                    return;
                }
                Err(Refusal::Failed(error)) => {
                    state_tx.send_replace(PushState::Lost(error));
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(retry_max);
        }
    });
    PushHandle { via, pushed, state, task }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Fails to open once, then reports two commits and is lost, then opens again.
    struct Flaky;

    static OPENS: AtomicU32 = AtomicU32::new(0);

    impl Source for Flaky {
        type Target = Arc<AtomicU32>;
        async fn open(next: &Arc<AtomicU32>) -> Result<Self, Refusal> {
            match OPENS.fetch_add(1, Ordering::SeqCst) {
                0 => Err(Refusal::Failed("down".into())),
                3 => Err(Refusal::Refused("no grant".into())),
                _ => {
                    next.store(0, Ordering::SeqCst);
                    Ok(Flaky)
                }
            }
        }
        async fn next(&mut self) -> Result<Pushed, String> {
            tokio::task::yield_now().await;
            Err("lost".into())
        }
    }

    /// A source that fails, opens, is lost, opens again and is then refused reports a
    /// poll at each opening and says each state, ending refused.
    #[tokio::test]
    async fn a_lost_source_is_opened_again_and_each_opening_asks_for_a_poll() {
        let ms = Duration::from_millis(1);
        let mut handle = spawn::<Flaky>("a test", Arc::default(), ms, ms * 4);
        let mut states = Vec::new();
        let mut pushes = Vec::new();
        loop {
            match handle.next().await {
                PushEvent::State(Some(state)) => states.push(state),
                PushEvent::Pushed(Some(pushed)) => pushes.push(pushed),
                PushEvent::State(None) | PushEvent::Pushed(None) => break,
            }
        }
        let lost = |why: &str| PushState::Lost(why.into());
        // A watch shows the latest state: quick changes may fold, but the end is there.
        assert_eq!(states.last(), Some(&PushState::Refused("no grant".into())));
        assert!(states.iter().all(|s| [lost("down"), lost("lost"), PushState::Live].contains(s)
            || matches!(s, PushState::Refused(_))));
        while let PushEvent::Pushed(Some(pushed)) = handle.next().await {
            pushes.push(pushed);
        }
        // One report per opening (two), some maybe folded together.
        assert!(!pushes.is_empty() && pushes.len() <= 2 && pushes.iter().all(|p| *p == Pushed::unknown()));
        assert_eq!(OPENS.load(Ordering::SeqCst), 4);
    }
}
