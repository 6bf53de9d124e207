//! [`Until`]: the future that stops a runner early
//! ([`SubscriptionBuilder::until`](crate::broker::SubscriptionBuilder::until)), which the
//! runner's claim loop waits on and each of its workers checks between two messages.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use futures::future::BoxFuture;

/// A stop future that one task waits on and any may check at once, each seeing the same
/// answer: whoever asks polls the future itself, one at a time, so an answer never depends
/// on another poll being under way. (A `futures::Shared` clone answers `Pending` while
/// another clone is being polled, even when that poll is about to find the future done: a
/// worker asking then would start one more message after the stop.)
#[derive(Clone)]
pub(crate) struct Until(Arc<Inner>);

struct Inner {
    /// The future, until it has resolved.
    future: Mutex<Option<BoxFuture<'static, ()>>>,
    /// Wakes the task waiting in [`Until::wait`], whoever's poll registered the wake-up.
    waiter: Arc<Waiter>,
}

/// The waker of the task waiting on an [`Until`], which the future's own wake-up wakes.
#[derive(Default)]
struct Waiter(Mutex<Option<Waker>>);

impl Wake for Waiter {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waker = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl std::fmt::Debug for Until {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Until(..)")
    }
}

impl Until {
    /// `stop`, to be waited on by one task and checked by any.
    pub fn new(stop: impl Future<Output = ()> + Send + 'static) -> Self {
        Until(Arc::new(Inner { future: Mutex::new(Some(Box::pin(stop))), waiter: Arc::default() }))
    }

    /// Whether the future has resolved: polls it once if it had not, after any poll under
    /// way elsewhere has returned.
    pub fn resolved(&self) -> bool {
        self.poll(None)
    }

    /// Resolves once the future has. One task at a time waits here: a second waiting task
    /// takes the wake-ups from the first.
    pub async fn wait(&self) {
        std::future::poll_fn(|cx| if self.poll(Some(cx.waker())) { Poll::Ready(()) } else { Poll::Pending })
            .await;
    }

    /// Polls the future unless it has resolved; `waiter`, if given, is woken when it may
    /// have. The future is always polled with the [`Waiter`]'s waker, so that a check by
    /// a worker does not take the waiting task's wake-up away.
    fn poll(&self, waiter: Option<&Waker>) -> bool {
        let mut future = self.0.future.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(stop) = future.as_mut() else { return true };
        if let Some(waker) = waiter {
            *self.0.waiter.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
        }
        let waker = Waker::from(self.0.waiter.clone());
        match stop.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(()) => {
                *future = None;
                true
            }
            Poll::Pending => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use futures::FutureExt as _;

    use super::*;

    #[test]
    fn a_check_while_another_poll_runs_waits_for_its_answer() {
        let polling = Arc::new(AtomicBool::new(false));
        let inside = polling.clone();
        let until = Until::new(async move {
            // Ready at once; the poll that finds it so takes 200 ms.
            inside.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
        });
        let waiting = until.clone();
        let waiter = std::thread::spawn(move || waiting.wait().now_or_never().is_some());
        while !polling.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // The other thread is inside the poll that resolves the future.
        assert!(until.resolved(), "a check during that poll learns that it resolved");
        assert!(waiter.join().unwrap());
    }

    #[tokio::test]
    async fn a_check_does_not_take_the_waiting_tasks_wake_up() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let until = Until::new(async move {
            let _ = rx.await;
        });
        let waiting = until.clone();
        let waiter = tokio::spawn(async move { waiting.wait().await });
        tokio::task::yield_now().await;
        // Polled by a check with no waiter of its own, after the task began waiting.
        assert!(!until.resolved());
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiting task is woken")
            .unwrap();
        assert!(until.resolved());
    }

    #[test]
    fn it_stays_resolved() {
        let until = Until::new(async {});
        assert!(until.resolved());
        assert!(until.resolved());
        assert!(until.wait().now_or_never().is_some());
    }
}
