//! The memcached text and meta protocols on the server side: the connection loop here, the
//! requests' execution against the cache in `dispatch.rs` (the meta commands in `meta.rs`, `stats`
//! in `stats.rs`).
//!
//! Invariants relied on:
//! 1. Replies are appended in request order to one output buffer; nothing is written out of order.
//! 2. We never read more requests while replies are waiting to be written beyond `OUT_HIGH_WATER`,
//!    and a multi-key get writes its reply out in parts of about that size: a client that stops
//!    reading stalls only its own connection, and the server buffers at most one read buffer plus
//!    one batch of replies for it (then the write timeout closes it).
//! 3. The read buffer grows only as far as one command line (`max_line_len`) plus one data block
//!    (`max_value_len`); anything larger was refused by the parser first.

use std::time::Duration;

use ramgrid_proto::memcache::{parse_request, ParseError, Request};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::auth;
use crate::buffers::ConnMemory;
use crate::io::{flush, read_or_stop, MEMCACHE_READ_CHUNK as READ_CHUNK};
use crate::stats::{Shared, WorkerStats};

pub mod dispatch;
mod meta;
mod stats;

use dispatch::Flow;

/// Flush replies mid-batch once this much is pending, so a long pipeline does not pile up output
/// (a single multi-key get stops at the same mark, see [`Flow::Partial`]).
const OUT_HIGH_WATER: usize = dispatch::REPLY_HIGH_WATER;

/// Most one-key lookups of a pipeline that are parsed ahead and prefetched together.
const LOOKUP_RUN: usize = 16;

/// The key of a request that looks up one key and answers with at most its value: meta `mg` of
/// a plain (not base64) key, or a text `get`/`gets` of one key. A pipeline of them is prefetched
/// together; prefetching only loads memory, so each still runs exactly as alone.
fn single_lookup_key<'a>(req: &Request<'a>) -> Option<&'a [u8]> {
    match req {
        Request::MetaGet(meta) if !meta.key.base64 => Some(meta.key.raw),
        Request::Get { keys, .. } if keys.len() == 1 => keys.iter().next(),
        _ => None,
    }
}

/// Serves a memcached-protocol connection until the client closes it, a fatal protocol error,
/// `quit`, a write timeout, or server shutdown. `buf[..end]` holds the bytes already read.
/// `auth_deadline` is set when the server has a token: until the connection authenticates (see
/// [`crate::auth`]) nothing else is answered, and at the deadline it is closed.
#[expect(clippy::too_many_arguments)]
pub(crate) async fn serve(
    mut sock: impl crate::io::Stream,
    mut buf: Vec<u8>,
    mut end: usize,
    shared: &Shared,
    stats: &WorkerStats,
    mut stop: watch::Receiver<bool>,
    write_timeout: Duration,
    mut auth_deadline: Option<Instant>,
    mem: &mut ConnMemory<'_>,
) {
    let limits = shared.settings.limits;
    let mut start = 0usize;
    let mut out: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    // Bytes still to drop that a refused request said to skip (an oversized value's data block,
    // which memcached swallows) but that have not arrived yet.
    let mut discard = 0usize;

    loop {
        if discard > 0 {
            let n = discard.min(end - start);
            start += n;
            discard -= n;
        }
        // Parse and execute every complete request we have.
        while discard == 0 {
            match parse_request(&buf[start..end], &limits) {
                Ok((req, used)) => {
                    start += used;
                    if auth_deadline.is_some() {
                        let token = shared.settings.token.as_deref().unwrap_or_default();
                        let outcome = auth::memcache_auth(&req, token);
                        if outcome == auth::MemcacheAuth::Authenticated {
                            // memcached answers even with noreply, and stores nothing.
                            out.extend_from_slice(outcome.reply());
                            auth_deadline = None;
                            continue;
                        }
                        if outcome == auth::MemcacheAuth::Failed {
                            tracing::warn!(
                                protocol = "memcached",
                                "authentication refused: wrong token"
                            );
                        }
                        // memcached drops what else was read (answering for it instead, if
                        // anything was) and waits for another try.
                        let more = start < end;
                        out.extend_from_slice(if more {
                            auth::UNAUTHENTICATED
                        } else {
                            outcome.reply()
                        });
                        start = end;
                        break;
                    }
                    if single_lookup_key(&req).is_some() && start < end {
                        // A pipeline of one-key lookups (meta `mg`, `get k`): take the rest of
                        // the run that has arrived, prefetch all its keys at once, then run them
                        // in order, so their cache misses overlap as a multi-key get's do.
                        let mut run: [Option<Request<'_>>; LOOKUP_RUN] = Default::default();
                        run[0] = Some(req);
                        let mut n = 1;
                        while n < LOOKUP_RUN {
                            match parse_request(&buf[start..end], &limits) {
                                Ok((next, used)) if single_lookup_key(&next).is_some() => {
                                    start += used;
                                    run[n] = Some(next);
                                    n += 1;
                                }
                                // Anything else is parsed again, and handled, by the main loop.
                                _ => break,
                            }
                        }
                        let run = &run[..n];
                        if n > 1 {
                            shared
                                .cache
                                .prefetch(run.iter().flatten().filter_map(single_lookup_key));
                        }
                        for r in run.iter().flatten() {
                            // One key: the reply is whole (Flow::Continue), at most one value.
                            dispatch::execute(r, shared, stats, &mut out);
                            if out.len() >= OUT_HIGH_WATER
                                && flush(&mut sock, &mut out, stats, write_timeout, mem)
                                    .await
                                    .is_err()
                            {
                                return;
                            }
                        }
                        continue;
                    }
                    let mut progress = 0;
                    loop {
                        match dispatch::execute_part(&req, shared, stats, &mut out, &mut progress) {
                            Flow::Continue => break,
                            Flow::Close => {
                                let _ = flush(&mut sock, &mut out, stats, write_timeout, mem).await;
                                return;
                            }
                            Flow::Partial => {
                                if flush(&mut sock, &mut out, stats, write_timeout, mem)
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                    if out.len() >= OUT_HIGH_WATER
                        && flush(&mut sock, &mut out, stats, write_timeout, mem)
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                Err(ParseError::Incomplete) => break,
                Err(ParseError::Recoverable { .. } | ParseError::Fatal { .. })
                    if auth_deadline.is_some() =>
                {
                    out.extend_from_slice(auth::UNAUTHENTICATED);
                    start = end;
                    break;
                }
                Err(ParseError::Recoverable { consumed, reply }) => {
                    let here = consumed.min(end - start);
                    start += here;
                    discard = consumed - here;
                    out.extend_from_slice(reply.as_bytes());
                }
                Err(ParseError::Fatal { reply, .. }) => {
                    out.extend_from_slice(reply.as_bytes());
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
        if *stop.borrow() {
            return;
        }

        // Make room: move the unparsed tail to the front, grow only when a single request needs it.
        if start == end {
            start = 0;
            end = 0;
        } else if start > 0 && buf.len() - end < READ_CHUNK / 2 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        if buf.len() - end < READ_CHUNK / 2 {
            let max = (limits.max_line_len + limits.max_value_len + 64).max(READ_CHUNK);
            let want = (buf.len() * 2).min(max);
            if want <= buf.len() {
                // Cannot happen while the parser enforces its limits; refuse rather than grow.
                return;
            }
            // Growth is granted once for the largest request the parser accepts, so a
            // connection never waits for memory while it holds part of a grant.
            let deadline = Instant::now() + write_timeout;
            if !mem.grow_read(max - READ_CHUNK, deadline).await {
                return;
            }
            buf.resize(want, 0);
        }

        let Some(n) =
            read_or_stop(&mut sock, &mut buf[end..], &mut stop, stats, auth_deadline).await
        else {
            return;
        };
        end += n;
        // Shrink a buffer that grew for one big value once it is drained, so idle connections stay
        // small, and give its grant back.
        if start == end && buf.len() > READ_CHUNK {
            buf = vec![0u8; READ_CHUNK];
            start = 0;
            end = 0;
            mem.shrink_read();
        }
    }
}
