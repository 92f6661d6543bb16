//! Whole requests and responses: decoding a frame's body by opcode, and encoding a frame.

use super::admin::{
    CreateTable, ExportChunk, ExportRequest, Hello, HelloOk, SpecReply, VersionRef,
};
use super::data::KeyBatch;
use super::digest::{DigestReply, DigestRequest};
use super::error::FrameError;
use super::frame::{Frame, Opcode, Pending, FLAG_RESPONSE};
use super::get_reply::{GetReply, KeyStatuses};
use super::ops::{OpReply, OpRequest};
use super::put::Put;
use super::scan::{ScanReply, ScanRequest};
use super::types::{ErrorReply, Status, TableInfo};
use super::wire::{self, put_u32, put_u64, put_u8, Reader};

/// A decoded request, borrowing from the frame. Data requests are validated views (see
/// [`KeyBatch`], [`Put`]); nothing here allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// HELLO.
    Hello(Hello<'a>),
    /// PING (empty body).
    Ping,
    /// CREATE_TABLE.
    CreateTable(CreateTable<'a>),
    /// DROP_TABLE.
    DropTable {
        /// Table name.
        name: &'a str,
    },
    /// LIST_TABLES (empty body).
    ListTables,
    /// DESCRIBE_TABLE.
    DescribeTable {
        /// Table name.
        name: &'a str,
    },
    /// CREATE_VERSION.
    CreateVersion(VersionRef<'a>),
    /// SEAL_VERSION.
    SealVersion(VersionRef<'a>),
    /// SET_CURRENT.
    SetCurrent(VersionRef<'a>),
    /// DROP_VERSION.
    DropVersion(VersionRef<'a>),
    /// SET_SPEC: a cluster spec in its text form.
    SetSpec {
        /// The spec text (see `ramgrid_proto::cluster::ClusterSpec::parse`).
        spec: &'a [u8],
    },
    /// GET_SPEC (empty body).
    GetSpec,
    /// EXPORT_PARTITION.
    ExportPartition(ExportRequest<'a>),
    /// CLUSTER_STATUS (empty body).
    ClusterStatus,
    /// DIGEST.
    Digest(DigestRequest<'a>),
    /// REPAIR: copy these partitions of the table in again (section 6.11). The body is DIGEST's;
    /// version 0 is refused.
    Repair(DigestRequest<'a>),
    /// RECOVER: leave the metadata group, which lost its majority, for a new one of
    /// `generation` (section 6.10).
    Recover {
        /// Lead the new group (from this server's state) or join it (reset, empty).
        mode: RecoverMode,
        /// The new group's generation: above every generation the live servers report.
        generation: u64,
    },
    /// RAFT: one message of the metadata group, opaque to the protocol.
    Raft {
        /// The message (`ramgrid_meta`'s encoding).
        message: &'a [u8],
    },
    /// METRICS (empty body).
    Metrics,
    /// GET.
    Get(KeyBatch<'a>),
    /// PUT.
    Put(Put<'a>),
    /// DELETE.
    Delete(KeyBatch<'a>),
    /// OPERATOR.
    Operator(OpRequest<'a>),
    /// SCAN.
    Scan(ScanRequest<'a>),
}

/// What a server asked to RECOVER does (protocol-native section 6.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecoverMode {
    /// Form a new group alone, holding this server's applied metadata, and lead it.
    Lead = 1,
    /// Leave the old group and wait, in no group, for the new group's leader to add it.
    Join = 2,
}

impl RecoverMode {
    /// The mode for a body byte, if assigned.
    pub fn from_u8(b: u8) -> Option<RecoverMode> {
        match b {
            1 => Some(RecoverMode::Lead),
            2 => Some(RecoverMode::Join),
            _ => None,
        }
    }
}

impl<'a> Request<'a> {
    /// Decodes a request frame's body. A response frame is refused as malformed.
    pub fn decode(frame: &Frame<'a>) -> Result<Request<'a>, FrameError> {
        if frame.is_response() {
            return Err(FrameError::Malformed("response flag on a request"));
        }
        Request::decode_body(frame.opcode, frame.body)
    }

    /// Decodes the body of a request with the given opcode.
    pub fn decode_body(opcode: Opcode, body: &'a [u8]) -> Result<Request<'a>, FrameError> {
        match opcode {
            Opcode::Get => return KeyBatch::decode(body).map(Request::Get),
            Opcode::Delete => return KeyBatch::decode(body).map(Request::Delete),
            Opcode::Put => return Put::decode(body).map(Request::Put),
            _ => {}
        }
        let mut r = Reader::new(body);
        let req = match opcode {
            Opcode::Hello => Request::Hello(Hello::read(&mut r)?),
            Opcode::Ping => Request::Ping,
            Opcode::CreateTable => Request::CreateTable(CreateTable::read(&mut r)?),
            Opcode::DropTable => Request::DropTable {
                name: r.name("table name")?,
            },
            Opcode::ListTables => Request::ListTables,
            Opcode::DescribeTable => Request::DescribeTable {
                name: r.name("table name")?,
            },
            Opcode::CreateVersion => Request::CreateVersion(VersionRef::read(&mut r)?),
            Opcode::SealVersion => Request::SealVersion(VersionRef::read(&mut r)?),
            Opcode::SetCurrent => Request::SetCurrent(VersionRef::read(&mut r)?),
            Opcode::DropVersion => Request::DropVersion(VersionRef::read(&mut r)?),
            Opcode::SetSpec => Request::SetSpec {
                spec: r.bytes32("spec")?,
            },
            Opcode::GetSpec => Request::GetSpec,
            Opcode::ExportPartition => Request::ExportPartition(ExportRequest::read(&mut r)?),
            Opcode::ClusterStatus => Request::ClusterStatus,
            Opcode::Digest => Request::Digest(DigestRequest::read(&mut r)?),
            Opcode::Repair => Request::Repair(DigestRequest::read(&mut r)?),
            Opcode::Recover => Request::Recover {
                mode: RecoverMode::from_u8(r.u8("recover mode")?)
                    .ok_or(FrameError::Malformed("recover mode"))?,
                generation: r.u64("generation")?,
            },
            Opcode::Raft => Request::Raft {
                message: r.bytes32("raft message")?,
            },
            Opcode::Metrics => Request::Metrics,
            Opcode::Operator => Request::Operator(OpRequest::read(&mut r)?),
            Opcode::Scan => Request::Scan(ScanRequest::read(&mut r)?),
            Opcode::Get | Opcode::Put | Opcode::Delete => unreachable!("handled above"),
        };
        r.finish()?;
        Ok(req)
    }

    /// The opcode this request travels under.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello(_) => Opcode::Hello,
            Request::Ping => Opcode::Ping,
            Request::CreateTable(_) => Opcode::CreateTable,
            Request::DropTable { .. } => Opcode::DropTable,
            Request::ListTables => Opcode::ListTables,
            Request::DescribeTable { .. } => Opcode::DescribeTable,
            Request::CreateVersion(_) => Opcode::CreateVersion,
            Request::SealVersion(_) => Opcode::SealVersion,
            Request::SetCurrent(_) => Opcode::SetCurrent,
            Request::DropVersion(_) => Opcode::DropVersion,
            Request::SetSpec { .. } => Opcode::SetSpec,
            Request::GetSpec => Opcode::GetSpec,
            Request::ExportPartition(_) => Opcode::ExportPartition,
            Request::Digest(_) => Opcode::Digest,
            Request::Recover { .. } => Opcode::Recover,
            Request::Repair(_) => Opcode::Repair,
            Request::ClusterStatus => Opcode::ClusterStatus,
            Request::Raft { .. } => Opcode::Raft,
            Request::Metrics => Opcode::Metrics,
            Request::Get(_) => Opcode::Get,
            Request::Put(_) => Opcode::Put,
            Request::Delete(_) => Opcode::Delete,
            Request::Operator(_) => Opcode::Operator,
            Request::Scan(_) => Opcode::Scan,
        }
    }

    /// Appends the whole request frame. On error nothing is appended.
    ///
    /// Batches are built with [`super::KeyBatchWriter`] / [`super::PutWriter`]; this re-encodes
    /// a decoded one (proxies, tests).
    pub fn encode(&self, out: &mut Vec<u8>, request_id: u64) -> Result<(), FrameError> {
        let p = Pending::begin(out, self.opcode(), 0, request_id);
        let out = &mut *p.out;
        match self {
            Request::Hello(h) => h.write(out)?,
            Request::Ping
            | Request::ListTables
            | Request::GetSpec
            | Request::ClusterStatus
            | Request::Metrics => {}
            Request::ExportPartition(x) => x.write(out)?,
            Request::Digest(x) | Request::Repair(x) => x.write(out)?,
            Request::Recover { mode, generation } => {
                out.push(*mode as u8);
                out.extend_from_slice(&generation.to_le_bytes());
            }
            Request::CreateTable(c) => c.write(out)?,
            Request::DropTable { name } | Request::DescribeTable { name } => {
                wire::put_name(out, name, "table name")?
            }
            Request::CreateVersion(v)
            | Request::SealVersion(v)
            | Request::SetCurrent(v)
            | Request::DropVersion(v) => v.write(out)?,
            Request::SetSpec { spec } => wire::put_bytes32(out, spec, "spec over 4 GiB")?,
            Request::Raft { message } => {
                wire::put_bytes32(out, message, "raft message over 4 GiB")?
            }
            Request::Get(b) | Request::Delete(b) => b.write_body(out)?,
            Request::Put(b) => b.write_body(out)?,
            Request::Operator(o) => o.write(out)?,
            Request::Scan(s) => s.write(out)?,
        }
        p.finish()
    }
}

/// A decoded response. Every response body starts with a [`Status`]; anything but OK decodes as
/// [`Response::Error`], whatever the opcode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<'a> {
    /// A refusal.
    Error(ErrorReply),
    /// OK to HELLO.
    Hello(HelloOk<'a>),
    /// OK with an empty payload: PING, CREATE_TABLE, DROP_TABLE, the four version operations, REPAIR.
    Done,
    /// OK to LIST_TABLES.
    Tables(Vec<TableInfo>),
    /// OK to DESCRIBE_TABLE.
    Table(TableInfo),
    /// OK to SET_SPEC: the epoch of the spec now installed.
    SpecSet {
        /// The new epoch.
        epoch: u64,
    },
    /// OK to GET_SPEC.
    Spec(SpecReply<'a>),
    /// OK to EXPORT_PARTITION.
    Export(ExportChunk<'a>),
    /// OK to CLUSTER_STATUS and RECOVER: `key value` lines.
    Status(&'a str),
    /// OK to RAFT: the reply message.
    Raft(&'a [u8]),
    /// OK to DIGEST.
    Digest(DigestReply<'a>),
    /// OK to METRICS: Prometheus text exposition (format 0.0.4).
    Metrics(&'a str),
    /// OK to GET.
    Get(GetReply<'a>),
    /// OK to PUT or DELETE.
    KeyStatuses(KeyStatuses<'a>),
    /// OK to OPERATOR.
    Operator(OpReply),
    /// OK to SCAN: one page.
    Scan(ScanReply<'a>),
}

impl<'a> Response<'a> {
    /// Decodes a response frame's body. A request frame is refused as malformed.
    pub fn decode(frame: &Frame<'a>) -> Result<Response<'a>, FrameError> {
        if !frame.is_response() {
            return Err(FrameError::Malformed(
                "request frame where a response was expected",
            ));
        }
        Response::decode_body(frame.opcode, frame.body)
    }

    /// Decodes the body of a response to a request with the given opcode.
    pub fn decode_body(opcode: Opcode, body: &'a [u8]) -> Result<Response<'a>, FrameError> {
        let mut r = Reader::new(body);
        let status = Status::from_u8(r.u8("status")?).ok_or(FrameError::Malformed("status"))?;
        let resp = if status != Status::Ok {
            Response::Error(ErrorReply::read(status, &mut r)?)
        } else {
            match opcode {
                Opcode::Hello => Response::Hello(HelloOk::read(&mut r)?),
                Opcode::Ping
                | Opcode::CreateTable
                | Opcode::DropTable
                | Opcode::CreateVersion
                | Opcode::SealVersion
                | Opcode::SetCurrent
                | Opcode::DropVersion
                | Opcode::Repair => Response::Done,
                Opcode::ListTables => {
                    let n = r.u32("table count")?;
                    // A table entry is at least 24 bytes; refuse counts the body cannot hold.
                    if n as usize > r.remaining() / 24 {
                        return Err(FrameError::Truncated("tables"));
                    }
                    let tables = (0..n)
                        .map(|_| TableInfo::read(&mut r))
                        .collect::<Result<_, _>>()?;
                    Response::Tables(tables)
                }
                Opcode::DescribeTable => Response::Table(TableInfo::read(&mut r)?),
                Opcode::SetSpec => Response::SpecSet {
                    epoch: r.u64("epoch")?,
                },
                Opcode::GetSpec => Response::Spec(SpecReply {
                    epoch: r.u64("epoch")?,
                    spec: r.bytes32("spec")?,
                }),
                Opcode::ExportPartition => Response::Export(ExportChunk::read(&mut r)?),
                Opcode::ClusterStatus | Opcode::Recover => Response::Status(r.str32("status")?),
                Opcode::Raft => Response::Raft(r.bytes32("raft reply")?),
                Opcode::Digest => Response::Digest(DigestReply::read(&mut r)?),
                Opcode::Metrics => Response::Metrics(r.str32("metrics")?),
                Opcode::Get => Response::Get(GetReply::read(&mut r)?),
                Opcode::Put | Opcode::Delete => Response::KeyStatuses(KeyStatuses::read(&mut r)?),
                Opcode::Operator => Response::Operator(OpReply::read(&mut r)?),
                Opcode::Scan => Response::Scan(ScanReply::read(&mut r)?),
            }
        };
        r.finish()?;
        Ok(resp)
    }

    /// Whether this response is a valid answer to `opcode`.
    pub fn fits(&self, opcode: Opcode) -> bool {
        use Opcode as O;
        match self {
            Response::Error(e) => e.status != Status::Ok,
            Response::Hello(_) => opcode == O::Hello,
            Response::Done => matches!(
                opcode,
                O::Ping
                    | O::CreateTable
                    | O::DropTable
                    | O::CreateVersion
                    | O::SealVersion
                    | O::SetCurrent
                    | O::DropVersion
                    | O::Repair
            ),
            Response::Tables(_) => opcode == O::ListTables,
            Response::Table(_) => opcode == O::DescribeTable,
            Response::SpecSet { .. } => opcode == O::SetSpec,
            Response::Spec(_) => opcode == O::GetSpec,
            Response::Export(_) => opcode == O::ExportPartition,
            Response::Status(_) => matches!(opcode, O::ClusterStatus | O::Recover),
            Response::Raft(_) => opcode == O::Raft,
            Response::Digest(_) => opcode == O::Digest,
            Response::Metrics(_) => opcode == O::Metrics,
            Response::Get(_) => opcode == O::Get,
            Response::KeyStatuses(_) => matches!(opcode, O::Put | O::Delete),
            Response::Operator(_) => opcode == O::Operator,
            Response::Scan(_) => opcode == O::Scan,
        }
    }

    /// Appends the whole response frame answering request `request_id` of `opcode`. On error
    /// nothing is appended. GET, PUT and DELETE answers are normally built with
    /// [`super::GetReplyWriter`] / [`super::KeyStatusWriter`].
    pub fn encode(
        &self,
        out: &mut Vec<u8>,
        opcode: Opcode,
        request_id: u64,
    ) -> Result<(), FrameError> {
        if !self.fits(opcode) {
            return Err(FrameError::Encode("response does not answer this opcode"));
        }
        let p = Pending::begin(out, opcode, FLAG_RESPONSE, request_id);
        let out = &mut *p.out;
        if let Response::Error(e) = self {
            e.write(out)?;
            return p.finish();
        }
        put_u8(out, Status::Ok as u8);
        match self {
            Response::Error(_) | Response::Done => {}
            Response::Hello(h) => h.write(out)?,
            Response::Tables(ts) => {
                put_u32(
                    out,
                    u32::try_from(ts.len()).map_err(|_| FrameError::Encode("table count"))?,
                );
                for t in ts {
                    t.write(out)?;
                }
            }
            Response::Table(t) => t.write(out)?,
            Response::SpecSet { epoch } => put_u64(out, *epoch),
            Response::Spec(s) => {
                put_u64(out, s.epoch);
                wire::put_bytes32(out, s.spec, "spec over 4 GiB")?;
            }
            Response::Export(x) => x.write(out)?,
            Response::Status(text) => wire::put_bytes32(out, text.as_bytes(), "status over 4 GiB")?,
            Response::Raft(m) => wire::put_bytes32(out, m, "raft reply over 4 GiB")?,
            Response::Digest(d) => d.write(out)?,
            Response::Metrics(text) => {
                wire::put_bytes32(out, text.as_bytes(), "metrics over 4 GiB")?
            }
            Response::Get(g) => g.write(out)?,
            Response::KeyStatuses(k) => k.write(out)?,
            Response::Operator(o) => o.write(out)?,
            Response::Scan(s) => s.write(out)?,
        }
        p.finish()
    }
}

/// Appends an error response to request `request_id` of `opcode`.
pub fn encode_error(
    out: &mut Vec<u8>,
    opcode: Opcode,
    request_id: u64,
    error: &ErrorReply,
) -> Result<(), FrameError> {
    let p = Pending::begin(out, opcode, FLAG_RESPONSE, request_id);
    error.write(p.out)?;
    p.finish()
}
