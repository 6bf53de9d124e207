//! Settling: what becomes of a claimed message. [`delivery`] is the `Delivery` a handler
//! gets and the `Outcome` it returns; [`lease`] acknowledges, retries, releases, extends or
//! dead-letters under a lease; [`many`] settles many deliveries at once for programs that
//! hold their claimed messages themselves; [`acks`] batches acknowledgements (on SQLite riding on the
//! next claim); [`retry`] is the backoff; [`transactional`] runs handlers inside the
//! transaction that locked their messages, in the transaction [`writer`] hands out.
//!
//! Entered from the claim room's runners, and by a `Delivery`'s own methods.

pub(crate) mod acks;
pub(crate) mod control;
pub(crate) mod delivery;
pub(crate) mod lease;
pub(crate) mod many;
pub(crate) mod retry;
pub(crate) mod transactional;
pub(crate) mod turns;
pub(crate) mod writer;
