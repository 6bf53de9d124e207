//! What the sink tests send, and sinks wrapped around a broker's for a test: one that
//! stalls after so many messages.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rowbus_relay::sink::{Outgoing, Sink, SinkError};

/// A message to send.
pub fn message(
    id: i64,
    group: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    payload: &[u8],
) -> Outgoing {
    Outgoing {
        id,
        group: group.to_owned(),
        key: key.map(str::to_owned),
        headers: headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
        payload: payload.to_vec(),
        attempt: 1,
    }
}

/// `n` messages with ids from `first`, keys `k0`..`k{keys-1}` in turn, the id in the
/// header `n` too, and a payload of every byte value after the id (so that no byte is lost
/// or changed).
pub fn batch(first: i64, n: usize, keys: usize) -> Vec<Outgoing> {
    (0..n)
        .map(|i| {
            let id = first + i as i64;
            let key = format!("k{}", i % keys);
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend(0..=255u8);
            message(id, "g", Some(&key), &[("n", &id.to_string())], &payload)
        })
        .collect()
}

/// Asserts every message of a batch was confirmed.
pub fn all_ok(results: &[Result<(), SinkError>]) {
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "message {i}: {r:?}");
    }
}

/// A sink that hands batches to `inner` until `after` messages went, then, the batch that
/// reached that number sent, tells `stalled` and never answers: a relay killed after that
/// has sent messages it did not settle, whatever the timing of its claims.
pub struct StallsAfter<S> {
    inner: S,
    after: u64,
    sent: AtomicU64,
    stalled: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl<S: Sink> StallsAfter<S> {
    pub fn new(inner: S, after: usize) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (stalled, told) = tokio::sync::oneshot::channel();
        let stalled = Mutex::new(Some(stalled));
        (StallsAfter { inner, after: after as u64, sent: AtomicU64::new(0), stalled }, told)
    }
}

impl<S: Sink> Sink for StallsAfter<S> {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        let results = self.inner.send(batch).await;
        let sent = self.sent.fetch_add(batch.len() as u64, Ordering::SeqCst) + batch.len() as u64;
        if sent >= self.after {
            if let Some(stalled) = self.stalled.lock().unwrap().take() {
                let _ = stalled.send(());
            }
            std::future::pending::<()>().await;
        }
        results
    }

    fn system(&self) -> &'static str {
        self.inner.system()
    }
}
