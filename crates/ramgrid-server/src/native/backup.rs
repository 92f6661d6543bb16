//! A primary's forward of a PUT or DELETE (flag REPLICA), taken by a backup: applied as any
//! write (data.rs), once. Every try of one forward carries the same request id, and a try that
//! comes again (the primary gave up waiting for the first, which still arrived) is answered with
//! what the first answered instead of being applied twice (`crate::replicate`).

use std::time::Duration;

use ramgrid_proto::native::{self as wire, ErrorReply, Opcode, Request, Status};

use super::handler::Conn;
use crate::node::Node;
use crate::replicate::Seen;

/// How long a second try waits for the first to be applied before it is refused.
const BUSY_WAIT: Duration = Duration::from_secs(2);

impl Conn {
    /// Answers the forward `id`; the refusal's status, if it was one.
    pub(super) async fn backup_write(
        &mut self,
        state: &Node,
        op: Opcode,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Option<Status> {
        let repl = &state.replication;
        let started = std::time::Instant::now();
        loop {
            match repl.seen(id) {
                Seen::Begin => break,
                Seen::Done(statuses) => {
                    self.status = statuses;
                    let e = self.write_statuses(out, op, id).err()?;
                    let _ = wire::encode_error(out, op, id, &e);
                    return Some(e.status);
                }
                Seen::Busy if started.elapsed() < BUSY_WAIT => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Seen::Busy => {
                    let e = ErrorReply::new(
                        Status::Internal,
                        "another try of this forward is still being applied",
                    );
                    let _ = wire::encode_error(out, op, id, &e);
                    return Some(e.status);
                }
            }
        }
        let refused = self.handle(state, op, id, req, out, room);
        repl.applied(id, refused.is_none().then(|| self.status.clone()));
        refused
    }
}
