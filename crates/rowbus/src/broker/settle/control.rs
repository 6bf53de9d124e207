//! What a runner tells a running handler: its message was cancelled, its time ran out, or
//! its lease was lost. One [`Control`] per claimed message, shared by its delivery and the
//! runner; the handler reads it through
//! [`Delivery`](crate::broker::Delivery)'s methods.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Why a running handler is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Its message was cancelled ([`Queue::cancel`](crate::broker::Queue::cancel)): it is
    /// gone from the queue, and whatever the handler returns is not applied.
    Cancelled,
    /// It ran longer than its timeout ([`Message::timeout`](crate::broker::Message::timeout),
    /// or the subscription's): the attempt fails with "timed out after ..." as its error.
    TimedOut(Duration),
}

/// What a runner has signalled about one message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Signals {
    stop: Option<StopReason>,
    lease_lost: bool,
}

/// The signals of one claimed message (cheap to clone: shared).
#[derive(Debug, Clone)]
pub(crate) struct Control(Arc<watch::Sender<Signals>>);

impl Default for Control {
    fn default() -> Self {
        Control(Arc::new(watch::Sender::new(Signals::default())))
    }
}

impl Control {
    /// Asks the handler to stop, for `reason`, unless an earlier reason did: whether this
    /// one is now the reason.
    pub fn stop(&self, reason: StopReason) -> bool {
        self.0.send_if_modified(|s| {
            if s.stop.is_some() {
                return false;
            }
            s.stop = Some(reason);
            true
        })
    }

    /// Tells the handler its lease was lost.
    pub fn lose_lease(&self) {
        self.0.send_if_modified(|s| !std::mem::replace(&mut s.lease_lost, true));
    }

    /// Why the handler is asked to stop, if it is.
    pub fn reason(&self) -> Option<StopReason> {
        self.0.borrow().stop
    }

    /// Whether the lease was found lost.
    pub fn is_lease_lost(&self) -> bool {
        self.0.borrow().lease_lost
    }

    /// Resolves once the handler is asked to stop; with the reason.
    pub async fn stopped(&self) -> StopReason {
        let mut rx = self.0.subscribe();
        let signals = rx.wait_for(|s| s.stop.is_some()).await.map(|s| *s);
        // The sender lives as long as `self`: the wait cannot end without a value.
        signals.ok().and_then(|s| s.stop).unwrap_or(StopReason::Cancelled)
    }

    /// Resolves once the lease is found lost.
    pub async fn lease_lost(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|s| s.lease_lost).await;
    }
}
