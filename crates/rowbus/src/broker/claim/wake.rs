//! Waking subscriptions: in this process at once, in others through notifications.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::{Notify, Semaphore};

use super::handoff::{Offer, Reserved, Taker};

/// The group under which runners register to hear of cancels, and which a cancel's
/// notification names: a space, which no group name can be (none ends with one).
pub(crate) const CONTROL_GROUP: &str = " ";

/// Every subscription's wake-up, by table channel and group.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    by_table: RwLock<HashMap<Arc<str>, Vec<Entry>>>,
    next_id: AtomicU64,
    /// Subscriptions woken, for the broker's stats.
    pub woken: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    group: String,
    notify: Arc<Notify>,
    /// Set for a runner that takes hand-offs (see [`handoff`](super::handoff)).
    offer: Option<Offer>,
}

/// A subscription's place in [`Wakers`]; removed when dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    wakers: Arc<Wakers>,
    table: Arc<str>,
    id: u64,
    pub notify: Arc<Notify>,
}

impl Registration {
    /// Makes the subscription take hand-offs: a runner whose workers are `workers`,
    /// leasing for `lease` (one offer per registration; a later one replaces it). Its side
    /// of the offer.
    pub fn take_hand_offs(&self, workers: Arc<Semaphore>, lease: std::time::Duration) -> Taker {
        let (offer, taker) = Offer::new(workers, lease);
        let mut map = self.wakers.by_table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.table).and_then(|e| e.iter_mut().find(|e| e.id == self.id)) {
            entry.offer = Some(offer);
        }
        taker
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.wakers.by_table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entries) = map.get_mut(&self.table) {
            entries.retain(|e| e.id != self.id);
            if entries.is_empty() {
                map.remove(&self.table);
            }
        }
    }
}

impl Wakers {
    pub fn register(self: &Arc<Self>, table: &Arc<str>, group: &str) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let entry = Entry { id, group: group.to_owned(), notify: notify.clone(), offer: None };
        self.by_table
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(table.clone())
            .or_default()
            .push(entry);
        Registration { wakers: self.clone(), table: table.clone(), id, notify }
    }

    /// Wakes the subscriptions of `table` in `group`, or in every group when `group` is
    /// `None`: one `notify_one` each, which a subscription busy claiming keeps for its
    /// next wait.
    pub fn wake(&self, table: &str, group: Option<&str>) -> usize {
        let map = self.by_table.read().unwrap_or_else(|e| e.into_inner());
        let Some(entries) = map.get(table) else { return 0 };
        let mut woken = 0;
        for entry in entries.iter().filter(|e| group.is_none_or(|g| e.group == g)) {
            entry.notify.notify_one();
            woken += 1;
        }
        self.woken.fetch_add(woken as u64, Ordering::Relaxed);
        woken
    }

    /// A free worker of a runner of `table`'s `group` that waits for work and takes
    /// hand-offs, if one has one.
    pub fn reserve(&self, table: &str, group: &str) -> Option<Reserved> {
        let map = self.by_table.read().unwrap_or_else(|e| e.into_inner());
        map.get(table)?.iter().filter(|e| e.group == group).find_map(|e| e.offer.as_ref()?.reserve())
    }

    /// Wakes every subscription once (after the listening connection came back).
    pub fn wake_all(&self) -> usize {
        let map = self.by_table.read().unwrap_or_else(|e| e.into_inner());
        let mut woken = 0;
        for entry in map.values().flatten() {
            entry.notify.notify_one();
            woken += 1;
        }
        self.woken.fetch_add(woken as u64, Ordering::Relaxed);
        woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken(notify: &Notify) -> bool {
        tokio::time::timeout(Duration::from_millis(20), notify.notified()).await.is_ok()
    }

    #[tokio::test]
    async fn wakes_its_table_and_group_only_and_keeps_the_wakeup() {
        let wakers = Arc::new(Wakers::default());
        let (jobs, mail): (Arc<str>, Arc<str>) = (Arc::from("jobs"), Arc::from("mail"));
        let a = wakers.register(&jobs, "a");
        let b = wakers.register(&jobs, "b");
        let m = wakers.register(&mail, "");
        assert_eq!(wakers.wake("jobs", Some("a")), 1);
        // Nobody was waiting: the wake-up is kept for the next wait.
        assert!(woken(&a.notify).await);
        assert!(!woken(&b.notify).await);
        assert!(!woken(&m.notify).await);
        assert_eq!(wakers.wake("jobs", None), 2);
        assert!(woken(&a.notify).await && woken(&b.notify).await);
        assert_eq!(wakers.wake_all(), 3);
        drop(b);
        assert_eq!(wakers.wake("jobs", None), 1);
        drop(a);
        assert_eq!(wakers.wake("jobs", None), 0);
        assert_eq!(wakers.woken.load(Ordering::Relaxed), 1 + 2 + 3 + 1);
    }
}
