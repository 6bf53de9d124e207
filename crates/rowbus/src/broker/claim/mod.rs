//! Claiming: taking rows for a consumer. [`claims`] runs a claim (under a lease, or locked
//! and deleted in a transactional handler's transaction), [`limited`] the claim of a
//! group some limit applies to, [`slot`] when what a rate let it take begins; [`subscription`] is the
//! subscription that claims while claims come back full and otherwise waits for a
//! wake-up or its poll interval; [`runner`] is the one `select!` loop every runner uses;
//! [`ahead`] sizes claim-ahead; [`until`] is what stops a runner early; [`wake`] wakes
//! subscriptions in this process at once and in others through notifications; [`handoff`]
//! hands a message published in this process straight to an idle runner's worker.
//!
//! Entered through `Queue::subscribe`, which gives a `SubscriptionBuilder`.

pub(crate) mod ahead;
pub(crate) mod claims;
pub(crate) mod handoff;
pub(crate) mod limited;
pub(crate) mod runner;
pub(crate) mod slot;
pub(crate) mod subscription;
pub(crate) mod until;
pub(crate) mod wake;
pub(crate) mod watch;
