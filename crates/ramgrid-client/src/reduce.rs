//! Fused lookup-reduce: a batch of records (texts tokenised with the reference experiment's rule,
//! or token lists) becomes its distinct tokens, looked up once each in an f64 table through the
//! batched read path, then one value per record: the correctly rounded sum (bit for bit Python's
//! `math.fsum`), the mean or the max, with the count of tokens and of misses.
//!
//! ```no_run
//! use ramgrid_client::{Client, ClientConfig};
//! use ramgrid_client::reduce::{Miss, Reduce, TokenBatch};
//!
//! let client = Client::new(ClientConfig::new(vec!["127.0.0.1:7001".into()]))?;
//! let texts = ["the cat sat", "on the mat"];
//! let batch = TokenBatch::from_texts(&texts)?;
//! assert_eq!(batch.distinct().len(), 5);
//! let r = client.lookup_reduce("lm", 0, 0, &batch, Reduce::Sum, Miss::Default(-20.0))?;
//! println!("{:?} {:?}", r.values, r.misses);
//! # Ok::<(), ramgrid_client::Error>(())
//! ```

mod fsum;
mod tokenize;

use std::hash::BuildHasher;
use std::str::FromStr;

use foldhash::fast::RandomState;
use hashbrown::hash_table::{Entry, HashTable};
use ramgrid_proto::native::ValueType;

pub use fsum::{fsum, Fsum, FsumError};
pub use tokenize::{tokenize, MAX_TOKEN_CHARS};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::values::{type_name, ValuesMut};

/// How the values of one record become one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// `math.fsum` of the values: correctly rounded, 0.0 for a record with none.
    Sum,
    /// `math.fsum(values) / len(values)`; NaN for a record with none.
    Mean,
    /// The largest value; NaN if any value is NaN, and for a record with none.
    Max,
}

impl FromStr for Reduce {
    type Err = Error;
    fn from_str(s: &str) -> Result<Reduce> {
        match s {
            "sum" => Ok(Reduce::Sum),
            "mean" => Ok(Reduce::Mean),
            "max" => Ok(Reduce::Max),
            _ => Err(Error::InvalidArgument(format!(
                "reduce must be sum, mean or max, not {s:?}"
            ))),
        }
    }
}

/// What a token the table does not hold contributes to its record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Miss {
    /// This value, as if the table held it (the language model's unknown-word log probability).
    Default(f64),
    /// Nothing: the record is reduced over the tokens found (a mean divides by their number).
    Skip,
}

/// A batch of records as its distinct tokens and, per record, the ids of its tokens in order.
/// Tokens are borrowed from the caller's records; nothing is copied per token.
#[derive(Debug, Default)]
pub struct TokenBatch<'a> {
    distinct: Vec<&'a [u8]>,
    ids: Vec<u32>,
    /// Record `i`'s tokens are `ids[bounds[i]..bounds[i + 1]]`.
    bounds: Vec<usize>,
    dropped: usize,
}

/// Distinct tokens are numbered in order of first appearance. The table holds only the ids (4
/// bytes a slot, so a task's few tens of thousands of distinct tokens stay in the CPU's L2); the
/// tokens themselves are in `batch.distinct`.
struct Dedupe<'a> {
    index: HashTable<u32>,
    hasher: RandomState,
    batch: TokenBatch<'a>,
}

impl<'a> Dedupe<'a> {
    fn new(records: usize, tokens_hint: usize) -> Dedupe<'a> {
        let mut bounds = Vec::with_capacity(records + 1);
        bounds.push(0);
        Dedupe {
            index: HashTable::with_capacity(tokens_hint / 6),
            // Random seeds: records come from users, who must not be able to aim at one bucket.
            hasher: RandomState::default(),
            batch: TokenBatch {
                ids: Vec::with_capacity(tokens_hint),
                distinct: Vec::with_capacity(tokens_hint / 8),
                bounds,
                ..TokenBatch::default()
            },
        }
    }

    #[inline]
    fn token(&mut self, tok: &'a [u8]) -> Result<()> {
        let Dedupe {
            index,
            hasher,
            batch,
        } = self;
        let distinct = &mut batch.distinct;
        let h = hasher.hash_one(tok);
        let entry = index.entry(
            h,
            |&i| same(distinct[i as usize], tok),
            |&i| hasher.hash_one(distinct[i as usize]),
        );
        let id = match entry {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(v) => {
                let next = distinct.len();
                if next >= u32::MAX as usize {
                    return Err(Error::InvalidArgument(
                        "a batch holds fewer than 2^32 - 1 distinct tokens".into(),
                    ));
                }
                distinct.push(tok);
                v.insert(next as u32);
                next as u32
            }
        };
        batch.ids.push(id);
        Ok(())
    }

    fn end_record(&mut self) {
        self.batch.bounds.push(self.batch.ids.len());
    }
}

/// `a == b` for tokens, which are mostly a few bytes long: a call to memcmp costs more than
/// comparing them in one or two overlapping word loads.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

impl<'a> TokenBatch<'a> {
    /// Texts split on whitespace exactly as python/ramgrid/lm/corpus.py does (see [`tokenize`]).
    /// Bytes that were not UTF-8 must have been replaced beforehand (`String::from_utf8_lossy`
    /// replaces them as Python's `"replace"` error handler does).
    pub fn from_texts<S: AsRef<str>>(texts: &'a [S]) -> Result<TokenBatch<'a>> {
        let hint = texts.iter().map(|t| t.as_ref().len() / 6).sum::<usize>() + 1;
        let mut d = Dedupe::new(texts.len(), hint);
        let mut dropped = 0;
        for t in texts {
            let mut failed = Ok(());
            dropped += tokenize(t.as_ref(), |tok| {
                if failed.is_ok() {
                    failed = d.token(tok.as_bytes());
                }
            });
            failed?;
            d.end_record();
        }
        d.batch.dropped = dropped;
        Ok(d.batch)
    }

    /// Records given as token lists, used as they are (no splitting, no length limit).
    pub fn from_token_lists<R, T>(records: R) -> Result<TokenBatch<'a>>
    where
        R: IntoIterator<Item = T>,
        T: IntoIterator<Item = &'a [u8]>,
    {
        let records = records.into_iter();
        let mut d = Dedupe::new(records.size_hint().0, 0);
        for r in records {
            for tok in r {
                d.token(tok)?;
            }
            d.end_record();
        }
        Ok(d.batch)
    }

    /// Records in a packed layout: record `i` is tokens `record_offsets[i]..record_offsets[i + 1]`
    /// of `tokens` (which may be [`Keys::Packed`] or [`Keys::Slices`]).
    pub fn from_packed(record_offsets: &[i64], tokens: Keys<'a>) -> Result<TokenBatch<'a>> {
        tokens.validate()?;
        if matches!(tokens, Keys::I64(_)) {
            return Err(Error::InvalidArgument(
                "tokens must be byte strings, not integers".into(),
            ));
        }
        let m = tokens.len() as i64;
        let bad = record_offsets.is_empty()
            || record_offsets[0] != 0
            || *record_offsets.last().unwrap_or(&0) != m
            || record_offsets.windows(2).any(|w| w[0] > w[1]);
        if bad {
            return Err(Error::InvalidArgument(format!(
                "record offsets must be non-decreasing from 0 to the number of tokens ({m}), \
                 one more than there are records"
            )));
        }
        let records = record_offsets.windows(2).map(|w| {
            (w[0] as usize..w[1] as usize).map(move |j| match tokens.key(j) {
                crate::keys::KeyBytes::Borrowed(b) => b,
                crate::keys::KeyBytes::Int(_) => unreachable!("integer keys were refused"),
            })
        });
        TokenBatch::from_token_lists(records)
    }

    /// Number of records.
    pub fn records(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }

    /// Number of tokens over all records (after dropping long ones).
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// The distinct tokens, in order of first appearance: the keys to look up.
    pub fn distinct(&self) -> &[&'a [u8]] {
        &self.distinct
    }

    /// Tokens dropped for being longer than [`MAX_TOKEN_CHARS`] characters (texts only).
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// Reduces each record, given the value and found flag of each distinct token (in the order
    /// of [`TokenBatch::distinct`]). `version` is passed through to the result.
    pub fn reduce(
        &self,
        values: &[f64],
        found: &[bool],
        how: Reduce,
        miss: Miss,
        version: u32,
    ) -> Result<Reduced> {
        let k = self.distinct.len();
        if values.len() != k || found.len() != k {
            return Err(Error::InvalidArgument(format!(
                "{k} distinct tokens but {} values and {} found flags",
                values.len(),
                found.len()
            )));
        }
        let n = self.records();
        let mut out = Reduced {
            values: Vec::with_capacity(n),
            misses: Vec::with_capacity(n),
            counts: Vec::with_capacity(n),
            version,
            distinct: k,
            dropped: self.dropped,
        };
        // Misses resolved once per distinct token, so the per-token pass only reads.
        let (fill, skip) = match miss {
            Miss::Default(d) => (d, false),
            Miss::Skip => (f64::NAN, true),
        };
        let resolved: Vec<f64> = values
            .iter()
            .zip(found)
            .map(|(&v, &f)| if f { v } else { fill })
            .collect();
        let mut acc = Fsum::new();
        for (r, w) in self.bounds.windows(2).enumerate() {
            let ids = &self.ids[w[0]..w[1]];
            let mut misses = 0;
            let v = match how {
                Reduce::Sum | Reduce::Mean => {
                    acc.clear();
                    for &i in ids {
                        let hit = found[i as usize];
                        misses += usize::from(!hit);
                        if hit || !skip {
                            acc.add(resolved[i as usize]);
                        }
                    }
                    let s = acc
                        .value()
                        .map_err(|e| Error::InvalidArgument(format!("record {r}: {e}")))?;
                    let used = if skip { ids.len() - misses } else { ids.len() };
                    if how == Reduce::Sum {
                        s
                    } else if used == 0 {
                        // 0.0 / 0.0 would be x86's negative NaN: the documented NaN is f64::NAN.
                        f64::NAN
                    } else {
                        s / used as f64
                    }
                }
                Reduce::Max => {
                    let mut m: Option<f64> = None;
                    for &i in ids {
                        let hit = found[i as usize];
                        misses += usize::from(!hit);
                        if hit || !skip {
                            let x = resolved[i as usize];
                            m = Some(match m {
                                None => x,
                                Some(m) if m.is_nan() || x.is_nan() => f64::NAN,
                                // Python's max keeps the first of equal values (0.0 vs -0.0).
                                Some(m) => {
                                    if x > m {
                                        x
                                    } else {
                                        m
                                    }
                                }
                            });
                        }
                    }
                    m.unwrap_or(f64::NAN)
                }
            };
            out.values.push(v);
            out.misses.push(misses as i64);
            out.counts.push(ids.len() as i64);
        }
        Ok(out)
    }
}

/// One value per record, and what went into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduced {
    /// The reduced value of each record.
    pub values: Vec<f64>,
    /// Tokens of each record the table did not hold.
    pub misses: Vec<i64>,
    /// Tokens of each record (found or not).
    pub counts: Vec<i64>,
    /// The version read.
    pub version: u32,
    /// Distinct tokens looked up (the keys sent, at most).
    pub distinct: usize,
    /// Tokens dropped for being longer than [`MAX_TOKEN_CHARS`] characters (texts only).
    pub dropped: usize,
}

impl Client {
    /// Looks `keys` up in the f64 table `table` at `version` (0 = current) of `incarnation`
    /// (0 = whichever exists), into `values` and `found`; returns the version read. A table of
    /// another value type is refused before anything is sent.
    pub fn lookup_f64(
        &self,
        table: &str,
        incarnation: u64,
        version: u32,
        keys: &[&[u8]],
        values: &mut [f64],
        found: &mut [bool],
    ) -> Result<u32> {
        let meta = self.table_meta(table)?;
        if meta.value_type != ValueType::F64 {
            return Err(Error::InvalidArgument(format!(
                "lookup-reduce needs a table of f64 values; {table} holds {}",
                type_name(meta.value_type)
            )));
        }
        self.get_into_of(
            table,
            incarnation,
            Keys::Slices(keys),
            version,
            &mut ValuesMut::F64(values),
            found,
        )
    }

    /// The whole fused call: each distinct token of `batch` looked up once (one batched read per
    /// server), then each record reduced. The records' order is kept.
    pub fn lookup_reduce(
        &self,
        table: &str,
        incarnation: u64,
        version: u32,
        batch: &TokenBatch<'_>,
        how: Reduce,
        miss: Miss,
    ) -> Result<Reduced> {
        let k = batch.distinct().len();
        let mut values = vec![0.0; k];
        let mut found = vec![false; k];
        let version = self.lookup_f64(
            table,
            incarnation,
            version,
            batch.distinct(),
            &mut values,
            &mut found,
        )?;
        batch.reduce(&values, &found, how, miss, version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(batch: &TokenBatch<'_>, table: &[(&str, f64)]) -> (Vec<f64>, Vec<bool>) {
        batch
            .distinct()
            .iter()
            .map(|t| {
                table
                    .iter()
                    .find(|(k, _)| k.as_bytes() == *t)
                    .map_or((0.0, false), |(_, v)| (*v, true))
            })
            .unzip()
    }

    #[test]
    fn short_token_comparison_is_exact() {
        let words: Vec<Vec<u8>> = (0..=20)
            .flat_map(|n| {
                (0..n).map(move |flip| {
                    let mut w: Vec<u8> = (0..n as u8).map(|i| b'a' + i).collect();
                    w[flip] ^= 0x20;
                    w
                })
            })
            .chain((0..=20).map(|n| (0..n as u8).map(|i| b'a' + i).collect()))
            .collect();
        for a in &words {
            for b in &words {
                assert_eq!(same(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn dedupes_across_records_in_first_seen_order() {
        let texts = ["b a b", "", "a c\u{3000}b", "  "];
        let batch = TokenBatch::from_texts(&texts).unwrap();
        assert_eq!(batch.records(), 4);
        assert_eq!(batch.tokens(), 6);
        let d: Vec<&[u8]> = batch.distinct().to_vec();
        assert_eq!(d, [b"b".as_ref(), b"a", b"c"]);
        assert_eq!(batch.ids, [0, 1, 0, 1, 2, 0]);
        assert_eq!(batch.bounds, [0, 3, 3, 6, 6]);
    }

    #[test]
    fn sums_are_exact_and_misses_take_the_default() {
        let texts = ["big one -big", "one unk", "", "unk unk"];
        let batch = TokenBatch::from_texts(&texts).unwrap();
        let (v, f) = model(&batch, &[("big", 1e100), ("one", 1.0), ("-big", -1e100)]);
        let r = batch
            .reduce(&v, &f, Reduce::Sum, Miss::Default(-7.0), 3)
            .unwrap();
        assert_eq!(r.values, [1.0, -6.0, 0.0, -14.0]);
        assert_eq!(r.misses, [0, 1, 0, 2]);
        assert_eq!(r.counts, [3, 2, 0, 2]);
        assert_eq!((r.version, r.distinct), (3, 4));
        let m = batch
            .reduce(&v, &f, Reduce::Mean, Miss::Default(-7.0), 3)
            .unwrap();
        assert_eq!(m.values[..2], [1.0 / 3.0, -3.0]);
        assert!(m.values[2].is_nan());
        let x = batch
            .reduce(&v, &f, Reduce::Max, Miss::Default(-7.0), 3)
            .unwrap();
        assert_eq!(x.values[0], 1e100);
        assert_eq!(x.values[1], 1.0);
        assert!(x.values[2].is_nan());
        assert_eq!(x.values[3], -7.0);
    }

    #[test]
    fn skipped_misses_leave_the_record() {
        let texts = ["one unk two", "unk"];
        let batch = TokenBatch::from_texts(&texts).unwrap();
        let (v, f) = model(&batch, &[("one", 1.0), ("two", 2.0)]);
        let s = batch.reduce(&v, &f, Reduce::Sum, Miss::Skip, 1).unwrap();
        assert_eq!(s.values, [3.0, 0.0]);
        assert_eq!(s.misses, [1, 1]);
        let m = batch.reduce(&v, &f, Reduce::Mean, Miss::Skip, 1).unwrap();
        assert_eq!(m.values[0], 1.5);
        assert!(m.values[1].is_nan());
        let x = batch.reduce(&v, &f, Reduce::Max, Miss::Skip, 1).unwrap();
        assert_eq!(x.values[0], 2.0);
        assert!(x.values[1].is_nan());
    }

    #[test]
    fn max_propagates_nan_and_sum_errors_name_the_record() {
        let texts = ["a b", "inf ninf"];
        let batch = TokenBatch::from_texts(&texts).unwrap();
        let (v, f) = model(
            &batch,
            &[
                ("a", f64::NAN),
                ("b", 1.0),
                ("inf", f64::INFINITY),
                ("ninf", f64::NEG_INFINITY),
            ],
        );
        let x = batch.reduce(&v, &f, Reduce::Max, Miss::Skip, 1).unwrap();
        assert!(x.values[0].is_nan());
        assert_eq!(x.values[1], f64::INFINITY);
        let e = batch
            .reduce(&v, &f, Reduce::Sum, Miss::Skip, 1)
            .unwrap_err();
        assert!(
            e.to_string().contains("record 1: -inf + inf in fsum"),
            "{e}"
        );
    }

    #[test]
    fn token_lists_and_packed_records_agree() {
        let lists: Vec<Vec<&[u8]>> = vec![vec![b"x", b"y", b"x"], vec![], vec![b"a b"]];
        let a = TokenBatch::from_token_lists(lists.iter().map(|r| r.iter().copied())).unwrap();
        let data = b"xyxa b";
        let offsets = [0i64, 1, 2, 3, 6];
        let b = TokenBatch::from_packed(
            &[0, 3, 3, 4],
            Keys::Packed {
                offsets: &offsets,
                data,
            },
        )
        .unwrap();
        assert_eq!(a.distinct(), b.distinct());
        assert_eq!((a.ids.clone(), a.bounds.clone()), (b.ids, b.bounds));
        assert_eq!(a.distinct(), [b"x".as_ref(), b"y", b"a b"]);
        for bad in [&[0i64, 3, 2, 4][..], &[0, 3, 3, 5], &[1, 4], &[]] {
            let e = TokenBatch::from_packed(
                bad,
                Keys::Packed {
                    offsets: &offsets,
                    data,
                },
            );
            assert!(e.is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reduce_checks_the_lookup_shape_and_parses_names() {
        let batch = TokenBatch::from_texts(&["a b"]).unwrap();
        assert!(batch
            .reduce(&[1.0], &[true], Reduce::Sum, Miss::Skip, 1)
            .is_err());
        assert_eq!("mean".parse::<Reduce>().unwrap(), Reduce::Mean);
        assert!("median".parse::<Reduce>().is_err());
    }
}
