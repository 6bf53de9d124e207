//! Redis streams of the test's own (unique names under one prefix), deleted when dropped,
//! and their entries read back.

use std::collections::BTreeMap;

use super::{REDIS, unique};

/// One entry of a stream: its fields.
#[derive(Debug, Clone)]
pub struct Entry {
    pub fields: BTreeMap<String, Vec<u8>>,
}

impl Entry {
    /// A field as text.
    pub fn text(&self, field: &str) -> Option<String> {
        self.fields.get(field).map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

pub struct Streams {
    pub prefix: String,
    client: redis::Client,
}

impl Streams {
    pub async fn new() -> Streams {
        let client = redis::Client::open(format!("redis://{REDIS}")).unwrap();
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("Redis at {REDIS} must be reachable (scripts/services.sh): {e}"));
        let _: String = redis::cmd("PING").query_async(&mut connection).await.unwrap();
        Streams { prefix: unique("rowbus_relay"), client }
    }

    /// The name of stream `name` of this test.
    pub fn name(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client.get_multiplexed_async_connection().await.unwrap()
    }

    /// Entries in stream `stream` (a full name).
    pub async fn len(&self, stream: &str) -> u64 {
        redis::cmd("XLEN").arg(stream).query_async(&mut self.connection().await).await.unwrap()
    }

    /// Every entry of stream `stream` (a full name), in order, read 1,000 at a time.
    pub async fn read_all(&self, stream: &str) -> Vec<Entry> {
        let (mut entries, mut from) = (Vec::new(), "-".to_owned());
        loop {
            let page = self.page(stream, &from).await;
            let Some((last, _)) = page.last() else { return entries };
            from = format!("({last}");
            entries.extend(page.into_iter().map(|(_, entry)| entry));
        }
    }

    /// Up to 1,000 entries of stream `stream` (a full name) from `from` (an XRANGE start:
    /// `-`, or `(<id>` for those after an entry), each with its id, in order.
    pub async fn page(&self, stream: &str, from: &str) -> Vec<(String, Entry)> {
        let page: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg(from)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut self.connection().await)
            .await
            .unwrap();
        page.into_iter()
            .map(|(id, flat)| {
                let fields = flat
                    .chunks(2)
                    .map(|pair| (String::from_utf8_lossy(&pair[0]).into_owned(), pair[1].clone()))
                    .collect();
                (id, Entry { fields })
            })
            .collect()
    }

    /// The full names of the test's streams (every key under its prefix), sorted.
    pub async fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut self.connection().await)
            .await
            .unwrap();
        names.sort();
        names
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let dropped = (|| -> redis::RedisResult<()> {
            let mut connection = self.client.get_connection()?;
            let keys: Vec<String> =
                redis::cmd("KEYS").arg(format!("{}:*", self.prefix)).query(&mut connection)?;
            if !keys.is_empty() {
                redis::cmd("DEL").arg(keys).exec(&mut connection)?;
            }
            Ok(())
        })();
        if let Err(e) = dropped {
            eprintln!("cleanup: cannot delete the streams {}:*, delete them by hand: {e}", self.prefix);
        }
    }
}
