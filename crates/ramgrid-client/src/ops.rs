//! Operators run at the data (OPERATOR, docs/protocol-native.md section 10): one partition round
//! (`round.rs`) over every partition of the table, each partition's partial taken from exactly one
//! reply, merged here.
//!
//! Exact or refused:
//! 1. A partition's partial is kept only from a reply that answered it OK; a partition refused
//!    after its pass (the epoch changed, it left the server, it is being copied in) keeps no
//!    partial and is asked again, alone with the others refused, after the spec is refreshed. The
//!    partitions already answered are not asked again, so nothing is counted twice.
//! 2. With version 0 ("current") every server resolves the version itself; partitions that
//!    resolved an older one than the newest seen are run again at the newest, so the result is of
//!    one version.
//! 3. After `spec_retries` refreshes the call fails with [`Error::PartitionsUnavailable`] naming
//!    the partitions it could not get; it never returns a result that lacks one.
//!
//! Load: partition `p` goes first to replica `(p + n) mod R`, `n` a counter of the client's
//! operator calls, so successive calls spread passes over every replica (`round::Pick::Spread`).

use std::sync::atomic::{AtomicU64, Ordering};

use ramgrid_proto::native::{
    encode_op, f64_bytes, F64s, OpReply, Operator, Outcome, Partial, Predicate, Response, Stats,
    ValueType,
};

use crate::client::{encode_err, unexpected, Client, Handled, OpError};
use crate::error::{Error, Result};
use crate::round::{Pick, RoundIo};

/// An operator to run, with its parameters (owned: the client's side of [`Operator`]).
#[derive(Debug, Clone, PartialEq)]
pub enum OpSpec {
    /// Items (satisfying the predicate).
    Count {
        /// Optional range `lo <= v < hi` on one component.
        predicate: Option<Predicate>,
    },
    /// Count, sum, min, max, mean, variance of one numeric column.
    Stats {
        /// Component of a vector (0 for scalar tables).
        column: u32,
        /// Optional range.
        predicate: Option<Predicate>,
    },
    /// Counts per bin of `edges` (numpy's rule).
    Histogram {
        /// Component of a vector (0 for scalar tables).
        column: u32,
        /// Optional range.
        predicate: Option<Predicate>,
        /// Strictly increasing.
        edges: Vec<f64>,
    },
    /// Logistic-regression loss and gradient (rows: features then the 0/1 label).
    LrGradient {
        /// Coefficients then the intercept (`dim` numbers).
        weights: Vec<f64>,
        /// L2 penalty `l2 / 2 * |coefficients|^2` added once to the loss (and `l2 * w` to the
        /// gradient of the coefficients; the intercept is not penalized).
        l2: f64,
    },
    /// One k-means step over the first `components` components.
    KmeansStep {
        /// Leading components used.
        components: u32,
        /// `k × components`, centroid by centroid.
        centroids: Vec<f64>,
    },
    /// The `k` items with the largest (or smallest) values of one numeric column.
    TopK {
        /// Component of a vector (0 for scalar tables).
        column: u32,
        /// How many.
        k: u32,
        /// Largest first; else smallest first.
        largest: bool,
        /// Optional range.
        predicate: Option<Predicate>,
    },
}

/// A whole table's result: every partition's partial merged.
#[derive(Debug, Clone, PartialEq)]
pub enum OpResult {
    /// Selected items, and items in the table.
    Count {
        /// Selected.
        matched: u64,
        /// In the table (this version).
        scanned: u64,
    },
    /// Summary statistics (population variance: `m2 / count`).
    Stats(Stats),
    /// A count per bin.
    Histogram(Vec<u64>),
    /// Summed loss and gradient over `rows` rows (plus the L2 term once, if asked).
    LrGradient {
        /// Rows.
        rows: u64,
        /// Summed log-loss.
        loss: f64,
        /// Summed gradient: coefficients then intercept.
        gradient: Vec<f64>,
    },
    /// Per centroid: rows nearest to it and their sum; summed squared distances.
    KmeansStep {
        /// Per centroid.
        counts: Vec<u64>,
        /// `k × components`.
        sums: Vec<f64>,
        /// Summed squared distances.
        inertia: f64,
    },
    /// The best items over the whole table, best first (equal values by key bytes, smaller
    /// first): (key, value of the column as f64).
    TopK(Vec<(Vec<u8>, f64)>),
}

/// What [`Client::run_op`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct OpAnswer {
    /// The merged result.
    pub result: OpResult,
    /// The version every partition was read at.
    pub version: u32,
    /// Partitions asked again after a refusal or a stale map (0 when nothing changed).
    pub retried: u32,
}

/// Counter behind [`Pick::Spread`]: one step per operator call.
static SPREAD: AtomicU64 = AtomicU64::new(0);

impl OpSpec {
    fn wire<'a>(&self, arrays: &'a [u8]) -> Operator<'a> {
        let f = F64s::new(arrays);
        match self {
            OpSpec::Count { predicate } => Operator::Count {
                predicate: *predicate,
            },
            OpSpec::Stats { column, predicate } => Operator::Stats {
                column: *column,
                predicate: *predicate,
            },
            OpSpec::Histogram {
                column, predicate, ..
            } => Operator::Histogram {
                column: *column,
                predicate: *predicate,
                edges: f,
            },
            OpSpec::LrGradient { .. } => Operator::LrGradient { weights: f },
            OpSpec::KmeansStep { components, .. } => Operator::KmeansStep {
                components: *components,
                centroids: f,
            },
            OpSpec::TopK {
                column,
                k,
                largest,
                predicate,
            } => Operator::TopK {
                column: *column,
                k: *k,
                largest: *largest,
                predicate: *predicate,
            },
        }
    }

    fn arrays(&self) -> Vec<u8> {
        match self {
            OpSpec::Histogram { edges, .. } => f64_bytes(edges),
            OpSpec::LrGradient { weights, .. } => f64_bytes(weights),
            OpSpec::KmeansStep { centroids, .. } => f64_bytes(centroids),
            OpSpec::Count { .. } | OpSpec::Stats { .. } | OpSpec::TopK { .. } => Vec::new(),
        }
    }

    /// Bytes one partition's answer takes, generously (for splitting frames under the limit).
    fn answer_len(&self, vt: ValueType) -> usize {
        let dim = match vt {
            ValueType::F32Vec(d) => d as usize,
            _ => 1,
        };
        5 + match self {
            OpSpec::Count { .. } => 16,
            OpSpec::Stats { .. } => 48,
            OpSpec::Histogram { edges, .. } => 4 + 8 * edges.len(),
            OpSpec::LrGradient { .. } => 20 + 8 * dim,
            OpSpec::KmeansStep {
                components,
                centroids,
            } => 24 + 8 * (centroids.len() + centroids.len() / (*components).max(1) as usize),
            // Keys of up to 54 bytes; longer ones may make a frame's reply TOO_LARGE.
            OpSpec::TopK { k, .. } => 4 + 64 * *k as usize,
        }
    }
}

impl Client {
    /// Runs `op` over every partition of `table` at `version` (0 = current) of incarnation
    /// `incarnation` (0 = whichever exists), exact or refused (see the module).
    pub fn run_op(
        &self,
        table: &str,
        version: u32,
        incarnation: u64,
        op: &OpSpec,
    ) -> Result<OpAnswer> {
        let _call = self.call();
        if let OpSpec::KmeansStep {
            components,
            centroids,
        } = op
        {
            if *components == 0 || centroids.len() % *components as usize != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{} centroid numbers are not k × {components}",
                    centroids.len()
                )));
            }
        }
        let arrays = op.arrays();
        let wire_op = op.wire(&arrays);
        let seed = SPREAD.fetch_add(1, Ordering::Relaxed);
        let mut meta = self.table_meta(table)?;
        if incarnation != 0 && meta.incarnation != incarnation {
            return Err(Error::TableNotFound(format!(
                "{table} (the version asked for belonged to a table of that name dropped since)"
            )));
        }
        let inc = meta.incarnation;
        let n = meta.partitions as usize;
        let mut partials: Vec<Option<(u32, Partial)>> = vec![None; n];
        let mut pin = version;
        let (mut attempt, mut retried) = (0u32, 0u32);
        loop {
            let todo: Vec<u32> = (0..n as u32)
                .filter(|&p| partials[p as usize].is_none())
                .collect();
            if todo.is_empty() {
                // One version: partitions that resolved an older "current" run again at the newest.
                let newest = partials
                    .iter()
                    .flatten()
                    .map(|(v, _)| *v)
                    .max()
                    .unwrap_or(0);
                let mut older = 0;
                for slot in partials.iter_mut() {
                    if slot.as_ref().is_some_and(|(v, _)| *v != newest) {
                        *slot = None;
                        older += 1;
                    }
                }
                if older == 0 {
                    let result = merge(op, partials.into_iter().flatten().map(|(_, p)| p))?;
                    return Ok(OpAnswer {
                        result,
                        version: newest,
                        retried,
                    });
                }
                pin = newest;
                retried += older;
                continue;
            }
            let topo = self.topology();
            meta = self.table_meta(table)?;
            if meta.incarnation != inc {
                return Err(Error::TableNotFound(format!(
                    "{table} (dropped and created again while an operator ran over it)"
                )));
            }
            let map = topo.map(&meta);
            let per_frame = (self.max_body_for_ops() / op.answer_len(meta.value_type)).max(1);
            let mut refused: Vec<(u32, usize, String)> = Vec::new();
            let mut stale: Option<(usize, String)> = None;
            for chunk in todo.chunks(per_frame) {
                let mut encode = |_s: usize, parts: &[u32], buf: &mut Vec<u8>, id: u64| {
                    encode_op(buf, id, table, pin, map.epoch(), inc, parts, &wire_op)
                        .map_err(encode_err)
                };
                let (partials, refused) = (&mut partials, &mut refused);
                let mut take = |s: usize, parts: &[u32], done: &[bool], resp: Response<'_>| {
                    let addr = &topo.pools[s].addr;
                    match resp {
                        Response::Operator(r) => Ok(take_reply(
                            r, &wire_op, addr, s, parts, done, partials, refused,
                        )),
                        other => Ok(Handled::Failed(unexpected(addr, &other))),
                    }
                };
                let io = RoundIo {
                    opcode: ramgrid_proto::native::Opcode::Operator,
                    hedge: false,
                    // Spread where every replica holds the same (a sealed version, or relaxed
                    // reads); the primaries otherwise, as a read would (round.rs, read_pick).
                    pick: match self.read_pick(table, pin) {
                        Pick::Spread(_) => Pick::Spread(seed),
                        other => other,
                    },
                    keys_in: &|_| 1,
                    encode: &mut encode,
                    take: &mut take,
                };
                match self.partition_round(&topo, &map, table, pin, chunk.to_vec(), io) {
                    Ok(()) => {}
                    Err(OpError::Stale(s, why)) => {
                        stale = Some((s, why));
                        break;
                    }
                    Err(OpError::Fatal(Error::TableNotFound(t))) => {
                        self.inner.tables.write().remove(table);
                        return Err(Error::TableNotFound(t));
                    }
                    Err(OpError::Fatal(e)) => return Err(e),
                }
            }
            let (s, why) = match (stale, refused.first()) {
                (None, None) => continue,
                (Some(st), _) => st,
                (None, Some((_, s, _))) => (
                    *s,
                    refused
                        .iter()
                        .map(|(p, _, m)| format!("partition {p}: {m}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
            };
            // Every partition still unanswered is asked again: those refused one by one, and those
            // of a frame refused whole for a stale map (which no `refused` entry names).
            let missing: Vec<u32> = (0..n as u32)
                .filter(|&p| partials[p as usize].is_none())
                .collect();
            retried += missing.len() as u32;
            if attempt >= self.inner.spec_retries {
                return Err(Error::PartitionsUnavailable {
                    partitions: missing,
                    detail: format!(
                        "an operator over {table} was refused after {attempt} refreshes of the cluster spec: {why}"
                    ),
                });
            }
            attempt += 1;
            crate::client::stale_backoff(attempt);
            self.on_stale(&topo, s, table)?;
        }
    }

    /// The body limit operator replies must fit (the servers' announced limit).
    fn max_body_for_ops(&self) -> usize {
        self.max_body().saturating_sub(256).max(1024)
    }
}

/// Takes one OPERATOR reply: each partition's partial, unless another reply answered it first.
#[expect(
    clippy::too_many_arguments,
    reason = "the reply and where its parts go"
)]
fn take_reply(
    r: OpReply,
    op: &Operator<'_>,
    addr: &str,
    s: usize,
    parts: &[u32],
    done: &[bool],
    partials: &mut [Option<(u32, Partial)>],
    refused: &mut Vec<(u32, usize, String)>,
) -> Handled {
    let mut got: Vec<u32> = r.results.iter().map(|(p, _)| *p).collect();
    let mut want = parts.to_vec();
    got.sort_unstable();
    want.sort_unstable();
    let shape_ok = r.kind == op.kind()
        && got == want
        && r.results.iter().all(|(_, o)| match o {
            Outcome::Done(p) => p.kind() == op.kind() && partial_fits(p, op),
            Outcome::Refused { .. } => true,
        });
    if !shape_ok {
        return Handled::Failed(Error::Protocol {
            server: addr.to_string(),
            message: "OPERATOR reply does not answer the partitions or operator asked".into(),
        });
    }
    for (p, outcome) in r.results {
        if done[p as usize] {
            continue;
        }
        match outcome {
            Outcome::Done(partial) => partials[p as usize] = Some((r.version, partial)),
            Outcome::Refused { status, message } => {
                refused.push((p, s, format!("{addr} {}: {message}", status.name())))
            }
        }
    }
    Handled::Ok
}

/// Whether a partial has the shape the request implies (so merging cannot go out of bounds).
fn partial_fits(p: &Partial, op: &Operator<'_>) -> bool {
    match (p, op) {
        (Partial::Histogram(c), Operator::Histogram { edges, .. }) => c.len() + 1 == edges.len(),
        (Partial::LrGradient { gradient, .. }, Operator::LrGradient { weights }) => {
            gradient.len() == weights.len()
        }
        (
            Partial::KmeansStep {
                components,
                counts,
                sums,
                ..
            },
            Operator::KmeansStep {
                components: c,
                centroids,
            },
        ) => {
            components == c
                && *c > 0
                && counts.len() == centroids.len() / *c as usize
                && sums.len() == centroids.len()
        }
        (Partial::TopK(items), Operator::TopK { k, .. }) => items.len() <= *k as usize,
        _ => true,
    }
}

/// Every partition's partial merged into the table's result.
fn merge(op: &OpSpec, parts: impl Iterator<Item = Partial>) -> Result<OpResult> {
    if let OpSpec::TopK { k, largest, .. } = op {
        let mut all: Vec<(Vec<u8>, f64)> = parts
            .flat_map(|p| match p {
                Partial::TopK(items) => items,
                _ => Vec::new(),
            })
            .collect();
        all.sort_by(|a, b| {
            let by = if *largest {
                b.1.partial_cmp(&a.1)
            } else {
                a.1.partial_cmp(&b.1)
            };
            by.unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.0.cmp(&b.0))
        });
        all.truncate(*k as usize);
        return Ok(OpResult::TopK(all));
    }
    let mut acc: Option<OpResult> = None;
    for p in parts {
        let r = match p {
            Partial::Count { matched, scanned } => OpResult::Count { matched, scanned },
            Partial::Stats(s) => OpResult::Stats(s),
            Partial::Histogram(h) => OpResult::Histogram(h),
            Partial::LrGradient {
                rows,
                loss,
                gradient,
            } => OpResult::LrGradient {
                rows,
                loss,
                gradient,
            },
            Partial::KmeansStep {
                counts,
                sums,
                inertia,
                ..
            } => OpResult::KmeansStep {
                counts,
                sums,
                inertia,
            },
            Partial::TopK(items) => OpResult::TopK(items),
        };
        acc = Some(match acc {
            None => r,
            Some(a) => combine(a, r),
        });
    }
    let mut result =
        acc.ok_or_else(|| Error::InvalidArgument("a table has no partitions".into()))?;
    if let (OpSpec::LrGradient { weights, l2 }, OpResult::LrGradient { loss, gradient, .. }) =
        (op, &mut result)
    {
        if *l2 != 0.0 {
            let d = weights.len() - 1;
            for j in 0..d {
                gradient[j] += l2 * weights[j];
                *loss += 0.5 * l2 * weights[j] * weights[j];
            }
        }
    }
    Ok(result)
}

fn add_all<T: Copy + std::ops::AddAssign>(a: &mut [T], b: &[T]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
}

fn combine(a: OpResult, b: OpResult) -> OpResult {
    match (a, b) {
        (
            OpResult::Count { matched, scanned },
            OpResult::Count {
                matched: m,
                scanned: s,
            },
        ) => OpResult::Count {
            matched: matched + m,
            scanned: scanned + s,
        },
        (OpResult::Stats(x), OpResult::Stats(y)) => OpResult::Stats(x.merge(&y)),
        (OpResult::Histogram(mut x), OpResult::Histogram(y)) => {
            add_all(&mut x, &y);
            OpResult::Histogram(x)
        }
        (
            OpResult::LrGradient {
                rows,
                loss,
                mut gradient,
            },
            OpResult::LrGradient {
                rows: r,
                loss: l,
                gradient: g,
            },
        ) => {
            add_all(&mut gradient, &g);
            OpResult::LrGradient {
                rows: rows + r,
                loss: loss + l,
                gradient,
            }
        }
        (
            OpResult::KmeansStep {
                mut counts,
                mut sums,
                inertia,
            },
            OpResult::KmeansStep {
                counts: c,
                sums: s,
                inertia: i,
            },
        ) => {
            add_all(&mut counts, &c);
            add_all(&mut sums, &s);
            OpResult::KmeansStep {
                counts,
                sums,
                inertia: inertia + i,
            }
        }
        (a, _) => a,
    }
}
