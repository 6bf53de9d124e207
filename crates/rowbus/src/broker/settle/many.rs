//! Settling many deliveries at once, for a program that holds the messages it claimed
//! itself (a stream's batches, a relay to a message broker) and acknowledges or gives back
//! what it finished together: one statement per [`ACK_BATCH`](crate::sql::ACK_BATCH)
//! messages rather than one each. Also the queue's counts, for such a program to add to.

use crate::broker::exec::to_the_end;
use crate::broker::operate::counts::{self, Counted};
use crate::broker::settle::delivery::Lease;
use crate::broker::settle::lease;
use crate::broker::{Delivery, Queue};
use crate::error::Error;
use crate::sql::Db;

/// Splits `deliveries` into the leases of `queue`'s table that nothing settled yet (each
/// taken for the caller) and the deliveries of other queues.
fn split<DB: Db>(queue: &Queue<DB>, deliveries: Vec<Delivery<DB>>) -> (Vec<Lease<DB>>, Vec<Delivery<DB>>) {
    let (mine, others): (Vec<_>, Vec<_>) =
        deliveries.into_iter().partition(|d| d.queue().table() == queue.table());
    let leases = mine.iter().map(Delivery::lease).filter(Lease::take).collect();
    (leases, others)
}

/// Wakes, once per group, the subscriptions that can take the next messages of the keys
/// the keyed ones of `leases` held, and cleans up after those keys. The runners settle
/// their batches with it too.
pub(in crate::broker) async fn free_keys<DB: Db>(queue: &Queue<DB>, leases: &[Lease<DB>]) {
    let mut seen: Vec<&str> = Vec::new();
    for group in leases.iter().filter_map(Lease::keyed_group) {
        if !seen.contains(&group) {
            seen.push(group);
            crate::broker::publish::insert::wake_group(queue, group).await;
        }
    }
    let keyed: Vec<i64> = leases.iter().filter(|l| l.is_keyed()).map(Lease::id).collect();
    lease::keys_gone(queue, &keyed).await;
}

impl<DB: Db> Queue<DB> {
    /// Acknowledges (deletes, or with a keep duration moves into the history) every one of
    /// `deliveries`, in one statement per claim or per 256 messages rather than one each,
    /// and frees the keys of keyed ones for their next messages. Returns how many were
    /// still leased: the others had lost their lease (it ran out and another consumer may
    /// hold them now) and were left alone, counted as lost leases. A delivery of another queue is acknowledged
    /// on its own queue, by itself.
    pub async fn ack_all(&self, deliveries: Vec<Delivery<DB>>) -> Result<u64, Error> {
        let queue = self.clone();
        to_the_end(async move {
            let (leases, others) = split(&queue, deliveries);
            let pairs: Vec<(i64, i64)> = leases.iter().map(|l| (l.id(), l.token())).collect();
            let mut acked = lease::ack_pairs(&queue, &pairs).await?;
            free_keys(&queue, &leases).await;
            for delivery in others {
                match delivery.ack().await {
                    Ok(()) => acked += 1,
                    Err(Error::LeaseLost { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(acked)
        })
        .await
    }

    /// Gives every one of `deliveries` back unstarted, as [`Delivery::release`] does
    /// (claimable at once, the attempt not counted), in one statement per claim and 256
    /// messages. Returns how many were still leased (the others had lost their lease and
    /// were left alone). A delivery of another queue is released on its own queue.
    pub async fn release_all(&self, deliveries: Vec<Delivery<DB>>) -> Result<u64, Error> {
        let queue = self.clone();
        to_the_end(async move {
            let (leases, others) = split(&queue, deliveries);
            let pairs: Vec<(i64, i64)> = leases.iter().map(|l| (l.id(), l.token())).collect();
            let mut released = 0;
            for (token, ids) in lease::by_claim(&pairs) {
                released += lease::release_many(&queue, token, &ids).await?;
            }
            for delivery in others {
                match delivery.release().await {
                    Ok(()) => released += 1,
                    Err(Error::LeaseLost { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(released)
        })
        .await
    }

    /// Adds `n` to the queue's counter of `kind` in its counts table, where every process
    /// reads it ([`counts`](Self::counts), `rowbus stats`): for a program that settles
    /// messages itself and reports what it did, as the relay to a message broker does.
    /// Never fails: a counts table missing (a queue deployed by an older rowbus) or one the
    /// role may not write is logged, and nothing else happens.
    pub async fn add_count(&self, kind: Counted, n: u64) {
        counts::count(self, kind, n).await;
    }
}
