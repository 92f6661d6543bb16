//! Cluster requests: SET_SPEC, GET_SPEC, EXPORT_PARTITION (a partition image copied to a peer),
//! CLUSTER_STATUS and METRICS.

use ramgrid_proto::cluster::ClusterSpec;
use ramgrid_proto::native::{ErrorReply, Opcode, Request, Response, SpecReply, Status};

use crate::node::Node;

pub(super) fn answer(
    state: &Node,
    op: Opcode,
    id: u64,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ErrorReply> {
    let done = |out: &mut Vec<u8>, resp: Response<'_>| {
        resp.encode(out, op, id)
            .map_err(|e| ErrorReply::new(Status::Internal, e.to_string()))
    };
    match req {
        Request::SetSpec { spec } => {
            let spec = ClusterSpec::parse_bytes(spec)
                .map_err(|e| ErrorReply::new(Status::BadRequest, e.to_string()))?;
            let epoch = state
                .install_spec(spec)
                .map_err(|e| ErrorReply::new(Status::BadRequest, e))?;
            done(out, Response::SpecSet { epoch })
        }
        Request::ExportPartition(x) => {
            let (eid, image, sealed, range) = state.exports.chunk(state, x, state.max_body)?;
            done(
                out,
                Response::Export(crate::export::reply(eid, &image, sealed, range)),
            )
        }
        Request::ClusterStatus => {
            let text = crate::cluster::status_text(state);
            done(out, Response::Status(&text))
        }
        Request::Metrics => {
            let text = state.metrics.render(state).unwrap_or_default();
            done(out, Response::Metrics(&text))
        }
        Request::GetSpec => {
            let cluster = state.cluster.read();
            let (epoch, text) = match cluster.as_ref() {
                Some(c) => (c.epoch, c.spec.to_text()),
                None => (0, String::new()),
            };
            done(
                out,
                Response::Spec(SpecReply {
                    epoch,
                    spec: text.as_bytes(),
                }),
            )
        }
        _ => unreachable!("the handler sends only this family here"),
    }
}
