//! The merges this server applied lately, by the client's write key (docs/replication.md,
//! "Merges counted once"; protocol 7.5).
//!
//! A client names each merge (`add`, `min`, `max`) with a random write key, the same in every try
//! of it. Whichever way a try reaches a replica (the client's frame at the primary, a primary's
//! forward, a new primary's forward after a fail-over), the replica applies each partition group
//! of it once: [`Conn::apply_put`](crate::native) looks each group up here first and answers a
//! group it already applied with the statuses it answered then. So a client may send a merge
//! answered INDETERMINATE again, and it is counted once on every replica.
//!
//! Entries are kept for [`KEEP`] (far past the client's retry window: 20 s for a down primary,
//! 20 s for a reply) and at most [`WRITES`] writes, the oldest dropped first. The lookup and the
//! apply happen under one of [`SHARDS`] locks, chosen by the key, so two tries of one write that
//! reach a replica at once are applied once too.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

/// How long a write's groups are remembered.
pub const KEEP: Duration = Duration::from_secs(120);
/// Writes remembered at most (over every shard).
pub const WRITES: usize = 1 << 18;
/// Independent locks: writes with different keys are applied in parallel.
const SHARDS: usize = 16;

/// What a write's groups answered here, by partition.
type Groups = Vec<(u32, Box<[u8]>)>;

#[derive(Default)]
struct Shard {
    writes: HashMap<u64, Groups>,
    order: VecDeque<(Instant, u64)>,
}

/// The merges applied lately, by write key.
pub struct Ledger {
    shards: Vec<Mutex<Shard>>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Ledger {
    /// The entry of write `key`, locked until the guard is dropped: look its groups up, apply
    /// the others, record them.
    pub fn entry(&self, key: u64) -> Entry<'_> {
        let shard = self.shards[(key % SHARDS as u64) as usize].lock();
        Entry { shard, key }
    }
}

/// One write's entry in the ledger, locked.
pub struct Entry<'a> {
    shard: MutexGuard<'a, Shard>,
    key: u64,
}

impl Entry<'_> {
    /// The statuses partition `p`'s group of this write answered here, if it was applied.
    pub fn applied(&self, p: u32) -> Option<&[u8]> {
        let groups = self.shard.writes.get(&self.key)?;
        groups.iter().find(|(q, _)| *q == p).map(|(_, s)| &s[..])
    }

    /// Records that partition `p`'s group was applied here and answered `statuses`.
    pub fn record(&mut self, p: u32, statuses: &[u8]) {
        let now = Instant::now();
        let shard = &mut *self.shard;
        while let Some(&(at, key)) = shard.order.front() {
            if now.duration_since(at) < KEEP && shard.order.len() < WRITES / SHARDS {
                break;
            }
            shard.order.pop_front();
            shard.writes.remove(&key);
        }
        let groups = shard.writes.entry(self.key).or_insert_with(|| {
            shard.order.push_back((now, self.key));
            Vec::new()
        });
        groups.push((p, statuses.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_found_once_recorded_and_other_writes_are_apart() {
        let l = Ledger::default();
        let mut e = l.entry(7);
        assert_eq!(e.applied(3), None);
        e.record(3, &[0, 0, 4]);
        assert_eq!(e.applied(3), Some(&[0u8, 0, 4][..]));
        assert_eq!(e.applied(4), None);
        drop(e);
        assert_eq!(l.entry(7 + SHARDS as u64).applied(3), None);
        assert_eq!(l.entry(7).applied(3), Some(&[0u8, 0, 4][..]));
    }

    #[test]
    fn the_oldest_writes_go_first_past_the_bound() {
        let l = Ledger::default();
        let per_shard = (WRITES / SHARDS) as u64;
        for i in 0..=per_shard {
            l.entry(i * SHARDS as u64).record(0, &[0]);
        }
        assert_eq!(l.entry(0).applied(0), None);
        assert!(l.entry(SHARDS as u64).applied(0).is_some());
    }
}
