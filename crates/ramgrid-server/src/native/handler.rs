//! One request on a native connection: the HELLO/authentication gate, then the request's family
//! (tables.rs, cluster.rs, data.rs). A refusal is written as the frame's error reply.

use std::sync::Arc;

use ramgrid_proto::native::{
    self as wire, ErrorReply, FrameError, HelloOk, KeyStatusWriter, Opcode, Request, Response,
    Status, PROTOCOL_VERSION,
};

use crate::auth;
use crate::convert::wire_key_status;
use crate::node::Node;
use crate::wal::Log;

/// Per-connection state: whether HELLO authenticated it, scratch buffers reused across frames,
/// and the log commit the request just handled must wait for before it is answered.
pub(super) struct Conn {
    pub(super) authed: bool,
    pub(super) status: Vec<u8>,
    pub(super) commit: Option<(Arc<Log>, u64)>,
    pub(super) metrics: crate::metrics::ConnMetrics,
}

impl Conn {
    pub(super) fn new(authed: bool) -> Conn {
        Conn {
            authed,
            status: Vec::new(),
            commit: None,
            metrics: Default::default(),
        }
    }

    pub(super) fn handle(
        &mut self,
        state: &Node,
        op: Opcode,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Option<Status> {
        let e = self.try_handle(state, op, id, req, out, room).err()?;
        let _ = wire::encode_error(out, op, id, &e);
        Some(e.status)
    }

    fn try_handle(
        &mut self,
        state: &Node,
        op: Opcode,
        id: u64,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        room: usize,
    ) -> Result<(), ErrorReply> {
        let done = |out: &mut Vec<u8>, resp: Response<'_>| {
            resp.encode(out, op, id)
                .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
        };
        match req {
            Request::Hello(h) => {
                if h.protocol_version != PROTOCOL_VERSION {
                    return Err(ErrorReply::new(
                        Status::UnsupportedProtocol,
                        "this server speaks protocol version 1",
                    ));
                }
                if let Some(token) = &state.token {
                    if !auth::token_matches(h.token, token) {
                        self.authed = false;
                        tracing::warn!(protocol = "native", "authentication refused: wrong token");
                        return Err(ErrorReply::new(Status::AuthFailed, "wrong auth token"));
                    }
                }
                self.authed = true;
                let max_body = u32::try_from(state.max_body).unwrap_or(u32::MAX);
                let hello = HelloOk {
                    protocol_version: PROTOCOL_VERSION,
                    server_id: &state.server_id,
                    epoch: state.epoch(),
                    max_body,
                };
                return done(out, Response::Hello(hello));
            }
            Request::Ping => return done(out, Response::Done),
            _ if !self.authed => {
                return Err(ErrorReply::new(
                    Status::AuthRequired,
                    "send HELLO with the auth token first",
                ))
            }
            _ => {}
        }
        match req {
            Request::Hello(_) | Request::Ping => unreachable!("answered above"),
            Request::Raft { .. } | Request::Recover { .. } => Err(ErrorReply::new(
                Status::BadRequest,
                "this server runs no metadata group",
            )),
            Request::CreateTable(_)
            | Request::DropTable { .. }
            | Request::ListTables
            | Request::DescribeTable { .. }
            | Request::CreateVersion(_)
            | Request::SealVersion(_)
            | Request::SetCurrent(_)
            | Request::DropVersion(_) => super::tables::answer(state, op, id, req, out),
            Request::SetSpec { .. }
            | Request::ExportPartition(_)
            | Request::ClusterStatus
            | Request::Metrics
            | Request::GetSpec => super::cluster::answer(state, op, id, req, out),
            Request::Get(_) | Request::Put(_) | Request::Delete(_) => {
                self.data(state, id, req, out, room)
            }
            Request::Operator(_) => super::ops::answer(state, id, req, out),
            Request::Digest(d) => super::digest::answer(state, id, d, out),
            Request::Repair(d) => super::digest::repair(state, id, d, out),
            Request::Scan(_) => super::scan::answer(state, id, req, out),
        }
    }

    pub(super) fn write_statuses(
        &self,
        out: &mut Vec<u8>,
        op: Opcode,
        id: u64,
    ) -> Result<(), ErrorReply> {
        let enc = |e: FrameError| ErrorReply::new(Status::Internal, e.to_string());
        let mut w = KeyStatusWriter::begin(out, op, id, self.status.len()).map_err(enc)?;
        for &s in &self.status {
            w.push(wire_key_status(s)).map_err(enc)?;
        }
        w.finish().map_err(enc)
    }
}
