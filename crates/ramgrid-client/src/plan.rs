//! Grouping a batch for fan-out, and acknowledgement counting: the pure part of routing.
//!
//! Grouping is a counting sort into compressed rows (one `Vec<u32>` of items, one of row starts), so
//! it allocates per batch, never per key. A batch is grouped twice: key positions by partition, then
//! partitions by server. A server's frame lists its partitions' keys in row order, its reply answers
//! them in the same order, and each answer lands at the caller's index of that key.

/// Items grouped by row (a partition or a server): row `s` is `idx[starts[s]..starts[s + 1]]`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Groups {
    starts: Vec<u32>,
    idx: Vec<u32>,
}

impl Groups {
    /// Groups `keys` (indices into the caller's batch, or any u32 items) by `target(i)`, a row index
    /// below `servers`, or `None` for items that go nowhere (they are left out). Rows keep the
    /// items' order.
    pub fn by_target(
        servers: usize,
        keys: impl Iterator<Item = u32> + Clone,
        target: impl Fn(u32) -> Option<usize>,
    ) -> Groups {
        let mut starts = vec![0u32; servers + 1];
        for i in keys.clone() {
            if let Some(s) = target(i) {
                starts[s + 1] += 1;
            }
        }
        for s in 0..servers {
            starts[s + 1] += starts[s];
        }
        let mut fill = starts.clone();
        let mut idx = vec![0u32; starts[servers] as usize];
        for i in keys {
            if let Some(s) = target(i) {
                idx[fill[s] as usize] = i;
                fill[s] += 1;
            }
        }
        Groups { starts, idx }
    }

    /// Groups `items` by every server in `targets(item)` (an item may go to several: all replicas of
    /// a write).
    pub fn by_targets<T>(
        servers: usize,
        items: impl Iterator<Item = u32> + Clone,
        targets: impl Fn(u32) -> T,
    ) -> Groups
    where
        T: IntoIterator<Item = usize>,
    {
        let mut starts = vec![0u32; servers + 1];
        for i in items.clone() {
            for s in targets(i) {
                starts[s + 1] += 1;
            }
        }
        for s in 0..servers {
            starts[s + 1] += starts[s];
        }
        let mut fill = starts.clone();
        let mut idx = vec![0u32; starts[servers] as usize];
        for i in items {
            for s in targets(i) {
                idx[fill[s] as usize] = i;
                fill[s] += 1;
            }
        }
        Groups { starts, idx }
    }

    /// The items sent to server `s`, in the order they were given.
    pub fn row(&self, s: usize) -> &[u32] {
        &self.idx[self.starts[s] as usize..self.starts[s + 1] as usize]
    }

    /// Number of servers (rows).
    pub fn servers(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Servers with a non-empty row.
    pub fn busy(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.servers()).filter(|&s| self.starts[s] != self.starts[s + 1])
    }
}

/// How many replicas must acknowledge a write before the key counts as stored. Writes are
/// ordered by each partition's primary, which answers only once every replica of the committed
/// assignment applied the write (docs/replication.md). `All` and `Majority` get that promise;
/// `One` trades it for availability while a replica is down: the first replica up takes the
/// write and completes it on the replicas that answer (protocol 7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ack {
    /// Every replica of the key's partition.
    #[default]
    All,
    /// More than half of them.
    Majority,
    /// Any one.
    One,
}

/// What a read of an open or current version may return (docs/replication.md, "Reads").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Consistency {
    /// Linearizable: read from the partition's primary, which holds a write only once every
    /// replica does; no read that starts after a write returned misses it.
    #[default]
    Linearizable,
    /// Any replica, spread over them: every acknowledged write is there, but a write still in
    /// flight may be seen at one replica and not yet at another.
    Replica,
}

impl std::str::FromStr for Consistency {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Consistency> {
        match s {
            "linearizable" => Ok(Consistency::Linearizable),
            "replica" => Ok(Consistency::Replica),
            _ => Err(crate::Error::InvalidArgument(format!(
                "consistency must be \"linearizable\" or \"replica\", not {s:?}"
            ))),
        }
    }
}

impl Ack {
    /// Acknowledgements needed from `replicas` replicas (at least 1).
    pub fn required(self, replicas: usize) -> usize {
        match self {
            Ack::All => replicas.max(1),
            Ack::Majority => replicas / 2 + 1,
            Ack::One => 1,
        }
    }
}

impl std::str::FromStr for Ack {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Ack> {
        match s {
            "all" => Ok(Ack::All),
            "majority" => Ok(Ack::Majority),
            "one" => Ok(Ack::One),
            _ => Err(crate::Error::InvalidArgument(format!(
                "ack must be \"all\", \"majority\" or \"one\", not {s:?}"
            ))),
        }
    }
}

/// Per-key acknowledgement tally of one write batch, and the first refusal seen for each key.
///
/// A key fails when fewer replicas than required stored it, or when any replica that answered
/// refused it (out of memory, too large...): replicas that answered never disagree silently about an
/// acknowledged key. Only a replica that did not answer (down, timed out) counts merely as a
/// missing acknowledgement, which `ack = one | majority` tolerates.
#[derive(Debug)]
pub struct AckTally {
    acks: Vec<u8>,
    refused: Vec<bool>,
    reasons: Vec<(u32, String)>,
}

impl AckTally {
    /// A tally for `n` keys, none acknowledged.
    pub fn new(n: usize) -> AckTally {
        AckTally {
            acks: vec![0; n],
            refused: vec![false; n],
            reasons: Vec::new(),
        }
    }

    /// Key `i` was stored by one replica.
    #[inline]
    pub fn ack(&mut self, i: u32) {
        self.acks[i as usize] = self.acks[i as usize].saturating_add(1);
    }

    /// Key `i` was refused by a replica that answered, for `why`: the key fails whatever the
    /// acknowledgement level.
    pub fn refuse(&mut self, i: u32, why: impl FnOnce() -> String) {
        self.refused[i as usize] = true;
        self.reasons.push((i, why()));
    }

    /// Key `i` was not answered by one replica (down, failed mid-call), for `why`.
    pub fn unanswered(&mut self, i: u32, why: impl FnOnce() -> String) {
        self.reasons.push((i, why()));
    }

    /// Acknowledgements counted for key `i`.
    pub fn acks(&self, i: usize) -> u8 {
        self.acks[i]
    }

    /// The keys with fewer than `required(i)` acknowledgements, ascending, each with its first reason.
    pub fn failures(mut self, required: impl Fn(usize) -> usize) -> Vec<(usize, String)> {
        self.reasons.sort_by_key(|r| r.0);
        let mut reasons = self.reasons.into_iter().peekable();
        let mut out = Vec::new();
        for (i, &a) in self.acks.iter().enumerate() {
            let mut first = None;
            while let Some((j, _)) = reasons.peek() {
                if (*j as usize) > i {
                    break;
                }
                let (j, why) = reasons.next().expect("peeked");
                if j as usize == i && first.is_none() {
                    first = Some(why);
                }
            }
            if (a as usize) < required(i) || self.refused[i] {
                out.push((
                    i,
                    first.unwrap_or_else(|| "not acknowledged by enough replicas".to_string()),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_partition_the_keys_and_keep_order() {
        let n = 1000u32;
        let g = Groups::by_target(4, 0..n, |i| {
            if i % 7 == 0 {
                None
            } else {
                Some((i as usize * 31) % 4)
            }
        });
        let mut seen = vec![false; n as usize];
        for s in 0..4 {
            let row = g.row(s);
            assert!(row.windows(2).all(|w| w[0] < w[1]), "row {s} ascending");
            for &i in row {
                assert_eq!((i as usize * 31) % 4, s);
                assert!(!seen[i as usize]);
                seen[i as usize] = true;
            }
        }
        for i in 0..n {
            assert_eq!(seen[i as usize], i % 7 != 0, "key {i}");
        }
        assert_eq!(g.busy().count(), 4);
        let empty = Groups::by_target(3, 0..0u32, |_| Some(0));
        assert_eq!(empty.busy().count(), 0);
    }

    #[test]
    fn multi_target_groups_put_each_key_on_every_replica() {
        let reps: [&[usize]; 3] = [&[0, 1], &[1, 2], &[2]];
        let g = Groups::by_targets(3, 0..6u32, |i| reps[i as usize % 3].iter().copied());
        assert_eq!(g.row(0), &[0, 3]);
        assert_eq!(g.row(1), &[0, 1, 3, 4]);
        assert_eq!(g.row(2), &[1, 2, 4, 5]);
    }

    #[test]
    fn ack_levels() {
        assert_eq!([1, 2, 3, 4].map(|r| Ack::All.required(r)), [1, 2, 3, 4]);
        assert_eq!(
            [1, 2, 3, 4, 5].map(|r| Ack::Majority.required(r)),
            [1, 2, 2, 3, 3]
        );
        assert_eq!([1, 3].map(|r| Ack::One.required(r)), [1, 1]);
        assert_eq!("majority".parse::<Ack>().unwrap(), Ack::Majority);
        assert!("most".parse::<Ack>().is_err());
    }

    #[test]
    fn tally_reports_underacknowledged_keys_with_first_reason() {
        // 4 keys, replication 3: key 0 stored everywhere, key 1 on two, key 2 on one, key 3 nowhere.
        let mut t = AckTally::new(4);
        for (i, n) in [(0u32, 3), (1, 2), (2, 1)] {
            for _ in 0..n {
                t.ack(i);
            }
        }
        t.refuse(3, || "VALUE_TOO_LARGE".into());
        t.unanswered(2, || "127.0.0.1:1 unreachable".into());
        t.refuse(3, || "second".into());
        t.unanswered(1, || "127.0.0.1:2 timed out".into());
        assert_eq!(t.acks(1), 2);
        let maj = Ack::Majority.required(3);
        let f = t.failures(|_| maj);
        assert_eq!(
            f,
            vec![
                (2, "127.0.0.1:1 unreachable".to_string()),
                (3, "VALUE_TOO_LARGE".to_string())
            ]
        );

        // A key stored by one replica and refused by another fails even at ack = one: the
        // replicas that answered would disagree about it.
        let mut t = AckTally::new(2);
        t.ack(0);
        t.ack(1);
        t.refuse(1, || "OUT_OF_MEMORY from 127.0.0.1:3".into());
        let f = t.failures(|_| Ack::One.required(2));
        assert_eq!(f, vec![(1, "OUT_OF_MEMORY from 127.0.0.1:3".to_string())]);

        let mut t = AckTally::new(2);
        t.ack(0);
        let f = t.failures(|_| 2);
        assert_eq!(f.len(), 2);
        assert_eq!(f[1], (1, "not acknowledged by enough replicas".to_string()));
    }
}
