//! One client connection: the first byte tells the native protocol (`native`) from memcached's text
//! and meta protocols (`memcache`); each has its own connection loop over the shared I/O (`io`).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::buffers::ConnMemory;
use crate::io::{read_or_stop, MEMCACHE_READ_CHUNK as READ_CHUNK};
use crate::native;
use crate::node::Node;
use crate::stats::{Shared, WorkerStats};

/// The first byte of a TLS handshake record (a ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// Serves one connection: the first byte tells the native protocol (magic 0xA7) from memcached's
/// text and meta protocols.
pub async fn serve(
    mut sock: impl crate::io::Stream,
    shared: &Shared,
    node: &Node,
    stats: &WorkerStats,
    mut stop: watch::Receiver<bool>,
    write_timeout: Duration,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut mem = ConnMemory::new(&shared.buffers);
    // With a token, a connection must authenticate (in either protocol) before this deadline.
    let auth_deadline = shared
        .settings
        .token
        .as_ref()
        .map(|_| Instant::now() + shared.settings.auth_timeout);
    let Some(end) = read_or_stop(&mut sock, &mut buf, &mut stop, stats, auth_deadline).await else {
        return;
    };
    if buf[0] == TLS_HANDSHAKE {
        // A TLS client on a plain port (no text command or native frame starts with this
        // byte): closing at once fails its handshake now rather than at its timeout.
        WorkerStats::add(&stats.tls_handshake_failures, 1);
        return;
    }
    if ramgrid_proto::native::is_native_first_byte(buf[0]) {
        native::serve(
            sock,
            buf,
            end,
            node,
            stats,
            stop,
            write_timeout,
            auth_deadline,
            &mut mem,
        )
        .await;
    } else {
        crate::memcache::serve(
            sock,
            buf,
            end,
            shared,
            stats,
            stop,
            write_timeout,
            auth_deadline,
            &mut mem,
        )
        .await;
    }
}
