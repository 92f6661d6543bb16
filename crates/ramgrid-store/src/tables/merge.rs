//! Merge writes: a numeric value combined with the one stored (sum, minimum, maximum) under the
//! partition's write lock, so concurrent writers of one key lose no update.

use super::partition::key_hash;
use super::{KeyStatus, TableVersion, ValueRef, MAX_KEY_LEN};
use crate::Result;

/// How a merge write combines a new value with the stored one. A missing key takes the new value
/// as it is (for `Add`, the sum with 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOp {
    /// The sum. An i64 sum that overflows is refused for that key (`WrongType`), never wrapped.
    Add,
    /// The smaller value.
    Min,
    /// The larger value.
    Max,
}

impl MergeOp {
    /// The stored value `old` merged with `new`, or None when the types differ or an i64 sum
    /// overflows (the caller refuses the key).
    fn apply<'v>(self, old: ValueRef<'_>, new: ValueRef<'v>) -> Option<ValueRef<'v>> {
        Some(match (old, new) {
            (ValueRef::I64(a), ValueRef::I64(b)) => ValueRef::I64(match self {
                MergeOp::Add => a.checked_add(b)?,
                MergeOp::Min => a.min(b),
                MergeOp::Max => a.max(b),
            }),
            (ValueRef::F64(a), ValueRef::F64(b)) => ValueRef::F64(match self {
                MergeOp::Add => a + b,
                MergeOp::Min => a.min(b),
                MergeOp::Max => a.max(b),
            }),
            _ => return None,
        })
    }
}

impl TableVersion {
    /// Merges `(key, value)` pairs into one partition of this OPEN version with `op`, appending one
    /// [`KeyStatus`] byte per pair: each key's new value is `op(stored, value)`, or `value` when
    /// the key is missing. The whole batch runs under the partition's write lock, so merges from
    /// concurrent batches are applied one after the other and none is lost; a key repeated within
    /// the batch is merged once per occurrence. Only i64 and f64 tables merge: every key of a
    /// batch for another type is answered `WrongType`. `then` runs under the lock, as for
    /// [`TableVersion::put_batch_then`].
    pub fn merge_batch_then<'k, 'v>(
        &self,
        partition: u32,
        items: impl IntoIterator<Item = (&'k [u8], ValueRef<'v>)>,
        op: MergeOp,
        status: &mut Vec<u8>,
        then: impl FnOnce(&[u8]),
    ) -> Result<()> {
        let max_value = self.max_value;
        let start = status.len();
        self.write(partition, |data, mut touched| {
            for (key, value) in items {
                if !matches!(value, ValueRef::I64(_) | ValueRef::F64(_)) {
                    status.push(KeyStatus::WrongType as u8);
                    continue;
                }
                let merged = if key.len() > MAX_KEY_LEN {
                    Some(value) // refused as too large by `put`
                } else {
                    match data.find(key, key_hash(key)) {
                        Some(i) => op.apply(data.value(i), value),
                        None => Some(value),
                    }
                };
                let st = match merged {
                    Some(v) => data.put(key, v, MAX_KEY_LEN, max_value),
                    None => KeyStatus::WrongType,
                };
                if let (Some(t), KeyStatus::Ok) = (touched.as_mut(), st) {
                    // Copying in: the copy must not overwrite the merged value.
                    t.insert(key.into());
                }
                status.push(st as u8);
            }
            then(&status[start..]);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::{Durability, TableSpec, Tables, TablesConfig, ValueType};

    fn table(vt: ValueType) -> Tables {
        let t = Tables::new(TablesConfig {
            memory_limit: 1 << 24,
            max_value_size: 1 << 16,
        });
        let spec = TableSpec {
            name: "t".into(),
            partitions: 1,
            replication: 1,
            value_type: vt,
            durability: Durability::Memory,
            incarnation: 1,
        };
        t.create_table(spec, &[0]).unwrap();
        t
    }

    fn merge(t: &Tables, op: MergeOp, items: &[(&[u8], ValueRef<'_>)]) -> Vec<u8> {
        let mut st = Vec::new();
        let tv = t.at("t", 1).unwrap();
        tv.merge_batch_then(0, items.iter().copied(), op, &mut st, |_| ())
            .unwrap();
        st
    }

    fn value(t: &Tables, key: &[u8]) -> Option<ValueRef<'static>> {
        let tv = t.at("t", 1).unwrap();
        tv.with_partition(0, |view| {
            view.get(key).map(|v| match v {
                ValueRef::I64(x) => ValueRef::I64(x),
                ValueRef::F64(x) => ValueRef::F64(x),
                _ => panic!("not numeric"),
            })
        })
        .unwrap()
    }

    #[test]
    fn add_min_max_on_i64_merge_with_the_stored_value() {
        let t = table(ValueType::I64);
        let ok = KeyStatus::Ok as u8;
        let st = merge(
            &t,
            MergeOp::Add,
            &[(b"a", ValueRef::I64(2)), (b"a", ValueRef::I64(3))],
        );
        assert_eq!(st, [ok, ok]);
        assert_eq!(value(&t, b"a"), Some(ValueRef::I64(5)));
        merge(
            &t,
            MergeOp::Min,
            &[(b"a", ValueRef::I64(9)), (b"b", ValueRef::I64(-4))],
        );
        assert_eq!(value(&t, b"a"), Some(ValueRef::I64(5)));
        assert_eq!(value(&t, b"b"), Some(ValueRef::I64(-4)));
        merge(
            &t,
            MergeOp::Max,
            &[(b"a", ValueRef::I64(9)), (b"b", ValueRef::I64(-7))],
        );
        assert_eq!(value(&t, b"a"), Some(ValueRef::I64(9)));
        assert_eq!(value(&t, b"b"), Some(ValueRef::I64(-4)));
    }

    #[test]
    fn an_i64_sum_that_overflows_is_refused_and_changes_nothing() {
        let t = table(ValueType::I64);
        merge(&t, MergeOp::Add, &[(b"a", ValueRef::I64(i64::MAX))]);
        let st = merge(
            &t,
            MergeOp::Add,
            &[(b"a", ValueRef::I64(1)), (b"b", ValueRef::I64(1))],
        );
        assert_eq!(st, [KeyStatus::WrongType as u8, KeyStatus::Ok as u8]);
        assert_eq!(value(&t, b"a"), Some(ValueRef::I64(i64::MAX)));
    }

    #[test]
    fn f64_adds_and_bytes_tables_refuse_merges() {
        let t = table(ValueType::F64);
        merge(
            &t,
            MergeOp::Add,
            &[(b"x", ValueRef::F64(0.5)), (b"x", ValueRef::F64(0.25))],
        );
        assert_eq!(value(&t, b"x"), Some(ValueRef::F64(0.75)));
        let b = table(ValueType::Bytes);
        let mut st = Vec::new();
        let tv = b.at("t", 1).unwrap();
        tv.merge_batch_then(
            0,
            [(&b"k"[..], ValueRef::Bytes(b"v"))],
            MergeOp::Add,
            &mut st,
            |_| (),
        )
        .unwrap();
        assert_eq!(st, [KeyStatus::WrongType as u8]);
    }

    #[test]
    fn concurrent_adds_lose_nothing() {
        let t = std::sync::Arc::new(table(ValueType::I64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        merge(
                            &t,
                            MergeOp::Add,
                            &[(b"n", ValueRef::I64(1)), (b"m", ValueRef::I64(2))],
                        );
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(value(&t, b"n"), Some(ValueRef::I64(2000)));
        assert_eq!(value(&t, b"m"), Some(ValueRef::I64(4000)));
    }
}
