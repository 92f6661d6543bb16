//! The 16-byte frame header, opcodes, and splitting a byte stream into frames.

use super::error::FrameError;
use super::wire::{patch_u32, put_u32, put_u64, put_u8};

/// First byte of every native frame. Neither printable ASCII (memcached text) nor 0x80
/// (memcached binary), so a server can tell a native connection from its first byte.
pub const MAGIC: u8 = 0xA7;
/// The protocol version this codec speaks, carried in every header and in HELLO.
pub const PROTOCOL_VERSION: u8 = 1;
/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 16;
/// Flag bit set on every response frame (a response carries its request's opcode and id).
pub const FLAG_RESPONSE: u8 = 0x01;
/// Flag bit on a PUT or DELETE that a partition's primary forwards to the partition's other
/// replicas, in the order it chose (spec section 7.5): the receiver applies it as it is and
/// forwards nothing. A PUT or DELETE without it comes from a client and is taken only by the
/// primary of every partition in it.
pub const FLAG_REPLICA: u8 = 0x02;
/// Flag bit on a client's PUT or DELETE sent at `ack = one` (spec section 7.5): any replica of
/// the partitions may take it (the first one up, when the primary is down), and it completes the
/// write on the replicas that answer instead of waiting for a silent one to be failed over.
pub const FLAG_ACK_ONE: u8 = 0x04;
const KNOWN_FLAGS: u8 = FLAG_RESPONSE | FLAG_REPLICA | FLAG_ACK_ONE;

/// Whether a connection whose first byte is `first` speaks the native protocol.
pub fn is_native_first_byte(first: u8) -> bool {
    first == MAGIC
}

/// What a frame asks for. A response carries the opcode of its request.
///
/// Not `#[non_exhaustive]` on purpose: the server matches on it exhaustively, so a new opcode
/// is a compile error there until it is handled. 0x40..=0x4F are operators (0x40 OPERATOR, 0x41
/// SCAN; the others reserved and parsed as [`FrameError::UnknownOpcode`] until they exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Handshake: protocol version, auth token, client name.
    Hello = 0x01,
    /// Liveness check; empty both ways.
    Ping = 0x02,
    /// Create a table.
    CreateTable = 0x10,
    /// Drop a table and all its versions.
    DropTable = 0x11,
    /// List every table.
    ListTables = 0x12,
    /// Describe one table.
    DescribeTable = 0x13,
    /// Create an empty, writable version of a table.
    CreateVersion = 0x18,
    /// Make a version read-only (complete).
    SealVersion = 0x19,
    /// Point the table's name at a sealed version.
    SetCurrent = 0x1A,
    /// Drop one version.
    DropVersion = 0x1B,
    /// Install a cluster spec (changes the epoch).
    SetSpec = 0x20,
    /// Fetch the cluster spec and epoch.
    GetSpec = 0x21,
    /// Read one chunk of a partition's image (server to server: moves and repairs).
    ExportPartition = 0x22,
    /// This server's view of membership and repair, as `key value` text lines.
    ClusterStatus = 0x23,
    /// One message of the cluster's Raft group (server to server; the body is opaque here).
    Raft = 0x24,
    /// Per partition, the items a server holds and a hash of them (comparing replicas).
    Digest = 0x25,
    /// Rebuild the metadata group after it lost its majority for good (operator, rarely).
    Recover = 0x26,
    /// Copy some partitions of a table in again from their other replicas (server to server).
    Repair = 0x27,
    /// Batched read.
    Get = 0x30,
    /// Batched write.
    Put = 0x31,
    /// Batched delete.
    Delete = 0x32,
    /// An operator run at the data over some partitions (count, stats, histogram, gradients).
    Operator = 0x40,
    /// One page of a plain or filtered scan of one partition (stateless cursor).
    Scan = 0x41,
    /// This server's figures (server-wide and per table) as Prometheus text.
    Metrics = 0x50,
}

impl Opcode {
    /// Every assigned opcode, in wire order.
    pub const ALL: [Opcode; 24] = [
        Opcode::Hello,
        Opcode::Ping,
        Opcode::CreateTable,
        Opcode::DropTable,
        Opcode::ListTables,
        Opcode::DescribeTable,
        Opcode::CreateVersion,
        Opcode::SealVersion,
        Opcode::SetCurrent,
        Opcode::DropVersion,
        Opcode::SetSpec,
        Opcode::GetSpec,
        Opcode::ExportPartition,
        Opcode::ClusterStatus,
        Opcode::Raft,
        Opcode::Digest,
        Opcode::Recover,
        Opcode::Repair,
        Opcode::Get,
        Opcode::Put,
        Opcode::Delete,
        Opcode::Metrics,
        Opcode::Operator,
        Opcode::Scan,
    ];

    /// The opcode for a header byte, if assigned.
    pub fn from_u8(b: u8) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|op| *op as u8 == b)
    }

    /// The spec's name for the opcode (`"CREATE_TABLE"`).
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "HELLO",
            Opcode::Ping => "PING",
            Opcode::CreateTable => "CREATE_TABLE",
            Opcode::DropTable => "DROP_TABLE",
            Opcode::ListTables => "LIST_TABLES",
            Opcode::DescribeTable => "DESCRIBE_TABLE",
            Opcode::CreateVersion => "CREATE_VERSION",
            Opcode::SealVersion => "SEAL_VERSION",
            Opcode::SetCurrent => "SET_CURRENT",
            Opcode::DropVersion => "DROP_VERSION",
            Opcode::SetSpec => "SET_SPEC",
            Opcode::GetSpec => "GET_SPEC",
            Opcode::ExportPartition => "EXPORT_PARTITION",
            Opcode::ClusterStatus => "CLUSTER_STATUS",
            Opcode::Raft => "RAFT",
            Opcode::Digest => "DIGEST",
            Opcode::Recover => "RECOVER",
            Opcode::Repair => "REPAIR",
            Opcode::Get => "GET",
            Opcode::Put => "PUT",
            Opcode::Delete => "DELETE",
            Opcode::Metrics => "METRICS",
            Opcode::Operator => "OPERATOR",
            Opcode::Scan => "SCAN",
        }
    }

    /// The opcode with the spec's name `name`.
    pub fn from_name(name: &str) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|op| op.name() == name)
    }
}

/// One frame whose body borrows from the input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What the frame asks for (or, in a response, what it answers).
    pub opcode: Opcode,
    /// Header flags: [`FLAG_RESPONSE`], [`FLAG_REPLICA`].
    pub flags: u8,
    /// Chosen by the client, echoed by the server, so many requests can be in flight.
    pub request_id: u64,
    /// The body, exactly as long as the header said.
    pub body: &'a [u8],
}

impl Frame<'_> {
    /// Whether this is a response frame.
    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }
}

/// Parses one frame from the front of `buf`, returning it and the bytes it used (header + body).
///
/// The header is checked as soon as its 16 bytes are in (the magic as soon as one byte is), so a
/// bad or oversized frame is refused before its body is waited for or buffered. The body is not
/// decoded here: see [`super::Request::decode`] and [`super::Response::decode`].
pub fn parse_frame(buf: &[u8], max_body: usize) -> Result<(Frame<'_>, usize), FrameError> {
    match buf.first() {
        None => return Err(FrameError::Incomplete { needed: HEADER_LEN }),
        Some(&b) if b != MAGIC => return Err(FrameError::BadMagic(b)),
        Some(_) => {}
    }
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Err(FrameError::Incomplete { needed: HEADER_LEN });
    };
    if h[1] != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion(h[1]));
    }
    let opcode = Opcode::from_u8(h[2]).ok_or(FrameError::UnknownOpcode(h[2]))?;
    let flags = h[3];
    // REPLICA and ACK_ONE belong to PUT and DELETE requests only.
    let write = matches!(opcode, Opcode::Put | Opcode::Delete) && flags & FLAG_RESPONSE == 0;
    if flags & !KNOWN_FLAGS != 0 || (!write && flags & (FLAG_REPLICA | FLAG_ACK_ONE) != 0) {
        return Err(FrameError::BadFlags(flags));
    }
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if len as usize > max_body {
        return Err(FrameError::BodyTooLarge { len, max: max_body });
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&h[8..16]);
    let total = HEADER_LEN + len as usize;
    let Some(body) = buf.get(HEADER_LEN..total) else {
        return Err(FrameError::Incomplete { needed: total });
    };
    let frame = Frame {
        opcode,
        flags,
        request_id: u64::from_le_bytes(id),
        body,
    };
    Ok((frame, total))
}

/// Appends a whole frame with a ready-made body (for tests, fuzzing and forwarding).
pub fn encode_frame(
    out: &mut Vec<u8>,
    opcode: Opcode,
    flags: u8,
    request_id: u64,
    body: &[u8],
) -> Result<(), FrameError> {
    if flags & !KNOWN_FLAGS != 0 {
        return Err(FrameError::Encode("reserved flag bits"));
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::Encode("body over 4 GiB"))?;
    put_header(out, opcode, flags, request_id, len);
    out.extend_from_slice(body);
    Ok(())
}

fn put_header(out: &mut Vec<u8>, opcode: Opcode, flags: u8, request_id: u64, len: u32) {
    put_u8(out, MAGIC);
    put_u8(out, PROTOCOL_VERSION);
    put_u8(out, opcode as u8);
    put_u8(out, flags);
    put_u32(out, len);
    put_u64(out, request_id);
}

/// A frame being appended to `out`. Until [`Pending::finish`] succeeds, dropping it removes the
/// partial frame, so an encoder that fails halfway never leaves garbage in the caller's buffer.
#[derive(Debug)]
pub(crate) struct Pending<'o> {
    pub(crate) out: &'o mut Vec<u8>,
    start: usize,
    done: bool,
}

impl<'o> Pending<'o> {
    pub(crate) fn begin(out: &'o mut Vec<u8>, opcode: Opcode, flags: u8, request_id: u64) -> Self {
        let start = out.len();
        put_header(out, opcode, flags, request_id, 0);
        Pending {
            out,
            start,
            done: false,
        }
    }

    /// Patches the body length into the header and keeps the frame.
    /// Sets `flag` in the frame's header.
    pub(crate) fn set_flag(&mut self, flag: u8) {
        self.out[self.start + 3] |= flag;
    }

    pub(crate) fn finish(mut self) -> Result<(), FrameError> {
        let len = self.out.len() - self.start - HEADER_LEN;
        let len = u32::try_from(len).map_err(|_| FrameError::Encode("body over 4 GiB"))?;
        patch_u32(self.out, self.start + 4, len);
        self.done = true;
        Ok(())
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.out.truncate(self.start);
        }
    }
}
