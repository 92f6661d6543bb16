//! ramgrid's cluster client: partition map, connection pools, batched fan-out, replication, failover
//! and a near cache for sealed versions.
//!
//! ```no_run
//! use ramgrid_client::{Client, ClientConfig, Keys, ValuesRef};
//! use ramgrid_proto::native::ValueType;
//!
//! let client = Client::new(ClientConfig::new(vec!["127.0.0.1:7001".into(), "127.0.0.1:7002".into()]))?;
//! client.push_spec()?;
//! client.create_table("weights", 64, 2, ValueType::F64)?;
//! client.put("weights", Keys::I64(&[1, 2, 3]), ValuesRef::F64(&[0.1, 0.2, 0.3]), 0)?;
//! let got = client.get("weights", Keys::I64(&[3, 4]), 0)?;
//! assert_eq!(got.found, [true, false]);
//! # Ok::<(), ramgrid_client::Error>(())
//! ```

#![warn(missing_docs)]

mod admin;
pub mod chunked;
mod client;
mod conn;
mod deadline;
pub mod error;
mod exchange;
mod health;
mod hedge;
pub mod keys;
pub mod membership;
pub mod near;
pub mod ops;
pub mod pipeline;
pub mod plan;
mod read;
mod recover;
pub mod reduce;
mod round;
pub mod scan;
pub mod shm;
mod shm_columns;
mod shm_reader;
mod stats;
mod tls;
mod topology;
pub mod values;
mod verify;
mod write;

pub use chunked::{ChunkedError, CHUNK_KEYS};
pub use client::{
    Client, ClientConfig, GetResult, ServerStats, TableDescription, TableMeta, VersionSummary,
};
pub use error::{Error, ErrorKind, Result};
pub use keys::{KeyBytes, Keys, OwnedKeys};
pub use membership::{MoveReport, ServerStatus};
pub use near::{NearCache, NearStats};
pub use ops::{OpAnswer, OpResult, OpSpec};
pub use pipeline::Pipeline;
pub use plan::{Ack, Consistency};
pub use ramgrid_proto::cluster::{partition_of, ClusterSpec};
pub use ramgrid_proto::native::Merge;
pub use ramgrid_proto::native::{Durability, Predicate, Stats, ValueType};
pub use recover::RecoverReport;
pub use scan::{Chunk, PackedKeys, Scan, ScanOptions};
pub use shm::{ShmInfo, ShmStats};
pub use shm_columns::{ColumnSizes, ColumnsOut, MappedValues};
pub use shm_reader::ShmReader;
pub use tls::TlsConfig;
pub use values::{parse_type, type_name, BytesValues, Values, ValuesMut, ValuesRef};
pub use verify::{ReplicaDigest, Verify};
