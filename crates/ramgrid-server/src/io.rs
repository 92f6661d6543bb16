//! Socket I/O shared by both protocols' connection loops: a read that gives way to shutdown and to
//! the authentication deadline, and a flush bounded by the write timeout that gives a burst's reply
//! memory back to the buffer budget. The buffer sizes of both loops are named here, side by side.
//!
//! The loops are generic over [`Stream`]: a plain `TcpStream`, or TLS over one (`crate::tls`).
//! Each is compiled once per stream type, so the plain path is the same code it was before TLS.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::buffers::ConnMemory;
use crate::stats::WorkerStats;

/// A memcached connection's read buffer at rest, and what the first read of any connection uses
/// (before the first byte tells the protocols apart). Text requests are small; a big value grows
/// the buffer for itself.
pub(crate) const MEMCACHE_READ_CHUNK: usize = 16 << 10;
/// A native connection's read buffer at rest: batch frames are large, so it reads more at once.
pub(crate) const NATIVE_READ_CHUNK: usize = 64 << 10;
/// A native connection flushes replies mid-read once this much is pending. (The memcached side
/// uses `memcache::dispatch::REPLY_HIGH_WATER`, the mark where a multi-key get stops too.)
pub(crate) const NATIVE_OUT_HIGH_WATER: usize = 1 << 20;
/// A reply buffer's base: what it keeps between bursts; anything beyond is charged to the
/// buffer budget while held (see [`crate::buffers`]).
pub(crate) const OUT_BASE: usize = 64 << 10;

/// A client connection's byte stream: a TCP socket, or TLS over one.
pub trait Stream: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Stream for T {}

/// Reads what the socket has into `buf` and counts it; `None` when the peer closed, the read
/// failed, the server is shutting down, or `deadline` (if any) passed first.
pub(crate) async fn read_or_stop(
    sock: &mut impl Stream,
    buf: &mut [u8],
    stop: &mut watch::Receiver<bool>,
    stats: &WorkerStats,
    deadline: Option<Instant>,
) -> Option<usize> {
    let expired = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let n = tokio::select! {
        r = sock.read(buf) => match r {
            Ok(0) | Err(_) => return None,
            Ok(n) => n,
        },
        _ = stop.changed() => return None,
        _ = expired => return None,
    };
    WorkerStats::add(&stats.bytes_read, n as u64);
    Some(n)
}

/// Writes `out` whole within `timeout` (a client that stops reading is cut off), counts it, and
/// empties it, giving back (to the allocator and to the buffer budget) memory a burst made it
/// grow to, unless the budget lets the connection keep it ([`ConnMemory::may_keep`]). What it
/// holds beyond its base is charged while it is held.
pub(crate) async fn flush(
    sock: &mut impl Stream,
    out: &mut Vec<u8>,
    stats: &WorkerStats,
    timeout: Duration,
    mem: &mut ConnMemory<'_>,
) -> io::Result<()> {
    mem.settle_reply(out.capacity().saturating_sub(OUT_BASE));
    // The flush is a no-op on a TCP socket; TLS may hold the last record until it.
    let write = async {
        sock.write_all(out).await?;
        sock.flush().await
    };
    let r = match tokio::time::timeout(timeout, write).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client stopped reading replies",
        )),
    };
    WorkerStats::add(&stats.bytes_written, out.len() as u64);
    out.clear();
    // A grown buffer is kept for the next burst (a scan's next page) while the budget has room:
    // it stays charged, and freeing and growing it again would map and fault in its pages anew
    // for every reply (a third of a scan's server time, measured).
    if out.capacity() > OUT_BASE && !mem.may_keep(out.capacity() - OUT_BASE) {
        out.shrink_to(OUT_BASE);
    }
    mem.settle_reply(out.capacity().saturating_sub(OUT_BASE));
    r
}
