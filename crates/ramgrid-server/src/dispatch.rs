//! Adapts parsed memcached requests to store calls and composes the replies.
//!
//! CONTRACT (fixed; implementation in progress): the connection loop calls `execute` once per
//! parsed request and appends the reply to `out`.

use ramgrid_proto::memcache::Request;

use crate::stats::{Shared, WorkerStats};

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// Flush `out` and close (quit).
    Close,
}

/// Executes one request against the store, appending its reply (if any) to `out`.
pub fn execute(req: &Request<'_>, shared: &Shared, stats: &WorkerStats, out: &mut Vec<u8>) -> Flow {
    let _ = (req, shared, stats, out);
    Flow::Continue
}
