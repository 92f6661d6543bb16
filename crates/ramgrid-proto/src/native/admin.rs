//! Handshake, table, version and cluster-spec messages: small, off the hot path.

use super::error::FrameError;
use super::types::{Durability, ValueType};
use super::wire::{self, put_u32, put_u64, put_u8, Reader};

/// HELLO request: the first frame on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The protocol version the client speaks ([`super::PROTOCOL_VERSION`]).
    pub protocol_version: u8,
    /// The cluster's auth token; empty when the client has none.
    pub token: &'a [u8],
    /// Free-form client name for logs (may be empty).
    pub client_name: &'a str,
}

impl<'a> Hello<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<Hello<'a>, FrameError> {
        Ok(Hello {
            protocol_version: r.u8("protocol version")?,
            token: r.bytes16("token")?,
            client_name: r.str16("client name")?,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u8(out, self.protocol_version);
        wire::put_bytes16(out, self.token, "token over 65535 bytes")?;
        wire::put_str16(out, self.client_name, "client name over 65535 bytes")
    }
}

/// OK payload of a HELLO response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloOk<'a> {
    /// The protocol version the server will speak on this connection.
    pub protocol_version: u8,
    /// The server's identity (normally its address as written in the cluster spec).
    pub server_id: &'a str,
    /// The server's current partition-map epoch (0 = no spec installed).
    pub epoch: u64,
    /// The largest frame body the server accepts; clients split batches to fit.
    pub max_body: u32,
}

impl<'a> HelloOk<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<HelloOk<'a>, FrameError> {
        Ok(HelloOk {
            protocol_version: r.u8("protocol version")?,
            server_id: r.str16("server id")?,
            epoch: r.u64("epoch")?,
            max_body: r.u32("max body")?,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u8(out, self.protocol_version);
        wire::put_str16(out, self.server_id, "server id over 65535 bytes")?;
        put_u64(out, self.epoch);
        put_u32(out, self.max_body);
        Ok(())
    }
}

/// CREATE_TABLE request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateTable<'a> {
    /// Table name (1..=255 bytes of UTF-8).
    pub name: &'a str,
    /// Number of partitions (a server refuses 0 with BAD_REQUEST).
    pub partitions: u32,
    /// Replication factor (clamped by the partition map to the number of servers).
    pub replication: u32,
    /// Value type of every version of the table.
    pub value_type: ValueType,
    /// Whether servers keep it across a restart.
    pub durability: Durability,
    /// The table's identity, chosen by the creating client (random, never 0) and the same on every
    /// server: a table created again under the same name is another table to every client.
    pub incarnation: u64,
}

impl<'a> CreateTable<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<CreateTable<'a>, FrameError> {
        Ok(CreateTable {
            name: r.name("table name")?,
            partitions: r.u32("partitions")?,
            replication: r.u32("replication")?,
            value_type: r.value_type()?,
            durability: r.durability()?,
            incarnation: r.u64("incarnation")?,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.name, "table name")?;
        put_u32(out, self.partitions);
        put_u32(out, self.replication);
        wire::put_value_type(out, self.value_type)?;
        put_u8(out, self.durability as u8);
        put_u64(out, self.incarnation);
        Ok(())
    }
}

/// Body of CREATE_VERSION, SEAL_VERSION, SET_CURRENT and DROP_VERSION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRef<'a> {
    /// Table name.
    pub table: &'a str,
    /// Version number (>= 1; a server refuses 0 with BAD_REQUEST).
    pub version: u32,
    /// CREATE_VERSION only: a number the creating call chose at random, the same on every
    /// server it asks, so that the metadata group can tell that call's own creation, committed
    /// by whichever server proposed it first, from another client's (protocol-native 6.3).
    /// 0: none (the field is then not on the wire).
    pub creator: u64,
}

impl<'a> VersionRef<'a> {
    /// A reference to `version` of `table`, with no creator.
    pub fn new(table: &'a str, version: u32) -> VersionRef<'a> {
        VersionRef {
            table,
            version,
            creator: 0,
        }
    }

    pub(crate) fn read(r: &mut Reader<'a>) -> Result<VersionRef<'a>, FrameError> {
        let table = r.name("table name")?;
        let version = r.u32("version")?;
        // Optional trailing creator (clients before it send none). When present it is non-zero
        // (protocol-native 6.3): an explicit 0 would mean "none" and re-encode without it.
        let creator = if r.remaining() > 0 {
            match r.u64("creator")? {
                0 => return Err(FrameError::Malformed("creator 0 (omit it instead)")),
                c => c,
            }
        } else {
            0
        };
        Ok(VersionRef {
            table,
            version,
            creator,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u32(out, self.version);
        if self.creator != 0 {
            put_u64(out, self.creator);
        }
        Ok(())
    }
}

/// OK payload of a GET_SPEC response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecReply<'a> {
    /// The epoch of the installed spec (0 = none).
    pub epoch: u64,
    /// The spec in its text form (empty when none is installed).
    pub spec: &'a [u8],
}

/// EXPORT_PARTITION request: one chunk of the flat image (docs/partition-image.md) of one
/// partition of one version, for a server copying it (a move or a repair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRequest<'a> {
    /// Table name.
    pub table: &'a str,
    /// The table incarnation meant (never 0: a copy must not cross tables).
    pub incarnation: u64,
    /// The version (never 0).
    pub version: u32,
    /// The partition.
    pub partition: u32,
    /// The copier's epoch: the exporter must run the same spec (during a move, a replica that
    /// has not taken the move yet still takes writes the copier would miss).
    pub epoch: u64,
    /// 0 to start a new export (the server takes the image then); otherwise the id a previous
    /// chunk's reply gave, to read on in that same image.
    pub export_id: u64,
    /// Byte offset in the image.
    pub offset: u64,
    /// Most bytes wanted in this chunk.
    pub max_len: u32,
}

impl<'a> ExportRequest<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<ExportRequest<'a>, FrameError> {
        Ok(ExportRequest {
            table: r.name("table name")?,
            incarnation: r.u64("incarnation")?,
            version: r.u32("version")?,
            partition: r.u32("partition")?,
            epoch: r.u64("epoch")?,
            export_id: r.u64("export id")?,
            offset: r.u64("offset")?,
            max_len: r.u32("max len")?,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        wire::put_name(out, self.table, "table name")?;
        put_u64(out, self.incarnation);
        put_u32(out, self.version);
        put_u32(out, self.partition);
        put_u64(out, self.epoch);
        put_u64(out, self.export_id);
        put_u64(out, self.offset);
        put_u32(out, self.max_len);
        Ok(())
    }
}

/// OK payload of an EXPORT_PARTITION response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportChunk<'a> {
    /// The export this chunk belongs to (name it to read on).
    pub export_id: u64,
    /// The whole image's length.
    pub total: u64,
    /// Whether the version was sealed when the image was taken (an open version's image is a
    /// point-in-time copy; writes after it reach the copier directly).
    pub sealed: bool,
    /// The bytes at the requested offset (empty at or past the end).
    pub chunk: &'a [u8],
}

impl<'a> ExportChunk<'a> {
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<ExportChunk<'a>, FrameError> {
        Ok(ExportChunk {
            export_id: r.u64("export id")?,
            total: r.u64("total")?,
            sealed: r.u8("sealed")? != 0,
            chunk: r.bytes32("chunk")?,
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        put_u64(out, self.export_id);
        put_u64(out, self.total);
        put_u8(out, u8::from(self.sealed));
        wire::put_bytes32(out, self.chunk, "chunk over 4 GiB")
    }
}
