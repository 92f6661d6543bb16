//! SCAN: one page of a plain or filtered scan of one partition (docs/protocol-native.md, section
//! 11; the page kernel is `ramgrid_store::ops::scan`).
//!
//! Exact or refused, as OPERATOR (ops.rs):
//! 1. Before the page: epoch, quorum, table, incarnation, version, the partition held here and not
//!    being copied in. A refused page read nothing.
//! 2. The page is chosen and copied into the reply under one hold of the partition (its read
//!    lock for an open version), and carries the partition's write generation. A page that
//!    continues a scan (its cursor has a generation) whose generation no longer matches is
//!    answered CHANGED with no items: the client starts that partition again, so what it keeps of
//!    a partition is one moment of it.
//! 3. After the page the epoch, the holding and the copy-in are checked again; if any changed the
//!    page is dropped and the partition refused (WRONG_EPOCH, NOT_OWNER, REPAIRING).
//!
//! Nothing is kept between pages: a client that stops asking, or disconnects, cancelled its scan
//! and cost the server nothing. A reply never passes `--max-frame`: the page's byte budget is the
//! smaller of the request's and the frame limit's.

use ramgrid_proto::native::{encode_scan_page, ErrorReply, PageHead, PageState, Request, Status};
use ramgrid_store::ops::scan::{page, Entries};
use ramgrid_store::ops::Range;
use ramgrid_store::tables::{PartitionView, ValueRef};

use super::checks::{after_pass, before_pass, check_copied, check_current_known, check_held};
use crate::convert::{refusal, wire_value_type};
use crate::node::Node;

/// Bytes of a SCAN reply besides its items (frame header, status, page head, count), generously.
const REPLY_SLACK: usize = 128;

pub(super) fn answer(
    state: &Node,
    id: u64,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ErrorReply> {
    let Request::Scan(q) = req else {
        unreachable!("the handler sends only SCAN here")
    };
    let (tv, started_epoch) = before_pass(state, q.table, q.version, q.epoch, q.incarnation)?;
    let p = q.partition;
    let parts = tv.spec().partitions;
    if p >= parts {
        return Err(ErrorReply::new(
            Status::BadRequest,
            format!("partition {p} out of range: table {} has {parts}", q.table),
        ));
    }
    check_held(&tv, std::iter::once(p))?;
    check_copied(&tv, std::iter::once(p))?;
    check_current_known(state, &tv, q.version, std::iter::once(p))?;
    let frame_room = state.max_body.saturating_sub(REPLY_SLACK);
    let budget = (q.max_bytes as usize).min(frame_room).max(1);
    let pred = q.predicate.map(|p| Range {
        component: p.component,
        lo: p.lo,
        hi: p.hi,
    });
    let head = |generation, state, next| PageHead {
        version: tv.version(),
        incarnation: tv.spec().incarnation,
        partition: p,
        generation,
        state,
        next,
        value_type: wire_value_type(tv.value_type()),
    };
    let start = out.len();
    tv.with_partition(p, |view| {
        let generation = view.generation();
        if q.cursor.generation != 0 && q.cursor.generation != generation {
            return encode_scan_page(
                out,
                id,
                &head(generation, PageState::Changed, 0),
                0,
                |_| {},
                |_| {},
            )
            .map_err(internal);
        }
        let position = usize::try_from(q.cursor.position).unwrap_or(usize::MAX);
        let pg = page(&view, position, pred.as_ref(), q.max_items as usize, budget)
            .map_err(|e| ErrorReply::new(Status::BadRequest, e.to_string()))?;
        if pg.bytes > frame_room {
            return Err(ErrorReply::new(
                Status::TooLarge,
                format!(
                    "entry {} of partition {p} takes {} bytes, over the {} byte frame limit",
                    pg.next.saturating_sub(1),
                    pg.bytes,
                    state.max_body
                ),
            ));
        }
        let st = if pg.done {
            PageState::Done
        } else {
            PageState::More
        };
        out.reserve(pg.bytes + REPLY_SLACK);
        encode_scan_page(
            out,
            id,
            &head(generation, st, pg.next as u64),
            pg.entries.len(),
            |o| put_keys(&view, &pg.entries, o),
            |o| put_values(&view, &pg.entries, o),
        )
        .map_err(internal)
    })
    .map_err(|e| refusal(&e))??;
    if let Err(e) = after_pass(state, &tv, q.partition, started_epoch) {
        out.truncate(start);
        return Err(e);
    }
    Ok(())
}

fn internal(e: ramgrid_proto::native::FrameError) -> ErrorReply {
    ErrorReply::new(Status::Internal, e.to_string())
}

fn put_keys(view: &PartitionView<'_>, entries: &Entries, out: &mut Vec<u8>) {
    for i in entries.iter() {
        let k = view.key(i);
        out.extend_from_slice(&(k.len() as u16).to_le_bytes());
        out.extend_from_slice(k);
    }
}

fn put_values(view: &PartitionView<'_>, entries: &Entries, out: &mut Vec<u8>) {
    // Runs of a scalar column are copied as they lie; anything else value by value.
    if let Entries::Run(r) = entries {
        if let Some(c) = view.column_f64() {
            put_le(out, &c[r.clone()], f64::to_le_bytes);
            return;
        }
        if let Some(c) = view.column_i64() {
            put_le(out, &c[r.clone()], i64::to_le_bytes);
            return;
        }
    }
    for i in entries.iter() {
        match view.value(i) {
            ValueRef::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            ValueRef::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            ValueRef::F32Vec(row) => out.extend(row.iter().flat_map(|x| x.to_le_bytes())),
            ValueRef::F32VecLe(b) => out.extend_from_slice(b),
            ValueRef::Bytes(b) => {
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }
}

/// Appends `xs` little-endian: one copy of the whole run where the machine is little-endian.
fn put_le<T: Copy, const N: usize>(out: &mut Vec<u8>, xs: &[T], le: fn(T) -> [u8; N]) {
    if cfg!(target_endian = "little") && std::mem::size_of::<T>() == N {
        // SAFETY: `xs` is `size_of_val(xs)` initialized bytes (T is i64 or f64: no padding), and on
        // a little-endian machine they are the values' little-endian encodings.
        let bytes = unsafe {
            std::slice::from_raw_parts(xs.as_ptr().cast::<u8>(), std::mem::size_of_val(xs))
        };
        out.extend_from_slice(bytes);
    } else {
        out.extend(xs.iter().flat_map(|&x| le(x)));
    }
}
