//! OPERATOR (0x40): one operator run by a server over some partitions of one version of a table,
//! answered with one partial result (or one refusal) per partition. Spec: docs/protocol-native.md,
//! section 10.
//!
//! Parameters that are arrays of numbers (weights, centroids, histogram edges) stay as borrowed
//! little-endian bytes ([`F64s`]); nothing here checks what they mean (finite, increasing, of the
//! table's width): the server does, and refuses with BAD_REQUEST.

use super::error::FrameError;
use super::frame::Opcode;
use super::frame::Pending;
use super::types::Status;
use super::wire::{self, put_u32, put_u64, put_u8, Reader};

/// Most partitions one OPERATOR frame names (a table's partition limit).
pub const MAX_OP_PARTITIONS: u32 = 1 << 16;
/// Most bins a histogram has (edges: one more).
pub const MAX_HISTOGRAM_BINS: u32 = 1 << 16;

/// A run of little-endian `f64`s, borrowed from a frame (or from the caller's bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct F64s<'a>(&'a [u8]);

impl<'a> F64s<'a> {
    /// Views `bytes` (8 per number; a trailing partial number is ignored).
    pub fn new(bytes: &'a [u8]) -> F64s<'a> {
        F64s(&bytes[..bytes.len() / 8 * 8])
    }

    /// The numbers' little-endian bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }

    /// How many numbers.
    pub fn len(&self) -> usize {
        self.0.len() / 8
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number `i` (`i < len()`).
    pub fn get(&self, i: usize) -> f64 {
        let b: [u8; 8] = self.0[i * 8..i * 8 + 8].try_into().expect("8 bytes");
        f64::from_le_bytes(b)
    }

    /// Every number, in order.
    pub fn iter(&self) -> impl Iterator<Item = f64> + 'a {
        self.0
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
    }

    /// The numbers as a vector.
    pub fn to_vec(&self) -> Vec<f64> {
        self.iter().collect()
    }
}

/// Little-endian bytes of `xs`, for [`F64s::new`].
pub fn f64_bytes(xs: &[f64]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A range on one numeric value: selects `lo <= v < hi` (the value itself for i64 and f64
/// tables, component `component` of each vector for f32vec tables).
#[derive(Debug, Clone, Copy)]
pub struct Predicate {
    /// Which component of a vector (0 for scalar tables).
    pub component: u32,
    /// Smallest value selected (`-inf`: no lower bound).
    pub lo: f64,
    /// Values from this one up are not selected (`+inf`: no upper bound).
    pub hi: f64,
}

impl PartialEq for Predicate {
    fn eq(&self, o: &Predicate) -> bool {
        self.component == o.component
            && self.lo.to_bits() == o.lo.to_bits()
            && self.hi.to_bits() == o.hi.to_bits()
    }
}
impl Eq for Predicate {}

/// An operator and its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator<'a> {
    /// How many items (that satisfy the predicate).
    Count {
        /// Optional value range.
        predicate: Option<Predicate>,
    },
    /// Count, sum, min, max, mean and the sum of squared deviations of one numeric column.
    Stats {
        /// Which component of a vector (0 for scalar tables).
        column: u32,
        /// Optional value range (on any column).
        predicate: Option<Predicate>,
    },
    /// Counts of one numeric column's values per bin of given edges.
    Histogram {
        /// Which component of a vector (0 for scalar tables).
        column: u32,
        /// Optional value range.
        predicate: Option<Predicate>,
        /// Bin edges, strictly increasing, at least 2.
        edges: F64s<'a>,
    },
    /// The logistic-regression loss and its gradient over f32-vector rows whose last component is
    /// the 0/1 label: weights are the `dim - 1` coefficients then the intercept.
    LrGradient {
        /// `dim` numbers.
        weights: F64s<'a>,
    },
    /// One k-means step: per centroid, the count and sum of the rows nearest to it (on their first
    /// `components` components), and the sum of squared distances.
    KmeansStep {
        /// Leading components of each vector used.
        components: u32,
        /// `k × components` numbers, centroid by centroid.
        centroids: F64s<'a>,
    },
    /// The `k` items with the largest (or smallest) values of one numeric column, as (key, value).
    TopK {
        /// Which component of a vector (0 for scalar tables).
        column: u32,
        /// How many, at least 1.
        k: u32,
        /// Largest first; else smallest first.
        largest: bool,
        /// Optional value range.
        predicate: Option<Predicate>,
    },
}

/// The operator codes (the `u8` after the partitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    /// [`Operator::Count`].
    Count = 1,
    /// [`Operator::Stats`].
    Stats = 2,
    /// [`Operator::Histogram`].
    Histogram = 3,
    /// [`Operator::LrGradient`].
    LrGradient = 4,
    /// [`Operator::KmeansStep`].
    KmeansStep = 5,
    /// [`Operator::TopK`].
    TopK = 6,
}

impl OpKind {
    /// The kind for a wire byte.
    pub fn from_u8(b: u8) -> Option<OpKind> {
        Some(match b {
            1 => OpKind::Count,
            2 => OpKind::Stats,
            3 => OpKind::Histogram,
            4 => OpKind::LrGradient,
            5 => OpKind::KmeansStep,
            6 => OpKind::TopK,
            _ => return None,
        })
    }

    /// The spec's name (`"COUNT"`).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Count => "COUNT",
            OpKind::Stats => "STATS",
            OpKind::Histogram => "HISTOGRAM",
            OpKind::LrGradient => "LR_GRADIENT",
            OpKind::KmeansStep => "KMEANS_STEP",
            OpKind::TopK => "TOP_K",
        }
    }

    /// The kind with the spec's name.
    pub fn from_name(name: &str) -> Option<OpKind> {
        (1..=6)
            .filter_map(OpKind::from_u8)
            .find(|k| k.name() == name)
    }
}

impl Operator<'_> {
    /// Its code.
    pub fn kind(&self) -> OpKind {
        match self {
            Operator::Count { .. } => OpKind::Count,
            Operator::Stats { .. } => OpKind::Stats,
            Operator::Histogram { .. } => OpKind::Histogram,
            Operator::LrGradient { .. } => OpKind::LrGradient,
            Operator::KmeansStep { .. } => OpKind::KmeansStep,
            Operator::TopK { .. } => OpKind::TopK,
        }
    }
}

/// A run of little-endian `u32`s (the partitions of a request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct U32s<'a>(&'a [u8]);

impl<'a> U32s<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every number, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.0
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
    }
}

/// An OPERATOR request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpRequest<'a> {
    /// Table name.
    pub table: &'a str,
    /// 0 = current; otherwise a pinned version.
    pub version: u32,
    /// The epoch of the partition map the client routed with.
    pub epoch: u64,
    /// The table incarnation meant (0 = whichever exists).
    pub incarnation: u64,
    /// The partitions to run over: distinct, at least one.
    pub partitions: U32s<'a>,
    /// What to run.
    pub op: Operator<'a>,
}

pub(super) fn read_predicate(r: &mut Reader<'_>) -> Result<Option<Predicate>, FrameError> {
    if !r.bool("predicate present")? {
        return Ok(None);
    }
    Ok(Some(Predicate {
        component: r.u32("predicate component")?,
        lo: f64::from_bits(r.u64("predicate lo")?),
        hi: f64::from_bits(r.u64("predicate hi")?),
    }))
}

pub(super) fn put_predicate(out: &mut Vec<u8>, p: &Option<Predicate>) {
    match p {
        None => put_u8(out, 0),
        Some(p) => {
            put_u8(out, 1);
            put_u32(out, p.component);
            put_u64(out, p.lo.to_bits());
            put_u64(out, p.hi.to_bits());
        }
    }
}

fn read_f64s<'a>(r: &mut Reader<'a>, n: u32, what: &'static str) -> Result<F64s<'a>, FrameError> {
    let bytes = (n as usize)
        .checked_mul(8)
        .ok_or(FrameError::Malformed(what))?;
    Ok(F64s(r.take(bytes, what)?))
}

fn put_f64s(out: &mut Vec<u8>, xs: &F64s<'_>) {
    out.extend_from_slice(xs.0);
}

fn count_u32(n: usize, what: &'static str) -> Result<u32, FrameError> {
    u32::try_from(n).map_err(|_| FrameError::Encode(what))
}

impl<'a> OpRequest<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<OpRequest<'a>, FrameError> {
        let table = r.name("table name")?;
        let version = r.u32("version")?;
        let epoch = r.u64("epoch")?;
        let incarnation = r.u64("incarnation")?;
        let n = r.u32("partition count")?;
        if n == 0 || n > MAX_OP_PARTITIONS {
            return Err(FrameError::Malformed("partition count"));
        }
        let partitions = U32s(r.take(n as usize * 4, "partitions")?);
        let mut seen: Vec<u32> = partitions.iter().collect();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(FrameError::Malformed("partition named twice"));
        }
        let kind = OpKind::from_u8(r.u8("operator")?).ok_or(FrameError::Malformed("operator"))?;
        let op = match kind {
            OpKind::Count => Operator::Count {
                predicate: read_predicate(r)?,
            },
            OpKind::Stats => Operator::Stats {
                column: r.u32("column")?,
                predicate: read_predicate(r)?,
            },
            OpKind::Histogram => {
                let column = r.u32("column")?;
                let predicate = read_predicate(r)?;
                let m = r.u32("edge count")?;
                if !(2..=MAX_HISTOGRAM_BINS + 1).contains(&m) {
                    return Err(FrameError::Malformed("edge count"));
                }
                Operator::Histogram {
                    column,
                    predicate,
                    edges: read_f64s(r, m, "edges")?,
                }
            }
            OpKind::LrGradient => {
                let n = r.u32("weight count")?;
                Operator::LrGradient {
                    weights: read_f64s(r, n, "weights")?,
                }
            }
            OpKind::KmeansStep => {
                let components = r.u32("components")?;
                let k = r.u32("centroid count")?;
                // A step has at least one centroid of at least one component (and only then does
                // `k` follow from the centroids, so that the frame re-encodes to itself).
                if components == 0 || k == 0 {
                    return Err(FrameError::Malformed("centroids"));
                }
                let n = (components as u64) * (k as u64);
                let n = u32::try_from(n).map_err(|_| FrameError::Malformed("centroids"))?;
                Operator::KmeansStep {
                    components,
                    centroids: read_f64s(r, n, "centroids")?,
                }
            }
            OpKind::TopK => Operator::TopK {
                column: r.u32("column")?,
                k: r.u32("k")?,
                largest: r.bool("largest")?,
                predicate: read_predicate(r)?,
            },
        };
        Ok(OpRequest {
            table,
            version,
            epoch,
            incarnation,
            partitions,
            op,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        put_u64(out, self.epoch);
        put_u64(out, self.incarnation);
        put_u32(out, count_u32(self.partitions.len(), "partition count")?);
        out.extend_from_slice(self.partitions.0);
        put_u8(out, self.op.kind() as u8);
        match &self.op {
            Operator::Count { predicate } => put_predicate(out, predicate),
            Operator::Stats { column, predicate } => {
                put_u32(out, *column);
                put_predicate(out, predicate);
            }
            Operator::Histogram {
                column,
                predicate,
                edges,
            } => {
                put_u32(out, *column);
                put_predicate(out, predicate);
                put_u32(out, count_u32(edges.len(), "edge count")?);
                put_f64s(out, edges);
            }
            Operator::LrGradient { weights } => {
                put_u32(out, count_u32(weights.len(), "weight count")?);
                put_f64s(out, weights);
            }
            Operator::KmeansStep {
                components,
                centroids,
            } => {
                if *components == 0 || centroids.is_empty() {
                    return Err(FrameError::Encode(
                        "a k-means step needs a centroid and a component",
                    ));
                }
                let k = centroids.len() / *components as usize;
                if k * *components as usize != centroids.len() {
                    return Err(FrameError::Encode("centroids are not k × components"));
                }
                put_u32(out, *components);
                put_u32(out, count_u32(k, "centroid count")?);
                put_f64s(out, centroids);
            }
            Operator::TopK {
                column,
                k,
                largest,
                predicate,
            } => {
                put_u32(out, *column);
                put_u32(out, *k);
                put_u8(out, u8::from(*largest));
                put_predicate(out, predicate);
            }
        }
        Ok(())
    }
}

/// Appends a whole OPERATOR request frame for `partitions` (the client's encoder).
#[expect(
    clippy::too_many_arguments,
    reason = "the request's fields, as the spec lists them"
)]
pub fn encode_op(
    out: &mut Vec<u8>,
    request_id: u64,
    table: &str,
    version: u32,
    epoch: u64,
    incarnation: u64,
    partitions: &[u32],
    op: &Operator<'_>,
) -> Result<(), FrameError> {
    let bytes: Vec<u8> = partitions.iter().flat_map(|p| p.to_le_bytes()).collect();
    let req = OpRequest {
        table,
        version,
        epoch,
        incarnation,
        partitions: U32s(&bytes),
        op: *op,
    };
    let p = Pending::begin(out, Opcode::Operator, 0, request_id);
    req.write(p.out)?;
    p.finish()
}

/// The summary statistics of some values: `mean` and `m2` (the sum of squared deviations from
/// the mean) merge exactly (Chan et al.), so partials of partitions combine without cancellation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// How many values.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// The smallest (`+inf` when none).
    pub min: f64,
    /// The largest (`-inf` when none).
    pub max: f64,
    /// Their mean (0 when none).
    pub mean: f64,
    /// The sum of squared deviations from `mean` (variance × count).
    pub m2: f64,
}

impl Stats {
    /// No values.
    pub fn empty() -> Stats {
        Stats {
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            mean: 0.0,
            m2: 0.0,
        }
    }

    /// Both sets of values at once (Chan, Golub and LeVeque's pairwise update).
    pub fn merge(&self, o: &Stats) -> Stats {
        if o.count == 0 {
            return *self;
        }
        if self.count == 0 {
            return *o;
        }
        let (na, nb) = (self.count as f64, o.count as f64);
        let n = na + nb;
        let delta = o.mean - self.mean;
        Stats {
            count: self.count + o.count,
            sum: self.sum + o.sum,
            min: self.min.min(o.min),
            max: self.max.max(o.max),
            mean: self.mean + delta * nb / n,
            m2: self.m2 + o.m2 + delta * delta * na * nb / n,
        }
    }
}

/// One partition's partial result.
#[derive(Debug, Clone)]
pub enum Partial {
    /// COUNT: items selected, items looked at.
    Count {
        /// Selected.
        matched: u64,
        /// In the partition.
        scanned: u64,
    },
    /// STATS.
    Stats(Stats),
    /// HISTOGRAM: a count per bin.
    Histogram(Vec<u64>),
    /// LR_GRADIENT: rows, the summed loss, the summed gradient (coefficients then intercept).
    LrGradient {
        /// Rows seen.
        rows: u64,
        /// Sum of the log-loss over the rows.
        loss: f64,
        /// Sum of the gradient over the rows.
        gradient: Vec<f64>,
    },
    /// KMEANS_STEP.
    KmeansStep {
        /// `components` of the request.
        components: u32,
        /// Rows nearest to each centroid.
        counts: Vec<u64>,
        /// Their sums, centroid by centroid (`k × components`).
        sums: Vec<f64>,
        /// Sum of each row's squared distance to its centroid.
        inertia: f64,
    },
    /// TOP_K: the partition's best items, best first, as (key, value of the column).
    TopK(Vec<(Vec<u8>, f64)>),
}

impl Partial {
    /// The operator it answers.
    pub fn kind(&self) -> OpKind {
        match self {
            Partial::Count { .. } => OpKind::Count,
            Partial::Stats(_) => OpKind::Stats,
            Partial::Histogram(_) => OpKind::Histogram,
            Partial::LrGradient { .. } => OpKind::LrGradient,
            Partial::KmeansStep { .. } => OpKind::KmeansStep,
            Partial::TopK(_) => OpKind::TopK,
        }
    }

    /// Bytes it takes on the wire.
    pub fn wire_len(&self) -> usize {
        match self {
            Partial::Count { .. } => 16,
            Partial::Stats(_) => 48,
            Partial::Histogram(c) => 4 + 8 * c.len(),
            Partial::LrGradient { gradient, .. } => 20 + 8 * gradient.len(),
            Partial::KmeansStep { counts, sums, .. } => 16 + 8 * (counts.len() + sums.len()),
            Partial::TopK(items) => 4 + items.iter().map(|(k, _)| 10 + k.len()).sum::<usize>(),
        }
    }

    fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        match self {
            Partial::Count { matched, scanned } => {
                put_u64(out, *matched);
                put_u64(out, *scanned);
            }
            Partial::Stats(s) => {
                put_u64(out, s.count);
                for x in [s.sum, s.min, s.max, s.mean, s.m2] {
                    put_u64(out, x.to_bits());
                }
            }
            Partial::Histogram(c) => {
                put_u32(out, count_u32(c.len(), "bins")?);
                for &x in c {
                    put_u64(out, x);
                }
            }
            Partial::LrGradient {
                rows,
                loss,
                gradient,
            } => {
                put_u64(out, *rows);
                put_u64(out, loss.to_bits());
                put_u32(out, count_u32(gradient.len(), "gradient length")?);
                for x in gradient {
                    put_u64(out, x.to_bits());
                }
            }
            Partial::KmeansStep {
                components,
                counts,
                sums,
                inertia,
            } => {
                if counts.len() * *components as usize != sums.len() {
                    return Err(FrameError::Encode("sums are not k × components"));
                }
                put_u32(out, count_u32(counts.len(), "centroid count")?);
                put_u32(out, *components);
                for &c in counts {
                    put_u64(out, c);
                }
                for x in sums {
                    put_u64(out, x.to_bits());
                }
                put_u64(out, inertia.to_bits());
            }
            Partial::TopK(items) => {
                put_u32(out, count_u32(items.len(), "top_k count")?);
                for (key, v) in items {
                    wire::put_bytes16(out, key, "key over 64 KiB")?;
                    put_u64(out, v.to_bits());
                }
            }
        }
        Ok(())
    }

    fn read(kind: OpKind, r: &mut Reader<'_>) -> Result<Partial, FrameError> {
        let f = |r: &mut Reader<'_>, what| r.u64(what).map(f64::from_bits);
        let u64s = |r: &mut Reader<'_>, n: usize, what| -> Result<Vec<u64>, FrameError> {
            if n > r.remaining() / 8 {
                return Err(FrameError::Truncated(what));
            }
            (0..n).map(|_| r.u64(what)).collect()
        };
        let f64s = |r: &mut Reader<'_>, n: usize, what| -> Result<Vec<f64>, FrameError> {
            if n > r.remaining() / 8 {
                return Err(FrameError::Truncated(what));
            }
            (0..n).map(|_| r.u64(what).map(f64::from_bits)).collect()
        };
        Ok(match kind {
            OpKind::Count => Partial::Count {
                matched: r.u64("matched")?,
                scanned: r.u64("scanned")?,
            },
            OpKind::Stats => Partial::Stats(Stats {
                count: r.u64("count")?,
                sum: f(r, "sum")?,
                min: f(r, "min")?,
                max: f(r, "max")?,
                mean: f(r, "mean")?,
                m2: f(r, "m2")?,
            }),
            OpKind::Histogram => {
                let n = r.u32("bins")? as usize;
                Partial::Histogram(u64s(r, n, "bin counts")?)
            }
            OpKind::LrGradient => {
                let rows = r.u64("rows")?;
                let loss = f(r, "loss")?;
                let n = r.u32("gradient length")? as usize;
                Partial::LrGradient {
                    rows,
                    loss,
                    gradient: f64s(r, n, "gradient")?,
                }
            }
            OpKind::KmeansStep => {
                let k = r.u32("centroid count")? as usize;
                let components = r.u32("components")?;
                let counts = u64s(r, k, "counts")?;
                let sums = f64s(r, k.saturating_mul(components as usize), "sums")?;
                Partial::KmeansStep {
                    components,
                    counts,
                    sums,
                    inertia: f(r, "inertia")?,
                }
            }
            OpKind::TopK => {
                let n = r.u32("top_k count")? as usize;
                // An item is at least 10 bytes (key length and value).
                if n > r.remaining() / 10 {
                    return Err(FrameError::Truncated("top_k items"));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = r.bytes16("top_k key")?.to_vec();
                    items.push((key, f(r, "top_k value")?));
                }
                Partial::TopK(items)
            }
        })
    }
}

impl PartialEq for Partial {
    /// Bit for bit (a NaN equals itself), as the test vectors need.
    fn eq(&self, o: &Partial) -> bool {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        self.kind() == o.kind() && self.write(&mut a).is_ok() && o.write(&mut b).is_ok() && a == b
    }
}
impl Eq for Partial {}

/// One partition's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its partial result: exact for the version and moment it was read at.
    Done(Partial),
    /// Not run, or its result dropped: the partition is not this server's (any more), the epoch
    /// changed during the pass, or it is being copied in. The client asks again elsewhere.
    Refused {
        /// WRONG_EPOCH, NOT_OWNER or REPAIRING.
        status: Status,
        /// For people.
        message: String,
    },
}

/// The OK payload of OPERATOR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpReply {
    /// The version read (a request's 0 resolved).
    pub version: u32,
    /// The operator answered.
    pub kind: OpKind,
    /// One answer per partition of the request, in request order.
    pub results: Vec<(u32, Outcome)>,
}

impl OpReply {
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<OpReply, FrameError> {
        let version = r.u32("version")?;
        let kind = OpKind::from_u8(r.u8("operator")?).ok_or(FrameError::Malformed("operator"))?;
        let n = r.u32("result count")? as usize;
        // A result is at least 5 bytes (partition and status).
        if n > r.remaining() / 5 {
            return Err(FrameError::Truncated("results"));
        }
        let mut results = Vec::with_capacity(n);
        for _ in 0..n {
            let p = r.u32("partition")?;
            let status = Status::from_u8(r.u8("partition status")?)
                .ok_or(FrameError::Malformed("partition status"))?;
            let outcome = if status == Status::Ok {
                Outcome::Done(Partial::read(kind, r)?)
            } else {
                Outcome::Refused {
                    status,
                    message: r.str16("message")?.to_owned(),
                }
            };
            results.push((p, outcome));
        }
        Ok(OpReply {
            version,
            kind,
            results,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u32(out, self.version);
        put_u8(out, self.kind as u8);
        put_u32(out, count_u32(self.results.len(), "result count")?);
        for (p, outcome) in &self.results {
            put_u32(out, *p);
            match outcome {
                Outcome::Done(partial) => {
                    if partial.kind() != self.kind {
                        return Err(FrameError::Encode("partial of another operator"));
                    }
                    put_u8(out, Status::Ok as u8);
                    partial.write(out)?;
                }
                Outcome::Refused { status, message } => {
                    if *status == Status::Ok {
                        return Err(FrameError::Encode("a refusal needs a status"));
                    }
                    put_u8(out, *status as u8);
                    let m = wire::truncate_str(message, 1024);
                    wire::put_str16(out, m, "message")?;
                }
            }
        }
        Ok(())
    }

    /// Bytes of the payload (after the status byte).
    pub fn wire_len(&self) -> usize {
        9 + self
            .results
            .iter()
            .map(|(_, o)| {
                5 + match o {
                    Outcome::Done(p) => p.wire_len(),
                    Outcome::Refused { message, .. } => 2 + message.len().min(1024),
                }
            })
            .sum::<usize>()
    }
}
