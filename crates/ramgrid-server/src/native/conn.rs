//! The native connection loop: parse every complete frame in the read buffer, answer it through
//! the handler, write the replies of a whole read at once, grow and shrink the read buffer within
//! the connection's share of the buffer budget.

use std::time::Duration;

use ramgrid_proto::native::{self as wire, parse_frame, ErrorReply, FrameError, Request, Status};
use tokio::sync::watch;
use tokio::time::Instant;

use super::data::reply_bound;
use super::handler::Conn;
use crate::buffers::ConnMemory;
use crate::convert::disk_refusal;
use crate::io::{
    flush, read_or_stop, NATIVE_OUT_HIGH_WATER as OUT_HIGH_WATER, NATIVE_READ_CHUNK as READ_CHUNK,
    OUT_BASE,
};
use crate::node::Node;
use crate::stats::WorkerStats;

/// How long a GET waits for buffer memory before composing only what fits (the client then asks
/// for fewer keys at once).
const REPLY_MEMORY_WAIT: Duration = Duration::from_millis(100);

/// Serves a native-protocol connection. `buf[..end]` already holds the first bytes read. With a
/// token, a connection that has not sent a good HELLO by `auth_deadline` is closed.
#[expect(clippy::too_many_arguments)]
pub async fn serve(
    mut sock: impl crate::io::Stream,
    mut buf: Vec<u8>,
    mut end: usize,
    state: &Node,
    stats: &WorkerStats,
    mut stop: watch::Receiver<bool>,
    write_timeout: Duration,
    auth_deadline: Option<Instant>,
    mem: &mut ConnMemory<'_>,
) {
    let mut conn = Conn::new(state.token.is_none());
    let mut out = Vec::with_capacity(READ_CHUNK);
    let mut start = 0usize;
    loop {
        loop {
            match parse_frame(&buf[start..end], state.max_body) {
                Ok((frame, used)) => {
                    let req = match Request::decode(&frame) {
                        Ok(r) => r,
                        Err(_) => {
                            // A body that does not decode: answer BAD_REQUEST, then close (protocol broken).
                            let e = ErrorReply::new(Status::BadRequest, "malformed request body");
                            let _ =
                                wire::encode_error(&mut out, frame.opcode, frame.request_id, &e);
                            let _ = flush(&mut sock, &mut out, stats, write_timeout, mem).await;
                            return;
                        }
                    };
                    // A GET reserves its reply's room in the buffer budget before composing it
                    // (briefly waiting when the budget is short); other replies are small.
                    let room = match &req {
                        Request::Get(b) => {
                            // Replies already waiting in `out` keep what they hold; this one
                            // gets room beyond that.
                            let held = out.len().saturating_sub(OUT_BASE);
                            let want = held + reply_bound(state, b);
                            let reserved = mem.reserve_reply(want, REPLY_MEMORY_WAIT).await;
                            (OUT_BASE + reserved).saturating_sub(out.len())
                        }
                        _ => state.max_body,
                    };
                    let before = out.len();
                    let started = std::time::Instant::now();
                    // The metadata group answers some requests itself, on its runtime (meta/mod.rs).
                    let answered = match state.meta.get().filter(|_| conn.authed) {
                        Some(m) => {
                            m.answer(state, &req, frame.opcode, frame.request_id, &mut out)
                                .await
                        }
                        None => None,
                    };
                    let write = matches!(req, Request::Put(_) | Request::Delete(_)) && conn.authed;
                    let forwarded = frame.flags & wire::FLAG_REPLICA != 0;
                    let mut refused = match answered {
                        Some(refused) => refused,
                        // A client's write is ordered by the partitions' primary (primary.rs);
                        // a primary's forward is applied once, as it comes (backup.rs).
                        None if write && !forwarded => {
                            let one = frame.flags & wire::FLAG_ACK_ONE != 0;
                            let (op, id) = (frame.opcode, frame.request_id);
                            conn.primary_write(state, op, id, &req, &mut out, one).await
                        }
                        None if write => {
                            let (op, id) = (frame.opcode, frame.request_id);
                            conn.backup_write(state, op, id, &req, &mut out, room).await
                        }
                        None => {
                            conn.handle(state, frame.opcode, frame.request_id, &req, &mut out, room)
                        }
                    };
                    // A write to a log table is answered only once its log records are on disk
                    // (wal.rs); the wait lets this worker's other connections go on.
                    if let Some((log, ticket)) = conn.commit.take() {
                        if let Err(e) = log.commit_async(ticket).await {
                            out.truncate(before);
                            let e = disk_refusal(e);
                            refused = Some(e.status);
                            let _ =
                                wire::encode_error(&mut out, frame.opcode, frame.request_id, &e);
                        }
                    }
                    conn.metrics
                        .record(stats, &req, &conn.status, refused, started);
                    mem.settle_reply(out.capacity().saturating_sub(OUT_BASE));
                    start += used;
                    if out.len() >= OUT_HIGH_WATER
                        && flush(&mut sock, &mut out, stats, write_timeout, mem)
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                Err(FrameError::Incomplete { needed }) => {
                    // Grow once to the size the header announced (bounded by max_body), after the
                    // buffer budget granted it (backpressure: the frame waits, unread, meanwhile).
                    if needed > buf.len() - start {
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        if needed > buf.len() {
                            let deadline = Instant::now() + write_timeout;
                            if !mem
                                .grow_read(needed.saturating_sub(READ_CHUNK), deadline)
                                .await
                            {
                                return;
                            }
                            buf.resize(needed, 0);
                        }
                    }
                    break;
                }
                Err(_) => {
                    // Bad magic, unknown opcode, oversized body: the peer broke the protocol.
                    let _ = flush(&mut sock, &mut out, stats, write_timeout, mem).await;
                    return;
                }
            }
        }
        if !out.is_empty()
            && flush(&mut sock, &mut out, stats, write_timeout, mem)
                .await
                .is_err()
        {
            return;
        }
        if start == end {
            start = 0;
            end = 0;
            if buf.len() > READ_CHUNK {
                buf = vec![0u8; READ_CHUNK];
                mem.shrink_read();
            }
        } else if buf.len() - end < READ_CHUNK / 4 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
            if buf.len() - end < READ_CHUNK / 4 {
                // Only a frame header is left unparsed here (whole frames were parsed above).
                let grow = buf.len() + READ_CHUNK;
                if !mem
                    .grow_read(grow - READ_CHUNK, Instant::now() + write_timeout)
                    .await
                {
                    return;
                }
                buf.resize(grow, 0);
            }
        }
        let deadline = auth_deadline.filter(|_| !conn.authed);
        let Some(n) = read_or_stop(&mut sock, &mut buf[end..], &mut stop, stats, deadline).await
        else {
            return;
        };
        end += n;
    }
}
