//! Redis Streams: each message an `XADD` to its stream, a batch one pipeline.
//!
//! The entry's fields: `payload` (the bytes as they are), `id` (the message's id in its
//! queue, as decimal text), `group`, `headers` (a JSON object of the message's headers)
//! and `key` when the message has one. Redis gives the entry an id of its own (`*`); a
//! message sent again is a second entry with the same `id` field, for the reader to drop.
//! With a maximum length, each `XADD` trims the stream to about that many entries
//! (`MAXLEN ~ N`).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult, Value};

use crate::error::RelayError;
use crate::sink::{Outgoing, Sink, SinkError, redact};
use crate::template::Template;

/// How a [`RedisSink`] adds entries.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The stream each message is added to (`{group}` and `{key}` may appear in it).
    pub stream: Template,
    /// Trims each stream to about this many entries (`XADD ... MAXLEN ~ N`); none by default.
    pub maxlen: Option<u64>,
    /// How long a connection attempt or a pipeline's replies may take: 5 seconds by default.
    pub timeout: Duration,
}

impl RedisOptions {
    /// Adding to `stream`, untrimmed, the default timeout.
    pub fn new(stream: Template) -> Self {
        RedisOptions { stream, maxlen: None, timeout: Duration::from_secs(5) }
    }
}

/// A [`Sink`] to Redis Streams. It reconnects at the next batch after losing its
/// connection; a batch sent while the server is away is unconfirmed
/// ([`SinkError::Unavailable`]). Batches sent at once share one connection, their
/// pipelines interleaved on it.
pub struct RedisSink {
    client: Client,
    config: AsyncConnectionConfig,
    /// The connection batches share; `None` once one of them lost it. Locked while a new
    /// one is made, so that sends waiting for it make one, not one each.
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    options: RedisOptions,
    url: String,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("url", &self.url)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Server errors that say "not now" rather than "never": sent again later.
const TRANSIENT: [&str; 7] = ["OOM", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "READONLY", "CLUSTERDOWN"];

impl RedisSink {
    /// Connects to the Redis server at `url` (`redis://host:port/db`, with
    /// `:password@` or `user:password@` where the server wants them). Fails when the
    /// server cannot be reached now.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<RedisSink, RelayError> {
        let refused =
            |e: RedisError| RelayError::Connect { system: "redis", url: redact(url), reason: e.to_string() };
        let client = Client::open(url).map_err(refused)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout));
        let connection =
            client.get_multiplexed_async_connection_with_config(&config).await.map_err(refused)?;
        Ok(RedisSink {
            client,
            config,
            connection: tokio::sync::Mutex::new(Some(connection)),
            options,
            url: redact(url),
        })
    }

    /// The pipeline of `batch`'s `XADD`s.
    fn pipeline(&self, batch: &[Outgoing]) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for message in batch {
            let stream = self.options.stream.render(&message.group, message.key.as_deref());
            let cmd = pipe.cmd("XADD").arg(stream);
            if let Some(maxlen) = self.options.maxlen {
                cmd.arg("MAXLEN").arg("~").arg(maxlen);
            }
            let headers: serde_json::Map<String, serde_json::Value> = message
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
                .collect();
            cmd.arg("*")
                .arg("payload")
                .arg(message.payload.as_slice())
                .arg("id")
                .arg(message.id)
                .arg("group")
                .arg(&message.group)
                .arg("headers")
                .arg(serde_json::Value::Object(headers).to_string());
            if let Some(key) = &message.key {
                cmd.arg("key").arg(key);
            }
        }
        pipe
    }
}

/// What one `XADD`'s reply says.
fn added(reply: RedisResult<Value>) -> Result<(), SinkError> {
    match reply {
        Ok(_) => Ok(()),
        Err(e) if e.code().is_some_and(|code| TRANSIENT.contains(&code)) => {
            Err(SinkError::Unavailable(format!("redis: {e}")))
        }
        Err(e) if e.code().is_some() => Err(SinkError::Refused(format!("redis: {e}"))),
        Err(e) => Err(SinkError::Unavailable(format!("redis: {e}"))),
    }
}

impl Sink for RedisSink {
    async fn send(&self, batch: &[Outgoing]) -> Vec<Result<(), SinkError>> {
        let all =
            |reason: String| batch.iter().map(|_| Err(SinkError::Unavailable(reason.clone()))).collect();
        if batch.is_empty() {
            return Vec::new();
        }
        let mut connection = {
            let mut shared = self.connection.lock().await;
            match &*shared {
                Some(connection) => connection.clone(),
                None => match self.client.get_multiplexed_async_connection_with_config(&self.config).await {
                    Ok(connection) => shared.insert(connection).clone(),
                    Err(e) => return all(format!("redis: cannot connect to {}: {e}", self.url)),
                },
            }
        };
        let pipe = self.pipeline(batch);
        match pipe.query_async::<Vec<RedisResult<Value>>>(&mut connection).await {
            Ok(replies) if replies.len() == batch.len() => replies.into_iter().map(added).collect(),
            Ok(replies) => all(format!("redis: {} replies to {} commands", replies.len(), batch.len())),
            Err(e) => {
                // The connection is lost or out of step: a new one for the next batch.
                *self.connection.lock().await = None;
                all(format!("redis: {e}"))
            }
        }
    }

    fn system(&self) -> &'static str {
        "redis"
    }
}
