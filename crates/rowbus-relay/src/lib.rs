//! The transactional outbox for rowbus: a [`Relay`] hands a queue's messages to a message
//! broker ([`Sink`](sink::Sink)) and removes each from the queue only once the broker
//! confirmed it.
//!
//! The application publishes to a rowbus queue inside its own transaction, so the row
//! that records the change and the message that announces it commit together; the relay
//! then claims the messages in batches, sends them, waits for the broker's confirmation of
//! each and acknowledges (deletes) what was confirmed. A message the broker could not take
//! now is given back and sent again, with the same id, once the broker is back; one it
//! refused for good is moved to the queue's dead letters with the broker's reason.
//! `docs/relay.md` describes each broker's mapping of ids, headers and order.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
pub mod sink;
mod template;

pub use error::RelayError;
pub use template::{MISSING, Template};
mod relay;

pub use relay::{DEFAULT_BATCH, DEFAULT_IN_FLIGHT, MAX_BACKOFF, MIN_BACKOFF, Relay, RelayReport};

/// The Rust blocks of docs/relay.md, compiled (and run where they may) as doctests, so a
/// snippet that stops compiling fails the tests (the other pages are rowbus's).
#[cfg(all(doctest, feature = "nats", feature = "redis"))]
mod snippets {
    #[doc = include_str!("../../../docs/relay.md")]
    struct Relay;
}
