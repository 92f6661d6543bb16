//! OPERATOR: an operator run over some partitions of one version, each partition's partial result
//! (or refusal) in one reply (docs/protocol-native.md, section 10; kernels in `ramgrid_store::ops`).
//!
//! Exact or refused, per partition:
//! 1. Before any pass the frame is checked whole: epoch, quorum, table, incarnation, version, the
//!    operator against the value type, every partition held here and not being copied in. A frame
//!    that fails is refused whole and reads nothing (as a GET).
//! 2. Each partition is one pass over one moment of it: an open version's partition is read under
//!    its read lock (writers of that partition wait for the pass; other partitions go on), a sealed
//!    one needs none as it never changes. The passes run side by side on the server's operator
//!    pool (`compute.rs`).
//! 3. After each pass the server checks again that its installed epoch is the one it started
//!    under, that it still holds the partition and that the partition is not being copied in.
//!    Otherwise the partial is dropped and the partition answered WRONG_EPOCH, NOT_OWNER or
//!    REPAIRING: the client asks again under the new map, for that partition only.

use std::sync::OnceLock;

use ramgrid_proto::native::{
    self as wire, ErrorReply, OpReply, Operator, Outcome, Partial, Request, Response, Status,
};
use ramgrid_store::ops::{self as kernels, Op, OpOutput, Range};

use super::checks::{after_pass, before_pass, check_copied, check_current_known, check_held};
use crate::convert::refusal;
use crate::node::Node;

/// A test seam: when set, called after each partition's pass and before the checks that follow
/// it (so a test can change the spec in the middle of an operator, deterministically).
#[doc(hidden)]
pub static AFTER_PASS: OnceLock<AfterPass> = OnceLock::new();

/// What [`AFTER_PASS`] holds: called with the server's state and the partition just passed over.
pub type AfterPass = Box<dyn Fn(&Node, u32) + Send + Sync>;

/// Bytes of an OPERATOR reply besides its results (header, status, version, kind, count).
const REPLY_SLACK: usize = 64;

pub(super) fn answer(
    state: &Node,
    id: u64,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ErrorReply> {
    let Request::Operator(o) = req else {
        unreachable!("the handler sends only OPERATOR here")
    };
    let (tv, started_epoch) = before_pass(state, o.table, o.version, o.epoch, o.incarnation)?;
    let arrays = Arrays::of(&o.op);
    let op = store_op(&o.op, &arrays);
    kernels::validate(&op, tv.value_type())
        .map_err(|e| ErrorReply::new(Status::BadRequest, e.to_string()))?;
    let parts = tv.spec().partitions;
    if let Some(p) = o.partitions.iter().find(|&p| p >= parts) {
        return Err(ErrorReply::new(
            Status::BadRequest,
            format!("partition {p} out of range: table {} has {parts}", o.table),
        ));
    }
    let per = partial_len(&o.op, tv.value_type()) + 5;
    if per + REPLY_SLACK > state.max_body {
        // One partition's answer alone cannot fit: no split of the request helps.
        return Err(ErrorReply::new(
            Status::BadRequest,
            format!(
                "one partition's answer would take at least {per} bytes, over the {} byte frame limit: ask for fewer items (k)",
                state.max_body
            ),
        ));
    }
    let bound = per.saturating_mul(o.partitions.len()) + REPLY_SLACK;
    if bound > state.max_body {
        return Err(ErrorReply::new(
            Status::TooLarge,
            format!(
                "the reply would take {bound} bytes, over the {} byte limit: ask for fewer partitions at once",
                state.max_body
            ),
        ));
    }
    check_held(&tv, o.partitions.iter())?;
    check_copied(&tv, o.partitions.iter())?;
    check_current_known(state, &tv, o.version, o.partitions.iter())?;
    // The passes run side by side on the operator pool (compute.rs); the checks that follow each
    // pass run after all of them, in order, each still after its own partition's pass.
    let parts: Vec<u32> = o.partitions.iter().collect();
    let passes = crate::compute::map(&parts, |&p| {
        tv.with_partition(p, |view| kernels::run(&op, &view))
    });
    let mut results = Vec::with_capacity(parts.len());
    for (&p, pass) in parts.iter().zip(passes) {
        let partial = pass
            .map_err(|e| refusal(&e))?
            .map_err(|e| ErrorReply::new(Status::BadRequest, e.to_string()))?;
        if let Some(hook) = AFTER_PASS.get() {
            hook(state, p);
        }
        let outcome = match after_pass(state, &tv, p, started_epoch) {
            Ok(()) => Outcome::Done(wire_partial(partial, &o.op)),
            Err(e) => Outcome::Refused {
                status: e.status,
                message: e.message,
            },
        };
        results.push((p, outcome));
    }
    let reply = OpReply {
        version: tv.version(),
        kind: o.op.kind(),
        results,
    };
    // TOP_K's size depends on its keys: the bound above was a floor.
    if reply.wire_len() + REPLY_SLACK > state.max_body {
        return Err(ErrorReply::new(
            Status::TooLarge,
            format!(
                "the reply would take {} bytes, over the {} byte limit: ask for fewer partitions or items at once",
                reply.wire_len(),
                state.max_body
            ),
        ));
    }
    Response::Operator(reply)
        .encode(out, wire::Opcode::Operator, id)
        .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
}

/// The operator's number arrays, decoded once per frame.
struct Arrays(Vec<f64>);

impl Arrays {
    fn of(op: &Operator<'_>) -> Arrays {
        Arrays(match op {
            Operator::Histogram { edges, .. } => edges.to_vec(),
            Operator::LrGradient { weights } => weights.to_vec(),
            Operator::KmeansStep { centroids, .. } => centroids.to_vec(),
            Operator::Count { .. } | Operator::Stats { .. } | Operator::TopK { .. } => Vec::new(),
        })
    }
}

fn range(p: &Option<wire::Predicate>) -> Option<Range> {
    p.map(|p| Range {
        component: p.component,
        lo: p.lo,
        hi: p.hi,
    })
}

fn store_op<'a>(op: &Operator<'_>, arrays: &'a Arrays) -> Op<'a> {
    match op {
        Operator::Count { predicate } => Op::Count {
            pred: range(predicate),
        },
        Operator::Stats { column, predicate } => Op::Stats {
            column: *column,
            pred: range(predicate),
        },
        Operator::Histogram {
            column, predicate, ..
        } => Op::Histogram {
            column: *column,
            pred: range(predicate),
            edges: &arrays.0,
        },
        Operator::LrGradient { .. } => Op::LrGradient { weights: &arrays.0 },
        Operator::KmeansStep { components, .. } => Op::KmeansStep {
            components: *components,
            centroids: &arrays.0,
        },
        Operator::TopK {
            column,
            k,
            largest,
            predicate,
        } => Op::TopK {
            column: *column,
            k: *k,
            largest: *largest,
            pred: range(predicate),
        },
    }
}

/// Bytes of one partition's partial on the wire (the parameters are validated).
fn partial_len(op: &Operator<'_>, vt: ramgrid_store::tables::ValueType) -> usize {
    let dim = match vt {
        ramgrid_store::tables::ValueType::F32Vec { dim } => dim as usize,
        _ => 1,
    };
    match op {
        Operator::Count { .. } => 16,
        Operator::Stats { .. } => 48,
        Operator::Histogram { edges, .. } => 4 + 8 * edges.len(),
        Operator::LrGradient { .. } => 20 + 8 * dim,
        Operator::KmeansStep {
            components,
            centroids,
        } => {
            let k = centroids.len() / (*components).max(1) as usize;
            24 + 8 * (k + centroids.len())
        }
        // At least: the keys' lengths are known only after the pass (checked then).
        Operator::TopK { k, .. } => 4 + 10 * *k as usize,
    }
}

fn wire_partial(p: OpOutput, op: &Operator<'_>) -> Partial {
    match p {
        OpOutput::Count { matched, scanned } => Partial::Count { matched, scanned },
        OpOutput::Stats(s) => Partial::Stats(wire::Stats {
            count: s.count,
            sum: s.sum,
            min: s.min,
            max: s.max,
            mean: s.mean,
            m2: s.m2,
        }),
        OpOutput::Histogram(h) => Partial::Histogram(h),
        OpOutput::LrGradient {
            rows,
            loss,
            gradient,
        } => Partial::LrGradient {
            rows,
            loss,
            gradient,
        },
        OpOutput::KmeansStep {
            counts,
            sums,
            inertia,
        } => Partial::KmeansStep {
            components: match op {
                Operator::KmeansStep { components, .. } => *components,
                _ => 0,
            },
            counts,
            sums,
            inertia,
        },
        OpOutput::TopK(items) => Partial::TopK(items),
    }
}
