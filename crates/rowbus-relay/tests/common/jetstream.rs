//! A JetStream stream of the test's own (a unique name and subjects), deleted when
//! dropped, and a reader of what was published to it, in the stream's order.

use async_nats::jetstream::{self, consumer, stream};

use super::{NATS, unique};

pub struct Stream {
    pub context: jetstream::Context,
    pub name: String,
    /// Every subject under it is the stream's: `<root>.>`.
    pub root: String,
}

impl Stream {
    /// A new stream covering `<root>.>`, with JetStream's default duplicate window (2 min).
    pub async fn new() -> Stream {
        Stream::covering(|root| vec![format!("{root}.>")]).await
    }

    /// A new stream covering the subjects `subjects` makes of its root.
    pub async fn covering(subjects: impl FnOnce(&str) -> Vec<String>) -> Stream {
        let client = async_nats::connect(NATS)
            .await
            .unwrap_or_else(|e| panic!("NATS at {NATS} must be reachable (scripts/services.sh): {e}"));
        let context = jetstream::new(client);
        let name = unique("rowbus_relay");
        let root = format!("relaytest.{name}");
        context
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: subjects(&root),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create stream {name}: {e}"));
        Stream { context, name, root }
    }

    /// Messages in the stream.
    pub async fn count(&self) -> u64 {
        let mut stream = self.context.get_stream(&self.name).await.unwrap();
        stream.info().await.unwrap().state.messages
    }

    /// The stream's messages from sequence number `from` on (the first is 1), as they come.
    pub async fn reader(&self, from: u64) -> consumer::pull::Stream {
        let stream = self.context.get_stream(&self.name).await.unwrap();
        let reader = stream
            .create_consumer(consumer::pull::Config {
                ack_policy: consumer::AckPolicy::None,
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: from },
                ..Default::default()
            })
            .await
            .unwrap();
        reader.messages().await.unwrap()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A drop cannot await: delete it from a runtime of its own, on a thread of its own.
        let (context, name) = (self.context.clone(), self.name.clone());
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                context.delete_stream(&name).await.map(drop).map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(e)) = deleted {
            eprintln!("cleanup: cannot delete stream {}, delete it by hand: {e}", self.name);
        }
    }
}
