//! Publishing: what a message carries ([`message`]: `Message`, `Published`, headers), the
//! INSERT of a batch of messages and the wake-ups that go with it ([`insert`]),
//! publishes arriving together that share one statement ([`coalesce`]), and the broker's
//! sender of wake-ups to other processes where they go apart from the publishing
//! transaction ([`wakes`]).
//!
//! Entered through `Queue::publish` / `publish_batch` (autocommitted, coalesced) and
//! `BrokerTx::publish` (in the caller's transaction, woken once it committed).

pub(crate) mod coalesce;
pub(crate) mod insert;
pub(crate) mod message;
pub(crate) mod wakes;
