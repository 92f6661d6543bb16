//! The metadata group's transport: its Raft messages travel as RAFT frames through the pool of peer
//! connections (`crate::peer_pool`) on the metadata runtime, each call bounded by its timeout.

use std::time::Duration;

use ramgrid_meta::network::BoxFuture;
use ramgrid_meta::{Transport, TransportError};
use ramgrid_proto::native::{Request, Response};
use tokio::time::Instant;

use crate::peer_pool::{CallError, Pool};

impl Transport for Pool {
    fn call<'a>(
        &'a self,
        addr: &'a str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, TransportError>> {
        Box::pin(async move {
            let deadline = Instant::now() + timeout;
            let req = Request::Raft { message: &request };
            let r = Pool::call(self, addr, &req, deadline, |r| match r {
                Response::Raft(reply) => Ok(reply.to_vec()),
                Response::Error(e) => Err(format!("{} {}", e.status.name(), e.message)),
                other => Err(format!("unexpected reply to RAFT: {other:?}")),
            })
            .await;
            r.map_err(|e| match e {
                CallError::Unreachable(reason) => TransportError::Unreachable {
                    addr: addr.to_owned(),
                    reason,
                },
                CallError::Timeout => TransportError::Timeout {
                    addr: addr.to_owned(),
                    timeout,
                },
                CallError::Failed(reason) => TransportError::Io {
                    addr: addr.to_owned(),
                    reason,
                },
            })
        })
    }
}
