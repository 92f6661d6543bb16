//! Long batches in chunks, for callers that must regain control between network calls (the Python
//! binding checks for Ctrl-C there): a read (or an f64 lookup) reads every chunk at the version the first chunk
//! resolved, so the whole batch sees one version; a write goes on past a chunk's failed keys and
//! reports every chunk's failures together, as one unchunked call would.

use std::collections::BTreeSet;
use std::ops::Range;

use crate::client::{Client, GetResult};
use crate::error::Error;
use crate::keys::Keys;
use crate::values::{Values, ValuesRef};
use ramgrid_proto::native::{Merge, ValueType};

/// Keys per chunk that [`Client::get_chunked`] and friends default to in the Python binding: large
/// enough that the per-call overhead vanishes, small enough that Ctrl-C is answered promptly.
pub const CHUNK_KEYS: usize = 1 << 18;

/// Why a chunked call stopped.
#[derive(Debug)]
pub enum ChunkedError<E> {
    /// The client call failed (for writes: after every chunk was tried, failures merged).
    Failed(Error),
    /// The hook run between chunks asked to stop, with this reason; the chunks before it were
    /// applied (writes) and nothing is returned (reads).
    Stopped(E),
}

impl<E> From<Error> for ChunkedError<E> {
    fn from(e: Error) -> Self {
        ChunkedError::Failed(e)
    }
}

/// The chunks of a batch of `n` keys, `chunk` keys each (at least one, empty for `n` = 0).
fn ranges(n: usize, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    let chunk = chunk.max(1);
    (0..n.div_ceil(chunk).max(1)).map(move |i| i * chunk..((i + 1) * chunk).min(n))
}

/// Runs `f` on each chunk and `between` between two chunks; `f`'s error stops the batch.
fn each_chunk<E>(
    n: usize,
    chunk: usize,
    mut between: impl FnMut() -> Result<(), E>,
    mut f: impl FnMut(Range<usize>) -> Result<(), Error>,
) -> Result<(), ChunkedError<E>> {
    for (i, r) in ranges(n, chunk).enumerate() {
        if i > 0 {
            between().map_err(ChunkedError::Stopped)?;
        }
        f(r)?;
    }
    Ok(())
}

/// Per-key and per-partition failures of a chunked write, merged over its chunks so that one
/// chunk's failure does not stop the others.
#[derive(Debug, Default)]
struct Failures {
    keys: Vec<(usize, String)>,
    partitions: BTreeSet<u32>,
    detail: String,
}

impl Failures {
    /// Records a chunk's failures (key indices shifted by the chunk's `start`); `Ok(None)` then,
    /// so the batch goes on. Other errors pass through and stop it.
    fn absorb<T>(&mut self, start: usize, r: Result<T, Error>) -> Result<Option<T>, Error> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(Error::Batch { failures }) => {
                self.keys
                    .extend(failures.into_iter().map(|(i, why)| (i + start, why)));
                Ok(None)
            }
            Err(Error::PartitionsUnavailable { partitions, detail }) => {
                self.partitions.extend(partitions);
                self.detail = detail;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The merged outcome: unavailable partitions first (they say more than the keys they cost),
    /// then failed keys, else `Ok`.
    fn into_result(self) -> Result<(), Error> {
        if !self.partitions.is_empty() {
            return Err(Error::PartitionsUnavailable {
                partitions: self.partitions.into_iter().collect(),
                detail: self.detail,
            });
        }
        if !self.keys.is_empty() {
            return Err(Error::Batch {
                failures: self.keys,
            });
        }
        Ok(())
    }
}

impl Client {
    /// [`Client::get`] of incarnation `incarnation` (0: whichever exists; see
    /// [`Client::get_into_of`]) in chunks of `chunk` keys, calling `between` between two chunks.
    /// Every chunk reads the version the first one resolved, so the result is of one version.
    ///
    /// When `version` is 0 and the read fails because the table was dropped and created again
    /// (perhaps with another value type) meanwhile, the new table's current version is read
    /// instead, into an output of its type (at most twice). A pinned version belonged to the table
    /// that is gone and is never read from the new one.
    pub fn get_chunked<E>(
        &self,
        table: &str,
        incarnation: u64,
        keys: Keys<'_>,
        version: u32,
        chunk: usize,
        mut between: impl FnMut() -> Result<(), E>,
    ) -> Result<GetResult, ChunkedError<E>> {
        let n = keys.len();
        let mut meta = self.table_meta(table)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut values = Values::zeroed(meta.value_type, n);
            let mut found = vec![false; n];
            let mut pinned = version;
            let read = each_chunk(n, chunk, &mut between, |r| {
                pinned = self.get_into_of(
                    table,
                    incarnation,
                    keys.slice(r.clone()),
                    pinned,
                    &mut values.slice_mut(r.clone()),
                    &mut found[r],
                )?;
                Ok(())
            });
            match read {
                Ok(()) => {
                    return Ok(GetResult {
                        values,
                        found,
                        version: pinned,
                    })
                }
                Err(ChunkedError::Failed(e)) => {
                    let fresh = if version == 0 && tries < 3 {
                        self.table_meta(table).ok()
                    } else {
                        None
                    };
                    match fresh {
                        Some(m) if m.incarnation != meta.incarnation => meta = m,
                        _ => return Err(ChunkedError::Failed(e)),
                    }
                }
                Err(stopped) => return Err(stopped),
            }
        }
    }

    /// [`Client::lookup_f64`] in chunks of `chunk` keys, calling `between` between two chunks;
    /// every chunk reads the version the first one resolved, which is returned.
    #[expect(
        clippy::too_many_arguments,
        reason = "lookup_f64's arguments, and the chunking"
    )]
    pub fn lookup_f64_chunked<E>(
        &self,
        table: &str,
        incarnation: u64,
        version: u32,
        keys: &[&[u8]],
        values: &mut [f64],
        found: &mut [bool],
        chunk: usize,
        between: impl FnMut() -> Result<(), E>,
    ) -> Result<u32, ChunkedError<E>> {
        let mut pinned = version;
        each_chunk(keys.len(), chunk, between, |r| {
            pinned = self.lookup_f64(
                table,
                incarnation,
                pinned,
                &keys[r.clone()],
                &mut values[r.clone()],
                &mut found[r],
            )?;
            Ok(())
        })?;
        Ok(pinned)
    }

    /// [`Client::put`] in chunks of `chunk` keys, calling `between` between two chunks. A chunk's
    /// refused keys or unreachable partitions do not stop the next chunks; they are reported
    /// together at the end (key indices in the whole batch), as [`Client::put`] reports them.
    pub fn put_chunked<E>(
        &self,
        table: &str,
        keys: Keys<'_>,
        values: ValuesRef<'_>,
        version: u32,
        chunk: usize,
        between: impl FnMut() -> Result<(), E>,
    ) -> Result<(), ChunkedError<E>> {
        self.put_merge_chunked(table, keys, values, version, Merge::Store, chunk, between)
    }

    /// [`Client::put_merge`] in chunks, as [`Client::put_chunked`].
    #[expect(
        clippy::too_many_arguments,
        reason = "put_chunked's arguments and the merge"
    )]
    pub fn put_merge_chunked<E>(
        &self,
        table: &str,
        keys: Keys<'_>,
        values: ValuesRef<'_>,
        version: u32,
        merge: Merge,
        chunk: usize,
        between: impl FnMut() -> Result<(), E>,
    ) -> Result<(), ChunkedError<E>> {
        let dim = match self.table_meta(table)?.value_type {
            ValueType::F32Vec(d) => d as usize,
            _ => 1,
        };
        let mut failures = Failures::default();
        each_chunk(keys.len(), chunk, between, |r| {
            let done = self.put_merge(
                table,
                keys.slice(r.clone()),
                values.slice(r.clone(), dim),
                version,
                merge,
            );
            failures.absorb(r.start, done).map(|_| ())
        })?;
        Ok(failures.into_result()?)
    }

    /// [`Client::delete`] in chunks of `chunk` keys, calling `between` between two chunks; returns
    /// how many keys were found. Failures are merged over the chunks as for [`Client::put_chunked`].
    pub fn delete_chunked<E>(
        &self,
        table: &str,
        keys: Keys<'_>,
        version: u32,
        chunk: usize,
        between: impl FnMut() -> Result<(), E>,
    ) -> Result<usize, ChunkedError<E>> {
        let mut failures = Failures::default();
        let mut deleted = 0;
        each_chunk(keys.len(), chunk, between, |r| {
            let done = self.delete(table, keys.slice(r.clone()), version);
            deleted += failures.absorb(r.start, done)?.unwrap_or(0);
            Ok(())
        })?;
        failures.into_result()?;
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_batch_in_order() {
        let r: Vec<_> = ranges(10, 4).collect();
        assert_eq!(r, [0..4, 4..8, 8..10]);
        assert_eq!(ranges(8, 4).collect::<Vec<_>>(), [0..4, 4..8]);
        // An empty batch is still one (empty) call, so it is checked like any other.
        assert_eq!(
            ranges(0, 4).collect::<Vec<_>>(),
            vec![Range { start: 0, end: 0 }]
        );
        assert_eq!(ranges(3, 0).count(), 3);
    }

    #[test]
    fn between_runs_between_chunks_only_and_can_stop() {
        let mut calls = Vec::new();
        let mut betweens = 0;
        let r: Result<(), ChunkedError<&str>> = each_chunk(
            10,
            4,
            || {
                betweens += 1;
                Ok(())
            },
            |r| {
                calls.push(r);
                Ok(())
            },
        );
        assert!(r.is_ok());
        assert_eq!(calls, [0..4, 4..8, 8..10]);
        assert_eq!(betweens, 2);

        let mut calls = Vec::new();
        let r = each_chunk(
            10,
            4,
            || Err("stop"),
            |r| {
                calls.push(r);
                Ok(())
            },
        );
        assert!(matches!(r, Err(ChunkedError::Stopped("stop"))));
        assert_eq!(calls, vec![Range { start: 0, end: 4 }]);
    }

    #[test]
    fn failures_are_merged_with_indices_in_the_whole_batch() {
        let mut f = Failures::default();
        let batch = |i: usize| Error::Batch {
            failures: vec![(i, "VALUE_TOO_LARGE".into())],
        };
        assert_eq!(f.absorb(0, Ok(3)).unwrap(), Some(3));
        assert_eq!(f.absorb::<()>(0, Err(batch(1))).unwrap(), None);
        assert_eq!(f.absorb::<()>(4, Err(batch(2))).unwrap(), None);
        match f.into_result() {
            Err(Error::Batch { failures }) => {
                assert_eq!(failures.iter().map(|f| f.0).collect::<Vec<_>>(), [1, 6])
            }
            other => panic!("expected a batch error, got {other:?}"),
        }
    }

    #[test]
    fn unavailable_partitions_outrank_failed_keys_and_other_errors_pass_through() {
        let mut f = Failures::default();
        let gone = |p: Vec<u32>| Error::PartitionsUnavailable {
            partitions: p,
            detail: "down".into(),
        };
        f.absorb::<()>(
            0,
            Err(Error::Batch {
                failures: vec![(0, "x".into())],
            }),
        )
        .unwrap();
        f.absorb::<()>(0, Err(gone(vec![5, 2]))).unwrap();
        f.absorb::<()>(8, Err(gone(vec![2, 9]))).unwrap();
        let e = f.absorb::<()>(9, Err(Error::TableNotFound("t".into())));
        assert!(matches!(e, Err(Error::TableNotFound(_))));
        match f.into_result() {
            Err(Error::PartitionsUnavailable { partitions, .. }) => {
                assert_eq!(partitions, [2, 5, 9])
            }
            other => panic!("expected unavailable partitions, got {other:?}"),
        }
        assert!(Failures::default().into_result().is_ok());
    }
}
